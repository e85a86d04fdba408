"""Part 10: the stackless core (autodidax.stackless) against real JAX.

Small programs only (the file stays fast): every transformation of the new
core alone and composed, compared with JAX in float64; the perturbation
confusion program; errors; and that the new core replaces nothing in the main
module and reaches it only through ``ad``.
"""

from __future__ import annotations

import dis
import inspect
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import autodidax as ad
from autodidax import stackless as sl


def close(got, want) -> None:
    got_leaves, want_leaves = jax.tree.leaves(got), jax.tree.leaves(want)
    assert len(got_leaves) == len(want_leaves)
    for g, w in zip(got_leaves, want_leaves):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-9, atol=1e-12)


def f_sl(x):
    return -2.0 * sl.sin(x) + x


def f_jax(x):
    return -2.0 * jnp.sin(x) + x


def g_sl(x):  # a vector -> scalar function with every kind of primitive
    y = sl.transpose(sl.broadcast(x, (2, x.shape[0]), (0,)), (1, 0))
    return sl.reduce_sum(sl.cos(y) * sl.sin(y)) + sl.reduce_sum(-x * x)


def g_jax(x):
    y = jnp.broadcast_to(x, (2, x.shape[0])).T
    return jnp.sum(jnp.cos(y) * jnp.sin(y)) + jnp.sum(-x * x)


X = np.array([0.3, -1.2, 2.5])
SCALAR = ad.ShapedArray((), np.float64)


def test_eval_and_running_example():
    close(sl.jvp(f_sl, (3.0,), (1.0,)), jax.jvp(f_jax, (3.0,), (1.0,)))
    close(g_sl(X), g_jax(X))


def test_jvp_of_vectors_and_pytrees():
    t = np.array([1.0, 0.5, -2.0])
    close(sl.jvp(g_sl, (X,), (t,)), jax.jvp(g_jax, (X,), (t,)))

    def h(d):
        return {"s": d["a"] * sl.cos(d["b"]), "t": (d["a"],)}

    def h_jax(d):
        return {"s": d["a"] * jnp.cos(d["b"]), "t": (d["a"],)}

    args = ({"a": X, "b": X + 1.0},)
    tans = ({"a": np.ones(3), "b": t},)
    close(sl.jvp(h, args, tans), jax.jvp(h_jax, args, tans))


@pytest.mark.parametrize("order", [1, 2, 3, 4])
def test_nested_jvp_to_fourth_order(order):
    def nest(jvp, fn):
        for _ in range(order):
            fn = (lambda inner: lambda x: jvp(inner, (x,), (1.0,))[1])(fn)
        return fn

    got = nest(sl.jvp, lambda x: sl.sin(x) * x)(0.7)
    want = nest(jax.jvp, lambda x: jnp.sin(x) * x)(0.7)
    close(got, want)


def perturbation_program(jvp, add_fn):
    def derivative(fn):
        return lambda x: jvp(fn, (x,), (1.0,))[1]

    return derivative(lambda x: x * derivative(lambda y: add_fn(x, y))(1.0))(1.0)


def test_perturbation_confusion_is_avoided_by_both_cores():
    want = perturbation_program(jax.jvp, jnp.add)
    assert float(want) == 1.0
    close(perturbation_program(sl.jvp, sl.add), want)
    close(perturbation_program(ad.jvp, ad.add), want)


def test_closed_over_tracer_of_an_outer_transformation():
    def outer_sl(x):
        return sl.jvp(lambda y: x * sl.sin(y), (2.0,), (1.0,))[1]

    def outer_jax(x):
        return jax.jvp(lambda y: x * jnp.sin(y), (2.0,), (1.0,))[1]

    close(sl.jvp(outer_sl, (1.5,), (1.0,)), jax.jvp(outer_jax, (1.5,), (1.0,)))
    close(sl.grad(outer_sl)(1.5), jax.grad(outer_jax)(1.5))


def test_python_control_flow_on_concrete_values():
    def soft_abs(x, np_):
        if x < -1.0:
            return -x
        if x < 1.0:
            return x * x * 0.5 + 0.5
        return x

    for x in (-2.0, 0.5, 3.0):
        want_jvp = jax.jvp(lambda x: soft_abs(x, jnp), (x,), (1.0,))
        close(sl.jvp(lambda x: soft_abs(x, sl), (x,), (1.0,)), want_jvp)
        want_grad = jax.grad(lambda x: soft_abs(x, jnp))(x)
        close(sl.grad(lambda x: soft_abs(x, sl))(x), want_grad)


def test_vmap_with_in_axes():
    mats = np.arange(6.0).reshape(2, 3)
    got = sl.vmap(lambda m, v: sl.reduce_sum(m * v), in_axes=(1, None))(mats, 2.0)
    want = jax.vmap(lambda m, v: jnp.sum(m * v), in_axes=(1, None))(mats, 2.0)
    close(got, want)
    got = sl.vmap(lambda a, b: sl.sin(a) * b, in_axes=(0, -1))(mats, mats.T)
    want = jax.vmap(lambda a, b: jnp.sin(a) * b, in_axes=(0, -1))(mats, mats.T)
    close(got, want)
    got = sl.vmap(lambda d: d["x"] + 1.0, in_axes=({"x": 1},))({"x": mats})
    close(got, jax.vmap(lambda d: d["x"] + 1.0, in_axes=({"x": 1},))({"x": mats}))
    close(sl.vmap(g_sl)(np.stack([X, 2 * X])), jax.vmap(g_jax)(np.stack([X, 2 * X])))


def test_vmap_of_jvp_and_jvp_of_vmap():
    xs, ts = np.stack([X, -X]), np.ones((2, 3))
    got = sl.vmap(lambda x, t: sl.jvp(g_sl, (x,), (t,)))(xs, ts)
    want = jax.vmap(lambda x, t: jax.jvp(g_jax, (x,), (t,)))(xs, ts)
    close(got, want)
    close(
        sl.jvp(sl.vmap(f_sl), (X,), (np.ones(3),)),
        jax.jvp(jax.vmap(f_jax), (X,), (np.ones(3),)),
    )


def test_make_jaxpr_stages_everything():
    jaxpr, consts, _ = sl.make_jaxpr(lambda: sl.mul(2.0, 2.0))
    assert [e.primitive.name for e in jaxpr.eqns] == ["mul"]
    jax_jaxpr = jax.make_jaxpr(lambda: jax.lax.mul(2.0, 2.0))().jaxpr
    assert [e.primitive.name for e in jax_jaxpr.eqns] == ["mul"]

    scalar = ad.ShapedArray((), np.float64)
    jaxpr, consts, out_tree = sl.make_jaxpr(f_sl, scalar)
    want = jax.make_jaxpr(f_jax)(1.0).jaxpr
    assert [e.primitive.name for e in jaxpr.eqns] == ["sin", "mul", "add"]
    assert [e.primitive.name for e in want.eqns] == ["sin", "mul", "add"]
    ad.typecheck_jaxpr(jaxpr)
    close(sl.eval_jaxpr(jaxpr, [*consts, 0.8]), [f_jax(0.8)])


def shared_programs(m):
    """Part 1's and Part 2's programs, written for a core ``m`` (the chapter's)."""
    vec = ad.ShapedArray((3,), np.float64)
    return {
        "f(3.0)": m.add(m.mul(-2.0, m.sin(3.0)), 3.0),
        "jvp of f": m.jvp(lambda x: -2.0 * m.sin(x) + x, (3.0,), (1.0,)),
        "4th derivative of sin": m.jvp(
            lambda x: m.jvp(lambda y: m.jvp(m.cos, (y,), (1.0,))[1], (x,), (1.0,))[1],
            (3.0,),
            (1.0,),
        ),
        "jvp of vmap": m.jvp(m.vmap(m.sin), (X,), (np.ones(3),)),
        "omnistaging": str(m.make_jaxpr(lambda: m.mul(2.0, 2.0))[0]),
        "x * 2": str(m.make_jaxpr(lambda x: m.mul(x, 2.0), vec)[0]),
        "jvp jaxpr": str(m.make_jaxpr(lambda x: m.jvp(m.sin, (x,), (1.0,)), SCALAR)[0]),
    }


def test_both_cores_print_the_same_for_the_shared_programs():
    main, new = shared_programs(ad), shared_programs(sl)
    for name in main:
        assert str(main[name]) == str(new[name]), name
    close(main["4th derivative of sin"][1], np.sin(3.0))
    close(new["jvp of f"], jax.jvp(f_jax, (3.0,), (1.0,)))


def test_make_jaxpr_of_transformations():
    scalar = ad.ShapedArray((), np.float64)
    jvp_jaxpr, consts, _ = sl.make_jaxpr(lambda x: sl.jvp(sl.sin, (x,), (1.0,)), scalar)
    close(sl.eval_jaxpr(jvp_jaxpr, [*consts, 0.4]), jax.jvp(jnp.sin, (0.4,), (1.0,)))
    grad_jaxpr, consts, _ = sl.make_jaxpr(sl.grad(f_sl), scalar)
    close(sl.eval_jaxpr(grad_jaxpr, [*consts, 0.4]), [jax.grad(f_jax)(0.4)])
    vec = ad.ShapedArray((3,), np.float64)
    vmap_jaxpr, consts, _ = sl.make_jaxpr(sl.vmap(f_sl), vec)
    close(sl.eval_jaxpr(vmap_jaxpr, [*consts, X]), [jax.vmap(f_jax)(X)])


def test_jit_traces_once_and_agrees():
    traced = []

    def body(x):
        traced.append(1)
        return sl.sin(x) * 2.0 + x

    fast = sl.jit(body)
    close(fast(X), jax.jit(lambda x: jnp.sin(x) * 2.0 + x)(X))
    close(fast(2 * X), jnp.sin(2 * X) * 2.0 + 2 * X)
    assert len(traced) == 1
    jaxpr = sl.make_jaxpr(fast, ad.ShapedArray((3,), np.float64))[0]
    assert [e.primitive.name for e in jaxpr.eqns] == ["xla_call"]


def test_compositions_with_jit_and_grad():
    close(sl.grad(g_sl)(X), jax.grad(g_jax)(X))
    close(sl.jit(sl.grad(g_sl))(X), jax.jit(jax.grad(g_jax))(X))
    close(sl.grad(sl.jit(g_sl))(X), jax.grad(jax.jit(g_jax))(X))
    close(sl.grad(sl.grad(f_sl))(0.9), jax.grad(jax.grad(f_jax))(0.9))
    close(sl.vmap(sl.grad(f_sl))(X), jax.vmap(jax.grad(f_jax))(X))
    close(
        sl.jvp(sl.grad(f_sl), (0.9,), (1.0,)), jax.jvp(jax.grad(f_jax), (0.9,), (1.0,))
    )
    close(sl.jvp(sl.jit(g_sl), (X,), (X,)), jax.jvp(jax.jit(g_jax), (X,), (X,)))
    close(sl.vmap(sl.jit(f_sl))(X), jax.vmap(jax.jit(f_jax))(X))
    nested = sl.jit(lambda x: sl.jit(f_sl)(x) * x)
    close(sl.grad(nested)(0.6), jax.grad(lambda x: jax.jit(f_jax)(x) * x)(0.6))


def test_linearize():
    y, f_lin = sl.linearize(g_sl, X)
    y_jax, f_lin_jax = jax.linearize(g_jax, X)
    close(y, y_jax)
    close(f_lin(np.ones(3)), f_lin_jax(np.ones(3)))


def test_leaked_tracer_is_a_clear_error():
    leaked = []
    sl.jvp(lambda x: leaked.append(x) or sl.sin(x), (1.0,), (1.0,))
    with pytest.raises(sl.UnexpectedTracerError, match="JVPTracer.*finished"):
        sl.sin(leaked[0])
    with pytest.raises(sl.UnexpectedTracerError, match="finished"):
        bool(leaked[0])
    assert issubclass(sl.UnexpectedTracerError, TypeError)

    staged = []
    sl.make_jaxpr(lambda x: staged.append(x) or x, ad.ShapedArray((), np.float64))
    with pytest.raises(sl.UnexpectedTracerError, match="StagingTracer"):
        sl.mul(staged[0], 2.0)


def test_errors_reuse_the_main_messages():
    with pytest.raises(TypeError, match="grad: f must return a float scalar"):
        sl.grad(lambda x: x * 1.0)(X)
    with pytest.raises(TypeError, match="float inputs, got dtype int64"):
        sl.grad(f_sl)(np.int64(1))
    with pytest.raises(TypeError, match="add: operands must have the same shape"):
        sl.add(np.ones(3), np.ones(4))
    with pytest.raises(TypeError, match="sin: expected a float"):
        sl.sin(np.int64(1))
    with pytest.raises(TypeError, match="expected an array or a number"):
        sl.sin("three")
    with pytest.raises(ValueError, match="tangent 0 is float64"):
        sl.jvp(sl.sin, (1.0,), (np.ones(2),))
    with pytest.raises(ValueError, match="one batch size"):
        sl.vmap(sl.add)(np.ones(3), np.ones(4))
    with pytest.raises(ValueError, match="in_axes 2 is out of range"):
        sl.vmap(sl.sin, in_axes=2)(np.ones(3))
    with pytest.raises(sl.ConcretizationError, match="staged out"):
        sl.jit(lambda x: x if x > 0.0 else -x)(1.0)
    with pytest.raises(sl.ConcretizationError, match="batched value"):
        sl.vmap(lambda x: x if x > 0.0 else -x)(X)
    with pytest.raises(ValueError, match="not a permutation"):
        sl.transpose(np.ones((2, 3)), (0, 0))


def test_the_new_core_replaces_nothing_in_the_main_module():
    assert ad.jvp is not sl.jvp and ad.bind is not sl.bind
    assert inspect.getmodule(ad.jvp) is ad
    assert ad.stackless is sl
    assert "autodidax.stackless" in __import__("sys").modules
    # the main core still works, and still by levels
    close(ad.jvp(ad.sin, (1.0,), (1.0,)), jax.jvp(jnp.sin, (1.0,), (1.0,)))
    assert len(ad._state.stack) == 1


def _global_names(code: types.CodeType) -> set[str]:
    names = {i.argval for i in dis.get_instructions(code) if i.opname == "LOAD_GLOBAL"}
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _global_names(const)
    return names


def test_the_new_core_reaches_the_main_module_only_through_ad():
    # The chapter's cells are the body of one function in autodidax.py; any
    # global name it reads would be a main-module name found by accident (and
    # a different one in the chapter's notebook, where the cells run at top
    # level). Only builtins may be read as globals.
    builtins = set(
        dir(__builtins__ if isinstance(__builtins__, dict) else __builtins__)
    )
    builtins |= set(__builtins__) if isinstance(__builtins__, dict) else set()
    names = _global_names(ad._stackless_namespace.__code__)
    assert names <= builtins, names - builtins


def test_source_and_tracebacks_point_into_autodidax_py():
    assert inspect.getsourcefile(sl.bind) == ad.__file__
    assert "trace.process_primitive(prim, args, params)" in inspect.getsource(sl.bind)
    leaked = []
    sl.jvp(lambda x: leaked.append(x) or x, (1.0,), (1.0,))
    try:
        sl.sin(leaked[0])
    except sl.UnexpectedTracerError as error:
        frames = [
            f.filename for f in __import__("traceback").extract_tb(error.__traceback__)
        ]
        assert frames[-1] == ad.__file__


def test_bind_leaves_the_evaluation_trace_current_and_rules_run_under_parent(
    monkeypatch,
):
    # The chapter: "`bind` hands the primitive to the current trace, with the
    # evaluation trace made current while that trace processes it" and "runs
    # its rules with the parent current".
    seen = []
    process, rule = sl.JVPTrace.process_primitive, sl.jvp_rules[sl.ad.sin_p]

    def spy_process(self, prim, args, params):
        seen.append(("process", self, sl.current_trace()))
        return process(self, prim, args, params)

    def spy_rule(primals, tangents):
        seen.append(("rule", None, sl.current_trace()))
        return rule(primals, tangents)

    monkeypatch.setattr(sl.JVPTrace, "process_primitive", spy_process)
    monkeypatch.setitem(sl.jvp_rules, sl.ad.sin_p, spy_rule)
    traces = []

    def inner(x):
        traces.append(sl.current_trace())
        return sl.sin(x)

    sl.jvp(lambda x: sl.jvp(inner, (x,), (1.0,))[1], (0.5,), (1.0,))
    (inner_trace,) = traces
    assert inner_trace.parent is not None
    # the inner trace processes sin with the evaluation trace current ...
    assert seen[0] == ("process", inner_trace, sl.eval_trace)
    # ... and runs sin's rule with its parent, the outer JVP trace, current
    assert seen[1] == ("rule", None, inner_trace.parent)
    assert sl.current_trace() is sl.eval_trace


def test_zeros_like_of_another_traces_tracer_is_an_array():
    # The chapter: zeros_like(x) is "a NumPy array of zeros of `x`'s shape and
    # dtype, even when `x` is another trace's tracer".
    seen = []

    def inner(x):
        def body(y):
            seen.append(sl.zeros_like(x))
            return x * y

        return sl.jvp(body, (np.full(3, 2.0),), (np.ones(3),))[1]

    sl.jvp(inner, (np.ones(3),), (np.ones(3),))
    (zero,) = seen
    assert type(zero) is np.ndarray and zero.shape == (3,) and not zero.any()


def careless_jvp_trace():
    """The chapter's JVP trace without `with set_current_trace(self.parent)`."""

    class CarelessJVPTrace(sl.JVPTrace):
        def process_primitive(self, prim, args, params):
            primals, tangents = zip(*map(self.primal_tangent, args))
            p_out, t_out = sl.jvp_rules[prim](primals, tangents, **params)
            return [sl.JVPTracer(self, p, t) for p, t in zip(p_out, t_out)]

    def careless_derivative(fun, x):
        with sl.transformation(CarelessJVPTrace(sl.current_trace())) as trace:
            return trace.primal_tangent(fun(sl.JVPTracer(trace, x, 1.0)))[1]

    return careless_derivative


def test_without_making_the_parent_current_nesting_fails():
    # The chapter: one careless derivative is right; nest two and the inner
    # rule's sin lands on the evaluation trace, which refuses it.
    careless = careless_jvp_trace()
    close(careless(sl.sin, 3.0), jax.jvp(jnp.sin, (3.0,), (1.0,))[1])
    with pytest.raises(
        sl.UnexpectedTracerError, match="evaluation trace was given a JVPTracer"
    ):
        careless(lambda x: careless(sl.sin, x), 3.0)
    # the same nesting with the chapter's JVP trace is right
    close(
        sl.jvp(lambda x: sl.jvp(sl.sin, (x,), (1.0,))[1], (3.0,), (1.0,))[1],
        -np.sin(3.0),
    )
    # and under staging the careless trace fails too
    with pytest.raises(sl.UnexpectedTracerError, match="StagingTracer"):
        sl.make_jaxpr(lambda x: careless(sl.sin, x), SCALAR)


def test_a_tracer_of_a_transformation_running_in_another_thread_is_refused():
    import threading

    errors = []

    def body(x):
        thread = threading.Thread(target=lambda: _try(lambda: sl.sin(x), errors))
        thread.start()
        thread.join()
        return x

    sl.jvp(body, (1.0,), (1.0,))
    (error,) = errors
    assert isinstance(error, sl.UnexpectedTracerError)
    assert "evaluation trace was given a JVPTracer of type float64[]" in str(error)


def _try(fn, errors):
    try:
        fn()
    except Exception as error:  # noqa: BLE001 - recorded for the test to check
        errors.append(error)


def test_jit_does_not_cache_a_jaxpr_closing_over_a_live_tracer():
    traced = []

    def outer(x):
        def body(y):
            traced.append(1)
            return x * y

        fast = sl.jit(body)
        return fast(2.0) + fast(3.0)

    got = sl.jvp(outer, (1.5,), (1.0,))
    want = jax.jvp(lambda x: x * 2.0 + x * 3.0, (1.5,), (1.0,))
    close(got, want)
    assert len(traced) == 2  # traced again: the first jaxpr held a dead tracer


def test_residuals_are_constants_or_scalar_literals():
    # The chapter: residuals "become the constants of the recorded jaxpr,
    # except NumPy scalars, which the staging trace writes into it as literals
    # (`cos(1.0)` in `grad(sin)(1.0)`, say)".
    _, linear, residuals = sl.linearize_flat(lambda x: [sl.sin(x)], [np.float64(1.0)])
    assert residuals == []
    (eqn,) = linear.eqns
    lits = [a.val for a in eqn.inputs if isinstance(a, ad.Lit)]
    close(lits, [np.cos(1.0)])
    _, linear, residuals = sl.linearize_flat(lambda x: [sl.sin(x)], [X])
    close(residuals, [np.cos(X)])
    assert linear.in_binders[0].aval.shape == (3,)


# Seeded random programs (no Hypothesis, to keep this file fast): each is a
# list of operations on a float64[3] input, run on both cores' spellings.
OPS = ["sin", "cos", "neg", "add", "mul", "sum_bcast", "trans_sum", "scale"]


def random_program(rng: np.random.Generator, n_ops: int) -> list:
    return [
        (
            OPS[rng.integers(len(OPS))],
            int(rng.integers(i + 1)),
            int(rng.integers(i + 1)),
        )
        for i in range(n_ops)
    ]


OURS = {
    "sin": lambda a, b: sl.sin(a),
    "cos": lambda a, b: sl.cos(a),
    "neg": lambda a, b: sl.neg(a),
    "add": lambda a, b: sl.add(a, b),
    "mul": lambda a, b: sl.mul(a, b),
    "sum_bcast": lambda a, b: sl.broadcast(sl.reduce_sum(a), (3,), (0,)),
    "trans_sum": lambda a, b: sl.reduce_sum(
        sl.transpose(sl.broadcast(a, (2, 3), (0,)), (1, 0)), axis=1
    ),
    "scale": lambda a, b: a * 0.5,
}
THEIRS = {
    "sin": lambda a, b: jnp.sin(a),
    "cos": lambda a, b: jnp.cos(a),
    "neg": lambda a, b: -a,
    "add": lambda a, b: a + b,
    "mul": lambda a, b: a * b,
    "sum_bcast": lambda a, b: jnp.broadcast_to(jnp.sum(a), (3,)),
    "trans_sum": lambda a, b: jnp.sum(jnp.broadcast_to(a, (2, 3)).T, axis=1),
    "scale": lambda a, b: a * 0.5,
}


def run_program(prog: list, ops: dict, x):
    vals = [x]
    for op, i, j in prog:
        vals.append(ops[op](vals[i], vals[j]))
    return vals[-1]


@pytest.mark.parametrize("seed", range(12))
def test_random_programs_under_every_transformation(seed):
    rng = np.random.default_rng(seed)
    prog = random_program(rng, n_ops=int(rng.integers(2, 7)))
    x, t = rng.uniform(-1, 1, 3), rng.uniform(-1, 1, 3)
    xs = rng.uniform(-1, 1, (2, 3))

    def ours(x):
        return run_program(prog, OURS, x)

    def theirs(x):
        return run_program(prog, THEIRS, x)

    def ours_loss(x):
        return sl.reduce_sum(ours(x))

    def theirs_loss(x):
        return jnp.sum(theirs(x))

    close(ours(x), theirs(x))
    close(sl.jvp(ours, (x,), (t,)), jax.jvp(theirs, (x,), (t,)))
    close(sl.vmap(ours)(xs), jax.vmap(theirs)(xs))
    close(sl.jit(ours)(x), jax.jit(theirs)(x))
    close(sl.grad(ours_loss)(x), jax.grad(theirs_loss)(x))
    close(sl.grad(sl.jit(ours_loss))(x), jax.grad(jax.jit(theirs_loss))(x))
    close(sl.vmap(sl.grad(ours_loss))(xs), jax.vmap(jax.grad(theirs_loss))(xs))
    close(
        sl.jvp(sl.grad(ours_loss), (x,), (t,)),
        jax.jvp(jax.grad(theirs_loss), (x,), (t,)),
    )
