"""Differential tests of the appendix (book/appendix_primitives.md) against JAX.

Everything the appendix adds is compared with jax.lax / jax.numpy (float64) or
NumPy, to 1e-9, including dtypes and shapes:

1. every new primitive and every ``autodidax.numpy`` function, on random
   inputs of several shapes, under eval, jit, jvp, vmap, grad, vjp, linearize
   and their compositions (one reference bundle, compiled once by JAX, per
   case);
2. ``dot_general`` with randomly generated dimension numbers, the dot-product
   (adjoint) test of its transpose, NumPy's ``dot``/``matmul`` for every rank
   combination, and batching without unrolling;
3. NumPy broadcasting of the operators and ``autodidax.numpy`` functions on
   random broadcast-compatible shapes, the explicit broadcast equations in the
   jaxprs, incompatible shapes, and Python scalars on either side;
4. the StableHLO lowering of each new primitive;
5. the registries: every rule present, ``NOT_LINEAR`` really non-linear, and a
   dot-product test of every transpose rule;
6. ``import autodidax.numpy`` in a fresh interpreter;
7. the appendix's worked example (a two-layer MLP) against JAX, trained for a
   few SGD steps.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import nothing_compiled
from jax import lax

import autodidax as ad
from autodidax import numpy as anp

pytestmark = pytest.mark.usefixtures("clean_interpreter_stack")

TOL = 1e-9
F64, F32 = np.float64, np.float32
FLOAT_KINDS = frozenset(["f", "pos", "nz", "tie", "zero", "f32"])


# ---------------------------------------------------------------------------
# Comparing results and drawing inputs
# ---------------------------------------------------------------------------


def host(x: Any) -> Any:
    """A device Array (what jit returns) as a NumPy array; others unchanged."""
    return np.asarray(x) if isinstance(x, ad.Array) else x


def assert_close(ours: Any, theirs: Any, what: str = "") -> None:
    """autodidax's pytree of results agrees with the reference's: same tree,
    same shapes and dtypes, floats to TOL, integers and booleans exactly, and
    an all-zero tangent where JAX has a float0 one."""
    our_leaves, our_tree = jax.tree_util.tree_flatten(ours)
    their_leaves, their_tree = jax.tree_util.tree_flatten(theirs)
    assert our_tree == their_tree, f"{what}: {our_tree} != {their_tree}"
    for k, (mine, ref) in enumerate(zip(our_leaves, their_leaves)):
        where = f"{what} (leaf {k})"
        mine = host(mine)
        assert isinstance(mine, (np.ndarray, np.generic)), (where, type(mine))
        ref = np.asarray(ref)
        assert np.shape(mine) == ref.shape, (where, np.shape(mine), ref.shape)
        if ref.dtype == jax.dtypes.float0:
            assert not np.any(mine), f"{where}: a non-float output needs zero tangent"
            continue
        assert mine.dtype == ref.dtype, (where, mine.dtype, ref.dtype)
        if ref.dtype.kind in "biu":
            np.testing.assert_array_equal(mine, ref, err_msg=where)
        else:
            finite = np.abs(ref[np.isfinite(ref)]) if ref.size else ref
            scale = max(1.0, float(np.max(finite))) if finite.size else 1.0
            np.testing.assert_allclose(
                mine, ref, rtol=TOL, atol=TOL * scale, err_msg=where
            )


def rng_for(*key: Any) -> np.random.Generator:
    """A generator seeded deterministically from ``key`` (e.g. a case name)."""
    return np.random.default_rng(zlib.crc32(repr(key).encode()))


def draw(rng: np.random.Generator, kind: str, shape: Sequence[int]) -> np.ndarray:
    """A random array of ``shape``; ``kind`` says which values and dtype."""
    shape = tuple(shape)
    if kind == "f":
        x = rng.uniform(-2.0, 2.0, shape)
    elif kind == "pos":  # for log
        x = rng.uniform(0.5, 3.0, shape)
    elif kind == "nz":  # away from zero: divisors, negative powers
        x = rng.choice([-1.0, 1.0], shape) * rng.uniform(0.5, 2.0, shape)
    elif kind == "tie":  # few distinct values: many ties for max
        x = rng.integers(-2, 3, shape).astype(F64)
    elif kind == "zero":  # some exact zeros (conversion to bool)
        x = np.where(rng.random(shape) < 0.3, 0.0, rng.uniform(-2.0, 2.0, shape))
    elif kind == "f32":
        x = rng.uniform(-2.0, 2.0, shape).astype(F32)
    elif kind == "int":
        x = rng.integers(-5, 6, shape)
    elif kind == "inz":  # nonzero integers (divisors)
        x = rng.choice([-3, -2, -1, 1, 2, 3], shape)
    elif kind == "i32":
        x = rng.integers(-5, 6, shape).astype(np.int32)
    elif kind == "bool":
        x = rng.random(shape) < 0.5
    else:
        raise ValueError(kind)
    return np.asarray(x)


def tangent_like(rng: np.random.Generator, x: Any) -> np.ndarray:
    return np.asarray(rng.uniform(-1.0, 1.0, np.shape(x))).astype(np.asarray(x).dtype)


def vdot(a: Any, b: Any) -> float:
    """Inner product of two pytrees of arrays, in float64 with NumPy."""
    a_leaves, b_leaves = jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)
    assert len(a_leaves) == len(b_leaves)
    return float(
        sum(
            np.vdot(np.asarray(host(x), F64), np.asarray(host(y), F64))
            for x, y in zip(a_leaves, b_leaves)
        )
    )


def insert_axis(shape: Sequence[int], axis: int | None, size: int) -> tuple:
    """``shape`` with a batch axis of ``size`` at ``axis`` (None: unbatched)."""
    shape = list(shape)
    if axis is not None:
        shape.insert(axis % (len(shape) + 1), size)
    return tuple(shape)


def leaves(tree: Any) -> list:
    """The outputs of a function as a flat list (a single array or a tuple)."""
    return list(tree) if isinstance(tree, tuple) else [tree]


def our_total(out: Any) -> Any:
    """Sum of every element of every output, with autodidax."""
    terms = [anp.sum(o) for o in leaves(out)]
    acc = terms[0]
    for t in terms[1:]:
        acc = acc + t
    return acc


def jax_total(out: Any) -> Any:
    return sum(jnp.sum(o) for o in leaves(out))


def our_inner(a: Sequence, b: Sequence) -> Any:
    """sum(a_i * b_i) over pytree leaves, with autodidax (differentiable)."""
    terms = [anp.sum(x * y) for x, y in zip(a, b)]
    acc = terms[0]
    for t in terms[1:]:
        acc = acc + t
    return acc


def jax_inner(a: Sequence, b: Sequence) -> Any:
    return sum(jnp.sum(x * y) for x, y in zip(a, b))


# ---------------------------------------------------------------------------
# 1. Every new primitive and autodidax.numpy function, every transformation
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    """One function, in autodidax and in JAX, with its inputs' shapes/kinds.

    ``grad``: the outputs are floats and the function is differentiable in its
    float inputs (so grad, vjp, linearize and second derivatives apply).
    ``jvp``: jvp applies (float inputs; the tangents of non-float outputs must
    be zero). Inputs of integer or boolean kind are never differentiated.
    """

    name: str
    ours: Callable
    theirs: Callable
    shapes: tuple
    kinds: tuple
    grad: bool = True
    jvp: bool = True

    @property
    def diff(self) -> list[int]:
        return [i for i, k in enumerate(self.kinds) if k in FLOAT_KINDS]

    def __str__(self) -> str:
        return self.name


def C(name, ours, theirs, shapes, kinds, **flags) -> Case:
    diff_possible = any(k in FLOAT_KINDS for k in kinds)
    flags.setdefault("jvp", diff_possible)
    flags.setdefault("grad", diff_possible)
    return Case(name, ours, theirs, tuple(map(tuple, shapes)), tuple(kinds), **flags)


POWERS = (0, 1, 2, 3, 4, 5, 6, 13)
NEGATIVE_POWERS = (-1, -2, -3, -5)


def _cases() -> list[Case]:
    cases = []
    add = cases.append
    # exp, log, tanh (primitive wrappers and autodidax.numpy), sin, cos, neg.
    for shape in [(), (2, 3)]:
        add(C(f"exp{shape}", ad.exp, jnp.exp, [shape], ["f"]))
    add(C("anp.exp(0, 2)", anp.exp, jnp.exp, [(0, 2)], ["f"]))
    for shape in [(), (4,)]:
        add(C(f"log{shape}", ad.log, jnp.log, [shape], ["pos"]))
    add(C("anp.log(2, 2)", anp.log, jnp.log, [(2, 2)], ["pos"]))
    for shape in [(), (2, 3)]:
        add(C(f"tanh{shape}", ad.tanh, jnp.tanh, [shape], ["f"]))
    add(C("anp.tanh(0,)", anp.tanh, jnp.tanh, [(0,)], ["f"]))
    for shape in [(), (2, 3)]:
        add(C(f"sqrt{shape}", ad.sqrt, jnp.sqrt, [shape], ["pos"]))
        add(C(f"rsqrt{shape}", ad.rsqrt, jax.lax.rsqrt, [shape], ["pos"]))
    add(C("anp.sqrt(4,)", anp.sqrt, jnp.sqrt, [(4,)], ["pos"]))
    add(C("anp.sin(3,)", anp.sin, jnp.sin, [(3,)], ["f"]))
    add(C("anp.cos(2, 2)", anp.cos, jnp.cos, [(2, 2)], ["f"]))
    add(C("anp.negative(2, 3)", anp.negative, jnp.negative, [(2, 3)], ["f"]))
    add(C("-x ()", lambda x: -x, lambda x: -x, [()], ["f"]))

    # Integer powers: every exponent 0..6 and 13, negative ones, three spellings.
    for shape in [(3,), ()]:
        add(
            C(
                f"integer_pow 0..6,13 {shape}",
                lambda x: tuple(ad.integer_pow(x, y) for y in POWERS),
                lambda x: tuple(lax.integer_pow(x, y) for y in POWERS),
                [shape],
                ["f"],
            )
        )
    add(
        C(
            "integer_pow negative (2, 2)",
            lambda x: tuple(ad.integer_pow(x, y) for y in NEGATIVE_POWERS),
            lambda x: tuple(lax.integer_pow(x, y) for y in NEGATIVE_POWERS),
            [(2, 2)],
            ["nz"],
        )
    )
    add(
        C(
            "integer_pow int64 (2, 3)",
            lambda x: tuple(ad.integer_pow(x, y) for y in (0, 1, 3, 6)),
            lambda x: tuple(lax.integer_pow(x, y) for y in (0, 1, 3, 6)),
            [(2, 3)],
            ["int"],
        )
    )
    add(
        C(
            "anp.power, x ** n (2, 3)",
            lambda x: (anp.power(x, 3), x**4, x ** np.int64(5), x**-2),
            lambda x: (jnp.power(x, 3), x**4, x ** np.int64(5), x**-2),
            [(2, 3)],
            ["nz"],
        )
    )

    # convert_element_type / astype, between floats, into and out of ints/bools.
    for src, dst, shape in [
        ("f", F32, (3,)),
        ("f32", F64, (2, 2)),
        ("f", np.int64, (4,)),
        ("f", np.int32, ()),
        ("zero", np.bool_, (5,)),
        ("int", F64, (3,)),
        ("i32", np.int64, (2, 2)),
        ("bool", F64, (2, 3)),
        ("bool", np.int32, (3,)),
        ("f", F32, (2, 0)),
    ]:
        add(
            C(
                f"convert_element_type {src}->{np.dtype(dst).name} {shape}",
                lambda x, d=dst: ad.convert_element_type(x, d),
                lambda x, d=dst: lax.convert_element_type(x, d),
                [shape],
                [src],
                grad=src in FLOAT_KINDS and np.dtype(dst).kind == "f",
            )
        )
    add(
        C(
            "anp.astype f32->f64, times 2 (3,)",
            lambda x: anp.astype(x, "float64") * 2.0,
            lambda x: x.astype("float64") * 2.0,
            [(3,)],
            ["f32"],
        )
    )

    # reshape, with -1, rank 0 and size 0.
    for shape, new in [
        ((2, 3), (3, 2)),
        ((2, 3), (-1,)),
        ((2, 3, 4), (4, -1)),
        ((), (1, 1)),
        ((1, 1), ()),
        ((0, 3), (3, -1)),
        ((6,), (2, -1, 1)),
        ((6,), 6),
    ]:
        add(
            C(
                f"reshape{shape}->{new}",
                lambda x, n=new: ad.reshape(x, n),
                lambda x, n=new: jnp.reshape(x, n),
                [shape],
                ["f"],
            )
        )
    add(
        C(
            "anp.reshape(4,)->(2, -1)",
            lambda x: anp.reshape(x, (2, -1)),
            lambda x: jnp.reshape(x, (2, -1)),
            [(4,)],
            ["f"],
        )
    )

    # reduce_max with ties, over several axes; empty reductions; integers.
    for axis in [None, 0, -1, (0, 2)]:
        add(
            C(
                f"reduce_max ties (2, 3, 4) axis={axis}",
                lambda x, a=axis: ad.reduce_max(x, a),
                lambda x, a=axis: jnp.max(x, a),
                [(2, 3, 4)],
                ["tie"],
            )
        )
    add(C("reduce_max ()", ad.reduce_max, jnp.max, [()], ["f"]))
    add(C("anp.max ties (5,)", anp.max, jnp.max, [(5,)], ["tie"]))
    add(
        C(
            "anp.max(0, 3) axis=1",
            lambda x: anp.max(x, 1),
            lambda x: lax.reduce_max(x, (1,)),
            [(0, 3)],
            ["f"],
        )
    )
    add(
        C(
            "reduce_max over an empty axis (0, 3) -> -inf",
            lambda x: ad.reduce_max(x, 0),
            lambda x: lax.reduce_max(x, (0,)),
            [(0, 3)],
            ["f"],
            grad=False,
            jvp=False,
        )
    )
    add(
        C(
            "reduce_max int64, also empty",
            lambda x, e: (ad.reduce_max(x, 1), ad.reduce_max(e, 0)),
            lambda x, e: (lax.reduce_max(x, (1,)), lax.reduce_max(e, (0,))),
            [(3, 4), (0, 2)],
            ["int", "int"],
        )
    )

    # The strict binary wrappers: equal shapes, or a Python scalar.
    add(C("sub (2, 3)", ad.sub, lax.sub, [(2, 3), (2, 3)], ["f", "f"]))
    add(C("sub ()", ad.sub, lax.sub, [(), ()], ["f", "f"]))
    add(
        C(
            "sub with Python scalars (3,)",
            lambda x: (ad.sub(2.0, x), ad.sub(x, 0.5)),
            lambda x: (2.0 - x, x - 0.5),
            [(3,)],
            ["f"],
        )
    )
    add(C("div (3,)", ad.div, lax.div, [(3,), (3,)], ["f", "nz"]))
    add(
        C(
            "div with Python scalars (2, 2)",
            lambda x: (ad.div(1.0, x), ad.div(x, 4.0)),
            lambda x: (1.0 / x, x / 4.0),
            [(2, 2)],
            ["nz"],
        )
    )
    add(C("maximum ties (2, 3)", ad.maximum, lax.max, [(2, 3), (2, 3)], ["tie"] * 2))
    add(C("maximum ties ()", ad.maximum, lax.max, [(), ()], ["tie"] * 2))
    add(
        C(
            "maximum(x, 0.0) ties (6,)",
            lambda x: ad.maximum(x, 0.0),
            lambda x: lax.max(x, 0.0),
            [(6,)],
            ["tie"],
        )
    )
    add(C("maximum int64 (4,)", ad.maximum, lax.max, [(4,), (4,)], ["int", "int"]))

    # autodidax.numpy: broadcasting binary functions, reductions, the rest.
    add(C("anp.subtract", anp.subtract, jnp.subtract, [(2, 3), (3,)], ["f", "f"]))
    add(C("anp.multiply", anp.multiply, jnp.multiply, [(), (2, 2)], ["f", "f"]))
    add(C("anp.divide", anp.divide, jnp.divide, [(2, 1), (1, 3)], ["f", "nz"]))
    add(C("anp.divide ints", anp.divide, jnp.divide, [(3,), ()], ["int", "nz"]))
    add(
        C(
            "anp.divide int64 by int64 -> float64",
            anp.divide,
            jnp.divide,
            [(2, 3), (3,)],
            ["int", "inz"],
        )
    )
    add(C("anp.maximum ties", anp.maximum, jnp.maximum, [(3, 1), (3,)], ["tie"] * 2))
    add(C("anp.minimum ties", anp.minimum, jnp.minimum, [(2, 3), (2, 3)], ["tie"] * 2))
    add(C("anp.add", anp.add, jnp.add, [(2, 1, 3), (4, 1)], ["f", "f"]))
    add(
        C(
            "anp.greater",
            anp.greater,
            jnp.greater,
            [(2, 3), (3,)],
            ["tie"] * 2,
            grad=False,
        )
    )
    add(C("anp.less", anp.less, jnp.less, [(), (4,)], ["tie"] * 2, grad=False))
    add(
        C(
            "anp.where",
            anp.where,
            jnp.where,
            [(2, 3), (3,), ()],
            ["bool", "f", "f"],
        )
    )
    add(
        C(
            "anp.where(x > 0, x, 0.0)",
            lambda x: anp.where(x > 0.0, x, 0.0),
            lambda x: jnp.where(x > 0.0, x, 0.0),
            [(2, 3)],
            ["f"],
        )
    )
    for axis in [None, 0, -1, (0, 2)]:
        add(
            C(
                f"anp.sum axis={axis}",
                lambda x, a=axis: anp.sum(x, a),
                lambda x, a=axis: jnp.sum(x, a),
                [(2, 3, 2)],
                ["f"],
            )
        )
    for axis in [None, 1]:
        add(
            C(
                f"anp.mean axis={axis}",
                lambda x, a=axis: anp.mean(x, a),
                lambda x, a=axis: jnp.mean(x, a),
                [(2, 3)],
                ["f"],
            )
        )
    add(C("anp.mean int64", anp.mean, jnp.mean, [(4, 2)], ["int"]))
    add(C("anp.transpose", anp.transpose, jnp.transpose, [(2, 3, 4)], ["f"]))
    add(
        C(
            "anp.transpose (1, 0, 2)",
            lambda x: anp.transpose(x, (1, 0, 2)),
            lambda x: jnp.transpose(x, (1, 0, 2)),
            [(2, 3, 4)],
            ["f"],
        )
    )
    add(
        C(
            "anp.broadcast_to",
            lambda x: anp.broadcast_to(x, (2, 3, 4)),
            lambda x: jnp.broadcast_to(x, (2, 3, 4)),
            [(3, 1)],
            ["f"],
        )
    )
    add(
        C(
            "anp.zeros_like, ones_like",
            lambda x: (anp.zeros_like(x), anp.ones_like(x), x * anp.ones_like(x)),
            lambda x: (jnp.zeros_like(x), jnp.ones_like(x), x * jnp.ones_like(x)),
            [(2, 3)],
            ["f"],
        )
    )
    add(
        C(
            "anp.zeros, ones",
            lambda x: (x + anp.zeros((2, 3)), anp.ones(3, anp.float64) * x),
            lambda x: (x + jnp.zeros((2, 3)), jnp.ones(3, jnp.float64) * x),
            [(3,)],
            ["f"],
        )
    )
    add(C("anp.dot", anp.dot, jnp.dot, [(2, 3), (3,)], ["f", "f"]))
    add(C("anp.matmul", anp.matmul, jnp.matmul, [(2, 2, 3), (3, 4)], ["f", "f"]))
    add(C("anp.dot int64", anp.dot, jnp.dot, [(2, 3), (3, 2)], ["int", "int"]))
    return cases


CASES = _cases()


def split(case: Case, args: list) -> tuple[tuple, Callable]:
    """The differentiable inputs, and autodidax's function of them alone."""
    diff = case.diff

    def with_diff(fn: Callable) -> Callable:
        def f(*d):
            full = list(args)
            for i, v in zip(diff, d):
                full[i] = v
            return fn(*full)

        return f

    return tuple(args[i] for i in diff), with_diff(case.ours)


def draw_args(case: Case, rng: np.random.Generator) -> list:
    return [draw(rng, k, s) for k, s in zip(case.kinds, case.shapes)]


def out_structs(case: Case, args: list) -> list:
    return leaves(jax.eval_shape(case.theirs, *args))


@pytest.mark.parametrize("case", CASES, ids=str)
def test_transformations(case: Case) -> None:
    """eval, jit, jvp, linearize, vjp, grad, jit(grad), grad(jit), jvp(grad)
    and grad(grad) agree with JAX (one compiled JAX bundle per case)."""
    rng = rng_for("direct", case.name)
    args = draw_args(case, rng)
    d, f = split(case, args)
    dt = tuple(tangent_like(rng, x) for x in d)
    w = tuple(tangent_like(rng, x) for x in d)
    structs = jax.eval_shape(case.theirs, *args)
    cts = [draw(rng, "f", s.shape).astype(s.dtype) for s in leaves(structs)]
    ct = tuple(cts) if isinstance(structs, tuple) else cts[0]

    def bundle(args, d, dt, ct, w):
        def g(*dd):
            full = list(args)
            for i, v in zip(case.diff, dd):
                full[i] = v
            return case.theirs(*full)

        def loss(dd):
            return jax_total(g(*dd))

        refs = {"eval": case.theirs(*args)}
        if case.jvp:
            refs["jvp"] = jax.jvp(g, d, dt)
        if case.grad:
            refs["vjp"] = jax.vjp(g, *d)[1](ct)
            refs["grad"] = jax.grad(loss)(d)
            refs["jvp(grad)"] = jax.jvp(jax.grad(loss), (d,), (dt,))
            refs["grad(grad)"] = jax.grad(lambda dd: jax_inner(jax.grad(loss)(dd), w))(
                d
            )
        return refs

    refs = jax.jit(bundle)(args, d, dt, ct, w)

    assert_close(case.ours(*args), refs["eval"], "eval")
    assert_close(ad.jit(case.ours)(*args), refs["eval"], "jit")
    if case.jvp:
        assert_close(ad.jvp(f, d, dt), refs["jvp"], "jvp")
    if not case.grad:
        return

    def loss(d):
        return our_total(f(*d))

    out, f_lin = ad.linearize(f, *d)
    assert_close(out, refs["eval"], "linearize primal")
    assert_close(f_lin(*dt), refs["jvp"][1], "linearize")
    out, f_vjp = ad.vjp(f, *d)
    assert_close(out, refs["eval"], "vjp primal")
    assert_close(f_vjp(ct), refs["vjp"], "vjp")
    assert_close(ad.grad(loss)(d), refs["grad"], "grad")
    assert_close(ad.jit(ad.grad(loss))(d), refs["grad"], "jit(grad)")
    jit_f = ad.jit(f)
    assert_close(ad.grad(lambda d: our_total(jit_f(*d)))(d), refs["grad"], "grad(jit)")
    assert_close(ad.jvp(ad.grad(loss), (d,), (dt,)), refs["jvp(grad)"], "jvp(grad)")
    second = ad.grad(lambda dd: our_inner(ad.grad(loss)(dd), w))(d)
    assert_close(second, refs["grad(grad)"], "grad(grad)")


def random_in_axes(rng: np.random.Generator, shapes: Sequence) -> tuple:
    """One batch axis (0, 1, -1 or None) per argument, not all None."""
    while True:
        axes = tuple(
            [0, -1, None, *([1] if len(s) >= 1 else [])][
                rng.integers(3 + (len(s) >= 1))
            ]
            for s in shapes
        )
        if any(a is not None for a in axes):
            return axes


def batching_plan(case: Case) -> dict:
    """Random batch axes for ``case`` (one level, and two nested levels),
    a random out_axes, and batched inputs of the right shapes."""
    rng = rng_for("vmap", case.name)
    in_axes = random_in_axes(rng, case.shapes)
    inner_axes = random_in_axes(rng, case.shapes)
    outer_axes = random_in_axes(
        rng, [insert_axis(s, a, 2) for s, a in zip(case.shapes, inner_axes)]
    )
    b_args = [
        draw(rng, k, insert_axis(s, a, 3))
        for k, s, a in zip(case.kinds, case.shapes, in_axes)
    ]
    bb_args = [
        draw(rng, k, insert_axis(insert_axis(s, ai, 2), ao, 3))
        for k, s, ai, ao in zip(case.kinds, case.shapes, inner_axes, outer_axes)
    ]
    out_rank = min(len(s.shape) for s in out_structs(case, draw_args(case, rng)))
    out_axes = int(rng.integers(-(out_rank + 1), out_rank + 1))
    return dict(
        in_axes=in_axes,
        inner_axes=inner_axes,
        outer_axes=outer_axes,
        out_axes=out_axes,
        b_args=b_args,
        bb_args=bb_args,
    )


def test_batching_plans_cover_every_kind_of_axis() -> None:
    """Across the cases, in_axes take the values 0, 1, -1 and None (also in
    the outer of two vmaps), and out_axes is negative, zero and positive."""
    plans = [batching_plan(case) for case in CASES]
    for key in ("in_axes", "inner_axes", "outer_axes"):
        used = {a for plan in plans for a in plan[key]}
        assert {0, 1, -1, None} <= used, (key, used)
    outs = {plan["out_axes"] for plan in plans}
    assert min(outs) < 0 and 0 in outs and max(outs) > 0


@pytest.mark.parametrize("case", CASES, ids=str)
def test_batching(case: Case) -> None:
    """vmap (random in_axes mixing 0, 1, -1 and None; random out_axes),
    jit(vmap), vmap(jit), vmap(grad) and vmap(vmap) agree with JAX."""
    plan = batching_plan(case)
    in_axes, out_axes = plan["in_axes"], plan["out_axes"]
    inner_axes, outer_axes = plan["inner_axes"], plan["outer_axes"]
    b_args, bb_args = plan["b_args"], plan["bb_args"]
    diff = case.diff

    def grads(fn, grad, total):
        def g(*args):
            def loss(d):
                full = list(args)
                for i, v in zip(diff, d):
                    full[i] = v
                return total(fn(*full))

            return grad(loss)(tuple(args[i] for i in diff))

        return g

    def bundle(b_args, bb_args):
        refs = {
            "vmap": jax.vmap(case.theirs, in_axes, out_axes)(*b_args),
            "vmap(vmap)": jax.vmap(jax.vmap(case.theirs, inner_axes), outer_axes)(
                *bb_args
            ),
        }
        if case.grad:
            g = grads(case.theirs, jax.grad, jax_total)
            refs["vmap(grad)"] = jax.vmap(g, in_axes)(*b_args)
        return refs

    refs = jax.jit(bundle)(b_args, bb_args)
    batched = ad.vmap(case.ours, in_axes, out_axes)
    assert_close(batched(*b_args), refs["vmap"], f"vmap {in_axes} -> {out_axes}")
    assert_close(ad.jit(batched)(*b_args), refs["vmap"], "jit(vmap)")
    assert_close(
        ad.vmap(ad.jit(case.ours), in_axes, out_axes)(*b_args),
        refs["vmap"],
        "vmap(jit)",
    )
    twice = ad.vmap(ad.vmap(case.ours, inner_axes), outer_axes)
    assert_close(
        twice(*bb_args), refs["vmap(vmap)"], f"vmap{outer_axes}(vmap{inner_axes})"
    )
    if case.grad:
        g = grads(case.ours, ad.grad, our_total)
        assert_close(ad.vmap(g, in_axes)(*b_args), refs["vmap(grad)"], "vmap(grad)")


# ---------------------------------------------------------------------------
# 2. dot_general with random dimension numbers; dot and matmul
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class DotProblem:
    x_shape: tuple
    y_shape: tuple
    dims: tuple  # ((x_contract, y_contract), (x_batch, y_batch))


def random_dot_problem(seed: int) -> DotProblem:
    """Random ranks 0-4, random numbers of batch and contracting pairs, each
    pair at random positions in x and in y (so listed in any order)."""
    rng = rng_for("dot_general", seed)
    while True:
        nb, nc, fx, fy = (int(v) for v in rng.integers(0, 3, 4))
        if nb + nc + fx <= 4 and nb + nc + fy <= 4:
            break
    batch, contract = rng.integers(1, 4, nb), rng.integers(1, 4, nc)

    def place(n_free: int) -> tuple[list, tuple, tuple]:
        perm = [int(a) for a in rng.permutation(nb + nc + n_free)]
        shape = [int(s) for s in rng.integers(1, 4, len(perm))]  # free sizes
        b_axes, c_axes = perm[:nb], perm[nb : nb + nc]
        for a, s in zip(b_axes, batch):
            shape[a] = int(s)
        for a, s in zip(c_axes, contract):
            shape[a] = int(s)
        return shape, tuple(c_axes), tuple(b_axes)

    x_shape, xc, xb = place(fx)
    y_shape, yc, yb = place(fy)
    return DotProblem(tuple(x_shape), tuple(y_shape), ((xc, yc), (xb, yb)))


DOT_SEEDS = range(24)


def test_dot_problems_cover_the_space() -> None:
    """The generator reaches ranks 0 and 4, several batch and contracting
    pairs, and pairs listed out of order."""
    problems = [random_dot_problem(s) for s in DOT_SEEDS]
    ranks = {len(p.x_shape) for p in problems} | {len(p.y_shape) for p in problems}
    assert {0, 4} <= ranks
    assert any(len(p.dims[0][0]) == 2 and len(p.dims[1][0]) >= 1 for p in problems)
    assert any(list(p.dims[0][0]) != sorted(p.dims[0][0]) for p in problems)
    assert any(p.dims[1][0] != p.dims[1][1] for p in problems)


@pytest.mark.parametrize("seed", DOT_SEEDS)
def test_dot_general_random(seed: int) -> None:
    """eval, jit, jvp, vjp, grad wrt each operand and vmap (x only, y only,
    both, at random positions) against jax.lax.dot_general; then the
    dot-product test of the transpose."""
    p = random_dot_problem(seed)
    rng = rng_for("dot_general data", seed)
    dims = p.dims
    x, y = draw(rng, "f", p.x_shape), draw(rng, "f", p.y_shape)
    dx, dy = tangent_like(rng, x), tangent_like(rng, y)
    out_shape = jax.eval_shape(lambda x, y: lax.dot_general(x, y, dims), x, y).shape
    ct = draw(rng, "f", out_shape)
    bx = int(rng.integers(0, len(p.x_shape) + 1))
    by = int(rng.integers(0, len(p.y_shape) + 1))
    out_axes = int(rng.integers(-len(out_shape) - 1, len(out_shape) + 1))
    xs = draw(rng, "f", insert_axis(p.x_shape, bx, 3))
    ys = draw(rng, "f", insert_axis(p.y_shape, by, 3))
    batchings = {"x only": (bx, None), "y only": (None, by), "both": (bx, by)}

    def batch_args(in_axes):
        return (x if in_axes[0] is None else xs, y if in_axes[1] is None else ys)

    def ours(x, y):
        return ad.dot_general(x, y, dims)

    def theirs(x, y):
        return lax.dot_general(x, y, dims)

    def bundle(x, y, dx, dy, ct, xs, ys):
        refs = {
            "eval": theirs(x, y),
            "jvp": jax.jvp(theirs, (x, y), (dx, dy)),
            "vjp": jax.vjp(theirs, x, y)[1](ct),
            "grad x": jax.grad(lambda x: jnp.sum(theirs(x, y)))(x),
            "grad y": jax.grad(lambda y: jnp.sum(theirs(x, y)))(y),
        }
        for name, in_axes in batchings.items():
            args = (x if in_axes[0] is None else xs, y if in_axes[1] is None else ys)
            refs[name] = jax.vmap(theirs, in_axes, out_axes)(*args)
        loss = lambda xy: jnp.sum(ct * theirs(*xy))  # noqa: E731
        refs["jvp(grad)"] = jax.jvp(jax.grad(loss), ((x, y),), ((dx, dy),))
        grad_x = jax.grad(lambda x, y: jnp.sum(theirs(x, y)))
        refs["vmap(grad)"] = jax.vmap(grad_x, (bx, by))(xs, ys)
        return refs

    refs = jax.jit(bundle)(x, y, dx, dy, ct, xs, ys)
    what = f"{p.x_shape} . {p.y_shape} with {dims}"
    assert_close(ours(x, y), refs["eval"], f"eval {what}")
    assert_close(ad.jit(ours)(x, y), refs["eval"], f"jit {what}")
    assert_close(ad.jvp(ours, (x, y), (dx, dy)), refs["jvp"], f"jvp {what}")
    out, f_vjp = ad.vjp(ours, x, y)
    assert_close(f_vjp(ct), refs["vjp"], f"vjp {what}")
    grad_x = ad.grad(lambda x: anp.sum(ours(x, y)))(x)
    assert_close(grad_x, refs["grad x"], f"grad x {what}")
    grad_y = ad.grad(lambda y: anp.sum(ours(x, y)))(y)
    assert_close(grad_y, refs["grad y"], f"grad y {what}")
    for name, in_axes in batchings.items():
        batched = ad.vmap(ours, in_axes, out_axes)(*batch_args(in_axes))
        assert_close(batched, refs[name], f"vmap {name} {in_axes}->{out_axes} {what}")
    loss = lambda xy: anp.sum(ct * ours(*xy))  # noqa: E731
    hvp = ad.jvp(ad.grad(loss), ((x, y),), ((dx, dy),))
    assert_close(hvp, refs["jvp(grad)"], f"jvp(grad) {what}")
    grad_x = ad.grad(lambda x, y: anp.sum(ours(x, y)))
    assert_close(ad.vmap(grad_x, (bx, by))(xs, ys), refs["vmap(grad)"], "vmap(grad)")

    # The adjoint test: <ct, A v> == <A^T ct, v> for A = (v -> dot(v, y)) and
    # for A = (v -> dot(x, v)), with A^T from vjp.
    v_x, v_y = draw(rng, "f", p.x_shape), draw(rng, "f", p.y_shape)
    x_bar, y_bar = f_vjp(ct)
    scale = max(1.0, float(np.sum(np.abs(ct))) * 10)
    assert abs(vdot(ct, ours(v_x, y)) - vdot(x_bar, v_x)) <= TOL * scale
    assert abs(vdot(ct, ours(x, v_y)) - vdot(y_bar, v_y)) <= TOL * scale


def test_dot_general_transpose_adjoint_out_of_order() -> None:
    """The appendix's example: two contracting pairs listed in different
    orders and a batch pair, each operand's transpose is the adjoint."""
    rng = rng_for("adjoint")
    dims = (((2, 0), (0, 2)), ((1,), (1,)))
    x, y = draw(rng, "f", (3, 4, 5)), draw(rng, "f", (5, 4, 3, 2))
    out, f_vjp = ad.vjp(lambda x, y: ad.dot_general(x, y, dims), x, y)
    assert_close(out, np.einsum("aib,biac->ic", x, y), "eval vs einsum")
    ct = draw(rng, "f", out.shape)
    x_bar, y_bar = f_vjp(ct)
    assert x_bar.shape == x.shape and y_bar.shape == y.shape
    for _ in range(3):
        v_x, v_y = draw(rng, "f", x.shape), draw(rng, "f", y.shape)
        np.testing.assert_allclose(
            vdot(ct, np.einsum("aib,biac->ic", v_x, y)), vdot(x_bar, v_x), rtol=TOL
        )
        np.testing.assert_allclose(
            vdot(ct, np.einsum("aib,biac->ic", x, v_y)), vdot(y_bar, v_y), rtol=TOL
        )


def random_stacks(rng: np.random.Generator, ra: int, rb: int) -> tuple[tuple, tuple]:
    """Two broadcast-compatible shapes of ranks ``ra`` and ``rb``."""
    n = max(ra, rb)
    full = [int(s) for s in rng.integers(2, 4, n)]
    a = [full[i] if rng.random() < 0.6 else 1 for i in range(n - ra, n)]
    b = [full[i] if rng.random() < 0.6 else 1 for i in range(n - rb, n)]
    return tuple(a), tuple(b)


def product_shapes(kind: str, ra: int, rb: int, seed: int) -> tuple[tuple, tuple]:
    rng = rng_for(kind, ra, rb, seed)
    k, m, n = (int(s) for s in rng.integers(1, 4, 3))
    if kind == "dot":
        a = tuple(int(s) for s in rng.integers(1, 4, ra - 1)) + (k,)
        b = (k,) if rb == 1 else (*(int(s) for s in rng.integers(1, 4, rb - 2)), k, n)
        return a, b
    stack_a, stack_b = random_stacks(rng, max(ra - 2, 0), max(rb - 2, 0))
    a = (*stack_a, m, k) if ra >= 2 else (k,)
    b = (*stack_b, k, n) if rb >= 2 else (k,)
    return a, b


PRODUCTS = [
    (kind, product_shapes(kind, ra, rb, 0))
    for kind in ("dot", "matmul")
    for ra in range(1, 5)
    for rb in range(1, 5)
] + [("matmul", ((5, 1, 2, 3), (4, 3, 2))), ("matmul", ((2, 3), (4, 1, 3, 2)))]


@pytest.mark.parametrize(
    "kind, shapes", PRODUCTS, ids=[f"{k}{a}{b}" for k, (a, b) in PRODUCTS]
)
def test_numpy_products(kind: str, shapes: tuple) -> None:
    """anp.dot / anp.matmul / @ for every rank combination 1-4 (and stacks
    that broadcast) against np.dot / np.matmul and jnp, under jit and grad."""
    a_shape, b_shape = shapes
    rng = rng_for("products data", kind, shapes)
    a, b = draw(rng, "f", a_shape), draw(rng, "f", b_shape)
    np_fn, jnp_fn = (np.dot, jnp.dot) if kind == "dot" else (np.matmul, jnp.matmul)
    expected = np.asarray(np_fn(a, b))
    w = draw(rng, "f", expected.shape)

    def bundle(a, b, w):
        return jnp_fn(a, b), jax.grad(lambda ab: jnp.sum(w * jnp_fn(*ab)))((a, b))

    jnp_out, jnp_grad = jax.jit(bundle)(a, b, w)
    assert_close(np.asarray(jnp_out), expected, "jnp agrees with NumPy")
    ours = anp.dot if kind == "dot" else anp.matmul
    assert_close(ours(a, b), expected, "eval vs NumPy")
    assert_close(ad.jit(ours)(a, b), expected, "jit")
    if kind == "matmul":
        assert_close(ad.jit(lambda a, b: a @ b)(a, b), expected, "@ under jit")
        arr = ad.jit(lambda a: a * 1.0)(a)
        assert_close(arr @ b, expected, "@ on a device Array")
    loss = lambda ab: anp.sum(w * ours(*ab))  # noqa: E731
    assert_close(ad.grad(loss)((a, b)), jnp_grad, "grad")
    assert_close(ad.jit(ad.grad(loss))((a, b)), jnp_grad, "jit(grad)")


def matvec(m, v):
    return ad.dot_general(m, v, (((1,), (0,)), ((), ())))


MATVECS = {
    "dot_general": matvec,
    "anp.dot": anp.dot,
    "@": lambda m, v: m @ v,
}


@pytest.mark.parametrize("spelling", MATVECS)
@pytest.mark.parametrize("in_axes", [(None, 0), (0, 0), (0, 1), (2, None)])
def test_vmap_matvec_is_one_dot_general(spelling: str, in_axes: tuple) -> None:
    """vmap of a matrix-vector product is one dot_general, whatever the batch
    size: no loop over examples is unrolled into the jaxpr."""
    fn = MATVECS[spelling]
    counts = {}
    for size in (1, 2, 7, 40):
        m_shape = insert_axis((3, 4), in_axes[0], size)
        v_shape = insert_axis((4,), in_axes[1], size)
        jaxpr, _, _ = ad.make_jaxpr(
            ad.vmap(fn, in_axes),
            ad.ShapedArray(m_shape, F64),
            ad.ShapedArray(v_shape, F64),
        )
        ad.typecheck_jaxpr(jaxpr)
        names = [eqn.primitive.name for eqn in jaxpr.eqns]
        assert names.count("dot_general") == 1, names
        counts[size] = len(names)
    assert len(set(counts.values())) == 1, counts
    rng = rng_for("matvec", spelling, in_axes)
    m = draw(rng, "f", insert_axis((3, 4), in_axes[0], 5))
    v = draw(rng, "f", insert_axis((4,), in_axes[1], 5))
    ms = np.moveaxis(m, in_axes[0], 0) if in_axes[0] is not None else [m] * 5
    vs = np.moveaxis(v, in_axes[1], 0) if in_axes[1] is not None else [v] * 5
    expected = np.stack([mi @ vi for mi, vi in zip(ms, vs)])
    assert_close(ad.vmap(fn, in_axes)(m, v), expected, "vmap matvec vs a loop")


# ---------------------------------------------------------------------------
# 3. Broadcasting
# ---------------------------------------------------------------------------


def broadcast_pair(rng: np.random.Generator) -> tuple[tuple, tuple]:
    """Two shapes of random ranks 0-3 that broadcast: at each aligned axis
    the sizes are equal or one of them is 1 (sizes include 0 now and then)."""
    ra, rb = (int(r) for r in rng.integers(0, 4, 2))
    n = max(ra, rb)
    full = [int(rng.choice([0, 2, 3, 4], p=[0.05, 0.35, 0.35, 0.25])) for _ in range(n)]

    def side(r):
        return tuple(full[i] if rng.random() < 0.6 else 1 for i in range(n - r, n))

    return side(ra), side(rb)


def incompatible_pair(rng: np.random.Generator) -> tuple[tuple, tuple]:
    """Two shapes that do not broadcast: one aligned axis has sizes 2 and 3."""
    a, b = broadcast_pair(rng)
    while not (a and b):
        a, b = broadcast_pair(rng)
    k = int(rng.integers(1, min(len(a), len(b)) + 1))
    a, b = list(a), list(b)
    a[-k], b[-k] = 2, 3
    return tuple(a), tuple(b)


BROADCAST_SEEDS = range(12)

# name -> (autodidax function, NumPy/JAX function); inputs a, b broadcast;
# c has b's shape and no zeros (a divisor); p is a boolean predicate.
NUMPY_FUNCTIONS: dict[str, tuple[Callable, Callable, Callable]] = {
    "add": (anp.add, np.add, jnp.add),
    "subtract": (anp.subtract, np.subtract, jnp.subtract),
    "multiply": (anp.multiply, np.multiply, jnp.multiply),
    "maximum": (anp.maximum, np.maximum, jnp.maximum),
    "minimum": (anp.minimum, np.minimum, jnp.minimum),
    "greater": (anp.greater, np.greater, jnp.greater),
    "less": (anp.less, np.less, jnp.less),
}


def all_functions(mod: Any, a, b, c, p) -> dict:
    """Every broadcasting function of ``mod`` (anp, np or jnp) on (a, b)."""
    out = {name: getattr(mod, name)(a, b) for name in NUMPY_FUNCTIONS}
    out["divide"] = mod.divide(a, c)
    out["where"] = mod.where(p, a, b)
    return out


def all_operators(a, b, c) -> dict:
    """Every broadcasting operator on (a, b): works on tracers, device Arrays
    and NumPy/JAX arrays alike."""
    return {
        "+": a + b,
        "-": a - b,
        "*": a * b,
        "/": a / c,
        ">": a > b,
        "<": a < b,
        "-b+a": -b + a,
    }


def broadcast_inputs(seed: int) -> tuple[list, np.random.Generator]:
    rng = rng_for("broadcast", seed)
    a_shape, b_shape = broadcast_pair(rng)
    out_shape = np.broadcast_shapes(a_shape, b_shape)
    p_shape = tuple(d if rng.random() < 0.5 else 1 for d in out_shape)
    p_shape = p_shape[int(rng.integers(0, len(p_shape) + 1)) :]
    a, b = draw(rng, "tie", a_shape), draw(rng, "tie", b_shape)
    c, p = draw(rng, "nz", b_shape), draw(rng, "bool", p_shape)
    return [a, b, c, p], rng


def weighted_loss(outs: dict, weights: dict, mod: Any):
    terms = [mod.sum(outs[k] * w) for k, w in weights.items()]
    acc = terms[0]
    for t in terms[1:]:
        acc = acc + t
    return acc


@pytest.mark.parametrize("seed", BROADCAST_SEEDS)
def test_broadcasting(seed: int) -> None:
    """Operators and autodidax.numpy functions on random broadcast-compatible
    shapes, vs NumPy (eval, jit, on device Arrays) and JAX (grad, vmap)."""
    (a, b, c, p), rng = broadcast_inputs(seed)
    expected = all_functions(np, a, b, c, p)
    expected_ops = all_operators(a, b, c)
    shapes = f"{a.shape} and {b.shape}"

    assert_close(all_functions(anp, a, b, c, p), expected, f"eval {shapes}")
    jitted = ad.jit(lambda a, b, c, p: all_functions(anp, a, b, c, p))
    assert_close(jitted(a, b, c, p), expected, f"jit {shapes}")
    assert_close(ad.jit(all_operators)(a, b, c), expected_ops, f"jit ops {shapes}")
    arrays = [ad.jit(lambda x: x)(x) for x in (a, b, c)]
    assert all(isinstance(x, ad.Array) for x in arrays)
    assert_close(all_operators(*arrays), expected_ops, f"ops on Arrays {shapes}")
    assert_close(
        all_operators(arrays[0], b, c), expected_ops, f"ops Array, ndarray {shapes}"
    )
    assert_close(
        all_operators(a, *arrays[1:]), expected_ops, f"ops ndarray, Array {shapes}"
    )
    ndarray_left = ad.jit(lambda b, c: all_operators(a, b, c))
    assert_close(ndarray_left(b, c), expected_ops, f"ops ndarray, tracer {shapes}")

    floats = [k for k, v in {**expected, **expected_ops}.items() if v.dtype == F64]
    weights = {k: draw(rng, "f", {**expected, **expected_ops}[k].shape) for k in floats}

    def our_loss(abc):
        outs = {**all_functions(anp, *abc, p), **all_operators(*abc)}
        return weighted_loss(outs, weights, anp)

    def jax_loss(abc):
        outs = {**all_functions(jnp, *abc, p), **all_operators(*abc)}
        return weighted_loss(outs, weights, jnp)

    in_axes = random_in_axes(rng, [a.shape, b.shape, c.shape, p.shape])
    batched = [
        draw(rng, k, insert_axis(x.shape, ax, 3))
        for k, x, ax in zip(["tie", "tie", "nz", "bool"], (a, b, c, p), in_axes)
    ]

    def both(a, b, c, p):
        return {**all_functions(jnp, a, b, c, p), **all_operators(a, b, c)}

    def bundle(a, b, c, p, batched):
        return {
            "grad": jax.grad(jax_loss)((a, b, c)),
            "vmap": jax.vmap(both, in_axes)(*batched),
        }

    refs = jax.jit(bundle)(a, b, c, p, batched)
    assert_close(ad.grad(our_loss)((a, b, c)), refs["grad"], f"grad {shapes}")

    def ours_both(a, b, c, p):
        return {**all_functions(anp, a, b, c, p), **all_operators(a, b, c)}

    assert_close(ad.vmap(ours_both, in_axes)(*batched), refs["vmap"], "vmap")


ELEMENTWISE = {"add", "sub", "mul", "div", "max", "select", "neg"}
ELEMENTWISE |= {"eq", "ne", "lt", "le", "gt", "ge"}
SIMPLE_BROADCASTING = {
    "anp.add": (anp.add, "add"),
    "anp.subtract": (anp.subtract, "sub"),
    "anp.multiply": (anp.multiply, "mul"),
    "anp.divide": (anp.divide, "div"),
    "anp.maximum": (anp.maximum, "max"),
    "anp.greater": (anp.greater, "gt"),
    "anp.less": (anp.less, "lt"),
    "anp.equal": (anp.equal, "eq"),
    "anp.not_equal": (anp.not_equal, "ne"),
    "anp.less_equal": (anp.less_equal, "le"),
    "anp.greater_equal": (anp.greater_equal, "ge"),
    "+": (lambda a, b: a + b, "add"),
    "-": (lambda a, b: a - b, "sub"),
    "*": (lambda a, b: a * b, "mul"),
    "/": (lambda a, b: a / b, "div"),
    ">": (lambda a, b: a > b, "gt"),
    "<": (lambda a, b: a < b, "lt"),
    "==": (lambda a, b: a == b, "eq"),
    "!=": (lambda a, b: a != b, "ne"),
    "<=": (lambda a, b: a <= b, "le"),
    ">=": (lambda a, b: a >= b, "ge"),
}


def check_explicit(jaxpr: Any) -> None:
    """No implicit broadcasting: every elementwise equation's inputs (and
    output) have one shape, and the jaxpr typechecks."""
    ad.typecheck_jaxpr(jaxpr)
    for eqn in jaxpr.eqns:
        if eqn.primitive.name in ELEMENTWISE:
            shapes = {x.aval.shape for x in eqn.inputs}
            shapes |= {v.aval.shape for v in eqn.out_binders}
            assert len(shapes) == 1, (eqn.primitive.name, shapes, str(jaxpr))


@pytest.mark.parametrize("seed", range(40))
def test_broadcasting_jaxprs_are_explicit(seed: int) -> None:
    """Before the operation, only reshape/broadcast equations; one broadcast
    per operand whose shape differs from the result's, one reshape per operand
    with a size-1 axis that must grow; every input of the operation has the
    result's shape."""
    rng = rng_for("explicit", seed)
    a_shape, b_shape = broadcast_pair(rng)
    out_shape = np.broadcast_shapes(a_shape, b_shape)
    avals = [ad.ShapedArray(s, F64) for s in (a_shape, b_shape)]

    def expected_counts():
        broadcasts = reshapes = 0
        for s in (a_shape, b_shape):
            lead = len(out_shape) - len(s)
            broadcasts += s != out_shape
            reshapes += any(
                d == 1 and out_shape[lead + i] != 1 for i, d in enumerate(s)
            )
        return broadcasts, reshapes

    for name, (fn, prim) in SIMPLE_BROADCASTING.items():
        jaxpr, _, _ = ad.make_jaxpr(fn, *avals)
        check_explicit(jaxpr)
        names = [eqn.primitive.name for eqn in jaxpr.eqns]
        assert names[-1] == prim, (name, names)
        assert set(names[:-1]) <= {"reshape", "broadcast"}, (name, names)
        assert (names.count("broadcast"), names.count("reshape")) == expected_counts()
        assert [v.aval.shape for v in jaxpr.outs] == [out_shape]
    for fn in [
        anp.minimum,  # neg, max, neg
        lambda a, b: anp.where(a > b, a, b),
        lambda a, b: anp.where(a > b, 1.0, b),
        lambda a, b: anp.where(True, a, b),
    ]:
        jaxpr, _, _ = ad.make_jaxpr(fn, *avals)
        check_explicit(jaxpr)


def test_broadcast_to_and_broadcast_shapes() -> None:
    """broadcast_shapes follows NumPy's rules (and raises TypeError where
    NumPy raises); broadcast_to matches np.broadcast_to and records nothing
    when the shape does not change."""
    rng = rng_for("broadcast_shapes")
    for _ in range(60):
        a, b = broadcast_pair(rng)
        assert ad.broadcast_shapes("t", a, b) == np.broadcast_shapes(a, b)
        target = np.broadcast_shapes(a, b)
        x = draw(rng, "f", a)
        assert_close(ad.broadcast_to(x, target), np.broadcast_to(x, target), "to")
        a, b = incompatible_pair(rng)
        with pytest.raises(ValueError):
            np.broadcast_shapes(a, b)
        with pytest.raises(TypeError, match="broadcast"):
            ad.broadcast_shapes("t", a, b)
    jaxpr, _, _ = ad.make_jaxpr(
        lambda x: anp.broadcast_to(x, (2, 3)), ad.ShapedArray((2, 3), F64)
    )
    assert jaxpr.eqns == []
    with pytest.raises(TypeError):
        ad.broadcast_to(np.ones((2, 3)), (3,))
    with pytest.raises(TypeError):
        ad.broadcast_to(np.ones((2, 3)), (4, 3, 3))


@pytest.mark.parametrize("seed", range(8))
def test_incompatible_shapes_raise_type_error(seed: int) -> None:
    """Shapes that do not broadcast: a TypeError, eagerly and while tracing
    under jit (before anything is compiled); the strict wrappers refuse any
    difference of shape, as jax.lax does."""
    rng = rng_for("incompatible", seed)
    a_shape, b_shape = incompatible_pair(rng)
    a, b = draw(rng, "nz", a_shape), draw(rng, "nz", b_shape)
    fns = {**{k: v[0] for k, v in SIMPLE_BROADCASTING.items()}}
    fns["anp.minimum"] = anp.minimum
    fns["anp.where"] = lambda a, b: anp.where(np.ones(a.shape, bool), a, b)
    for name, fn in fns.items():
        if not name.startswith("anp."):  # operators need a tracer or an Array
            with pytest.raises(TypeError, match="broadcast"):
                fn(ad.jit(lambda x: x)(a), b)
        else:
            with pytest.raises(TypeError, match="broadcast"):
                fn(a, b)
        with nothing_compiled(), pytest.raises(TypeError, match="broadcast"):
            ad.jit(fn)(a, b)
    # The strict wrappers do not broadcast ranks or sizes at all.
    a_shape, b_shape = broadcast_pair(rng)
    while a_shape == b_shape:
        a_shape, b_shape = broadcast_pair(rng)
    a, b = draw(rng, "nz", a_shape), draw(rng, "nz", b_shape)
    for strict in (ad.add, ad.sub, ad.mul, ad.div, ad.maximum, ad.greater, ad.less):
        with pytest.raises(TypeError, match="same shape"):
            strict(a, b)
        with nothing_compiled(), pytest.raises(TypeError, match="same shape"):
            ad.jit(strict)(a, b)


# Python scalars on either side of every operator; same lambdas run on NumPy
# arrays (the reference), on tracers and on device Arrays.
SCALAR_OPERATORS = {
    "2.0 + x": lambda x: 2.0 + x,
    "x + 2.0": lambda x: x + 2.0,
    "2.0 - x": lambda x: 2.0 - x,
    "x - 2.0": lambda x: x - 2.0,
    "3.0 * x": lambda x: 3.0 * x,
    "x * 3.0": lambda x: x * 3.0,
    "1.0 / x": lambda x: 1.0 / x,
    "x / 4.0": lambda x: x / 4.0,
    "x ** 0": lambda x: x**0,
    "x ** 3": lambda x: x**3,
    "x ** -2": lambda x: x**-2,
    "-x": lambda x: -x,
    "x > 0.5": lambda x: x > 0.5,
    "0.5 > x": lambda x: 0.5 > x,
    "x < 0.5": lambda x: x < 0.5,
    "0.5 < x": lambda x: 0.5 < x,
    "2.0 - x * x / 3.0": lambda x: 2.0 - x * x / 3.0,
}
INT_SCALAR_OPERATORS = {
    "2 - i": lambda i: 2 - i,
    "i * 3": lambda i: i * 3,
    "1 / i": lambda i: 1 / i,
    "i / 2": lambda i: i / 2,
    "i ** 2": lambda i: i**2,
    "-i": lambda i: -i,
    "i > 0": lambda i: i > 0,
}


def all_scalar_operators(x):
    return {name: op(x) for name, op in SCALAR_OPERATORS.items()}


@pytest.mark.parametrize("shape", [(), (3,), (2, 2)])
def test_python_scalars_with_operators(shape: tuple) -> None:
    """``2.0 - x``, ``1.0 / x``, ``x ** 3``, ``-x``, ... on jvp, jit, vmap and
    grad tracers and on jit-returned Arrays: NumPy's values and dtypes (the
    scalar takes the array's dtype), JAX's derivatives."""
    rng = rng_for("scalars", shape)
    x = draw(rng, "nz", shape)
    t = tangent_like(rng, x)
    expected = all_scalar_operators(x)
    floats = [k for k, v in expected.items() if v.dtype == F64]

    def loss(mod, x):
        outs = all_scalar_operators(x)
        return weighted_loss({k: outs[k] for k in floats}, weights, mod)

    weights = {k: draw(rng, "f", shape) for k in floats}
    xs = draw(rng, "nz", (4, *shape))

    def bundle(x, t, xs):
        return {
            "jvp": jax.jvp(all_scalar_operators, (x,), (t,)),
            "grad": jax.grad(lambda x: loss(jnp, x))(x),
            "vmap": jax.vmap(all_scalar_operators)(xs),
        }

    refs = jax.jit(bundle)(x, t, xs)
    assert_close(ad.jit(all_scalar_operators)(x), expected, "jit")
    assert_close(ad.jvp(all_scalar_operators, (x,), (t,)), refs["jvp"], "jvp")
    assert_close(ad.grad(lambda x: loss(anp, x))(x), refs["grad"], "grad")
    assert_close(ad.vmap(all_scalar_operators)(xs), refs["vmap"], "vmap")
    array = ad.jit(lambda x: x)(x)
    assert isinstance(array, ad.Array)
    assert_close(all_scalar_operators(array), expected, "on a device Array")
    # float32: Python numbers take the array's dtype, as in NumPy 2.
    x32 = draw(rng, "f32", shape)
    for name, op in SCALAR_OPERATORS.items():
        want = op(x32)
        got = ad.jit(op)(x32)
        assert got.dtype == want.dtype, name
        np.testing.assert_allclose(host(got), want, rtol=1e-6, err_msg=name)
    # integers: ``/`` gives float64, the others keep int64 (like NumPy).
    i = draw(rng, "inz", shape)
    for name, op in INT_SCALAR_OPERATORS.items():
        want = np.asarray(op(i))
        assert_close(ad.jit(op)(i), want, f"jit {name}")
        assert_close(op(ad.jit(lambda i: i)(i)), want, f"Array {name}")


def test_matmul_operator_and_bad_operands() -> None:
    """``x @ y`` on tracers and Arrays (either side an Array or an ndarray);
    ``@`` with a Python scalar and ``**`` with a non-integer are TypeErrors."""
    rng = rng_for("matmul operator")
    m, v = draw(rng, "f", (3, 4)), draw(rng, "f", (4,))
    expected = m @ v
    m_arr, v_arr = ad.jit(lambda m, v: (m * 1.0, v * 1.0))(m, v)
    assert_close(ad.jit(lambda m, v: m @ v)(m, v), expected, "jit")
    assert_close(m_arr @ v_arr, expected, "Array @ Array")
    assert_close(m_arr @ v, expected, "Array @ ndarray")
    u = draw(rng, "f", (3,))
    assert_close(u @ m_arr, u @ m, "ndarray @ Array")
    assert_close(ad.jit(lambda m: u @ m)(m), u @ m, "ndarray @ tracer")
    assert_close(ad.jvp(lambda v: m @ v, (v,), (v,)), (expected, expected), "jvp")
    assert_close(
        ad.vmap(lambda v: m @ v)(np.stack([v, 2 * v])),
        np.stack([expected, 2 * expected]),
        "vmap",
    )
    with pytest.raises(TypeError):
        ad.jit(lambda m: m @ 2.0)(m)
    with pytest.raises(TypeError):
        ad.jit(lambda m: 2.0 @ m)(m)
    with pytest.raises(TypeError, match="integer"):
        ad.jit(lambda n: np.arange(3) ** n)(2)
    with pytest.raises(TypeError, match="integer"):
        ad.integer_pow(m, 2.0)
    with pytest.raises(ValueError):
        ad.integer_pow(np.arange(3), -1)


# ---------------------------------------------------------------------------
# 4. Lowering to StableHLO
# ---------------------------------------------------------------------------

LOWERINGS = {
    "sub": (ad.sub, ["f", "f"], ["stablehlo.subtract"]),
    "div": (ad.div, ["f", "nz"], ["stablehlo.divide"]),
    "max": (ad.maximum, ["tie", "tie"], ["stablehlo.maximum"]),
    "exp": (ad.exp, ["f"], ["stablehlo.exponential"]),
    "log": (ad.log, ["pos"], ["stablehlo.log"]),
    "tanh": (ad.tanh, ["f"], ["stablehlo.tanh"]),
    "sqrt": (ad.sqrt, ["pos"], ["stablehlo.sqrt"]),
    "rsqrt": (ad.rsqrt, ["pos"], ["stablehlo.rsqrt"]),
    "reshape": (lambda x: ad.reshape(x, (3, -1)), ["f"], ["stablehlo.reshape"]),
    "convert f64->f32": (
        lambda x: ad.convert_element_type(x, F32),
        ["f"],
        ["stablehlo.convert", "tensor<2x3xf32>"],
    ),
    "convert int64->f64": (
        lambda x: ad.convert_element_type(x, F64),
        ["int"],
        ["stablehlo.convert", "tensor<2x3xf64>"],
    ),
    "convert f64->bool": (
        lambda x: ad.convert_element_type(x, np.bool_),
        ["zero"],
        ["stablehlo.compare", "NE"],
    ),
    "dot_general": (
        lambda x, y: ad.dot_general(x, y, (((1,), (1,)), ((0,), (0,)))),
        ["f", "f"],
        ["stablehlo.dot_general"],
    ),
    "reduce_max": (
        lambda x: ad.reduce_max(x, 1),
        ["tie"],
        ["stablehlo.reduce", "stablehlo.maximum"],
    ),
    "integer_pow": (lambda x: ad.integer_pow(x, 3), ["f"], ["stablehlo.multiply"]),
}


@pytest.mark.parametrize("name", LOWERINGS)
def test_lowering_of_each_new_primitive(name: str) -> None:
    fn, kinds, ops = LOWERINGS[name]
    rng = rng_for("lowering", name)
    args = [draw(rng, k, (2, 3)) for k in kinds]
    jaxpr, consts, _ = ad.make_jaxpr(fn, *(ad.get_aval(a) for a in args))
    assert not consts
    prim = name.split()[0]
    assert [eqn.primitive.name for eqn in jaxpr.eqns] == [
        "convert_element_type" if prim == "convert" else prim
    ]
    text = str(ad.lower_jaxpr(jaxpr))
    for op in ops:
        assert op in text, (op, text)
    assert_close(ad.jit(fn)(*args), fn(*args), "jit vs eval")


def expected_multiplies(y: int) -> int:
    """Square-and-multiply: one squaring per binary digit after the first,
    one multiplication per set bit after the first."""
    n = abs(y)
    return 0 if n == 0 else (n.bit_length() - 1) + (bin(n).count("1") - 1)


@pytest.mark.parametrize("y", [*POWERS, 7, 8, 31, *NEGATIVE_POWERS])
def test_integer_pow_lowering(y: int) -> None:
    """integer_pow(x, y) lowers to square-and-multiply (x^13 = x^8 x^4 x: 5
    multiplies), with one divide for a negative exponent, and runs under jit
    like NumPy's power."""
    aval = ad.ShapedArray((3,), F64)
    jaxpr, _, _ = ad.make_jaxpr(lambda x: ad.integer_pow(x, y), aval)
    text = str(ad.lower_jaxpr(jaxpr))
    assert text.count("stablehlo.multiply") == expected_multiplies(y), text
    assert text.count("stablehlo.divide") == (y < 0), text
    assert "stablehlo.power" not in text
    x = draw(rng_for("pow", y), "nz", (3,))
    assert_close(ad.jit(lambda x: ad.integer_pow(x, y))(x), np.power(x, y), "jit")
    assert_close(ad.integer_pow(x, y), np.power(x, y), "eval")


def test_integer_pow_13_is_five_multiplies() -> None:
    jaxpr, _, _ = ad.make_jaxpr(
        lambda x: ad.integer_pow(x, 13), ad.ShapedArray((), F64)
    )
    assert str(ad.lower_jaxpr(jaxpr)).count("stablehlo.multiply") == 5
    i = np.arange(-3, 4)
    assert_close(ad.jit(lambda i: ad.integer_pow(i, 13))(i), i**13, "int64")


def test_no_equation_when_nothing_changes() -> None:
    """convert_element_type to the same dtype and reshape to the same shape
    record nothing; anp.astype likewise."""
    aval = ad.ShapedArray((2, 3), F64)
    for fn in [
        lambda x: ad.convert_element_type(x, F64),
        lambda x: anp.astype(x, "float64"),
        lambda x: ad.reshape(x, (2, 3)),
        lambda x: ad.reshape(x, (2, -1)),
        lambda x: anp.broadcast_to(x, (2, 3)),
    ]:
        jaxpr, _, _ = ad.make_jaxpr(fn, aval)
        assert jaxpr.eqns == [], str(jaxpr)


# ---------------------------------------------------------------------------
# 5. Registries
# ---------------------------------------------------------------------------

NEW_PRIMITIVES = {
    "sub", "div", "max", "exp", "log", "tanh", "sqrt", "rsqrt", "integer_pow",
    "convert_element_type", "reshape", "reduce_max", "dot_general",
}  # fmt: skip


def module_primitives() -> dict[str, ad.Primitive]:
    """The module's own primitives (``<name>_p`` attributes): other tests
    register throwaway primitives in the same global registry."""
    return {
        name: prim
        for name, prim in ad.PRIMITIVES.items()
        if getattr(ad, f"{name}_p", None) is prim
    }


def test_every_primitive_has_every_rule() -> None:
    assert NEW_PRIMITIVES | {"add", "sin", "select", "cond", "xla_call"} <= set(
        module_primitives()
    )
    assert {
        "impl", "jvp", "vmap", "abstract_eval", "lower", "transpose",
        "partial_eval", "partial_eval_jaxpr",
    } <= set(ad.RULE_KINDS)  # fmt: skip
    for name, prim in module_primitives().items():
        assert prim.name == name
        for kind in ("impl", "jvp", "vmap", "abstract_eval", "lower"):
            assert kind in prim.rules, (name, kind)
        without = ad.NOT_LINEAR | ad.NEVER_TRANSPOSED
        assert ("transpose" in prim.rules) == (name not in without), name
    for name in ("xla_call", "cond"):
        prim = ad.PRIMITIVES[name]
        assert {"partial_eval", "partial_eval_jaxpr"} <= set(prim.rules), name
    assert ad.NOT_LINEAR <= set(ad.PRIMITIVES)
    assert ad.NEVER_TRANSPOSED <= set(ad.PRIMITIVES)
    assert not ad.NOT_LINEAR & ad.NEVER_TRANSPOSED


_sin_with_vjp = ad.custom_vjp(ad.sin)
_sin_with_vjp.defvjp(lambda x: (ad.sin(x), ad.cos(x)), lambda c, ct: (ct * c,))


# For each primitive that is linear in none of its inputs, a function of
# float arrays that applies just that primitive (floats out).
NONLINEAR_WITNESSES = {
    "sin": lambda x, y: ad.sin(x),
    "cos": lambda x, y: ad.cos(x),
    "exp": lambda x, y: ad.exp(x),
    "log": lambda x, y: ad.log(x),
    "tanh": lambda x, y: ad.tanh(x),
    "sqrt": lambda x, y: ad.sqrt(x),
    "rsqrt": lambda x, y: ad.rsqrt(x),
    "erf": lambda x, y: ad.lax.erf(x),
    "pow": lambda x, y: ad.lax.pow(x, y),
    "integer_pow": lambda x, y: ad.integer_pow(x, 2),
    "reduce_max": lambda x, y: ad.reduce_max(x, 0),
    "max": lambda x, y: ad.maximum(x, y),
    "gt": lambda x, y: ad.convert_element_type(ad.greater(x, y), F64),
    "lt": lambda x, y: ad.convert_element_type(ad.less(x, y), F64),
    "ge": lambda x, y: ad.convert_element_type(ad.greater_equal(x, y), F64),
    "le": lambda x, y: ad.convert_element_type(ad.less_equal(x, y), F64),
    "eq": lambda x, y: ad.convert_element_type(ad.equal(x, y), F64),
    "ne": lambda x, y: ad.convert_element_type(ad.not_equal(x, y), F64),
    # Part 8: a custom_vjp function (sin, with its true backward pass).
    "custom_vjp_call": lambda x, y: _sin_with_vjp(x),
    # Part 6: square until the sum passes 100 (elements are positive).
    "while": lambda x, y: ad.while_loop(
        lambda v: ad.reduce_sum(v, 0) < 100.0, lambda v: v * v + 1.0, x
    ),
    # Part 9: collectives over an axis "i" whose members are the 5 entries of
    # x (traced with the axis bound, evaluated under a named vmap). pmax is a
    # maximum over the members; axis_index ignores x, so f(a + b) = f(a).
    "pmax": lambda x, y: ad.pmax(x, "i"),
    "axis_index": lambda x, y: ad.convert_element_type(ad.axis_index("i"), F64),
    # the indexing chapter: the smaller (larger) of x and the updates y written
    # at repeated positions
    "scatter-min": lambda x, y: ad.lax.scatter_min(x, y, np.array([0, 2, 2, 4, 1])),
    "scatter-max": lambda x, y: ad.lax.scatter_max(x, y, np.array([0, 2, 2, 4, 1])),
}


# The random chapter: integer primitives see the floats as uint32 (values 0 to
# 5), and give floats back; erf_inv and iota are not linear either.
def _on_uint32(op):
    u32 = lambda v: ad.convert_element_type(v, np.uint32)  # noqa: E731
    return lambda x, y: ad.convert_element_type(op(u32(x), u32(y)), F64)


_TWOS = np.full(5, 2, np.uint32)
NONLINEAR_WITNESSES.update(
    {
        "xor": _on_uint32(ad.bitwise_xor),
        "or": _on_uint32(ad.bitwise_or),
        "and": _on_uint32(ad.bitwise_and),
        "shift_left": _on_uint32(ad.shift_left),
        "shift_right_logical": _on_uint32(ad.shift_right_logical),
        "rem": _on_uint32(lambda x, y: ad.rem(x, _TWOS)),
        "bitcast_convert_type": lambda x, y: ad.convert_element_type(
            ad.bitcast_convert_type(x, np.uint64), F64
        ),
        "iota": lambda x, y: ad.convert_element_type(ad.iota(np.uint32, 5), F64),
        "erf_inv": lambda x, y: ad.erf_inv(x),
        "sort": lambda x, y: ad.lax.sort_key_val(
            ad.convert_element_type(x, np.int64), y
        )[1],
    }
)

OVER_NAMED_AXIS = {"pmax", "axis_index"}
# no outputs, so nothing to witness (tests/test_analysis.py checks that a print
# of tangents stays out of linear jaxprs)
WITHOUT_OUTPUTS = {"debug_print"}


@pytest.mark.parametrize("name", sorted(ad.NOT_LINEAR - WITHOUT_OUTPUTS))
def test_not_linear_primitives_are_not_linear(name: str) -> None:
    """f(a + b) != f(a) + f(b) for some inputs, so a transpose rule would be
    meaningless; linear-in-some-input would need a transpose instead."""
    fn = NONLINEAR_WITNESSES[name]
    rng = rng_for("nonlinear", name)
    a = [draw(rng, "pos", (5,)) for _ in range(2)]
    b = [draw(rng, "pos", (5,)) for _ in range(2)]
    if name in ("gt", "lt", "ge", "le", "max"):
        b = [b[0], -b[0]]  # flips which operand is larger
    if name == "eq":  # a's operands are equal, a + b's are not
        a, b = [a[0], a[0]], [b[0], -b[0]]
    if name == "ne":  # a's and b's operands differ, a + b's are equal
        b = [a[1], a[0]]
    avals = [ad.get_aval(v) for v in a]
    if name in OVER_NAMED_AXIS:  # one member's view: a scalar, axis "i" bound
        traced = ad.with_axis(fn, "i", 5)
        avals = [ad.ShapedArray((), F64)] * 2
        fn = ad.vmap(fn, axis_name="i")
    else:
        traced = fn
    jaxpr, _, _ = ad.make_jaxpr(traced, *avals)
    names = {eqn.primitive.name for eqn in jaxpr.eqns} - {"convert_element_type"}
    assert names == {name}
    total = fn(a[0] + b[0], a[1] + b[1])
    parts = fn(*a) + fn(*b)
    assert not np.allclose(total, parts), (total, parts)


def test_every_not_linear_primitive_has_a_witness() -> None:
    assert set(NONLINEAR_WITNESSES) == set(ad.NOT_LINEAR) - WITHOUT_OUTPUTS


# NEVER_TRANSPOSED: linear primitives without a transpose rule, because their
# tangent is always a fresh zero. Each is linear: f(a + b) == f(a) + f(b).
NEVER_TRANSPOSED_WITNESSES = {
    "stop_gradient": ad.stop_gradient,
    "name": lambda x: ad.checkpoint_name(x, "x"),  # Part 11: the tangent is not named
}


@pytest.mark.parametrize("name", sorted(ad.NEVER_TRANSPOSED))
def test_never_transposed_primitives_are_linear(name: str) -> None:
    fn = NEVER_TRANSPOSED_WITNESSES[name]
    rng = rng_for("never-transposed", name)
    a, b = draw(rng, "f", (5,)), draw(rng, "f", (5,))
    jaxpr, _, _ = ad.make_jaxpr(fn, ad.get_aval(a))
    assert {eqn.primitive.name for eqn in jaxpr.eqns} == {name}
    np.testing.assert_allclose(fn(a + b), fn(a) + fn(b), rtol=1e-12)
    assert set(NEVER_TRANSPOSED_WITNESSES) == set(ad.NEVER_TRANSPOSED)


def test_zero_derivative_primitives_stay_out_of_linear_jaxprs() -> None:
    """linearize of a function through stop_gradient records no stop_gradient
    in the linear jaxpr (its tangent is a zero constant), so grad works."""
    x = np.array([0.5, -1.0, 2.0])
    f = lambda x: ad.reduce_sum(ad.stop_gradient(x) * ad.sin(x))  # noqa: E731
    _, f_lin = ad.linearize(f, x)
    jaxpr, _, _ = ad.make_jaxpr(f_lin, ad.get_aval(x))
    assert "stop_gradient" not in {e.primitive.name for e in jaxpr.eqns}
    np.testing.assert_allclose(ad.grad(f)(x), x * np.cos(x), rtol=1e-12)


def dyadic(rng: np.random.Generator, shape: Sequence[int], dtype=F64) -> np.ndarray:
    """Values k/4 with small k: exact in float32 and in float64."""
    return np.asarray(rng.integers(-8, 9, tuple(shape)) / 4.0).astype(dtype)


_P = np.array([True, False, True])
_C23 = np.array([[0.5, -1.5, 2.0], [1.25, 0.75, -0.5]])

# For each primitive with a transpose rule: a linear function using just that
# primitive (plus constants), and the shapes and dtypes of its inputs.
LINEAR_FUNCTIONS = {
    "add": (ad.add, [(2, 3), (2, 3)]),
    "sub": (ad.sub, [(2, 3), (2, 3)]),
    "mul": (lambda x, y: ad.add(ad.mul(x, _C23), ad.mul(_C23, y)), [(2, 3)] * 2),
    "neg": (ad.neg, [(2, 3)]),
    "div": (lambda x: ad.div(x, _C23), [(2, 3)]),
    "reduce_sum": (lambda x: ad.reduce_sum(x, (0, 2)), [(2, 3, 4)]),
    "transpose": (lambda x: ad.transpose(x, (2, 0, 1)), [(2, 3, 4)]),
    "broadcast": (lambda x: ad.broadcast(x, (2, 3, 4), (0, 2)), [(3,)]),
    "reshape": (lambda x: ad.reshape(x, (3, -1)), [(2, 3, 2)]),
    "convert_element_type": (
        lambda x, y: (ad.convert_element_type(x, F64), ad.convert_element_type(y, F32)),
        [((2, 3), F32), ((3,), F64)],
    ),
    "dot_general": (
        lambda x, y: ad.add(
            ad.dot_general(x, _C23, (((0, 2), (0, 1)), ((), ()))),
            ad.dot_general(_C23[0], y, (((0,), (1,)), ((), ()))),
        ),
        [(2, 4, 3), (4, 3)],
    ),
    "select": (lambda x, y: ad.select(_P, x, y), [(3,), (3,)]),
    "cond": (
        lambda x: tuple(
            ad.cond(p, lambda x: x * 2.0, lambda x: -x, x) for p in (True, False)
        ),
        [(3,)],
    ),
    "xla_call": (ad.jit(lambda x, y: ad.sub(ad.mul(x, 3.0), y)), [(2,), (2,)]),
    # Part 7: a scan linear in its carry and its xs.
    "scan": (
        lambda c, xs: ad.scan(lambda c, x: (c * 0.5 + x, c - x * 2.0), c, xs),
        [(3,), (4, 3)],
    ),
}


# Part 8: a linear custom_jvp function whose rule applies it to the tangent,
# so the call lands in the linear jaxpr and is transposed.
_triple = ad.custom_jvp(lambda x: ad.mul(x, 3.0))
_triple.defjvp(lambda p, t: (_triple(p[0]), _triple(t[0])))
LINEAR_FUNCTIONS["custom_jvp_call"] = (_triple, [(2, 3)])
# Part 5: keep_gradient is the identity on values; its own JVP never leaves it
# in a linear jaxpr, so a custom_jvp rule applies it to the tangent.
_keep = ad.custom_jvp(lambda x: ad.keep_gradient(_P, x))
_keep.defjvp(lambda p, t: (_keep(p[0]), ad.keep_gradient(_P, t[0])))
LINEAR_FUNCTIONS["keep_gradient"] = (_keep, [(3,)])
# Part 8: custom_lin is what a custom_vjp function leaves in a linear jaxpr;
# its transpose runs bwd. It has no forward mode by design, so J v comes from
# the same map without the custom rule (FORWARD_OF).
_triple_vjp = ad.custom_vjp(lambda x: ad.mul(x, 3.0))
_triple_vjp.defvjp(lambda x: (ad.mul(x, 3.0), None), lambda r, ct: (ad.mul(ct, 3.0),))
LINEAR_FUNCTIONS["custom_lin"] = (_triple_vjp, [(2, 3)])
FORWARD_OF = {"custom_lin": lambda x: ad.mul(x, 3.0)}
# Part 9: pmap over 4 of the test process's 8 host devices; its transpose is
# the pmap of the transposed body, which transposes the collectives in it.
LINEAR_FUNCTIONS["pmap"] = (
    ad.pmap(lambda x, y: ad.sub(ad.mul(x, 3.0), y)),
    [(4, 2), (4, 2)],
)
LINEAR_FUNCTIONS["psum"] = (ad.pmap(lambda x: ad.psum(x, "i"), "i"), [(4, 3)])
LINEAR_FUNCTIONS["all_gather"] = (
    ad.pmap(lambda x: ad.all_gather(x, "i"), "i"),
    [(4, 3)],
)

# The indexing chapter: slices and pads, blocks at positions given as
# operands (clamped), and gathers and scatters with repeated indices (out of
# range only for the scatter: a gather's transpose drops what it clamped, as
# JAX's does, so the two are adjoint for indices in range).
_ROWS = np.array([2, 0, 2, 1])
# Part 11: a checkpointed linear function; vjp transposes the checkpoint that
# partial evaluation stages (its jaxpr recomputes nothing here).
LINEAR_FUNCTIONS["checkpoint"] = (
    ad.checkpoint(lambda x, y: ad.sub(ad.mul(x, 3.0), ad.transpose(y, (1, 0)))),
    [(2, 3), (3, 2)],
)
LINEAR_FUNCTIONS["slice"] = (
    lambda x: ad.lax.slice(x, (1, 0), (3, 4), (1, 2)),
    [(3, 4)],
)
LINEAR_FUNCTIONS["pad"] = (lambda x: ad.lax.pad(x, (1, 0), (0, 2), (1, 1)), [(2, 3)])
LINEAR_FUNCTIONS["dynamic_slice"] = (
    lambda x: ad.lax.dynamic_slice(x, (np.int64(2), np.int64(-1)), (2, 2)),
    [(3, 4)],
)
LINEAR_FUNCTIONS["dynamic_update_slice"] = (
    lambda x, u: ad.lax.dynamic_update_slice(x, u, (1, 5)),
    [(3, 4), (2, 2)],
)
LINEAR_FUNCTIONS["gather"] = (lambda x: ad.lax.gather(x, _ROWS), [(3, 4)])
LINEAR_FUNCTIONS["scatter"] = (
    lambda x, u: ad.lax.scatter(x, u, np.array([2, 0, 2, 7])),
    [(3, 4), (4, 4)],
)


def test_every_transpose_rule_has_a_linear_function() -> None:
    with_transpose = {
        n for n, p in module_primitives().items() if "transpose" in p.rules
    }
    assert set(LINEAR_FUNCTIONS) == with_transpose


@pytest.mark.parametrize("name", sorted(LINEAR_FUNCTIONS))
def test_transpose_rule_dot_product(name: str, monkeypatch) -> None:
    """<ct, J v> (J v from jvp) == <J^T ct, v> (J^T ct from vjp, which runs
    this primitive's transpose rule): a wrong transpose fails."""
    fn, specs = LINEAR_FUNCTIONS[name]
    specs = [s if isinstance(s[-1], type) else (s, F64) for s in specs]
    prim = ad.PRIMITIVES[name]
    calls = []
    rule = prim.rules["transpose"]

    def counting(*args, **params):
        calls.append(1)
        return rule(*args, **params)

    monkeypatch.setitem(prim.rules, "transpose", counting)
    rng = rng_for("transpose", name)
    for _ in range(3):
        primals = tuple(dyadic(rng, s, d) for s, d in specs)
        v = tuple(dyadic(rng, s, d) for s, d in specs)
        out, jv = ad.jvp(FORWARD_OF.get(name, fn), primals, v)
        ct = jax.tree_util.tree_map(
            lambda o: dyadic(rng, np.shape(o), np.asarray(host(o)).dtype), out
        )
        _, f_vjp = ad.vjp(fn, *primals)
        ct_in = f_vjp(ct)
        assert jax.tree_util.tree_structure(ct_in) == jax.tree_util.tree_structure(v)
        for c, x in zip(ct_in, v):
            assert np.shape(c) == x.shape and np.asarray(host(c)).dtype == x.dtype
        lhs, rhs = vdot(ct, jv), vdot(ct_in, v)
        assert abs(lhs - rhs) <= TOL * max(1.0, abs(lhs)), (lhs, rhs)
    assert calls, f"the transpose rule of {name} was never used"


# ---------------------------------------------------------------------------
# 6. Importing autodidax.numpy
# ---------------------------------------------------------------------------

NUMPY_NAMES = (
    "add subtract multiply divide maximum minimum greater less negative sin cos "
    "exp log tanh sqrt rsqrt reshape broadcast_to zeros_like ones_like zeros ones "
    "power where sum max mean transpose astype dot matmul "
    "bool_ int32 int64 float32 float64"
).split()


def test_numpy_namespace_has_every_function() -> None:
    for name in NUMPY_NAMES:
        assert hasattr(anp, name), name
    assert anp.float64 is np.float64 and anp.bool_ is np.bool_


def test_import_autodidax_numpy_in_a_fresh_interpreter(tmp_path) -> None:
    """``import autodidax.numpy as anp`` and ``from autodidax import numpy``
    work in a new process, give one module, and print nothing."""
    code = (
        "import autodidax.numpy as anp\n"
        "from autodidax import numpy\n"
        "import autodidax, sys\n"
        "assert anp is numpy is autodidax.numpy is sys.modules['autodidax.numpy']\n"
        "x = anp.ones((2, 3))\n"
        "print(repr(anp.__name__), anp.sum(anp.maximum(x, 2.0) @ anp.ones(3)))\n"
    )
    env = dict(os.environ, PYTHONPATH=os.path.dirname(ad.__file__))
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == "'autodidax.numpy' 12.0\n"
    assert done.stderr == ""


def test_the_appendix_replaces_nothing_earlier_chapters_defined() -> None:
    """The appendix extends (new primitives, rules, functions, operators that
    did not exist, entries in Part 1's empty registry OPERATORS); it rebinds no
    name, class attribute or primitive rule of Parts 1-5. Runs the module's
    chapters up to the appendix, snapshots them, then runs the appendix."""
    with open(ad.__file__, encoding="utf-8") as source_file:
        lines = source_file.read().splitlines(keepends=True)
    marker = re.compile(r"# ==== chapter: (\S+) ====$")
    starts = {}
    for number, line in enumerate(lines):
        if found := marker.match(line.rstrip("\n")):
            starts[found.group(1)] = number
    chapters = list(starts)
    appendix = chapters.index("appendix_primitives")
    begin, end = starts["appendix_primitives"], starts[chapters[appendix + 1]]
    namespace: dict = {"__name__": "__main__"}
    exec(compile("".join(lines[:begin]), ad.__file__, "exec"), namespace)

    def bindings() -> dict:
        found = {}
        for name, value in list(namespace.items()):
            found[name] = value
            if isinstance(value, type) and value.__module__ == "__main__":
                for attr, attr_value in vars(value).items():
                    found[f"{name}.{attr}"] = attr_value
        for prim in namespace["PRIMITIVES"].values():
            for kind, rule in prim.rules.items():
                found[f"{prim.name} rule {kind}"] = rule
        return found

    earlier = bindings()
    loop_variables = {"_prim", "_np_fn"}  # `for _prim in ...` in several chapters
    exec(
        compile("\n" * begin + "".join(lines[begin:end]), ad.__file__, "exec"),
        namespace,
    )
    later = bindings()
    replaced = [
        name
        for name, value in earlier.items()
        if name not in loop_variables and later.get(name) is not value
    ]
    assert replaced == []
    assert {"sub", "div", "dot_general"} <= set(namespace["PRIMITIVES"])
    assert set(namespace["OPERATORS"]) == {"add", "sub", "mul", "greater", "less"}


# ---------------------------------------------------------------------------
# 7. The worked example: a two-layer MLP
# ---------------------------------------------------------------------------


def mlp_loss(mod: Any, params: dict, x: Any, y: Any) -> Any:
    """Mean squared error of a tanh MLP, for ``mod`` = anp or jnp."""
    hidden = mod.tanh(x @ params["w1"] + params["b1"])
    prediction = hidden @ params["w2"] + params["b2"]
    return mod.mean((prediction - y) ** 2)


@pytest.mark.parametrize(
    "seed, batch, d_in, width, d_out",
    [(0, 16, 1, 8, 1), (1, 10, 3, 5, 2), (2, 7, 2, 4, 3)],
)
def test_mlp_gradient_and_training(seed, batch, d_in, width, d_out) -> None:
    rng = rng_for("mlp", seed)
    x = rng.uniform(-2.0, 2.0, (batch, d_in))
    y = np.sin(x @ rng.normal(size=(d_in, d_out))) + 0.1 * rng.normal(
        size=(batch, d_out)
    )
    params = {
        "w1": 0.5 * rng.normal(size=(d_in, width)),
        "b1": 0.1 * rng.normal(size=width),
        "w2": 0.3 * rng.normal(size=(width, d_out)),
        "b2": 0.1 * rng.normal(size=d_out),
    }
    ours = ad.jit(ad.grad(lambda p, x, y: mlp_loss(anp, p, x, y)))
    theirs = jax.jit(jax.grad(lambda p, x, y: mlp_loss(jnp, p, x, y)))
    assert_close(ours(params, x, y), theirs(params, x, y), "jit(grad(loss))")
    assert_close(
        mlp_loss(anp, params, x, y), np.asarray(mlp_loss(jnp, params, x, y)), "loss"
    )

    def step(p, g, lr=0.1):
        return {k: p[k] - lr * g[k] for k in p}

    # Per-example gradients: vmap(grad) over the batch, params shared.
    per_example = ad.vmap(ours, (None, 0, 0))(params, x[:, None], y[:, None])
    jax_per_example = jax.jit(jax.vmap(theirs, (None, 0, 0)))(
        params, x[:, None], y[:, None]
    )
    assert_close(per_example, jax_per_example, "vmap(jit(grad(loss)))")

    ours_p, theirs_p = params, params
    for _ in range(20):
        ours_p = step(ours_p, ours(ours_p, x, y))
        theirs_p = step(theirs_p, theirs(theirs_p, x, y))
    ours_p = {k: np.asarray(host(v)) for k, v in ours_p.items()}
    assert_close(ours_p, {k: np.asarray(v) for k, v in theirs_p.items()}, "20 steps")
    assert float(mlp_loss(anp, ours_p, x, y)) < float(mlp_loss(anp, params, x, y))


# ---------------------------------------------------------------------------
# Regressions: bugs these tests found, fixed in the appendix chapter (anp.minimum
# negated integers; anp.sum kept booleans boolean).
# ---------------------------------------------------------------------------


def test_regression_anp_minimum_of_unsigned_integers() -> None:
    """BUG: anp.minimum is written -maximum(-x, -y), which is wrong where
    negation wraps around: for unsigned integers minimum(0, 5) gives 5."""
    a, b = np.array([0, 3], np.uint8), np.array([5, 1], np.uint8)
    assert_close(anp.minimum(a, b), np.minimum(a, b), "eval")
    assert_close(ad.jit(anp.minimum)(a, b), np.minimum(a, b), "jit")


def test_regression_anp_minimum_at_the_smallest_integer() -> None:
    """BUG: -iinfo.min overflows to iinfo.min, so anp.minimum(iinfo.min, 0)
    gives 0 instead of iinfo.min."""
    a = np.array([np.iinfo(np.int64).min, 4])
    b = np.array([0, 5])
    assert_close(anp.minimum(a, b), np.minimum(a, b), "eval")
    assert_close(ad.jit(anp.minimum)(a, b), np.minimum(a, b), "jit")


def test_regression_anp_sum_of_booleans_counts_like_numpy() -> None:
    """BUG: anp.sum of a boolean array returns a boolean (reduce_sum keeps
    the dtype, so it is a logical 'any'), where np.sum and jnp.sum count the
    True elements: a silent wrong answer in the NumPy-like front end."""
    mask = np.array([True, True, False])
    assert_close(anp.sum(mask), np.asarray(jnp.sum(mask)), "eval")
    assert_close(ad.jit(anp.sum)(mask), np.sum(mask), "jit")


@pytest.mark.parametrize("mode", ["eager", "jit"])
def test_max_and_reduce_max_derivatives_at_nan_match_jax(mode: str) -> None:
    """Ties are found with eq, so a NaN operand neither wins nor ties: max's
    slope is 0 for both operands and reduce_max's tangent is NaN eagerly, as in
    JAX (compiled, XLA turns the 0 * inf of the backward pass into 0, for JAX's
    program and ours alike)."""
    wrap = ad.jit if mode == "jit" else (lambda f: f)
    their_wrap = jax.jit if mode == "jit" else (lambda f: f)  # XLA: inf * 0 = 0
    for x, y in [(1.0, np.nan), (np.nan, 1.0), (2.0, 2.0)]:
        ours = wrap(ad.grad(lambda a, b: ad.maximum(a, b), argnums=(0, 1)))(x, y)
        with jax.enable_x64(True):
            theirs = their_wrap(jax.grad(jnp.maximum, argnums=(0, 1)))(x, y)
        np.testing.assert_array_equal(np.asarray(ours), np.asarray(theirs))
    rows = np.array([[1.0, np.nan, 0.5], [2.0, 3.0, 3.0]])
    f = wrap(ad.grad(lambda s: ad.reduce_sum(ad.reduce_max(s, 1))))
    with jax.enable_x64(True):
        theirs = their_wrap(jax.grad(lambda s: jnp.sum(jnp.max(s, 1))))(rows)
    with np.errstate(invalid="ignore", divide="ignore"):
        ours = f(rows)
    np.testing.assert_array_equal(np.asarray(ours), np.asarray(theirs))
