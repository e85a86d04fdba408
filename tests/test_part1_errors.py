"""Bad input to Part 1 gets a clear error (SPEC §5).

Every case checks the exception's type (a TypeError or ValueError, or a named
subclass of those), that its message names the problem, and that the
interpreter stays usable afterwards: only the evaluation level is left on the
stack and a following jvp/vmap gives the right answer.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
from helpers import raises_clearly

import autodidax as ad

pytestmark = pytest.mark.usefixtures("clean_interpreter_stack")

VEC3 = np.array([0.5, -1.0, 2.0])
VEC4 = np.arange(4.0)
MAT = np.arange(6.0).reshape(2, 3)


def assert_interpreter_usable() -> None:
    """The stack holds only the evaluation level and transformations work."""
    assert len(ad._state.stack) == 1
    primal, tangent = ad.jvp(ad.sin, (0.5,), (2.0,))
    np.testing.assert_allclose(primal, np.sin(0.5), rtol=1e-12)
    np.testing.assert_allclose(tangent, 2.0 * np.cos(0.5), rtol=1e-12)
    np.testing.assert_allclose(ad.vmap(ad.cos, 1)(MAT), np.cos(MAT).T, rtol=1e-12)
    assert len(ad._state.stack) == 1


def clear_error(exc_type: type | tuple[type, ...], match: str):
    """Expect a clear error, then check the interpreter is still usable."""
    return raises_clearly(exc_type, match, then=assert_interpreter_usable)


def leak(transform: str) -> ad.Tracer:
    """A tracer that escaped from a finished jvp or vmap."""
    escaped = []

    def f(x):
        escaped.append(x)
        return ad.sin(x)

    if transform == "jvp":
        ad.jvp(f, (VEC3,), (VEC3,))
    else:
        ad.vmap(f)(MAT)
    (tracer,) = escaped
    assert isinstance(tracer, ad.Tracer)
    return tracer


# ---------------------------------------------------------------------------
# Non-array inputs
# ---------------------------------------------------------------------------

BAD_VALUES = [
    pytest.param("abc", "str", id="str"),
    pytest.param([1.0, 2.0], "list", id="list"),
    pytest.param(None, "None", id="None"),
    pytest.param(1 + 2j, "complex", id="complex"),
    pytest.param(np.array([1j, 2j]), "complex", id="complex-array"),
    pytest.param(object(), "object", id="object"),
]

PRIMITIVE_CALLS = {
    "neg": ad.neg,
    "sin": ad.sin,
    "cos": ad.cos,
    "reduce_sum": ad.reduce_sum,
    "transpose": lambda b: ad.transpose(b, (0,)),
    "broadcast": lambda b: ad.broadcast(b, (2, 2), (0,)),
    "add-left": lambda b: ad.add(b, np.ones(2)),
    "add-right": lambda b: ad.add(np.ones(2), b),
    "mul": lambda b: ad.mul(np.ones(2), b),
    "greater": lambda b: ad.greater(b, np.ones(2)),
    "less": lambda b: ad.less(np.ones(2), b),
}


@pytest.mark.parametrize("bad, type_name", BAD_VALUES)
@pytest.mark.parametrize("call", PRIMITIVE_CALLS.values(), ids=PRIMITIVE_CALLS)
def test_non_array_input_to_primitive(call, bad, type_name):
    """Strings, lists, None, complex numbers and objects are rejected."""
    with clear_error(TypeError, type_name):
        call(bad)


LIST_POSITIONS = {
    "sin": (lambda b: ad.sin(b), "sin", 0),
    "reduce_sum": (lambda b: ad.reduce_sum(b), "reduce_sum", 0),
    "add-left": (lambda b: ad.add(b, np.ones(2)), "add", 0),
    "mul-right": (lambda b: ad.mul(np.ones(2), b), "mul", 1),
}


@pytest.mark.parametrize(
    "call, name, position", LIST_POSITIONS.values(), ids=LIST_POSITIONS
)
def test_list_input_names_the_operation_and_position(call, name, position):
    """A list is a pytree, not an array: the error says where and what to do."""
    pattern = (
        rf"^{name}: expected an array or a number at position {position}, got a "
        r"list of 2 values\..*np\.asarray"
    )
    with clear_error(TypeError, pattern):
        call([1.0, 2.0])


def test_list_passed_to_a_transformed_function():
    """grad(f)([1.0, 2.0]): f sees a list of tracers; no tracer internals shown."""
    from autodidax import numpy as anp

    def f(x):
        return anp.sum(anp.sin(x))

    for transformed in (ad.grad(f), ad.jit(ad.grad(f))):
        with clear_error(TypeError, r"^sin: .*at position 0, got a list of 2 values"):
            transformed([1.0, 2.0])
        try:
            transformed([1.0, 2.0])
        except TypeError as error:
            assert "Tracer" not in str(error)
    # The advice works: the same function of an array gives JAX's numbers.
    np.testing.assert_allclose(
        ad.grad(f)(np.asarray([1.0, 2.0])), np.cos([1.0, 2.0]), rtol=1e-12
    )


@pytest.mark.parametrize("bad, type_name", BAD_VALUES[:1] + BAD_VALUES[3:])
def test_non_array_primal_or_tangent_to_jvp(bad, type_name):
    """A leaf of primals or tangents that is not an array is rejected."""
    with clear_error(TypeError, f"(?i)primal.*{type_name}|{type_name}.*primal"):
        ad.jvp(ad.sin, (bad,), (1.0,))
    with clear_error(TypeError, f"(?i)tangent.*{type_name}|{type_name}.*tangent"):
        ad.jvp(ad.sin, (1.0,), (bad,))


def test_none_primal_with_array_tangent_to_jvp():
    """None is an empty pytree, so it cannot pair with an array tangent."""
    with clear_error(TypeError, "(?i)structure"):
        ad.jvp(ad.sin, (None,), (1.0,))


def test_lists_and_none_are_pytrees_for_jvp():
    """Lists and None are containers, not bad leaves, for jvp."""

    def f(xs, nothing):
        assert nothing is None
        return ad.mul(xs[0], xs[1])

    primal, tangent = ad.jvp(f, ([2.0, 3.0], None), ([1.0, 0.5], None))
    np.testing.assert_allclose((primal, tangent), (6.0, 3.0 + 1.0))


@pytest.mark.parametrize("bad, type_name", BAD_VALUES[:1] + BAD_VALUES[3:])
def test_non_array_argument_to_vmap(bad, type_name):
    """vmap rejects non-array leaves, also inside a container argument."""
    with clear_error(TypeError, type_name):
        ad.vmap(ad.sin)(bad)
    with clear_error(TypeError, type_name):
        ad.vmap(lambda x, d: ad.add(x, d["y"]), (0, None))(VEC3, {"y": bad})


@pytest.mark.parametrize(
    "bad, type_name",
    [("abc", "str"), (object(), "object"), (1 + 2j, "complex")],
    ids=["str", "object", "complex"],
)
def test_function_returning_non_array(bad, type_name):
    """jvp, vmap and jacfwd reject a function whose output is not an array."""
    with clear_error(TypeError, type_name):
        ad.jvp(lambda x: bad, (1.0,), (1.0,))
    with clear_error(TypeError, type_name):
        ad.jvp(lambda x: (x, {"out": bad}), (1.0,), (1.0,))
    with clear_error(TypeError, type_name):
        ad.vmap(lambda x: bad)(VEC3)
    with clear_error(TypeError, type_name):
        ad.jacfwd(lambda x: bad)(VEC3)


def test_jacfwd_of_function_returning_a_tuple():
    """A tuple output gives a tuple of Jacobians, as in JAX."""
    jac_a, jac_b = ad.jacfwd(lambda x: (x, ad.sin(x)))(VEC3)
    np.testing.assert_allclose(jac_a, np.eye(3))
    np.testing.assert_allclose(jac_b, np.diag(np.cos(VEC3)))


# ---------------------------------------------------------------------------
# Binary operations: shapes and dtypes
# ---------------------------------------------------------------------------

BINARY = {
    "add": ad.add,
    "mul": ad.mul,
    "greater": ad.greater,
    "less": ad.less,
    "sub-operator": lambda x, y: x - y,
}

# The message must name both per-example shapes, (3,) and (4,), in either spelling.
SHAPES_3_AND_4 = r"(?i)shape.*(\[3\]|\(3,\)).*(\[4\]|\(4,\))"

SHAPE_PAIRS = [
    pytest.param(VEC3, VEC4, id="3-vs-4"),
    pytest.param(np.float64(1.0), VEC3, id="0d-vs-vector"),
    pytest.param(np.ones((2, 3)), np.ones((3, 2)), id="2x3-vs-3x2"),
    pytest.param(np.ones((1, 3)), np.ones((2, 3)), id="no-implicit-broadcast"),
]


@pytest.mark.parametrize("x, y", SHAPE_PAIRS)
@pytest.mark.parametrize("op", list(BINARY.values())[:4], ids=list(BINARY)[:4])
def test_binary_shape_mismatch_eager(op, x, y):
    """lax-style binary ops need equal shapes; 0-d arrays do not broadcast."""
    with clear_error(TypeError, "(?i)shape"):
        op(x, y)
    with clear_error(TypeError, "(?i)shape"):
        op(y, x)


@pytest.mark.parametrize("op", BINARY.values(), ids=BINARY)
def test_binary_shape_mismatch_under_jvp(op):
    """The shape check also runs on traced values, with the user's shapes."""
    with clear_error(TypeError, SHAPES_3_AND_4):
        ad.jvp(lambda x: op(x, VEC4), (VEC3,), (VEC3,))


@pytest.mark.parametrize("op", BINARY.values(), ids=BINARY)
def test_binary_shape_mismatch_under_vmap(op):
    """Under vmap the message shows per-example shapes, not batched ones."""
    with clear_error(TypeError, SHAPES_3_AND_4):
        ad.vmap(op)(np.ones((2, 3)), np.ones((2, 4)))
    with clear_error(TypeError, SHAPES_3_AND_4):
        ad.vmap(lambda x: op(x, VEC4))(np.ones((5, 3)))


DTYPE_PAIRS = [
    pytest.param(np.float64, np.float32, id="f64-f32"),
    pytest.param(np.float64, np.int64, id="f64-i64"),
    pytest.param(np.int32, np.int64, id="i32-i64"),
    pytest.param(np.float32, np.bool_, id="f32-bool"),
]


@pytest.mark.parametrize("dx, dy", DTYPE_PAIRS)
@pytest.mark.parametrize("op", list(BINARY.values())[:4], ids=list(BINARY)[:4])
def test_binary_dtype_mismatch(op, dx, dy):
    """Binary ops need equal dtypes (no promotion), eager, in jvp and vmap."""
    x, y = np.ones(3, dx), np.ones(3, dy)
    names = f"{np.dtype(dx).name}.*{np.dtype(dy).name}"
    with clear_error(TypeError, f"(?i)dtype.*{names}"):
        op(x, y)
    with clear_error(TypeError, "(?i)dtype"):
        ad.vmap(op)(np.ones((2, 3), dx), np.ones((2, 3), dy))
    if np.dtype(dx).kind == "f":
        with clear_error(TypeError, "(?i)dtype"):
            ad.jvp(lambda x: op(x, y), (x,), (x,))


@pytest.mark.parametrize("dtype", [np.int64, np.int32, np.uint8, np.bool_])
def test_float_scalar_with_integer_array(dtype):
    """A Python float next to an integer/bool array is an error for the strict
    wrappers, not a cast (lax refuses too; the operators promote, as jnp)."""
    ints = np.ones(3, dtype)
    with clear_error(TypeError, r"(?i)float.*1\.5|1\.5.*float"):
        ad.add(ints, 1.5)
    with clear_error(TypeError, r"(?i)float.*2\.5|2\.5.*float"):
        ad.mul(2.5, ints)
    with clear_error(TypeError, "(?i)float"):
        ad.vmap(lambda x: ad.mul(x, 0.5))(np.ones((2, 3), dtype))


@pytest.mark.parametrize(
    "dtype, value",
    [(np.uint8, -1), (np.uint8, 300), (np.int8, 1000), (np.bool_, 2)],
    ids=["uint8-neg", "uint8-big", "int8-big", "bool-2"],
)
def test_python_int_not_representable_in_array_dtype(dtype, value):
    """A Python int the array's dtype cannot hold is an error, not a cast.

    Like a float next to an int array, converting would change the value
    (e.g. 2 -> True for a bool array), so it must be a TypeError/ValueError
    that names the dtype.
    """
    with clear_error((TypeError, ValueError), np.dtype(dtype).name):
        ad.add(np.ones(3, dtype), value)


# ---------------------------------------------------------------------------
# jvp arguments
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "primals, tangents",
    [
        pytest.param((VEC3, VEC3), (VEC3,), id="fewer-tangents"),
        pytest.param((VEC3,), (VEC3, VEC3), id="more-tangents"),
        pytest.param(({"a": VEC3},), ({"b": VEC3},), id="dict-keys"),
        pytest.param(((VEC3, VEC3),), ([VEC3, VEC3],), id="tuple-vs-list"),
        pytest.param((VEC3,), ((VEC3,),), id="leaf-vs-tuple"),
    ],
)
def test_jvp_structure_mismatch(primals, tangents):
    """Primals and tangents must have the same pytree structure."""
    with clear_error(TypeError, "(?i)structure"):
        ad.jvp(lambda *args: args, primals, tangents)


@pytest.mark.parametrize(
    "primal, tangent",
    [
        pytest.param(VEC3, VEC4, id="3-vs-4"),
        pytest.param(VEC3, 1.0, id="vector-vs-scalar"),
        pytest.param(1.0, VEC3, id="scalar-vs-vector"),
        pytest.param(MAT, MAT.T, id="transposed"),
    ],
)
def test_jvp_tangent_shape_mismatch(primal, tangent):
    """Each tangent must have its primal's shape."""
    with clear_error(ValueError, r"(?i)shape"):
        ad.jvp(ad.sin, (primal,), (tangent,))
    with clear_error(ValueError, r"(?i)shape"):
        ad.jvp(lambda d: ad.sin(d["x"]), ({"x": primal},), ({"x": tangent},))


@pytest.mark.parametrize("tangent_dtype", [np.float32, np.int64, np.bool_])
def test_jvp_tangent_dtype_mismatch(tangent_dtype):
    """Each tangent must have its primal's dtype."""
    name = np.dtype(tangent_dtype).name
    with clear_error(TypeError, f"(?i)dtype.*{name}|{name}.*dtype"):
        ad.jvp(ad.sin, (VEC3,), (np.ones(3, tangent_dtype),))


@pytest.mark.parametrize(
    "primals",
    [1.0, VEC3, None, "x", {"x": 1.0}],
    ids=["float", "ndarray", "None", "str", "dict"],
)
def test_jvp_primals_not_a_tuple(primals):
    """primals and tangents are tuples with one entry per argument."""
    with clear_error(TypeError, "(?i)tuple"):
        ad.jvp(ad.sin, primals, primals)


# ---------------------------------------------------------------------------
# vmap arguments
# ---------------------------------------------------------------------------


def test_vmap_inconsistent_batch_sizes():
    """All mapped axes must have the same size; the message shows the sizes."""
    with clear_error(ValueError, r"(?i)batch size.*2.*3|size.*2.*size.*3"):
        ad.vmap(ad.add)(np.ones((2, 3)), np.ones((3, 3)))
    with clear_error(ValueError, r"(?i)size"):
        ad.vmap(ad.add, (0, 1))(np.ones((2, 3)), np.ones((2, 3)))
    with clear_error(ValueError, r"(?i)size"):
        ad.vmap(lambda t: ad.add(*t))((np.ones((4, 3)), np.ones((2, 3))))


@pytest.mark.parametrize(
    "in_axes, arg",
    [
        pytest.param(2, MAT, id="positive"),
        pytest.param(-3, MAT, id="negative"),
        pytest.param(0, np.float64(1.0), id="0d-argument"),
        pytest.param(5, VEC3, id="far"),
    ],
)
def test_vmap_in_axes_out_of_range(in_axes, arg):
    """in_axes must name an existing axis of its argument."""
    with clear_error(ValueError, "(?i)out of range"):
        ad.vmap(ad.sin, in_axes)(arg)
    with clear_error(ValueError, "(?i)out of range"):
        ad.vmap(lambda x, y: ad.mul(x, x), (0, in_axes))(VEC3, arg)


@pytest.mark.parametrize(
    "in_axes, args",
    [
        pytest.param((0,), (VEC3, VEC3), id="too-few-entries"),
        pytest.param((0, 0, 0), (VEC3, VEC3), id="too-many-entries"),
        pytest.param(({"a": 0},), ({"b": VEC3},), id="dict-keys-differ"),
        pytest.param(({"a": 0, "b": 0},), ({"a": VEC3},), id="dict-extra-key"),
        pytest.param(([0, 0],), ((VEC3, VEC3),), id="list-vs-tuple"),
        pytest.param(((0, 0, 0),), ((VEC3, VEC3),), id="tuple-length"),
        pytest.param(((0, None),), (VEC3,), id="tuple-vs-leaf"),
        pytest.param(({"a": 0},), (VEC3,), id="dict-vs-leaf"),
    ],
)
def test_vmap_in_axes_structure_mismatch(in_axes, args):
    """in_axes must be a prefix of the arguments' structure."""
    with clear_error(ValueError, "(?i)in_axes.*(structure|entries|argument)"):
        ad.vmap(lambda *a: VEC3, in_axes)(*args)


@pytest.mark.parametrize(
    "in_axes, args",
    [
        pytest.param(None, (VEC3,), id="None"),
        pytest.param((None, None), (VEC3, VEC3), id="tuple"),
        pytest.param(({"x": None}, None), ({"x": VEC3}, VEC3), id="tree"),
    ],
)
def test_vmap_all_in_axes_none(in_axes, args):
    """With every in_axes None there is nothing to map over."""
    with clear_error(ValueError, "(?i)None"):
        ad.vmap(lambda *a: VEC3, in_axes)(*args)


@pytest.mark.parametrize(
    "in_axes, args",
    [
        pytest.param(True, (VEC3,), id="True"),
        pytest.param(False, (VEC3,), id="False"),
        pytest.param("0", (VEC3,), id="str"),
        pytest.param(0.0, (VEC3,), id="float"),
        pytest.param((0, True), (VEC3, VEC3), id="bool-in-tuple"),
        pytest.param(({"a": "x"},), ({"a": VEC3},), id="str-in-tree"),
    ],
)
def test_vmap_in_axes_wrong_type(in_axes, args):
    """in_axes entries are ints or None: not bools, strings or floats."""
    with clear_error(TypeError, "(?i)in_axes"):
        ad.vmap(lambda *a: VEC3, in_axes)(*args)


@pytest.mark.parametrize("out_axes", [2, 5, -3], ids=["2", "5", "-3"])
def test_vmap_out_axes_out_of_range(out_axes):
    """out_axes must fit the rank of every output plus the batch axis."""
    with clear_error(ValueError, f"(?i)out_axes.*{out_axes}"):
        ad.vmap(ad.sin, 0, out_axes)(MAT)
    with clear_error(ValueError, "(?i)out_axes"):
        ad.vmap(lambda x: (ad.reduce_sum(x), x), 0, out_axes)(MAT)


@pytest.mark.parametrize("out_axes", ["0", 1.0, True])
def test_vmap_out_axes_wrong_type(out_axes):
    """out_axes is an int, None or a container of those."""
    with clear_error(TypeError, "(?i)out_axes"):
        ad.vmap(ad.sin, 0, out_axes)(MAT)


@pytest.mark.parametrize("out_axes", [None, (0,)])
def test_vmap_out_axes_that_do_not_fit_the_output(out_axes):
    """As JAX: None for a batched output, or a tuple for a single array, is a
    ValueError naming out_axes (tests/test_api_corners.py compares with JAX)."""
    with clear_error(ValueError, "(?i)out_axes"):
        ad.vmap(ad.sin, 0, out_axes)(MAT)


# ---------------------------------------------------------------------------
# Python control flow on batched values
# ---------------------------------------------------------------------------


def branch(x):
    """abs(x) by a Python if: fine under jvp, impossible under vmap."""
    return x if x > 0.0 else -x


def loop(x):
    while x < 10.0:
        x = x * 2.0
    return x


@pytest.mark.parametrize(
    "batched, xs",
    [
        pytest.param(ad.vmap(branch), VEC3, id="if"),
        pytest.param(ad.vmap(loop), VEC3, id="while"),
        pytest.param(ad.vmap(lambda x: bool(ad.sin(x))), VEC3, id="bool"),
        pytest.param(
            ad.vmap(lambda x: ad.jvp(branch, (x,), (1.0,))), VEC3, id="vmap-of-jvp"
        ),
        pytest.param(
            lambda xs: ad.jvp(ad.vmap(branch), (xs,), (xs,)), VEC3, id="jvp-of-vmap"
        ),
        pytest.param(ad.vmap(ad.vmap(branch)), MAT, id="vmap-of-vmap"),
    ],
)
def test_python_if_on_batched_value(batched, xs):
    """Python branching on a batched value raises ConcretizationError."""
    with clear_error(ad.ConcretizationError, "(?i)batch|vmap") as info:
        batched(xs)
    assert isinstance(info.value, TypeError)


def test_python_if_is_fine_under_jvp():
    """The same branch works under jvp, where primal values are known."""
    for x, sign in ((2.0, 1.0), (-3.0, -1.0)):
        primal, tangent = ad.jvp(branch, (x,), (1.0,))
        assert primal == abs(x) and tangent == sign


def test_error_classes_are_type_errors():
    """The named error classes are TypeErrors, as the API promises."""
    assert issubclass(ad.ConcretizationError, TypeError)
    assert issubclass(ad.UnexpectedTracerError, TypeError)


# ---------------------------------------------------------------------------
# reduce_sum / transpose / broadcast parameters
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "axis, exc, match",
    [
        pytest.param(2, ValueError, "(?i)out of range", id="out-of-range"),
        pytest.param(-3, ValueError, "(?i)out of range", id="negative-out-of-range"),
        pytest.param((0, 2), ValueError, "(?i)out of range", id="tuple-out-of-range"),
        pytest.param((0, 0), ValueError, "(?i)repeated|duplicate", id="repeated"),
        pytest.param((1, -1), ValueError, "(?i)repeated|duplicate", id="repeated-neg"),
        pytest.param(1.0, TypeError, "(?i)integer", id="float"),
        pytest.param("0", TypeError, "(?i)integer", id="str"),
        pytest.param((0, 0.5), TypeError, "(?i)integer", id="float-in-tuple"),
        pytest.param(True, TypeError, "(?i)integer", id="bool"),
    ],
)
def test_reduce_sum_bad_axis(axis, exc, match):
    """reduce_sum checks its axis, eagerly and on traced values."""
    with clear_error(exc, match):
        ad.reduce_sum(MAT, axis)
    with clear_error(exc, match):
        ad.jvp(lambda x: ad.reduce_sum(x, axis), (MAT,), (MAT,))
    with clear_error(exc, match):
        ad.vmap(lambda x: ad.reduce_sum(x, axis), 2)(np.ones((2, 3, 4)))


def test_reduce_sum_axis_under_vmap_uses_per_example_rank():
    """Under vmap, axis 1 of a per-example vector is out of range (rank 1)."""
    with clear_error(ValueError, "(?i)out of range.*rank 1|rank 1.*out of range"):
        ad.vmap(lambda x: ad.reduce_sum(x, 1))(MAT)
    with clear_error(ValueError, "(?i)out of range"):
        ad.reduce_sum(np.float64(1.0), 0)


@pytest.mark.parametrize(
    "perm, exc, match",
    [
        pytest.param((0, 0), ValueError, "(?i)repeated|permutation", id="repeated"),
        pytest.param((1, -1), ValueError, "(?i)repeated|permutation", id="rep-neg"),
        pytest.param((0,), ValueError, "(?i)permutation", id="too-short"),
        pytest.param((0, 1, 2), ValueError, "(?i)range|permutation", id="too-long"),
        pytest.param((0, 2), ValueError, "(?i)range|permutation", id="out-of-range"),
        pytest.param((-3, 0), ValueError, "(?i)range|permutation", id="negative"),
        pytest.param(None, TypeError, "(?i)integer|perm", id="None"),
        pytest.param((0.0, 1.0), TypeError, "(?i)integer", id="floats"),
        pytest.param("01", TypeError, "(?i)integer", id="str"),
    ],
)
def test_transpose_bad_perm(perm, exc, match):
    """transpose's perm must be a permutation of the input's axes."""
    with clear_error(exc, match):
        ad.transpose(MAT, perm)
    with clear_error(exc, match):
        ad.jvp(lambda x: ad.transpose(x, perm), (MAT,), (MAT,))
    with clear_error(exc, match):
        ad.vmap(lambda x: ad.transpose(x, perm), 1)(np.ones((2, 5, 3)))


@pytest.mark.parametrize("perm", [(0, 0), (1, -1), (1,), [0, 0]])
def test_transpose_bad_perm_names_perm_and_type(perm):
    """The message names the argument ``perm``, its value and the operand's type."""
    shown = re.escape(str(tuple(perm)))
    match = (
        rf"transpose: perm {shown} is not a permutation of the axes of float64\[2,3\]"
    )
    with clear_error(ValueError, match):
        ad.transpose(MAT, perm)
    with clear_error(ValueError, match):
        ad.jvp(lambda x: ad.transpose(x, perm), (MAT,), (MAT,))


@pytest.mark.parametrize(
    "operand, shape, axes, exc, match",
    [
        pytest.param(VEC3, (2, 4), (0,), ValueError, r"(?i)\(3,\)", id="size"),
        pytest.param(VEC3, (3, 2), (0,), ValueError, r"(?i)\(3,\)", id="wrong-axis"),
        pytest.param(VEC3, (2, 3), (), ValueError, r"(?i)\(3,\)", id="no-new-axis"),
        pytest.param(VEC3, (3,), (0,), ValueError, r"(?i)shape", id="all-new"),
        pytest.param(VEC3, (-2, 3), (0,), ValueError, "(?i)negative", id="neg-dim"),
        pytest.param(VEC3, (2, 3), (2,), ValueError, "(?i)range", id="axis-range"),
        pytest.param(VEC3, (2, 3), (-3,), ValueError, "(?i)range", id="neg-range"),
        pytest.param(1.0, (2, 3), (0, 0), ValueError, "(?i)repeated", id="repeat"),
        pytest.param(1.0, (2, 3), (1, -1), ValueError, "(?i)repeated", id="rep-neg"),
        pytest.param(VEC3, None, (0,), TypeError, "(?i)shape", id="shape-None"),
        pytest.param(VEC3, (2.0, 3), (0,), (TypeError, ValueError), "(?i)integer",
                     id="float-dim"),
        pytest.param(VEC3, (2, 3), (0.0,), TypeError, "(?i)integer", id="float-axis"),
    ],
)  # fmt: skip
def test_broadcast_bad_parameters(operand, shape, axes, exc, match):
    """broadcast checks its target shape and the positions of the new axes."""
    with clear_error(exc, match):
        ad.broadcast(operand, shape, axes)
    with clear_error(exc, match):
        ad.jvp(lambda x: ad.broadcast(x, shape, axes), (operand,), (operand,))
    batch = np.stack([np.asarray(operand)] * 2, axis=-1)
    with clear_error(exc, match):
        ad.vmap(lambda x: ad.broadcast(x, shape, axes), -1)(batch)


# ---------------------------------------------------------------------------
# Leaked tracers
# ---------------------------------------------------------------------------

LEAK_USES = {
    "primitive": lambda t: ad.sin(t),
    "operator": lambda t: t * 2.0,
    "with-array": lambda t: ad.add(VEC3, t),
    "reduce_sum": lambda t: ad.reduce_sum(t),
    "comparison": lambda t: t > 0.0,
    "in-new-jvp": lambda t: ad.jvp(lambda y: ad.mul(y, t), (VEC3,), (VEC3,)),
    "returned-from-new-jvp": lambda t: ad.jvp(lambda y: t, (VEC3,), (VEC3,)),
    "in-new-vmap": lambda t: ad.vmap(lambda y: ad.add(y, t))(MAT[:, :3]),
    "as-jvp-primal": lambda t: ad.jvp(ad.sin, (t,), (VEC3,)),
    "as-unmapped-vmap-arg": lambda t: ad.vmap(ad.mul, (0, None))(MAT, t),
    "passed-through-jvp": lambda t: ad.jvp(lambda y: y, (t,), (VEC3,)),
    "passed-through-vmap": lambda t: ad.vmap(lambda y: y)(t),
    "in-nested-jvp": lambda t: ad.jvp(
        lambda x: ad.jvp(lambda y: ad.mul(ad.mul(x, y), t), (x,), (x,))[1],
        (VEC3,),
        (VEC3,),
    ),
}


@pytest.mark.parametrize("transform", ["jvp", "vmap"])
@pytest.mark.parametrize("use", LEAK_USES.values(), ids=LEAK_USES)
def test_leaked_tracer(transform, use):
    """A tracer used after its transformation finished is reported."""
    tracer = leak(transform)
    with clear_error(ad.UnexpectedTracerError, "(?i)escaped|leak|finished"):
        use(tracer)


# ---------------------------------------------------------------------------
# Pytrees and primitives
# ---------------------------------------------------------------------------


def test_tree_unflatten_wrong_number_of_leaves():
    """tree_unflatten says how many leaves the structure needs."""
    _, treedef = ad.tree_flatten((1.0, {"a": 2.0, "b": [3.0]}))
    with clear_error(ValueError, "(?i)3 leaves.*2|leaves"):
        ad.tree_unflatten(treedef, [1.0, 2.0])


def test_primitive_without_rule():
    """A user primitive missing a rule names the primitive and the rule.

    NotImplementedError is the right type here (it is not bad input but an
    unfinished extension), as in JAX.
    """
    only_impl = ad.Primitive("test_only_impl")
    only_impl.def_rule("impl")(lambda x: [np.sin(x)])
    np.testing.assert_allclose(ad.bind(only_impl, VEC3), np.sin(VEC3))
    with pytest.raises(NotImplementedError, match="test_only_impl.*jvp"):
        ad.jvp(lambda x: ad.bind(only_impl, x), (VEC3,), (VEC3,))
    with pytest.raises(NotImplementedError, match="test_only_impl.*vmap"):
        ad.vmap(lambda x: ad.bind(only_impl, x))(MAT)
    assert_interpreter_usable()
