"""Tests of Part 11: ``checkpoint`` (remat), policies, ``saved_residuals`` and
``dce_jaxpr``.

Each program is written once against a small namespace of operations and run
with autodidax and with JAX (float64, tests/conftest.py); values and
derivatives agree to 1e-9 under eval, jit, jvp, vmap, linearize, vjp, grad,
jit(grad), grad(grad) and hessian, with checkpoints inside scan, cond,
fori_loop and custom rules, nested in each other and around them, and under
every policy. The number (and types) of residuals each policy keeps on fixed
programs equals what JAX's ``saved_residuals`` reports; nothing_saveable
recomputes (equations counted in the backward jaxpr) and everything_saveable
does not; the lowering puts an optimization barrier where JAX's does;
``dce_jaxpr`` removes what it should, keeps effects, and the trimmed jaxpr
computes the used outputs of the original; every error the chapter promises.
"""

from __future__ import annotations

import functools
import math
import sys
from pathlib import Path
from types import SimpleNamespace

import jax
import jax.ad_checkpoint
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import raises_clearly as _raises_clearly
from jax._src.ad_checkpoint import saved_residuals as jax_saved_residuals

import autodidax as ad

pytestmark = pytest.mark.usefixtures("clean_interpreter_stack")

TOL = 1e-9
anp = ad.numpy_namespace

OURS = SimpleNamespace(
    checkpoint=ad.checkpoint, name=ad.checkpoint_name, policies=ad.checkpoint_policies,
    scan=ad.scan, cond=ad.cond, fori_loop=ad.fori_loop, sin=anp.sin, cos=anp.cos,
    tanh=anp.tanh, sum=anp.sum, jit=ad.jit, grad=ad.grad, vmap=ad.vmap, jvp=ad.jvp,
    vjp=ad.vjp, linearize=ad.linearize, hessian=ad.hessian,
    saved_residuals=ad.saved_residuals,
)  # fmt: skip
JAX = SimpleNamespace(
    checkpoint=jax.checkpoint, name=jax.ad_checkpoint.checkpoint_name,
    policies=jax.checkpoint_policies, scan=jax.lax.scan, cond=jax.lax.cond,
    fori_loop=jax.lax.fori_loop, sin=jnp.sin, cos=jnp.cos, tanh=jnp.tanh,
    sum=jnp.sum, jit=jax.jit, grad=jax.grad, vmap=jax.vmap, jvp=jax.jvp,
    vjp=jax.vjp, linearize=jax.linearize, hessian=jax.hessian,
    saved_residuals=jax_saved_residuals,
)  # fmt: skip

POLICIES = [
    None,
    "everything_saveable",
    "nothing_saveable",
    "dots_saveable",
    "dots_with_no_batch_dims_saveable",
    "save_only_these_names",
]


def policy_of(L, name):
    if name is None:
        return None
    policy = getattr(L.policies, name)
    return policy("h", "g") if name == "save_only_these_names" else policy


def still_works() -> None:
    assert float(ad.grad(ad.checkpoint(anp.sin))(0.0)) == 1.0


def raises_clearly(exc_type, match):
    return _raises_clearly(exc_type, match, still_works)


def close(a, b):
    a = jax.tree_util.tree_map(np.asarray, a)
    b = jax.tree_util.tree_map(np.asarray, b)
    assert jax.tree_util.tree_structure(a) == jax.tree_util.tree_structure(b)
    for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)):
        np.testing.assert_allclose(x, y, rtol=TOL, atol=TOL)


# ---------------------------------------------------------------------------
# Programs, written once for both libraries
# ---------------------------------------------------------------------------


def mlp(L, W1, W2, x):
    h = L.name(L.sin(x @ W1), "h")
    g = L.name(L.tanh(h @ W2), "g")
    return L.sum(L.sin(g) * g)


def with_control_flow(L, x):
    """checkpoints nested, around and inside cond, scan and fori_loop."""
    inner = L.checkpoint(lambda y: L.sin(y) * y)
    y = inner(x)
    y = L.cond(L.sum(y) > 0.0, L.cos, L.sin, y)
    y = L.scan(lambda c, _: (L.checkpoint(L.sin)(c) * 1.1, None), y, None, length=3)[0]
    y = L.fori_loop(0, 2, lambda i, c: L.tanh(c) + c, y)
    return L.sum(y * y)


def rnn(L, w, xs, checkpoint_body):
    def step(h, x):
        h = L.tanh(h * w + x)
        return h, h * h

    body = L.checkpoint(step) if checkpoint_body else step
    h, ys = L.scan(body, 0.5 * xs[0], xs)
    return L.sum(ys) + L.sum(h)


RNG = np.random.default_rng(11)
W1, W2, X = RNG.normal(size=(3, 4)), RNG.normal(size=(4, 2)), RNG.normal(size=(5, 3))
V = np.array([0.3, -1.1, 0.7])
SEQ = RNG.normal(size=(6, 3)) * 0.5


# ---------------------------------------------------------------------------
# Values and derivatives against JAX
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("policy", POLICIES)
def test_mlp_under_every_policy_agrees_with_jax(policy):
    def run(L):
        f = L.checkpoint(functools.partial(mlp, L), policy=policy_of(L, policy))
        g = L.grad(f, argnums=(0, 1, 2))
        return {
            "value": f(W1, W2, X),
            "grad": g(W1, W2, X),
            "jit(grad)": L.jit(g)(W1, W2, X),
            "vjp": L.vjp(f, W1, W2, X)[1](1.5),
            "jvp": L.jvp(f, (W1, W2, X), (W2[:3, :1] * np.ones((3, 4)), W2, X))[1],
        }

    close(run(OURS), run(JAX))


@pytest.mark.parametrize("policy", [None, "dots_saveable"])
def test_composite_program_every_transformation(policy):
    def run(L):
        f = L.checkpoint(
            functools.partial(with_control_flow, L), policy=policy_of(L, policy)
        )
        g = L.grad(f)
        _, f_lin = L.linearize(f, V)
        second_order = {"hessian": L.hessian(f)(V)} if policy is None else {}
        return {
            **second_order,
            "value": f(V),
            "grad": g(V),
            "jit(grad)": L.jit(g)(V),
            "grad(jit)": L.grad(L.jit(f))(V),
            "vmap(grad)": L.vmap(g)(np.stack([V, 2 * V, -V])),
            "linearize": f_lin(V * 0.5),
        }

    close(run(OURS), run(JAX))


@pytest.mark.parametrize("checkpoint_body", [False, True])
def test_checkpointed_scan_body(checkpoint_body):
    def run(L):
        f = functools.partial(rnn, L, checkpoint_body=checkpoint_body)
        g = L.grad(f, argnums=(0, 1))
        return {
            "grad": g(0.8, SEQ),
            "jit(grad)": L.jit(g)(0.8, SEQ),
            "grad(grad)": L.grad(L.grad(f))(0.8, SEQ),
            "vmap": L.vmap(L.grad(f), (0, None))(np.array([0.2, 0.9]), SEQ),
        }

    close(run(OURS), run(JAX))


def test_checkpoint_inside_jit_inside_grad_and_custom_rules():
    @ad.custom_jvp
    def ours_safe(x):
        return anp.sin(x)

    ours_safe.defjvp(lambda p, t: (anp.sin(p[0]), 2.0 * t[0]))

    @jax.custom_jvp
    def jax_safe(x):
        return jnp.sin(x)

    jax_safe.defjvp(lambda p, t: (jnp.sin(p[0]), 2.0 * t[0]))

    @ad.custom_vjp
    def ours_cv(x):
        return anp.sin(x)

    ours_cv.defvjp(lambda x: (anp.sin(x), x), lambda r, ct: (3.0 * ct * r,))

    @jax.custom_vjp
    def jax_cv(x):
        return jnp.sin(x)

    jax_cv.defvjp(lambda x: (jnp.sin(x), x), lambda r, ct: (3.0 * ct * r,))

    def run(L, safe, cv):
        f = L.checkpoint(lambda x: L.sum(safe(x) * cv(x) * L.jit(L.cos)(x)))
        return L.grad(f)(V), L.grad(L.jit(f))(V), L.jit(L.grad(f))(V)

    close(run(OURS, ours_safe, ours_cv), run(JAX, jax_safe, jax_cv))


def test_decorator_forms_static_argnums_and_pytrees():
    @ad.checkpoint
    def plain(x):
        return anp.sin(x) * x

    @functools.partial(ad.remat, policy=ad.checkpoint_policies.dots_saveable)
    def with_policy(p, x):
        return anp.sum(anp.sin(x @ p["w"]) + p["b"])

    @functools.partial(ad.checkpoint, static_argnums=(1,))
    def powered(x, n):
        for _ in range(n):  # n is a Python int: static
            x = anp.sin(x)
        return x

    @functools.partial(jax.checkpoint, static_argnums=(1,))
    def jax_powered(x, n):
        for _ in range(n):
            x = jnp.sin(x)
        return x

    assert ad.remat is ad.checkpoint
    assert plain.__name__ == "plain"
    close(ad.grad(plain)(0.4), jax.grad(jax.checkpoint(lambda x: jnp.sin(x) * x))(0.4))
    params = {"w": W1, "b": np.float64(0.5)}
    jax_f = jax.checkpoint(
        lambda p, x: jnp.sum(jnp.sin(x @ p["w"]) + p["b"]),
        policy=jax.checkpoint_policies.dots_saveable,
    )
    close(ad.grad(with_policy)(params, X), jax.grad(jax_f)(params, X))
    close(ad.grad(powered)(0.3, 3), jax.grad(jax_powered)(0.3, 3))
    close(ad.grad(powered, argnums=0)(0.3, -1 + 3), jax.grad(jax_powered)(0.3, 2))


def test_traced_once_per_signature():
    calls = []

    @ad.checkpoint
    def f(x):
        calls.append(1)
        return anp.sin(x)

    f(1.0), f(2.0), ad.grad(f)(3.0)
    assert len(calls) == 1
    f(np.ones(3))
    assert len(calls) == 2


def test_checkpoint_name_is_identity_under_every_transformation():
    f = lambda x: ad.checkpoint_name(anp.sin(x), "s") * x  # noqa: E731
    g = lambda x: jax.ad_checkpoint.checkpoint_name(jnp.sin(x), "s") * x  # noqa: E731
    close(f(V), g(V))
    close(ad.jit(f)(V), g(V))
    close(ad.vmap(f)(V), jax.vmap(g)(V))
    close(ad.jacfwd(f)(V), jax.jacfwd(g)(V))
    close(ad.jacrev(f)(V), jax.jacrev(g)(V))
    tree = ad.checkpoint_name({"a": V, "b": (1.0, V)}, "t")
    close(tree, {"a": V, "b": (1.0, V)})
    jaxpr = ad.make_jaxpr(lambda x: ad.checkpoint_name(x, "s"), V)[0]
    assert [(e.primitive.name, e.params) for e in jaxpr.eqns] == [
        ("name", {"name": "s"})
    ]


# ---------------------------------------------------------------------------
# Residuals, against jax's saved_residuals
# ---------------------------------------------------------------------------


def residual_types(L, f, *args):
    with jax.enable_x64(True):
        found = L.saved_residuals(f, *args)
    return sorted((tuple(a.shape), np.dtype(a.dtype).name) for a, _ in found)


def mlp_sin(L, W1, W2, x):
    h = L.name(L.sin(x @ W1), "h")
    return L.sum(L.sin(h @ W2))


@pytest.mark.parametrize("policy", ["plain", *POLICIES])
def test_each_policy_keeps_as_many_residuals_as_jax(policy):
    def f(L):
        program = functools.partial(mlp_sin, L)
        if policy == "plain":
            return program
        return L.checkpoint(program, policy=policy_of(L, policy))

    ours, theirs = (
        residual_types(OURS, f(OURS), W1, W2, X),
        residual_types(JAX, f(JAX), W1, W2, X),
    )
    assert ours == theirs
    expected = {"plain": 6, None: 3, "everything_saveable": 6, "nothing_saveable": 3}
    expected.update(dots_saveable=5, dots_with_no_batch_dims_saveable=5)
    expected.update(save_only_these_names=4)
    assert len(ours) == expected[policy]


def test_descriptions_follow_jax():
    f = ad.checkpoint(
        functools.partial(mlp_sin, OURS),
        policy=ad.checkpoint_policies.save_only_these_names("h"),
    )
    g = jax.checkpoint(
        functools.partial(mlp_sin, JAX),
        policy=jax.checkpoint_policies.save_only_these_names("h"),
    )

    def names(found):  # JAX adds "from file:line (function)" to equation outputs
        return [(tuple(a.shape), s.split(" from ")[0]) for a, s in found]

    ours = ad.saved_residuals(f, W1, W2, X)
    with jax.enable_x64(True):
        theirs = jax_saved_residuals(g, W1, W2, X)
    assert names(ours) == names(theirs)
    assert [s for _, s in ours] == [
        "from the argument W1",
        "from the argument W2",
        "from the argument x",
        "named 'h'",
    ]


def test_tanh_saves_one_value_where_jax_saves_two():
    """Our tanh's JVP multiplies the tangent by 1 - y*y computed at once and
    saves that; JAX's saves y and 1 - y. The chapter's programs use sin."""

    def f(L):
        return lambda x: L.sum(L.tanh(x))

    ours = ad.saved_residuals(f(OURS), V)
    with jax.enable_x64(True):
        theirs = jax_saved_residuals(f(JAX), V)
    assert [s for _, s in ours] == ["output of sub"]
    assert [s.split(" from ")[0] for _, s in theirs] == [
        "output of tanh",
        "output of sub",
    ]


def test_deep_chain_residual_bytes_equal_jax():
    def deep(L):
        def f(Ws, x):
            for W in Ws:
                x = L.sin(x @ W)
            return L.sum(x)

        return f

    Ws = [RNG.normal(size=(8, 8)) for _ in range(5)]
    x = RNG.normal(size=(4, 8))
    assert residual_types(OURS, deep(OURS), Ws, x) == residual_types(
        JAX, deep(JAX), Ws, x
    )
    found = ad.saved_residuals(deep(OURS), Ws, x)
    assert ad.residual_bytes(found) == (2 * 5 - 1) * 4 * 8 * 8


def trip_count_losses(L, n):
    k = math.isqrt(n)

    def plain(w, h0):
        return L.sum(L.scan(lambda h, _: (L.sin(h * w), None), h0, None, length=n)[0])

    def body(w, h0):
        step = L.checkpoint(lambda h, _: (L.sin(h * w), None))
        return L.sum(L.scan(step, h0, None, length=n)[0])

    def sqrt_n(w, h0):
        def chunk(h, _):
            return L.scan(lambda h, _: (L.sin(h * w), None), h, None, length=k)[0], None

        return L.sum(L.scan(L.checkpoint(chunk), h0, None, length=k)[0])

    return [plain, body, sqrt_n]


@pytest.mark.parametrize("n", [16, 64, 256])
def test_memory_against_trip_count_equals_jax(n):
    w0, h0 = np.linspace(0.5, 1.5, 8), np.linspace(-1.0, 1.0, 8)
    ours = [ad.saved_residuals(f, w0, h0) for f in trip_count_losses(OURS, n)]
    with jax.enable_x64(True):
        theirs = [jax_saved_residuals(f, w0, h0) for f in trip_count_losses(JAX, n)]
    ours_bytes = [ad.residual_bytes(r) for r in ours]
    assert ours_bytes == [ad.residual_bytes(r) for r in theirs]
    assert ours_bytes == [2 * n * 8 * 8, n * 8 * 8, math.isqrt(n) * 8 * 8]
    for ours_f, jax_f in zip(trip_count_losses(OURS, n), trip_count_losses(JAX, n)):
        close(
            ad.grad(ours_f, argnums=(0, 1))(w0, h0),
            jax.grad(jax_f, argnums=(0, 1))(w0, h0),
        )


# ---------------------------------------------------------------------------
# Recomputation is visible; lowering
# ---------------------------------------------------------------------------


def count_eqns(jaxpr, names):
    found = 0
    for eqn in jaxpr.eqns:
        found += eqn.primitive.name in names
        for p in eqn.params.values():
            found += count_eqns(p, names) if isinstance(p, ad.Jaxpr) else 0
    return found


def test_nothing_saveable_recomputes_and_everything_saveable_does_not():
    def two_sins(x):
        return anp.sin(anp.sin(x))

    def backward(f):
        _, lin_jaxpr, residuals = ad.linearize_flat(lambda x: [f(x)], [np.float64(0.5)])
        return lin_jaxpr, residuals

    plain_lin, plain_res = backward(two_sins)
    assert count_eqns(plain_lin, {"sin", "cos"}) == 0 and len(plain_res) == 2
    none_lin, none_res = backward(ad.checkpoint(two_sins))
    assert count_eqns(none_lin, {"sin"}) == 1  # the second sin was removed by DCE
    assert count_eqns(none_lin, {"cos"}) == 2
    assert [float(r) for r in none_res] == [0.5]
    every = ad.checkpoint(two_sins, policy=ad.checkpoint_policies.everything_saveable)
    every_lin, every_res = backward(every)
    assert count_eqns(every_lin, {"sin", "cos"}) == 0 and len(every_res) == 2
    # the whole gradient: nothing_saveable has one more transcendental equation
    grad_eqns = [
        count_eqns(ad.make_jaxpr(ad.grad(f), 0.5)[0], {"sin", "cos"})
        for f in [two_sins, ad.checkpoint(two_sins), every]
    ]
    assert grad_eqns == [4, 5, 4]


def test_lowering_has_an_optimization_barrier_where_jax_does():
    f = lambda x: anp.sin(anp.sin(x))  # noqa: E731
    for prevent_cse, expected in [(True, True), (False, False)]:
        g = ad.checkpoint(f, prevent_cse=prevent_cse)
        text = str(ad.lower_jaxpr(ad.make_jaxpr(ad.grad(g), 0.5)[0]))
        assert ("optimization_barrier" in text) is expected
        jax_g = jax.checkpoint(lambda x: jnp.sin(jnp.sin(x)), prevent_cse=prevent_cse)
        jax_text = jax.jit(jax.grad(jax_g)).lower(0.5).as_text()
        assert ("optimization_barrier" in jax_text) is expected
    # an undifferentiated checkpoint has none, in either library
    text = str(ad.lower_jaxpr(ad.make_jaxpr(ad.checkpoint(f), 0.5)[0]))
    assert "optimization_barrier" not in text
    jax_f = jax.checkpoint(lambda x: jnp.sin(jnp.sin(x)))
    assert "optimization_barrier" not in jax.jit(jax_f).lower(0.5).as_text()


def test_partial_eval_jaxpr_rule_splits_a_checkpoint_inside_jit():
    f = ad.checkpoint(lambda x: anp.sin(anp.sin(x)))
    jvp_jaxpr = ad.make_jaxpr(lambda x, t: ad.jvp(f, (x,), (t,)), 0.5, 0.5)[0]
    known, unknown, out_unknowns, num_res = ad.partial_eval_jaxpr(
        jvp_jaxpr, [False, True]
    )
    assert out_unknowns == [False, True]
    (eqn,) = [e for e in unknown.eqns if e.primitive is ad.checkpoint_p]
    assert (
        eqn.params["differentiated"] and count_eqns(eqn.params["jaxpr"], {"cos"}) == 2
    )
    # the residual is the input itself
    assert num_res == 1 and known.outs[-1] is known.in_binders[0]
    x, t = 0.5, 1.25
    (y,) = ad.eval_jaxpr(known, [x])[:1]
    close(
        ad.eval_jaxpr(unknown, [x, t])[0],
        jax.jvp(lambda x: jnp.sin(jnp.sin(x)), (x,), (t,))[1],
    )
    close(y, np.sin(np.sin(x)))


def test_cost_rule_counts_the_body():
    f = lambda x: anp.sin(x @ x)  # noqa: E731
    m = np.ones((4, 4))
    assert ad.cost_analysis(ad.checkpoint(f), m) == ad.cost_analysis(f, m)


# ---------------------------------------------------------------------------
# Dead-code elimination
# ---------------------------------------------------------------------------


def check_dce(f, args, used):
    """dce_jaxpr's jaxpr computes the used outputs of the original, from the
    inputs it reports as used."""
    jaxpr, consts, _ = ad.make_jaxpr(f, *args)
    full = ad.eval_jaxpr(jaxpr, [*consts, *args])
    trimmed, used_inputs = ad.dce_jaxpr(jaxpr, used)
    ad.typecheck_jaxpr(trimmed)
    inputs = [x for x, u in zip([*consts, *args], used_inputs) if u]
    close(ad.eval_jaxpr(trimmed, inputs), [o for o, u in zip(full, used) if u])
    return jaxpr, trimmed, used_inputs


def test_dce_straight_line_and_unused_inputs():
    f = lambda x, y: (anp.sin(x), anp.cos(y) * 2.0)  # noqa: E731
    jaxpr, trimmed, used_inputs = check_dce(f, (0.3, 0.4), [True, False])
    assert used_inputs == [True, False]
    assert [e.primitive.name for e in trimmed.eqns] == ["sin"]
    _, _, used_inputs = check_dce(f, (0.3, 0.4), [False, False])
    assert used_inputs == [False, False]
    assert ad.dce_jaxpr(jaxpr, [False, False], instantiate=True)[1] == [True, True]


def test_dce_inside_jit_cond_and_checkpoint():
    def f(x):
        a, b = ad.jit(lambda x: (anp.sin(x), anp.cos(x)))(x)
        c, d = ad.cond(x > 0.0, lambda x: (x * 2.0, anp.sin(x)), lambda x: (x, x), x)
        e, g = ad.checkpoint(lambda x: (anp.exp(x), anp.log(x)))(x)
        return a, b, c, d, e, g

    jaxpr, trimmed, _ = check_dce(f, (0.7,), [True, False, True, False, False, True])
    names = [e.primitive.name for e in trimmed.eqns]
    assert names.count("xla_call") == 1 and names.count("checkpoint") == 1
    for eqn in trimmed.eqns:
        if eqn.primitive.name == "xla_call":
            assert count_eqns(eqn.params["jaxpr"], {"cos"}) == 0
        if eqn.primitive.name == "cond":
            assert count_eqns(eqn.params["true_jaxpr"], {"sin"}) == 0
            assert len(eqn.out_binders) == 1
        if eqn.primitive.name == "checkpoint":
            assert count_eqns(eqn.params["jaxpr"], {"exp"}) == 0


def test_dce_drops_loop_carries_by_fixed_point():
    def f(x):
        def step(carry, _):
            i, a, b = carry  # b feeds a on the next trip; i feeds nothing used
            return (i + 1.0, anp.sin(a) + b, b * 2.0), a

        (i, a, b), ys = ad.scan(step, (0.0, x, x), None, length=4)
        return i, a, b, ys

    jaxpr, trimmed, _ = check_dce(f, (0.3,), [False, True, False, False])
    (loop,) = [e for e in trimmed.eqns if e.primitive is ad.scan_p]
    assert loop.params["num_carry"] == 2  # a and b; the counter is gone
    _, trimmed, _ = check_dce(f, (0.3,), [False, False, False, True])
    (loop,) = [e for e in trimmed.eqns if e.primitive is ad.scan_p]
    assert loop.params["num_carry"] == 2 and len(loop.out_binders) == 3

    def g(x):
        def body(c):
            i, a, junk = c
            return i + 1, anp.sin(a), junk * 3.0

        return ad.while_loop(lambda c: c[0] < 3, body, (0, x, x))

    _, trimmed, _ = check_dce(g, (0.3,), [False, True, False])
    (loop,) = [e for e in trimmed.eqns if e.primitive is ad.while_p]
    assert len(loop.out_binders) == 2  # the counter (read by cond) and a


def test_dce_keeps_effects(capsys):
    def f(x):
        ad.debug.print("x = {}", x)

        def body(c, _):
            ad.debug.print("trip {}", c)
            return c + 1.0, None

        ad.scan(body, x, None, length=2)
        ad.cond(x > 0.0, lambda x: ad.debug.print("pos {}", x) or x, lambda x: x, x)
        ad.jit(lambda x: ad.debug.print("jit {}", x) or anp.sin(x))(x)
        return x * 2.0

    jaxpr, consts, _ = ad.make_jaxpr(f, 1.0)
    trimmed, _ = ad.dce_jaxpr(jaxpr, [True])
    kept = [e.primitive.name for e in trimmed.eqns]
    assert kept.count("debug_print") == 1
    assert {"scan", "cond", "xla_call"} <= set(kept)
    capsys.readouterr()
    ad.eval_jaxpr(trimmed, [*consts, 1.0])
    out = capsys.readouterr().out
    for line in ["x = 1.0", "trip 1.0", "trip 2.0", "pos 1.0", "jit 1.0"]:
        assert line in out
    pure = ad.make_jaxpr(
        lambda x: (ad.scan(lambda c, _: (c + 1.0, None), x, None, 2), x)[1], 1.0
    )[0]
    assert ad.dce_jaxpr(pure, [True])[0].eqns == []


def test_dce_keeps_custom_calls_whole():
    @ad.custom_jvp
    def two(x):
        return anp.sin(x), anp.cos(x)

    two.defjvp(lambda p, t: (two(*p), (t[0], t[0])))
    jaxpr, trimmed, _ = check_dce(lambda x: two(x), (0.3,), [True, False])
    (eqn,) = trimmed.eqns
    assert eqn.primitive is ad.custom_jvp_call_p and len(eqn.out_binders) == 2
    assert ad.dce_jaxpr(jaxpr, [False, False])[0].eqns == []


def test_dce_rules_registry():
    for prim in [ad.xla_call_p, ad.cond_p, ad.scan_p, ad.while_p, ad.checkpoint_p]:
        assert prim in ad.dce_rules
    assert {ad.custom_jvp_call_p, ad.custom_vjp_call_p} <= set(ad.dce_rules)
    assert ad.debug_print_p in ad.effectful_primitives


# ---------------------------------------------------------------------------
# Errors
# ---------------------------------------------------------------------------


def test_checkpoint_of_a_non_callable():
    with raises_clearly(TypeError, "checkpoint: fun must be a function, got float 3.0"):
        ad.checkpoint(3.0)


@pytest.mark.parametrize("policy", ["dots_saveable", 3, ["x"]])
def test_unknown_policy_is_refused_when_checkpoint_is_called(policy):
    with raises_clearly(TypeError, "checkpoint: policy must be None or a function"):
        ad.checkpoint(anp.sin, policy=policy)
    if policy == "dots_saveable":
        with pytest.raises(
            TypeError, match="did you mean checkpoint_policies.dots_saveable"
        ):
            ad.checkpoint(anp.sin, policy=policy)


def test_static_argnums_out_of_range_and_of_the_wrong_type():
    f = ad.checkpoint(lambda x, n: x * n, static_argnums=2)
    with raises_clearly(ValueError, "static_argnums 2 is out of range"):
        f(1.0, 2)
    with raises_clearly(TypeError, "static_argnums must be an int or a tuple of ints"):
        ad.checkpoint(anp.sin, static_argnums="n")


def test_checkpoint_name_errors():
    with raises_clearly(TypeError, "checkpoint_name: name must be a str, got int 7"):
        ad.checkpoint_name(1.0, 7)
    with raises_clearly(TypeError, "checkpoint_name 'h'"):
        ad.checkpoint_name("activations", "h")


# ---------------------------------------------------------------------------
# The benchmark runs
# ---------------------------------------------------------------------------


def test_bench_checkpoint_quick_run(capsys):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
    import bench_checkpoint

    report = bench_checkpoint.main(["--quick", "--steps", "4", "--repeats", "1"])
    assert [row["scheme"] for row in report["rows"]] == list(bench_checkpoint.SCHEMES)
    for row in report["rows"]:
        assert row["same_bytes"] and row["max_abs_grad_difference"] < TOL
    assert "checkpointed body" in capsys.readouterr().out


def test_policy_sees_a_nested_jit_as_one_equation():
    """The chapter: with dots_saveable, a product inside a jit inside a
    checkpoint is recomputed by ours (JAX saves it: tests/test_jax_claims.py)."""
    W = np.ones((3, 3))
    f = lambda x: anp.sum(anp.sin(ad.jit(lambda x: x @ W)(x)))  # noqa: E731
    g = ad.checkpoint(f, policy=ad.checkpoint_policies.dots_saveable)
    sources = [s for _, s in ad.saved_residuals(g, np.ones((2, 3)))]
    assert not any(s.startswith("output of") for s in sources)
    close(ad.grad(g)(np.ones((2, 3))), ad.grad(f)(np.ones((2, 3))))


def test_checkpoint_in_while_loop_body_batched_axes_and_keywords():
    def run(L, while_loop):
        step = L.checkpoint(lambda c, scale=1.0: L.sin(c) * scale)

        def f(x):
            return while_loop(
                lambda c: c[0] < 3, lambda c: (c[0] + 1, step(c[1])), (0, x)
            )[1]

        def g(x, y):
            return L.checkpoint(lambda x, y: L.sin(x) * y)(x, y=y)

        mat = np.arange(6.0).reshape(2, 3) / 5
        return {
            "jvp while": L.jvp(f, (V,), (V * 0.5,)),
            "vmap axis 1": L.vmap(L.checkpoint(lambda r: L.sin(r) * r), in_axes=1)(mat),
            "keywords": L.grad(g, argnums=(0, 1))(0.4, 1.5),
            "keyword default": L.grad(lambda x: step(x, scale=2.0))(0.3),
        }

    close(run(OURS, ad.while_loop), run(JAX, jax.lax.while_loop))
