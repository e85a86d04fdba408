"""Tests of Part 4: partial evaluation, linearize, transposition, vjp and grad.

Random programs come from the Part 1 generator (every Part 1 primitive,
comparisons, Python scalars, ranks 0-3, float64). Each is differentiated with
``linearize``, ``vjp`` and ``grad`` and their compositions with ``jit``,
``jvp`` and ``vmap``, and the results must agree with JAX's to 1e-9. Around
that, structural checks: the two halves of ``partial_eval_jaxpr`` recompose to
the original jaxpr, ``toposort`` is iterative and orders parents first,
``backward_pass`` computes the transposed Jacobian, every transpose rule passes
the dot-product test, deep programs work, and ``linearize`` does its primal
work once.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import count_impl_calls
from jax import lax
from test_part1_differential import (
    SEEDS,
    TOL,
    Program,
    assert_matches,
    batch_axes,
    program_fns,
    random_arrays,
    random_program,
    setup,
)
from test_part3_jit import assert_state_clean, counted, host

import autodidax as ad

pytestmark = pytest.mark.usefixtures("clean_interpreter_stack")

F64 = np.float64
GRAD_SEEDS = SEEDS[:20]
JIT_SEEDS = GRAD_SEEDS[::2]  # compositions with jit compile; fewer seeds
LINEAR_PRIMITIVES = ("add", "sub", "neg", "mul", "reduce_sum", "broadcast", "transpose")


# ---------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------


def vdot(a: Any, b: Any) -> float:
    """The inner product of two arrays (or two pytrees of arrays)."""
    a_leaves = jax.tree_util.tree_leaves(a)
    b_leaves = jax.tree_util.tree_leaves(b)
    assert len(a_leaves) == len(b_leaves)
    return float(
        sum(
            np.vdot(np.asarray(x, F64), np.asarray(y, F64))
            for x, y in zip(a_leaves, b_leaves)
        )
    )


def assert_close(a: float, b: float, scale: float = 1.0) -> None:
    np.testing.assert_allclose(a, b, rtol=TOL, atol=TOL * max(1.0, scale))


def is_float_out(prog: Program, k: int) -> bool:
    return not prog.is_bool[prog.outs[k]]


def cotangents(prog: Program, rng: np.random.Generator) -> tuple[list, list]:
    """Random cotangents for ``prog``'s outputs: autodidax's (boolean zeros for
    boolean outputs) and JAX's (float0 zeros for those)."""
    ours, theirs = [], []
    for k, shape in enumerate(prog.out_shapes):
        if is_float_out(prog, k):
            ct = rng.uniform(-1.0, 1.0, size=shape)
            ours.append(ct)
            theirs.append(ct)
        else:
            ours.append(np.zeros(shape, np.bool_))
            theirs.append(np.zeros(shape, jax.dtypes.float0))
    return ours, theirs


def scalar_fns(prog: Program, seed: int) -> tuple[Callable, Callable]:
    """Scalar losses of all of ``prog``'s inputs: a weighted sum of the main
    (float) output, plus the weighted sums of the other float outputs."""
    rng = np.random.default_rng(30_000 + seed)
    weights = [rng.uniform(-1.0, 1.0, size=s) for s in prog.out_shapes]
    f, f_jax = program_fns(prog)

    def make(fn, mul, total):
        def loss(*xs):
            outs = fn(*xs)
            terms = [
                total(mul(out, w))
                for k, (out, w) in enumerate(zip(outs, weights))
                if is_float_out(prog, k)
            ]
            acc = terms[0]
            for term in terms[1:]:
                acc = acc + term
            return acc

        return loss

    return make(f, ad.mul, ad.reduce_sum), make(f_jax, jnp.multiply, jnp.sum)


def along_line(prog: Program, seed: int, inputs: Sequence) -> tuple[Callable, Callable]:
    """Scalar -> scalar restrictions of the loss: s -> loss(x + s * d) for a
    random direction d (a line through the inputs)."""
    loss, loss_jax = scalar_fns(prog, seed)
    rng = np.random.default_rng(40_000 + seed)
    directions = random_arrays(rng, prog.in_shapes)

    def spread(s, shape):
        return ad.broadcast(s, shape, tuple(range(len(shape)))) if shape else s

    def g(s):
        return loss(*[x + spread(s, x.shape) * d for x, d in zip(inputs, directions)])

    def g_jax(s):
        return loss_jax(*[x + s * d for x, d in zip(inputs, directions)])

    return g, g_jax


def first_rest(fn: Callable) -> Callable:
    """``fn(*xs)`` as a function of (x0, (x1, x2, ...)): a pytree argument."""
    return lambda first, rest: fn(first, *rest)


def pack(xs: Sequence) -> tuple:
    return xs[0], tuple(xs[1:])


def np_tree(tree: Any) -> Any:
    """Every leaf as a NumPy array (device Arrays are copied to the host)."""
    return host(tree, arrays=False)


# ---------------------------------------------------------------------------
# Randomized differential tests against JAX
# ---------------------------------------------------------------------------


def test_seeds_cover_every_primitive():
    kinds, ranks = set(), set()
    for seed in GRAD_SEEDS:
        prog = random_program(seed)
        ranks |= {len(s) for s in prog.in_shapes}
        kinds |= {op.kind for op in prog.ops}
        kinds |= {op.params[0] for op in prog.ops if op.kind == "scalar"}
    assert {
        "neg", "sin", "cos", "add", "mul", "sub", "greater", "less",
        "reduce_sum", "transpose", "broadcast", "scalar",
    } <= kinds  # fmt: skip
    assert ranks == {0, 1, 2, 3}


@pytest.mark.parametrize("seed", GRAD_SEEDS)
def test_linearize(seed):
    """Primal outputs and the linear map on two tangents = JAX's (the
    reference is jax.jvp, which jax.linearize is defined to agree with)."""
    prog, rng, inputs = setup(seed)
    f, f_jax = program_fns(prog)
    primals_out, f_lin = ad.linearize(f, *inputs)
    reference = jax.jit(partial(jax.jvp, f_jax))
    for _ in range(2):
        tangents = random_arrays(rng, prog.in_shapes)
        their_out, their_tangents = reference(tuple(inputs), tuple(tangents))
        assert_matches(np_tree(primals_out), their_out)
        assert_matches(np_tree(f_lin(*tangents)), their_tangents)


@pytest.mark.parametrize("seed", GRAD_SEEDS[:4])
def test_linearize_against_jax_linearize(seed):
    """The same against jax.linearize itself, for a few seeds."""
    prog, rng, inputs = setup(seed)
    f, f_jax = program_fns(prog)
    primals_out, f_lin = ad.linearize(f, *inputs)
    their_out, their_lin = jax.linearize(jax.jit(f_jax), *inputs)
    assert_matches(np_tree(primals_out), their_out)
    tangents = random_arrays(rng, prog.in_shapes)
    assert_matches(np_tree(f_lin(*tangents)), their_lin(*tangents))


def jax_vjp(fn: Callable) -> Callable:
    """(args, ct) -> (f(*args), f_vjp(ct)) with JAX, compiled."""

    def run(args, ct):
        out, f_vjp = jax.vjp(fn, *args)
        return out, f_vjp(ct)

    return jax.jit(run)


@pytest.mark.parametrize("seed", GRAD_SEEDS)
def test_vjp_with_pytrees(seed):
    """vjp of a program taking (x0, (x1, ...)) and returning a dict with a
    list and None inside, on a random cotangent."""
    prog, rng, inputs = setup(seed)
    f, f_jax = program_fns(prog)

    def as_tree(fn):
        def tree_fn(first, rest):
            outs = fn(first, *rest)
            return {"main": outs[0], "rest": (list(outs[1:]), None)}

        return tree_fn

    cts, cts_jax = cotangents(prog, rng)
    ct = {"main": cts[0], "rest": (cts[1:], None)}
    ct_jax = {"main": cts_jax[0], "rest": (cts_jax[1:], None)}
    out, f_vjp = ad.vjp(as_tree(f), *pack(inputs))
    their_out, their_cts = jax_vjp(as_tree(f_jax))(pack(inputs), ct_jax)
    assert_matches(np_tree(out), their_out)
    ours = f_vjp(ct)
    assert isinstance(ours, tuple) and len(ours) == 2
    assert_matches(np_tree(ours), their_cts)


@pytest.mark.parametrize("seed", GRAD_SEEDS)
def test_vjp_is_the_transpose_of_linearize(seed):
    """<ct, f_lin(t)> == <f_vjp(ct), t> for random t and ct (float outputs)."""
    prog, rng, inputs = setup(seed)
    f, _ = program_fns(prog)
    _, f_lin = ad.linearize(f, *inputs)
    _, f_vjp = ad.vjp(f, *inputs)
    tangents = random_arrays(rng, prog.in_shapes)
    cts, _ = cotangents(prog, rng)
    lhs = vdot(
        [c for k, c in enumerate(cts) if is_float_out(prog, k)],
        [y for k, y in enumerate(f_lin(*tangents)) if is_float_out(prog, k)],
    )
    rhs = vdot(f_vjp(tuple(cts)), tangents)
    assert_close(lhs, rhs, scale=abs(lhs))


@pytest.mark.parametrize("seed", GRAD_SEEDS)
def test_grad(seed):
    """grad w.r.t. one input (others passed after it) and w.r.t. a tuple of
    all inputs (a pytree first argument)."""
    prog, rng, inputs = setup(seed)
    loss, loss_jax = scalar_fns(prog, seed)
    at = int(rng.integers(len(inputs)))

    def moved(fn):
        def g(x, *others):
            xs = list(others)
            xs.insert(at, x)
            return fn(*xs)

        return g

    rest = [x for i, x in enumerate(inputs) if i != at]
    ours = ad.grad(moved(loss))(inputs[at], *rest)
    theirs = jax.jit(jax.grad(moved(loss_jax)))(inputs[at], *rest)
    assert_matches(np_tree(ours), theirs)
    whole = ad.grad(lambda xs: loss(*xs))(tuple(inputs))
    assert isinstance(whole, tuple) and len(whole) == len(inputs)
    theirs = jax.jit(jax.grad(lambda xs: loss_jax(*xs)))(tuple(inputs))
    assert_matches(np_tree(whole), theirs)


@pytest.mark.parametrize("seed", JIT_SEEDS)
def test_grad_of_jit(seed):
    prog, _, inputs = setup(seed)
    loss, loss_jax = scalar_fns(prog, seed)
    ours = ad.grad(ad.jit(first_rest(loss)))(*pack(inputs))
    theirs = jax.jit(jax.grad(first_rest(loss_jax)))(*pack(inputs))
    assert_matches(np_tree(ours), theirs)


@pytest.mark.parametrize("seed", JIT_SEEDS)
def test_jit_of_grad(seed):
    """jit(grad(f)) returns device Arrays with JAX's gradient; a second call
    with new values reuses the trace."""
    prog, rng, inputs = setup(seed)
    loss, loss_jax = scalar_fns(prog, seed)
    body = counted(first_rest(loss))
    g = ad.jit(ad.grad(body))
    reference = jax.jit(jax.grad(first_rest(loss_jax)))
    ours = g(*pack(inputs))
    assert isinstance(ours, ad.Array)
    assert_matches(np_tree(ours), reference(*pack(inputs)))
    new_inputs = random_arrays(rng, prog.in_shapes)
    assert_matches(np_tree(g(*pack(new_inputs))), reference(*pack(new_inputs)))
    assert body.calls == 1


@pytest.mark.parametrize("seed", JIT_SEEDS)
def test_nested_jit_inside_grad(seed):
    """grad of a function that calls a jitted function, which calls another
    jitted function, with eager work before and after: grad(jit(...)) too."""
    prog, _, inputs = setup(seed)
    loss, loss_jax = scalar_fns(prog, seed)

    def outer(loss, sin, jit):
        inner = jit(lambda *xs: loss(*xs) * 0.5)
        middle = jit(lambda *xs: inner(*xs) + sin(inner(*[sin(x) for x in xs])))
        return lambda first, rest: sin(middle(first, *rest)) + loss(first, *rest)

    ours_fn = outer(loss, ad.sin, ad.jit)
    theirs_fn = outer(loss_jax, jnp.sin, jax.jit)
    expected = jax.jit(jax.grad(theirs_fn))(*pack(inputs))
    assert_matches(np_tree(ad.grad(ours_fn)(*pack(inputs))), expected)
    assert_matches(np_tree(ad.grad(ad.jit(ours_fn))(*pack(inputs))), expected)
    assert_matches(np_tree(ad.jit(ad.grad(ad.jit(ours_fn)))(*pack(inputs))), expected)


@pytest.mark.parametrize("seed", JIT_SEEDS)
def test_linearize_of_jit(seed):
    """linearize(jit(f)): the primal outputs come from the compiled known half,
    the linear map agrees with jax.jvp; f's body is traced once."""
    prog, rng, inputs = setup(seed)
    f, f_jax = program_fns(prog)
    body = counted(f)
    primals_out, f_lin = ad.linearize(ad.jit(body), *inputs)
    reference = jax.jit(partial(jax.jvp, f_jax))
    for _ in range(2):
        tangents = random_arrays(rng, prog.in_shapes)
        their_out, their_tangents = reference(tuple(inputs), tuple(tangents))
        assert_matches(np_tree(primals_out), their_out)
        assert_matches(np_tree(f_lin(*tangents)), their_tangents)
    assert body.calls == 1


@pytest.mark.parametrize("seed", JIT_SEEDS)
def test_vjp_of_jit(seed):
    prog, rng, inputs = setup(seed)
    f, f_jax = program_fns(prog)
    cts, cts_jax = cotangents(prog, rng)
    out, f_vjp = ad.vjp(ad.jit(f), *inputs)
    their_out, their_cts = jax_vjp(f_jax)(tuple(inputs), tuple(cts_jax))
    assert_matches(np_tree(out), their_out)
    assert_matches(np_tree(f_vjp(tuple(cts))), their_cts)


def line_references(g_jax: Callable, s: float, ss: np.ndarray) -> tuple:
    """JAX's first and second derivatives at s, and both mapped over ss."""

    def run(s, ss):
        d1, d2 = jax.grad(g_jax), jax.grad(jax.grad(g_jax))
        return d1(s), d2(s), jax.vmap(d1)(ss), jax.vmap(d2)(ss)

    return jax.jit(run)(s, ss)


@pytest.mark.parametrize("seed", GRAD_SEEDS)
def test_second_derivatives_along_a_line(seed):
    """For s -> loss(x + s d): grad(grad), jvp(grad), grad(jvp), jacfwd(grad)
    and vmap(grad) all agree with JAX's second (and first) derivatives."""
    prog, _, inputs = setup(seed)
    g, g_jax = along_line(prog, seed, inputs)
    s, ss = np.float64(0.3), np.array([-0.5, 0.0, 0.3, 1.1])
    d1, d2, d1s, d2s = line_references(g_jax, s, ss)
    assert_matches(np_tree(ad.grad(g)(s)), d1)
    assert_matches(np_tree(ad.grad(ad.grad(g))(s)), d2)
    primal, tangent = ad.jvp(ad.grad(g), (s,), (1.0,))
    assert_matches(np_tree((primal, tangent)), (d1, d2))
    grad_of_jvp = ad.grad(lambda s: ad.jvp(g, (s,), (1.0,))[1])(s)
    assert_matches(np_tree(grad_of_jvp), d2)
    assert_matches(np_tree(ad.jacfwd(ad.grad(g))(s)), d2)
    assert_matches(np_tree(ad.vmap(ad.grad(g))(ss)), d1s)
    assert_matches(np_tree(ad.vmap(ad.grad(ad.grad(g)))(ss)), d2s)


@pytest.mark.parametrize("seed", JIT_SEEDS)
def test_second_derivatives_through_jit(seed):
    """grad(grad) with jit at every depth, jit(grad(jit(grad))), and (for
    half of the seeds) jvp(grad(jit)) and vmap(grad(grad(jit)))."""
    prog, _, inputs = setup(seed)
    g, g_jax = along_line(prog, seed, inputs)
    s = np.float64(-0.4)
    d2 = jax.jit(jax.grad(jax.grad(g_jax)))(s)
    compositions = [
        ad.grad(ad.grad(ad.jit(g))),
        ad.grad(ad.jit(ad.grad(g))),
        ad.jit(ad.grad(ad.jit(ad.grad(g)))),
    ]
    if seed in JIT_SEEDS[::2]:
        compositions += [
            lambda s: ad.jvp(ad.grad(ad.jit(g)), (s,), (np.float64(1.0),))[1],
            lambda s: np.asarray(
                ad.vmap(ad.grad(ad.grad(ad.jit(g))))(np.stack([s, s]))
            )[1],
        ]
    for fn in compositions:
        assert_matches(np_tree(fn(s)), d2)


@pytest.mark.parametrize("seed", GRAD_SEEDS)
def test_jvp_of_grad(seed):
    """Hessian-vector products: jvp of grad of the loss of all inputs."""
    prog, rng, inputs = setup(seed)
    loss, loss_jax = scalar_fns(prog, seed)
    v = random_arrays(rng, prog.in_shapes)
    ours = ad.jvp(ad.grad(first_rest(loss)), pack(inputs), pack(v))
    reference = jax.jit(partial(jax.jvp, jax.grad(first_rest(loss_jax))))
    assert_matches(np_tree(ours), reference(pack(inputs), pack(v)))


@pytest.mark.parametrize("seed", GRAD_SEEDS)
def test_vmap_of_grad(seed):
    """Per-example gradients: vmap of grad with random in_axes per input."""
    prog, rng, _ = setup(seed)
    loss, loss_jax = scalar_fns(prog, seed)
    in_axes, shapes = batch_axes(rng, prog.in_shapes, 3)
    args = random_arrays(rng, shapes)
    spec = (tuple(in_axes),)

    def whole(loss):
        return lambda xs: loss(*xs)

    ours = ad.vmap(ad.grad(whole(loss)), spec)(tuple(args))
    theirs = jax.jit(jax.vmap(jax.grad(whole(loss_jax)), spec))(tuple(args))
    assert_matches(np_tree(ours), theirs)


@pytest.mark.parametrize("seed", GRAD_SEEDS[::2])
def test_grad_of_vmap(seed):
    """grad of the summed per-example losses of a vmapped loss."""
    prog, rng, _ = setup(seed)
    loss, loss_jax = scalar_fns(prog, seed)
    in_axes, shapes = batch_axes(rng, prog.in_shapes, 2)
    args = random_arrays(rng, shapes)

    def total(vmap, reduce_sum, loss):
        return lambda xs: reduce_sum(vmap(lambda *a: loss(*a), tuple(in_axes))(*xs))

    ours = ad.grad(total(ad.vmap, ad.reduce_sum, loss))(tuple(args))
    theirs = jax.jit(jax.grad(total(jax.vmap, jnp.sum, loss_jax)))(tuple(args))
    assert_matches(np_tree(ours), theirs)


# ---------------------------------------------------------------------------
# Hand-written cases
# ---------------------------------------------------------------------------


def test_compositionality_stress_test():
    """The chapter's stress test, against jax.grad (g(x) = sin(x) x)."""

    def g(x):
        return ad.sin(x) * x

    def g_jax(x):
        return jnp.sin(x) * x

    x = 0.8
    d1, d2 = jax.grad(g_jax)(x), jax.grad(jax.grad(g_jax))(x)
    np.testing.assert_allclose(d1, np.cos(x) * x + np.sin(x), rtol=TOL)
    np.testing.assert_allclose(d2, 2 * np.cos(x) - x * np.sin(x), rtol=TOL)
    first = [
        ad.grad(g)(x),
        ad.grad(ad.jit(g))(x),
        ad.jit(ad.grad(g))(x),
        ad.jit(ad.grad(ad.jit(g)))(x),
        ad.jvp(ad.jit(g), (x,), (1.0,))[1],
        ad.linearize(ad.jit(g), x)[1](1.0),
        ad.vjp(ad.jit(g), x)[1](1.0)[0],
    ]
    second = [
        ad.grad(ad.grad(g))(x),
        ad.jit(ad.grad(ad.jit(ad.grad(g))))(x),
        ad.grad(ad.grad(ad.jit(ad.jit(g))))(x),
        ad.jvp(ad.grad(g), (x,), (1.0,))[1],
        ad.jvp(ad.jit(ad.grad(g)), (x,), (1.0,))[1],
        ad.grad(lambda x: ad.jvp(g, (x,), (1.0,))[1])(x),
        ad.grad(lambda x: ad.jvp(ad.jit(g), (x,), (1.0,))[1])(x),
        ad.jacfwd(ad.grad(g))(x),
        ad.vmap(ad.grad(ad.grad(g)), (0,))(np.array([x, x]))[0],
        ad.linearize(ad.grad(g), x)[1](1.0),
        ad.vjp(ad.grad(ad.jit(g)), x)[1](1.0)[0],
    ]
    for value in first:
        np.testing.assert_allclose(np.asarray(value), d1, rtol=TOL)
    for value in second:
        np.testing.assert_allclose(np.asarray(value), d2, rtol=TOL)
    d4 = jax.grad(jax.grad(jax.grad(jax.grad(g_jax))))(x)
    np.testing.assert_allclose(ad.grad(ad.grad(ad.grad(ad.grad(g))))(x), d4, rtol=TOL)


def test_grad_of_sin_and_higher_derivatives():
    """grad of sin is cos; the 4th derivative by grad of grad... is sin."""
    fn = ad.sin
    expected = [np.cos, lambda x: -np.sin(x), lambda x: -np.cos(x), np.sin]
    for reference in expected:
        fn = ad.grad(fn)
        for x in (3.0, -0.7):
            np.testing.assert_allclose(fn(x), reference(x), rtol=TOL, atol=TOL)


def test_spec_example_gradient():
    """f(x) = -2 sin x + x: f'(3.0) by grad, vjp and linearize."""

    def f(x):
        return -2.0 * ad.sin(x) + x

    expected = jax.grad(lambda x: -2.0 * jnp.sin(x) + x)(3.0)
    np.testing.assert_allclose(expected, -2.0 * np.cos(3.0) + 1.0, rtol=TOL)
    np.testing.assert_allclose(ad.grad(f)(3.0), expected, rtol=TOL)
    y, f_vjp = ad.vjp(f, 3.0)
    np.testing.assert_allclose(y, -2.0 * np.sin(3.0) + 3.0, rtol=TOL)
    np.testing.assert_allclose(f_vjp(1.0)[0], expected, rtol=TOL)
    y, f_lin = ad.linearize(f, 3.0)
    np.testing.assert_allclose(f_lin(1.0), expected, rtol=TOL)


def test_vjp_takes_several_positional_cotangents_as_a_tuple():
    """For f returning a tuple, f_vjp(ct_a, ct_b) == f_vjp((ct_a, ct_b))."""

    def f(sin, reduce_sum):
        return lambda x, y: (sin(x) * y, reduce_sum(x * y))

    x, y = np.array([0.3, 0.7, -1.2]), np.array([2.0, -1.0, 0.5])
    ct_a, ct_b = np.array([1.0, 0.5, -2.0]), np.float64(1.5)
    _, f_vjp = ad.vjp(f(ad.sin, ad.reduce_sum), x, y)
    _, their_vjp = jax.vjp(f(jnp.sin, jnp.sum), x, y)
    expected = their_vjp((ct_a, ct_b))
    assert_matches(f_vjp(ct_a, ct_b), expected)
    assert_matches(f_vjp((ct_a, ct_b)), expected)


def test_outputs_that_are_inputs_constants_or_repeated():
    """Identity, constant, repeated and unused: vjp and linearize like JAX."""

    def f(x, y, unused):
        s = x + y
        return {"x": x, "two": np.float64(2.0), "ones": np.ones(2), "s": s, "s2": s}

    x, y, z = np.array([1.0, -2.0]), np.array([0.5, 4.0]), np.array([3.0])
    out, f_vjp = ad.vjp(f, x, y, z)
    their_out, their_vjp = jax.vjp(f, x, y, z)
    assert_matches(out, their_out)
    ct = {
        "x": np.array([1.0, 2.0]),
        "two": np.float64(3.0),
        "ones": np.array([-1.0, 5.0]),
        "s": np.array([0.25, -0.5]),
        "s2": np.array([2.0, 1.0]),
    }
    assert_matches(f_vjp(ct), their_vjp(ct))
    _, f_lin = ad.linearize(f, x, y, z)
    _, their_lin = jax.linearize(f, x, y, z)
    assert_matches(f_lin(y, x, z), their_lin(y, x, z))
    np.testing.assert_array_equal(ad.grad(lambda x: 2.0)(1.5), 0.0)
    np.testing.assert_array_equal(ad.grad(lambda x, y: ad.reduce_sum(y))(x, y), 0 * x)


def test_grad_with_pytree_argument_and_extra_arguments():
    """grad differentiates the first argument (a dict) only; the others are
    passed through and may be any Python objects used statically."""

    def loss(params, batch, mode, reduce_sum, sin):
        pred = sin(batch * params["w"]) + params["b"][0]
        if mode == "double":
            pred = pred * 2.0
        return reduce_sum(pred * pred)

    params = {"w": np.array([0.5, -1.0, 2.0]), "b": (np.array([0.1, 0.2, 0.3]),)}
    batch = np.array([1.0, 2.0, -0.5])
    for mode in ("plain", "double"):
        ours = ad.grad(loss)(params, batch, mode, ad.reduce_sum, ad.sin)
        theirs = jax.grad(loss)(params, batch, mode, jnp.sum, jnp.sin)
        assert_matches(ours, theirs)


def test_float32_gradients():
    """float32 in, float32 out (Python numbers do not promote), like JAX."""

    def f(reduce_sum, sin):
        return lambda x: reduce_sum(sin(x) * 2.0 + x * x - 1)

    x = np.array([0.5, -1.5, 2.0], np.float32)
    ours = ad.grad(f(ad.reduce_sum, ad.sin))(x)
    theirs = jax.grad(f(jnp.sum, jnp.sin))(x)
    assert ours.dtype == np.float32
    np.testing.assert_allclose(ours, theirs, rtol=1e-6)
    ours_jit = np.asarray(ad.grad(ad.jit(f(ad.reduce_sum, ad.sin)))(x))
    assert ours_jit.dtype == np.float32
    np.testing.assert_allclose(ours_jit, theirs, rtol=1e-6)


def test_python_scalars_broadcast_under_linearize_and_grad():
    def f(x):
        return (x * 2.0, 1.0 + x, x - 3, 2 - x, 0.5 * x * x)

    x = np.array([[0.5, -1.0, 2.0], [0.0, 3.0, -0.2]])
    v = np.ones_like(x)
    out, f_lin = ad.linearize(f, x)
    their_out, their_lin = jax.linearize(f, x)
    assert_matches(out, their_out)
    assert_matches(f_lin(v), their_lin(v))
    ours = ad.grad(lambda x: ad.reduce_sum(f(x)[4] * f(x)[3]))(x)
    assert_matches(ours, jax.grad(lambda x: jnp.sum(f(x)[4] * f(x)[3]))(x))


def test_python_control_flow_under_grad():
    """if/while on traced values is fine under grad and linearize (the
    primal is known): the derivative of the branch taken, like JAX."""

    def f(x, sin, reduce_sum):
        y = sin(x) * x if reduce_sum(x) > 0.0 else x * x - 2.0 * x
        count = 0
        while reduce_sum(y * y) < 50.0 and count < 20:
            y = y * 1.5 + sin(y)
            count += 1
        return reduce_sum(y)

    for x in (np.array([0.3, -0.2]), np.array([-1.0, -0.5]), np.array([2.0, 1.5])):
        ours = ad.grad(lambda x: f(x, ad.sin, ad.reduce_sum))(x)
        theirs = jax.grad(lambda x: f(x, jnp.sin, jnp.sum))(x)
        assert_matches(ours, theirs)
        hvp = ad.jvp(ad.grad(lambda x: f(x, ad.sin, ad.reduce_sum)), (x,), (x,))
        their_hvp = jax.jvp(jax.grad(lambda x: f(x, jnp.sin, jnp.sum)), (x,), (x,))
        assert_matches(hvp, their_hvp)


def test_linear_jaxpr_holds_only_linear_work():
    """The jaxpr of linearize has only linear primitives (the sin/cos work was
    done while linearizing), and each mul has exactly one linear operand."""
    prog, _, inputs = setup(3)
    f, _ = program_fns(prog)
    flat = lambda *xs: [y for k, y in enumerate(f(*xs)) if is_float_out(prog, k)]  # noqa: E731
    for fn in (flat, ad.jit(flat)):
        _, jaxpr, residuals = ad.linearize_flat(fn, inputs)
        ad.typecheck_jaxpr(jaxpr)
        assert len(jaxpr.in_binders) == len(residuals) + len(inputs)
        check_linear(jaxpr, [False] * len(residuals) + [True] * len(inputs))


def check_linear(jaxpr: ad.Jaxpr, linear_in: Sequence[bool]) -> None:
    """Every equation that reads a linear value is a linear primitive applied
    linearly (recursing into xla_call); no nonlinear work on linear values."""
    linear = {v for v, lin in zip(jaxpr.in_binders, linear_in) if lin}
    for eqn in jaxpr.eqns:
        lin = [isinstance(x, ad.Var) and x in linear for x in eqn.inputs]
        if not any(lin):
            continue
        name = eqn.primitive.name
        if name == "xla_call":
            check_linear(eqn.params["jaxpr"], lin)
        else:
            assert name in LINEAR_PRIMITIVES, name
            if name == "mul":
                assert lin.count(True) == 1
        linear.update(eqn.out_binders)


def test_vmap_of_grad_with_unbatched_argument():
    """vmap(grad(f), (None, 0)): x is shared, the data is batched, so the
    gradient w.r.t. x is batched (also through jit)."""

    def loss(sin, reduce_sum):
        return lambda x, y: reduce_sum(sin(x * y) * x)

    x = np.array([0.5, 1.0, 2.0])
    ys = np.array([[1.0, 2.0, 3.0], [0.5, -1.0, 2.0]])
    expected = jax.vmap(jax.grad(loss(jnp.sin, jnp.sum)), (None, 0))(x, ys)
    ours = ad.vmap(ad.grad(loss(ad.sin, ad.reduce_sum)), (None, 0))(x, ys)
    assert_matches(ours, expected)
    ours = ad.vmap(ad.grad(ad.jit(loss(ad.sin, ad.reduce_sum))), (None, 0))(x, ys)
    assert_matches(np_tree(ours), expected)


def test_nested_grads_keep_their_perturbations_apart():
    """d/dx [x * d/dy (x * y)] = 2x, with and without jit at each level; an
    inner jitted function closing over the outer grad's tracer."""

    def outer(grad, jit, inner_jit):
        def inner_derivative(x):
            fn = lambda y: x * y  # noqa: E731
            return grad(jit(fn) if inner_jit else fn)(2.0)

        return grad(lambda x: x * inner_derivative(x))

    for grad, jit in ((ad.grad, ad.jit), (jax.grad, jax.jit)):
        for inner_jit in (False, True):
            np.testing.assert_allclose(outer(grad, jit, inner_jit)(3.0), 6.0, rtol=TOL)
    # The outer function is x -> 2x, so its derivative is 2.
    np.testing.assert_allclose(
        ad.grad(ad.jit(outer(ad.grad, ad.jit, True)))(3.0), 2.0, rtol=TOL
    )

    def closure(x, jit, sin):
        return jit(lambda y: sin(y * x) * x)(x)

    for x in (0.7, -1.3):
        expected = jax.grad(jax.grad(lambda x: closure(x, jax.jit, jnp.sin)))(x)
        ours = ad.grad(ad.grad(lambda x: closure(x, ad.jit, ad.sin)))(x)
        np.testing.assert_allclose(ours, expected, rtol=TOL)


def test_device_arrays_in_and_out():
    """Arrays returned by jit go into grad, vjp, linearize and their linear
    maps; jitted linear maps and pullbacks work."""
    x = ad.jit(lambda x: x * 1.0)(np.array([0.5, 1.0, 2.0]))
    assert isinstance(x, ad.Array)
    xh = np.asarray(x)
    np.testing.assert_allclose(
        ad.grad(lambda x: ad.reduce_sum(ad.sin(x)))(x), np.cos(xh), rtol=TOL
    )
    _, f_lin = ad.linearize(lambda x: ad.sin(x) * x, x)
    _, f_vjp = ad.vjp(lambda x: ad.sin(x) * x, x)
    t = ad.jit(lambda t: t * 2.0)(np.ones(3))
    expected = 2.0 * (np.cos(xh) * xh + np.sin(xh))
    np.testing.assert_allclose(np.asarray(f_lin(t)), expected, rtol=TOL)
    np.testing.assert_allclose(np.asarray(f_vjp(t)[0]), expected, rtol=TOL)
    np.testing.assert_allclose(np.asarray(ad.jit(f_lin)(t)), expected, rtol=TOL)
    np.testing.assert_allclose(np.asarray(ad.jit(f_vjp)(t)[0]), expected, rtol=TOL)
    jac = jax.jacfwd(lambda x: jnp.sin(x) * x)(xh)
    assert_matches(ad.vmap(f_lin)(np.eye(3)), jac.T)
    assert_matches(ad.vmap(f_vjp)(np.eye(3))[0], jac)


# ---------------------------------------------------------------------------
# linearize does the primal work once
# ---------------------------------------------------------------------------


def test_linear_map_does_not_rerun_the_primal(monkeypatch):
    """Calling f_lin (or f_vjp) runs neither f's Python body nor any sin/cos:
    all primal work happened in linearize."""
    calls = count_impl_calls(monkeypatch, ["sin", "cos"])

    body = counted(lambda x: ad.reduce_sum(ad.sin(ad.cos(x) * x) * x))
    x = np.array([0.3, -1.2, 2.5])
    y, f_lin = ad.linearize(body, x)
    _, f_vjp = ad.vjp(body, x)
    assert body.calls == 2
    before = dict(calls)
    assert before["sin"] >= 2 and before["cos"] >= 2
    f_jax = lambda x: jnp.sum(jnp.sin(jnp.cos(x) * x) * x)  # noqa: E731
    rng = np.random.default_rng(0)
    for _ in range(3):
        t = rng.uniform(-1, 1, size=3)
        np.testing.assert_allclose(f_lin(t), jax.jvp(f_jax, (x,), (t,))[1], rtol=TOL)
        ct = rng.uniform(-1, 1)
        (x_bar,) = f_vjp(np.float64(ct))
        np.testing.assert_allclose(x_bar, ct * jax.grad(f_jax)(x), rtol=TOL)
    assert body.calls == 2
    assert calls == before, "the linear map recomputed primal work"


def jax_wave(x):
    return jnp.sin(x) * x + jnp.cos(x)


def test_linearize_of_jit_does_not_retrace_or_recompile(compilations):
    """Calling the linear map of a jitted function traces nothing and compiles
    at most its linear half, once."""
    body = counted(lambda x: ad.sin(x) * x + ad.cos(x))
    f = ad.jit(body)
    x = np.array([0.1, 0.2, 0.3])
    _, f_lin = ad.linearize(f, x)
    compiled = len(compilations)
    for t in (np.ones(3), np.array([1.0, -2.0, 0.5])):
        expected = jax.jvp(jax_wave, (x,), (t,))[1]
        np.testing.assert_allclose(np.asarray(f_lin(t)), expected, rtol=TOL)
    assert body.calls == 1
    assert len(compilations) <= compiled + 1  # at most the linear half, once
    f_lin(np.zeros(3))
    assert len(compilations) <= compiled + 1


@pytest.mark.parametrize(
    "transform",
    [
        lambda f, x: ad.grad(lambda x: ad.reduce_sum(f(x)))(x),
        lambda f, x: ad.linearize(f, x)[1](np.ones(3)),
        lambda f, x: ad.vjp(f, x)[1](np.ones(3))[0],
        lambda f, x: ad.jvp(f, (x,), (np.ones(3),))[1],
    ],
    ids=["grad", "linearize", "vjp", "jvp"],
)
def test_differentiating_a_jitted_function_again_compiles_nothing(
    transform, compilations
):
    """grad(jit(f)) (or linearize/vjp of it) called a second time with new
    values of the same types reuses the compiled executables, as jvp(jit(f))
    does: jit caches per jaxpr, so the transformed jaxprs must be reused
    rather than rebuilt on every call."""
    body = counted(lambda x: ad.sin(x) * x + ad.cos(x))
    f = ad.jit(body)
    x = np.array([0.1, 0.2, 0.3])
    transform(f, x)  # first call: trace and compile what is needed
    compiled = len(compilations)
    assert compiled >= 1
    for shift in (1.0, 2.0):
        derivative = np.asarray(transform(f, x + shift))
        expected = jax.jvp(jax_wave, (x + shift,), (np.ones(3),))[1]
        np.testing.assert_allclose(derivative, expected, rtol=TOL)
    assert body.calls == 1
    assert len(compilations) == compiled, "compiled again for the same types"


# ---------------------------------------------------------------------------
# partial_eval_jaxpr: the two halves recompose to the original
# ---------------------------------------------------------------------------


def nested_program(prog: Program) -> tuple[Callable, Callable]:
    """``prog`` mixed with nested jits (an xla_call inside an xla_call) and
    eager work, plus a closed-over constant."""
    f, f_jax = program_fns(prog)
    const = np.linspace(-1.0, 1.0, int(np.prod(prog.out_shapes[0], dtype=int)))
    const = const.reshape(prog.out_shapes[0])

    def build(f, jit, sin):
        inner = jit(lambda *xs: f(*xs))
        outer = jit(lambda *xs: (sin(inner(*xs)[0]) + const, *inner(*xs)[1:]))

        def g(*xs):
            first, *rest = outer(*[sin(x) for x in xs])
            return (first * f(*xs)[0], *rest, xs[0])

        return g

    return build(f, ad.jit, ad.sin), build(f_jax, jax.jit, jnp.sin)


def dependence(jaxpr: ad.Jaxpr, unknown_in: Sequence[bool]) -> list[bool]:
    """Which outputs depend (at equation granularity) on the unknown inputs."""
    dep = {v for v, u in zip(jaxpr.in_binders, unknown_in) if u}
    for eqn in jaxpr.eqns:
        if any(isinstance(x, ad.Var) and x in dep for x in eqn.inputs):
            dep.update(eqn.out_binders)
    return [isinstance(x, ad.Var) and x in dep for x in jaxpr.outs]


def check_partial_eval(
    jaxpr: ad.Jaxpr, args: list, unknowns: list[bool], instantiate: list[bool] | None
) -> None:
    known, unknown, out_unknowns, num_res = ad.partial_eval_jaxpr(
        jaxpr, unknowns, instantiate
    )
    ad.typecheck_jaxpr(known)
    ad.typecheck_jaxpr(unknown)
    n_known_out = out_unknowns.count(False)
    assert len(out_unknowns) == len(jaxpr.outs)
    assert len(known.in_binders) == unknowns.count(False)
    assert len(known.outs) == n_known_out + num_res
    assert len(unknown.in_binders) == num_res + unknowns.count(True)
    assert len(unknown.outs) == out_unknowns.count(True)
    # Types of the halves' inputs and outputs line up with the original's.
    in_types = [v.aval for v in jaxpr.in_binders]
    assert [v.aval for v in known.in_binders] == [
        t for t, u in zip(in_types, unknowns) if not u
    ]
    assert [v.aval for v in unknown.in_binders[num_res:]] == [
        t for t, u in zip(in_types, unknowns) if u
    ]
    assert (
        ad.typecheck_jaxpr(unknown).in_types[:num_res]
        == (ad.typecheck_jaxpr(known).out_types[n_known_out:])
    )
    # Minimal: an output independent of the unknown inputs stays known.
    # (Equation granularity is exact without xla_call; with it, the rule
    # splits inside the call and may keep more outputs known.)
    exact = not any(e.primitive is ad.xla_call_p for e in jaxpr.eqns)
    inst = instantiate or [False] * len(jaxpr.outs)
    for unk, dep, forced in zip(out_unknowns, dependence(jaxpr, unknowns), inst):
        if forced:
            assert unk
        elif not dep:
            assert not unk, "an output independent of the unknowns became unknown"
        elif exact:
            assert unk, "an output depending on an unknown input stayed known"
    # No known work left in the unknown half: each equation reads a value
    # that depends on an unknown input.
    res_free = dependence_vars(
        unknown, [False] * num_res + [True] * unknowns.count(True)
    )
    for eqn in unknown.eqns:
        assert any(isinstance(x, ad.Var) and x in res_free for x in eqn.inputs), eqn
    # Composing the halves computes the original.
    expected = ad.eval_jaxpr(jaxpr, args)
    known_args = [a for a, u in zip(args, unknowns) if not u]
    unknown_args = [a for a, u in zip(args, unknowns) if u]
    known_outs = ad.eval_jaxpr(known, known_args)
    residuals = known_outs[n_known_out:]
    unknown_outs = ad.eval_jaxpr(unknown, [*residuals, *unknown_args])
    known_it, unknown_it = iter(known_outs[:n_known_out]), iter(unknown_outs)
    combined = [next(unknown_it) if u else next(known_it) for u in out_unknowns]
    assert_matches(np_tree(combined), np_tree(expected))


def dependence_vars(jaxpr: ad.Jaxpr, unknown_in: Sequence[bool]) -> set:
    dep = {v for v, u in zip(jaxpr.in_binders, unknown_in) if u}
    for eqn in jaxpr.eqns:
        if any(isinstance(x, ad.Var) and x in dep for x in eqn.inputs):
            dep.update(eqn.out_binders)
    return dep


def unknown_patterns(rng: np.random.Generator, n: int) -> list[list[bool]]:
    patterns = [[False] * n, [True] * n]
    patterns += [[bool(b) for b in rng.random(n) < 0.5] for _ in range(3)]
    return patterns


@pytest.mark.parametrize("seed", GRAD_SEEDS)
def test_partial_eval_jaxpr_recomposes(seed):
    """Random programs' jaxprs (and their JVP jaxprs) split by random
    in_unknowns/instantiate patterns: both halves type-check, the split is
    minimal, and known-then-unknown computes the original."""
    prog, rng, inputs = setup(seed)
    f, _ = program_fns(prog)
    avals = [ad.ShapedArray(np.shape(x), F64) for x in inputs]
    jvp_f = lambda *a: ad.jvp(f, a[: len(a) // 2], a[len(a) // 2 :])  # noqa: E731
    tangents = random_arrays(rng, prog.in_shapes)
    for fn, args in ((f, inputs), (jvp_f, [*inputs, *tangents])):
        jaxpr, consts, _ = ad.make_jaxpr(fn, *avals * (len(args) // len(inputs)))
        full_args = [*consts, *args]
        n = len(jaxpr.in_binders)
        for unknowns in unknown_patterns(rng, n):
            instantiate = [bool(b) for b in rng.random(len(jaxpr.outs)) < 0.3]
            check_partial_eval(jaxpr, full_args, unknowns, None)
            check_partial_eval(jaxpr, full_args, unknowns, instantiate)


@pytest.mark.parametrize("seed", JIT_SEEDS[:5])
def test_partial_eval_jaxpr_with_nested_xla_call(seed):
    """The same with jaxprs containing xla_call equations (nested twice)."""
    prog, rng, inputs = setup(seed)
    g, _ = nested_program(prog)
    avals = [ad.ShapedArray(np.shape(x), F64) for x in inputs]
    jaxpr, consts, _ = ad.make_jaxpr(g, *avals)
    assert any(e.primitive is ad.xla_call_p for e in jaxpr.eqns)
    full_args = [*consts, *inputs]
    for unknowns in unknown_patterns(rng, len(jaxpr.in_binders)):
        instantiate = [bool(b) for b in rng.random(len(jaxpr.outs)) < 0.3]
        check_partial_eval(jaxpr, full_args, unknowns, instantiate)


def test_partial_eval_jaxpr_literal_and_input_outputs():
    """Outputs that are inputs, literals or repeated, with instantiate."""
    x = ad.ShapedArray((3,), F64)

    def f(a, b):
        c = ad.sin(a)
        return a, b, c, c, ad.mul(2.0, 3.0), b * c

    jaxpr, consts, _ = ad.make_jaxpr(f, x, x)
    args = [*consts, np.array([0.1, 0.2, 0.3]), np.array([1.0, -1.0, 2.0])]
    n_in, n_out = len(jaxpr.in_binders), len(jaxpr.outs)
    for unknowns in ([False] * n_in, [True] * n_in, [False, True], [True, False]):
        unknowns = [False] * (n_in - 2) + list(unknowns)[-2:]
        for instantiate in (None, [True] * n_out, [False, True] * (n_out // 2)):
            check_partial_eval(jaxpr, args, unknowns, instantiate)


# ---------------------------------------------------------------------------
# toposort
# ---------------------------------------------------------------------------


class Node:
    def __init__(self, name: int, parents: Sequence[Node] = ()) -> None:
        self.name = name
        self.parents = list(parents)


def check_topological(order: list, roots: Sequence[Node]) -> None:
    """Every node reachable from the roots appears exactly once, after all of
    its parents, and nothing else appears."""
    reachable, stack = set(), list(roots)
    while stack:
        node = stack.pop()
        if id(node) not in reachable:
            reachable.add(id(node))
            stack.extend(node.parents)
    assert len(order) == len({id(n) for n in order}) == len(reachable)
    assert {id(n) for n in order} == reachable
    position = {id(n): i for i, n in enumerate(order)}
    for node in order:
        for parent in node.parents:
            assert position[id(parent)] < position[id(node)]


def test_toposort_long_chain_is_iterative():
    """A chain of 20,000 nodes (far beyond the recursion limit)."""
    nodes = [Node(0)]
    for i in range(1, 20_000):
        nodes.append(Node(i, [nodes[-1]]))
    calls = counted(lambda n: n.parents)
    order = ad.toposort([nodes[-1]], calls)
    assert [n.name for n in order] == list(range(20_000))
    assert calls.calls == 20_000  # each node's parents asked for once


@pytest.mark.parametrize("seed", range(8))
def test_toposort_random_dags(seed):
    """Random DAGs with shared ancestors, repeated parents and several roots
    (some reachable from others); parents are asked for once per node."""
    rng = np.random.default_rng(seed)
    nodes: list[Node] = []
    for i in range(int(rng.integers(1, 300))):
        k = int(rng.integers(0, min(i, 4) + 1))
        parents = [nodes[int(j)] for j in rng.integers(0, i, size=k)] if i else []
        nodes.append(Node(i, parents))
    roots = [nodes[int(j)] for j in rng.integers(0, len(nodes), size=3)]
    calls = counted(lambda n: n.parents)
    order = ad.toposort(roots, calls)
    check_topological(order, roots)
    assert calls.calls == len(order)


def test_toposort_wide_diamonds():
    """Layers fully connected to the next: many paths to every node."""
    layers = [[Node(i) for i in range(5)]]
    for depth in range(1, 200):
        layers.append([Node(depth * 10 + i, layers[-1]) for i in range(5)])
    order = ad.toposort(layers[-1], lambda n: n.parents)
    check_topological(order, layers[-1])
    assert ad.toposort([], lambda n: n.parents) == []


# ---------------------------------------------------------------------------
# backward_pass and transpose rules
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("seed", GRAD_SEEDS[::2])
def test_backward_pass_is_the_transposed_jacobian(seed):
    """For the linear jaxpr of the main output, backward_pass(ct) equals
    ct^T J with J from jax.jacfwd, and <ct, J t> == <backward_pass(ct), t>."""
    prog, rng, inputs = setup(seed)
    f, f_jax = program_fns(prog)
    _, jaxpr, residuals = ad.linearize_flat(lambda *xs: [f(*xs)[0]], inputs)
    undefs = [ad.UndefPrimal(ad.ShapedArray(np.shape(x), F64)) for x in inputs]
    out_shape = prog.out_shapes[0]
    ct = rng.uniform(-1.0, 1.0, size=out_shape)
    cts_in = ad.backward_pass(jaxpr, [*residuals, *undefs], [ct])
    assert len(cts_in) == len(inputs)
    argnums = tuple(range(len(inputs)))
    jacobians = jax.jit(jax.jacfwd(lambda *xs: f_jax(*xs)[0], argnums=argnums))(*inputs)
    t = random_arrays(rng, prog.in_shapes)
    (j_t,) = ad.eval_jaxpr(jaxpr, [*residuals, *t])
    for ct_in, jac, x in zip(cts_in, jacobians, inputs):
        assert np.shape(ct_in) == np.shape(x)
        expected = np.tensordot(ct, np.asarray(jac), axes=len(out_shape))
        assert_matches(np.asarray(ct_in, F64), expected)
    lhs, rhs = vdot(ct, j_t), vdot(cts_in, t)
    assert_close(lhs, rhs, scale=abs(lhs))


def test_backward_pass_of_a_hand_written_linear_map():
    """A linear map using every linear primitive and a nested jit, traced by
    make_jaxpr: its transpose is the transposed matrix (from jax.jacfwd)."""
    scale = np.array([[1.0, -2.0, 0.5], [3.0, 0.25, -1.0]])

    def linear(ops, u, v):
        a = ops.transpose(u, (1, 0)) * 2.0  # (3, 2)
        b = ops.broadcast(ops.reduce_sum(v, 1), (3, 2), (0,))  # (3, 2)
        c = ops.jit(lambda a, b: -(a + b))(a, b)
        d = ops.transpose(c, (1, 0)) * scale  # (2, 3)
        return ops.reduce_sum(d, 0), d + v

    class Ours:
        transpose = staticmethod(ad.transpose)
        broadcast = staticmethod(ad.broadcast)
        reduce_sum = staticmethod(ad.reduce_sum)
        jit = staticmethod(ad.jit)

    class Theirs:
        transpose = staticmethod(jnp.transpose)
        reduce_sum = staticmethod(lambda x, axis: jnp.sum(x, axis=axis))
        jit = staticmethod(jax.jit)

        @staticmethod
        def broadcast(x, shape, axes):
            kept = [i for i in range(len(shape)) if i not in axes]
            return lax.broadcast_in_dim(x, shape, kept)

    aval = ad.ShapedArray((2, 3), F64)
    jaxpr, consts, _ = ad.make_jaxpr(partial(linear, Ours), aval, aval)
    assert {e.primitive.name for e in jaxpr.eqns} >= {"transpose", "xla_call"}
    check_linear(jaxpr, [False] * len(consts) + [True, True])
    rng = np.random.default_rng(7)
    u, v = rng.uniform(-1, 1, (2, 3)), rng.uniform(-1, 1, (2, 3))
    ct = (rng.uniform(-1, 1, 3), rng.uniform(-1, 1, (2, 3)))
    undefs = [ad.UndefPrimal(aval)] * 2
    ours = ad.backward_pass(jaxpr, [*consts, *undefs], list(ct))
    _, their_vjp = jax.vjp(partial(linear, Theirs), u, v)
    assert_matches(np_tree(tuple(ours)), their_vjp(ct))
    # A cotangent of None (a zero) for an output is allowed.
    ours = ad.backward_pass(jaxpr, [*consts, *undefs], [ct[0], None])
    assert_matches(np_tree(tuple(ours)), their_vjp((ct[0], np.zeros((2, 3)))))


def test_backward_pass_with_defined_inputs_and_nonlinear_work_on_them():
    """Defined (non-UndefPrimal) inputs may feed nonlinear equations; those are
    evaluated forward; unused linear inputs get zero cotangents."""
    vec = ad.ShapedArray((3,), F64)

    def f(w, t, unused):
        return ad.sin(w) * t + ad.cos(w) * 2.0 * t

    jaxpr, consts, _ = ad.make_jaxpr(f, vec, vec, vec)
    w = np.array([0.1, 0.7, -1.3])
    ct = np.array([1.0, 2.0, -0.5])
    t_bar, unused_bar = ad.backward_pass(
        jaxpr, [*consts, w, ad.UndefPrimal(vec), ad.UndefPrimal(vec)], [ct]
    )
    np.testing.assert_allclose(t_bar, ct * (np.sin(w) + 2.0 * np.cos(w)), rtol=TOL)
    np.testing.assert_array_equal(unused_bar, np.zeros(3))


def random_shape(rng: np.random.Generator, rank: int) -> tuple[int, ...]:
    return tuple(int(d) for d in rng.integers(1, 4, size=rank))


def linear_cases(rng: np.random.Generator) -> list[tuple[str, Callable, list, dict]]:
    """(name, L as a function of its linear inputs, the rule's args with
    UndefPrimal for linear inputs, params) for random shapes and params."""
    cases = []
    shape = random_shape(rng, int(rng.integers(0, 4)))
    aval = ad.ShapedArray(shape, F64)
    u = ad.UndefPrimal(aval)
    c = rng.uniform(-2, 2, size=shape)
    cases.append(("add", lambda a, b: ad.add(a, b), [u, u], {}))
    # With a defined operand, add is affine; its linear part is the identity.
    cases.append(("add", lambda a: ad.add(ad.add(a, c), -c), [u, c], {}))
    cases.append(("add", lambda b: ad.add(ad.add(c, b), -c), [c, u], {}))
    cases.append(("neg", lambda a: ad.neg(a), [u], {}))
    cases.append(("mul", lambda a: ad.mul(a, c), [u, c], {}))
    cases.append(("mul", lambda b: ad.mul(c, b), [c, u], {}))
    ndim = len(shape)
    count = int(rng.integers(0, ndim + 1))
    axes = tuple(sorted(int(a) for a in rng.permutation(ndim)[:count]))
    cases.append(("reduce_sum", lambda a: ad.reduce_sum(a, axes), [u], {"axes": axes}))
    perm = tuple(int(p) for p in rng.permutation(ndim))
    cases.append(("transpose", lambda a: ad.transpose(a, perm), [u], {"perm": perm}))
    new = int(rng.integers(0, 3))
    out_ndim = ndim + new
    b_axes = tuple(sorted(int(a) for a in rng.permutation(out_ndim)[:new]))
    dims = iter(shape)
    b_shape = tuple(
        int(rng.integers(1, 4)) if i in b_axes else next(dims) for i in range(out_ndim)
    )
    cases.append(
        (
            "broadcast",
            lambda a: ad.broadcast(a, b_shape, b_axes),
            [u],
            {"shape": b_shape, "axes": b_axes},
        )
    )
    return cases


@pytest.mark.parametrize("seed", range(12))
def test_transpose_rules_pass_the_dot_product_test(seed):
    """<ct, L(t)> == sum_i <L^T(ct)_i, t_i> for each linear primitive on random
    shapes and params; the rule returns None for non-linear operands and
    cotangents of the primal's shape and dtype for linear ones."""
    rng = np.random.default_rng(seed)
    for name, fn, rule_args, params in linear_cases(rng):
        linear = [isinstance(a, ad.UndefPrimal) for a in rule_args]
        ts = [
            rng.uniform(-1, 1, size=a.aval.shape)
            for a in rule_args
            if isinstance(a, ad.UndefPrimal)
        ]
        out = fn(*ts)
        ct = rng.uniform(-1, 1, size=np.shape(out))
        rule = ad.PRIMITIVES[name].rules["transpose"]
        cts_in = rule([ct], *rule_args, **params)
        assert len(cts_in) == len(rule_args), name
        for is_lin, ct_in, arg in zip(linear, cts_in, rule_args):
            if is_lin:
                assert np.shape(ct_in) == arg.aval.shape, name
                assert np.asarray(ct_in).dtype == F64, name
            else:
                assert ct_in is None, name
        lin_cts = [c for c, is_lin in zip(cts_in, linear) if is_lin]
        lhs, rhs = vdot(ct, out), vdot(lin_cts, ts)
        assert_close(lhs, rhs, scale=abs(lhs))


@pytest.mark.parametrize("seed", range(6))
def test_xla_call_transpose_rule_passes_the_dot_product_test(seed):
    """xla_call's transpose, for a jaxpr linear in some inputs and with a
    defined (nonlinear) input, on random shapes."""
    rng = np.random.default_rng(100 + seed)
    shape = random_shape(rng, int(rng.integers(0, 4)))
    aval = ad.ShapedArray(shape, F64)
    ndim = len(shape)
    perm = tuple(int(p) for p in rng.permutation(ndim))

    def body(w, a, b):
        y = ad.transpose(ad.sin(w) * a + ad.neg(b), perm)
        total = ad.reduce_sum(y)
        return y, total, ad.broadcast(total, (2,), (0,))

    jaxpr, consts, _ = ad.make_jaxpr(body, aval, aval, aval)
    assert not consts
    w = rng.uniform(-1, 1, size=shape)
    a, b = rng.uniform(-1, 1, size=shape), rng.uniform(-1, 1, size=shape)
    outs = ad.bind(ad.xla_call_p, w, a, b, jaxpr=jaxpr)
    cts = [rng.uniform(-1, 1, size=np.shape(o)) for o in outs]
    rule = ad.xla_call_p.rules["transpose"]
    u = ad.UndefPrimal(aval)
    w_bar, a_bar, b_bar = rule(cts, w, u, u, jaxpr=jaxpr)
    assert w_bar is None
    assert np.shape(a_bar) == np.shape(b_bar) == shape
    lhs = vdot(cts, [np.asarray(o) for o in outs])
    assert_close(lhs, vdot([a_bar, b_bar], [a, b]), scale=abs(lhs))
    # Linear in one input only (the other is a defined value); a None
    # cotangent for an output means zero.
    a_only = ad.bind(ad.xla_call_p, w, a, np.zeros(shape), jaxpr=jaxpr)
    _, a_bar2, b_none = rule([cts[0], None, cts[2]], w, u, np.zeros(shape), jaxpr=jaxpr)
    assert b_none is None
    lhs = vdot([cts[0], cts[2]], [np.asarray(a_only[0]), np.asarray(a_only[2])])
    assert_close(lhs, vdot(a_bar2, a), scale=abs(lhs))


def test_mul_of_two_linear_values_is_not_transposable():
    vec = ad.ShapedArray((2,), F64)
    jaxpr, consts, _ = ad.make_jaxpr(lambda a, b: a * b, vec, vec)
    with pytest.raises(TypeError, match="linear"):
        ad.backward_pass(
            jaxpr, [*consts, ad.UndefPrimal(vec), ad.UndefPrimal(vec)], [np.ones(2)]
        )
    assert_state_clean()


def test_every_linear_primitive_has_a_transpose_rule():
    for name in (*LINEAR_PRIMITIVES, "xla_call"):
        assert "transpose" in ad.PRIMITIVES[name].rules, name
    for name in ("sin", "cos", "gt", "lt", "eq", "ne", "le", "ge"):
        assert "transpose" not in ad.PRIMITIVES[name].rules, name


# ---------------------------------------------------------------------------
# Deep programs
# ---------------------------------------------------------------------------


def chain(ops: dict, n: int) -> Callable:
    cycle = ("sin", "mul", "cos", "add", "neg")

    def f(x):
        y = x
        for i in range(n):
            name = cycle[i % len(cycle)]
            y = ops[name](y, x) if name in ("mul", "add") else ops[name](y)
        return ops["sum"](y)

    return f


OURS_OPS = {
    "sin": ad.sin, "cos": ad.cos, "mul": ad.mul, "add": ad.add, "neg": ad.neg,
    "sum": ad.reduce_sum,
}  # fmt: skip
JAX_OPS = {
    "sin": lax.sin, "cos": lax.cos, "mul": lax.mul, "add": lax.add, "neg": lax.neg,
    "sum": jnp.sum,
}  # fmt: skip


def test_grad_of_a_function_with_2000_primitives():
    """No recursion limit is hit (2000 > sys.getrecursionlimit())."""
    x = np.linspace(0.1, 0.4, 4)
    ours = ad.grad(chain(OURS_OPS, 2000))(x)
    theirs = jax.grad(chain(JAX_OPS, 2000))(x)
    assert_matches(ours, theirs)


def numpy_chain_jvp(n: int, x: np.ndarray, t: np.ndarray) -> tuple[float, float]:
    """The chain's value and directional derivative, by forward mode written
    out with NumPy (the reference for chains too long to compile quickly)."""
    y, dy = x, t
    for i in range(n):
        name = ("sin", "mul", "cos", "add", "neg")[i % 5]
        if name == "sin":
            y, dy = np.sin(y), np.cos(y) * dy
        elif name == "cos":
            y, dy = np.cos(y), -np.sin(y) * dy
        elif name == "mul":
            y, dy = y * x, dy * x + y * t
        elif name == "add":
            y, dy = y + x, dy + t
        else:
            y, dy = -y, -dy
    return float(np.sum(y)), float(np.sum(dy))


def test_linearize_of_a_deep_chain():
    """linearize and vjp of 12,000 primitives: iterative all the way."""
    x = np.linspace(0.1, 0.4, 4)
    f = chain(OURS_OPS, 12_000)
    y, f_lin = ad.linearize(f, x)
    _, f_vjp = ad.vjp(f, x)
    t = np.array([1.0, -1.0, 0.5, 2.0])
    their_y, their_t = numpy_chain_jvp(12_000, x, t)
    np.testing.assert_allclose(y, their_y, rtol=TOL)
    np.testing.assert_allclose(f_lin(t), their_t, rtol=TOL, atol=TOL)
    (x_bar,) = f_vjp(np.float64(1.0))
    np.testing.assert_allclose(vdot(x_bar, t), their_t, rtol=TOL, atol=TOL)


# ---------------------------------------------------------------------------
# Interpreter state after errors
# ---------------------------------------------------------------------------


def _leak_from_linearize_and_use():
    leaked = []
    ad.linearize(lambda x: leaked.append(x) or ad.sin(x), 1.0)
    return ad.grad(lambda y: y * leaked[0])(1.0)


@pytest.mark.parametrize(
    "thunk, exc",
    [
        (lambda: ad.grad(ad.sin)(np.ones(3)), TypeError),
        (lambda: ad.grad(lambda x: x * np.ones(2))(np.ones(3)), TypeError),
        (lambda: ad.grad(lambda x: "no")(1.0), TypeError),
        (
            lambda: ad.grad(ad.jit(lambda x: x if x > 0.0 else -x))(1.0),
            ad.ConcretizationError,
        ),
        (lambda: ad.linearize(lambda x: ad.sin(x) * np.ones(2), np.ones(3)), TypeError),
        (lambda: ad.vjp(lambda x: ad.reduce_sum(x, 4), np.ones(3)), ValueError),
        (lambda: ad.grad(ad.grad(lambda x: ad.sin(x) * np.ones(2)))(1.0), TypeError),
        (lambda: ad.jit(ad.grad(lambda x: x * np.ones(2)))(np.ones(3)), TypeError),
        (lambda: ad.vmap(ad.grad(lambda x: ad.sin(x)))(np.ones((2, 3))), TypeError),
        (lambda: ad.jvp(ad.grad(lambda x: x), (1,), (1,)), TypeError),
        (
            lambda: ad.grad(lambda x: ad.vmap(lambda y: y if y > 0.0 else y)(x))(
                np.ones(2)
            ),
            ad.ConcretizationError,
        ),
        (_leak_from_linearize_and_use, ad.UnexpectedTracerError),
    ],
    ids=[
        "nonscalar",
        "shape-mismatch",
        "string-output",
        "if-in-jit",
        "linearize-shape",
        "vjp-axis",
        "grad-grad",
        "jit-of-grad",
        "vmap-of-grad",
        "jvp-of-grad-int",
        "vmap-inside-grad",
        "leak",
    ],
)
def test_state_clean_after_errors(thunk, exc):
    with pytest.raises(exc) as info:
        thunk()
    assert not isinstance(info.value, (AssertionError, KeyError, AttributeError))
    assert_state_clean()
    np.testing.assert_allclose(ad.grad(ad.sin)(0.5), np.cos(0.5), rtol=TOL)
    np.testing.assert_allclose(ad.grad(ad.jit(ad.sin))(0.5), np.cos(0.5), rtol=TOL)
    jaxpr, _, _ = ad.make_jaxpr(lambda: ad.mul(2.0, 2.0))
    assert [e.primitive.name for e in jaxpr.eqns] == ["mul"]
    assert_state_clean()
