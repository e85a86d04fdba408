"""Tests of Part 7: ``scan``, a loop with reverse mode.

Each program is written once against a small namespace of operations and run
with autodidax and with jax.lax/jax.numpy; results must agree to 1e-9 in
float64 (tests/conftest.py switches JAX's x64 mode on) under eval, jit, jvp,
vmap (batched xs, batched init, both, batched closed-over weights),
linearize, vjp, grad, jit(grad), grad(jit), vmap(grad) and grad(grad), with
reverse=True, pytree carries, xs and ys, xs=None with length, integer
carries, and carries that become unknown or batched only after some trips.
Around that: the jaxpr (one ``scan`` equation), the lowering, hoisting of
loop-invariant residuals, the dot-product test of transposition
(<J v, u> = <v, J^T u>), fori_loop under grad, the registries, and every
error the chapter promises.
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

pytestmark = pytest.mark.usefixtures("clean_interpreter_stack")

TOL = 1e-9
F64 = np.float64

OURS = SimpleNamespace(
    scan=ad.scan,
    fori_loop=ad.fori_loop,
    cond=ad.cond,
    sin=ad.sin,
    cos=ad.cos,
    tanh=ad.tanh,
    total=ad.reduce_sum,
    to_float=lambda i: ad.convert_element_type(i, F64),
)
JAX = SimpleNamespace(
    scan=lax.scan,
    fori_loop=lax.fori_loop,
    cond=lax.cond,
    sin=jnp.sin,
    cos=jnp.cos,
    tanh=jnp.tanh,
    total=jnp.sum,
    to_float=lambda i: jnp.asarray(i, F64),
)


# ---------------------------------------------------------------------------
# Programs: (L, *float args) -> pytree of outputs
# ---------------------------------------------------------------------------


def rnn(L, w, xs):
    """tanh recurrence with a pytree carry and a dict of ys."""

    def step(carry, x):
        h, acc = carry
        h = L.tanh(h * w + x)
        return (h, acc + h * h), {"h": h, "sq": L.sin(h) * w}

    return L.scan(step, (w * 0.5, 0.0), xs)


def rnn_reverse(L, w, xs):
    def step(h, x):
        h = L.tanh(h * w + L.sin(x))
        return h, h * x

    return L.scan(step, 0.3, xs, reverse=True)


def matrix_rnn(L, W, xs):
    """A matrix weight, a vector carry, xs of shape (5, 3)."""

    def step(h, x):
        h = L.tanh(W @ h + x)
        return h, L.total(h * h)

    return L.scan(step, np.full(3, 0.1), xs)


def no_xs(L, x, w):
    """xs=None with a length; a carry fed only by the body."""

    def step(c, _):
        return c * w + L.sin(c), c * c

    return L.scan(step, x, None, length=7)


def shift(L, x, w):
    """Carry (a, b, c) -> (a * w, a, b * c): tangents, batch axes and
    unknowns reach b and c only after one and two trips."""

    def step(carry, _):
        i, (a, b, c) = carry
        return (i + 1, (a * w + L.sin(b), a, b * c + L.to_float(i))), a + c

    zero = x * 0.0
    return L.scan(step, (0, (x, zero + 1.0, zero + 2.0)), None, length=6)


def invariant(L, w, xs):
    """Residuals that depend only on w (cos w, sin w): hoisted."""

    def step(h, x):
        h = L.tanh(h * L.cos(w) + x * L.sin(w))
        return h, h

    return L.scan(step, 0.2, xs)


def pytree_xs(L, w, xs):
    """A dict of xs with two leaves, a tuple of ys, one y that ignores the
    carry."""

    def step(c, x):
        c = c * x["a"] + L.cos(x["b"] * w)
        return c, (c, x["a"] * 2.0)

    return L.scan(step, w, xs, reverse=True)


def fori(L, x, w):
    """fori_loop with Python-int bounds: a scan, so it has reverse mode."""

    def body(i, c):
        return c * w + L.sin(c) * L.to_float(i)

    return L.fori_loop(0, 5, body, x)


def nested(L, w, xs):
    """A scan whose body holds a scan and a cond that take primals and
    tangents together: partial evaluation must keep the primals known."""

    def inner(c, x):
        return c * w + L.sin(x * c), c

    def outer(c, row):
        c, ys = L.scan(inner, c, row)
        c = L.cond(c > 0.0, lambda a: a * w, lambda a: L.cos(a) + w, c)
        return c, ys * c

    return L.scan(outer, w, xs, reverse=True)


@dataclass
class Program:
    name: str
    fn: Callable
    args: tuple
    batched: tuple  # batched versions of args (leading axis 3)


RNG = np.random.default_rng(7)
XS = np.sin(np.arange(8.0))
XS_B = np.stack([XS, XS * 0.5, np.cos(XS)])
W_M = RNG.normal(size=(3, 3)) * 0.5
XS_M = RNG.normal(size=(5, 3))
PYXS = {"a": np.linspace(0.5, 1.0, 4), "b": np.linspace(-1.0, 1.0, 4)}
PYXS_B = {k: np.stack([v, v * 0.9, v + 0.1]) for k, v in PYXS.items()}
B3 = np.array([0.3, 0.6, 0.9])

PROGRAMS = [
    Program("rnn", rnn, (F64(0.8), XS), (B3, XS_B)),
    Program("rnn_reverse", rnn_reverse, (F64(0.7), XS), (B3, XS_B)),
    Program(
        "matrix_rnn",
        matrix_rnn,
        (W_M, XS_M),
        (np.stack([W_M, W_M * 0.5, -W_M]), np.stack([XS_M] * 3) * B3[:, None, None]),
    ),
    Program("no_xs", no_xs, (F64(0.4), F64(0.8)), (B3, B3 + 0.1)),
    Program("shift", shift, (F64(0.4), F64(0.8)), (B3, B3 + 0.1)),
    Program("invariant", invariant, (F64(0.7), XS), (B3, XS_B)),
    Program("pytree_xs", pytree_xs, (F64(0.7), PYXS), (B3, PYXS_B)),
    Program("fori", fori, (F64(0.4), F64(0.8)), (B3, B3 + 0.1)),
    Program(
        "nested",
        nested,
        (F64(0.7), XS_M.T[:, :4]),
        (np.array([0.7, -0.3, 0.2]), np.stack([XS_M.T[:, :4]] * 3) * B3[:, None, None]),
    ),
]
IDS = [p.name for p in PROGRAMS]


def leaves(tree: Any) -> list[np.ndarray]:
    """The leaves as float64 arrays; JAX's float0 tangents of integers as 0."""
    out = []
    for x in jax.tree_util.tree_leaves(tree):
        if getattr(x, "dtype", None) == jax.dtypes.float0:
            out.append(np.zeros(np.shape(x)))
        else:
            out.append(np.asarray(x, F64))
    return out


def assert_close(ours: Any, theirs: Any) -> None:
    a, b = leaves(ours), leaves(theirs)
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert x.shape == y.shape
        np.testing.assert_allclose(x, y, rtol=TOL, atol=TOL)


def scalar_loss(L, fn):
    """A scalar function of a program's outputs: sum of sin of every leaf."""

    def loss(args):
        outs = fn(L, *args)
        total = 0.0
        for leaf in jax.tree_util.tree_leaves(outs):
            if np.issubdtype(
                np.dtype(getattr(leaf, "dtype", None) or leaf.aval.dtype),
                np.floating,
            ):
                total = total + L.total(L.sin(leaf))
        return total

    return loss


_REFERENCES: dict[tuple, Any] = {}


def reference(key: tuple, compute: Callable[[], Any]) -> Any:
    """JAX's result ``compute()``, under ``jax.jit`` and once per test process
    for ``key`` (the tests that share a key compare with the same result):
    one trace, lowering and compile of the whole computation, where eager JAX
    compiled each of its primitives as a program of its own. ``compute``
    closes over its arguments, which stay the constants they are eagerly."""
    if key not in _REFERENCES:
        _REFERENCES[key] = jax.jit(compute)()
    return _REFERENCES[key]


def tangents_for(args):
    return jax.tree_util.tree_map(lambda a: np.cos(np.asarray(a) * 1.3) + 0.2, args)


@pytest.mark.parametrize("p", PROGRAMS, ids=IDS)
def test_eval_and_jit(p):
    expected = reference((p.name, "eval"), lambda: p.fn(JAX, *p.args))
    assert_close(p.fn(OURS, *p.args), expected)
    assert_close(ad.jit(lambda *a: p.fn(OURS, *a))(*p.args), expected)


@pytest.mark.parametrize("p", PROGRAMS, ids=IDS)
def test_jvp_and_linearize(p):
    dots = tangents_for(p.args)
    expected = reference(
        (p.name, "jvp"), lambda: jax.jvp(lambda *a: p.fn(JAX, *a), p.args, dots)
    )
    assert_close(ad.jvp(lambda *a: p.fn(OURS, *a), p.args, dots), expected)
    assert_close(
        ad.jit(lambda *a: ad.jvp(lambda *b: p.fn(OURS, *b), a, dots))(*p.args), expected
    )
    out, f_lin = ad.linearize(lambda *a: p.fn(OURS, *a), *p.args)
    assert_close(out, expected[0])
    assert_close(f_lin(*dots), expected[1])


@pytest.mark.parametrize("p", PROGRAMS, ids=IDS)
@pytest.mark.parametrize("which", ["first", "second", "both"])
def test_vmap(p, which):
    in_axes = {"first": (0, None), "second": (None, 0), "both": (0, 0)}[which]
    args = [b if ax == 0 else a for a, b, ax in zip(p.args, p.batched, in_axes)]
    expected = reference(
        (p.name, "vmap", which),
        lambda: jax.vmap(lambda *a: p.fn(JAX, *a), in_axes)(*args),
    )
    assert_close(ad.vmap(lambda *a: p.fn(OURS, *a), in_axes)(*args), expected)
    assert_close(ad.jit(ad.vmap(lambda *a: p.fn(OURS, *a), in_axes))(*args), expected)


@pytest.mark.parametrize("p", PROGRAMS, ids=IDS)
def test_vjp(p):
    out, f_vjp = ad.vjp(lambda *a: p.fn(OURS, *a), *p.args)
    j_out = reference((p.name, "eval"), lambda: p.fn(JAX, *p.args))
    cts = jax.tree_util.tree_map(lambda y: np.sin(np.asarray(y) + 0.5), j_out)
    cts = jax.tree_util.tree_map(
        lambda c, y: np.asarray(c).astype(np.asarray(y).dtype), cts, j_out
    )
    if any(np.asarray(y).dtype.kind != "f" for y in jax.tree_util.tree_leaves(j_out)):
        pytest.skip("integer outputs: no cotangent")
    expected = reference(
        (p.name, "vjp"), lambda: jax.vjp(lambda *a: p.fn(JAX, *a), *p.args)[1](cts)
    )
    assert_close(f_vjp(cts), expected)


@pytest.mark.parametrize("p", PROGRAMS, ids=IDS)
@pytest.mark.parametrize("how", ["grad", "jit(grad)", "grad(jit)"])
def test_grad(p, how):
    ours, theirs = scalar_loss(OURS, p.fn), scalar_loss(JAX, p.fn)
    g = {
        "grad": ad.grad(ours),
        "jit(grad)": ad.jit(ad.grad(ours)),
        "grad(jit)": ad.grad(ad.jit(ours)),
    }[how]
    assert_close(
        g(p.args), reference((p.name, "grad"), lambda: jax.grad(theirs)(p.args))
    )


@pytest.mark.parametrize("p", PROGRAMS, ids=IDS)
def test_vmap_of_grad(p):
    ours, theirs = scalar_loss(OURS, p.fn), scalar_loss(JAX, p.fn)
    expected = reference(
        (p.name, "vmap(grad)"), lambda: jax.vmap(jax.grad(theirs))(p.batched)
    )
    assert_close(ad.vmap(ad.grad(ours))(p.batched), expected)
    assert_close(ad.jit(ad.vmap(ad.grad(ours)))(p.batched), expected)


@pytest.mark.parametrize(
    "p", [p for p in PROGRAMS if np.ndim(p.args[0]) == 0], ids=lambda p: p.name
)
def test_second_derivatives(p):
    def first(L, grad):
        loss = scalar_loss(L, p.fn)
        return grad(lambda a0: loss((a0, *p.args[1:])))

    expected = reference(
        (p.name, "grad(grad)"), lambda: jax.grad(first(JAX, jax.grad))(p.args[0])
    )
    assert_close(ad.grad(first(OURS, ad.grad))(p.args[0]), expected)
    assert_close(ad.jit(ad.grad(ad.jit(first(OURS, ad.grad))))(p.args[0]), expected)
    forward_over_reverse = ad.jvp(first(OURS, ad.grad), (p.args[0],), (1.0,))[1]
    assert_close(forward_over_reverse, expected)


# ---------------------------------------------------------------------------
# Transposition: the dot-product test, <J v, u> = <v, J^T u>
# ---------------------------------------------------------------------------


def _dot(a: Any, b: Any) -> float:
    return sum(float(np.sum(x * y)) for x, y in zip(leaves(a), leaves(b)))


@pytest.mark.parametrize(
    "p", [p for p in PROGRAMS if p.name != "shift"], ids=lambda p: p.name
)
def test_transpose_dot_product(p):
    out, f_lin = ad.linearize(lambda *a: p.fn(OURS, *a), *p.args)
    _, f_vjp = ad.vjp(lambda *a: p.fn(OURS, *a), *p.args)
    v = tangents_for(p.args)
    u = jax.tree_util.tree_map(lambda y: np.cos(np.asarray(y) * 2.0 + 0.1), out)
    lhs = _dot(f_lin(*v), u)
    rhs = _dot(v, f_vjp(u))
    assert abs(lhs - rhs) <= 1e-9 * max(1.0, abs(lhs))


def test_transpose_rule_on_a_linear_scan():
    """A scan linear in its carry and its xs (with a known weight a),
    transposed by backward_pass: one scan, running the other way, and
    <J v, u> = <v, J^T u>."""
    a = F64(1.7)

    def linear(c, xs):
        def step(carry, x):
            return carry * 0.9 + x * a, carry * 2.0 - x

        return ad.scan(step, c, xs)

    args = (F64(0.3), XS)
    avals = [ad.get_aval(x) for x in args]
    jaxpr = ad.make_jaxpr(linear, *avals)[0]
    ct = (F64(0.6), np.cos(XS))
    undef = [ad.UndefPrimal(aval) for aval in avals]
    cts = ad.backward_pass(jaxpr, undef, list(ct))
    transposed = ad.make_jaxpr(
        lambda c0, c1: ad.backward_pass(jaxpr, undef, [c0, c1]), *map(ad.get_aval, ct)
    )[0]
    scans = [e for e in transposed.eqns if e.primitive.name == "scan"]
    assert len(scans) == 1 and scans[0].params["reverse"] is True
    lhs = _dot(linear(*args), ct)
    rhs = _dot(args, cts)
    assert abs(lhs - rhs) <= 1e-9 * max(1.0, abs(lhs))


# ---------------------------------------------------------------------------
# The jaxpr, the lowering, hoisting, fori_loop
# ---------------------------------------------------------------------------

SCALAR = ad.ShapedArray((), F64)


def test_one_scan_equation_whatever_the_length():
    for n in (10, 1000):
        jaxpr = ad.make_jaxpr(lambda xs: rnn(OURS, 0.8, xs), ad.ShapedArray((n,), F64))[
            0
        ]
        assert [e.primitive.name for e in jaxpr.eqns].count("scan") == 1
        ad.typecheck_jaxpr(jaxpr)
    sizes = []
    for n in (10, 1000):
        g = ad.make_jaxpr(
            ad.grad(lambda w, xs: ad.reduce_sum(rnn(OURS, w, xs)[1]["h"], 0)),
            SCALAR,
            ad.ShapedArray((n,), F64),
        )[0]
        sizes.append(len(g.eqns))
    assert sizes[0] == sizes[1]


def test_lowering_uses_dynamic_slices():
    jaxpr = ad.make_jaxpr(
        lambda xs: rnn_reverse(OURS, 0.8, xs), ad.ShapedArray((8,), F64)
    )[0]
    text = str(ad.lower_jaxpr(jaxpr))
    for op in (
        "stablehlo.while",
        "stablehlo.dynamic_slice",
        "stablehlo.dynamic_update_slice",
    ):
        assert op in text


def _cumsum(xs):
    return ad.scan(lambda total, x: (total + x, total + x), 0.0, xs)[1]


def test_lowered_running_total_has_no_dead_constants():
    # The chapter prints this module: the loop body's only constant is the
    # counter's increment (a row of a 1-D array needs no zero indices).
    jaxpr = ad.make_jaxpr(_cumsum, ad.ShapedArray((4,), F64))[0]
    body = str(ad.lower_jaxpr(jaxpr)).split("} do {")[1].split("return %0")[0]
    assert body.count("stablehlo.constant") == 1


def test_compiled_running_total_of_many_numbers():
    xs = np.random.default_rng(0).normal(size=100_000)
    np.testing.assert_allclose(ad.jit(_cumsum)(xs), np.cumsum(xs), rtol=1e-9)


def test_hoisting_is_optional(monkeypatch):
    # Without hoisting (before does nothing), every residual is stacked and
    # the gradient is the same: hoisting only saves memory.
    def no_hoisting(s, num_known_consts):
        binders = s.known_body.in_binders[:num_known_consts]
        return ad.Jaxpr(binders, [], binders), s

    def loss(w, xs):
        return ad.reduce_sum(rnn(OURS, w, xs)[1]["h"], 0)

    xs = np.sin(np.arange(7.0))
    hoisted = ad.linearize_flat(lambda w: [loss(w, xs)], [F64(0.8)])[2]
    expected = ad.grad(loss)(F64(0.8), xs)
    monkeypatch.setattr(ad, "hoist_residuals", no_hoisting)
    stacked = ad.linearize_flat(lambda w: [loss(w, xs)], [F64(0.8)])[2]
    assert ad.grad(loss)(F64(0.8), xs) == pytest.approx(expected, rel=1e-12)
    assert ad.jit(ad.grad(loss))(F64(0.8), xs) == pytest.approx(expected, rel=1e-12)
    assert ad.grad(ad.jit(loss))(F64(0.8), xs) == pytest.approx(expected, rel=1e-12)
    assert sum(np.shape(r) == (7,) for r in stacked) > sum(
        np.shape(r) == (7,) for r in hoisted
    )


def test_residuals_that_depend_only_on_constants_are_hoisted():
    def loss(W):
        return ad.reduce_sum(matrix_rnn(OURS, ad.cos(W), XS_M)[1], 0)

    _, _, residuals = ad.linearize_flat(lambda W: [loss(W)], [W_M])
    shapes = [np.shape(r) for r in residuals]
    assert (3, 3) in shapes  # cos W and sin W: saved once
    assert all(s[:1] != (5,) or len(s) < 3 for s in shapes), shapes  # no stack of W
    assert all(np.size(r) <= 15 for r in residuals)


def test_a_10000_step_scan_saves_rows_not_copies():
    xs = np.sin(np.arange(10_000.0))
    _, _, residuals = ad.linearize_flat(
        lambda w: [ad.reduce_sum(rnn_reverse(OURS, w, xs)[1], 0)], [F64(0.7)]
    )
    stacked = [r for r in residuals if np.shape(r) == (10_000,)]
    assert 1 <= len(stacked) <= 5  # one a zero tangent (no symbolic zeros)
    assert all(np.ndim(r) in (0, 1) for r in residuals)


def test_fori_loop_with_int_bounds_is_a_scan_with_grad():
    def f(x):
        return ad.fori_loop(0, 3, lambda i, c: c * x, x)

    jaxpr = ad.make_jaxpr(f, SCALAR)[0]
    assert [e.primitive.name for e in jaxpr.eqns] == ["scan"]
    assert ad.grad(f)(F64(1.5)) == pytest.approx(4 * 1.5**3, rel=1e-12)
    assert ad.jit(ad.grad(f))(F64(1.5)) == pytest.approx(4 * 1.5**3, rel=1e-12)
    traced = ad.make_jaxpr(
        lambda x, n: ad.fori_loop(0, n, lambda i, c: c * x, x),
        SCALAR,
        ad.ShapedArray((), np.int64),
    )[0]
    assert [e.primitive.name for e in traced.eqns] == ["while"]
    assert ad.fori_loop(5, 2, lambda i, c: c + 1.0, 0.0) == 0.0


def test_registries():
    prim = ad.PRIMITIVES["scan"]
    assert prim is ad.scan_p
    for kind in (
        "impl",
        "abstract_eval",
        "lower",
        "jvp",
        "vmap",
        "partial_eval",
        "partial_eval_jaxpr",
        "transpose",
    ):
        assert kind in prim.rules, kind
    assert "scan" not in ad.NOT_LINEAR


def test_zero_length_scan():
    carry, ys = ad.scan(lambda c, x: (c + x, c * x), 1.0, np.zeros(0))
    j_carry, j_ys = lax.scan(lambda c, x: (c + x, c * x), 1.0, np.zeros(0))
    assert_close((carry, ys), (j_carry, j_ys))
    assert_close(
        ad.jit(lambda xs: ad.scan(lambda c, x: (c + x, c * x), 1.0, xs))(np.zeros(0)),
        (j_carry, j_ys),
    )


# ---------------------------------------------------------------------------
# Errors
# ---------------------------------------------------------------------------


def _stack_is_clean():
    assert len(ad._state.stack) == 1


def _keep(c, x):
    return c, x


ERRORS = {
    "lengths": (
        lambda: ad.scan(_keep, 0.0, (np.ones(3), np.ones(4))),
        ValueError,
        r"share one leading length.*float64\[3\], float64\[4\]",
    ),
    "length": (
        lambda: ad.scan(_keep, 0.0, np.ones(3), length=4),
        ValueError,
        r"length=4 disagrees .* 3",
    ),
    "no_length": (
        lambda: ad.scan(_keep, 0.0, None),
        ValueError,
        r"no xs, give the number of trips as length",
    ),
    "scalar_xs": (lambda: ad.scan(_keep, 0.0, 1.0), ValueError, r"leading axis"),
    "carry_type": (
        lambda: ad.scan(lambda c, x: (c * np.ones(2), x), 0.0, np.ones(3)),
        TypeError,
        r"carry of the type it is given, float64\[\], but it returned float64\[2\]",
    ),
    "carry_dtype": (
        lambda: ad.scan(
            lambda c, x: (ad.convert_element_type(c, np.float32), x), 0.0, np.ones(3)
        ),
        TypeError,
        r"float64\[\], but it returned float32\[\]",
    ),
    "carry_tree": (
        lambda: ad.scan(lambda c, x: ((c, c), x), 0.0, np.ones(3)),
        TypeError,
        r"float64\[\], but it returned \(float64\[\], float64\[\]\)",
    ),
    "not_pair": (
        lambda: ad.scan(lambda c, x: c + x, 0.0, np.ones(3)),
        TypeError,
        r"must return a pair \(carry, y\)",
    ),
    "triple": (
        lambda: ad.scan(lambda c, x: (c, x, x), 0.0, np.ones(3)),
        TypeError,
        r"must return a pair",
    ),
    "bad_length": (
        lambda: ad.scan(_keep, 0.0, None, length=-1),
        TypeError,
        r"non-negative",
    ),
}


@pytest.mark.parametrize("case", ERRORS, ids=list(ERRORS))
@pytest.mark.parametrize("mode", ["eager", "jit"])
def test_errors(case, mode):
    fn, exc, match = ERRORS[case]
    with raises_clearly(exc, match, _stack_is_clean):
        if mode == "eager":
            fn()
        else:
            with nothing_compiled():
                ad.jit(lambda x: (fn(), x)[1])(F64(1.0))
