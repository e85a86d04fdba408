"""Bad jaxprs and bad input to make_jaxpr get clear errors (SPEC section 5).

Hand-built jaxprs that break a rule of the language are rejected by
``typecheck_jaxpr`` with a ``JaxprTypeError`` naming the problem; mistakes in a
function being traced are reported while tracing, with the error type and
message of the operation that made them. Every case checks the exception's
type (a TypeError or ValueError or a named subclass, never an internal
AssertionError/KeyError/AttributeError), its message, and that the
interpreter is usable afterwards.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from helpers import raises_clearly

import autodidax as ad
from autodidax import Jaxpr, JaxprEqn, JaxprTypeError, Lit, ShapedArray, Var

pytestmark = pytest.mark.usefixtures("clean_interpreter_stack")

F64 = np.float64
SCALAR = ShapedArray((), F64)
VEC3 = ShapedArray((3,), F64)
MAT23 = ShapedArray((2, 3), F64)


def assert_interpreter_usable() -> None:
    """Only the evaluation level is on the stack and it is the dynamic level;
    staging and eager evaluation both still work."""
    assert len(ad._state.stack) == 1
    assert ad._state.dynamic is ad._state.stack[0]
    jaxpr, _, _ = ad.make_jaxpr(lambda: ad.mul(2.0, 2.0))
    assert [e.primitive.name for e in jaxpr.eqns] == ["mul"]
    out = ad.sin(0.5)
    assert not isinstance(out, ad.Tracer)
    np.testing.assert_allclose(out, np.sin(0.5), rtol=1e-12)
    assert len(ad._state.stack) == 1


def clear_error(exc_type: type | tuple[type, ...], match: str):
    """Expect a clear error, then check the interpreter is still usable."""
    return raises_clearly(exc_type, match, then=assert_interpreter_usable)


def var(shape: tuple = (), dtype: Any = F64) -> Var:
    return Var(ShapedArray(shape, dtype))


def names_in(jaxpr: Jaxpr) -> set[str]:
    """The variable names the printer gives to the jaxpr's binders."""
    text = str(jaxpr)
    return {word.split(":")[0] for word in text.split() if ":" in word}


# ---------------------------------------------------------------------------
# typecheck_jaxpr on hand-built jaxprs
# ---------------------------------------------------------------------------


def test_well_formed_hand_built_jaxpr_passes():
    """The control case: a correct hand-built jaxpr has the expected type."""
    x, y, three, z = var((3,)), var((3,)), var((3,)), var((3,))
    jaxpr = Jaxpr(
        [x],
        [
            JaxprEqn(ad.sin_p, [x], {}, [y]),
            JaxprEqn(
                ad.broadcast_p, [Lit(3.0)], {"shape": (3,), "axes": (0,)}, [three]
            ),
            JaxprEqn(ad.mul_p, [y, three], {}, [z]),
        ],
        [z],
    )
    jaxpr_type = ad.typecheck_jaxpr(jaxpr)
    assert jaxpr_type.in_types == [VEC3] and jaxpr_type.out_types == [VEC3]
    assert str(jaxpr_type) == "(float64[3]) -> (float64[3])"


def test_unbound_variable_in_equation():
    a, b = var(), var()
    stray = var()
    jaxpr = Jaxpr([a], [JaxprEqn(ad.mul_p, [a, stray], {}, [b])], [b])
    with clear_error(JaxprTypeError, r"equation 0 \(mul\).*not bound"):
        ad.typecheck_jaxpr(jaxpr)


def test_variable_used_before_it_is_bound():
    a, b, c = var(), var(), var()
    jaxpr = Jaxpr(
        [a],
        [JaxprEqn(ad.sin_p, [b], {}, [c]), JaxprEqn(ad.cos_p, [a], {}, [b])],
        [c],
    )
    with clear_error(JaxprTypeError, r"equation 0 \(sin\): variable \w+ is not bound"):
        ad.typecheck_jaxpr(jaxpr)


def test_unbound_output():
    a, b = var(), var()
    with clear_error(JaxprTypeError, r"outputs.*not bound"):
        ad.typecheck_jaxpr(Jaxpr([a], [], [b]))


def test_bound_twice_as_input_and_equation_output():
    a = var()
    jaxpr = Jaxpr([a], [JaxprEqn(ad.sin_p, [a], {}, [a])], [a])
    with clear_error(JaxprTypeError, r"equation 0 \(sin\): variable a is bound twice"):
        ad.typecheck_jaxpr(jaxpr)
    assert "a" in names_in(jaxpr)  # the message uses the printer's name


def test_bound_twice_by_two_equations():
    a, b = var(), var()
    jaxpr = Jaxpr(
        [a],
        [JaxprEqn(ad.sin_p, [a], {}, [b]), JaxprEqn(ad.cos_p, [a], {}, [b])],
        [b],
    )
    with clear_error(JaxprTypeError, r"equation 1 \(cos\): variable b is bound twice"):
        ad.typecheck_jaxpr(jaxpr)


def test_bound_twice_as_two_inputs():
    a = var()
    with clear_error(JaxprTypeError, r"input binders: variable a is bound twice"):
        ad.typecheck_jaxpr(Jaxpr([a, a], [], [a]))


@pytest.mark.parametrize(
    "prim, in_avals, params, declared, produced",
    [
        (ad.gt_p, [SCALAR, SCALAR], {}, SCALAR, r"bool\[\]"),
        (ad.sin_p, [SCALAR], {}, VEC3, r"float64\[\]"),
        (ad.sin_p, [ShapedArray((3,), np.float32)], {}, VEC3, r"float32\[3\]"),
        (
            ad.reduce_sum_p,
            [MAT23],
            {"axes": (0,)},
            ShapedArray((2,), F64),
            r"float64\[3\]",
        ),
        (
            ad.transpose_p,
            [MAT23],
            {"perm": (0, 1)},
            ShapedArray((3, 2), F64),
            r"float64\[2,3\]",
        ),
        (
            ad.broadcast_p,
            [VEC3],
            {"shape": (3, 2), "axes": (1,)},
            MAT23,
            r"float64\[3,2\]",
        ),
    ],
)
def test_declared_output_type_wrong(prim, in_avals, params, declared, produced):
    ins = [Var(aval) for aval in in_avals]
    out = Var(declared)
    jaxpr = Jaxpr(ins, [JaxprEqn(prim, ins, params, [out])], [out])
    with clear_error(JaxprTypeError, rf"{prim.name}.*declared.*produces {produced}"):
        ad.typecheck_jaxpr(jaxpr)


@pytest.mark.parametrize("prim", [ad.add_p, ad.mul_p, ad.gt_p, ad.lt_p])
def test_shape_mismatch_in_binary_equation(prim):
    a, v, c = var(), var((3,)), var()
    jaxpr = Jaxpr([a, v], [JaxprEqn(prim, [a, v], {}, [c])], [c])
    with clear_error(JaxprTypeError, r"same shape.*float64\[\].*float64\[3\]"):
        ad.typecheck_jaxpr(jaxpr)


@pytest.mark.parametrize("prim", [ad.add_p, ad.mul_p, ad.gt_p])
def test_dtype_mismatch_in_binary_equation(prim):
    a, i, c = var(), var((), np.int64), var()
    jaxpr = Jaxpr([a, i], [JaxprEqn(prim, [a, i], {}, [c])], [c])
    with clear_error(JaxprTypeError, r"same dtype.*float64\[\].*int64\[\]"):
        ad.typecheck_jaxpr(jaxpr)


def test_dtype_mismatch_with_a_literal():
    a, c = var((), np.int64), var((), np.int64)
    jaxpr = Jaxpr([a], [JaxprEqn(ad.add_p, [a, Lit(1.5)], {}, [c])], [c])
    with clear_error(JaxprTypeError, r"same dtype"):
        ad.typecheck_jaxpr(jaxpr)


@pytest.mark.parametrize("prim", [ad.sin_p, ad.cos_p])
def test_sin_cos_of_integers(prim):
    i, out = var((2,), np.int64), var((2,), np.int64)
    jaxpr = Jaxpr([i], [JaxprEqn(prim, [i], {}, [out])], [out])
    with clear_error(JaxprTypeError, rf"{prim.name}.*float.*int64"):
        ad.typecheck_jaxpr(jaxpr)


@pytest.mark.parametrize(
    "prim, in_shape, params, out_shape, match",
    [
        (ad.reduce_sum_p, (2, 3), {"axes": (2,)}, (2,), r"axis 2 is out of range"),
        (ad.reduce_sum_p, (2, 3), {"axes": (0, 0)}, (3,), r"repeated axis"),
        (ad.reduce_sum_p, (2, 3), {"axes": ("x",)}, (3,), r"axes must be integers"),
        (ad.reduce_sum_p, (2, 3), {}, (3,), r"axes"),
        (ad.transpose_p, (2, 3), {"perm": (0, 0)}, (2, 2), r"repeated axis"),
        (ad.transpose_p, (2, 3), {"perm": (0,)}, (2,), r"permutation"),
        (ad.transpose_p, (2, 3), {"perm": (0, 2)}, (2, 3), r"out of range"),
        (
            ad.broadcast_p,
            (3,),
            {"shape": (2, 4), "axes": (0,)},
            (2, 4),
            r"cannot broadcast float64\[3\] to shape \(2, 4\)",
        ),
        (
            ad.broadcast_p,
            (3,),
            {"shape": (2, -3), "axes": (0,)},
            (2, 3),
            r"non-negative",
        ),
        (
            ad.broadcast_p,
            (3,),
            {"shape": (2, 3), "axes": (5,)},
            (2, 3),
            r"axis 5 is out of range",
        ),
        (
            ad.broadcast_p,
            (3,),
            {"shape": 3, "axes": (0,)},
            (2, 3),
            r"shape must be a sequence",
        ),
        (ad.broadcast_p, (3,), {"shape": (2, 3)}, (2, 3), r"axes"),
    ],
)
def test_bad_params(prim, in_shape, params, out_shape, match):
    x, out = var(in_shape), var(out_shape)
    jaxpr = Jaxpr([x], [JaxprEqn(prim, [x], params, [out])], [out])
    with clear_error(JaxprTypeError, rf"equation 0 \({prim.name}\).*{match}"):
        ad.typecheck_jaxpr(jaxpr)


NON_CANONICAL = {
    "reduce_sum negative axis": (ad.reduce_sum_p, (2, 3), {"axes": (-1,)}, (2,)),
    "reduce_sum int axes": (ad.reduce_sum_p, (2, 3), {"axes": 0}, (3,)),
    "reduce_sum list axes": (ad.reduce_sum_p, (2, 3), {"axes": [0]}, (3,)),
    "transpose negative perm": (ad.transpose_p, (2, 3), {"perm": (-1, 0)}, (3, 2)),
    "broadcast negative axis": (
        ad.broadcast_p,
        (3,),
        {"shape": (3, 2), "axes": (-1,)},
        (3, 2),
    ),
}


@pytest.mark.parametrize("case", sorted(NON_CANONICAL))
def test_params_accepted_by_typecheck_work_everywhere(case):
    """Params the wrappers never produce (negative axes, an int or a list of
    axes): typecheck_jaxpr must either reject them with a JaxprTypeError or
    accept a jaxpr that eval_jaxpr, jvp and vmap then run correctly (compared
    with the same jaxpr written with normalized params). Accepting them and
    failing later would be a jaxpr that type-checks but cannot run."""
    prim, in_shape, params, out_shape = NON_CANONICAL[case]
    x, out = var(in_shape), var(out_shape)
    jaxpr = Jaxpr([x], [JaxprEqn(prim, [x], params, [out])], [out])
    try:
        ad.typecheck_jaxpr(jaxpr)
    except JaxprTypeError:
        assert_interpreter_usable()
        return
    ndim = len(params.get("shape", in_shape))
    canonical = {
        k: v if k == "shape" else tuple(int(a) % ndim for a in np.atleast_1d(v))
        for k, v in params.items()
    }
    good = Jaxpr([x], [JaxprEqn(prim, [x], canonical, [out])], [out])
    ad.typecheck_jaxpr(good)
    rng = np.random.default_rng(0)
    xs = rng.uniform(-1, 1, size=(2, *in_shape))
    bad_fn, good_fn = ad.jaxpr_as_fun(jaxpr), ad.jaxpr_as_fun(good)
    np.testing.assert_array_equal(bad_fn(xs[0])[0], good_fn(xs[0])[0])
    np.testing.assert_array_equal(
        ad.jvp(bad_fn, (xs[0],), (xs[1],))[1][0],
        ad.jvp(good_fn, (xs[0],), (xs[1],))[1][0],
    )
    np.testing.assert_array_equal(ad.vmap(bad_fn)(xs)[0], ad.vmap(good_fn)(xs)[0])


def test_wrong_number_of_out_binders():
    a, b, c = var(), var(), var()
    too_many = Jaxpr([a], [JaxprEqn(ad.sin_p, [a], {}, [b, c])], [b])
    with clear_error(JaxprTypeError, r"equation 0 \(sin\).*1 outputs.*binds 2"):
        ad.typecheck_jaxpr(too_many)
    too_few = Jaxpr([a], [JaxprEqn(ad.sin_p, [a], {}, [])], [])
    with clear_error(JaxprTypeError, r"equation 0 \(sin\).*1 outputs.*binds 0"):
        ad.typecheck_jaxpr(too_few)


def test_wrong_number_of_inputs():
    a, b = var(), var()
    jaxpr = Jaxpr([a], [JaxprEqn(ad.sin_p, [a, a], {}, [b])], [b])
    with clear_error(JaxprTypeError, r"equation 0 \(sin\).*(argument|input)"):
        ad.typecheck_jaxpr(jaxpr)


@pytest.mark.parametrize(
    "binder", [Lit(1.0), "b", None, 3.0], ids=["Lit", "str", "None", "float"]
)
def test_non_var_input_binder(binder):
    with clear_error(JaxprTypeError, r"input binders: a binder must be a Var"):
        ad.typecheck_jaxpr(Jaxpr([binder], [], []))


@pytest.mark.parametrize(
    "binder", [Lit(1.0), "b", None, 3.0], ids=["Lit", "str", "None", "float"]
)
def test_non_var_equation_binder(binder):
    a = var()
    jaxpr = Jaxpr([a], [JaxprEqn(ad.sin_p, [a], {}, [binder])], [])
    with clear_error(JaxprTypeError, r"equation 0 \(sin\).*must be a Var"):
        ad.typecheck_jaxpr(jaxpr)


@pytest.mark.parametrize("atom", ["a", 1.0, None], ids=["str", "float", "None"])
def test_non_atom_input_or_output(atom):
    a, b = var(), var()
    with clear_error(JaxprTypeError, r"equation 0 \(sin\): expected a Var or Lit"):
        ad.typecheck_jaxpr(Jaxpr([a], [JaxprEqn(ad.sin_p, [atom], {}, [b])], [b]))
    with clear_error(JaxprTypeError, r"outputs: expected a Var or Lit"):
        ad.typecheck_jaxpr(Jaxpr([a], [], [atom]))


def test_jaxpr_type_error_is_a_type_error():
    assert issubclass(JaxprTypeError, TypeError)


# ---------------------------------------------------------------------------
# eval_jaxpr
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("n_args", [0, 1, 3])
def test_eval_jaxpr_wrong_number_of_args(n_args):
    jaxpr, consts, _ = ad.make_jaxpr(lambda x, y: ad.add(x, y), VEC3, VEC3)
    args = [np.ones(3)] * n_args
    with clear_error(
        TypeError,
        r"eval_jaxpr: the jaxpr takes 2 inputs, got "
        rf"{n_args}",
    ):
        ad.eval_jaxpr(jaxpr, args)


@pytest.mark.parametrize(
    "bad",
    [np.ones(4), np.float64(1.0), np.ones(3, np.int64), np.ones((1, 3))],
    ids=["shape-4", "scalar", "int64", "shape-1x3"],
)
def test_eval_jaxpr_argument_of_wrong_type(bad):
    """An argument whose type differs from its binder's is an error, not a
    result of some other type (NumPy would broadcast a scalar or a (1, 3)
    array, or add ints to floats, without complaint)."""
    jaxpr, _, _ = ad.make_jaxpr(lambda x, y: ad.add(x, y), VEC3, VEC3)
    with clear_error((TypeError, ValueError), r"shape|dtype"):
        ad.eval_jaxpr(jaxpr, [np.ones(3), bad])


# ---------------------------------------------------------------------------
# make_jaxpr: errors while tracing
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "fn, aval",
    [
        (lambda x: x if x > 0.0 else -x, SCALAR),
        (lambda x: ad.sin(x) if ad.reduce_sum(x) else x, VEC3),
        (lambda x: bool(ad.sin(x)), SCALAR),
        (lambda x: [x for _ in range(3) if x < 1.0], SCALAR),
    ],
)
def test_python_if_on_traced_value(fn, aval):
    with clear_error(ad.ConcretizationError, r"(?s)traced.*cond"):
        ad.make_jaxpr(fn, aval)


def test_python_if_inside_jvp_inside_make_jaxpr():
    def f(x):
        return ad.jvp(lambda y: y if y > 0.0 else -y, (x,), (1.0,))

    with clear_error(ad.ConcretizationError, r"(?s)traced.*cond"):
        ad.make_jaxpr(f, SCALAR)


def test_if_on_static_information_is_fine():
    """Branching on shapes or Python values is allowed while tracing."""

    def total(x):
        while x.ndim > 0:
            x = ad.reduce_sum(x, axis=0)
        return x

    jaxpr, _, _ = ad.make_jaxpr(total, ShapedArray((2, 3, 4), F64))
    assert [e.primitive.name for e in jaxpr.eqns] == ["reduce_sum"] * 3


@pytest.mark.parametrize(
    "fn, avals, exc, match",
    [
        (
            lambda x, y: ad.add(x, y),
            (VEC3, SCALAR),
            TypeError,
            r"add: operands must have the same shape, got float64\[3\] and float64\[\]",
        ),
        (
            lambda x, y: x + y,
            (VEC3, ShapedArray((2,), F64)),
            TypeError,
            r"add: operands must have the same shape, or shapes that broadcast; "
            r"got float64\[3\] and float64\[2\], whose sizes at axis -1 are 3 and 2",
        ),
        (
            lambda x, y: ad.mul(x, y),
            (VEC3, MAT23),
            TypeError,
            r"mul: .*same shape.*float64\[3\].*float64\[2,3\]",
        ),
        (
            lambda x, y: ad.greater(x, y),
            (MAT23, VEC3),
            TypeError,
            r"greater: .*same shape.*float64\[2,3\].*float64\[3\]",
        ),
        (
            lambda x, y: x > y,
            (MAT23, ShapedArray((3, 2), F64)),
            TypeError,
            r"greater: .*same shape, or shapes that broadcast.*float64\[2,3\] and "
            r"float64\[3,2\].*axis -2",
        ),
        (
            lambda x, y: x * y,
            (VEC3, ShapedArray((2,), F64)),
            TypeError,
            r"multiply: .*shapes that broadcast.*float64\[3\] and float64\[2\]",
        ),
        (
            lambda x, y: x - y,
            (MAT23, ShapedArray((2,), F64)),
            TypeError,
            r"subtract: .*shapes that broadcast.*float64\[2,3\] and float64\[2\]",
        ),
        (
            lambda x, y: ad.add(x, y),
            (VEC3, ShapedArray((3,), np.float32)),
            TypeError,
            r"add: operands must have the same dtype.*float32",
        ),
        (
            lambda x, y: ad.mul(x, y),
            (VEC3, ShapedArray((3,), np.int64)),
            TypeError,
            r"mul: .*same dtype.*int64",
        ),
        (
            lambda x: ad.sin(x),
            (ShapedArray((3,), np.int64),),
            TypeError,
            r"sin: expected a float array, got dtype int64",
        ),
        (
            lambda x: ad.cos(x),
            (ShapedArray((), np.int32),),
            TypeError,
            r"cos: expected a float array, got dtype int32",
        ),
        (
            lambda x: ad.mul(x, 2.5),
            (ShapedArray((3,), np.int64),),
            TypeError,
            r"mul: cannot combine the float 2.5 with an array of dtype int64",
        ),
        (
            lambda x: ad.transpose(x, (0, 0)),
            (MAT23,),
            ValueError,
            r"transpose: perm \(0, 0\) is not a permutation of the axes of "
            r"float64\[2,3\]",
        ),
        (
            lambda x: ad.transpose(x, (1,)),
            (MAT23,),
            ValueError,
            r"transpose: perm \(1,\) is not a permutation",
        ),
        (
            lambda x: ad.transpose(x, (0, 2)),
            (MAT23,),
            ValueError,
            r"transpose: axis 2 is out of range",
        ),
        (
            lambda x: ad.reduce_sum(x, 2),
            (MAT23,),
            ValueError,
            r"reduce_sum: axis 2 is out of range for an array of rank 2",
        ),
        (
            lambda x: ad.reduce_sum(x, -3),
            (MAT23,),
            ValueError,
            r"reduce_sum: axis -3 is out of range",
        ),
        (
            lambda x: ad.reduce_sum(x, 0.5),
            (MAT23,),
            TypeError,
            r"reduce_sum: axes must be integers",
        ),
        (
            lambda x: ad.broadcast(x, (2, 4), (0,)),
            (VEC3,),
            ValueError,
            r"broadcast: cannot broadcast an array of shape \(3,\) to shape \(2, 4\)",
        ),
        (
            lambda x: ad.broadcast(x, (2, -1), (0,)),
            (VEC3,),
            ValueError,
            r"broadcast: shape must contain non-negative integers",
        ),
        (
            lambda x: ad.broadcast(x, (2, 3), (3,)),
            (VEC3,),
            ValueError,
            r"broadcast: axis 3 is out of range",
        ),
        (
            lambda x: ad.broadcast(x, 3, (0,)),
            (VEC3,),
            TypeError,
            r"broadcast: shape must be a sequence of integers",
        ),
    ],
)
def test_errors_while_tracing(fn, avals, exc, match):
    """Shape/dtype mistakes and bad params are reported during tracing, with
    the same messages as Part 1 gives in eager code."""
    with clear_error(exc, match):
        ad.make_jaxpr(fn, *avals)


@pytest.mark.parametrize(
    "aval",
    ["float64[3]", object(), [1, "x"], {"a": b"bytes"}, np.array(["s"])],
    ids=["str", "object", "list-with-str", "bytes", "str-array"],
)
def test_non_array_avals(aval):
    with clear_error(TypeError, r"make_jaxpr: expected an array"):
        ad.make_jaxpr(lambda s: s, aval)


@pytest.mark.parametrize(
    "out",
    ["hi", ("ok", "no"), {"a": object()}, np.array(["s"])],
    ids=["str", "tuple-with-str", "object", "str-array"],
)
def test_function_returning_non_array(out):
    def f(x):
        if isinstance(out, tuple):
            return (ad.sin(x), out[1])
        return out

    with clear_error(TypeError, r"make_jaxpr: output of the function: expected"):
        ad.make_jaxpr(f, VEC3)


@pytest.mark.parametrize(
    "op, x_shape, y_shape",
    [
        (lambda x, y: x + y, (3,), ()),
        (lambda x, y: x - y, (2, 3), (3,)),
        (lambda x, y: x * y, (3, 1), (1, 4)),
        (lambda x, y: x > y, (2, 3), (3,)),
        (lambda x, y: x < y, (3,), (2, 1)),
    ],
    ids=["add-rank", "sub-row", "mul-outer", "greater-row", "less-outer"],
)
def test_operators_broadcast_while_tracing_like_jax_numpy(op, x_shape, y_shape):
    """Shapes that broadcast are no longer a mistake for the operators: the
    traced jaxpr typechecks and computes what jax.numpy computes."""
    import jax.numpy as jnp

    rng = np.random.default_rng(0)
    x, y = rng.normal(size=x_shape), rng.normal(size=y_shape)
    jaxpr, consts, _ = ad.make_jaxpr(
        op, ShapedArray(x_shape, F64), ShapedArray(y_shape, F64)
    )
    expected = np.asarray(op(jnp.asarray(x), jnp.asarray(y)))
    (out_type,) = ad.typecheck_jaxpr(jaxpr).out_types
    assert out_type.shape == expected.shape and out_type.dtype == expected.dtype
    (out,) = ad.eval_jaxpr(jaxpr, [*consts, x, y])
    np.testing.assert_allclose(np.asarray(out), expected, rtol=1e-12)


def test_make_jaxpr_v1_reports_the_same_errors():
    with clear_error(TypeError, r"add: operands must have the same shape, got"):
        ad.make_jaxpr_v1(lambda x, y: ad.add(x, y), VEC3, SCALAR)
    with clear_error(TypeError, r"add: .*shapes that broadcast.*axis -1 are 3 and 2"):
        ad.make_jaxpr_v1(lambda x, y: x + y, VEC3, ShapedArray((2,), F64))
    with clear_error(ad.ConcretizationError, r"cond"):
        ad.make_jaxpr_v1(lambda x: x if x > 0.0 else -x, SCALAR)
    with clear_error(TypeError, r"output of the function"):
        ad.make_jaxpr_v1(lambda x: "hi", SCALAR)


# ---------------------------------------------------------------------------
# Leaked tracers
# ---------------------------------------------------------------------------


def leaked_tracer() -> ad.Tracer:
    """A tracer that escaped from a finished make_jaxpr."""
    escaped = []

    def f(x):
        escaped.append(x)
        return ad.sin(x)

    ad.make_jaxpr(f, VEC3)
    (tracer,) = escaped
    assert isinstance(tracer, ad.Tracer)
    return tracer


@pytest.mark.parametrize(
    "use",
    [
        lambda t: ad.sin(t),
        lambda t: t + 1.0,
        lambda t: t * np.ones(3),
        lambda t: ad.make_jaxpr(lambda y: y + t, VEC3),
        lambda t: ad.make_jaxpr(lambda y: t, VEC3),
        lambda t: ad.make_jaxpr(lambda: ad.neg(t)),
        lambda t: ad.jvp(lambda y: y * t, (np.ones(3),), (np.ones(3),)),
        lambda t: ad.vmap(lambda y: y * t)(np.ones((2, 3))),
        lambda t: ad.make_jaxpr(lambda y: y, t),
        lambda t: ad.jvp(ad.sin, (t,), (np.ones(3),)),
    ],
    ids=[
        "eager-sin",
        "eager-add",
        "eager-mul-array",
        "closed-over-in-make_jaxpr",
        "returned-from-make_jaxpr",
        "constant-only-make_jaxpr",
        "jvp",
        "vmap",
        "as-aval",
        "as-jvp-primal",
    ],
)
def test_leaked_tracer_used_later(use):
    tracer = leaked_tracer()
    with clear_error(ad.UnexpectedTracerError, r"transformation has already finished"):
        use(tracer)


def test_leaked_tracer_from_inner_make_jaxpr_inside_outer_make_jaxpr():
    """A tracer of a finished inner make_jaxpr, used in the still-running outer
    one, is also caught (the levels have the same depth)."""

    def outer(x):
        escaped = []
        ad.make_jaxpr(lambda y: escaped.append(y) or y, VEC3)
        return x + escaped[0]

    with clear_error(ad.UnexpectedTracerError, r"already finished"):
        ad.make_jaxpr(outer, VEC3)
