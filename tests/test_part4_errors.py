"""Bad input to linearize, vjp and grad gets a clear error (SPEC section 5).

Each case checks the exception's type (TypeError, ValueError or a named
subclass, never an internal AssertionError/KeyError/AttributeError), its
message, and that the interpreter is usable afterwards. Python control flow on
a traced value is *not* an error under grad (the primal is known), and gives
JAX's derivative.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import raises_clearly

import autodidax as ad

pytestmark = pytest.mark.usefixtures("clean_interpreter_stack")

TOL = 1e-9
VEC = np.array([0.5, -1.0, 2.0])


def assert_interpreter_usable() -> None:
    """Only the evaluation level is on the stack and it is the dynamic level;
    grad, linearize, jit and staging all still work."""
    assert len(ad._state.stack) == 1
    assert ad._state.dynamic is ad._state.stack[0]
    np.testing.assert_allclose(ad.grad(ad.sin)(0.5), np.cos(0.5), rtol=TOL)
    _, f_lin = ad.linearize(ad.jit(ad.cos), 0.5)
    np.testing.assert_allclose(f_lin(2.0), -2.0 * np.sin(0.5), rtol=TOL)
    jaxpr, _, _ = ad.make_jaxpr(lambda: ad.mul(2.0, 2.0))
    assert [e.primitive.name for e in jaxpr.eqns] == ["mul"]
    assert len(ad._state.stack) == 1
    assert ad._state.dynamic is ad._state.stack[0]


def clear_error(exc_type: type | tuple[type, ...], match: str):
    """Expect a clear error, then check the interpreter is still usable."""
    return raises_clearly(exc_type, match, then=assert_interpreter_usable)


class Box:
    """A user-registered container (a pytree node)."""

    def __init__(self, value: Any) -> None:
        self.value = value


ad.register_pytree_node(Box, lambda b: ((b.value,), None), lambda _, kids: Box(*kids))


# ---------------------------------------------------------------------------
# grad: what f returns
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "f, got",
    [
        (lambda x: ad.sin(x), r"float64\[3\]"),
        (lambda x: ad.broadcast(ad.reduce_sum(x), (1,), (0,)), r"float64\[1\]"),
        (lambda x: ad.transpose(ad.broadcast(x, (2, 3), (0,)), (1, 0)), r"\[3, ?2\]"),
    ],
    ids=["vector", "one-element", "matrix"],
)
def test_grad_of_non_scalar_output(f, got):
    with clear_error(TypeError, rf"(?s)scalar.*{got}"):
        ad.grad(f)(VEC)


@pytest.mark.parametrize(
    "f",
    [
        lambda x: (ad.reduce_sum(x),),
        lambda x: [ad.reduce_sum(x)],
        lambda x: {"loss": ad.reduce_sum(x)},
        lambda x: (ad.reduce_sum(x), ad.reduce_sum(x)),
        lambda x: Box(ad.reduce_sum(x)),
        lambda x: None,
    ],
    ids=["tuple", "list", "dict", "pair", "registered-node", "none"],
)
def test_grad_of_container_output(f):
    """A container holding a scalar is not a scalar: say so, and point to vjp."""
    with clear_error(TypeError, r"scalar"):
        ad.grad(f)(VEC)


@pytest.mark.parametrize(
    "f, dtype",
    [
        (lambda x: 3, "int"),
        (lambda x: np.int32(3), "int32"),
        (lambda x: ad.reduce_sum(x) > 0.0, "bool"),
        (lambda x: ad.greater(ad.reduce_sum(x), 0.0), "bool"),
    ],
    ids=["python-int", "int32", "bool-op", "bool-fn"],
)
def test_grad_of_int_or_bool_output(f, dtype):
    with clear_error(TypeError, rf"(?s)float.*{dtype}"):
        ad.grad(f)(VEC)


def test_grad_of_string_output():
    with clear_error(TypeError, r"str"):
        ad.grad(lambda x: "loss")(VEC)


# ---------------------------------------------------------------------------
# grad: what f is differentiated with respect to
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "x, dtype",
    [
        (3, "int64"),
        (np.array([1, 2, 3]), "int64"),
        (np.int32(2), "int32"),
        (True, "bool"),
        (np.array([True, False]), "bool"),
        ((1.0, 2), "int64"),
        ({"w": np.ones(2), "n": np.arange(2)}, "int64"),
    ],
    ids=["int", "int-array", "int32", "bool", "bool-array", "tuple-leaf", "dict-leaf"],
)
def test_grad_with_respect_to_a_non_float(x, dtype):
    def f(x):
        return ad.reduce_sum(ad.sin(np.ones(2) * 1.0)) * 0.0

    with clear_error(TypeError, rf"(?s)float.*{dtype}"):
        ad.grad(f)(x)


def test_grad_with_respect_to_an_int_inside_jvp():
    with clear_error(TypeError, r"float"):
        ad.jvp(ad.grad(lambda x: x * 2), (3,), (0,))


# ---------------------------------------------------------------------------
# Non-array inputs
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "call",
    [
        lambda: ad.grad(lambda x: ad.sin(x))("abc"),
        lambda: ad.grad(lambda x: ad.reduce_sum(x[0]))(("abc", VEC)),
        lambda: ad.vjp(ad.sin, "abc"),
        lambda: ad.vjp(lambda x, y: x, VEC, "abc"),
        lambda: ad.linearize(ad.sin, "abc"),
        lambda: ad.linearize(lambda d: d["x"], {"x": "abc"}),
        lambda: ad.grad(lambda x: ad.reduce_sum(x))(object()),
    ],
    ids=[
        "grad",
        "grad-tree",
        "vjp",
        "vjp-second",
        "linearize",
        "linearize-tree",
        "obj",
    ],
)
def test_non_array_inputs(call):
    with clear_error(TypeError, r"(?s)expected an array or a number.*(str|object)"):
        call()


@pytest.mark.parametrize("transform", ["linearize", "vjp"])
def test_non_array_outputs(transform):
    with clear_error(TypeError, r"(?s)expected an array or a number.*str"):
        getattr(ad, transform)(lambda x: (x, "text"), VEC)


# ---------------------------------------------------------------------------
# vjp: cotangents
# ---------------------------------------------------------------------------


def vector_vjp():
    return ad.vjp(lambda x: ad.sin(x) * x, VEC)[1]


def tuple_vjp():
    return ad.vjp(lambda x: (ad.sin(x), ad.reduce_sum(x)), VEC)[1]


@pytest.mark.parametrize(
    "make, cts, exc, match",
    [
        (vector_vjp, (np.ones(2),), ValueError, r"(?s)float64\[3\].*float64\[2\]"),
        (vector_vjp, (np.ones((3, 1)),), ValueError, r"(?s)float64\[3\].*\[3, ?1\]"),
        (vector_vjp, (np.float64(1.0),), ValueError, r"(?s)float64\[3\].*float64\[\]"),
        (vector_vjp, (np.ones(3, np.float32),), ValueError, r"float32"),
        (vector_vjp, (np.ones(3, np.int64),), ValueError, r"int64"),
        (vector_vjp, ((np.ones(3),),), TypeError, r"structure"),
        (vector_vjp, ([np.ones(3)],), TypeError, r"structure"),
        (vector_vjp, (), TypeError, r"structure"),
        (vector_vjp, (np.ones(3), np.ones(3)), TypeError, r"structure"),
        (vector_vjp, ("abc",), TypeError, r"str"),
        (tuple_vjp, (np.ones(3),), TypeError, r"structure"),
        (tuple_vjp, ([np.ones(3), 1.0],), TypeError, r"structure"),
        (tuple_vjp, ((np.ones(3), np.ones(2)),), ValueError, r"(?s)float64\[\].*\[2\]"),
        (tuple_vjp, ((np.ones(2), 1.0),), ValueError, r"(?s)float64\[3\].*\[2\]"),
        (tuple_vjp, ({"a": np.ones(3), "b": 1.0},), TypeError, r"structure"),
    ],
    ids=[
        "shape",
        "rank",
        "scalar-for-vector",
        "float32",
        "int",
        "nested-tuple",
        "list",
        "none-given",
        "too-many",
        "string",
        "one-for-two",
        "list-for-tuple",
        "second-shape",
        "first-shape",
        "dict-for-tuple",
    ],
)
def test_vjp_with_wrong_cotangents(make, cts, exc, match):
    f_vjp = make()
    with clear_error(exc, match):
        f_vjp(*cts)
    np.testing.assert_allclose(  # the pullback still works afterwards
        f_vjp(np.ones(3))[0] if make is vector_vjp else f_vjp(np.ones(3), 1.0)[0],
        jax.vjp(lambda x: jnp.sin(x) * x, VEC)[1](np.ones(3))[0]
        if make is vector_vjp
        else np.cos(VEC) + 1.0,
        rtol=TOL,
    )


def test_vjp_cotangent_for_a_boolean_output():
    """The cotangent of a boolean output has dtype bool (a float there is a
    dtype mismatch, reported as such)."""
    _, f_vjp = ad.vjp(lambda x: (x * 2.0, x > 0.0), VEC)
    x_bar = f_vjp(np.ones(3), np.zeros(3, np.bool_))[0]
    np.testing.assert_allclose(x_bar, 2.0 * np.ones(3), rtol=TOL)
    with clear_error(ValueError, r"(?s)bool.*float64"):
        f_vjp(np.ones(3), np.zeros(3))


# ---------------------------------------------------------------------------
# linearize: tangents
# ---------------------------------------------------------------------------


def two_arg_lin():
    def f(x, d):
        return ad.sin(x) * ad.broadcast(d["s"], (3,), (0,))

    return ad.linearize(f, VEC, {"s": 2.0})[1]


@pytest.mark.parametrize(
    "tangents, exc, match",
    [
        ((np.ones(2), {"s": 1.0}), ValueError, r"(?s)shape.*\(2,\).*\(3,\)"),
        ((np.ones((1, 3)), {"s": 1.0}), ValueError, r"(?s)shape.*\(1, 3\)"),
        ((np.ones(3), {"s": np.ones(2)}), ValueError, r"(?s)shape.*\(2,\).*\(\)"),
        ((np.ones(3, np.float32), {"s": 1.0}), TypeError, r"(?s)dtype.*float32"),
        ((np.ones(3), {"s": 1}), TypeError, r"(?s)dtype.*int64"),
        ((np.ones(3),), TypeError, r"structure"),
        ((np.ones(3), 1.0), TypeError, r"structure"),
        ((np.ones(3), {"t": 1.0}), TypeError, r"structure"),
        ((np.ones(3), {"s": 1.0}, np.ones(3)), TypeError, r"structure"),
        ((), TypeError, r"structure"),
        (("abc", {"s": 1.0}), TypeError, r"str"),
    ],
    ids=[
        "shape",
        "rank",
        "second-shape",
        "float32",
        "int",
        "missing",
        "leaf-for-dict",
        "wrong-key",
        "extra",
        "none",
        "string",
    ],
)
def test_linear_map_with_wrong_tangents(tangents, exc, match):
    f_lin = two_arg_lin()
    with clear_error(exc, match):
        f_lin(*tangents)
    np.testing.assert_allclose(  # the linear map still works afterwards
        f_lin(np.ones(3), {"s": 1.0}), 2.0 * np.cos(VEC) + np.sin(VEC), rtol=TOL
    )


def test_linear_map_of_jit_with_wrong_tangent():
    _, f_lin = ad.linearize(ad.jit(lambda x: ad.sin(x) * x), VEC)
    with clear_error(ValueError, r"shape"):
        f_lin(np.ones(4))
    with clear_error(TypeError, r"dtype"):
        f_lin(np.ones(3, np.float32))


# ---------------------------------------------------------------------------
# Python control flow: fine under grad (the primal is known)
# ---------------------------------------------------------------------------


def piecewise(x, sin, cos, reduce_sum):
    """Branches and a loop on the (known) primal value."""
    if reduce_sum(x) > 1.0:
        y = sin(x) * x
    elif reduce_sum(x) < -1.0:
        y = cos(x) * 3.0
    else:
        y = x * x
    steps = 0
    while reduce_sum(y * y) < 20.0 and steps < 10:
        y = y * 1.7 + sin(y)
        steps += 1
    return reduce_sum(y) if bool(reduce_sum(y) > 0.0) else -reduce_sum(y)


@pytest.mark.parametrize(
    "x",
    [
        np.array([1.0, 0.5, 0.2]),
        np.array([-2.0, 0.3, -0.4]),
        np.array([0.1, -0.2, 0.3]),
    ],
    ids=["first-branch", "second-branch", "else"],
)
def test_python_control_flow_under_grad_vjp_linearize(x):
    def ours(x):
        return piecewise(x, ad.sin, ad.cos, ad.reduce_sum)

    def theirs(x):
        return piecewise(x, jnp.sin, jnp.cos, jnp.sum)

    expected = jax.grad(theirs)(x)
    np.testing.assert_allclose(ad.grad(ours)(x), expected, rtol=TOL, atol=TOL)
    np.testing.assert_allclose(ad.vjp(ours, x)[1](1.0)[0], expected, rtol=TOL)
    _, f_lin = ad.linearize(ours, x)
    np.testing.assert_allclose(f_lin(VEC), np.dot(expected, VEC), rtol=TOL, atol=TOL)
    hvp = ad.jvp(ad.grad(ours), (x,), (VEC,))[1]
    their_hvp = jax.jvp(jax.grad(theirs), (x,), (VEC,))[1]
    np.testing.assert_allclose(hvp, their_hvp, rtol=TOL, atol=TOL)

    def along(s):
        return ours(x * ad.broadcast(s, (3,), (0,)))

    second = jax.grad(jax.grad(lambda s: theirs(x * s)))(1.0)
    np.testing.assert_allclose(ad.grad(ad.grad(along))(1.0), second, rtol=TOL, atol=TOL)


def test_python_if_on_a_traced_value_under_grad_of_jit():
    """Inside jit the value is abstract: a ConcretizationError pointing to cond."""
    with clear_error(ad.ConcretizationError, r"(?s)traced.*cond"):
        ad.grad(ad.jit(lambda x: ad.sin(x) if x > 0.0 else x))(0.5)
    with clear_error(ad.ConcretizationError, r"(?s)traced.*cond"):
        ad.jit(ad.grad(lambda x: ad.sin(x) if x > 0.0 else x))(0.5)


# ---------------------------------------------------------------------------
# Leaked tracers
# ---------------------------------------------------------------------------


def leaked_tracer(transform: str) -> ad.Tracer:
    """A tracer that escaped from a finished linearize / vjp / grad."""
    escaped = []

    def f(x):
        escaped.append(x)
        return ad.reduce_sum(ad.sin(x))

    if transform == "linearize":
        ad.linearize(f, VEC)
    elif transform == "vjp":
        ad.vjp(f, VEC)
    else:
        ad.grad(f)(VEC)
    (tracer,) = escaped
    assert isinstance(tracer, ad.Tracer)
    return tracer


@pytest.mark.parametrize("transform", ["linearize", "vjp", "grad"])
@pytest.mark.parametrize(
    "use",
    [
        lambda t: ad.sin(t),
        lambda t: t + 1.0,
        lambda t: t * VEC,
        lambda t: ad.grad(lambda y: ad.reduce_sum(y * t))(VEC),
        lambda t: ad.grad(lambda y: ad.reduce_sum(y * 2.0))(t),
        lambda t: ad.linearize(ad.sin, t),
        lambda t: ad.vjp(lambda y: y * t, VEC),
        lambda t: ad.linearize(ad.sin, VEC)[1](t),
        lambda t: ad.vjp(ad.sin, VEC)[1](t),
        lambda t: ad.jit(lambda y: y * t)(VEC),
        lambda t: ad.grad(ad.jit(lambda y: ad.reduce_sum(y * t)))(VEC),
    ],
    ids=[
        "eager-sin",
        "eager-add",
        "eager-mul",
        "closed-over-in-grad",
        "as-grad-input",
        "as-linearize-primal",
        "closed-over-in-vjp",
        "as-tangent",
        "as-cotangent",
        "closed-over-in-jit",
        "grad-of-jit",
    ],
)
def test_leaked_tracer_used_later(transform, use):
    tracer = leaked_tracer(transform)
    with clear_error(ad.UnexpectedTracerError, r"transformation has already finished"):
        use(tracer)


def test_linear_map_closing_over_a_finished_outer_transformation():
    """f_lin made inside jvp holds the jvp's tracers as residuals; calling it
    after that jvp has returned is a leak too."""
    escaped = []

    def outer(x):
        _, f_lin = ad.linearize(lambda y: ad.sin(y * x), 1.0)
        escaped.append(f_lin)
        return x

    ad.jvp(outer, (0.5,), (1.0,))
    with clear_error(ad.UnexpectedTracerError, r"already finished"):
        escaped[0](1.0)
