"""Property-based tests of ``while_loop`` and ``fori_loop`` (Part 6) with
Hypothesis.

The body of each loop is a random program from the generator of
tests/test_hypothesis.py (its ``branch``, the generator of cond branches:
every primitive, nested conds, closures), from (float carries, the trip's
index as a float64 scalar, a closed-over value) to the new float carries, all
float64. It runs 0-3 trips in three kinds of loop:

- ``fori_loop(0, n, body, init)`` with ``n`` a Python int: a ``scan`` since
  Part 7. Checked under eval, jit, jvp, vmap (every argument batched), grad
  and jit(grad).
- ``fori_loop(0, n, body, init)`` with ``n`` an int32 array, an argument of
  the function (so traced under jit and vmap): a ``while_loop``. Checked
  under eval, jit, jvp, jvp(jit), and vmap with ``n`` batched too (a
  different trip count per example). Not grad: reverse mode through
  ``while_loop`` is refused by design.
- ``while_loop(counter < k, body, (counter, *carries))`` where the body also
  increments the int32 counter, and the function returns the float carries
  and the final counter as a float. Checked under eval, jit, jvp, and vmap,
  jit(vmap), vmap(jit) both with ``k`` shared by the batch and with ``k``
  batched (the loop runs while any example runs).

Every program is interpreted with autodidax and with jax.lax, and the results
must agree to 1e-9. This file does not change the programs of
tests/test_hypothesis.py; it reuses its generator and interpreters.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, note, settings
from hypothesis import strategies as st
from jax import lax
from test_hypothesis import FLT, Autodidax, Jax, Program, branch, run, shapes

import autodidax as ad

pytestmark = pytest.mark.usefixtures("clean_interpreter_stack")

TOL = 1e-9
F64 = np.float64
I32 = np.int32
EXAMPLES = settings(max_examples=max(4, settings().max_examples // 3))

OURS = SimpleNamespace(
    interp=Autodidax,
    fori_loop=ad.fori_loop,
    while_loop=ad.while_loop,
    to_float=lambda i: ad.convert_element_type(i, F64),
)
JAX = SimpleNamespace(
    interp=Jax,
    fori_loop=lax.fori_loop,
    while_loop=lax.while_loop,
    to_float=lambda i: lax.convert_element_type(i, F64),
)


@dataclass(frozen=True)
class LoopProgram:
    """A loop body and two trip counts: ``trips`` for a single run, and
    ``other_trips`` for the second example when the bound is batched."""

    carry_shapes: tuple
    captured_shapes: tuple
    body: Program
    trips: int
    other_trips: int

    def args(self, rng: np.random.Generator) -> list[np.ndarray]:
        """Initial carries, then captured values: uniform in [-1, 1]."""
        shapes_ = [*self.carry_shapes, *self.captured_shapes]
        return [rng.uniform(-1.0, 1.0, size=s) for s in shapes_]

    def step(self, lib, index, carries: tuple, captured: list) -> tuple:
        """One trip of the body: the new float carries."""
        inputs = [*carries, lib.to_float(index), *captured]
        return tuple(run(self.body, lib.interp, inputs))

    def fori_static(self, lib):
        """``(*init, *captured) -> carries``, with Python-int bounds."""
        n_carry = len(self.carry_shapes)

        def f(*args):
            init, captured = tuple(args[:n_carry]), list(args[n_carry:])

            def body(i, carries):
                return self.step(lib, i, carries, captured)

            return lib.fori_loop(0, self.trips, body, init)

        return f

    def fori_traced(self, lib):
        """``(n, *init, *captured) -> carries``, with ``n`` an int32 scalar."""
        n_carry = len(self.carry_shapes)

        def f(n, *args):
            init, captured = tuple(args[:n_carry]), list(args[n_carry:])

            def body(i, carries):
                return self.step(lib, i, carries, captured)

            return lib.fori_loop(0, n, body, init)

        return f

    def while_(self, lib):
        """``(k, *init, *captured) -> (*carries, float(counter))``: a
        while_loop that runs while its int32 counter is below ``k``."""
        n_carry = len(self.carry_shapes)

        def f(k, *args):
            init, captured = tuple(args[:n_carry]), list(args[n_carry:])

            def cond_fun(carry):
                return carry[0] < k

            def body_fun(carry):
                counter, carries = carry
                return counter + 1, self.step(lib, counter, carries, captured)

            counter, carries = lib.while_loop(cond_fun, body_fun, (I32(0), init))
            return (*carries, lib.to_float(counter))

        return f


@st.composite
def loop_programs(draw) -> LoopProgram:
    carry_shapes = tuple(draw(st.lists(shapes(1), min_size=1, max_size=2)))
    captured_shapes = tuple(draw(st.lists(shapes(1), max_size=1)))
    in_types = [(s, FLT) for s in (*carry_shapes, (), *captured_shapes)]
    out_types = [(s, FLT) for s in carry_shapes]
    body = branch(draw, in_types, out_types, depth=1)
    # 0-3 trips, shrinking toward one trip (zero trips test little), and the
    # second example's count shrinking toward a different one.
    trips = draw(st.sampled_from((1, 2, 3, 0)))
    other_trips = draw(st.sampled_from((2, 0, 3, 1)))
    return LoopProgram(carry_shapes, captured_shapes, body, trips, other_trips)


def leaves(tree) -> list[np.ndarray]:
    return [np.asarray(x, np.float64) for x in jax.tree_util.tree_leaves(tree)]


def assert_close(ours, theirs) -> None:
    a, b = leaves(ours), leaves(theirs)
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert x.shape == y.shape
        np.testing.assert_allclose(x, y, rtol=TOL, atol=TOL)


def _show(prog: LoopProgram) -> None:
    note(prog.body.pretty())
    note(f"trips={prog.trips} other_trips={prog.other_trips}")


def _batch(args: list[np.ndarray]) -> list[np.ndarray]:
    """A batch of two examples of every argument."""
    return [np.stack([a, a * 0.5]) for a in args]


def _loss(f, total, sin):
    def loss(args):
        return sum(total(sin(x)) for x in jax.tree_util.tree_leaves(f(*args)))

    return loss


# ---------------------------------------------------------------------------
# fori_loop with Python-int bounds: a scan
# ---------------------------------------------------------------------------


@EXAMPLES
@given(prog=loop_programs(), seed=st.integers(0, 2**16))
def test_fori_static_eval_jit_jvp(prog, seed):
    _show(prog)
    ours, theirs = prog.fori_static(OURS), prog.fori_static(JAX)
    args = prog.args(np.random.default_rng(seed))
    expected = theirs(*args)
    assert_close(ours(*args), expected)
    assert_close(ad.jit(ours)(*args), expected)
    dots = [np.cos(a) for a in args]
    assert_close(ad.jvp(ours, tuple(args), tuple(dots)), jax.jvp(theirs, args, dots))


@EXAMPLES
@given(prog=loop_programs(), seed=st.integers(0, 2**16))
def test_fori_static_vmap(prog, seed):
    _show(prog)
    ours, theirs = prog.fori_static(OURS), prog.fori_static(JAX)
    batch = _batch(prog.args(np.random.default_rng(seed)))
    assert_close(ad.vmap(ours)(*batch), jax.vmap(theirs)(*batch))


@EXAMPLES
@given(prog=loop_programs(), seed=st.integers(0, 2**16))
def test_fori_static_grad(prog, seed):
    _show(prog)
    ours, theirs = prog.fori_static(OURS), prog.fori_static(JAX)
    args = tuple(prog.args(np.random.default_rng(seed)))
    expected = jax.grad(_loss(theirs, jnp.sum, jnp.sin))(args)
    our_loss = _loss(ours, ad.reduce_sum, ad.sin)
    assert_close(ad.grad(our_loss)(args), expected)
    assert_close(ad.jit(ad.grad(our_loss))(args), expected)


# ---------------------------------------------------------------------------
# fori_loop with an int32 array bound: a while_loop
# ---------------------------------------------------------------------------


@EXAMPLES
@given(prog=loop_programs(), seed=st.integers(0, 2**16))
def test_fori_traced_eval_jit_jvp(prog, seed):
    _show(prog)
    ours, theirs = prog.fori_traced(OURS), prog.fori_traced(JAX)
    n = I32(prog.trips)
    args = prog.args(np.random.default_rng(seed))
    expected = theirs(n, *args)
    assert_close(ours(n, *args), expected)
    assert_close(ad.jit(ours)(n, *args), expected)
    dots = [np.cos(a) for a in args]
    expected = jax.jvp(lambda *xs: theirs(n, *xs), args, dots)
    assert_close(ad.jvp(lambda *xs: ours(n, *xs), tuple(args), tuple(dots)), expected)
    jitted = ad.jit(ours)  # the bound is traced inside jvp
    assert_close(ad.jvp(lambda *xs: jitted(n, *xs), tuple(args), tuple(dots)), expected)


@EXAMPLES
@given(prog=loop_programs(), seed=st.integers(0, 2**16))
def test_fori_traced_vmap(prog, seed):
    """Every argument batched, the bound too: a trip count per example."""
    _show(prog)
    ours, theirs = prog.fori_traced(OURS), prog.fori_traced(JAX)
    n = np.array([prog.trips, prog.other_trips], I32)
    batch = [n, *_batch(prog.args(np.random.default_rng(seed)))]
    assert_close(ad.vmap(ours)(*batch), jax.vmap(theirs)(*batch))


# ---------------------------------------------------------------------------
# while_loop with a counter in the carry
# ---------------------------------------------------------------------------


@EXAMPLES
@given(prog=loop_programs(), seed=st.integers(0, 2**16))
def test_while_eval_jit_jvp(prog, seed):
    _show(prog)
    ours, theirs = prog.while_(OURS), prog.while_(JAX)
    k = I32(prog.trips)
    args = prog.args(np.random.default_rng(seed))
    expected = theirs(k, *args)
    assert_close(ours(k, *args), expected)
    assert_close(ad.jit(ours)(k, *args), expected)
    dots = [np.cos(a) for a in args]
    expected = jax.jvp(lambda *xs: theirs(k, *xs), args, dots)
    assert_close(ad.jvp(lambda *xs: ours(k, *xs), tuple(args), tuple(dots)), expected)


@EXAMPLES
@given(prog=loop_programs(), seed=st.integers(0, 2**16), shared=st.booleans())
def test_while_vmap(prog, seed, shared):
    """vmap, jit(vmap) and vmap(jit), with the bound ``k`` shared by the
    batch (an unbatched predicate) or one per example (a batched one)."""
    _show(prog)
    note(f"shared={shared}")
    ours, theirs = prog.while_(OURS), prog.while_(JAX)
    batch = _batch(prog.args(np.random.default_rng(seed)))
    if shared:
        k, in_axes = I32(prog.trips), (None, *[0] * len(batch))
    else:
        k, in_axes = np.array([prog.trips, prog.other_trips], I32), 0
    expected = jax.vmap(theirs, in_axes)(k, *batch)
    assert_close(ad.vmap(ours, in_axes)(k, *batch), expected)
    assert_close(ad.jit(ad.vmap(ours, in_axes))(k, *batch), expected)
    assert_close(ad.vmap(ad.jit(ours), in_axes)(k, *batch), expected)
