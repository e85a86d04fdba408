"""Bad input to cond and select gets a clear error (SPEC section 5).

Each case checks the exception's type (TypeError, ValueError or a named
subclass, never an internal AssertionError/KeyError/AttributeError), its
message, and that the interpreter is usable afterwards: cond still evaluates,
compiles, differentiates and batches correctly. Mistakes in a call of cond are
reported while tracing, before anything is compiled, under every
transformation. A user's own exception raised in a branch propagates unchanged.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import raises_clearly
from jax import lax

import autodidax as ad
from autodidax import Jaxpr, JaxprEqn, JaxprTypeError, ShapedArray, Var

pytestmark = pytest.mark.usefixtures("clean_interpreter_stack")

TOL = 1e-9
F64 = np.float64
ONE = np.float64(1.0)
VEC = np.array([0.5, -1.0, 2.0])
SCALAR = ShapedArray((), F64)
VEC3 = ShapedArray((3,), F64)
BOOL = ShapedArray((), np.bool_)


def _kinked(cond, sin, cos):
    return lambda x: cond(x > 0.0, lambda x: sin(x) * x, lambda x: cos(x) * 3.0, x)


KINKED = _kinked(ad.cond, ad.sin, ad.cos)
KINKED_JAX = _kinked(lax.cond, jnp.sin, jnp.cos)


KINKED_JIT = ad.jit(KINKED)  # traced and compiled once, then reused


USABLE_XS = np.array([1.2, -0.5, 0.3])


@functools.cache
def usable_references() -> tuple[np.ndarray, np.ndarray]:
    """JAX's values and derivatives of the kinked function at USABLE_XS."""
    both = jax.jit(jax.vmap(lambda x: (KINKED_JAX(x), jax.grad(KINKED_JAX)(x))))
    return tuple(np.asarray(r) for r in both(USABLE_XS))


def assert_interpreter_usable() -> None:
    """Only the evaluation level is on the stack and it is the dynamic level;
    cond works eagerly, staged (a fresh trace), compiled, under grad and vmap
    (with a batched predicate), and staging still records constant-only work."""
    assert len(ad._state.stack) == 1
    assert ad._state.dynamic is ad._state.stack[0]
    values, slopes = usable_references()
    jaxpr, consts, _ = ad.make_jaxpr(KINKED, SCALAR)
    assert [e.primitive.name for e in jaxpr.eqns] == ["gt", "cond"]
    for x, value, slope in zip(USABLE_XS[:2], values, slopes):
        np.testing.assert_allclose(KINKED(x), value, rtol=TOL)
        np.testing.assert_allclose(
            ad.eval_jaxpr(jaxpr, [*consts, x])[0], value, rtol=TOL
        )
        np.testing.assert_allclose(KINKED_JIT(x), value, rtol=TOL)
        np.testing.assert_allclose(ad.grad(KINKED)(x), slope, rtol=TOL)
    np.testing.assert_allclose(ad.vmap(ad.grad(KINKED))(USABLE_XS), slopes, rtol=TOL)
    jaxpr, _, _ = ad.make_jaxpr(lambda: ad.mul(2.0, 2.0))
    assert [e.primitive.name for e in jaxpr.eqns] == ["mul"]
    assert len(ad._state.stack) == 1
    assert ad._state.dynamic is ad._state.stack[0]


def _nested(cond, sin, cos):
    def f(x, w):
        inner = lambda x: cond(x > 1.0, lambda x: sin(x) * w, cos, x)  # noqa: E731
        return cond(x > 0.0, inner, lambda x: x * w, x)

    return f


NESTED, NESTED_JAX = (
    _nested(ad.cond, ad.sin, ad.cos),
    _nested(lax.cond, jnp.sin, jnp.cos),
)
NESTED_XS, NESTED_W = np.array([1.7, 0.4, -0.8]), np.float64(1.5)


@functools.cache
def nested_references() -> tuple[np.ndarray, np.ndarray]:
    both = jax.jit(
        jax.vmap(lambda x, w: (NESTED_JAX(x, w), jax.grad(NESTED_JAX)(x, w)), (0, None))
    )
    return tuple(np.asarray(r) for r in both(NESTED_XS, NESTED_W))


def assert_new_transformations_work() -> None:
    """A new jit (traced and compiled now), grad and vmap of a function with
    a nested cond give JAX's answers."""
    values, slopes = nested_references()
    xs, w = NESTED_XS, NESTED_W
    np.testing.assert_allclose(
        ad.jit(ad.vmap(NESTED, (0, None)))(xs, w), values, rtol=TOL
    )
    np.testing.assert_allclose(
        ad.vmap(ad.grad(NESTED), (0, None))(xs, w), slopes, rtol=TOL
    )
    f_jit = ad.jit(NESTED)
    for x, value, slope in zip(xs, values, slopes):
        np.testing.assert_allclose(f_jit(x, w), value, rtol=TOL)
        np.testing.assert_allclose(ad.grad(NESTED)(x, w), slope, rtol=TOL)


def clear_error(exc_type: type | tuple[type, ...], match: str):
    """Expect a clear error, then check the interpreter is still usable."""
    return raises_clearly(exc_type, match, then=assert_interpreter_usable)


# How a call of cond is reached: directly, or while some transformation traces
# the function that calls it. ``f`` takes one float64[3] argument.
TRANSFORMS: dict[str, Callable[[Callable], Any]] = {
    "eager": lambda f: f(VEC),
    "jit": lambda f: ad.jit(f)(VEC),
    "jit-of-jit": lambda f: ad.jit(lambda x: ad.jit(f)(x) + 1.0)(VEC),
    "make_jaxpr": lambda f: ad.make_jaxpr(f, VEC3),
    "jvp": lambda f: ad.jvp(f, (VEC,), (VEC,)),
    "vmap": lambda f: ad.vmap(f)(np.stack([VEC, -VEC])),
    "grad": lambda f: ad.grad(lambda x: ad.reduce_sum(f(x)))(VEC),
    "linearize": lambda f: ad.linearize(f, VEC),
    "vjp": lambda f: ad.vjp(f, VEC),
    "grad-of-jit": lambda f: ad.grad(ad.jit(lambda x: ad.reduce_sum(f(x))))(VEC),
    "jit-of-grad": lambda f: ad.jit(ad.grad(lambda x: ad.reduce_sum(f(x))))(VEC),
    "vmap-of-grad": lambda f: ad.vmap(ad.grad(lambda x: ad.reduce_sum(f(x))))(
        np.stack([VEC, -VEC])
    ),
}
SOME_TRANSFORMS = ["eager", "jit", "vmap", "grad", "jvp", "jit-of-grad"]


def positive(x):
    return ad.reduce_sum(x) > 0.0


# ---------------------------------------------------------------------------
# The predicate
# ---------------------------------------------------------------------------


def test_number_predicate_is_true_when_nonzero():
    """A number is accepted as JAX does (nonzero is true); the differential tests
    are in tests/test_custom_rules_semantics.py."""
    cases = [(1, True), (0, False), (np.uint8(1), True), (np.float32(0.0), False)]
    for pred, want in cases:
        np.testing.assert_allclose(
            ad.cond(pred, ad.sin, ad.cos, ONE), np.sin(1.0) if want else np.cos(1.0)
        )


@pytest.mark.parametrize(
    "pred, got",
    [
        (np.array([True, False, True]), r"bool\[3\]"),
        (np.array([True]), r"bool\[1\]"),
        (np.ones((2, 2), bool), r"bool\[2, ?2\]"),
    ],
    ids=["bool3", "bool1", "matrix"],
)
def test_non_scalar_predicate(pred, got):
    """Says what was given, that a scalar is needed, and what to use instead."""
    with clear_error(
        TypeError, rf"(?s)predicate must be a boolean scalar.*{got}.*select.*vmap"
    ):
        ad.cond(pred, ad.sin, ad.cos, ONE)


@pytest.mark.parametrize(
    "pred, got",
    [("yes", "str"), (None, "NoneType"), ([True], "list"), ({"p": True}, "dict")],
    ids=["string", "none", "list", "dict"],
)
def test_predicate_that_is_not_an_array(pred, got):
    with clear_error(
        TypeError, rf"(?s)predicate.*expected an array or a number.*{got}"
    ):
        ad.cond(pred, ad.sin, ad.cos, ONE)


@pytest.mark.parametrize("transform", list(TRANSFORMS))
@pytest.mark.parametrize(
    "make_pred, got",
    [
        (lambda x: x > 0.0, r"bool\[3\]"),
    ],
    ids=["bool3"],
)
def test_bad_predicate_under_transformations(transform, make_pred, got):
    """A traced float or non-scalar predicate is caught while tracing (under
    vmap the message names the per-example type)."""

    def f(x):
        return ad.cond(make_pred(x), lambda x: x * 2.0, ad.neg, x)

    with clear_error(TypeError, rf"(?s)cond: the predicate must be.*{got}"):
        TRANSFORMS[transform](f)


def test_bad_predicate_under_jit_compiles_nothing_and_caches_no_trace(compilations):
    body_calls = []

    def body(x):
        body_calls.append(1)
        return ad.cond(x, ad.sin, ad.cos, x)

    f = ad.jit(body)
    with pytest.raises(TypeError, match=r"predicate must be a boolean.*bool\[3\]"):
        f(VEC > 0.0)
    assert compilations == []
    assert len(f.traces) == 0
    with pytest.raises(
        TypeError, match=r"predicate must be a boolean scalar.*bool\[3\]"
    ):
        ad.jit(lambda x: ad.cond(x > 0.0, ad.sin, ad.cos, x))(VEC)
    assert compilations == []
    assert_interpreter_usable()


# ---------------------------------------------------------------------------
# Branches of different types: structure, number of outputs, shapes, dtypes
# ---------------------------------------------------------------------------

MISMATCHED_BRANCHES = [
    (lambda x: x, lambda x: (x, x), r"same structure.*\*.*\(\*, \*\)", "leaf-vs-tuple"),
    (
        lambda x: (x, x),
        lambda x: (x, x, x),
        r"same structure.*\(\*, \*\).*\(\*, \*, \*\)",
        "two-vs-three-outputs",
    ),
    (
        lambda x: [x],
        lambda x: (x,),
        r"same structure.*\[\*\].*\(\*,\)",
        "list-vs-tuple",
    ),
    (
        lambda x: {"a": x},
        lambda x: {"b": x},
        r"same structure.*'a'.*'b'",
        "dict-keys",
    ),
    (
        lambda x: (x, None),
        lambda x: (x, x),
        r"same structure.*None",
        "none-vs-leaf",
    ),
    (
        lambda x: x,
        lambda x: ad.reduce_sum(x),
        r"same types.*output 0.*float64\[3\].*float64\[\]",
        "shape",
    ),
    (
        lambda x: (x, x),
        lambda x: (x, ad.broadcast(x, (2, 3), (0,))),
        r"same types.*output 1.*float64\[3\].*float64\[2, ?3\]",
        "shape-of-second-output",
    ),
    (lambda x: x, lambda x: x > 0.0, r"same types.*float64\[3\].*bool\[3\]", "bool"),
    (
        lambda x: ad.reduce_sum(x),
        lambda x: np.float32(1.0),
        r"same types.*float64\[\].*float32\[\]",
        "float32",
    ),
    (
        lambda x: ad.reduce_sum(x),
        lambda x: 1,
        r"same types.*float64\[\].*int64\[\]",
        "int",
    ),
]


@pytest.mark.parametrize("transform", list(TRANSFORMS))
@pytest.mark.parametrize(
    "true_fn, false_fn, match",
    [case[:3] for case in MISMATCHED_BRANCHES],
    ids=[case[3] for case in MISMATCHED_BRANCHES],
)
def test_branches_of_different_types(transform, true_fn, false_fn, match):
    """Reported in terms of true_fn and false_fn, whichever transformation is
    tracing, and whatever the predicate's value."""

    def f(x):
        out = ad.cond(positive(x), true_fn, false_fn, x)
        leaves, _ = ad.tree_flatten(out)
        return leaves[0] * 1.0

    with clear_error(
        TypeError, rf"(?s)cond: true_fn and false_fn must return the {match}"
    ):
        TRANSFORMS[transform](f)


def test_mismatch_in_a_nested_cond_is_reported():
    """A mismatch two conds deep, under jit and grad."""

    def f(x):
        def inner(x):
            return ad.cond(positive(x), lambda x: x, lambda x: (x,), x)

        return ad.cond(positive(x), inner, lambda x: x, x)

    for transform in ("eager", "jit", "grad", "vmap"):
        with clear_error(TypeError, r"(?s)same structure.*\*.*\(\*,\)"):
            TRANSFORMS[transform](f)


def test_mismatched_branches_under_jit_compile_nothing(compilations):
    f = ad.jit(lambda x: ad.cond(positive(x), lambda x: x, ad.reduce_sum, x))
    with pytest.raises(TypeError, match=r"same types"):
        f(VEC)
    assert compilations == []
    assert len(f.traces) == 0
    assert_interpreter_usable()


# ---------------------------------------------------------------------------
# Branch functions: arity, callability
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "true_fn, false_fn, operands, match",
    [
        (lambda x, y: x * y, lambda x: x, (ONE,), r"true_fn.*1 operand.*'y'"),
        (lambda: ONE, lambda x: x, (ONE,), r"true_fn.*1 operand.*too many"),
        (lambda x: x, lambda x, y: x, (ONE,), r"false_fn.*1 operand.*'y'"),
        (lambda x: x, lambda: ONE, (ONE,), r"false_fn.*1 operand.*too many"),
        (lambda x: x, lambda x: x, (ONE, ONE), r"true_fn.*2 operand.*too many"),
        (lambda x, y, z: x, lambda x, y, z: x, (ONE, ONE), r"true_fn.*2 operand.*'z'"),
        (lambda x: x, lambda x: x, (), r"true_fn.*0 operand.*'x'"),
        (lambda x, *, k: x, lambda x: x, (ONE,), r"true_fn.*1 operand.*'k'"),
        (lambda t: t[0], lambda t: t[0], ((ONE, ONE), ONE), r"true_fn.*2 operand"),
    ],
    ids=[
        "true-too-many-params",
        "true-too-few-params",
        "false-too-many-params",
        "false-too-few-params",
        "two-operands-one-param",
        "three-params-two-operands",
        "no-operands",
        "keyword-only",
        "pytree-operand-counts-once",
    ],
)
def test_branch_functions_with_the_wrong_arity(true_fn, false_fn, operands, match):
    with clear_error(TypeError, rf"(?s)cond: {match}"):
        ad.cond(True, true_fn, false_fn, *operands)


@pytest.mark.parametrize("transform", SOME_TRANSFORMS)
def test_wrong_arity_under_transformations(transform):
    def f(x):
        return ad.cond(positive(x), lambda x, y: x, lambda x: x, x)

    with clear_error(
        TypeError, r"(?s)cond: true_fn cannot be called with the 1 operand"
    ):
        TRANSFORMS[transform](f)


def test_branches_taking_varargs_or_defaults_are_fine():
    """Not errors: *args, defaults and pytree operands that match."""
    out = ad.cond(True, lambda *xs: xs[0] * xs[1], lambda x, y=None: x, ONE, 2.0)
    np.testing.assert_allclose(out, 2.0, rtol=TOL)
    out = ad.cond(False, lambda t: t[0], lambda t: t[1] * 3.0, (ONE, np.float64(2.0)))
    np.testing.assert_allclose(out, 6.0, rtol=TOL)
    assert_interpreter_usable()


@pytest.mark.parametrize(
    "true_fn, false_fn, which, got",
    [
        (3.0, ad.cos, "true_fn", "3.0"),
        (ad.sin, "cos", "false_fn", "'cos'"),
        (ad.sin, None, "false_fn", "None"),
        (np.ones(2), ad.cos, "true_fn", "array"),
        ((ad.sin,), ad.cos, "true_fn", r"\(<function"),
    ],
    ids=["number", "string", "none", "array", "tuple-of-function"],
)
def test_non_callable_branch(true_fn, false_fn, which, got):
    with clear_error(TypeError, rf"(?s)cond: {which} must be a function, got {got}"):
        ad.cond(True, true_fn, false_fn, ONE)
    with clear_error(TypeError, rf"(?s)cond: {which} must be a function"):
        ad.jit(lambda x: ad.cond(x > 0.0, true_fn, false_fn, x))(ONE)


@pytest.mark.parametrize(
    "operands, got",
    [
        (("abc",), "str"),
        ((ONE, "abc"), "str"),
        (({"x": ONE, "name": "abc"},), "str"),
        ((object(),), "object"),
    ],
    ids=["string", "second", "in-a-dict", "object"],
)
def test_non_array_operands(operands, got):
    with clear_error(
        TypeError, rf"(?s)cond operand: expected an array or a number.*{got}"
    ):
        ad.cond(True, lambda *a: ONE, lambda *a: ONE, *operands)


def test_non_array_output_of_a_branch():
    with clear_error(
        TypeError, r"(?s)cond: true_fn.*expected an array or a number.*str"
    ):
        ad.cond(True, lambda x: "text", lambda x: x, ONE)
    with clear_error(
        TypeError, r"(?s)cond: false_fn.*expected an array or a number.*object"
    ):
        ad.jit(lambda x: ad.cond(x > 0.0, lambda x: x, lambda x: object(), x))(ONE)


# ---------------------------------------------------------------------------
# Errors inside a branch
# ---------------------------------------------------------------------------


class UserError(Exception):
    """An exception of the user's own, not a TypeError or ValueError."""


@pytest.mark.parametrize("transform", list(TRANSFORMS))
@pytest.mark.parametrize("branch", ["true", "false"])
@pytest.mark.parametrize("exc_type", [ValueError, UserError, KeyError])
def test_user_exception_inside_a_branch_propagates_unchanged(
    transform, branch, exc_type
):
    """The very exception object raised in a branch reaches the caller (both
    branches are traced, so the branch not taken raises too, as in JAX); the
    interpreter is usable afterwards."""
    error = exc_type("the user's own message")

    def raising(x):
        raise error

    def f(x):
        fns = (raising, ad.sin) if branch == "true" else (ad.sin, raising)
        return ad.cond(positive(x), *fns, x)

    with pytest.raises(exc_type) as info:
        TRANSFORMS[transform](f)
    assert info.value is error
    assert_interpreter_usable()
    if transform in ("jit", "grad", "vmap"):
        assert_new_transformations_work()


MISMATCHES = {
    # The operator broadcasts, but (3,) and (2,) do not broadcast.
    "operator": (
        lambda x: x * np.ones(2),
        r"(?s)multiply: operands must have the same shape, or shapes that "
        r"broadcast; got float64\[3\] and float64\[2\], whose sizes at axis -1 "
        r"are 3 and 2",
    ),
    # The strict wrapper refuses even shapes that would broadcast.
    "strict": (
        lambda x: ad.mul(x, np.ones((2, 3))),
        r"(?s)mul: operands must have the same shape, got float64\[3\] and "
        r"float64\[2,3\]",
    ),
}


@pytest.mark.parametrize("kind", sorted(MISMATCHES))
@pytest.mark.parametrize("transform", SOME_TRANSFORMS)
@pytest.mark.parametrize("branch", ["true", "false"])
def test_shape_mismatch_of_an_operation_inside_a_branch(transform, branch, kind):
    """The operation's own clear error, raised while tracing the branch."""
    bad, match = MISMATCHES[kind]

    def f(x):
        fns = (bad, ad.sin) if branch == "true" else (ad.sin, bad)
        return ad.cond(positive(x), *fns, x)

    with clear_error(TypeError, match):
        TRANSFORMS[transform](f)


def _broadcasting_in_a_branch(cond, sin, reduce_sum, branch):
    """A branch whose operator broadcasts (3,) against (2, 3)."""
    rows = np.array([[1.0, -2.0, 0.5], [3.0, 0.25, -1.0]])

    def good(x):
        return reduce_sum(sin(x) * rows - x, 0)

    def f(x):
        fns = (good, sin) if branch == "true" else (sin, good)
        return cond(reduce_sum(x, 0) > 0.0, *fns, x)

    return f


JAX_TRANSFORMS: dict[str, Callable[[Callable], Any]] = {
    "eager": lambda f: f(VEC),
    "jit": lambda f: jax.jit(f)(VEC),
    "vmap": lambda f: jax.vmap(f)(np.stack([VEC, -VEC])),
    "grad": lambda f: jax.grad(lambda x: jnp.sum(f(x)))(VEC),
    "jvp": lambda f: jax.jvp(f, (VEC,), (VEC,)),
    "jit-of-grad": lambda f: jax.jit(jax.grad(lambda x: jnp.sum(f(x))))(VEC),
}


@pytest.mark.parametrize("transform", SOME_TRANSFORMS)
@pytest.mark.parametrize("branch", ["true", "false"])
def test_broadcasting_operator_inside_a_branch_is_fine(transform, branch):
    """Shapes that broadcast are not a mistake: the branch computes what
    jax.numpy computes, under the same transformations (the predicate sends
    VEC, whose sum is positive, to the true branch; vmap sends -VEC to the
    false branch)."""
    ours = TRANSFORMS[transform](
        _broadcasting_in_a_branch(ad.cond, ad.sin, ad.reduce_sum, branch)
    )
    theirs = JAX_TRANSFORMS[transform](
        _broadcasting_in_a_branch(
            lax.cond, jnp.sin, lambda x, axis: jnp.sum(x, axis), branch
        )
    )
    ours, theirs = jax.tree.leaves(ours), jax.tree.leaves(theirs)
    assert len(ours) == len(theirs)
    for mine, ref in zip(ours, theirs):
        np.testing.assert_allclose(np.asarray(mine), np.asarray(ref), rtol=TOL)


def test_user_exception_in_a_nested_branch_under_jit_leaves_no_trace():
    calls = {"fail": True}

    def inner(x):
        if calls["fail"]:
            raise ValueError("not yet")
        return ad.sin(x)

    def body(x):
        return ad.cond(
            positive(x), lambda x: ad.cond(positive(x), inner, ad.cos, x), ad.neg, x
        )

    f = ad.jit(body)
    with pytest.raises(ValueError, match="not yet"):
        f(VEC)
    assert len(f.traces) == 0
    assert_interpreter_usable()
    calls["fail"] = False
    np.testing.assert_allclose(np.asarray(f(VEC)), np.sin(VEC), rtol=TOL)
    np.testing.assert_allclose(np.asarray(f(-VEC)), VEC, rtol=TOL)
    assert len(f.traces) == 1


def doubling_while_small(x):
    while ad.reduce_sum(x * x) < 10.0:
        x = x * 2.0
    return x


@pytest.mark.parametrize("transform", list(TRANSFORMS))
@pytest.mark.parametrize(
    "branch_fn",
    [
        lambda x: x if ad.reduce_sum(x) > 0.0 else -x,
        lambda x: x * 2.0 if bool(ad.reduce_sum(x) < 1.0) else x,
        doubling_while_small,
    ],
    ids=["if", "bool", "while"],
)
def test_python_if_on_a_traced_value_inside_a_branch(transform, branch_fn):
    """The branch is staged into a jaxpr, so its values are abstract: a
    ConcretizationError that points to cond, under every transformation."""

    def f(x):
        return ad.cond(positive(x), branch_fn, ad.sin, x)

    with clear_error(ad.ConcretizationError, r"(?s)traced.*cond"):
        TRANSFORMS[transform](f)


# ---------------------------------------------------------------------------
# select
# ---------------------------------------------------------------------------

PRED3 = np.array([True, False, True])

SELECT_CASES = [
    (
        (np.array([True, False]), VEC, VEC),
        r"predicate.*bool\[3\].*got bool\[2\]",
        "pred-shape",
    ),  # noqa: E501
    ((np.bool_(True), VEC, VEC), r"predicate.*bool\[3\].*got bool\[\]", "scalar-pred"),
    (
        (VEC > 0.0, VEC, np.ones(2)),
        r"same shape.*float64\[3\].*float64\[2\]",
        "operand-shapes",
    ),  # noqa: E501
    (
        (PRED3, VEC, np.ones((3, 1))),
        r"same shape.*float64\[3\].*\[3, ?1\]",
        "operand-rank",
    ),  # noqa: E501
    (
        (PRED3, VEC, np.ones(3, np.int64)),
        r"same dtype.*float64\[3\].*int64\[3\]",
        "int",
    ),  # noqa: E501
    ((PRED3, VEC, np.ones(3, np.float32)), r"same dtype.*float32\[3\]", "float32"),
    ((VEC, VEC, VEC), r"predicate.*boolean.*got float64\[3\]", "float-pred"),
    (
        (np.array([1, 0, 1]), VEC, VEC),
        r"predicate.*boolean.*got int64\[3\]",
        "int-pred",
    ),
]


@pytest.mark.parametrize(
    "args, match",
    [case[:2] for case in SELECT_CASES],
    ids=[case[2] for case in SELECT_CASES],
)
def test_select_with_mismatched_operands(args, match):
    """Eagerly, under jit (while tracing) and under vmap (per example)."""
    with clear_error(TypeError, rf"(?s)select: .*{match}"):
        ad.select(*args)
    with clear_error(TypeError, rf"(?s)select: .*{match}"):
        ad.jit(ad.select)(*args)
    batched = [np.stack([a, a]) for a in args]
    with clear_error(TypeError, rf"(?s)select: .*{match}"):
        ad.vmap(ad.select)(*batched)


@pytest.mark.parametrize(
    "args, got",
    [(("yes", VEC, VEC), "str"), ((PRED3, VEC, None), "NoneType")],
    ids=["string-pred", "none-operand"],
)
def test_select_with_non_arrays(args, got):
    with clear_error(TypeError, rf"(?s)select: expected an array or a number.*{got}"):
        ad.select(*args)


def test_select_transpose_with_a_linear_predicate():
    u = ad.UndefPrimal(ShapedArray((3,), np.bool_))
    with clear_error(TypeError, r"select: the predicate cannot be a linear input"):
        ad.select_p.rules["transpose"]([VEC], u, ad.UndefPrimal(VEC3), VEC)


# ---------------------------------------------------------------------------
# Hand-built cond equations rejected by typecheck_jaxpr
# ---------------------------------------------------------------------------


def branch(avals: list, fn: Callable) -> Jaxpr:
    jaxpr, consts, _ = ad.make_jaxpr(fn, *avals)
    assert not consts
    return jaxpr


def cond_jaxpr(
    operand_avals: list,
    true_jaxpr: Jaxpr,
    false_jaxpr: Jaxpr,
    out_avals: list,
    pred_aval: ShapedArray = BOOL,
) -> Jaxpr:
    """A jaxpr whose one equation is a cond on its inputs."""
    pred, operands = Var(pred_aval), [Var(a) for a in operand_avals]
    outs = [Var(a) for a in out_avals]
    params = dict(true_jaxpr=true_jaxpr, false_jaxpr=false_jaxpr)
    return Jaxpr(
        [pred, *operands], [JaxprEqn(ad.cond_p, [pred, *operands], params, outs)], outs
    )


SIN = branch([SCALAR], ad.sin)
COS = branch([SCALAR], ad.cos)
BAD_CONDS = [
    (
        ([VEC3], SIN, COS, [SCALAR]),
        r"true branch takes \(float64\[\]\).*operands are \(float64\[3\]\)",
        "operand-shape",
    ),  # noqa: E501
    (
        ([ShapedArray((), np.float32)], SIN, COS, [SCALAR]),
        r"true branch.*operands are \(float32\[\]\)",
        "operand-dtype",
    ),  # noqa: E501
    (
        ([SCALAR], SIN, branch([VEC3], ad.cos), [SCALAR]),
        r"false branch takes \(float64\[3\]\).*operands are \(float64\[\]\)",
        "false-branch-input",
    ),  # noqa: E501
    (
        ([SCALAR, SCALAR], SIN, COS, [SCALAR]),
        r"true branch.*operands are \(float64\[\], float64\[\]\)",
        "too-many-operands",
    ),  # noqa: E501
    (([], SIN, COS, [SCALAR]), r"true branch.*operands are \(\)", "no-operands"),
    (
        (
            [SCALAR],
            SIN,
            branch([SCALAR], lambda x: ad.broadcast(x, (3,), (0,))),
            [SCALAR],
        ),
        r"branches return different types.*float64\[3\]",
        "branch-outputs",
    ),  # noqa: E501
    (
        ([SCALAR], SIN, COS, [SCALAR], SCALAR),
        r"predicate must be a boolean scalar.*float64\[\]",
        "float-pred",
    ),  # noqa: E501
    (
        ([SCALAR], SIN, COS, [SCALAR], ShapedArray((2,), np.bool_)),
        r"predicate must be a boolean scalar.*bool\[2\]",
        "vector-pred",
    ),  # noqa: E501
    (
        ([SCALAR], SIN, COS, [VEC3]),
        r"declared float64\[3\] but the primitive produces float64\[\]",
        "out-binder-type",
    ),  # noqa: E501
    (
        ([SCALAR], SIN, COS, [SCALAR, SCALAR]),
        r"1 outputs but the equation binds 2",
        "out-binder-count",
    ),  # noqa: E501
]


@pytest.mark.parametrize(
    "spec, match",
    [case[:2] for case in BAD_CONDS],
    ids=[case[2] for case in BAD_CONDS],
)
def test_typecheck_rejects_bad_cond_equations(spec, match):
    jaxpr = cond_jaxpr(*spec)
    with clear_error(JaxprTypeError, rf"(?s)equation 0 \(cond\): .*{match}"):
        ad.typecheck_jaxpr(jaxpr)


def test_typecheck_rejects_an_ill_typed_branch():
    """The type checker checks inside the branches too."""
    stray = Var(SCALAR)
    x, y = Var(SCALAR), Var(SCALAR)
    bad = Jaxpr([x], [JaxprEqn(ad.sin_p, [stray], {}, [y])], [y])
    with clear_error(
        JaxprTypeError, r"(?s)equation 0 \(cond\).*equation 0 \(sin\).*not bound"
    ):
        ad.typecheck_jaxpr(cond_jaxpr([SCALAR], bad, COS, [SCALAR]))
    with clear_error(JaxprTypeError, r"(?s)equation 0 \(cond\).*not bound"):
        ad.typecheck_jaxpr(cond_jaxpr([SCALAR], SIN, bad, [SCALAR]))


def test_bad_cond_equation_is_caught_when_staged_under_jit(compilations):
    """Binding cond with branches that do not fit the operands, inside jit:
    a TypeError from the abstract evaluation rule, nothing compiled."""

    def f(x):
        return ad.bind(ad.cond_p, True, x, true_jaxpr=SIN, false_jaxpr=COS)

    with pytest.raises(
        TypeError, match=r"(?s)true branch takes \(float64\[\]\).*\[3\]"
    ):
        ad.jit(f)(VEC)
    assert compilations == []
    assert_interpreter_usable()


# ---------------------------------------------------------------------------
# Tracers leaked out of a branch
# ---------------------------------------------------------------------------


def leak_from_a_branch(transform: str, branch: str) -> ad.Tracer:
    """A tracer of a branch's trace, stored in a list inside the branch and
    kept after ``transform`` of a function calling cond has returned."""
    leaked: list = []

    def storing(x):
        leaked.append(x)
        return ad.sin(x)

    def f(x):
        fns = (storing, ad.cos) if branch == "true" else (ad.cos, storing)
        return ad.cond(positive(x), *fns, x)

    TRANSFORMS[transform](f)
    (tracer,) = leaked
    assert isinstance(tracer, ad.Tracer)
    return tracer


LEAK_USES = {
    "eager-sin": lambda t: ad.sin(t),
    "eager-add": lambda t: t + 1.0,
    "closed-over-in-jit": lambda t: ad.jit(lambda y: y * t)(VEC),
    "closed-over-in-grad": lambda t: ad.grad(lambda y: ad.reduce_sum(y * t))(VEC),
    "closed-over-in-vmap": lambda t: ad.vmap(lambda y: y * t)(np.ones((2, 3))),
    "cond-operand": lambda t: ad.cond(True, ad.sin, ad.cos, t),
    "closed-over-in-a-branch": lambda t: ad.cond(False, ad.sin, lambda y: y * t, VEC),
    "in-a-predicate": lambda t: ad.cond(ad.reduce_sum(t) > 0.0, ad.sin, ad.cos, VEC),
    "branch-in-jit": lambda t: ad.jit(
        lambda y: ad.cond(True, lambda z: z * t, ad.cos, y)
    )(VEC),  # noqa: E501
    "branch-in-grad": lambda t: ad.grad(
        lambda y: ad.reduce_sum(ad.cond(True, lambda z: z * t, ad.cos, y))
    )(VEC),
    "select": lambda t: ad.select(PRED3, t, VEC),
}


@pytest.mark.parametrize("use", list(LEAK_USES))
@pytest.mark.parametrize(
    "transform", ["eager", "jit", "grad", "vmap", "jvp", "linearize"]
)
@pytest.mark.parametrize("branch", ["true", "false"])
def test_tracer_leaked_out_of_a_branch(branch, transform, use):
    tracer = leak_from_a_branch(transform, branch)
    with clear_error(
        ad.UnexpectedTracerError, r"(?s)transformation has already finished"
    ):
        LEAK_USES[use](tracer)


@pytest.mark.parametrize("transform", ["eager", "jit", "grad", "vmap"])
def test_tracer_leaked_into_a_later_cond_of_the_same_function(transform):
    """The leaked tracer is used while the enclosing transformation still runs,
    but the branch that made it has finished."""

    def as_operand(x):
        leaked: list = []
        ad.cond(positive(x), lambda y: leaked.append(y) or y, ad.neg, x)
        return ad.cond(positive(x), ad.sin, ad.cos, leaked[0])

    def as_closure(x):
        leaked: list = []
        ad.cond(positive(x), lambda y: leaked.append(y) or y, ad.neg, x)
        return ad.cond(positive(x), lambda y: y * leaked[0], ad.cos, x)

    for f in (as_operand, as_closure):
        with clear_error(ad.UnexpectedTracerError, r"already finished"):
            TRANSFORMS[transform](f)


def test_outer_tracer_leaked_through_a_branch():
    """A branch closing over a jvp tracer stores it; used after jvp returns."""
    leaked: list = []

    def f(x):
        def branch(y):
            leaked.append(x)
            return y * x

        return ad.cond(x > 0.0, branch, ad.neg, x)

    ad.jvp(f, (ONE,), (ONE,))
    assert isinstance(leaked[0], ad.Tracer)
    with clear_error(ad.UnexpectedTracerError, r"already finished"):
        ad.sin(leaked[0])
    with clear_error(ad.UnexpectedTracerError, r"already finished"):
        ad.cond(True, lambda y: y * leaked[0], ad.neg, ONE)


# ---------------------------------------------------------------------------
# Other SPEC section 5 errors, for functions using cond
# ---------------------------------------------------------------------------


def test_grad_of_a_non_scalar_cond_output():
    with clear_error(
        TypeError, r"(?s)grad: f must return a float scalar.*float64\[3\]"
    ):
        ad.grad(lambda x: ad.cond(positive(x), ad.sin, ad.cos, x))(VEC)


def test_grad_with_respect_to_an_integer_through_cond():
    with clear_error(TypeError, r"(?s)grad.*float.*int64"):
        ad.grad(lambda n: ad.cond(n > 0, lambda n: n * 1.0, lambda n: n * 2.0, n))(3)


def test_wrong_tangents_and_cotangents_for_a_cond_function():
    def f(x):
        return ad.cond(positive(x), lambda x: ad.sin(x) * x, ad.cos, x)

    _, f_lin = ad.linearize(f, VEC)
    with clear_error(ValueError, r"(?s)linearize: tangent 0 has shape \(2,\)"):
        f_lin(np.ones(2))
    with clear_error(TypeError, r"(?s)linearize: tangent 0 has dtype float32"):
        f_lin(np.ones(3, np.float32))
    _, f_vjp = ad.vjp(f, VEC)
    with clear_error(
        ValueError, r"(?s)vjp: cotangent 0 should be float64\[3\].*float64\[2\]"
    ):
        f_vjp(np.ones(2))
    with clear_error(TypeError, r"(?s)vjp: cotangents must have the structure"):
        f_vjp((np.ones(3),))
    # Both still work afterwards.
    expected = jax.jvp(lambda x: jnp.sin(x) * x, (VEC,), (VEC,))[1]
    np.testing.assert_allclose(f_lin(VEC), expected, rtol=TOL)


def test_jitted_function_returning_a_non_array_from_cond():
    """A branch returning a string is caught while tracing the branch."""
    with clear_error(TypeError, r"(?s)expected an array or a number.*str"):
        ad.jit(lambda x: ad.cond(x > 0.0, lambda x: "a", lambda x: "b", x))(ONE)
