# ---
# jupyter:
#   jupytext:
#     default_lexer: ipython3
#     formats: ipynb,md:myst,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.6
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# (appendix)=
# # Appendix: more primitives and a NumPy-like front end
#
# :::{admonition} Where we are
# :class: note
# Parts 1–5 built the core transformations — `jvp`, `vmap`, `make_jaxpr`,
# `jit`, `linearize`, `vjp`, `grad` and `cond` — on ten elementwise and shape
# primitives plus `select` (and Part 5's `keep_gradient`, a `select` helper for
# derivatives). That was enough to explain the machinery, and too little to
# write a real program with. Parts 6–9, after this appendix, add loops, custom
# rules and collectives.
# :::
#
# The chapters kept the set of primitives small on purpose: each new primitive
# would have added a handful of rules to read, and none of them would have taught
# anything new about interpreters. Now that the machinery is finished, the
# balance flips. This appendix adds what a small numerical program needs, and
# along the way shows three ideas: a primitive is a wrapper plus a few small
# rules, so it costs little once the interpreters exist; a NumPy-like front
# end (promotion and broadcasting) sits on top of strict primitives and only
# stages them; and every Python protocol on a tracer must either work as in JAX
# or raise a clear error, because Python's default answer (for `==`, an identity test) is
# silently wrong on a tracer. In detail:
#
# 1. **twenty primitives**: `sub`, `div`, `max`, `exp`, `log`, `tanh`,
#    `sqrt`, `rsqrt`, the
#    comparisons `eq`, `ne`, `le` and `ge`, `stop_gradient`, integer powers and
#    `pow` (for a traced exponent), `convert_element_type`, `reshape`,
#    `reduce_max`, `dot_general`, the one contraction behind every matrix
#    product, and `erf` — each with every
#    {term}`rule <rule>` the earlier parts defined;
# 2. **NumPy's broadcasting** for binary operations, spelled out as explicit
#    `reshape` and `broadcast` equations so that jaxprs stay explicit;
#    and **JAX's dtype rules**, the promotion lattice with weak Python numbers;
# 3. the **operators** `- / ** @` and the comparisons `== != <= >=` on
#    tracers and arrays, NumPy's array methods, and a small
#    module `autodidax.numpy` (`sum`, `mean`, `exp`, `where`, `matmul`,
#    `einsum`, ...) so that user code reads like code written for `jax.numpy`,
#    and a few functions of `jax.nn` (`softmax`, `log_softmax`, `gelu`, ...);
# 4. the **table of every primitive and every rule**, generated from the
#    registries, with no gaps;
# 5. a worked example: the gradient of a two-layer neural network's loss with
#    `jit(grad(loss))`, checked against JAX, and a few steps of training.
#
# The folded cell below loads the library code of the chapters from the module
# `autodidax`, as in {ref}`Part 2 <part2-setup>`. In Colab it first installs the
# JAX release the book is tested with and fetches the module.

# %% tags=["hide-input"]
# @title Setup: the pinned JAX, the module `autodidax`, the earlier chapters
from __future__ import annotations

try:
    import book_setup  # book/book_setup.py, next to this notebook
except ImportError:  # Colab opens a notebook on its own: fetch the helper first
    from urllib.request import urlretrieve

    urlretrieve(
        "https://raw.githubusercontent.com/autodidax-book/autodidax/main/book/"
        "book_setup.py",
        "book_setup.py",
    )
    import book_setup

book_setup.load_book(globals(), before="appendix_primitives")

# %% [markdown]
# The second folded cell imports JAX, against which the appendix checks its
# answers.

# %% tags=["hide-input"]
# @title JAX, to check the answers against
import jax
import jax.numpy as jnp


# %% [markdown]
# Every check of this appendix, and every rule that repeats a pattern of the
# earlier parts, is in a folded cell whose title says what it holds; the text
# names them only where the idea needs them.
#
# The demos trace functions of float64 arrays; `f64(3, 4)` is the type of a
# 3×4 one, and `scalar` that of a float64 number.


# %%
def f64(*shape):
    return ShapedArray(shape, np.float64)


scalar = f64()

# %% [markdown]
# ## What a primitive needs
#
# Every primitive so far has the same kit, and a new one needs all of it:
#
# | part | what it says | defined in |
# |---|---|---|
# | a wrapper | checks the user's arguments and calls `bind` with canonical params | {ref}`Part 1 <part1>` |
# | `impl` | how to compute it with NumPy | {ref}`Part 1 <part1>` |
# | `jvp` | its derivative, written with primitives | {ref}`Part 1 <part1-jvp-rules>` |
# | `vmap` | how to apply it to a batch at once | {ref}`Part 1 <part1-vmap>` |
# | `abstract_eval` | its output type, from its input types | {ref}`Part 2 <part2-abstract-eval>` |
# | `lower` | the StableHLO it becomes | {ref}`Part 3 <part3>` |
# | `transpose` | for a {term}`linear` primitive: how cotangents flow back | {ref}`Part 4 <part4-transposition>` |
#
# Partial evaluation needs nothing per primitive: the generic rule of
# {ref}`Part 4 <part4>` stages any first-order primitive whose inputs are not all
# known. Only the higher-order primitives, `xla_call` and `cond`, bring special
# partial-evaluation rules.
#
# Here are thirteen of the twenty new primitives (`stop_gradient`, the four
# comparisons, `pow` and `erf` are created where they are explained). Besides `PRIMITIVES`, which lists every primitive, a
# second registry, `NOT_LINEAR`, records which primitives are *not linear in any
# input*: for those a transpose rule is not missing but
# meaningless, and the table at the end of the appendix marks them as such.

# %% tags=["export"]
sub_p = Primitive("sub")
div_p = Primitive("div")
max_p = Primitive("max")
exp_p = Primitive("exp")
log_p = Primitive("log")
tanh_p = Primitive("tanh")
sqrt_p = Primitive("sqrt")
rsqrt_p = Primitive("rsqrt")
integer_pow_p = Primitive("integer_pow")
convert_element_type_p = Primitive("convert_element_type")
reshape_p = Primitive("reshape")
reduce_max_p = Primitive("reduce_max")
dot_general_p = Primitive("dot_general")

NOT_LINEAR = {
    "sin",
    "cos",
    "gt",
    "lt",
    "exp",
    "log",
    "tanh",
    "sqrt",
    "rsqrt",
    "max",
    "integer_pow",
    "reduce_max",
}


# %% [markdown]
# ## Changing the dtype
#
# The first new primitive is one the others' rules will use.
# `convert_element_type` is NumPy's `astype`. Its param is the new dtype; when
# the dtype does not change, the wrapper returns its input and records nothing.
# Between floats the conversion is linear (up to rounding), so its derivative
# converts the tangent and its transpose converts the cotangent back. Into or
# out of integers and booleans nothing varies smoothly, and the tangent is zero.
# Evaluation (`astype`), abstract evaluation (the new dtype) and batching (the
# elementwise rule, passing the params along; integer powers reuse it) are
# routine, and folded after the main cell.


# %% tags=["export"]
def convert_element_type(x: ArrayLike, dtype: Any) -> ArrayLike:
    """``x`` with its elements converted to ``dtype`` (NumPy's ``astype``)."""
    new_dtype = check_array_dtype("convert_element_type", dtype)
    if get_aval(x).dtype == new_dtype:
        return x
    return bind(convert_element_type_p, x, new_dtype=new_dtype)


@convert_element_type_p.def_rule("jvp")
def _convert_element_type_jvp(primals, tangents, *, new_dtype):
    (x,), (dx,) = primals, tangents
    out = convert_element_type(x, new_dtype)
    if get_aval(x).dtype.kind == "f" and new_dtype.kind == "f":
        return [out], [convert_element_type(dx, new_dtype)]
    return [out], [zeros_like(out)]


@convert_element_type_p.def_rule("transpose")
def _convert_element_type_transpose(cts, x, *, new_dtype):
    (ct,) = cts
    check_float_to_float(x.aval.dtype, new_dtype)
    return [convert_element_type(ct, x.aval.dtype)]


# %% tags=["export", "hide-input"]
# @title convert_element_type: evaluation, abstract evaluation, batching
import math


@convert_element_type_p.def_rule("impl")
def _convert_element_type_impl(x, *, new_dtype):
    return [np.asarray(x).astype(new_dtype)]


@convert_element_type_p.def_rule("abstract_eval")
def _convert_element_type_abstract_eval(x, *, new_dtype):
    check_new_dtype_param(new_dtype)
    return [ShapedArray(x.shape, new_dtype)]


def _elementwise_vmap_with_params(prim: Primitive) -> None:
    @prim.def_rule("vmap")
    def rule(axis, vals, dims, **params):
        (x,), (ax,) = vals, dims
        return [bind(prim, x, **params)], [ax]


_elementwise_vmap_with_params(convert_element_type_p)


# %% tags=["export", "hide-input"]
# @title Checks: dtypes that arrays can hold
def check_array_dtype(name: str, dtype: Any) -> np.dtype:
    """``dtype`` as a NumPy dtype of booleans, integers or floats."""
    try:
        new_dtype = None if dtype is None else np.dtype(dtype)
    except TypeError:
        new_dtype = None
    if new_dtype is None:
        raise TypeError(f"{name}: {dtype!r} is not a dtype")
    if new_dtype.kind not in _ARRAY_KINDS or new_dtype.itemsize > 8:
        kinds = {"U": "strings", "S": "bytes", "O": "objects", "c": "complex numbers"}
        what = (
            f" (a dtype of {kinds[new_dtype.kind]})" if new_dtype.kind in kinds else ""
        )
        raise TypeError(
            f"{name}: cannot convert to {new_dtype}{what}; arrays "
            "hold booleans, integers or floats of up to 64 bits"
        )
    return new_dtype


def check_new_dtype_param(new_dtype: Any) -> None:
    if not isinstance(new_dtype, np.dtype) or new_dtype.kind not in _ARRAY_KINDS:
        raise TypeError(
            "convert_element_type: param new_dtype must be a NumPy dtype of "
            f"booleans, integers or floats, got {new_dtype!r}"
        )


def check_float_to_float(old: np.dtype, new: np.dtype) -> None:
    if old.kind != "f" or new.kind != "f":
        raise TypeError(
            "convert_element_type: only float-to-float conversions are linear, "
            f"got {old.name} to {new.name}"
        )


# %% tags=["export", "hide-input"]
# @title Lowering: a conversion to bool compares with zero
@convert_element_type_p.def_rule("lower")
def _convert_element_type_lower(ctx, avals_in, avals_out, x, *, new_dtype):
    (x_aval,), (out_aval,) = avals_in, avals_out
    if out_aval.dtype == np.bool_ and x_aval.dtype != np.bool_:
        zero = ir_constant(0, x_aval)
        kind = {"f": "FLOAT", "u": "UNSIGNED"}.get(x_aval.dtype.kind, "SIGNED")
        return [
            hlo.compare(
                x,
                zero,
                hlo.ComparisonDirectionAttr.get("NE"),
                compare_type=hlo.ComparisonTypeAttr.get(kind),
            )
        ]
    return [hlo.convert(ir_type(out_aval), x)]


# %% [markdown]
# ## Eight elementwise primitives, and four comparisons
#
# `sub`, `div` and `max` take two operands of one shape and dtype, like `add`;
# `exp`, `log`, `tanh`, `sqrt` and `rsqrt` ($1/\sqrt{x}$) take one float
# array, like `sin`. Their wrappers, in the
# folded cell, are `bind` with {ref}`Part 1 <part1>`'s helpers, so Python numbers
# broadcast as they do for `add` and `mul`; all but `sub` and `max` first
# check that their operands hold floats. (What `/` should do with integers is a
# front-end decision, made further down.)


# %% tags=["export", "hide-input"]
# @title The eight wrappers: bind, after a check for floats where one is needed
def sub(x: ArrayLike, y: ArrayLike) -> ArrayLike:
    """Elementwise ``x - y``."""
    return _bind_binary(sub_p, x, y)


def div(x: ArrayLike, y: ArrayLike) -> ArrayLike:
    """Elementwise ``x / y`` of float arrays."""
    if _is_python_scalar(x) and _is_python_scalar(y):
        x, y = float(x), float(y)
    check_float_arrays("div", x, y)
    return _bind_binary(div_p, x, y)


def maximum(x: ArrayLike, y: ArrayLike) -> ArrayLike:
    """Elementwise larger of ``x`` and ``y``."""
    return _bind_binary(max_p, x, y)


def exp(x: ArrayLike) -> ArrayLike:
    """Elementwise e to the power ``x``, for a float array."""
    _check_kind("exp", x, "f", "a float")
    return bind(exp_p, x)


def log(x: ArrayLike) -> ArrayLike:
    """Elementwise natural logarithm of a float array."""
    _check_kind("log", x, "f", "a float")
    return bind(log_p, x)


def tanh(x: ArrayLike) -> ArrayLike:
    """Elementwise hyperbolic tangent of a float array."""
    _check_kind("tanh", x, "f", "a float")
    return bind(tanh_p, x)


def sqrt(x: ArrayLike) -> ArrayLike:
    """Elementwise square root of a float array."""
    _check_kind("sqrt", x, "f", "a float")
    return bind(sqrt_p, x)


def rsqrt(x: ArrayLike) -> ArrayLike:
    """Elementwise ``1 / sqrt(x)`` of a float array."""
    _check_kind("rsqrt", x, "f", "a float")
    return bind(rsqrt_p, x)


def check_float_arrays(name: str, *operands: ArrayLike) -> None:
    """Operands that are arrays must hold floats (Python numbers adapt)."""
    for operand in operands:
        if not _is_python_scalar(operand):
            _check_kind(name, operand, "f", "a float")


# %% [markdown]
# Evaluation, abstract evaluation, batching and lowering are mostly one line
# each (`sub` adds a check that refuses booleans), because {ref}`Parts 1 <part1>` to {ref}`3 <part3>` already wrote the helpers
# that turn "this is an elementwise NumPy function / StableHLO operation" into a
# rule. Here they are: adding a primitive is registering its rules.

# %% tags=["export"]
for _prim, _np_fn in [
    (sub_p, np.subtract),
    (div_p, np.divide),
    (max_p, np.maximum),
    (exp_p, np.exp),
    (log_p, np.log),
    (tanh_p, np.tanh),
    (sqrt_p, np.sqrt),
    (rsqrt_p, lambda x: 1 / np.sqrt(x)),
]:
    _impl_from_numpy(_prim, _np_fn)

_binary_abstract_eval(max_p)


@sub_p.def_rule("abstract_eval")
def _sub_abstract_eval(x, y):
    check_binary_operands("sub", x, y)
    if x.dtype == np.bool_:  # as in NumPy and JAX
        raise TypeError("sub: booleans cannot be subtracted; use != for exclusive or")
    return [ShapedArray(x.shape, x.dtype)]


_unary_abstract_eval(exp_p, "f", "a float")
_unary_abstract_eval(log_p, "f", "a float")
_unary_abstract_eval(tanh_p, "f", "a float")
_unary_abstract_eval(sqrt_p, "f", "a float")
_unary_abstract_eval(rsqrt_p, "f", "a float")

for _prim in [sub_p, div_p, max_p]:
    _binary_vmap(_prim)
for _prim in [exp_p, log_p, tanh_p, sqrt_p, rsqrt_p]:
    _unary_vmap(_prim)

_lower_with(sub_p, hlo.subtract)
_lower_with(div_p, hlo.divide)
_lower_with(max_p, hlo.maximum)
_lower_with(exp_p, hlo.exponential)
_lower_with(log_p, hlo.log)
_lower_with(tanh_p, hlo.tanh)
_lower_with(sqrt_p, hlo.sqrt)
_lower_with(rsqrt_p, hlo.rsqrt)


# %% tags=["export", "hide-input"]
# @title div's abstract evaluation: same shapes, float operands
@div_p.def_rule("abstract_eval")
def _div_abstract_eval(x, y):
    check_binary_operands("div", x, y)
    if x.dtype.kind != "f":
        raise TypeError(f"div: expected float arrays, got {x.str_short()}")
    return [ShapedArray(x.shape, x.dtype)]


# %% [markdown]
# (appendix-comparison-primitives)=
# Four comparisons are registered the same way. {ref}`Part 1 <part1>` has `gt`
# and `lt`; JAX also has `eq`, `ne`, `le` and `ge`, and the derivative of `max`
# below needs `eq` to find ties. Each reuses the rules `gt` and `lt` got chapter
# by chapter: NumPy evaluates it, its output is a boolean array with a zero
# tangent, batching aligns the two batch axes, abstract evaluation checks the
# operands and answers `bool`, and lowering emits `stablehlo.compare` with a
# direction. (Why `x == y` on a tracer must call `eq` is a story of its own,
# told {ref}`further down <appendix-comparisons>`.)

# %% tags=["export"]
eq_p = Primitive("eq")
ne_p = Primitive("ne")
le_p = Primitive("le")
ge_p = Primitive("ge")
NOT_LINEAR.update(["eq", "ne", "le", "ge"])

for _prim, _np_fn, _direction in [
    (eq_p, np.equal, "EQ"),
    (ne_p, np.not_equal, "NE"),
    (le_p, np.less_equal, "LE"),
    (ge_p, np.greater_equal, "GE"),
]:
    _impl_from_numpy(_prim, _np_fn)
    _comparison_jvp(_prim)
    _binary_vmap(_prim)
    _binary_abstract_eval(_prim, out_dtype=np.bool_)
    _lower_comparison(_prim, _direction)


# %% tags=["export", "hide-input"]
# @title The four wrappers: equal not_equal less_equal greater_equal, strict
def equal(x: ArrayLike, y: ArrayLike) -> ArrayLike:
    """Elementwise ``x == y``, a boolean array (the primitive ``eq``)."""
    return _bind_binary(eq_p, x, y)


def not_equal(x: ArrayLike, y: ArrayLike) -> ArrayLike:
    """Elementwise ``x != y``, a boolean array (the primitive ``ne``)."""
    return _bind_binary(ne_p, x, y)


def less_equal(x: ArrayLike, y: ArrayLike) -> ArrayLike:
    """Elementwise ``x <= y``, a boolean array (the primitive ``le``)."""
    return _bind_binary(le_p, x, y)


def greater_equal(x: ArrayLike, y: ArrayLike) -> ArrayLike:
    """Elementwise ``x >= y``, a boolean array (the primitive ``ge``)."""
    return _bind_binary(ge_p, x, y)


# %% [markdown]
# The derivatives are the ones from a calculus course, written with primitives
# so that every interpreter can run them (and so that they can be differentiated
# again):
#
# - $\frac{d}{dx} e^x = e^x$, so the JVP of `exp` reuses its output;
# - $\frac{d}{dx} \log x = 1/x$;
# - $\frac{d}{dx} \tanh x = 1 - \tanh^2 x$, again from the output;
# - $\frac{d}{dx} \sqrt{x} = 1/(2\sqrt{x})$ and
#   $\frac{d}{dx} x^{-1/2} = -\tfrac{1}{2} x^{-1/2}/x$, both from the output;
# - $d(x/y) = dx/y - (x/y)\,dy/y$, which also reuses the output.
#
# `sub` is linear, and {ref}`Part 1 <part1-jvp-rules>`'s `_linear_jvp` covers it.

# %% tags=["export"]
_linear_jvp(sub_p)


@exp_p.def_rule("jvp")
def _exp_jvp(primals, tangents):
    (x,), (dx,) = primals, tangents
    out = exp(x)
    return [out], [mul(dx, out)]


@log_p.def_rule("jvp")
def _log_jvp(primals, tangents):
    (x,), (dx,) = primals, tangents
    return [log(x)], [div(dx, x)]


@tanh_p.def_rule("jvp")
def _tanh_jvp(primals, tangents):
    (x,), (dx,) = primals, tangents
    out = tanh(x)
    return [out], [mul(dx, sub(1.0, mul(out, out)))]


@sqrt_p.def_rule("jvp")
def _sqrt_jvp(primals, tangents):
    (x,), (dx,) = primals, tangents
    out = sqrt(x)
    return [out], [div(dx, mul(out, 2.0))]


@rsqrt_p.def_rule("jvp")
def _rsqrt_jvp(primals, tangents):
    (x,), (dx,) = primals, tangents
    out = rsqrt(x)
    return [out], [mul(dx, mul(div(out, x), -0.5))]


@div_p.def_rule("jvp")
def _div_jvp(primals, tangents):
    (x, y), (dx, dy) = primals, tangents
    out = div(x, y)
    return [out], [div(sub(dx, mul(out, dy)), y)]


# %% [markdown]
# `max` needs a decision. Away from ties, the derivative of $\max(x, y)$ is the
# derivative of whichever operand is larger. Where $x = y$ the function has a
# kink and no derivative; any slope between the two one-sided slopes is a
# reasonable answer. We give each operand half, as JAX does: then
# `maximum(x, x)`, which is just `x`, has slope exactly 1, and the rule is
# symmetric in its operands. A tie is found with `equal` (the primitive `eq`,
# registered just above); where an operand is NaN, neither wins nor
# ties, and the slope is zero, again as in JAX. For integers there is nothing to
# differentiate, and the tangent is zero, as for the comparisons of Part 1.


# %% tags=["export"]
@max_p.def_rule("jvp")
def _max_jvp(primals, tangents):
    (x, y), (dx, dy) = primals, tangents
    out = maximum(x, y)
    dtype = get_aval(out).dtype
    if dtype.kind != "f":
        return [out], [zeros_like(out)]
    x_wins = convert_element_type(greater(x, y), dtype)  # 1.0 or 0.0
    y_wins = convert_element_type(less(x, y), dtype)
    half_if_tie = mul(convert_element_type(equal(x, y), dtype), 0.5)
    d_out = add(mul(dx, add(x_wins, half_if_tie)), mul(dy, add(y_wins, half_if_tie)))
    return [out], [d_out]


# %% [markdown]
# Two of the six are linear: `sub` in both operands, and `div` in its numerator
# (dividing by a fixed $y$ is scaling by $1/y$). Their transpose rules follow
# the pattern of `add` and `mul` in {ref}`Part 4 <part4-transposition>`: the
# cotangent flows back to `x - y` as $(\bar c, -\bar c)$, and to $x / y$ as
# $\bar c / y$.


# %% tags=["export"]
@sub_p.def_rule("transpose")
def _sub_transpose(cts, x, y):
    (ct,) = cts
    return [ct if _is_undef(x) else None, neg(ct) if _is_undef(y) else None]


@div_p.def_rule("transpose")
def _div_transpose(cts, x, y):
    (ct,) = cts
    if _is_undef(y):
        raise TypeError("div: transposing a division by a linear value")
    return [div(ct, y), None]


# %% [markdown]
# That is all eight. A quick check of the derivatives against JAX, and of the tie
# rule: at $x = y$ both operands of `max` get half of the slope.


# %%
def smooth(x, y):
    return tanh(div(exp(x), y)) - log(maximum(x, y))


x0, y0 = 0.7, 1.3
ours = grad(lambda xy: smooth(*xy))((x0, y0))
with jax.enable_x64(True):
    theirs = jax.grad(
        lambda xy: jnp.tanh(jnp.exp(xy[0]) / xy[1]) - jnp.log(jnp.maximum(*xy))
    )((x0, y0))
print("ours:", [float(g) for g in ours])
print("JAX: ", [float(g) for g in theirs])
tie = grad(lambda xy: maximum(*xy))((2.0, 2.0))
print("slopes of max at a tie:", [float(s) for s in tie])

# %% [markdown]
# ## `stop_gradient`
#
# `stop_gradient(x)` is `x` when evaluated, but differentiation treats it as a
# constant: its JVP rule returns a zero tangent. It is linear (it is the
# identity), yet it needs no transpose rule: its tangent is always a fresh zero,
# so `stop_gradient` is never applied to a tangent and never appears in a linear
# jaxpr. JAX registers no transpose rule for it either. A second registry,
# `NEVER_TRANSPOSED`, records such primitives, so that the rule table can say
# *never transposed* rather than report a gap. Every other rule is the
# identity's, one line each in the folded cell.

# %% tags=["export"]
stop_gradient_p = Primitive("stop_gradient")


def stop_gradient(x: Any) -> Any:
    """``x`` (any pytree), treated as a constant by differentiation."""
    return tree_map(lambda leaf: bind(stop_gradient_p, leaf), x)


@stop_gradient_p.def_rule("jvp")
def _stop_gradient_jvp(primals, tangents):
    (x,) = primals
    return [stop_gradient(x)], [zeros_like(x)]


NEVER_TRANSPOSED = {"stop_gradient"}  # linear, but never in a linear jaxpr

# %% tags=["export", "hide-input"]
# @title The other rules of stop_gradient: the identity's
_impl_from_numpy(stop_gradient_p, np.asarray)
_unary_abstract_eval(stop_gradient_p, "biuf", "a numeric")
_unary_vmap(stop_gradient_p)
_lower_with(stop_gradient_p, lambda x: x)

# %%
print(grad(lambda x: x * stop_gradient(x))(3.0))  # 3.0, not 6.0


# %% [markdown]
# ## Integer powers
#
# `x ** 3` could be written `x * x * x`, but a primitive for integer powers keeps
# jaxprs short and derivatives simple. The exponent is a
# {term}`parameter <params>`, not an operand: it is a Python integer known when
# the program is traced, so `integer_pow[y=3]` is a different operation from
# `integer_pow[y=2]`, just as `reduce_sum[axes=(0,)]` differs from
# `reduce_sum[axes=(1,)]`. Negative exponents are allowed for floats only
# (NumPy refuses them for integers as well).


# %% tags=["export"]
def integer_pow(x: ArrayLike, y: int) -> ArrayLike:
    """Elementwise ``x ** y`` for an integer exponent ``y``."""
    check_integer_power(x, y)
    return bind(integer_pow_p, x, y=int(y))


# %% [markdown]
# The wrapper checks that the exponent is an integer, that the base is numeric,
# and that a negative power has a float base; the abstract evaluation rule
# checks the same on types. Both checks are folded here, with the evaluation
# rule (`np.power`) and the abstract evaluation rule (the input's type).


# %% tags=["export", "hide-input"]
# @title Checks: an integer exponent, a numeric base; evaluation, abstract evaluation
@integer_pow_p.def_rule("impl")
def _integer_pow_impl(x, *, y):
    return [np.power(x, y)]


@integer_pow_p.def_rule("abstract_eval")
def _integer_pow_abstract_eval(x, *, y):
    check_integer_power_types(x, y)
    return [ShapedArray(x.shape, x.dtype)]


def check_integer_power(x: ArrayLike, y: Any) -> None:
    if not _is_axis(y):  # a Python or NumPy integer, not a bool
        raise TypeError(
            f"integer_pow: the exponent must be an integer, got {_describe(y)}; "
            "for other powers use lax.pow (which ** and jnp.power choose)"
        )
    _check_kind("integer_pow", x, "iuf", "a numeric (not boolean)")
    if y < 0 and get_aval(x).dtype.kind != "f":
        raise ValueError(
            f"integer_pow: integers cannot be raised to the negative power {y}; "
            "convert them to float first"
        )


def check_integer_power_types(x: ShapedArray, y: Any) -> None:
    if not _is_axis(y) or x.dtype.kind not in "iuf" or (y < 0 and x.dtype.kind != "f"):
        raise TypeError(f"integer_pow: cannot raise {x.str_short()} to the power {y!r}")


def _describe(value: Any) -> str:
    """A value for an error message: an array or tracer by its type."""
    if isinstance(value, (Tracer, np.ndarray, *DEVICE_ARRAY_TYPES)):
        return f"an array of type {get_aval(value).str_short()}"
    return _short_repr(value)


# %% [markdown]
# The derivative is $\frac{d}{dx} x^n = n x^{n-1}$, itself an integer power, so
# derivatives of every order stay within the primitive. The batching rule is
# `_elementwise_vmap_with_params`, defined with `convert_element_type`'s folded
# rules: it applies the primitive, params and all, to the batched operand, and
# the batch axis stays where it was.


# %% tags=["export"]
@integer_pow_p.def_rule("jvp")
def _integer_pow_jvp(primals, tangents, *, y):
    (x,), (dx,) = primals, tangents
    out = integer_pow(x, y)
    if y == 0 or get_aval(out).dtype.kind != "f":
        return [out], [zeros_like(out)]
    slope = x if y == 2 else integer_pow(x, y - 1)  # x**1 is x: no integer_pow[y=1]
    return [out], [mul(dx, mul(slope, float(y)))]


_elementwise_vmap_with_params(integer_pow_p)


# %% [markdown]
# StableHLO has a general `power` operation, but for a known integer exponent a
# few multiplications are cheaper and exact. The lowering rule squares
# repeatedly and multiplies together the squares that the exponent's binary
# digits select: $x^{13} = x^8 \cdot x^4 \cdot x$, since $13 = 1101_2$. That is
# five multiplications instead of twelve; the folded cell holds the rule, and the
# lowered module below shows them.


# %% tags=["export", "hide-input"]
# @title Lowering: square repeatedly, multiply the squares the exponent's bits select
@integer_pow_p.def_rule("lower")
def _integer_pow_lower(ctx, avals_in, avals_out, x, *, y):
    (aval,) = avals_in
    result, square, n = None, x, abs(y)
    while n:
        if n & 1:  # this binary digit of the exponent is set
            result = square if result is None else hlo.multiply(result, square)
        n >>= 1
        if n:
            square = hlo.multiply(square, square)
    if result is None:  # y == 0
        result = ir_constant(1, aval)
    if y < 0:
        result = hlo.divide(ir_constant(1, aval), result)
    return [result]


# %%
power_jaxpr, _, _ = make_jaxpr(lambda x: integer_pow(x, 13), scalar)
print(power_jaxpr)
print(lower_jaxpr(power_jaxpr))

# %% [markdown]
# ## Powers with a traced exponent: `pow`
#
# An exponent is not always known when the program is traced. Adam's bias
# correction divides by $1 - \beta^t$, where $t$ is the step counter, a traced
# integer under `jit`. For that JAX has a second primitive, `pow`, whose
# exponent is an operand: `x ** y` with a float `x` and a `y` that is either
# of the same float dtype or an integer array (which the lowering converts, so
# that `0.9 ** t` needs no conversion in the jaxpr).
#
# Its derivative has a part for each operand. In the base it is the integer
# power's, $y\,x^{y-1}$. In the exponent, $x^y = e^{y \log x}$ gives
# $\log x \cdot x^y$, which reuses the output. Two conventions at zero are
# JAX's: an integer exponent of 0 has slope 0 in the base (not $0 \cdot
# x^{-1}$, which is NaN at $x = 0$), and $\log x$ is taken as $\log 1 = 0$ where
# $x = 0$, so that $0^y$, which is 0 for every positive $y$, has slope 0 in
# $y$. An integer exponent is not differentiated (its tangent is zero).

# %% tags=["export"]
pow_p = Primitive("pow")
NOT_LINEAR.add("pow")


@pow_p.def_rule("jvp")
def _pow_jvp(primals, tangents):
    (x, y), (dx, dy) = primals, tangents
    out = general_pow(x, y)
    dtype = get_aval(x).dtype
    y_float = convert_element_type(y, dtype)
    ones = np.ones(get_aval(x).shape, dtype)
    if get_aval(y).dtype.kind == "f":
        slope_x = mul(y_float, general_pow(x, sub(y_float, ones)))
        slope_y = mul(log(select(equal(x, zeros_like(x)), ones, x)), out)
        return [out], [add(mul(dx, slope_x), mul(dy, slope_y))]
    y_is_0 = equal(y_float, zeros_like(y_float))
    y_or_1 = select(y_is_0, ones, y_float)  # no 0 * inf in the unused branch
    slope_x = mul(y_or_1, general_pow(x, sub(y_float, ones)))
    return [out], [mul(dx, select(y_is_0, zeros_like(x), slope_x))]


# %% [markdown]
# The wrapper is `general_pow` (`lax.pow` in `autodidax.lax`; Python's own
# `pow` keeps its name); it and the other rules are folded: NumPy evaluates it,
# batching is `add`'s, and the lowering converts an integer exponent to the
# base's dtype before StableHLO's `power`. The front end's `**` and `power`
# choose between the two primitives: a Python or NumPy integer exponent gives
# `integer_pow`, anything else `pow`.


# %% tags=["export", "hide-input"]
# @title lax.pow: the wrapper and checks, evaluation, typing, batching, lowering
def general_pow(x: ArrayLike, y: ArrayLike) -> ArrayLike:
    """Elementwise ``x ** y``: a float ``x``; ``y`` of ``x``'s dtype or integer."""
    x, y = _pow_operands(x, y)
    return bind(pow_p, x, y)


def _pow_operands(x: ArrayLike, y: ArrayLike) -> tuple[ArrayLike, ArrayLike]:
    """Python numbers become arrays shaped like the other operand: a float
    base as the exponent's float dtype (or float64), an exponent as int64 or
    the base's dtype; then the operands are checked."""
    if _is_python_scalar(x):
        y_dtype = np.float64 if _is_python_scalar(y) else get_aval(y, "pow", 1).dtype
        x = np.asarray(float(x), y_dtype if y_dtype.kind == "f" else np.float64)
    if _is_python_scalar(y) and type(y) is not bool:
        y = np.asarray(y, np.int64 if type(y) is int else get_aval(x, "pow").dtype)
    x_aval, y_aval = get_aval(x, "pow", 0), get_aval(y, "pow", 1)
    if y_aval.ndim == 0 and x_aval.ndim:
        y = broadcast(y, x_aval.shape, tuple(range(x_aval.ndim)))
    elif x_aval.ndim == 0 and y_aval.ndim:
        x = broadcast(x, y_aval.shape, tuple(range(y_aval.ndim)))
    check_pow_types(get_aval(x), get_aval(y))
    return x, y


def check_pow_types(x: ShapedArray, y: ShapedArray) -> None:
    if x.dtype.kind != "f" or not (y.dtype == x.dtype or y.dtype.kind in "iu"):
        raise TypeError(
            f"pow: the base must be a float array and the exponent an integer "
            f"array or a float array of the base's dtype, got {x.str_short()} "
            f"and {y.str_short()}"
        )
    if x.shape != y.shape:
        raise TypeError(
            f"pow: operands must have the same shape, got {x.str_short()} and "
            f"{y.str_short()}"
        )


@pow_p.def_rule("impl")
def _pow_impl(x, y):
    return [np.power(x, np.asarray(y, x.dtype))]


@pow_p.def_rule("abstract_eval")
def _pow_abstract_eval(x, y):
    check_pow_types(x, y)
    return [ShapedArray(x.shape, x.dtype)]


_binary_vmap(pow_p)


@pow_p.def_rule("lower")
def _pow_lower(ctx, avals_in, avals_out, x, y):
    x_aval, y_aval = avals_in
    if y_aval.dtype != x_aval.dtype:
        y = hlo.convert(ir_type(ShapedArray(y_aval.shape, x_aval.dtype)), y)
    return [hlo.power(x, y)]


# %%
print(make_jaxpr(lambda t: general_pow(0.9, t), ShapedArray((), np.int64))[0])
dx, dy = grad(general_pow, argnums=(0, 1))(2.0, 3.0)
print(float(dx), float(dy))  # 3 * 2**2 and log(2) * 2**3


# %% [markdown]
# ## `reshape`
#
# `reshape` reads the elements in row-major order and pours them into a new
# shape with the same number of elements. As in NumPy, one entry of the new
# shape may be `-1`, worked out by the wrapper; the param `new_sizes` is always
# the full shape.


# %% tags=["export"]
def reshape(x: ArrayLike, shape: int | Sequence[int]) -> ArrayLike:
    """The elements of ``x``, in row-major order, in an array of ``shape``."""
    aval = get_aval(x)
    shape = check_reshape(aval, shape)  # sizes, at most one -1, that fit x
    if -1 in shape:
        known = math.prod(d for d in shape if d != -1)
        shape = tuple(aval.size // known if d == -1 else d for d in shape)
    if shape == aval.shape:
        return x
    return bind(reshape_p, x, new_sizes=shape)


# %% tags=["export", "hide-input"]
# @title Checks: a shape that holds all the elements
def check_reshape(aval: ShapedArray, shape: Any) -> tuple:
    """``shape`` as a tuple, checked against the size of ``aval``."""
    if _is_axis(shape):
        shape = (shape,)
    shape = _check_shape_or_hole("reshape", shape)
    if -1 in shape:
        known = math.prod(d for d in shape if d != -1)
        if known == 0 or aval.size % known:
            raise ValueError(
                f"reshape: cannot reshape {aval.str_short()} ({aval.size} "
                f"elements) into shape {shape}"
            )
    elif math.prod(shape) != aval.size:
        raise ValueError(
            f"reshape: cannot reshape {aval.str_short()} ({aval.size} elements) "
            f"into shape {shape} ({math.prod(shape)} elements)"
        )
    return shape


def _check_shape_or_hole(name: str, shape: Any) -> tuple:
    """Like _check_shape, but one entry may be -1."""
    try:
        dims = tuple(shape)
    except TypeError:
        raise TypeError(
            f"{name}: shape must be a sequence of integers, got {shape!r}"
        ) from None
    holes = [i for i, d in enumerate(dims) if _is_axis(d) and d == -1]
    if len(holes) > 1:
        raise ValueError(f"{name}: at most one entry of the shape can be -1: {dims}")
    try:
        checked = _check_shape(
            name, [0 if i in holes else d for i, d in enumerate(dims)]
        )
    except ValueError:
        raise ValueError(
            f"{name}: shape must contain non-negative integers and at most one "
            f"-1, got {dims}"
        ) from None
    return tuple(-1 if i in holes else d for i, d in enumerate(checked))


def check_reshape_param(x: ShapedArray, new_sizes: Any) -> tuple:
    if not isinstance(new_sizes, tuple):
        raise TypeError(f"reshape: param new_sizes must be a tuple, got {new_sizes!r}")
    shape = _check_shape("reshape", new_sizes)
    if math.prod(shape) != x.size:
        raise ValueError(f"reshape: cannot reshape {x.str_short()} into shape {shape}")
    return shape


# %% [markdown]
# Reshaping is linear, and so simple that its rules almost write themselves: the
# tangent is reshaped like the primal, a cotangent is reshaped back to the
# input's shape, and a batch is handled by moving the batch axis to the front
# and keeping it there, because a reshape must not mix elements of different
# examples.


# %% tags=["export", "hide-input"]
# @title The rules of reshape: linear; a batch axis kept in front
@reshape_p.def_rule("impl")
def _reshape_impl(x, *, new_sizes):
    return [np.reshape(np.asarray(x), new_sizes)]


@reshape_p.def_rule("abstract_eval")
def _reshape_abstract_eval(x, *, new_sizes):
    return [ShapedArray(check_reshape_param(x, new_sizes), x.dtype)]


_linear_jvp(reshape_p)


@reshape_p.def_rule("vmap")
def _reshape_vmap(axis, vals, dims, *, new_sizes):
    (x,), (bdim,) = vals, dims
    front = move_batch_axis(axis.size, bdim, 0, x)
    return [bind(reshape_p, front, new_sizes=(axis.size, *new_sizes))], [0]


@reshape_p.def_rule("lower")
def _reshape_lower(ctx, avals_in, avals_out, x, *, new_sizes):
    return [hlo.reshape(ir_type(avals_out[0]), x)]


@reshape_p.def_rule("transpose")
def _reshape_transpose(cts, x, *, new_sizes):
    (ct,) = cts
    return [reshape(ct, x.aval.shape)]


# %% [markdown]
# ## `reduce_max`
#
# `reduce_max` is `reduce_sum`'s sibling: the same `axes` param, the same
# batching rule (renumber the axes around the batch axis), a `reduce` in
# StableHLO with `maximum` instead of `add` in its body. The starting value of
# that reduction is the identity of `max`, minus infinity for floats and the
# smallest integer for integers, which is also what a maximum over zero elements
# returns; NumPy needs to be told (`initial=`), or it refuses empty reductions.


# %% tags=["export"]
def reduce_max(x: ArrayLike, axis: int | Sequence[int] | None = None) -> ArrayLike:
    """The largest element over ``axis`` (an int, ints, or None for all axes)."""
    _check_kind("reduce_max", x, "iuf", "a numeric (not boolean)")
    ndim = get_aval(x).ndim
    axes = range(ndim) if axis is None else axis
    return bind(reduce_max_p, x, axes=_normalize_axes("reduce_max", axes, ndim))


def _max_identity(dtype: np.dtype) -> Any:
    """The identity of max: -inf, or the smallest integer of the dtype."""
    dtype = np.dtype(dtype)
    return -np.inf if dtype.kind == "f" else np.iinfo(dtype).min


# %% [markdown]
# The other rules are folded; batching is `reduce_sum`'s rule with another
# primitive.


# %% tags=["export", "hide-input"]
# @title reduce_max: evaluation, abstract evaluation, batching, lowering to a reduce
@reduce_max_p.def_rule("impl")
def _reduce_max_impl(x, *, axes):
    return [np.max(np.asarray(x), axis=axes, initial=_max_identity(x.dtype))]


@reduce_max_p.def_rule("abstract_eval")
def _reduce_max_abstract_eval(x, *, axes):
    check_reduce_max_types(x, axes)
    return [ShapedArray([d for i, d in enumerate(x.shape) if i not in axes], x.dtype)]


def check_reduce_max_types(x: ShapedArray, axes: Any) -> None:
    if x.dtype.kind not in "iuf":
        raise TypeError(f"reduce_max: expected a numeric array, got {x.str_short()}")
    _check_canonical_axes("reduce_max", "axes", axes, x.ndim)


@reduce_max_p.def_rule("vmap")
def _reduce_max_vmap(axis, vals, dims, *, axes):
    (x,), (bdim,) = vals, dims
    full_axes = tuple(a if a < bdim else a + 1 for a in axes)
    out_bdim = bdim - sum(1 for a in axes if a < bdim)
    return [bind(reduce_max_p, x, axes=full_axes)], [out_bdim]


@reduce_max_p.def_rule("lower")
def _reduce_max_lower(ctx, avals_in, avals_out, x, *, axes):
    (x_aval,), (out_aval,) = avals_in, avals_out
    scalar = ShapedArray((), x_aval.dtype)
    lowest = ir_constant(_max_identity(x_aval.dtype), scalar)
    reduce = hlo.ReduceOp(
        [ir_type(out_aval)], [x], [lowest], ir.DenseI64ArrayAttr.get(axes)
    )
    body = reduce.regions[0].blocks.append(ir_type(scalar), ir_type(scalar))
    with ir.InsertionPoint(body):
        hlo.ReturnOp([hlo.maximum(*body.arguments)])
    return [reduce.result]


# %% [markdown]
# Its derivative is the tie question of `max` again, over many elements. Moving
# one input by a small amount moves the maximum only if that input is the
# maximum; if several elements share the maximum, we average their tangents,
# which generalizes the half-and-half rule and is again JAX's choice. The rule
# finds the winners by comparing each element with the maximum broadcast back to
# the input's shape, with `equal` (the primitive `eq`). A NaN maximum equals nothing, so it has no winners and its tangent
# is NaN, as in JAX.


# %% tags=["export"]
@reduce_max_p.def_rule("jvp")
def _reduce_max_jvp(primals, tangents, *, axes):
    (x,), (dx,) = primals, tangents
    out = reduce_max(x, axes)
    aval = get_aval(x)
    if aval.dtype.kind != "f":
        return [out], [zeros_like(out)]
    spread = broadcast(out, aval.shape, axes)
    is_winner = convert_element_type(equal(x, spread), aval.dtype)
    winners = reduce_sum(is_winner, axes)
    return [out], [div(reduce_sum(mul(dx, is_winner), axes), winners)]


# %%
scores = np.array([[1.0, 3.0, 3.0], [0.5, -1.0, 2.0]])
ours = grad(lambda s: reduce_sum(reduce_max(s, 1)))(scores)
with jax.enable_x64(True):
    theirs = jax.grad(lambda s: jnp.sum(jnp.max(s, 1)))(scores)
print(ours)
print(np.array_equal(ours, theirs))


# %% [markdown]
# (appendix-dot)=
# ## `dot_general`: one primitive for every product
#
# Matrix–matrix, matrix–vector and vector–vector products, and their batched
# versions, are all the same operation: multiply elements of two arrays that
# face each other along some pairs of axes, and sum over those pairs. JAX
# describes every such product with one primitive, `dot_general`, and so do we.
# Its param `dimension_numbers` is a pair of pairs:
#
# - `(x_contract, y_contract)`: axes of `x` and of `y` that are multiplied
#   together and summed away, in matching order;
# - `(x_batch, y_batch)`: axes that are matched up but *not* summed, like the
#   example axis of a batch of matrix products.
#
# The output has the batch axes first, then the remaining ("free") axes of `x`,
# then those of `y`, each in their original order. A matrix product `x @ y` of
# `(m, k)` by `(k, n)` contracts axis 1 of `x` with axis 0 of `y`: `(((1,), (0,)),
# ((), ()))`, and its output is `(m, n)`. A matrix–vector product contracts the
# same axes, and its output is `(m,)`.


# %% tags=["export"]
def _free_axes(ndim: int, *used: tuple[int, ...]) -> list[int]:
    """The axes among ``range(ndim)`` in none of the tuples ``used``."""
    taken = {a for axes in used for a in axes}
    return [a for a in range(ndim) if a not in taken]


def dot_general(x: ArrayLike, y: ArrayLike, dimension_numbers: Any) -> ArrayLike:
    """Multiply ``x`` and ``y`` along paired axes, summing the contracted ones."""
    x, y = (_as_input(v, "dot_general") for v in (x, y))
    dims = _check_dot_dims(get_aval(x), get_aval(y), dimension_numbers)
    return bind(dot_general_p, x, y, dimension_numbers=dims)


@dot_general_p.def_rule("abstract_eval")
def _dot_general_abstract_eval(x, y, *, dimension_numbers):
    check_canonical_dot_dims(x, y, dimension_numbers)
    (xc, yc), (xb, yb) = dimension_numbers
    shape = [x.shape[i] for i in xb]
    shape += [x.shape[i] for i in _free_axes(x.ndim, xc, xb)]
    shape += [y.shape[j] for j in _free_axes(y.ndim, yc, yb)]
    return [ShapedArray(shape, x.dtype)]


# %% tags=["export", "hide-input"]
# @title Checks: dimension numbers that fit the operands
def _check_dot_dims(x: ShapedArray, y: ShapedArray, dims: Any) -> tuple:
    """Check ``((x_contract, y_contract), (x_batch, y_batch))`` against the
    operand types, and return it in canonical form (tuples of ints)."""
    try:
        (xc, yc), (xb, yb) = dims
    except (TypeError, ValueError):
        raise TypeError(
            "dot_general: dimension_numbers must be ((x_contract, y_contract), "
            f"(x_batch, y_batch)), got {dims!r}"
        ) from None
    xc, xb = (_normalize_axes("dot_general", axes, x.ndim) for axes in (xc, xb))
    yc, yb = (_normalize_axes("dot_general", axes, y.ndim) for axes in (yc, yb))
    if len(xc) != len(yc) or len(xb) != len(yb):
        raise ValueError(
            "dot_general: x and y need as many contracting axes as each other, "
            f"and as many batch axes; got {dims}"
        )
    if set(xc) & set(xb) or set(yc) & set(yb):
        raise ValueError(f"dot_general: an axis is both contracting and batch: {dims}")
    for kind, x_axes, y_axes in [("contracting", xc, yc), ("batch", xb, yb)]:
        for i, j in zip(x_axes, y_axes):
            if x.shape[i] != y.shape[j]:
                raise TypeError(
                    f"dot_general: {kind} axis {i} of x {x.str_short()} has size "
                    f"{x.shape[i]}, but {kind} axis {j} of y {y.str_short()} has "
                    f"size {y.shape[j]}"
                )
    if x.dtype != y.dtype:
        raise TypeError(
            f"dot_general: operands must have the same dtype, got {x.str_short()} "
            f"and {y.str_short()} (use convert_element_type to make them match)"
        )
    if x.dtype.kind not in "iuf":
        raise TypeError(f"dot_general: expected numeric arrays, got {x.str_short()}")
    return ((xc, yc), (xb, yb))


def check_canonical_dot_dims(x: ShapedArray, y: ShapedArray, dims: Any) -> None:
    if _check_dot_dims(x, y, dims) != dims:
        raise TypeError(
            f"dot_general: param dimension_numbers={dims!r} is not "
            "in canonical form (tuples of non-negative ints)"
        )


# %% [markdown]
# NumPy's `einsum` speaks exactly this language, with letters for axes: paired
# axes share a letter, and the letters of the output say what is kept and in
# which order. The evaluation rule translates the params into an `einsum`
# specification, and lowering hands the same params to StableHLO's own
# `dot_general`, a direct translation.


# %% tags=["export", "hide-input"]
# @title Evaluation with np.einsum; lowering to StableHLO's dot_general
@dot_general_p.def_rule("impl")
def _dot_general_impl(x, y, *, dimension_numbers):
    (xc, yc), (xb, yb) = dimension_numbers
    x_letters = [chr(ord("a") + i) for i in range(np.ndim(x))]
    y_letters = [chr(ord("A") + j) for j in range(np.ndim(y))]
    for i, j in zip(xc + xb, yc + yb):
        y_letters[j] = x_letters[i]  # paired axes share a letter
    out = [x_letters[i] for i in xb]
    out += [x_letters[i] for i in _free_axes(np.ndim(x), xc, xb)]
    out += [y_letters[j] for j in _free_axes(np.ndim(y), yc, yb)]
    spec = f"{''.join(x_letters)},{''.join(y_letters)}->{''.join(out)}"
    return [np.einsum(spec, x, y)]


@dot_general_p.def_rule("lower")
def _dot_general_lower(ctx, avals_in, avals_out, x, y, *, dimension_numbers):
    (xc, yc), (xb, yb) = dimension_numbers
    dims = hlo.DotDimensionNumbers.get(
        lhs_batching_dimensions=list(xb),
        rhs_batching_dimensions=list(yb),
        lhs_contracting_dimensions=list(xc),
        rhs_contracting_dimensions=list(yc),
    )
    return [hlo.dot_general(ir_type(avals_out[0]), x, y, dims)]


# %% [markdown]
# A product is linear in each operand separately (bilinear), so its derivative
# is the product rule, $d(xy) = dx\,y + x\,dy$, with the same dimension numbers
# for both terms.


# %% tags=["export"]
@dot_general_p.def_rule("jvp")
def _dot_general_jvp(primals, tangents, *, dimension_numbers):
    (x, y), (dx, dy) = primals, tangents
    params = dict(dimension_numbers=dimension_numbers)
    out = bind(dot_general_p, x, y, **params)
    d_out = add(
        bind(dot_general_p, dx, y, **params), bind(dot_general_p, x, dy, **params)
    )
    return [out], [d_out]


# %% [markdown]
# ### Batching without a loop
#
# A batch of products is still a product, so `vmap` never has to loop over
# examples. The batching rule only renumbers axes: a batch axis inserted at
# position `b` shifts every axis at or after `b` up by one, and then there are
# three cases.
#
# - **Both operands batched.** The two batch axes face each other: they become
#   one more pair of *batch* dimensions. Batch dimensions come first in the
#   output, so the output's batch axis is 0.
# - **Only `x` batched.** Its batch axis is just one more free axis of `x`; it
#   lands among `x`'s free axes in the output, after the existing batch axes.
# - **Only `y` batched.** Likewise, among `y`'s free axes, after all of `x`'s.


# %% tags=["export"]
def _shift_axes(axes: tuple[int, ...], bdim: int) -> tuple[int, ...]:
    """Renumber axes after a batch axis has been inserted at ``bdim``."""
    return tuple(a + 1 if a >= bdim else a for a in axes)


@dot_general_p.def_rule("vmap")
def _dot_general_vmap(axis, vals, dims, *, dimension_numbers):
    (x, y), (bx, by) = vals, dims
    (xc, yc), (xb, yb) = dimension_numbers
    if bx is not None and by is not None:
        xc, xb = _shift_axes(xc, bx), (bx, *_shift_axes(xb, bx))
        yc, yb = _shift_axes(yc, by), (by, *_shift_axes(yb, by))
        out_dim = 0
    elif bx is not None:
        xc, xb = _shift_axes(xc, bx), _shift_axes(xb, bx)
        x_free = _free_axes(get_aval(x).ndim, xc, xb)
        out_dim = len(xb) + x_free.index(bx)
    else:
        yc, yb = _shift_axes(yc, by), _shift_axes(yb, by)
        num_x_free = len(_free_axes(get_aval(x).ndim, xc, xb))
        y_free = _free_axes(get_aval(y).ndim, yc, yb)
        out_dim = len(xb) + num_x_free + y_free.index(by)
    out = bind(dot_general_p, x, y, dimension_numbers=((xc, yc), (xb, yb)))
    return [out], [out_dim]


# %% [markdown]
# A matrix applied to a batch of vectors, and a batch of matrices applied to a
# batch of vectors, each become a single `dot_general`. In the first, the batch
# axis of the vectors is a free axis, which lands after the matrix's rows, so
# `vmap` adds a `transpose` to move it to the front, where `out_axes=0` wants
# it. In the second, the two batch axes form a batch dimension.


# %%
def matvec(m, v):
    return dot_general(m, v, (((1,), (0,)), ((), ())))


print(make_jaxpr(vmap(matvec, (None, 0)), f64(3, 4), f64(5, 4))[0])
print(make_jaxpr(vmap(matvec, (0, 1)), f64(5, 3, 4), f64(4, 5))[0])


# %% [markdown]
# ### Transposing a product
#
# Fix `y`; then $x \mapsto \mathrm{dot}(x, y)$ is linear, and its transpose
# takes an output cotangent $\bar c$ back to a cotangent for `x`. For matrices
# that is the familiar $\bar x = \bar c\, y^T$: a product of the cotangent with
# the *other* operand, contracted over the axes the output got from that other
# operand. In general:
#
# 1. contract $\bar c$ with `y` over `y`'s free axes (which are the last axes of
#    $\bar c$), keeping the batch axes paired;
# 2. the result has the batch axes, then the free axes of `x` (the rest of
#    $\bar c$), then `y`'s contracted axes — which stand for `x`'s contracted
#    axes, listed in `y`'s order;
# 3. a final `transpose` puts those axes back in `x`'s order.
#
# For example, take `x` of shape `(3, 5, 4)` and `y` of shape `(4, 3, 6)`, and
# contract `x`'s axes 0 and 2 with `y`'s axes 1 and 0. The output, and so
# $\bar c$, has shape `(5, 6)`. Step 1 contracts $\bar c$'s axis 1 with `y`'s
# free axis 2 and gives shape `(5, 4, 3)`: `x`'s free axis, then `y`'s axes 0 and
# 1, which stand for `x`'s axes 2 and 0. Step 3 transposes that to `(3, 5, 4)`,
# the shape of `x`.
#
# The cotangent for `y` is the mirror image. The order bookkeeping is the only
# subtle part, and the {ref}`dot-product test <appendix-dot-test>` below checks
# it on a product with batch and contracting axes out of order.


# %% tags=["export", "hide-input"]
# @title Helpers: _argsort, _transpose_unless_identity, _aval_of
def _argsort(values: Sequence[int]) -> list[int]:
    return sorted(range(len(values)), key=values.__getitem__)


def _transpose_unless_identity(x: Any, perm: list[int]) -> Any:
    return x if perm == sorted(perm) else transpose(x, perm)


def _aval_of(x: Any) -> ShapedArray:
    return x.aval if _is_undef(x) else get_aval(x)


# %% tags=["export"]
@dot_general_p.def_rule("transpose")
def _dot_general_transpose(cts, x, y, *, dimension_numbers):
    (ct,) = cts
    (xc, yc), (xb, yb) = dimension_numbers
    if _is_undef(x) and _is_undef(y):
        raise TypeError("dot_general: transposing a product of two linear values")
    x_free = _free_axes(_aval_of(x).ndim, xc, xb)
    y_free = _free_axes(_aval_of(y).ndim, yc, yb)
    # The cotangent's axes: batch, then x's free axes, then y's free axes.
    ct_batch = tuple(range(len(xb)))
    ct_x_free = tuple(range(len(xb), len(xb) + len(x_free)))
    ct_y_free = tuple(range(len(xb) + len(x_free), get_aval(ct).ndim))
    if _is_undef(x):
        dims = ((ct_y_free, tuple(y_free)), (ct_batch, yb))
        x_bar = bind(dot_general_p, ct, y, dimension_numbers=dims)
        # Which axis of x each axis of x_bar stands for:
        stands_for = [*xb, *x_free, *(xc[i] for i in _argsort(yc))]
        return [_transpose_unless_identity(x_bar, _argsort(stands_for)), None]
    dims = ((ct_x_free, tuple(x_free)), (ct_batch, xb))
    y_bar = bind(dot_general_p, ct, x, dimension_numbers=dims)
    stands_for = [*yb, *y_free, *(yc[i] for i in _argsort(xc))]
    return [None, _transpose_unless_identity(y_bar, _argsort(stands_for))]


# %% [markdown]
# (appendix-dot-test)=
# A transpose can be tested without knowing the answer: for a linear map $A$,
# $\langle \bar c, A v\rangle = \langle A^T \bar c, v\rangle$ for every $v$ and
# $\bar c$. Here $A$ is a product with one batch pair and two contracting pairs
# listed in an order that differs between the operands, and `vjp` supplies
# $A^T$.

# %%
rng = np.random.default_rng(0)
dims = (((2, 0), (0, 2)), ((1,), (1,)))  # contract x2-y0 and x0-y2; batch x1-y1
x = rng.normal(size=(3, 4, 5))
y = rng.normal(size=(5, 4, 3, 2))
v_x, v_y = rng.normal(size=x.shape), rng.normal(size=y.shape)
out, product_vjp = vjp(lambda x, y: dot_general(x, y, dims), x, y)
ct = rng.normal(size=out.shape)
x_bar, y_bar = product_vjp(ct)
# x -> dot(x, y) and y -> dot(x, y) are each linear:
print(np.allclose(np.sum(ct * dot_general(v_x, y, dims)), np.sum(x_bar * v_x)))
print(np.allclose(np.sum(ct * dot_general(x, v_y, dims)), np.sum(y_bar * v_y)))
with jax.enable_x64(True):
    print(np.allclose(out, jax.lax.dot_general(x, y, dims)))


# %% [markdown]
# (appendix-broadcasting)=
# ## Broadcasting, made explicit
#
# Every binary primitive of ours insists on operands of one shape. (`lax`,
# JAX's layer of thin wrappers around its primitives, is nearly as strict: its
# operands must have the same rank, except that a rank-0 operand goes with any rank,
# and it only stretches axes of size 1.) NumPy and `jax.numpy` are
# more forgiving: they {term}`broadcast` operands of different shapes. Line the
# shapes up on the right; at each position the sizes must be equal or one of
# them must be 1; a missing leading axis counts as size 1; the result takes the
# larger size everywhere. So `(3,)` meets `(2, 3)` as `(2, 3)`, and `(3, 1)`
# meets `(1, 4)` as `(3, 4)`.


# %% tags=["export"]
def broadcast_shapes(
    name: str, *shapes: Sequence[int], described: str | None = None
) -> tuple[int, ...]:
    """The shape NumPy's broadcasting gives ``shapes``, or a TypeError."""
    ndim = max(len(s) for s in shapes)
    padded = [(1,) * (ndim - len(s)) + tuple(s) for s in shapes]
    result = []
    for axis, sizes in enumerate(zip(*padded)):
        other_than_one = {d for d in sizes if d != 1}
        if len(other_than_one) > 1:
            raise _not_broadcastable(name, shapes, described, axis - ndim, sizes)
        result.append(other_than_one.pop() if other_than_one else 1)
    return tuple(result)


# %% [markdown]
# Our `broadcast` primitive from {ref}`Part 1 <part1>` only *inserts* axes; it
# cannot stretch an existing axis of size 1. We keep it that way and stretch in
# two explicit steps: a `reshape` drops the size-1 axes that must grow, then
# `broadcast` inserts them back at full size, together with any new leading
# axes. Nothing happens, and nothing is recorded, for an operand that already
# has the result's shape.


# %% tags=["export"]
def broadcast_to(x: ArrayLike, shape: Sequence[int]) -> ArrayLike:
    """``x`` broadcast to ``shape`` by NumPy's rules, as explicit equations."""
    aval = get_aval(x)
    shape = check_broadcast_to(aval, shape)
    lead = len(shape) - aval.ndim
    if aval.shape == shape:
        return x
    growing = [i for i, d in enumerate(aval.shape) if d == 1 and shape[lead + i] != 1]
    x = reshape(x, [d for i, d in enumerate(aval.shape) if i not in growing])
    return broadcast(x, shape, [*range(lead), *(lead + i for i in growing)])


def _broadcast_operands(name: str, *args: ArrayLike) -> list[ArrayLike]:
    """Broadcast the array operands to their common shape; numbers stay numbers."""
    avals = [
        get_aval(a, name, i) for i, a in enumerate(args) if not _is_python_scalar(a)
    ]
    if all(aval.shape == avals[0].shape for aval in avals):
        return list(args)  # the common case: nothing to do
    described = " and ".join(aval.str_short() for aval in avals)
    shape = broadcast_shapes(name, *(a.shape for a in avals), described=described)
    return [a if _is_python_scalar(a) else broadcast_to(a, shape) for a in args]


# %% tags=["export", "hide-input"]
# @title Checks: shapes that broadcast
def _not_broadcastable(name, shapes, described, axis, sizes) -> TypeError:
    """The error for ``shapes`` whose ``sizes`` clash at ``axis`` (negative).
    ``described`` names the operands in the message (default: the shapes)."""
    described = described or " and ".join(str(tuple(s)) for s in shapes)
    return TypeError(
        f"{name}: operands must have the same shape, or shapes that "
        f"broadcast; got {described}, whose sizes at axis {axis} "
        f"are {' and '.join(map(str, sizes))} (they must be equal, or 1)"
    )


def check_broadcast_to(aval: ShapedArray, shape: Any) -> tuple:
    """``shape`` as a tuple that ``aval`` broadcasts to."""
    shape = _check_shape("broadcast_to", shape)
    lead = len(shape) - aval.ndim
    if lead < 0 or broadcast_shapes("broadcast_to", aval.shape, shape) != shape:
        raise TypeError(
            f"broadcast_to: cannot broadcast {aval.str_short()} to shape {shape}"
        )
    return shape


def _operands_alike(name: str, *args: ArrayLike) -> list[ArrayLike]:
    """Promote and broadcast, then make Python numbers arrays like the other
    operands: what the strict wrappers would accept."""
    args = _broadcast_operands(name, *promote_operands(name, *args))
    arrays = [a for a in args if not _is_python_scalar(a)]
    if not arrays:
        dtype = np.result_type(*(type(a) for a in args))
        return [np.asarray(a, dtype) for a in args]
    args = [
        _scalar_like(name, a, arrays[0]) if _is_python_scalar(a) else a for a in args
    ]
    for other in args[1:]:
        check_binary_operands(name, get_aval(args[0]), get_aval(other))
    return args


# %% [markdown]
# (appendix-dtypes)=
# ## JAX's dtype rules
#
# The wrappers are strict about dtypes as well as shapes: `add` of an `int32`
# and a `float32` array is an error, as `lax.add` is in JAX. User code mixes
# dtypes all the time, though (`counts / total`, `x * 2` with `x` a float
# array, `mask + 1.5`), and `jax.numpy` decides the result's dtype by a small
# fixed order, a *promotion lattice*. Each dtype points to the dtypes just
# above it; the result of combining two dtypes is the lowest dtype above both.
# Python's `int` and `float` are nodes of their own, *weak* types, placed low,
# so a Python number adapts to the array next to it: `x * 2` and `x * 2.0` keep
# the dtype of a float array `x`, and `n + 1` keeps the dtype of an integer
# array `n`. A Python float next to an integer array cannot adapt (no integer
# holds 1.5), so it becomes a 64-bit float: an `int32` array times `1.5` is `float64`, as in JAX
# with 64-bit types enabled, the mode this book runs in.

# %% tags=["export"]
import functools

PROMOTION_LATTICE = {  # each dtype -> the dtypes just above it
    "bool": ["int"],  # "int", "float": Python's weakly typed numbers
    "int": ["uint8", "int8"],
    "uint8": ["uint16", "int16"],
    "uint16": ["uint32", "int32"],
    "uint32": ["uint64", "int64"],
    "uint64": ["float"],
    "int8": ["int16"],
    "int16": ["int32"],
    "int32": ["int64"],
    "int64": ["float"],
    "float": ["float16"],
    "float16": ["float32"],
    "float32": ["float64"],
    "float64": [],
}


@functools.cache
def _at_or_above(name: str) -> frozenset:
    return frozenset([name]).union(*map(_at_or_above, PROMOTION_LATTICE[name]))


@functools.cache  # a lookup after the first time: operators call it often
def promote_types(*names: str) -> np.dtype:
    """The lowest dtype at or above all of ``names``; a weak result is 64-bit."""
    common = frozenset.intersection(*map(_at_or_above, names))
    lowest = next(n for n in common if common <= _at_or_above(n))
    return np.dtype({"int": "int64", "float": "float64"}.get(lowest, lowest))


def promote_operands(name: str, *args: ArrayLike) -> list[ArrayLike]:
    """Convert the arrays among ``args`` to their promoted dtype; Python
    numbers stay numbers (the strict wrappers shape them like the arrays)."""
    if all(map(_is_python_scalar, args)):
        return list(args)
    dtype = promote_types(*(_dtype_name(name, a) for a in args))
    return [a if _is_python_scalar(a) else convert_element_type(a, dtype) for a in args]


# %% [markdown]
# Functions that only make sense on floats (`sin`, `exp`, true division,
# `mean`) first promote, then move an integer or boolean result to a float,
# as `jax.numpy` does: 64-bit integers become `float64`, narrower ones and
# booleans `float32`. Both helpers are folded.


# %% tags=["export", "hide-input"]
# @title _dtype_name, as_inexact, _on_inexact: lattice nodes; ints become floats
def _dtype_name(name: str, x: Any) -> str:
    if type(x) in (int, float):  # bool is not weak, as in JAX
        return type(x).__name__
    dtype = np.dtype(bool) if type(x) is bool else get_aval(x, name).dtype
    if dtype.name not in PROMOTION_LATTICE:
        raise TypeError(f"{name}: unsupported dtype {dtype.name}")
    return dtype.name


def inexact_dtype(dtype: np.dtype) -> np.dtype:
    """A float dtype stays; an integer or boolean one becomes a float
    (64-bit integers: float64; narrower ones and booleans: float32), as JAX."""
    if dtype.kind == "f":
        return dtype
    return np.dtype(np.float64 if dtype.itemsize == 8 else np.float32)


def _on_inexact(fn: Callable) -> Callable:
    """``fn`` (a float-only wrapper) applied to ``as_inexact`` of its input."""

    def on_inexact(x: ArrayLike) -> ArrayLike:
        return fn(as_inexact(fn.__name__, x))

    on_inexact.__name__, on_inexact.__doc__ = fn.__name__, fn.__doc__
    return on_inexact


def as_inexact(name: str, x: ArrayLike, position: int = 0) -> ArrayLike:
    """``x`` converted to its inexact dtype (a Python number to a float)."""
    if _is_python_scalar(x):
        return float(x)
    dtype = get_aval(x, name, position).dtype  # a clear error for a non-array
    return convert_element_type(x, inexact_dtype(dtype))


# %% [markdown]
# Here is the table of results for every pair of seven types, ours, with each
# cell checked against what `jax.numpy` gives for the same pair (the table code
# is in `book/figures.py`):

# %%
from figures import promotion_table

promotion_table(promote_types)

# %% [markdown]
# (appendix-numpy)=
# ## A NumPy-like front end
#
# With broadcasting in hand, the front end is a thin layer. Following JAX's
# split between `lax` and `jax.numpy`, the wrappers `add`, `sub`, `mul`, ...
# stay strict — the transformation rules call them and should fail loudly on a
# shape mistake rather than broadcast it away — and a separate module,
# `autodidax.numpy`, holds NumPy-style functions that broadcast first. Outside
# the book you get it with `import autodidax.numpy as anp`; in this notebook it
# is the object `numpy_namespace`, made in the folded cell. Each `numpy_<name>`
# function below is put into it as `<name>` by the decorator `numpy_function`.

# %% tags=["export", "hide-input"]
# @title The module autodidax.numpy, and the decorator that fills it
import sys
import types

numpy_namespace = types.ModuleType("autodidax.numpy", "NumPy-style functions.")


Axes = int | Sequence[int] | None  # the axis argument of the reductions


def numpy_function(fn: Callable) -> Callable:
    """Decorator: put ``numpy_<name>`` into the namespace as ``<name>``."""
    setattr(numpy_namespace, fn.__name__.removeprefix("numpy_"), fn)
    return fn


numpy = numpy_namespace  # for `from autodidax import numpy as anp`
if __name__ != "__main__":  # in the module: `import autodidax.numpy as anp`
    sys.modules[f"{__name__}.numpy"] = numpy_namespace


# %% tags=["export"]
def _broadcasting(name: str, strict: Callable) -> Callable:
    """A NumPy-style binary function: promote, broadcast, call ``strict``."""

    def fn(x: ArrayLike, y: ArrayLike) -> ArrayLike:
        return strict(*_broadcast_operands(name, *promote_operands(name, x, y)))

    fn.__name__ = f"numpy_{name}"
    fn.__doc__ = f"``{strict.__name__}`` with JAX's promotion and broadcasting."
    return numpy_function(fn)


numpy_add = _broadcasting("add", add)
numpy_multiply = _broadcasting("multiply", mul)

# %% [markdown]
# The rest of the namespace is folded: `subtract`, `maximum`, `greater` and
# `less`, made like `add`; `sin`, `cos`, `exp`, `log`, `tanh`, `sqrt` and
# `rsqrt`, which turn integers into floats first; `mean` (a sum, then a division by the
# count), `divide` (which promotes, then turns integers into floats, as
# `jax.numpy`'s `/` does), `minimum`, `power`, `where`, `sum` (which
# widens small integers, as NumPy does), `max`, `transpose`, `astype`, `zeros`,
# `ones`, `ones_like`, and the dtype names. Each is a few lines on top of a
# primitive or two.

# %% tags=["export", "hide-input"]
# @title The rest of autodidax.numpy
numpy_subtract = _broadcasting("subtract", sub)
numpy_maximum = _broadcasting("maximum", maximum)
numpy_greater = _broadcasting("greater", greater)
numpy_less = _broadcasting("less", less)
for _fn in [reshape, broadcast_to, zeros_like]:
    setattr(numpy_namespace, _fn.__name__, _fn)
for _fn in [sin, cos, exp, log, tanh, sqrt, rsqrt]:  # integers become floats first
    setattr(numpy_namespace, _fn.__name__, _on_inexact(_fn))


@numpy_function
def numpy_mean(x: ArrayLike, axis: Axes = None, keepdims: bool = False) -> ArrayLike:
    """Average over ``axis`` (all axes by default); integers give floats."""
    x = as_inexact("mean", x)
    ndim = get_aval(x).ndim
    axes = range(ndim) if axis is None else _normalize_axes("mean", axis, ndim)
    count = math.prod(get_aval(x).shape[a] for a in axes)
    return _keep_dims(div(reduce_sum(x, axis), float(count)), x, axis, keepdims)


def _keep_dims(out: ArrayLike, x: ArrayLike, axis: Axes, keepdims: bool) -> ArrayLike:
    """With ``keepdims``, ``out`` reshaped so the reduced axes stay, as 1s."""
    if not keepdims:
        return out
    shape = get_aval(x).shape
    axes = range(len(shape)) if axis is None else _normalize_axes("", axis, len(shape))
    return reshape(out, tuple(1 if i in axes else n for i, n in enumerate(shape)))


numpy_namespace.negative = neg
for _name in ["bool_", "int32", "int64", "float32", "float64"]:
    setattr(numpy_namespace, _name, getattr(np, _name))


@numpy_function
def numpy_divide(x: ArrayLike, y: ArrayLike) -> ArrayLike:
    """True division: promote, make integers floats, broadcast."""
    x, y = _broadcast_operands("divide", *promote_operands("divide", x, y))
    return div(as_inexact("divide", x), as_inexact("divide", y, 1))


@numpy_function
def numpy_minimum(x: ArrayLike, y: ArrayLike) -> ArrayLike:
    """Elementwise smaller of ``x`` and ``y``, with NumPy broadcasting."""
    x, y = _operands_alike("minimum", x, y)
    if get_aval(x).dtype.kind == "f":
        # Negation is exact for floats, and this shares max's rule at ties.
        return neg(maximum(neg(x), neg(y)))
    return select(less(x, y), x, y)  # integers: -x could overflow


@numpy_function
def numpy_power(x: ArrayLike, y: ArrayLike) -> ArrayLike:
    """``x ** y``: ``integer_pow`` for a Python or NumPy integer ``y``, as
    JAX; otherwise ``pow``, after broadcasting, with a float base (an integer
    exponent is passed as it is, other operands are promoted first)."""
    if _is_axis(y) or _is_integer_scalar_array(y):  # known now: multiplications
        return integer_pow(x, int(y))
    check_power_exponent(y)
    x_dtype = np.dtype(float) if type(x) is float else get_aval(x, "power").dtype
    y_dtype = None if _is_python_scalar(y) else get_aval(y, "power", 1).dtype
    if not (x_dtype.kind == "f" and y_dtype is not None and y_dtype.kind in "iu"):
        x, y = promote_operands("power", x, y)  # else: a float base, an integer
        check_power_is_float(x, y)  # exponent, passed as they are
    return general_pow(*_broadcast_operands("power", x, y))


def _is_integer_scalar_array(y: Any) -> bool:
    """A NumPy integer array of no axes: a known exponent, as in JAX."""
    return isinstance(y, np.ndarray) and y.ndim == 0 and y.dtype.kind in "iu"


def check_power_exponent(y: Any) -> None:
    if get_aval(_as_input(y, "power"), "power", 1).dtype == np.bool_:
        raise TypeError(f"power: the exponent must be a number, got {_describe(y)}")


def check_power_is_float(x: ArrayLike, y: ArrayLike) -> None:
    if all(_is_python_scalar(v) or get_aval(v).dtype.kind != "f" for v in (x, y)):
        raise TypeError(
            f"power: an integer base with an exponent that is not a Python integer "
            f"is not supported, got {_describe(x)} and {_describe(y)}; convert the "
            "base to a float dtype first"
        )


@numpy_function
def numpy_where(pred: ArrayLike, x: ArrayLike, y: ArrayLike) -> ArrayLike:
    """``x`` where ``pred`` is true, else ``y``, with NumPy broadcasting."""
    pred = np.asarray(pred) if _is_python_scalar(pred) else pred
    if get_aval(pred).dtype != np.bool_:
        raise TypeError(
            f"where: the condition must be a boolean array, got "
            f"{get_aval(pred).str_short()} (compare with > or < to make one)"
        )
    if _is_python_scalar(x) and _is_python_scalar(y):
        x, y = _operands_alike("where", x, y)
    pred, x, y = _broadcast_operands("where", pred, x, y)
    x, y = _operands_alike("where", x, y)
    return select(pred, x, y)


@numpy_function
def numpy_sum(x: ArrayLike, axis: Axes = None, keepdims: bool = False) -> ArrayLike:
    """Sum over ``axis`` (all axes by default). As in NumPy, booleans and
    integers narrower than 64 bits are summed as 64-bit integers."""
    dtype = get_aval(_as_input(x, "sum")).dtype
    if dtype.kind in "bi" and dtype.itemsize < 8:
        x = convert_element_type(x, np.int64)
    elif dtype.kind == "u" and dtype.itemsize < 8:
        x = convert_element_type(x, np.uint64)
    return _keep_dims(reduce_sum(x, axis), x, axis, keepdims)


def check_reduced_axes_not_empty(name: str, x: ArrayLike, axis: Axes) -> None:
    """max and min of no elements have no value: a ValueError, as jax.numpy
    raises (lax.reduce_max itself answers -inf, the identity of max)."""
    shape = get_aval(x).shape
    try:
        axes = _normalize_axes(
            name, range(len(shape)) if axis is None else axis, len(shape)
        )
    except (TypeError, ValueError):
        return  # a bad axis: reduce_max says so in its own words
    if any(shape[a] == 0 for a in axes):
        raise ValueError(
            f"{name}: zero-size array to reduction operation {name} which has "
            f"no identity (an array of shape {shape}, reduced over axes "
            f"{tuple(axes)})"
        )


@numpy_function
def numpy_max(x: ArrayLike, axis: Axes = None, keepdims: bool = False) -> ArrayLike:
    """Largest element over ``axis`` (all axes by default)."""
    x = _as_input(x, "max")
    check_reduced_axes_not_empty("max", x, axis)
    if get_aval(x).dtype == np.bool_:  # any: the largest of 0s and 1s
        as_int = convert_element_type(x, np.int8)
        return convert_element_type(numpy_max(as_int, axis, keepdims), np.bool_)
    return _keep_dims(reduce_max(x, axis), x, axis, keepdims)


@numpy_function
def numpy_min(x: ArrayLike, axis: Axes = None, keepdims: bool = False) -> ArrayLike:
    """Smallest element over ``axis``: the largest of an order-reversed copy
    (-x for floats; top - x for integers, which cannot overflow)."""
    x = _as_input(x, "min")
    check_reduced_axes_not_empty("min", x, axis)
    dtype = get_aval(x).dtype
    if dtype.kind == "b":
        as_int = convert_element_type(x, np.int8)
        return convert_element_type(numpy_min(as_int, axis, keepdims), np.bool_)
    if dtype.kind == "f":
        return neg(numpy_max(neg(x), axis, keepdims))
    top = int(np.iinfo(dtype).max) if dtype.kind == "u" else -1
    return sub(top, numpy_max(sub(top, x), axis, keepdims))


@numpy_function
def numpy_transpose(x: ArrayLike, axes: Sequence[int] | None = None) -> ArrayLike:
    """Permute the axes of ``x``; reverse them if ``axes`` is None."""
    if axes is None:
        axes = tuple(reversed(range(get_aval(x).ndim)))
    return transpose(x, axes)


@numpy_function
def numpy_astype(x: ArrayLike, dtype: Any) -> ArrayLike:
    """``x`` converted to ``dtype``."""
    return convert_element_type(x, dtype)


@numpy_function
def numpy_zeros(shape: int | Sequence[int], dtype: Any = np.float64) -> np.ndarray:
    """An array of zeros: a constant, since it depends on no input."""
    return np.zeros(shape, dtype)


@numpy_function
def numpy_ones(shape: int | Sequence[int], dtype: Any = np.float64) -> np.ndarray:
    """An array of ones (a constant)."""
    return np.ones(shape, dtype)


@numpy_function
def numpy_ones_like(x: ArrayLike) -> np.ndarray:
    """An array of ones with the shape and dtype of ``x``."""
    aval = get_aval(x)
    return np.ones(aval.shape, aval.dtype)


# %% tags=["export", "hide-input"]
# @title More of autodidax.numpy, from the primitives we have
@numpy_function
def numpy_square(x: ArrayLike) -> ArrayLike:
    return integer_pow(x, 2)


def _sign(x: ArrayLike) -> ArrayLike:
    """-1, 0 or 1 with x's dtype; a constant to differentiation (comparisons)."""
    dtype = get_aval(x).dtype
    one = lambda b: convert_element_type(b, dtype)  # noqa: E731
    return sub(one(greater(x, zeros_like(x))), one(less(x, zeros_like(x))))


@numpy_function
def numpy_sign(x: ArrayLike) -> ArrayLike:
    return _sign(_as_input(x, "sign"))


@numpy_function
def numpy_abs(x: ArrayLike) -> ArrayLike:
    """|x|; its derivative at 0 is 1, as JAX's (and -0.0 becomes 0.0)."""
    x = _as_input(x, "abs")
    return select(less(x, zeros_like(x)), neg(x), add(x, zeros_like(x)))


@numpy_function
def numpy_round(x: ArrayLike, decimals: int = 0) -> ArrayLike:
    """Round half to even, as NumPy and JAX; its derivative is zero."""
    x = _as_input(x, "round")
    if get_aval(x).dtype.kind != "f":
        return x
    scale = 10.0**decimals
    y = mul(x, scale) if decimals else x
    dtype = get_aval(y).dtype
    whole = convert_element_type(convert_element_type(y, np.int64), dtype)
    sign = _sign(y)
    away = mul(sub(y, whole), sign)  # distance from whole, toward y
    odd = numpy_equal(numpy_abs(sub(whole, mul(_trunc_half(whole), 2.0))), 1.0)
    up = _or(greater(away, 0.5), _and(numpy_equal(away, 0.5), odd))
    step = select(up, sign, zeros_like(sign))
    out = stop_gradient(add(whole, step))
    return div(out, scale) if decimals else out


def _and(p: ArrayLike, q: ArrayLike) -> ArrayLike:
    return select(p, q, np.zeros(get_aval(q).shape, np.bool_))


def _or(p: ArrayLike, q: ArrayLike) -> ArrayLike:
    return select(p, np.ones(get_aval(q).shape, np.bool_), q)


def _trunc_half(w: ArrayLike) -> ArrayLike:
    """w / 2 rounded toward zero, for whole numbers w."""
    dtype = get_aval(w).dtype
    return convert_element_type(convert_element_type(div(w, 2.0), np.int64), dtype)


@numpy_function
def numpy_clip(x: ArrayLike, min: Any = None, max: Any = None) -> ArrayLike:
    """``x`` limited to [min, max], as JAX: minimum(max, maximum(min, x))."""
    if min is not None:
        x = numpy_maximum(min, x)
    if max is not None:
        x = numpy_minimum(max, x)
    return x


@numpy_function
def numpy_vdot(x: ArrayLike, y: ArrayLike) -> ArrayLike:
    """The dot product of ``x`` and ``y`` flattened (real arrays)."""
    x, y = _as_input(x, "vdot"), _as_input(y, "vdot")
    if get_aval(x).size != get_aval(y).size:
        raise TypeError(
            f"vdot: the arrays must have the same size, got "
            f"{get_aval(x).str_short()} and {get_aval(y).str_short()}"
        )
    return reduce_sum(mul(*_operands_alike("vdot", reshape(x, -1), reshape(y, -1))))


@numpy_function
def numpy_arange(start, stop=None, step=None, dtype=None) -> np.ndarray:
    """A constant, as NumPy's arange; without ``dtype``, the arguments'
    promoted dtype (Python numbers weak), as JAX: ``arange(np.int32(4))`` is
    int32."""
    if dtype is None:
        given = [a for a in (start, stop, step) if a is not None]
        dtype = promote_types(*(_dtype_name("arange", a) for a in given))
    return np.arange(start, stop, step, dtype)


@numpy_function
def numpy_eye(n: int, m: int | None = None, k: int = 0, dtype=np.float64):
    """A constant identity (or shifted diagonal) matrix."""
    return np.eye(n, m, k, dtype)


@numpy_function
def numpy_concatenate(arrays: Sequence[ArrayLike], axis: int = 0) -> ArrayLike:
    """``arrays`` joined along ``axis``. Without a concatenation primitive,
    each array is broadcast along a new axis and the entries that belong at
    each output position are selected and summed (one nonzero each)."""
    arrays = [_as_input(a, "concatenate") for a in arrays]
    avals = [get_aval(a) for a in arrays]
    _check_concatenate(avals, axis)
    axis = axis % avals[0].ndim
    total = sum(a.shape[axis] for a in avals)
    out, offset = None, 0
    for x, aval in zip(arrays, avals):
        n = aval.shape[axis]
        shape = (*aval.shape[:axis], total, *aval.shape[axis:])
        wide = broadcast(x, shape, [axis])  # axis: output position; axis+1: x's
        eq = np.arange(total)[:, None] == np.arange(n)[None, :] + offset
        mask = np.broadcast_to(
            eq.reshape(eq.shape + (1,) * (aval.ndim - axis - 1)), shape
        )
        part = reduce_sum(select(mask, wide, np.zeros(shape, aval.dtype)), axis + 1)
        out = part if out is None else add(out, part)
        offset += n
    return out


def _check_concatenate(avals: list[ShapedArray], axis: Any) -> None:
    if not avals:
        raise ValueError("concatenate: need at least one array")
    first = avals[0]
    if first.ndim == 0:
        raise ValueError("concatenate: zero-dimensional arrays cannot be joined")
    if not isinstance(axis, int) or not -first.ndim <= axis < first.ndim:
        raise ValueError(
            f"concatenate: axis {axis!r} is out of range for {first.str_short()}"
        )
    ax = axis % first.ndim
    for aval in avals[1:]:
        same = aval.ndim == first.ndim and all(
            d == e for i, (d, e) in enumerate(zip(aval.shape, first.shape)) if i != ax
        )
        if not same or aval.dtype != first.dtype:
            raise TypeError(
                f"concatenate: arrays must have one dtype and equal sizes off axis "
                f"{axis}, got {first.str_short()} and {aval.str_short()}"
            )


@numpy_function
def numpy_stack(arrays: Sequence[ArrayLike], axis: int = 0) -> ArrayLike:
    """``arrays`` (one shape) joined along a new axis."""
    arrays = [_as_input(a, "stack") for a in arrays]
    if not arrays:
        raise ValueError("stack: need at least one array")
    ndim = get_aval(arrays[0]).ndim
    if not isinstance(axis, int) or not -ndim - 1 <= axis <= ndim:
        raise ValueError(f"stack: axis {axis!r} is out of range for {ndim + 1} axes")
    axis = axis % (ndim + 1)
    expanded = []
    for a in arrays:
        shape = get_aval(a).shape
        expanded.append(reshape(a, (*shape[:axis], 1, *shape[axis:])))
    return numpy_concatenate(expanded, axis)


# %% tags=["export", "hide-input"]
# @title tril, triu, var, std; the namespaces autodidax.tree and autodidax.tree_util
@numpy_function
def numpy_tril(m: ArrayLike, k: int = 0) -> ArrayLike:
    """``m`` with zeros above the ``k``-th diagonal (of the last two axes)."""
    return _keep_triangle("tril", m, k, lower=True)


@numpy_function
def numpy_triu(m: ArrayLike, k: int = 0) -> ArrayLike:
    """``m`` with zeros below the ``k``-th diagonal (of the last two axes)."""
    return _keep_triangle("triu", m, k, lower=False)


def _keep_triangle(name: str, m: ArrayLike, k: int, lower: bool) -> ArrayLike:
    m = _as_input(m, name)
    aval = get_aval(m)
    if aval.ndim < 2:
        raise ValueError(
            f"{name}: the array must have at least 2 axes, got {aval.str_short()}"
        )
    if not _is_axis(k):
        raise TypeError(f"{name}: k must be an integer, got {_describe(k)}")
    rows, cols = aval.shape[-2:]
    below = np.tri(rows, cols, int(k) if lower else int(k) - 1, dtype=bool)
    mask = np.broadcast_to(below if lower else ~below, aval.shape)
    return select(np.ascontiguousarray(mask), m, zeros_like(m))


@numpy_function
def numpy_var(
    x: ArrayLike,
    axis: Axes = None,
    dtype: Any = None,
    ddof: int = 0,
    keepdims: bool = False,
) -> ArrayLike:
    """Mean squared distance from the mean over ``axis``, divided by N - ddof,
    as JAX computes it; integers give float64."""
    x = _as_input(x, "var")
    if get_aval(x).dtype.kind != "f":
        x = convert_element_type(x, np.float64)  # JAX's default float, not as_inexact
    ndim = get_aval(x).ndim
    axes = range(ndim) if axis is None else _normalize_axes("var", axis, ndim)
    count = math.prod(get_aval(x).shape[a] for a in axes)
    centered = numpy_subtract(x, numpy_mean(x, axis, keepdims=True))
    total = numpy_sum(integer_pow(centered, 2), axis, keepdims)
    out = div(total, float(count - ddof))
    return out if dtype is None else convert_element_type(out, dtype)


@numpy_function
def numpy_std(
    x: ArrayLike,
    axis: Axes = None,
    dtype: Any = None,
    ddof: int = 0,
    keepdims: bool = False,
) -> ArrayLike:
    """The square root of ``var``."""
    return sqrt(numpy_var(x, axis, dtype, ddof, keepdims))


tree = types.ModuleType("autodidax.tree", "jax.tree's names for the tree functions.")
tree_util = types.ModuleType("autodidax.tree_util", "jax.tree_util's names.")
if __name__ != "__main__":  # `import autodidax.tree`, as `import jax.tree`
    sys.modules[f"{__name__}.tree"] = tree
    sys.modules[f"{__name__}.tree_util"] = tree_util
tree.map, tree.leaves, tree.structure = tree_map, tree_leaves, tree_structure
tree.flatten, tree.unflatten = tree_flatten, tree_unflatten
for _fn in [tree_map, tree_leaves, tree_structure, tree_flatten, tree_unflatten]:
    setattr(tree_util, _fn.__name__, _fn)
tree_util.register_pytree_node = register_pytree_node


# %% [markdown]
# ### `einsum`: a product named by letters
#
# `einsum` describes a product by naming every axis with a letter:
# `einsum("bqhd,bkhd->bhqk", q, k)` multiplies `q` and `k` along `d`, sums `d`
# away (it is not in the output), and pairs `b` and `h` without summing them.
# That is `dot_general`'s vocabulary, spelled differently. A letter in both
# operands and in the output is a batch dimension; a letter in both operands
# but not in the output is contracted; a letter in one operand and in the
# output is a free axis; a letter in one operand only is summed away before
# the product. So two operands make exactly one `dot_general`, whose output
# comes out as batch letters, then the first operand's free letters, then the
# second's; if the output names another order, one `transpose` follows.
# Nothing is ever broadcast. (More operands are contracted two at a time, left
# to right.)


# %% tags=["export"]
@numpy_function
def numpy_einsum(subscripts: str, *operands: ArrayLike) -> ArrayLike:
    """Einstein summation over one or more operands; two operands make one
    ``dot_general``, more are contracted pairwise, left to right."""
    operands = promote_operands("einsum", *(_as_input(x, "einsum") for x in operands))
    ins, out = parse_einsum(subscripts, [get_aval(x) for x in operands])
    x, sx = _sum_unused_letters(operands[0], ins[0], [out, *ins[1:]])
    for i in range(1, len(operands)):
        x, sx = _einsum_pair(x, sx, operands[i], ins[i], [out, *ins[i + 1 :]])
    return _transpose_unless_identity(x, [sx.index(c) for c in out])


def _einsum_pair(x, sx, y, sy, later):
    """One dot_general. A letter of both operands is a batch dimension if
    ``later`` (the output, the operands still to come) needs it, else it is
    contracted. Returns the product and its letters: batch (in the order
    ``later`` names them), then x's free letters, then y's."""
    y, sy = _sum_unused_letters(y, sy, [sx, *later])
    batch = [c for c in dict.fromkeys("".join(later)) if c in sx and c in sy]
    contract = [c for c in sx if c in sy and c not in batch]
    dims = (
        (tuple(map(sx.index, contract)), tuple(map(sy.index, contract))),
        (tuple(map(sx.index, batch)), tuple(map(sy.index, batch))),
    )
    free_x = [c for c in sx if c not in sy]
    free_y = [c for c in sy if c not in sx]
    return dot_general(x, y, dims), "".join(batch + free_x + free_y)


# %% [markdown]
# The folded cell sums the unused letters and checks the subscripts: one
# letter per axis of each operand, no letter twice in one operand (a diagonal,
# which `jnp.einsum` allows and we do not), a size per letter that all operands
# agree on, and no output letter that names nothing. `...` is refused with a
# message that says to name the axes.


# %% tags=["export", "hide-input"]
# @title Summing the letters no one needs; checks: subscripts that fit the operands
def _sum_unused_letters(x, letters, others):
    """Sum away the axes whose letter appears nowhere in ``others``."""
    unused = [i for i, c in enumerate(letters) if not any(c in s for s in others)]
    if not unused:
        return x, letters
    return reduce_sum(x, tuple(unused)), "".join(
        c for i, c in enumerate(letters) if i not in unused
    )


def parse_einsum(subscripts: Any, avals: list[ShapedArray]) -> tuple[list[str], str]:
    """The operands' letters and the output's, checked against the operands."""
    if not isinstance(subscripts, str):
        raise TypeError(
            f"einsum: subscripts must be a string, got {_describe(subscripts)}"
        )
    spec = subscripts.replace(" ", "")
    if "." in spec:
        raise ValueError(
            f"einsum: '...' in {subscripts!r} is not supported; name every axis "
            "with a letter"
        )
    ins_spec, arrow, out = spec.partition("->")
    ins = ins_spec.split(",")
    if len(ins) != len(avals):
        raise ValueError(
            f"einsum: subscripts {subscripts!r} name {len(ins)} operand(s), got "
            f"{len(avals)}"
        )
    if not arrow:  # implicit output: the letters used once, in alphabetical order
        once = [c for c in set(ins_spec) if c.isalpha() and ins_spec.count(c) == 1]
        out = "".join(sorted(once))
    sizes: dict[str, tuple[int, int]] = {}
    for i, (letters, aval) in enumerate(zip(ins, avals)):
        _check_einsum_operand(subscripts, i, letters, aval, sizes)
    for c in out:
        if not c.isalpha() or c not in sizes:
            raise ValueError(
                f"einsum: output subscript {c!r} in {subscripts!r} names no axis "
                "of the operands"
            )
        if out.count(c) > 1:
            raise ValueError(
                f"einsum: output subscript {c!r} repeats in {subscripts!r}"
            )
    return ins, out


def _check_einsum_operand(subscripts, i, letters, aval, sizes) -> None:
    if len(letters) != aval.ndim:
        raise ValueError(
            f"einsum: operand {i} is {aval.str_short()}, with {aval.ndim} axes, but "
            f"its subscripts {letters!r} in {subscripts!r} name {len(letters)}"
        )
    for axis, c in enumerate(letters):
        if not c.isalpha():
            raise ValueError(
                f"einsum: subscript {c!r} in {subscripts!r} is not a letter"
            )
        if letters.count(c) > 1:
            raise ValueError(
                f"einsum: subscript {c!r} repeats within operand {i} ({letters!r}) "
                f"in {subscripts!r}; diagonals are not supported"
            )
        size = aval.shape[axis]
        if c in sizes and sizes[c][0] != size:
            raise ValueError(
                f"einsum: subscript {c!r} in {subscripts!r} has size "
                f"{sizes[c][0]} in operand {sizes[c][1]} and size {size} in "
                f"operand {i}"
            )
        sizes.setdefault(c, (size, i))


# %% [markdown]
# Attention scores, the product at the heart of a transformer, are one
# `dot_general` with two batch dimensions, and its output is already in the
# requested order:

# %%
q = k = f64(2, 5, 4, 8)  # batch, position, head, feature
print(make_jaxpr(lambda q, k: numpy_einsum("bqhd,bkhd->bhqk", q, k), q, k)[0])


# %% [markdown]
# The two products follow NumPy's definitions, both on top of `dot_general`.
# `dot` contracts the last axis of `x` with the only axis of a vector `y`, or
# with the second-to-last axis of an array `y`, and keeps all other axes.
# `matmul` (the `@` operator) treats arrays of more than two axes as stacks of
# matrices, and is an `einsum`: the matrix axes get the letters `mk` and `kn`,
# and each stack axis a letter of its own, shared by both operands where both
# stacks have it. A shared stack axis becomes a batch dimension; a stack axis
# only one operand has is a free axis of that operand. So activations of
# shape `(B, T, D)` times weights of shape `(D, F)` are one `dot_general`
# that contracts `D`: the weights are never copied `B` times. (Where one stack
# has size 1 against another's size, the size-1 axis is reshaped away first,
# so it too is never broadcast.)


# %% tags=["export"]
def _contract_last_axis(name: str, x: Any, y: Any) -> Any:
    """x's last axis against y's only axis, or y's second-to-last."""
    i, j = check_aligned(name, get_aval(x), get_aval(y))
    return dot_general(x, y, (((i,), (j,)), ((), ())))


@numpy_function
def numpy_matmul(x: ArrayLike, y: ArrayLike) -> ArrayLike:
    """NumPy's ``matmul``, the ``@`` operator: an einsum, so one dot_general."""
    x, y = promote_operands("matmul", *(_as_input(v, "matmul") for v in (x, y)))
    check_matmul_operands(get_aval(x), get_aval(y))  # no scalars, sizes that agree
    x, y, subscripts = matmul_as_einsum(x, y)  # e.g. "amk,kn->amn"
    return numpy_einsum(subscripts, x, y)


# %% [markdown]
# The folded cell holds `dot`, which is `_contract_last_axis` with a special case
# for scalars, and the checks: they say which axes fail to line up, in the
# user's terms, and refuse a scalar operand of `@` with a pointer to `*`.


# %% tags=["export", "hide-input"]
# @title Checks: operands of a product that line up; and numpy.dot
@numpy_function
def numpy_dot(x: ArrayLike, y: ArrayLike) -> ArrayLike:
    """NumPy's ``dot``; with a scalar operand, a multiplication."""
    x, y = promote_operands("dot", *(_as_input(v, "dot") for v in (x, y)))
    if get_aval(x).ndim == 0 or get_aval(y).ndim == 0:
        return numpy_multiply(x, y)
    return _contract_last_axis("dot", x, y)


def check_aligned(name: str, x: ShapedArray, y: ShapedArray) -> tuple[int, int]:
    """The axes to contract: x's last, and y's only or second-to-last."""
    i, j = x.ndim - 1, max(y.ndim - 2, 0)
    if x.shape[i] != y.shape[j]:
        raise TypeError(
            f"{name}: shapes {x.str_short()} and {y.str_short()} are not "
            f"aligned: axis {i} of x has size {x.shape[i]}, axis {j} of y "
            f"has size {y.shape[j]}"
        )
    return i, j


def check_matmul_operands(x: ShapedArray, y: ShapedArray) -> None:
    if x.ndim == 0 or y.ndim == 0:
        raise TypeError(
            f"matmul: operands must not be scalars, got {x.str_short()} and "
            f"{y.str_short()} (use * to multiply by a scalar)"
        )
    check_aligned("matmul", x, y)
    _broadcast_stacks(x, y)


def matmul_as_einsum(x: ArrayLike, y: ArrayLike) -> tuple[ArrayLike, ArrayLike, str]:
    """``x @ y`` as einsum subscripts, such as ``"amk,kn->amn"``: a letter per
    stack axis, shared where both stacks have the axis. A size-1 stack axis
    that meets a larger one is reshaped away from its operand."""
    xs, ys = get_aval(x).shape, get_aval(y).shape
    n = max(len(xs), len(ys)) - 2
    pad_x = (None,) * (n - len(xs[:-2])) + xs[:-2]  # None: no such axis
    pad_y = (None,) * (n - len(ys[:-2])) + ys[:-2]
    lx, ly, out, keep_x, keep_y = "", "", "", [], []
    for c, dx, dy in zip("abcdefghijlopqrstuvwxyz", pad_x, pad_y):
        out += c
        if dx is not None and (dx != 1 or dy in (None, 1)):
            lx, keep_x = lx + c, [*keep_x, dx]
        if dy is not None and (dy != 1 or dx in (None, 1)):
            ly, keep_y = ly + c, [*keep_y, dy]
    if len(keep_x) < len(xs[:-2]):
        x = reshape(x, (*keep_x, *xs[-2:]))
    if len(keep_y) < len(ys[:-2]):
        y = reshape(y, (*keep_y, *ys[-2:]))
    lx += "mk" if len(xs) > 1 else "k"
    ly += "kn" if len(ys) > 1 else "k"
    out += "m" * (len(xs) > 1) + "n" * (len(ys) > 1)
    return x, y, f"{lx},{ly}->{out}"


def _broadcast_stacks(x: ShapedArray, y: ShapedArray) -> tuple[int, ...]:
    """The common shape of the stacks of two stacks of matrices."""
    described = f"{x.str_short()} and {y.str_short()} (as stacks of matrices)"
    return broadcast_shapes("matmul", x.shape[:-2], y.shape[:-2], described=described)


# %% [markdown]
# Activations `(B, T, D)` times weights `(D, F)`, and weights `(F, D)` on the
# left of `(B, D, T)`: each is one `dot_general`, the second followed by the
# transpose that puts `B` first, and neither broadcasts the weights:

# %%
print(make_jaxpr(numpy_matmul, f64(4, 6, 8), f64(8, 3))[0])
print(make_jaxpr(numpy_matmul, f64(3, 8), f64(4, 8, 6))[0])


# %% [markdown]
# Finally the operators. {ref}`Part 1 <part1>`'s operators `+ * - > <` look up
# their function in the registry `OPERATORS`; the front end registers its
# broadcasting functions there, so from here on the operators broadcast and
# promote (and `x - y` records one `sub`, no longer a `neg` and an `add`). The
# operators tracers did not have yet, `/`, `@` and `**` (`power` in both
# directions, in the folded cell), become new methods of the shared class
# `ArrayOperators`.


# %% tags=["export", "hide-input"]
# @title `**`: the front end's power, in both directions
def _power(x: ArrayLike, exponent: Any) -> ArrayLike:
    return numpy_power(x, exponent)


def _reflected_power(x: ArrayLike, base: Any) -> ArrayLike:
    return numpy_power(base, x)


# %% tags=["export"]
OPERATORS.update(add=numpy_add, sub=numpy_subtract, mul=numpy_multiply)
OPERATORS.update(greater=numpy_greater, less=numpy_less)

ArrayOperators.__truediv__ = numpy_divide
ArrayOperators.__rtruediv__ = lambda self, other: numpy_divide(other, self)
ArrayOperators.__matmul__ = numpy_matmul
ArrayOperators.__rmatmul__ = lambda self, other: numpy_matmul(other, self)
ArrayOperators.__pow__ = _power
ArrayOperators.__rpow__ = _reflected_power


# %% [markdown]
# Arrays in JAX also have NumPy's methods (`x.sum(axis=0)`, `x.T`,
# `x.astype(np.float32)`, ...); ours get the same ones, each a call into
# `autodidax.numpy`, in the folded cell.


# %% tags=["export", "hide-input"]
# @title Array methods as in jax.numpy: sum mean max min astype dot reshape T size
def _reshape_method(self: ArrayOperators, *shape: Any) -> ArrayLike:
    """``x.reshape(2, 3)`` or ``x.reshape((2, 3))``, as NumPy allows both."""
    if len(shape) == 1 and not isinstance(shape[0], (int, np.integer)):
        shape = shape[0]
    return reshape(self, tuple(shape))


def _transpose_method(self: ArrayOperators, *axes: Any) -> ArrayLike:
    """``x.transpose()``, ``x.transpose(1, 0)`` or ``x.transpose((1, 0))``."""
    if len(axes) == 1 and not isinstance(axes[0], (int, np.integer)):
        axes = axes[0]
    return numpy_transpose(self, tuple(axes) if axes else None)


ArrayOperators.sum = numpy_sum
ArrayOperators.mean = numpy_mean
ArrayOperators.max = numpy_max
ArrayOperators.min = numpy_min
ArrayOperators.astype = numpy_astype
ArrayOperators.dot = numpy_dot
ArrayOperators.reshape = _reshape_method
ArrayOperators.transpose = _transpose_method
ArrayOperators.T = property(numpy_transpose)
ArrayOperators.size = property(lambda self: get_aval(self).size)

# %% [markdown]
# Here is what broadcasting records. Adding a `(3, 1)` column to a `(4,)` row
# stretches both: the column loses its size-1 axis and gains a new one of size
# 4; the row gains a leading axis of size 3.

# %%
print(make_jaxpr(lambda col, row: col + row, f64(3, 1), f64(4))[0])

# %% [markdown]
# Mixed dtypes follow {ref}`JAX's rules <appendix-dtypes>`: below, the integer
# input is converted once, explicitly, and the Python number adapts to the
# float array.

# %%
print(make_jaxpr(lambda i, x: i * x + 1.5, ShapedArray((3,), np.int32), f64(3))[0])


# %% [markdown]
# (appendix-comparisons)=
# ## Comparisons, and why `==` must be a primitive
#
# Tracers so far had `<` and `>`, and nothing for `==`. Python does not complain
# about that: a class without `__eq__` inherits `object.__eq__`, which asks
# whether the two operands are *the same object*, `a is b`. On a concrete
# number that question is harmless; on a tracer it is a silent wrong answer.
# Here is a program that adds `x` to itself when it is 3 and squares it
# otherwise. The module defines `==` properly by the end of this section, so
# the demo spells Python's default out by hand in its place:


# %%
def python_default_eq(a, b):  # what `==` means for a class without __eq__
    return a is b


def add_if_three_by_identity(x):
    return cond(python_default_eq(x, 3.0), add, mul, x, x)


print(jit(add_if_three_by_identity)(3.0))


# %% [markdown]
# Under `jit`, `x` is a tracer, never the same object as `3.0`, so `cond` takes
# the `mul` branch whatever `x` is: 9.0, where JAX gives 6.0. Nothing fails;
# the program just computes something else.
#
# The cure is to make the operator what the other operators already are: a call
# of a primitive, `eq`, which the appendix registered with the
# {ref}`elementwise primitives <appendix-comparison-primitives>`. (Spelling
# `x == y` as "neither `x < y` nor `x > y`" would be wrong for NaN, which is
# neither smaller nor larger than itself and yet not equal to it.) The
# operators `== != <= >=` call the broadcasting versions of the four wrappers,
# and an operand of a type they do not know is left to Python, as JAX's arrays
# do (the folded cell).


# %% tags=["export", "hide-input"]
# @title compares_with(fn): operands of unknown types are left to Python, as in JAX
def compares_with(fn: Callable) -> Callable:
    """The method ``self <op> other``: ``fn(self, other)`` for an array or a
    number; otherwise NotImplemented, so Python asks ``other`` (``x == None``
    is False, ``x == pytest.approx(...)`` works), as JAX's arrays do."""

    def method(self, other):
        known = (np.ndarray, np.generic, Tracer, *DEVICE_ARRAY_TYPES)
        if not (_is_python_scalar(other) or isinstance(other, known)):
            return NotImplemented
        return fn(self, other)

    return method


# %% tags=["export"]
numpy_equal = _broadcasting("equal", equal)
numpy_not_equal = _broadcasting("not_equal", not_equal)
numpy_less_equal = _broadcasting("less_equal", less_equal)
numpy_greater_equal = _broadcasting("greater_equal", greater_equal)

ArrayOperators.__eq__ = compares_with(numpy_equal)
ArrayOperators.__ne__ = compares_with(numpy_not_equal)
ArrayOperators.__le__ = compares_with(numpy_less_equal)
ArrayOperators.__ge__ = compares_with(numpy_greater_equal)

# %% [markdown]
# JAX's `lax` module holds its primitives' wrappers under the primitives'
# names (`lax.eq`, `lax.gt`, `lax.add`, ...); the folded cell makes the same
# module for ours, `autodidax.lax`, with the names whose call forms match.

# %% tags=["export", "hide-input"]
# @title The module autodidax.lax: JAX's lax names for our primitives
lax_namespace = types.ModuleType("autodidax.lax", "Primitives under lax's names.")
lax = lax_namespace  # for `from autodidax import lax`
if __name__ != "__main__":  # in the module: `import autodidax.lax as lax`
    sys.modules[f"{__name__}.lax"] = lax_namespace
for _name, _fn in {
    "eq": equal,
    "ne": not_equal,
    "lt": less,
    "le": less_equal,
    "gt": greater,
    "ge": greater_equal,
    "max": maximum,
    **{f.__name__: f for f in [add, sub, mul, div, neg, sin, cos, exp, log, tanh]},
    **{f.__name__: f for f in [sqrt, rsqrt]},
    **{f.__name__: f for f in [integer_pow, convert_element_type, reshape]},
    **{f.__name__: f for f in [transpose, select, dot_general, stop_gradient]},
    **{f.__name__: f for f in [cond, switch]},
}.items():
    setattr(lax_namespace, _name, _fn)


# %% [markdown]
# Fixing `==` alone would leave the same trap one protocol over. Python asks
# an object for many things besides its operators: a hash (for a dict key or
# a set), a truth value (`if`), a number (`float()`, `int()`, a list index),
# a length, an iterator. Each either works as it does in JAX or refuses with
# an error that names the traced value and says what to use instead, never
# falls back to Python's default. A tracer is unhashable, as in JAX: an object
# whose `==` returns an array cannot honour the contract between `__eq__` and
# `__hash__`. The folded cell defines the rest; the cell after it tries each
# protocol on a traced scalar, ours next to JAX's.


# %% tags=["export", "hide-input"]
# @title Every other Python protocol on a tracer: as in JAX, or a clear error
def _unhashable(self: ArrayOperators) -> int:
    raise TypeError(
        f"unhashable type: {type(self).__name__} ({_describe(self)}): its == "
        "compares elementwise, so it cannot be a dict key or a set member; "
        "use id(x) as the key"
    )


def _number_conversion_error(kind: str, tracer: Tracer, instead: str) -> TypeError:
    tracer.check_live()
    return ConcretizationError(
        f"{kind} of a traced {tracer.aval.str_short()} value: its value is not "
        f"known while the function is transformed. {instead}"
    )


def _tracer_float(self: Tracer) -> float:
    raise _number_conversion_error(
        "float()", self, "To change its dtype, use x.astype(np.float64)."
    )


def _tracer_int(self: Tracer) -> int:
    raise _number_conversion_error(
        "int()", self, "To change its dtype, use x.astype(np.int64)."
    )


def _tracer_index(self: Tracer) -> int:
    raise _number_conversion_error(
        "Using as a Python index (a list index, a range, a shape)",
        self,
        "Pass a Python int instead, or choose with select/cond.",
    )


def _tracer_len(self: Tracer) -> int:
    self.check_live()
    if not self.aval.shape:
        raise TypeError(f"len() of unsized object: a traced {self.aval.str_short()}")
    return self.aval.shape[0]


def _tracer_iter(self: Tracer):
    self.check_live()
    if not self.aval.shape:
        raise TypeError(f"iteration over a 0-d array: a traced {self.aval.str_short()}")
    raise TypeError(
        f"iterating over a traced {self.aval.str_short()} needs indexing, which "
        "this chapter does not have; use vmap over the leading axis, or scan"
    )


ArrayOperators.__hash__ = _unhashable
Tracer.__float__ = _tracer_float
Tracer.__int__ = _tracer_int
Tracer.__index__ = _tracer_index
Tracer.__complex__ = lambda self: complex(_tracer_float(self))
Tracer.__len__ = _tracer_len
Tracer.__iter__ = _tracer_iter

# %%
import re
import textwrap


def try_protocols(jit_fn, x, first_sentence_only=False):
    for name, use in [("hash(x)", hash), ("float(x)", float), ("if x:", bool),
                      ("len(x)", len)]:  # fmt: skip
        try:
            outcome = f"-> {jit_fn(lambda x, use=use: x * use(x))(x)}"
        except Exception as error:
            message = str(error)
            if first_sentence_only:
                message = re.split(r"\.\s|\n", message)[0]
            outcome = f"{type(error).__name__}: {message}"
        print(textwrap.fill(outcome, 88, initial_indent=f"  {name:9} ",
                            subsequent_indent=" " * 12))  # fmt: skip


print("ours:")
try_protocols(jit, 2.0)
print("JAX (first sentences):")
with jax.enable_x64(True):
    try_protocols(jax.jit, 2.0, first_sentence_only=True)


# %% [markdown]
# Each refuses in both, for the same reason: the value is not known while the
# function is traced (a hash, for an array whose `==` is elementwise, would
# break Python's rules anyway). `len` refuses because a scalar has no length;
# of a traced vector it is the size of the leading axis, known while tracing,
# and works in both.
#
# Here is the program that went wrong, under `jit`, `vmap` and `grad`, next to
# JAX:


# %%
def add_if_three(x):
    return cond(x == 3.0, add, mul, x, x)


def jax_add_if_three(x):
    return jax.lax.cond(x == 3.0, jnp.add, jnp.multiply, x, x)


xs = np.array([3.0, 4.0])
print(jit(add_if_three)(3.0), jax.jit(jax_add_if_three)(3.0))
print(vmap(add_if_three)(xs), jax.vmap(jax_add_if_three)(xs))
print(grad(add_if_three)(3.0), jax.grad(jax_add_if_three)(3.0))
print(make_jaxpr(add_if_three, scalar)[0])

# %% [markdown]
# (appendix-rule-table)=
# (appendix-nn)=
# ## A few of `jax.nn`
#
# A model written for JAX also calls `jax.nn`: activations, `softmax`,
# `log_softmax`, `one_hot`. They need no new idea, only care with large
# numbers. `exp` overflows for inputs above about 709, and a softmax of logits
# such as `[1000., 1001.]` would be `inf / inf`. Softmax does not change when
# the same number is subtracted from every input, so the maximum is subtracted
# first and the largest exponential is 1. The maximum is wrapped in
# `stop_gradient`, as in JAX: it only shifts the inputs, its exact derivative
# contributes nothing, and the derivative of `max` at ties (split among the
# tied elements) need not be computed at all. `log_softmax` is the same shift
# with the logarithm taken before dividing, so that it never takes the
# logarithm of an underflowed 0.

# %% tags=["export", "hide-input"]
# @title The module autodidax.nn, and the decorator that fills it
nn_namespace = types.ModuleType("autodidax.nn", "A few of jax.nn's functions.")
nn = nn_namespace  # for `from autodidax import nn`
if __name__ != "__main__":  # `import autodidax.nn`
    sys.modules[f"{__name__}.nn"] = nn_namespace


def nn_function(fn: Callable) -> Callable:
    """Decorator: put ``nn_<name>`` into autodidax.nn as ``<name>``."""
    setattr(nn_namespace, fn.__name__.removeprefix("nn_"), fn)
    return fn


# %% tags=["export"]
@nn_function
def nn_log_softmax(x: ArrayLike, axis: Axes = -1) -> ArrayLike:
    x = as_inexact("log_softmax", _as_input(x, "log_softmax"))
    shifted = x - stop_gradient(numpy_max(x, axis, keepdims=True))
    return shifted - log(numpy_sum(exp(shifted), axis, keepdims=True))


@nn_function
def nn_softmax(x: ArrayLike, axis: Axes = -1) -> ArrayLike:
    x = as_inexact("softmax", _as_input(x, "softmax"))
    unnormalized = exp(x - stop_gradient(numpy_max(x, axis, keepdims=True)))
    return unnormalized / numpy_sum(unnormalized, axis, keepdims=True)


# %% [markdown]
# The folded cells hold `gelu` (JAX's tanh approximation by default, and
# the exact form through a new primitive, `erf`, when `approximate=False`),
# `relu` (whose derivative at 0 is 0, as JAX's), `logsumexp` (shifted by the
# largest finite input) and `one_hot` (an `==` between the indices and the
# class numbers, laid along a new axis).

# %% tags=["export", "hide-input"]
# @title The primitive erf (evaluated by XLA), for gelu(approximate=False)
from jaxlib.mlir.dialects import chlo

erf_p = Primitive("erf")
NOT_LINEAR.add("erf")


def erf(x: ArrayLike) -> ArrayLike:
    """The error function, elementwise, of a float array."""
    _check_kind("erf", x, "f", "a float")
    return bind(erf_p, x)


@erf_p.def_rule("jvp")
def _erf_jvp(primals, tangents):
    (x,), (dx,) = primals, tangents  # d/dx erf(x) = 2/sqrt(pi) exp(-x^2)
    return [erf(x)], [mul(dx, mul(exp(neg(mul(x, x))), 2 / math.sqrt(math.pi)))]


@erf_p.def_rule("impl")
def _erf_impl(x):
    return [np.asarray(_erf_on_xla(x))]  # NumPy has no erf; XLA's, as under jit


_erf_on_xla = jit(lambda x: bind(erf_p, x))
_unary_abstract_eval(erf_p, "f", "a float")
_unary_vmap(erf_p)


@erf_p.def_rule("lower")
def _erf_lower(ctx, avals_in, avals_out, x):
    with_chlo(ir.Context.current)
    return [chlo.erf(x)]


@functools.cache
def with_chlo(context: ir.Context) -> None:
    """Register CHLO, XLA's dialect of composite operations such as erf."""
    chlo.register_dialect(context)


lax_namespace.erf = erf
lax_namespace.pow = general_pow


# %% tags=["export", "hide-input"]
# @title gelu, relu, logsumexp, one_hot
@nn_function
def nn_gelu(x: ArrayLike, approximate: bool = True) -> ArrayLike:
    """x times the normal distribution's CDF at x; by default its tanh
    approximation, with JAX's constants and order of operations."""
    x = as_inexact("gelu", _as_input(x, "gelu"))
    dtype = get_aval(x).dtype
    if approximate:
        inner = np.sqrt(2 / np.pi).astype(dtype) * (x + 0.044715 * x**3)
        return x * (0.5 * (1.0 + tanh(inner)))
    return 0.5 * x * (1.0 + erf(x * np.sqrt(0.5).astype(dtype)))


@nn_function
def nn_relu(x: ArrayLike) -> ArrayLike:
    """max(x, 0), with derivative 0 at 0, as JAX's (NaN stays NaN)."""
    x = _as_input(x, "relu")
    return numpy_where(x > 0, x, stop_gradient(numpy_maximum(x, 0)))


@nn_function
def nn_logsumexp(a: ArrayLike, axis: Axes = None, keepdims: bool = False) -> ArrayLike:
    """log(sum(exp(a))) over ``axis``, shifted by the (finite) maximum first."""
    a = as_inexact("logsumexp", _as_input(a, "logsumexp"))
    top = numpy_max(a, axis, keepdims=True)
    top = stop_gradient(numpy_where(numpy_equal(top - top, 0.0), top, 0.0))  # finite
    out = log(numpy_sum(exp(a - top), axis, keepdims=True)) + top
    return out if keepdims else _drop_dims(out, axis)


def _drop_dims(x: ArrayLike, axis: Axes) -> ArrayLike:
    shape = get_aval(x).shape
    axes = range(len(shape)) if axis is None else _normalize_axes("", axis, len(shape))
    return reshape(x, tuple(n for i, n in enumerate(shape) if i not in axes))


@nn_function
def nn_one_hot(
    x: ArrayLike, num_classes: int, *, dtype: Any = np.float64, axis: int = -1
):
    """1 where the new axis's position equals the index in ``x``, else 0."""
    x = _as_input(x, "one_hot")
    aval = get_aval(x)
    check_one_hot(aval, num_classes, axis)
    axis = axis % (aval.ndim + 1)
    shape = (*aval.shape[:axis], 1, *aval.shape[axis:])
    classes = np.arange(num_classes, dtype=aval.dtype)
    classes = classes.reshape(
        [num_classes if i == axis else 1 for i in range(len(shape))]
    )
    return convert_element_type(numpy_equal(reshape(x, shape), classes), dtype)


def check_one_hot(aval: ShapedArray, num_classes: Any, axis: Any) -> None:
    if aval.dtype.kind not in "iu":
        raise TypeError(
            f"one_hot: the indices must be integers, got {aval.str_short()} "
            "(JAX has deprecated other dtypes); convert them with astype"
        )
    if not _is_axis(num_classes) or num_classes < 0:
        raise TypeError(
            f"one_hot: num_classes must be a non-negative Python integer, got "
            f"{_describe(num_classes)}"
        )
    if not _is_axis(axis) or not -aval.ndim - 1 <= axis <= aval.ndim:
        raise ValueError(
            f"one_hot: axis {axis!r} is out of range for the {aval.ndim + 1} axes "
            f"of the result (indices {aval.str_short()})"
        )


# %%
logits = np.array([1000.0, 1001.0, 1002.0])
print(nn.softmax(logits), nn.log_softmax(logits))
with jax.enable_x64(True):
    print(jax.nn.softmax(logits), jax.nn.log_softmax(logits))

# %% [markdown]
# ## Every primitive, every rule
#
# Each primitive keeps its rules in a dictionary, and `PRIMITIVES` lists every
# primitive, so the table of what the module can do is read off the registries
# rather than written by hand. One row per primitive, one column per kind of
# rule: the five every primitive needs, `transpose`, and the two kinds of
# {ref}`Part 4 <part4>`'s partial evaluation — *partial eval* splits known from
# unknown values while tracing (what `linearize` does), and *partial eval jaxpr*
# splits a jaxpr that is already staged, such as the body of a `jit` call, into
# its known and unknown halves. A cell says *not linear* where a transpose rule
# would be meaningless, *never transposed* for `stop_gradient`, and *generic*
# where Part 4's generic partial evaluation applies, which needs no rule of its
# own. Anything else missing would be listed as a gap in the first line.

# %%
from figures import rule_table

rule_table(globals())

# %% [markdown]
# The same table for the whole book, with the primitives of Parts 6–9 (loops,
# `scan`, custom rules, collectives), is on the page {ref}`Every primitive, every rule <rule-table>` at the end.
#
# ## A worked example: a small neural network
#
# Everything is in place to write a model the way one would for JAX. A
# two-layer perceptron maps each input row through a matrix product, a bias, a
# `tanh`, and a second matrix product and bias; the loss is the mean squared
# error on a batch. The parameters live in a dict, a {term}`pytree`, and `grad`
# differentiates with respect to all of them at once.

# %%
anp = numpy_namespace  # outside the book: import autodidax.numpy as anp


def predict(params, x):
    hidden = anp.tanh(x @ params["w1"] + params["b1"])
    return hidden @ params["w2"] + params["b2"]


def loss(params, x, y):
    return anp.mean((predict(params, x) - y) ** 2)


rng = np.random.default_rng(42)
x_train = rng.uniform(-2.0, 2.0, size=(64, 1))
y_train = np.sin(2.0 * x_train) + 0.1 * rng.normal(size=x_train.shape)
params = {
    "w1": 0.5 * rng.normal(size=(1, 32)),
    "b1": np.zeros(32),
    "w2": 0.3 * rng.normal(size=(32, 1)),
    "b2": np.zeros(1),
}
shaped = {name: ShapedArray(p.shape, p.dtype) for name, p in params.items()}
print(make_jaxpr(loss, shaped, get_aval(x_train), get_aval(y_train))[0])

# %% [markdown]
# Every broadcast is in the jaxpr: the biases gain the batch axis with
# `broadcast`, and the mean is a sum followed by a division by the literal
# 64.0. Now the gradient, compiled, and the same function written for JAX:

# %%
loss_grad = jit(grad(loss))
ours = loss_grad(params, x_train, y_train)


def jax_loss(params, x, y):
    hidden = jnp.tanh(x @ params["w1"] + params["b1"])
    return jnp.mean((hidden @ params["w2"] + params["b2"] - y) ** 2)


with jax.enable_x64(True):
    jax_loss_grad = jax.jit(jax.grad(jax_loss))
    theirs = jax_loss_grad(params, x_train, y_train)


def largest_difference(a, b):
    return max(np.max(np.abs(np.asarray(a[k]) - np.asarray(b[k]))) for k in a)


print(f"largest difference from JAX's gradient: {largest_difference(ours, theirs):.1e}")


# %% [markdown]
# The two agree to the last few bits of float64. Training is a loop around that
# gradient: step every parameter a little against its gradient. Running both
# trainings side by side for 300 steps shows them staying together while the
# loss drops.


# %%
def sgd_step(params, grads):
    return {k: params[k] - 0.1 * grads[k] for k in params}


def print_losses(step, ours, theirs):
    with jax.enable_x64(True):
        their_loss = float(jax_loss(theirs, x_train, y_train))
    our_loss = float(loss(ours, x_train, y_train))
    print(f"step {step:3}: loss {our_loss:.6f} (JAX: {their_loss:.6f})")


ours, theirs = params, params
for step in range(300):
    if step % 100 == 0:
        print_losses(step, ours, theirs)
    ours = sgd_step(ours, loss_grad(ours, x_train, y_train))
    with jax.enable_x64(True):
        theirs = sgd_step(theirs, jax_loss_grad(theirs, x_train, y_train))
print_losses(300, ours, theirs)
drift = largest_difference(ours, theirs)
print(f"largest parameter difference after 300 steps: {drift:.1e}")

# %% [markdown]
# ## Mistakes the new primitives catch
#
# Each wrapper checks its arguments before anything is recorded, so a mistake
# surfaces at the line that made it, eagerly or while tracing under `jit`, with
# the shapes in the message.

# %%
a, b = np.ones((2, 3)), np.ones((4, 5))
show_error(jit(lambda a, b: a @ b), a, b)  # inner sizes differ
show_error(jit(lambda a: a + np.ones((3, 2))), a)  # shapes that do not broadcast

# %% [markdown]
# Six more mistakes, folded, with their messages below:

# %% tags=["hide-input"]
# @title More mistakes: reshape, log of integers, powers, dtypes, products
show_error(lambda: reshape(a, (4, 2)))  # 6 elements do not fill (4, 2)
show_error(lambda: log(np.arange(3)))  # log of integers
show_error(lambda: jit(lambda n: np.arange(3) ** n)(2))  # a traced power of ints
show_error(lambda: anp.astype(a, "U3"))  # not a numeric dtype
show_error(lambda: dot_general(a, a, (((1,), (0,)), ((), ()))))
show_error(lambda: jit(lambda a: a @ 2.0)(a))


# %% [markdown]
# ## Where real JAX differs
#
# - **Weak types on arrays.** Our lattice is JAX's
#   ([type promotion](https://docs.jax.dev/en/latest/type_promotion.html)),
#   but only a Python number is weak here. JAX also keeps weakness on arrays
#   and tracers made from Python numbers (a jitted function's argument `2.0`
#   is a weak `float64`, so its product with a `float32` array is `float32`),
#   and its `convert_element_type` has a `weak_type` param for that. JAX with its default
#   32-bit mode also narrows every 64-bit result to 32 bits; we always run as
#   JAX does with 64-bit types enabled. `bfloat16` and complex types are not in
#   our lattice.
# - **Broadcasting in fewer steps.** JAX's
#   [`broadcast_in_dim`](https://docs.jax.dev/en/latest/_autosummary/jax.lax.broadcast_in_dim.html)
#   can stretch axes of size 1 directly, and JAX's binary primitives themselves
#   stretch size-1 axes between operands of one rank: `jax.make_jaxpr` of
#   `col + row` above shows one `broadcast_in_dim` that adds the row's leading
#   axis, then an `add` of shapes `(3, 1)` and `(1, 4)`. Our primitives stay
#   strict, so every stretch is an explicit `reshape` and `broadcast` in the
#   jaxpr; the result is the same.
# - **More params on products.**
#   [`lax.dot_general`](https://docs.jax.dev/en/latest/_autosummary/jax.lax.dot_general.html)
#   also takes a `precision`, a `preferred_element_type` (for instance, to
#   accumulate a `bfloat16` product in `float32`) and an `out_sharding`; XLA
#   picks the algorithm unless `precision` names one (a `lax.DotAlgorithm` or
#   `lax.DotAlgorithmPreset`).
# - **Who gives tracers their operators.** JAX's core defines no arithmetic
#   operators on its `Tracer`: `jax.numpy` installs them once, when it is
#   imported (`register_jax_array_methods` in
#   `jax/_src/numpy/array_methods.py` sets `Tracer.__add__` and the others to
#   forward to the aval, whose `_add` is the NumPy-style function). Our Part 1
#   needs operators before there is a front end, so it gives them the strict
#   wrappers as defaults and a registry for the front end to fill.
# - **Powers.** As here, `x ** 2` becomes `integer_pow` in JAX, lowered by
#   repeated squaring, and a traced exponent `pow`, with a float base and an
#   integer exponent passed unconverted. JAX's `jnp.power` also raises an integer
#   base to a traced integer exponent (six rounds of squaring and selecting,
#   enough for any power that does not overflow); ours refuses and asks for a
#   float base.
# - **Ties.** JAX's rules for `max` and `reduce_max` split the derivative among
#   tied elements in the same way, which is why the examples above agree
#   exactly.
# - **Many more functions.** `jax.numpy` implements most of NumPy's API on top of
#   a few hundred primitives, and jit-compiles many of its functions
#   internally; ours is a couple of dozen functions, enough for the example
#   above, and `autodidax.nn` has six functions of `jax.nn`. Programs written
#   for JAX that fail here with only their imports changed most often need
#   indexing and slicing of traced arrays (`x[:, 0]`, `x.at[...]`, the next
#   chapter), `jax.random` (a later chapter) or `jnp.linalg`; `jax.tree` and
#   `jax.tree_util` are here under their names, `autodidax.tree` and
#   `autodidax.tree_util`. `autodidax.lax` has only the names of the primitives
#   we have.
#
# ## Summary
#
# - Once the interpreters exist, a primitive is a wrapper and a set of small
#   rules: evaluation, abstract evaluation, `jvp`, `vmap`, lowering, and
#   transposition if it is linear. Partial evaluation comes for free.
# - A kink such as `max` needs a convention for its derivative at ties; ours
#   (and JAX's) splits the slope evenly among the tied inputs.
# - `dot_general` expresses every matrix and vector product, batched or not,
#   through dimension numbers; `vmap` and transposition only renumber axes.
#   `einsum` and `@` name the same products with letters, and each becomes one
#   `dot_general` (and at most one `transpose`), without broadcasting an
#   operand.
# - NumPy broadcasting becomes explicit `reshape` and `broadcast` equations in
#   the front end, while the primitives and their wrappers stay strict.
# - Mixed dtypes meet in JAX's promotion lattice: the result is the lowest
#   dtype above both, Python numbers are weak and adapt to the arrays, and the
#   front end stages each conversion as a `convert_element_type`.
# - `==` has to be a primitive: a Python protocol left to its default answers
#   silently wrong on a tracer. Every protocol either works as in JAX or raises
#   an error that says what to use instead.
# - Everything here is added, nothing replaced: primitives register their
#   rules, and the front end is a new module whose functions the operators
#   find through a registry.
# - The table of primitives and rules is generated from the registries, and has
#   no gaps.
#
# ## Exercises
#
# **1. A stable `logsumexp`.** `log(sum(exp(x)))` overflows for large inputs.
# Write `logsumexp(x)` that subtracts the maximum first, check it against the
# naive formula on moderate inputs, show that it survives `x = [1000., 1001.]`,
# and compare its gradient (which is the softmax) with JAX's.


# %% tags=["hide-input"]
# @title Solution 1: a stable logsumexp
def logsumexp(x):
    top = anp.max(x)
    return anp.log(anp.sum(anp.exp(x - top))) + top


x = np.array([0.3, -1.2, 2.0])
print(logsumexp(x), np.log(np.sum(np.exp(x))))
print(logsumexp(np.array([1000.0, 1001.0])))  # the naive formula gives inf
with jax.enable_x64(True):
    print(grad(logsumexp)(x), jax.grad(jax.nn.logsumexp)(x))

# %% [markdown]
# **2. A new primitive.** Add `expm1`, $e^x - 1$ computed without the
# cancellation that `exp(x) - 1.0` suffers near 0, with all the rules of this
# appendix: evaluation (`np.expm1`), abstract evaluation, `jvp`
# ($\frac{d}{dx}(e^x - 1) = e^x$, which is the output plus 1), `vmap` and
# lowering (`hlo.exponential_minus_one`). Is it linear? Check `jit(grad(...))`
# of a function that uses it against JAX, and look it up in a regenerated
# table.

# %% tags=["hide-input"]
# @title Solution 2: an expm1 primitive
expm1_p = Primitive("expm1")


def expm1(x):
    _check_kind("expm1", x, "f", "a float")
    return bind(expm1_p, x)


_impl_from_numpy(expm1_p, np.expm1)
_unary_abstract_eval(expm1_p, "f", "a float")
_unary_vmap(expm1_p)
_lower_with(expm1_p, hlo.exponential_minus_one)


@expm1_p.def_rule("jvp")
def _expm1_jvp(primals, tangents):
    (x,), (dx,) = primals, tangents
    out = expm1(x)
    return [out], [mul(dx, add(out, 1.0))]


# Not linear: expm1(a + b) != expm1(a) + expm1(b), so no transpose rule; the
# table should say so rather than report a gap.
NOT_LINEAR.update({"expm1"})
tiny = np.float64(1e-10)
print(float(expm1(tiny)), float(exp(tiny) - 1.0))  # the second lost digits
print(jit(grad(lambda x: anp.sum(expm1(x * x))))(np.array([0.5, 2.0])))
with jax.enable_x64(True):
    print(jax.grad(lambda x: jnp.sum(jnp.expm1(x * x)))(np.array([0.5, 2.0])))
from figures import rule_status

print({kind: rule_status(expm1_p, kind, NOT_LINEAR) for kind in RULE_KINDS})

# %% [markdown]
# **3. Batched products, counted.** Under `vmap(vmap(matvec))`, with the matrix
# batched in the outer `vmap` only and the vector in both, how many equations
# does the jaxpr have, and which axes are batch dimensions of the
# `dot_general`?

# %% tags=["hide-input"]
# @title Solution 3: batched products, counted
inner = vmap(matvec, (None, 0))  # one matrix, many vectors
outer = vmap(inner, (0, 0))  # many matrices, each with its own vectors
jaxpr, _, _ = make_jaxpr(outer, f64(2, 3, 4), f64(2, 5, 4))
print(jaxpr)
# One dot_general: the outer batch axis pairs the operands' axes 0 as a batch
# dimension; the inner one is a free axis of the vectors, which lands after
# the matrix rows, hence the transpose that puts it back in second place.
