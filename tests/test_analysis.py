"""Tests of the chapter on interpreters that read programs (book/analysis.md).

``cost_analysis`` is checked against XLA's own cost analysis of the same
program written with jax.numpy: ``jax.jit(f).lower(*args).compile()
.cost_analysis()`` for loop-free programs where XLA's optimizer does not
rewrite the arithmetic, and ``Lowered.cost_analysis()`` (before
optimization) for every loop-free program. Loops are checked as trip count
times XLA's count of their (loop-free) body; ``cond`` as XLA's count of the
branch taken, or the larger branch key by key. ``debug.print`` is checked
against ``jax.debug.print``'s output for the same program, eagerly, under
jit, vmap, jvp and grad, and inside scan, cond and while_loop.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import nothing_compiled, raises_clearly

import autodidax as ad

pytestmark = pytest.mark.usefixtures("clean_interpreter_stack")

anp = ad.numpy
F64 = np.float64
KEYS = ("flops", "transcendentals")
rng = np.random.default_rng(0)


def xla_compiled(f, *args) -> dict:
    """XLA's counts for JAX's optimized program (missing keys are zero)."""
    costs = jax.jit(f).lower(*args).compile().cost_analysis()
    return {k: costs.get(k, 0.0) for k in (*KEYS, "bytes accessed")}


def xla_lowered(f, *args) -> dict:
    """XLA's counts for JAX's program before optimization."""
    costs = jax.jit(f).lower(*args).cost_analysis()
    return {k: costs.get(k, 0.0) for k in (*KEYS, "bytes accessed")}


def pick(costs: dict, keys=KEYS) -> dict:
    return {k: costs[k] for k in keys}


def avals(*args):
    return [ad.ShapedArray(np.shape(a), np.asarray(a).dtype) for a in args]


# ---------------------------------------------------- loop-free, against XLA

m34, m45, v7 = rng.normal(size=(3, 4)), rng.normal(size=(4, 5)), rng.normal(size=7)
w, b, x = rng.normal(size=(16, 32)), rng.normal(size=32), rng.normal(size=(8, 16))
pos = rng.uniform(0.5, 2.0, size=(6, 7))
stack_a, stack_b = rng.normal(size=(4, 3, 5)), rng.normal(size=(4, 5, 2))

# name: (ours, JAX's, arguments); XLA's optimizer keeps their arithmetic
SAME_AFTER_OPTIMIZING = {
    "matrix product": (lambda a, b: a @ b, lambda a, b: a @ b, (m34, m45)),
    "matrix-vector": (
        lambda a, v: a @ v,
        lambda a, v: a @ v,
        (m45.T, rng.normal(size=4)),
    ),
    "batched product (vmap)": (
        ad.vmap(lambda a, b: a @ b),
        jax.vmap(lambda a, b: a @ b),
        (stack_a, stack_b),
    ),
    "dot_general, two contracted axes": (
        lambda a, b: ad.dot_general(a, b, (((1, 2), (0, 1)), ((), ()))),
        lambda a, b: jax.lax.dot_general(a, b, (((1, 2), (0, 1)), ((), ()))),
        (rng.normal(size=(2, 3, 4)), rng.normal(size=(3, 4, 5))),
    ),
    "layer with broadcast bias": (
        lambda w, b, x: anp.tanh(x @ w + b),
        lambda w, b, x: jnp.tanh(x @ w + b),
        (w, b, x),
    ),
    "elementwise chain": (
        lambda x: anp.sin(x) * 2.0 + x - x / 3.0,
        lambda x: jnp.sin(x) * 2.0 + x - x / 3.0,
        (pos,),
    ),
    "transcendentals": (
        lambda x: anp.exp(x) + anp.log(x) + anp.tanh(x) + ad.cos(x),
        lambda x: jnp.exp(x) + jnp.log(x) + jnp.tanh(x) + jnp.cos(x),
        (pos,),
    ),
    "reductions": (
        lambda x: anp.sum(x, axis=0) + anp.max(x, axis=0) + anp.sum(x),
        lambda x: x.sum(axis=0) + x.max(axis=0) + x.sum(),
        (pos,),
    ),
    "comparison and select": (
        lambda x: anp.where(x > 1.0, x, -x),
        lambda x: jnp.where(x > 1.0, x, -x),
        (pos,),
    ),
    "integer powers": (lambda x: x**5, lambda x: x**5, (pos,)),
    "negative power": (lambda x: x**-3, lambda x: x**-3, (pos,)),
    "maximum": (lambda x: anp.maximum(x, 1.0), lambda x: jnp.maximum(x, 1.0), (pos,)),
    "sqrt and rsqrt": (
        lambda x: ad.sqrt(x) * ad.rsqrt(x),
        lambda x: jnp.sqrt(x) * jax.lax.rsqrt(x),
        (pos,),
    ),
}

# programs whose arithmetic XLA's optimizer changes (the chapter says how)
REWRITTEN = {
    "softmax": (
        lambda x: (lambda e: e / anp.sum(e, axis=1, keepdims=True))(
            anp.exp(x - anp.max(x, axis=1, keepdims=True))
        ),
        lambda x: (lambda e: e / e.sum(axis=1, keepdims=True))(
            jnp.exp(x - x.max(axis=1, keepdims=True))
        ),
        (pos,),
    ),
    "shared x*x": (
        lambda x: x**3 + x**-2 + anp.log(x),
        lambda x: x**3 + x**-2 + jnp.log(x),
        (pos,),
    ),
    "dot of two vectors": (lambda u: u @ u, lambda u: u @ u, (rng.normal(size=100),)),
}


@pytest.mark.parametrize("name", SAME_AFTER_OPTIMIZING)
def test_counts_equal_xla_compiled(name):
    ours, theirs, args = SAME_AFTER_OPTIMIZING[name]
    expected = pick(xla_compiled(theirs, *args))
    assert pick(ad.cost_analysis(ours, *args)) == expected
    assert pick(ad.cost_analysis(ours, *avals(*args))) == expected  # types only


@pytest.mark.parametrize("name", [*SAME_AFTER_OPTIMIZING, *REWRITTEN])
def test_counts_equal_xla_before_optimizing(name):
    ours, theirs, args = {**SAME_AFTER_OPTIMIZING, **REWRITTEN}[name]
    assert pick(ad.cost_analysis(ours, *args)) == pick(xla_lowered(theirs, *args))


@pytest.mark.parametrize(
    "ours, theirs",
    [
        (lambda x: anp.sin(x), jnp.sin),
        (lambda x: anp.sum(x, axis=1), lambda x: x.sum(axis=1)),
        (lambda x: ad.reshape(x, (42,)), lambda x: x.reshape(42)),
        (lambda x: x.astype(np.float32), lambda x: x.astype(jnp.float32)),
    ],
)
def test_bytes_of_one_operation_equal_xla(ours, theirs):
    """One operation, nothing to fuse: bytes accessed agree before and after."""
    expected = xla_lowered(theirs, pos)["bytes accessed"]
    assert xla_compiled(theirs, pos)["bytes accessed"] == expected
    assert ad.cost_analysis(ours, pos)["bytes accessed"] == expected


def test_returns_xla_keys_as_floats():
    costs = ad.cost_analysis(lambda a, b: a @ b, m34, m45)
    assert list(costs) == ["flops", "transcendentals", "bytes accessed"]
    assert all(type(v) is float for v in costs.values())


def test_nested_jit_counts_its_body():
    def inner(x):
        return anp.sin(x) * x

    def ours(x):
        return ad.jit(inner)(ad.jit(inner)(x) + 1.0)

    def theirs(x):
        inner = jax.jit(lambda x: jnp.sin(x) * x)
        return inner(inner(x) + 1.0)

    assert pick(ad.cost_analysis(ad.jit(ours), pos)) == pick(xla_compiled(theirs, pos))


def test_types_in_nothing_is_computed(monkeypatch):
    def refuse(*args, **params):
        raise AssertionError("cost_analysis ran an operation")

    for prim in ad.PRIMITIVES.values():
        monkeypatch.setitem(prim.rules, "impl", refuse)
    n = 20000
    big = ad.ShapedArray((n, n), F64)
    with nothing_compiled():
        costs = ad.cost_analysis(lambda a, b: anp.tanh(a @ b), big, big)
    assert costs["flops"] == 2 * n**3  # XLA's rule: 2 per multiply-add
    assert costs["transcendentals"] == n * n


def test_every_primitive_has_a_cost_rule():
    # the module's primitives (other tests register primitives of their own)
    module = {p.name: p for p in vars(ad).values() if isinstance(p, ad.Primitive)}
    assert "dot_general" in module and "debug_print" in module
    missing = [name for name, p in module.items() if "cost" not in p.rules]
    assert missing == [], f"primitives without a cost rule: {missing}"
    assert "cost" in ad.RULE_KINDS


# ------------------------------------------------------------- control flow


def step_ours(c, x):
    return anp.sin(c) * x + c, c


def step_jax(c, x):
    return jnp.sin(c) * x + c, c


@pytest.mark.parametrize("length", [1, 7, 50])
def test_scan_costs_length_times_its_body(length):
    xs = rng.normal(size=(length, 5))
    body = xla_compiled(lambda c, x: step_jax(c, x)[0], xs[0], xs[0])
    costs = ad.cost_analysis(lambda xs: ad.scan(step_ours, np.zeros(5), xs), xs)
    assert pick(costs) == {k: length * body[k] for k in KEYS}


def test_scan_under_jit_and_types_only():
    xs = ad.ShapedArray((30, 5), F64)
    body = xla_compiled(lambda c, x: step_jax(c, x)[0], np.zeros(5), np.zeros(5))
    costs = ad.cost_analysis(ad.jit(lambda xs: ad.scan(step_ours, np.zeros(5), xs)), xs)
    assert pick(costs) == {k: 30 * body[k] for k in KEYS}


@pytest.mark.parametrize("trips", [0, 3, 100])
def test_fori_loop_with_int_bounds_costs_trips_times_body(trips):
    body = xla_compiled(lambda x: jnp.sin(x) * 2.0, pos)
    costs = ad.cost_analysis(
        lambda x: ad.fori_loop(0, trips, lambda i, c: anp.sin(c) * 2.0, x),
        ad.ShapedArray(pos.shape, F64),
    )
    # each trip also adds 1 to the loop counter
    assert costs["flops"] == trips * (body["flops"] + 1)
    assert costs["transcendentals"] == trips * body["transcendentals"]


def test_while_loop_with_known_inputs_runs_and_counts_every_trip():
    def cond_jax(v):
        return v.sum() > 1.0

    def body_jax(v):
        return v * 0.5

    start = np.full(4, 3.0)
    trips, v = 0, start
    while cond_jax(v):
        trips, v = trips + 1, body_jax(v)
    cond_cost = xla_compiled(cond_jax, start)["flops"]
    body_cost = xla_compiled(body_jax, start)["flops"]
    costs = ad.cost_analysis(
        lambda x: ad.while_loop(lambda v: anp.sum(v) > 1.0, lambda v: v * 0.5, x), start
    )
    assert trips == 4
    assert costs["flops"] == (trips + 1) * cond_cost + trips * body_cost


def test_fori_loop_with_array_bound_counts_when_the_bound_is_an_array():
    def f(n, x):
        return ad.fori_loop(0, n, lambda i, c: c * 2.0, x)

    # per trip: the body's 3 multiplications, i + 1, and the test i < n
    expected = 6 * (3 + 1) + 7 * 1
    assert ad.cost_analysis(f, np.int64(6), np.ones(3))["flops"] == expected
    # only the counter and the bound decide the trip count: x may be a type
    with nothing_compiled():
        costs = ad.cost_analysis(f, np.int64(6), ad.ShapedArray((3,), F64))
    assert costs["flops"] == expected


def test_while_loop_with_unknown_trip_count_is_a_clear_error():
    def f(x):
        return ad.while_loop(lambda v: anp.sum(v) > 1.0, lambda v: v * 0.5, x)

    with raises_clearly(
        ad.UnknownTripCountError,
        r"while_loop.*types.*float64\[4\].*ShapedArrays.*fori_loop.*scan",
        then=lambda: ad.cost_analysis(f, np.ones(4)),
    ):
        ad.cost_analysis(f, ad.ShapedArray((4,), F64))
    assert issubclass(ad.UnknownTripCountError, ValueError)


def branch_costs():
    return (
        xla_compiled(jnp.sin, pos),
        xla_compiled(lambda x: x * x * x, pos),
    )


def pick_ours(p, x):
    return ad.cond(p, anp.sin, lambda x: x * x * x, x)


def test_cond_with_unknown_predicate_costs_the_dearer_branch_key_by_key():
    sin_cost, cube_cost = branch_costs()
    costs = ad.cost_analysis(pick_ours, ad.ShapedArray((), np.bool_), pos)
    assert pick(costs) == {k: max(sin_cost[k], cube_cost[k]) for k in KEYS}


@pytest.mark.parametrize("taken", [True, False])
def test_cond_with_known_predicate_costs_the_branch_taken(taken):
    sin_cost, cube_cost = branch_costs()
    costs = ad.cost_analysis(pick_ours, np.bool_(taken), pos)
    assert pick(costs) == pick(sin_cost if taken else cube_cost)


def test_cond_predicate_computed_from_an_array_argument():
    def ours(x):
        return ad.cond(anp.sum(x) > 10.0, anp.sin, lambda x: x * x * x, x)

    sin_cost, cube_cost = branch_costs()
    predicate = xla_compiled(lambda x: x.sum() > 10.0, pos)
    for scale, branch in [(10.0, sin_cost), (0.01, cube_cost)]:
        costs = ad.cost_analysis(ours, pos * scale)
        assert pick(costs) == {k: branch[k] + predicate[k] for k in KEYS}


# ------------------------------------------- transformations: expected multiples


def test_vmap_multiplies_by_the_batch_size():
    def f(v):
        return anp.sin(v) * v + anp.sum(v)

    one = ad.cost_analysis(f, pos[0])
    batched = ad.cost_analysis(ad.vmap(f), pos)
    assert pick(batched) == {k: pos.shape[0] * one[k] for k in KEYS}
    assert pick(batched) == pick(
        xla_compiled(jax.vmap(lambda v: jnp.sin(v) * v + v.sum()), pos)
    )


def test_jvp_of_a_product_costs_three_products_and_a_sum():
    def f(a, v):
        return a @ v

    a, v = m45.T, rng.normal(size=4)
    forward = ad.cost_analysis(f, a, v)["flops"]
    assert forward == xla_compiled(f, a, v)["flops"]
    costs = ad.cost_analysis(lambda a, v: ad.jvp(f, (a, v), (a, v)), a, v)
    # a v, then da v + a dv: three products and the sum of two of them
    assert costs["flops"] == 3 * forward + 5


def test_grad_of_a_sum_of_sines_evaluates_sin_and_cos():
    n = pos.size
    costs = ad.cost_analysis(ad.grad(lambda x: anp.sum(anp.sin(x))), pos)
    assert costs["transcendentals"] == 2 * n  # sin forward, cos for the derivative
    assert costs["transcendentals"] == 2 * xla_compiled(jnp.sin, pos)["transcendentals"]


def test_grad_of_an_mlp_costs_about_three_forwards():
    def loss(params, x):
        for w, b in params:
            x = anp.tanh(x @ w + b)
        return anp.sum(x * x)

    layer = (ad.ShapedArray((32, 32), F64), ad.ShapedArray((32,), F64))
    batch = ad.ShapedArray((16, 32), F64)
    for depth in (1, 3):
        forward = ad.cost_analysis(loss, [layer] * depth, batch)["flops"]
        backward = ad.cost_analysis(ad.grad(loss), [layer] * depth, batch)["flops"]
        assert 2.5 < backward / forward < 3.5


def test_jacfwd_and_jacrev_cost_by_inputs_and_outputs():
    def many_to_one(x):
        return anp.sum(anp.sin(x) * x)

    wide = ad.ShapedArray((100,), F64)
    fwd = ad.cost_analysis(ad.jacfwd(many_to_one), wide)["flops"]
    rev = ad.cost_analysis(ad.jacrev(many_to_one), wide)["flops"]
    assert fwd > 20 * rev  # one JVP per input against one VJP


def test_custom_rules_and_pmap_cost_their_functions():
    @ad.custom_jvp
    def f(x):
        return anp.sin(x) * x

    f.defjvp(lambda primals, tangents: (f(*primals), tangents[0]))
    expected = pick(xla_compiled(lambda x: jnp.sin(x) * x, pos))
    assert pick(ad.cost_analysis(f, pos)) == expected
    rows = ad.cost_analysis(ad.pmap(lambda r: anp.sin(r) * r), pos[:4])
    assert pick(rows) == pick(xla_compiled(lambda x: jnp.sin(x) * x, pos[:4]))
    summed = ad.cost_analysis(
        ad.pmap(lambda r: ad.psum(r, "i"), axis_name="i"), pos[:4]
    )
    assert summed["flops"] == 4 * 3 * 7  # each of 4 members adds 4 rows of 7


# ---------------------------------------------------------------- debug.print


def printed(capsys, run) -> list[str]:
    capsys.readouterr()
    run()
    jax.effects_barrier()
    return capsys.readouterr().out.splitlines()


def noisy_ours(v):
    ad.debug.print("v = {} and {s}", v, s=anp.sin(v))
    return v * v


def noisy_jax(v):
    jax.debug.print("v = {} and {s}", v, s=jnp.sin(v))
    return v * v


@pytest.mark.parametrize(
    "name, ours, theirs",
    [
        ("eager", noisy_ours, noisy_jax),
        ("jit", ad.jit(noisy_ours), jax.jit(noisy_jax)),
        ("vmap", ad.vmap(noisy_ours), jax.vmap(noisy_jax)),
        ("jit of vmap", ad.jit(ad.vmap(noisy_ours)), jax.jit(jax.vmap(noisy_jax))),
        ("vmap of vmap", ad.vmap(ad.vmap(noisy_ours)), jax.vmap(jax.vmap(noisy_jax))),
    ],
)
def test_debug_print_matches_jax(capsys, name, ours, theirs):
    x = np.arange(6.0).reshape(2, 3) / 3.0
    theirs_out = printed(capsys, lambda: theirs(x))
    ours_out = printed(capsys, lambda: ours(x))
    assert ours_out == theirs_out and ours_out


@pytest.mark.parametrize(
    "ours, theirs",
    [
        (ad.grad(noisy_ours), jax.grad(noisy_jax)),
        (ad.jit(ad.grad(noisy_ours)), jax.jit(jax.grad(noisy_jax))),
        (
            lambda x: ad.jvp(noisy_ours, (x,), (1.0,)),
            lambda x: jax.jvp(noisy_jax, (x,), (1.0,)),
        ),
    ],
)
def test_debug_print_under_differentiation_prints_primals_once(capsys, ours, theirs):
    theirs_out = printed(capsys, lambda: theirs(0.75))
    ours_out = printed(capsys, lambda: ours(0.75))
    assert ours_out == theirs_out and len(ours_out) == 1
    assert float(ad.grad(noisy_ours)(0.75)) == pytest.approx(1.5)


def loops(lib, np_):
    def scan_body(c, x):
        lib.debug.print("c = {c}, x = {x}", c=c, x=x)
        return c + x, c

    def while_body(i):
        lib.debug.print("i = {}", i)
        return i - 1

    def positive(x):
        lib.debug.print("positive {}", x)
        return x

    def run(xs):
        total = lib_scan(lib)(scan_body, 0.0, xs)[0]
        lib_while(lib)(lambda i: i > 0, while_body, np.int64(2))
        return lib_cond(lib)(total > 0.0, positive, lambda x: -x, total)

    return run


def lib_scan(lib):
    return ad.scan if lib is ad else jax.lax.scan


def lib_while(lib):
    return ad.while_loop if lib is ad else jax.lax.while_loop


def lib_cond(lib):
    return ad.cond if lib is ad else jax.lax.cond


@pytest.mark.parametrize("compiled", [False, True])
def test_debug_print_inside_scan_while_and_cond(capsys, compiled):
    xs = np.array([0.5, 1.5, 2.0])
    ours, theirs = loops(ad, anp), loops(jax, jnp)
    if compiled:
        ours, theirs = ad.jit(ours), jax.jit(theirs)
    theirs_out = printed(capsys, lambda: theirs(xs))
    ours_out = printed(capsys, lambda: ours(xs))
    assert ours_out == theirs_out and len(ours_out) == 6


def test_debug_print_lowers_to_a_host_callback():
    jaxpr, _, _ = ad.make_jaxpr(noisy_ours, ad.ShapedArray((), F64))
    assert [e.primitive.name for e in jaxpr.eqns][:2] == ["sin", "debug_print"]
    text = str(ad.lower_jaxpr(jaxpr))
    assert "xla_ffi_python_cpu_callback" in text and "has_side_effect = true" in text


def test_debug_print_costs_nothing():
    costs = ad.cost_analysis(noisy_ours, pos)
    assert pick(costs) == pick(xla_compiled(lambda v: (jnp.sin(v), v * v), pos))


@pytest.mark.parametrize(
    "fmt, args, kwargs, match",
    [
        ("{} and {}", (1.0,), {}, r"'\{\} and \{\}' asks for more positional .*1 pos"),
        ("{y}", (1.0,), {}, r"'\{y\}' asks for 'y'"),
        ("{}", (), {"x": 1.0}, r"asks for .*0 positional"),
        ("{", (1.0,), {}, r"bad format '\{'"),
        ("{}", (1.0, 2.0), {}, r"does not use the positional argument.*\[1\]"),
    ],
)
def test_debug_print_format_that_does_not_fit(fmt, args, kwargs, match):
    def check():
        assert ad.cost_analysis(noisy_ours, 1.0)["flops"] == 1.0

    with raises_clearly(ad.DebugPrintFormatError, match, then=check):
        ad.debug.print(fmt, *args, **kwargs)
    with nothing_compiled():  # under jit: raised while tracing
        with pytest.raises(ad.DebugPrintFormatError, match=match):
            ad.jit(lambda *a, **k: ad.debug.print(fmt, *a, **k))(*args, **kwargs)
    # JAX raises too, with IndexError, KeyError or ValueError
    with pytest.raises((IndexError, KeyError, ValueError)):
        jax.debug.print(fmt, *args, **kwargs)
    assert issubclass(ad.DebugPrintFormatError, (ValueError, LookupError))


def test_debug_print_format_must_be_a_string():
    with raises_clearly(TypeError, "format must be a str", then=lambda: None):
        ad.debug.print(3, 1.0)


def test_debug_print_inside_pmap_is_a_clear_error(capsys):
    def f(r):
        ad.debug.print("r = {}", r)
        return r * 2.0

    with raises_clearly(
        ad.DebugPrintInPmapError,
        r"debug.print inside pmap.*4 replicas.*vmap",
        then=lambda: printed(capsys, lambda: ad.vmap(f)(pos[:4, 0])),
    ):
        ad.pmap(f)(pos[:4, 0])


def test_debug_print_of_a_tangent_is_dropped_under_grad(capsys):
    @ad.custom_jvp
    def f(x):
        return anp.sin(x)

    def f_jvp(primals, tangents):
        ad.debug.print("tangent {}", tangents[0])
        return f(*primals), ad.cos(primals[0]) * tangents[0]

    f.defjvp(f_jvp)

    @jax.custom_jvp
    def g(x):
        return jnp.sin(x)

    def g_jvp(primals, tangents):
        jax.debug.print("tangent {}", tangents[0])
        return g(*primals), jnp.cos(primals[0]) * tangents[0]

    g.defjvp(g_jvp)
    theirs = printed(capsys, lambda: jax.grad(g)(0.5))
    ours = printed(capsys, lambda: ad.grad(f)(0.5))
    assert ours == theirs
    assert float(ad.grad(f)(0.5)) == pytest.approx(np.cos(0.5))


def test_indexing_primitives_move_bytes_and_scatter_add_adds_each_update():
    """slice, gather and friends count no operations; scatter-add counts one
    addition per element of its updates, the chapter's rules."""
    table = np.ones((10, 4))
    rows = np.array([1, 3, 3, 7])
    assert ad.cost_analysis(lambda t: t[2:5], table)["flops"] == 0.0
    assert ad.cost_analysis(lambda t: t[rows], table)["flops"] == 0.0
    updates = np.ones((4, 4))
    cost = ad.cost_analysis(lambda t, u: t.at[rows].add(u), table, updates)
    assert cost["flops"] == updates.size
