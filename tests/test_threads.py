"""Thread safety (issue 8): the interpreter state is per thread.

Several threads run grad, jit, vmap, cond and linearize at the same time, many
times, on inputs of their own (and of their own shapes), sharing some jitted
functions; every result is checked against NumPy. Barriers inside the traced
functions make sure the threads really are inside their transformations at the
same moment, with levels of their own on their own stacks. One thread raises in
the middle of a transformation while the others are inside theirs; that must
not disturb the others, and the failing thread carries on correctly.
"""

from __future__ import annotations

import threading
import traceback
from collections.abc import Callable

import numpy as np
import pytest

import autodidax as ad

pytestmark = pytest.mark.usefixtures("clean_interpreter_stack")

N_THREADS = 8
ROUNDS = 12
TIMEOUT = 120  # seconds for a barrier: generous, only to turn a hang into a failure


class Boom(Exception):
    pass


# Jitted functions shared by every thread (one trace per input shape).
shared_jit = ad.jit(lambda x: ad.sin(x) * 2.0 + x)
shared_cond = ad.jit(
    lambda x: ad.cond(ad.reduce_sum(x) > 0.0, lambda y: ad.sin(y) * y, ad.cos, x)
)
shared_grad = ad.jit(ad.grad(lambda x: ad.reduce_sum(ad.sin(x) * x)))


def np_cond(x):
    return np.sin(x) * x if x.sum() > 0.0 else np.cos(x)


def np_cond_slope(x):
    """d/dx of the cond above, elementwise."""
    return np.sin(x) + x * np.cos(x) if x.sum() > 0.0 else -np.sin(x)


def close(a, b) -> None:
    np.testing.assert_allclose(np.asarray(a), b, rtol=1e-10, atol=1e-12)


def one_round(k: int, i: int, rng: np.random.Generator) -> int:
    """Every transformation once, on this thread's inputs; returns the number
    of checked results."""
    n = 2 + k % 3  # threads use different shapes, so traces differ too
    x = rng.uniform(-2.0, 2.0, size=n)
    t = rng.uniform(-1.0, 1.0, size=n)
    m = rng.uniform(-2.0, 2.0, size=(3, n))
    checks = 0

    close(ad.grad(lambda v: ad.reduce_sum(ad.sin(v) * v))(x), np.cos(x) * x + np.sin(x))
    close(shared_grad(x), np.cos(x) * x + np.sin(x))
    close(shared_jit(x), np.sin(x) * 2.0 + x)
    close(ad.vmap(lambda r: ad.reduce_sum(ad.sin(r) * r))(m), (np.sin(m) * m).sum(1))
    close(ad.vmap(shared_jit, 1, 1)(m), np.sin(m) * 2.0 + m)
    close(shared_cond(x), np_cond(x))
    checks += 6

    # cond per example under vmap (a batched predicate), and its derivative
    # per scalar example. (vmap of grad of a cond with vector examples is
    # tested in test_hypothesis.py; here the point is concurrency.)
    per_example = ad.vmap(shared_cond)(m)
    close(per_example, np.stack([np_cond(r) for r in m]))
    scalars = m[:, 0]
    slopes = ad.vmap(ad.grad(shared_cond))(scalars)
    close(slopes, np.array([np_cond_slope(np.array(s)) for s in scalars]))
    checks += 2

    # linearize and vjp of a cond inside jit.
    y, f_lin = ad.linearize(shared_cond, x)
    close(y, np_cond(x))
    close(f_lin(t), np_cond_slope(x) * t)
    _, f_vjp = ad.vjp(shared_cond, x)
    close(f_vjp(t)[0], np_cond_slope(x) * t)
    checks += 3

    # A second derivative through jit: d^2/dx^2 sum(sin(x) * x * c), with a
    # new jitted inner gradient now and then (tracing and compiling while
    # the other threads run).
    c = np.full(n, float(k + i))
    inner = shared_weighted_grad if i % 4 else ad.jit(ad.grad(weighted))
    hess_diag = ad.grad(lambda v: ad.reduce_sum(inner(v, c)))(x)
    close(hess_diag, c * (2.0 * np.cos(x) - x * np.sin(x)))
    checks += 1
    return checks


def weighted(w, c):
    return ad.reduce_sum(ad.sin(w) * w * c)


shared_weighted_grad = ad.jit(ad.grad(weighted))


def run_threads(work: Callable[[int], int], n: int = N_THREADS) -> list[int]:
    """Run ``work(k)`` in ``n`` threads; re-raise the first failure with its
    thread's traceback; return what each returned."""
    results: list = [None] * n
    errors: list = []

    def target(k: int) -> None:
        try:
            results[k] = work(k)
            assert len(ad._state.stack) == 1, "the thread's stack was not popped"
            assert ad._state.dynamic is ad._state.stack[0]
        except BaseException as err:  # reported in the main thread
            errors.append((k, err, traceback.format_exc()))

    threads = [threading.Thread(target=target, args=(k,)) for k in range(n)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=10 * TIMEOUT)
    assert not any(thread.is_alive() for thread in threads), "a thread hung"
    if errors:
        k, err, text = errors[0]
        raise AssertionError(f"thread {k} failed:\n{text}") from err
    return results


def test_every_thread_has_its_own_stack():
    """Each thread starts with a fresh evaluation level of its own."""
    main_level = ad._state.stack[0]

    def work(k: int) -> int:
        assert len(ad._state.stack) == 1
        assert ad._state.stack[0] is not main_level
        assert ad._state.dynamic is ad._state.stack[0]
        return 1

    assert run_threads(work) == [1] * N_THREADS


def test_concurrent_transformations_give_right_answers():
    """All threads inside their transformations at once, then many rounds of
    every transformation, every result checked."""
    inside = threading.Barrier(N_THREADS, timeout=TIMEOUT)

    def work(k: int) -> int:
        rng = np.random.default_rng(k)
        depths = []

        def rendezvous(x):
            # Everyone waits here while tracing (jit of grad of vmap), so all
            # threads have three levels of their own on the stack at once.
            depths.append(len(ad._state.stack))
            inside.wait()
            y = ad.sin(x) * float(k)
            inside.wait()
            return y

        x = rng.uniform(-1.0, 1.0, size=(2, 3))
        f = ad.jit(ad.grad(lambda v: ad.reduce_sum(ad.vmap(rendezvous)(v))))
        close(f(x), np.cos(x) * k)
        assert depths and all(d >= 3 for d in depths), depths
        checks = 1
        for i in range(ROUNDS):
            checks += one_round(k, i, rng)
        return checks

    results = run_threads(work)
    assert results == [1 + 12 * ROUNDS] * N_THREADS


def test_a_failing_thread_does_not_disturb_the_others():
    """One thread raises inside jit-of-grad-of-cond while all the others are
    inside their own transformations; everyone's results stay right and the
    failing thread carries on afterwards."""
    bad = 3
    inside = threading.Barrier(N_THREADS, timeout=TIMEOUT)
    after = threading.Barrier(N_THREADS, timeout=TIMEOUT)

    def work(k: int) -> int:
        rng = np.random.default_rng(100 + k)
        x = rng.uniform(-1.0, 1.0, size=3)

        def branch(y):
            inside.wait()  # all threads are tracing a cond branch now
            if k == bad:
                raise Boom("raised mid-transformation")
            return ad.sin(y) * y

        def f(v):
            return ad.reduce_sum(ad.cond(ad.reduce_sum(v) > -10.0, branch, ad.cos, v))

        g = ad.jit(ad.grad(f))
        if k == bad:
            with pytest.raises(Boom):
                g(x)
            assert len(ad._state.stack) == 1
            assert ad._state.dynamic is ad._state.stack[0]
        else:
            # While the bad thread unwinds, the others finish theirs.
            close(g(x), np.sin(x) + x * np.cos(x))
        after.wait()
        checks = 0
        for i in range(ROUNDS // 2):
            checks += one_round(k, i, rng)
        return checks

    results = run_threads(work)
    assert results == [12 * (ROUNDS // 2)] * N_THREADS


def test_threads_share_a_jitted_function_while_it_is_first_traced():
    """Many threads call one new jitted function for the first time together:
    every call is right, whoever traces it."""
    start = threading.Barrier(N_THREADS, timeout=TIMEOUT)
    f = ad.jit(lambda x, y: ad.cos(x) * y + ad.sin(y))

    def work(k: int) -> int:
        x = np.linspace(-1.0, 1.0, 4) + k
        start.wait()
        for c in range(5):
            y = np.full(4, float(c))
            close(f(x, y), np.cos(x) * y + np.sin(y))
        return 5

    assert run_threads(work) == [5] * N_THREADS
