"""Property-based differential tests with Hypothesis (issue 8, SPEC §6).

Hypothesis generates small programs over every primitive (``add mul neg sin
cos greater less reduce_sum transpose broadcast select cond``, with ``cond``
branches that are generated programs themselves, may nest and close over outer
values), their input shapes (rank 0-2, sizes 0-3) and input values. A program
is plain data: it is interpreted once with autodidax and once with
jax.numpy/jax.lax, and the results must agree to 1e-9 in float64.

Each test applies a transformation, or a composition ``outer(inner(program))``
of two, to both versions. A transformation is a small recipe that turns a
function of float arrays into another one, drawing what it needs (vmap's
in_axes and out_axes, which argument grad differentiates, tangent and
cotangent values) from Hypothesis, so that failures shrink to a small program
*and* a small transformation. Every pair of the transformations ``jit vmap jvp
grad linearize vjp make_jaxpr`` is tested, including a transformation composed
with itself (second derivatives, nested vmap, nested jit).

How many examples run: the Hypothesis profile chosen in ``conftest.py``. CI
runs a fixed, derandomized budget; setting ``AUTODIDAX_HYPOTHESIS_EXAMPLES=N``
runs N examples for each single transformation (and proportionally fewer for
each pair), with a random seed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, note, settings
from hypothesis import strategies as st
from jax import lax

import autodidax as ad

pytestmark = pytest.mark.usefixtures("clean_interpreter_stack")

TOL = 1e-9
MAX_RANK = 3  # inputs have rank 0-2; broadcast may add one more axis
MAX_SIZE = 36
MAX_COND_DEPTH = 2
F64 = np.dtype(np.float64)

# The budget per test comes from the loaded profile (conftest.py): a single
# transformation runs the full count, a composition of two a third of it.
BASE_EXAMPLES = settings().max_examples
SINGLE = settings(max_examples=BASE_EXAMPLES)
PAIR = settings(max_examples=max(2, BASE_EXAMPLES // 3))

Shape = tuple[int, ...]
Type = tuple[Shape, bool]  # (shape, is_bool); every other value is float64


# ---------------------------------------------------------------------------
# Programs as data
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Op:
    """``kind`` applied to environment entries ``args``; ``style`` "op" uses
    Python operators when an operand is a tracer (or a device array)."""

    kind: str
    args: tuple[int, ...]
    params: tuple = ()
    style: str = "fn"


@dataclass(frozen=True)
class Program:
    """Input types, ops (each appends its outputs to the environment), the
    type of every environment entry, and which entries are returned."""

    in_types: tuple[Type, ...]
    ops: tuple[Op, ...]
    types: tuple[Type, ...]
    outs: tuple[int, ...]

    def pretty(self, indent: str = "") -> str:
        """The program as readable pseudo-code (shown for failing examples)."""

        def ty(t: Type) -> str:
            return f"{'bool' if t[1] else 'f64'}{list(t[0])}"

        ins = ", ".join(f"v{i}:{ty(t)}" for i, t in enumerate(self.in_types))
        lines = [f"{indent}lambda {ins}:"]
        n = len(self.in_types)
        for op in self.ops:
            n_out = len(op.params[3]) if op.kind == "cond" else 1
            outs = ", ".join(f"v{i}:{ty(self.types[i])}" for i in range(n, n + n_out))
            args = ", ".join(f"v{i}" for i in op.args)
            if op.kind == "cond":
                pred_const, true_prog, false_prog, _, n_operands = op.params
                pred = repr(pred_const) if pred_const is not None else None
                lines.append(
                    f"{indent}  {outs} = cond[pred={pred}, operands={n_operands}]"
                    f"({args})"
                )
                lines.append(true_prog.pretty(indent + "    true: "))
                lines.append(false_prog.pretty(indent + "    false: "))
            else:
                params = f"{list(op.params)}" if op.params else ""
                lines.append(
                    f"{indent}  {outs} = {op.kind}{params}({args}) [{op.style}]"
                )
            n += n_out
        lines.append(f"{indent}  return {', '.join(f'v{i}' for i in self.outs)}")
        return "\n".join(lines)


SCALARS = [0.5, 2, -1.25, 3.0, -1, 0.0]
DIMS = [1, 2, 3, 2, 3, 1, 2, 3, 2, 3, 1, 0]  # a size-0 axis now and then


def shapes(max_rank: int = 2) -> st.SearchStrategy[Shape]:
    return st.lists(st.sampled_from(DIMS), max_size=max_rank).map(tuple)


class Builder:
    """Grows a program one op at a time, drawing every choice from Hypothesis
    (so that shrinking removes ops and simplifies the remaining ones)."""

    def __init__(self, draw: Callable, in_types: Sequence[Type], depth: int) -> None:
        self.draw = draw
        self.in_types = tuple(in_types)
        self.types: list[Type] = list(in_types)
        self.ops: list[Op] = []
        self.depth = depth

    # -- picking values ------------------------------------------------------

    def pick(self, ok: Callable[[Type], bool]) -> int | None:
        """An environment entry whose type satisfies ``ok``: often the most
        recent one (so that ops build on each other), and shrinking toward it;
        None if there is none."""
        ids = [i for i, t in enumerate(self.types) if ok(t)]
        if not ids:
            return None
        back = self.draw(st.one_of(st.just(0), st.integers(0, len(ids) - 1)))
        return ids[-1 - back]

    def pick_float(self) -> int:
        index = self.pick(lambda t: not t[1])
        assert index is not None, "every program has a float value"
        return index

    def float_of_shape(self, shape: Shape) -> int:
        """A float of ``shape``: an existing one, or a sum of another value
        broadcast to ``shape``."""
        same = self.pick(lambda t: t == (shape, False))
        if same is not None and self.draw(st.booleans()) is False:
            return same
        other = self.pick_float()
        if self.types[other] == (shape, False):
            return other
        total = self.emit("reduce_sum", [other], (None,), [((), False)])
        if shape == ():
            return total
        return self.emit(
            "broadcast", [total], (shape, tuple(range(len(shape)))), [(shape, False)]
        )

    def bool_of_shape(self, shape: Shape) -> int:
        """A boolean of ``shape``: an existing one or a new comparison."""
        same = self.pick(lambda t: t == (shape, True))
        if same is not None and self.draw(st.booleans()) is False:
            return same
        a = self.float_of_shape(shape)
        name = self.draw(st.sampled_from(["greater", "less"]))
        if self.draw(st.booleans()):
            b = self.float_of_shape(shape)
            return self.emit(name, [a, b], (), [(shape, True)])
        c, left = self.draw(st.sampled_from(SCALARS)), self.draw(st.booleans())
        return self.emit("scalar", [a], (name, c, left), [(shape, True)])

    def axis(self, axis: int, ndim: int) -> int:
        """``axis``, or the same axis counted from the end."""
        return axis - ndim if self.draw(st.booleans()) else axis

    # -- emitting ops --------------------------------------------------------

    def emit(self, kind: str, args, params=(), out_types=()) -> int:
        style = self.draw(st.sampled_from(["fn", "op"]))
        self.ops.append(Op(kind, tuple(args), tuple(params), style))
        first = len(self.types)
        self.types.extend(out_types)
        return first

    def step(self) -> None:
        kinds = ["unary", "binary", "scalar", "compare", "reduce_sum", "transpose"]
        kinds += ["broadcast", "select"]
        if self.depth < MAX_COND_DEPTH:
            kinds.append("cond")
        kind = self.draw(st.sampled_from(kinds))
        getattr(self, "step_" + kind)()

    def step_unary(self) -> None:
        a = self.pick_float()
        name = self.draw(st.sampled_from(["sin", "neg", "cos"]))
        self.emit(name, [a], (), [self.types[a]])

    def step_binary(self) -> None:
        a = self.pick_float()
        b = self.float_of_shape(self.types[a][0])
        name = self.draw(st.sampled_from(["add", "mul", "sub"]))
        self.emit(name, [a, b], (), [self.types[a]])

    def step_scalar(self) -> None:
        a = self.pick_float()
        name = self.draw(st.sampled_from(["add", "mul", "sub", "greater", "less"]))
        c, left = self.draw(st.sampled_from(SCALARS)), self.draw(st.booleans())
        shape = self.types[a][0]
        self.emit(
            "scalar", [a], (name, c, left), [(shape, name in ("greater", "less"))]
        )

    def step_compare(self) -> None:
        self.bool_of_shape(self.types[self.pick_float()][0])

    def step_reduce_sum(self) -> None:
        a = self.pick_float()
        shape = self.types[a][0]
        ndim = len(shape)
        how = self.draw(st.sampled_from(["all", "one", "some"]))
        if how == "all":
            axis, kept = None, ()
        elif how == "one" and ndim:
            ax = self.draw(st.integers(0, ndim - 1))
            axis = self.axis(ax, ndim)
            kept = tuple(d for i, d in enumerate(shape) if i != ax)
        else:
            chosen = self.draw(st.permutations(range(ndim)))
            chosen = chosen[: self.draw(st.integers(0, ndim))]
            axis = tuple(self.axis(i, ndim) for i in chosen)
            kept = tuple(d for i, d in enumerate(shape) if i not in chosen)
        self.emit("reduce_sum", [a], (axis,), [(kept, False)])

    def step_transpose(self) -> None:
        a = self.pick(lambda t: True)
        shape, is_bool = self.types[a]
        perm = self.draw(st.permutations(range(len(shape))))
        out = tuple(shape[p] for p in perm)
        spelled = tuple(self.axis(p, len(shape)) for p in perm)
        self.emit("transpose", [a], (spelled,), [(out, is_bool)])

    def step_broadcast(self) -> None:
        a = self.pick(lambda t: True)
        shape, is_bool = self.types[a]
        room = MAX_RANK - len(shape)
        if room == 0:
            return self.step_unary()
        new = self.draw(st.integers(1, min(2, room)))
        out_ndim = len(shape) + new
        axes = sorted(self.draw(st.permutations(range(out_ndim)))[:new])
        sizes = iter(shape)
        out = tuple(
            self.draw(st.sampled_from(DIMS)) if i in axes else next(sizes)
            for i in range(out_ndim)
        )
        if int(np.prod(out)) > MAX_SIZE:
            return self.step_unary()
        spelled = self.draw(st.permutations([self.axis(i, out_ndim) for i in axes]))
        self.emit("broadcast", [a], (out, tuple(spelled)), [(out, is_bool)])

    def step_select(self) -> None:
        a = self.pick_float()
        shape = self.types[a][0]
        b = self.float_of_shape(shape)
        pred = self.bool_of_shape(shape)
        self.emit("select", [pred, a, b], (), [(shape, False)])

    def step_cond(self) -> None:
        # The predicate: a Python bool, or a traced boolean scalar.
        pred_const = None
        if self.draw(st.integers(0, 4)) == 0:
            pred_const = self.draw(st.booleans())
            pred_args = []
        else:
            pred_args = [self.bool_of_shape(())]
        # Operands, and outer values the branches close over; the first of
        # them is a float, so both branches have a float to work with.
        n_operands = self.draw(st.integers(0, 2))
        n_captured = self.draw(st.integers(0 if n_operands else 1, 1))
        inputs = [self.pick_float()]
        inputs += [
            self.pick(lambda t: True) for _ in range(n_operands + n_captured - 1)
        ]
        branch_in = [self.types[i] for i in inputs]
        float_shapes = [s for s, b in branch_in if not b]
        out_types = [
            (
                self.draw(st.sampled_from(float_shapes)),
                self.draw(st.integers(0, 3)) == 0,
            )
            for _ in range(self.draw(st.integers(1, 2)))
        ]
        true_prog = branch(self.draw, branch_in, out_types, self.depth + 1)
        false_prog = branch(self.draw, branch_in, out_types, self.depth + 1)
        params = (pred_const, true_prog, false_prog, tuple(out_types), n_operands)
        self.emit("cond", pred_args + inputs, params, out_types)

    def finish(self, outs: Sequence[int]) -> Program:
        return Program(self.in_types, tuple(self.ops), tuple(self.types), tuple(outs))


def branch(draw, in_types: list[Type], out_types: list[Type], depth: int) -> Program:
    """A branch of a cond: a program from ``in_types`` to ``out_types``."""
    builder = Builder(draw, in_types, depth)
    for _ in range(draw(st.integers(0, 3))):
        builder.step()
    outs = [
        builder.bool_of_shape(shape) if is_bool else builder.float_of_shape(shape)
        for shape, is_bool in out_types
    ]
    return builder.finish(outs)


@st.composite
def programs(draw, max_ops: int = 8) -> Program:
    """A program of 1-3 float inputs. Its first output is its last float
    value; up to two more outputs are any values (floats or booleans)."""
    in_types = [(s, False) for s in draw(st.lists(shapes(), min_size=1, max_size=3))]
    builder = Builder(draw, in_types, depth=0)
    for _ in range(draw(st.integers(1, max_ops))):
        builder.step()
    main = max(i for i, (_, is_bool) in enumerate(builder.types) if not is_bool)
    extra = [builder.pick(lambda t: True) for _ in range(draw(st.integers(0, 2)))]
    return builder.finish([main, *extra])


# ---------------------------------------------------------------------------
# Two interpreters for programs
# ---------------------------------------------------------------------------


def _traced(*xs: Any) -> bool:
    return any(isinstance(x, (ad.Tracer, ad.Array)) for x in xs)


class Autodidax:
    """Program ops in autodidax, via functions or Python operators."""

    BINARY_OPS = {
        "add": lambda x, y: x + y,
        "mul": lambda x, y: x * y,
        "sub": lambda x, y: x - y,
        "greater": lambda x, y: x > y,
        "less": lambda x, y: x < y,
    }

    @classmethod
    def binary(cls, name, x, y, style):
        if style == "op" and _traced(x, y):
            return cls.BINARY_OPS[name](x, y)
        if name == "sub":
            return ad.add(x, ad.neg(y))
        return getattr(ad, name)(x, y)

    @classmethod
    def apply(cls, op: Op, vals: list) -> list:
        kind, p = op.kind, op.params
        if kind == "neg" and op.style == "op" and _traced(*vals):
            return [-vals[0]]
        if kind in ("neg", "sin", "cos"):
            return [getattr(ad, kind)(*vals)]
        if kind in cls.BINARY_OPS:
            return [cls.binary(kind, *vals, op.style)]
        if kind == "scalar":
            name, c, left = p
            if op.style == "op" and _traced(*vals):
                args = (c, vals[0]) if left else (vals[0], c)
                return [cls.BINARY_OPS[name](*args)]
            if name == "sub":
                return [ad.add(c, ad.neg(vals[0])) if left else ad.add(vals[0], -c)]
            fn = getattr(ad, name)
            return [fn(c, vals[0]) if left else fn(vals[0], c)]
        if kind == "reduce_sum":
            (axis,) = p
            if axis is None:
                return [ad.reduce_sum(vals[0])]
            return [ad.reduce_sum(vals[0], axis)]
        if kind == "transpose":
            return [ad.transpose(vals[0], *p)]
        if kind == "broadcast":
            return [ad.broadcast(vals[0], *p)]
        if kind == "select":
            return [ad.select(*vals)]
        assert kind == "cond"
        return _cond(ad.cond, cls, op, vals)


class Jax:
    """The same ops with jax.numpy and jax.lax (the reference)."""

    FNS = {
        "neg": jnp.negative,
        "sin": jnp.sin,
        "cos": jnp.cos,
        "add": jnp.add,
        "mul": jnp.multiply,
        "sub": jnp.subtract,
        "greater": jnp.greater,
        "less": jnp.less,
    }

    @classmethod
    def apply(cls, op: Op, vals: list) -> list:
        kind, p = op.kind, op.params
        if kind in cls.FNS:
            return [cls.FNS[kind](*vals)]
        if kind == "scalar":
            name, c, left = p
            fn = cls.FNS[name]
            return [fn(c, vals[0]) if left else fn(vals[0], c)]
        if kind == "reduce_sum":
            return [jnp.sum(vals[0], axis=p[0])]
        if kind == "transpose":
            return [jnp.transpose(vals[0], p[0])]
        if kind == "broadcast":
            shape, axes = p
            new = {a % len(shape) for a in axes}
            kept = [i for i in range(len(shape)) if i not in new]
            return [lax.broadcast_in_dim(vals[0], shape, kept)]
        if kind == "select":
            return [lax.select(*vals)]
        assert kind == "cond"
        return _cond(lax.cond, cls, op, vals)


def _cond(cond: Callable, lib: type, op: Op, vals: list) -> list:
    pred_const, true_prog, false_prog, _, n_operands = op.params
    if pred_const is None:
        pred, vals = vals[0], vals[1:]
    else:
        pred = pred_const
    operands, captured = vals[:n_operands], vals[n_operands:]

    def as_branch(prog: Program) -> Callable:
        return lambda *xs: run(prog, lib, [*xs, *captured])

    return list(cond(pred, as_branch(true_prog), as_branch(false_prog), *operands))


def run(prog: Program, lib: type, inputs: Sequence[Any]) -> list:
    """Interpret ``prog`` with ``lib`` (Autodidax or Jax)."""
    env = list(inputs)
    for op in prog.ops:
        env.extend(lib.apply(op, [env[i] for i in op.args]))
    return [env[i] for i in prog.outs]


# ---------------------------------------------------------------------------
# Transformations as recipes over pairs of functions
# ---------------------------------------------------------------------------


@dataclass
class Fns:
    """The same function in both libraries: positional float64 arrays of
    ``arg_shapes`` in, a pytree of arrays out."""

    ours: Callable
    theirs: Callable
    arg_shapes: list[Shape]

    def out_specs(self) -> list:
        """The output leaves' shapes and dtypes, from the JAX version."""
        specs = [jax.ShapeDtypeStruct(s, F64) for s in self.arg_shapes]
        return jax.tree_util.tree_leaves(jax.eval_shape(self.theirs, *specs))


def is_float(x: Any) -> bool:
    return np.dtype(x.dtype).kind == "f"


def float_leaves(tree: Any, flatten: Callable) -> list:
    return [x for x in flatten(tree) if is_float(x)]


def our_leaves(tree: Any) -> list:
    return ad.tree_flatten(tree)[0]


def their_leaves(tree: Any) -> list:
    return jax.tree_util.tree_leaves(tree)


def values(draw, shapes_: Sequence[Shape]) -> list[np.ndarray]:
    """Float64 arrays of ``shapes_``, from a drawn seed (shrinks to seed 0)."""
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    return [rng.uniform(-2.0, 2.0, size=s) for s in shapes_]


def t_jit(fns: Fns, draw) -> Fns:
    """jit; its reference is the JAX function itself."""
    return Fns(ad.jit(fns.ours), fns.theirs, fns.arg_shapes)


def t_make_jaxpr(fns: Fns, draw) -> Fns:
    """Trace to a jaxpr (typechecked and printed), then evaluate it."""

    def ours(*args):
        jaxpr, consts, out_tree = ad.make_jaxpr(fns.ours, *args)
        jaxpr_type = ad.typecheck_jaxpr(jaxpr)
        n = len(consts)
        assert [(t.shape, t.dtype) for t in jaxpr_type.in_types[n:]] == [
            (tuple(np.shape(x)), np.dtype(x.dtype)) for x in args
        ]
        assert str(jaxpr).startswith("{ lambda")
        outs = ad.eval_jaxpr(jaxpr, [*consts, *args])
        return ad.tree_unflatten(out_tree, outs)

    return Fns(ours, fns.theirs, fns.arg_shapes)


def t_vmap(fns: Fns, draw) -> Fns:
    """vmap with drawn in_axes (int, negative int or None) and out_axes."""
    size = draw(st.sampled_from([2, 1, 3]))
    axes, shapes_ = [], []
    for shape in fns.arg_shapes:
        pos = draw(st.one_of(st.none(), st.integers(0, len(shape))))
        if pos is None:
            axes.append(None)
            shapes_.append(shape)
            continue
        shapes_.append(shape[:pos] + (size,) + shape[pos:])
        axes.append(pos - len(shape) - 1 if draw(st.booleans()) else pos)
    if all(a is None for a in axes):
        axes[0] = 0
        shapes_[0] = (size,) + fns.arg_shapes[0]
    rank = min(len(s.shape) for s in fns.out_specs()) + 1
    out_axis = draw(st.integers(-rank, rank - 1))
    in_axes = tuple(axes)
    return Fns(
        ad.vmap(fns.ours, in_axes, out_axis),
        jax.vmap(fns.theirs, in_axes, out_axis),
        shapes_,
    )


def _tangents_of_floats(primals_out, tangents_out, flatten):
    """Tangents of the float outputs only (JAX gives boolean outputs float0
    tangents, autodidax boolean zeros; neither is worth comparing further)."""
    return [
        t for p, t in zip(flatten(primals_out), flatten(tangents_out)) if is_float(p)
    ]


def t_jvp(fns: Fns, draw) -> Fns:
    """jvp: a function of (primals, tangents) -> (outputs, float tangents)."""
    n = len(fns.arg_shapes)

    def ours(*args):
        outs, touts = ad.jvp(fns.ours, args[:n], args[n:])
        return outs, _tangents_of_floats(outs, touts, our_leaves)

    def theirs(*args):
        outs, touts = jax.jvp(fns.theirs, args[:n], args[n:])
        return outs, _tangents_of_floats(outs, touts, their_leaves)

    return Fns(ours, theirs, fns.arg_shapes * 2)


def t_linearize(fns: Fns, draw) -> Fns:
    """linearize, then apply the linear map; the reference is JAX's jvp."""
    n = len(fns.arg_shapes)

    def ours(*args):
        outs, f_lin = ad.linearize(fns.ours, *args[:n])
        return outs, _tangents_of_floats(outs, f_lin(*args[n:]), our_leaves)

    def theirs(*args):
        outs, touts = jax.jvp(fns.theirs, args[:n], args[n:])
        return outs, _tangents_of_floats(outs, touts, their_leaves)

    return Fns(ours, theirs, fns.arg_shapes * 2)


def t_vjp(fns: Fns, draw) -> Fns:
    """vjp of the float outputs: (primals, cotangents) -> (outputs, cts in)."""
    n = len(fns.arg_shapes)
    out_shapes = [tuple(s.shape) for s in fns.out_specs() if s.dtype.kind == "f"]

    def ours(*args):
        outs, f_vjp = ad.vjp(
            lambda *xs: float_leaves(fns.ours(*xs), our_leaves), *args[:n]
        )
        return outs, f_vjp(list(args[n:]))

    def theirs(*args):
        outs, f_vjp = jax.vjp(
            lambda *xs: float_leaves(fns.theirs(*xs), their_leaves), *args[:n]
        )
        return outs, f_vjp(list(args[n:]))

    return Fns(ours, theirs, fns.arg_shapes + out_shapes)


def _scalarize(f: Callable, flatten: Callable, reduce_sum: Callable) -> Callable:
    """sum_i c_i * sum(float output i), with fixed weights c_i."""

    def scalar(*args):
        total = 0.0
        for i, leaf in enumerate(float_leaves(f(*args), flatten)):
            total = total + reduce_sum(leaf) * (0.5 + 0.25 * i)
        return total

    return scalar


def t_grad(fns: Fns, draw) -> Fns:
    """grad of a weighted sum of the float outputs w.r.t. a drawn argument
    (moved to the front, since grad differentiates the first argument)."""
    n = len(fns.arg_shapes)
    at = draw(st.integers(0, n - 1))

    def front(f: Callable) -> Callable:
        return lambda x, *rest: f(*rest[:at], x, *rest[at:])

    shapes_ = [fns.arg_shapes[at]] + fns.arg_shapes[:at] + fns.arg_shapes[at + 1 :]
    ours = ad.grad(_scalarize(front(fns.ours), our_leaves, ad.reduce_sum))
    theirs = jax.grad(_scalarize(front(fns.theirs), their_leaves, jnp.sum))
    return Fns(ours, theirs, shapes_)


TRANSFORMS = {
    "jit": t_jit,
    "vmap": t_vmap,
    "jvp": t_jvp,
    "grad": t_grad,
    "linearize": t_linearize,
    "vjp": t_vjp,
    "make_jaxpr": t_make_jaxpr,
}

# ---------------------------------------------------------------------------
# Comparing results
# ---------------------------------------------------------------------------


def assert_matches(ours: Any, theirs: Any) -> None:
    """Same pytree structure; leaves of the same shape and dtype, floats equal
    to ``TOL`` (relative to the largest reference value), booleans exactly."""
    our_leaves_, our_tree = jax.tree_util.tree_flatten(ours)
    their_leaves_, their_tree = jax.tree_util.tree_flatten(theirs)
    assert our_tree == their_tree
    for mine, ref in zip(our_leaves_, their_leaves_):
        assert isinstance(mine, (np.ndarray, np.generic, ad.Array)), type(mine)
        mine, ref = np.asarray(mine), np.asarray(ref)
        assert mine.shape == ref.shape
        if ref.dtype == jax.dtypes.float0:
            assert not np.any(mine)
            continue
        assert mine.dtype == ref.dtype
        if ref.dtype == np.bool_:
            np.testing.assert_array_equal(mine, ref)
        else:
            scale = max(1.0, float(np.max(np.abs(ref)))) if ref.size else 1.0
            np.testing.assert_allclose(mine, ref, rtol=TOL, atol=TOL * scale)


def check(prog: Program, data, names: Sequence[str]) -> None:
    """Apply the transformations ``names`` (innermost first) to ``prog`` in
    both libraries, draw arguments, and compare."""
    note(prog.pretty())
    fns = Fns(
        lambda *xs: run(prog, Autodidax, xs),
        lambda *xs: run(prog, Jax, xs),
        [s for s, _ in prog.in_types],
    )
    for name in names:
        fns = TRANSFORMS[name](fns, data.draw)
    args = values(data.draw, fns.arg_shapes)
    note(f"argument shapes: {[a.shape for a in args]}")
    expected = jax.jit(fns.theirs)(*args)
    assert_matches(fns.ours(*args), expected)
    assert len(ad._state.stack) == 1 and ad._state.dynamic is ad._state.stack[0]


# ---------------------------------------------------------------------------
# The tests
# ---------------------------------------------------------------------------


@SINGLE
@given(programs(), st.data())
def test_eval(prog, data):
    """Eager evaluation of a generated program."""
    check(prog, data, [])


@pytest.mark.parametrize("name", TRANSFORMS)
@SINGLE
@given(prog=programs(), data=st.data())
def test_single(name, prog, data):
    """One transformation of a generated program."""
    check(prog, data, [name])


PAIRS = [(outer, inner) for outer in TRANSFORMS for inner in TRANSFORMS]


@pytest.mark.parametrize("outer, inner", PAIRS, ids=[f"{o}-of-{i}" for o, i in PAIRS])
@PAIR
@given(prog=programs(max_ops=5), data=st.data())
def test_pair(outer, inner, prog, data):
    """``outer(inner(program))`` for every ordered pair of transformations."""
    check(prog, data, [inner, outer])


def test_generator_covers_every_primitive_and_form():
    """The strategy reaches every primitive, op form and cond variant (checked
    on generated examples, so a change to the generator cannot silently drop
    one)."""
    seen: set[str] = set()

    def visit(prog: Program) -> None:
        for op in prog.ops:
            name = op.kind if op.kind != "scalar" else f"scalar-{op.params[0]}"
            seen.add(f"{name}/{op.style}")
            if op.kind == "cond":
                pred_const, true_prog, false_prog, out_types, n_operands = op.params
                seen.add("cond-const-pred" if pred_const is not None else "cond-pred")
                seen.add(f"cond-operands-{n_operands}")
                if len(op.args) > n_operands + (pred_const is None):
                    seen.add("cond-closure")
                if any(b for _, b in out_types):
                    seen.add("cond-bool-out")
                if any(o.kind == "cond" for o in true_prog.ops + false_prog.ops):
                    seen.add("cond-nested")
                visit(true_prog)
                visit(false_prog)
            if op.kind == "reduce_sum":
                seen.add(f"reduce_sum-{type(op.params[0]).__name__}")

    @settings(max_examples=300, derandomize=True, database=None, deadline=None)
    @given(programs())
    def collect(prog):
        visit(prog)

    collect()
    kinds = ["neg", "sin", "cos", "add", "mul", "sub", "greater", "less"]
    kinds += ["reduce_sum", "transpose", "broadcast", "select", "cond"]
    kinds += [f"scalar-{n}" for n in ("add", "mul", "sub", "greater", "less")]
    expected = {f"{k}/{style}" for k in kinds for style in ("fn", "op")}
    expected |= {"cond-const-pred", "cond-pred", "cond-closure", "cond-bool-out"}
    expected |= {"cond-nested", "cond-operands-0", "cond-operands-1"}
    expected |= {"cond-operands-2", "reduce_sum-NoneType", "reduce_sum-int"}
    expected |= {"reduce_sum-tuple"}
    assert expected <= seen, sorted(expected - seen)


# ---------------------------------------------------------------------------
# Minimal examples of failures the generator found, kept as plain tests
# ---------------------------------------------------------------------------


def test_found_vmap_of_cond_with_batched_predicate_and_two_vector_outputs():
    """Shrunk from test_single[vmap]: a per-example predicate and two
    non-scalar outputs (the predicate is broadcast for every output)."""

    def f(lib, x):
        cond = ad.cond if lib is ad else lax.cond
        total = lib.reduce_sum(x) if lib is ad else jnp.sum(x)
        return cond(total > 0.0, lambda y: (y * y, y), lambda y: (y, -y), x)

    xs = np.array([[1.0, 2.0, 3.0], [-1.0, -2.0, 0.5]])
    assert_matches(ad.vmap(lambda x: f(ad, x))(xs), jax.vmap(lambda x: f(jnp, x))(xs))


def test_found_vmap_of_grad_of_cond_with_vector_examples():
    """The same bug reached through grad: jvp makes a cond with two outputs
    (primal and tangent), which vmap then batches per example."""

    def f(lib, x):
        cond = ad.cond if lib is ad else lax.cond
        total = lib.reduce_sum(x) if lib is ad else jnp.sum(x)
        out = cond(total > 0.0, lambda y: lib.sin(y) * y, lib.cos, x)
        return lib.reduce_sum(out) if lib is ad else jnp.sum(out)

    xs = np.array([[1.0, 2.0, 3.0], [-1.0, -2.0, 0.5]])
    ours = ad.vmap(ad.grad(lambda x: f(ad, x)))(xs)
    assert_matches(ours, jax.vmap(jax.grad(lambda x: f(jnp, x)))(xs))
