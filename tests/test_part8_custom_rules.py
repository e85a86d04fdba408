"""Tests of Part 8: custom derivative rules, ``custom_jvp`` and ``custom_vjp``.

Each program is written once against a small namespace of operations and
built twice: with autodidax's ``custom_jvp``/``custom_vjp`` and with JAX's.
Results must agree to 1e-9 in float64 (tests/conftest.py switches JAX's x64
mode on) under eval, jit, grad, jvp, vmap and their compositions (jit(grad),
grad(jit), vmap(grad), jit(vmap(grad)), grad(grad), vmap(jvp), linearize,
grad inside cond). Several rules are deliberately *not* the derivative, so
agreement shows that the rule, not the function, was differentiated. Around
that: the jaxprs (one equation per call, the rule replacing it under jvp, a
custom_lin in linear jaxprs), the registries, and every error the chapter
promises.
"""

from __future__ import annotations

import functools
from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import raises_clearly

import autodidax as ad

TOL = 1e-9
F64 = np.float64
V3 = np.array([1.0, -2.0, 0.5])

pytestmark = pytest.mark.usefixtures("clean_interpreter_stack")

OURS = SimpleNamespace(
    custom_jvp=ad.custom_jvp,
    custom_vjp=ad.custom_vjp,
    where=ad.select,
    exp=ad.exp,
    log=ad.log,
    sin=ad.sin,
    cos=ad.cos,
    maximum=ad.maximum,
    total=lambda x: ad.reduce_sum(x, 0),
    cond=ad.cond,
    jit=ad.jit,
    grad=ad.grad,
    jvp=ad.jvp,
    vmap=ad.vmap,
    linearize=ad.linearize,
)
JAX = SimpleNamespace(
    custom_jvp=jax.custom_jvp,
    custom_vjp=jax.custom_vjp,
    where=jnp.where,
    exp=jnp.exp,
    log=jnp.log,
    sin=jnp.sin,
    cos=jnp.cos,
    maximum=jnp.maximum,
    total=lambda x: jnp.sum(x, 0),
    cond=jax.lax.cond,
    jit=jax.jit,
    grad=jax.grad,
    jvp=jax.jvp,
    vmap=jax.vmap,
    linearize=jax.linearize,
)


def host(x):
    return np.asarray(x, dtype=F64)


def close(ours, theirs) -> None:
    ours_leaves = jax.tree_util.tree_leaves(ours)
    theirs_leaves = jax.tree_util.tree_leaves(theirs)
    assert len(ours_leaves) == len(theirs_leaves), (ours, theirs)
    for a, b in zip(ours_leaves, theirs_leaves):
        a, b = host(a), host(b)
        assert a.shape == b.shape, (a, b)
        assert np.allclose(a, b, rtol=TOL, atol=TOL, equal_nan=True), (a, b)


# ---------------------------------------------------------------------------
# Programs: each builds a scalar function of a scalar with namespace m
# ---------------------------------------------------------------------------


def softplus(m):
    """The chapter's softplus: a select-based function, the logistic rule."""

    @m.custom_jvp
    def f(x):
        return m.where(x > 30.0, x, m.log(1.0 + m.exp(x)))

    @f.defjvp
    def f_jvp(primals, tangents):
        (x,), (t,) = primals, tangents
        return f(x), t * (1.0 / (1.0 + m.exp(-x)))

    return f


def wrong_slope(m):
    """sin, with a rule claiming the derivative is x * x (not cos x)."""

    @m.custom_jvp
    def f(x):
        return m.sin(x)

    @f.defjvp
    def f_jvp(primals, tangents):
        (x,), (t,) = primals, tangents
        return f(x), t * (x * x)

    return lambda x: f(x) * 2.0 + x


def nondiff_power(m):
    """x ** k with k in nondiff_argnums, a rule 1.5 times the derivative."""

    @functools.partial(m.custom_jvp, nondiff_argnums=(0,))
    def f(k, x):
        return x**k

    @f.defjvp
    def f_jvp(k, primals, tangents):
        (x,), (t,) = primals, tangents
        return f(k, x), t * (1.5 * k) * x ** (k - 1)

    return lambda x: f(3, x) + f(2, x * 0.5)


def pytree_jvp(m):
    """A dict in, (scalar, [scalar]) out; the rule is the true derivative
    except a factor 0.75 on the second output."""

    @m.custom_jvp
    def f(params):
        return params["a"] * m.sin(params["w"]), [params["a"] * m.cos(params["w"])]

    @f.defjvp
    def f_jvp(primals, tangents):
        ((p,), (t,)) = primals, tangents
        a, w, da, dw = p["a"], p["w"], t["a"], t["w"]
        first = da * m.sin(w) + a * m.cos(w) * dw
        second = (da * m.cos(w) - a * m.sin(w) * dw) * 0.75
        return f(p), (first, [second])

    def g(x):
        first, (second,) = f({"a": x * 0.5 + 1.0, "w": x})
        return first + second * 2.0

    return g


def closes_over_array(m):
    """A function using a closed-over vector (a constant of its jaxpr)."""
    c = np.array([1.0, 2.0, -0.5])

    @m.custom_jvp
    def f(x):
        return m.total(m.sin(x * c))

    @f.defjvp
    def f_jvp(primals, tangents):
        (x,), (t,) = primals, tangents
        return f(x), t * m.total(m.cos(x * c) * c) * 0.5  # half the derivative

    return f


def clip_gradient(m):
    """The chapter's gradient clipping, bound in nondiff_argnums."""

    @functools.partial(m.custom_vjp, nondiff_argnums=(1,))
    def clip(x, bound):
        return x

    def clip_fwd(x, bound):
        return x, None

    def clip_bwd(bound, res, ct):
        return (m.maximum(-bound, -m.maximum(-bound, -ct)),)

    clip.defvjp(clip_fwd, clip_bwd)
    return lambda x: clip(x * 1.5, 2.0) ** 3 + m.sin(x)


def pytree_vjp(m):
    """A dict in, a pair out, a tuple of residuals; bwd scales the cotangent
    of ``w`` by 1.25, so it is not the true backward pass."""

    def plain(params):
        return params["a"] * m.sin(params["w"]), params["a"] * m.cos(params["w"])

    f = m.custom_vjp(plain)

    def fwd(params):
        a, w = params["a"], params["w"]
        return plain(params), (a, m.sin(w), m.cos(w))

    def bwd(res, cts):
        a, s, c = res
        ct_sin, ct_cos = cts
        return (
            {"a": ct_sin * s + ct_cos * c, "w": (ct_sin * c - ct_cos * s) * a * 1.25},
        )

    f.defvjp(fwd, bwd)

    def g(x):
        first, second = f({"a": x * 0.5 + 1.0, "w": x})
        return first + second * 2.0

    return g


def vjp_with_array_residual(m):
    """Residuals that are vectors; bwd is the true backward pass."""
    c = np.array([1.0, 2.0, -0.5])

    @m.custom_vjp
    def f(x):
        return m.total(m.sin(x * c))

    def fwd(x):
        return f(x), m.cos(x * c) * c

    def bwd(res, ct):
        return (ct * m.total(res),)

    f.defvjp(fwd, bwd)
    return lambda x: f(x) * f(x * 0.5)


JVP_PROGRAMS = {
    "softplus": softplus,
    "wrong_slope": wrong_slope,
    "nondiff_power": nondiff_power,
    "pytree_jvp": pytree_jvp,
    "closes_over_array": closes_over_array,
}
VJP_PROGRAMS = {
    "clip_gradient": clip_gradient,
    "pytree_vjp": pytree_vjp,
    "vjp_with_array_residual": vjp_with_array_residual,
}
PROGRAMS = {**JVP_PROGRAMS, **VJP_PROGRAMS}
POINTS = [0.3, -1.7, 2.5]
XS = np.array(POINTS)


def in_cond(m, g):
    return lambda x: m.cond(x > 0.0, g, lambda y: y * 3.0, x)


# Transformations of a scalar function g, written once for both namespaces.
TRANSFORMS = {
    "eval": lambda m, g: [g(x) for x in POINTS],
    "jit": lambda m, g: [m.jit(g)(x) for x in POINTS],
    "grad": lambda m, g: [m.grad(g)(x) for x in POINTS],
    "jit(grad)": lambda m, g: [m.jit(m.grad(g))(x) for x in POINTS],
    "grad(jit)": lambda m, g: [m.grad(m.jit(g))(x) for x in POINTS],
    "vmap": lambda m, g: m.vmap(g)(XS),
    "vmap(grad)": lambda m, g: m.vmap(m.grad(g))(XS),
    "jit(vmap(grad))": lambda m, g: m.jit(m.vmap(m.grad(g)))(XS),
    "vmap(jit(grad))": lambda m, g: m.vmap(m.jit(m.grad(g)))(XS),
    "grad(sum(vmap))": lambda m, g: m.grad(lambda v: m.total(m.vmap(g)(v)))(XS),
    "grad(grad)": lambda m, g: [m.grad(m.grad(g))(x) for x in POINTS],
    "grad in cond": lambda m, g: [m.grad(in_cond(m, g))(x) for x in POINTS],
    "jit(grad in cond)": lambda m, g: [m.jit(m.grad(in_cond(m, g)))(x) for x in POINTS],
}
FORWARD_TRANSFORMS = {
    "jvp": lambda m, g: [m.jvp(g, (x,), (0.7,)) for x in POINTS],
    "jit(jvp)": lambda m, g: [
        m.jit(lambda x: m.jvp(g, (x,), (0.7,)))(x) for x in POINTS
    ],
    "jvp(jit)": lambda m, g: [m.jvp(m.jit(g), (x,), (0.7,)) for x in POINTS],
    "vmap(jvp)": lambda m, g: m.vmap(lambda x: m.jvp(g, (x,), (0.7,)))(XS),
    "jvp(vmap)": lambda m, g: m.jvp(m.vmap(g), (XS,), (XS * 0.5,)),
    "linearize": lambda m, g: [m.linearize(g, x)[1](0.7) for x in POINTS],
    "jvp(grad)": lambda m, g: [m.jvp(m.grad(g), (x,), (0.7,)) for x in POINTS],
}


@pytest.mark.parametrize("transform", list(TRANSFORMS))
@pytest.mark.parametrize("program", list(PROGRAMS))
def test_agrees_with_jax(program: str, transform: str) -> None:
    build, run = PROGRAMS[program], TRANSFORMS[transform]
    close(run(OURS, build(OURS)), run(JAX, build(JAX)))


@pytest.mark.parametrize("transform", list(FORWARD_TRANSFORMS))
@pytest.mark.parametrize("program", list(JVP_PROGRAMS))
def test_forward_mode_agrees_with_jax(program: str, transform: str) -> None:
    build, run = JVP_PROGRAMS[program], FORWARD_TRANSFORMS[transform]
    close(run(OURS, build(OURS)), run(JAX, build(JAX)))


@pytest.mark.parametrize("program", ["clip_gradient", "pytree_vjp"])
def test_jvp_of_grad_of_custom_vjp_agrees_with_jax(program: str) -> None:
    """Forward over reverse: bwd runs under the outer JVP, which is fine."""
    run = FORWARD_TRANSFORMS["jvp(grad)"]
    close(run(OURS, PROGRAMS[program](OURS)), run(JAX, PROGRAMS[program](JAX)))


def test_jvp_of_grad_where_fwd_calls_the_function_fails_like_jax() -> None:
    """A fwd that calls the custom_vjp function itself runs it under the outer
    JVP: forward mode of a custom_vjp function, refused by both."""
    run = FORWARD_TRANSFORMS["jvp(grad)"]
    with pytest.raises(TypeError, match="can't apply forward-mode"):
        run(JAX, vjp_with_array_residual(JAX))
    with raises_clearly(ad.CustomVJPForwardModeError, "custom_vjp", then=lambda: None):
        run(OURS, vjp_with_array_residual(OURS))


@pytest.mark.parametrize("program", ["wrong_slope", "nondiff_power", "pytree_vjp"])
def test_the_rule_is_used_not_the_function(program: str) -> None:
    """The deliberately wrong rules give a derivative other than the true
    one (JAX agrees with ours above, so both use the rule)."""
    g = PROGRAMS[program](OURS)
    x, eps = 0.8, 1e-6
    numeric = (g(x + eps) - g(x - eps)) / (2 * eps)
    assert abs(ad.grad(g)(x) - numeric) > 1e-3


def test_softplus_gradient_is_finite_where_the_naive_one_is_nan() -> None:
    naive = lambda x: ad.select(x > 30.0, x, ad.log(1.0 + ad.exp(x)))  # noqa: E731
    custom = softplus(OURS)
    with np.errstate(over="ignore", invalid="ignore"):
        assert np.isnan(ad.grad(naive)(800.0))
        for x in [800.0, -800.0, 0.3]:
            close(ad.grad(custom)(x), jax.grad(softplus(JAX))(x))
            close(custom(x), softplus(JAX)(x))
        close(ad.grad(custom)(800.0), 1.0)


def test_vector_arguments_and_outputs() -> None:
    """A custom_jvp function of two vectors returning a vector, under vmap,
    jacfwd-like jvps and grad of a sum."""

    def build(m):
        @m.custom_jvp
        def f(x, y):
            return m.sin(x) * y

        @f.defjvp
        def f_jvp(primals, tangents):
            (x, y), (dx, dy) = primals, tangents
            return f(x, y), m.cos(x) * y * dx + m.sin(x) * dy * 2.0

        return f

    ours, theirs = build(OURS), build(JAX)
    y = np.array([0.5, 1.5, -1.0])
    close(ours(V3, y), theirs(V3, y))
    close(ad.jvp(ours, (V3, y), (y, V3)), jax.jvp(theirs, (V3, y), (y, V3)))
    close(
        ad.grad(lambda x: ad.reduce_sum(ours(x, y), 0))(V3),
        jax.grad(lambda x: jnp.sum(theirs(x, y)))(V3),
    )
    mat = np.arange(6.0).reshape(2, 3) / 4.0
    close(ad.vmap(ours, (0, None))(mat, y), jax.vmap(theirs, (0, None))(mat, y))
    close(
        ad.vmap(lambda x: ad.jvp(ours, (x, y), (y, x)), (0,))(mat),
        jax.vmap(lambda x: jax.jvp(theirs, (x, y), (y, x)))(mat),
    )


def test_unbatched_operand_of_a_batched_custom_vjp_call() -> None:
    """vmap over one argument of a two-argument custom_vjp function: the
    unbatched one's cotangent is summed over the batch."""

    def build(m):
        @m.custom_vjp
        def f(x, w):
            return m.sin(x) * w

        def fwd(x, w):
            return f(x, w), (m.cos(x), m.sin(x), w)

        def bwd(res, ct):
            c, s, w = res
            return ct * c * w * 2.0, ct * s  # x's cotangent doubled

        f.defvjp(fwd, bwd)
        return f

    ours, theirs = build(OURS), build(JAX)
    xs = np.array([0.1, 0.7, -1.3])

    def loss(m, f):
        return lambda w: m.total(m.vmap(f, (0, None))(xs, w))

    close(ad.grad(loss(OURS, ours))(0.6), jax.grad(loss(JAX, theirs))(0.6))
    close(
        ad.grad(lambda x: ad.reduce_sum(ad.vmap(ours, (0, None))(x, 0.6), 0))(xs),
        jax.grad(lambda x: jnp.sum(jax.vmap(theirs, (0, None))(x, 0.6)))(xs),
    )


def test_rule_applying_a_custom_function_to_a_tangent() -> None:
    """A linear custom_jvp function applied to a tangent lands in the linear
    jaxpr; its transpose is the transpose of its jaxpr."""

    def build(m):
        triple = m.custom_jvp(lambda x: x * 3.0)
        triple.defjvp(lambda p, t: (triple(p[0]), triple(t[0])))

        @m.custom_jvp
        def f(x):
            return m.sin(x)

        f.defjvp(lambda p, t: (f(p[0]), triple(t[0]) * m.cos(p[0])))
        return f

    for x in POINTS:
        close(ad.grad(build(OURS))(x), jax.grad(build(JAX))(x))
        close(ad.jit(ad.grad(build(OURS)))(x), jax.grad(build(JAX))(x))


# ---------------------------------------------------------------------------
# Jaxprs
# ---------------------------------------------------------------------------

SCALAR = ad.ShapedArray((), F64)


def names(jaxpr) -> list[str]:
    return [eqn.primitive.name for eqn in jaxpr.eqns]


def test_staging_records_one_equation_with_function_and_rule() -> None:
    f = softplus(OURS)
    jaxpr, _, _ = ad.make_jaxpr(f, SCALAR)
    assert names(jaxpr) == ["custom_jvp_call"]
    params = jaxpr.eqns[0].params
    assert isinstance(params["call_jaxpr"], ad.Jaxpr)
    assert "select" in names(params["call_jaxpr"])
    assert "jvp=f_jvp" in str(jaxpr) and "name=f" in str(jaxpr)
    ad.typecheck_jaxpr(jaxpr)


def test_jvp_replaces_the_call_by_the_rule() -> None:
    f = softplus(OURS)
    jaxpr, _, _ = ad.make_jaxpr(lambda x, t: ad.jvp(f, (x,), (t,)), SCALAR, SCALAR)
    # the rule's primal output is a call again; its tangent has no select
    assert names(jaxpr).count("custom_jvp_call") == 1
    assert "select" not in names(jaxpr) and "div" in names(jaxpr)


def test_vmap_keeps_one_call_with_a_batched_rule() -> None:
    f = softplus(OURS)
    jaxpr, _, _ = ad.make_jaxpr(ad.vmap(f), ad.ShapedArray((3,), F64))
    assert names(jaxpr) == ["custom_jvp_call"]
    assert "jvp=vmap(f_jvp)" in str(jaxpr)


def test_custom_vjp_staging_and_linear_jaxpr() -> None:
    g = clip_gradient(OURS)
    jaxpr, _, _ = ad.make_jaxpr(g, SCALAR)
    assert "custom_vjp_call" in names(jaxpr)
    assert "fwd=clip_fwd" in str(jaxpr) and "bwd=clip_bwd" in str(jaxpr)
    _, linear, _ = ad.linearize_flat(lambda x: [g(x)], [F64(0.9)])
    assert "custom_lin" in names(linear)
    assert "custom_vjp_call" not in names(linear)


def test_lowering_is_the_lowering_of_the_function() -> None:
    jaxpr, _, _ = ad.make_jaxpr(softplus(OURS), SCALAR)
    text = str(ad.lower_jaxpr(jaxpr))
    assert "func.call" in text or "call @" in text
    assert "stablehlo.log" in text and "stablehlo.select" in text


def test_evaluation_ignores_the_rule() -> None:
    calls = []

    @ad.custom_jvp
    def f(x):
        return ad.sin(x)

    @f.defjvp
    def f_jvp(p, t):
        calls.append(1)
        return f(p[0]), t[0]

    assert f(0.4) == np.sin(0.4) and ad.jit(f)(0.4) == pytest.approx(np.sin(0.4))
    ad.vmap(f)(XS)
    assert calls == []
    ad.grad(f)(0.4)
    assert calls == [1]


def test_registries() -> None:
    for name in ["custom_jvp_call", "custom_vjp_call", "custom_lin"]:
        prim = ad.PRIMITIVES[name]
        for kind in ("impl", "jvp", "vmap", "abstract_eval", "lower"):
            assert kind in prim.rules, (name, kind)
    assert "custom_vjp_call" in ad.NOT_LINEAR
    assert "custom_jvp_call" not in ad.NOT_LINEAR
    assert "transpose" in ad.PRIMITIVES["custom_jvp_call"].rules
    assert "transpose" in ad.PRIMITIVES["custom_lin"].rules
    assert "transpose" not in ad.PRIMITIVES["custom_vjp_call"].rules


def test_decorators_keep_the_function_name_and_rule() -> None:
    @ad.custom_jvp
    def my_function(x):
        return x

    rule = my_function.defjvp(lambda p, t: (p[0], t[0]))
    assert my_function.__name__ == "my_function" and callable(rule)


# ---------------------------------------------------------------------------
# Errors
# ---------------------------------------------------------------------------


def usable() -> None:
    assert len(ad._state.stack) == 1
    assert ad.grad(ad.sin)(0.5) == pytest.approx(np.cos(0.5))


def clip_loss(x):
    return clip_gradient(OURS)(x)


@pytest.mark.parametrize(
    "run",
    [
        lambda: ad.jvp(clip_loss, (0.5,), (1.0,)),
        lambda: ad.vmap(lambda x: ad.jvp(clip_loss, (x,), (x,)))(XS),
        lambda: ad.linearize(clip_loss, 0.5)[1](1.0),
        lambda: ad.jit(lambda x: ad.jvp(clip_loss, (x,), (1.0,)))(0.5),
    ],
    ids=["jvp", "vmap(jvp)", "linearize's linear map", "jit(jvp)"],
)
def test_jvp_of_custom_vjp_function(run) -> None:
    with raises_clearly(
        ad.CustomVJPForwardModeError,
        r"jvp of clip, a custom_vjp function: it has only a reverse-mode rule",
        then=usable,
    ):
        run()
    assert issubclass(ad.CustomVJPForwardModeError, TypeError)


def with_rule(rule):
    @ad.custom_jvp
    def f(x):
        return ad.sin(x)

    f.defjvp(rule)
    return f


BAD_JVP_RULES = {
    "not a pair": (lambda p, t: ad.sin(p[0]), r"must return a pair"),
    "tangent shape": (
        lambda p, t: (ad.sin(p[0]), ad.broadcast(t[0], (3,), (0,))),
        r"tangent output must be float64\[\], but it is float64\[3\]",
    ),
    "tangent dtype": (
        lambda p, t: (ad.sin(p[0]), ad.convert_element_type(t[0], np.float32)),
        r"tangent output must be float64\[\], but it is float32\[\]",
    ),
    "primal structure": (
        lambda p, t: ((ad.sin(p[0]), p[0]), t[0]),
        r"primal output must be float64\[\], but it is \(float64\[\], float64\[\]\)",
    ),
}


@pytest.mark.parametrize("mode", ["jvp", "grad", "jit(grad)", "vmap(grad)"])
@pytest.mark.parametrize("case", list(BAD_JVP_RULES))
def test_jvp_rule_of_the_wrong_type(case: str, mode: str) -> None:
    rule, match = BAD_JVP_RULES[case]
    f = with_rule(rule)
    run = {
        "jvp": lambda: ad.jvp(f, (0.5,), (1.0,)),
        "grad": lambda: ad.grad(f)(0.5),
        "jit(grad)": lambda: ad.jit(ad.grad(f))(0.5),
        "vmap(grad)": lambda: ad.vmap(ad.grad(f))(XS),
    }[mode]
    with raises_clearly(TypeError, rf"f: the custom_jvp rule.*{match}", then=usable):
        run()


def test_bad_fwd_and_bwd() -> None:
    def make(fwd, bwd):
        @ad.custom_vjp
        def f(x, y):
            return x * y

        f.defvjp(fwd, bwd)
        return f

    good_fwd = lambda x, y: (x * y, (x, y))  # noqa: E731
    good_bwd = lambda res, ct: (ct * res[1], ct * res[0])  # noqa: E731
    cases = [
        (make(lambda x, y: x * y, good_bwd), r"fwd must return a pair"),
        (
            make(lambda x, y: ((x, y), None), good_bwd),
            r"fwd's output must be float64\[\], but it is \(float64\[\], float64\[\]\)",
        ),
        (
            make(good_fwd, lambda res, ct: ct),
            r"bwd's result .* must be \(float64\[\], float64\[\]\), "
            r"but it is float64\[\]",
        ),
        (
            make(good_fwd, lambda res, ct: (ct,)),
            r"must be \(float64\[\], float64\[\]\), but it is \(float64\[\],\)",
        ),
    ]
    for f, match in cases:
        with raises_clearly(TypeError, match, then=usable):
            ad.grad(lambda x, f=f: f(x, 2.0))(0.5)
        with raises_clearly(TypeError, match, then=usable):
            ad.jit(ad.grad(lambda x, f=f: f(x, 2.0)))(0.5)


def test_missing_rule_bad_nondiff_argnums_and_traced_closure() -> None:
    with raises_clearly(
        TypeError, r"without a rule: define one with sin\.defjvp", then=usable
    ):
        ad.custom_jvp(ad.sin)(1.0)
    with raises_clearly(
        TypeError, r"without a rule: define one with sin\.defvjp", then=usable
    ):
        ad.custom_vjp(ad.sin)(1.0)
    f = ad.custom_jvp(lambda x, k: x * k, nondiff_argnums=(2,))
    f.defjvp(lambda k, p, t: (p[0], t[0]))
    with raises_clearly(
        ValueError, r"nondiff_argnums \(2,\) is out of range", then=usable
    ):
        f(1.0, 2.0)

    def closes_over_traced(w):
        g = ad.custom_jvp(lambda x: x * w)
        g.defjvp(lambda p, t: (g(p[0]), t[0]))
        return g(2.0)

    with raises_clearly(
        TypeError, r"closes over a value .* that is being differentiated", then=usable
    ):
        ad.grad(closes_over_traced)(1.5)
    h = ad.custom_vjp(lambda x, k: x * k, nondiff_argnums=(1,))
    h.defvjp(lambda x, k: (x * k, None), lambda k, r, ct: (ct * k,))
    with raises_clearly(
        TypeError, r"a nondiff_argnums argument is a traced", then=usable
    ):
        ad.jit(lambda x, k: h(x, k))(1.0, 2.0)
