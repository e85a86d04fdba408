"""Tests of Part 5: staged control flow with ``cond`` (and the ``select`` primitive).

A generator builds random programs around ``cond``: straight-line code from the
Part 1 generator (every Part 1 primitive, comparisons, Python scalars) plus
``select``, closed-over NumPy constants and ``cond`` equations whose branches
are random programs of their own, of different composition, closing over
different values of the enclosing program (tracers of whatever transformation
runs it), taking and returning pytrees, sometimes jitted, and nested up to three
conds deep. A program is plain data; it is interpreted once with autodidax and
once with jax.numpy/jax.lax (``lax.cond``, ``lax.select``), and the results
must agree to 1e-9 in float64 under eval, jit, jvp, vmap (shared and batched
predicates), linearize, vjp, grad and their compositions. Around that,
structural checks: make_jaxpr/typecheck/printing, partial_eval_jaxpr with
unknown predicates, the linear jaxpr of linearize, the transpose rule's
dot-product test, lowering to ``stablehlo.if`` and compilation caching.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import count_impl_calls
from jax import lax
from test_part1_differential import (
    TOL,
    AutodidaxOps,
    JaxOps,
    Op,
    _Builder,
    assert_matches,
    batch_axes,
    random_arrays,
)
from test_part3_jit import assert_state_clean, counted, host
from test_part4_grad import dependence_vars, vdot

import autodidax as ad

pytestmark = pytest.mark.usefixtures("clean_interpreter_stack")

F64 = np.float64
BOOL = ad.ShapedArray((), np.bool_)
SEEDS = range(12)  # nesting depth 1, 2, 3 by seed % 3
AD_SEEDS = SEEDS[:9]
HEAVY_SEEDS = SEEDS[:6]
JIT2_SEEDS = (0, 2, 4)  # depth 1, 3 and 2 (with a jitted branch)
LINEAR_PRIMITIVES = {"add", "sub", "neg", "mul", "reduce_sum", "broadcast", "transpose"}


def np_tree(tree: Any) -> Any:
    """Every leaf as a NumPy array (device Arrays are copied to the host)."""
    return host(tree, arrays=False)


def check(ours: Any, theirs: Any) -> None:
    """autodidax's pytree of results agrees with JAX's (to 1e-9)."""
    assert_matches(np_tree(ours), theirs)


# ---------------------------------------------------------------------------
# Programs with conds, as data
# ---------------------------------------------------------------------------

# Positional operand structures (a tuple: one entry per operand of cond) and
# branch output structures, by number of leaves; 0 marks a leaf.
IN_TEMPLATES = {
    0: [()],
    1: [(0,), ({"a": 0},), ([0],)],
    2: [(0, 0), ({"b": 0, "a": 0},), (0, None, (0,))],
    3: [(0, {"k": (0, 0)}), (0, 0, 0), ([0, {"z": 0}], 0)],
}
OUT_TEMPLATES = {
    1: [0, (0,), {"y": 0}],
    2: [(0, 0), {"q": [0], "p": 0}],
    3: [(0, (0, 0)), [0, 0, {"r": 0}]],
}


@dataclass(frozen=True)
class Body:
    """A straight-line program whose values are floats ("f"), booleans ("b")
    or the tuple of leaves a cond returns ("t")."""

    in_shapes: tuple[tuple[int, ...], ...]
    ops: tuple[Op, ...]
    shapes: tuple[tuple[int, ...], ...]
    kinds: tuple[str, ...]
    outs: tuple[int, ...]

    @property
    def out_shapes(self) -> list[tuple[int, ...]]:
        return [self.shapes[i] for i in self.outs]

    def conds(self) -> list[CondSpec]:
        return [op.params[0] for op in self.ops if op.kind == "cond"]


@dataclass(frozen=True)
class CondSpec:
    """A cond op: its branches take the operand leaves, then the values they
    close over (different ones for each branch)."""

    true_body: Body
    false_body: Body
    in_tree: Any  # JAX treedef of the tuple of positional operands
    out_tree: Any  # JAX treedef of what each branch returns
    n_operands: int
    n_closed_true: int
    n_closed_false: int
    jit_branches: bool

    def depth(self) -> int:
        inner = [
            c.depth() for b in (self.true_body, self.false_body) for c in b.conds()
        ]
        return 1 + max(inner, default=0)


class BodyBuilder(_Builder):
    """The Part 1 builder, plus select, closed-over constants and conds."""

    def __init__(self, rng, in_shapes, in_kinds, depth: int) -> None:
        super().__init__(rng, list(in_shapes))
        self.kinds = list(in_kinds)
        self.is_bool = [k != "f" for k in in_kinds]
        self.depth = depth

    def emit(self, kind, args, params=(), shape=(), is_bool=False, value_kind=None):
        value_kind = value_kind or ("b" if is_bool else "f")
        i = super().emit(kind, args, params, shape, value_kind != "f")
        self.kinds.append(value_kind)
        return i

    def floats(self) -> list[int]:
        return [i for i, k in enumerate(self.kinds) if k == "f"]

    def float_of_shape(self, shape: tuple) -> int:
        """A float value of ``shape`` (recent ones favoured), or a sum of one
        broadcast to it."""
        same = [i for i in self.floats() if self.shapes[i] == shape]
        if same and self.rng.random() < 0.8:
            weights = np.arange(1, len(same) + 1, dtype=float) ** 2
            return int(self.rng.choice(same, p=weights / weights.sum()))
        b = self.pick_float()
        if self.shapes[b] != ():
            b = self.emit("reduce_sum", [b], (None,), ())
        if shape == ():
            return self.emit("sin", [b], (), ())
        return self.emit("broadcast", [b], (shape, tuple(range(len(shape)))), shape)

    def scalar_predicate(self) -> int:
        a = self.pick_float()
        if self.shapes[a] != ():
            a = self.emit("reduce_sum", [a], (None,), ())
        name = str(self.rng.choice(["greater", "less"]))
        c = float(np.round(self.rng.uniform(-1.5, 1.5), 2))
        left = bool(self.rng.random() < 0.5)
        return self.emit("scalar", [a], (name, c, left), (), is_bool=True)

    def select_step(self) -> None:
        a = self.pick_float()
        shape = self.shapes[a]
        bools = [
            i for i, k in enumerate(self.kinds) if k == "b" and self.shapes[i] == shape
        ]
        if bools and self.rng.random() < 0.6:
            p = int(self.rng.choice(bools))
        else:
            name = str(self.rng.choice(["greater", "less"]))
            p = self.emit(name, [a, self.pick_partner(a)], (), shape, is_bool=True)
        on_false = self.float_of_shape(shape)
        self.emit("select", [p, a, on_false], (), shape)

    def const_step(self) -> None:
        """A closed-over NumPy array (a constant of the traced function)."""
        a = self.pick_float()
        shape = self.shapes[a]
        value = np.round(self.rng.uniform(-1.5, 1.5, size=shape), 3)
        c = self.emit("const", [], (np.asarray(value, F64),), shape)
        self.emit(str(self.rng.choice(["add", "mul"])), [c, a], (), shape)

    def cond_step(self, pred: int | None = None) -> None:
        rng = self.rng
        if pred is None:
            pred = self.scalar_predicate()
        n_ops = int(rng.choice([0, 1, 2, 3], p=[0.08, 0.42, 0.3, 0.2]))
        operands = [self.pick_float() for _ in range(n_ops)]
        templates = IN_TEMPLATES[n_ops]
        in_template = templates[int(rng.integers(len(templates)))]
        floats = self.floats()
        closed_t = [int(i) for i in rng.choice(floats, size=int(rng.integers(0, 3)))]
        closed_f = [int(i) for i in rng.choice(floats, size=int(rng.integers(0, 3)))]
        if not operands and not closed_t:
            closed_t = [self.pick_float()]
        n_out = int(rng.choice([1, 2, 3], p=[0.45, 0.35, 0.2]))
        first = self.shapes[operands[0]] if operands else self.shapes[closed_t[0]]
        out_shapes = [first] + [
            self.shapes[int(rng.choice(floats))] for _ in range(n_out - 1)
        ]
        templates = OUT_TEMPLATES[n_out]
        out_template = templates[int(rng.integers(len(templates)))]
        op_shapes = [self.shapes[i] for i in operands]
        inner = self.depth - 1
        force_true = inner > 0
        force_false = inner > 0 and rng.random() < 0.4
        true_body = random_body(
            rng,
            op_shapes + [self.shapes[i] for i in closed_t],
            out_shapes,
            inner,
            force_true,
        )
        false_body = random_body(
            rng,
            op_shapes + [self.shapes[i] for i in closed_f],
            out_shapes,
            inner,
            force_false,
        )
        spec = CondSpec(
            true_body,
            false_body,
            jax.tree_util.tree_structure(in_template),
            jax.tree_util.tree_structure(out_template),
            n_ops,
            len(closed_t),
            len(closed_f),
            bool(rng.random() < 0.15),
        )
        args = [pred, *operands, *closed_t, *closed_f]
        t = self.emit("cond", args, (spec,), (), value_kind="t")
        for k, shape in enumerate(out_shapes):
            self.emit("item", [t], (k,), shape)

    def random_step(self) -> None:
        r = self.rng.random()
        if r < 0.14:
            self.select_step()
        elif r < 0.22:
            self.const_step()
        elif r < 0.26 and self.depth > 0:
            self.cond_step()
        else:
            self.step()


def random_body(rng, in_shapes, out_shapes, depth: int, force_cond: bool) -> Body:
    """A branch: a random program from ``in_shapes`` (all floats) to floats of
    ``out_shapes``, containing a cond (nested ``depth`` deep) if forced."""
    builder = BodyBuilder(rng, in_shapes, ["f"] * len(in_shapes), depth)
    if not in_shapes:  # a branch taking nothing: start from a constant
        value = np.asarray(rng.uniform(-1.0, 1.0, size=out_shapes[0]), F64)
        builder.emit("const", [], (value,), out_shapes[0])
    n = int(rng.integers(2, 6))
    cond_at = int(rng.integers(0, n + 1)) if force_cond else -1
    for i in range(n):
        if i == cond_at:
            builder.cond_step()
        builder.random_step()
    if cond_at == n:
        builder.cond_step()
    outs = [builder.float_of_shape(tuple(s)) for s in out_shapes]
    return Body(
        tuple(in_shapes),
        tuple(builder.ops),
        tuple(builder.shapes),
        tuple(builder.kinds),
        tuple(outs),
    )


def small_shape(rng: np.random.Generator) -> tuple[int, ...]:
    rank = int(rng.choice([0, 1, 2], p=[0.35, 0.4, 0.25]))
    return tuple(int(d) for d in rng.choice([1, 2, 3], size=rank, p=[0.2, 0.4, 0.4]))


@dataclass(frozen=True)
class Case:
    """A top-level program: input 0 is the predicate of its first cond (a
    boolean scalar), the others are floats."""

    body: Body
    seed: int

    @property
    def float_shapes(self) -> list[tuple[int, ...]]:
        return list(self.body.in_shapes[1:])

    def depth(self) -> int:
        return max(c.depth() for c in self.body.conds())


MAX_OPS, MAX_CONDS = 60, 5  # keeps compile times (XLA's and ours) modest


def random_case(seed: int) -> Case:
    """The program for ``seed``: its first cond is nested 1 + seed % 3 deep.
    Programs over the size limits are drawn again from the same seed."""
    rng = np.random.default_rng(seed)
    while True:
        case = _draw_case(rng, seed)
        bodies = all_bodies(case.body)
        n_ops = sum(len(b.ops) for b in bodies)
        n_conds = sum(len(b.conds()) for b in bodies)
        if n_ops <= MAX_OPS and n_conds <= MAX_CONDS:
            return case


def _draw_case(rng: np.random.Generator, seed: int) -> Case:
    depth = 1 + seed % 3
    float_shapes = [small_shape(rng) for _ in range(int(rng.integers(1, 4)))]
    in_shapes = [(), *float_shapes]
    builder = BodyBuilder(rng, in_shapes, ["b"] + ["f"] * len(float_shapes), depth)
    for _ in range(int(rng.integers(1, 4))):
        builder.random_step() if rng.random() < 0.5 else builder.step()
    builder.cond_step(pred=0)
    outs = [i for i, op in enumerate(builder.ops, len(in_shapes)) if op.kind == "item"]
    for _ in range(int(rng.integers(0, 3))):
        builder.step()
    if rng.random() < 0.3:  # a second cond, on a data-dependent predicate
        builder.depth = 1
        builder.cond_step()
    last = max(builder.floats())
    outs = sorted(set(outs) | {last})
    body = Body(
        tuple(in_shapes),
        tuple(builder.ops),
        tuple(builder.shapes),
        tuple(builder.kinds),
        tuple(outs),
    )
    return Case(body, seed)


# ---------------------------------------------------------------------------
# Two interpreters
# ---------------------------------------------------------------------------


class AdCondOps(AutodidaxOps):
    select = staticmethod(ad.select)
    cond = staticmethod(ad.cond)
    jit = staticmethod(ad.jit)


class JaxCondOps(JaxOps):
    select = staticmethod(lax.select)
    cond = staticmethod(lax.cond)
    jit = staticmethod(jax.jit)


def run_body(body: Body, ops: type, inputs: Sequence[Any]) -> tuple:
    env = list(inputs)
    assert len(env) == len(body.in_shapes)
    for op in body.ops:
        vals = [env[i] for i in op.args]
        if op.kind in ("neg", "sin", "cos"):
            out = ops.unary(op.kind, *vals, op.style)
        elif op.kind in ("add", "mul", "sub", "greater", "less"):
            out = ops.binary(op.kind, *vals, op.style)
        elif op.kind == "scalar":
            out = ops.scalar(op.params[0], *vals, *op.params[1:], op.style)
        elif op.kind == "select":
            out = ops.select(*vals)
        elif op.kind == "const":
            out = op.params[0]
        elif op.kind == "item":
            out = vals[0][op.params[0]]
        elif op.kind == "cond":
            out = run_cond(op.params[0], ops, vals)
        else:
            out = getattr(ops, op.kind)(*vals, *op.params)
        env.append(out)
    return tuple(env[i] for i in body.outs)


def run_cond(spec: CondSpec, ops: type, vals: list) -> tuple:
    pred, rest = vals[0], vals[1:]
    n, nt = spec.n_operands, spec.n_closed_true
    operands, closed_t, closed_f = rest[:n], rest[n : n + nt], rest[n + nt :]
    assert len(closed_f) == spec.n_closed_false

    def branch(body: Body, closed: list) -> Callable:
        def fn(*args):
            leaves = jax.tree_util.tree_leaves(args)
            assert len(leaves) == n
            outs = run_body(body, ops, [*leaves, *closed])
            return jax.tree_util.tree_unflatten(spec.out_tree, outs)

        return ops.jit(fn) if spec.jit_branches else fn

    args = jax.tree_util.tree_unflatten(spec.in_tree, operands)
    result = ops.cond(
        pred, branch(spec.true_body, closed_t), branch(spec.false_body, closed_f), *args
    )
    return tuple(jax.tree_util.tree_leaves(result))


def case_fns(case: Case) -> tuple[Callable, Callable]:
    """f(pred, *xs) -> tuple of float outputs, for autodidax and for JAX."""
    return (
        lambda pred, *xs: run_body(case.body, AdCondOps, [pred, *xs]),
        lambda pred, *xs: run_body(case.body, JaxCondOps, [pred, *xs]),
    )


def setup(seed: int):
    case = random_case(seed)
    rng = np.random.default_rng(10_000 + seed)
    return case, rng, random_arrays(rng, case.float_shapes)


def loss_fns(case: Case) -> tuple[Callable, Callable]:
    """loss(xs, pred): a weighted sum of every output, xs a tuple (pytree)."""
    rng = np.random.default_rng(30_000 + case.seed)
    weights = [rng.uniform(-1.0, 1.0, size=s) for s in case.body.out_shapes]
    f, f_jax = case_fns(case)

    def make(fn, total):
        def loss(xs, pred):
            outs = fn(pred, *xs)
            acc = total(outs[0] * weights[0])
            for out, w in zip(outs[1:], weights[1:]):
                acc = acc + total(out * w)
            return acc

        return loss

    return make(f, ad.reduce_sum), make(f_jax, jnp.sum)


def along_line(case: Case, xs: Sequence) -> tuple[Callable, Callable]:
    """(s, pred) -> loss(x + s d, pred) for a random direction d."""
    loss, loss_jax = loss_fns(case)
    rng = np.random.default_rng(40_000 + case.seed)
    directions = random_arrays(rng, case.float_shapes)

    def spread(s, shape):
        return ad.broadcast(s, shape, tuple(range(len(shape)))) if shape else s

    def g(s, pred):
        moved = [x + spread(s, np.shape(x)) * d for x, d in zip(xs, directions)]
        return loss(tuple(moved), pred)

    def g_jax(s, pred):
        return loss_jax(tuple(x + s * d for x, d in zip(xs, directions)), pred)

    return g, g_jax


def with_pred(fn: Callable, pred: Any) -> Callable:
    return lambda *xs: fn(pred, *xs)


_REFERENCES: dict[tuple[int, str], Callable] = {}


def reference(seed: int, name: str, make: Callable[[], Callable]) -> Callable:
    """``jax.jit(make())``, JAX's reference ``name`` for the program of
    ``seed``, built once per test process. The predicate is one of its
    arguments, so the tests of both predicate values (and the other tests
    that compare against the same function) share one trace and one compile;
    each test still compares its own results."""
    key = (seed, name)
    if key not in _REFERENCES:
        _REFERENCES[key] = jax.jit(make())
    return _REFERENCES[key]


BOTH = pytest.mark.parametrize("pred", [True, False], ids=["true", "false"])


# ---------------------------------------------------------------------------
# The generator
# ---------------------------------------------------------------------------


def all_bodies(body: Body) -> list[Body]:
    found = [body]
    for spec in body.conds():
        found += all_bodies(spec.true_body) + all_bodies(spec.false_body)
    return found


def test_generator_covers_every_feature():
    """The seeds have nested conds at depth 1-3, jitted branches, pytrees in
    and out, closures, constants, operand-free conds, select, every
    primitive, and at least one random program has more than one cond."""
    depths, kinds, features = set(), set(), set()
    for seed in SEEDS:
        case = random_case(seed)
        depths.add(case.depth())
        assert case.depth() == 1 + seed % 3
        for body in all_bodies(case.body):
            kinds |= {op.kind for op in body.ops}
            kinds |= {op.params[0] for op in body.ops if op.kind == "scalar"}
            for spec in body.conds():
                features.add(f"operands={spec.n_operands}")
                features.add(f"outs={spec.out_tree.num_leaves}")
                if spec.jit_branches:
                    features.add("jit")
                if spec.n_closed_true != spec.n_closed_false:
                    features.add("different closures")
                if len(spec.in_tree.children()) != spec.n_operands:
                    features.add("pytree operands")
            if len(body.conds()) > 1:
                features.add("several conds")
    assert depths == {1, 2, 3}
    assert {
        "neg", "sin", "cos", "add", "mul", "sub", "greater", "less", "scalar",
        "reduce_sum", "transpose", "broadcast", "select", "const", "cond",
    } <= kinds  # fmt: skip
    assert {
        "operands=0", "operands=1", "operands=2", "operands=3", "outs=1", "outs=2",
        "outs=3", "jit", "different closures", "pytree operands", "several conds",
    } <= features  # fmt: skip


# ---------------------------------------------------------------------------
# Randomized differential tests: eval, jit, jvp, vmap
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("seed", SEEDS)
def test_eval(seed):
    """Eager evaluation with either predicate value (also as a NumPy bool)."""
    case, _, xs = setup(seed)
    f, f_jax = case_fns(case)
    f_ref = reference(seed, "eval", lambda: f_jax)
    for pred in (True, False, np.bool_(True), np.array(False)):
        check(f(pred, *xs), f_ref(pred, *xs))


@pytest.mark.parametrize("seed", SEEDS)
def test_jit(seed):
    """jit traces once for both predicate values and gives JAX's results."""
    case, rng, xs = setup(seed)
    f, f_jax = case_fns(case)
    body = counted(f)
    g = ad.jit(body)
    f_ref = reference(seed, "eval", lambda: f_jax)
    for pred, args in [
        (True, xs),
        (False, xs),
        (True, random_arrays(rng, case.float_shapes)),
    ]:
        out = g(pred, *args)
        assert all(isinstance(o, ad.Array) for o in out)
        check(out, f_ref(pred, *args))
    assert body.calls == len(g.traces) == 1


@pytest.mark.parametrize("seed", SEEDS)
@BOTH
def test_jvp(seed, pred):
    """jvp with the inputs given as a pytree (first, (rest...))."""
    case, rng, xs = setup(seed)
    f, f_jax = case_fns(case)
    ts = random_arrays(rng, case.float_shapes)

    def as_tree(fn):
        return lambda first, rest: fn(pred, first, *rest)

    def jvp_jax(pred, primals, tangents):
        return jax.jvp(lambda first, rest: f_jax(pred, first, *rest), primals, tangents)

    primals, tangents = (xs[0], tuple(xs[1:])), (ts[0], tuple(ts[1:]))
    ours = ad.jvp(as_tree(f), primals, tangents)
    theirs = reference(seed, "jvp", lambda: jvp_jax)(pred, primals, tangents)
    check(ours, theirs)


@pytest.mark.parametrize("seed", SEEDS)
def test_vmap_shared_predicate(seed):
    """Batched operands (random in_axes, some None), an unbatched predicate,
    random out_axes."""
    case, rng, _ = setup(seed)
    f, f_jax = case_fns(case)
    axes, shapes = batch_axes(rng, case.float_shapes, 3)
    args = random_arrays(rng, shapes)
    rank = min(len(s) for s in case.body.out_shapes) + 1
    out_axes = int(rng.integers(-rank, rank))
    spec = (None, *axes)
    for pred in (True, False):
        ours = ad.vmap(f, spec, out_axes)(pred, *args)
        theirs = jax.jit(jax.vmap(f_jax, spec, out_axes))(pred, *args)
        check(ours, theirs)


@pytest.mark.parametrize("seed", SEEDS)
def test_vmap_batched_predicate(seed):
    """A predicate per example (mixed True/False), operands batched on random
    axes (some None); the predicate's axis spelled 0 or -1."""
    case, rng, _ = setup(seed)
    f, f_jax = case_fns(case)
    preds = np.array([True, False, False, True])
    axes, shapes = batch_axes(rng, case.float_shapes, 4)
    args = random_arrays(rng, shapes)
    spec = (int(rng.choice([0, -1])), *axes)
    ours = ad.vmap(f, spec)(preds, *args)
    check(ours, jax.jit(jax.vmap(f_jax, spec))(preds, *args))


@pytest.mark.parametrize("seed", SEEDS)
def test_vmap_batched_predicate_unbatched_operands(seed):
    """Only the predicate is batched: every operand and closure is shared."""
    case, _, xs = setup(seed)
    f, f_jax = case_fns(case)
    preds = np.array([False, True, True])
    spec = (0, *[None] * len(xs))
    ours = ad.vmap(f, spec)(preds, *xs)
    check(ours, jax.jit(jax.vmap(f_jax, spec))(preds, *xs))


@pytest.mark.parametrize("seed", HEAVY_SEEDS)
def test_vmap_of_jit_and_jit_of_vmap(seed):
    case, rng, _ = setup(seed)
    f, f_jax = case_fns(case)
    axes, shapes = batch_axes(rng, case.float_shapes, 3)
    args = random_arrays(rng, shapes)
    preds = np.array([True, False, True])
    for spec, pred in [((None, *axes), True), ((0, *axes), preds)]:
        theirs = jax.jit(jax.vmap(f_jax, spec))(pred, *args)
        check(ad.vmap(ad.jit(f), spec)(pred, *args), theirs)
        check(ad.jit(ad.vmap(f, spec))(pred, *args), theirs)


@pytest.mark.parametrize("seed", HEAVY_SEEDS)
def test_vmap_of_vmap_with_batched_predicates(seed):
    """Two levels of batching, the predicate batched at both."""
    case, rng, _ = setup(seed)
    f, f_jax = case_fns(case)
    inner_axes, shapes = batch_axes(rng, case.float_shapes, 2)
    outer_axes, shapes = batch_axes(rng, shapes, 3)
    args = random_arrays(rng, shapes)
    preds = np.array([[True, False], [False, False], [True, True]])

    def nest(vmap, fn):
        return vmap(vmap(fn, (0, *inner_axes)), (0, *outer_axes))

    check(nest(ad.vmap, f)(preds, *args), jax.jit(nest(jax.vmap, f_jax))(preds, *args))


@pytest.mark.parametrize("seed", HEAVY_SEEDS)
@BOTH
def test_jacfwd(seed, pred):
    case, _, xs = setup(seed)
    f, f_jax = case_fns(case)

    def jacfwd_jax(pred, x, rest):
        return jax.jacfwd(lambda x: f_jax(pred, x, *rest)[0])(x)

    ours = ad.jacfwd(lambda x: f(pred, x, *xs[1:])[0])(xs[0])
    check(ours, reference(seed, "jacfwd", lambda: jacfwd_jax)(pred, xs[0], xs[1:]))


# ---------------------------------------------------------------------------
# Randomized differential tests: linearize, vjp, grad and compositions
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("seed", AD_SEEDS)
@BOTH
def test_linearize(seed, pred):
    """Primal outputs and the linear map on two tangents = jax.jvp's."""
    case, rng, xs = setup(seed)
    f, f_jax = case_fns(case)
    primals_out, f_lin = ad.linearize(with_pred(f, pred), *xs)
    jvp_jax = reference(
        seed, "jvp-flat", lambda: lambda p, xs, ts: jax.jvp(with_pred(f_jax, p), xs, ts)
    )
    for _ in range(2):
        ts = random_arrays(rng, case.float_shapes)
        their_out, their_tangents = jvp_jax(pred, tuple(xs), tuple(ts))
        check(primals_out, their_out)
        check(f_lin(*ts), their_tangents)


@pytest.mark.parametrize("seed", AD_SEEDS[:3])
@BOTH
def test_linearize_against_jax_linearize(seed, pred):
    case, rng, xs = setup(seed)
    f, f_jax = case_fns(case)
    primals_out, f_lin = ad.linearize(with_pred(f, pred), *xs)
    their_out, their_lin = jax.linearize(with_pred(f_jax, pred), *xs)
    check(primals_out, their_out)
    ts = random_arrays(rng, case.float_shapes)
    check(f_lin(*ts), their_lin(*ts))


def random_cotangents(case: Case, rng: np.random.Generator) -> tuple:
    return tuple(rng.uniform(-1.0, 1.0, size=s) for s in case.body.out_shapes)


@pytest.mark.parametrize("seed", AD_SEEDS)
@BOTH
def test_vjp(seed, pred):
    case, rng, xs = setup(seed)
    f, f_jax = case_fns(case)
    cts = random_cotangents(case, rng)
    out, f_vjp = ad.vjp(with_pred(f, pred), *xs)

    def vjp_jax(pred, xs, cts):
        out, pullback = jax.vjp(with_pred(f_jax, pred), *xs)
        return out, pullback(cts)

    their_out, their_cts = reference(seed, "vjp", lambda: vjp_jax)(pred, tuple(xs), cts)
    check(out, their_out)
    check(f_vjp(cts), their_cts)
    # <ct, f_lin(t)> == <f_vjp(ct), t>: vjp transposes linearize.
    _, f_lin = ad.linearize(with_pred(f, pred), *xs)
    ts = random_arrays(rng, case.float_shapes)
    lhs = vdot(cts, np_tree(f_lin(*ts)))
    np.testing.assert_allclose(
        lhs, vdot(np_tree(f_vjp(cts)), ts), rtol=TOL, atol=TOL * max(1.0, abs(lhs))
    )


@pytest.mark.parametrize("seed", AD_SEEDS)
@BOTH
def test_grad(seed, pred):
    """grad with respect to a tuple of all float inputs."""
    case, _, xs = setup(seed)
    loss, loss_jax = loss_fns(case)
    ours = ad.grad(loss)(tuple(xs), pred)
    assert isinstance(ours, tuple) and len(ours) == len(xs)
    check(ours, reference(seed, "grad", lambda: jax.grad(loss_jax))(tuple(xs), pred))


@pytest.mark.parametrize("seed", HEAVY_SEEDS)
def test_grad_of_jit_and_jit_of_grad(seed):
    """grad(jit(f)) and jit(grad(f)) for both predicates; jit(grad) traces
    once, since the predicate is an argument."""
    case, _, xs = setup(seed)
    loss, loss_jax = loss_fns(case)
    grad_jax = reference(seed, "grad", lambda: jax.grad(loss_jax))
    jitted = ad.jit(loss)
    g = ad.jit(ad.grad(loss))
    for pred in (True, False):
        expected = grad_jax(tuple(xs), pred)
        check(ad.grad(jitted)(tuple(xs), pred), expected)
        check(g(tuple(xs), pred), expected)
    assert len(g.traces) == 1


@pytest.mark.parametrize("seed", HEAVY_SEEDS)
def test_vmap_of_grad(seed):
    """Per-example gradients, with a shared and with a per-example predicate."""
    case, rng, _ = setup(seed)
    loss, loss_jax = loss_fns(case)
    axes, shapes = batch_axes(rng, case.float_shapes, 3)
    args = tuple(random_arrays(rng, shapes))
    for pred_axis, pred in [
        (None, False),
        (None, True),
        (0, np.array([1, 0, 1], bool)),
    ]:
        spec = (tuple(axes), pred_axis)
        ours = ad.vmap(ad.grad(loss), spec)(args, pred)
        check(ours, jax.jit(jax.vmap(jax.grad(loss_jax), spec))(args, pred))


@pytest.mark.parametrize("seed", AD_SEEDS)
def test_grad_of_vmap_sum(seed):
    """grad of the summed per-example losses; the predicate per example."""
    case, rng, _ = setup(seed)
    loss, loss_jax = loss_fns(case)
    axes, shapes = batch_axes(rng, case.float_shapes, 3)
    args = tuple(random_arrays(rng, shapes))
    preds = np.array([False, True, False])

    def total(vmap, reduce_sum, loss):
        return lambda xs, ps: reduce_sum(vmap(loss, (tuple(axes), 0))(xs, ps))

    ours = ad.grad(total(ad.vmap, ad.reduce_sum, loss))(args, preds)
    theirs = jax.jit(jax.grad(total(jax.vmap, jnp.sum, loss_jax)))(args, preds)
    check(ours, theirs)


@pytest.mark.parametrize("seed", AD_SEEDS)
@BOTH
def test_jvp_of_grad(seed, pred):
    """Hessian-vector products."""
    case, rng, xs = setup(seed)
    loss, loss_jax = loss_fns(case)
    v = tuple(random_arrays(rng, case.float_shapes))

    def hvp(grad, jvp, loss):
        return lambda pred, xs, v: jvp(lambda xs: grad(loss)(xs, pred), (xs,), (v,))

    check(
        hvp(ad.grad, ad.jvp, loss)(pred, tuple(xs), v),
        reference(seed, "hvp", lambda: hvp(jax.grad, jax.jvp, loss_jax))(
            pred, tuple(xs), v
        ),
    )


@pytest.mark.parametrize("seed", AD_SEEDS)
@BOTH
def test_second_derivatives_along_a_line(seed, pred):
    """grad, grad(grad) and grad(jvp) of s -> loss(x + s d)."""
    case, _, xs = setup(seed)
    g, g_jax = along_line(case, xs)
    s = np.float64(0.3)

    def derivatives(s, pred):
        return jax.grad(g_jax)(s, pred), jax.grad(jax.grad(g_jax))(s, pred)

    d1, d2 = reference(seed, "line", lambda: derivatives)(s, pred)
    check(ad.grad(g)(s, pred), d1)
    check(ad.grad(ad.grad(g))(s, pred), d2)
    check(ad.grad(lambda s: ad.jvp(lambda s: g(s, pred), (s,), (1.0,))[1])(s), d2)


@pytest.mark.parametrize("seed", HEAVY_SEEDS)
def test_vmap_of_second_derivatives(seed):
    """vmap(grad(grad)) over points along the line, with a shared and with a
    per-example predicate."""
    case, _, xs = setup(seed)
    g, g_jax = along_line(case, xs)
    ss = np.array([-0.4, 0.0, 0.7])
    d2 = jax.grad(jax.grad(g_jax))
    for spec, pred in [
        ((0, None), True),
        ((0, None), False),
        ((0, 0), np.array([1, 0, 1], bool)),
    ]:
        ours = ad.vmap(ad.grad(ad.grad(g)), spec)(ss, pred)
        check(ours, jax.jit(jax.vmap(d2, spec))(ss, pred))


@pytest.mark.parametrize("seed", JIT2_SEEDS)
def test_second_derivatives_through_jit(seed):
    """grad(jit(grad)), jit(grad(grad)), grad(grad(jit)) and vmap over a
    batched predicate of grad(grad)."""
    case, _, xs = setup(seed)
    g, g_jax = along_line(case, xs)
    s = np.float64(-0.2)
    preds = np.array([True, False])
    d2 = jax.jit(jax.grad(jax.grad(g_jax)))
    compositions = [
        ad.grad(ad.jit(ad.grad(g))),
        ad.jit(ad.grad(ad.grad(g))),
        ad.grad(ad.grad(ad.jit(g))),
    ]
    for pred in (True, False):
        expected = d2(s, pred)
        for fn in compositions:
            check(fn(s, pred), expected)
    ours = ad.vmap(ad.grad(ad.grad(g)), (None, 0))(s, preds)
    check(ours, jax.jit(jax.vmap(jax.grad(jax.grad(g_jax)), (None, 0)))(s, preds))


# ---------------------------------------------------------------------------
# make_jaxpr, printing, partial_eval_jaxpr, the linear jaxpr, lowering
# ---------------------------------------------------------------------------


def case_jaxpr(case: Case) -> tuple[ad.Jaxpr, list]:
    avals = [BOOL] + [ad.ShapedArray(s, F64) for s in case.float_shapes]
    f, _ = case_fns(case)
    jaxpr, consts, _ = ad.make_jaxpr(f, *avals)
    return jaxpr, consts


def all_eqns(jaxpr: ad.Jaxpr) -> list[ad.JaxprEqn]:
    """Every equation, including those inside cond branches and jit calls."""
    found = []
    for eqn in jaxpr.eqns:
        found.append(eqn)
        for param in eqn.params.values():
            if isinstance(param, ad.Jaxpr):
                found += all_eqns(param)
    return found


@pytest.mark.parametrize("seed", SEEDS)
def test_make_jaxpr_typechecks_and_prints_both_branches(seed):
    case, _, xs = setup(seed)
    jaxpr, consts = case_jaxpr(case)
    jaxpr_type = ad.typecheck_jaxpr(jaxpr)
    assert [t.shape for t in jaxpr_type.out_types] == case.body.out_shapes
    top = [e for e in jaxpr.eqns if e.primitive is ad.cond_p]
    assert len(top) == len(case.body.conds())
    # The predicate input feeds a cond directly.
    pred_var = jaxpr.in_binders[len(consts)]
    assert [e.inputs[0] for e in top].count(pred_var) == 1
    for eqn in [e for e in all_eqns(jaxpr) if e.primitive is ad.cond_p]:
        true_type = ad.typecheck_jaxpr(eqn.params["true_jaxpr"])
        false_type = ad.typecheck_jaxpr(eqn.params["false_jaxpr"])
        assert true_type.in_types == false_type.in_types
        assert true_type.out_types == false_type.out_types
        assert [v.aval for v in eqn.out_binders] == true_type.out_types
    # The printed jaxpr shows every equation of both branches, at every depth.
    text = str(jaxpr)
    printed = re.findall(r"= (\w+)(?:\[| |$)", text, flags=re.M)
    printed = [p for p in printed if p not in ("false_jaxpr", "true_jaxpr")]
    assert sorted(printed) == sorted(e.primitive.name for e in all_eqns(jaxpr))
    n_conds = sum(e.primitive is ad.cond_p for e in all_eqns(jaxpr))
    assert len(re.findall(r"^\s+true_jaxpr =$", text, flags=re.M)) == n_conds
    assert len(re.findall(r"^\s+false_jaxpr =$", text, flags=re.M)) == n_conds
    # The jaxpr computes the function.
    f, f_jax = case_fns(case)
    for pred in (True, False):
        check(tuple(ad.eval_jaxpr(jaxpr, [*consts, pred, *xs])), f_jax(pred, *xs))


def check_partial_eval(
    jaxpr: ad.Jaxpr, args: list, unknowns: list[bool], instantiate: list[bool] | None
) -> tuple[list[bool], int]:
    """Split ``jaxpr``; both halves type-check, their types line up with the
    original's, no equation of the unknown half is known work, and running
    known then unknown computes the original."""
    known, unknown, out_unknowns, num_res = ad.partial_eval_jaxpr(
        jaxpr, unknowns, instantiate
    )
    known_type, unknown_type = ad.typecheck_jaxpr(known), ad.typecheck_jaxpr(unknown)
    n_known_out = out_unknowns.count(False)
    in_types = [v.aval for v in jaxpr.in_binders]
    assert known_type.in_types == [t for t, u in zip(in_types, unknowns) if not u]
    assert unknown_type.in_types[num_res:] == [
        t for t, u in zip(in_types, unknowns) if u
    ]
    assert unknown_type.in_types[:num_res] == known_type.out_types[n_known_out:]
    out_types = ad.typecheck_jaxpr(jaxpr).out_types
    assert known_type.out_types[:n_known_out] == [
        t for t, u in zip(out_types, out_unknowns) if not u
    ]
    assert unknown_type.out_types == [t for t, u in zip(out_types, out_unknowns) if u]
    for forced, unk in zip(instantiate or [], out_unknowns):
        assert unk or not forced
    res_free = dependence_vars(
        unknown, [False] * num_res + [True] * unknowns.count(True)
    )
    for eqn in unknown.eqns:
        assert any(isinstance(x, ad.Var) and x in res_free for x in eqn.inputs), eqn
    expected = ad.eval_jaxpr(jaxpr, args)
    known_outs = ad.eval_jaxpr(known, [a for a, u in zip(args, unknowns) if not u])
    unknown_outs = ad.eval_jaxpr(
        unknown, [*known_outs[n_known_out:], *[a for a, u in zip(args, unknowns) if u]]
    )
    known_it, unknown_it = iter(known_outs[:n_known_out]), iter(unknown_outs)
    combined = [next(unknown_it) if u else next(known_it) for u in out_unknowns]
    assert_matches(np_tree(combined), np_tree(expected))
    return out_unknowns, num_res


@pytest.mark.parametrize("seed", SEEDS)
def test_partial_eval_jaxpr_with_conds(seed):
    """Random unknown patterns over (consts, pred, xs), always including an
    unknown predicate and a known predicate with unknown operands, for the
    jaxpr of f and of its JVP; with random instantiate."""
    case, rng, xs = setup(seed)
    f, _ = case_fns(case)
    jaxpr, consts = case_jaxpr(case)
    n_consts = len(consts)
    for pred in (True, False):
        args = [*consts, pred, *xs]
        n = len(args)
        patterns = [[False] * n, [True] * n]
        patterns += [[i == n_consts for i in range(n)]]  # only the predicate
        patterns += [[i > n_consts for i in range(n)]]  # all but the predicate
        patterns += [[bool(b) for b in rng.random(n) < 0.5] for _ in range(3)]
        for unknowns in patterns:
            instantiate = [bool(b) for b in rng.random(len(jaxpr.outs)) < 0.3]
            check_partial_eval(jaxpr, args, unknowns, instantiate)
    # An unknown predicate sends the whole first cond to the unknown side.
    pred_var = jaxpr.in_binders[n_consts]
    (first,) = [
        e for e in jaxpr.eqns if e.primitive is ad.cond_p and e.inputs[0] is pred_var
    ]
    only_pred = [i == n_consts for i in range(len(jaxpr.in_binders))]
    known, unknown, _, _ = ad.partial_eval_jaxpr(jaxpr, only_pred)
    assert first in unknown.eqns and first not in known.eqns
    # The JVP jaxpr: primals known and tangents unknown, and random patterns.
    avals = [ad.ShapedArray(s, F64) for s in case.float_shapes]
    n_x = len(avals)

    def jvp_f(pred, *args):
        return ad.jvp(with_pred(f, pred), args[:n_x], args[n_x:])

    jvp_jaxpr, jvp_consts, _ = ad.make_jaxpr(jvp_f, BOOL, *avals, *avals)
    ts = random_arrays(rng, case.float_shapes)
    for pred in (True, False):
        args = [*jvp_consts, pred, *xs, *ts]
        n_known = len(jvp_consts) + 1 + n_x
        check_partial_eval(
            jvp_jaxpr, args, [i >= n_known for i in range(len(args))], None
        )
        unknowns = [bool(b) for b in rng.random(len(args)) < 0.5]
        check_partial_eval(jvp_jaxpr, args, unknowns, None)


def test_partial_eval_jaxpr_unknown_predicate_goes_to_the_unknown_side():
    """With the predicate unknown nothing of the cond runs early; with it
    known and one operand unknown the cond is split, and an output that only
    depends on known operands in both branches stays known."""
    vec = ad.ShapedArray((3,), F64)

    def f(p, a, b):
        return ad.cond(
            p,
            lambda a, b: (ad.sin(a), a * b),
            lambda a, b: (ad.cos(a) * 2.0, b - a),
            a,
            b,
        )

    jaxpr, consts, _ = ad.make_jaxpr(f, BOOL, vec, vec)
    assert not consts
    args = [True, np.array([0.1, 0.2, 0.3]), np.array([1.0, -1.0, 2.0])]
    known, unknown, out_unknowns, _ = ad.partial_eval_jaxpr(jaxpr, [True, False, False])
    assert out_unknowns == [True, True]
    assert not any(e.primitive is ad.cond_p for e in known.eqns)
    assert [e.primitive.name for e in unknown.eqns] == ["cond"]
    known, unknown, out_unknowns, _ = ad.partial_eval_jaxpr(jaxpr, [False, False, True])
    assert out_unknowns == [False, True]
    for pred in (True, False):
        check_partial_eval(jaxpr, [pred, *args[1:]], [False, False, True], None)
        check_partial_eval(jaxpr, [pred, *args[1:]], [True, False, False], None)
        check_partial_eval(jaxpr, [pred, *args[1:]], [True, True, True], [True, False])


def check_linear(jaxpr: ad.Jaxpr, linear_in: Sequence[bool]) -> None:
    """Every equation reading a linear value is a linear primitive applied
    linearly, recursing into cond branches and jit calls; a predicate (of cond
    or select) is never linear."""
    linear = {v for v, lin in zip(jaxpr.in_binders, linear_in) if lin}
    for eqn in jaxpr.eqns:
        lin = [isinstance(x, ad.Var) and x in linear for x in eqn.inputs]
        if not any(lin):
            continue
        name = eqn.primitive.name
        if name == "xla_call":
            check_linear(eqn.params["jaxpr"], lin)
        elif name == "cond":
            assert not lin[0], "a linear predicate"
            check_linear(eqn.params["true_jaxpr"], lin[1:])
            check_linear(eqn.params["false_jaxpr"], lin[1:])
        elif name == "select":
            assert not lin[0], "a linear predicate"
        else:
            assert name in LINEAR_PRIMITIVES, name
            if name == "mul":
                assert lin.count(True) == 1
        linear.update(eqn.out_binders)


@pytest.mark.parametrize("seed", AD_SEEDS)
@BOTH
def test_linear_jaxpr_holds_only_linear_work(seed, pred):
    """The linear jaxpr of linearize (of f and of jit(f)) has no sin, cos or
    comparison anywhere (in every branch, at every depth): the primal work
    of the known halves was done while linearizing."""
    case, _, xs = setup(seed)
    f, _ = case_fns(case)
    for fn in (with_pred(f, pred), ad.jit(with_pred(f, pred))):
        flat = lambda *xs, fn=fn: list(fn(*xs))  # noqa: E731
        _, jaxpr, residuals = ad.linearize_flat(flat, xs)
        ad.typecheck_jaxpr(jaxpr)
        assert len(jaxpr.in_binders) == len(residuals) + len(xs)
        check_linear(jaxpr, [False] * len(residuals) + [True] * len(xs))
        names = {e.primitive.name for e in all_eqns(jaxpr)}
        assert not names & {"sin", "cos", "gt", "lt"}, names


def test_linear_map_does_not_rerun_the_primal(monkeypatch):
    """Calling f_lin or f_vjp of a function with (nested) conds runs no sin or
    cos and not the function's Python body: linearize did the primal work."""
    calls = count_impl_calls(monkeypatch, ["sin", "cos"])

    def make(cond, sin, cos, total):
        def f(x):
            def inner(y):
                return cond(total(sin(y)) > 0.0, lambda z: sin(z) * z, cos, y)

            return cond(total(x) > 0.5, inner, lambda y: cos(sin(y)) * x, x)

        return f

    rng = np.random.default_rng(0)
    for x in (
        np.array([0.3, 1.2, -0.5]),
        np.array([-0.3, 0.4, 1.0]),
        np.array([0.3, -1.0, 2.0]),
    ):
        body = counted(make(ad.cond, ad.sin, ad.cos, ad.reduce_sum))
        f_jax = make(lax.cond, jnp.sin, jnp.cos, jnp.sum)
        _, f_lin = ad.linearize(body, x)
        _, f_vjp = ad.vjp(body, x)
        assert body.calls == 2
        before = dict(calls)
        assert before["sin"] + before["cos"] > 0
        for _ in range(2):
            t = rng.uniform(-1, 1, size=3)
            check(f_lin(t), jax.jvp(f_jax, (x,), (t,))[1])
            check(f_vjp(t), jax.vjp(f_jax, x)[1](t))
        assert body.calls == 2
        assert calls == before, "the linear map recomputed primal work"


@pytest.mark.parametrize("seed", SEEDS)
def test_lowering_emits_stablehlo_if(seed):
    """One stablehlo.if per cond equation (each branch lowered once), and
    the compiled module computes the function."""
    case, _, xs = setup(seed)
    jaxpr, consts = case_jaxpr(case)
    text = str(ad.lower_jaxpr(jaxpr))
    eqns = all_eqns(jaxpr)
    n_conds = sum(e.primitive is ad.cond_p for e in eqns)
    assert n_conds >= 1
    assert len(re.findall(r"stablehlo\.(?:if|case)\b", text)) == n_conds
    n_selects = sum(e.primitive is ad.select_p for e in eqns)
    assert len(re.findall(r"stablehlo\.select\b", text)) == n_selects
    _, f_jax = case_fns(case)
    compiled = ad.compile_jaxpr(jaxpr)
    for pred in (True, False):
        check(tuple(compiled(*consts, pred, *xs)), f_jax(pred, *xs))


# ---------------------------------------------------------------------------
# Transposition
# ---------------------------------------------------------------------------


def linear_cond_case(rng: np.random.Generator):
    """A function (pred, w, a, b) -> outputs, linear in (a, b), with
    different linear work in each branch and closed-over weights."""
    shape = tuple(int(d) for d in rng.integers(1, 4, size=int(rng.integers(0, 3))))
    c1 = rng.uniform(-2, 2, size=shape)
    c2 = rng.uniform(-2, 2, size=shape)
    ndim = len(shape)
    perm = tuple(int(p) for p in rng.permutation(ndim))

    def make(cond, transpose, reduce_sum, neg):
        def true_fn(w, a, b):
            y = transpose(a * w + b * c1, perm)
            return y, reduce_sum(a) * 2.0, neg(b)

        def false_fn(w, a, b):
            y = transpose(neg(a) + b * w * c2, perm)
            inner = cond(reduce_sum(w) > 0.0, lambda a: a * 3.0, lambda a: neg(a), a)
            return y, reduce_sum(b * c2), inner + a

        return lambda p, w, a, b: cond(p, true_fn, false_fn, w, a, b)

    ours = make(ad.cond, ad.transpose, ad.reduce_sum, ad.neg)
    theirs = make(lax.cond, jnp.transpose, jnp.sum, jnp.negative)
    return shape, ours, theirs


@pytest.mark.parametrize("seed", range(6))
def test_cond_transpose_rule_passes_the_dot_product_test(seed):
    """The transpose rule applied to the cond equation of a linear function
    (its branches close over arrays, joined into the equation's inputs):
    <ct, L t> == <L^T ct, t> for both predicates, the cotangents equal JAX's;
    linear in both (a, b) or in a only (b a defined value); a None output
    cotangent means zero; defined inputs get None."""
    rng = np.random.default_rng(200 + seed)
    shape, f, f_jax = linear_cond_case(rng)
    aval = ad.ShapedArray(shape, F64)
    jaxpr, consts, _ = ad.make_jaxpr(f, BOOL, aval, aval, aval)
    (eqn,) = jaxpr.eqns
    assert eqn.primitive is ad.cond_p
    p_var, w_var, a_var, b_var = jaxpr.in_binders[len(consts) :]
    consts_of = dict(zip(jaxpr.in_binders, consts))

    def eqn_args(pred, w, a, b) -> list:
        env = {**consts_of, p_var: pred, w_var: w, a_var: a, b_var: b}
        return [x.val if isinstance(x, ad.Lit) else env[x] for x in eqn.inputs]

    def position(var) -> int:
        (i,) = [i for i, x in enumerate(eqn.inputs) if x is var]
        return i

    rule = ad.cond_p.rules["transpose"]
    w, a, b = (rng.uniform(-1, 1, size=shape) for _ in range(3))
    u = ad.UndefPrimal(aval)
    for pred in (True, False):
        outs = ad.bind(ad.cond_p, *eqn_args(pred, w, a, b), **eqn.params)
        cts = [rng.uniform(-1, 1, size=np.shape(o)) for o in outs]
        cts_in = rule(cts, *eqn_args(pred, w, u, u), **eqn.params)
        assert len(cts_in) == len(eqn.inputs)
        a_bar, b_bar = cts_in[position(a_var)], cts_in[position(b_var)]
        defined = [
            c
            for i, c in enumerate(cts_in)
            if i not in (position(a_var), position(b_var))
        ]
        assert all(c is None for c in defined)
        assert np.shape(a_bar) == np.shape(b_bar) == shape
        lhs = vdot(cts, [np.asarray(o) for o in outs])
        np.testing.assert_allclose(
            lhs, vdot([a_bar, b_bar], [a, b]), rtol=TOL, atol=TOL * max(1, abs(lhs))
        )
        _, pullback = jax.vjp(lambda a, b, pred=pred: f_jax(pred, w, a, b), a, b)
        check((a_bar, b_bar), pullback(tuple(cts)))
        # Linear in a only; b defined (zero, so L stays linear in a).
        zeros = np.zeros(shape)
        outs_a = ad.bind(ad.cond_p, *eqn_args(pred, w, a, zeros), **eqn.params)
        cts_none = [cts[0], None, cts[2]]
        cts_in = rule(cts_none, *eqn_args(pred, w, u, zeros), **eqn.params)
        assert cts_in[position(b_var)] is None
        a_bar2 = cts_in[position(a_var)]
        lhs = vdot([cts[0], cts[2]], [np.asarray(outs_a[0]), np.asarray(outs_a[2])])
        np.testing.assert_allclose(
            lhs, vdot(a_bar2, a), rtol=TOL, atol=TOL * max(1, abs(lhs))
        )


@pytest.mark.parametrize("seed", range(4))
def test_backward_pass_through_cond_is_the_transposed_jacobian(seed):
    """backward_pass over the linear jaxpr of a cond function (with the
    predicate and weights defined), against jax.jacfwd, for both predicates."""
    rng = np.random.default_rng(300 + seed)
    shape, f, f_jax = linear_cond_case(rng)
    aval = ad.ShapedArray(shape, F64)
    jaxpr, consts, _ = ad.make_jaxpr(f, BOOL, aval, aval, aval)
    w = rng.uniform(-1, 1, size=shape)
    for pred in (True, False):
        undefs = [ad.UndefPrimal(aval)] * 2
        outs = jax.eval_shape(lambda a, b, pred=pred: f_jax(pred, w, a, b), w, w)
        cts = [rng.uniform(-1, 1, size=o.shape) for o in outs]
        a_bar, b_bar = ad.backward_pass(jaxpr, [*consts, pred, w, *undefs], cts)
        jac = jax.jacfwd(lambda a, b, pred=pred: f_jax(pred, w, a, b), argnums=(0, 1))(
            w, w
        )
        for k, ct_in in enumerate((a_bar, b_bar)):
            expected = sum(
                np.tensordot(ct, np.asarray(jac[i][k]), axes=np.ndim(ct))
                for i, ct in enumerate(cts)
            )
            assert_matches(np.asarray(ct_in, F64), np.asarray(expected, F64))


def test_transposing_a_cond_with_a_linear_predicate_is_an_error():
    vec = ad.ShapedArray((2,), F64)
    jaxpr, consts, _ = ad.make_jaxpr(
        lambda p, a: ad.cond(p, lambda a: a * 2.0, ad.neg, a), BOOL, vec
    )
    (eqn,) = jaxpr.eqns
    with pytest.raises(TypeError, match="predicate"):
        ad.cond_p.rules["transpose"](
            [np.ones(2)], ad.UndefPrimal(BOOL), ad.UndefPrimal(vec), **eqn.params
        )
    assert_state_clean()


# ---------------------------------------------------------------------------
# select on its own
# ---------------------------------------------------------------------------


def select_inputs(seed: int):
    rng = np.random.default_rng(500 + seed)
    shape = tuple(int(d) for d in rng.integers(1, 4, size=int(rng.integers(0, 4))))
    pred = rng.random(shape) < 0.5
    return rng, shape, pred, rng.uniform(-2, 2, shape), rng.uniform(-2, 2, shape)


@pytest.mark.parametrize("seed", range(5))
def test_select(seed):
    """select against jnp.where / lax.select: eval, jit, jvp, vmap (random
    axes, batched predicate or not), grad of both operands, linearize, vjp
    and the transpose rule's dot-product test."""
    rng, shape, pred, a, b = select_inputs(seed)
    expected = np.where(pred, a, b)
    check(ad.select(pred, a, b), lax.select(pred, a, b))
    check(ad.select(pred, a, b), expected)
    check(ad.jit(ad.select)(pred, a, b), expected)
    ta, tb = rng.uniform(-1, 1, shape), rng.uniform(-1, 1, shape)
    check(
        ad.jvp(lambda a, b: ad.select(pred, a, b), (a, b), (ta, tb)),
        jax.jvp(lambda a, b: jnp.where(pred, a, b), (a, b), (ta, tb)),
    )
    # vmap: every combination of batched arguments, at random axes.
    size = 3
    for batched in [
        (True, True, True),
        (True, False, False),
        (False, True, False),
        (False, False, True),
        (True, False, True),
    ]:
        axes, args = [], []
        for x, is_batched in zip((pred, a, b), batched):
            if not is_batched:
                axes.append(None)
                args.append(x)
                continue
            ax = int(rng.integers(-x.ndim - 1, x.ndim + 1))
            stacked = np.stack([x if x.dtype == bool else x + k for k in range(size)])
            if x.dtype == bool:
                stacked = rng.random(stacked.shape) < 0.5
            args.append(np.moveaxis(stacked, 0, ax))
            axes.append(ax)
        expected = jax.vmap(lax.select, tuple(axes))(*args)
        check(ad.vmap(ad.select, tuple(axes))(*args), expected)
        if batched == (True, False, True):
            check(ad.jit(ad.vmap(ad.select, tuple(axes)))(*args), expected)
    # grad of a scalar loss with respect to both operands.
    w = rng.uniform(-1, 1, shape)

    def loss(select, sin, total):
        return lambda ab: total(sin(select(pred, ab[0] * ab[1], ab[1])) * w)

    theirs = jax.grad(loss(lax.select, jnp.sin, jnp.sum))((a, b))
    check(ad.grad(loss(ad.select, ad.sin, ad.reduce_sum))((a, b)), theirs)
    check(ad.grad(ad.jit(loss(ad.select, ad.sin, ad.reduce_sum)))((a, b)), theirs)
    check(ad.jit(ad.grad(loss(ad.select, ad.sin, ad.reduce_sum)))((a, b)), theirs)
    # linearize and vjp.
    _, f_lin = ad.linearize(lambda a, b: ad.select(pred, a, b), a, b)
    check(f_lin(ta, tb), np.where(pred, ta, tb))
    ct = rng.uniform(-1, 1, shape)
    _, f_vjp = ad.vjp(lambda a, b: ad.select(pred, a, b), a, b)
    check(f_vjp(ct), jax.vjp(lambda a, b: lax.select(pred, a, b), a, b)[1](ct))
    # The transpose rule directly: <ct, select(p, ta, tb)> == <rule(ct), t>.
    rule = ad.select_p.rules["transpose"]
    u = ad.UndefPrimal(ad.ShapedArray(shape, F64))
    p_bar, a_bar, b_bar = rule([ct], pred, u, u)
    assert p_bar is None
    lhs = vdot(ct, np.where(pred, ta, tb))
    np.testing.assert_allclose(
        lhs, vdot([a_bar, b_bar], [ta, tb]), rtol=TOL, atol=TOL * max(1, abs(lhs))
    )
    _, a_bar, b_none = rule([ct], pred, u, b)
    assert b_none is None
    check(a_bar, np.where(pred, ct, 0.0))


def test_select_of_other_dtypes_and_python_scalars():
    """select keeps integer and boolean dtypes, and under jit too."""
    pred = np.array([True, False, True])
    for a, b in [
        (np.array([1, 2, 3]), np.array([4, 5, 6])),
        (np.array([True, True, False]), np.array([False, False, True])),
        (np.array([1.0, 2.0, 3.0], np.float32), np.array([4.0, 5.0, 6.0], np.float32)),
    ]:
        expected = lax.select(pred, a, b)
        check(ad.select(pred, a, b), expected)
        check(ad.jit(ad.select)(pred, a, b), expected)
    check(ad.select(np.bool_(False), 1.0, 2.0), lax.select(False, 1.0, 2.0))


# ---------------------------------------------------------------------------
# Hand-written cases
# ---------------------------------------------------------------------------


def kinked(cond, sin, cos):
    return lambda x: cond(x > 0.0, lambda x: sin(x) * x, lambda x: cos(x) * 3.0, x)


def test_chapter_example_everywhere():
    """The chapter's kinked function, on both sides of the kink, under every
    transformation and composition, against JAX."""
    f, f_jax = kinked(ad.cond, ad.sin, ad.cos), kinked(lax.cond, jnp.sin, jnp.cos)
    xs = np.array([1.2, -0.5, 0.3, -2.0])
    d1, d2 = jax.grad(f_jax), jax.grad(jax.grad(f_jax))
    d3 = jax.grad(d2)

    def reference(x):
        return f_jax(x), d1(x), d2(x), d3(x), jax.jvp(f_jax, (x,), (1.0,))

    jitted = [ad.jit(f), ad.jit(ad.grad(f)), ad.jit(ad.grad(ad.jit(ad.grad(f))))]
    grad_of_jit = ad.grad(jitted[0])
    for x in xs:
        y, g1, g2, g3, (p, t) = jax.jit(reference)(x)
        check(f(x), y)
        check(jitted[0](x), y)
        check(ad.grad(f)(x), g1)
        check(grad_of_jit(x), g1)
        check(jitted[1](x), g1)
        check(ad.jvp(f, (x,), (1.0,)), (p, t))
        check(ad.linearize(f, x)[1](2.0), 2.0 * g1)
        check(ad.vjp(f, x)[1](2.0), (2.0 * g1,))
        check(ad.grad(ad.grad(f))(x), g2)
        check(jitted[2](x), g2)
        check(ad.jvp(ad.grad(f), (x,), (1.0,)), (g1, g2))
        check(ad.grad(ad.grad(ad.grad(f)))(x), g3)
    for jitted_fn in jitted:
        assert len(jitted_fn.traces) == 1

    def batched(x):
        return (
            jax.vmap(f_jax)(x),
            jax.vmap(d1)(x),
            jax.vmap(d2)(x),
            jax.jacfwd(jax.vmap(f_jax))(x),
        )

    y, g1, g2, jac = jax.jit(batched)(xs)
    check(ad.vmap(f)(xs), y)
    check(ad.vmap(ad.grad(f))(xs), g1)
    check(ad.vmap(ad.grad(ad.grad(f)))(xs), g2)
    check(ad.jit(ad.vmap(ad.grad(f)))(xs), g1)
    check(ad.jacfwd(ad.vmap(f))(xs), jac)
    check(ad.grad(lambda xs: ad.reduce_sum(ad.vmap(f)(xs)))(xs), g1)


def nested(cond, sin, cos):
    """The chapter's nested example: a cond in a branch, closing over w."""

    def f(x, w):
        def positive(x):
            return cond(x > 1.0, lambda x: sin(x * 2.0) * w, lambda x: cos(x), x)

        return cond(x > 0.0, positive, lambda x: x * w, x)

    return f


def test_nested_cond_closing_over_a_differentiated_value():
    """d/dx and d/dw of the chapter's nested function, every composition."""
    f, f_jax = nested(ad.cond, ad.sin, ad.cos), nested(lax.cond, jnp.sin, jnp.cos)
    points, w = np.array([1.7, 0.4, -0.8]), np.float64(1.5)
    for argnum in (0, 1):
        d = jax.vmap(jax.grad(f_jax, argnum), (0, None))(points, w)

        def ours(grad, f=f, argnum=argnum):
            g = grad(f) if argnum == 0 else grad(lambda w, x: f(x, w))
            return g if argnum == 0 else (lambda x, w: g(w, x))

        check(ad.vmap(ours(ad.grad), (0, None))(points, w), d)
        check(ad.vmap(ad.jit(ours(ad.grad)), (0, None))(points, w), d)
        check(ad.jit(ad.vmap(ours(ad.grad), (0, None)))(points, w), d)
        check(ad.vmap(ours(lambda f: ad.grad(ad.jit(f))), (0, None))(points, w), d)
    hess = jax.hessian(f_jax, argnums=(0, 1))
    for x in points:
        h = hess(x, w)
        check(ad.grad(ad.grad(f))(x, w), h[0][0])
        check(ad.grad(lambda w, x: ad.grad(f)(x, w))(w, x), h[0][1])
        check(ad.jit(ad.grad(lambda w, x=x: ad.grad(lambda w: f(x, w))(w)))(w), h[1][1])


def test_three_levels_of_nesting_with_closures_from_every_level():
    """cond in cond in cond; each level closes over values of the levels
    above (tracers of the enclosing conds and of the transformation)."""

    def make(cond, sin, cos):
        def f(x, y):
            a = sin(x) * y

            def level1(x):
                b = cos(x) + a

                def level2(x):
                    c = x * b
                    return cond(
                        c > 0.5, lambda z: sin(z * c) + a, lambda z: z * b * y, x
                    )

                return cond(x < 1.0, level2, lambda z: cos(z) * a, x)

            return cond(y > 0.0, level1, lambda z: z * z * a, x)

        return f

    f, f_jax = make(ad.cond, ad.sin, ad.cos), make(lax.cond, jnp.sin, jnp.cos)
    points = [(0.3, 0.8), (0.9, 1.3), (1.4, 0.7), (0.2, -0.5), (-0.7, 2.0)]

    @jax.jit
    def reference(x, y):
        return (
            f_jax(x, y),
            jax.grad(f_jax, (0, 1))(x, y),
            jax.grad(jax.grad(f_jax))(x, y),
        )

    f_jit, grad_jit_grad = ad.jit(f), ad.grad(ad.jit(ad.grad(f)))
    for x, y in points:
        value, (dx, dy), dxx = reference(x, y)
        check(f(x, y), value)
        check(f_jit(x, y), value)
        check(ad.grad(f)(x, y), dx)
        check(ad.grad(lambda y, x: f(x, y))(y, x), dy)
        check(ad.grad(ad.grad(f))(x, y), dxx)
        check(grad_jit_grad(x, y), dxx)
    xs = np.array([p[0] for p in points])
    ys = np.array([p[1] for p in points])

    @jax.jit
    def batched(xs, ys):
        return (
            jax.vmap(f_jax)(xs, ys),
            jax.vmap(jax.grad(f_jax))(xs, ys),
            jax.vmap(jax.grad(jax.grad(f_jax)))(xs, ys),
        )

    values, dxs, dxxs = batched(xs, ys)
    check(ad.vmap(f)(xs, ys), values)
    check(ad.vmap(ad.grad(f))(xs, ys), dxs)
    check(ad.vmap(ad.grad(ad.grad(f)))(xs, ys), dxxs)


def test_batched_predicate_with_several_outputs_of_different_ranks():
    """vmap with a per-example predicate of a cond returning (per example) a
    matrix, a vector and a scalar, and two matrices."""

    def make(cond, broadcast, total):
        def f(p, x):
            def yes(x):
                return broadcast(x, (2, 2), 0), x * 2.0, total(x)

            def no(x):
                return broadcast(x, (2, 2), 1), x + 1.0, total(x) * 3.0

            return cond(p, yes, no, x)

        return f

    ours = make(ad.cond, lambda x, s, a: ad.broadcast(x, s, (a,)), ad.reduce_sum)
    theirs = make(
        lax.cond,
        lambda x, s, a: lax.broadcast_in_dim(x, s, (1 - a,)),
        jnp.sum,
    )
    ps, xs = np.array([True, False, True]), np.arange(6.0).reshape(3, 2)
    check(ad.vmap(ours)(ps, xs), jax.vmap(theirs)(ps, xs))
    check(
        ad.vmap(lambda p, x: ours(p, x)[:2])(ps, xs),
        jax.vmap(lambda p, x: theirs(p, x)[:2])(ps, xs),
    )
    check(
        ad.vmap(lambda p, x: ours(p, x)[1:])(ps, xs),
        jax.vmap(lambda p, x: theirs(p, x)[1:])(ps, xs),
    )


def test_operand_free_cond_and_literal_outputs():
    """Branches without operands (closing over everything), and branches
    returning a Python number or an input unchanged."""

    def make(cond, sin, total):
        def f(p, x):
            a = cond(p, lambda: x * 2.0, lambda: sin(x))
            b = cond(p, lambda x: total(x), lambda x: 2.0, x)
            c = cond(p, lambda x, y: x, lambda x, y: y * x, x, a)
            return a, b, c

        return f

    ours, theirs = (
        make(ad.cond, ad.sin, ad.reduce_sum),
        make(lax.cond, jnp.sin, jnp.sum),
    )
    x = np.array([0.5, -1.0])
    w = np.array([0.3, 0.7])
    for p in (True, False):
        check(ours(p, x), theirs(p, x))
        check(ad.jit(ours)(p, x), theirs(p, x))

        def loss(f, total, p=p):
            return lambda x: total(f(p, x)[0] * w) + f(p, x)[1] + total(f(p, x)[2])

        check(ad.grad(loss(ours, ad.reduce_sum))(x), jax.grad(loss(theirs, jnp.sum))(x))
        check(
            ad.jvp(lambda x, p=p: ours(p, x), (x,), (w,)),
            jax.jvp(lambda x, p=p: theirs(p, x), (x,), (w,)),
        )
        _, f_lin = ad.linearize(lambda x, p=p: ours(p, x), x)
        check(f_lin(w), jax.jvp(lambda x, p=p: theirs(p, x), (x,), (w,))[1])
    ps, xs = np.array([True, False]), np.stack([x, x * 3.0])
    check(ad.vmap(ours)(ps, xs), jax.vmap(theirs)(ps, xs))
    check(ad.vmap(ours, (0, None))(ps, x), jax.vmap(theirs, (0, None))(ps, x))
    check(ad.vmap(ours, (None, 0))(True, xs), jax.vmap(theirs, (None, 0))(True, xs))


def test_boolean_and_integer_operands_and_outputs():
    """A boolean operand used by select inside a branch, an integer operand,
    and a boolean output: eval, jit, grad, vmap, linearize, vjp."""

    def make(cond, select, total):
        def f(p, x, n):
            def yes(q, x, n):
                return select(q, x, x * -2.0), x > 0.5, n

            def no(q, x, n):
                return x * 3.0, q, n

            return cond(p, yes, no, x > 0.0, x, n)

        return f

    ours, theirs = (
        make(ad.cond, ad.select, ad.reduce_sum),
        make(lax.cond, lax.select, jnp.sum),
    )
    x, n = np.array([0.7, -0.4, 0.2]), np.int64(4)
    w = np.array([1.0, -2.0, 0.5])
    for p in (True, False):
        check(ours(p, x, n), theirs(p, x, n))
        check(ad.jit(ours)(p, x, n), theirs(p, x, n))

        def loss(f, total, p=p):
            return lambda x: total(f(p, x, n)[0] * w)

        check(ad.grad(loss(ours, ad.reduce_sum))(x), jax.grad(loss(theirs, jnp.sum))(x))
        check(
            ad.jit(ad.grad(loss(ours, ad.reduce_sum)))(x),
            jax.grad(loss(theirs, jnp.sum))(x),
        )
        _, f_lin = ad.linearize(lambda x, p=p: ours(p, x, n)[0], x)
        check(f_lin(w), jax.jvp(lambda x, p=p: theirs(p, x, n)[0], (x,), (w,))[1])
        _, f_vjp = ad.vjp(lambda x, p=p: ours(p, x, n)[0], x)
        check(f_vjp(w), jax.vjp(lambda x, p=p: theirs(p, x, n)[0], x)[1](w))
    ps, xs = np.array([True, False]), np.stack([x, -x])
    check(
        ad.vmap(ours, (0, 0, None))(ps, xs, n),
        jax.vmap(theirs, (0, 0, None))(ps, xs, n),
    )
    check(
        ad.vmap(ours, (None, 0, None))(False, xs, n),
        jax.vmap(theirs, (None, 0, None))(False, xs, n),
    )


def test_float32_cond():
    """float32 in, float32 out, through both branches and grad."""
    f, f_jax = kinked(ad.cond, ad.sin, ad.cos), kinked(lax.cond, jnp.sin, jnp.cos)
    for x in (np.float32(0.7), np.float32(-0.4)):
        for ours in (f(x), ad.jit(f)(x), ad.grad(f)(x)):
            assert np.asarray(ours).dtype == np.float32
        np.testing.assert_allclose(f(x), f_jax(x), rtol=1e-6)
        np.testing.assert_allclose(ad.grad(f)(x), jax.grad(f_jax)(x), rtol=1e-6)


def test_predicate_from_a_jitted_function_is_a_device_array():
    """A predicate that is a device Array (computed by jit) works eagerly, as a
    jit argument and under grad."""
    p = ad.jit(lambda x: x > 0.0)(0.5)
    q = ad.jit(lambda x: x > 0.0)(-0.5)
    assert isinstance(p, ad.Array)

    def g(cond, sin, cos):
        return lambda p, x: cond(p, lambda x: sin(x) * x, lambda x: cos(x) * 3.0, x)

    ours, theirs = g(ad.cond, ad.sin, ad.cos), g(lax.cond, jnp.sin, jnp.cos)
    for pred, ref_pred in ((p, True), (q, False)):
        check(ours(pred, 0.3), theirs(ref_pred, 0.3))
        check(ad.jit(ours)(pred, 0.3), theirs(ref_pred, 0.3))
        check(
            ad.grad(lambda x, pred=pred: ours(pred, x))(0.3),
            jax.grad(lambda x, p=ref_pred: theirs(p, x))(0.3),
        )


def test_jit_compiles_once_for_both_predicates():
    """One trace and one executable serve every predicate value and new data;
    a new shape traces and compiles again."""

    def body(p, x):
        return ad.cond(p, lambda x: ad.sin(x) * x, lambda x: ad.cos(x) + x, x)

    counted_body = counted(body)
    f = ad.jit(counted_body)
    x = np.array([0.3, -1.2])
    before = len(ad._compiled)
    f(True, x)
    after_first = len(ad._compiled)
    assert after_first == before + 1
    for p, data in [(False, x), (True, x + 1.0), (np.bool_(False), x * 2.0), (True, x)]:
        out = f(p, data)
        expected = np.sin(data) * data if p else np.cos(data) + data
        np.testing.assert_allclose(np.asarray(out), expected, rtol=TOL)
    assert counted_body.calls == len(f.traces) == 1
    assert len(ad._compiled) == after_first
    f(True, np.ones(3))
    assert counted_body.calls == len(f.traces) == 2
    assert len(ad._compiled) == after_first + 1


def test_jit_of_grad_compiles_once_for_both_predicates():
    f = kinked(ad.cond, ad.sin, ad.cos)
    d1 = jax.grad(kinked(lax.cond, jnp.sin, jnp.cos))
    g = ad.jit(ad.grad(f))
    g(0.5)
    compiled = len(ad._compiled)
    for x in (-0.5, 1.5, -2.0, 0.1):
        check(g(x), d1(x))
    assert len(g.traces) == 1
    assert len(ad._compiled) == compiled


def test_repeated_eager_grad_gives_the_same_result():
    """Eager grad of a function with conds, called again and again (the
    branches are retraced every time): the same, correct result."""
    f = nested(ad.cond, ad.sin, ad.cos)
    f_jax = nested(lax.cond, jnp.sin, jnp.cos)
    for x in (1.7, 0.4, -0.8):
        expected = jax.grad(f_jax)(x, 1.5)
        results = [np.asarray(ad.grad(f)(x, 1.5)) for _ in range(4)]
        for r in results:
            np.testing.assert_array_equal(r, results[0])
        check(results[0], expected)
    g = ad.grad(kinked(ad.cond, ad.sin, ad.cos))
    first = [g(x) for x in (0.3, -0.3)]
    for _ in range(3):
        assert [g(x) for x in (0.3, -0.3)] == first


def test_cond_in_jit_in_grad_in_vmap():
    """vmap(grad(f)) where f calls a jitted function whose body has a cond
    with a jitted branch, itself with a cond (per-example predicates)."""

    def make(cond, jit, sin, cos):
        inner = jit(lambda x, y: cond(x > y, lambda: sin(x * y), lambda: cos(x) * y))

        def f(x, y):
            branch = jit(lambda x: inner(x, y) * x)
            return cond(y > 0.0, branch, lambda x: inner(y, x) + x, sin(x))

        return f

    ours = make(ad.cond, ad.jit, ad.sin, ad.cos)
    theirs = make(lax.cond, jax.jit, jnp.sin, jnp.cos)
    xs, ys = np.array([0.3, -1.2, 2.0, 0.8]), np.array([0.5, 0.4, -0.3, -1.1])
    for argnum in (0, 1):
        expected = jax.vmap(jax.grad(theirs, argnum))(xs, ys)
        if argnum == 0:
            check(ad.vmap(ad.grad(ours))(xs, ys), expected)
        else:
            check(
                ad.vmap(lambda x, y: ad.grad(lambda y, x: ours(x, y))(y, x))(xs, ys),
                expected,
            )
    check(ad.jit(ad.vmap(ad.grad(ours)))(xs, ys), jax.vmap(jax.grad(theirs))(xs, ys))
    check(
        ad.vmap(ad.grad(ad.grad(ours)))(xs, ys),
        jax.vmap(jax.grad(jax.grad(theirs)))(xs, ys),
    )


@BOTH
def test_constant_predicate_is_a_literal(pred):
    """A Python bool predicate becomes a literal of the cond equation; the
    jaxpr still splits, and jit compositions agree with JAX."""

    def make(cond, sin, cos):
        return lambda x: cond(pred, lambda x: sin(x) * x, cos, x)

    f, f_jax = make(ad.cond, ad.sin, ad.cos), make(lax.cond, jnp.sin, jnp.cos)
    jaxpr, consts, _ = ad.make_jaxpr(
        lambda x, t: ad.jvp(f, (x,), (t,)),
        ad.ShapedArray((), F64),
        ad.ShapedArray((), F64),
    )
    (eqn,) = [e for e in jaxpr.eqns if e.primitive is ad.cond_p]
    assert isinstance(eqn.inputs[0], ad.Lit)
    args = [*consts, np.float64(0.7), np.float64(2.0)]
    check_partial_eval(jaxpr, args, [False] * (len(args) - 1) + [True], None)
    xs = np.array([0.7, -0.3])
    check(ad.grad(ad.jit(f))(0.7), jax.grad(f_jax)(0.7))
    check(ad.linearize(ad.jit(f), 0.7)[1](2.0), jax.jvp(f_jax, (0.7,), (2.0,))[1])
    check(ad.vmap(ad.grad(ad.jit(f)))(xs), jax.vmap(jax.grad(f_jax))(xs))


def test_discarded_branch_nan_stays_out_of_grad_of_vmap():
    """A log kept away from zero by a batched cond: the discarded branch's
    0 x inf = nan stays out of the gradient of the batched function, as in JAX
    (keep_gradient, JAX's select with stop_gradient); vmap of grad agrees too."""

    def make(cond, log, total):
        f = lambda x: cond(x > 0.0, log, lambda x: x, x)  # noqa: E731
        return f, lambda xs: total(xs, f)

    xs = np.array([1.0, 0.0, -1.0])
    f, summed = make(ad.cond, ad.log, lambda xs, f: ad.reduce_sum(ad.vmap(f)(xs)))
    f_jax, summed_jax = make(lax.cond, jnp.log, lambda xs, f: jnp.sum(jax.vmap(f)(xs)))
    with np.errstate(divide="ignore", invalid="ignore"):
        ours = ad.grad(summed)(xs)
        check(ad.vmap(ad.grad(f))(xs), jax.vmap(jax.grad(f_jax))(xs))
    theirs = np.asarray(jax.grad(summed_jax)(xs))
    assert not np.isnan(ours).any()
    check(ours, theirs)
