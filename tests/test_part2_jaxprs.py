"""Tests of Part 2: jaxprs, the type checker, eval_jaxpr and make_jaxpr.

Random programs come from the Part 1 generator (every Part 1 primitive, ranks
0-3). Each is traced with ``make_jaxpr`` and the jaxpr is checked against real
JAX (values, shapes and dtypes in float64, equation counts of
``jax.make_jaxpr``) and against structural facts that hold for any correct
implementation: one equation per primitive application (omnistaging), every
variable bound once and before use, the printer's names in binding order.
"""

from __future__ import annotations

import ast
import itertools
import re
import string
import threading
from collections import Counter
from collections.abc import Callable, Sequence
from functools import cache
from types import SimpleNamespace
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from test_part1_differential import (
    SEEDS,
    TOL,
    JaxOps,
    Program,
    assert_matches,
    batch_axes,
    program_fns,
    random_arrays,
    random_out_axis,
    random_program,
    run,
    setup,
)

import autodidax as ad

pytestmark = pytest.mark.usefixtures("clean_interpreter_stack")

F64 = np.float64
SCALAR = ad.ShapedArray((), F64)
VEC3 = ad.ShapedArray((3,), F64)


# ---------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------


def avals_of(shapes: Sequence[tuple], dtype: Any = F64) -> list[ad.ShapedArray]:
    return [ad.ShapedArray(s, dtype) for s in shapes]


def short_type(shape: Sequence[int], dtype: Any) -> str:
    """The printed form of a type, e.g. ``float64[3,4]`` (SPEC section 4)."""
    return f"{np.dtype(dtype).name}[{','.join(str(int(d)) for d in shape)}]"


def assert_state_clean() -> None:
    """Only the evaluation level is on the stack, and it is the dynamic level."""
    assert len(ad._state.stack) == 1
    assert ad._state.dynamic is ad._state.stack[0]


def eqn_names(jaxpr: ad.Jaxpr) -> list[str]:
    return [eqn.primitive.name for eqn in jaxpr.eqns]


def with_constant(prog: Program, seed: int) -> tuple[Callable, Callable, np.ndarray]:
    """The program with a closed-over NumPy constant added to its main output
    (for autodidax and for JAX), and that constant."""
    rng = np.random.default_rng(20_000 + seed)
    const = rng.uniform(-1.0, 1.0, size=prog.out_shapes[0])
    f, f_jax = program_fns(prog)

    def g(*xs):
        first, *rest = f(*xs)
        return (first + const, *rest)

    def g_jax(*xs):
        first, *rest = f_jax(*xs)
        return (first + const, *rest)

    return g, g_jax, const


@cache
def traced(seed: int) -> tuple[ad.Jaxpr, list, Any]:
    """make_jaxpr of the random program for ``seed``, at its input types."""
    prog = random_program(seed)
    f, _ = program_fns(prog)
    return ad.make_jaxpr(f, *avals_of(prog.in_shapes))


FLIPPED = {"greater": "less", "less": "greater"}
PRIMITIVE_OF = {"greater": "gt", "less": "lt"}  # wrapper name -> primitive name


def expected_primitive_counts(prog: Program) -> Counter:
    """How many equations of each primitive tracing ``prog`` must record: one
    per primitive application, including those on constants (omnistaging)."""
    counts: Counter = Counter()
    for op in prog.ops:
        # Every value of a program derives from its inputs, so under make_jaxpr
        # every operand is a tracer and "op" style really uses the operators;
        # the operator ``-`` is one ``sub``, the "fn" style spells it with
        # ``add`` and ``neg``.
        if op.kind == "sub":
            counts.update(["sub"] if op.style == "op" else ["add", "neg"])
        elif op.kind == "scalar":
            name, _, left = op.params
            if prog.shapes[op.args[0]]:  # the number is broadcast to a non-scalar
                counts["broadcast"] += 1
            if name == "sub" and op.style == "op":
                counts["sub"] += 1
            elif name == "sub":
                counts.update(["add", "neg"] if left else ["add"])
            elif left and op.style == "op" and name in FLIPPED:
                counts[FLIPPED[name]] += 1  # Python runs `2.0 > x` as `x < 2.0`
            else:
                counts[name] += 1
        else:
            counts[op.kind] += 1
    return Counter({PRIMITIVE_OF.get(k, k): n for k, n in counts.items()})


# ---------------------------------------------------------------------------
# Randomized programs: eval_jaxpr, typecheck_jaxpr, str(jaxpr)
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("seed", SEEDS)
def test_eval_jaxpr_matches_function_and_jax(seed):
    """eval_jaxpr of the traced program = the program itself = JAX."""
    prog, _, inputs = setup(seed)
    f, f_jax = program_fns(prog)
    jaxpr, consts, out_tree = traced(seed)
    assert len(jaxpr.in_binders) == len(consts) + len(inputs)
    ours = ad.tree_unflatten(out_tree, ad.eval_jaxpr(jaxpr, [*consts, *inputs]))
    assert_matches(ours, f(*inputs))
    assert_matches(ours, jax.jit(f_jax)(*inputs))
    assert_state_clean()


@pytest.mark.parametrize("seed", SEEDS)
def test_closed_over_constant_becomes_a_const(seed):
    """A non-scalar NumPy array the function closes over is passed in as a
    constant (the jaxpr's first inputs); a 0-d one becomes a literal."""
    prog, _, inputs = setup(seed)
    g, g_jax, const = with_constant(prog, seed)
    jaxpr, consts, out_tree = ad.make_jaxpr(g, *avals_of(prog.in_shapes))
    if const.ndim:
        assert len(consts) == 1 and consts[0] is const
        assert jaxpr.in_binders[0].aval == ad.ShapedArray(const.shape, F64)
    else:
        assert consts == []
        assert any(isinstance(x, ad.Lit) for e in jaxpr.eqns for x in e.inputs)
    ours = ad.tree_unflatten(out_tree, ad.eval_jaxpr(jaxpr, [*consts, *inputs]))
    assert_matches(ours, jax.jit(g_jax)(*inputs))


@pytest.mark.parametrize("seed", SEEDS)
def test_typecheck_accepts_traced_jaxpr_with_jax_types(seed):
    """The traced jaxpr type-checks; its type is the avals in and JAX's output
    shapes/dtypes out, and prints as ``(in, ...) -> (out, ...)``."""
    prog = random_program(seed)
    _, f_jax = program_fns(prog)
    jaxpr, consts, _ = traced(seed)
    jaxpr_type = ad.typecheck_jaxpr(jaxpr)
    want_in = avals_of([np.shape(c) for c in consts]) + avals_of(prog.in_shapes)
    assert list(jaxpr_type.in_types) == want_in
    specs = [jax.ShapeDtypeStruct(s, F64) for s in prog.in_shapes]
    jax_outs = jax.eval_shape(f_jax, *specs)
    want_out = [ad.ShapedArray(o.shape, o.dtype) for o in jax_outs]
    assert list(jaxpr_type.out_types) == want_out
    ins = ", ".join(short_type(t.shape, t.dtype) for t in want_in)
    outs = ", ".join(short_type(o.shape, o.dtype) for o in jax_outs)
    assert str(jaxpr_type) == f"({ins}) -> ({outs})"
    # Every variable carries a plain type, never a value.
    for eqn in jaxpr.eqns:
        for v in eqn.out_binders:
            assert type(v.aval) is ad.ShapedArray


@pytest.mark.parametrize("seed", SEEDS)
def test_one_equation_per_primitive_application(seed):
    """Tracing records exactly the primitives the program applies, and the
    printed jaxpr names each of them."""
    prog = random_program(seed)
    jaxpr, _, _ = traced(seed)
    want = expected_primitive_counts(prog)
    assert Counter(eqn_names(jaxpr)) == want
    text = str(jaxpr)
    for name in want:
        assert re.search(rf"= {name}[\[ ]", text), name


# ---------------------------------------------------------------------------
# Equation counts against jax.make_jaxpr
# ---------------------------------------------------------------------------

JAX_NAMES = {"broadcast_in_dim": "broadcast"}


def jax_eqn_counts(closed_jaxpr: Any) -> Counter:
    return Counter(
        JAX_NAMES.get(e.primitive.name, e.primitive.name)
        for e in closed_jaxpr.jaxpr.eqns
    )


def is_identity(eqn: ad.JaxprEqn) -> bool:
    """A transpose by the identity permutation, or a broadcast adding no axes."""
    if eqn.primitive.name == "transpose":
        return tuple(eqn.params["perm"]) == tuple(range(len(eqn.params["perm"])))
    if eqn.primitive.name == "broadcast":
        return len(eqn.params["axes"]) == 0
    return False


def our_eqn_counts(jaxpr: ad.Jaxpr) -> Counter:
    """Equation counts, leaving out identity transposes and broadcasts, which
    jax.lax elides (``lax.transpose(x, (0, 1))`` returns ``x``)."""
    return Counter(e.primitive.name for e in jaxpr.eqns if not is_identity(e))


class LaxOps(JaxOps):
    """Program ops written with jax.lax primitives (no jnp conveniences)."""

    _lax = {
        "neg": lax.neg,
        "sin": lax.sin,
        "cos": lax.cos,
        "add": lax.add,
        "mul": lax.mul,
        "greater": lax.gt,
        "less": lax.lt,
    }

    @staticmethod
    def unary(name, x, style):
        return LaxOps._lax[name](x)

    @staticmethod
    def binary(name, x, y, style):
        if name == "sub":
            # Like ours: JAX's own operator ``-`` on two tracers of one shape
            # records one ``sub``; the "fn" style spells it add(x, neg(y)).
            return x - y if style == "op" else lax.add(x, lax.neg(y))
        return LaxOps._lax[name](x, y)

    @staticmethod
    def scalar(name, x, c, left, style):
        raise AssertionError("programs compared with jax.make_jaxpr use no scalars")

    @staticmethod
    def reduce_sum(x, axis):
        ndim = np.ndim(x)
        if axis is None:
            axes = tuple(range(ndim))
        else:
            axes = (axis,) if isinstance(axis, int) else tuple(axis)
        return lax.reduce_sum(x, tuple(a % ndim for a in axes))

    @staticmethod
    def transpose(x, perm):
        return lax.transpose(x, tuple(p % len(perm) for p in perm))


SCALAR_FREE_SEEDS = [
    s
    for s in range(400)
    if not any(op.kind == "scalar" for op in random_program(s).ops)
][:20]


@pytest.mark.parametrize("seed", SCALAR_FREE_SEEDS)
def test_equation_counts_match_jax_on_random_programs(seed):
    """Our jaxpr has as many equations of each primitive as jax.make_jaxpr's
    jaxpr of the same program written with jax.lax (programs without Python
    scalars)."""
    prog = random_program(seed)
    f, _ = program_fns(prog)
    jaxpr, consts, _ = ad.make_jaxpr(f, *avals_of(prog.in_shapes))
    specs = [jax.ShapeDtypeStruct(s, F64) for s in prog.in_shapes]
    closed = jax.make_jaxpr(lambda *xs: run(prog, LaxOps, xs))(*specs)
    assert our_eqn_counts(jaxpr) == jax_eqn_counts(closed)
    assert len(consts) == len(closed.consts) == 0


M23 = np.arange(6.0).reshape(2, 3) / 7.0
W23 = np.linspace(-1.0, 1.0, 6).reshape(2, 3)

HAND_WRITTEN = {
    "sin_cos_mul_add_neg": (
        lambda x, y: ad.add(ad.mul(ad.sin(x), ad.cos(y)), ad.neg(x)),
        lambda x, y: lax.add(lax.mul(lax.sin(x), lax.cos(y)), lax.neg(x)),
    ),
    "reduce_transpose_broadcast": (
        lambda x, y: ad.broadcast(
            ad.reduce_sum(ad.mul(ad.transpose(x, (1, 0)), ad.transpose(y, (1, 0))), 0),
            (4, 2),
            (0,),
        ),
        lambda x, y: lax.broadcast_in_dim(
            lax.reduce_sum(
                lax.mul(lax.transpose(x, (1, 0)), lax.transpose(y, (1, 0))), (0,)
            ),
            (4, 2),
            (1,),
        ),
    ),
    "comparisons": (
        lambda x, y: (ad.greater(x, y), ad.less(ad.sin(x), y), x > y),
        lambda x, y: (lax.gt(x, y), lax.lt(lax.sin(x), y), lax.gt(x, y)),
    ),
    "repeated_use": (
        lambda x, y: ad.reduce_sum(ad.mul(ad.mul(x, x), ad.add(x, y))),
        lambda x, y: lax.reduce_sum(lax.mul(lax.mul(x, x), lax.add(x, y)), (0, 1)),
    ),
    "closed_over_array": (
        lambda x, y: ad.add(ad.mul(x, W23), y),
        lambda x, y: lax.add(lax.mul(x, W23), y),
    ),
    "constant_only_work": (
        lambda x, y: ad.add(x, ad.sin(ad.mul(W23, W23))),
        lambda x, y: lax.add(x, lax.sin(lax.mul(W23, W23))),
    ),
}


@pytest.mark.parametrize("name", sorted(HAND_WRITTEN))
def test_equation_counts_match_jax_hand_written(name):
    """Hand-written lax programs: same equation counts and constant counts as
    jax.make_jaxpr, and the same values."""
    ours_fn, lax_fn = HAND_WRITTEN[name]
    jaxpr, consts, out_tree = ad.make_jaxpr(ours_fn, M23, W23)
    closed = jax.make_jaxpr(lax_fn)(M23, W23)
    assert our_eqn_counts(jaxpr) == jax_eqn_counts(closed)
    assert len(consts) == len(closed.consts)
    ours = ad.tree_unflatten(out_tree, ad.eval_jaxpr(jaxpr, [*consts, M23, W23]))
    assert_matches(ours, lax_fn(M23, W23))


@pytest.mark.parametrize(
    "ours_fn, lax_fn",
    [
        (
            lambda x: x * 2.0,
            lambda x: lax.mul(x, lax.broadcast_in_dim(2.0, (2, 3), ())),
        ),
        (
            lambda x: 1.5 - x,
            lambda x: lax.sub(lax.broadcast_in_dim(1.5, (2, 3), ()), x),
        ),
        (
            lambda x: x - 1.5,
            lambda x: lax.sub(x, lax.broadcast_in_dim(1.5, (2, 3), ())),
        ),
        (
            lambda x: ad.sin(x) > 0.25,
            lambda x: lax.gt(lax.sin(x), lax.broadcast_in_dim(0.25, (2, 3), ())),
        ),
    ],
)
def test_python_scalar_is_an_explicit_broadcast(ours_fn, lax_fn):
    """A Python number next to an array is one ``broadcast`` equation: our
    jaxpr counts like JAX's jaxpr of the explicitly broadcast program."""
    jaxpr, consts, _ = ad.make_jaxpr(ours_fn, M23)
    closed = jax.make_jaxpr(lax_fn)(M23)
    assert our_eqn_counts(jaxpr) == jax_eqn_counts(closed)
    assert consts == []
    assert_matches(ad.eval_jaxpr(jaxpr, [M23])[0], lax_fn(M23))


# ---------------------------------------------------------------------------
# Omnistaging
# ---------------------------------------------------------------------------


def test_constant_only_operation_is_staged():
    """make_jaxpr(lambda: mul(2., 2.)) contains the mul; make_jaxpr_v1 does not."""
    jaxpr, consts, _ = ad.make_jaxpr(lambda: ad.mul(2.0, 2.0))
    assert eqn_names(jaxpr) == ["mul"]
    assert consts == [] and jaxpr.in_binders == []
    (eqn,) = jaxpr.eqns
    assert all(isinstance(x, ad.Lit) for x in eqn.inputs)
    assert [float(x.val) for x in eqn.inputs] == [2.0, 2.0]
    assert jaxpr.outs == eqn.out_binders
    assert ad.eval_jaxpr(jaxpr, []) == [4.0]

    jaxpr_v1, consts_v1, _ = ad.make_jaxpr_v1(lambda: ad.mul(2.0, 2.0))
    assert jaxpr_v1.eqns == [] and consts_v1 == []
    (out,) = jaxpr_v1.outs
    assert isinstance(out, ad.Lit) and float(out.val) == 4.0
    assert_state_clean()


def test_scalar_times_vector_broadcasts_in_the_jaxpr():
    """x * 2.0 stages a broadcast of the literal 2.0, not a float64[3] const."""
    jaxpr, consts, _ = ad.make_jaxpr(lambda x: x * 2.0, VEC3)
    assert consts == []
    assert len(jaxpr.in_binders) == 1
    assert sorted(eqn_names(jaxpr)) == ["broadcast", "mul"]
    (bcast,) = [e for e in jaxpr.eqns if e.primitive.name == "broadcast"]
    (lit,) = bcast.inputs
    assert isinstance(lit, ad.Lit) and float(lit.val) == 2.0
    # Data-dependence-only tracing computes the broadcast eagerly instead.
    jaxpr_v1, consts_v1, _ = ad.make_jaxpr_v1(lambda x: x * 2.0, VEC3)
    assert eqn_names(jaxpr_v1) == ["mul"]
    assert len(consts_v1) == 1 and np.shape(consts_v1[0]) == (3,)
    x = np.array([1.0, -2.0, 0.5])
    np.testing.assert_array_equal(ad.eval_jaxpr(jaxpr, [x])[0], x * 2.0)
    np.testing.assert_array_equal(ad.eval_jaxpr(jaxpr_v1, [*consts_v1, x])[0], x * 2.0)


def test_outside_make_jaxpr_constants_are_computed_eagerly():
    """Omnistaging only applies while tracing: eager ops still give arrays."""
    ad.make_jaxpr(lambda x: ad.sin(x), VEC3)
    out = ad.mul(2.0, 3.0)
    assert not isinstance(out, ad.Tracer) and float(out) == 6.0
    assert_state_clean()


def test_make_jaxpr_records_equations_of_jvp_inside():
    """Tracing a jvp records the jvp rules' equations, and operations on
    constants inside it (cos 2.0); the jaxpr computes JAX's jvp."""

    def f(x):
        return ad.jvp(lambda t: ad.sin(t) * ad.cos(2.0), (x,), (1.0,))

    def f_jax(x):
        return jax.jvp(lambda t: jnp.sin(t) * jnp.cos(2.0), (x,), (1.0,))

    jaxpr, consts, out_tree = ad.make_jaxpr(f, SCALAR)
    names = Counter(eqn_names(jaxpr))
    # sin t and its derivative's cos t (jvp rules), and cos 2.0: not a jvp
    # operation (2.0 has no tangent), but staged all the same.
    assert names["sin"] == 1 and names["cos"] == 2
    cos_inputs = [e.inputs[0] for e in jaxpr.eqns if e.primitive.name == "cos"]
    assert any(isinstance(x, ad.Lit) and float(x.val) == 2.0 for x in cos_inputs)
    for x in (0.3, -1.2):
        ours = ad.tree_unflatten(out_tree, ad.eval_jaxpr(jaxpr, [*consts, x]))
        assert_matches(ours, f_jax(x))


@pytest.mark.parametrize("seed", SEEDS)
def test_make_jaxpr_of_jvp_with_pytrees(seed):
    """make_jaxpr of a function that runs jvp, with tuples in and out: the
    jaxpr computes JAX's jvp."""
    prog, rng, inputs = setup(seed)
    tangents = random_arrays(rng, prog.in_shapes)
    f, f_jax = program_fns(prog)
    avals = tuple(avals_of(prog.in_shapes))
    jaxpr, consts, out_tree = ad.make_jaxpr(
        lambda xs, ts: ad.jvp(f, xs, ts), avals, avals
    )
    ad.typecheck_jaxpr(jaxpr)
    flat = ad.eval_jaxpr(jaxpr, [*consts, *inputs, *tangents])
    ours = ad.tree_unflatten(out_tree, flat)
    theirs = jax.jit(lambda xs, ts: jax.jvp(f_jax, xs, ts))(
        tuple(inputs), tuple(tangents)
    )
    assert_matches(ours, theirs)


@pytest.mark.parametrize("seed", SEEDS)
def test_make_jaxpr_of_vmap(seed):
    """make_jaxpr of a vmapped program computes JAX's vmap."""
    prog, rng, _ = setup(seed)
    in_axes, shapes = batch_axes(rng, prog.in_shapes, 3)
    args = random_arrays(rng, shapes)
    out_axes = random_out_axis(rng, prog.out_shapes)
    f, f_jax = program_fns(prog)
    batched = ad.vmap(f, tuple(in_axes), out_axes)
    jaxpr, consts, out_tree = ad.make_jaxpr(batched, *avals_of(shapes))
    ad.typecheck_jaxpr(jaxpr)
    ours = ad.tree_unflatten(out_tree, ad.eval_jaxpr(jaxpr, [*consts, *args]))
    assert_matches(ours, jax.jit(jax.vmap(f_jax, tuple(in_axes), out_axes))(*args))


@pytest.mark.parametrize("seed", SEEDS)
def test_jvp_of_eval_jaxpr(seed):
    """jvp of the jaxpr (as a function) = jvp of the program = JAX's jvp."""
    prog, rng, inputs = setup(seed)
    tangents = tuple(random_arrays(rng, prog.in_shapes))
    g, g_jax, _ = with_constant(prog, seed)
    jaxpr, consts, _ = ad.make_jaxpr(g, *avals_of(prog.in_shapes))

    def from_jaxpr(*xs):
        return tuple(ad.eval_jaxpr(jaxpr, [*consts, *xs]))

    ours = ad.jvp(from_jaxpr, tuple(inputs), tangents)
    assert_matches(ours, ad.jvp(g, tuple(inputs), tangents))
    assert_matches(
        ours, jax.jit(lambda p, t: jax.jvp(g_jax, p, t))(tuple(inputs), tangents)
    )


@pytest.mark.parametrize("seed", SEEDS)
def test_vmap_of_eval_jaxpr(seed):
    """vmap of the jaxpr (as a function) = vmap of the program = JAX's vmap,
    with the jaxpr's constants unbatched."""
    prog, rng, _ = setup(seed)
    in_axes, shapes = batch_axes(rng, prog.in_shapes, 2)
    args = random_arrays(rng, shapes)
    out_axes = random_out_axis(rng, prog.out_shapes)
    g, g_jax, _ = with_constant(prog, seed)
    jaxpr, consts, _ = ad.make_jaxpr(g, *avals_of(prog.in_shapes))
    n = len(consts)
    as_fun = ad.jaxpr_as_fun(jaxpr)
    batched = ad.vmap(
        lambda *xs: tuple(as_fun(*xs)), (None,) * n + tuple(in_axes), out_axes
    )
    ours = batched(*consts, *args)
    assert_matches(ours, ad.vmap(g, tuple(in_axes), out_axes)(*args))
    assert_matches(ours, jax.jit(jax.vmap(g_jax, tuple(in_axes), out_axes))(*args))


@pytest.mark.parametrize("seed", SEEDS)
def test_tracing_eval_jaxpr_gives_the_same_jaxpr(seed):
    """make_jaxpr of eval_jaxpr of a jaxpr is the same program: same equations
    and params in order, same type, same printed text, same values. The
    constants of the first jaxpr become ordinary inputs of the second."""
    prog, _, inputs = setup(seed)
    g, _, _ = with_constant(prog, seed)
    jaxpr, consts, _ = ad.make_jaxpr(g, *avals_of(prog.in_shapes))
    in_avals = ad.typecheck_jaxpr(jaxpr).in_types
    again, consts_again, _ = ad.make_jaxpr(ad.jaxpr_as_fun(jaxpr), *in_avals)
    assert consts_again == []
    assert [(e.primitive, e.params) for e in again.eqns] == [
        (e.primitive, e.params) for e in jaxpr.eqns
    ]
    assert ad.typecheck_jaxpr(again) == ad.typecheck_jaxpr(jaxpr)
    assert str(again) == str(jaxpr)
    assert_matches(
        ad.eval_jaxpr(again, [*consts, *inputs]),
        ad.eval_jaxpr(jaxpr, [*consts, *inputs]),
    )


def test_make_jaxpr_inside_jvp_closes_over_the_outer_tracer():
    """Inside jvp, a jaxpr that closes over the differentiated value takes it as
    a constant; evaluating it under jvp gives JAX's derivative."""

    def f(x):
        jaxpr, consts, _ = ad.make_jaxpr(lambda y: ad.sin(x) * y, SCALAR)
        assert len(consts) == 1 and isinstance(consts[0], ad.Tracer)
        return ad.eval_jaxpr(jaxpr, [*consts, 2.0])[0]

    for x in (0.3, 2.0):
        assert_matches(
            ad.jvp(f, (x,), (1.0,)), jax.jvp(lambda x: jnp.sin(x) * 2.0, (x,), (1.0,))
        )
    assert_state_clean()


def test_make_jaxpr_of_jacfwd():
    """jacfwd (vmap of jvp) traces into a jaxpr computing JAX's Jacobian."""

    def f(x):
        total = ad.broadcast(ad.reduce_sum(ad.cos(x) * x), (3,), (0,))
        return ad.sin(x) * total + 0.5 * x

    def f_jax(x):
        return jnp.sin(x) * jnp.sum(jnp.cos(x) * x) + 0.5 * x

    x = np.array([0.3, -1.0, 2.0])
    jaxpr, consts, _ = ad.make_jaxpr(ad.jacfwd(f), VEC3)
    assert ad.typecheck_jaxpr(jaxpr).out_types == [ad.ShapedArray((3, 3), F64)]
    assert_matches(ad.eval_jaxpr(jaxpr, [*consts, x])[0], jax.jacfwd(f_jax)(x))


# ---------------------------------------------------------------------------
# Pytrees in and out
# ---------------------------------------------------------------------------


def test_pytrees_in_and_out():
    """Dict/tuple/list/None inputs and outputs: leaves in JAX's order,
    out_tree rebuilds the output structure."""

    def make(ops):
        def f(params, xs):
            w, b = params["w"], params["b"]
            first, (second, nothing) = xs
            assert nothing is None
            h = ops.add(ops.mul(w, first), b)
            return {"h": h, "parts": [ops.sin(second), (ops.neg(w),)], "none": None}

        return f

    ours_f = make(ad)
    jax_f = make(
        SimpleNamespace(add=jnp.add, mul=jnp.multiply, sin=jnp.sin, neg=jnp.negative)
    )
    params = {"w": np.array([0.5, -1.0, 2.0]), "b": np.array([1.0, 0.0, -1.0])}
    xs = (np.array([3.0, 4.0, 5.0]), (np.array([[0.1, 0.2]]), None))
    avals = jax.tree_util.tree_map(lambda a: ad.ShapedArray(a.shape, a.dtype), params)
    xs_avals = (VEC3, (ad.ShapedArray((1, 2), F64), None))
    jaxpr, consts, out_tree = ad.make_jaxpr(ours_f, avals, xs_avals)
    leaves = jax.tree_util.tree_leaves((params, xs))
    assert [v.aval.shape for v in jaxpr.in_binders[len(consts) :]] == [
        np.shape(leaf) for leaf in leaves
    ]
    flat = ad.eval_jaxpr(jaxpr, [*consts, *leaves])
    ours = ad.tree_unflatten(out_tree, flat)
    assert out_tree == ad.tree_flatten(ours_f(params, xs))[1]
    assert_matches(ours, jax_f(params, xs))
    # Arrays may stand for their own types.
    jaxpr2, _, out_tree2 = ad.make_jaxpr(ours_f, params, xs)
    assert str(jaxpr2) == str(jaxpr) and out_tree2 == out_tree


def test_outputs_that_are_inputs_literals_or_repeated():
    """Returning an input, a Python number, a NumPy array and one value twice."""
    ones = np.ones((2, 2))

    def f(x, y):
        z = ad.sin(x)
        return x, 3.0, ones, z, z, y

    jaxpr, consts, out_tree = ad.make_jaxpr(f, VEC3, SCALAR)
    assert jaxpr.outs[0] is jaxpr.in_binders[len(consts)]
    assert jaxpr.outs[5] is jaxpr.in_binders[len(consts) + 1]
    assert isinstance(jaxpr.outs[1], ad.Lit)
    assert jaxpr.outs[3] is jaxpr.outs[4]
    assert len(consts) == 1 and consts[0] is ones
    x, y = np.array([0.1, 0.2, 0.3]), np.array(-1.5)
    ours = ad.tree_unflatten(out_tree, ad.eval_jaxpr(jaxpr, [*consts, x, y]))
    assert_matches(ours, (x, np.array(3.0), ones, np.sin(x), np.sin(x), y))


def test_example_arrays_and_numbers_stand_for_their_types():
    """make_jaxpr accepts arrays and Python numbers in place of avals."""
    j1, _, _ = ad.make_jaxpr(lambda x, n: ad.mul(x, x), np.zeros(3), 1.0)
    j2, _, _ = ad.make_jaxpr(lambda x, n: ad.mul(x, x), VEC3, SCALAR)
    assert str(j1) == str(j2)
    j3, _, _ = ad.make_jaxpr(lambda x: ad.neg(x), np.zeros((2,), np.int32))
    assert ad.typecheck_jaxpr(j3).in_types == [ad.ShapedArray((2,), np.int32)]


def test_float32_and_int_programs_keep_their_dtypes():
    """Types follow the inputs' dtypes, as in JAX (no promotion)."""

    def f(x, i):
        return ad.sin(x) * 2.0 + x, ad.neg(i) * 3, i > 1

    def f_jax(x, i):
        return jnp.sin(x) * 2.0 + x, -i * 3, i > 1

    x = np.array([0.5, 1.5], np.float32)
    i = np.array([1, 2], np.int32)
    jaxpr, consts, out_tree = ad.make_jaxpr(f, x, i)
    jax_outs = jax.eval_shape(f_jax, x, i)
    assert ad.typecheck_jaxpr(jaxpr).out_types == [
        ad.ShapedArray(o.shape, o.dtype) for o in jax_outs
    ]
    ours = ad.tree_unflatten(out_tree, ad.eval_jaxpr(jaxpr, [*consts, x, i]))
    theirs = f_jax(x, i)
    for mine, ref in zip(ours, theirs):
        assert mine.dtype == ref.dtype
        np.testing.assert_allclose(mine, ref, rtol=1e-6)


# ---------------------------------------------------------------------------
# The printer
# ---------------------------------------------------------------------------


def expected_names() -> Any:
    """a, b, ..., z, aa, ab, ..., zz, aaa, ...: the names in binding order."""
    for length in itertools.count(1):
        for letters in itertools.product(string.ascii_lowercase, repeat=length):
            yield "".join(letters)


BINDER = r"([a-z]+):(\w+)\[([\d,]*)\]"
EQN_LINE = re.compile(
    r"    (?P<outs>(?:[a-z]+:\w+\[[\d,]*\] ?)+) = (?P<prim>\w+)"
    r"(?P<params>\[[^\]]*\])?(?: (?P<args>.*))?"
)


def check_printed(jaxpr: ad.Jaxpr) -> str:
    """Parse ``str(jaxpr)`` and check it against the jaxpr's structure."""
    text = str(jaxpr)
    lines = text.splitlines()
    assert len(lines) == len(jaxpr.eqns) + 2
    header, *body, footer = lines
    found = re.fullmatch(r"\{ lambda (.*)\. let", header)
    assert found, header
    names = expected_names()
    var_of: dict[str, ad.Var] = {}

    def check_binders(text: str, binders: Sequence[ad.Var]) -> None:
        printed = re.findall(BINDER, text)
        assert len(printed) == len(binders)
        for (name, dtype, dims), var in zip(printed, binders):
            assert name == next(names), "names are handed out in binding order"
            assert name not in var_of, f"{name} bound twice"
            assert f"{dtype}[{dims}]" == short_type(var.aval.shape, var.aval.dtype)
            var_of[name] = var

    def check_atoms(tokens: Sequence[str], atoms: Sequence[Any]) -> None:
        assert len(tokens) == len(atoms)
        for token, atom in zip(tokens, atoms):
            if isinstance(atom, ad.Lit):  # inline, as the value itself
                assert token not in var_of
                assert np.asarray(ast.literal_eval(token)) == atom.val
            else:
                assert var_of.get(token) is atom, f"{token} used before bound"

    check_binders(found.group(1), jaxpr.in_binders)
    for line, eqn in zip(body, jaxpr.eqns):
        parts = EQN_LINE.fullmatch(line)
        assert parts, line
        assert parts["prim"] == eqn.primitive.name
        if eqn.params:
            for key in eqn.params:
                assert f"{key}=" in parts["params"]
        else:
            assert parts["params"] is None
        args = (parts["args"] or "").split()
        check_atoms(args, eqn.inputs)  # inputs are bound before the outputs
        check_binders(parts["outs"], eqn.out_binders)
    found = re.fullmatch(r"  in \( (.*) \) \}", footer)
    assert found, footer
    check_atoms(found.group(1).split(), jaxpr.outs)
    return text


@pytest.mark.parametrize("seed", SEEDS)
def test_printer_on_random_programs(seed):
    prog, _, _ = setup(seed)
    g, _, _ = with_constant(prog, seed)
    check_printed(ad.make_jaxpr(g, *avals_of(prog.in_shapes))[0])


def test_printer_literals_inline():
    text = check_printed(ad.make_jaxpr(lambda x: x * 2.5 + (-1.0), SCALAR)[0])
    assert re.search(r"= mul a 2\.5$", text, re.M)
    assert re.search(r"= add b -1\.0$", text, re.M)
    text = check_printed(ad.make_jaxpr(lambda: ad.mul(2.0, 2.0))[0])
    assert "= mul 2.0 2.0" in text
    assert "lambda . let" in text


def test_printer_names_beyond_z():
    """More than 26 variables: names continue aa, ab, ..."""

    def long_chain(x):
        for _ in range(60):
            x = ad.sin(x)
        return x

    text = check_printed(ad.make_jaxpr(long_chain, VEC3)[0])
    assert "aa:float64[3] = sin z" in text
    assert "in ( bi ) }" in text  # the 61st name


def test_printer_hand_made_jaxpr():
    """A jaxpr built by hand prints; params go in brackets."""
    x, y, three, z = (ad.Var(ad.ShapedArray((3,), F64)) for _ in range(4))
    jaxpr = ad.Jaxpr(
        [x],
        [
            ad.JaxprEqn(ad.sin_p, [x], {}, [y]),
            ad.JaxprEqn(
                ad.broadcast_p, [ad.Lit(3.0)], {"shape": (3,), "axes": (0,)}, [three]
            ),
            ad.JaxprEqn(ad.mul_p, [y, three], {}, [z]),
        ],
        [z],
    )
    text = check_printed(jaxpr)
    assert "c:float64[3] = broadcast[axes=(0,) shape=(3,)] 3.0" in text
    assert str(ad.typecheck_jaxpr(jaxpr)) == "(float64[3]) -> (float64[3])"


# ---------------------------------------------------------------------------
# Interpreter state
# ---------------------------------------------------------------------------


def test_state_clean_after_make_jaxpr():
    ad.make_jaxpr(lambda x: ad.sin(x) * 2.0, VEC3)
    assert_state_clean()
    ad.make_jaxpr_v1(lambda x: ad.sin(x) * 2.0, VEC3)
    assert_state_clean()


def _raise_inside(x):
    ad.sin(x)
    raise RuntimeError("boom")


@pytest.mark.parametrize(
    "thunk, exc",
    [
        (lambda: ad.make_jaxpr(_raise_inside, VEC3), RuntimeError),
        (
            lambda: ad.make_jaxpr(lambda x: ad.sin(x) if x > 0.0 else x, SCALAR),
            ad.ConcretizationError,
        ),
        (lambda: ad.make_jaxpr(lambda x: "no", VEC3), TypeError),
        (
            lambda: ad.make_jaxpr(lambda x: ad.jvp(_raise_inside, (x,), (x,)), VEC3),
            RuntimeError,
        ),
        (
            lambda: ad.make_jaxpr(
                lambda x: ad.make_jaxpr(lambda y: ad.add(x, y), SCALAR), VEC3
            ),
            TypeError,
        ),
        (
            lambda: ad.jvp(lambda x: ad.make_jaxpr(_raise_inside, x), (1.0,), (1.0,)),
            RuntimeError,
        ),
        (
            lambda: ad.vmap(lambda x: ad.make_jaxpr_v1(_raise_inside, x))(np.ones(2)),
            RuntimeError,
        ),
    ],
)
def test_state_clean_after_exception(thunk, exc):
    """Whatever goes wrong while tracing, the stack and dynamic level are
    restored, and staging and eager evaluation work as before."""
    with pytest.raises(exc):
        thunk()
    assert_state_clean()
    jaxpr, _, _ = ad.make_jaxpr(lambda: ad.mul(2.0, 2.0))
    assert eqn_names(jaxpr) == ["mul"]
    out = ad.mul(2.0, 3.0)
    assert not isinstance(out, ad.Tracer) and float(out) == 6.0
    assert_state_clean()


def test_threads_trace_independently():
    """Two threads tracing at the same time record only their own equations."""
    barrier = threading.Barrier(2, timeout=10)
    results: dict[str, Any] = {}

    def work(name: str) -> None:
        op = getattr(ad, name)

        def f(x):
            for _ in range(3):
                barrier.wait()  # both threads are inside make_jaxpr
                x = op(x)
                ad.mul(2.0, 2.0)  # constant-only: staged in this thread
            return x * 2.0

        try:
            results[name] = ad.make_jaxpr(f, VEC3)[0]
        except Exception as err:  # reported by the main thread
            results[name] = err

    threads = [threading.Thread(target=work, args=(n,)) for n in ("sin", "cos")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for name in ("sin", "cos"):
        jaxpr = results[name]
        assert isinstance(jaxpr, ad.Jaxpr), jaxpr
        assert Counter(eqn_names(jaxpr)) == {name: 3, "mul": 4, "broadcast": 1}
    assert_state_clean()


# ---------------------------------------------------------------------------
# Sanity of the reference: the program interpreters agree with NumPy
# ---------------------------------------------------------------------------


def test_lax_ops_agree_with_jnp_ops():
    """LaxOps (used for equation counts) computes what the Part 1 reference
    JaxOps computes, so the two JAX spellings describe the same program."""
    for seed in SCALAR_FREE_SEEDS[:5]:
        prog, _, inputs = setup(seed)
        ours = run(prog, LaxOps, inputs)
        ref = run(prog, JaxOps, inputs)
        for a, b in zip(ours, ref):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=TOL)
