"""Comparisons as primitives (issue 28, item 1), against real JAX.

The six comparisons ``eq ne lt le gt ge`` are primitives with every rule:
their results, and the equations they record, must match JAX's under every
interpreter; the operators ``== != < <= > >=`` on tracers and device arrays
call them; and the program that once answered silently wrong (``==`` on a
tracer was Python's identity test) gives JAX's answer.
"""

from __future__ import annotations

import operator

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import autodidax as ad

pytestmark = pytest.mark.usefixtures("clean_interpreter_stack")

OPERATORS = {
    "eq": operator.eq,
    "ne": operator.ne,
    "lt": operator.lt,
    "le": operator.le,
    "gt": operator.gt,
    "ge": operator.ge,
}
OURS = {
    "eq": ad.equal,
    "ne": ad.not_equal,
    "lt": ad.less,
    "le": ad.less_equal,
    "gt": ad.greater,
    "ge": ad.greater_equal,
}
# Ties on purpose: x and y share entries, so eq/le/ge differ from lt/gt.
X = np.array([1.0, 2.0, 3.0, -0.5, 0.0])
Y = np.array([1.0, 3.0, 2.0, -0.5, -0.0])
XI = np.array([1, 2, 3, -5, 0], np.int64)
YI = np.array([1, 3, 2, -5, 7], np.int64)


def _same(ours, theirs):
    ours, theirs = np.asarray(ours), np.asarray(theirs)
    assert ours.dtype == theirs.dtype == np.bool_, (ours.dtype, theirs.dtype)
    np.testing.assert_array_equal(ours, theirs)


@pytest.mark.parametrize("name", OPERATORS)
@pytest.mark.parametrize("xy", [(X, Y), (XI, YI)], ids=["float64", "int64"])
@pytest.mark.parametrize("mode", ["eager", "jit", "vmap", "jit-of-vmap"])
def test_comparison_values_match_jax(name, xy, mode):
    x, y = xy
    op = OPERATORS[name]
    want = getattr(jax.lax, name)(x, y)
    wrap = {
        "eager": lambda f: f,
        "jit": ad.jit,
        "vmap": ad.vmap,
        "jit-of-vmap": lambda f: ad.jit(ad.vmap(f)),
    }[mode]
    _same(wrap(op)(x, y) if mode != "eager" else op(ad.jit(lambda a: a)(x), y), want)
    _same(wrap(OURS[name])(x, y), want)
    _same(getattr(ad.lax, name)(x, y), want)


@pytest.mark.parametrize("name", OPERATORS)
def test_operator_records_the_primitive_jax_records(name):
    op = OPERATORS[name]
    ours, _, _ = ad.make_jaxpr(lambda x, y: op(x, y), *[ad.get_aval(X)] * 2)
    theirs = jax.make_jaxpr(lambda x, y: op(x, y))(X, Y)
    assert [e.primitive.name for e in ours.eqns] == [name]
    assert [e.primitive.name for e in theirs.jaxpr.eqns] == [name]


@pytest.mark.parametrize("name", OPERATORS)
def test_operator_with_a_python_number_on_either_side(name):
    op = OPERATORS[name]
    for left in [False, True]:

        def apply(a, left=left):
            return op(2.0, a) if left else op(a, 2.0)

        ours, theirs = ad.jit(apply), jax.jit(apply)
        _same(ours(X), theirs(X))


@pytest.mark.parametrize("name", OPERATORS)
def test_broadcasting_operands_like_jnp(name):
    op = OPERATORS[name]
    col, row = X[:, None], Y[None, :4]
    _same(ad.jit(op)(col, row), jax.jit(op)(col, row))
    _same(getattr(ad.numpy, {"eq": "equal", "ne": "not_equal", "lt": "less",
                             "le": "less_equal", "gt": "greater",
                             "ge": "greater_equal"}[name])(col, row),
          op(jnp.asarray(col), jnp.asarray(row)))  # fmt: skip


@pytest.mark.parametrize("name", OPERATORS)
def test_jvp_of_a_comparison_has_a_zero_tangent(name):
    op = OPERATORS[name]
    out, tangent = ad.jvp(lambda x: op(x, Y), (X,), (np.ones_like(X),))
    _same(out, op(X, Y))
    assert not np.any(np.asarray(tangent))
    # JAX's tangent of a boolean output has the dtype float0 (no values).
    _, jax_tangent = jax.jvp(lambda x: op(x, Y), (X,), (np.ones_like(X),))
    assert jax_tangent.dtype == jax.dtypes.float0


@pytest.mark.parametrize("name", OPERATORS)
@pytest.mark.parametrize("transform", ["grad", "jit-of-grad", "vmap-of-grad"])
def test_gradient_through_a_comparison_select(name, transform):
    """The comparison decides which branch the derivative comes from."""
    op = OPERATORS[name]

    def ours(x, y):
        return ad.reduce_sum(ad.select(op(x, y), ad.sin(x), x * x))

    def theirs(x, y):
        return jnp.sum(jnp.where(op(x, y), jnp.sin(x), x * x))

    if transform == "grad":
        got, want = ad.grad(ours)(X, Y), jax.grad(theirs)(X, Y)
    elif transform == "jit-of-grad":
        got, want = ad.jit(ad.grad(ours))(X, Y), jax.jit(jax.grad(theirs))(X, Y)
    else:
        xs, ys = np.stack([X, Y]), np.stack([Y, X])
        got = ad.vmap(ad.grad(ours))(xs, ys)
        want = jax.vmap(jax.grad(theirs))(xs, ys)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-12)


def _add_if_three(x):
    return ad.cond(x == 3.0, ad.add, ad.mul, x, x)


def _jax_add_if_three(x):
    return jax.lax.cond(x == 3.0, jnp.add, jnp.multiply, x, x)


@pytest.mark.parametrize("x", [3.0, 4.0])
def test_the_program_that_was_silently_wrong(x):
    """``x == 3.`` under jit was Python's identity test: 9.0 instead of 6.0."""
    assert float(ad.jit(_add_if_three)(x)) == float(jax.jit(_jax_add_if_three)(x))
    assert float(ad.grad(_add_if_three)(x)) == float(jax.grad(_jax_add_if_three)(x))
    assert float(ad.jit(ad.grad(_add_if_three))(x)) == float(
        jax.jit(jax.grad(_jax_add_if_three))(x)
    )
    xs = np.array([x, 3.0, -1.0])
    ours, theirs = ad.vmap(_add_if_three)(xs), jax.vmap(_jax_add_if_three)(xs)
    np.testing.assert_array_equal(np.asarray(ours), np.asarray(theirs))


def test_the_silently_wrong_program_gives_six():
    assert float(ad.jit(_add_if_three)(3.0)) == 6.0


@pytest.mark.parametrize("name", OPERATORS)
def test_every_comparison_has_every_rule(name):
    prim = ad.PRIMITIVES[name]
    for kind in ["impl", "jvp", "vmap", "abstract_eval", "lower"]:
        assert kind in prim.rules, (name, kind)
    assert "transpose" not in prim.rules and name in ad.NOT_LINEAR


def test_comparison_refuses_mismatched_dtypes_like_lax():
    """The primitives stay strict, as lax's do (the front end is the place
    for promotion)."""
    with pytest.raises(TypeError, match=r"float64.*int64|int64.*float64"):
        ad.jit(ad.equal)(X, XI)
    with pytest.raises(TypeError):
        jax.lax.eq(X, XI)


@pytest.mark.parametrize("name", OPERATORS)
def test_lax_namespace_matches_jax_lax_names(name):
    import autodidax.lax as lax

    assert getattr(lax, name) is OURS[name]
    assert callable(getattr(jax.lax, name))


def test_lax_namespace_has_the_later_chapters_names():
    import autodidax.lax as lax

    names = ["while_loop", "fori_loop", "scan", "psum", "pmean", "pmax"]
    names += ["all_gather", "axis_index", "cond", "switch", "select", "dot_general"]
    for name in names:
        assert callable(getattr(lax, name)), name
        assert callable(getattr(jax.lax, name)), name


def test_len_of_a_traced_array_is_its_leading_size_as_in_jax():
    ours = ad.jit(lambda x: x * float(len(x)))(X)
    theirs = jax.jit(lambda x: x * float(len(x)))(X)
    np.testing.assert_array_equal(np.asarray(ours), np.asarray(theirs))


def test_bool_of_a_jvp_comparison_still_branches_as_in_jax():
    """Python control flow under grad (not jit) reads the primal, as JAX."""

    def f(x):
        return ad.sin(x) if x <= 1.0 else x * x

    def g(x):
        return jnp.sin(x) if x <= 1.0 else x * x

    for x in [0.5, 1.0, 2.0]:
        assert float(ad.grad(f)(x)) == pytest.approx(float(jax.grad(g)(x)), rel=1e-12)
