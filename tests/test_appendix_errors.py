"""Bad input to the appendix's primitives and front end gets a clear error.

SPEC section 5 for book/appendix_primitives.md: dot_general and the products,
reshape, the float-only functions, integer powers, dtype conversion,
reduce_max, NumPy broadcasting, mixed dtypes, hand-built equations of the new
primitives, and grad through them. Each case checks

- the exception's type (TypeError or ValueError, or a named subclass; never
  an internal AssertionError/KeyError/AttributeError/IndexError);
- its message, in the user's terms: what is wrong, with the shapes, dtypes or
  values involved;
- in every mode where the mistake can happen (eager, jit, vmap, grad, jvp,
  jit of grad, vmap of jit), and for the staged modes that it was raised while
  tracing, before anything was lowered or compiled;
- that the interpreter is still usable afterwards.

Tests named ``test_bug_*`` reproduce defects found while writing this file
and fail until the module is fixed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import nothing_compiled, raises_clearly

import autodidax as ad
from autodidax import Jaxpr, JaxprEqn, JaxprTypeError, ShapedArray, Var
from autodidax import numpy as anp

pytestmark = pytest.mark.usefixtures("clean_interpreter_stack")

F64, F32, I64 = np.dtype(np.float64), np.dtype(np.float32), np.dtype(np.int64)
BOOL = np.dtype(np.bool_)
X = np.arange(6.0).reshape(2, 3) / 4.0  # every case's input: a float64[2,3]
V3 = np.array([0.5, -1.0, 2.0])
INTERNAL = (AssertionError, KeyError, AttributeError, IndexError)

# The usability check after every error; traced and compiled once, here.
_jitted_check = ad.jit(
    lambda a, b: anp.tanh(a @ b) - anp.reshape(anp.max(a, 1), (2, 1))
)

MATRIX_PRODUCT = (((1,), (0,)), ((), ()))  # dot_general of two matrices


def _jitted_check_reference(a, b):
    return np.tanh(a @ b) - a.max(axis=1)[:, None]


def assert_usable() -> None:
    """Only the evaluation level is on the stack, and jit, grad and vmap of
    the new primitives still give right answers."""
    assert len(ad._state.stack) == 1
    assert ad._state.dynamic is ad._state.stack[0]
    b = np.ones((3, 2)) / 3.0
    np.testing.assert_allclose(
        _jitted_check(X, b), _jitted_check_reference(X, b), rtol=1e-12
    )
    gradient = ad.grad(lambda v: anp.sum(anp.exp(v) * v))(V3)
    np.testing.assert_allclose(gradient, np.exp(V3) * (V3 + 1.0), rtol=1e-12)
    mapped = ad.vmap(lambda r: anp.reshape(r, (3, 1)) @ np.ones((1, 2)))(X)
    np.testing.assert_allclose(mapped, X[:, :, None] * np.ones(2), rtol=1e-12)
    assert len(ad._state.stack) == 1
    assert ad._state.dynamic is ad._state.stack[0]


@contextmanager
def clear_error(exc_type, match: str) -> Iterator:
    """Expect ``exc_type`` with a message matching ``match``, never an internal
    error type (also not as a subclass), then check the interpreter."""
    with raises_clearly(exc_type, match, then=assert_usable) as info:
        yield info
    assert not isinstance(info.value, INTERNAL), type(info.value).__mro__


MODES = ["eager", "jit", "vmap", "grad", "jvp", "jit-of-grad", "vmap-of-jit"]
STAGED = {"jit", "jit-of-grad", "vmap-of-jit"}


def run(mode: str, f: Callable, x: np.ndarray = X):
    """Call ``f`` (a function of one float array) on ``x`` eagerly or under a
    transformation. Eagerly ``x`` is a device array, so that Python operators
    are autodidax's (on NumPy arrays they are NumPy's). vmap maps over a new
    leading axis of size 2; grad differentiates the sum of sin of ``f``'s
    output, so ``f`` runs on traced values; staged modes must not compile."""
    if mode == "eager":
        return f(ad.device_put(x))
    if mode == "jit":
        call = ad.jit(f)
    elif mode == "vmap":
        return ad.vmap(f)(np.stack([x, x]))
    elif mode == "grad":
        return ad.grad(lambda y: ad.reduce_sum(ad.sin(f(y))))(x)
    elif mode == "jvp":
        return ad.jvp(f, (x,), (x,))
    elif mode == "jit-of-grad":
        call = ad.jit(lambda y: ad.grad(lambda z: ad.reduce_sum(ad.sin(f(z))))(y))
    elif mode == "vmap-of-jit":
        jitted = ad.jit(f)
        call = lambda y: ad.vmap(jitted)(np.stack([y, y]))  # noqa: E731
    else:
        raise ValueError(mode)
    with nothing_compiled():
        return call(x)


def dev(value):
    """Eager results are NumPy arrays; make them device arrays so that
    operators on them are autodidax's. Tracers pass through."""
    return ad.device_put(value) if isinstance(value, np.ndarray) else value


def ints(x):
    """``x`` as int64, with the same shape (traced where ``x`` is)."""
    return dev(ad.convert_element_type(x, np.int64))


def bools(x):
    return dev(x > 0.5)


def check_cases(cases: dict, case: str, mode: str) -> None:
    fn, exc, match = cases[case]
    with clear_error(exc, match):
        run(mode, fn)


# ---------------------------------------------------------------------------
# dot_general
# ---------------------------------------------------------------------------

MATMUL_DIMS = (((1,), (0,)), ((), ()))
Y32 = np.ones((3, 2))

DOT_GENERAL = {
    "contracting-sizes-differ": (
        lambda x: ad.dot_general(x, np.ones((4, 5)), MATMUL_DIMS),
        TypeError,
        r"dot_general: contracting axis 1 of x float64\[2,3\] has size 3, but "
        r"contracting axis 0 of y float64\[4,5\] has size 4",
    ),
    "batch-sizes-differ": (
        lambda x: ad.dot_general(x, np.ones((4, 3)), (((1,), (1,)), ((0,), (0,)))),
        TypeError,
        r"dot_general: batch axis 0 of x float64\[2,3\] has size 2, but batch "
        r"axis 0 of y float64\[4,3\] has size 4",
    ),
    "contracting-counts-differ": (
        lambda x: ad.dot_general(x, np.ones((3, 3)), (((1,), (0, 1)), ((), ()))),
        ValueError,
        r"dot_general: .*as many contracting axes.*\(\(\(1,\), \(0, 1\)\), "
        r"\(\(\), \(\)\)\)",
    ),
    "batch-counts-differ": (
        lambda x: ad.dot_general(x, np.ones((2, 3, 2)), (((1,), (1,)), ((0,), (0, 2)))),
        ValueError,
        r"dot_general: .*as many batch axes.*\(\(0,\), \(0, 2\)\)",
    ),
    "axis-contracting-and-batch": (
        lambda x: ad.dot_general(x, x, (((0,), (0,)), ((0,), (0,)))),
        ValueError,
        r"dot_general: an axis is both contracting and batch",
    ),
    "x-axis-out-of-range": (
        lambda x: ad.dot_general(x, Y32, (((2,), (0,)), ((), ()))),
        ValueError,
        r"dot_general: axis 2 is out of range for an array of rank 2",
    ),
    "negative-axis-out-of-range": (
        lambda x: ad.dot_general(x, Y32, (((-3,), (0,)), ((), ()))),
        ValueError,
        r"dot_general: axis -3 is out of range for an array of rank 2",
    ),
    "y-axis-out-of-range": (
        lambda x: ad.dot_general(x, Y32, (((1,), (5,)), ((), ()))),
        ValueError,
        r"dot_general: axis 5 is out of range for an array of rank 2",
    ),
    "batch-axis-out-of-range": (
        lambda x: ad.dot_general(x, Y32, (((1,), (0,)), ((3,), (1,)))),
        ValueError,
        r"dot_general: axis 3 is out of range for an array of rank 2",
    ),
    "repeated-axis": (
        lambda x: ad.dot_general(x, np.ones((3, 3)), (((1, 1), (0, 1)), ((), ()))),
        ValueError,
        r"dot_general: repeated axis in \(1, 1\)",
    ),
    "repeated-axis-negative-spelling": (
        lambda x: ad.dot_general(x, np.ones((3, 3)), (((1, -1), (0, 1)), ((), ()))),
        ValueError,
        r"dot_general: repeated axis in \(1, -1\)",
    ),
    "one-pair-not-two": (
        lambda x: ad.dot_general(x, Y32, ((1,), (0,))),
        TypeError,
        r"dot_general: dimension_numbers must be \(\(x_contract, y_contract\), "
        r"\(x_batch, y_batch\)\), got \(\(1,\), \(0,\)\)",
    ),
    "flat-pair-of-ints": (
        lambda x: ad.dot_general(x, Y32, (1, 0)),
        TypeError,
        r"dimension_numbers must be \(\(x_contract, .*got \(1, 0\)",
    ),
    "four-flat-entries": (
        lambda x: ad.dot_general(x, Y32, ((1,), (0,), (), ())),
        TypeError,
        r"dimension_numbers must be .*got \(\(1,\), \(0,\), \(\), \(\)\)",
    ),
    "only-contracting-pair": (
        lambda x: ad.dot_general(x, Y32, (((1,), (0,)),)),
        TypeError,
        r"dimension_numbers must be .*got \(\(\(1,\), \(0,\)\),\)",
    ),
    "einsum-string": (
        lambda x: ad.dot_general(x, Y32, "ij,jk->ik"),
        TypeError,
        r"dimension_numbers must be .*got 'ij,jk->ik'",
    ),
    "none": (
        lambda x: ad.dot_general(x, Y32, None),
        TypeError,
        r"dimension_numbers must be .*got None",
    ),
    "float-axis": (
        lambda x: ad.dot_general(x, Y32, (((1.0,), (0,)), ((), ()))),
        TypeError,
        r"dot_general: axes must be integers, got 1\.0",
    ),
    "string-axes": (
        lambda x: ad.dot_general(x, Y32, (("1", (0,)), ((), ()))),
        TypeError,
        r"dot_general: axes must be integers, got '1'",
    ),
    "bool-axis": (
        lambda x: ad.dot_general(x, Y32, (((True,), (0,)), ((), ()))),
        TypeError,
        r"dot_general: axes must be integers, got True",
    ),
    "float64-with-float32": (
        lambda x: ad.dot_general(x, Y32.astype(np.float32), MATMUL_DIMS),
        TypeError,
        r"dot_general: operands must have the same dtype, got float64\[2,3\] and "
        r"float32\[3,2\]",
    ),
    "int-with-float": (
        lambda x: ad.dot_general(ints(x), Y32, MATMUL_DIMS),
        TypeError,
        r"dot_general: operands must have the same dtype, got int64\[2,3\] and "
        r"float64\[3,2\]",
    ),
    "bool-operands": (
        lambda x: ad.dot_general(bools(x), Y32 > 0.0, MATMUL_DIMS),
        TypeError,
        r"dot_general: expected numeric arrays, got bool\[2,3\]",
    ),
    "scalar-operand-has-no-axis": (
        lambda x: ad.dot_general(2.0, x, (((0,), (0,)), ((), ()))),
        ValueError,
        r"dot_general: axis 0 is out of range for an array of rank 0",
    ),
}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case", DOT_GENERAL, ids=list(DOT_GENERAL))
def test_dot_general(mode, case):
    """Sizes, counts, ranges, form and dtypes of dot_general's operands and
    dimension numbers; per-example shapes under vmap."""
    check_cases(DOT_GENERAL, case, mode)


def test_dot_general_accepts_lists_and_ints_for_axes():
    """The control case: JAX-style lists, and a bare int for one axis, are
    canonicalized (not errors) and give the same product as JAX."""
    y = np.arange(12.0).reshape(3, 4)
    expected = jax.lax.dot_general(X, y, MATMUL_DIMS)
    for dims in ([[[1], [0]], [[], []]], ((1, 0), ((), ()))):
        np.testing.assert_allclose(ad.dot_general(X, y, dims), expected, rtol=1e-12)
        jaxpr, _, _ = ad.make_jaxpr(
            lambda a, b, d=dims: ad.dot_general(a, b, d), M23, A((3, 4))
        )
        assert jaxpr.eqns[0].params["dimension_numbers"] == MATMUL_DIMS


# ---------------------------------------------------------------------------
# anp.dot, anp.matmul and @
# ---------------------------------------------------------------------------

PRODUCTS = {
    "dot-unaligned": (
        lambda x: anp.dot(x, np.ones((4, 5))),
        TypeError,
        r"dot: shapes float64\[2,3\] and float64\[4,5\] are not aligned: axis 1 of "
        r"x has size 3, axis 0 of y has size 4",
    ),
    "dot-vectors": (
        lambda x: anp.dot(anp.reshape(x, (6,)), np.ones(4)),
        TypeError,
        r"dot: shapes float64\[6\] and float64\[4\] are not aligned",
    ),
    "dot_general-dtypes": (
        lambda x: ad.dot_general(x, np.ones((3, 2), np.float32), MATRIX_PRODUCT),
        TypeError,
        r"same dtype, got float64\[2,3\] and float32\[3,2\]",
    ),
    "matmul-unaligned": (
        lambda x: anp.matmul(x, np.ones((4, 5))),
        TypeError,
        r"matmul: shapes float64\[2,3\] and float64\[4,5\] are not aligned",
    ),
    "operator-@-unaligned": (
        lambda x: x @ np.ones((4, 5)),
        TypeError,
        r"matmul: shapes float64\[2,3\] and float64\[4,5\] are not aligned",
    ),
    "operator-@-reflected": (
        lambda x: np.ones((4, 5)) @ x,
        TypeError,
        r"matmul: shapes float64\[4,5\] and float64\[2,3\] are not aligned",
    ),
    "matmul-vector-matrix": (
        lambda x: anp.matmul(np.ones(5), x),
        TypeError,
        r"matmul: shapes float64\[5\] and float64\[2,3\] are not aligned",
    ),
    "matmul-stack-unaligned": (
        lambda x: anp.matmul(anp.reshape(x, (2, 3, 1)), np.ones((2, 2, 4))),
        TypeError,
        r"matmul: shapes float64\[2,3,1\] and float64\[2,2,4\] are not aligned",
    ),
    "matmul-stack-by-vector": (
        lambda x: anp.matmul(anp.reshape(x, (2, 3, 1)), np.ones(3)),
        TypeError,
        r"matmul: shapes float64\[2,3,1\] and float64\[3\] are not aligned",
    ),
    "operator-@-python-scalar": (
        lambda x: x @ 2.0,
        TypeError,
        r"matmul: operands must not be scalars, got float64\[2,3\] and "
        r"float64\[\] \(use \* to multiply by a scalar\)",
    ),
    "operator-@-reflected-scalar": (
        lambda x: 2.0 @ x,
        TypeError,
        r"matmul: operands must not be scalars, got float64\[\] and float64\[2,3\]",
    ),
    "matmul-0d-array": (
        lambda x: anp.matmul(x, np.float64(2.0)),
        TypeError,
        r"matmul: operands must not be scalars, got float64\[2,3\] and float64\[\]",
    ),
    "matmul-stacks-do-not-broadcast": (
        lambda x: anp.matmul(anp.reshape(x, (2, 3, 1)), np.ones((5, 1, 2))),
        TypeError,
        r"matmul: .*shapes that broadcast.*sizes at axis -1 are 2 and 5",
    ),
    "dot_general-int-with-float": (
        lambda x: ad.dot_general(ints(x), np.ones((3, 2)), MATRIX_PRODUCT),
        TypeError,
        r"same dtype, got int64\[2,3\] and float64\[3,2\]",
    ),
    "operator-@-bool": (
        lambda x: bools(x) @ (np.ones((3, 2)) > 0.0),
        TypeError,
        r"numeric.*bool\[2,3\]",
    ),
}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case", PRODUCTS, ids=list(PRODUCTS))
def test_products(mode, case):
    """Unaligned shapes name both operands' types and the axes that differ."""
    check_cases(PRODUCTS, case, mode)


# ---------------------------------------------------------------------------
# reshape
# ---------------------------------------------------------------------------

RESHAPE = {
    "element-count": (
        lambda x: ad.reshape(x, (4, 2)),
        ValueError,
        r"reshape: cannot reshape float64\[2,3\] \(6 elements\) into shape "
        r"\(4, 2\) \(8 elements\)",
    ),
    "element-count-int-shape": (
        lambda x: anp.reshape(x, 7),
        ValueError,
        r"reshape: cannot reshape float64\[2,3\] \(6 elements\) into shape \(7,\)",
    ),
    "two-holes": (
        lambda x: ad.reshape(x, (-1, -1)),
        ValueError,
        r"reshape: at most one entry of the shape can be -1: \(-1, -1\)",
    ),
    "hole-cannot-divide": (
        lambda x: ad.reshape(x, (-1, 4)),
        ValueError,
        r"reshape: cannot reshape float64\[2,3\] \(6 elements\) into shape "
        r"\(-1, 4\)",
    ),
    "hole-next-to-zero": (
        lambda x: ad.reshape(x, (-1, 0)),
        ValueError,
        r"reshape: cannot reshape float64\[2,3\] \(6 elements\) into shape "
        r"\(-1, 0\)",
    ),
    "negative-sizes": (
        lambda x: ad.reshape(x, (-2, -3)),
        ValueError,
        r"reshape: shape must contain non-negative integers and at most one -1, "
        r"got .*-2, -3",
    ),
    "negative-size-next-to-hole": (
        lambda x: ad.reshape(x, (-1, -2)),
        ValueError,
        r"reshape: shape must contain non-negative integers and at most one -1, "
        r"got .*-2",
    ),
    "float-size": (
        lambda x: ad.reshape(x, (2.0, 3)),
        ValueError,
        r"reshape: shape must contain non-negative integers and at most one -1, "
        r"got .*2\.0, 3",
    ),
    "string-size": (
        lambda x: ad.reshape(x, ("2", 3)),
        ValueError,
        r"reshape: shape must contain non-negative integers and at most one -1, "
        r"got .*'2', 3",
    ),
    "bool-size": (
        lambda x: ad.reshape(x, (True, 6)),
        ValueError,
        r"reshape: shape must contain non-negative integers and at most one -1, "
        r"got .*True, 6",
    ),
    "float-shape": (
        lambda x: ad.reshape(x, 6.0),
        TypeError,
        r"reshape: shape must be a sequence of integers, got 6\.0",
    ),
    "none-shape": (
        lambda x: anp.reshape(x, None),
        TypeError,
        r"reshape: shape must be a sequence of integers, got None",
    ),
}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case", RESHAPE, ids=list(RESHAPE))
def test_reshape(mode, case):
    """The input's type and element count and the requested shape."""
    check_cases(RESHAPE, case, mode)


# ---------------------------------------------------------------------------
# Float-only functions, integer powers, dtype conversion
# ---------------------------------------------------------------------------

FLOAT_ONLY = {
    "log-of-ints": (
        lambda x: ad.log(ints(x)),
        TypeError,
        r"log: expected a float array, got dtype int64",
    ),
    "exp-of-bools": (
        lambda x: ad.exp(bools(x)),
        TypeError,
        r"exp: expected a float array, got dtype bool",
    ),
    "tanh-of-ints": (
        lambda x: ad.tanh(ints(x)),
        TypeError,
        r"tanh: expected a float array, got dtype int64",
    ),
    "sqrt-of-ints": (
        lambda x: ad.sqrt(ints(x)),
        TypeError,
        r"sqrt: expected a float array, got dtype int64",
    ),
    "rsqrt-of-ints": (
        lambda x: ad.rsqrt(ints(x)),
        TypeError,
        r"rsqrt: expected a float array, got dtype int64",
    ),
    "log-of-int32": (
        lambda x: ad.log(ad.convert_element_type(x, np.int32)),
        TypeError,
        r"log: expected a float array, got dtype int32",
    ),
    "exp-of-python-int": (
        lambda x: ad.exp(3) * x,
        TypeError,
        r"exp: expected a float array, got dtype int64",
    ),
    "div-of-ints": (
        lambda x: ad.div(ints(x), ints(x)),
        TypeError,
        r"div: expected a float array, got dtype int64",
    ),
    "div-int-by-float": (
        lambda x: ad.div(ints(x), x),
        TypeError,
        r"div: expected a float array, got dtype int64",
    ),
    "div-float-by-int": (
        lambda x: ad.div(x, ints(x)),
        TypeError,
        r"div: expected a float array, got dtype int64",
    ),
    "div-int-by-python-int": (
        lambda x: ad.div(ints(x), 2),
        TypeError,
        r"div: expected a float array, got dtype int64",
    ),
    "div-of-bools": (
        lambda x: ad.div(bools(x), bools(x)),
        TypeError,
        r"div: expected a float array, got dtype bool",
    ),
}

POWERS = {
    "float-exponent": (
        lambda x: ad.integer_pow(x, 2.0),
        TypeError,
        r"integer_pow: the exponent must be an integer, got 2\.0; for other "
        r"powers use lax\.pow",
    ),
    "bool-exponent": (
        lambda x: ad.integer_pow(x, True),
        TypeError,
        r"integer_pow: the exponent must be an integer, got True",
    ),
    "array-exponent": (
        lambda x: ad.integer_pow(x, np.array([1, 2, 3])),
        TypeError,
        r"integer_pow: the exponent must be an integer, "
        r"got an array of type int64\[3\]",
    ),
    "ints-to-negative-power": (
        lambda x: ad.integer_pow(ints(x), -1),
        ValueError,
        r"integer_pow: integers cannot be raised to the negative power -1; "
        r"convert them to float first",
    ),
    "bools": (
        lambda x: ad.integer_pow(bools(x), 2),
        TypeError,
        r"integer_pow: expected a numeric \(not boolean\) array, got dtype bool",
    ),
    "operator-bool": (
        lambda x: x**True,
        TypeError,
        r"power: the exponent must be a number, got True",
    ),
    "operator-ints-negative": (
        lambda x: ints(x) ** -2,
        ValueError,
        r"integer_pow: integers cannot be raised to the negative power -2",
    ),
    "operator-ints-traced-exponent": (
        lambda x: ints(x) ** ints(x),
        TypeError,
        r"power: an integer base with an exponent that is not a Python integer",
    ),
    "operator-bools": (
        lambda x: bools(x) ** 2,
        TypeError,
        r"integer_pow: expected a numeric \(not boolean\) array, got dtype bool",
    ),
}

CONVERSIONS = {
    "to-str": (
        lambda x: ad.convert_element_type(x, str),
        TypeError,
        r"convert_element_type: cannot convert to <U0 \(a dtype of strings\); "
        r"arrays hold booleans, "
        r"integers or floats",
    ),
    "to-object": (
        lambda x: ad.convert_element_type(x, object),
        TypeError,
        r"convert_element_type: cannot convert to object \(a dtype of objects\); "
        r"arrays hold booleans",
    ),
    "astype-U3": (
        lambda x: anp.astype(x, "U3"),
        TypeError,
        r"convert_element_type: cannot convert to <U3",
    ),
    "to-complex": (
        lambda x: ad.convert_element_type(x, np.complex128),
        TypeError,
        r"convert_element_type: cannot convert to complex128",
    ),
    "to-datetime": (
        lambda x: anp.astype(x, "M8[s]"),
        TypeError,
        r"convert_element_type: cannot convert to datetime64\[s\]",
    ),
    "to-unknown-name": (
        lambda x: ad.convert_element_type(x, "nope"),
        TypeError,
        r"convert_element_type: 'nope' is not a dtype",
    ),
    "to-a-number": (
        lambda x: ad.convert_element_type(x, 3),
        TypeError,
        r"convert_element_type: 3 is not a dtype",
    ),
    "to-a-function": (
        lambda x: ad.convert_element_type(x, ad.sin),
        TypeError,
        r"convert_element_type: <function sin .*> is not a dtype",
    ),
    "to-a-list": (
        lambda x: anp.astype(x, [1]),
        TypeError,
        r"convert_element_type: \[1\] is not a dtype",
    ),
}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case", FLOAT_ONLY, ids=list(FLOAT_ONLY))
def test_float_only_functions(mode, case):
    """log, exp, tanh and the strict div name the dtype they refuse."""
    check_cases(FLOAT_ONLY, case, mode)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case", POWERS, ids=list(POWERS))
def test_integer_powers(mode, case):
    """Only integer exponents; negative ones only for floats; not for bools."""
    check_cases(POWERS, case, mode)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case", CONVERSIONS, ids=list(CONVERSIONS))
def test_convert_element_type(mode, case):
    """Only boolean, integer and float dtypes; anything else is named."""
    check_cases(CONVERSIONS, case, mode)


# ---------------------------------------------------------------------------
# reduce_max and maximum
# ---------------------------------------------------------------------------

MAXIMA = {
    "reduce_max-bools": (
        lambda x: ad.reduce_max(bools(x)),
        TypeError,
        r"reduce_max: expected a numeric \(not boolean\) array, got dtype bool",
    ),
    "reduce_max-axis-out-of-range": (
        lambda x: ad.reduce_max(x, 2),
        ValueError,
        r"reduce_max: axis 2 is out of range for an array of rank 2",
    ),
    "reduce_max-negative-axis-out-of-range": (
        lambda x: anp.max(x, -3),
        ValueError,
        r"reduce_max: axis -3 is out of range for an array of rank 2",
    ),
    "reduce_max-repeated-axis": (
        lambda x: ad.reduce_max(x, (1, -1)),
        ValueError,
        r"reduce_max: repeated axis in \(1, -1\)",
    ),
    "max-repeated-axis": (
        lambda x: anp.max(x, (0, 0)),
        ValueError,
        r"reduce_max: repeated axis in \(0, 0\)",
    ),
    "reduce_max-string-axis": (
        lambda x: ad.reduce_max(x, "0"),
        TypeError,
        r"reduce_max: axes must be integers, got '0'",
    ),
    "maximum-float64-float32": (
        lambda x: ad.maximum(x, np.ones((2, 3), np.float32)),
        TypeError,
        r"max: operands must have the same dtype, got float64\[2,3\] and "
        r"float32\[2,3\]",
    ),
    "maximum-int-float": (
        lambda x: ad.maximum(ints(x), x),
        TypeError,
        r"max: operands must have the same dtype, got int64\[2,3\] and "
        r"float64\[2,3\]",
    ),
    "maximum-float-int": (
        lambda x: ad.maximum(x, ints(x)),
        TypeError,
        r"max: operands must have the same dtype, got float64\[2,3\] and "
        r"int64\[2,3\]",
    ),
    "maximum-int-array-python-float": (
        lambda x: ad.maximum(ints(x), 1.5),
        TypeError,
        r"max: cannot combine the float 1\.5 with an array of dtype int64",
    ),
}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case", MAXIMA, ids=list(MAXIMA))
def test_maxima(mode, case):
    check_cases(MAXIMA, case, mode)


# ---------------------------------------------------------------------------
# Broadcasting, and the strict wrappers that do not broadcast
# ---------------------------------------------------------------------------

_NO_BROADCAST = (
    r"operands must have the same shape, or shapes that broadcast; got "
    r"float64\[2,3\] and float64\[2\], whose sizes at axis -1 are 3 and 2 "
    r"\(they must be equal, or 1\)"
)

BROADCASTING = {
    "operator+": (lambda x: x + np.ones(2), TypeError, "add: " + _NO_BROADCAST),
    "operator-": (lambda x: x - np.ones(2), TypeError, "subtract: " + _NO_BROADCAST),
    "operator*": (lambda x: x * np.ones(2), TypeError, "multiply: " + _NO_BROADCAST),
    "operator/": (lambda x: x / np.ones(2), TypeError, "divide: " + _NO_BROADCAST),
    "operator>": (lambda x: x > np.ones(2), TypeError, "greater: " + _NO_BROADCAST),
    "operator<": (lambda x: x < np.ones(2), TypeError, "less: " + _NO_BROADCAST),
    "operator+reflected": (
        lambda x: np.ones(2) + x,
        TypeError,
        r"add: .*got float64\[2\] and float64\[2,3\]",
    ),
    "add-2d": (
        lambda x: anp.add(x, np.ones((3, 2))),
        TypeError,
        r"add: .*got float64\[2,3\] and float64\[3,2\], whose sizes at axis -2 "
        r"are 2 and 3",
    ),
    "subtract": (
        lambda x: anp.subtract(np.ones(2), x),
        TypeError,
        r"subtract: .*got float64\[2\] and float64\[2,3\]",
    ),
    "multiply": (
        lambda x: anp.multiply(x, np.ones(2)),
        TypeError,
        "multiply: " + _NO_BROADCAST,
    ),
    "divide": (
        lambda x: anp.divide(x, np.ones(2)),
        TypeError,
        "divide: " + _NO_BROADCAST,
    ),
    "maximum": (
        lambda x: anp.maximum(x, np.ones(2)),
        TypeError,
        "maximum: " + _NO_BROADCAST,
    ),
    "minimum": (
        lambda x: anp.minimum(x, np.ones(2)),
        TypeError,
        r"got float64\[2,3\] and float64\[2\], whose sizes at axis -1 are 3 and 2",
    ),
    "greater": (
        lambda x: anp.greater(x, np.ones(2)),
        TypeError,
        "greater: " + _NO_BROADCAST,
    ),
    "empty-axis-is-not-one": (
        lambda x: anp.add(x, np.ones((2, 0))),
        TypeError,
        r"add: .*got float64\[2,3\] and float64\[2,0\], whose sizes at axis -1 "
        r"are 3 and 0",
    ),
    "broadcast_to-smaller-rank": (
        lambda x: ad.broadcast_to(x, (3,)),
        TypeError,
        r"broadcast_to: cannot broadcast float64\[2,3\] to shape \(3,\)",
    ),
    "broadcast_to-shrink-an-axis": (
        lambda x: anp.broadcast_to(x, (1, 3)),
        TypeError,
        r"broadcast_to: cannot broadcast float64\[2,3\] to shape \(1, 3\)",
    ),
    "broadcast_to-incompatible": (
        lambda x: ad.broadcast_to(x, (2, 4)),
        TypeError,
        r"broadcast_to: .*\(2, 3\) and \(2, 4\), whose sizes at axis -1 are 3 "
        r"and 4",
    ),
    "broadcast_to-negative-size": (
        lambda x: ad.broadcast_to(x, (-1, 3)),
        ValueError,
        r"broadcast_to: shape must contain non-negative integers, got \(-1, 3\)",
    ),
    "broadcast_to-int-shape": (
        lambda x: ad.broadcast_to(x, 6),
        TypeError,
        r"broadcast_to: shape must be a sequence of integers, got 6",
    ),
    "where-operands": (
        lambda x: anp.where(x > 0.5, x, np.ones(2)),
        TypeError,
        r"where: operands must have the same shape, or shapes that broadcast; "
        r"got bool\[2,3\] and float64\[2,3\] and float64\[2\]",
    ),
    "where-predicate-shape": (
        lambda x: anp.where(np.array([True, False]), x, x),
        TypeError,
        r"where: .*got bool\[2\] and float64\[2,3\] and float64\[2,3\]",
    ),
    "where-float-predicate": (
        lambda x: anp.where(x, x, x),
        TypeError,
        r"where: the condition must be a boolean array.*got float64\[2,3\]",
    ),
    "where-int-predicate": (
        lambda x: anp.where(ints(x), x, x),
        TypeError,
        r"where: the condition must be a boolean array.*got int64\[2,3\]",
    ),
    "select-dtypes": (
        lambda x: ad.select(x > 0.5, x, ints(x)),
        TypeError,
        r"operands must have the same dtype, got float64\[2,3\] and int64\[2,3\]",
    ),
}

# The strict wrappers: names as in their messages (maximum's primitive is max).
STRICT = {"add": ad.add, "sub": ad.sub, "mul": ad.mul, "max": ad.maximum}
STRICT["div"] = ad.div
for _name, _fn in STRICT.items():
    BROADCASTING[f"strict-{_name}-rank"] = (
        lambda x, fn=_fn: fn(x, np.ones(3)),
        TypeError,
        rf"{_name}: operands must have the same shape, got float64\[2,3\] and "
        r"float64\[3\] \(use broadcast to make them match\)",
    )
    BROADCASTING[f"strict-{_name}-size-one-axis"] = (
        lambda x, fn=_fn: fn(np.ones((1, 3)), x),
        TypeError,
        rf"{_name}: operands must have the same shape, got float64\[1,3\] and "
        r"float64\[2,3\]",
    )


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case", BROADCASTING, ids=list(BROADCASTING))
def test_broadcasting(mode, case):
    """Shapes that do not broadcast: both operands' types and the axis where
    they differ. The strict wrappers refuse even shapes that would broadcast."""
    check_cases(BROADCASTING, case, mode)


# ---------------------------------------------------------------------------
# Mixed dtypes through the strict wrappers (the operators and autodidax.numpy
# promote instead, as jax.numpy does: tests/test_dtypes_and_methods.py)
# ---------------------------------------------------------------------------

F32_23 = np.ones((2, 3), np.float32)

MIXED_DTYPES = {
    "float64+float32": (
        lambda x: ad.add(x, F32_23),
        TypeError,
        r"add: operands must have the same dtype, got float64\[2,3\] and "
        r"float32\[2,3\]",
    ),
    "float32-float64": (
        lambda x: ad.sub(F32_23, x),
        TypeError,
        r"sub: operands must have the same dtype, got float32\[2,3\] and "
        r"float64\[2,3\]",
    ),
    "float64/float32": (
        lambda x: ad.div(x, F32_23),
        TypeError,
        r"div: operands must have the same dtype, got float64\[2,3\] and "
        r"float32\[2,3\]",
    ),
    "int+float": (
        lambda x: ad.add(ints(x), x),
        TypeError,
        r"add: operands must have the same dtype, got int64\[2,3\] and "
        r"float64\[2,3\]",
    ),
    "float*int": (
        lambda x: ad.mul(x, ints(x)),
        TypeError,
        r"mul: operands must have the same dtype, got float64\[2,3\] and "
        r"int64\[2,3\]",
    ),
    "int>float": (
        lambda x: ad.greater(ints(x), x),
        TypeError,
        r"greater: operands must have the same dtype, got int64\[2,3\] and "
        r"float64\[2,3\]",
    ),
    "float<int": (
        lambda x: ad.less(x, ints(x)),
        TypeError,
        r"less: operands must have the same dtype, got float64\[2,3\] and "
        r"int64\[2,3\]",
    ),
    "int+float-broadcast": (
        lambda x: ad.add(ints(x), np.ones((2, 3))),
        TypeError,
        r"add: operands must have the same dtype, got int64\[2,3\] and "
        r"float64\[2,3\]",
    ),
    "numpy-subtract-int-float": (
        lambda x: ad.sub(x, ints(x)),
        TypeError,
        r"sub: operands must have the same dtype, got float64\[2,3\] and "
        r"int64\[2,3\]",
    ),
    "int-array+python-float": (
        lambda x: ad.add(ints(x), 1.5),
        TypeError,
        r"add: cannot combine the float 1\.5 with an array of dtype int64",
    ),
    "python-float*int-array": (
        lambda x: ad.mul(1.5, ints(x)),
        TypeError,
        r"mul: cannot combine the float 1\.5 with an array of dtype int64",
    ),
    "int-array-python-float": (
        lambda x: ad.sub(ints(x), 0.5),
        TypeError,
        r"sub: cannot combine the float 0\.5 with an array of dtype int64",
    ),
    "int-array>python-float": (
        lambda x: ad.greater(ints(x), 1.5),
        TypeError,
        r"greater: cannot combine the float 1\.5 with an array of dtype int64",
    ),
    "numpy-add-int-array-python-float": (
        lambda x: ad.add(ints(x), 1.5),
        TypeError,
        r"add: cannot combine the float 1\.5 with an array of dtype int64",
    ),
    "bool-array+python-int": (
        lambda x: ad.add(bools(x), 1),
        TypeError,
        r"add: cannot combine the int 1 with an array of dtype bool",
    ),
}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case", MIXED_DTYPES, ids=list(MIXED_DTYPES))
def test_mixed_dtypes(mode, case):
    """The strict wrappers do not promote, as lax's do not: both dtypes are
    named, or the Python number that does not fit the array's kind."""
    check_cases(MIXED_DTYPES, case, mode)


def test_true_division_of_ints_is_not_an_error():
    """The control case: / converts 64-bit integers to float64 (as jax.numpy), and
    so does a Python int with an int array; the values are NumPy's."""
    i = np.arange(6).reshape(2, 3)
    for out in (
        ad.device_put(i) / 4,
        ad.jit(lambda a: a / 4)(i),
        anp.divide(i, np.arange(1, 4)),
    ):
        assert np.asarray(out).dtype == np.float64
    np.testing.assert_allclose(ad.jit(lambda a: a / 4)(i), i / 4, rtol=1e-15)
    np.testing.assert_allclose(anp.divide(i, np.arange(1, 4)), i / np.arange(1, 4))


# ---------------------------------------------------------------------------
# Hand-built equations of the new primitives: typecheck_jaxpr
# ---------------------------------------------------------------------------


def A(shape, dtype=F64) -> ShapedArray:
    return ShapedArray(shape, dtype)


M23, M34, M32, VEC3 = A((2, 3)), A((3, 4)), A((3, 2)), A((3,))
I23, B23 = A((2, 3), I64), A((2, 3), BOOL)
DN = MATMUL_DIMS

# name: (primitive, input types, params, declared output type, message)
HAND_BUILT = {
    "sub-shapes": ("sub", [M23, VEC3], {}, M23, r"same shape.*\[2,3\].*\[3\]"),
    "sub-dtypes": ("sub", [M23, A((2, 3), F32)], {}, M23, r"same dtype.*float32"),
    "sub-one-input": ("sub", [M23], {}, M23, r"argument|input"),
    "max-shapes": ("max", [VEC3, M23], {}, M23, r"same shape.*\[3\].*\[2,3\]"),
    "max-dtypes": ("max", [M23, I23], {}, M23, r"same dtype.*int64\[2,3\]"),
    "div-ints": ("div", [I23, I23], {}, I23, r"div: expected float.*int64\[2,3\]"),
    "div-bools": ("div", [B23, B23], {}, B23, r"div: expected float.*bool\[2,3\]"),
    "div-shapes": ("div", [M23, VEC3], {}, M23, r"same shape"),
    "exp-ints": ("exp", [I23], {}, I23, r"exp: expected a float.*int64\[2,3\]"),
    "log-bools": ("log", [B23], {}, B23, r"log: expected a float.*bool\[2,3\]"),
    "tanh-int32": ("tanh", [A((3,), np.int32)], {}, A((3,), np.int32), r"int32"),
    "exp-with-a-param": ("exp", [M23], {"y": 2}, M23, r"'y'"),
    "exp-declared-int": ("exp", [M23], {}, I23, r"declared int64.*produces float"),
    "integer_pow-float-y": ("integer_pow", [M23], {"y": 2.0}, M23, r"power 2\.0"),
    "integer_pow-bool-y": ("integer_pow", [M23], {"y": True}, M23, r"power True"),
    "integer_pow-str-y": ("integer_pow", [M23], {"y": "2"}, M23, r"power '2'"),
    "integer_pow-ints-negative-y": (
        "integer_pow",
        [I23],
        {"y": -1},
        I23,
        r"cannot raise int64\[2,3\] to the power -1",
    ),
    "integer_pow-bools": (
        "integer_pow",
        [B23],
        {"y": 2},
        B23,
        r"cannot raise bool\[2,3\] to the power 2",
    ),
    "integer_pow-no-y": ("integer_pow", [M23], {}, M23, r"'y'"),
    "convert-dtype-class": (
        "convert_element_type",
        [M23],
        {"new_dtype": np.float32},
        A((2, 3), F32),
        r"new_dtype must be a NumPy dtype.*numpy\.float32",
    ),
    "convert-dtype-name": (
        "convert_element_type",
        [M23],
        {"new_dtype": "float32"},
        A((2, 3), F32),
        r"new_dtype must be a NumPy dtype.*'float32'",
    ),
    "convert-to-U3": (
        "convert_element_type",
        [M23],
        {"new_dtype": np.dtype("U3")},
        M23,
        r"booleans, integers or floats, got dtype\('<U3'\)",
    ),
    "convert-to-object": (
        "convert_element_type",
        [M23],
        {"new_dtype": np.dtype(object)},
        M23,
        r"got dtype\('O'\)",
    ),
    "convert-to-none": (
        "convert_element_type",
        [M23],
        {"new_dtype": None},
        M23,
        r"new_dtype must be a NumPy dtype.*got None",
    ),
    "convert-no-new_dtype": ("convert_element_type", [M23], {}, M23, r"new_dtype"),
    "convert-declared-wrong": (
        "convert_element_type",
        [M23],
        {"new_dtype": F32},
        I23,
        r"declared int64\[2,3\] but the primitive produces float32\[2,3\]",
    ),
    "reshape-list": (
        "reshape",
        [M23],
        {"new_sizes": [3, 2]},
        M32,
        r"param new_sizes must be a tuple, got \[3, 2\]",
    ),
    "reshape-int": (
        "reshape",
        [M23],
        {"new_sizes": 6},
        A((6,)),
        r"param new_sizes must be a tuple, got 6",
    ),
    "reshape-count": (
        "reshape",
        [M23],
        {"new_sizes": (4, 2)},
        A((4, 2)),
        r"cannot reshape float64\[2,3\] into shape \(4, 2\)",
    ),
    "reshape-hole": (
        "reshape",
        [M23],
        {"new_sizes": (-1, 2)},
        M32,
        r"non-negative integers, got \(-1, 2\)",
    ),
    "reshape-float": (
        "reshape",
        [M23],
        {"new_sizes": (3.0, 2)},
        M32,
        r"non-negative integers, got \(3\.0, 2\)",
    ),
    "reshape-no-new_sizes": ("reshape", [M23], {}, M32, r"new_sizes"),
    "reshape-shape-instead-of-new_sizes": (
        "reshape",
        [M23],
        {"shape": (3, 2)},
        M32,
        r"shape|new_sizes",
    ),
    "reshape-declared-wrong": (
        "reshape",
        [M23],
        {"new_sizes": (3, 2)},
        M23,
        r"declared float64\[2,3\] but the primitive produces float64\[3,2\]",
    ),
    "reduce_max-list": (
        "reduce_max",
        [M23],
        {"axes": [0]},
        VEC3,
        r"param axes must be a tuple, got \[0\]",
    ),
    "reduce_max-int": (
        "reduce_max",
        [M23],
        {"axes": 0},
        VEC3,
        r"param axes must be a tuple, got 0",
    ),
    "reduce_max-out-of-range": (
        "reduce_max",
        [M23],
        {"axes": (2,)},
        VEC3,
        r"axis 2 is out of range for an array of rank 2",
    ),
    "reduce_max-negative": (
        "reduce_max",
        [M23],
        {"axes": (-1,)},
        A((2,)),
        r"axis -1 is out of range .*axes 0\.\.1",
    ),
    "reduce_max-repeated": (
        "reduce_max",
        [M23],
        {"axes": (0, 0)},
        VEC3,
        r"repeated axis in param axes=\(0, 0\)",
    ),
    "reduce_max-float-axis": (
        "reduce_max",
        [M23],
        {"axes": (0.0,)},
        VEC3,
        r"axes must be integers, got 0\.0",
    ),
    "reduce_max-bools": (
        "reduce_max",
        [B23],
        {"axes": (0,)},
        A((3,), BOOL),
        r"expected a numeric array, got bool\[2,3\]",
    ),
    "reduce_max-no-axes": ("reduce_max", [M23], {}, VEC3, r"axes"),
    "reduce_max-declared-wrong": (
        "reduce_max",
        [M23],
        {"axes": (0,)},
        A((2,)),
        r"declared float64\[2\] but the primitive produces float64\[3\]",
    ),
}

_DG_CASES = {
    "lists": ([[[1], [0]], [[], []]], M23, M34, r"not in canonical form"),
    "inner-lists": ((([1], [0]), ([], [])), M23, M34, r"not in canonical form"),
    "negative-axes": ((((-1,), (0,)), ((), ())), M23, M34, r"not in canonical"),
    "one-pair": (((1,), (0,)), M23, M34, r"must be \(\(x_contract, y_contract\)"),
    "string": ("ij,jk", M23, M34, r"must be \(\(x_contract.*got 'ij,jk'"),
    "none": (None, M23, M34, r"must be \(\(x_contract.*got None"),
    "sizes": (DN, M23, A((4, 3)), r"contracting axis 1 of x float64\[2,3\] has"),
    "float32": (DN, M23, A((3, 4), F32), r"same dtype.*float32\[3,4\]"),
    "int-float": (DN, I23, M34, r"same dtype, got int64\[2,3\] and float64"),
    "bools": (DN, B23, A((3, 4), BOOL), r"expected numeric arrays, got bool"),
    "counts": ((((1,), (0, 1)), ((), ())), M23, A((3, 3)), r"as many contracting"),
    "contracting-and-batch": (
        (((0,), (0,)), ((0,), (0,))),
        M23,
        M23,
        r"both contracting and batch",
    ),
    "out-of-range": ((((2,), (0,)), ((), ())), M23, M34, r"axis 2 is out of range"),
    "repeated": ((((1, 1), (0, 0)), ((), ())), M23, M34, r"repeated axis"),
    "float-axis": ((((1.0,), (0,)), ((), ())), M23, M34, r"integers, got 1\.0"),
    "bool-axis": ((((True,), (0,)), ((), ())), M23, M34, r"integers, got True"),
}
for _name, (_dims, _x, _y, _match) in _DG_CASES.items():
    HAND_BUILT[f"dot_general-{_name}"] = (
        "dot_general",
        [_x, _y],
        {"dimension_numbers": _dims},
        A((2, 4)),
        _match,
    )
HAND_BUILT["dot_general-no-params"] = (
    "dot_general",
    [M23, M34],
    {},
    A((2, 4)),
    r"dimension_numbers",
)
HAND_BUILT["dot_general-one-input"] = (
    "dot_general",
    [M23],
    {"dimension_numbers": DN},
    A((2, 4)),
    r"argument|input",
)
HAND_BUILT["dot_general-declared-wrong"] = (
    "dot_general",
    [M23, M34],
    {"dimension_numbers": DN},
    A((4, 2)),
    r"declared float64\[4,2\] but the primitive produces float64\[2,4\]",
)


def assert_staging_usable() -> None:
    assert_usable()
    jaxpr, _, _ = ad.make_jaxpr(lambda a: anp.reshape(a, (3, 2)) @ a, M23)
    ad.typecheck_jaxpr(jaxpr)


@pytest.mark.parametrize("case", HAND_BUILT, ids=list(HAND_BUILT))
def test_hand_built_equation(case):
    """typecheck_jaxpr names the equation, the primitive and the problem."""
    name, in_types, params, out_type, match = HAND_BUILT[case]
    ins, out = [Var(t) for t in in_types], Var(out_type)
    jaxpr = Jaxpr(ins, [JaxprEqn(ad.PRIMITIVES[name], ins, params, [out])], [out])
    pattern = rf"equation 0 \({name}\): .*{match}"
    with raises_clearly(JaxprTypeError, pattern, then=assert_staging_usable):
        ad.typecheck_jaxpr(jaxpr)


def test_hand_built_jaxpr_of_every_new_primitive_passes():
    """The control case: a well-formed hand-built jaxpr using all eleven new
    primitives has the expected type, and runs to NumPy's answer."""
    x, y = Var(M23), Var(M34)
    steps = [
        ("dot_general", [x, y], {"dimension_numbers": DN}, A((2, 4))),
        ("reshape", [0], {"new_sizes": (4, 2)}, A((4, 2))),
        ("tanh", [1], {}, A((4, 2))),
        ("exp", [2], {}, A((4, 2))),
        ("log", [3], {}, A((4, 2))),
        ("sub", [4, 2], {}, A((4, 2))),
        ("div", [5, 3], {}, A((4, 2))),
        ("max", [6, 1], {}, A((4, 2))),
        ("integer_pow", [7], {"y": 3}, A((4, 2))),
        ("reduce_max", [8], {"axes": (1,)}, A((4,))),
        ("convert_element_type", [9], {"new_dtype": F32}, A((4,), F32)),
    ]
    outs, eqns = [], []
    for name, inputs, params, out_type in steps:
        ins = [outs[i] if isinstance(i, int) else i for i in inputs]
        outs.append(Var(out_type))
        eqns.append(JaxprEqn(ad.PRIMITIVES[name], ins, params, [outs[-1]]))
    jaxpr = Jaxpr([x, y], eqns, [outs[-1]])
    jaxpr_type = ad.typecheck_jaxpr(jaxpr)
    assert str(jaxpr_type) == "(float64[2,3], float64[3,4]) -> (float32[4])"
    a, b = X, np.arange(12.0).reshape(3, 4) / 10.0
    p = (a @ b).reshape(4, 2)
    t = np.tanh(p)
    e = np.exp(t)
    expected = (np.maximum((np.log(e) - t) / e, p) ** 3).max(axis=1)
    (out,) = ad.eval_jaxpr(jaxpr, [a, b])
    assert out.dtype == np.float32
    np.testing.assert_allclose(out, expected.astype(np.float32), rtol=1e-6)


NUMPY_INT_PARAMS = {
    "integer_pow": ("integer_pow", [VEC3], {"y": np.int64(3)}, {"y": 3}, VEC3),
    "reshape": (
        "reshape",
        [M23],
        {"new_sizes": (np.int64(3), np.int32(2))},
        {"new_sizes": (3, 2)},
        M32,
    ),
    "reduce_max": (
        "reduce_max",
        [M23],
        {"axes": (np.int64(1),)},
        {"axes": (1,)},
        A((2,)),
    ),
    "dot_general": (
        "dot_general",
        [M23, M32],
        {"dimension_numbers": (((np.int64(1),), (np.int32(0),)), ((), ()))},
        {"dimension_numbers": DN},
        A((2, 2)),
    ),
}


@pytest.mark.parametrize("case", NUMPY_INT_PARAMS)
def test_params_with_numpy_ints_run_everywhere(case):
    """Params holding NumPy integers where the wrappers put Python ints pass
    typecheck_jaxpr; then the jaxpr must run like the canonical one under
    eval, jit (lowering), jvp, vmap and grad, not fail later."""
    name, in_types, params, canonical, out_type = NUMPY_INT_PARAMS[case]
    prim = ad.PRIMITIVES[name]

    def build(p):
        ins, out = [Var(t) for t in in_types], Var(out_type)
        return ad.jaxpr_as_fun(Jaxpr(ins, [JaxprEqn(prim, ins, p, [out])], [out]))

    odd, good = build(params), build(canonical)
    rng = np.random.default_rng(0)
    args = [rng.uniform(0.5, 1.5, size=t.shape) for t in in_types]
    batched = [np.stack([a, 2.0 * a]) for a in args]
    transforms = [
        lambda f: f(*args),
        lambda f: ad.jit(f)(*args),
        lambda f: ad.jvp(f, tuple(args), tuple(args)),
        lambda f: ad.vmap(f)(*batched),
        lambda f: ad.grad(lambda *a: ad.reduce_sum(f(*a)[0]))(*args),
    ]
    for transform in transforms:
        for got, want in zip(
            ad.tree_flatten(transform(odd))[0], ad.tree_flatten(transform(good))[0]
        ):
            np.testing.assert_allclose(got, want, rtol=1e-12)


# ---------------------------------------------------------------------------
# grad through the new primitives
# ---------------------------------------------------------------------------

THROUGH_NEW_PRIMITIVES = {
    "dot_general": lambda x: ad.dot_general(x, x, (((0,), (0,)), ((), ()))),
    "matmul": lambda x: x @ x,
    "reshape": lambda x: anp.sum(ad.reshape(x, (3, 1))),
    "reduce_max": lambda x: ad.reduce_max(x),
    "integer_pow": lambda x: anp.sum(x**2),
    "convert_element_type": lambda x: anp.sum(anp.astype(x, np.float64)),
    "sub-maximum": lambda x: anp.sum(ad.maximum(ad.sub(x, 1), x)),
    "mean": lambda x: anp.mean(x),
}


@pytest.mark.parametrize(
    "wrap",
    [
        lambda g: g,
        lambda g: ad.jit(g),
        lambda g: lambda x: ad.vmap(g)(np.stack([x, x])),
        lambda g: lambda x: ad.jvp(g, (x,), (x,)),
    ],
    ids=["grad", "jit-of-grad", "vmap-of-grad", "jvp-of-grad"],
)
@pytest.mark.parametrize(
    "fn", THROUGH_NEW_PRIMITIVES.values(), ids=list(THROUGH_NEW_PRIMITIVES)
)
def test_grad_with_respect_to_integer_input(fn, wrap):
    """grad's own clear error, whatever the function does with the input."""
    with clear_error(TypeError, r"grad: can only differentiate with respect to "):
        with nothing_compiled():
            wrap(ad.grad(fn))(np.arange(3))


def test_grad_with_respect_to_python_int_through_new_primitives():
    with clear_error(TypeError, r"(?i)float inputs.*int64"):
        ad.grad(lambda n: anp.exp(anp.astype(n, np.float64)))(3)


def _round_trip_int(x):
    return ad.convert_element_type(ad.convert_element_type(x, np.int64), np.float64)


def _round_trip_int_jax(x):
    as_int = jax.lax.convert_element_type(x, jnp.int64)
    return jax.lax.convert_element_type(as_int, jnp.float64)


def _round_trip_bool(x):
    return ad.convert_element_type(ad.convert_element_type(x, np.bool_), np.float64)


def _round_trip_bool_jax(x):
    as_bool = jax.lax.convert_element_type(x, jnp.bool_)
    return jax.lax.convert_element_type(as_bool, jnp.float64)


CONVERSION_GRADS = {
    "through-int": (
        lambda x: ad.reduce_sum(_round_trip_int(x)),
        lambda x: jnp.sum(_round_trip_int_jax(x)),
    ),
    "through-int-times-x": (
        lambda x: ad.reduce_sum(_round_trip_int(x) * x),
        lambda x: jnp.sum(_round_trip_int_jax(x) * x),
    ),
    "through-bool-times-sin": (
        lambda x: ad.reduce_sum(_round_trip_bool(x) * ad.sin(x)),
        lambda x: jnp.sum(_round_trip_bool_jax(x) * jnp.sin(x)),
    ),
    "int-output-compared": (
        lambda x: ad.reduce_sum(
            anp.where(ad.convert_element_type(x, np.int64) > 0, x * x, x)
        ),
        lambda x: jnp.sum(
            jnp.where(jax.lax.convert_element_type(x, jnp.int64) > 0, x * x, x)
        ),
    ),
}


@pytest.mark.parametrize(
    "wrap",
    [
        lambda g: g,
        lambda g: ad.jit(g),
        lambda g: lambda x: np.asarray(ad.vmap(g)(np.stack([x, -x])))[0],
    ],
    ids=["grad", "jit-of-grad", "vmap-of-grad"],
)
@pytest.mark.parametrize("inner_jit", [False, True], ids=["f", "jit-f"])
@pytest.mark.parametrize("case", CONVERSION_GRADS, ids=list(CONVERSION_GRADS))
def test_float_to_int_conversion_has_zero_gradient_like_jax(case, inner_jit, wrap):
    """Converting a float to an integer (or bool) is not an error under grad:
    nothing varies smoothly through it, so its contribution to the gradient is
    zero, as in JAX. Compared with jax.grad on the same function."""
    ours, theirs = CONVERSION_GRADS[case]
    x = np.array([-1.7, -0.4, 0.0, 0.6, 2.5])
    got = wrap(ad.grad(ad.jit(ours) if inner_jit else ours))(x)
    expected = jax.grad(theirs)(x)
    np.testing.assert_allclose(got, expected, rtol=1e-12, atol=0.0)
    if case == "through-int":
        assert np.all(np.asarray(got) == 0.0)


def test_vjp_of_a_float_to_int_conversion_gives_zero_cotangent():
    """vjp through a float-to-int conversion gives a zero float cotangent."""
    out, f_vjp = ad.vjp(lambda x: ad.convert_element_type(x, np.int64), V3)
    np.testing.assert_array_equal(out, V3.astype(np.int64))
    (ct,) = f_vjp(np.ones(3, np.int64))
    assert np.asarray(ct).dtype == np.float64
    np.testing.assert_array_equal(ct, np.zeros(3))


# ---------------------------------------------------------------------------
# Regressions: bugs found while writing this file (the docstrings describe the
# old behaviour), all fixed in the appendix chapter or Part 3
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["eager", "jit"])
def test_regression_matmul_stacks_error_names_only_the_stack_shapes(mode):
    """matmul of stacks whose leading axes do not broadcast says "got (2,) and
    (5,)": shapes the user never wrote. It should name both operands,
    float64[2,3,1] and float64[5,1,2], like every other matmul error."""

    def f(x):
        return anp.matmul(anp.reshape(x, (2, 3, 1)), np.ones((5, 1, 2)))

    with clear_error(TypeError, r"matmul: .*float64\[2,3,1\].*float64\[5,1,2\]"):
        run(mode, f)


@pytest.mark.parametrize("mode", ["jit", "vmap", "grad", "jvp"])
def test_regression_power_with_traced_exponent_shows_tracer_internals(mode):
    """An unsupported power under a transformation once said "got
    JaxprTracer<float64[2,3]>" (jit), "got BatchTracer(val=array([[[0. , 0.25,
    ..." (vmap: the whole batch), or "got JVPTracer(primal=..." (grad, jvp):
    internals instead of the exponent's type in the user's terms. (A traced
    float exponent is now pow; integers to a traced power are refused.)"""
    with clear_error(TypeError, r"power: an integer base") as info:
        run(mode, lambda x: ints(x) ** ints(x) + x)
    assert "Tracer" not in str(info.value), str(info.value)
    assert "int64[2,3]" in str(info.value), str(info.value)


@pytest.mark.parametrize(
    "x, y",
    [
        (np.array([0, 3], np.uint8), np.array([5, 1], np.uint8)),
        (np.array([np.iinfo(np.int64).min, 4]), np.array([0, 2])),
    ],
    ids=["uint8", "int64-min"],
)
@pytest.mark.parametrize("jitted", [False, True], ids=["eager", "jit"])
def test_regression_minimum_silently_wrong_for_unsigned_and_most_negative(x, y, jitted):
    """anp.minimum is -maximum(-x, -y): negation wraps around for unsigned
    integers and for the most negative int64, so minimum([0, 3], [5, 1]) of
    uint8 is [5, 1] and minimum(INT64_MIN, 0) is 0. NumPy is the reference."""
    fn = ad.jit(anp.minimum) if jitted else anp.minimum
    np.testing.assert_array_equal(fn(x, y), np.minimum(x, y))


@pytest.mark.parametrize(
    "call, given",
    [
        (lambda: anp.minimum("abc", V3), r"str 'abc'"),
        (lambda: anp.minimum(V3, [1.0, 2.0, 3.0]), r"a list of 3 values"),
        (lambda: anp.minimum(V3, 1j), r"complex 1j"),
        (lambda: ad.jit(lambda x: anp.minimum(x, None))(V3), r"NoneType None"),
    ],
    ids=["str", "list", "complex", "None-under-jit"],
)
def test_regression_minimum_of_a_non_array_has_no_autodidax_message(call, given):
    """Every other function says "<name>: expected an array or a number, got
    str 'abc'"; minimum gives Python's "bad operand type for unary -: 'str'"
    (or, for 1j, blames maximum and shows (-0-1j), a value never passed)."""
    with clear_error(TypeError, rf"minimum: expected an array .*got {given}"):
        call()


def test_regression_minimum_broadcast_error_names_maximum():
    """anp.minimum(a, b) of shapes that do not broadcast says "maximum: ...",
    a function the user did not call."""
    with clear_error(TypeError, r"^minimum: .*float64\[3\] and float64\[2\]"):
        anp.minimum(V3, np.ones(2))


@pytest.mark.parametrize(
    "call, given",
    [
        (lambda: anp.divide(np.arange(3), np.arange(2)), r"int64\[3\].*int64\[2\]"),
    ],
    ids=["shapes"],
)
def test_regression_divide_error_names_converted_dtype_not_the_given_one(call, given):
    """divide converted integer operands to float64 before checking them, so
    int64[3] / int64[2] said "got float64[3] and float64[2]": dtypes the user
    did not pass. The message should name the operands as given. (int64 /
    float32 was the other case; it now promotes to float32, as in JAX.)"""
    with clear_error(TypeError, rf"(?s)div.*{given}") as info:
        call()
    assert "float64" not in str(info.value), str(info.value)


@pytest.mark.parametrize("mode", ["eager", "jit"])
def test_regression_reshape_negative_size_message_hides_the_minus_one(mode):
    """reshape(x, (-1, -2)) says "got [0, -2]": the user's -1 is shown as 0,
    and the shape as a list. It should show the shape as written."""
    with clear_error(ValueError, r"non-negative.*\(-1, -2\)") as info:
        run(mode, lambda x: ad.reshape(x, (-1, -2)))
    assert "[0, -2]" not in str(info.value), str(info.value)


@pytest.mark.parametrize(
    "fn, dtype",
    [
        (lambda x: ad.convert_element_type(x, np.longdouble) * 2.0, np.float64),
        (ad.exp, np.longdouble),
    ],
    ids=["convert-to-longdouble", "longdouble-input"],
)
def test_regression_longdouble_under_jit_is_an_internal_key_error(fn, dtype):
    """float128 (np.longdouble) is a float kind, so convert_element_type and
    every float-only function accept it, and eagerly NumPy computes it; under
    jit, lowering fails with KeyError: 128. The error should be a clear one
    raised while tracing, naming the dtype (XLA has no float128)."""
    with clear_error((TypeError, ValueError), r"float128|longdouble"):
        with nothing_compiled():
            ad.jit(fn)(X.astype(dtype))


@pytest.mark.parametrize("mode", ["eager", "jit", "vmap", "grad"])
@pytest.mark.parametrize("name", ["max", "min"])
def test_max_and_min_of_no_elements(mode, name):
    """jax.numpy's max and min of an empty reduction raise ValueError (JAX's
    message); reducing a non-empty axis of an array with an empty one works."""
    fn = getattr(anp, name)
    with clear_error(ValueError, rf"zero-size array to reduction operation {name}"):
        run(mode, lambda x: fn(ad.reshape(x, (6, 1)) * np.zeros((6, 0)), axis=1))
    ours = fn(np.zeros((0, 3)), axis=1)
    assert ad.get_aval(ours).shape == (0,)
