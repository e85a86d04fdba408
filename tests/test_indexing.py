"""Differential tests of the indexing chapter (book/indexing.md) against JAX.

Every indexing form (ints, slices, None, ..., integer arrays traced or not,
static boolean masks, .at[] updates, take, take_along_axis, split, argmax,
argmin, lax.slice/dynamic_slice/dynamic_update_slice/gather/scatter_add) is
run under eval, jit, jvp, grad, jit of grad, linearize, a second derivative,
and vmap with the operand batched, the indices batched, or both, and compared
with jax.numpy / jax.lax in float64 to 1e-9. Then: indexing inside scan and
cond, repeated indices, out-of-range positions (reads clamp, writes drop,
take fills), an embedding lookup and its gradient (a scatter-add, no one-hot
product), a cross-entropy loss with take_along_axis, the transposes checked
by the dot-product test, iteration over traced arrays, and the errors.
"""

from __future__ import annotations

import zlib
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import raises_clearly

import autodidax as ad
from autodidax import numpy as anp

pytestmark = pytest.mark.usefixtures("clean_interpreter_stack")

TOL = 1e-9


def host(x: Any) -> Any:
    return np.asarray(x) if isinstance(x, ad.Array) else x


def assert_close(ours: Any, theirs: Any, what: str = "") -> None:
    our_leaves = jax.tree_util.tree_leaves(ours)
    their_leaves = jax.tree_util.tree_leaves(theirs)
    assert len(our_leaves) == len(their_leaves), what
    for k, (mine, ref) in enumerate(zip(our_leaves, their_leaves)):
        mine, ref = np.asarray(host(mine)), np.asarray(ref)
        where = f"{what} (leaf {k})"
        assert mine.shape == ref.shape, (where, mine.shape, ref.shape)
        if ref.dtype == jax.dtypes.float0:
            assert not np.any(mine), where
            continue
        assert mine.dtype == ref.dtype, (where, mine.dtype, ref.dtype)
        np.testing.assert_allclose(
            mine, ref, rtol=TOL, atol=TOL, equal_nan=True, err_msg=where
        )


def rng_for(*key: Any) -> np.random.Generator:
    return np.random.default_rng(zlib.crc32(repr(key).encode()))


class Lib:
    """The names a case uses, from autodidax or from JAX."""

    def __init__(self, ours: bool) -> None:
        self.ours = ours
        self.np = anp if ours else jnp
        self.lax = ad.lax if ours else jax.lax
        mod = ad if ours else jax
        self.jit, self.grad, self.vmap = mod.jit, mod.grad, mod.vmap
        self.jvp, self.linearize = mod.jvp, mod.linearize
        self.scan = ad.scan if ours else jax.lax.scan
        self.cond = ad.cond if ours else jax.lax.cond


OURS, JAX = Lib(True), Lib(False)


# ---------------------------------------------------------------------------
# The cases: fn(lib, x, *index_args) -> array (or list of arrays)
# ---------------------------------------------------------------------------

I2 = np.array([0, 3, 3, -1])  # repeats and a negative index
MASK = np.array([True, False, True, True])


def _gather(lib, x, i):
    return lib.lax.gather(x, i) if lib.ours else x[i]


def _scatter_add(lib, x, i):
    rows = x[:3] * 2.0
    return lib.lax.scatter_add(x, rows, i) if lib.ours else x.at[i].add(rows)


def UNIQUE(lib):
    """JAX differentiates scatter-mul's updates only with unique_indices=True."""
    return {} if lib.ours else {"unique_indices": True}


# name: (fn, x shape, index args, float output)
CASES: dict[str, tuple] = {
    # static indices: one case per group, a list of results (a failure names
    # the leaf)
    "slices, ints, None": (
        lambda lib, x: [
            x[1:3],
            x[:, ::2],
            x[..., None],
            x[-1],
            x[1, None, -2:],
            x[7] + x[-9],  # out of range: clamped
            x[..., 2, 1:],
            x[:, None],
        ],
        (4, 5),
        [],
        True,
    ),
    "static gathers": (
        lambda lib, x: [
            x[::-1, 4:0:-2],
            x[MASK],
            x[np.eye(4, 5) > 0],
            x[I2],
            x[np.array([9, -9, 2])],  # out of range
            x[:, np.array([[0, 4], [2, 2]])],
            x[np.array([0, 3]), np.array([1, 4])],
            x[np.array([0, 2]), None, np.array([1, 3])],
        ],
        (4, 5),
        [],
        True,
    ),
    "arrays and slices, 3-d": (
        lambda lib, x: [
            x[np.array([1, 0]), :, np.array([[2], [0]])],
            x[1, np.array([0, 2]), 1:],
            x[:, np.array([3, 0, 3])],
            x[..., 2, 1:],
        ],
        (3, 4, 5),
        [],
        True,
    ),
    "scalar booleans": (
        lambda lib, x: [x[True], x[1, True], x[np.array([0, 2]), True], x[:, False]],
        (4, 5),
        [],
        True,
    ),
    "static updates": (
        lambda lib, x: [
            x.at[I2].add(x[0] * 3.0),
            x.at[np.array([2, 0]), 1:].set(x[:2, :4] * 2.0),
            x.at[1:3, ::2].set(7.0),
            x.at[np.array([5, -1, -7])].add(x[1:4]),  # out of range: dropped
            x.at[::2, np.array([1, 1])].get(),
            x.at[0, True].set(x[1] * 2.0),
        ],
        (4, 5),
        [],
        True,
    ),
    "multiply, min, clip": (
        lambda lib, x: [
            x.at[np.array([2, 0]), 1:].multiply(x[:2, :4], **UNIQUE(lib)),
            x.at[I2].multiply(np.arange(1.0, 6.0)),
            x.at[I2].min(x[0] * 0.5),
            x.at[np.array([5, -1, -7])].add(x[1:4], mode="clip"),
        ],
        (4, 5),
        [],
        True,
    ),
    "take": (
        lambda lib, x: [
            lib.np.take(x, np.array([7, -1, 25, 3])),
            lib.np.take(x, np.array([7, -1, 2]), axis=0, mode="clip"),
            lib.np.take_along_axis(x, np.array([[0, 5, -1, 2, 1]]), axis=0),
            lib.np.take_along_axis(
                x, np.array([[0, 5, -1, 2, -9]]), axis=0, mode="clip"
            ),
        ],
        (4, 5),
        [],
        True,
    ),
    "split": (
        lambda lib, x: [*lib.np.split(x, 2, axis=0), *lib.np.split(x, [1, 3], axis=1)],
        (4, 5),
        [],
        True,
    ),
    "iterate": (lambda lib, x: lib.np.stack(list(x)[::-1]) * x[0], (4, 5), [], True),
    "lax, static": (
        lambda lib, x: [
            lib.lax.slice(x, (1, 0), (4, 5), (2, 3)),
            _scatter_add(lib, x, np.array([1, 7, 2])),  # 7: dropped
        ],
        (4, 5),
        [],
        True,
    ),
    "argmax, argmin": (
        lambda lib, x: [
            lib.np.argmax(x, axis=1),
            lib.np.argmin(x),
            lib.np.argmax(x, axis=0, keepdims=True),
        ],
        (4, 5),
        [],
        False,
    ),
    # traced indices
    "traced scalar": (
        lambda lib, x, i: [
            x[i],
            x[i, 1:4],
            x[:, i],
            x[i, ::2],
            x.at[i, 1:].set(x[0, :4]),
            lib.lax.dynamic_slice(x, (i, 1), (2, 3)),
            lib.lax.dynamic_update_slice(x, x[:2, :3] * 3.0, (1, i)),
        ],
        (4, 5),
        ["i"],
        True,
    ),
    "traced rows": (
        lambda lib, x, t: [
            x[t],
            x[t, -1],
            x[:, t],
            x.at[t].add(x[:3]),
            x.at[t].max(x[:3]),
            lib.np.take(x, t, axis=1),
        ],
        (4, 5),
        ["t"],
        True,
    ),
    "traced rows, column": (lambda lib, x, t, i: x[t, i], (4, 5), ["t", "i"], True),
    "lax.gather, scatter_add": (
        lambda lib, x, t: [_gather(lib, x, t), _scatter_add(lib, x, t)],
        (4, 5),
        ["t3"],
        True,
    ),
    "take_along_axis": (
        lambda lib, x, y: lib.np.take_along_axis(x, y[:, None], axis=1),
        (4, 5),
        ["y"],
        True,
    ),
    "int32 rows": (lambda lib, x, t: x[t], (4, 5), ["t32"], True),
    "uint8 rows": (lambda lib, x, t: x[:, t] * 2.0, (4, 5), ["u8"], True),
    "traced out of range": (
        lambda lib, x, o: [
            x[o] + x[:, o[:2]].sum(),
            x.at[o].set(x[:4] * 2.0, mode="drop"),
            x.at[:, o].get(mode="fill", fill_value=-1.0),
            x.at[o].get(mode="clip"),
        ],
        (4, 5),
        ["o"],
        True,
    ),
}

INDEX_ARGS = {  # two batch members each, for vmap over the indices
    "i": [np.int64(2), np.int64(-1)],
    "t": [np.array([1, 3, 1]), np.array([0, -2, 3])],
    "t3": [np.array([1, 3, 1]), np.array([0, 2, 2])],  # lax: no negative indices
    "y": [np.array([0, 4, 4, 1]), np.array([3, 2, 1, 0])],
    "t32": [np.array([1, 3], np.int32), np.array([-1, 0], np.int32)],
    "u8": [np.array([4, 0, 2], np.uint8), np.array([1, 1, 3], np.uint8)],
    "o": [np.array([9, -1, 2, -7]), np.array([4, -5, 0, 3])],
}

# "second" (jvp of grad) checks the gradient and a Hessian-vector product, so
# grad and jvp on their own add nothing; linearize checks the jvp rules.
MODES = ["eval", "jit", "second", "vmap_x"]
# With traced indices, also: jit of grad, linearize, and vmap over the indices.
IDX_MODES = ["jit_grad", "linearize", "vmap_idx", "vmap_both", "vmap_grad"]


def loss(lib, fn):
    def f(x, *idx):
        outs = fn(lib, x, *idx)
        outs = outs if isinstance(outs, list) else [outs]
        return sum(lib.np.sum(lib.np.sin(o) * (k + 1)) for k, o in enumerate(outs))

    return f


def jax_reference(fn):
    """``fn`` compiled by ``jax.jit`` in float64: JAX traces, lowers and
    compiles the whole computation once, where running it eagerly compiles
    each of its primitives as a program of its own (most of this file's time
    went there). The indices stay NumPy constants that ``fn`` closes over, as
    in an eager call; the results are JAX's either way."""
    compiled = jax.jit(fn)

    def call(*args):
        with jax.enable_x64(True):
            return compiled(*args)

    return call


def run(lib: Lib, mode: str, fn, x, xs, t, idx, idxs):
    f = lambda x, *i: fn(lib, x, *i)  # noqa: E731
    if mode == "eval":  # on the library's own arrays, which have [] and .at
        return f(x_at(x) if lib.ours else jnp.asarray(x), *idx)
    if mode == "jit":
        return lib.jit(f)(x, *idx)
    if mode == "jvp":
        return lib.jvp(lambda x: f(x, *idx), (x,), (t,))
    if mode == "grad":
        return lib.grad(loss(lib, fn))(x, *idx)
    if mode == "jit_grad":
        return lib.jit(lib.grad(loss(lib, fn)))(x, *idx)
    if mode == "linearize":
        out, f_lin = lib.linearize(lambda x: f(x, *idx), x)
        return out, f_lin(t)
    if mode == "second":
        g = lib.grad(loss(lib, fn))
        return lib.jvp(lambda x: g(x, *idx), (x,), (t,))
    if mode == "vmap_x":
        return lib.vmap(f, (0, *[None] * len(idx)))(xs, *idx)
    if mode == "vmap_idx":
        x = x_at(x) if lib.ours else jnp.asarray(x)  # an array with [] and .at
        return lib.vmap(f, (None, *[0] * len(idx)))(x, *idxs)
    if mode == "vmap_both":
        return lib.jit(lib.vmap(f))(xs, *idxs)
    if mode == "vmap_grad":
        return lib.vmap(lib.grad(loss(lib, fn)))(xs, *idxs)
    raise ValueError(mode)


def case_params():
    for name, (_fn, _shape, args, is_float) in CASES.items():
        modes = MODES if is_float else ["eval", "jit", "vmap_x"]
        modes = modes + (IDX_MODES if args and is_float else [])
        modes = modes + (["vmap_idx", "vmap_both"] if args and not is_float else [])
        for mode in modes:
            yield pytest.param(name, mode, id=f"{name}-{mode}")


@pytest.mark.parametrize("name, mode", list(case_params()))
def test_indexing_matches_jax(name, mode):
    fn, shape, args, _ = CASES[name]
    rng = rng_for(name)
    x = rng.normal(size=shape)
    xs = rng.normal(size=(2, *shape))
    t = rng.normal(size=shape)
    idx = [INDEX_ARGS[a][0] for a in args]
    idxs = [np.stack(INDEX_ARGS[a]) for a in args]
    ours = run(OURS, mode, fn, x, xs, t, idx, idxs)
    theirs = jax_reference(lambda x, xs, t: run(JAX, mode, fn, x, xs, t, idx, idxs))
    assert_close(ours, theirs(x, xs, t), f"{name} under {mode}")


# ---------------------------------------------------------------------------
# Indexing inside scan and cond, and the embedding lookup
# ---------------------------------------------------------------------------


def rnn_loss(lib, table, tokens, w):
    def step(h, tok):
        h = lib.np.tanh(table[tok] + h @ w)
        return h, h[1] * table[tok, 0]

    h, ys = lib.scan(step, lib.np.zeros(table.shape[1]), tokens)
    picked = lib.cond(ys[0] > 0.0, lambda h: h[1:].sum(), lambda h: -h[::-1][0], h)
    return lib.np.sum(ys * ys) + picked


@pytest.mark.parametrize("mode", ["eval", "grad", "jit_grad", "vmap_grad", "hvp"])
def test_indexing_inside_scan_and_cond(mode):
    rng = rng_for("rnn", mode)
    table = rng.normal(size=(6, 3))
    w = rng.normal(size=(3, 3)) * 0.5
    tokens = np.array([1, 5, 5, 0, 2])
    tables = rng.normal(size=(2, 6, 3))

    def go(lib):
        f = lambda table, tokens: rnn_loss(lib, table, tokens, w)  # noqa: E731
        if mode == "eval":
            return f(x_at(table) if lib.ours else jnp.asarray(table), tokens)
        if mode == "grad":
            return lib.grad(f)(table, tokens)
        if mode == "jit_grad":
            return lib.jit(lib.grad(f))(table, tokens)
        if mode == "vmap_grad":
            return lib.vmap(lib.grad(f), (0, None))(tables, tokens)
        g = lib.grad(f)  # second order: a Hessian-vector product
        return lib.jvp(lambda t: g(t, tokens), (table,), (tables[0],))

    ours = go(OURS)
    with jax.enable_x64(True):
        theirs = go(JAX)
    assert_close(ours, theirs, mode)


def test_embedding_gradient_is_a_scatter_add_of_rows():
    def loss(table, tokens, w):
        return anp.sum(anp.tanh(table[tokens]) * w)

    avals = [ad.ShapedArray((1000, 8), np.float64), ad.ShapedArray((5,), np.int64)]
    avals.append(ad.ShapedArray((5, 8), np.float64))
    jaxpr, _, _ = ad.make_jaxpr(ad.grad(loss), *avals)
    names = [e.primitive.name for e in jaxpr.eqns]
    assert "scatter-add" in names and "dot_general" not in names
    (scatter,) = [e for e in jaxpr.eqns if e.primitive.name == "scatter-add"]
    assert scatter.inputs[1].aval.shape == (5, 8)  # the cotangent rows only
    rng = rng_for("embedding")
    table, w = rng.normal(size=(1000, 8)), rng.normal(size=(5, 8))
    tokens = np.array([3, 999, 3, 0, 17])
    ours = ad.jit(ad.value_and_grad(loss))(table, tokens, w)
    with jax.enable_x64(True):
        jax_loss = lambda t, i, w: jnp.sum(jnp.tanh(t[i]) * w)  # noqa: E731
        theirs = jax.jit(jax.value_and_grad(jax_loss))(table, tokens, w)
    assert_close(ours, theirs, "embedding")


def test_cross_entropy_with_take_along_axis():
    def ce(lib, logits, labels):
        logp = logits - lib.np.max(logits, axis=1, keepdims=True)
        logp = logp - lib.np.log(lib.np.sum(lib.np.exp(logp), axis=1, keepdims=True))
        return -lib.np.mean(lib.np.take_along_axis(logp, labels[:, None], axis=1))

    rng = rng_for("ce")
    logits = rng.normal(size=(3, 6, 7))
    labels = rng.integers(0, 7, size=(3, 6))
    ours = ad.jit(ad.vmap(ad.value_and_grad(lambda a, b: ce(OURS, a, b))))(
        logits, labels
    )
    with jax.enable_x64(True):
        theirs = jax.vmap(jax.value_and_grad(lambda a, b: ce(JAX, a, b)))(
            logits, labels
        )
    assert_close(ours, theirs, "cross-entropy")


# ---------------------------------------------------------------------------
# Semantics: repeated indices, bounds, transposes, iteration
# ---------------------------------------------------------------------------


def test_set_with_repeated_indices_writes_one_of_the_updates():
    x = np.zeros(4)
    idx, vals = np.array([1, 1, 3]), np.array([5.0, 6.0, 7.0])
    for out in [ad.jit(lambda x: x.at[idx].set(vals))(x), x_at(x).at[idx].set(vals)]:
        out = np.asarray(out)
        assert out[1] in (5.0, 6.0) and out[3] == 7.0 and out[0] == out[2] == 0.0
    # its gradient: the update that won gets the cotangent, the others none
    g = ad.grad(lambda v: anp.sum(x_at(x).at[idx].set(v) * np.arange(4.0)))(vals)
    winner = 0 if np.asarray(ad.jit(lambda x: x.at[idx].set(vals))(x))[1] == 5.0 else 1
    expected = np.array([0.0, 0.0, 3.0])
    expected[winner] = 1.0
    np.testing.assert_array_equal(g, expected)


def x_at(x):
    """x as a device Array, which has .at like a tracer."""
    return ad.jit(lambda x: x * 1.0)(x)


@pytest.mark.parametrize(
    "which",
    [
        "gather",
        "scatter_add",
        "scatter",
        "scatter_mul",
        "slice",
        "pad",
        "dynamic_slice",
        "dynamic_update_slice",
        "batched_gather",
    ],
)
def test_transpose_is_the_adjoint(which):
    """<ct, A v> == <A^T ct, v> for each linear indexing primitive: gathers
    with repeated indices in range, scatters also with positions out of range
    (dropped updates get a zero cotangent)."""
    rng = rng_for("adjoint", which)
    x = rng.normal(size=(5, 4))
    idx = np.array([4, 0, 4, 1, 2])  # repeats
    far = np.array([4, 0, 4, 7, -2])  # repeats and positions out of range
    factors = rng.normal(size=(5, 4))
    maps = {
        "gather": lambda v: ad.lax.gather(v, idx),
        "scatter_add": lambda v: ad.lax.scatter_add(v, v[:5] * 2.0, far),
        "scatter": lambda v: ad.lax.scatter(v, v[::-1], np.array([4, 0, 1, 7, -2])),
        "scatter_mul": lambda v: ad.lax.scatter_mul(v, factors, far),
        "slice": lambda v: ad.lax.slice(v, (1, 0), (5, 3), (3, 2)),
        "pad": lambda v: ad.lax.pad(v, (1, 0), (0, 2), (2, 1)),
        "dynamic_slice": lambda v: ad.lax.dynamic_slice(v, (-10, 1), (3, 2)),
        "dynamic_update_slice": lambda v: ad.lax.dynamic_update_slice(
            v, v[:2, :2] * 3.0, (4, -1)
        ),
        "batched_gather": lambda v: ad.lax.gather(
            v, np.array([[1, 3], [0, 0], [2, 3], [1, 1], [3, 0]]), batch_dims=1
        ),
    }
    f = maps[which]
    out, f_vjp = ad.vjp(f, x)
    ct = rng.normal(size=np.shape(out))
    v = rng.normal(size=x.shape)
    (x_bar,) = f_vjp(ct)
    _, lin = ad.linearize(f, x)
    assert np.isclose(np.vdot(ct, lin(v)), np.vdot(x_bar, v), rtol=1e-12)
    # and compiled, the same
    np.testing.assert_allclose(np.asarray(ad.jit(f)(x)), f(x), rtol=1e-12)
    np.testing.assert_allclose(np.asarray(ad.jit(f_vjp)(ct)[0]), x_bar, rtol=1e-12)


def test_reads_clamp_writes_drop_take_fills():
    x = np.arange(4.0)
    idx = np.array([9, -1, -9, 2])
    with jax.enable_x64(True):
        for ours, theirs in [
            (ad.jit(lambda x: x[idx])(x), jnp.asarray(x)[idx]),
            (
                ad.jit(lambda x: x.at[idx].set(-1.0))(x),
                jnp.asarray(x).at[idx].set(-1.0),
            ),
            (ad.jit(lambda x: anp.take(x, idx))(x), jnp.take(x, idx)),
            (anp.take(np.arange(4), idx), jnp.take(jnp.arange(4), idx)),
            (
                ad.grad(
                    lambda u: anp.sum(np.zeros(4) + x_at(np.zeros(4)).at[idx].add(u))
                )(x),
                jax.grad(lambda u: jnp.sum(jnp.zeros(4).at[idx].add(u)))(x),
            ),
            # a read out of range: its gradient is dropped, as in JAX, unless
            # mode="clip" clamps the indices first
            (
                ad.grad(lambda x: anp.sum(x[idx] * np.arange(4.0)))(x),
                jax.grad(lambda x: jnp.sum(x[idx] * jnp.arange(4.0)))(x),
            ),
            (
                ad.grad(lambda x: anp.sum(x.at[idx].get(mode="clip") * x))(x),
                jax.grad(lambda x: jnp.sum(x.at[idx].get(mode="clip") * x))(x),
            ),
        ]:
            assert_close(ours, theirs)
    clamped = np.clip(np.where(idx < 0, idx + 4, idx), 0, 3)
    ours = ad.grad(lambda x: anp.sum(x.at[idx].get(mode="clip") * np.arange(4.0)))(x)
    np.testing.assert_array_equal(ours, np.bincount(clamped, np.arange(4.0), 4))


def test_iterating_a_traced_array_gives_its_rows():
    rows = ad.jit(lambda x: list(x))(np.arange(6.0).reshape(3, 2))
    assert len(rows) == 3
    np.testing.assert_array_equal(np.asarray(rows[2]), [4.0, 5.0])
    a, b = x_at(np.array([1.0, 2.0]))
    assert float(a) == 1.0 and float(b) == 2.0
    with raises_clearly(
        TypeError, r"iteration over a 0-d array.*float64\[\]", lambda: None
    ):
        ad.jit(lambda x: list(x))(1.0)


def test_batched_starts_become_a_gather_and_a_scatter():
    f = ad.vmap(lambda x, i: ad.lax.dynamic_slice(x, (i,), (2,)))
    jaxpr = ad.make_jaxpr(
        f, ad.ShapedArray((3, 5), np.float64), ad.ShapedArray((3,), np.int64)
    )[0]
    assert "gather" in [e.primitive.name for e in jaxpr.eqns]
    g = ad.vmap(
        lambda x, i: ad.lax.dynamic_update_slice(x, np.ones(2), (i,)), (None, 0)
    )
    jaxpr = ad.make_jaxpr(
        g, ad.ShapedArray((5,), np.float64), ad.ShapedArray((3,), np.int64)
    )[0]
    assert "scatter" in [e.primitive.name for e in jaxpr.eqns]


@pytest.mark.parametrize("in_axes", [(0, None), (None, 0), (0, 0)])
@pytest.mark.parametrize("batch_dims", [0, 1])
def test_gather_batching_cases_match_jax(in_axes, batch_dims):
    """vmap of gather with the array batched, the indices, or both: the three
    rules of the chapter, against jax.vmap of the same read."""
    rng = rng_for("gather-vmap", in_axes, batch_dims)
    tables = rng.normal(size=(3, 4, 5, 2))  # (vmap, paired, rows, window)
    rows = rng.integers(0, 5, size=(3, 4, 6))

    def ours(t, i):
        return ad.lax.gather(t, i, batch_dims=batch_dims)

    def theirs(t, i):
        if batch_dims:
            return jax.vmap(lambda t, i: t[i])(t, i)
        return t[i]

    t = tables if in_axes[0] == 0 else tables[0]
    i = rows if in_axes[1] == 0 else rows[0]
    out = ad.vmap(ours, in_axes)(t, i)
    with jax.enable_x64(True):
        ref = jax.vmap(theirs, in_axes)(jnp.asarray(t), i)
    assert_close(out, ref, f"vmap {in_axes} batch_dims={batch_dims}")
    assert_close(ad.jit(ad.vmap(ours, in_axes))(t, i), ref, "jit")


def test_whole_axes_are_read_as_the_window():
    """x[:, i] reads columns with a transpose and a gather: no constant of
    row positions (JAX reads the same window with offset_dims); x[1:3, i]
    slices first."""
    f64, i64 = np.float64, np.int64
    avals = [ad.ShapedArray((3, 4), f64), ad.ShapedArray((2,), i64)]
    jaxpr, consts, _ = ad.make_jaxpr(lambda x, i: x[:, i], *avals)
    assert not consts and len(jaxpr.in_binders) == 2, jaxpr
    (gather,) = [e for e in jaxpr.eqns if e.primitive.name == "gather"]
    assert [v.aval.shape for v in gather.inputs] == [(4, 3), (2,)]
    jaxpr, consts, _ = ad.make_jaxpr(
        lambda x, i, u: x.at[:, i].set(u), *avals, ad.ShapedArray((3, 2), f64)
    )
    assert not consts and len(jaxpr.in_binders) == 3, jaxpr
    # a partial slice next to an array is a static slice first, then the window
    for read in [lambda x, i: x[1:3, i], lambda x, i: x[::2, i]]:
        jaxpr, consts, _ = ad.make_jaxpr(read, *avals)
        names = [e.primitive.name for e in jaxpr.eqns]
        assert not consts and "slice" in names and "gather" in names, jaxpr


def test_scatter_min_max_split_ties_as_jax():
    """The derivative of .at[].min/max follows the winners, averaged over
    ties between updates and with x (JAX's rule)."""
    x = np.array([1.0, 5.0, 2.0, 0.0])
    idx = np.array([0, 0, 1, 2, 2])
    u = np.array([3.0, 3.0, 5.0, 2.0, -1.0])  # ties: two updates; update and x
    for method in ["max", "min"]:

        def ours(x, u, method=method):
            return anp.sum(getattr(x_at(x).at[idx], method)(u) * np.arange(1.0, 5.0))

        def theirs(x, u, method=method):
            return jnp.sum(getattr(x.at[idx], method)(u) * jnp.arange(1.0, 5.0))

        with jax.enable_x64(True):
            ref = jax.grad(theirs, (0, 1))(jnp.asarray(x), jnp.asarray(u))
        assert_close(ad.grad(ours, (0, 1))(x, u), ref, method)
        assert_close(ad.jit(ad.grad(ours, (0, 1)))(x, u), ref, method + " jit")


def test_scatter_mul_derivative_with_repeated_positions_and_zeros():
    """JAX differentiates scatter-mul's updates only for unique indices; ours
    covers repeats and zero updates too: check against a product of masked
    factors, which JAX differentiates."""
    x = np.array([1.5, -2.0, 3.0, 0.5])
    idx = np.array([0, 0, 1, 1, 1, 3])
    weights = np.arange(1.0, 5.0)

    def ours(x, u):
        return anp.sum(x_at(x).at[idx].multiply(u) * weights)

    def reference(x, u):
        factors = jnp.where(idx[:, None] == jnp.arange(4), u[:, None], 1.0)
        return jnp.sum(x * jnp.prod(factors, axis=0) * weights)

    for u in [
        np.array([2.0, -0.5, 3.0, 1.5, 0.25, 4.0]),
        np.array([2.0, 0.0, 3.0, 0.0, 0.25, 4.0]),  # a zero at 0, two at 1
        np.array([0.0, -0.5, 0.0, 1.5, 0.25, 0.0]),
    ]:
        with jax.enable_x64(True):
            ref = jax.grad(reference, (0, 1))(jnp.asarray(x), jnp.asarray(u))
        assert_close(ad.grad(ours, (0, 1))(x, u), ref, str(u))
        assert_close(ad.jit(ad.grad(ours, (0, 1)))(x, u), ref, str(u))


@pytest.mark.parametrize("mode", [None, "promise_in_bounds", "clip", "fill", "drop"])
def test_at_modes_match_jax(mode):
    """Every .at[] method under each mode, out-of-range positions included,
    and the gradient of the reads and of add."""
    x = rng_for("modes", mode).normal(size=(4, 3))
    idx = np.array([6, -1, -6, 2, 1])
    u = np.arange(15.0).reshape(5, 3) - 7.0

    def run(x):
        return [
            x.at[idx].get(mode=mode, fill_value=-3.0),  # fill_value: "fill" only
            x.at[idx].set(u, mode=mode),
            x.at[idx].add(u, mode=mode),
            x.at[idx].multiply(u, mode=mode),
            x.at[idx].min(u, mode=mode),
            x.at[idx].max(u, mode=mode),
        ]

    def loss(lib):
        def f(x):
            g, _, a, *_ = run(x)
            return lib.np.sum(lib.np.sin(g)) + lib.np.sum(a * a)

        return f

    ours = ad.jit(run)(x), ad.grad(loss(OURS))(x)
    with jax.enable_x64(True):
        theirs = jax.jit(run)(jnp.asarray(x)), jax.grad(loss(JAX))(jnp.asarray(x))
    assert_close(ours, theirs, str(mode))


def test_gradient_of_dropped_updates_per_mode():
    """The updates' gradient of a write with positions out of range: zero for
    the dropped updates in every mode but "clip", as JAX's for None, "fill"
    and "drop". With "promise_in_bounds" JAX gives a dropped update its
    clamped neighbour's cotangent and ours still gives 0 (the chapter's
    reference notes say so)."""
    xs, far, w = np.arange(4.0), np.array([9, -1, -9, 2]), np.arange(1.0, 5.0)
    dropped = np.array([True, False, True, False])

    def loss(mode):
        return lambda x, v: (x.at[far].add(v, mode=mode) * w).sum()

    for mode in [None, "promise_in_bounds", "fill", "drop", "clip"]:
        ours = ad.grad(ad.jit(loss(mode)), argnums=1)(xs, np.ones(4))
        with jax.enable_x64(True):
            theirs = jax.grad(loss(mode), argnums=1)(jnp.asarray(xs), jnp.ones(4))
        if mode == "promise_in_bounds":
            assert_close(host(ours)[~dropped], np.asarray(theirs)[~dropped], mode)
            assert np.all(host(ours)[dropped] == 0.0)
            assert np.all(np.asarray(theirs)[dropped] != 0.0)
        else:
            assert_close(ours, theirs, str(mode))


def test_batched_dynamic_slice_clamps_the_block_not_each_position():
    """Start 5, size 3, on an axis of 6, with the starts batched: the block
    3, 4, 5, as JAX's, not a gather of 5, 6, 7 clamped to 5, 5, 5."""
    x = np.arange(6.0) * 10.0
    starts = np.array([5, -1, 2, -10])

    def f(x, s):
        return ad.lax.dynamic_slice(x, (s,), (3,))

    ours = ad.vmap(f, (None, 0))(x, starts)
    with jax.enable_x64(True):
        theirs = jax.vmap(lambda x, s: jax.lax.dynamic_slice(x, (s,), (3,)), (None, 0))(
            jnp.asarray(x), starts
        )
    assert_close(ours, theirs)
    np.testing.assert_array_equal(host(ours)[0], [30.0, 40.0, 50.0])


def test_rule_table_has_every_rule_for_the_indexing_primitives():
    for name in [
        "slice",
        "pad",
        "dynamic_slice",
        "dynamic_update_slice",
        "gather",
        "scatter-add",
        "scatter",
        "scatter-mul",
        "scatter-min",
        "scatter-max",
    ]:
        rules = ad.PRIMITIVES[name].rules
        for kind in ["impl", "jvp", "vmap", "abstract_eval", "lower", "cost"]:
            assert kind in rules, (name, kind)
        assert ("transpose" in rules) == (name not in ad.NOT_LINEAR), name
    assert {"scatter-min", "scatter-max"} <= ad.NOT_LINEAR


def test_numpy_and_lax_namespaces_have_the_indexing_names():
    for name in ["take", "take_along_axis", "split", "argmax", "argmin"]:
        assert callable(getattr(anp, name))
    for name in [
        "slice",
        "dynamic_slice",
        "dynamic_update_slice",
        "gather",
        "scatter_add",
        "scatter",
        "scatter_mul",
        "scatter_min",
        "scatter_max",
        "pad",
    ]:
        assert callable(getattr(ad.lax, name))


# ---------------------------------------------------------------------------
# Errors (SPEC 5): each names the user's index or shape
# ---------------------------------------------------------------------------

X = np.arange(12.0).reshape(3, 4)

ERRORS = {
    "float index": (lambda x: x[1.0], TypeError, r"float64\[3,4\].*integer or boolean"),
    "float array index": (
        lambda x: x[np.array([0.0, 1.0])],
        TypeError,
        r"float64\[3,4\].*float64\[2\]",
    ),
    "list index": (lambda x: x[[0, 1]], TypeError, r"float64\[3,4\].*list.*tuple"),
    "too many indices": (
        lambda x: x[0, 1, 2],
        ad.IndexingError,
        r"Too many indices: array is 2-dimensional, but 3 were indexed.*float64\[3,4\]",
    ),
    "two ellipses": (lambda x: x[..., 0, ...], ad.IndexingError, r"at most one \.\.\."),
    "zero step": (lambda x: x[::0], ValueError, r"float64\[3,4\].*step cannot be zero"),
    "traced mask": (
        lambda x: x[x > 3.0],
        ad.NonConcreteBooleanIndexError,
        r"traced boolean.*where",
    ),
    "mask shape": (
        lambda x: x[np.array([True, False])],
        ad.IndexingError,
        r"mask of shape \(2,\)",
    ),
    "traced slice bound": (
        lambda x: x[: ad.convert_element_type(x[0, 0], np.int64)],
        TypeError,
        r"known while tracing.*dynamic_slice",
    ),
    "update too big": (
        lambda x: x.at[0].set(np.ones((2, 4))),
        ValueError,
        r"float64\[3,4\].*\(2, 4\).*indexed shape \(4,\)",
    ),
    "update wrong size": (
        lambda x: x.at[:, 1].add(np.ones(4)),
        ValueError,
        r"\(4,\).*indexed shape \(3,\)",
    ),
    "take mode": (lambda x: anp.take(x, 1, mode="wrap"), ValueError, r"mode.*'wrap'"),
    "at mode": (
        lambda x: x.at[0].set(1.0, mode="wrap"),
        ValueError,
        r"at\[\].*mode.*'wrap'",
    ),
    "split unequal": (lambda x: anp.split(x, 3, axis=1), ValueError, r"equal division"),
    "dynamic_slice starts": (
        lambda x: ad.lax.dynamic_slice(x, (0,), (1, 1)),
        TypeError,
        r"1 start indices",
    ),
    "dynamic_slice float start": (
        lambda x: ad.lax.dynamic_slice(x, (0.5, 0), (1, 1)),
        TypeError,
        r"scalar integer",
    ),
    "slice out of range": (
        lambda x: ad.lax.slice(x, (0, 0), (4, 4)),
        ValueError,
        r"do not fit float64\[3,4\]",
    ),
    "gather float indices": (
        lambda x: ad.lax.gather(x, np.array([0.5])),
        TypeError,
        r"integer arrays",
    ),
    "scatter updates": (
        lambda x: ad.lax.scatter_add(x, np.ones(4), np.array([0, 1])),
        TypeError,
        r"updates must have type float64\[2,4\]",
    ),
}


TRACED_ONLY = {"traced mask", "traced slice bound"}  # eagerly, these are concrete


@pytest.mark.parametrize(
    "which, mode",
    [
        (which, mode)
        for which in ERRORS
        for mode in ["eager", "jit"]
        if not (mode == "eager" and which in TRACED_ONLY)
    ],
)
def test_indexing_errors(which, mode):
    fn, exc_type, match = ERRORS[which]
    assert issubclass(exc_type, (TypeError, ValueError))
    with raises_clearly(exc_type, match, lambda: ad.jit(lambda x: x[0])(X)):
        if mode == "jit":
            ad.jit(fn)(X)
        else:
            fn(x_at(X))
