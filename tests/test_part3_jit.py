"""Tests of Part 3: jit, lowering to StableHLO, XLA compilation and Arrays.

Random programs come from the Part 1 generator (every Part 1 primitive,
comparisons, Python scalars, ranks 0-3, float64). Each is run through ``jit``
and its compositions with ``jvp``, ``vmap``, ``jacfwd`` and ``make_jaxpr``, and
the results must agree with the same program under ``jax.jit`` to 1e-9. Around
that: how often tracing and compilation happen, the device-resident ``Array``
type, the StableHLO we emit, the interpreter's state after errors, and the
dispatch fast path (taken only when it gives what the full path gives).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
import threading
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from test_part1_differential import (
    SEEDS,
    TOL,
    Program,
    assert_matches,
    batch_axes,
    main_output_fns,
    program_fns,
    random_arrays,
    random_out_axis,
    random_program,
    setup,
)

import autodidax as ad

pytestmark = pytest.mark.usefixtures("clean_interpreter_stack")

F64 = np.float64
REPO_ROOT = Path(__file__).resolve().parent.parent

# Every differential test below runs these seeds; a few heavier ones run a
# subset. test_seeds_cover_every_primitive checks what the subsets exercise.
JIT_SEEDS = SEEDS[:20]
HEAVY_SEEDS = JIT_SEEDS[::2]


# ---------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------


def host(tree: Any, *, arrays: bool = True) -> Any:
    """``tree`` with every leaf copied to a NumPy array.

    With ``arrays=True`` each leaf must be a device ``Array`` (what ``jit``
    and transformations of jitted calls return directly).
    """

    def leaf(x: Any) -> np.ndarray:
        if arrays:
            assert isinstance(x, ad.Array), f"expected an Array, got {type(x)}"
        return np.asarray(x)

    return jax.tree_util.tree_map(leaf, tree)


def avals_of(shapes: Sequence[tuple], dtype: Any = F64) -> list[ad.ShapedArray]:
    return [ad.ShapedArray(s, dtype) for s in shapes]


def assert_state_clean() -> None:
    """Only the evaluation level is on the stack, and it is the dynamic level."""
    assert len(ad._state.stack) == 1
    assert ad._state.dynamic is ad._state.stack[0]


def counted(fn: Callable) -> Callable:
    """``fn``, counting in ``.calls`` how often its Python body runs."""

    def body(*args):
        body.calls += 1
        return fn(*args)

    body.calls = 0
    return body


def with_constant(prog: Program, seed: int) -> tuple[Callable, Callable]:
    """The program with a closed-over NumPy array added to its main output."""
    rng = np.random.default_rng(20_000 + seed)
    const = rng.uniform(-1.0, 1.0, size=prog.out_shapes[0])
    f, f_jax = program_fns(prog)

    def g(*xs):
        first, *rest = f(*xs)
        return (first + const, *rest)

    def g_jax(*xs):
        first, *rest = f_jax(*xs)
        return (first + const, *rest)

    return g, g_jax


def xla_call_eqns(jaxpr: ad.Jaxpr) -> list[ad.JaxprEqn]:
    return [e for e in jaxpr.eqns if e.primitive is ad.xla_call_p]


# ---------------------------------------------------------------------------
# Randomized differential tests against jax.jit
# ---------------------------------------------------------------------------


def test_seeds_cover_every_primitive():
    """The seeds used below apply every primitive, Python scalars on both
    sides, and have inputs of every rank 0-3."""
    for seeds in (JIT_SEEDS, HEAVY_SEEDS):
        kinds, ranks = set(), set()
        for seed in seeds:
            prog = random_program(seed)
            ranks |= {len(s) for s in prog.in_shapes}
            for op in prog.ops:
                kinds.add(op.kind)
                if op.kind == "scalar":
                    kinds.add(f"scalar-{'left' if op.params[2] else 'right'}")
                    kinds.add(op.params[0])
        assert {
            "neg", "sin", "cos", "add", "mul", "sub", "greater", "less",
            "reduce_sum", "transpose", "broadcast", "scalar-left", "scalar-right",
        } <= kinds, seeds  # fmt: skip
        assert ranks == {0, 1, 2, 3}


@pytest.mark.parametrize("seed", JIT_SEEDS)
def test_jit(seed, compilations):
    """jit of a random program = jax.jit of it; the outputs are Arrays and
    keep JAX's dtypes. Calling again with new values (NumPy or Array inputs)
    neither retraces nor recompiles."""
    prog, rng, inputs = setup(seed)
    f, f_jax = program_fns(prog)
    body = counted(f)
    f_jit = ad.jit(body)
    assert_matches(host(f_jit(*inputs)), jax.jit(f_jax)(*inputs))
    assert body.calls == 1 and len(compilations) == 1
    for new_inputs, on_device in (
        (random_arrays(rng, prog.in_shapes), False),
        (random_arrays(rng, prog.in_shapes), True),
    ):
        args = [ad.device_put(x) for x in new_inputs] if on_device else new_inputs
        assert_matches(host(f_jit(*args)), jax.jit(f_jax)(*new_inputs))
    assert body.calls == 1 and len(compilations) == 1
    assert len(f_jit.traces) == 1


@pytest.mark.parametrize("seed", JIT_SEEDS)
def test_jvp_of_jit(seed):
    prog, rng, inputs = setup(seed)
    tangents = random_arrays(rng, prog.in_shapes)
    f, f_jax = program_fns(prog)
    ours = ad.jvp(ad.jit(f), tuple(inputs), tuple(tangents))
    theirs = jax.jit(partial(jax.jvp, jax.jit(f_jax)))(tuple(inputs), tuple(tangents))
    assert_matches(host(ours), theirs)


@pytest.mark.parametrize("seed", JIT_SEEDS)
def test_vmap_of_jit(seed):
    """vmap of a jitted program with random int/negative/None in_axes and a
    random out_axes."""
    prog, rng, _ = setup(seed)
    in_axes, shapes = batch_axes(rng, prog.in_shapes, int(rng.integers(1, 4)))
    args = random_arrays(rng, shapes)
    out_axes = random_out_axis(rng, prog.out_shapes)
    f, f_jax = program_fns(prog)
    ours = ad.vmap(ad.jit(f), tuple(in_axes), out_axes)(*args)
    theirs = jax.jit(jax.vmap(jax.jit(f_jax), tuple(in_axes), out_axes))(*args)
    assert_matches(host(ours, arrays=False), theirs)


@pytest.mark.parametrize("seed", JIT_SEEDS)
def test_jit_of_jvp(seed):
    """jit of a jvp, with tuples of arrays as the jitted function's arguments."""
    prog, rng, inputs = setup(seed)
    tangents = random_arrays(rng, prog.in_shapes)
    f, f_jax = program_fns(prog)
    ours = ad.jit(lambda xs, ts: ad.jvp(f, xs, ts))(tuple(inputs), tuple(tangents))
    theirs = jax.jit(partial(jax.jvp, f_jax))(tuple(inputs), tuple(tangents))
    assert_matches(host(ours), theirs)


@pytest.mark.parametrize("seed", JIT_SEEDS)
def test_jit_of_vmap(seed):
    prog, rng, _ = setup(seed)
    in_axes, shapes = batch_axes(rng, prog.in_shapes, int(rng.integers(1, 4)))
    args = random_arrays(rng, shapes)
    out_axes = random_out_axis(rng, prog.out_shapes)
    f, f_jax = program_fns(prog)
    ours = ad.jit(ad.vmap(f, tuple(in_axes), out_axes))(*args)
    theirs = jax.jit(jax.vmap(f_jax, tuple(in_axes), out_axes))(*args)
    assert_matches(host(ours), theirs)


@pytest.mark.parametrize("seed", JIT_SEEDS)
def test_nested_jit(seed):
    """jit(jit(f)), and one jitted function called twice inside another jit
    (traced once, one xla_call equation per call sharing one jaxpr)."""
    prog, _, inputs = setup(seed)
    f, f_jax = program_fns(prog)
    assert_matches(host(ad.jit(ad.jit(f))(*inputs)), jax.jit(jax.jit(f_jax))(*inputs))

    body = counted(f)
    inner = ad.jit(body)
    inner_jax = jax.jit(f_jax)

    def twice(jitted, sin):
        return lambda *xs: (jitted(*xs), jitted(*[sin(x) for x in xs]))

    outer = ad.jit(twice(inner, ad.sin))
    ours = outer(*inputs)
    assert_matches(host(ours), jax.jit(twice(inner_jax, jnp.sin))(*inputs))
    assert body.calls == 1  # same input types both times: one trace
    jaxpr, _, _ = ad.make_jaxpr(twice(inner, ad.sin), *avals_of(prog.in_shapes))
    first, second = xla_call_eqns(jaxpr)
    assert first.params["jaxpr"] is second.params["jaxpr"]
    assert body.calls == 1


@pytest.mark.parametrize("seed", JIT_SEEDS)
def test_make_jaxpr_of_jit(seed):
    """make_jaxpr(jit(f)) is one xla_call equation whose inner jaxpr
    type-checks at the program's (JAX's) types; evaluating it gives JAX's
    results. A closed-over array becomes a constant of the outer jaxpr."""
    prog, _, inputs = setup(seed)
    avals = avals_of(prog.in_shapes)
    specs = [jax.ShapeDtypeStruct(s, F64) for s in prog.in_shapes]
    for g, g_jax in (program_fns(prog), with_constant(prog, seed)):
        jaxpr, consts, out_tree = ad.make_jaxpr(ad.jit(g), *avals)
        (eqn,) = jaxpr.eqns
        assert eqn.primitive is ad.xla_call_p and eqn.primitive.name == "xla_call"
        inner = eqn.params["jaxpr"]
        inner_type = ad.typecheck_jaxpr(inner)
        assert list(inner_type.in_types)[len(consts) :] == avals
        want_out = [
            ad.ShapedArray(o.shape, o.dtype) for o in jax.eval_shape(g_jax, *specs)
        ]
        assert list(inner_type.out_types) == want_out
        outer_type = ad.typecheck_jaxpr(jaxpr)
        assert list(outer_type.out_types) == want_out
        assert str(jaxpr).count("xla_call") == 1
        outs = ad.eval_jaxpr(jaxpr, [*consts, *inputs])
        ours = ad.tree_unflatten(out_tree, outs)
        assert_matches(host(ours), jax.jit(g_jax)(*inputs))


@pytest.mark.parametrize("seed", JIT_SEEDS)
def test_jit_with_closed_over_constant(seed):
    prog, rng, inputs = setup(seed)
    g, g_jax = with_constant(prog, seed)
    g_jit = ad.jit(g)
    for xs in (inputs, random_arrays(rng, prog.in_shapes)):
        assert_matches(host(g_jit(*xs)), jax.jit(g_jax)(*xs))
    tangents = random_arrays(rng, prog.in_shapes)
    ours = ad.jvp(g_jit, tuple(inputs), tuple(tangents))
    theirs = jax.jit(partial(jax.jvp, g_jax))(tuple(inputs), tuple(tangents))
    assert_matches(host(ours), theirs)


@pytest.mark.parametrize("seed", JIT_SEEDS)
def test_jacfwd_of_jit(seed):
    prog, rng, inputs = setup(seed)
    at = int(rng.integers(len(inputs)))
    g, g_jax = main_output_fns(prog, at, inputs)
    ours = ad.jacfwd(ad.jit(g))(inputs[at])
    assert np.shape(ours) == prog.out_shapes[0] + prog.in_shapes[at]
    theirs = jax.jit(jax.jacfwd(jax.jit(g_jax)))(inputs[at])
    assert_matches(host(ours, arrays=False), theirs)


@pytest.mark.parametrize("seed", HEAVY_SEEDS)
def test_second_derivatives_through_jit(seed):
    """jvp(jit(jvp(f))), jvp(jvp(jit(f))) and jit(jacfwd(jit(jacfwd)))."""
    prog, rng, inputs = setup(seed)
    d1, d2 = (tuple(random_arrays(rng, prog.in_shapes)) for _ in range(2))
    f, f_jax = program_fns(prog)

    def derivative(jvp, fn, direction):
        return lambda *xs: jvp(fn, xs, direction)[1]

    second = partial(jax.jvp, derivative(jax.jvp, jax.jit(f_jax), d1))
    theirs = jax.jit(second)(tuple(inputs), d2)
    for g in (
        ad.jit(derivative(ad.jvp, f, d1)),
        derivative(ad.jvp, ad.jit(f), d1),
        ad.jit(derivative(ad.jvp, ad.jit(f), d1)),
    ):
        assert_matches(host(ad.jvp(g, tuple(inputs), d2), arrays=False), theirs)

    at = int(np.argmin([np.size(x) for x in inputs]))
    h, h_jax = main_output_fns(prog, at, inputs)
    x = inputs[at]
    ours = ad.jit(ad.jacfwd(ad.jit(ad.jacfwd(h))))(x)
    theirs = jax.jit(jax.jacfwd(jax.jit(jax.jacfwd(h_jax))))(x)
    assert_matches(host(ours), theirs)


@pytest.mark.parametrize("seed", HEAVY_SEEDS)
def test_vmap_of_jvp_of_jit(seed):
    """Batched directional derivatives of a jitted program."""
    prog, rng, _ = setup(seed)
    n = len(prog.in_shapes)
    in_axes, shapes = batch_axes(rng, prog.in_shapes * 2, 2)
    args = random_arrays(rng, shapes)
    f, f_jax = program_fns(prog)
    f_jit = ad.jit(f)
    ours = ad.vmap(lambda *a: ad.jvp(f_jit, a[:n], a[n:]), tuple(in_axes))(*args)
    f_jax_jit = jax.jit(f_jax)
    theirs = jax.jit(
        jax.vmap(lambda *a: jax.jvp(f_jax_jit, a[:n], a[n:]), tuple(in_axes))
    )(*args)
    assert_matches(host(ours, arrays=False), theirs)


# ---------------------------------------------------------------------------
# Hand-written cases
# ---------------------------------------------------------------------------


def test_spec_example_under_jit():
    """f(x) = -2 sin x + x and its derivative at 3.0, jitted, agree with JAX."""

    def f(x):
        return -2 * ad.sin(x) + x

    def f_jax(x):
        return -2 * jnp.sin(x) + x

    np.testing.assert_allclose(ad.jit(f)(3.0), jax.jit(f_jax)(3.0), rtol=TOL)
    np.testing.assert_allclose(ad.jit(f)(3.0), -2 * np.sin(3.0) + 3.0, rtol=TOL)
    assert_matches(
        host(ad.jvp(ad.jit(f), (3.0,), (1.0,))), jax.jvp(jax.jit(f_jax), (3.0,), (1.0,))
    )
    df = ad.jit(lambda x: ad.jvp(f, (x,), (1.0,))[1])
    np.testing.assert_allclose(df(3.0), jax.grad(f_jax)(3.0), rtol=TOL)


def test_tracing_printed_once_for_two_calls(capsys):
    """The chapter's demo: 'tracing!' once for two calls with new floats."""

    @ad.jit
    def wave(x, y):
        print("tracing!")
        return ad.sin(x) * y + ad.cos(y)

    x, y = np.array([0.0, 1.0, 2.0]), np.array([1.0, 2.0, 3.0])
    first = wave(x, y)
    second = wave(x + 1.0, y)
    assert capsys.readouterr().out == "tracing!\n"
    np.testing.assert_allclose(first, np.sin(x) * y + np.cos(y), rtol=TOL)
    np.testing.assert_allclose(second, np.sin(x + 1.0) * y + np.cos(y), rtol=TOL)
    wave(np.ones(2), np.ones(2))
    assert capsys.readouterr().out == "tracing!\n"


def test_trace_once_per_signature():
    """A new trace per input signature (pytree structure and every leaf's
    shape and dtype), never per value; Python floats share a trace with
    float64 0-d arrays; NumPy and device inputs share traces."""
    body = counted(lambda x: x + x * 2.0 if x.dtype.kind == "f" else x + x)
    f = ad.jit(body)
    expected_traces = 0

    def call(x, new_trace: bool) -> None:
        nonlocal expected_traces
        expected_traces += new_trace
        out = f(x)
        host_x = np.asarray(x)
        want = host_x + host_x * 2.0 if host_x.dtype.kind == "f" else host_x + host_x
        np.testing.assert_allclose(np.asarray(out), want, rtol=TOL)
        assert np.asarray(out).dtype == want.dtype
        assert body.calls == len(f.traces) == expected_traces, x

    call(1.0, True)
    call(2.5, False)
    call(np.float64(-3.0), False)
    call(np.array(4.0), False)
    call(ad.device_put(np.array(5.0)), False)
    call(np.ones(3), True)
    call(np.arange(3.0), False)
    call(ad.device_put(np.zeros(3)), False)
    call(np.ones(3, np.float32), True)
    call(np.ones((3, 1)), True)
    call(np.ones((1, 3)), True)
    call(np.float32(1.0), True)
    call(7, True)  # a Python int is int64, not float64
    call(np.int64(8), False)
    call(np.array([1, 2], np.int32), True)


def test_trace_once_per_pytree_structure():
    body = counted(lambda t: t["a"] * t["b"][0])
    f = ad.jit(body)
    assert float(f({"a": 2.0, "b": (3.0,)})) == 6.0
    assert float(f({"a": 4.0, "b": (5.0,)})) == 20.0
    assert body.calls == 1
    assert float(f({"a": 4.0, "b": [5.0]})) == 20.0  # list, not tuple
    assert body.calls == 2
    assert float(f({"a": 1.0, "b": (2.0, 9.0)})) == 2.0  # one more leaf
    assert body.calls == 3
    assert float(f({"a": 1.0, "b": (2.0, None)})) == 2.0  # None is structure
    assert body.calls == 4
    assert float(f({"a": 1.0, "b": (2.0, None)})) == 2.0
    assert body.calls == 4 == len(f.traces)


def test_transformations_reuse_the_trace():
    """jvp, vmap, make_jaxpr and an outer jit of a jitted function see the
    same input types as a direct call, so the Python body runs once."""
    body = counted(lambda x: ad.sin(x) * x)
    f = ad.jit(body)
    x, v = np.array([0.5, -1.0, 2.0]), np.array([1.0, 0.5, -2.0])
    f(x)
    primal, tangent = ad.jvp(f, (x,), (v,))
    batched = ad.vmap(f)(np.stack([x, v, x * v]))
    outer = ad.jit(lambda y: f(y) + 1.0)(x)
    ad.make_jaxpr(f, ad.ShapedArray((3,), F64))
    assert body.calls == 1
    p_jax, t_jax = jax.jvp(lambda y: jnp.sin(y) * y, (x,), (v,))
    np.testing.assert_allclose(primal, p_jax, rtol=TOL)
    np.testing.assert_allclose(tangent, t_jax, rtol=TOL)
    np.testing.assert_allclose(
        batched, jax.vmap(lambda y: jnp.sin(y) * y)(np.stack([x, v, x * v])), rtol=TOL
    )
    np.testing.assert_allclose(outer, np.sin(x) * x + 1.0, rtol=TOL)


def test_compiled_once_per_program(compilations):
    """Second calls of jit, jvp(jit) and vmap(jit) compile nothing new; a new
    batch size compiles a new batched program."""
    f = ad.jit(lambda x: ad.cos(x) * x)
    x = np.linspace(-1.0, 1.0, 4)
    f(x)
    f(x + 1.0)
    assert len(compilations) == 1
    ad.jvp(f, (x,), (x,))
    ad.jvp(f, (x * 2.0,), (x,))
    assert len(compilations) == 2
    ad.vmap(f)(np.ones((3, 4)))
    ad.vmap(f)(np.zeros((3, 4)))
    ad.vmap(f, 1)(np.zeros((4, 3)))
    assert len(compilations) == 3
    out = ad.vmap(f)(np.ones((5, 4)))
    assert len(compilations) == 4
    np.testing.assert_allclose(out, np.cos(np.ones((5, 4))), rtol=TOL)


def test_compile_cache_is_per_jaxpr():
    jaxpr, _, _ = ad.make_jaxpr(lambda x: ad.sin(x) * 2.0, ad.ShapedArray((3,), F64))
    compiled = ad.compile_jaxpr(jaxpr)
    assert ad.compile_jaxpr(jaxpr) is compiled
    again, _, _ = ad.make_jaxpr(lambda x: ad.sin(x) * 2.0, ad.ShapedArray((3,), F64))
    assert ad.compile_jaxpr(again) is not compiled
    x = np.array([0.5, 1.0, 2.0])
    (out,) = compiled(x)
    assert isinstance(out, ad.Array)
    np.testing.assert_allclose(out, 2.0 * np.sin(x), rtol=TOL)


def test_jitted_function_closing_over_a_tracer_is_not_cached():
    """A jitted function that closes over an outer tracer must not reuse that
    trace later, when the closed-over value is an ordinary array."""
    holder: dict[str, Any] = {}
    inner = ad.jit(lambda y: y * holder["x"])

    def outer(x):
        holder["x"] = x
        return inner(2.0)

    def outer_jax(x):
        return jax.jit(lambda y: y * x)(2.0)

    assert_matches(
        host(ad.jvp(outer, (3.0,), (1.0,))), jax.jvp(outer_jax, (3.0,), (1.0,))
    )
    xs = np.array([1.0, -2.0, 0.5])
    np.testing.assert_allclose(ad.vmap(outer)(xs), 2.0 * xs, rtol=TOL)
    jaxpr, _, _ = ad.make_jaxpr(outer, ad.ShapedArray((), F64))
    assert [e.primitive.name for e in jaxpr.eqns] == ["xla_call"]
    holder["x"] = np.float64(5.0)
    assert float(inner(2.0)) == 10.0


def test_vmap_of_jit_with_only_unbatched_operands():
    """The jitted calls inside vmap use only an unbatched (in_axes None)
    argument; their results meet batched values afterwards."""
    g = ad.jit(lambda y: ad.sin(y) * 2.0)
    xs = np.arange(6.0).reshape(3, 2)
    y = np.array([0.25, -0.5])

    def f(x, y, g, sin):
        return g(y) + x, g(sin(y))

    ours = ad.vmap(lambda x, y: f(x, y, g, ad.sin), (0, None))(xs, y)
    g_jax = jax.jit(lambda y: jnp.sin(y) * 2.0)
    theirs = jax.vmap(lambda x, y: f(x, y, g_jax, jnp.sin), (0, None))(xs, y)
    assert_matches(host(ours, arrays=False), theirs)


def test_vmap_of_jit_output_not_depending_on_the_batch():
    f = ad.jit(lambda x, y: (y * 3.0, x + y, np.ones(2)))
    ours = ad.vmap(f, (0, None), -1)(np.ones((4, 2)), np.array([1.0, 2.0]))
    theirs = jax.vmap(lambda x, y: (y * 3.0, x + y, jnp.ones(2)), (0, None), -1)(
        np.ones((4, 2)), np.array([1.0, 2.0])
    )
    assert_matches(host(ours, arrays=False), theirs)


def test_nested_vmap_and_jit():
    """vmap(jit(vmap(jit(f)))) with axes in different places."""

    def f(x, y):
        return ad.reduce_sum(ad.sin(x) * y, 0)

    def f_jax(x, y):
        return jnp.sum(jnp.sin(x) * y, 0)

    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(3, 4, 5)), rng.normal(size=(4, 3))
    ours = ad.vmap(ad.jit(ad.vmap(ad.jit(f), (-1, None))), (0, 1))(x, y)
    theirs = jax.vmap(jax.vmap(f_jax, (-1, None)), (0, 1))(x, y)
    assert np.shape(ours) == (3, 5)
    assert_matches(host(ours, arrays=False), theirs)


def test_pytrees_in_and_out_of_jit():
    def f(params, batch):
        w, b = params["w"], params["b"]
        out = ad.reduce_sum(w * batch[0], 1) + b
        return {"out": out, "aux": (batch[1], None, [out > 0.0])}

    def f_jax(params, batch):
        out = jnp.sum(params["w"] * batch[0], 1) + params["b"]
        return {"out": out, "aux": (batch[1], None, [out > 0.0])}

    params = {"w": np.arange(6.0).reshape(2, 3) - 2.5, "b": np.array([0.5, -20.0])}
    batch = (np.ones((2, 3)), np.array(3.0))
    ours = ad.jit(f)(params, batch)
    assert ours["aux"][1] is None
    assert_matches(host(ours), jax.jit(f_jax)(params, batch))


def test_outputs_that_are_inputs_constants_or_repeated():
    def f(x, y):
        s = ad.sin(x)
        return {"x": x, "two": 2.0, "ones": np.ones(2), "y": y, "s": (s, s), "i": 3}

    def f_jax(x, y):
        s = jnp.sin(x)
        return {"x": x, "two": 2.0, "ones": jnp.ones(2), "y": y, "s": (s, s), "i": 3}

    x, y = np.array([1.0, -2.0]), np.array(0.5)
    ours = ad.jit(f)(x, y)
    assert_matches(host(ours), jax.jit(f_jax)(x, y))
    assert ours["i"].dtype == np.int64


def test_jit_of_a_function_without_arguments():
    """Constant-only work under jit is staged and compiled (omnistaging)."""
    assert_matches(
        host(ad.jit(lambda: (ad.mul(2.0, 3.0), ad.sin(np.ones(2))))()),
        jax.jit(lambda: (jnp.multiply(2.0, 3.0), jnp.sin(jnp.ones(2))))(),
    )
    jaxpr, _, _ = ad.make_jaxpr(ad.jit(lambda: ad.mul(2.0, 2.0)))
    (eqn,) = jaxpr.eqns
    assert [e.primitive.name for e in eqn.params["jaxpr"].eqns] == ["mul"]


@pytest.mark.parametrize(
    "dtype",
    [
        np.float16,
        np.float32,
        np.float64,
        np.int8,
        np.int32,
        np.int64,
        np.uint8,
        np.uint32,
    ],
)
def test_other_dtypes_under_jit(dtype):
    """Every primitive on float, signed and unsigned arrays, against NumPy:
    same values (with wrap-around for integers) and same dtypes."""
    unsigned = np.dtype(dtype).kind == "u"
    x = (np.arange(6).reshape(2, 3) * 37 % 11 - (0 if unsigned else 5)).astype(dtype)
    y = x[::-1].copy()
    if unsigned:
        x[0, 0] = np.iinfo(dtype).max - 1  # wraps around in x + y

    def f(x, y):
        outs = [x + y, x * y, x > y, x < y, ad.reduce_sum(x * y, 0)]
        outs += [ad.transpose(x, (1, 0)), ad.broadcast(x, (4, 2, 3), (0,))]
        outs += [x * 3, 2 + x, x > 1, -x, x - y]  # unsigned ones wrap around
        if np.dtype(dtype).kind == "f":
            outs += [ad.sin(x), ad.cos(y), x * 0.5]
        return outs

    d = np.dtype(dtype).type
    with np.errstate(over="ignore"):
        want = [x + y, x * y, x > y, x < y, np.sum(x * y, 0, dtype=dtype)]
        want += [x.T, np.broadcast_to(x, (4, 2, 3)), x * d(3), d(2) + x, x > d(1)]
        want += [-x, x - y]
        if np.dtype(dtype).kind == "f":
            want += [np.sin(x), np.cos(y), x * d(0.5)]
    ours = ad.jit(f)(x, y)
    assert len(ours) == len(want)
    for i, (mine, ref) in enumerate(zip(ours, want)):
        assert isinstance(mine, ad.Array)
        assert mine.dtype == ref.dtype and mine.shape == ref.shape, i
        rtol = {2: 2e-3, 4: 1e-6}.get(np.dtype(dtype).itemsize, TOL)
        if np.dtype(dtype).kind == "f":
            np.testing.assert_allclose(np.asarray(mine), ref, rtol=rtol, atol=rtol)
        else:
            np.testing.assert_array_equal(np.asarray(mine), ref)


def test_boolean_arrays_under_jit():
    """Comparisons give bool Arrays, and bool arrays go through every
    primitive that accepts them (add is `or`, mul is `and`, as in NumPy)."""
    a = np.array([[True, False, True, False], [False, False, True, True]])
    b = np.array([[False, True, True, False], [True, False, False, True]])
    x = np.array([0.5, -1.0, 2.0])
    cmp = ad.jit(lambda x: (x > 0.0, x < 1.0, 1.0 < x, ad.greater(x, x * 0.5)))(x)
    assert all(isinstance(c, ad.Array) and c.dtype == np.bool_ for c in cmp)
    assert_matches(host(cmp), (x > 0.0, x < 1.0, 1.0 < x, x > x * 0.5))

    def f(a, b):
        return (
            a + b,
            a * b,
            ad.reduce_sum(a, 0),
            ad.transpose(a, (1, 0)),
            ad.broadcast(b, (3, 2, 4), (0,)),
        )

    want = (a | b, a & b, a.any(0), a.T, np.broadcast_to(b, (3, 2, 4)))
    assert_matches(host(ad.jit(f)(a, b)), want)


def test_comparisons_of_boolean_arrays_under_jit():
    """greater/less of bools (False < True), as eagerly and in NumPy/JAX."""
    a = np.array([True, False, True, False])
    b = np.array([False, True, True, False])
    eager = (ad.greater(a, b), ad.less(a, b), a > b)
    assert_matches(eager, (a > b, a < b, a > b))
    ours = ad.jit(lambda a, b: (ad.greater(a, b), ad.less(a, b), a > b))(a, b)
    assert_matches(host(ours), jax.jit(lambda a, b: (a > b, a < b, a > b))(a, b))


def test_threads_use_jit_independently():
    """Two threads tracing and running jitted functions at the same time."""
    barrier = threading.Barrier(2, timeout=20)
    results: dict[int, Any] = {}
    shared = ad.jit(lambda x, k: ad.sin(x) * k)

    def work(k: int) -> None:
        def f(x):
            barrier.wait()
            y = ad.jit(lambda z: shared(z, np.full(3, float(k))) + z)(x)
            barrier.wait()
            return y

        try:
            results[k] = ad.jvp(ad.jit(f), (np.full(3, 0.3 * k),), (np.ones(3),))
        except Exception as err:  # reported by the main thread below
            results[k] = err

    threads = [threading.Thread(target=work, args=(k,)) for k in (1, 2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for k in (1, 2):
        expected = jax.jvp(
            lambda x, k=k: jnp.sin(x) * k + x, (np.full(3, 0.3 * k),), (np.ones(3),)
        )
        assert_matches(host(results[k]), expected)


# ---------------------------------------------------------------------------
# Arrays
# ---------------------------------------------------------------------------


def test_results_are_float64_device_arrays():
    x = np.array([[0.5, 1.5, -2.0]])
    out = ad.jit(lambda x: ad.sin(x) * 2.0 + x)(x)
    assert isinstance(out, ad.Array) and not isinstance(out, np.ndarray)
    assert out.dtype == np.float64 and np.asarray(out).dtype == np.float64
    assert out.shape == (1, 3) and out.ndim == 2 and len(out) == 1
    assert out.aval == ad.ShapedArray((1, 3), F64)
    np.testing.assert_allclose(
        out, jax.jit(lambda x: jnp.sin(x) * 2.0 + x)(x), rtol=TOL
    )
    scalar = ad.jit(lambda x: x * 3.0)(2.0)
    assert scalar.shape == () and scalar.dtype == np.float64
    assert float(scalar) == 6.0 and int(scalar) == 6 and bool(scalar)
    put = ad.device_put(np.arange(4, dtype=np.int32))
    assert isinstance(put, ad.Array) and put.dtype == np.int32 and put.shape == (4,)
    np.testing.assert_array_equal(put, np.arange(4))


def test_arrays_go_back_into_jit_without_a_host_copy(monkeypatch):
    """An Array fed to a jitted function (cached or being traced, nested or
    not) is used on the device: no __array__ and no device_put."""
    f = ad.jit(lambda x, y: ad.sin(x) * y)
    x, y = np.array([0.1, 0.2, 0.3]), np.array([1.0, -2.0, 3.0])
    a = f(x, y)
    b = ad.device_put(y)

    def no_host_copy(*args, **kwargs):
        raise AssertionError("an Array was copied to the host")

    def no_device_put(*args, **kwargs):
        raise AssertionError("an Array was copied to the device again")

    with monkeypatch.context() as patch:
        patch.setattr(ad.Array, "__array__", no_host_copy)
        patch.setattr(ad, "device_put", no_device_put)
        again = f(a, b)  # cached trace
        fresh = ad.jit(lambda u, v: ad.cos(u) + v * 2.0)(again, a)  # new trace
        nested = ad.jit(lambda u: f(u, u))(fresh)
    expected_a = np.sin(x) * y
    expected_again = np.sin(expected_a) * y
    expected_fresh = np.cos(expected_again) + expected_a * 2.0
    np.testing.assert_allclose(again, expected_again, rtol=TOL)
    np.testing.assert_allclose(fresh, expected_fresh, rtol=TOL)
    np.testing.assert_allclose(
        nested, np.sin(expected_fresh) * expected_fresh, rtol=TOL
    )


def test_numpy_conversion():
    a = ad.jit(lambda x: x * 2.0)(np.array([[1.25, -2.5], [3.0, 0.1]]))
    want = np.array([[1.25, -2.5], [3.0, 0.1]]) * 2.0
    as32 = np.asarray(a, dtype=np.float32)
    assert as32.dtype == np.float32
    np.testing.assert_array_equal(as32, want.astype(np.float32))
    copy = np.asarray(a, copy=True)
    assert copy.flags.writeable and copy.dtype == np.float64
    copy[0, 0] = 99.0
    np.testing.assert_array_equal(np.asarray(a), want)  # the Array is unchanged
    np.testing.assert_array_equal(np.array(a), want)
    assert np.asarray(a).dtype == np.float64
    np.testing.assert_array_equal(np.asarray(a, dtype=np.int64), want.astype(np.int64))


@pytest.mark.parametrize(
    "value",
    [
        np.array(2.5),
        np.array([0.0, 1.0, 2.0 / 3.0]),
        np.arange(12.0).reshape(3, 4) / 7.0,
        np.array([True, False]),
        np.arange(6, dtype=np.int32).reshape(2, 3),
        np.ones((0, 3)),
    ],
    ids=["0d", "vector", "matrix", "bool", "int32", "empty"],
)
def test_str_and_repr(value):
    a = ad.device_put(value)
    assert str(a) == str(value)
    text = repr(a)
    assert text.startswith("Array(") and text.endswith(f"dtype={value.dtype.name})")
    jitted = ad.jit(lambda x: x)(value)
    assert str(jitted) == str(value)


def test_infix_operators_on_arrays_match_numpy():
    """+ * - > < and unary - on Arrays (with Arrays, NumPy arrays and Python
    numbers on either side) compute eagerly and agree with NumPy."""
    xv = np.array([[0.5, -1.5, 2.0], [3.0, 0.0, -0.25]])
    yv = np.array([[1.0, 2.0, -2.0], [0.5, 0.0, 4.0]])
    x, y = ad.device_put(xv), ad.jit(lambda v: v * 1.0)(yv)
    cases = [
        (x + y, xv + yv),
        (x * y, xv * yv),
        (x - y, xv - yv),
        (x > y, xv > yv),
        (x < y, xv < yv),
        (-x, -xv),
        (x + 2.0, xv + 2.0),
        (2.0 + x, 2.0 + xv),
        (x * 3, xv * 3),
        (3 * x, 3 * xv),
        (x - 1.5, xv - 1.5),
        (1.5 - x, 1.5 - xv),
        (x > 0.0, xv > 0.0),
        (0.0 < x, 0.0 < xv),
        (x < 1, xv < 1),
        (x + yv, xv + yv),
        (yv * x, yv * xv),
        (yv - x, yv - xv),
        (yv > x, yv > xv),
        (ad.sin(x) * y, np.sin(xv) * yv),
    ]
    for i, (ours, want) in enumerate(cases):
        assert not isinstance(ours, ad.Tracer)
        mine = np.asarray(ours)
        assert mine.dtype == want.dtype and mine.shape == want.shape, i
        np.testing.assert_allclose(mine, want, rtol=TOL, err_msg=str(i))


def test_arrays_in_eager_transformations():
    """Arrays are accepted as inputs to jvp, vmap and jacfwd too."""
    xv = np.array([0.5, -1.0, 2.0])
    x = ad.device_put(xv)
    ours = ad.jvp(lambda v: ad.sin(v) * v, (x,), (ad.device_put(np.ones(3)),))
    theirs = jax.jvp(lambda v: jnp.sin(v) * v, (xv,), (np.ones(3),))
    assert_matches(host(ours, arrays=False), theirs)
    np.testing.assert_allclose(ad.vmap(lambda v: v * 2.0)(x), xv * 2.0, rtol=TOL)
    np.testing.assert_allclose(
        ad.jacfwd(ad.jit(lambda v: ad.sin(v)))(x), np.diag(np.cos(xv)), rtol=TOL
    )


def test_autodidax_leaves_jax_x64_switched_off():
    """In a fresh interpreter where JAX's x64 mode is off, autodidax still
    computes in float64 and never switches the mode on."""
    script = textwrap.dedent(
        """
        import json
        import jax
        import numpy as np
        before = jax.config.jax_enable_x64
        import autodidax as ad
        f = ad.jit(lambda x, n: (ad.sin(x) * 2.0 + x, n + n, x > 0.5))
        out, ints, flags = f(np.array([0.25, 1.0 / 3.0]), np.array([2**40]))
        again = f(out, ints)[0]
        d = ad.jvp(ad.jit(ad.sin), (1.0,), (1.0,))[1]
        put = ad.device_put(np.float64(np.pi))
        print(json.dumps({
            "before": before,
            "after": jax.config.jax_enable_x64,
            "dtypes": [str(out.dtype), str(np.asarray(out).dtype), str(ints.dtype),
                       str(flags.dtype), str(again.dtype), str(d.dtype),
                       str(put.dtype)],
            "out": np.asarray(out).tolist(),
            "ints": np.asarray(ints).tolist(),
            "again": np.asarray(again).tolist(),
            "d": float(d),
            "put": float(put),
        }))
        """
    )
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("JAX_", "XLA_FLAGS"))
    }
    env["JAX_PLATFORMS"] = "cpu"
    env["PYTHONPATH"] = os.pathsep.join(
        [str(REPO_ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["before"] is False and report["after"] is False
    assert report["dtypes"] == ["float64"] * 2 + ["int64", "bool"] + ["float64"] * 3
    x = np.array([0.25, 1.0 / 3.0])
    out = np.sin(x) * 2.0 + x
    np.testing.assert_allclose(report["out"], out, rtol=1e-15)
    assert report["ints"] == [2**41]  # would overflow in 32 bits
    np.testing.assert_allclose(report["again"], np.sin(out) * 2.0 + out, rtol=1e-15)
    assert report["d"] == pytest.approx(np.cos(1.0), rel=1e-15)
    assert report["put"] == np.pi


# ---------------------------------------------------------------------------
# Lowering
# ---------------------------------------------------------------------------

STABLEHLO_OPS = {
    "sin": "stablehlo.sine",
    "cos": "stablehlo.cosine",
    "neg": "stablehlo.negate",
    "mul": "stablehlo.multiply",
    "transpose": "stablehlo.transpose",
    "broadcast": "stablehlo.broadcast_in_dim",
    "reduce_sum": "stablehlo.reduce",
}


def every_primitive(x, y):
    a = ad.sin(x) * y + ad.cos(y)
    t = ad.transpose(-a, (1, 0))
    r = ad.broadcast(ad.reduce_sum(t, 0), (4, 2), (0,))
    return r, x > y, x < y, x * 2.0


def every_primitive_jax(x, y):
    a = jnp.sin(x) * y + jnp.cos(y)
    t = jnp.transpose(-a, (1, 0))
    r = jax.lax.broadcast_in_dim(jnp.sum(t, 0), (4, 2), (1,))
    return r, x > y, x < y, x * 2.0


def test_lowering_emits_stablehlo_for_every_primitive():
    mat = ad.ShapedArray((2, 3), F64)
    jaxpr, _, _ = ad.make_jaxpr(every_primitive, mat, mat)
    text = str(ad.lower_jaxpr(jaxpr))
    assert re.search(r"func\.func (public )?@main\(", text)
    names = [e.primitive.name for e in jaxpr.eqns]
    for prim, op in STABLEHLO_OPS.items():
        found = re.findall(rf"\b{re.escape(op)}\b", text)
        assert len(found) == names.count(prim) > 0, (prim, text)
    assert re.search(r"stablehlo\.add\b", text)
    assert len(re.findall(r"stablehlo\.compare\s+GT,", text)) == names.count("gt")
    assert len(re.findall(r"stablehlo\.compare\s+LT,", text)) == names.count("lt")
    assert "stablehlo.constant" in text  # the literal 2.0 and the reduce's 0.0
    assert "tensor<2x3xf64>" in text and "tensor<2x3xi1>" in text
    assert "tensor<4x2xf64>" in text
    x = np.arange(6.0).reshape(2, 3) / 5.0
    y = np.cos(np.arange(6.0)).reshape(2, 3)
    outs = ad.compile_jaxpr(jaxpr)(x, y)
    assert_matches(host(tuple(outs)), jax.jit(every_primitive_jax)(x, y))
    # The same module text compiled by JAX's own runtime behaves the same.
    assert_matches(host(ad.jit(every_primitive)(x, y)), every_primitive_jax(x, y))


def test_nested_jit_lowers_to_a_call_of_a_private_function():
    inner = ad.jit(lambda x: ad.sin(x) * 2.0)
    other = ad.jit(lambda x: ad.cos(x))
    outer = ad.jit(lambda x: inner(x) + inner(ad.cos(x)) + other(x))
    scalar = ad.ShapedArray((), F64)
    outer_jaxpr, _, _ = ad.make_jaxpr(outer, scalar)
    (call_eqn,) = outer_jaxpr.eqns
    body = call_eqn.params["jaxpr"]
    text = str(ad.lower_jaxpr(body))
    private = re.findall(r"func\.func private @([\w.$-]+)\(", text)
    calls = re.findall(r"call @([\w.$-]+)\(", text)
    assert len(private) == len(set(private)) == 2  # inner once, other once
    assert sorted(set(calls)) == sorted(private)
    assert len(calls) == 3
    inner_name = max(set(calls), key=calls.count)
    assert calls.count(inner_name) == 2
    inner_body = text.split(f"private @{inner_name}(")[1].split("func.func")[0]
    assert "stablehlo.sine" in inner_body and "call @" not in inner_body
    # The whole nest as one module: main calls the outer body, which calls the rest.
    full = str(ad.lower_jaxpr(outer_jaxpr))
    assert len(re.findall(r"func\.func private @", full)) == 3
    assert len(re.findall(r"call @", full)) == 4
    want = 2 * np.sin(0.7) + 2 * np.sin(np.cos(0.7)) + np.cos(0.7)
    np.testing.assert_allclose(outer(0.7), want, rtol=TOL)


def test_module_text_of_compiled_jaxpr():
    jaxpr, _, _ = ad.make_jaxpr(lambda x: ad.cos(x) + 1.0, ad.ShapedArray((3,), F64))
    compiled = ad.compile_jaxpr(jaxpr)
    assert compiled.module_text == str(ad.lower_jaxpr(jaxpr))
    assert "stablehlo.cosine" in compiled.module_text


# ---------------------------------------------------------------------------
# Interpreter state after errors inside jit
# ---------------------------------------------------------------------------


def _leak_and_use():
    leaked = []
    ad.jit(lambda x: leaked.append(x) or x)(1.0)
    return ad.jit(lambda y: y + leaked[0])(1.0)


@pytest.mark.parametrize(
    "thunk, exc",
    [
        (lambda: ad.jit(lambda x: x if x > 0.0 else -x)(1.0), ad.ConcretizationError),
        (lambda: ad.jit(lambda x, y: x * y)(np.ones(3), np.ones(2)), TypeError),
        (lambda: ad.jit(lambda x: "no")(1.0), TypeError),
        (
            lambda: ad.jit(lambda x: ad.jit(lambda y: y * np.ones(2))(x))(np.ones(3)),
            TypeError,
        ),
        (
            lambda: ad.jvp(ad.jit(lambda x: x if x > 0.0 else -x), (1.0,), (1.0,)),
            ad.ConcretizationError,
        ),
        (
            lambda: ad.vmap(ad.jit(lambda x: ad.reduce_sum(x, 3)))(np.ones((2, 3))),
            ValueError,
        ),
        (
            lambda: ad.jit(lambda x: ad.vmap(lambda y: y if y > 0.0 else y)(x))(
                np.ones(2)
            ),
            ad.ConcretizationError,
        ),
        (lambda: ad.jit(lambda s: s)("text"), TypeError),
        (_leak_and_use, ad.UnexpectedTracerError),
    ],
    ids=[
        "if",
        "shape",
        "output",
        "nested",
        "jvp-of-jit",
        "vmap-of-jit",
        "vmap-inside-jit",
        "argument",
        "leak",
    ],
)
def test_state_clean_after_errors_inside_jit(thunk, exc):
    with pytest.raises(exc):
        thunk()
    assert_state_clean()
    f = ad.jit(lambda x: ad.sin(x) + 1.0)
    np.testing.assert_allclose(f(0.5), np.sin(0.5) + 1.0, rtol=TOL)
    jaxpr, _, _ = ad.make_jaxpr(lambda: ad.mul(2.0, 2.0))
    assert [e.primitive.name for e in jaxpr.eqns] == ["mul"]
    assert_state_clean()


def test_failed_trace_is_not_cached():
    """A trace that raised leaves no entry; a later call traces again and a
    different signature of the same function still works."""
    fail = {"now": True}

    def body(x):
        if fail["now"]:
            raise ValueError("not yet")
        return x * 2.0

    f = ad.jit(body)
    with pytest.raises(ValueError, match="not yet"):
        f(np.ones(2))
    assert len(f.traces) == 0
    assert_state_clean()
    fail["now"] = False
    np.testing.assert_allclose(f(np.ones(2)), 2.0 * np.ones(2), rtol=TOL)
    assert len(f.traces) == 1


# ---------------------------------------------------------------------------
# The dispatch fast path
# ---------------------------------------------------------------------------


def watch_fast_calls(f: Callable, forbid: bool = False) -> list:
    """Replace every entry of ``f.fast_calls`` with a wrapper that records
    (or, with ``forbid``, refuses) its use. Returns the list of recorded
    signatures."""
    used: list = []
    for signature, entry in list(f.fast_calls.items()):

        def spy(args, entry=entry, signature=signature):
            if forbid:
                raise AssertionError(f"the fast path was taken for {signature}")
            used.append(signature)
            return entry(args)

        f.fast_calls[signature] = spy
    return used


def fast_path_programs():
    """(autodidax function, JAX function, arguments): several outputs,
    pytree outputs, closed-over constants, integers and booleans."""
    const = np.linspace(-1.0, 1.0, 6).reshape(2, 3)
    return [
        (
            lambda x: ad.sin(x) * 2.0 + x,
            lambda x: jnp.sin(x) * 2.0 + x,
            (np.linspace(-1.0, 1.0, 8),),
        ),
        (
            lambda x, y: (x * y + const, ad.reduce_sum(x, 0), x > y),
            lambda x, y: (x * y + const, jnp.sum(x, 0), x > y),
            (np.arange(6.0).reshape(2, 3), np.full((2, 3), 2.5)),
        ),
        (
            lambda x, n: {"out": ad.cos(x), "n": [n + n, n * 3]},
            lambda x, n: {"out": jnp.cos(x), "n": [n + n, n * 3]},
            (np.array(0.7), np.array([2**40, -5])),
        ),
        (
            lambda a, b: (a + b, a * b, ad.transpose(a, (1, 0))),
            lambda a, b: (a | b, a & b, a.T),
            (np.array([[True, False], [False, False]]), np.eye(2, dtype=bool)),
        ),
    ]


@pytest.mark.parametrize("index", range(4))
def test_fast_path_is_taken_for_arrays_and_agrees(index):
    """After one full call, calls whose arguments are NumPy arrays or device
    Arrays of the same types take the fast path; they return device Arrays
    equal to the full path's results, and agree with jax.jit."""
    fn, fn_jax, args = fast_path_programs()[index]
    f = ad.jit(counted(fn))
    full = f(*args)  # the full path: traces, compiles, adds an entry
    assert list(f.fast_calls) == [tuple((a.shape, a.dtype) for a in args)]
    used = watch_fast_calls(f)
    from_numpy = f(*args)
    from_device = f(*[ad.device_put(a) for a in args])
    assert len(used) == 2 and f.__wrapped__.calls == 1
    expected = jax.jit(fn_jax)(*args)
    for result in (full, from_numpy, from_device):
        assert jax.tree_util.tree_structure(result) == jax.tree_util.tree_structure(
            expected
        )
        assert_matches(host(result), expected)
        for mine, ref in zip(
            jax.tree_util.tree_leaves(result), jax.tree_util.tree_leaves(full)
        ):
            assert mine.dtype == ref.dtype and mine.shape == ref.shape
            np.testing.assert_array_equal(np.asarray(mine), np.asarray(ref))


def test_fast_path_results_feed_back_in():
    """A loop feeding results back: every call after the first is a fast
    call, and the values follow NumPy's."""
    f = ad.jit(lambda x, v: (x + 0.1 * v, v - 0.1 * ad.sin(x)))
    x, v = ad.device_put(np.linspace(0.0, 1.0, 5)), np.zeros(5)
    x_np, v_np = np.linspace(0.0, 1.0, 5), np.zeros(5)
    x, v = f(x, v)
    used = watch_fast_calls(f)
    for _ in range(20):
        x, v = f(x, v)
    for _ in range(21):
        x_np, v_np = x_np + 0.1 * v_np, v_np - 0.1 * np.sin(x_np)
    assert len(used) == 20 and isinstance(x, ad.Array)
    np.testing.assert_allclose(np.asarray(x), x_np, rtol=TOL)
    np.testing.assert_allclose(np.asarray(v), v_np, rtol=TOL, atol=1e-15)


def test_fast_path_not_taken_under_transformations():
    """Under jvp, vmap, grad, linearize, make_jaxpr and an outer jit the
    cached entry is never used (those calls go through bind and xla_call's
    rules), and every result agrees with JAX."""
    f = ad.jit(lambda x: ad.sin(x) * x)
    x = np.array([0.5, -1.0, 2.0])
    f(x)
    watch_fast_calls(f, forbid=True)
    const = ad.device_put(x)  # a concrete Array closed over by the callers

    def f_jax(x):
        return jnp.sin(x) * x

    primal, tangent = ad.jvp(f, (x,), (np.ones(3),))
    assert_matches(host((primal, tangent)), jax.jvp(f_jax, (x,), (np.ones(3),)))
    batch = np.stack([x, 2.0 * x])
    assert_matches(host(ad.vmap(f)(batch)), jax.vmap(f_jax)(batch))
    g = ad.grad(lambda y: ad.reduce_sum(f(y)))(x)
    assert_matches(host(g), jax.grad(lambda y: jnp.sum(f_jax(y)))(x))
    y, f_lin = ad.linearize(f, x)
    y_jax, f_lin_jax = jax.linearize(f_jax, x)
    assert_matches(host((y, f_lin(np.ones(3)))), (y_jax, f_lin_jax(np.ones(3))))
    # Staged out: make_jaxpr and an outer jit record the call even though its
    # argument is a concrete Array.
    jaxpr, _, _ = ad.make_jaxpr(lambda: f(const) + 1.0)
    assert [e.primitive.name for e in jaxpr.eqns] == ["xla_call", "broadcast", "add"]
    outer = ad.jit(lambda y: f(const) + y)
    assert_matches(host(outer(x)), f_jax(x) + x)
    # Inside jvp of another function, a call on a concrete Array (no tracer
    # among its arguments, nothing staged out) is one that bind sends to the
    # impl rule; the fast path may take it, and the result is the same.
    f.fast_calls.clear()
    f(x)
    used = watch_fast_calls(f)
    _, t = ad.jvp(lambda y: f(const) * y, (x,), (np.ones(3),))
    assert len(used) == 1
    assert_matches(host(t, arrays=False), f_jax(x))


def test_fast_path_needs_every_argument_to_be_an_array_or_a_number():
    """Python and NumPy scalars and 0-d arrays of one dtype share one entry
    (the performance page's fast path covers numbers too); containers are
    keyed by their structure and leaves; array subclasses take the full path
    and leave no entry. Every result agrees with JAX. (More in
    tests/test_fast_path.py.)"""
    f = ad.jit(lambda x, y: x * 2.0 + y)
    f_jax = jax.jit(lambda x, y: x * 2.0 + y)
    for args in [
        (1.5, 2.0),
        (np.float64(1.5), np.array(2.0)),
        (np.array(1.5), 2.0),
    ]:
        assert_matches(host(f(*args)), f_jax(*args))
    assert list(f.fast_calls) == [(((), np.dtype(np.float64)),) * 2]
    g = ad.jit(lambda t: t[0] + t[1]["b"])
    args = ((np.ones(2), {"b": np.arange(2.0)}),)
    assert_matches(host(g(*args)), np.ones(2) + np.arange(2.0))
    assert_matches(host(g(*args)), np.ones(2) + np.arange(2.0))
    assert len(g.fast_calls) == 1 and len(g.traces) == 1  # keyed by structure
    # A NumPy array subclass is not a plain ndarray: the full path.
    h = ad.jit(lambda x: x + 1.0)
    assert_matches(host(h(np.ma.masked_array([1.0, 2.0]))), np.array([2.0, 3.0]))
    assert h.fast_calls == {}


def test_fast_path_signature_change_retraces():
    """A new shape or dtype misses the table: it is traced once and gets its
    own entry; NumPy and device inputs of one type share an entry."""
    body = counted(lambda x: x + x * 2 if x.dtype.kind != "b" else x + x)
    f = ad.jit(body)
    cases = [
        (np.ones(3), 1),
        (ad.device_put(np.arange(3.0)), 1),
        (np.ones(4), 2),
        (np.ones((3, 1)), 3),
        (np.ones(3, np.float32), 4),
        (np.arange(3), 5),
        (ad.device_put(np.arange(4.0)), 5),
        (np.array([True, False]), 6),
    ]
    for x, traces in cases:
        out = f(x)
        host_x = np.asarray(x)
        want = host_x + host_x if host_x.dtype.kind == "b" else host_x + host_x * 2
        np.testing.assert_array_equal(np.asarray(out), want)
        assert np.asarray(out).dtype == want.dtype
        assert body.calls == traces == len(f.fast_calls) == len(f.traces)


def _error_of(fn: Callable, *args: Any) -> tuple[type, str]:
    """The type and message of the exception ``fn(*args)`` raises."""
    with pytest.raises(Exception) as info:
        fn(*args)
    return type(info.value), str(info.value)


def test_errors_unchanged_by_the_fast_path():
    """With an entry in the table, bad calls raise exactly what a jitted
    function without one raises; the entry still works afterwards."""

    def body(x, y):
        return x * y + 1.0

    warm = ad.jit(body)
    x, y = np.ones(3), np.arange(3.0)
    warm(x, y)
    assert len(warm.fast_calls) == 1
    leaked = []
    ad.jit(lambda z: leaked.append(z) or z)(np.ones(3))
    bad_calls = [
        (np.ones(3), np.ones(2)),  # shape mismatch in mul
        (np.ones(3), np.ones(3, "U1")),  # a dtype that is not a number
        (np.array(["a", "b", "c"]), y),  # not numbers
        (np.ones(3, dtype=object), y),
        (leaked[0], y),  # a tracer that escaped its transformation
        ("text", y),
    ]
    for args in bad_calls:
        expected = _error_of(ad.jit(body), *args)
        assert _error_of(warm, *args) == expected
        assert issubclass(expected[0], (TypeError, ValueError))
        assert_state_clean()
    assert len(warm.fast_calls) == 1
    np.testing.assert_array_equal(np.asarray(warm(x, y)), x * y + 1.0)


def test_no_fast_path_entry_for_a_trace_with_tracer_constants():
    """A jitted function called on concrete arrays while it closes over an
    outer tracer: the trace is valid for that call only, so no entry is
    made, and a later call with an ordinary closure is traced again."""
    holder: dict[str, Any] = {}
    inner = ad.jit(lambda y: y * holder["x"])
    y = np.array([2.0, 3.0])

    def outer(x):
        holder["x"] = x
        return inner(y)

    x = np.array([1.0, -2.0])
    ours = ad.jvp(outer, (x,), (np.ones(2),))
    assert_matches(host(ours), jax.jvp(lambda x: y * x, (x,), (np.ones(2),)))
    assert inner.fast_calls == {} and inner.traces == {}
    holder["x"] = np.array([5.0, 5.0])
    np.testing.assert_array_equal(np.asarray(inner(y)), y * 5.0)
    assert len(inner.fast_calls) == 1


def test_fast_path_from_several_threads():
    """Threads calling one warmed-up jitted function at the same time, each
    with its own arrays: every call takes the fast path and is right."""
    f = ad.jit(lambda x, k: ad.sin(x) * k + x)
    f(np.zeros(4), np.ones(4))
    used = watch_fast_calls(f)
    results: dict[int, Any] = {}

    def work(k: int) -> None:
        x, scale = np.linspace(0.0, 1.0, 4) * k, np.full(4, float(k))
        try:
            results[k] = [np.asarray(f(x, scale)) for _ in range(50)]
        except Exception as err:  # reported by the main thread below
            results[k] = err

    threads = [threading.Thread(target=work, args=(k,)) for k in range(1, 5)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(used) == 4 * 50
    for k in range(1, 5):
        x = np.linspace(0.0, 1.0, 4) * k
        expected = jax.jit(lambda x, k: jnp.sin(x) * k + x)(x, np.full(4, float(k)))
        for result in results[k]:
            np.testing.assert_allclose(result, expected, rtol=TOL)
