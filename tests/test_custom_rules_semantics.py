"""JAX's meaning for custom rules (Part 8) and two corners of cond (Part 5).

Differential tests against real JAX (float64, tests/conftest.py): a custom
function called outside transformations runs its Python function; keyword
arguments are resolved to positions with defaults; ``bwd`` may return ``None``
for zero cotangents, also inside nested tuples and dicts; ``cond`` takes number
predicates (nonzero is true); ``switch`` clamps its index; ``grad`` of a
``vmap`` of a ``cond`` with a batched predicate has no NaN from the branch not
taken. Each error has a test with its type and message.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import raises_clearly
from jax import lax

import autodidax as ad

pytestmark = pytest.mark.usefixtures("clean_interpreter_stack")


def check(ours, theirs):
    ours_leaves, theirs_leaves = jax.tree.leaves(ours), jax.tree.leaves(theirs)
    assert len(ours_leaves) == len(theirs_leaves)
    for a, b in zip(ours_leaves, theirs_leaves):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-12, atol=0)


def still_works():
    assert float(ad.grad(ad.sin)(0.0)) == 1.0


# ------------------------------------------------ a custom function run eagerly


def _python_relu(lib):
    """A custom function with Python control flow on its argument; its rules
    claim slope 2, so agreement shows the rule was used under grad."""

    @lib.custom_jvp
    def relu_jvp(x):
        if x > 0:
            return x
        return x * 0.0

    relu_jvp.defjvp(lambda p, t: (relu_jvp(p[0]), t[0] * 2.0))

    @lib.custom_vjp
    def relu_vjp(x):
        if x > 0:
            return x
        return x * 0.0

    relu_vjp.defvjp(lambda x: (x * 1.0, None), lambda _, ct: (ct * 2.0,))
    return relu_jvp, relu_vjp


@pytest.mark.parametrize("which", [0, 1], ids=["custom_jvp", "custom_vjp"])
@pytest.mark.parametrize("x", [3.0, -2.0])
def test_eager_call_runs_the_python_function(which, x):
    ours, theirs = _python_relu(ad)[which], _python_relu(jax)[which]
    check(ours(x), theirs(x))


def test_eager_call_with_arrays_and_pytrees():
    def make(lib):
        @lib.custom_jvp
        def f(d):
            return d["a"] * 2.0 if float(d["a"][0]) > 0 else d["a"]

        f.defjvp(lambda p, t: (f(p[0]), t[0]["a"]))
        return f

    arg = {"a": np.array([1.0, 2.0])}
    check(make(ad)(arg), make(jax)(arg))


def test_eager_call_still_checks_the_rule_is_defined():
    f = ad.custom_jvp(ad.sin)
    with raises_clearly(TypeError, r"without a rule.*defjvp", still_works):
        f(1.0)


def test_eager_closure_over_a_differentiated_value_is_refused():
    """JAX refuses it (UnexpectedTracerError); ours says why."""

    def outer(lib, y):
        f = lib.custom_jvp(lambda x: x * y)
        f.defjvp(lambda p, t: (f(p[0]), t[0] * y))
        return f(2.0)

    with pytest.raises(jax.errors.UnexpectedTracerError):
        jax.grad(lambda y: outer(jax, y))(3.0)
    with raises_clearly(
        ad.ClosureDifferentiatedError,
        r"<lambda>: .*closes over a value \(float64\[\]\) "
        r"that is being differentiated.*as an argument",
        still_works,
    ):
        ad.grad(lambda y: outer(ad, y))(3.0)


# ----------------------------------------------------------- keyword arguments


def _with_defaults(lib, seen):
    @lib.custom_jvp
    def f(x, y=2.0, z=3.0):
        return x * y * z

    @f.defjvp
    def f_jvp(primals, tangents):
        seen.append(len(primals))
        (x, y, z), (x_dot, y_dot, z_dot) = primals, tangents
        return f(x, y, z), x_dot * y * z * 10.0 + y_dot * 100.0 + z_dot

    @lib.custom_vjp
    def g(x, y=2.0):
        return x * y

    g.defvjp(lambda x, y=2.0: (x * y, (x, y)), lambda r, ct: (ct * r[1] * 10.0, ct))
    return f, g


@pytest.mark.parametrize(
    "program",
    [
        lambda lib, f, g: f(1.5, y=5.0),
        lambda lib, f, g: f(1.5, z=4.0, y=5.0),
        lambda lib, f, g: lib.grad(lambda x: f(x, z=5.0))(1.0),
        lambda lib, f, g: lib.grad(lambda y: f(1.0, y=y))(1.0),
        lambda lib, f, g: lib.grad(lambda x: f(x))(1.0),
        lambda lib, f, g: lib.jit(lambda x: f(x, z=x))(1.5),
        lambda lib, f, g: lib.vmap(lambda x: f(x, y=3.0))(np.array([1.0, 2.0])),
        lambda lib, f, g: lib.grad(lambda x: g(x, y=4.0))(1.0),
        lambda lib, f, g: lib.grad(lambda y: g(2.0, y=y))(1.0),
        lambda lib, f, g: lib.grad(lambda x: g(x))(1.0),
    ],
    ids=[
        "eval", "eval-reordered", "grad-x", "grad-y-by-keyword", "grad-defaults",
        "jit", "vmap", "vjp-grad-x", "vjp-grad-y-by-keyword", "vjp-defaults",
    ],
)  # fmt: skip
def test_keyword_arguments_as_jax(program):
    seen_ours, seen_jax = [], []
    ours = program(ad, *_with_defaults(ad, seen_ours))
    theirs = program(jax, *_with_defaults(jax, seen_jax))
    check(ours, theirs)
    assert set(seen_ours) <= {3} and set(seen_jax) <= {3}


def test_keyword_errors():
    f = ad.custom_jvp(lambda x, *, scale: x * scale)
    f.defjvp(lambda p, t: (p[0], t[0]))
    with raises_clearly(TypeError, r"keyword-only arguments \['scale'\]", still_works):
        f(1.0, scale=2.0)
    g = ad.custom_jvp(lambda x: x)
    g.defjvp(lambda p, t: (p[0], t[0]))
    with raises_clearly(TypeError, r"cannot take these arguments.*'y'", still_works):
        g(1.0, y=2.0)
    # JAX refuses both too, with a TypeError.
    jf = jax.custom_jvp(lambda x, *, scale: x * scale)
    jf.defjvp(lambda p, t: (p[0], t[0]))
    with pytest.raises(TypeError):
        jf(1.0, scale=2.0)


# ------------------------------------------------ bwd returns None for zeros


def _vjp_with_none(lib, bwd):
    @lib.custom_vjp
    def f(x, pair):
        return x * pair[0] + pair[1]["w"] * 3.0

    f.defvjp(lambda x, pair: (f(x, pair), (x, pair)), bwd)
    return f


BWDS = {
    "whole-argument": lambda r, ct: (ct * r[1][0], None),
    "tuple-entry": lambda r, ct: (None, (ct * r[0], None)),
    "dict-entry": lambda r, ct: (ct, (None, {"w": None})),
    "leaf-in-dict": lambda r, ct: (ct * 2.0, (ct, {"w": ct * 3.0})),
    "all": lambda r, ct: (None, None),
}


@pytest.mark.parametrize("bwd", list(BWDS))
def test_bwd_may_return_none_for_zero_cotangents(bwd):
    args = (1.5, (2.0, {"w": 0.5}))

    def run(lib):
        f = _vjp_with_none(lib, BWDS[bwd])
        return (
            lib.grad(f, (0, 1))(*args),
            lib.jit(lib.grad(f, (0, 1)))(*args),
            lib.vmap(lib.grad(f), (0, None))(np.array([1.0, 2.0]), args[1]),
        )

    check(run(ad), run(jax))


def test_bwd_none_where_structure_differs_is_an_error():
    f = ad.custom_vjp(lambda x, y: x * y)
    f.defvjp(lambda x, y: (x * y, None), lambda r, ct: (ct, None, None))
    with raises_clearly(TypeError, r"bwd's result.*must be", still_works):
        ad.grad(f)(1.0, 2.0)


# -------------------------------------------------- cond: number predicates


@pytest.mark.parametrize(
    "pred",
    [1, 0, -3, 2.5, 0.0, -0.0, np.float32(0.25), np.uint8(0), np.uint8(7),
     np.int32(-1), float("nan"), float("inf"), np.array(0.0), True, False],
)  # fmt: skip
def test_cond_number_predicate_as_jax(pred):
    def run(cond, p):
        return cond(p, lambda x: x + 1.0, lambda x: x - 1.0, 1.0)

    check(run(ad.cond, pred), run(lax.cond, pred))


def test_cond_number_predicate_under_transformations():
    def make(cond):
        def f(x):  # a float predicate computed from the input
            return cond(x * 2.0, lambda x: x * x, lambda x: x + 10.0, x)

        return f

    ours, theirs = make(ad.cond), make(lax.cond)
    xs = np.array([0.0, 1.5, -2.0])
    check(ad.vmap(ours)(xs), jax.vmap(theirs)(xs))
    check(ad.vmap(ad.grad(ours))(xs), jax.vmap(jax.grad(theirs))(xs))
    check(ad.jit(ours)(1.5), jax.jit(theirs)(1.5))
    check(ad.jit(ours)(0.0), jax.jit(theirs)(0.0))
    check(
        ad.grad(lambda v: ad.reduce_sum(ad.vmap(ours)(v), (0,)))(xs),
        jax.grad(lambda v: jnp.sum(jax.vmap(theirs)(v)))(xs),
    )
    ints = np.array([0, 3, -1])
    check(
        ad.vmap(lambda i: ad.cond(i, lambda: 1.0, lambda: 2.0))(ints),
        jax.vmap(lambda i: lax.cond(i, lambda: 1.0, lambda: 2.0))(ints),
    )


def test_cond_non_scalar_predicate_is_an_error_as_in_jax():
    pred = np.array([1.0, 0.0])
    with pytest.raises(TypeError, match="scalar"):
        lax.cond(pred, lambda: 1.0, lambda: 2.0)
    with raises_clearly(
        TypeError, r"predicate must be .*scalar.*float64\[2\]", still_works
    ):
        ad.cond(pred, lambda: 1.0, lambda: 2.0)


# -------------------------------------------------------------------- switch


def _branches(lib):
    return [
        lambda x: lib.sin(x) * 2.0,
        lambda x: x * x,
        lambda x: -x,
        lambda x: x * 3.0 + 1.0,
        lambda x: lib.cos(x),
    ]


@pytest.mark.parametrize("n", [1, 2, 3, 5])
@pytest.mark.parametrize("index", [-7, -1, 0, 1, 2, 3, 4, 5, 40])
def test_switch_clamps_as_jax(n, index):
    ours, theirs = _branches(ad)[:n], _branches(jnp)[:n]
    check(ad.switch(index, ours, 0.7), lax.switch(index, theirs, 0.7))
    check(
        ad.jit(lambda i, x: ad.switch(i, ours, x))(index, 0.7),
        jax.jit(lambda i, x: lax.switch(i, theirs, x))(index, 0.7),
    )
    check(
        ad.grad(lambda x: ad.switch(index, ours, x))(0.7),
        jax.grad(lambda x: lax.switch(index, theirs, x))(0.7),
    )


def test_switch_under_vmap_and_grad():
    ours, theirs = _branches(ad), _branches(jnp)
    index = np.array([-2, 0, 1, 2, 3, 4, 9], np.int32)
    xs = np.linspace(0.1, 1.3, 7)
    check(
        ad.vmap(lambda i, x: ad.switch(i, ours, x))(index, xs),
        jax.vmap(lambda i, x: lax.switch(i, theirs, x))(index, xs),
    )
    check(
        ad.vmap(ad.grad(lambda x, i: ad.switch(i, ours, x)))(xs, index),
        jax.vmap(jax.grad(lambda x, i: lax.switch(i, theirs, x)))(xs, index),
    )

    def summed(lib, vmap, switch, branches, total):
        return lib.grad(
            lambda v: total(vmap(lambda i, x: switch(i, branches, x))(index, v))
        )

    check(
        summed(ad, ad.vmap, ad.switch, ours, lambda y: ad.reduce_sum(y, (0,)))(xs),
        summed(jax, jax.vmap, lax.switch, theirs, jnp.sum)(xs),
    )
    pairs = [lambda a, b: (a, b), lambda a, b: (b, a)]
    check(  # one index for the batch; several operands, a pytree output
        ad.vmap(lambda x: ad.switch(3, pairs, x, 1.0))(xs),
        jax.vmap(lambda x: lax.switch(3, pairs, x, 1.0))(xs),
    )


def test_switch_errors():
    with pytest.raises(TypeError):
        lax.switch(1.0, [jnp.sin, jnp.cos], 1.0)
    with raises_clearly(
        TypeError,
        r"switch: the index must be an integer scalar, got float64\[\]",
        still_works,
    ):
        ad.switch(1.0, [ad.sin, ad.cos], 1.0)
    with raises_clearly(
        TypeError, r"index must be an integer scalar, got int64\[2\]", still_works
    ):
        ad.switch(np.array([0, 1]), [ad.sin, ad.cos], 1.0)
    with pytest.raises(ValueError):
        lax.switch(0, [], 1.0)
    with raises_clearly(ValueError, r"branches must be a nonempty list", still_works):
        ad.switch(0, [], 1.0)
    with raises_clearly(TypeError, r"branches\[1\] must be a function.*3", still_works):
        ad.switch(0, [ad.sin, 3], 1.0)
    with raises_clearly(TypeError, r"must return the same types", still_works):
        ad.switch(0, [ad.sin, lambda x: ad.broadcast(x, (2,), (0,))], 1.0)


# --------------------------- grad of vmap of a cond: no NaN from the other side


def _safe_programs(lib, cond, log, recip):
    eps = 1e-3
    return {
        # testCondGradVmapNan's shape: a branch closing over the input, none taken.
        "recip-closure": lambda x: cond(x < eps, lambda: eps, lambda: recip(x)),
        "log-operand": lambda x: cond(x > 0.0, log, lambda x: x * 0.0, x),
        "cube-overflow": lambda x: cond(x > 1e100, lambda x: x, lambda x: x * x * x, x),
        "nested": lambda x: cond(
            x > 0.0,
            lambda x: cond(x > 1.0, log, recip, x),
            lambda x: x * 2.0,
            x,
        ),
    }


@pytest.mark.parametrize(
    "name", ["recip-closure", "log-operand", "cube-overflow", "nested"]
)
def test_grad_of_vmap_of_cond_has_no_nan_where_jax_has_none(name):
    ours = _safe_programs(ad, ad.cond, ad.log, lambda x: 1.0 / x)[name]
    theirs = _safe_programs(jax, lax.cond, jnp.log, lambda x: 1.0 / x)[name]
    xs = np.array([0.0, 0.0, 0.5, 4.0, -1.0, 1e200])
    with np.errstate(all="ignore"):
        for transform in [
            lambda lib, vmap, f, s: lib.grad(lambda v: s(vmap(f)(v)))(xs),
            lambda lib, vmap, f, s: lib.jit(lib.grad(lambda v: s(vmap(f)(v))))(xs),
            lambda lib, vmap, f, s: lib.grad(lambda v: s(lib.jit(vmap(f))(v)))(xs),
        ]:
            got = transform(ad, ad.vmap, ours, lambda y: ad.reduce_sum(y, (0,)))
            want = transform(jax, jax.vmap, theirs, jnp.sum)
            assert np.isnan(np.asarray(got)).sum() == np.isnan(np.asarray(want)).sum()
            check(got, want)


# ------------------------------ closures over tracers of an outer transformation
# JAX 0.10.2 (measured): a custom function may close over tracers of an
# enclosing jit or vmap (results), but not over a value an enclosing jvp/grad
# is differentiating (UnexpectedTracerError for a closure used by the call;
# ours: ClosureDifferentiatedError, a TypeError saying to pass it as an argument).


def _closing(lib, kind, inner):
    """``outer(y)``: a custom function of x whose fun and rule use y."""
    np_ = jnp if lib is jax else ad.numpy

    def outer(y):
        if kind == "custom_jvp":
            f = lib.custom_jvp(lambda x: np_.sin(x) * y)
            f.defjvp(lambda p, t: (f(p[0]), 10.0 * np_.cos(p[0]) * y * t[0]))
        else:
            f = lib.custom_vjp(lambda x: np_.sin(x) * y)
            f.defvjp(lambda x: (f(x), np_.cos(x)), lambda c, ct: (10.0 * c * y * ct,))
        return inner(lib, f)(y * 2.0)

    return outer


_INNER = {
    "call": lambda lib, f: f,
    "call-const": lambda lib, f: lambda x: f(2.0),
    "grad": lambda lib, f: lib.grad(f),
    "vjp": lambda lib, f: lambda x: lib.vjp(f, x)[1](1.0)[0],
    "jit(grad)": lambda lib, f: lib.jit(lib.grad(f)),
    "vmap(grad)": lambda lib, f: lambda x: lib.vmap(lib.grad(f))(x * np.ones(2)).sum(),
}
_SUPPORTED = {
    "jit": lambda lib, g: lib.jit(g),
    "vmap": lambda lib, g: lib.vmap(g),
    "vmap(jit)": lambda lib, g: lib.vmap(lib.jit(g)),
    "jit(vmap)": lambda lib, g: lib.jit(lib.vmap(g)),
}
_REFUSED = {
    "grad": lambda lib, g: lib.grad(g),
    "jvp": lambda lib, g: lambda y: lib.jvp(g, (y,), (1.0,)),
    "jit(grad)": lambda lib, g: lib.jit(lib.grad(g)),
    "vmap(grad)": lambda lib, g: lib.vmap(lib.grad(g)),
}


def _arg(outer_name):
    return np.array([0.5, 1.5]) if "vmap" in outer_name else 0.7


@pytest.mark.parametrize("kind", ["custom_jvp", "custom_vjp"])
@pytest.mark.parametrize("inner", list(_INNER))
@pytest.mark.parametrize("outer", list(_SUPPORTED))
def test_closure_over_jit_and_vmap_tracers_agrees_with_jax(kind, inner, outer):
    run = lambda lib: _SUPPORTED[outer](lib, _closing(lib, kind, _INNER[inner]))  # noqa: E731
    check(run(ad)(_arg(outer)), run(jax)(_arg(outer)))


@pytest.mark.parametrize("kind", ["custom_jvp", "custom_vjp"])
@pytest.mark.parametrize("inner", ["call", "call-const", "grad", "vmap(grad)"])
@pytest.mark.parametrize("outer", list(_REFUSED))
def test_closure_over_a_differentiated_value_is_refused_as_in_jax(kind, inner, outer):
    run = lambda lib: _REFUSED[outer](lib, _closing(lib, kind, _INNER[inner]))  # noqa: E731
    with pytest.raises(jax.errors.UnexpectedTracerError):
        run(jax)(_arg(outer))
    with raises_clearly(
        ad.ClosureDifferentiatedError,
        r"<lambda>: the custom function closes over a value \(float64\[\]\) that is "
        r"being differentiated.*Pass that value to the custom function as an "
        r"argument",
        still_works,
    ):
        run(ad)(_arg(outer))


def test_closure_over_a_vmapped_value_with_grad_outside():
    """The closed-over value is batched by a vmap inside grad, and not
    differentiated: the rules must see it batched along that same vmap. (A
    ``bwd`` closing over it is refused by both, next test: it runs after the
    vmap finished. Here fwd saves what bwd needs.)"""

    def program(lib):
        np_ = jnp if lib is jax else ad.numpy

        def loss(x, ys):
            def per_example(y):
                f = lib.custom_vjp(lambda x: np_.sin(x) * y)
                f.defvjp(
                    lambda x: (f(x), 3.0 * np_.cos(x) * y), lambda c, ct: (c * ct,)
                )
                g = lib.custom_jvp(lambda x: x * y)
                g.defjvp(lambda p, t: (g(p[0]), 5.0 * y * t[0]))
                return f(x) + g(x)

            return lib.vmap(per_example)(ys).sum()

        return lib.grad(loss)(0.3, np.array([1.0, 2.0, 4.0]))

    check(program(ad), program(jax))


def test_custom_vjp_closure_over_a_jit_value_differentiated_later():
    """grad of jit: the jit staged the call with its closed-over value as an
    input; differentiating that input is refused, as JAX does (JAX raises
    CustomVJPException, pointing to passing it as an argument)."""

    def outer(lib, y):
        f = lib.custom_vjp(lambda x: x * y)
        f.defvjp(lambda x: (x * 2.0, None), lambda _, ct: (ct * 2.0,))
        return f(3.0)

    with pytest.raises(Exception, match="closed-over value"):
        jax.grad(jax.jit(lambda y: outer(jax, y)))(0.7)
    with raises_clearly(
        ad.ClosureDifferentiatedError, r"<lambda>: .*closes over", still_works
    ):
        ad.grad(ad.jit(lambda y: outer(ad, y)))(0.7)


# ----------------------- a custom_jvp whose fun branches on its (concrete) input


def _branching(lib):
    @lib.custom_jvp
    def f(x):
        if x > 0:
            return x * 2.0
        return x * 0.0

    f.defjvp(lambda p, t: (f(p[0]), t[0] * 5.0 * (p[0] > 0)))
    return f


@pytest.mark.parametrize(
    "program",
    [
        lambda lib, f: lib.grad(f)(3.0),
        lambda lib, f: lib.grad(f)(-3.0),
        lambda lib, f: lib.jvp(f, (3.0,), (1.0,)),
        lambda lib, f: lib.grad(lambda x: f(x) * x)(-2.0),
        lambda lib, f: lib.linearize(f, 3.0)[1](1.0),
        lambda lib, f: lib.vjp(f, 3.0)[1](1.0),
        lambda lib, f: lib.grad(lib.grad(f))(3.0),
        lambda lib, f: lib.value_and_grad(lambda x: f(x) + f(-x))(1.5),
    ],
)
def test_python_control_flow_in_custom_jvp_fun_under_jvp_and_grad(program):
    check(program(ad, _branching(ad)), program(jax, _branching(jax)))


@pytest.mark.parametrize(
    "program",
    [lambda lib, f: lib.jit(lib.grad(f))(3.0), lambda lib, f: lib.vmap(f)(np.ones(2))],
    ids=["jit", "vmap"],
)
def test_python_control_flow_in_custom_jvp_fun_still_refused_when_staged(program):
    with pytest.raises(jax.errors.TracerBoolConversionError):
        program(jax, _branching(jax))
    with raises_clearly(ad.ConcretizationError, r"Python `if`", still_works):
        program(ad, _branching(ad))


def test_bwd_closing_over_a_vmap_tracer_with_grad_outside_is_refused():
    def loss(lib, x):
        np_ = jnp if lib is jax else ad.numpy

        def per_example(y):
            f = lib.custom_vjp(lambda x: np_.sin(x) * y)
            f.defvjp(lambda x: (f(x), np_.cos(x)), lambda c, ct: (c * y * ct,))
            return f(x)

        return lib.vmap(per_example)(np.array([1.0, 2.0])).sum()

    with pytest.raises(jax.errors.UnexpectedTracerError):
        jax.grad(lambda x: loss(jax, x))(0.3)
    with raises_clearly(
        ad.UnexpectedTracerError, r"BatchTracer .* already finished", still_works
    ):
        ad.grad(lambda x: loss(ad, x))(0.3)
