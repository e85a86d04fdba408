"""Programs modelled on JAX's own test files, run unchanged on both libraries.

Each program below is written here, in our own code, after a test in the
jax-ml/jax repository (named in its docstring: file and test method). It
takes the library as arguments (``lax``, ``jit``, ``vmap``, ``grad``,
``jnp``) and returns its results, so the very same Python runs once with
JAX and once with autodidax; the results must agree. That is SPEC §4's
promise: a program written for JAX runs after changing its imports.
"""

from __future__ import annotations

import types

import autodidax.lax as ad_lax
import autodidax.numpy as anp
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import autodidax as ad

pytestmark = pytest.mark.usefixtures("clean_interpreter_stack")

JAX = types.SimpleNamespace(
    lax=jax.lax, jit=jax.jit, vmap=jax.vmap, grad=jax.grad, jnp=jnp
)
OURS = types.SimpleNamespace(
    lax=ad_lax, jit=ad.jit, vmap=ad.vmap, grad=ad.grad, jnp=anp
)


def while_with_tuple(lib):
    """tests/lax_control_flow_test.py, testWhileWithTuple: a while_loop whose
    carry is a tuple, counting trips with lax.lt and lax.add on Python ints."""
    stop = 7

    def count_from(start):
        def more(state):
            return lib.lax.lt(state[0], stop)

        def step(state):
            return lib.lax.add(state[0], 1), lib.lax.add(state[1], 1)

        return lib.lax.while_loop(more, step, (start, 0))[1]

    return [count_from(1), lib.jit(count_from)(1), lib.jit(count_from)(4)]


def nested_while(lib):
    """tests/lax_control_flow_test.py, testNestedWhile: a while_loop whose
    body runs another while_loop; counts the inner trips."""

    def inner(i, total):
        def more(state):
            return lib.lax.lt(state[0], i)

        def step(state):
            return lib.lax.add(state[0], 1), lib.lax.add(state[1], 1)

        return lib.lax.while_loop(more, step, (0, total))[1]

    def outer(n):
        def more(state):
            return lib.lax.lt(state[1], state[0])

        def step(state):
            n, i, total = state
            return n, lib.lax.add(i, 1), inner(i, total)

        return lib.lax.while_loop(more, step, (n, 0, 0))[2]

    return [outer(4), lib.jit(outer)(5), lib.jit(outer)(0)]


def while_batched_predicate(lib):
    """tests/lax_control_flow_test.py, testWhileLoopBatched: vmap of a loop
    whose trip count depends on the batched input."""

    def halvings(x):
        def more(state):
            return state[0] > 1.0

        def step(state):
            return state[0] / 2.0, state[1] + 1.0

        return lib.lax.while_loop(more, step, (x, 0.0))[1]

    xs = np.array([1.0, 3.0, 40.0, 0.5])
    return [lib.vmap(halvings)(xs), lib.jit(lib.vmap(halvings))(xs)]


def fori_loop_sum(lib):
    """tests/lax_control_flow_test.py, testForiLoopBasic: fori_loop adding
    the loop index to a float carry; its gradient (a scan underneath)."""

    def f(x):
        return lib.lax.fori_loop(0, 6, lambda i, c: c * 1.5 + x, x)

    return [f(0.5), lib.jit(f)(0.5), lib.grad(f)(0.5)]


def cond_on_equality(lib):
    """tests/lax_control_flow_test.py, testCond: a jitted cond whose
    predicate compares the traced input with ==, then with <."""

    def f(x):
        y = lib.lax.cond(x == 3.0, lambda v: v + 10.0, lambda v: v * 2.0, x)
        return lib.lax.cond(x < 2.0, lambda v: -v, lambda v: v, y)

    return [lib.jit(f)(v) for v in (3.0, 1.0, 2.5)] + [lib.grad(f)(3.0)]


def cond_batched_predicate(lib):
    """tests/lax_control_flow_test.py, testCondBatched: vmap of cond with a
    batched predicate (a select of both branches) and its gradient."""

    def f(x, y):
        return lib.lax.cond(x >= y, lambda a, b: a * b, lambda a, b: a - b, x, y)

    xs, ys = np.array([1.0, 2.0, 3.0]), np.array([2.0, 2.0, 1.0])
    grads = lib.vmap(lib.grad(f))(xs, ys)
    return [lib.vmap(f)(xs, ys), grads]


def scan_cumulative(lib):
    """tests/lax_control_flow_test.py, testScanImpl: a scan carrying a
    running value and emitting one row per trip; its gradient."""

    def f(w, xs):
        def step(c, x):
            c = lib.jnp.tanh(c * w + x)
            return c, c * 2.0

        last, ys = lib.lax.scan(step, 0.1, xs)
        return last + lib.jnp.sum(ys)

    xs = np.linspace(-1.0, 1.0, 5)
    return [f(0.7, xs), lib.jit(f)(0.7, xs), lib.grad(f)(0.7, xs)]


def comparisons_and_where(lib):
    """tests/lax_numpy_operators_test.py, testOp over the comparison
    operators (equal, not_equal, less_equal, greater_equal): == != <= >=
    on traced arrays feeding jnp.where."""

    def f(x, y):
        both = lib.jnp.where(x != y, x, 0.0) + lib.jnp.where(x <= y, y, 1.0)
        return lib.jnp.where(x >= 2.0, both, -both)

    x, y = np.array([1.0, 2.0, 3.0, 2.0]), np.array([1.0, 3.0, 2.0, 2.0])
    return [lib.jit(f)(x, y), lib.vmap(f)(x, y)]


def mixed_dtypes(lib):
    """tests/dtypes_test.py, testBinaryPromotion: int32 and float32 arrays,
    Python numbers on either side, through jnp and the operators."""
    i = np.arange(4, dtype=np.int32)
    x = np.linspace(0.0, 1.0, 4).astype(np.float32)

    def f(i, x):
        return (i * x + 1, i / 2, i + 2, lib.jnp.sin(i), x * 2.0)

    return list(lib.jit(f)(i, x))


def methods(lib):
    """tests/lax_numpy_reducers_test.py, testReducer: reductions with axis=
    and keepdims=, here spelled as array methods (sum, mean, max, min) after
    reshape, .T and astype, under jit and grad."""

    def f(a):
        b = a.reshape(3, 2).T.astype(np.float64)
        return b.sum(axis=0) + b.mean(axis=1, keepdims=True).max() - b.min()

    a = np.arange(6.0) - 2.5
    return [lib.jit(f)(a), lib.grad(lambda a: f(a).sum())(a)]


PROGRAMS = [
    while_with_tuple,
    nested_while,
    while_batched_predicate,
    fori_loop_sum,
    cond_on_equality,
    cond_batched_predicate,
    scan_cumulative,
    comparisons_and_where,
    mixed_dtypes,
    methods,
]


@pytest.mark.parametrize("program", PROGRAMS, ids=[p.__name__ for p in PROGRAMS])
def test_program_runs_unchanged_and_agrees_with_jax(program):
    with jax.enable_x64(True):
        want = program(JAX)
    got = program(OURS)
    assert len(got) == len(want)
    for ours, theirs in zip(got, want):
        ours, theirs = np.asarray(ours), np.asarray(theirs)
        assert ours.shape == theirs.shape, (ours, theirs)
        assert ours.dtype == theirs.dtype, (ours.dtype, theirs.dtype)
        np.testing.assert_allclose(ours, theirs, rtol=1e-12, atol=1e-12)
