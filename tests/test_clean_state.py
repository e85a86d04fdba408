"""Clean state after failure (issue 8).

User code raises inside nested transformations (jit, jvp, vmap, grad,
linearize, vjp, make_jaxpr, either branch of a cond; up to four deep, in
mixed orders) at every depth: in the innermost function, or in an outer one
after the inner transformations have finished. Afterwards

- the interpreter stack holds only this thread's evaluation level, and it is
  the dynamic level again;
- the *same* transformed function, called again without the exception, gives
  the right answer (so no cache kept anything of the failed trace), compared
  with the same composition in JAX;
- fresh jit, grad and vmap calls give the right answers (compared with NumPy).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import autodidax as ad

pytestmark = pytest.mark.usefixtures("clean_interpreter_stack")

X = np.array([0.3, -1.1, 0.7])
TOL = 1e-9


class Boom(Exception):
    """What the user's code raises."""


class BaseBoom(BaseException):
    """Not an Exception: like KeyboardInterrupt, it must also unwind cleanly."""


# Each transformation maps a function float64[3] -> float64[3] to another one,
# in autodidax and (for the reference) in JAX.


def _ad_vmap(f):
    return lambda x: ad.reduce_sum(ad.vmap(f)(ad.broadcast(x, (2, 3), (0,))), 0)


def _jax_vmap(f):
    return lambda x: jnp.sum(jax.vmap(f)(jnp.broadcast_to(x, (2, 3))), 0)


def _ad_make_jaxpr(f):
    def run(x):
        jaxpr, consts, _ = ad.make_jaxpr(f, x)
        ad.typecheck_jaxpr(jaxpr)
        return ad.eval_jaxpr(jaxpr, [*consts, x])[0]

    return run


TRANSFORMS: dict[str, tuple[Callable, Callable]] = {
    "jit": (ad.jit, jax.jit),
    "jvp": (
        lambda f: lambda x: ad.jvp(f, (x,), (x,))[1],
        lambda f: lambda x: jax.jvp(f, (x,), (x,))[1],
    ),
    "vmap": (_ad_vmap, _jax_vmap),
    "grad": (
        lambda f: ad.grad(lambda y: ad.reduce_sum(ad.sin(f(y)))),
        lambda f: jax.grad(lambda y: jnp.sum(jnp.sin(f(y)))),
    ),
    "linearize": (
        lambda f: lambda x: ad.linearize(f, x)[1](x),
        lambda f: lambda x: jax.linearize(f, x)[1](x),
    ),
    "vjp": (
        lambda f: lambda x: ad.vjp(f, x)[1](x)[0],
        lambda f: lambda x: jax.vjp(f, x)[1](x)[0],
    ),
    "make_jaxpr": (_ad_make_jaxpr, lambda f: f),
    "cond-true": (
        lambda f: lambda x: ad.cond(ad.reduce_sum(x) > -100.0, f, lambda y: y, x),
        lambda f: lambda x: lax.cond(jnp.sum(x) > -100.0, f, lambda y: y, x),
    ),
    "cond-false": (
        lambda f: lambda x: ad.cond(ad.reduce_sum(x) < -100.0, lambda y: y, f, x),
        lambda f: lambda x: lax.cond(jnp.sum(x) < -100.0, lambda y: y, f, x),
    ),
}


def build(names: tuple[str, ...], lib: int, control: dict) -> Callable:
    """``names[0](names[1](...(inner)))`` for library ``lib`` (0: autodidax,
    1: JAX). The function at depth ``control["raise_at"]`` (1 = outermost)
    raises ``control["error"]`` after computing its value, if set."""
    sin = (ad.sin, jnp.sin)[lib]

    def body_at(depth: int) -> Callable:
        if depth > len(names):
            return lambda x: sin(x) * 2.0
        inner = TRANSFORMS[names[depth - 1]][lib](body_at(depth + 1))

        def body(x):
            y = inner(x)
            if lib == 0 and control.get("raise_at") == depth:
                if control["error"] == "autodidax":
                    ad.add(y, np.ones(4))  # a shape error from autodidax itself
                raise control["error"](f"from depth {depth}")
            return sin(y) * x

        return body

    return body_at(1)


def assert_clean_and_usable() -> None:
    """Only the evaluation level is left; fresh transformations work."""
    assert len(ad._state.stack) == 1
    assert ad._state.stack[0].number == 0
    assert ad._state.dynamic is ad._state.stack[0]
    np.testing.assert_allclose(ad.jit(lambda x: ad.cos(x) * x)(X), np.cos(X) * X)
    np.testing.assert_allclose(
        ad.grad(lambda x: ad.reduce_sum(ad.sin(x) * x))(X),
        np.cos(X) * X + np.sin(X),
        rtol=1e-12,
    )
    m = np.arange(6.0).reshape(3, 2)
    np.testing.assert_allclose(ad.vmap(ad.sin, 1)(m), np.sin(m).T, rtol=1e-12)


def _nests() -> list:
    """Every nest of depth 1 and 2 (raising at each depth), and a fixed sample
    of depth 3 and 4 (raising at a drawn depth)."""
    names = list(TRANSFORMS)
    cases = [
        (nest, depth)
        for k in (1, 2)
        for nest in itertools.product(names, repeat=k)
        for depth in range(1, k + 1)
    ]
    rng = np.random.default_rng(8)
    for k, count in ((3, 36), (4, 36)):
        for _ in range(count):
            nest = tuple(str(s) for s in rng.choice(names, size=k))
            cases.append((nest, int(rng.integers(1, k + 1))))
    return cases


NESTS = _nests()


@pytest.mark.parametrize(
    "nest, raise_at", NESTS, ids=[f"{'-'.join(n)}@{d}" for n, d in NESTS]
)
def test_user_exception_leaves_clean_state(nest, raise_at):
    control = {"raise_at": raise_at, "error": Boom}
    ours = build(nest, 0, control)
    with pytest.raises(Boom, match=f"from depth {raise_at}"):
        ours(X)
    assert_clean_and_usable()
    # The same function object again, now without the exception.
    control["raise_at"] = None
    expected = jax.jit(build(nest, 1, {}))(X)
    np.testing.assert_allclose(ours(X), expected, rtol=TOL, atol=TOL)
    assert_clean_and_usable()


@pytest.mark.parametrize(
    "nest, raise_at",
    [
        (("jit",), 1),
        (("grad", "jit"), 2),
        (("vmap", "cond-true"), 2),
        (("jit", "linearize", "vmap"), 3),
        (("cond-false", "jvp", "jit", "grad"), 2),
    ],
    ids=lambda v: "-".join(v) if isinstance(v, tuple) else str(v),
)
@pytest.mark.parametrize("error", [BaseBoom, "autodidax"], ids=["BaseException", "ad"])
def test_other_exceptions_leave_clean_state(nest, raise_at, error):
    """A BaseException (like KeyboardInterrupt) and autodidax's own errors
    unwind the same way."""
    control = {"raise_at": raise_at, "error": error}
    ours = build(nest, 0, control)
    expected_type = TypeError if error == "autodidax" else BaseBoom
    with pytest.raises(expected_type):
        ours(X)
    assert_clean_and_usable()
    control["raise_at"] = None
    expected = jax.jit(build(nest, 1, {}))(X)
    np.testing.assert_allclose(ours(X), expected, rtol=TOL, atol=TOL)


def test_many_failures_in_a_row_do_not_accumulate():
    """A hundred failing traces leave nothing behind (no levels, no dynamic
    trace) and a jitted function still traces once per signature."""
    traces = []

    def f(x, fail):
        traces.append(1)
        y = ad.sin(x)
        if fail:
            raise Boom
        return y

    for _ in range(100):
        with pytest.raises(Boom):
            ad.grad(lambda x: ad.reduce_sum(ad.jit(lambda y: f(y, True))(x)))(X)
        assert len(ad._state.stack) == 1
        assert ad._state.dynamic is ad._state.stack[0]
    jitted = ad.jit(lambda x: f(x, False))
    traces.clear()
    for _ in range(3):
        np.testing.assert_allclose(jitted(X), np.sin(X), rtol=1e-12)
    assert len(traces) == 1
    assert_clean_and_usable()


def test_failure_inside_cond_branch_inside_jit_then_same_jit_works():
    """A cond branch that fails only for one input signature: the failure
    leaves the jitted function usable for the other signature and later for
    the failing one once the condition is gone."""
    state = {"fail": True}

    def true_fn(x):
        if state["fail"] and x.shape == (3,):
            raise Boom
        return ad.sin(x)

    f = ad.jit(lambda x: ad.cond(ad.reduce_sum(x) > 0.0, true_fn, ad.cos, x))
    with pytest.raises(Boom):
        f(X)
    assert_clean_and_usable()
    y = np.array([0.5, 0.25])
    np.testing.assert_allclose(f(y), np.sin(y), rtol=1e-12)
    state["fail"] = False
    expected = np.sin(X) if X.sum() > 0 else np.cos(X)
    np.testing.assert_allclose(f(X), expected, rtol=1e-12)
    assert_clean_and_usable()
