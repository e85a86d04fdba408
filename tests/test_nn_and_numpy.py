"""What a JAX user's transformer needs (issue 34): autodidax.nn, einsum, tril,
triu, var, std, the tree namespaces, pow and erf, and products that stay one
dot_general. Each function against JAX (float64) under evaluation, jit, vmap
and grad; the jaxprs of einsum and @; bad input."""

from __future__ import annotations

import autodidax.nn as ann
import autodidax.numpy as anp
import autodidax.tree as atree
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import raises_clearly

import autodidax as ad

rng = np.random.default_rng(34)


def usable() -> None:
    assert float(ad.jit(lambda x: x * 2.0)(1.5)) == 3.0


def normal(*shape):
    return rng.normal(size=shape)


X = normal(2, 3, 4)
LOGITS = np.array([[1000.0, 1001.0, 1002.0, -3.0], [0.5, -0.5, 0.0, 0.0]])
WITH_ZERO = np.array([[-1.5, 0.0, 2.0], [0.3, -0.2, 0.0]])

# name: (ours, JAX's, float arguments); the function is differentiated in its
# first argument and vmapped over a new leading axis of every argument.
CASES = {
    "softmax": (ann.softmax, jax.nn.softmax, [LOGITS]),
    "softmax axis=0": (
        lambda x: ann.softmax(x, axis=0),
        lambda x: jax.nn.softmax(x, axis=0),
        [X],
    ),
    "softmax axis=(0, 2)": (
        lambda x: ann.softmax(x, axis=(0, 2)),
        lambda x: jax.nn.softmax(x, axis=(0, 2)),
        [X],
    ),
    "log_softmax": (ann.log_softmax, jax.nn.log_softmax, [LOGITS]),
    "log_softmax axis=1": (
        lambda x: ann.log_softmax(x, axis=1),
        lambda x: jax.nn.log_softmax(x, axis=1),
        [X],
    ),
    "gelu": (ann.gelu, jax.nn.gelu, [X]),
    "gelu exact": (
        lambda x: ann.gelu(x, approximate=False),
        lambda x: jax.nn.gelu(x, approximate=False),
        [X],
    ),
    "relu": (ann.relu, jax.nn.relu, [WITH_ZERO]),
    "logsumexp": (ann.logsumexp, jax.nn.logsumexp, [LOGITS]),
    "logsumexp axis=1 keepdims": (
        lambda x: ann.logsumexp(x, axis=1, keepdims=True),
        lambda x: jax.nn.logsumexp(x, axis=1, keepdims=True),
        [LOGITS],
    ),
    "erf": (ad.lax.erf, jax.lax.erf, [X]),
    "tril": (anp.tril, jnp.tril, [X]),
    "tril k=1": (lambda m: anp.tril(m, k=1), lambda m: jnp.tril(m, k=1), [X]),
    "triu k=-1": (lambda m: anp.triu(m, k=-1), lambda m: jnp.triu(m, k=-1), [X]),
    "var": (anp.var, jnp.var, [X]),
    "var axis=-1 keepdims": (
        lambda x: anp.var(x, axis=-1, keepdims=True),
        lambda x: jnp.var(x, axis=-1, keepdims=True),
        [X],
    ),
    "std axis=(0, 1) ddof=1": (
        lambda x: anp.std(x, axis=(0, 1), ddof=1),
        lambda x: jnp.std(x, axis=(0, 1), ddof=1),
        [X],
    ),
}
POSITIVE = np.abs(normal(2, 3)) + 0.1
INTS = np.array([[0, 1, 3], [2, -1, 4]])
CASES["x ** y"] = (lambda x, y: x**y, lambda x, y: x**y, [POSITIVE, normal(2, 3)])
CASES["x ** 1.5"] = (lambda x: x**1.5, lambda x: x**1.5, [POSITIVE])
CASES["0.9 ** y"] = (lambda y: 0.9**y, lambda y: 0.9**y, [normal(2, 3)])
CASES["x ** int array"] = (lambda x: x**INTS, lambda x: x**INTS, [normal(2, 3)])
CASES["power(x, row)"] = (anp.power, jnp.power, [POSITIVE, normal(3)])
CASES["lax.pow"] = (ad.lax.pow, jax.lax.pow, [POSITIVE, normal(2, 3)])
EINSUMS = {
    "bqhd,bkhd->bhqk": [(2, 5, 3, 4), (2, 6, 3, 4)],
    "bhqk,bkhd->bqhd": [(2, 3, 5, 6), (2, 6, 3, 4)],
    "ij,jk->ik": [(3, 4), (4, 5)],
    "ij,jk": [(3, 4), (4, 5)],  # implicit output: ik
    "ij,kj->jki": [(3, 4), (5, 4)],
    "i,i->": [(4,), (4,)],
    "i,j->ij": [(3,), (4,)],
    "ijk,kl->il": [(2, 3, 4), (4, 5)],  # j is summed before the product
    "ij->ji": [(3, 4)],
    "ijk->k": [(2, 3, 4)],
    "ij,jk,kl->il": [(2, 3), (3, 4), (4, 5)],
}
for _spec, _shapes in EINSUMS.items():
    CASES[f"einsum {_spec}"] = (
        lambda *xs, s=_spec: anp.einsum(s, *xs),
        lambda *xs, s=_spec: jnp.einsum(s, *xs),
        [normal(*shape) for shape in _shapes],
    )


def close(ours, theirs, rtol=1e-12, atol=1e-13) -> None:
    np.testing.assert_allclose(np.asarray(ours), np.asarray(theirs), rtol, atol)


@pytest.mark.parametrize("name", list(CASES))
def test_matches_jax_under_eval_jit_vmap_and_grad(name):
    ours, theirs, args = CASES[name]
    expected = theirs(*args)
    close(ours(*args), expected)
    close(ad.jit(ours)(*args), expected)
    stacked = [np.stack([a, 0.5 * a - 1.0]) for a in args]
    close(ad.vmap(ours)(*stacked), jax.vmap(theirs)(*stacked))
    weights = normal(*np.shape(expected))

    def weighted(f, sum_):
        return lambda *xs: sum_(f(*xs) * weights)

    ours_grad = ad.grad(weighted(ours, anp.sum))(*args)
    close(ours_grad, jax.grad(weighted(theirs, jnp.sum))(*args), atol=1e-12)


def test_one_hot_matches_jax_dtypes_axes_and_out_of_range():
    idx = np.array([[0, 3, -1], [2, 7, 1]])
    for kwargs in [{}, {"dtype": np.float32}, {"axis": 0}, {"axis": 1}]:
        ours, theirs = ann.one_hot(idx, 4, **kwargs), jax.nn.one_hot(idx, 4, **kwargs)
        assert ours.dtype == theirs.dtype and ours.shape == theirs.shape
        close(ours, theirs)
    close(ad.jit(lambda i: ann.one_hot(i, 5))(idx), jax.nn.one_hot(idx, 5))
    close(ad.vmap(lambda i: ann.one_hot(i, 5))(idx), jax.nn.one_hot(idx, 5))


def test_softmax_of_huge_logits_is_finite_and_dtypes_follow_jax():
    assert np.isfinite(np.asarray(ann.softmax(LOGITS))).all()
    x32 = X.astype(np.float32)
    for ours, theirs in [
        (ann.softmax, jax.nn.softmax),
        (ann.gelu, jax.nn.gelu),
        (anp.var, jnp.var),
        (anp.tril, jnp.tril),
    ]:
        assert ours(x32).dtype == theirs(x32).dtype, ours
    ints = np.arange(12).reshape(3, 4)
    assert anp.var(ints).dtype == jnp.var(ints).dtype
    close(anp.var(ints, axis=0), jnp.var(ints, axis=0))
    ours, theirs = anp.einsum("ij,kj", ints, ints), jnp.einsum("ij,kj", ints, ints)
    assert ours.dtype == theirs.dtype


def count(jaxpr, name: str) -> int:
    return sum(eqn.primitive.name == name for eqn in jaxpr.eqns)


TWO_OPERANDS = [s for s, shapes in EINSUMS.items() if len(shapes) == 2]


@pytest.mark.parametrize("spec", TWO_OPERANDS)
def test_two_operand_einsum_is_one_dot_general_and_no_broadcast(spec):
    avals = [ad.ShapedArray(s, np.float64) for s in EINSUMS[spec]]
    jaxpr, _, _ = ad.make_jaxpr(lambda x, y: anp.einsum(spec, x, y), *avals)
    assert count(jaxpr, "dot_general") == 1, str(jaxpr)
    assert "broadcast" not in str(jaxpr)
    assert count(jaxpr, "transpose") <= 1


MATMULS = [
    ((2, 3, 4), (4, 5)),  # activations @ weights
    ((5, 4), (2, 4, 3)),  # weights on the left
    ((2, 3, 4), (2, 4, 5)),  # batched
    ((1, 3, 4), (2, 4, 5)),  # a stack of one
    ((2, 1, 3, 4), (5, 4, 2)),
    ((4,), (2, 4, 3)),
    ((2, 3, 4), (4,)),
]


def test_matmul_is_one_dot_general_without_broadcasts_as_in_jax():
    for sx, sy in MATMULS:
        x, y = normal(*sx), normal(*sy)
        jaxpr, _, _ = ad.make_jaxpr(anp.matmul, x, y)
        assert count(jaxpr, "dot_general") == 1, str(jaxpr)
        assert "broadcast" not in str(jaxpr) and count(jaxpr, "transpose") <= 1
        theirs = jax.make_jaxpr(jnp.matmul)(x, y)
        assert sum(e.primitive.name == "dot_general" for e in theirs.eqns) == 1
        assert "broadcast" not in str(theirs)
        close(ad.jit(lambda a, b: a @ b)(x, y), jnp.matmul(x, y))
    x, w = normal(2, 3, 4), normal(4, 5)
    weights = normal(2, 3, 5)
    ours = ad.grad(lambda x, w: anp.sum((x @ w) * weights), argnums=(0, 1))(x, w)
    theirs = jax.grad(lambda x, w: jnp.sum((x @ w) * weights), argnums=(0, 1))(x, w)
    for a, b in zip(ours, theirs):
        close(a, b)
    close(ad.vmap(lambda x: x @ w)(x), jax.vmap(lambda x: x @ w)(x))


def test_tree_namespace_is_jax_tree():
    tree = {"b": [1.0, (2.0, None)], "a": np.ones(2)}
    assert [np.asarray(x).tolist() for x in atree.leaves(tree)] == [
        np.asarray(x).tolist() for x in jax.tree.leaves(tree)
    ]
    leaves, treedef = atree.flatten(tree)
    assert atree.structure(tree) == treedef
    assert atree.unflatten(treedef, [0, 1, 2])["b"] == [1, (2, None)]
    doubled = atree.map(lambda x, y: x + y, tree, tree)
    close(doubled["b"][1][0], 4.0)
    import autodidax.tree_util as tu

    assert tu.tree_map is ad.tree_map
    assert tu.register_pytree_node is ad.register_pytree_node


def test_powers_stage_what_jax_stages_and_traced_int_exponents_work():
    for fn, avals, expected in [
        (lambda x: x**3, [(np.float64, ())], ["integer_pow"]),
        (lambda x: x ** np.int64(3), [(np.float64, ())], ["integer_pow"]),
        (lambda x: x**3.0, [(np.float64, ())], ["pow"]),
        (lambda t: 0.9**t, [(np.int64, ())], ["pow"]),
        (lambda x, t: x**t, [(np.float32, (2,)), (np.int64, (2,))], ["pow"]),
    ]:
        ours = ad.make_jaxpr(fn, *(ad.ShapedArray(s, d) for d, s in avals))[0]
        theirs = jax.make_jaxpr(fn)(*(np.ones(s, d) for d, s in avals))
        assert [e.primitive.name for e in ours.eqns] == expected
        names = [e.primitive.name for e in theirs.eqns]
        assert [n for n in names if n != "convert_element_type"] == expected
    steps = np.arange(1, 5)
    close(ad.jit(ad.vmap(lambda t: 1 - 0.9**t))(steps), 1 - 0.9**steps)
    x32 = np.float32(1.5)
    assert ad.jit(lambda x, t: x**t)(x32, 3).dtype == np.float32
    # the derivative at zero: JAX's conventions (0 where y == 0, log 0 -> log 1)
    zero_base = [np.array([0.0, 0.0, 2.0]), np.array([0.0, 2.0, 0.0])]
    for f in [lambda x, y: x**y, lambda x, y: x ** y.astype(np.int64)]:
        ours = ad.jvp(f, tuple(zero_base), (np.ones(3), np.ones(3)))[1]
        theirs = jax.jvp(f, tuple(zero_base), (np.ones(3), np.ones(3)))[1]
        np.testing.assert_array_equal(np.asarray(ours), np.asarray(theirs))


def test_pow_and_erf_costs_match_xla():
    for dtype in [np.float32, np.float64]:
        x = np.ones(12, dtype)
        for ours, theirs, args in [
            (ad.lax.pow, jax.lax.pow, [x, x]),
            (ad.lax.pow, jax.lax.pow, [x, np.ones(12, np.int64)]),
        ]:
            expected = jax.jit(theirs).lower(*args).compile().cost_analysis()
            costs = ad.cost_analysis(ours, *args)
            assert costs["transcendentals"] == expected["transcendentals"]
            assert costs["flops"] == expected.get("flops", 0.0)
            assert costs["bytes accessed"] == expected["bytes accessed"]


def test_erf_cost_matches_xla():
    for dtype in [np.float32, np.float64]:
        x = np.ones(12, dtype)
        expected = jax.jit(jax.lax.erf).lower(x).compile().cost_analysis()
        costs = ad.cost_analysis(ad.lax.erf, ad.ShapedArray((12,), dtype))
        assert costs["transcendentals"] == expected["transcendentals"]
        assert costs["flops"] == expected.get("flops", 0.0)
        assert costs["bytes accessed"] == expected["bytes accessed"]


M = np.ones((2, 3))
IDX = np.array([0, 1])
BAD = {
    "einsum: rank": (
        lambda: anp.einsum("ijk,kl->il", M, M),
        ValueError,
        r"einsum: operand 0 is float64\[2,3\], with 2 axes, but its subscripts 'ijk'",
    ),
    "einsum: output letter": (
        lambda: anp.einsum("ij,jk->iz", M, M.T),
        ValueError,
        r"einsum: output subscript 'z' in 'ij,jk->iz' names no axis",
    ),
    "einsum: sizes": (
        lambda: anp.einsum("ij,jk->ik", M, M),
        ValueError,
        r"subscript 'j' in 'ij,jk->ik' has size 3 in operand 0 and size 2 in operand 1",
    ),
    "einsum: operand count": (
        lambda: anp.einsum("ij,jk->ik", M),
        ValueError,
        r"einsum: subscripts 'ij,jk->ik' name 2 operand\(s\), got 1",
    ),
    "einsum: ellipsis": (
        lambda: anp.einsum("...j,jk->...k", M, M.T),
        ValueError,
        r"einsum: '\.\.\.' in '\.\.\.j,jk->\.\.\.k' is not supported",
    ),
    "einsum: diagonal": (
        lambda: anp.einsum("ii->i", np.ones((2, 2))),
        ValueError,
        r"einsum: subscript 'i' repeats within operand 0 \('ii'\)",
    ),
    "einsum: repeated output": (
        lambda: anp.einsum("ij->ii", M),
        ValueError,
        r"einsum: output subscript 'i' repeats in 'ij->ii'",
    ),
    "einsum: not a string": (
        lambda: anp.einsum(3, M),
        TypeError,
        r"einsum: subscripts must be a string, got 3",
    ),
    "matmul: stacks": (
        lambda: anp.matmul(np.ones((2, 3, 4)), np.ones((3, 4, 5))),
        TypeError,
        r"matmul: .*float64\[2,3,4\] and float64\[3,4,5\] \(as stacks of matrices\)",
    ),
    "one_hot: floats": (
        lambda: ann.one_hot(np.array([0.0, 1.0]), 3),
        TypeError,
        r"one_hot: the indices must be integers, got float64\[2\]",
    ),
    "one_hot: traced num_classes": (
        lambda: ad.jit(lambda n: ann.one_hot(IDX, n))(3),
        TypeError,
        r"one_hot: num_classes must be a non-negative Python integer, got an array",
    ),
    "one_hot: axis": (
        lambda: ann.one_hot(IDX, 3, axis=2),
        ValueError,
        r"one_hot: axis 2 is out of range for the 2 axes of the result",
    ),
    "tril: a vector": (
        lambda: anp.tril(np.ones(3)),
        ValueError,
        r"tril: the array must have at least 2 axes, got float64\[3\]",
    ),
    "triu: k": (
        lambda: anp.triu(M, k=0.5),
        TypeError,
        r"triu: k must be an integer, got 0\.5",
    ),
    "pow: ints": (
        lambda: ad.lax.pow(IDX, IDX),
        TypeError,
        r"pow: the base must be a float array .* got int64\[2\] and int64\[2\]",
    ),
    "pow: shapes": (
        lambda: ad.lax.pow(M, np.ones(3)),
        TypeError,
        r"pow: operands must have the same shape, got float64\[2,3\] and float64\[3\]",
    ),
    "power: traced integer exponent of ints": (
        lambda: ad.jit(lambda n: np.arange(3) ** n)(2),
        TypeError,
        r"power: an integer base with an exponent that is not a Python integer",
    ),
    "power: a string": (
        lambda: ad.jit(lambda x: x ** "2")(M),
        TypeError,
        r"power: expected an array or a number, got str '2'",
    ),
    "erf: ints": (
        lambda: ad.lax.erf(IDX),
        TypeError,
        r"erf: expected a float",
    ),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_input_is_a_clear_error(case):
    fn, exc, match = BAD[case]
    with raises_clearly(exc, match, then=usable):
        fn()
