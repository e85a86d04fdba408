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
    with raises_clearly(TypeError, r"traced value it does not receive", still_works):
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
