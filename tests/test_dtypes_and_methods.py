"""JAX's dtype rules and array methods (issue 28, items 2 and 3), against JAX.

Our front end (the operators and ``autodidax.numpy``) promotes by JAX's
lattice, with Python numbers weak, as JAX does with 64-bit types enabled; the
strict wrappers stay strict like ``lax``. Arrays and tracers have NumPy's
methods with JAX's argument forms. Every expected dtype and value here comes
from running the same program in JAX.
"""

from __future__ import annotations

import itertools
import operator

import autodidax.numpy as anp
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import autodidax as ad

pytestmark = pytest.mark.usefixtures("clean_interpreter_stack")

DTYPES = ["bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32"]
DTYPES += ["uint64", "float16", "float32", "float64"]
WEAK = {"int": 3, "float": 1.5}


def operand(name: str, shape=(3,)):
    """An array of dtype ``name``, or the Python number of a weak type."""
    if name in WEAK:
        return WEAK[name]
    values = np.array([1, 3, 2][: shape[0]] if shape else 1)
    return np.broadcast_to(values, shape).astype(name)


@pytest.mark.parametrize("a, b", list(itertools.product([*DTYPES, *WEAK], repeat=2)))
def test_promote_types_is_jaxs_lattice(a, b):
    want = jnp.add(operand(a), operand(b)).dtype
    assert ad.promote_types(a, b) == want


BINARY = {
    "+": operator.add,
    "-": operator.sub,
    "*": operator.mul,
    "/": operator.truediv,
    "==": operator.eq,
    "<": operator.lt,
    ">=": operator.ge,
}
MIXED = ["bool", "int32", "int64", "uint8", "float32", "float64", "int", "float"]


def _jax_fn(op):
    return lambda x, y: op(
        x if not isinstance(x, np.ndarray) else jnp.asarray(x),
        y if not isinstance(y, np.ndarray) else jnp.asarray(y),
    )


PAIRS = [
    (a, b)
    for a, b in itertools.product(MIXED, repeat=2)
    if not (a in WEAK and b in WEAK)
]
# Every operator meets every pair of dtypes under jit; eagerly (on device
# arrays) and under vmap, two operators do (the promotion code is shared).
CASES = [(name, a, b, "jit") for name in BINARY for a, b in PAIRS]
CASES += [
    (n, a, b, m) for n in ["+", "=="] for a, b in PAIRS for m in ["eager", "vmap"]
]


@pytest.mark.parametrize("name, a, b, mode", CASES)
def test_operators_promote_as_jax(name, a, b, mode):
    op = BINARY[name]
    x, y = operand(a), operand(b)
    if name == "-" and a == b == "bool":  # JAX refuses; so do we
        with pytest.raises(TypeError):
            _jax_fn(op)(x, y)
        with pytest.raises(TypeError, match="booleans"):
            ad.jit(op)(x, y)
        return
    want = _jax_fn(op)(x, y)
    if mode == "eager":
        device = ad.jit(lambda v: v)
        got = op(*[device(v) if isinstance(v, np.ndarray) else v for v in (x, y)])
    elif mode == "jit":
        arrays = [v for v in (x, y) if isinstance(v, np.ndarray)]

        def f(*vs):
            it = iter(vs)
            return op(*[next(it) if isinstance(v, np.ndarray) else v for v in (x, y)])

        got = ad.jit(f)(*arrays)
    else:  # the Python number, if any, is closed over (it stays weak)
        arrays = [np.stack([v, v]) for v in (x, y) if isinstance(v, np.ndarray)]

        def per_row(*vs):
            it = iter(vs)
            return op(*[next(it) if isinstance(v, np.ndarray) else v for v in (x, y)])

        got = ad.vmap(per_row)(*arrays)[0]
    got = np.asarray(got)
    assert got.dtype == want.dtype, (a, b, got.dtype, want.dtype)
    np.testing.assert_allclose(got.astype(np.float64), np.asarray(want, np.float64))


def test_jax_refuses_subtracting_booleans_and_so_do_we():
    t = np.array([True, False])
    with pytest.raises(TypeError):
        jnp.asarray(t) - jnp.asarray(t)
    with pytest.raises(TypeError, match="booleans cannot be subtracted"):
        ad.jit(lambda v: v - v)(t)


@pytest.mark.parametrize("fn", ["sin", "cos", "exp", "log", "tanh"])
@pytest.mark.parametrize("dtype", ["bool", "int32", "int64", "uint8", "float32"])
def test_float_functions_of_integers_promote_as_jnp(fn, dtype):
    x = operand(dtype) + (np.ones(3, dtype) if dtype != "bool" else False)
    want = getattr(jnp, fn)(x)
    for run in (getattr(anp, fn), ad.jit(getattr(anp, fn))):
        got = np.asarray(run(x))
        assert got.dtype == want.dtype
        np.testing.assert_allclose(got, np.asarray(want), rtol=1e-6)


def test_mixed_program_records_one_convert_and_differentiates():
    i = np.array([1, 2, 3], np.int32)

    def f(x):
        return (x * i + 1.5).sum()

    jaxpr = ad.make_jaxpr(f, ad.ShapedArray((3,), np.float64))[0]
    names = [e.primitive.name for e in jaxpr.eqns]
    assert names.count("convert_element_type") == 1
    want = jax.grad(lambda x: (x * i + 1.5).sum())(np.ones(3))
    np.testing.assert_allclose(np.asarray(ad.grad(f)(np.ones(3))), np.asarray(want))
    np.testing.assert_allclose(
        np.asarray(ad.jit(ad.grad(f))(np.ones(3))), np.asarray(want)
    )


def test_wrappers_stay_strict_like_lax():
    i, x = np.ones(3, np.int32), np.ones(3, np.float32)
    with pytest.raises(TypeError, match="int32.*float32|float32.*int32"):
        ad.add(i, x)
    with pytest.raises(TypeError):
        jax.lax.add(i, x)


def test_integer_division_and_mean_give_jaxs_float_width():
    for dtype in ["bool", "int32", "int64", "uint8"]:
        x = operand(dtype)
        for ours, theirs in [
            (lambda v: v / 2, lambda v: v / 2),
            (anp.mean, jnp.mean),
            (lambda v: anp.divide(v, v), lambda v: jnp.divide(v, v)),
        ]:
            got, want = ad.jit(ours)(x), theirs(jnp.asarray(x))
            assert np.asarray(got).dtype == want.dtype, dtype


# ----------------------------------------------------------- array methods

X = np.arange(6.0).reshape(2, 3) - 2.5
XI = np.arange(6, dtype=np.int32).reshape(2, 3) - 2
XU = np.arange(6, dtype=np.uint8).reshape(2, 3)
XB = np.array([[True, False, True], [True, True, True]])
METHODS = {
    "sum": lambda a: a.sum(),
    "sum-axis-keepdims": lambda a: a.sum(axis=0, keepdims=True),
    "mean-axis": lambda a: a.mean(1),
    "mean-keepdims": lambda a: a.mean(axis=(0, 1), keepdims=True),
    "max": lambda a: a.max(),
    "max-axis-keepdims": lambda a: a.max(axis=1, keepdims=True),
    "min": lambda a: a.min(),
    "min-axis": lambda a: a.min(axis=0),
    "min-keepdims": lambda a: a.min(axis=-1, keepdims=True),
    "astype": lambda a: a.astype(np.float32),
    "T": lambda a: a.T,
    "transpose": lambda a: a.transpose(),
    "transpose-args": lambda a: a.transpose(1, 0),
    "transpose-tuple": lambda a: a.transpose((1, 0)),
    "reshape-args": lambda a: a.reshape(3, 2),
    "reshape-tuple": lambda a: a.reshape((6,)),
    "reshape-minus-one": lambda a: a.reshape(-1, 2),
    "dot": lambda a: a.astype(np.float64).dot(a.astype(np.float64).T),
    "size-ndim-shape": lambda a: a.astype(np.float64) * (a.size + a.ndim + a.shape[1]),
}


INPUTS = {"f64": X, "i32": XI, "u8": XU, "bool": XB}
METHOD_CASES = [
    (n, d, m) for n in METHODS for d in INPUTS for m in ["jit", "device-array"]
]
METHOD_CASES += [(n, "f64", "vmap") for n in METHODS] + [
    (n, "i32", "vmap") for n in METHODS
]


@pytest.mark.parametrize("name, dtype, mode", METHOD_CASES)
def test_array_methods_match_jax(name, dtype, mode):
    x = INPUTS[dtype]
    f = METHODS[name]
    if name.startswith("mean") and x.dtype == np.bool_:
        pass  # JAX's mean of booleans is float32, as ours
    want = jax.jit(f)(x) if mode != "vmap" else jax.vmap(f)(np.stack([x, x]))
    if mode == "jit":
        got = ad.jit(f)(x)
    elif mode == "vmap":
        got = ad.vmap(f)(np.stack([x, x]))
    else:
        got = f(ad.jit(lambda v: v)(x))
    got = np.asarray(got)
    assert got.shape == want.shape and got.dtype == want.dtype, (got, want)
    np.testing.assert_allclose(got.astype(np.float64), np.asarray(want, np.float64))


def test_gradient_through_methods_matches_jax():
    def f(a):
        return (a.reshape(3, 2).T * a.max(axis=0, keepdims=True)).mean()

    want = jax.grad(f)(X)
    np.testing.assert_allclose(np.asarray(ad.grad(f)(X)), np.asarray(want))
    np.testing.assert_allclose(np.asarray(ad.jit(ad.grad(f))(X)), np.asarray(want))


@pytest.mark.parametrize("fn", ["sum", "mean", "max", "min"])
def test_numpy_reductions_take_keepdims(fn):
    for axis in [None, 0, 1, (0, 1), -1]:
        got = getattr(anp, fn)(X, axis=axis, keepdims=True)
        want = getattr(jnp, fn)(X, axis=axis, keepdims=True)
        assert np.shape(got) == want.shape
        np.testing.assert_allclose(np.asarray(got), np.asarray(want))


def test_min_of_extreme_integers_does_not_overflow():
    for dtype in [np.int8, np.int64, np.uint8, np.uint32]:
        info = np.iinfo(dtype)
        x = np.array([info.max, info.min, 0], dtype)
        assert np.asarray(ad.jit(lambda v: v.min())(x)) == jnp.min(x)
        assert np.asarray(ad.jit(lambda v: v.max())(x)) == jnp.max(x)
