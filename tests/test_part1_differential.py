"""Randomized differential tests of Part 1 (eval, jvp, vmap, jacfwd) against JAX.

A small generator builds random straight-line programs over every Part 1
primitive. A program is plain data (a list of ops over an environment of
values with known shapes); it is interpreted once with autodidax and once with
jax.numpy/jax.lax, and the two results must agree to 1e-9 in float64, under
each transformation and their compositions.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from types import SimpleNamespace
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import autodidax as ad

pytestmark = pytest.mark.usefixtures("clean_interpreter_stack")

SEEDS = range(30)
TOL = 1e-9
MAX_RANK = 4
MAX_SIZE = 48

# ---------------------------------------------------------------------------
# Comparing results
# ---------------------------------------------------------------------------


def assert_matches(ours: Any, theirs: Any) -> None:
    """Check that autodidax's pytree of results agrees with JAX's.

    Leaves must be NumPy arrays or scalars of the same shape; floats agree to
    ``TOL``, booleans exactly, and JAX's ``float0`` tangents (of boolean
    outputs) correspond to all-zero tangents here.
    """
    our_leaves, our_tree = jax.tree_util.tree_flatten(ours)
    their_leaves, their_tree = jax.tree_util.tree_flatten(theirs)
    assert our_tree == their_tree
    for mine, ref in zip(our_leaves, their_leaves):
        assert isinstance(mine, (np.ndarray, np.generic)), type(mine)
        ref = np.asarray(ref)
        assert np.shape(mine) == ref.shape
        if ref.dtype == jax.dtypes.float0:
            assert not np.any(mine), "the tangent of a boolean output must be zero"
        elif ref.dtype == np.bool_:
            assert mine.dtype == np.bool_
            np.testing.assert_array_equal(mine, ref)
        else:
            assert mine.dtype == ref.dtype
            scale = max(1.0, float(np.max(np.abs(ref)))) if ref.size else 1.0
            np.testing.assert_allclose(mine, ref, rtol=TOL, atol=TOL * scale)


# ---------------------------------------------------------------------------
# Programs as data
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Op:
    """One step: ``kind`` applied to environment entries ``args``.

    ``style`` is "fn" (call autodidax's functions) or "op" (Python operators,
    used whenever an operand is a tracer).
    """

    kind: str
    args: tuple[int, ...]
    params: tuple = ()
    style: str = "fn"


@dataclass(frozen=True)
class Program:
    """Inputs' shapes, ops, the shape/boolness of every value, and outputs."""

    in_shapes: tuple[tuple[int, ...], ...]
    ops: tuple[Op, ...]
    shapes: tuple[tuple[int, ...], ...]
    is_bool: tuple[bool, ...]
    outs: tuple[int, ...]  # outs[0] is a float value: the "main" output

    @property
    def out_shapes(self) -> list[tuple[int, ...]]:
        return [self.shapes[i] for i in self.outs]


class _Builder:
    """Grows a program one op at a time, tracking shapes."""

    def __init__(self, rng: np.random.Generator, in_shapes: list[tuple]) -> None:
        self.rng = rng
        self.in_shapes = in_shapes
        self.shapes: list[tuple[int, ...]] = list(in_shapes)
        self.is_bool: list[bool] = [False] * len(in_shapes)
        self.ops: list[Op] = []

    def emit(self, kind, args, params=(), shape=(), is_bool=False) -> int:
        style = "op" if self.rng.random() < 0.5 else "fn"
        self.ops.append(Op(kind, tuple(args), params, style))
        self.shapes.append(tuple(shape))
        self.is_bool.append(is_bool)
        return len(self.shapes) - 1

    def pick_float(self) -> int:
        """A float value, favouring recent ones."""
        ids = [i for i, b in enumerate(self.is_bool) if not b]
        weights = np.arange(1, len(ids) + 1, dtype=float) ** 2
        return int(self.rng.choice(ids, p=weights / weights.sum()))

    def pick_partner(self, a: int) -> int:
        """A float value of the same shape as ``a``, made by summing and
        broadcasting another value when no same-shaped one is picked."""
        same = [
            i
            for i, b in enumerate(self.is_bool)
            if not b and self.shapes[i] == self.shapes[a]
        ]
        if self.rng.random() < 0.6:
            return int(self.rng.choice(same))
        b = self.pick_float()
        if self.shapes[b] == self.shapes[a]:
            return b
        total = self.emit("reduce_sum", [b], (None,), ())
        shape = self.shapes[a]
        return self.emit("broadcast", [total], (shape, tuple(range(len(shape)))), shape)

    def python_scalar(self) -> int | float:
        if self.rng.random() < 0.25:
            return int(self.rng.integers(-3, 4))
        return float(np.round(self.rng.uniform(-2, 2), 2))

    def random_axis(self, axis: int, ndim: int) -> int:
        """``axis`` or its negative spelling."""
        return axis - ndim if self.rng.random() < 0.4 else axis

    def step(self) -> None:
        rng = self.rng
        kind = rng.choice(
            ["unary", "binary", "scalar", "compare", "reduce", "transpose", "bcast"],
            p=[0.2, 0.2, 0.12, 0.1, 0.16, 0.11, 0.11],
        )
        a = self.pick_float()
        shape = self.shapes[a]
        ndim = len(shape)
        if kind in ("reduce", "transpose") and ndim == 0 and rng.random() < 0.8:
            kind = "bcast"
        if kind == "unary":
            self.emit(str(rng.choice(["neg", "sin", "cos"])), [a], (), shape)
        elif kind == "binary":
            b = self.pick_partner(a)
            self.emit(str(rng.choice(["add", "mul", "sub"])), [a, b], (), shape)
        elif kind == "scalar":
            name = str(rng.choice(["add", "mul", "sub"]))
            left = bool(rng.random() < 0.5)
            self.emit("scalar", [a], (name, self.python_scalar(), left), shape)
        elif kind == "compare":
            name = str(rng.choice(["greater", "less"]))
            if rng.random() < 0.5:
                b = self.pick_partner(a)
                self.emit(name, [a, b], (), shape, is_bool=True)
            else:
                left = bool(rng.random() < 0.5)
                params = (name, self.python_scalar(), left)
                self.emit("scalar", [a], params, shape, is_bool=True)
        elif kind == "reduce":
            choice = rng.random()
            if choice < 0.25 or ndim == 0:
                axis, kept = None, ()
            elif choice < 0.55:
                ax = int(rng.integers(ndim))
                axis = self.random_axis(ax, ndim)
                kept = tuple(d for i, d in enumerate(shape) if i != ax)
            else:
                count = int(rng.integers(0, ndim + 1))
                chosen = [int(i) for i in rng.permutation(ndim)[:count]]
                axis = tuple(self.random_axis(i, ndim) for i in chosen)
                kept = tuple(d for i, d in enumerate(shape) if i not in chosen)
            self.emit("reduce_sum", [a], (axis,), kept)
        elif kind == "transpose":
            perm = [int(p) for p in rng.permutation(ndim)]
            out_shape = tuple(shape[p] for p in perm)
            perm = tuple(self.random_axis(p, ndim) for p in perm)
            self.emit("transpose", [a], (perm,), out_shape)
        else:
            new = int(rng.integers(1, 3))
            size = int(np.prod(shape, dtype=int))
            if ndim + new > MAX_RANK or size * 3**new > MAX_SIZE:
                self.emit("sin", [a], (), shape)
                return
            out_ndim = ndim + new
            axes = sorted(int(i) for i in rng.permutation(out_ndim)[:new])
            sizes = iter(shape)
            out_shape = tuple(
                int(rng.integers(1, 4)) if i in axes else next(sizes)
                for i in range(out_ndim)
            )
            spelled = [self.random_axis(i, out_ndim) for i in axes]
            spelled = [int(i) for i in rng.permutation(spelled)]
            self.emit("broadcast", [a], (out_shape, tuple(spelled)), out_shape)


def random_shape(rng: np.random.Generator, rank: int) -> tuple[int, ...]:
    return tuple(int(d) for d in rng.choice([1, 2, 3], size=rank, p=[0.2, 0.4, 0.4]))


def random_program(seed: int, n_inputs: int | None = None) -> Program:
    """A deterministic random program for ``seed``."""
    rng = np.random.default_rng(seed)
    if n_inputs is None:
        n_inputs = int(rng.integers(1, 4))
    in_shapes = [random_shape(rng, int(rng.integers(0, 4))) for _ in range(n_inputs)]
    builder = _Builder(rng, in_shapes)
    for _ in range(int(rng.integers(5, 12))):
        builder.step()
    main = max(i for i, b in enumerate(builder.is_bool) if not b)
    bools = [i for i, b in enumerate(builder.is_bool) if b][-2:]
    extra = [int(rng.integers(len(builder.shapes)))] if rng.random() < 0.5 else []
    return Program(
        tuple(in_shapes),
        tuple(builder.ops),
        tuple(builder.shapes),
        tuple(builder.is_bool),
        (main, *bools, *extra),
    )


# ---------------------------------------------------------------------------
# Two interpreters for programs
# ---------------------------------------------------------------------------


def _traced(*xs: Any) -> bool:
    return any(isinstance(x, ad.Tracer) for x in xs)


class AutodidaxOps:
    """Program ops in autodidax, via functions or Python operators."""

    @staticmethod
    def unary(name, x, style):
        if name == "neg" and style == "op" and _traced(x):
            return -x
        return {"neg": ad.neg, "sin": ad.sin, "cos": ad.cos}[name](x)

    @staticmethod
    def binary(name, x, y, style):
        if style == "op" and _traced(x, y):
            ops = {
                "add": lambda: x + y,
                "mul": lambda: x * y,
                "sub": lambda: x - y,
                "greater": lambda: x > y,
                "less": lambda: x < y,
            }
            return ops[name]()
        if name == "sub":
            return ad.add(x, ad.neg(y))
        return getattr(ad, name)(x, y)

    @staticmethod
    def scalar(name, x, c, left, style):
        if style == "op" and _traced(x):
            operands = (c, x) if left else (x, c)
            return AutodidaxOps.binary(name, *operands, "op")
        if name == "sub":
            return ad.add(c, ad.neg(x)) if left else ad.add(x, -c)
        fn = getattr(ad, name)
        return fn(c, x) if left else fn(x, c)

    @staticmethod
    def reduce_sum(x, axis):
        return ad.reduce_sum(x, axis) if axis is not None else ad.reduce_sum(x)

    @staticmethod
    def transpose(x, perm):
        return ad.transpose(x, perm)

    @staticmethod
    def broadcast(x, shape, axes):
        return ad.broadcast(x, shape, axes)


class JaxOps:
    """The same ops in jax.numpy / jax.lax (the reference)."""

    _fns = {
        "neg": jnp.negative,
        "sin": jnp.sin,
        "cos": jnp.cos,
        "add": jnp.add,
        "mul": jnp.multiply,
        "sub": jnp.subtract,
        "greater": jnp.greater,
        "less": jnp.less,
    }

    @staticmethod
    def unary(name, x, style):
        return JaxOps._fns[name](x)

    @staticmethod
    def binary(name, x, y, style):
        return JaxOps._fns[name](x, y)

    @staticmethod
    def scalar(name, x, c, left, style):
        fn = JaxOps._fns[name]
        return fn(c, x) if left else fn(x, c)

    @staticmethod
    def reduce_sum(x, axis):
        return jnp.sum(x, axis=axis)

    @staticmethod
    def transpose(x, perm):
        return jnp.transpose(x, perm)

    @staticmethod
    def broadcast(x, shape, axes):
        new = [a % len(shape) for a in axes]
        kept = [i for i in range(len(shape)) if i not in new]
        return lax.broadcast_in_dim(x, shape, kept)


def run(prog: Program, ops: type, inputs: Sequence[Any]) -> tuple:
    """Interpret ``prog`` with ``ops`` (AutodidaxOps or JaxOps)."""
    env = list(inputs)
    for op in prog.ops:
        vals = [env[i] for i in op.args]
        if op.kind in ("neg", "sin", "cos"):
            out = ops.unary(op.kind, *vals, op.style)
        elif op.kind in ("add", "mul", "sub", "greater", "less"):
            out = ops.binary(op.kind, *vals, op.style)
        elif op.kind == "scalar":
            out = ops.scalar(op.params[0], *vals, *op.params[1:], op.style)
        else:
            out = getattr(ops, op.kind)(*vals, *op.params)
        env.append(out)
    return tuple(env[i] for i in prog.outs)


def program_fns(prog: Program) -> tuple[Callable, Callable]:
    """``prog`` as a function of its inputs, for autodidax and for JAX."""
    return (lambda *xs: run(prog, AutodidaxOps, xs)), (
        lambda *xs: run(prog, JaxOps, xs)
    )


def main_output_fns(prog: Program, at: int, inputs: Sequence[Any]):
    """The main output as a function of input ``at``, the others fixed."""

    def bind_input(ops):
        def f(x):
            xs = list(inputs)
            xs[at] = x
            return run(prog, ops, xs)[0]

        return f

    return bind_input(AutodidaxOps), bind_input(JaxOps)


def random_arrays(rng: np.random.Generator, shapes: Sequence[tuple]) -> list:
    return [rng.uniform(-2.0, 2.0, size=s) for s in shapes]


def batch_axes(rng: np.random.Generator, shapes: Sequence[tuple], size: int):
    """Random in_axes (int, negative int or None; not all None) for arrays of
    ``shapes``, and the shapes with the batch axis inserted."""
    while True:
        axes, new_shapes = [], []
        for shape in shapes:
            if rng.random() < 0.25:
                axes.append(None)
                new_shapes.append(tuple(shape))
                continue
            pos = int(rng.integers(len(shape) + 1))
            new_shapes.append(tuple(shape[:pos]) + (size,) + tuple(shape[pos:]))
            axes.append(pos - len(shape) - 1 if rng.random() < 0.4 else pos)
        if any(a is not None for a in axes):
            return axes, new_shapes


def random_out_axis(rng: np.random.Generator, out_shapes: Sequence[tuple]) -> int:
    """An out_axes value valid for every output (possibly negative)."""
    rank = min(len(s) for s in out_shapes) + 1
    return int(rng.integers(-rank, rank))


def setup(seed: int):
    """The program for ``seed``, an RNG for its data, and its inputs."""
    prog = random_program(seed)
    rng = np.random.default_rng(10_000 + seed)
    return prog, rng, random_arrays(rng, prog.in_shapes)


# ---------------------------------------------------------------------------
# Randomized differential tests
# ---------------------------------------------------------------------------


def test_generator_covers_every_primitive():
    """The seeds used below exercise every Part 1 primitive and op form."""
    kinds, axis_forms, scalar_forms = set(), set(), set()
    for seed in SEEDS:
        prog = random_program(seed)
        for op in prog.ops:
            kinds.add(op.kind)
            if op.kind == "scalar":
                scalar_forms.add((op.params[0], op.params[2], op.style))
                kinds.add(op.params[0])
            if op.kind == "reduce_sum":
                axis = op.params[0]
                axis_forms.add(type(axis).__name__)
                if isinstance(axis, int) and axis < 0:
                    axis_forms.add("negative")
    assert {
        "neg", "sin", "cos", "add", "mul", "sub", "greater", "less", "scalar",
        "reduce_sum", "transpose", "broadcast",
    } <= kinds  # fmt: skip
    assert {"NoneType", "int", "tuple", "negative"} <= axis_forms
    assert len(scalar_forms) >= 10
    ranks = {len(s) for seed in SEEDS for s in random_program(seed).in_shapes}
    assert ranks == {0, 1, 2, 3}


@pytest.mark.parametrize("seed", SEEDS)
def test_eval(seed):
    """Evaluating a random program gives JAX's results."""
    prog, _, inputs = setup(seed)
    f, f_jax = program_fns(prog)
    assert_matches(f(*inputs), jax.jit(f_jax)(*inputs))


@pytest.mark.parametrize("seed", SEEDS)
def test_jvp_with_pytrees(seed):
    """jvp of a program taking and returning nested tuples/dicts."""
    prog, rng, inputs = setup(seed)
    tangents = random_arrays(rng, prog.in_shapes)

    def as_tree(fn):
        def tree_fn(first, rest):
            outs = fn(first, *[rest[f"x{i}"] for i in range(1, len(inputs))])
            return {"main": outs[0], "rest": (list(outs[1:]), None)}

        return tree_fn

    def pack(xs):
        return xs[0], {f"x{i}": x for i, x in enumerate(xs) if i}

    f, f_jax = program_fns(prog)
    ours = ad.jvp(as_tree(f), pack(inputs), pack(tangents))
    theirs = jax.jit(partial(jax.jvp, as_tree(f_jax)))(pack(inputs), pack(tangents))
    assert_matches(ours, theirs)


@pytest.mark.parametrize("seed", SEEDS)
def test_vmap(seed):
    """vmap with random int/negative/None in_axes per argument and out_axes."""
    prog, rng, _ = setup(seed)
    in_axes, shapes = batch_axes(rng, prog.in_shapes, int(rng.integers(1, 4)))
    args = random_arrays(rng, shapes)
    out_axes = random_out_axis(rng, prog.out_shapes)
    f, f_jax = program_fns(prog)
    spec = in_axes[0] if len(set(in_axes)) == 1 else tuple(in_axes)
    ours = ad.vmap(f, spec, out_axes)(*args)
    theirs = jax.jit(jax.vmap(f_jax, spec, out_axes))(*args)
    assert_matches(ours, theirs)


@pytest.mark.parametrize("seed", SEEDS[::3])
def test_vmap_pytree_in_axes(seed):
    """in_axes given as a pytree matching a dict argument."""
    prog = random_program(seed, n_inputs=3)
    rng = np.random.default_rng(10_000 + seed)
    in_axes, shapes = batch_axes(rng, prog.in_shapes, 3)
    args = random_arrays(rng, shapes)
    f, f_jax = program_fns(prog)

    def on_tree(fn):
        return lambda x, d: fn(x, d["b"], d["a"])

    tree_args = (args[0], {"a": args[2], "b": args[1]})
    spec = (in_axes[0], {"a": in_axes[2], "b": in_axes[1]})
    ours = ad.vmap(on_tree(f), spec)(*tree_args)
    theirs = jax.jit(jax.vmap(on_tree(f_jax), spec))(*tree_args)
    assert_matches(ours, theirs)


@pytest.mark.parametrize("seed", SEEDS)
def test_jacfwd(seed):
    """jacfwd of the main output w.r.t. one input; shape out + in."""
    prog, rng, inputs = setup(seed)
    at = int(rng.integers(len(inputs)))
    g, g_jax = main_output_fns(prog, at, inputs)
    ours = ad.jacfwd(g)(inputs[at])
    assert np.shape(ours) == prog.out_shapes[0] + prog.in_shapes[at]
    assert_matches(ours, jax.jit(jax.jacfwd(g_jax))(inputs[at]))


@pytest.mark.parametrize("seed", SEEDS)
def test_nested_jvp(seed):
    """Second and third directional derivatives by jvp of jvp."""
    prog, rng, inputs = setup(seed)
    directions = [random_arrays(rng, prog.in_shapes) for _ in range(3)]

    def derivative(jvp, fn, direction):
        return lambda *xs: jvp(fn, tuple(xs), tuple(direction))[1]

    f, f_jax = program_fns(prog)
    for order in (2, 3):
        g, g_jax = f, f_jax
        for direction in directions[: order - 1]:
            g = derivative(ad.jvp, g, direction)
            g_jax = derivative(jax.jvp, g_jax, direction)
        last = tuple(directions[order - 1])
        ours = ad.jvp(g, tuple(inputs), last)
        theirs = jax.jit(partial(jax.jvp, g_jax))(tuple(inputs), last)
        assert_matches(ours, theirs)


@pytest.mark.parametrize("seed", SEEDS)
def test_vmap_of_jvp(seed):
    """vmap over primals and tangents of a jvp."""
    prog, rng, _ = setup(seed)
    n = len(prog.in_shapes)
    in_axes, shapes = batch_axes(rng, prog.in_shapes * 2, 2)
    args = random_arrays(rng, shapes)
    f, f_jax = program_fns(prog)
    ours = ad.vmap(lambda *a: ad.jvp(f, a[:n], a[n:]), tuple(in_axes))(*args)
    theirs = jax.jit(jax.vmap(lambda *a: jax.jvp(f_jax, a[:n], a[n:]), tuple(in_axes)))(
        *args
    )
    assert_matches(ours, theirs)


@pytest.mark.parametrize("seed", SEEDS)
def test_jvp_of_vmap(seed):
    """jvp of a vmapped program."""
    prog, rng, _ = setup(seed)
    in_axes, shapes = batch_axes(rng, prog.in_shapes, 3)
    primals = tuple(random_arrays(rng, shapes))
    tangents = tuple(random_arrays(rng, shapes))
    out_axes = random_out_axis(rng, prog.out_shapes)
    f, f_jax = program_fns(prog)
    ours = ad.jvp(ad.vmap(f, tuple(in_axes), out_axes), primals, tangents)
    batched = jax.vmap(f_jax, tuple(in_axes), out_axes)
    assert_matches(ours, jax.jit(partial(jax.jvp, batched))(primals, tangents))


@pytest.mark.parametrize("seed", SEEDS)
def test_vmap_of_vmap(seed):
    """Two levels of batching with independent in_axes and out_axes."""
    prog, rng, _ = setup(seed)
    inner_axes, shapes = batch_axes(rng, prog.in_shapes, 2)
    outer_axes, shapes = batch_axes(rng, shapes, 3)
    args = random_arrays(rng, shapes)
    inner_out = random_out_axis(rng, prog.out_shapes)
    outer_out = random_out_axis(rng, [s + (1,) for s in prog.out_shapes])
    f, f_jax = program_fns(prog)
    ours = ad.vmap(
        ad.vmap(f, tuple(inner_axes), inner_out), tuple(outer_axes), outer_out
    )(*args)
    theirs = jax.jit(
        jax.vmap(
            jax.vmap(f_jax, tuple(inner_axes), inner_out),
            tuple(outer_axes),
            outer_out,
        )
    )(*args)
    assert_matches(ours, theirs)


def smallest_input(prog: Program) -> int:
    sizes = [int(np.prod(s, dtype=int)) for s in prog.in_shapes]
    return int(np.argmin(sizes))


@pytest.mark.parametrize("seed", SEEDS)
def test_hessian(seed):
    """jacfwd of jacfwd of the summed main output."""
    prog, _, inputs = setup(seed)
    at = smallest_input(prog)
    g, g_jax = main_output_fns(prog, at, inputs)
    x = inputs[at]
    ours = ad.jacfwd(ad.jacfwd(lambda y: ad.reduce_sum(g(y))))(x)
    assert np.shape(ours) == 2 * prog.in_shapes[at]
    theirs = jax.jit(jax.jacfwd(jax.jacfwd(lambda y: jnp.sum(g_jax(y)))))(x)
    assert_matches(ours, theirs)


@pytest.mark.parametrize("seed", SEEDS)
def test_vmap_of_jacfwd(seed):
    """Per-example Jacobians by vmap of jacfwd."""
    prog, rng, inputs = setup(seed)
    at = smallest_input(prog)
    g, g_jax = main_output_fns(prog, at, inputs)
    (axis,), (shape,) = batch_axes(rng, [prog.in_shapes[at]], 2)
    (xs,) = random_arrays(rng, [shape])
    ours = ad.vmap(ad.jacfwd(g), axis)(xs)
    assert_matches(ours, jax.jit(jax.vmap(jax.jacfwd(g_jax), axis))(xs))


# ---------------------------------------------------------------------------
# Hand-written cases from the spec
# ---------------------------------------------------------------------------


def test_spec_example_value_and_derivative():
    """f(x) = -2 sin x + x at 3.0: value and derivative agree with NumPy/JAX."""

    def f(x):
        return -2 * ad.sin(x) + x

    def f_jax(x):
        return -2 * jnp.sin(x) + x

    value = ad.add(ad.mul(-2, ad.sin(3.0)), 3.0)
    np.testing.assert_allclose(value, -2.0 * np.sin(3.0) + 3.0, rtol=TOL)
    primal, tangent = ad.jvp(f, (3.0,), (1.0,))
    np.testing.assert_allclose(primal, -2.0 * np.sin(3.0) + 3.0, rtol=TOL)
    np.testing.assert_allclose(tangent, -2.0 * np.cos(3.0) + 1.0, rtol=TOL)
    assert_matches((primal, tangent), jax.jvp(f_jax, (3.0,), (1.0,)))
    np.testing.assert_allclose(ad.jacfwd(f)(3.0), jax.grad(f_jax)(3.0), rtol=TOL)


def test_derivative_of_sin_is_cos():
    """d/dx sin at 3.0 is cos 3.0."""
    primal, tangent = ad.jvp(ad.sin, (3.0,), (1.0,))
    np.testing.assert_allclose(primal, np.sin(3.0), rtol=TOL)
    np.testing.assert_allclose(tangent, np.cos(3.0), rtol=TOL)


def test_higher_derivatives_of_sin():
    """Derivatives of sin cycle: cos, -sin, -cos, then sin again (4th)."""

    def derivative(f):
        return lambda x: ad.jvp(f, (x,), (1.0,))[1]

    expected = [np.cos, lambda x: -np.sin(x), lambda x: -np.cos(x), np.sin]
    f, f_jax = ad.sin, jnp.sin
    for reference in expected:
        f, f_jax = derivative(f), jax.grad(f_jax)
        for x in (3.0, -0.7, 1.2):
            np.testing.assert_allclose(f(x), reference(x), rtol=TOL, atol=TOL)
            np.testing.assert_allclose(f(x), f_jax(x), rtol=TOL, atol=TOL)


def control_flow(x, sin, reduce_sum):
    """Python `if` and `while` on (traced) values."""
    total = reduce_sum(x)
    if total > 0.0:
        y = sin(x) * x + 1.0
    else:
        y = x * x - 2.0 * x
    count = 0
    while reduce_sum(y * y) < 50.0 and count < 20:
        y = y * 1.5 + sin(y)
        count += 1
    if count % 2:
        y = -y
    return y


@pytest.mark.parametrize(
    "x", [np.array([0.3, -0.2]), np.array([-1.0, -0.5]), np.array([2.0, 1.5])]
)
def test_python_control_flow_under_jvp(x):
    """if/while on traced values under jvp, and under jvp of jvp."""

    def f(x):
        return control_flow(x, ad.sin, ad.reduce_sum)

    def f_jax(x):
        return control_flow(x, jnp.sin, jnp.sum)

    v = np.array([1.0, -0.5])
    assert_matches(f(x), f_jax(x))
    assert_matches(ad.jvp(f, (x,), (v,)), jax.jvp(f_jax, (x,), (v,)))

    def df(x):
        return ad.jvp(f, (x,), (v,))[1]

    def df_jax(x):
        return jax.jvp(f_jax, (x,), (v,))[1]

    assert_matches(ad.jvp(df, (x,), (v,)), jax.jvp(df_jax, (x,), (v,)))


class Pair:
    """A user-defined container, registered as a pytree node in both libraries."""

    def __init__(self, first: Any, second: Any) -> None:
        self.first = first
        self.second = second


def _pair_children(p: Pair):
    return (p.first, p.second), None


def _pair_from_children(_aux, kids) -> Pair:
    return Pair(*kids)


ad.register_pytree_node(Pair, _pair_children, _pair_from_children)
jax.tree_util.register_pytree_node(Pair, _pair_children, _pair_from_children)


def test_tree_flatten_matches_jax():
    """Leaves come out in JAX's order and unflatten rebuilds the tree."""
    a, b, c, d = (np.array(float(i)) for i in range(4))
    tree = {"z": (a, [b, None]), "y": Pair(c, {"q": d}), "x": Pair(None, ())}
    leaves, treedef = ad.tree_flatten(tree)
    assert [id(x) for x in leaves] == [id(x) for x in jax.tree_util.tree_leaves(tree)]
    rebuilt = ad.tree_unflatten(treedef, leaves)
    assert jax.tree_util.tree_structure(rebuilt) == jax.tree_util.tree_structure(tree)
    assert rebuilt["z"][0] is a and rebuilt["y"].second["q"] is d
    _, other = ad.tree_flatten({"z": (a, [b, None]), "y": Pair(c, d), "x": 1.0})
    assert other != treedef


def test_jvp_and_vmap_with_registered_node():
    """jvp and vmap see through a user-registered container type."""

    def f(ops, p):
        return {"prod": ops.mul(p.first, p.second), "p": Pair(ops.sin(p.first), p)}

    ours_ops = SimpleNamespace(mul=ad.mul, sin=ad.sin)
    jax_ops = SimpleNamespace(mul=jnp.multiply, sin=jnp.sin)
    x, y = np.array([0.5, 1.0, -2.0]), np.array([3.0, -1.0, 0.25])
    primals, tangents = (Pair(x, y),), (Pair(y, x),)
    assert_matches(
        ad.jvp(lambda p: f(ours_ops, p), primals, tangents),
        jax.jvp(lambda p: f(jax_ops, p), primals, tangents),
    )
    xs = np.arange(6.0).reshape(3, 2)
    spec = (Pair(1, None),)
    assert_matches(
        ad.vmap(lambda p: f(ours_ops, p), spec)(Pair(xs, np.array([2.0, 3.0, 4.0]))),
        jax.vmap(lambda p: f(jax_ops, p), spec)(Pair(xs, np.array([2.0, 3.0, 4.0]))),
    )


def test_python_scalars_broadcast_in_every_interpreter():
    """``x * 2.0``, ``1.0 + x``, ``x - 3``, ``2 - x`` agree with JAX everywhere."""

    def f(x):
        return (x * 2.0, 1.0 + x, x - 3, 2 - x, 0.5 * x * x, x > 0.1, 1.0 < x)

    x = np.array([[0.5, -1.0, 2.0], [0.0, 3.0, -0.2]])
    v = np.ones_like(x)
    assert_matches(ad.jvp(f, (x,), (v,)), jax.jvp(f, (x,), (v,)))
    assert_matches(ad.vmap(f, 1)(x), jax.vmap(f, 1)(x))
    assert_matches(ad.jacfwd(lambda x: f(x)[4])(x), jax.jacfwd(lambda x: f(x)[4])(x))
    x32, v32 = x.astype(np.float32), v.astype(np.float32)  # numbers keep float32
    assert_matches(ad.jvp(f, (x32,), (v32,)), jax.jvp(f, (x32,), (v32,)))
    assert_matches(ad.vmap(f)(x32), jax.vmap(f)(x32))


def test_perturbations_are_not_confused():
    """Nested jvps keep their tangents apart (d/dx [x * d/dy (x * y)] = 2x)."""

    def outer(jvp, mul):
        def inner_derivative(x):
            return jvp(lambda y: mul(x, y), (2.0,), (1.0,))[1]

        return lambda x: jvp(lambda x: mul(x, inner_derivative(x)), (x,), (1.0,))

    ours = outer(ad.jvp, ad.mul)(3.0)
    assert_matches(ours, outer(jax.jvp, jnp.multiply)(3.0))
    np.testing.assert_allclose(ours[1], 6.0, rtol=TOL)


def test_nested_vmap_closing_over_outer_batch():
    """An inner vmap may use the outer vmap's batched value (an outer product)."""
    xs = np.array([[1.0, 2.0], [3.0, -1.0], [0.0, 0.5]])
    ys = np.array([[0.5, -1.0, 1.5], [2.0, 0.0, 3.0]])

    def table(vmap, mul, add):
        return vmap(lambda x: vmap(lambda y: add(mul(x, y), y), 1)(ys))(xs)

    ours = table(ad.vmap, ad.mul, ad.add)
    assert_matches(ours, table(jax.vmap, jnp.multiply, jnp.add))
    assert ours.shape == (3, 3, 2)


def test_outputs_that_are_inputs_or_constants():
    """Returning an input, a Python number or a NumPy constant is fine."""

    def f(x, y):
        return {"x": x, "two": 2.0, "ones": np.ones(2), "y": y, "sum": x + y}

    x, y = np.array([1.0, -2.0]), np.array([0.5, 4.0])
    assert_matches(ad.jvp(f, (x, y), (y, x)), jax.jvp(f, (x, y), (y, x)))
    stacked = np.stack([x, y, x])
    for in_axes, args in [
        ((0, None), (stacked, y)),
        ((None, 1), (x, stacked.T)),
        ((1, 0), (stacked.T, stacked)),
    ]:
        ours = ad.vmap(f, in_axes, -1)(*args)
        assert_matches(ours, jax.vmap(f, in_axes, -1)(*args))
    identity, constant = (lambda v: v), (lambda v: np.ones((2, 3)))
    assert_matches(ad.jacfwd(identity)(x), jax.jacfwd(identity)(x))
    assert_matches(ad.jacfwd(constant)(x), jax.jacfwd(constant)(x))


square_p = ad.Primitive("test_square")
square_p.def_rule("impl")(lambda x: [np.square(x)])


@square_p.def_rule("jvp")
def _square_jvp(primals, tangents):
    (x,), (dx,) = primals, tangents
    return [ad.bind(square_p, x)], [ad.mul(ad.mul(2.0, x), dx)]


@square_p.def_rule("vmap")
def _square_vmap(axis_size, vals, dims):
    (x,), (dim,) = vals, dims
    return [ad.bind(square_p, x)], [dim]


def test_user_defined_primitive():
    """A primitive added with Primitive/bind works under every transformation."""

    def f(x):
        return ad.sin(ad.bind(square_p, x))

    def f_jax(x):
        return jnp.sin(jnp.square(x))

    x, v = np.array([[0.5, -1.0, 2.0]]), np.array([[1.0, 2.0, -1.0]])
    assert_matches(f(x), f_jax(x))
    assert_matches(ad.jvp(f, (x,), (v,)), jax.jvp(f_jax, (x,), (v,)))
    assert_matches(ad.vmap(f, 1)(x), jax.vmap(f_jax, 1)(x))
    assert_matches(ad.jacfwd(f)(x), jax.jacfwd(f_jax)(x))
    hessian = ad.jacfwd(ad.jacfwd(f))(x[0])
    assert_matches(hessian, jax.hessian(f_jax)(x[0]))


def test_abstract_values():
    """get_aval/ShapedArray, and tracer shapes like JAX's."""
    m = np.zeros((2, 3), np.float32)
    aval = ad.get_aval(m)
    assert (aval.shape, aval.dtype) == ((2, 3), np.float32)
    shaped = aval
    assert type(shaped) is ad.ShapedArray
    assert shaped == ad.ShapedArray([2, 3], "float32")
    assert hash(shaped) == hash(ad.ShapedArray((2, 3), np.float32))
    assert shaped != ad.ShapedArray((3, 2), np.float32)
    assert shaped != ad.ShapedArray((2, 3), np.float64)
    for value in (2.0, 3, True, np.int32(4)):
        assert ad.get_aval(value).dtype == np.asarray(value).dtype
        assert ad.get_aval(value).shape == ()

    def record(seen):
        def f(x):
            seen.append((tuple(x.shape), np.dtype(x.dtype), x.ndim))
            return x

        return f

    ours, theirs = [], []
    x = np.ones((4, 2, 3))
    ad.jvp(record(ours), (x,), (x,))
    ad.vmap(record(ours), 1)(x)
    ad.vmap(ad.vmap(record(ours), -1))(x)
    jax.jvp(record(theirs), (x,), (x,))
    jax.vmap(record(theirs), 1)(x)
    jax.vmap(jax.vmap(record(theirs), -1))(x)
    assert ours == theirs


def test_threads_have_separate_interpreter_stacks():
    """Transformations running at the same time in two threads do not mix."""
    barrier = threading.Barrier(2, timeout=10)
    results: dict[int, Any] = {}

    def work(k: int) -> None:
        def f(x):
            barrier.wait()  # both threads are inside their transformations
            y = ad.vmap(lambda r: ad.mul(ad.sin(r), float(k)))(x)
            barrier.wait()
            return y

        try:
            results[k] = ad.jvp(f, (np.full((2, 2), 0.3 * k),), (np.ones((2, 2)),))
        except Exception as err:  # reported by the main thread below
            results[k] = err

    threads = [threading.Thread(target=work, args=(k,)) for k in (1, 2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for k in (1, 2):
        x = np.full((2, 2), 0.3 * k)
        expected = jax.jvp(
            partial(lambda r, k: jnp.sin(r) * k, k=k), (x,), (np.ones((2, 2)),)
        )
        assert_matches(results[k], expected)
