"""Scale (issue 8): big programs and big pytrees, without recursion limits or
quadratic costs.

A straight-line program of 5,000 primitives (a chain cycling through sin,
mul, cos, add and neg, each step depending on the previous one) goes through
make_jaxpr, the type checker, the printer, eval_jaxpr, jvp, vmap, linearize,
vjp, grad and the lowering to StableHLO, with the recursion limit set low:
nothing may recurse once per primitive (the limit leaves 250 frames, a
twentieth of the chain, so 5,000 shows that as well as 20,000 did, at a
quarter of the suite's time). Results are checked against a NumPy
computation of the same chain (values and derivatives by forward-mode dual
numbers). Pytrees of 3,000 leaves (a flat list, a dict, a balanced nested
structure and a deeper one of 50 levels; twelve times the recursion headroom,
which shows a recursion per leaf as well as 10,000 leaves did, at a third of
the time) go through tree_flatten/unflatten, jit, grad and
vmap; jit of the balanced one is traced, lowered and evaluated at full size,
and compiled and run at 1,000 leaves (XLA alone takes 15-20 s to compile a
program of 10,000 parameters).

XLA itself needs a long time to compile such chains on CPU (real JAX too), so
the 5,000-primitive jaxprs are lowered but not compiled: jit is traced at full
size (under make_jaxpr, which stages the jitted call instead of compiling
it), lowered, and checked by evaluating its nested jaxprs with the primitives'
own implementations; a 2,000-primitive chain is compiled and run.

Quadratic behaviour is guarded without timing: the number of Python function
calls (Python and C functions, counted with sys.setprofile) for 4x the size
must be at most 5x (4x plus a margin). No test here measures time; timings
belong in bench/.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import pytest

import autodidax as ad

pytestmark = pytest.mark.usefixtures("clean_interpreter_stack")

N = 5_000  # primitives in the big chain: 20x the recursion headroom
N_COMPILED = 2_000  # the chain that XLA compiles and runs
N_LEAVES = 3_000  # 12x the recursion headroom
HEADROOM = 250  # frames allowed above the test's own depth
TOL = 1e-9
X = np.linspace(-0.9, 0.9, 8)
CYCLE = ("sin", "mul", "cos", "add", "neg")


# ---------------------------------------------------------------------------
# The chain, in autodidax and in NumPy (values and forward derivatives)
# ---------------------------------------------------------------------------


def chain(n: int) -> Callable:
    """x -> the chain of ``n`` primitives (mul and add use ``x`` again)."""

    def f(x):
        y = x
        for i in range(n):
            step = CYCLE[i % 5]
            if step == "sin":
                y = ad.sin(y)
            elif step == "mul":
                y = y * x
            elif step == "cos":
                y = ad.cos(y)
            elif step == "add":
                y = y + x
            else:
                y = -y
        return y

    return f


def chain_numpy(n: int, x: np.ndarray, dx: np.ndarray) -> tuple:
    """The chain's value and its directional derivative along ``dx`` (``dx``
    may carry extra leading axes: several directions at once)."""
    y, dy = x, dx
    for i in range(n):
        step = CYCLE[i % 5]
        if step == "sin":
            y, dy = np.sin(y), np.cos(y) * dy
        elif step == "mul":
            y, dy = y * x, dy * x + y * dx
        elif step == "cos":
            y, dy = np.cos(y), -np.sin(y) * dy
        elif step == "add":
            y, dy = y + x, dy + dx
        else:
            y, dy = -y, -dy
    return y, dy


def close(ours: Any, expected: np.ndarray) -> None:
    np.testing.assert_allclose(np.asarray(ours), expected, rtol=TOL, atol=TOL)


@pytest.fixture(scope="module")
def reference() -> dict:
    """NumPy values of the big chain: value, a jvp, and the gradient of the
    sum (from the full Jacobian, by 8 directions at once)."""
    v = np.cos(3.0 * X)
    value, tangent = chain_numpy(N, X, v)
    _, jacobian_t = chain_numpy(N, X, np.eye(8))  # row j: d chain / d x_j
    return {"value": value, "v": v, "tangent": tangent, "grad": jacobian_t.sum(1)}


@contextmanager
def low_recursion_limit() -> Iterator[int]:
    """Allow only HEADROOM frames above the current depth: far too few for
    anything that recurses once per primitive or per leaf."""
    depth, frame = 0, sys._getframe()
    while frame is not None:
        depth, frame = depth + 1, frame.f_back
    saved = sys.getrecursionlimit()
    sys.setrecursionlimit(depth + HEADROOM)
    try:
        yield depth + HEADROOM
    finally:
        sys.setrecursionlimit(saved)


def count_calls(fn: Callable[[], Any]) -> int:
    """How many Python and C function calls ``fn()`` makes."""
    calls = 0

    def profile(frame, event, arg):
        nonlocal calls
        if event in ("call", "c_call"):
            calls += 1

    sys.setprofile(profile)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return calls


def assert_linear(make_work: Callable[[int], Callable[[], Any]], n: int) -> None:
    """The work for 4n makes at most 5x the calls of the work for n."""
    count_calls(make_work(n // 4))  # warm up one-time initialisations
    small = count_calls(make_work(n))
    large = count_calls(make_work(4 * n))
    assert large <= 5 * small, f"{small} calls for {n}, {large} for {4 * n}"


# ---------------------------------------------------------------------------
# A program of 20,000 primitives
# ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def big_jaxpr():
    with low_recursion_limit():
        jaxpr, consts, out_tree = ad.make_jaxpr(chain(N), X)
    return jaxpr, consts


def test_make_jaxpr_typecheck_and_print(big_jaxpr, reference):
    jaxpr, consts = big_jaxpr
    assert len(jaxpr.eqns) == N
    names = [eqn.primitive.name for eqn in jaxpr.eqns]
    assert names[:5] == list(CYCLE) and names[-5:] == list(CYCLE)
    with low_recursion_limit():
        jaxpr_type = ad.typecheck_jaxpr(jaxpr)
        text = str(jaxpr)
        out = ad.eval_jaxpr(jaxpr, [*consts, X])
    assert str(jaxpr_type) == "(float64[8]) -> (float64[8])"
    lines = text.splitlines()
    assert len(lines) == N + 2
    assert lines[1].split("=")[1].split()[0] == "sin"
    close(out[0], reference["value"])


def test_eager_jvp_vmap(reference):
    f = chain(N)
    v = reference["v"]
    with low_recursion_limit():
        value = f(X)
        primal, tangent = ad.jvp(f, (X,), (v,))
        batched = ad.vmap(f, 1, 1)(np.stack([X, -X], axis=1))
    close(value, reference["value"])
    close(primal, reference["value"])
    close(tangent, reference["tangent"])
    close(batched[:, 0], reference["value"])
    close(batched[:, 1], chain_numpy(N, -X, np.zeros(8))[0])


def test_linearize_vjp_grad(reference):
    f = chain(N)
    v = reference["v"]
    with low_recursion_limit():
        primal, f_lin = ad.linearize(f, X)
        tangent = f_lin(v)
        _, f_vjp = ad.vjp(f, X)
        (cotangent,) = f_vjp(np.ones(8))
        gradient = ad.grad(lambda x: ad.reduce_sum(f(x)))(X)
    close(primal, reference["value"])
    close(tangent, reference["tangent"])
    close(cotangent, reference["grad"])
    close(gradient, reference["grad"])


def evaluate(jaxpr: ad.Jaxpr, args: list) -> list:
    """Evaluate a jaxpr, running each nested xla_call's jaxpr the same way
    (instead of compiling it): a check of the staged jaxprs themselves."""
    env: dict = {}

    def read(atom):
        return atom.val if isinstance(atom, ad.Lit) else env[atom]

    env.update(zip(jaxpr.in_binders, args))
    for eqn in jaxpr.eqns:
        ins = [read(x) for x in eqn.inputs]
        if eqn.primitive is ad.xla_call_p:
            outs = evaluate(eqn.params["jaxpr"], ins)
        else:
            outs = ad.bind(eqn.primitive, *ins, **eqn.params)
            outs = outs if eqn.primitive.multiple_results else [outs]
        env.update(zip(eqn.out_binders, outs))
    return [read(x) for x in jaxpr.outs]


def test_jit_traced_and_lowered_at_full_size(reference):
    """jit's trace of the big chain, and of its gradient, staged (not
    compiled), type checked, lowered, and evaluated."""
    f = ad.jit(chain(N))
    with low_recursion_limit():
        jaxpr, consts, _ = ad.make_jaxpr(f, X)
        (call,) = jaxpr.eqns
        assert call.primitive.name == "xla_call"
        assert len(call.params["jaxpr"].eqns) == N
        module = ad.lower_jaxpr(jaxpr)
        text = str(module)
        out = evaluate(jaxpr, [*consts, X])
        # grad of jit: the jvp, partial evaluation and transposition of the
        # xla_call, all staged by the outer make_jaxpr.
        grad_jaxpr, grad_consts, _ = ad.make_jaxpr(
            ad.grad(lambda x: ad.reduce_sum(f(x))), X
        )
        ad.typecheck_jaxpr(grad_jaxpr)
        gradient = evaluate(grad_jaxpr, [*grad_consts, X])
        grad_module = ad.lower_jaxpr(grad_jaxpr)
    assert text.count("stablehlo.sine") == N // 5
    assert text.count("stablehlo.negate") == N // 5
    assert "call @" in text
    close(out[0], reference["value"])
    close(gradient[0], reference["grad"])
    assert str(grad_module).count("stablehlo.cosine") >= N // 5


def test_jit_compiled_and_run():
    """XLA compiles and runs a 2,000-primitive chain, and its gradient (the
    jit of a grad: one module)."""
    x, v = X, np.cos(3.0 * X)
    value, _ = chain_numpy(N_COMPILED, x, v)
    _, jacobian_t = chain_numpy(N_COMPILED, x, np.eye(8))
    with low_recursion_limit():
        out = ad.jit(chain(N_COMPILED))(x)
        gradient = ad.jit(ad.grad(lambda y: ad.reduce_sum(chain(N_COMPILED)(y))))(x)
    close(out, value)
    close(gradient, jacobian_t.sum(1))


def test_cond_with_big_branches(reference):
    """A cond whose branches are chains of 5,000 primitives each: run,
    differentiated, staged, printed and lowered."""
    f = chain(N)
    g = chain(N + 1)

    def h(x):
        return ad.cond(ad.reduce_sum(x) > 100.0, f, g, x)

    expected, _ = chain_numpy(N + 1, X, np.zeros(8))
    _, jacobian_t = chain_numpy(N + 1, X, np.eye(8))
    with low_recursion_limit():
        close(h(X), expected)
        close(ad.grad(lambda x: ad.reduce_sum(h(x)))(X), jacobian_t.sum(1))
        jaxpr, consts, _ = ad.make_jaxpr(h, X)
        text = str(jaxpr)
        module = str(ad.lower_jaxpr(jaxpr))
    assert len(text.splitlines()) > 2 * N
    assert "stablehlo.if" in module or "stablehlo.case" in module


@pytest.mark.parametrize(
    "name",
    [
        "make_jaxpr",
        "typecheck",
        "print",
        "eval_jaxpr",
        "jvp",
        "vmap",
        "linearize",
        "grad",
        "lower",
        "grad-of-jit-staged",
    ],
)
def test_program_costs_grow_linearly(name):
    """4x the primitives cost at most 5x the function calls."""

    def make_work(n: int) -> Callable[[], Any]:
        f = chain(n)
        if name == "make_jaxpr":
            return lambda: ad.make_jaxpr(f, X)
        jaxpr, consts, _ = ad.make_jaxpr(f, X)
        if name == "typecheck":
            return lambda: ad.typecheck_jaxpr(jaxpr)
        if name == "print":
            return lambda: str(jaxpr)
        if name == "eval_jaxpr":
            return lambda: ad.eval_jaxpr(jaxpr, [*consts, X])
        if name == "jvp":
            return lambda: ad.jvp(f, (X,), (X,))
        if name == "vmap":
            return lambda: ad.vmap(f)(np.stack([X, X]))
        if name == "linearize":
            return lambda: ad.linearize(f, X)[1](X)
        if name == "grad":
            return lambda: ad.grad(lambda x: ad.reduce_sum(f(x)))(X)
        if name == "lower":
            return lambda: ad.lower_jaxpr(jaxpr)
        jitted = ad.jit(f)
        return lambda: ad.make_jaxpr(ad.grad(lambda x: ad.reduce_sum(jitted(x))), X)

    assert_linear(make_work, 500)


# ---------------------------------------------------------------------------
# Pytrees of 3,000 leaves
# ---------------------------------------------------------------------------


def leaves_of(n: int, rng: np.random.Generator) -> list[np.ndarray]:
    return [rng.uniform(-1.0, 1.0, size=2) for _ in range(n)]


def balanced(leaves: list) -> dict:
    """dict -> list -> tuple -> dict, ten children each below the top dict,
    which has one per 1,000 leaves: a depth of four containers."""
    it = iter(leaves)
    return {
        f"k{a}": [
            tuple({f"d{c}": next(it) for c in range(10)} for _ in range(10))
            for _ in range(10)
        ]
        for a in range(len(leaves) // 1000)
    }


def deep(leaves: list, per_level: int = N_LEAVES // 50) -> list:
    """A list of ``per_level`` leaves followed by the next level: 50 levels."""
    tree: list = []
    for start in range(len(leaves) - per_level, -1, -per_level):
        tree = [*leaves[start : start + per_level], tree]
    return tree


STRUCTURES = {
    "list": lambda leaves: list(leaves),
    "dict": lambda leaves: {f"w{i:05d}": x for i, x in enumerate(leaves)},
    "balanced": balanced,
    "deep-50": deep,
}


def tree_sum_of_sin(tree: Any) -> Any:
    total = 0.0
    for leaf in ad.tree_flatten(tree)[0]:
        total = total + ad.reduce_sum(ad.sin(leaf))
    return total


def tree_map(fn: Callable, tree: Any) -> Any:
    leaves, treedef = ad.tree_flatten(tree)
    return ad.tree_unflatten(treedef, [fn(x) for x in leaves])


LOWERED = {"balanced"}  # the structure whose staged jit is also lowered


@pytest.mark.parametrize("structure", STRUCTURES)
def test_pytree_of_3000_leaves(structure):
    rng = np.random.default_rng(0)
    leaves = leaves_of(N_LEAVES, rng)
    tree = STRUCTURES[structure](leaves)
    with low_recursion_limit():
        flat, treedef = ad.tree_flatten(tree)
        assert len(flat) == N_LEAVES and treedef.num_leaves == N_LEAVES
        assert all(a is b for a, b in zip(flat, leaves))
        rebuilt = ad.tree_unflatten(treedef, flat)
        assert ad.tree_flatten(rebuilt)[1] == treedef
        str(treedef)
        hash(treedef)

        # Staged, not compiled: XLA takes seconds for thousands of parameters (see
        # test_jit_of_a_pytree_compiled_and_run for a compiled one).
        jitted_f = ad.jit(lambda t: tree_map(lambda x: ad.sin(x) * 2.0, t))
        jaxpr, consts, out_tree = ad.make_jaxpr(jitted_f, tree)
        assert out_tree == treedef
        if structure in LOWERED:
            module = str(ad.lower_jaxpr(jaxpr))
            assert module.count("stablehlo.sine") == N_LEAVES
        flat_out = evaluate(jaxpr, [*consts, *leaves])
        jitted = ad.tree_unflatten(out_tree, flat_out)
        gradient = ad.grad(tree_sum_of_sin)(tree)
        batched = ad.vmap(lambda t: tree_map(ad.cos, t))(tree)
        jvp_out = ad.jvp(tree_sum_of_sin, (tree,), (tree,))

    for out in (jitted, gradient, batched):
        assert ad.tree_flatten(out)[1] == treedef
    stacked = np.stack(leaves)
    close(np.stack(ad.tree_flatten(jitted)[0]), np.sin(stacked) * 2.0)
    close(np.stack(ad.tree_flatten(gradient)[0]), np.cos(stacked))
    close(np.stack(ad.tree_flatten(batched)[0]), np.cos(stacked))
    close(jvp_out[0], np.sin(stacked).sum())
    close(jvp_out[1], (np.cos(stacked) * stacked).sum())


def test_jit_of_a_pytree_compiled_and_run():
    """XLA compiles and runs jit of the balanced pytree at 1,000 leaves: the
    arguments, the outputs and the output tree of a compiled call."""
    leaves = leaves_of(1_000, np.random.default_rng(2))
    tree = balanced(leaves)
    with low_recursion_limit():
        out = ad.jit(lambda t: tree_map(lambda x: ad.sin(x) * 2.0, t))(tree)
    flat, treedef = ad.tree_flatten(out)
    assert treedef == ad.tree_flatten(tree)[1] and len(flat) == 1_000
    assert all(isinstance(x, ad.Array) for x in flat)
    close(np.stack(flat), np.sin(np.stack(leaves)) * 2.0)


@pytest.mark.parametrize("structure", ["list", "dict", "balanced"])
@pytest.mark.parametrize("name", ["flatten", "unflatten", "jit", "grad", "vmap"])
def test_pytree_costs_grow_linearly(structure, name):
    """4x the leaves cost at most 5x the function calls."""
    rng = np.random.default_rng(1)

    def make_work(n: int) -> Callable[[], Any]:
        leaves = leaves_of(n, rng)
        if structure == "balanced":  # same depth, wider at the bottom
            width = n // 100
            tree = {
                f"k{a}": [
                    tuple(leaves[(10 * a + b) * width : (10 * a + b + 1) * width])
                    for b in range(10)
                ]
                for a in range(10)
            }
        else:
            tree = STRUCTURES[structure](leaves)
        flat, treedef = ad.tree_flatten(tree)
        if name == "flatten":
            return lambda: ad.tree_flatten(tree)
        if name == "unflatten":
            return lambda: ad.tree_unflatten(treedef, flat)
        if name == "jit":
            return lambda: ad.make_jaxpr(ad.jit(lambda t: tree_map(ad.sin, t)), tree)
        if name == "grad":
            return lambda: ad.grad(tree_sum_of_sin)(tree)
        return lambda: ad.vmap(lambda t: tree_map(ad.cos, t))(tree)

    assert_linear(make_work, 500)
