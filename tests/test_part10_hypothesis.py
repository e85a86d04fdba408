"""Property-based tests of Part 10's stackless core (``autodidax.stackless``)
against JAX, with Hypothesis (issue 31).

The programs come from the generator of tests/test_hypothesis.py, restricted
to what the stackless core has: ``neg sin cos add mul greater less
reduce_sum transpose broadcast`` (subtraction is spelled ``x + neg(y)``,
which is exact), on float64 values, with booleans only as results of the
comparisons. That generator cannot be restricted by a parameter, so this file
subclasses its ``Builder``: the subclass draws from a smaller list of steps
and overrides the few helpers that would reach other primitives (reshape,
int32 values, other unary and comparison primitives) or NumPy broadcasting
(the stackless core's binary operations want equal shapes, or a Python
number). Everything else is reused: the program data, the step methods for
reduce_sum, transpose and broadcast, the drawing of shapes and values, the
JAX interpreter ``Jax`` and ``assert_matches``. A thin interpreter
``Stackless`` runs the programs with the stackless core (its wrappers, or
Python's operators when an operand is a tracer); it makes the generator's
negative axis numbers of transpose and broadcast non-negative, which the
stackless wrappers ask for.

Each transformation of the stackless core, eval, jvp, vmap (in_axes drawn,
out axis 0), grad (of a weighted sum of the float outputs, with respect to a
drawn argument, the others closed over), jit and jit of grad, is compared
with JAX's (float64, to 1e-9), on a small, fixed, derandomized budget.
"""

from __future__ import annotations

import operator

import jax
import jax.numpy as jnp
import pytest
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st
from test_hypothesis import (
    FLT,
    STYLES,
    Builder,
    Jax,
    Program,
    assert_matches,
    is_float,
    run,
    shapes,
    values,
)

from autodidax import stackless as sl

pytestmark = pytest.mark.usefixtures("clean_interpreter_stack")

EXAMPLES = settings(
    max_examples=30,
    derandomize=True,
    database=None,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
KINDS = {"neg", "sin", "cos", "add", "mul", "sub", "greater", "less"}
KINDS |= {"scalar", "reduce_sum", "transpose", "broadcast"}


# ---------------------------------------------------------------------------
# The generator, restricted to the stackless core's primitives
# ---------------------------------------------------------------------------


class StacklessBuilder(Builder):
    """test_hypothesis.Builder with only the steps the stackless core can
    run, and float64 operands of equal shapes for the binary operations."""

    STEPS = ["unary", "binary", "scalar", "compare", "reduce_sum", "transpose"]
    STEPS += ["broadcast"]

    def step(self) -> None:
        getattr(self, "step_" + self.draw(st.sampled_from(self.STEPS)))()

    def pick_number(self) -> int:
        return self.pick_float()

    def float_of_shape(self, shape) -> int:
        """As Builder's, without the reshape: an existing float, or the sum
        of one broadcast to ``shape``."""
        same = self.pick(lambda t: t == (shape, FLT))
        if same is not None and self.draw(st.booleans()) is False:
            return same
        other = self.pick_float()
        if self.types[other] == (shape, FLT):
            return other
        total = self.emit(
            "reduce_sum", [other], (None,), [((), FLT)], STYLES["reduce_sum"]
        )
        if shape == ():
            return total
        return self.emit(
            "broadcast", [total], (shape, tuple(range(len(shape)))), [(shape, FLT)]
        )

    def partner(self, a: int) -> int:
        return self.float_of_shape(self.shape(a))

    def step_unary(self) -> None:
        a = self.pick_float()
        self.unary(self.draw(st.sampled_from(["sin", "neg", "cos"])), a)

    def step_scalar(self) -> None:
        a = self.pick_float()
        name = self.draw(st.sampled_from(["add", "mul", "sub", "greater", "less"]))
        self.scalar(name, a, self.constant(FLT), self.draw(st.booleans()))

    def step_compare(self) -> None:
        a = self.pick_float()
        b = self.partner(a)
        if self.draw(st.booleans()):
            a, b = b, a
        self.binary(self.draw(st.sampled_from(["greater", "less"])), a, b)


@st.composite
def programs(draw, max_ops: int = 8) -> Program:
    """As test_hypothesis.programs, with StacklessBuilder."""
    in_types = [(s, FLT) for s in draw(st.lists(shapes(), min_size=1, max_size=3))]
    builder = StacklessBuilder(draw, in_types, depth=0)
    for _ in range(draw(st.integers(1, max_ops))):
        if len(builder.ops) >= max_ops:
            break
        builder.step()
    main = max(i for i, (_, dtype) in enumerate(builder.types) if dtype == FLT)
    extra = [builder.pick(lambda t: True) for _ in range(draw(st.integers(0, 2)))]
    return builder.finish([main, *extra])


# ---------------------------------------------------------------------------
# The programs in the stackless core
# ---------------------------------------------------------------------------


def _sub(x, y):
    return sl.add(x, -y if isinstance(y, (int, float)) else sl.neg(y))


class Stackless:
    """Program ops with autodidax.stackless: its wrappers, or Python's
    operators when an operand is a tracer (Op.style "op")."""

    FNS = {
        "neg": sl.neg,
        "sin": sl.sin,
        "cos": sl.cos,
        "add": sl.add,
        "mul": sl.mul,
        "sub": _sub,
        "greater": sl.greater,
        "less": sl.less,
    }
    OPERATORS = {
        "neg": operator.neg,
        "add": operator.add,
        "mul": operator.mul,
        "sub": operator.sub,
        "greater": operator.gt,
        "less": operator.lt,
    }

    @classmethod
    def call(cls, kind: str, style: str, *args):
        if style == "op" and any(isinstance(x, sl.Tracer) for x in args):
            return cls.OPERATORS[kind](*args)
        return cls.FNS[kind](*args)

    @classmethod
    def apply(cls, op, vals: list) -> list:
        kind, p = op.kind, op.params
        if kind == "scalar":
            name, c, left = p
            args = (c, vals[0]) if left else (vals[0], c)
            return [cls.call(name, op.style, *args)]
        if kind == "reduce_sum":
            return [sl.reduce_sum(vals[0], p[0])]
        if kind == "transpose":
            ndim = sl.get_aval(vals[0]).ndim
            return [sl.transpose(vals[0], tuple(a % ndim for a in p[0]))]
        if kind == "broadcast":
            shape, axes = p
            return [sl.broadcast(vals[0], shape, tuple(a % len(shape) for a in axes))]
        return [cls.call(kind, op.style, *vals)]


# ---------------------------------------------------------------------------
# Transformations: (ours, theirs, argument shapes) from a program
# ---------------------------------------------------------------------------


def _float_tangents(outs, tangents) -> list:
    return [t for p, t in zip(outs, tangents) if is_float(p)]


def _scalarize(f, reduce_sum):
    """sum_i c_i * sum(float output i), with fixed weights c_i."""

    def scalar(*args):
        total = 0.0
        floats = [x for x in f(*args) if is_float(x)]
        for i, leaf in enumerate(floats):
            total = total + reduce_sum(leaf) * (0.5 + 0.25 * i)
        return total

    return scalar


def t_eval(ours, theirs, arg_shapes, draw):
    return ours, theirs, arg_shapes


def t_jit(ours, theirs, arg_shapes, draw):
    return sl.jit(ours), theirs, arg_shapes


def t_jvp(ours, theirs, arg_shapes, draw):
    n = len(arg_shapes)

    def jvp_ours(*args):
        outs, touts = sl.jvp(ours, args[:n], args[n:])
        return outs, _float_tangents(outs, touts)

    def jvp_theirs(*args):
        outs, touts = jax.jvp(theirs, args[:n], args[n:])
        return outs, _float_tangents(outs, touts)

    return jvp_ours, jvp_theirs, arg_shapes * 2


def t_vmap(ours, theirs, arg_shapes, draw):
    """in_axes drawn (an int, a negative int or None per argument); every
    output gets the batch axis 0, the stackless vmap's only choice."""
    size = draw(st.sampled_from([2, 1, 3]))
    axes, shapes_ = [], []
    for shape in arg_shapes:
        pos = draw(st.one_of(st.none(), st.integers(0, len(shape))))
        if pos is None:
            axes.append(None)
            shapes_.append(shape)
            continue
        shapes_.append(shape[:pos] + (size,) + shape[pos:])
        axes.append(pos - len(shape) - 1 if draw(st.booleans()) else pos)
    if all(a is None for a in axes):
        axes[0] = 0
        shapes_[0] = (size,) + arg_shapes[0]
    in_axes = tuple(axes)
    return sl.vmap(ours, in_axes), jax.vmap(theirs, in_axes, 0), shapes_


def t_grad(ours, theirs, arg_shapes, draw):
    """grad with respect to a drawn argument; the others are closed over."""
    at = draw(st.integers(0, len(arg_shapes) - 1))

    def grad_of(grad, f):
        def g(*args):
            return grad(lambda x: f(*args[:at], x, *args[at + 1 :]))(args[at])

        return g

    return (
        grad_of(sl.grad, _scalarize(ours, sl.reduce_sum)),
        grad_of(jax.grad, _scalarize(theirs, jnp.sum)),
        arg_shapes,
    )


def t_jit_of_grad(ours, theirs, arg_shapes, draw):
    ours, theirs, arg_shapes = t_grad(ours, theirs, arg_shapes, draw)
    return sl.jit(ours), theirs, arg_shapes


TRANSFORMS = {
    "eval": t_eval,
    "jvp": t_jvp,
    "vmap": t_vmap,
    "grad": t_grad,
    "jit": t_jit,
    "jit-of-grad": t_jit_of_grad,
}


def check(prog: Program, data, name: str) -> None:
    note(prog.pretty())
    ours, theirs, arg_shapes = TRANSFORMS[name](
        lambda *xs: run(prog, Stackless, xs),
        lambda *xs: run(prog, Jax, xs),
        [s for s, _ in prog.in_types],
        data.draw,
    )
    args = values(data.draw, arg_shapes)
    note(f"argument shapes: {[a.shape for a in args]}")
    expected = jax.jit(theirs)(*args)
    assert_matches(ours(*args), expected)
    assert sl.current_trace() is sl.eval_trace


# ---------------------------------------------------------------------------
# The tests
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", TRANSFORMS)
@EXAMPLES
@given(prog=programs(), data=st.data())
def test_stackless_against_jax(name, prog, data):
    check(prog, data, name)


def test_the_generator_keeps_to_the_stackless_primitives():
    """Every op is one the stackless core has, and every one of them (and
    each spelling of the scalar and binary ones) appears."""
    seen = set()

    @settings(max_examples=300, derandomize=True, database=None, deadline=None)
    @given(programs())
    def collect(prog):
        for op in prog.ops:
            assert op.kind in KINDS, op.kind
            name = op.params[0] if op.kind == "scalar" else op.kind
            seen.add(f"{op.kind}/{name}/{op.style}")
            seen.add(op.kind)
        assert prog.types[prog.outs[0]][1] == FLT

    collect()
    assert KINDS <= seen, sorted(KINDS - seen)
    for name in ["add", "mul", "sub", "greater", "less"]:
        for style in ["fn", "np", "op"]:
            assert f"scalar/{name}/{style}" in seen, (name, style)
    assert "neg/neg/op" in seen
