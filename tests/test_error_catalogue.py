"""The catalogue of SPEC §5: every kind of bad input gets a clear error.

One section per case of the spec's list, in the spec's order. Each case runs
in every mode where it can happen (eager, under jit, under vmap, under grad,
and combinations of those) and checks

- the exception's type: TypeError or ValueError, or a named subclass of those
  (ConcretizationError, UnexpectedTracerError), never an internal
  AssertionError/KeyError/AttributeError/IndexError;
- its message, in the user's terms: what was expected and what was given
  (shapes, dtypes, tree structures, values);
- for jit, that it was raised while tracing: nothing was lowered or compiled;
- that the interpreter is usable afterwards: only the evaluation level is on
  the stack, it is the dynamic level, and jit/grad/vmap give the right answers.

Some cases are also covered, in more variants, by tests/test_part*_errors.py;
this file is the one place where a reader sees every case of the list.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

import numpy as np
import pytest
from helpers import nothing_compiled, raises_clearly

import autodidax as ad

pytestmark = pytest.mark.usefixtures("clean_interpreter_stack")

V3 = np.array([0.5, -1.0, 2.0])
V4 = np.arange(4.0)
M23 = np.arange(6.0).reshape(2, 3) / 4.0
INTERNAL = (AssertionError, KeyError, AttributeError, IndexError)

# Used by the usability check after every error; traced and compiled once.
_jitted_check = ad.jit(lambda x: ad.sin(x) * x + 1.0)


def assert_usable() -> None:
    """The stack is clean and jit, grad and vmap still give right answers."""
    assert len(ad._state.stack) == 1
    assert ad._state.dynamic is ad._state.stack[0]
    np.testing.assert_allclose(_jitted_check(V3), np.sin(V3) * V3 + 1.0, rtol=1e-12)
    gradient = ad.grad(lambda x: ad.reduce_sum(ad.sin(x) * x))(V3)
    np.testing.assert_allclose(gradient, np.cos(V3) * V3 + np.sin(V3), rtol=1e-12)
    np.testing.assert_allclose(ad.vmap(ad.cos, 1)(M23), np.cos(M23).T, rtol=1e-12)
    assert len(ad._state.stack) == 1
    assert ad._state.dynamic is ad._state.stack[0]


@contextmanager
def clear_error(exc_type, match: str) -> Iterator:
    """Expect ``exc_type`` with a message matching ``match``, never an internal
    error type (also not as a subclass), then check the interpreter."""
    with raises_clearly(exc_type, match, then=assert_usable) as info:
        yield info
    assert not isinstance(info.value, INTERNAL), type(info.value).__mro__


def under(mode: str, f: Callable) -> Callable:
    """``f`` (a function of one array) run eagerly or under a transformation.

    vmap maps over a new leading axis of size 2; grad differentiates the sum
    of sin of ``f``'s output, so ``f`` itself runs on traced values.
    """
    if mode == "eager":
        return f
    if mode == "jit":
        return ad.jit(f)
    if mode == "vmap":
        return lambda x: ad.vmap(f)(np.stack([x, x]))
    if mode == "grad":
        return lambda x: ad.grad(lambda y: ad.reduce_sum(ad.sin(f(y))))(x)
    if mode == "jit-of-grad":
        return ad.jit(under("grad", f))
    if mode == "vmap-of-jit":
        return under("vmap", ad.jit(f))
    if mode == "grad-of-jit":
        return under("grad", ad.jit(f))
    raise ValueError(mode)


MODES = ["eager", "jit", "vmap", "grad", "jit-of-grad", "vmap-of-jit", "grad-of-jit"]
STAGED = {"jit", "jit-of-grad", "vmap-of-jit", "grad-of-jit"}


@contextmanager
def in_mode(mode: str) -> Iterator[None]:
    """``nothing_compiled`` for the modes that compile, nothing for the others."""
    if mode in STAGED:
        with nothing_compiled():
            yield
    else:
        yield


# ---------------------------------------------------------------------------
# 1. Non-scalar output to grad
# ---------------------------------------------------------------------------

NON_SCALAR_OUTPUTS = {
    "vector": (lambda x: ad.sin(x), r"float64\[3\]"),
    "matrix": (lambda x: ad.broadcast(x, (2, 3), (0,)), r"float64\[2, ?3\]"),
    "tuple": (lambda x: (ad.reduce_sum(x), ad.reduce_sum(x)), r"\(\*, \*\)"),
    "dict": (lambda x: {"loss": ad.reduce_sum(x)}, r"\{'loss': \*\}"),
    "bool-scalar": (lambda x: ad.reduce_sum(x) > 0.0, r"bool\[\]"),
}


@pytest.mark.parametrize("case", NON_SCALAR_OUTPUTS, ids=list(NON_SCALAR_OUTPUTS))
@pytest.mark.parametrize(
    "wrap",
    [
        lambda g: g,
        lambda g: ad.jit(g),
        lambda g: lambda x: ad.vmap(g)(np.stack([x, x])),
        lambda g: lambda x: ad.grad(lambda y: ad.reduce_sum(g(y)))(x),
    ],
    ids=["grad", "jit-of-grad", "vmap-of-grad", "grad-of-grad"],
)
@pytest.mark.parametrize("jit_inside", [False, True], ids=["f", "jit-f"])
def test_1_grad_of_non_scalar_output(case, wrap, jit_inside):
    """grad says it needs a float scalar (shape ()) and shows what f returned."""
    f, given = NON_SCALAR_OUTPUTS[case]
    g = ad.grad(ad.jit(f) if jit_inside else f)
    with clear_error(TypeError, rf"(?i)scalar.*shape \(\).*got .*{given}"):
        wrap(g)(V3)


# ---------------------------------------------------------------------------
# 2. Shape or dtype mismatch in a binary op
# ---------------------------------------------------------------------------

BINARY_OPS = {
    "add": ad.add,
    "mul": ad.mul,
    "greater": ad.greater,
    "less": ad.less,
    "operator-": lambda x, y: x - y,
    "operator*": lambda x, y: x * y,
    "select-operands": lambda x, y: ad.select(ad.greater(x, x), x, y),
}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("op", BINARY_OPS.values(), ids=list(BINARY_OPS))
def test_2_binary_shape_mismatch(mode, op):
    """Both per-example shapes are named, eagerly and while tracing. (Eager
    Python operators are autodidax's on device arrays, NumPy's on NumPy
    arrays, so the eager operator cases use a device array.)"""
    f = under(mode, lambda x: op(x, V4))
    x = ad.device_put(V3) if mode == "eager" else V3
    with clear_error(TypeError, r"(?i)same shape.*float64\[3\].*float64\[4\]"):
        with in_mode(mode):
            f(x)


STRICT_BINARY = {"add": ad.add, "mul": ad.mul, "greater": ad.greater, "less": ad.less}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("op", STRICT_BINARY, ids=list(STRICT_BINARY))
def test_2_strict_wrappers_refuse_a_rank_mismatch(mode, op):
    """The primitive wrappers do not broadcast ranks (like jax.lax), even
    where NumPy's rules would: float64[3] against float64[2,3] is an error."""
    f = under(mode, lambda x: STRICT_BINARY[op](x, M23))
    with clear_error(
        TypeError,
        rf"{op}: operands must have the same shape.*float64\[3\].*"
        r"float64\[2,3\]",
    ):
        with in_mode(mode):
            f(V3)


BROADCASTING_OPS = {
    "operator-": (lambda x, y: x - y, np.subtract),
    "operator*": (lambda x, y: x * y, np.multiply),
    "operator>": (lambda x, y: x > y, np.greater),
}


@pytest.mark.parametrize("mode", ["eager", "jit", "vmap", "vmap-of-jit"])
@pytest.mark.parametrize("op", BROADCASTING_OPS, ids=list(BROADCASTING_OPS))
def test_2_operators_broadcast_like_numpy(mode, op):
    """Not a mistake: the operators broadcast float64[3] against float64[2,3]
    as NumPy does (vmap maps over two copies of the input)."""
    ours, theirs = BROADCASTING_OPS[op]
    f = under(mode, lambda x: ours(x, M23))
    x = ad.device_put(V3) if mode == "eager" else V3
    expected = theirs(V3, M23)
    if mode.startswith("vmap"):
        expected = np.stack([expected, expected])
    out = np.asarray(f(x))
    assert out.dtype == expected.dtype
    np.testing.assert_allclose(out, expected, rtol=1e-12)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(
    "other, name",
    [
        (V3.astype(np.float32), "float32"),
        (np.arange(3), "int64"),
        (np.ones(3, np.bool_), "bool"),
    ],
    ids=["float32", "int64", "bool"],
)
@pytest.mark.parametrize("op", ["add", "mul", "greater", "less"])
def test_2_binary_dtype_mismatch(mode, other, name, op):
    """No implicit promotion: both dtypes are named."""
    f = under(mode, lambda x: getattr(ad, op)(x, other))
    with clear_error(TypeError, rf"(?i)same dtype.*float64\[3\].*{name}\[3\]"):
        with in_mode(mode):
            f(V3)


@pytest.mark.parametrize("mode", MODES)
def test_2_python_float_with_integer_array(mode):
    """A Python float next to an integer array would change its dtype."""
    ints = np.arange(3)
    f = under(mode, lambda x: ad.add(ints, 1.5) * 0.0 + x)
    with clear_error(TypeError, r"(?i)1\.5.*int64|int64.*1\.5"):
        with in_mode(mode):
            f(V3)


# ---------------------------------------------------------------------------
# 3. Python `if` on a traced value under jit (say to use cond)
# ---------------------------------------------------------------------------


def _if(x):
    return x if ad.reduce_sum(x) > 0.0 else -x


def _while(x):
    while ad.reduce_sum(x * x) < 100.0:
        x = x * 2.0
    return x


def _bool(x):
    return x * float(bool(ad.reduce_sum(x) < 1.0))


def _and(x):
    return (ad.reduce_sum(x) > 0.0) and x


def _if_in_cond_branch(x):
    return ad.cond(True, _if, lambda y: y, x)


CONTROL_FLOW = [_if, _while, _bool, _and, _if_in_cond_branch]


@pytest.mark.parametrize("fn", CONTROL_FLOW, ids=lambda f: f.__name__)
@pytest.mark.parametrize("mode", ["jit", "jit-of-grad", "grad-of-jit", "vmap-of-jit"])
def test_3_python_if_on_traced_value_under_jit(fn, mode):
    """ConcretizationError (a TypeError) that says the value is traced and
    points to cond."""
    with clear_error(ad.ConcretizationError, r"(?s)traced.*\bcond\b") as info:
        with in_mode(mode):
            under(mode, fn)(V3)
    assert isinstance(info.value, TypeError)


def test_3_python_if_on_static_information_is_fine():
    """Branching on shapes, dtypes and Python values works under jit."""

    def f(x, flag=True):
        if x.ndim == 1 and x.shape[0] == 3 and x.dtype == np.float64 and flag:
            return x * 2.0
        return x

    np.testing.assert_allclose(ad.jit(f)(V3), 2.0 * V3)


# ---------------------------------------------------------------------------
# 4. Python `if` on a batched value under vmap
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("fn", CONTROL_FLOW[:4], ids=lambda f: f.__name__)
@pytest.mark.parametrize(
    "wrap",
    [
        lambda fn: ad.vmap(fn),
        lambda fn: ad.jit(ad.vmap(fn)),
        lambda fn: ad.vmap(ad.vmap(fn)),
        lambda fn: lambda xs: ad.grad(lambda y: ad.reduce_sum(ad.vmap(fn)(y)))(xs),
        lambda fn: ad.vmap(lambda x: ad.jvp(fn, (x,), (x,))[1]),
    ],
    ids=["vmap", "jit-of-vmap", "vmap-of-vmap", "grad-of-vmap", "vmap-of-jvp"],
)
def test_4_python_if_on_batched_value_under_vmap(fn, wrap):
    """The message says the value is batched and suggests select or cond."""
    xs = np.stack([V3, -V3])  # per example a float64[3] (a scalar for vmap-of-vmap)
    with clear_error(ad.ConcretizationError, r"(?s)vmap.*batched.*(select|cond)"):
        wrap(fn)(xs)


def test_4_python_if_on_unbatched_value_is_fine():
    """Branching on a value that does not depend on the batch is allowed."""
    out = ad.vmap(lambda x, y: x * 2.0 if y > 0.0 else x, (0, None))(M23, 1.0)
    np.testing.assert_allclose(out, 2.0 * M23)


# ---------------------------------------------------------------------------
# 5. Non-array inputs (strings and other objects)
# ---------------------------------------------------------------------------

ENTRY_POINTS = {
    "primitive": lambda b: ad.sin(b),
    "binary-left": lambda b: ad.mul(b, V3),
    "binary-right": lambda b: ad.add(V3, b),
    "jit": lambda b: ad.jit(ad.sin)(b),
    "jit-pytree": lambda b: ad.jit(lambda d: d["x"])({"x": b}),
    "vmap": lambda b: ad.vmap(ad.sin)(b),
    "vmap-unmapped": lambda b: ad.vmap(ad.mul, (0, None))(M23, b),
    "grad": lambda b: ad.grad(ad.sin)(b),
    "grad-extra-arg": lambda b: ad.grad(lambda x, y: x * y)(1.0, b),
    "jvp-primal": lambda b: ad.jvp(ad.sin, (b,), (1.0,)),
    "jvp-tangent": lambda b: ad.jvp(ad.sin, (1.0,), (b,)),
    "linearize": lambda b: ad.linearize(ad.sin, b),
    "vjp": lambda b: ad.vjp(ad.sin, b),
    "make_jaxpr": lambda b: ad.make_jaxpr(ad.sin, b),
    "cond-operand": lambda b: ad.cond(True, ad.sin, ad.cos, b),
    "cond-predicate": lambda b: ad.cond(b, ad.sin, ad.cos, 1.0),
    "select": lambda b: ad.select(V3 > 0.0, V3, b),
    "eval_jaxpr": lambda b: ad.eval_jaxpr(ad.make_jaxpr(ad.sin, 1.0)[0], [b]),
    "inside-jit": lambda b: ad.jit(lambda x: x * b)(V3),
}
BAD_VALUES = [("abc", r"str 'abc'"), (object(), r"object <object"), (1j, r"complex")]


@pytest.mark.parametrize("bad, given", BAD_VALUES, ids=["str", "object", "complex"])
@pytest.mark.parametrize("call", ENTRY_POINTS.values(), ids=list(ENTRY_POINTS))
def test_5_non_array_input(call, bad, given):
    """Every entry point says it expected an array and shows what it got."""
    with clear_error(TypeError, rf"(?i)expected an array.*got {given}"):
        with nothing_compiled():
            call(bad)


# ---------------------------------------------------------------------------
# 6. jvp: primal/tangent structure or shape mismatch
# ---------------------------------------------------------------------------

JVP_WRAPS = {
    "jvp": lambda f: f,
    "jvp-of-jit": lambda f: ad.jit(f),
}


@pytest.mark.parametrize("wrap", JVP_WRAPS.values(), ids=list(JVP_WRAPS))
@pytest.mark.parametrize(
    "primals, tangents, given",
    [
        ((V3, V3), (V3,), r"\(\*, \*\) and \(\*,\)"),
        (({"a": V3},), ({"b": V3},), r"\(\{'a': \*\},\) and \(\{'b': \*\},\)"),
        (((V3, V3),), ([V3, V3],), r"\(\(\*, \*\),\) and \(\[\*, \*\],\)"),
    ],
    ids=["count", "dict-keys", "tuple-vs-list"],
)
def test_6_jvp_structure_mismatch(wrap, primals, tangents, given):
    with clear_error(TypeError, rf"(?i)same structure.*{given}"):
        ad.jvp(wrap(lambda *args: args), primals, tangents)


@pytest.mark.parametrize("wrap", JVP_WRAPS.values(), ids=list(JVP_WRAPS))
@pytest.mark.parametrize(
    "primal, tangent, given, expected",
    [
        (V3, V4, r"\(4,\)", r"\(3,\)"),
        (V3, 1.0, r"\(\)", r"\(3,\)"),
        (M23, M23.T, r"\(3, 2\)", r"\(2, 3\)"),
    ],
    ids=["3-vs-4", "vector-vs-scalar", "transposed"],
)
def test_6_jvp_tangent_shape_mismatch(wrap, primal, tangent, given, expected):
    with clear_error(ValueError, rf"(?i)tangent 0 has shape {given}.*{expected}"):
        ad.jvp(wrap(ad.sin), (primal,), (tangent,))


def test_6_jvp_mismatch_inside_jit_and_vmap():
    """A bad jvp call inside jit or vmap is reported in per-example shapes."""
    with clear_error(ValueError, r"(?i)tangent 0 has shape \(4,\).*\(3,\)"):
        with nothing_compiled():
            ad.jit(lambda x: ad.jvp(ad.sin, (x,), (V4,)))(V3)
    with clear_error(ValueError, r"(?i)tangent 0 has shape \(4,\).*\(3,\)"):
        ad.vmap(lambda x: ad.jvp(ad.sin, (x,), (V4,)))(M23)


def test_6_jvp_tangent_dtype_mismatch():
    with clear_error(TypeError, r"(?i)tangent 0 has dtype float32.*float64"):
        ad.jvp(ad.sin, (V3,), (V3.astype(np.float32),))


# ---------------------------------------------------------------------------
# 7. vmap: inconsistent batch sizes, out-of-range axes, in_axes structure
# ---------------------------------------------------------------------------

VMAP_WRAPS = {
    "vmap": lambda g: g,
    "jit-of-vmap": lambda g: ad.jit(g),
    "grad-of-vmap": lambda g: (
        lambda x, *rest: ad.grad(lambda y, *r: ad.reduce_sum(g(y, *r)))(x, *rest)
    ),
}


@pytest.mark.parametrize("wrap", VMAP_WRAPS.values(), ids=list(VMAP_WRAPS))
def test_7_vmap_inconsistent_batch_sizes(wrap):
    """Both sizes are named, with the arguments they come from."""
    f = wrap(ad.vmap(ad.mul))
    with clear_error(ValueError, r"(?i)batch sizes.*size 2.*\[0\].*size 3.*\[1\]"):
        with nothing_compiled():
            f(np.ones((2, 3)), np.ones((3, 3)))


@pytest.mark.parametrize("wrap", VMAP_WRAPS.values(), ids=list(VMAP_WRAPS))
@pytest.mark.parametrize("axis", [2, -3, 7])
def test_7_vmap_in_axes_out_of_range(wrap, axis):
    """The axis, the argument's shape and its rank are named."""
    f = wrap(ad.vmap(ad.sin, axis))
    with clear_error(ValueError, rf"(?i)in_axes {axis} is out of range.*\(2, 3\).*2"):
        with nothing_compiled():
            f(M23)


@pytest.mark.parametrize("out_axes", [3, -4])
def test_7_vmap_out_axes_out_of_range(out_axes):
    with clear_error(ValueError, rf"(?i)out_axes {out_axes} is out of range.*rank 3"):
        ad.vmap(ad.sin, 0, out_axes)(np.ones((2, 3, 4)))


@pytest.mark.parametrize("wrap", VMAP_WRAPS.values(), ids=list(VMAP_WRAPS))
@pytest.mark.parametrize(
    "in_axes, args, match",
    [
        ((0,), (V3, V3), r"in_axes has 1 entries.*2 positional"),
        ((0, 0, 0), (V3, V3), r"in_axes has 3 entries.*2 positional"),
        (
            ({"a": 0}, 0),
            ({"b": V3}, V3),
            r"in_axes\[0\] has structure \{'a': \*\}.*\{'b': \*\}",
        ),
        (
            ([0, 0], 0),
            ((V3, V3), V3),
            r"in_axes\[0\] has structure \[\*, \*\].*\(\*, \*\)",
        ),
        (
            ((0, None), 0),
            (V3, V3),
            r"in_axes\[0\] has structure \(\*, None\).*structure \*",
        ),
    ],
    ids=["too-few", "too-many", "dict-keys", "list-vs-tuple", "tuple-vs-leaf"],
)
def test_7_vmap_in_axes_structure_mismatch(wrap, in_axes, args, match):
    """in_axes must be a prefix of the arguments: both structures are shown."""

    def f(*a):
        return ad.reduce_sum(ad.sin(ad.tree_flatten(a)[0][0]))

    g = wrap(ad.vmap(f, in_axes))
    with clear_error(ValueError, rf"(?i)vmap: .*{match}"):
        with nothing_compiled():
            g(*args)


# ---------------------------------------------------------------------------
# 8. cond: branches of different types or arity
# ---------------------------------------------------------------------------

COND_MISTAKES = {
    "shape": (
        lambda x: x,
        lambda x: ad.broadcast(ad.reduce_sum(x), (4,), (0,)),
        r"same types.*float64\[3\] from true_fn.*float64\[4\] from false_fn",
    ),
    "dtype": (
        lambda x: x,
        lambda x: x > 0.0,
        r"same types.*float64\[3\] from true_fn.*bool\[3\] from false_fn",
    ),
    "number-of-outputs": (
        lambda x: x,
        lambda x: (x, x),
        r"same structure.*true_fn returns \*.*false_fn returns \(\*, \*\)",
    ),
    "container": (
        lambda x: {"a": x},
        lambda x: {"b": x},
        r"same structure.*\{'a': \*\}.*\{'b': \*\}",
    ),
    "number-of-parameters": (
        lambda x, y: x * y,
        lambda x: x,
        r"true_fn cannot be called with the 1 operand",
    ),
    "false-parameters": (
        lambda x: x,
        lambda: V3,
        r"false_fn cannot be called with the 1 operand",
    ),
}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case", COND_MISTAKES, ids=list(COND_MISTAKES))
def test_8_cond_branches_differ(mode, case):
    """Both branches' types (or the arity) are named, while tracing."""
    true_fn, false_fn, match = COND_MISTAKES[case]

    def f(x):
        out = ad.cond(ad.reduce_sum(x) > 0.0, true_fn, false_fn, x)
        return ad.tree_flatten(out)[0][0]

    with clear_error(TypeError, rf"(?i)cond: .*{match}"):
        with in_mode(mode):
            under(mode, f)(V3)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(
    "pred, given",
    [
        (lambda x: x > 0.0, r"bool\[3\]"),
    ],
    ids=["vector"],
)
def test_8_cond_bad_predicate(mode, pred, given):
    """The predicate must be a boolean scalar: bool[] and what it was."""
    f = under(mode, lambda x: ad.cond(pred(x), ad.sin, ad.cos, x))
    with clear_error(TypeError, rf"(?i)predicate must be a .*scalar.*got {given}"):
        with in_mode(mode):
            f(V3)


# ---------------------------------------------------------------------------
# 9. Bad axis / perm / shape parameters
# ---------------------------------------------------------------------------

BAD_PARAMS = {
    "reduce_sum-axis": (
        lambda x: ad.reduce_sum(x, 2),
        ValueError,
        r"axis 2 is out of range.*rank 2",
    ),
    "reduce_sum-negative": (
        lambda x: ad.reduce_sum(x, -3),
        ValueError,
        r"axis -3 is out of range.*rank 2",
    ),
    "reduce_sum-repeated": (
        lambda x: ad.reduce_sum(x, (1, -1)),
        ValueError,
        r"repeated.*\(1, -1\)",
    ),
    "reduce_sum-type": (
        lambda x: ad.reduce_sum(x, "0"),
        TypeError,
        r"integers.*'0'",
    ),
    "transpose-short": (
        lambda x: ad.transpose(x, (0,)),
        ValueError,
        r"perm \(0,\) is not a permutation of the axes of \w+\[2,3\]",
    ),
    "transpose-repeated": (
        lambda x: ad.transpose(x, (1, 1)),
        ValueError,
        r"perm \(1, 1\) is not a permutation of the axes of \w+\[2,3\]",
    ),
    "transpose-range": (
        lambda x: ad.transpose(x, (0, 2)),
        ValueError,
        r"2 is out of range.*rank 2",
    ),
    "broadcast-shape": (
        lambda x: ad.broadcast(x, (4, 4), (0,)),
        ValueError,
        r"shape \(2, 3\) to shape \(4, 4\)",
    ),
    "broadcast-axes": (
        lambda x: ad.broadcast(x, (2, 3, 4), (3,)),
        ValueError,
        r"3 is out of range.*rank 3",
    ),
    "broadcast-negative-dim": (
        lambda x: ad.broadcast(x, (-1, 2, 3), (0,)),
        ValueError,
        r"negative.*-1",
    ),
}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case", BAD_PARAMS, ids=list(BAD_PARAMS))
def test_9_bad_parameters(mode, case):
    """The parameter, its value and the input's rank or shape are named, in
    per-example terms under vmap."""
    fn, exc, match = BAD_PARAMS[case]
    f = under(mode, lambda x: ad.sin(fn(x)))
    with clear_error(exc, rf"(?i){match}"):
        with in_mode(mode):
            f(M23)


# ---------------------------------------------------------------------------
# 10. A tracer leaked out of its transformation and used later
# ---------------------------------------------------------------------------


def leak(transformation: str, scalar: bool = False) -> ad.Tracer:
    """Run a transformation whose function stores its traced argument in a
    list (a stand-in for a global), and return that tracer (a float64[3], or
    a float64[] with ``scalar``)."""
    box = []
    x = np.float64(0.5) if scalar else V3

    def f(x):
        box.append(x)
        return ad.reduce_sum(ad.sin(x))

    if transformation == "jit":
        ad.jit(f)(x)
    elif transformation == "jvp":
        ad.jvp(f, (x,), (x,))
    elif transformation == "vmap":
        ad.vmap(f)(np.stack([x, x]))
    elif transformation == "grad":
        ad.grad(f)(x)
    elif transformation == "linearize":
        ad.linearize(f, x)
    elif transformation == "vjp":
        ad.vjp(f, x)
    elif transformation == "make_jaxpr":
        ad.make_jaxpr(f, x)
    elif transformation == "cond-branch":
        ad.cond(True, f, lambda x: ad.reduce_sum(x), x)
    elif transformation == "cond-branch-in-jit":
        ad.jit(lambda y: ad.cond(ad.reduce_sum(y) > 0.0, f, ad.reduce_sum, y))(x)
    elif transformation == "jit-in-grad":
        ad.grad(ad.jit(f))(x)
    else:
        raise ValueError(transformation)
    (tracer,) = box
    assert isinstance(tracer, ad.Tracer)
    assert tracer.shape == np.shape(x)
    return tracer


LEAKING = ["jit", "jvp", "vmap", "grad", "linearize", "vjp", "make_jaxpr"]
LEAKING += ["cond-branch", "cond-branch-in-jit", "jit-in-grad"]

LEAK_USES = {
    "primitive": lambda t: ad.sin(t),
    "operator": lambda t: t * 2.0,
    "with-array": lambda t: ad.add(V3, t),
    "comparison": lambda t: t > 0.0,
    "jit-closure": lambda t: ad.jit(lambda y: y + t)(V3),
    "jit-return": lambda t: ad.jit(lambda y: t)(V3),
    "jit-argument": lambda t: ad.jit(ad.sin)(t),
    "vmap-argument": lambda t: ad.vmap(ad.sin)(t),
    "vmap-closure": lambda t: ad.vmap(lambda y: y * t)(np.ones((2, 3))),
    "grad-argument": lambda t: ad.grad(lambda y: ad.reduce_sum(y))(t),
    "grad-closure": lambda t: ad.grad(lambda y: ad.reduce_sum(y * t))(V3),
    "jvp-primal": lambda t: ad.jvp(ad.sin, (t,), (V3,)),
    "cond-operand": lambda t: ad.cond(True, ad.sin, ad.cos, t),
    "cond-closure": lambda t: ad.cond(True, lambda y: y * t, ad.cos, V3),
    "cond-return": lambda t: ad.cond(False, ad.sin, lambda y: t, V3),
    "make_jaxpr-closure": lambda t: ad.make_jaxpr(lambda y: y * t, V3),
}


@pytest.mark.parametrize("use", LEAK_USES.values(), ids=list(LEAK_USES))
@pytest.mark.parametrize("transformation", LEAKING)
def test_10_leaked_tracer_used_later(transformation, use):
    """UnexpectedTracerError that says a traced value escaped."""
    tracer = leak(transformation)
    with clear_error(ad.UnexpectedTracerError, r"(?i)escaped its transformation"):
        use(tracer)


@pytest.mark.parametrize("convert", [bool, np.asarray], ids=["bool", "np.asarray"])
@pytest.mark.parametrize(
    "transformation", ["jit", "jvp", "vmap", "grad", "cond-branch"]
)
def test_10_leaked_tracer_converted_by_python(transformation, convert):
    """Turning a leaked (scalar) tracer into a Python bool or a NumPy array is
    a use after its transformation finished too, and must say so: not return
    the primal's truth value, and not blame a traced value or a batch."""
    tracer = leak(transformation, scalar=True)
    with clear_error(ad.UnexpectedTracerError, r"(?i)escaped its transformation"):
        convert(tracer)


def test_10_tracer_leaked_from_inner_transformation_into_running_outer_one():
    """A tracer of a finished inner jit or cond, used while the outer jit is
    still tracing, is caught too."""

    def outer(x):
        box = []
        ad.cond(True, lambda y: box.append(y) or y, lambda y: y, x)
        return x + box[0]

    with clear_error(ad.UnexpectedTracerError, r"(?i)escaped its transformation"):
        with nothing_compiled():
            ad.jit(outer)(V3)


# ---------------------------------------------------------------------------
# 11. grad with respect to an integer input
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "x, name",
    [
        (3, "int64"),
        (np.arange(3), "int64"),
        (np.int32(2), "int32"),
        (True, "bool"),
        ({"w": 1.0, "n": 2}, "int64"),
    ],
    ids=["python-int", "int-array", "int32", "bool", "int-in-pytree"],
)
@pytest.mark.parametrize(
    "wrap",
    [
        lambda g: g,
        lambda g: ad.jit(g),
        lambda g: lambda x: ad.vmap(g)(ad.tree_unflatten(*_stacked(x))),
    ],
    ids=["grad", "jit-of-grad", "vmap-of-grad"],
)
def test_11_grad_with_respect_to_integer_input(x, name, wrap):
    """grad says it needs float inputs and names the dtype it got."""

    def f(x):
        return ad.reduce_sum(ad.tree_flatten(x)[0][0] * 1.0)

    with clear_error(TypeError, rf"(?i)float inputs.*{name}"):
        with nothing_compiled():
            wrap(ad.grad(f))(x)


def _stacked(tree):
    """``tree`` with every leaf stacked twice (a batch of two)."""
    leaves, treedef = ad.tree_flatten(tree)
    return treedef, [np.stack([np.asarray(leaf)] * 2) for leaf in leaves]


# ---------------------------------------------------------------------------
# 12. Wrong cotangent / tangent shapes given to vjp / linearize results
# ---------------------------------------------------------------------------


def _f(x):
    return {"y": ad.sin(x), "total": ad.reduce_sum(x)}


@pytest.mark.parametrize("jitted", [False, True], ids=["f", "jit-f"])
@pytest.mark.parametrize(
    "cts, exc, match",
    [
        (
            {"y": V4, "total": 1.0},
            ValueError,
            r"cotangent 1 should be float64\[3\].*got float64\[4\]",
        ),
        (
            {"y": V3, "total": V3},
            ValueError,
            r"cotangent 0 should be float64\[\].*got float64\[3\]",
        ),
        (
            {"y": V3.astype(np.float32), "total": 1.0},
            ValueError,
            r"cotangent 1 should be float64\[3\].*got float32\[3\]",
        ),
        (
            {"y": V3},
            TypeError,
            r"structure of f's output.*\{'total': \*, 'y': \*\}.*got \{'y': \*\}",
        ),
        (
            (V3, 1.0),
            TypeError,
            r"structure of f's output.*\{'total': \*, 'y': \*\}.*got \(\*, \*\)",
        ),
    ],
    ids=["shape", "scalar-shape", "dtype", "missing-key", "tuple-for-dict"],
)
def test_12_vjp_wrong_cotangents(jitted, cts, exc, match):
    """The cotangent's expected type (the output's) and the given one."""
    _, f_vjp = ad.vjp(ad.jit(_f) if jitted else _f, V3)
    with clear_error(exc, rf"(?i)vjp: .*{match}"):
        f_vjp(cts)


@pytest.mark.parametrize("jitted", [False, True], ids=["f", "jit-f"])
@pytest.mark.parametrize(
    "tangents, exc, match",
    [
        ((V4,), ValueError, r"tangent 0 has shape \(4,\).*primal has shape \(3,\)"),
        ((1.0,), ValueError, r"tangent 0 has shape \(\).*primal has shape \(3,\)"),
        (
            (V3.astype(np.float32),),
            TypeError,
            r"tangent 0 has dtype float32.*primal has dtype float64",
        ),
        ((V3, V3), TypeError, r"structure of the primals, \(\*,\), got \(\*, \*\)"),
    ],
    ids=["shape", "scalar", "dtype", "count"],
)
def test_12_linearize_wrong_tangents(jitted, tangents, exc, match):
    _, f_lin = ad.linearize(ad.jit(_f) if jitted else _f, V3)
    with clear_error(exc, rf"(?i)linearize: .*{match}"):
        f_lin(*tangents)


# ---------------------------------------------------------------------------
# 13. A jitted function returning a non-array
# ---------------------------------------------------------------------------

NON_ARRAY_OUTPUTS = {
    "str": (lambda x: "abc", r"str 'abc'"),
    "object": (lambda x: object(), r"object <object"),
    "function": (lambda x: ad.sin, r"function <function sin"),
    "str-in-dict": (lambda x: {"out": x, "note": "abc"}, r"str 'abc'"),
    "str-in-tuple": (lambda x: (x, "abc"), r"str 'abc'"),
}


@pytest.mark.parametrize(
    "wrap",
    [
        lambda g: g,
        lambda g: ad.jit(g),
        lambda g: lambda x: ad.vmap(g)(np.stack([x, x])),
        lambda g: lambda x: ad.jvp(g, (x,), (x,)),
        lambda g: (
            lambda x: ad.grad(lambda y: ad.reduce_sum(ad.tree_flatten(g(y))[0][0]))(x)
        ),
    ],
    ids=["jit", "jit-of-jit", "vmap-of-jit", "jvp-of-jit", "grad-of-jit"],
)
@pytest.mark.parametrize("case", NON_ARRAY_OUTPUTS, ids=list(NON_ARRAY_OUTPUTS))
def test_13_jitted_function_returning_non_array(case, wrap):
    """jit names the output and shows what it was, while tracing."""
    fn, given = NON_ARRAY_OUTPUTS[case]
    with clear_error(TypeError, rf"(?i)jit: output.*expected an array.*got {given}"):
        with nothing_compiled():
            wrap(ad.jit(fn))(V3)


def test_13_a_python_number_or_container_of_arrays_is_fine():
    """Numbers and containers of arrays are valid outputs of a jitted function."""
    out = ad.jit(lambda x: {"x": x, "two": 2.0, "pair": (x, x * 2.0)})(V3)
    np.testing.assert_allclose(out["two"], 2.0)
    np.testing.assert_allclose(out["pair"][1], 2.0 * V3)


# ---------------------------------------------------------------------------
# The named error classes
# ---------------------------------------------------------------------------


def test_named_error_classes_are_type_errors():
    for cls in (ad.ConcretizationError, ad.UnexpectedTracerError, ad.JaxprTypeError):
        assert issubclass(cls, TypeError)
        assert not issubclass(cls, INTERNAL)


# ---------------------------------------------------------------------------
# 14. Loops (Part 6): a body returning a carry of another type, a condition
#     that is not a boolean scalar, reverse mode through while_loop
# ---------------------------------------------------------------------------


def _total(v):
    return ad.reduce_sum(v, 0)


LOOP_BODIES = {
    "shape": (lambda v: _total(v), r"float64\[3\], but it returned float64\[\]"),
    "dtype": (
        lambda v: ad.convert_element_type(v, np.float32),
        r"float64\[3\], but it returned float32\[3\]",
    ),
    "structure": (
        lambda v: (v, v),
        r"float64\[3\], but it returned \(float64\[3\], float64\[3\]\)",
    ),
}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case", LOOP_BODIES, ids=list(LOOP_BODIES))
def test_14_loop_body_returning_another_carry_type(case, mode):
    body, names = LOOP_BODIES[case]

    def f(x):
        return ad.while_loop(lambda v: _total(v) > 100.0, body, x)

    with clear_error(TypeError, rf"while_loop: body_fun must return .*{names}"):
        with in_mode(mode):
            under(mode, f)(V3)


LOOP_CONDITIONS = {
    "float": (lambda v: _total(v), r"float64\[\]"),
    "vector": (lambda v: v > 0.0, r"bool\[3\]"),
    "pair": (lambda v: (_total(v) > 0.0, _total(v) > 1.0), r"\(bool\[\], bool\[\]\)"),
}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case", LOOP_CONDITIONS, ids=list(LOOP_CONDITIONS))
def test_14_loop_condition_not_a_boolean_scalar(case, mode):
    cond_fun, returned = LOOP_CONDITIONS[case]

    def f(x):
        return ad.while_loop(cond_fun, lambda v: v * 1.5, x)

    match = rf"while_loop: cond_fun must return a boolean scalar .*returned {returned}"
    with clear_error(TypeError, match):
        with in_mode(mode):
            under(mode, f)(V3)


def _growing(x):
    return ad.while_loop(lambda v: _total(v) < 10.0, lambda v: v * 1.5, x)


@pytest.mark.parametrize(
    "run",
    [
        under("grad", _growing),
        under("jit-of-grad", _growing),
        under("grad-of-jit", _growing),
        lambda x: ad.vjp(_growing, x),
        lambda x: ad.linearize(_growing, x),
        lambda x: ad.grad(
            lambda x: ad.fori_loop(0, np.int64(3), lambda i, c: c * x, x)
        )(1.5),
    ],
    ids=["grad", "jit-of-grad", "grad-of-jit", "vjp", "linearize", "fori_loop"],
)
def test_14_reverse_mode_through_while_loop(run):
    with clear_error(
        ad.WhileLoopReverseModeError, r"trip count .* Use scan, or\s+fori_loop"
    ):
        run(V3)
    assert issubclass(ad.WhileLoopReverseModeError, TypeError)


# ---------------------------------------------------------------------------
# 15. scan (Part 7): xs leaves with different leading lengths, a length that
#     disagrees with xs, neither xs nor length, a body changing the carry's
#     type, a body returning something other than a pair
# ---------------------------------------------------------------------------


def _scan_case(body, xs, length=None):
    """A function of one array that scans ``body`` over ``xs(x)``, with the
    sum of x as the initial carry (so the carry is traced in every mode)."""

    def f(x):
        carry, _ = ad.scan(body, _total(x), xs(x), length=length)
        return carry * x

    return f


SCAN_ERRORS = {
    "xs-lengths": (
        _scan_case(lambda c, r: (c, r), lambda x: (x, ad.reduce_sum(M23, 1))),
        ValueError,
        r"scan: the leaves of xs must share one leading length, got "
        r"float64\[3\], float64\[2\]",
    ),
    "length-disagrees": (
        _scan_case(lambda c, r: (c, r), lambda x: x, length=5),
        ValueError,
        r"scan: length=5 disagrees with the leading length of xs, 3",
    ),
    "no-xs-no-length": (
        _scan_case(lambda c, r: (c, c), lambda x: None),
        ValueError,
        r"scan: with no xs, give the number of trips as length=",
    ),
    "carry-type": (
        _scan_case(lambda c, r: (c * V3, r), lambda x: x),
        TypeError,
        r"scan: f must return a carry of the type it is given, float64\[\], but "
        r"it returned float64\[3\]",
    ),
    "carry-structure": (
        _scan_case(lambda c, r: ((c, c), r), lambda x: x),
        TypeError,
        r"float64\[\], but it returned \(float64\[\], float64\[\]\)",
    ),
    "not-a-pair": (
        _scan_case(lambda c, r: c + r, lambda x: x),
        TypeError,
        r"scan: f must return a pair \(carry, y\), but it returned float64\[\]",
    ),
}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case", SCAN_ERRORS, ids=list(SCAN_ERRORS))
def test_15_scan_mistakes(case, mode):
    f, exc_type, match = SCAN_ERRORS[case]
    with clear_error(exc_type, match):
        with in_mode(mode):
            under(mode, f)(V3)


def test_15_reverse_mode_through_scan_and_static_fori_loop_works():
    """The counterpart of section 14: scan and fori_loop with Python-int
    bounds have reverse mode."""

    def f(x):
        _, ys = ad.scan(lambda c, r: (c * r, ad.sin(c)), 1.0, x)
        return ad.fori_loop(0, 3, lambda i, c: c * _total(x), _total(ys))

    for mode in ("grad", "jit-of-grad", "grad-of-jit"):
        under(mode, f)(V3)
    assert_usable()


# ---------------------------------------------------------------------------
# 16. Custom derivative rules (Part 8): jvp of a custom_vjp function, and a
#     rule returning the wrong structure, shape or dtype
# ---------------------------------------------------------------------------


def _clipped(x):
    """A custom_vjp function: the identity, with a backward pass that clips."""
    return _clip_gradient(x, 0.5)


_clip_gradient = ad.custom_vjp(lambda x, bound: x, nondiff_argnums=(1,))
_clip_gradient.defvjp(
    lambda x, bound: (x, None),
    lambda bound, res, ct: (
        ad.maximum(-bound, ad.neg(ad.maximum(-bound, ad.neg(ct)))),
    ),
)


@pytest.mark.parametrize(
    "run",
    [
        lambda x: ad.jvp(_clipped, (x,), (x,)),
        lambda x: ad.vmap(lambda y: ad.jvp(_clipped, (y,), (y,)))(np.stack([x, x])),
        lambda x: ad.jit(lambda y: ad.jvp(_clipped, (y,), (y,)))(x),
        lambda x: ad.linearize(_clipped, x)[1](x),
    ],
    ids=["jvp", "vmap-of-jvp", "jit-of-jvp", "linearize's linear map"],
)
def test_16_jvp_of_a_custom_vjp_function(run):
    with clear_error(
        ad.CustomVJPForwardModeError,
        r"jvp of <lambda>, a custom_vjp function: it has only a reverse-mode rule",
    ):
        run(V3)
    assert issubclass(ad.CustomVJPForwardModeError, TypeError)
    # reverse mode works, in every composition
    np.testing.assert_allclose(
        under("grad", _clipped)(V3), np.clip(np.cos(V3), -0.5, 0.5), rtol=1e-12
    )


def _with_jvp_rule(rule):
    f = ad.custom_jvp(lambda x: ad.sin(x))
    f.defjvp(rule)
    return f


BAD_RULES = {
    "structure": (
        lambda p, t: ((ad.sin(p[0]), p[0]), t[0]),
        r"primal output must be float64\[3\], but it is \(float64\[3\], float64\[3\]\)",
    ),
    "shape": (
        lambda p, t: (ad.sin(p[0]), ad.reduce_sum(t[0], 0)),
        r"tangent output must be float64\[3\], but it is float64\[\]",
    ),
    "dtype": (
        lambda p, t: (ad.sin(p[0]), ad.convert_element_type(t[0], np.float32)),
        r"tangent output must be float64\[3\], but it is float32\[3\]",
    ),
}


@pytest.mark.parametrize("mode", ["grad", "jit-of-grad", "grad-of-jit"])
@pytest.mark.parametrize("case", BAD_RULES, ids=list(BAD_RULES))
def test_16_rule_returning_the_wrong_type(case, mode):
    rule, names = BAD_RULES[case]
    f = _with_jvp_rule(rule)
    with clear_error(TypeError, rf"<lambda>: the custom_jvp rule's {names}"):
        with in_mode(mode):
            under(mode, f)(V3)


def test_16_bwd_returning_the_wrong_structure():
    g = ad.custom_vjp(lambda x: ad.sin(x))
    g.defvjp(lambda x: (ad.sin(x), ad.cos(x)), lambda c, ct: ct * c)  # not a tuple
    match = r"one cotangent per differentiable argument\) must be \(float64\[3\],\)"
    for mode in ["grad", "jit-of-grad", "grad-of-jit"]:
        with clear_error(TypeError, match):
            # bwd runs in the backward pass: under grad-of-jit, after the
            # forward pass has been compiled and run
            with in_mode(mode if mode != "grad-of-jit" else "eager"):
                under(mode, g)(V3)


# ---------------------------------------------------------------------------
# 17. Named axes and pmap (Part 9): a collective naming an axis that no
#     enclosing vmap or pmap binds, pmap over more rows than devices, pmap
#     over arguments whose leading sizes differ
# ---------------------------------------------------------------------------

COLLECTIVES = {
    "psum": lambda x: ad.psum(x, "j"),
    "pmean": lambda x: ad.pmean(x, "j"),
    "pmax": lambda x: ad.pmax(x, "j"),
    "all_gather": lambda x: ad.all_gather(x, "j"),
    "axis_index": lambda x: x * ad.convert_element_type(ad.axis_index("j"), x.dtype),
}


@pytest.mark.parametrize("mode", [*MODES, "vmap-named-i", "pmap-named-i"])
@pytest.mark.parametrize("which", COLLECTIVES, ids=list(COLLECTIVES))
def test_17_collective_with_an_unbound_axis_name(which, mode):
    """The error names the collective and the axis, is raised while tracing
    (under jit: before anything is lowered), and is a NameError as in JAX."""
    f = COLLECTIVES[which]
    if mode == "vmap-named-i":
        run = lambda x: ad.vmap(f, axis_name="i")(np.stack([x, x]))  # noqa: E731
    elif mode == "pmap-named-i":
        run = lambda x: ad.pmap(f, axis_name="i")(np.stack([x, x]))  # noqa: E731
    else:
        run = under(mode, f)
    with clear_error(ad.UnboundAxisError, rf"{which}.*'j'") as info:
        with in_mode(mode):
            run(V3)
    assert isinstance(info.value, NameError)
    assert issubclass(ad.UnboundAxisError, NameError)


def test_17_pmap_over_more_rows_than_devices():
    rows = len(ad.devices()) + 1
    match = rf"(?s)(?=.*\b{rows}\b)(?=.*\b{rows - 1}\b)(?=.*device)"
    with clear_error(ValueError, match):
        ad.pmap(lambda x: x * 2.0)(np.zeros((rows, 3)))


def test_17_pmap_over_mismatched_leading_sizes():
    with clear_error(ValueError, r"(?s)(?=.*\b3\b)(?=.*\b4\b)"):
        ad.pmap(lambda x, y: x + y)(V3, V4)
    with clear_error(ValueError, r"(?s)(?=.*\b2\b)(?=.*\b3\b)"):
        ad.pmap(lambda x, y: x * y, in_axes=(0, 1))(M23, M23)


def test_17_pmap_inside_another_pmap():
    """Refused when the enclosing program is lowered, with what to do instead
    (pmap inside jit runs, as in JAX: tests/test_api_corners.py)."""
    inner = ad.pmap(lambda x: ad.psum(x, "i"), axis_name="i")
    rows = np.stack([V3, V3])
    with clear_error(ad.PmapInsideJitError, r"pmap inside another pmap.*use vmap"):
        ad.pmap(inner, axis_name="j")(np.stack([rows, rows]))
    assert issubclass(ad.PmapInsideJitError, TypeError)


# ---------------------------------------------------------------------------
# 18. Python's protocols on a traced value: float(), int(), use as an index,
#     hash(), len() and iteration of a 0-d value. Each raises an error that
#     names the traced value (never Python's "must be a real number", never
#     a silent fallback such as hashing by identity)
# ---------------------------------------------------------------------------

PROTOCOLS = {
    "float": (lambda x: float(x), ad.ConcretizationError, r"float\(\).*traced float64"),
    "int": (lambda x: int(x), ad.ConcretizationError, r"int\(\).*traced float64"),
    "index": (
        lambda x: [1.0, 2.0][ad.convert_element_type(x, np.int64)],
        ad.ConcretizationError,
        r"(?s)index.*traced int64.*Python int",
    ),
    "hash": (lambda x: hash(x), TypeError, r"unhashable type: \w*Tracer"),
    "dict-key": (lambda x: {x: 1}, TypeError, r"unhashable type: \w*Tracer"),
    "len-0d": (lambda x: len(x), TypeError, r"len\(\) of unsized object.*float64\[\]"),
    "iter-0d": (lambda x: list(x), TypeError, r"iteration over a 0-d.*float64\[\]"),
}


@pytest.mark.parametrize("mode", ["jit", "vmap", "grad", "jit-of-grad"])
@pytest.mark.parametrize("which", PROTOCOLS, ids=list(PROTOCOLS))
def test_18_python_protocol_on_a_traced_value(which, mode):
    protocol, exc_type, match = PROTOCOLS[which]

    def f(x):
        protocol(ad.reduce_sum(x))
        return x

    with clear_error(exc_type, match):
        with in_mode(mode):
            under(mode, f)(V3)


def test_18_device_arrays_are_unhashable_and_compare_elementwise():
    a = ad.jit(lambda x: x * 1.0)(V3)
    with clear_error(TypeError, r"unhashable type: Array \(.*float64\[3\]"):
        hash(a)
    np.testing.assert_array_equal(np.asarray(a == 0.5), V3 == 0.5)
