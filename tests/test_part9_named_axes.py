"""Tests of Part 9: named axes, collectives, and ``pmap`` on 8 host devices.

Each program is written once against a small namespace and built twice: with
autodidax and with JAX (``jax.vmap(axis_name=)``, ``jax.pmap``,
``jax.lax.psum``/``pmean``/``pmax``/``all_gather``/``axis_index``). Results
agree to 1e-9 in float64 (tests/conftest.py switches JAX's x64 mode on and
gives the test process 8 CPU devices before JAX starts).

Covered: every collective under a named ``vmap`` and under ``pmap``; a
collective of an unbatched value; pytrees in and out, ``in_axes=(0, None)``,
``in_axes``/``out_axes`` other than 0; fewer rows than devices; nested names
(two ``vmap``s, ``pmap`` of ``vmap``, ``vmap`` of ``pmap``, a collective over
the outer name inside the inner map); ``jit`` inside ``pmap`` and a named
``vmap``, ``jit`` outside them; ``jvp`` and ``grad`` through both;
``pmap(grad(loss))`` with ``pmean``; ``vjp``; closures over constants and
over an outer tracer; collectives inside ``cond``, ``scan``, ``fori_loop``
and ``while_loop`` (and their derivatives); integer and scalar collectives;
three steps of data-parallel SGD on a small MLP; the StableHLO collectives
pmap lowers to; where the result's rows live, printing and ``np.asarray``;
``devices()``; tracing once; and the errors of SPEC section 5 (more rows than
devices, mismatched leading sizes, a mapped-nothing ``pmap``, ``pmap`` inside
``jit`` or ``pmap``, an unbound axis name under eval, ``jit``, ``vmap``,
``pmap`` and ``grad``).

JAX's side is jitted (``jax.jit`` of the same function: the same values, and
much faster than JAX's eager ``vmap``). The ``pmap`` programs used by several
tests are built once per module (``functools.cache``) and called with few
distinct shapes, so each is traced and compiled once.
"""

from __future__ import annotations

import functools
from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import autodidax as ad

TOL = 1e-9
F64 = np.float64
N = 8  # host devices (tests/conftest.py)
AXIS = "i"

pytestmark = pytest.mark.usefixtures("clean_interpreter_stack")

RNG = np.random.default_rng(20)
X8 = RNG.uniform(-1.0, 1.0, (N, 3))  # one row per device
X5 = RNG.uniform(-1.0, 1.0, (5, 3))  # a vmap batch
X3 = RNG.uniform(-1.0, 1.0, (3, 3))  # fewer rows than devices
C3 = RNG.uniform(0.5, 1.5, 3)  # an unmapped operand


class _Ours:
    """autodidax's names, looked up when used (so that a missing name fails
    one test, not the collection of the file)."""

    def __getattr__(self, name: str):
        if name == "total":
            return lambda x, axis=None: ad.reduce_sum(x, axis)
        if name == "to_float":
            return lambda x: ad.convert_element_type(x, F64)
        return getattr(ad, name)


OURS = _Ours()
JAX = SimpleNamespace(
    vmap=jax.vmap,
    pmap=jax.pmap,
    jit=jax.jit,
    grad=jax.grad,
    jvp=jax.jvp,
    vjp=jax.vjp,
    cond=jax.lax.cond,
    scan=jax.lax.scan,
    fori_loop=jax.lax.fori_loop,
    while_loop=jax.lax.while_loop,
    where=jnp.where,
    psum=jax.lax.psum,
    pmean=jax.lax.pmean,
    pmax=jax.lax.pmax,
    all_gather=jax.lax.all_gather,
    axis_index=jax.lax.axis_index,
    sin=jnp.sin,
    cos=jnp.cos,
    tanh=jnp.tanh,
    total=jnp.sum,
    to_float=lambda x: jax.lax.convert_element_type(x, F64),
    devices=jax.devices,
)
LIBS = {"ours": OURS, "jax": JAX}


def host(x) -> np.ndarray:
    return np.asarray(x)


def close(ours, theirs) -> None:
    """Same tree structure (as JAX sees it), shapes and values to 1e-9."""
    ours_leaves, ours_tree = jax.tree_util.tree_flatten(ours)
    theirs_leaves, theirs_tree = jax.tree_util.tree_flatten(theirs)
    assert ours_tree == theirs_tree, (ours_tree, theirs_tree)
    for a, b in zip(ours_leaves, theirs_leaves):
        a, b = host(a), host(b)
        assert a.shape == b.shape, (a.shape, b.shape)
        np.testing.assert_allclose(a.astype(F64), b.astype(F64), rtol=TOL, atol=TOL)


def both(build, *args) -> None:
    """``build(lib)`` is a function; run it with both libraries and compare.
    JAX's version is jitted: the same values, and faster than JAX's eager
    vmap and grad."""
    close(build(OURS)(*args), jax.jit(build(JAX))(*args))


# ---------------------------------------------------------------------------
# Programs, written once for both libraries
# ---------------------------------------------------------------------------

COLLECTIVES = ["psum", "pmean", "pmax", "all_gather", "axis_index"]


def per_example(lib, which: str, axis: str = AXIS):
    """A function of one example (float64[3]) using collective ``which``."""

    def f(x):
        y = lib.sin(x) * x + 1.0
        if which == "psum":
            return lib.psum(y, axis)
        if which == "pmean":
            return y - lib.pmean(y, axis)
        if which == "pmax":
            return lib.pmax(y, axis) * y
        if which == "all_gather":
            return lib.all_gather(y, axis) * 2.0
        if which == "axis_index":
            return y * lib.to_float(lib.axis_index(axis))
        raise ValueError(which)

    return f


def tree_program(lib):
    """A pytree in (a dict, and an unmapped vector), a pytree out."""

    def f(tree, c):
        a, (b, scale) = tree["a"], tree["b"]
        s = lib.psum(a * c, AXIS)
        centred = b - lib.pmean(b, AXIS)
        index = lib.to_float(lib.axis_index(AXIS))
        return {"sum": s, "pair": [centred * scale, index + scale]}

    return f


def tree_args(rows: int) -> tuple:
    rng = np.random.default_rng(rows)
    tree = {
        "a": rng.normal(size=(rows, 3)),
        "b": (rng.normal(size=(rows, 2)), rng.normal(size=rows)),
    }
    return tree, C3


def nested(lib):
    """A function of one inner example, using the outer name ``i`` and the
    inner name ``j``."""

    def g(x):
        outer = lib.psum(x, "i")
        inner = lib.pmax(lib.sin(x), "j")
        index = lib.to_float(lib.axis_index("i") * 10 + lib.axis_index("j"))
        return outer * inner + index - lib.pmean(x * outer, "j")

    return g


def jitted_inside(lib):
    def g(x):
        return lib.psum(lib.sin(x), AXIS) * x - lib.to_float(lib.axis_index(AXIS))

    return lib.jit(g)


def loss_with_psum(lib):
    """``w -> total`` of a named map over the rows of ``xs``, with a psum."""

    def row(w, x):
        return lib.psum(lib.sin(w * x), AXIS) * x + w * w

    return row


# ---------------------------------------------------------------------------
# vmap with axis_name
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("which", COLLECTIVES)
def test_each_collective_under_named_vmap(which):
    both(lambda lib: lib.vmap(per_example(lib, which), axis_name=AXIS), X5)


@pytest.mark.parametrize("which", COLLECTIVES)
def test_each_collective_under_vmap_of_jit(which):
    """The collective is staged into the jaxpr, and xla_call's batching rule
    batches it with the same axis name."""
    both(lambda lib: lib.vmap(lib.jit(per_example(lib, which)), axis_name=AXIS), X5)


@pytest.mark.parametrize("which", COLLECTIVES)
def test_each_collective_under_jit_of_vmap(which):
    both(lambda lib: lib.jit(lib.vmap(per_example(lib, which), axis_name=AXIS)), X5)


def test_axis_index_under_vmap_is_an_integer_iota():
    out = ad.vmap(lambda x: ad.axis_index(AXIS), axis_name=AXIS)(X5)
    assert np.dtype(host(out).dtype).kind == "i"
    np.testing.assert_array_equal(host(out), np.arange(5))


def test_collective_of_an_unbatched_value():
    """psum(3.0) over a batch of 5 is 15 per example: the value is raised to
    the level of the vmap that bound the name, though it does not depend on
    the batch."""

    def build(lib):
        return lib.vmap(
            lambda x: (lib.psum(3.0, AXIS) + x * 0.0, lib.pmean(C3, AXIS)),
            axis_name=AXIS,
        )

    both(build, X5)
    np.testing.assert_allclose(host(build(OURS)(X5)[0]), np.full((5, 3), 15.0))


def test_jit_with_unbatched_inputs_under_named_vmap():
    """A jitted function whose inputs do not depend on the batch still sees
    the vmap's name: its collective runs over the batch axis."""

    def build(lib):
        def f(x):
            total = lib.jit(lambda c: lib.psum(c, AXIS))(C3)
            index = lib.jit(lambda: lib.axis_index(AXIS))()
            return total + x * lib.to_float(index)

        return lib.vmap(f, axis_name=AXIS)

    both(build, X5)


def control_flow(lib, kind: str):
    """A per-example function with a collective inside a control-flow
    primitive's body (its jaxpr is batched with the map's axis name).

    "cond" has a per-example predicate: under vmap, a select of both
    branches. "cond-uniform" has one predicate for all rows (a psum), so
    that under pmap every device takes the same branch: XLA needs every
    replica to reach a collective."""

    def f(x):
        if kind in ("cond", "cond-uniform", "cond-as-select"):
            if kind in ("cond", "cond-as-select"):
                pred = lib.total(x) > 0.0
            else:
                pred = lib.psum(lib.total(x), AXIS) < 0.0
            branches = (lambda v: lib.psum(v, AXIS), lambda v: v - lib.pmean(v, AXIS))
            if kind == "cond-as-select":
                return lib.where(pred, branches[0](x), branches[1](x))
            return lib.cond(pred, *branches, x)
        if kind == "scan":

            def body(carry, row):
                new = lib.sin(carry) + lib.psum(row * carry, AXIS)
                return new, lib.pmean(new, AXIS)

            return lib.scan(body, x, np.stack([C3, C3 * 0.5]))
        if kind == "fori_loop":
            return lib.fori_loop(0, 3, lambda i, v: lib.sin(lib.pmean(v, AXIS)) + v, x)
        if kind == "while_loop":

            def body(carry):
                k, v = carry
                return k + 1, v * 0.5 + lib.psum(v, AXIS) * 0.1

            return lib.while_loop(lambda c: c[0] < 3, body, (0, x))[1]
        raise ValueError(kind)

    return f


LOOPS = ["scan", "fori_loop", "while_loop"]


@pytest.mark.parametrize("kind", ["cond", "cond-uniform", *LOOPS])
def test_collective_inside_control_flow_under_vmap(kind):
    both(lambda lib: lib.vmap(control_flow(lib, kind), axis_name=AXIS), X5)


@pytest.mark.parametrize("kind", ["cond-uniform", *LOOPS])
def test_collective_inside_control_flow_under_pmap(kind):
    both(lambda lib: lib.pmap(control_flow(lib, kind), axis_name=AXIS), X8)


def grad_of_mapped(lib, kind: str, mapper: str):
    """grad with respect to a scale of the rows, through the map."""

    def loss(w):
        rows = getattr(lib, mapper)(control_flow(lib, kind), axis_name=AXIS)
        out = rows(X8 * w)
        out = out[0] if kind == "scan" else out  # the final carry
        return lib.total(lib.sin(out) * X8)

    return lib.grad(loss)


@pytest.mark.parametrize(
    ("kind", "mapper"),
    [("cond-uniform", "vmap"), ("cond-uniform", "pmap"), ("scan", "vmap")]
    + [("scan", "pmap"), ("while_loop", "vmap")],
)
def test_grad_through_control_flow_with_a_collective(kind, mapper):
    if kind == "while_loop":  # forward mode only: no reverse through while

        def build(lib):
            rows = lib.vmap(control_flow(lib, kind), axis_name=AXIS)
            return lambda x, t: lib.jvp(rows, (x,), (t,))

        both(build, X8, np.cos(X8))
        return
    both(lambda lib: grad_of_mapped(lib, kind, mapper), 0.7)


def test_grad_through_cond_with_a_per_example_predicate_and_a_psum():
    """Under vmap a cond with a per-example predicate runs both branches and
    selects, and, as in JAX, each branch is differentiated only for the rows
    that take it (Part 5's keep_gradient, JAX's select with stop_gradient). With
    a psum in a branch, that is not the derivative of the select written out
    (nor JAX's finite differences): the rows that do not take the branch still
    feed its psum, but get no gradient through it. Ours agrees with JAX's cond."""
    ours = grad_of_mapped(OURS, "cond", "vmap")(0.7)
    theirs = jax.jit(grad_of_mapped(JAX, "cond", "vmap"))(0.7)
    close(ours, theirs)
    written_out = jax.jit(grad_of_mapped(JAX, "cond-as-select", "vmap"))(0.7)
    assert abs(float(host(ours)) - float(written_out)) > 1e-3


def test_vmap_pytrees_and_unmapped_operand():
    both(
        lambda lib: lib.vmap(tree_program(lib), in_axes=(0, None), axis_name=AXIS),
        *tree_args(5),
    )


def test_vmap_in_axes_and_out_axes():
    both(
        lambda lib: lib.vmap(
            per_example(lib, "pmean"), in_axes=1, out_axes=1, axis_name=AXIS
        ),
        X5.T,
    )


def test_two_nested_vmaps_with_two_names():
    x = np.random.default_rng(1).normal(size=(4, 3, 2))

    def build(lib):
        return lib.vmap(lib.vmap(nested(lib), axis_name="j"), axis_name="i")

    both(build, x)


def pytree_collectives(lib):
    def f(x):
        tree = {"w": x, "b": (lib.sin(x), lib.total(x))}
        return (
            lib.pmean(tree, AXIS),
            lib.psum(tree, AXIS),
            lib.pmax(tree, AXIS),
            lib.all_gather(tree, AXIS),
        )

    return f


@pytest.mark.parametrize("mapper", ["vmap", "pmap"])
def test_collectives_of_pytrees(mapper):
    x = X8 if mapper == "pmap" else X5
    both(lambda lib: getattr(lib, mapper)(pytree_collectives(lib), axis_name=AXIS), x)


def two_names(lib):
    def g(x):
        both_names = ("i", "j")
        return (
            lib.psum(x, both_names),
            lib.pmean(x * x, both_names),
            lib.pmax(lib.sin(x), both_names),
            lib.psum(x, ("j",)),
        )

    return g


@pytest.mark.parametrize("outer", ["vmap", "pmap"])
def test_collectives_over_a_tuple_of_names(outer):
    x = np.random.default_rng(7).normal(size=(N if outer == "pmap" else 4, 3, 2))

    def build(lib):
        inner = lib.vmap(two_names(lib), axis_name="j")
        return getattr(lib, outer)(inner, axis_name="i")

    both(build, x)


def test_the_same_name_rebinds_innermost():
    """An inner vmap may reuse the outer's name; a collective then means the
    innermost binding (as in JAX)."""
    x = np.random.default_rng(2).normal(size=(4, 3))

    def build(lib):
        inner = lib.vmap(lambda v: lib.psum(v, AXIS), axis_name=AXIS)
        return lib.vmap(inner, axis_name=AXIS)

    both(build, x)


def test_jvp_and_grad_through_named_vmap():
    xs, w = X5, np.array([0.3, -0.7, 1.1])

    def build_jvp(lib):
        f = lib.vmap(lambda x: loss_with_psum(lib)(w, x), axis_name=AXIS)
        return lambda x, t: lib.jvp(f, (x,), (t,))

    both(build_jvp, xs, np.cos(xs))

    def build_grad(lib):
        mapped = lib.vmap(loss_with_psum(lib), in_axes=(None, 0), axis_name=AXIS)
        return lib.grad(lambda w: lib.total(mapped(w, xs)))

    both(build_grad, w)
    both(lambda lib: lib.jit(build_grad(lib)), w)


@pytest.mark.parametrize("mapper", ["vmap", "pmap"])
def test_derivatives_of_pmax_against_numpy(mapper):
    """JAX has no derivative rule for pmax; autodidax's is the tangent (or
    cotangent) of the row holding the maximum (no ties in this data)."""
    x = X8
    t = np.cos(3.0 * X8)
    mapped = getattr(ad, mapper)(lambda v: ad.pmax(v, AXIS), axis_name=AXIS)
    winner = x.argmax(axis=0)  # per column
    _, tangent = ad.jvp(mapped, (x,), (t,))
    expected = np.broadcast_to(t[winner, np.arange(3)], x.shape)
    np.testing.assert_allclose(host(tangent), expected, rtol=TOL, atol=TOL)
    gradient = ad.grad(lambda v: ad.reduce_sum(mapped(v) * x))(x)
    expected = np.zeros_like(x)
    expected[winner, np.arange(3)] = x.sum(axis=0)
    np.testing.assert_allclose(host(gradient), expected, rtol=TOL, atol=TOL)


def test_per_example_gradients_averaged_with_pmean_under_vmap():
    w = np.array([0.3, -0.7, 1.1])

    def build(lib):
        def loss(w, x):
            return lib.total(lib.tanh(w * x) * x)

        def averaged(w, x):
            return lib.pmean(lib.grad(loss)(w, x), AXIS)

        return lib.vmap(averaged, in_axes=(None, 0), axis_name=AXIS)

    both(build, w, X5)


# ---------------------------------------------------------------------------
# devices() and pmap
# ---------------------------------------------------------------------------


def test_devices():
    devices = ad.devices()
    assert len(devices) == N == len(jax.devices())
    assert [d.id for d in devices] == [d.id for d in jax.devices()]
    # the 8 devices change nothing else: device 0 is still the default
    assert ad.jit(ad.sin)(C3).devices() == {devices[0]}
    assert jnp.zeros(2).devices() == {jax.devices()[0]}


@functools.cache
def pmapped(lib_name: str, which: str):
    """``pmap`` of a per-example program, built once per test module."""
    lib = LIBS[lib_name]
    if which in COLLECTIVES:
        return lib.pmap(per_example(lib, which), axis_name=AXIS)
    if which == "tree":
        return lib.pmap(tree_program(lib), axis_name=AXIS, in_axes=(0, None))
    if which == "axes":
        return lib.pmap(per_example(lib, "psum"), axis_name=AXIS, in_axes=1, out_axes=1)
    if which == "jit-inside":
        return lib.pmap(jitted_inside(lib), axis_name=AXIS)
    if which == "vmap-inside":
        return lib.pmap(lib.vmap(nested(lib), axis_name="j"), axis_name="i")
    raise ValueError(which)


def pmap_both(which: str, *args) -> tuple:
    ours, theirs = pmapped("ours", which)(*args), pmapped("jax", which)(*args)
    close(ours, theirs)
    return ours, theirs


@pytest.mark.parametrize("which", COLLECTIVES)
def test_each_collective_under_pmap(which):
    pmap_both(which, X8)


def test_pmap_without_a_name_integers_and_scalar_rows():
    def build(lib):
        return lib.pmap(lambda x, n: (lib.sin(x) * 2.0, lib.total(x), n * 3))

    both(build, X8, np.arange(N, dtype=np.int32))


def test_pmap_outputs_that_are_inputs_or_constants():
    """An output that is the input itself, one that does not depend on the
    input, and an unmapped input returned: each still has a row per device."""

    def build(lib):
        return lib.pmap(
            lambda x, c: (x, 1.5, c, lib.psum(2.0, AXIS)),
            axis_name=AXIS,
            in_axes=(0, None),
        )

    both(build, X8, C3)


def test_collectives_of_integers_and_scalars():
    def per_row(lib):
        def f(x):
            index = lib.axis_index(AXIS)
            scalar = lib.total(x)
            return (
                lib.psum(index, AXIS),
                lib.pmax(index * 3 - 2, AXIS),
                lib.psum(scalar, AXIS),
                lib.all_gather(scalar, AXIS),
            )

        return f

    both(lambda lib: lib.pmap(per_row(lib), axis_name=AXIS), X8)
    both(lambda lib: lib.vmap(per_row(lib), axis_name=AXIS), X5)


def test_pmap_closing_over_constants_and_jit_constants():
    def build(lib):
        inner = lib.jit(lambda x: x * C3 + 1.0)
        return lib.pmap(lambda x: inner(x) * C3 + lib.psum(x, AXIS), axis_name=AXIS)

    both(build, X8)


def test_grad_of_pmap_closing_over_the_differentiated_value():
    """w is not an argument of the pmapped function: it is closed over, a
    tracer of grad's trace inside pmap's body."""
    w = np.array([0.3, -0.7, 1.1])

    def build(lib):
        def loss(w):
            def row(x):
                return lib.psum(lib.sin(w * x), AXIS) * w

            return lib.total(lib.pmap(row, axis_name=AXIS)(X8))

        return lib.grad(loss)

    both(build, w)


def test_vjp_through_pmap():
    ct = np.random.default_rng(6).normal(size=(N, 3))

    def build(lib):
        def f(x, ct):
            out, pullback = lib.vjp(pmapped_program(lib), x)
            return out, pullback(ct)

        return f

    both(build, X8, ct)


def pmapped_program(lib):
    return lib.pmap(per_example(lib, "pmean"), axis_name=AXIS)


def test_fewer_rows_than_devices():
    ours, _ = pmap_both("psum", X3)
    assert len(ours.devices()) == 3


def test_pmap_pytrees_and_unmapped_operand():
    pmap_both("tree", *tree_args(N))


def test_pmap_in_axes_as_a_pytree_prefix():
    def build(lib):
        def f(d):
            return d["a"] * d["b"] + lib.psum(d["a"], AXIS)

        return lib.pmap(f, axis_name=AXIS, in_axes=({"a": 0, "b": None},))

    both(build, {"a": X8, "b": C3})


def test_pmap_in_axes_of_the_wrong_structure():
    with pytest.raises(ValueError, match=r"in_axes"):
        ad.pmap(lambda x: x * 2.0, in_axes=(0, 0))(X8)
    with pytest.raises(ValueError, match=r"in_axes"):
        ad.pmap(lambda d: d["a"], in_axes=({"b": 0},))({"a": X8})


def test_pmap_in_axes_and_out_axes():
    ours, _ = pmap_both("axes", X8.T)
    assert ours.shape == (3, N)


def test_jit_inside_pmap():
    pmap_both("jit-inside", X8)


def test_pmap_of_vmap_with_a_collective_over_the_outer_name():
    x = np.random.default_rng(3).normal(size=(N, 3, 2))
    pmap_both("vmap-inside", x)


def test_vmap_of_pmap():
    x = np.random.default_rng(4).normal(size=(2, N, 3))

    def build(lib):
        def g(v):
            return v * lib.psum(v, "i") + lib.psum(v, "j")

        return lib.vmap(lib.pmap(g, axis_name="i"), axis_name="j")

    both(build, x)


def test_pmap_result_goes_back_into_pmap():
    ours = pmapped("ours", "pmean")(pmapped("ours", "psum")(X8))
    theirs = pmapped("jax", "pmean")(pmapped("jax", "psum")(X8))
    close(ours, theirs)


@pytest.mark.parametrize("rows", [N, 3])
def test_collectives_lower_to_stablehlo_collectives(rows):
    """One pmap equation carrying the per-device jaxpr; lowered with one
    replica per row, psum and pmax are all_reduce over every replica (with an
    add or a maximum region), all_gather is all_gather, axis_index is
    replica_id."""

    def f(x):
        index = ad.convert_element_type(ad.axis_index(AXIS), x.dtype)
        gathered = ad.reduce_sum(ad.all_gather(x, AXIS), 0)
        return ad.psum(x, AXIS) + ad.pmax(x, AXIS) * index + gathered

    jaxpr, _, _ = ad.make_jaxpr(ad.pmap(f, axis_name=AXIS), X8[:rows])
    (eqn,) = jaxpr.eqns
    assert eqn.primitive.name == "pmap"
    body = eqn.params["jaxpr"]
    names = [e.primitive.name for e in body.eqns]
    for name in ("psum", "pmax", "all_gather", "axis_index"):
        assert name in names
    text = str(ad.lower_pmap(body, rows))
    groups = f"replica_groups = dense<[[{', '.join(map(str, range(rows)))}]]>"
    assert text.count('"stablehlo.all_reduce"') == 2
    assert text.count(groups) == 3  # two all_reduce, one all_gather
    assert "stablehlo.add" in text and "stablehlo.maximum" in text
    assert '"stablehlo.all_gather"' in text and "stablehlo.replica_id" in text


def test_pmap_result_goes_back_without_a_host_copy(monkeypatch):
    """Rows already on their devices are passed as they are."""
    first = pmapped("ours", "psum")(X8)

    def refuse(*args, **kwargs):
        raise AssertionError("a pmap result was copied to the host")

    monkeypatch.setattr(type(first), "__array__", refuse)
    again = pmapped("ours", "pmean")(first)
    monkeypatch.undo()
    close(again, pmapped("jax", "pmean")(pmapped("jax", "psum")(X8)))


def test_pmap_traces_once_per_shape():
    traced = []

    def f(x):
        traced.append(1)
        return ad.psum(x * 2.0, AXIS)

    g = ad.pmap(f, axis_name=AXIS)
    first, second = g(X8), g(X8 + 1.0)
    assert len(traced) == 1
    np.testing.assert_allclose(host(first), np.broadcast_to(X8.sum(0) * 2, (N, 3)))
    np.testing.assert_allclose(host(second), host(first) + 2.0 * N, rtol=TOL)


def test_jvp_through_pmap():
    def build(lib):
        f = lib.pmap(per_example(lib, "pmean"), axis_name=AXIS)
        return lambda x, t: lib.jvp(f, (x,), (t,))

    both(build, X8, np.cos(X8))


def test_grad_through_pmap_with_psum():
    """grad(lambda w: pmap(f, in_axes=(None, 0))(w, xs).sum()): pmap's jvp,
    partial evaluation and transpose rules, and psum's transpose."""
    w = np.array([0.3, -0.7, 1.1])

    def build(lib):
        mapped = lib.pmap(loss_with_psum(lib), axis_name=AXIS, in_axes=(None, 0))
        return lib.grad(lambda w: lib.total(mapped(w, X8)))

    both(build, w)


def test_pmap_of_grad_with_pmean():
    w = np.array([0.3, -0.7, 1.1])

    def build(lib):
        def loss(w, x):
            return lib.total(lib.tanh(w * x) * x)

        def averaged(w, x):
            return lib.pmean(lib.grad(loss)(w, x), AXIS)

        return lib.pmap(averaged, axis_name=AXIS, in_axes=(None, 0))

    both(build, w, X8)


@pytest.mark.parametrize("mapper", ["vmap", "pmap"])
def test_grad_of_a_psum_inside_the_map(mapper):
    """grad of psum(g(x)) with respect to this row's x: psum's transpose
    sums the rows' cotangents (all 1), so it is the number of rows * g'(x)."""

    def build(lib):
        f = lambda x: lib.psum(lib.total(lib.sin(x) * x), AXIS)  # noqa: E731
        return getattr(lib, mapper)(lib.grad(f), axis_name=AXIS)

    both(build, X8)


def test_pmap_inside_jit_gives_pmaps_values():
    """As JAX, jit(pmap(f)) runs: ours lowers the pmap as its body batched over
    the rows, so the values are pmap's."""
    ours, theirs = pmapped("ours", "psum"), pmapped("jax", "psum")
    close(ad.jit(ours)(X8[:2]), jax.jit(theirs)(X8[:2]))


def test_pmap_inside_pmap_is_refused_clearly():
    """Nested pmap: a clear TypeError saying what to do."""
    inner = pmapped("ours", "psum")
    run = lambda: ad.pmap(inner, axis_name="j")(np.stack([X8[:2], X8[:2]]))  # noqa: E731
    with pytest.raises(ad.PmapInsideJitError, match=r"pmap inside another pmap.*vmap"):
        run()
    assert issubclass(ad.PmapInsideJitError, TypeError)
    # the other way round works
    close(pmapped("ours", "jit-inside")(X8), pmapped("jax", "jit-inside")(X8))


# ---------------------------------------------------------------------------
# Data-parallel training: three SGD steps of a small MLP on 8 devices
# ---------------------------------------------------------------------------


def mlp_step(lib, lr: float = 0.3):
    """One SGD step on this device's part of the batch; gradients averaged
    over the devices with pmean."""

    def loss(params, x, y):
        hidden = lib.tanh(x @ params["w1"] + params["b1"])
        prediction = hidden @ params["w2"] + params["b2"]
        return lib.total((prediction - y) * (prediction - y)) / y.shape[0]

    def step(params, x, y):
        grads = lib.grad(loss)(params, x, y)
        grads = jax.tree_util.tree_map(lambda g: lib.pmean(g, AXIS), grads)
        new = jax.tree_util.tree_map(lambda p, g: p - lr * g, params, grads)
        return new, lib.pmean(loss(params, x, y), AXIS)

    return step


def mlp_data():
    rng = np.random.default_rng(5)
    params = {
        "w1": rng.normal(size=(3, 4)) * 0.5,
        "b1": rng.normal(size=4) * 0.1,
        "w2": rng.normal(size=4) * 0.5,
        "b2": np.float64(0.1),
    }
    x = rng.normal(size=(N, 2, 3))  # 16 examples, 2 per device
    y = np.sin(x.sum(-1))
    return params, x, y


def train(lib, steps: int = 3):
    """Parameters broadcast to every device (in_axes=None) each step; the
    replicated result's first row is the next step's parameters."""
    params, x, y = mlp_data()
    step = lib.pmap(mlp_step(lib), axis_name=AXIS, in_axes=(None, 0, 0))
    losses = []
    for _ in range(steps):
        replicated, loss = step(params, x, y)
        rows = jax.tree_util.tree_map(host, replicated)
        for leaf in jax.tree_util.tree_leaves(rows):  # every device agrees
            np.testing.assert_allclose(leaf, np.broadcast_to(leaf[0], leaf.shape))
        params = jax.tree_util.tree_map(lambda r: r[0], rows)
        losses.append(host(loss)[0])
    return params, losses


def test_data_parallel_sgd_three_steps():
    ours, theirs = train(OURS), train(JAX)
    close(ours, theirs)
    assert theirs[1][2] < theirs[1][0]  # it trains


def test_data_parallel_sgd_with_replicated_parameters():
    """The parameters stay on the devices between steps: each step's pmap
    takes the previous step's (replicated) result with in_axes=0."""
    results = {}
    for name, lib in LIBS.items():
        params, x, y = mlp_data()
        params = jax.tree_util.tree_map(
            lambda p: np.broadcast_to(p, (N, *np.shape(p))).copy(), params
        )
        step = lib.pmap(mlp_step(lib), axis_name=AXIS)
        for _ in range(3):
            params, _ = step(params, x, y)
        results[name] = params
    close(results["ours"], results["jax"])


# ---------------------------------------------------------------------------
# The result: rows on devices, printing, NumPy
# ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def result():
    return pmapped("ours", "pmean")(X8)


def test_rows_stay_on_different_devices(result):
    assert result.devices() == set(ad.devices())
    shards = getattr(result, "addressable_shards", None)
    if shards is not None:  # JAX's way to see which row lives where
        assert [s.device for s in shards] == list(ad.devices())
        for i, shard in enumerate(shards):
            np.testing.assert_array_equal(host(shard.data).reshape(-1), host(result)[i])


def test_numpy_conversion_and_printing(result):
    expected = np.asarray(pmapped("jax", "pmean")(X8))
    assert result.shape == (N, 3) and result.dtype == np.float64
    np.testing.assert_allclose(np.asarray(result), expected, rtol=TOL, atol=TOL)
    as32 = np.asarray(result, dtype=np.float32)
    assert as32.dtype == np.float32 and as32.shape == (N, 3)
    copy = np.asarray(result, copy=True)
    copy[0, 0] = 1e300
    assert np.asarray(result)[0, 0] != 1e300
    assert str(result) == str(np.asarray(result))
    assert "Array(" in repr(result) or str(np.asarray(result)[0, 0])[:6] in repr(result)


def test_pmap_result_works_with_operators_and_jit(result):
    gathered = host(result)
    np.testing.assert_allclose(host(result * 2.0 + 1.0), gathered * 2 + 1, rtol=TOL)
    np.testing.assert_allclose(host(ad.jit(ad.sin)(result)), np.sin(gathered))


# ---------------------------------------------------------------------------
# Errors (SPEC section 5); tests/test_error_catalogue.py section 17 has the
# same cases in the catalogue's style
# ---------------------------------------------------------------------------


def test_more_rows_than_devices():
    with pytest.raises(ValueError, match=r"9.*8|8.*9") as info:
        ad.pmap(lambda x: x * 2.0)(np.zeros((9, 3)))
    assert "device" in str(info.value)


def test_mismatched_leading_sizes():
    with pytest.raises(ValueError, match=r"3.*4|4.*3"):
        ad.pmap(lambda x, y: x + y)(np.zeros(3), np.zeros(4))


def test_mapped_nothing():
    """Like JAX, pmap needs at least one mapped argument."""
    with pytest.raises((ValueError, TypeError), match="in_axes|mapped"):
        ad.pmap(lambda x: x * 2.0, in_axes=None)(X3)


UNBOUND_RUNS = {
    "eval": lambda f: f(C3),
    "jit": lambda f: ad.jit(f)(C3),
    "vmap-other-name": lambda f: ad.vmap(f, axis_name="k")(X5),
    "vmap-unnamed": lambda f: ad.vmap(f)(X5),
    "pmap-other-name": lambda f: ad.pmap(f, axis_name="k")(X3),
    "grad": lambda f: ad.grad(lambda x: ad.reduce_sum(f(x)))(C3),
    "vmap-of-jit": lambda f: ad.vmap(ad.jit(f), axis_name="k")(X5),
}


@pytest.mark.parametrize("run", UNBOUND_RUNS, ids=list(UNBOUND_RUNS))
@pytest.mark.parametrize("which", COLLECTIVES)
def test_unbound_axis_name(which, run):
    f = per_example(OURS, which, axis="j")
    with pytest.raises(ad.UnboundAxisError, match=rf"{which}.*'j'") as info:
        UNBOUND_RUNS[run](f)
    assert isinstance(info.value, NameError)
    assert not isinstance(info.value, (AssertionError, KeyError, AttributeError))


def test_an_unbound_name_in_a_tuple_of_names():
    with pytest.raises(ad.UnboundAxisError, match=r"psum.*'j'"):
        ad.vmap(lambda x: ad.psum(x, ("i", "j")), axis_name="i")(X5)
    with pytest.raises(ad.UnboundAxisError, match=r"pmean.*'j'"):
        ad.pmap(lambda x: ad.pmean(x, ("j", "i")), axis_name="i")(X3)


def test_a_name_is_unbound_again_after_its_map():
    """The axis environment is popped when a map returns, also after an
    error inside it."""
    ad.vmap(lambda x: ad.psum(x, AXIS), axis_name=AXIS)(X5)
    with pytest.raises(ad.UnboundAxisError, match=rf"'{AXIS}'"):
        ad.psum(C3, AXIS)
    with pytest.raises(ad.UnboundAxisError, match="'j'"):
        ad.vmap(lambda x: ad.psum(x, "j"), axis_name=AXIS)(X5)
    with pytest.raises(ad.UnboundAxisError, match=rf"'{AXIS}'"):
        ad.axis_index(AXIS)
