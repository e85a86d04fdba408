"""Bad input to jit gets a clear error (SPEC section 5).

Each case checks the exception's type (TypeError, ValueError or a named
subclass, never an internal AssertionError/KeyError/AttributeError or a
runtime error from XLA), its message, where it was raised (while tracing, with
the user's own line in the traceback, before anything is lowered or compiled),
and that the interpreter is usable afterwards.
"""

from __future__ import annotations

import traceback
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from helpers import nothing_compiled, raises_clearly

import autodidax as ad
from autodidax import ShapedArray

pytestmark = pytest.mark.usefixtures("clean_interpreter_stack")

F64 = np.float64
VEC3 = ShapedArray((3,), F64)


def assert_interpreter_usable() -> None:
    """Only the evaluation level is on the stack and it is the dynamic level;
    jit, staging and eager evaluation all still work."""
    assert len(ad._state.stack) == 1
    assert ad._state.dynamic is ad._state.stack[0]
    out = ad.jit(lambda x: ad.sin(x) * 2.0)(np.array([0.5, 1.0]))
    np.testing.assert_allclose(out, 2.0 * np.sin([0.5, 1.0]), rtol=1e-12)
    jaxpr, _, _ = ad.make_jaxpr(lambda: ad.mul(2.0, 2.0))
    assert [e.primitive.name for e in jaxpr.eqns] == ["mul"]
    assert len(ad._state.stack) == 1
    assert ad._state.dynamic is ad._state.stack[0]


def clear_error(exc_type: type | tuple[type, ...], match: str):
    """Expect a clear error, then check the interpreter is still usable."""
    return raises_clearly(exc_type, match, then=assert_interpreter_usable)


def frames_at(tb: Any, fn: Callable) -> list[traceback.FrameSummary]:
    """The traceback's frames inside ``fn``'s code (in this file)."""
    code = fn.__code__
    return [
        frame
        for frame in traceback.extract_tb(tb)
        if frame.filename == code.co_filename and frame.name == code.co_name
    ]


def line_of(fn: Callable, marker: str) -> int:
    """The line number of the first line of ``fn``'s source containing
    ``marker``."""
    import inspect

    lines, first = inspect.getsourcelines(fn)
    for offset, text in enumerate(lines):
        if marker in text:
            return first + offset
    raise LookupError(marker)


# ---------------------------------------------------------------------------
# Python control flow on traced values
# ---------------------------------------------------------------------------


def _if(x):
    return x if x > 0.0 else -x


def _while(x):
    while ad.reduce_sum(x) < 10.0:
        x = x * 2.0
    return x


def _bool(x):
    return ad.sin(x) * float(bool(x < 1.0))


def _and(x):
    return (x > 0.0) and x


@pytest.mark.parametrize("fn", [_if, _while, _bool, _and], ids=lambda f: f.__name__)
@pytest.mark.parametrize(
    "wrap",
    [
        lambda fn: ad.jit(fn),
        lambda fn: ad.jit(ad.jit(fn)),
        lambda fn: lambda x: ad.jvp(ad.jit(fn), (x,), (np.ones_like(x),)),
        lambda fn: ad.jit(lambda x: ad.jvp(fn, (x,), (x,))),
        lambda fn: lambda x: ad.vmap(ad.jit(fn))(np.stack([x, x])),
    ],
    ids=["jit", "jit-of-jit", "jvp-of-jit", "jit-of-jvp", "vmap-of-jit"],
)
def test_python_control_flow_on_traced_value(fn, wrap):
    """Python `if`/`while`/`bool`/`and` on a value traced by jit: a
    ConcretizationError (a TypeError) that points to cond."""
    x = np.array(0.5) if fn is not _while else np.array([0.5, 1.0])
    with clear_error(ad.ConcretizationError, r"(?s)traced.*cond") as info:
        with nothing_compiled():
            wrap(fn)(x)
    assert isinstance(info.value, TypeError)
    assert frames_at(info.tb, fn), "the user's function is not in the traceback"


def test_control_flow_on_static_information_is_fine():
    """Branching on shapes, dtypes and Python values is allowed under jit."""

    def total(x, scale):
        while x.ndim > 0:
            x = ad.reduce_sum(x, axis=0)
        if x.dtype == np.float64 and scale > 1:
            x = x * float(scale)
        return x

    f = ad.jit(lambda x: total(x, 3))
    np.testing.assert_allclose(f(np.ones((2, 3, 4))), 72.0, rtol=1e-12)


# ---------------------------------------------------------------------------
# Outputs and arguments that are not arrays
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "out",
    [
        "done",
        b"bytes",
        object(),
        (None, "text"),
        {"a": None, "b": object()},
        [None, [None, "nested"]],
        np.array(["s"]),
        np.array([1.0, None], dtype=object),
        ad.ShapedArray((3,), F64),
        print,
    ],
    ids=[
        "str",
        "bytes",
        "object",
        "tuple-with-None-and-str",
        "dict-with-None-and-object",
        "nested-list",
        "str-array",
        "object-array",
        "aval",
        "function",
    ],
)
def test_jitted_function_returning_a_non_array(out):
    def f(x):
        y = ad.sin(x)
        if isinstance(out, (tuple, list, dict)):
            return y, out
        return out

    with clear_error(TypeError, r"jit: output of the function: expected an array"):
        with nothing_compiled():
            ad.jit(f)(np.ones(3))


@pytest.mark.parametrize(
    "args",
    [
        ("text",),
        (np.ones(3), "text"),
        ({"k": "v"},),
        ([1.0, b"bytes"],),
        (np.array(["s"]),),
        (np.array([1.0, None], dtype=object),),
        (object(),),
        (ad.ShapedArray((3,), F64),),
    ],
    ids=[
        "str",
        "second-str",
        "dict-of-str",
        "list-with-bytes",
        "str-array",
        "object-array",
        "object",
        "aval",
    ],
)
def test_non_array_argument_to_jit(args):
    body_runs = []

    def f(*xs):
        body_runs.append(xs)
        return xs

    f_jit = ad.jit(f)
    with clear_error(TypeError, r"jit argument: expected an array"):
        with nothing_compiled():
            f_jit(*args)
    assert body_runs == [] and len(f_jit.traces) == 0


def test_non_callable_to_jit():
    with clear_error(TypeError, r"not callable"):
        ad.jit(3)(1.0)


# ---------------------------------------------------------------------------
# Shape and dtype mistakes: found while tracing, at the user's line
# ---------------------------------------------------------------------------


def mismatched_shapes(x, y):
    z = ad.sin(x)
    return z * y  # the mistake


def mismatched_dtypes(x, y):
    z = ad.cos(x)
    return ad.add(z, y)  # the mistake (the operator + would promote, as jnp)


def compared_shapes(x, y):
    return x > y  # the mistake


def strict_ranks(x, y):
    z = ad.sin(x)
    return ad.mul(z, y)  # the mistake: the wrapper does not broadcast ranks


def strict_compared_ranks(x, y):
    return ad.greater(x, y)  # the mistake


def sin_of_ints(x, y):
    return ad.sin(y)  # the mistake


def float_times_ints(x, y):
    return ad.mul(y, 2.5)  # the mistake (the operator * would promote)


@pytest.mark.parametrize(
    "fn, args, exc, match",
    [
        (
            mismatched_shapes,
            (np.ones(3), np.ones(2)),
            TypeError,
            r"multiply: operands must have the same shape, or shapes that "
            r"broadcast; got float64\[3\] and float64\[2\], whose sizes at axis "
            r"-1 are 3 and 2 \(they must be equal, or 1\)",
        ),
        (
            mismatched_shapes,
            (np.ones((2, 3)), np.ones((3, 2))),
            TypeError,
            r"multiply: .*same shape.*broadcast.*float64\[2,3\].*float64\[3,2\]"
            r".*axis -2 are 2 and 3",
        ),
        (
            strict_ranks,
            (np.ones(3), np.ones((2, 3))),
            TypeError,
            r"mul: operands must have the same shape, "
            r"got float64\[3\] and float64\[2,3\]",
        ),
        (
            mismatched_dtypes,
            (np.ones(3), np.ones(3, np.float32)),
            TypeError,
            r"add: operands must have the same dtype.*float64.*float32",
        ),
        (
            mismatched_dtypes,
            (np.ones(3), np.arange(3)),
            TypeError,
            r"add: .*same dtype.*float64.*int64",
        ),
        (
            compared_shapes,
            (np.ones((2, 3)), np.ones(2)),
            TypeError,
            r"greater: .*same shape, or shapes that broadcast.*float64\[2,3\]"
            r".*float64\[2\].*axis -1 are 3 and 2",
        ),
        (
            strict_compared_ranks,
            (np.ones((2, 3)), np.ones(3)),
            TypeError,
            r"greater: operands must have the same shape, "
            r"got float64\[2,3\] and float64\[3\]",
        ),
        (
            sin_of_ints,
            (np.ones(3), np.arange(3)),
            TypeError,
            r"sin: expected a float array, got dtype int64",
        ),
        (
            float_times_ints,
            (np.ones(3), np.arange(3)),
            TypeError,
            r"mul: cannot combine the float 2.5 with an array of dtype int64",
        ),
    ],
    ids=[
        "shape",
        "shape-2d",
        "strict-rank",
        "dtype",
        "int-float",
        "compare",
        "strict-compare-rank",
        "sin-int",
        "scalar",
    ],
)
@pytest.mark.parametrize("nesting", ["jit", "jit-in-jit", "jvp-of-jit"])
def test_mistakes_found_while_tracing_at_the_users_line(fn, args, exc, match, nesting):
    if nesting == "jit":
        call = ad.jit(fn)
    elif nesting == "jit-in-jit":
        call = ad.jit(lambda *xs: ad.sin(ad.jit(fn)(*xs)))
    else:
        call = lambda *xs: ad.jvp(ad.jit(fn), xs, xs)  # noqa: E731
    with clear_error(exc, match) as info:
        with nothing_compiled():
            call(*args)
    frames = frames_at(info.tb, fn)
    assert frames, "the user's function is not in the traceback"
    assert frames[-1].lineno == line_of(fn, "# the mistake")


@pytest.mark.parametrize(
    "x_shape, y_shape",
    [((2, 3), (3,)), ((3, 1), (1, 4)), ((3,), ())],
    ids=["row", "outer", "rank-0"],
)
def test_operators_broadcast_under_jit_like_jax_numpy(x_shape, y_shape):
    """Shapes that broadcast are not a mistake for the operators: under jit,
    and under jvp of jit, the results are jax.numpy's."""
    import jax
    import jax.numpy as jnp

    def f(x, y):
        return ad.sin(x) * y - y, x > y

    def f_jax(x, y):
        return jnp.sin(x) * y - y, x > y

    rng = np.random.default_rng(3)
    x, y = rng.normal(size=x_shape), rng.normal(size=y_shape)
    tx, ty = rng.normal(size=x_shape), rng.normal(size=y_shape)
    out, bigger = ad.jit(f)(x, y)
    want, want_bigger = f_jax(jnp.asarray(x), jnp.asarray(y))
    np.testing.assert_allclose(np.asarray(out), np.asarray(want), rtol=1e-12)
    np.testing.assert_array_equal(np.asarray(bigger), np.asarray(want_bigger))
    primal, tangent = ad.jvp(lambda a, b: ad.jit(f)(a, b)[0], (x, y), (tx, ty))
    jax_primal, jax_tangent = jax.jvp(
        lambda a, b: f_jax(a, b)[0], (jnp.asarray(x), jnp.asarray(y)), (tx, ty)
    )
    np.testing.assert_allclose(np.asarray(primal), np.asarray(jax_primal), rtol=1e-12)
    np.testing.assert_allclose(
        np.asarray(tangent), np.asarray(jax_tangent), rtol=1e-12, atol=1e-12
    )


def test_mistake_in_a_lambda_points_at_the_lambda():
    fn = lambda x, y: x * y  # noqa: E731
    with clear_error(TypeError, r"float64\[3\] and float64\[2\]") as info:
        with nothing_compiled():
            ad.jit(fn)(np.ones(3), np.ones(2))
    (frame,) = frames_at(info.tb, fn)
    assert frame.lineno == fn.__code__.co_firstlineno


@pytest.mark.parametrize(
    "fn, x",
    [
        (lambda x: ad.reduce_sum(x, 3), np.ones((2, 3))),
        (lambda x: ad.reduce_sum(x, -4), np.ones((2, 3))),
        (lambda x: ad.reduce_sum(x, 0.5), np.ones((2, 3))),
        (lambda x: ad.transpose(x, (0, 0)), np.ones((2, 3))),
        (lambda x: ad.transpose(x, (1,)), np.ones((2, 3))),
        (lambda x: ad.broadcast(x, (2, 4), (0,)), np.ones(3)),
        (lambda x: ad.broadcast(x, (2, 3), (3,)), np.ones(3)),
        (lambda x: ad.broadcast(x, 3, (0,)), np.ones(3)),
        (lambda x: ad.sin(x), np.arange(3)),
        (lambda x: ad.add(x, np.ones(2)), np.ones(3)),
    ],
    ids=[
        "reduce-axis",
        "reduce-negative-axis",
        "reduce-float-axis",
        "transpose-repeated",
        "transpose-short",
        "broadcast-shape",
        "broadcast-axis",
        "broadcast-int-shape",
        "sin-int",
        "add-constant",
    ],
)
def test_bad_params_under_jit_match_eager_errors(fn, x):
    """Under jit, bad params are reported while tracing with the same
    exception type and message as in eager code."""
    with pytest.raises((TypeError, ValueError)) as eager:
        fn(x)
    with clear_error(type(eager.value), None) as info:
        with nothing_compiled():
            ad.jit(fn)(x)
    assert str(info.value) == str(eager.value)
    assert frames_at(info.tb, fn)


def test_negating_booleans_under_jit():
    """`-x` of a bool array is an error in NumPy and in JAX; under jit it must
    be a TypeError naming neg and bool, not a failure of MLIR verification."""
    with pytest.raises(TypeError):
        -np.array([True])  # NumPy refuses too
    with clear_error(TypeError, r"(?s)neg.*bool"):
        ad.jit(lambda a: -a)(np.array([True, False]))


def test_transformation_errors_around_jit():
    """Mistakes in how jvp/vmap are called on a jitted function get jvp's and
    vmap's own errors, not errors from xla_call."""
    f = ad.jit(lambda x, y: x * y)
    two = np.ones(2)
    with clear_error(ValueError, r"vmap: inconsistent batch sizes"):
        ad.vmap(f)(np.ones((3, 2)), np.ones((4, 2)))
    with clear_error(ValueError, r"vmap: in_axes 2 is out of range"):
        ad.vmap(f, (0, 2))(np.ones((3, 2)), np.ones((2, 3)))
    with clear_error(ValueError, r"jvp: tangent 0 has shape \(3,\)"):
        ad.jvp(f, (two, two), (np.ones(3), two))
    with clear_error(TypeError, r"jvp: tangent 0 has dtype float32"):
        ad.jvp(f, (two, two), (np.ones(2, np.float32), two))


# ---------------------------------------------------------------------------
# Leaked tracers
# ---------------------------------------------------------------------------


def leaked_jit_tracer() -> ad.Tracer:
    """A tracer that escaped from a finished jit trace."""
    escaped = []

    def f(x):
        escaped.append(x)
        return ad.sin(x)

    ad.jit(f)(np.ones(3))
    (tracer,) = escaped
    assert isinstance(tracer, ad.Tracer)
    return tracer


@pytest.mark.parametrize(
    "use",
    [
        lambda t: ad.sin(t),
        lambda t: t + 1.0,
        lambda t: t * np.ones(3),
        lambda t: ad.jit(lambda y: y + t)(np.ones(3)),
        lambda t: ad.jit(lambda y: t)(np.ones(3)),
        lambda t: ad.jit(lambda y: y)(t),
        lambda t: ad.jit(lambda: ad.neg(t))(),
        lambda t: ad.jvp(ad.jit(lambda y: y * t), (np.ones(3),), (np.ones(3),)),
        lambda t: ad.vmap(ad.jit(lambda y: y * t))(np.ones((2, 3))),
        lambda t: ad.jvp(ad.jit(ad.sin), (t,), (np.ones(3),)),
        lambda t: ad.make_jaxpr(ad.jit(lambda y: y * t), VEC3),
    ],
    ids=[
        "eager-sin",
        "eager-add",
        "eager-mul-array",
        "closed-over-in-jit",
        "returned-from-jit",
        "argument-to-jit",
        "constant-only-jit",
        "jvp-of-jit",
        "vmap-of-jit",
        "as-jvp-primal",
        "make_jaxpr-of-jit",
    ],
)
def test_leaked_tracer_used_later(use):
    tracer = leaked_jit_tracer()
    with clear_error(ad.UnexpectedTracerError, r"transformation has already finished"):
        use(tracer)


def test_tracer_leaked_from_inner_jit_used_in_outer_jit():
    """A tracer of a finished inner jit, used while the outer jit is still
    tracing, is caught too."""

    def outer(x):
        escaped = []
        ad.jit(lambda y: escaped.append(y) or y)(x)
        return x + escaped[0]

    with clear_error(ad.UnexpectedTracerError, r"already finished"):
        ad.jit(outer)(np.ones(3))


# ---------------------------------------------------------------------------
# xla_call bound with arguments of the wrong types
# ---------------------------------------------------------------------------


def float64_vector_jaxpr() -> ad.Jaxpr:
    jaxpr, consts, _ = ad.make_jaxpr(lambda x: ad.sin(x) * 2.0, VEC3)
    assert consts == []
    return jaxpr


@pytest.mark.parametrize(
    "avals, given",
    [
        ((ShapedArray((2,), F64),), r"float64\[2\]"),
        ((ShapedArray((3, 1), F64),), r"float64\[3,1\]"),
        ((ShapedArray((3,), np.float32),), r"float32\[3\]"),
        ((ShapedArray((3,), np.int64),), r"int64\[3\]"),
        ((VEC3, VEC3), r"float64\[3\], float64\[3\]"),
        ((), r""),
    ],
    ids=["shape", "rank", "float32", "int64", "too-many", "too-few"],
)
def test_xla_call_with_wrong_argument_types_while_tracing(avals, given):
    """The abstract evaluation rule checks the arguments against the jaxpr
    and says what it takes and what it got."""
    jaxpr = float64_vector_jaxpr()

    def f(*xs):
        return ad.bind(ad.xla_call_p, *xs, jaxpr=jaxpr)

    takes = r"\(float64\[3\]\) -> \(float64\[3\]\)"
    match = rf"xla_call: the jaxpr takes {takes} but was called with \({given}\)$"
    with clear_error(TypeError, match):
        ad.make_jaxpr(f, *avals)


@pytest.mark.parametrize(
    "how, arg",
    [
        ("eager", np.ones(2)),
        ("eager", np.ones(3, np.float32)),
        ("eager", np.ones((3, 1))),
        ("eager", np.arange(3)),
        ("jvp", np.ones(2)),
        ("jvp", np.arange(3.0).reshape(1, 3)),
        ("vmap", np.ones(2)),
        ("vmap", np.arange(3).astype(np.int64)),
    ],
    ids=[
        "eager-shape",
        "eager-float32",
        "eager-rank-same-size",
        "eager-int64-same-size",
        "jvp-shape",
        "jvp-rank-same-size",
        "vmap-shape",
        "vmap-int64-same-size",
    ],
)
def test_xla_call_with_wrong_argument_types_outside_tracing(how, arg):
    """Bound directly (eagerly, or under jvp/vmap, whose rules run the
    transformed jaxpr eagerly), xla_call must reject arguments of the wrong
    type as it does while tracing, not hand them to the XLA executable (which
    fails with a runtime error, or, when the byte sizes agree, silently
    reinterprets the buffer)."""
    jaxpr = float64_vector_jaxpr()

    def call(x):
        return ad.bind(ad.xla_call_p, x, jaxpr=jaxpr)

    with clear_error(TypeError, r"xla_call: the jaxpr takes \(float64\[3\]\)"):
        if how == "eager":
            call(arg)
        elif how == "jvp":
            ad.jvp(call, (arg,), (np.ones_like(arg),))
        else:
            ad.vmap(call)(np.stack([arg, arg]))
