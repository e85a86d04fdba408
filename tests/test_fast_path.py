"""The dispatch fast path of the performance page, next to the full path.

``autodidax.jit`` (the performance page's) remembers, per input signature, what
a call needs, and takes a shortcut for Python numbers, NumPy scalars, NumPy
arrays and device Arrays; ``autodidax.full_path_jit`` is Part 3's ``jit``
without it. These tests check that the shortcut changes nothing but the time:
the same results (compared with the full path exactly and with ``jax.jit`` to
1e-9), the same errors, the same dtypes, the same retracing, and that it is
never entered while a transformation is running (a spy on ``FastCall``
counts every entry; no timing anywhere).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import autodidax as ad

pytestmark = pytest.mark.usefixtures("clean_interpreter_stack")

TOL = 1e-9


@pytest.fixture
def fast_entries(monkeypatch) -> list:
    """A list that grows by one signature every time any jitted function
    takes the fast path (a spy on ``FastCall.__call__``)."""
    entered: list = []
    original = ad.FastCall.__call__

    def spy(self, args):
        entered.append(ad.input_signature(args))
        return original(self, args)

    monkeypatch.setattr(ad.FastCall, "__call__", spy)
    return entered


def counted(f: Callable) -> Callable:
    """``f``, counting how often it runs (that is, how often it is traced)."""

    def wrapper(*args):
        wrapper.calls += 1
        return f(*args)

    wrapper.calls = 0
    return wrapper


def leaves(tree: Any) -> list:
    return jax.tree_util.tree_leaves(tree, is_leaf=lambda x: isinstance(x, ad.Array))


def assert_same(ours: Any, full: Any) -> None:
    """Fast and full path: same structure, types, shapes, dtypes, values."""
    assert jax.tree_util.tree_structure(
        ours, is_leaf=lambda x: isinstance(x, ad.Array)
    ) == jax.tree_util.tree_structure(full, is_leaf=lambda x: isinstance(x, ad.Array))
    for a, b in zip(leaves(ours), leaves(full)):
        assert type(a) is type(b) is ad.Array
        assert a.shape == b.shape and a.dtype == b.dtype
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def assert_like_jax(ours: Any, expected: Any) -> None:
    """Ours against JAX's: same dtypes and shapes, values within 1e-9."""
    for a, b in zip(leaves(ours), jax.tree_util.tree_leaves(expected)):
        b = np.asarray(b)
        assert np.asarray(a).dtype == b.dtype and a.shape == b.shape
        np.testing.assert_allclose(np.asarray(a), b, rtol=TOL, atol=TOL)


# Functions written once for both libraries, per kind of dtype.
def float_program(lib) -> Callable:
    return lambda x: (lib.sin(x) * 2.0 + x, lib.cos(x) * x)


def int_program(lib) -> Callable:
    return lambda x: x * x + x * 3


def bool_program(lib) -> Callable:
    return lambda x: x + x if lib is ad else x | x


def programs_for(x: Any) -> tuple[Callable, Callable]:
    kind = np.asarray(x).dtype.kind
    make = {"f": float_program, "i": int_program, "u": int_program}.get(
        kind, bool_program
    )
    return make(ad), make(jnp)


INPUTS = {
    "python float": lambda: 0.75,
    "python int": lambda: 7,
    "python bool": lambda: True,
    "numpy float64 scalar": lambda: np.float64(-0.25),
    "numpy float32 scalar": lambda: np.float32(1.5),
    "numpy int64 scalar": lambda: np.int64(-4),
    "numpy int32 scalar": lambda: np.int32(5),
    "numpy bool scalar": lambda: np.bool_(False),
    "0-d float64 array": lambda: np.array(2.5),
    "float64[2,3] array": lambda: np.linspace(-1.0, 1.0, 6).reshape(2, 3),
    "float32[4] array": lambda: np.linspace(0.0, 1.0, 4, dtype=np.float32),
    "int32[3] array": lambda: np.array([1, -2, 3], np.int32),
    "bool[2] array": lambda: np.array([True, False]),
    "strided float64[3] array": lambda: np.arange(6.0)[::2],
    "fortran-order float64[2,3]": lambda: np.asfortranarray(
        np.arange(6.0).reshape(2, 3)
    ),
    "device float64[3] Array": lambda: ad.device_put(np.array([0.1, 0.2, 0.3])),
    "device 0-d int64 Array": lambda: ad.device_put(np.array(9)),
}


@pytest.mark.parametrize("name", list(INPUTS))
def test_fast_path_agrees_with_full_path_and_jax(name, fast_entries):
    """After one full call, repeated calls take the fast path and return
    exactly what Part 3's jit returns, which agrees with jax.jit."""
    x = INPUTS[name]()
    ours_fn, jax_fn = programs_for(x)
    f = ad.jit(counted(ours_fn))
    first = f(x)
    assert fast_entries == [] and len(f.fast_calls) == 1
    again = [f(x) for _ in range(3)]
    assert len(fast_entries) == 3 and f.__wrapped__.calls == 1
    full = ad.full_path_jit(ours_fn)(x)
    x_jax = jax.device_put(np.asarray(x)) if isinstance(x, ad.Array) else x
    expected = jax.jit(jax_fn)(x_jax)
    for result in (first, *again):
        assert_same(result, full)
        assert_like_jax(result, expected)


def test_key_of_a_number_is_what_numpy_makes_of_it():
    """The signature of a Python number is NumPy's shape and dtype for it, so a
    number, the NumPy scalar and the 0-d array of that dtype share an entry."""
    for number in (0.5, 3, True):
        expected = (np.asarray(number).shape, np.asarray(number).dtype)
        assert ad.input_signature((number,)) == (expected,)
        same = (np.asarray(number)[()], np.asarray(number))
        assert ad.input_signature(same) == (expected, expected)
    # Outside int64, NumPy makes a uint64 or an object array: no key.
    for big in (2**63, 2**64, -(2**63) - 1):
        assert ad.input_signature((big,)) is None
    assert ad.input_signature((2**63 - 1, -(2**63))) is not None
    # Not arrays or numbers NumPy turns into booleans, integers or floats.
    for other in ("a", None, [1.0], (1.0,), 1j, np.complex128(1j), np.str_("a")):
        assert ad.input_signature((other,)) is None
    assert ad.input_signature((np.ma.masked_array([1.0]),)) is None


def test_retraces_when_the_signature_changes(fast_entries):
    """A new shape or dtype is traced once and gets its own entry; inputs that
    the full path traces alike share an entry."""
    body = counted(lambda x: x + x)
    f = ad.jit(body)
    cases = [  # (argument, traces so far, entries so far)
        (1.0, 1, 1),
        (np.float64(2.0), 1, 1),
        (np.array(3.0), 1, 1),
        (ad.device_put(np.array(4.0)), 1, 1),
        (np.float32(1.0), 2, 2),
        (5, 3, 3),
        (np.int64(6), 3, 3),
        (True, 4, 4),
        (np.bool_(False), 4, 4),
        (np.ones(3), 5, 5),
        (2**63, 6, 5),  # uint64 for NumPy: traced, but no entry (full path)
        (2**63 + 1, 6, 5),
    ]
    for x, traces, entries in cases:
        out = f(x)
        host = np.asarray(x)
        np.testing.assert_array_equal(np.asarray(out), host + host)
        assert np.asarray(out).dtype == host.dtype
        assert body.calls == traces and len(f.fast_calls) == entries
    assert len(fast_entries) == 5  # the calls that found an entry


def test_dtypes_follow_numpy_not_weak_types():
    """autodidax has no weak types: a Python float argument is float64, as
    np.asarray makes it, on both paths. JAX keeps it weakly typed, which shows
    when it meets a float32 array: JAX computes in float32, we promote to
    float64, on both paths alike."""
    f = ad.jit(lambda x: x * 2.0)  # a Python scalar inside the function
    g = ad.jit(lambda x, y: x * y)  # a Python scalar as an argument
    for _ in range(2):  # a full call, then a call that may take the fast path
        assert f(np.float32(1.5)).dtype == np.float32
        assert f(1.5).dtype == np.float64
        assert g(2.0, 3.0).dtype == np.float64
        assert g(2, 3).dtype == np.int64
    assert jax.jit(lambda x, y: x * y)(np.ones(3, np.float32), 2.0).dtype == (
        np.float32
    )
    args = (np.ones(3, np.float32), 2.0)
    expected = ad.full_path_jit(lambda x, y: x * y)(*args)
    assert expected.dtype == np.float64
    for _ in range(2):  # a full call that adds an entry, then the fast path
        out = g(*args)
        assert out.dtype == expected.dtype
        np.testing.assert_array_equal(np.asarray(out), np.asarray(expected))
    signature = (((3,), np.dtype(np.float32)), ((), np.dtype(np.float64)))
    assert signature in g.fast_calls


def error_of(fn: Callable, *args: Any) -> tuple[type, str]:
    """The type and message of the exception ``fn(*args)`` raises."""
    with pytest.raises(Exception) as info:
        fn(*args)
    return type(info.value), str(info.value)


def test_errors_are_the_full_paths(fast_entries):
    """With entries for numbers and arrays in the table, bad arguments raise
    exactly what Part 3's jit raises (a clear TypeError or ValueError), never
    enter the fast path, and leave the entries working."""

    def body(x, y):
        return x * y + 1.0

    warm = ad.jit(body)
    warm(1.0, 2.0)
    warm(np.ones(3), np.ones(3))
    assert len(warm.fast_calls) == 2
    leaked: list = []
    ad.jit(lambda z: leaked.append(z) or z)(1.0)
    bad_calls = [
        ("text", 2.0),
        (None, 2.0),
        (1j, 2.0),
        (np.complex128(1j), 2.0),
        (np.longdouble(1.0), np.longdouble(2.0)),  # no XLA type
        (np.str_("a"), 2.0),
        (2**64, 2.0),  # an object array for NumPy
        (np.ones(3), np.ones(2)),  # shapes differ
        (np.array(["a", "b", "c"]), np.ones(3)),
        (np.ones(3, dtype=object), np.ones(3)),
        (leaked[0], 2.0),  # a tracer that escaped its transformation
    ]
    for args in bad_calls:
        expected = error_of(ad.full_path_jit(body), *args)
        assert issubclass(expected[0], (TypeError, ValueError)), (args, expected)
        assert error_of(warm, *args) == expected, args
        assert error_of(ad.jit(body), *args) == expected, args
    assert fast_entries == [] and len(warm.fast_calls) == 2
    np.testing.assert_array_equal(np.asarray(warm(3.0, 2.0)), 7.0)
    np.testing.assert_array_equal(np.asarray(warm(np.ones(3), np.ones(3))), 2.0)
    assert len(fast_entries) == 2


def test_not_taken_under_transformations(fast_entries):
    """Under jvp, vmap, grad, linearize, make_jaxpr and an outer jit the fast
    path is never entered, even for numbers and arrays it has entries for,
    and every result agrees with JAX."""
    f = ad.jit(lambda x: ad.sin(x) * x)
    f_jax = jax.jit(lambda x: jnp.sin(x) * x)
    v = np.array([0.5, -1.0, 2.0])
    f(0.5)
    f(v)
    f(np.float64(0.5))
    assert len(fast_entries) == 1 and len(f.fast_calls) == 2
    fast_entries.clear()

    def close(ours, expected):
        np.testing.assert_allclose(
            np.asarray(ours), np.asarray(expected), rtol=TOL, atol=TOL
        )

    primal, tangent = ad.jvp(f, (0.5,), (1.0,))
    expected = jax.jvp(f_jax, (0.5,), (1.0,))
    close(primal, expected[0])
    close(tangent, expected[1])
    close(ad.vmap(f)(np.stack([v, 2.0 * v])), jax.vmap(f_jax)(np.stack([v, 2 * v])))
    close(ad.grad(f)(0.5), jax.grad(f_jax)(0.5))
    close(
        ad.grad(lambda x: ad.reduce_sum(f(x)))(v), jax.grad(lambda x: f_jax(x).sum())(v)
    )
    y, f_lin = ad.linearize(f, 0.5)
    close(f_lin(1.0), jax.linearize(f_jax, 0.5)[1](1.0))
    # Staged out: make_jaxpr and an outer jit record the call, even with
    # concrete numbers as its arguments.
    jaxpr, _, _ = ad.make_jaxpr(lambda: f(0.5) + f(np.float64(0.5)))
    assert [e.primitive.name for e in jaxpr.eqns] == ["xla_call", "xla_call", "add"]
    outer = ad.jit(lambda x: f(0.5) * x)
    close(outer(v), f_jax(0.5) * v)
    close(outer(v), f_jax(0.5) * v)  # outer's own fast path: f stays inside
    assert fast_entries == [((v.shape, v.dtype),)]  # only outer's second call


def test_numbers_results_feed_back_in(fast_entries):
    """A loop on a Python float: the first call traces, every later one takes
    the fast path with the Array it returned, and the values follow NumPy."""
    step = ad.jit(lambda x, h: x - h * ad.sin(x))
    x, x_np = 1.0, 1.0
    for _ in range(10):
        x = step(x, 0.1)
        x_np = x_np - 0.1 * np.sin(x_np)
    assert isinstance(x, ad.Array) and len(fast_entries) == 9
    np.testing.assert_allclose(float(x), x_np, rtol=TOL)


def python_functions_of_a_call(f: Callable, *args: Any) -> list[str]:
    """The names of the Python functions that start while ``f(*args)`` runs."""
    import sys

    names: list[str] = []

    def note(frame, event, arg):
        if event == "call":
            names.append(frame.f_code.co_name)

    sys.setprofile(note)
    try:
        f(*args)
    finally:
        sys.setprofile(None)
    return names


def test_a_repeated_call_skips_bind_and_the_caches():
    # the page's demo: a repeated call of Part 3's jit runs bind once and more than a
    # hundred Python functions; the new jit's runs neither bind nor a cache lookup.
    def scaled(x, y):
        return ad.sin(x) * 2.0 + y

    a, b = ad.device_put(np.linspace(0.0, 1.0, 4)), np.ones(4)
    full, fast = ad.full_path_jit(scaled), ad.jit(scaled)
    full(a, b), fast(a, b)  # the first calls trace and compile
    full_names = python_functions_of_a_call(full, a, b)
    fast_names = python_functions_of_a_call(fast, a, b)
    assert full_names.count("bind") == 1
    assert "trace_for_call" in full_names
    assert len(full_names) > 100
    assert "bind" not in fast_names and "trace_for_call" not in fast_names
    assert fast_names[:2] == ["f_jitted", "input_signature"]
    assert "__call__" in fast_names and len(fast_names) <= 10


def test_pytrees_keywords_and_static_arguments(fast_entries):
    """A training-step-like call (a dict of parameters, a tuple state, a
    keyword learning rate, a static keyword) takes the fast path once it has
    been made; its results equal the full path's and JAX's. A changed dict key,
    static value or leaf dtype is a new signature: traced, not a fast hit."""

    def step(params, state, x, *, lr, power):
        m, t = state
        loss = ((params["w"] * x + params["b"]) ** power).sum()
        new = {"b": params["b"] - lr * m, "w": params["w"] * (1.0 - lr)}
        return new, (m + loss, t + 1), loss

    def step_jax(params, state, x, *, lr, power):  # ad.jit's ** takes static ints
        return step(params, state, x, lr=lr, power=power)

    params = {"w": np.linspace(0.5, 1.5, 3), "b": np.array(0.25)}
    state, x = (np.array(0.0), 0), np.arange(3.0)
    traced: list = []

    def body(params, state, x, *, lr, power):
        traced.append(power)
        return step(params, state, x, lr=lr, power=power)

    f = ad.jit(body, static_argnames="power")
    full = ad.full_path_jit(step, static_argnames="power")
    f_jax = jax.jit(step_jax, static_argnames="power")
    out = f(params, state, x, lr=0.1, power=2)  # full path: an entry
    assert fast_entries == [] and len(f.fast_calls) == 1
    for _ in range(2):  # results fed back in: device Arrays and numbers mixed
        expected = full(params, state, x, lr=0.1, power=2)
        out = f(params, state, x, lr=0.1, power=2)
        assert_same(out, expected)
        on_host = jax.tree_util.tree_map(np.asarray, (params, state, x))
        assert_like_jax(out, f_jax(*on_host, lr=0.1, power=2))
        params, state = out[0], out[1]
    assert len(fast_entries) == 2 and len(traced) == 1
    # New signatures: each traces once and misses the entries made before.
    changed = [
        (({**params, "extra": x}, state, x), dict(lr=0.1, power=2)),  # a dict key
        ((params, state, x), dict(lr=0.1, power=3)),  # a static value
        ((params, state, x.astype(np.float32)), dict(lr=0.1, power=2)),  # a dtype
        ((params, (state[0], 1.5), x), dict(lr=0.1, power=2)),  # int -> float
    ]
    for i, (args, kwargs) in enumerate(changed):
        assert_same(f(*args, **kwargs), full(*args, **kwargs))
        assert len(traced) == 2 + i and len(fast_entries) == 2
    assert len(f.fast_calls) == 1 + len(changed)
