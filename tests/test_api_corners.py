"""The corners of JAX's API that programs rely on, each checked against JAX.

``jit``'s ``static_argnums``/``static_argnames`` and keyword arguments (Part 3
and the performance chapter's fast ``jit``); keyword arguments through
``grad``, ``value_and_grad``, ``jacfwd``/``jacrev``/``jacobian`` (Part 4);
``scan`` without ``xs`` (Part 7); ``vmap`` with pytree ``in_axes``/``out_axes``,
namedtuples and ``in_axes=None`` for non-array arguments (Part 1); ``pmap``'s
``devices=`` and ``pmap`` inside ``jit`` (Part 9). Each error has a test of its
type and message. JAX runs in float64 (tests/conftest.py).
"""

from __future__ import annotations

import collections

import autodidax.numpy as anp
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import autodidax as ad

Pair = collections.namedtuple("Pair", "a b")


def close(ours, theirs):
    ours_leaves, ours_tree = jax.tree_util.tree_flatten(_to_jax_tree(ours))
    their_leaves, their_tree = jax.tree_util.tree_flatten(theirs)
    assert ours_tree == their_tree, (ours_tree, their_tree)
    for a, b in zip(ours_leaves, their_leaves):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-12, atol=1e-12)
        assert np.shape(a) == np.shape(b)


def _to_jax_tree(tree):
    """Our containers are Python's, so JAX reads them as they are; our arrays
    become NumPy arrays."""
    leaves, treedef = ad.tree_flatten(tree)
    return ad.tree_unflatten(treedef, [np.asarray(x) for x in leaves])


# ---- jit: static arguments and keyword arguments -----------------------------


def scale_by(x, n, *, scale=1.0):
    return x * float(n) * scale


def body_counter(fn):
    calls = []

    def counted(*args, **kwargs):
        calls.append(1)
        return fn(*args, **kwargs)

    counted.calls = calls
    return counted


@pytest.mark.parametrize("make_jit", [ad.full_path_jit, ad.jit], ids=["part3", "fast"])
@pytest.mark.parametrize(
    "static",
    [
        dict(static_argnums=1),
        dict(static_argnums=(1,)),
        dict(static_argnums=-1),
        dict(static_argnames="n"),
        dict(static_argnames=("n",)),
    ],
)
def test_static_argument_forms(make_jit, static):
    x = np.array([1.0, 2.0])
    ours, theirs = make_jit(scale_by, **static), jax.jit(scale_by, **static)
    for args, kwargs in [((x, 3), {}), ((x,), dict(n=3)), ((x, 2), dict(scale=0.5))]:
        if static.get("static_argnums") == -1 and len(args) == 1:
            # As JAX: -1 counts from the end of this call's positional
            # arguments, so here it names x, which is not hashable.
            with pytest.raises(ValueError, match="static argument 0 must be hashable"):
                ours(*args, **kwargs)
            with pytest.raises(ValueError, match="Non-hashable static arguments"):
                theirs(*args, **kwargs)
            continue
        close(ours(*args, **kwargs), theirs(*args, **kwargs))


@pytest.mark.parametrize("make_jit", [ad.full_path_jit, ad.jit], ids=["part3", "fast"])
def test_a_new_static_value_traces_again(make_jit):
    body = body_counter(lambda x, n: x * float(n))
    f = make_jit(body, static_argnums=1)
    x = np.ones(3)
    for n in [2, 2, 3, 2, 3]:
        close(f(x, n), jax.jit(lambda x, n: x * float(n), static_argnums=1)(x, n))
    assert len(body.calls) == len(f.traces) == 2  # the cache key holds n


@pytest.mark.parametrize("make_jit", [ad.full_path_jit, ad.jit], ids=["part3", "fast"])
def test_static_python_values_drive_tracing(make_jit):
    def f(x, mode, power):
        return x**power if mode == "pow" else x * power

    x = np.array([1.5, 2.0])
    ours = make_jit(f, static_argnums=(1, 2))
    theirs = jax.jit(f, static_argnums=(1, 2))
    for mode, power in [("pow", 3), ("mul", 3), ("pow", 2)]:
        close(ours(x, mode, power), theirs(x, mode, power))


def test_static_argnums_on_a_function_of_varargs():
    def f(*args):
        return args[0] * args[-1]

    x = np.ones(2)
    for nums in [-1, 1, 3]:  # 3: beyond the call's arguments, ignored as in JAX
        close(
            ad.jit(f, static_argnums=nums)(x, 3.0),
            jax.jit(f, static_argnums=nums)(x, 3.0),
        )
    body = body_counter(lambda *args: args[0] * float(args[-1]))
    g = ad.jit(body, static_argnums=-1)
    g(x, 2), g(x, 2), g(x, 3)
    assert len(body.calls) == 2  # the last argument is static: its value traces


@pytest.mark.parametrize("make_jit", [ad.full_path_jit, ad.jit], ids=["part3", "fast"])
def test_keyword_arguments_are_traced(make_jit):
    def step(params, x, lr=0.1):
        return {k: v - lr * x for k, v in params.items()}

    body = body_counter(step)
    params = {"w": np.array([1.0, 2.0]), "b": np.array(0.5)}
    x = np.array([0.5, 0.25])
    f = make_jit(body)
    for lr in [0.1, 0.2, 0.3]:
        close(f(params, x, lr=lr), jax.jit(step)(params, x, lr=lr))
    assert len(body.calls) == 1  # lr is traced: one trace for all three values
    close(f(params, x), jax.jit(step)(params, x))
    close(f(params=params, x=x, lr=0.5), jax.jit(step)(params=params, x=x, lr=0.5))


def test_keyword_arguments_under_jvp_and_grad_of_jit():
    def f(x, y=1.0):
        return anp.sum(ad.sin(x) * y)

    def jf(x, y=1.0):
        return jnp.sum(jnp.sin(x) * y)

    x = np.array([0.3, 0.7])
    close(ad.grad(ad.jit(f))(x, y=2.0), jax.grad(jax.jit(jf))(x, y=2.0))
    close(
        ad.jvp(lambda x: ad.jit(f)(x, y=3.0), (x,), (np.ones(2),)),
        jax.jvp(lambda x: jax.jit(jf)(x, y=3.0), (x,), (np.ones(2),)),
    )


def test_static_argument_must_be_hashable():
    f = ad.jit(scale_by, static_argnums=1)
    with pytest.raises(
        ValueError, match=r"jit: static argument 1 must be hashable.*ndarray"
    ):
        f(np.ones(2), np.ones(2))
    with pytest.raises(ValueError, match="Non-hashable static arguments"):
        jax.jit(scale_by, static_argnums=1)(np.ones(2), np.ones(2))
    g = ad.jit(scale_by, static_argnames="n")
    with pytest.raises(
        ValueError, match=r"jit: static argument 'n' must be hashable.*list"
    ):
        g(np.ones(2), n=[1, 2])


def test_static_argnums_out_of_range():
    with pytest.raises(
        ValueError, match=r"static_argnums 5 is out of range.*scale_by takes 2"
    ):
        ad.jit(scale_by, static_argnums=5)
    with pytest.raises(ValueError, match="static_argnums"):
        jax.jit(scale_by, static_argnums=5)(np.ones(2), 2)


def test_static_argnames_not_a_parameter():
    with pytest.raises(
        ValueError, match=r"static_argnames \['zz'\] are not parameters of scale_by"
    ):
        ad.jit(scale_by, static_argnames="zz")
    with pytest.raises(ValueError, match="invalid argnames"):
        jax.jit(scale_by, static_argnames="zz")(np.ones(2), 2)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(static_argnums="a"), r"static_argnums must be an int or a tuple of ints"),
        (dict(static_argnums=1.0), r"static_argnums must be an int or a tuple of ints"),
        (dict(static_argnames=3), r"static_argnames must be a str or a tuple of strs"),
    ],
)
def test_bad_static_specifications(kwargs, match):
    with pytest.raises(TypeError, match=match):
        ad.jit(scale_by, **kwargs)
    with pytest.raises(TypeError):
        jax.jit(scale_by, **kwargs)(np.ones(2), 2)


def test_fast_path_keys_static_and_keyword_arguments_by_structure():
    f = ad.jit(lambda x, y=1.0: x * y)
    f(np.ones(2), y=2.0)
    assert len(f.fast_calls) == 1  # keyed by the keywords and the leaves' types
    np.testing.assert_array_equal(np.asarray(f(np.ones(2), y=3.0)), [3.0, 3.0])
    g = ad.jit(scale_by, static_argnums=1)
    g(np.ones(2), 2)
    np.testing.assert_array_equal(
        np.asarray(g(np.ones(2), 2)), np.asarray(scale_by(np.ones(2), 2))
    )
    g(np.ones(2), 3)  # another static value: another trace and entry
    assert len(g.fast_calls) == 2 and len(g.traces) == 2
    h = ad.jit(lambda x, y: x * y)
    h(np.ones(2), 2.0)
    assert len(h.fast_calls) == 1  # positional arrays still take the fast path


# ---- grad and friends: keyword arguments are not differentiated ----------------


def loss(w, x, *, scale=1.0, offset=0.0):
    return anp.sum((ad.sin(w) * x + offset) ** 2) * scale


def jloss(w, x, *, scale=1.0, offset=0.0):
    return jnp.sum((jnp.sin(w) * x + offset) ** 2) * scale


W, X = np.array([0.3, -0.4, 1.1]), np.array([1.5, 2.0, -0.5])


@pytest.mark.parametrize("argnums", [0, 1, (0, 1)])
def test_grad_and_value_and_grad_with_keyword_arguments(argnums):
    kw = dict(scale=2.5, offset=0.25)
    close(ad.grad(loss, argnums)(W, X, **kw), jax.grad(jloss, argnums)(W, X, **kw))
    close(
        ad.value_and_grad(loss, argnums)(W, X, **kw),
        jax.value_and_grad(jloss, argnums)(W, X, **kw),
    )


def test_grad_has_aux_with_keyword_arguments():
    def f(w, *, k):
        return anp.sum(w * w) * k, {"k": k}

    def jf(w, *, k):
        return jnp.sum(w * w) * k, {"k": k}

    ours = ad.grad(f, has_aux=True)(W, k=3.0)
    theirs = jax.grad(jf, has_aux=True)(W, k=3.0)
    close(ours, theirs)


@pytest.mark.parametrize(
    "ours, theirs",
    [
        (ad.jacfwd, jax.jacfwd),
        (ad.jacrev, jax.jacrev),
        (ad.jacobian, jax.jacobian),
        (ad.hessian, jax.hessian),
    ],
)
def test_jacobians_with_keyword_arguments(ours, theirs):
    def f(w, *, x):
        return ad.sin(w) * x * w

    def jf(w, *, x):
        return jnp.sin(w) * x * w

    close(ours(f)(W, x=X), theirs(jf)(W, x=X))


def test_jacobian_is_jacrev():
    assert ad.jacobian is ad.jacrev
    assert "jacobian" in dir(ad)


def test_keyword_argument_of_an_integer_type_is_fine():
    # Only positional arguments are differentiated: an int keyword is no error.
    def f(w, *, n):
        return anp.sum(w**n)

    def jf(w, *, n):
        return jnp.sum(w**n)

    close(ad.grad(f)(W, n=3), jax.grad(jf)(W, n=3))


# ---- scan: xs defaults to None -------------------------------------------------


@pytest.mark.parametrize("reverse", [False, True])
def test_scan_without_xs(reverse):
    def body(c, x):
        assert x is None
        return c * 2.0 + 1.0, c

    init = np.array([1.0, -1.0])
    close(
        ad.scan(body, init, length=4, reverse=reverse),
        jax.lax.scan(body, init, length=4, reverse=reverse),
    )
    close(ad.scan(body, init, None, 3), jax.lax.scan(body, init, None, 3))


def test_scan_without_xs_or_length_is_an_error():
    with pytest.raises((TypeError, ValueError), match="length"):
        ad.scan(lambda c, x: (c, c), 1.0)
    with pytest.raises(ValueError):
        jax.lax.scan(lambda c, x: (c, c), 1.0)


# ---- vmap: pytree in_axes/out_axes, namedtuples, in_axes=None ------------------

XS = np.arange(12.0).reshape(3, 4)


def test_namedtuples_are_pytree_nodes():
    p = Pair(np.ones(2), (3.0, None))
    leaves, tree = ad.tree_flatten(p)
    assert len(leaves) == len(jax.tree_util.tree_leaves(p)) == 2
    back = ad.tree_unflatten(tree, leaves)
    assert type(back) is Pair and back.b[1] is None
    assert str(tree) == "Pair(*, (*, None))"
    doubled = ad.tree_map(lambda x: x * 2, p)
    assert type(doubled) is Pair
    close(doubled, jax.tree_util.tree_map(lambda x: x * 2, p))
    assert ad.tree_structure(None).num_leaves == 0


@pytest.mark.parametrize(
    "in_axes",
    [
        (Pair(0, None),),
        (Pair(1, 0),),
        ({"w": 1, "b": None},),
        [0],
    ],
    ids=["pair0None", "pair10", "dict", "list"],
)
def test_vmap_in_axes_as_pytree_prefixes(in_axes):
    if isinstance(in_axes, list):
        close(
            ad.vmap(lambda x: x * 2.0, in_axes)(XS),
            jax.vmap(lambda x: x * 2.0, in_axes)(XS),
        )
        return
    if isinstance(in_axes[0], dict):
        arg = {"w": XS, "b": np.ones(3)}

        def g(d):
            return d["w"] * 2.0 + anp.sum(d["b"])

        def jg(d):
            return d["w"] * 2.0 + jnp.sum(d["b"])

        close(ad.vmap(g, in_axes)(arg), jax.vmap(jg, in_axes)(arg))
        return
    arg = Pair(XS, np.ones((4, 3)) if in_axes[0].a == 1 else np.ones(4))

    def h(p):
        return p.a * 2.0, Pair(p.b, p.a)

    close(ad.vmap(h, in_axes)(arg), jax.vmap(h, in_axes)(arg))


@pytest.mark.parametrize(
    "out_axes",
    [
        (1, 0),
        [1, 0],
        ({"u": 0, "v": 1}, 0),
        ({"u": -1, "v": None}, 0),
        1,
        (0, None),
    ],
)
def test_vmap_out_axes_as_pytree_prefixes(out_axes):
    def f(x, c):
        return {"u": x * 2.0, "v": c}, x

    def g(x, c):  # a list output, for out_axes given as a list
        return [x * 2.0, x]

    if isinstance(out_axes, list):
        close(
            ad.vmap(g, (0, None), out_axes)(XS, np.ones(2)),
            jax.vmap(g, (0, None), out_axes)(XS, np.ones(2)),
        )
        return
    if out_axes == (0, None):
        out_axes = ({"u": 0, "v": None}, 0)
    if out_axes == 1 or out_axes == (1, 0):
        f2 = lambda x, c: (x * 2.0, x * c)  # noqa: E731
        ours = ad.vmap(f2, (0, None), out_axes)(XS, 3.0)
        theirs = jax.vmap(f2, (0, None), out_axes)(XS, 3.0)
        close(ours, theirs)
        return
    c = np.array([1.0, 2.0])
    close(
        ad.vmap(f, (0, None), out_axes)(XS, c), jax.vmap(f, (0, None), out_axes)(XS, c)
    )


@pytest.mark.parametrize(
    "arg",
    [ad.sin, "abc", object(), {"n": "name"}, None],
    ids=["function", "string", "object", "dict-of-str", "None"],
)
def test_vmap_passes_non_arrays_with_in_axes_none(arg):
    seen = []

    def f(a, x):
        seen.append(a)
        return x * 2.0

    out = ad.vmap(f, in_axes=(None, 0))(arg, XS)
    close(out, jax.vmap(lambda a, x: x * 2.0, in_axes=(None, 0))(arg, XS))
    assert seen and all(s is arg or s == arg for s in seen)


def test_vmap_applies_a_function_argument():
    ours = ad.vmap(lambda f, x: f(x), in_axes=(None, 0))(ad.sin, XS)
    theirs = jax.vmap(lambda f, x: f(x), in_axes=(None, 0))(jnp.sin, XS)
    close(ours, theirs)


def test_vmap_non_array_with_an_axis_is_an_error():
    with pytest.raises(TypeError, match="vmap argument.*str"):
        ad.vmap(lambda s, x: x, in_axes=(0, 0))("abc", XS)
    with pytest.raises(TypeError):
        jax.vmap(lambda s, x: x, in_axes=(0, 0))("abc", XS)


def test_vmap_out_axes_errors():
    with pytest.raises(
        ValueError, match=r"out_axes has structure \(\*, \*, \*\) but the output"
    ):
        ad.vmap(lambda x: (x, x), out_axes=(0, 0, 0))(XS)
    with pytest.raises(ValueError):
        jax.vmap(lambda x: (x, x), out_axes=(0, 0, 0))(XS)
    with pytest.raises(ValueError, match="out_axes is None for output leaf 0.*batched"):
        ad.vmap(lambda x: x, out_axes=None)(XS)
    with pytest.raises(ValueError, match="out_axes"):
        jax.vmap(lambda x: x, out_axes=None)(XS)
    with pytest.raises(TypeError, match="out_axes must be an int, None or a container"):
        ad.vmap(lambda x: x, out_axes="a")
    with pytest.raises(ValueError, match=r"out_axes 3 is out of range"):
        ad.vmap(lambda x: (x, x), out_axes=(0, 3))(XS)


@pytest.mark.parametrize("in_axes", [Pair(0, None), {"x": 0}])
def test_vmap_top_level_in_axes_must_be_a_tuple(in_axes):
    msg = "in_axes must be an int, None, or a tuple with one entry per positional"
    with pytest.raises(TypeError, match=msg):
        ad.vmap(lambda x, y: x, in_axes=in_axes)(XS, np.ones(4))
    with pytest.raises(TypeError, match="in_axes must be an int, None, or a tuple"):
        jax.vmap(lambda x, y: x, in_axes=in_axes)(XS, np.ones(4))


def test_vmap_namedtuple_prefix_mismatch_is_an_error():
    with pytest.raises(ValueError, match=r"in_axes\[0\] has structure Pair\(\*, \*\)"):
        ad.vmap(lambda p: p, in_axes=(Pair(0, 0),))((XS, XS))


# ---- pmap inside jit -------------------------------------------------------------


def _pmap_body(lib, psum, axis_index, convert):
    def body(x):
        rank = convert(axis_index("i"))
        return psum(x * x, "i") * 2.0 + rank + convert(x > 2.0)

    return lib(body, axis_name="i")


OURS_PMAP = _pmap_body(
    ad.pmap, ad.psum, ad.axis_index, lambda v: ad.convert_element_type(v, np.float64)
)
JAX_PMAP = _pmap_body(
    jax.pmap, jax.lax.psum, jax.lax.axis_index, lambda v: v.astype(np.float64)
)
ROWS = np.arange(8.0).reshape(4, 2)


def test_pmap_inside_jit_has_pmaps_values():
    close(ad.jit(OURS_PMAP)(ROWS), jax.jit(JAX_PMAP)(ROWS))
    close(ad.jit(OURS_PMAP)(ROWS), OURS_PMAP(ROWS))
    close(
        ad.jit(lambda x: OURS_PMAP(x) * x + 1.0)(ROWS),
        jax.jit(lambda x: JAX_PMAP(x) * x + 1.0)(ROWS),
    )


def test_pmap_inside_jit_composes():
    def ours(x):
        return anp.sum(ad.jit(OURS_PMAP)(x) * x)

    def theirs(x):
        return jnp.sum(jax.jit(JAX_PMAP)(x) * x)

    close(ad.grad(ours)(ROWS), jax.grad(theirs)(ROWS))
    stacked = np.stack([ROWS, 2 * ROWS])
    close(ad.jit(ad.vmap(OURS_PMAP))(stacked), jax.jit(jax.vmap(JAX_PMAP))(stacked))


# ------------------------------------------- the function vjp returns is a pytree
# JAX's vjp returns a pytree (a jax._src.api.VJP in JAX 0.10.2) whose leaves are
# the residual arrays,
# so it passes through jit (as an argument or a result) and can be a residual
# of a custom_vjp's fwd.


def _sin_times(lib):
    np_ = jnp if lib is jax else anp
    return lambda x: np_.sin(x) * x


def _custom_vjp_keeping_vjp(lib):
    g = _sin_times(lib)

    @lib.custom_vjp
    def f(x):
        return g(x)

    def bwd(f_vjp, ct):
        return (f_vjp(ct)[0] * 3.0,)

    f.defvjp(lambda x: lib.vjp(g, x), bwd)
    return f


@pytest.mark.parametrize(
    "program",
    [
        lambda lib, f: lib.grad(f)(1.0),
        lambda lib, f: lib.jit(lib.grad(f))(1.0),
        lambda lib, f: lib.grad(lib.jit(f))(1.0),
        lambda lib, f: lib.vmap(lib.grad(f))(np.array([0.5, 1.0, 2.0])),
        lambda lib, f: lib.grad(lib.grad(f))(1.0),
        lambda lib, f: lib.value_and_grad(lambda x: f(x) * f(2.0 * x))(0.7),
    ],
)
def test_vjp_function_as_a_custom_vjp_residual(program):
    close(
        program(ad, _custom_vjp_keeping_vjp(ad)),
        program(jax, _custom_vjp_keeping_vjp(jax)),
    )


def test_vjp_function_is_a_pytree_of_its_residuals():
    _, f_vjp = ad.vjp(_sin_times(ad), 1.0)
    leaves = ad.tree_leaves(f_vjp)
    assert leaves and all(isinstance(x, (np.ndarray, np.generic)) for x in leaves)
    _, jax_vjp = jax.vjp(_sin_times(jax), 1.0)
    assert all(isinstance(x, jax.Array) for x in jax.tree.leaves(jax_vjp))


@pytest.mark.parametrize("make_jit", [ad.full_path_jit, ad.jit], ids=["part3", "fast"])
def test_vjp_function_through_jit(make_jit):
    def returned(lib, jit, x):
        return jit(lambda x: lib.vjp(_sin_times(lib), x)[1])(x)

    for x in [1.0, 2.5]:  # the second call reuses the compiled function
        close(returned(ad, make_jit, x)(1.0), returned(jax, jax.jit, x)(1.0))
    for lib, jit in [(ad, make_jit), (jax, jax.jit)]:
        apply = jit(lambda f_vjp, ct: f_vjp(ct))
        ours_or_theirs = [
            apply(lib.vjp(_sin_times(lib), x)[1], 2.0) for x in [1.0, 3.0]
        ]
        if lib is ad:
            ours = ours_or_theirs
        else:
            theirs = ours_or_theirs
    close(ours, theirs)
    close(
        make_jit(lambda f_vjp, ct: f_vjp(ct))(returned(ad, make_jit, 0.3), 2.0),
        jax.jit(lambda f_vjp, ct: f_vjp(ct))(returned(jax, jax.jit, 0.3), 2.0),
    )


def test_vmapped_vjp_function_wants_unbatched_cotangents():
    """vmap may return the function, but its residuals are batched and it still
    expects the unbatched output's type, so JAX and ours refuse a batch."""

    def run(lib):
        return lib.vmap(lambda x: lib.vjp(_sin_times(lib), x)[1])(np.ones(3))(
            np.ones(3)
        )

    with pytest.raises(ValueError, match="expected float64"):
        run(jax)
    with pytest.raises(ValueError, match=r"vjp: cotangent 0 should be float64\[\]"):
        run(ad)


# ---------------------------------------------------- vmap's keyword arguments
# JAX maps every keyword argument along axis 0; in_axes covers only the
# positional ones (a keyword argument cannot be left unbatched).


def _kw_fn(x, y=1.0, *, z=2.0):
    return x * y + z


_XS, _YS, _M = np.arange(3.0), np.arange(3.0) + 10.0, np.arange(6.0).reshape(2, 3)


@pytest.mark.parametrize(
    "program",
    [
        lambda lib: lib.vmap(_kw_fn)(_XS, y=_YS),
        lambda lib: lib.vmap(_kw_fn)(_XS, z=_YS),
        lambda lib: lib.vmap(_kw_fn, in_axes=(0,))(_XS, y=_YS, z=_YS),
        lambda lib: lib.vmap(_kw_fn, in_axes=1)(_M, y=_M.T),
        lambda lib: lib.vmap(_kw_fn, in_axes=(None, 0), out_axes=0)(2.0, _YS, z=_YS),
        lambda lib: lib.vmap(lambda x, *, d: x * d["a"] + d["b"])(
            _XS, d={"a": _YS, "b": _XS}
        ),
        lambda lib: lib.vmap(lambda *, x: x * 2.0)(x=_XS),
        lambda lib: lib.jit(lib.vmap(_kw_fn))(_XS, y=_YS),
        lambda lib: lib.grad(lambda w: lib.vmap(_kw_fn)(_XS, y=_YS * w).sum())(1.5),
    ],
)
def test_vmap_maps_keyword_arguments_along_axis_0(program):
    close(program(ad), program(jax))


@pytest.mark.parametrize(
    "kwargs, theirs, ours",
    [
        ({"z": 2.0}, "its rank should be at least 1", r"in_axes 0 is out of range"),
        (
            {"y": np.arange(4.0)},
            "inconsistent sizes",
            r"inconsistent batch sizes: size 3 .* size 4",
        ),
    ],
)
def test_vmap_keyword_argument_errors(kwargs, theirs, ours):
    with pytest.raises(ValueError, match=theirs):
        jax.vmap(_kw_fn)(_XS, **kwargs)
    with pytest.raises(ValueError, match=ours):
        ad.vmap(_kw_fn)(_XS, **kwargs)


# ------------------------------------------------------------ pmap's devices=
# JAX runs row i on the i-th device of devices= (extra devices unused), and
# refuses more rows than devices given.


def _pmap_with_devices(lib, ids, rows):
    chosen = [lib.devices()[i] for i in ids]
    body = lambda x: lib.lax.psum(x, "i") + lib.lax.axis_index("i") * x  # noqa: E731
    return lib.pmap(body, axis_name="i", devices=chosen)(np.arange(1.0, rows + 1))


@pytest.mark.parametrize(
    "ids, rows", [((2, 3, 4, 5), 4), ((2, 3, 4, 5), 3), ((5, 1), 2), (range(8), 8)]
)
def test_pmap_runs_rows_on_the_given_devices(ids, rows):
    ours, theirs = _pmap_with_devices(ad, ids, rows), _pmap_with_devices(jax, ids, rows)
    close(ours, theirs)
    ours_ids = [s.device.id for s in ours.addressable_shards]
    assert ours_ids == [s.device.id for s in theirs.addressable_shards]
    assert ours_ids == list(ids)[:rows]


def test_pmap_with_devices_under_grad_and_jit():
    def program(lib, x):
        chosen = lib.devices()[2:6]
        body = lambda x: lib.lax.psum(x * x, "i")  # noqa: E731
        per_device = lambda x: lib.pmap(body, axis_name="i", devices=chosen)(x)  # noqa: E731
        return lib.grad(lambda x: per_device(x).sum())(x), lib.jit(per_device)(x)

    close(program(ad, np.arange(4.0)), program(jax, np.arange(4.0)))


def test_pmap_more_rows_than_devices_given():
    with pytest.raises(Exception, match="partitioned 3 times"):
        _pmap_with_devices(jax, (2, 3, 4), 4)
    with pytest.raises(
        ValueError,
        match=r"pmap: the mapped axis has 4 rows but devices= gives only 3 devices",
    ):
        _pmap_with_devices(ad, (2, 3, 4), 4)
    assert _pmap_with_devices(ad, (2, 3, 4), 3).shape == (3,)


@pytest.mark.parametrize(
    "chosen, error, match",
    [
        (
            ["cpu:0"],
            TypeError,
            r"devices= must hold devices from devices\(\), got 'cpu:0'",
        ),
        (None, ValueError, r"devices= names a device twice"),
    ],
)
def test_pmap_bad_devices(chosen, error, match):
    if chosen is None:  # JAX refuses this too (a ValueError from inside)
        with pytest.raises(ValueError):
            jax.pmap(lambda x: x, devices=[jax.devices()[1]] * 2)(np.ones(2))
        chosen = [ad.devices()[1], ad.devices()[1]]
    with pytest.raises(error, match=match):
        ad.pmap(lambda x: x, devices=chosen)(np.ones(2))


# ------------------------------------- uint64 constants above int64's range
# MLIR's Python binding takes integer constants as int64; a uint64 above
# 2**63 - 1 is lowered with the same bits (it used to fail with std::bad_cast).

_BIG = [np.uint64(2**63 + 5), np.uint64(2**64 - 1), np.uint64(2**63)]


@pytest.mark.parametrize("big", _BIG, ids=str)
@pytest.mark.parametrize(
    "program",
    [
        lambda lib, c: lib.jit(lambda x: x + c)(np.uint64(1)),
        lambda lib, c: lib.jit(lambda: c * np.uint64(1))(),
        lambda lib, c: lib.jit(lambda x: x < c)(np.uint64(2**63 + 1)),
        lambda lib, c: lib.jit(lambda x: x - c)(np.arange(3, dtype=np.uint64)),
        lambda lib, c: lib.vmap(lib.jit(lambda x: x + c))(
            np.arange(3, dtype=np.uint64)
        ),
        lambda lib, c: lib.jit(lambda x: lib.numpy.maximum(x, c))(np.uint64(7)),
    ],
    ids=["add", "constant", "less", "array", "vmap", "maximum"],
)
def test_uint64_constants_above_int64_range_lower(program, big):
    ours, theirs = program(ad, big), program(jax, big)
    assert np.asarray(ours).dtype == np.asarray(theirs).dtype
    np.testing.assert_array_equal(np.asarray(ours), np.asarray(theirs))


def test_int64_extremes_still_lower():
    for c in [np.int64(-(2**63)), np.int64(2**63 - 1)]:
        ours = ad.jit(lambda x, c=c: x * np.int64(1) + c)(np.int64(0))
        theirs = jax.jit(lambda x, c=c: x * np.int64(1) + c)(np.int64(0))
        np.testing.assert_array_equal(np.asarray(ours), np.asarray(theirs))


# ------------------------------------------------ integer dtypes, as JAX's (x64)
# axis_index is int32; arange takes its dtype from its arguments (Python numbers
# weak); loop counters, switch indices and argnums-selected values keep JAX's.

_I32 = np.int32


def _axis_index_plus(lib, x):
    return lib.vmap(lambda v: lib.lax.axis_index("i") + v, axis_name="i")(x)


_DTYPE_PROGRAMS = {
    "axis_index vmap": lambda lib: lib.vmap(
        lambda x: lib.lax.axis_index("i"), axis_name="i"
    )(np.ones(3)),
    "axis_index pmap": lambda lib: lib.pmap(
        lambda x: lib.lax.axis_index("i"), axis_name="i"
    )(np.ones(3)),
    "axis_index + 1": lambda lib: lib.vmap(
        lambda x: lib.lax.axis_index("i") + 1, axis_name="i"
    )(np.ones(3)),
    "axis_index + int32": lambda lib: _axis_index_plus(lib, np.arange(3, dtype=_I32)),
    "axis_index + int64": lambda lib: _axis_index_plus(lib, np.arange(3)),
    "axis_index + float32": lambda lib: _axis_index_plus(lib, np.ones(3, np.float32)),
    "arange(5)": lambda lib: lib.numpy.arange(5),
    "arange(0, 1, 0.25)": lambda lib: lib.numpy.arange(0, 1, 0.25),
    "arange(int32)": lambda lib: lib.numpy.arange(_I32(4)),
    "arange(int32, 4)": lambda lib: lib.numpy.arange(_I32(1), 4),
    "arange(1, int32)": lambda lib: lib.numpy.arange(1, _I32(4)),
    "arange(uint8)": lambda lib: lib.numpy.arange(np.uint8(4)),
    "arange(float32)": lambda lib: lib.numpy.arange(np.float32(4)),
    "arange(int32, 2, 0.5)": lambda lib: lib.numpy.arange(_I32(0), 2, 0.5),
    "arange dtype=int32": lambda lib: lib.numpy.arange(0.0, 3.0, dtype=_I32),
    "arange in jit": lambda lib: lib.jit(lambda x: lib.numpy.arange(4) + x)(
        np.int64(1)
    ),
    "fori counter": lambda lib: lib.lax.fori_loop(0, 3, lambda i, c: i, 0),
    "fori int32 bounds": lambda lib: lib.lax.fori_loop(
        _I32(0), _I32(5), lambda i, c: c + i, _I32(0)
    ),
    "fori traced bound": lambda lib: lib.jit(
        lambda n: lib.lax.fori_loop(0, n, lambda i, c: i, 0)
    )(5),
    "fori traced int32": lambda lib: lib.jit(
        lambda n: lib.lax.fori_loop(_I32(0), n, lambda i, c: c + i, _I32(0))
    )(_I32(5)),
    "fori float32 carry": lambda lib: lib.lax.fori_loop(
        0, 5, lambda i, c: c + i, np.float32(0)
    ),
    "while counter": lambda lib: lib.lax.while_loop(
        lambda c: c < 5, lambda c: c + 1, 0
    ),
    "scan counter": lambda lib: lib.lax.scan(
        lambda c, _: (c + 1, c), 0, None, length=3
    )[1],
    "switch int32 index": lambda lib: lib.lax.switch(
        _I32(1), [lambda x: x, lambda x: x * 2], 3
    ),
    "grad argnums (0, 1)": lambda lib: lib.grad(lambda x, y: x * y, argnums=(0, 1))(
        2.0, np.float32(3.0)
    ),
    "jacfwd argnums 1": lambda lib: lib.jacfwd(lambda x, y: x * y, argnums=1)(
        2.0, np.float32(3.0)
    ),
    "value_and_grad with an int": lambda lib: lib.value_and_grad(lambda x, n: x * n)(
        np.float32(2.0), 3
    ),
    "psum of ints": lambda lib: lib.vmap(lambda x: lib.lax.psum(x, "i"), axis_name="i")(
        np.arange(3, dtype=_I32)
    ),
    "sum of int32": lambda lib: lib.numpy.sum(np.arange(3, dtype=_I32)),
}


@pytest.mark.parametrize("name", list(_DTYPE_PROGRAMS))
def test_integer_and_result_dtypes_are_jax(name):
    ours, theirs = _DTYPE_PROGRAMS[name](ad), _DTYPE_PROGRAMS[name](jax)
    ours_leaves, theirs_leaves = ad.tree_leaves(ours), jax.tree.leaves(theirs)
    assert [np.asarray(x).dtype for x in ours_leaves] == [
        np.dtype(x.dtype) for x in theirs_leaves
    ]
    close(ours, theirs)
