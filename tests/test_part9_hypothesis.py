"""Property-based tests of Part 9's collectives with Hypothesis.

A random program from the generator of tests/test_hypothesis.py (every
primitive, conds, closures; float64 inputs) runs once per example of a batch
bound to the name ``i``. Around it, collectives over ``i``: the first input
is centred on the batch mean (``pmean``) before the program sees it, and each
float output comes back as its ``psum``, its ``pmax``, and itself times the
example's ``axis_index``. Checked under ``vmap(axis_name="i")``, ``jit`` of
that, ``vmap`` of ``jit``, ``pmap`` (a few examples: each compiles), and
``vmap`` of ``grad`` with a ``psum`` inside the differentiated function;
autodidax and JAX must agree to 1e-9.
"""

from __future__ import annotations

import jax
import numpy as np
import pytest
from hypothesis import given, note, settings
from hypothesis import strategies as st
from test_hypothesis import FLT, Autodidax, Jax, programs, run

import autodidax as ad

pytestmark = pytest.mark.usefixtures("clean_interpreter_stack")

TOL = 1e-9
F64 = np.float64
AXIS = "i"
EXAMPLES = settings(max_examples=max(4, settings().max_examples // 3))
FEW = settings(max_examples=max(2, settings().max_examples // 10))


class _Ours:
    interp = Autodidax
    vmap, pmap, jit, grad = ad.vmap, ad.pmap, ad.jit, ad.grad
    psum, pmean, pmax = ad.psum, ad.pmean, ad.pmax
    axis_index = ad.axis_index

    @staticmethod
    def to_float(x):
        return ad.convert_element_type(x, F64)

    @staticmethod
    def total(x):
        return ad.reduce_sum(x)


class _Jax:
    interp = Jax
    vmap, pmap, jit, grad = jax.vmap, jax.pmap, jax.jit, jax.grad
    psum, pmean, pmax = jax.lax.psum, jax.lax.pmean, jax.lax.pmax
    axis_index = jax.lax.axis_index

    @staticmethod
    def to_float(x):
        return jax.lax.convert_element_type(x, F64)

    @staticmethod
    def total(x):
        return jax.numpy.sum(x)


def is_float(x) -> bool:
    return np.dtype(x.dtype) == np.dtype(F64)


def with_collectives(prog, lib):
    """The per-example function: collectives around ``prog``."""

    def f(*xs):
        first = (xs[0] - lib.pmean(xs[0], AXIS)) * 0.5  # stays in [-2, 2]
        outs = run(prog, lib.interp, [first, *xs[1:]])
        index = lib.to_float(lib.axis_index(AXIS))
        results = []
        for out in outs:
            if is_float(out):
                results += [lib.psum(out, AXIS), lib.pmax(out, AXIS), out * index]
            else:
                results.append(out)
        return results

    return f


def batch(prog, size: int, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.uniform(-2.0, 2.0, (size, *shape)) for shape, _ in prog.in_types]


def assert_close(ours, theirs) -> None:
    ours, theirs = jax.tree_util.tree_leaves(ours), jax.tree_util.tree_leaves(theirs)
    assert len(ours) == len(theirs)
    for a, b in zip(ours, theirs):
        a, b = np.asarray(a), np.asarray(b)
        assert a.shape == b.shape, (a.shape, b.shape)
        if a.dtype == np.bool_:
            np.testing.assert_array_equal(a, b)
        else:
            np.testing.assert_allclose(a, b, rtol=TOL, atol=TOL)


def check(prog, size, seed, build, jit_reference: bool = True) -> None:
    """``build(lib, prog)`` run with both libraries. JAX's version is jitted
    (same values, and several times faster than JAX's eager vmap)."""
    note(prog.pretty())
    args = batch(prog, size, seed)
    note(f"batch of {size}, input shapes {[a.shape for a in args]}")
    reference = build(_Jax, prog)
    if jit_reference:
        reference = jax.jit(reference)
    assert_close(build(_Ours, prog)(*args), reference(*args))


MAPS = {
    "vmap": lambda lib, prog: lib.vmap(with_collectives(prog, lib), axis_name=AXIS),
    "jit-of-vmap": lambda lib, prog: lib.jit(MAPS["vmap"](lib, prog)),
    "vmap-of-jit": lambda lib, prog: lib.vmap(
        lib.jit(with_collectives(prog, lib)), axis_name=AXIS
    ),
}


@pytest.mark.parametrize("how", MAPS)
@EXAMPLES
@given(prog=programs(), size=st.sampled_from([1, 2, 3]), seed=st.integers(0, 2**16))
def test_collectives_around_random_programs(how, prog, size, seed):
    check(prog, size, seed, MAPS[how])


@FEW
@given(prog=programs(), size=st.sampled_from([2, 8]), seed=st.integers(0, 2**16))
def test_collectives_around_random_programs_under_pmap(prog, size, seed):
    check(
        prog,
        size,
        seed,
        lambda lib, prog: lib.pmap(with_collectives(prog, lib), axis_name=AXIS),
        jit_reference=False,
    )


@EXAMPLES
@given(prog=programs(), size=st.sampled_from([1, 3]), seed=st.integers(0, 2**16))
def test_per_example_grad_of_a_psum(prog, size, seed):
    """vmap(grad(x -> total(psum(program(x))))): psum's transpose is a psum."""

    def build(lib, prog):
        def loss(*xs):
            out = run(prog, lib.interp, list(xs))[0]  # the first output is float
            return lib.total(lib.psum(out * out, AXIS))

        argnums = tuple(range(len(prog.in_types)))
        return lib.vmap(lib.grad(loss, argnums=argnums), axis_name=AXIS)

    check(prog, size, seed, build)


def test_the_generator_gives_float_first_outputs():
    """The grad test relies on it (tests/test_hypothesis.py's programs())."""

    @settings(max_examples=5, database=None)
    @given(prog=programs())
    def first_is_float(prog):
        assert prog.types[prog.outs[0]][1] == FLT

    first_is_float()
