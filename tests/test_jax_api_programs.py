"""Small programs in the style of JAX's Quickstart and Autodiff Cookbook, run
with autodidax and with JAX: the same program text, only the modules differ.

Each program is one function ``prog(jax, jnp)`` returning a pytree of arrays;
it runs once with (``autodidax``, ``autodidax.numpy``) and once with (``jax``,
``jax.numpy``), and the leaves must agree to 1e-9 (float64: conftest enables
x64). The error tests at the end cover the new entry points (SPEC section 5).
"""

from __future__ import annotations

import autodidax.numpy as anp
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import raises_clearly

import autodidax as ad

TOL = 1e-9


def stop_gradient(jax):
    """JAX has it in ``jax.lax``; autodidax at the top level (no ``lax``)."""
    return jax.lax.stop_gradient if hasattr(jax, "lax") else jax.stop_gradient


def _data():
    rng = np.random.default_rng(16)
    return {
        "x": rng.normal(size=(5, 3)),
        "y": rng.normal(size=(5,)),
        "w": rng.normal(size=(3,)),
        "v": rng.normal(size=(3,)),
        "m": rng.normal(size=(3, 3)),
    }


D = _data()


def prog_per_example_gradients(jax, jnp):
    def loss(w, x, y):
        return (jnp.dot(x, w) - y) ** 2

    return jax.vmap(jax.grad(loss), in_axes=(None, 0, 0))(D["w"], D["x"], D["y"])


def _energy(jnp, x):
    return jnp.sum(jnp.tanh(x) * x) + jnp.sum(jnp.dot(D["m"], x) * x) / 3.0


def prog_hvp_forward_over_reverse(jax, jnp):
    f = lambda x: _energy(jnp, x)  # noqa: E731
    return jax.jvp(jax.grad(f), (D["w"],), (D["v"],))[1]


def prog_hvp_reverse_over_forward(jax, jnp):
    f = lambda x: _energy(jnp, x)  # noqa: E731
    return jax.grad(lambda x: jax.jvp(f, (x,), (D["v"],))[1])(D["w"])


def prog_hvp_reverse_over_reverse(jax, jnp):
    f = lambda x: _energy(jnp, x)  # noqa: E731
    return jax.grad(lambda x: jnp.vdot(jax.grad(f)(x), D["v"]))(D["w"])


def prog_hvp_from_hessian(jax, jnp):
    f = lambda x: _energy(jnp, x)  # noqa: E731
    return jnp.dot(jax.hessian(f)(D["w"]), D["v"])


def prog_jacobians_both_ways(jax, jnp):
    def f(x):
        return jnp.tanh(jnp.dot(D["x"], x)) * jnp.sum(x * x)

    return jax.jacfwd(f)(D["w"]), jax.jacrev(f)(D["w"])


def prog_jacobian_pytrees(jax, jnp):
    def f(params, x):
        h = jnp.tanh(jnp.dot(x, params["w"]) + params["b"])
        return {"out": h, "norm": jnp.sum(h * h)}

    params = {"w": D["m"], "b": D["v"]}
    return (
        jax.jacfwd(f)(params, D["w"]),
        jax.jacrev(f)(params, D["w"]),
        jax.jacrev(f, argnums=(0, 1))(params, D["w"]),
    )


def prog_hessian_argnums(jax, jnp):
    def f(a, b):
        return jnp.sum(jnp.sin(a) * b * b) + jnp.vdot(a, b)

    return jax.hessian(f, argnums=(0, 1))(D["w"], D["v"])


def prog_mlp_training(jax, jnp):
    sizes = [3, 4, 4, 1]
    rng = np.random.default_rng(0)
    params = [
        (rng.normal(size=(m, n)) / np.sqrt(m), np.zeros(n))
        for m, n in zip(sizes[:-1], sizes[1:])
    ]

    def predict(params, x):
        for w, b in params[:-1]:
            x = jnp.tanh(jnp.dot(x, w) + b)
        w, b = params[-1]
        return jnp.dot(x, w) + b

    def loss(params, x, y):
        return jnp.mean(
            (jnp.reshape(predict(params, x), (-1,)) - y) ** 2
        )  # no [:, 0] in ours

    @jax.jit
    def step(params, x, y):
        value, grads = jax.value_and_grad(loss)(params, x, y)
        new = [(w - 0.1 * dw, b - 0.1 * db) for (w, b), (dw, db) in zip(params, grads)]
        return new, value

    losses = []
    for _ in range(4):
        params, value = step(params, D["x"], D["y"])
        losses.append(value)
    return params, losses


def prog_value_and_grad_has_aux(jax, jnp):
    def loss(w, x, y):
        pred = jnp.dot(x, w)
        err = pred - y
        return jnp.mean(err * err), {"pred": pred, "max_err": jnp.max(err)}

    (value, aux), g = jax.value_and_grad(loss, has_aux=True)(D["w"], D["x"], D["y"])
    g2, aux2 = jax.grad(loss, has_aux=True)(D["w"], D["x"], D["y"])
    return value, aux, g, g2, aux2


def prog_grad_argnums(jax, jnp):
    def f(a, scale, b):
        return jnp.sum(jnp.sin(a * scale) * b)

    return (
        jax.grad(f, argnums=(0, 2))(D["w"], 2.0, D["v"]),
        jax.grad(f, argnums=1)(D["w"], 2.0, D["v"]),
        jax.grad(f, argnums=-1)(D["w"], 2.0, D["v"]),
        jax.value_and_grad(f, argnums=(1,))(D["w"], 2.0, D["v"]),
    )


def prog_stop_gradient_tricks(jax, jnp):
    sg = stop_gradient(jax)

    def straight_through_round(x):
        return x + sg(jnp.round(x) - x)

    def target_loss(w):
        target = sg(jnp.tanh(jnp.dot(D["x"], w)))  # a fixed target, as in TD
        return jnp.sum((jnp.dot(D["x"], w) - target) ** 2)

    return (
        jax.grad(lambda x: jnp.sum(straight_through_round(x) ** 2))(D["w"] * 3.0),
        jax.grad(target_loss)(D["w"]),
        jax.vmap(jax.grad(lambda x: x * sg(x)))(D["v"]),
        jax.jit(jax.grad(lambda x: jnp.sum(sg(x) * x * x)))(D["v"]),
    )


def prog_logistic_regression(jax, jnp):
    labels = (D["y"] > 0).astype(jnp.float64)

    def loss(w, b):
        logits = jnp.dot(D["x"], w) + b
        p = 1.0 / (1.0 + jnp.exp(-logits))
        return -jnp.mean(labels * jnp.log(p) + (1.0 - labels) * jnp.log(1.0 - p))

    grad_loss = jax.jit(jax.grad(loss, argnums=(0, 1)))
    w, b = D["w"], 0.0
    for _ in range(3):
        dw, db = grad_loss(w, b)
        w, b = w - 0.5 * dw, b - 0.5 * db
    return w, b, loss(w, b)


def prog_numpy_functions(jax, jnp):
    def f(x):
        a = jnp.clip(x, -0.5, 0.5)
        b = jnp.abs(x) + jnp.square(x)
        c = jnp.concatenate([a, b, jnp.round(x * 4.0) / 4.0])
        d = jnp.stack([a, b], axis=1)
        return (
            jnp.vdot(c, c) + jnp.sum(d * jnp.eye(3, 2)) + jnp.sum(jnp.arange(3.0) * x)
        )

    x = np.array([-1.3, 0.0, 0.4])
    return f(x), jax.grad(f)(x), jax.jacrev(jax.grad(f))(x)


def prog_batched_jacobians(jax, jnp):
    def f(x):
        return jnp.sin(x) * jnp.sum(x)

    return jax.vmap(jax.jacrev(f))(D["x"]), jax.vmap(jax.jacfwd(f))(D["x"])


def prog_higher_derivatives(jax, jnp):
    d = jnp.tanh
    derivs = []
    for _ in range(4):
        d = jax.grad(d)
        derivs.append(d(0.3))
    return derivs


def prog_jacrev_of_jit_and_scalar_input(jax, jnp):
    f = jax.jit(lambda t: jnp.sin(t * D["v"]) * t)
    return (
        jax.jacrev(f)(0.7),
        jax.jacfwd(f)(0.7),
        jax.hessian(lambda t: jnp.sum(f(t)))(0.7),
    )


PROGRAMS = {
    name.removeprefix("prog_"): fn
    for name, fn in sorted(globals().items())
    if name.startswith("prog_")
}


def leaves_of(tree):
    return [np.asarray(leaf) for leaf in jax.tree_util.tree_leaves(tree)]


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_program_matches_jax(name: str) -> None:
    prog = PROGRAMS[name]
    ours = prog(ad, anp)
    theirs = prog(jax, jnp)
    assert ad.tree_structure(ours) == ad.tree_structure(
        jax.tree_util.tree_map(np.asarray, theirs)
    )
    ours_leaves, their_leaves = leaves_of(ours), leaves_of(theirs)
    assert len(ours_leaves) == len(their_leaves)
    for a, b in zip(ours_leaves, their_leaves):
        assert a.shape == b.shape, (a.shape, b.shape)
        np.testing.assert_allclose(a, b, rtol=TOL, atol=TOL)


def test_a_dozen_programs() -> None:
    assert len(PROGRAMS) >= 12


def test_tree_utilities_match_jax() -> None:
    tree = {"a": (1.0, np.ones(2)), "b": [None, 2.0, {"c": 3.0}]}
    other = {"a": (10.0, np.ones(2)), "b": [None, 20.0, {"c": 30.0}]}
    ours = ad.tree_map(lambda x, y: x + y, tree, other)
    theirs = jax.tree_util.tree_map(lambda x, y: x + y, tree, other)
    for a, b in zip(ad.tree_leaves(ours), jax.tree_util.tree_leaves(theirs)):
        np.testing.assert_array_equal(a, b)
    assert ad.tree_structure(ours) == ad.tree_structure(tree)
    assert (
        ad.tree_structure(tree).num_leaves
        == jax.tree_util.tree_structure(tree).num_leaves
    )
    assert str(ad.tree_structure((1.0, [2.0]))) == "(*, [*])"


def test_stop_gradient_under_every_transformation() -> None:
    x = np.array([0.5, -1.0, 2.0])
    f = lambda x: ad.reduce_sum(ad.sin(ad.stop_gradient(x)) * x)  # noqa: E731
    f_jax = lambda x: jnp.sum(jnp.sin(jax.lax.stop_gradient(x)) * x)  # noqa: E731
    np.testing.assert_allclose(ad.jit(ad.grad(f))(x), jax.grad(f_jax)(x), rtol=TOL)
    np.testing.assert_allclose(ad.hessian(f)(x), jax.hessian(f_jax)(x), atol=TOL)
    np.testing.assert_allclose(
        ad.vmap(ad.stop_gradient)(x), x
    )  # batching is the identity
    jaxpr, _, _ = ad.make_jaxpr(ad.stop_gradient, ad.get_aval(x))
    assert [e.primitive.name for e in jaxpr.eqns] == ["stop_gradient"]
    _, f_lin = ad.linearize(f, x)
    np.testing.assert_allclose(f_lin(x), np.sin(x) @ x, rtol=TOL)
    assert ad.stop_gradient({"k": (1.0, 2)})["k"][1] == 2  # pytrees, ints


# ---------------------------------------------------------------------------
# Errors (SPEC section 5) of the new entry points
# ---------------------------------------------------------------------------


def usable() -> None:
    assert ad.grad(ad.sin)(0.0) == 1.0


VEC = np.array([0.5, -1.0, 2.0])


def total(x, y=1.0):
    return ad.reduce_sum(x * y)


@pytest.mark.parametrize(
    "entry", [ad.grad, ad.value_and_grad, ad.jacfwd, ad.jacrev, ad.hessian]
)
def test_argnums_out_of_range(entry) -> None:
    with raises_clearly(ValueError, r"argnums 2 is out of range.*2 positional", usable):
        entry(total, argnums=2)(VEC, 2.0)
    with raises_clearly(ValueError, r"argnums -3 is out of range", usable):
        entry(total, argnums=(0, -3))(VEC, 2.0)


@pytest.mark.parametrize(
    "entry", [ad.grad, ad.value_and_grad, ad.jacfwd, ad.jacrev, ad.hessian]
)
@pytest.mark.parametrize("argnums", [1.0, "0", (0, "1"), (), True, [0]])
def test_argnums_not_ints(entry, argnums) -> None:
    with raises_clearly(
        TypeError, r"argnums must be an int or a non-empty tuple", usable
    ):
        entry(total, argnums=argnums)(VEC, 2.0)


@pytest.mark.parametrize("entry", [ad.grad, ad.value_and_grad])
@pytest.mark.parametrize(
    "out",
    [lambda x: ad.reduce_sum(x), lambda x: (ad.reduce_sum(x),), lambda x: [1, 2, 3]],
    ids=["scalar", "1-tuple", "3-list"],
)
def test_has_aux_without_a_pair(entry, out) -> None:
    with raises_clearly(TypeError, r"has_aux=True.*pair \(value, aux\)", usable):
        entry(out, has_aux=True)(VEC)


@pytest.mark.parametrize("entry", [ad.grad, ad.value_and_grad])
def test_non_scalar_output_under_new_entry_points(entry) -> None:
    with raises_clearly(TypeError, r"float scalar.*float64\[3\]", usable):
        entry(lambda x, y: x * y, argnums=(0, 1))(VEC, VEC)
    with raises_clearly(TypeError, r"float scalar.*float64\[3\]", usable):
        entry(lambda x: (x * 2.0, 0), has_aux=True)(VEC)


def test_grad_of_an_integer_argument_chosen_by_argnums() -> None:
    with raises_clearly(TypeError, r"float inputs.*int64", usable):
        ad.grad(total, argnums=1)(VEC, np.int64(2))


def test_concatenate_and_stack_errors() -> None:
    with raises_clearly(TypeError, r"concatenate: .*equal sizes off axis", usable):
        anp.concatenate([np.ones((2, 3)), np.ones((2, 4))])
    with raises_clearly(ValueError, r"stack: axis 3 is out of range", usable):
        anp.stack([VEC, VEC], axis=3)
    with raises_clearly(TypeError, r"vdot: .*same size", usable):
        anp.vdot(VEC, np.ones(2))
