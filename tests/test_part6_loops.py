"""Tests of Part 6: loops with ``while_loop`` and ``fori_loop``.

Each program is written once against a small namespace of operations and run
twice: with autodidax and with jax.lax/jax.numpy. Results must agree to 1e-9
in float64 (tests/conftest.py switches JAX's x64 mode on) under eval, jit,
jvp, vmap (shared and per-example predicates, partly batched carries, batched
closed-over constants) and the pairs jit(vmap), vmap(jit), jvp(jit),
jit(jvp), vmap(jvp), jvp(vmap). Around that: the jaxpr (one ``while``
equation, whatever the trip count), the lowering, the registries, a
100,000-step jitted loop, and every error the chapter promises.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import nothing_compiled, raises_clearly
from jax import lax

import autodidax as ad

TOL = 1e-9
F64 = np.float64

OURS = SimpleNamespace(
    name="autodidax",
    jit=ad.jit,
    jvp=ad.jvp,
    vmap=ad.vmap,
    while_loop=ad.while_loop,
    fori_loop=ad.fori_loop,
    cond=ad.cond,
    sin=ad.sin,
    cos=ad.cos,
    select=ad.select,
    reduce_sum=lambda x: ad.reduce_sum(x, 0),
    to_float=lambda i: ad.convert_element_type(i, F64),
)
JAX = SimpleNamespace(
    name="jax",
    jit=jax.jit,
    jvp=jax.jvp,
    vmap=jax.vmap,
    while_loop=lax.while_loop,
    fori_loop=lax.fori_loop,
    cond=lax.cond,
    sin=jnp.sin,
    cos=jnp.cos,
    select=lax.select,
    reduce_sum=lambda x: jnp.sum(x, 0),
    to_float=lambda i: jnp.asarray(i, F64),
)


# ---------------------------------------------------------------------------
# Programs: (L, *args) -> outputs, for L in (OURS, JAX)
# ---------------------------------------------------------------------------


def newton(L, a):
    """Newton's method for sqrt(a): a trip count that depends on a (closed
    over by both functions), and an integer counter in the carry."""

    def cond_fun(carry):
        x, _ = carry
        return x * x - a > 1e-12 * a

    def body_fun(carry):
        x, steps = carry
        return (x + a / x) * 0.5, steps + 1

    return L.while_loop(cond_fun, body_fun, (a + 1.0, 0))


def tower(L, x, w):
    """y -> y * w + sin(y) from x until y reaches 10 (x > 0, w >= 1.5)."""

    def body_fun(carry):
        i, y = carry
        return i + 1, y * w + L.sin(y)

    return L.while_loop(lambda c: c[1] < 10.0, body_fun, (0, x))


def shift(L, x, w):
    """A fixed trip count (a predicate nobody batches) and a carry (x, y, z)
    -> (x * w, x, y): tangents and batch axes reach y and z only after one and
    two trips, so the fixed points of jvp and vmap need several rounds."""

    def body_fun(carry):
        i, (x, y, z) = carry
        return i + 1, (x * w + L.sin(y), x, y * z)

    zero = x * 0.0
    return L.while_loop(lambda c: c[0] < 6, body_fun, (0, (x, zero + 1.0, zero + 2.0)))


def pytree_carry(L, v, s):
    """A dict carry with a vector, a scalar and an integer, and a per-element
    select in the body."""

    def cond_fun(c):
        return c["n"] < 5

    def body_fun(c):
        v = L.select(c["v"] > 1.0, c["v"] * s, c["v"] + L.cos(c["v"]))
        return {"v": v, "s": c["s"] + L.reduce_sum(v), "n": c["n"] + 1}

    return L.while_loop(cond_fun, body_fun, {"v": v, "s": s * 0.0, "n": 0})


def fori(L, x, w):
    """fori_loop with Python-int bounds, the index used as a float."""

    def body_fun(i, c):
        return c * w + L.sin(c) * L.to_float(i)

    return L.fori_loop(0, 7, body_fun, x)


def fori_nested_cond(L, x, w):
    """fori_loop whose body holds a cond on the carry and a while_loop of its
    own (a nested loop with its own trip count)."""

    def inner(c):
        return L.while_loop(lambda y: y < 3.0, lambda y: y * 1.5 + 0.1, c + 0.5)

    def body_fun(i, c):
        c = L.cond(c > 2.0, lambda c: c * w * 0.5, lambda c: L.sin(c) + w, c)
        return inner(c) * 0.25 + L.to_float(i) * 0.1

    return L.fori_loop(1, 5, body_fun, x)


@dataclass(frozen=True)
class Program:
    name: str
    fn: Callable
    args: tuple  # for eval, jit, jvp
    batch: tuple  # batched arguments for vmap
    in_axes: Any = 0


B_POS = np.array([0.7, 1.3, 2.9])
PROGRAMS = [
    Program("newton", newton, (F64(2.0),), (np.array([2.0, 0.01, 1e6, 1e-6]),)),
    Program("tower", tower, (F64(0.5), F64(1.5)), (B_POS, np.array([1.5, 2.0, 3.0]))),
    Program(  # only the weight, a closed-over constant, is batched
        "tower_batched_const",
        tower,
        (F64(1.0), F64(1.7)),
        (F64(1.0), np.array([1.5, 2.0, 3.0])),
        (None, 0),
    ),
    Program("shift", shift, (F64(0.3), F64(0.9)), (B_POS, np.array([0.5, 0.9, 1.1]))),
    Program(  # only x is batched: y, z get batched inside the loop
        "shift_partly_batched",
        shift,
        (F64(0.3), F64(0.9)),
        (B_POS, F64(0.8)),
        (0, None),
    ),
    Program(
        "pytree",
        pytree_carry,
        (np.array([0.5, 1.5, 2.5]), F64(1.1)),
        (np.array([[0.5, 1.5, 2.5], [2.0, 0.1, 1.0]]), np.array([1.1, 0.9])),
    ),
    Program("fori", fori, (F64(0.4), F64(0.8)), (B_POS, np.array([0.5, 0.8, 1.0]))),
    Program(
        "fori_nested_cond",
        fori_nested_cond,
        (F64(0.4), F64(0.8)),
        (np.array([0.4, 2.5, 1.0]), np.array([0.8, 0.3, 1.2])),
    ),
]
IDS = [p.name for p in PROGRAMS]


def function(program: Program, L: SimpleNamespace) -> Callable:
    return lambda *args: program.fn(L, *args)


def tangents_for(args: tuple) -> tuple:
    rng = np.random.default_rng(len(args))
    return tuple(np.asarray(rng.uniform(0.5, 1.5, np.shape(a))) for a in args)


def assert_same(ours: Any, theirs: Any) -> None:
    """Same pytree structure, and leaves equal to TOL (float0 tangents of
    integer outputs in JAX are zeros here)."""
    ours_leaves, ours_tree = jax.tree_util.tree_flatten(ours)
    their_leaves, their_tree = jax.tree_util.tree_flatten(theirs)
    assert ours_tree == their_tree, (ours_tree, their_tree)
    for x, y in zip(ours_leaves, their_leaves):
        x = np.asarray(x)
        if y.dtype == jax.dtypes.float0:
            assert not np.any(x), x
            continue
        y = np.asarray(y)
        assert x.shape == y.shape and x.dtype == y.dtype, (x, y)
        np.testing.assert_allclose(x, y, rtol=TOL, atol=TOL)


# Each transformation, given a namespace, a function and a program's arguments.
def t_eval(L, f, p):
    return f(*p.args)


def t_jit(L, f, p):
    return L.jit(f)(*p.args)


def t_jvp(L, f, p):
    return L.jvp(f, p.args, tangents_for(p.args))


def t_vmap(L, f, p):
    return L.vmap(f, p.in_axes)(*p.batch)


def t_jit_vmap(L, f, p):
    return L.jit(L.vmap(f, p.in_axes))(*p.batch)


def t_vmap_jit(L, f, p):
    return L.vmap(L.jit(f), p.in_axes)(*p.batch)


def t_jvp_jit(L, f, p):
    return L.jvp(L.jit(f), p.args, tangents_for(p.args))


def t_jit_jvp(L, f, p):
    return L.jit(lambda *a: L.jvp(f, a, tangents_for(p.args)))(*p.args)


def t_vmap_jvp(L, f, p):
    def f_jvp(*args):
        return L.jvp(f, args, tuple(a * 0.0 + 1.0 for a in args))

    return L.vmap(f_jvp, p.in_axes)(*p.batch)


def t_jvp_vmap(L, f, p):
    return L.jvp(L.vmap(f, p.in_axes), p.batch, tangents_for(p.batch))


TRANSFORMS = {
    "eval": t_eval,
    "jit": t_jit,
    "jvp": t_jvp,
    "vmap": t_vmap,
    "jit(vmap)": t_jit_vmap,
    "vmap(jit)": t_vmap_jit,
    "jvp(jit)": t_jvp_jit,
    "jit(jvp)": t_jit_jvp,
    "vmap(jvp)": t_vmap_jvp,
    "jvp(vmap)": t_jvp_vmap,
}


@pytest.mark.parametrize("transform", list(TRANSFORMS))
@pytest.mark.parametrize("program", PROGRAMS, ids=IDS)
def test_agrees_with_jax(program: Program, transform: str) -> None:
    run = TRANSFORMS[transform]
    ours = run(OURS, function(program, OURS), program)
    theirs = run(JAX, function(program, JAX), program)
    assert_same(ours, theirs)


def test_newton_matches_numpy_and_the_analytic_derivative() -> None:
    numbers = np.array([2.0, 0.01, 1e6, 1e-6, 7.0])
    roots, steps = ad.vmap(lambda a: newton(OURS, a))(numbers)
    np.testing.assert_allclose(roots, np.sqrt(numbers), rtol=1e-10)
    assert len(set(np.asarray(steps).tolist())) > 1  # trip counts differ
    slopes = ad.vmap(lambda a: ad.jvp(lambda a: newton(OURS, a)[0], (a,), (1.0,))[1])(
        numbers
    )
    np.testing.assert_allclose(slopes, 0.5 / np.sqrt(numbers), rtol=1e-8)


def test_vmap_per_example_steps_equal_one_by_one() -> None:
    numbers = np.array([2.0, 0.01, 1e6])
    _, steps = ad.vmap(lambda a: newton(OURS, a))(numbers)
    one_by_one = [int(newton(OURS, a)[1]) for a in numbers]
    assert np.asarray(steps).tolist() == one_by_one


def test_vmap_with_batch_axis_not_first() -> None:
    vs = np.array([[0.7, 1.3], [2.9, 0.4], [1.0, 1.0]])  # examples along axis 1
    ours = ad.vmap(lambda v: pytree_carry(OURS, v, 1.2), 1)(vs)
    theirs = jax.vmap(lambda v: pytree_carry(JAX, v, 1.2), 1)(vs)
    assert_same(ours, theirs)


# ---------------------------------------------------------------------------
# make_jaxpr, printing, abstract evaluation, lowering, registries
# ---------------------------------------------------------------------------


def counting_loop(n: int) -> Callable:
    def f(x):
        def body(carry):
            i, x = carry
            return i + 1, x * 0.99999 + 0.001

        return ad.while_loop(lambda c: c[0] < n, body, (0, x))[1]

    return f


SCALAR = ad.ShapedArray((), F64)


def test_one_while_equation_whatever_the_trip_count() -> None:
    jaxprs = [ad.make_jaxpr(counting_loop(n), SCALAR)[0] for n in (1, 10, 100_000)]
    for jaxpr in jaxprs:
        assert [e.primitive.name for e in jaxpr.eqns] == ["while"]
        ad.typecheck_jaxpr(jaxpr)
    sizes = {len(j.eqns[0].params["body_jaxpr"].eqns) for j in jaxprs}
    assert sizes == {3}
    fori_jaxprs = [
        ad.make_jaxpr(lambda x, n=n: ad.fori_loop(0, n, lambda i, c: c * x, x), SCALAR)[
            0
        ]
        for n in (2, 100_000)
    ]
    assert [len(j.eqns) for j in fori_jaxprs] == [1, 1]


def test_jaxpr_params_and_printing() -> None:
    jaxpr = ad.make_jaxpr(lambda a: newton(OURS, a), SCALAR)[0]
    (eqn,) = [e for e in jaxpr.eqns if e.primitive.name == "while"]
    assert eqn.params["cond_nconsts"] == 1 and eqn.params["body_nconsts"] == 1
    text = str(jaxpr)
    for word in ("while[", "body_jaxpr =", "cond_jaxpr =", "gt", "div"):
        assert word in text


def test_a_100000_step_jitted_loop_agrees_with_jax() -> None:
    def program(L, x):
        def body(carry):
            i, x = carry
            return i + 1, x * 0.99999 + L.sin(x) * 1e-5

        return L.while_loop(lambda c: c[0] < 100_000, body, (0, x))

    ours = ad.jit(lambda x: program(OURS, x))(F64(3.0))
    theirs = jax.jit(lambda x: program(JAX, x))(F64(3.0))
    assert_same(ours, theirs)
    assert int(np.asarray(ours[0])) == 100_000


def test_lowering_is_a_stablehlo_while() -> None:
    jaxpr = ad.make_jaxpr(lambda a: newton(OURS, a), SCALAR)[0]
    text = str(ad.lower_jaxpr(jaxpr))
    assert text.count("stablehlo.while") == 1
    assert "stablehlo.if" not in text


def test_abstract_eval_checks_hand_built_loops() -> None:
    jaxpr = ad.make_jaxpr(lambda a: newton(OURS, a), SCALAR)[0]
    (eqn,) = jaxpr.eqns[-1:]
    params = dict(eqn.params)
    params["cond_jaxpr"], params["body_jaxpr"] = (
        params["body_jaxpr"],
        params["cond_jaxpr"],
    )
    bad = ad.Jaxpr(
        jaxpr.in_binders, [*jaxpr.eqns[:-1], eqn._replace(params=params)], jaxpr.outs
    )
    with pytest.raises(TypeError, match="cond_jaxpr has type"):
        ad.typecheck_jaxpr(bad)


def test_registries() -> None:
    prim = ad.PRIMITIVES["while"]
    assert prim is ad.while_p
    for kind in ad.RULE_KINDS:
        if kind == "transpose":
            assert kind not in prim.rules and "while" in ad.NOT_LINEAR
        else:
            assert kind in prim.rules, kind


def test_jvp_keeps_untouched_loops_as_they_are() -> None:
    """A loop that no tangent reaches stays the original loop, so grad of a
    function that only uses its result as a constant works."""

    def f(L, x):
        root = newton(L, F64(4.0))[0]
        return x * root + L.sin(x)

    ours = ad.grad(lambda x: f(OURS, x))(F64(0.3))
    theirs = jax.grad(lambda x: f(JAX, x))(F64(0.3))
    np.testing.assert_allclose(ours, theirs, rtol=TOL)
    jaxpr = ad.make_jaxpr(lambda x: ad.jvp(lambda x: f(OURS, x), (x,), (1.0,)), SCALAR)[
        0
    ]
    (loop,) = [e for e in jaxpr.eqns if e.primitive.name == "while"]
    assert len(loop.out_binders) == 2  # x and the counter: no tangent carry


def test_jvp_carries_tangents_only_where_needed() -> None:
    jaxpr = ad.make_jaxpr(
        lambda x: ad.jvp(lambda x: newton(OURS, x), (x,), (1.0,)), SCALAR
    )[0]
    (loop,) = [e for e in jaxpr.eqns if e.primitive.name == "while"]
    types = [v.aval.str_short() for v in loop.out_binders]
    assert types == ["float64[]", "int64[]", "float64[]"]  # no counter tangent


def test_vmap_shared_predicate_keeps_the_counter_unbatched() -> None:
    jaxpr = ad.make_jaxpr(ad.vmap(counting_loop(10)), ad.ShapedArray((4,), F64))[0]
    (loop,) = [e for e in jaxpr.eqns if e.primitive.name == "while"]
    types = [v.aval.str_short() for v in loop.out_binders]
    assert types == ["int64[]", "float64[4]"]
    body = loop.params["body_jaxpr"]
    assert "select" not in {e.primitive.name for e in body.eqns}


def test_vmap_batched_predicate_selects_per_example() -> None:
    jaxpr = ad.make_jaxpr(
        ad.vmap(lambda a: newton(OURS, a)), ad.ShapedArray((4,), F64)
    )[0]
    (loop,) = [e for e in jaxpr.eqns if e.primitive.name == "while"]
    body = loop.params["body_jaxpr"]
    assert [e.primitive.name for e in body.eqns].count("select") == 2
    cond_out = loop.params["cond_jaxpr"].outs[0].aval
    assert cond_out == ad.ShapedArray((), np.bool_)


def test_fori_loop_with_traced_bounds_under_jit_and_vmap() -> None:
    def basel(L, n):
        return L.fori_loop(1, n, lambda k, t: t + 1.0 / (L.to_float(k) ** 2), 0.0)

    ns = np.array([2, 11, 101, 1], dtype=np.int64)
    for n in ns:
        assert_same(
            ad.jit(lambda n: basel(OURS, n))(n), jax.jit(lambda n: basel(JAX, n))(n)
        )
    assert_same(
        ad.vmap(lambda n: basel(OURS, n))(ns), jax.vmap(lambda n: basel(JAX, n))(ns)
    )


def test_fori_loop_bounds_take_each_others_dtype() -> None:
    out = ad.fori_loop(
        np.int32(0), 4, lambda i, c: c + ad.convert_element_type(i, F64), 0.0
    )
    assert float(out) == 6.0
    empty = ad.fori_loop(5, 2, lambda i, c: c + 1.0, 0.0)  # no trips at all
    assert float(empty) == 0.0


# ---------------------------------------------------------------------------
# Errors
# ---------------------------------------------------------------------------


def stack_is_clean() -> None:
    assert len(ad._state.stack) == 1
    assert float(ad.while_loop(lambda x: x < 2.0, lambda x: x + 1.0, 0.0)) == 2.0


def sum_of(v):
    return ad.reduce_sum(v, 0)


BODY_MISTAKES = [
    # (init, body, what the message names: the given type, then the returned)
    (np.ones(3), sum_of, ("float64[3]", "float64[]")),  # another shape
    (0, lambda i: ad.convert_element_type(i, F64), ("int64[]", "float64[]")),  # dtype
    (1.0, lambda x: (x, x), ("float64[]", "(float64[], float64[])")),  # structure
    (
        (1.0, 2.0),
        lambda c: [c[0], c[1]],
        ("(float64[], float64[])", "[float64[], float64[]]"),
    ),
    ({"a": 1.0}, lambda c: {"b": c["a"]}, ("{a: float64[]}", "{b: float64[]}")),
]


@pytest.mark.parametrize("init, body, names", BODY_MISTAKES)
@pytest.mark.parametrize("under_jit", [False, True])
def test_body_must_keep_the_carry_type(init, body, names, under_jit) -> None:
    def run(init):
        return ad.while_loop(lambda c: False, body, init)

    call = ad.jit(run) if under_jit else run
    with raises_clearly(
        TypeError, "body_fun must return a carry", stack_is_clean
    ) as info:
        with nothing_compiled():
            call(init)
    given, returned = names
    message = str(info.value)
    assert f"given, {given}, but it returned {returned}" in message, message


COND_MISTAKES = [
    (lambda x: x, "float64[]"),  # not boolean
    (lambda x: ad.broadcast(x, (3,), (0,)) > 0.0, "bool[3]"),  # not a scalar
    (lambda x: (x > 0.0, x > 1.0), "(bool[], bool[])"),  # not one value
    (lambda x: ad.convert_element_type(x > 0.0, np.int32), "int32[]"),
]


@pytest.mark.parametrize("cond_fun, returned", COND_MISTAKES)
@pytest.mark.parametrize("under_jit", [False, True])
def test_condition_must_be_a_boolean_scalar(cond_fun, returned, under_jit) -> None:
    def run(x):
        return ad.while_loop(cond_fun, lambda x: x * 0.5, x)

    call = ad.jit(run) if under_jit else run
    with raises_clearly(
        TypeError, "cond_fun must return a boolean scalar", stack_is_clean
    ) as info:
        with nothing_compiled():
            call(F64(3.0))
    assert f"returned {returned}" in str(info.value)


def loop_fn(x):
    return newton(OURS, x)[0] * x


def fori_fn(x):
    # A bound that is an array, not a Python int, keeps it a while_loop (with
    # Python-int bounds, Part 7 makes fori_loop a scan, which has reverse mode).
    return ad.fori_loop(0, np.int64(3), lambda i, c: c * x, x)


REVERSE_MODE = {
    "grad": lambda f: ad.grad(f)(F64(2.0)),
    "vjp": lambda f: ad.vjp(f, F64(2.0)),
    "linearize": lambda f: ad.linearize(f, F64(2.0)),
    "jit(grad)": lambda f: ad.jit(ad.grad(f))(F64(2.0)),
    "grad(jit)": lambda f: ad.grad(ad.jit(f))(F64(2.0)),
    "vmap(grad)": lambda f: ad.vmap(ad.grad(f))(np.array([2.0, 3.0])),
}


@pytest.mark.parametrize("how", list(REVERSE_MODE))
@pytest.mark.parametrize("fn", [loop_fn, fori_fn], ids=["while_loop", "fori_loop"])
def test_reverse_mode_is_refused(fn, how) -> None:
    with raises_clearly(
        ad.WhileLoopReverseModeError, "trip count", stack_is_clean
    ) as info:
        REVERSE_MODE[how](fn)
    message = str(info.value)
    assert isinstance(info.value, TypeError)
    assert "scan" in message and "fori_loop" in message and "save" in message


def test_transposing_a_linear_jaxpr_with_a_loop_is_refused() -> None:
    """A hand-made 'linear' jaxpr that contains a while: backward_pass finds
    no transpose rule (while is in NOT_LINEAR), with a readable error."""
    jaxpr = ad.make_jaxpr(counting_loop(3), SCALAR)[0]
    with pytest.raises(NotImplementedError, match="while"):
        ad.backward_pass(jaxpr, [ad.UndefPrimal(SCALAR)], [np.float64(1.0)])


@pytest.mark.parametrize(
    "lower, upper, match",
    [
        (0.0, 3, "lower must be an integer scalar, got float64"),
        (0, np.array([1, 2]), "upper must be an integer scalar, got int64\\[2\\]"),
        (True, 3, "lower must be an integer scalar, got bool"),
        (np.int32(0), np.int64(3), "same dtype, got int32\\[\\] and int64\\[\\]"),
        ("0", 3, "fori_loop: lower"),
    ],
)
def test_fori_loop_bounds_must_be_integer_scalars(lower, upper, match) -> None:
    with raises_clearly(TypeError, match, stack_is_clean):
        ad.fori_loop(lower, upper, lambda i, c: c, 1.0)


def test_fori_loop_bad_bound_under_jit_found_while_tracing() -> None:
    with raises_clearly(TypeError, "upper must be an integer scalar", stack_is_clean):
        with nothing_compiled():
            ad.jit(lambda n: ad.fori_loop(0, n, lambda i, c: c, 1.0))(F64(3.0))
