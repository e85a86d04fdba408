"""Property-based tests of ``scan`` (Part 7) with Hypothesis.

The body of each scan is a random program from the generator of
tests/test_hypothesis.py (its ``branch``, the generator of cond branches:
every primitive, nested conds, closures), from (carries, rows of xs, a
closed-over value) to (carries, ys), all float64. The scan runs 0-3 trips,
forwards or in reverse. It is interpreted with autodidax and with jax.lax,
under eval, jit, jvp, vmap (every argument batched), grad and jit(grad), and
the results must agree to 1e-9. This file does not change the programs of
tests/test_hypothesis.py; it reuses its generator and interpreters.
"""

from __future__ import annotations

from dataclasses import dataclass

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
EXAMPLES = settings(max_examples=max(4, settings().max_examples // 2))


@dataclass(frozen=True)
class ScanProgram:
    carry_shapes: tuple
    row_shapes: tuple
    captured_shapes: tuple
    body: Program
    length: int
    reverse: bool

    def args(self, rng: np.random.Generator) -> list[np.ndarray]:
        """Initial carries, xs, captured values: uniform in [-1, 1]."""
        shapes_ = [
            *self.carry_shapes,
            *[(self.length, *s) for s in self.row_shapes],
            *self.captured_shapes,
        ]
        return [rng.uniform(-1.0, 1.0, size=s) for s in shapes_]

    def function(self, scan, lib):
        """``(*init, *xs, *captured) -> (carries, ys)`` with ``scan`` and
        the program interpreter ``lib``."""
        n_carry, n_rows = len(self.carry_shapes), len(self.row_shapes)

        def f(*args):
            init, xs = list(args[:n_carry]), list(args[n_carry : n_carry + n_rows])
            captured = list(args[n_carry + n_rows :])

            def body(carry, rows):
                outs = run(self.body, lib, [*carry, *rows, *captured])
                return outs[:n_carry], outs[n_carry:]

            length = None if xs else self.length
            return scan(body, init, xs, length=length, reverse=self.reverse)

        return f


@st.composite
def scan_programs(draw) -> ScanProgram:
    carry_shapes = tuple(draw(st.lists(shapes(1), min_size=1, max_size=2)))
    row_shapes = tuple(draw(st.lists(shapes(1), max_size=2)))
    captured_shapes = tuple(draw(st.lists(shapes(1), max_size=1)))
    y_shapes = draw(st.lists(shapes(1), max_size=2))
    in_types = [(s, FLT) for s in (*carry_shapes, *row_shapes, *captured_shapes)]
    out_types = [(s, FLT) for s in (*carry_shapes, *y_shapes)]
    body = branch(draw, in_types, out_types, depth=1)
    length, reverse = draw(st.integers(0, 3)), draw(st.booleans())
    return ScanProgram(carry_shapes, row_shapes, captured_shapes, body, length, reverse)


def leaves(tree) -> list[np.ndarray]:
    return [np.asarray(x, np.float64) for x in jax.tree_util.tree_leaves(tree)]


def assert_close(ours, theirs) -> None:
    a, b = leaves(ours), leaves(theirs)
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert x.shape == y.shape
        np.testing.assert_allclose(x, y, rtol=TOL, atol=TOL)


def _both(prog: ScanProgram):
    note(prog.body.pretty())
    note(f"length={prog.length} reverse={prog.reverse}")
    return prog.function(ad.scan, Autodidax), prog.function(lax.scan, Jax)


def _loss(f, total, sin):
    def loss(args):
        return sum(total(sin(x)) for x in jax.tree_util.tree_leaves(f(*args)))

    return loss


@EXAMPLES
@given(prog=scan_programs(), seed=st.integers(0, 2**16))
def test_scan_eval_jit_jvp(prog, seed):
    ours, theirs = _both(prog)
    args = prog.args(np.random.default_rng(seed))
    expected = theirs(*args)
    assert_close(ours(*args), expected)
    assert_close(ad.jit(ours)(*args), expected)
    dots = [np.cos(a) for a in args]
    assert_close(ad.jvp(ours, tuple(args), tuple(dots)), jax.jvp(theirs, args, dots))


@EXAMPLES
@given(prog=scan_programs(), seed=st.integers(0, 2**16))
def test_scan_vmap(prog, seed):
    ours, theirs = _both(prog)
    rng = np.random.default_rng(seed)
    batch = [np.stack([a, a * 0.5]) for a in prog.args(rng)]
    assert_close(ad.vmap(ours)(*batch), jax.vmap(theirs)(*batch))


@EXAMPLES
@given(prog=scan_programs(), seed=st.integers(0, 2**16))
def test_scan_grad(prog, seed):
    ours, theirs = _both(prog)
    args = tuple(prog.args(np.random.default_rng(seed)))
    expected = jax.grad(_loss(theirs, jnp.sum, jnp.sin))(args)
    our_loss = _loss(ours, ad.reduce_sum, ad.sin)
    assert_close(ad.grad(our_loss)(args), expected)
    assert_close(ad.jit(ad.grad(our_loss))(args), expected)
