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
# (indexing)=
# # Indexing: slices, `gather` and `scatter`
#
# :::{admonition} Where we are
# :class: note
# The {ref}`appendix <appendix>` gave the module a NumPy-like front end,
# `autodidax.numpy`, on strict primitives. One thing every NumPy program does
# was still missing: reading and writing *parts* of an array.
# :::
#
# Without indexing, an embedding lookup, the first layer of a language model,
# has to be written as a product with a one-hot matrix: for each token,
# `V·D` multiply-adds to fetch `D` numbers from a `V × D` table, forward and
# backward. Picking a target's log-probability becomes a masked sum, and
# splitting a fused projection into three becomes three more products with
# 0/1 matrices. This chapter adds
# indexing the way JAX has it, as a handful of primitives whose rules carry two
# of the nicest ideas of the book:
#
# - **a read's transpose is a write.** The transpose of taking a slice is
#   padding the cotangent with zeros; the transpose of `gather` (fetching rows
#   at traced positions) is `scatter-add` (adding rows at those positions). So
#   the gradient of an embedding lookup adds into only the rows it read (of a
#   table of zeros).
# - **batching a gather never loops over examples.** A batched array becomes
#   one more axis of the window read at each position, batched indices one
#   more axis of the index arrays, and both at once one more paired *batch
#   dimension*.
#
# In order: the static `slice` and its transpose `pad`; `dynamic_slice` and
# `dynamic_update_slice`, whose start is known only when the program runs;
# `gather`, `scatter-add` and the other scatters; the NumPy interface on top:
# `x[i]`, `x[1:3]`, `x[..., None]`, integer-array and boolean-mask indices,
# `x.at[i].set(v)`; what happens to an index out of range; and `take`,
# `take_along_axis`, `split`. Reference notes at the end collect the errors,
# two details of the rules, and where JAX differs.

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

book_setup.load_book(globals(), before="indexing")

# %% tags=["hide-input"]
# @title JAX, to check the answers against; float64 types for the demos
import jax
import jax.numpy as jnp

anp = numpy_namespace  # autodidax.numpy


def f64(*shape):
    return ShapedArray(shape, np.float64)


def i64(*shape):
    return ShapedArray(shape, np.int64)


# %% [markdown]
# ## A static slice, and its transpose
#
# `slice` takes, along every axis, the elements from `start` up to `limit`
# (excluded) every `stride` steps, all three known while tracing: NumPy's
# `x[1:5:2]`. Its derivative is the same slice of the tangent, since a slice is
# linear. Its transpose sends the slice's cotangent back to the input: every
# element that was taken gets its cotangent, every other element gets zero.
# That is the cotangent padded with zeros before (`start`), after, and
# between the taken elements (`stride - 1` of them). That is a second
# primitive, `pad`, whose own transpose is again a slice. The only arithmetic is
# the amount after: an axis of `n` elements, read from `start` every `stride`,
# `taken` times, ends at `start + (taken - 1)·stride + 1`, so `high` is `n`
# minus that.

# %% tags=["export"]
import operator

slice_p = Primitive("slice")
pad_p = Primitive("pad")


def lax_slice(x: ArrayLike, start_indices, limit_indices, strides=None) -> ArrayLike:
    """``x[start:limit:stride]`` along every axis (``lax.slice``)."""
    x = _as_input(x, "slice")
    params = check_slice(get_aval(x), start_indices, limit_indices, strides)
    return bind(slice_p, x, **params)


def pad(x: ArrayLike, low, high, interior) -> ArrayLike:
    """``x`` with zeros added before, after, and between its elements."""
    x = _as_input(x, "pad")
    return bind(pad_p, x, **check_pad(get_aval(x), low, high, interior))


def past_last(start: int, taken: int, stride: int) -> int:
    """The position after the last of ``taken`` elements read every ``stride``
    from ``start``: start + (taken - 1) * stride + 1 (just start if none)."""
    return start + (taken - 1) * stride + 1 if taken else start


@slice_p.def_rule("transpose")
def _slice_transpose(cts, x, *, start_indices, limit_indices, strides):
    (ct,) = cts
    taken = get_aval(ct).shape
    end = map(past_last, start_indices, taken, strides)
    low = start_indices  # zeros before the first taken element,
    high = [n - e for n, e in zip(x.aval.shape, end)]  # after the last one,
    interior = [s - 1 for s in strides]  # and between two taken ones
    return [pad(ct, low, high, interior)]


@pad_p.def_rule("transpose")
def _pad_transpose(cts, x, *, low, high, interior):
    (ct,) = cts  # read back every (interior + 1)-th element, from low on
    steps = [i + 1 for i in interior]
    limits = map(past_last, low, x.aval.shape, steps)
    return [lax_slice(ct, low, tuple(limits), steps)]


# %% [markdown]
# Both are linear, so their `jvp` rule is the linear one of {ref}`Part 1
# <part1-jvp-rules>`; batching adds the batch axis with a full range
# (`slice`) or no padding (`pad`); evaluation is NumPy's basic indexing, and
# lowering is StableHLO's `slice` and `pad`. The checks make the params tuples
# of non-negative ints, one per axis, with `start <= limit <= size` and positive
# strides, as `lax.slice` wants.


# %% tags=["export", "hide-input"]
# @title slice and pad: checks, evaluation, abstract evaluation, batching, lowering
def _int_tuple_param(name: str, what: str, values: Any, ndim: int) -> tuple:
    try:
        values = tuple(operator.index(v) for v in values)
    except TypeError:
        raise TypeError(
            f"{name}: {what} must be a sequence of ints, got {values!r}"
        ) from None
    if len(values) != ndim:
        raise TypeError(
            f"{name}: {what} {values} needs one entry per axis of an array "
            f"with {ndim} axes"
        )
    return values


def check_slice(aval: ShapedArray, start, limit, strides) -> dict:
    start = _int_tuple_param("slice", "start_indices", start, aval.ndim)
    limit = _int_tuple_param("slice", "limit_indices", limit, aval.ndim)
    strides = (1,) * aval.ndim if strides is None else strides
    strides = _int_tuple_param("slice", "strides", strides, aval.ndim)
    for lo, hi, s, n in zip(start, limit, strides, aval.shape):
        if not 0 <= lo <= hi <= n or s < 1:
            raise ValueError(
                f"slice: start_indices {start}, limit_indices {limit} and "
                f"strides {strides} do not fit {aval.str_short()} (each axis "
                "needs 0 <= start <= limit <= size and a stride of at least 1)"
            )
    return dict(start_indices=start, limit_indices=limit, strides=strides)


def check_pad(aval: ShapedArray, low, high, interior) -> dict:
    low = _int_tuple_param("pad", "low", low, aval.ndim)
    high = _int_tuple_param("pad", "high", high, aval.ndim)
    interior = _int_tuple_param("pad", "interior", interior, aval.ndim)
    if min((*low, *high, *interior), default=0) < 0:
        raise ValueError(
            f"pad: low {low}, high {high} and interior {interior} must not be "
            f"negative (padding {aval.str_short()})"
        )
    return dict(low=low, high=high, interior=interior)


def _sliced_size(start: int, limit: int, stride: int) -> int:
    return max(0, -(-(limit - start) // stride))


def _padded_size(n: int, lo: int, hi: int, inner: int) -> int:
    return lo + n + max(n - 1, 0) * inner + hi


@slice_p.def_rule("impl")
def _slice_impl(x, *, start_indices, limit_indices, strides):
    index = tuple(map(slice, start_indices, limit_indices, strides))
    return [np.asarray(x)[index].copy()]


@slice_p.def_rule("abstract_eval")
def _slice_abstract_eval(x, *, start_indices, limit_indices, strides):
    check_slice(x, start_indices, limit_indices, strides)
    shape = map(_sliced_size, start_indices, limit_indices, strides)
    return [ShapedArray(tuple(shape), x.dtype)]


@slice_p.def_rule("vmap")
def _slice_vmap(axis, vals, dims, *, start_indices, limit_indices, strides):
    (x,), (b,) = vals, dims

    def widen(params, value):
        return (*params[:b], value, *params[b:])

    start, limit = widen(start_indices, 0), widen(limit_indices, axis.size)
    return [lax_slice(x, start, limit, widen(strides, 1))], [b]


@slice_p.def_rule("lower")
def _slice_lower(ctx, avals_in, avals_out, x, *, start_indices, limit_indices, strides):
    return [hlo.slice(x, start_indices, limit_indices, strides)]


@pad_p.def_rule("impl")
def _pad_impl(x, *, low, high, interior):
    x = np.asarray(x)
    shape = tuple(map(_padded_size, x.shape, low, high, interior))
    out = np.zeros(shape, x.dtype)
    index = tuple(
        slice(lo, lo + (n - 1) * (i + 1) + 1 if n else lo, i + 1)
        for lo, n, i in zip(low, x.shape, interior)
    )
    out[index] = x
    return [out]


@pad_p.def_rule("abstract_eval")
def _pad_abstract_eval(x, *, low, high, interior):
    check_pad(x, low, high, interior)
    shape = map(_padded_size, x.shape, low, high, interior)
    return [ShapedArray(tuple(shape), x.dtype)]


@pad_p.def_rule("vmap")
def _pad_vmap(axis, vals, dims, *, low, high, interior):
    (x,), (b,) = vals, dims

    def widen(params):
        return (*params[:b], 0, *params[b:])

    return [pad(x, widen(low), widen(high), widen(interior))], [b]


@pad_p.def_rule("lower")
def _pad_lower(ctx, avals_in, avals_out, x, *, low, high, interior):
    zero = ir_constant(0, ShapedArray((), avals_in[0].dtype))
    return [hlo.pad(x, zero, low, high, interior)]


_linear_jvp(slice_p)
_linear_jvp(pad_p)


# %% [markdown]
# The gradient of a sum over every other element shows the pair at work:


# %%
def every_other(x):
    return reduce_sum(lax_slice(x, (1,), (6,), (2,)))


print(grad(every_other)(np.arange(6.0)))
print(make_jaxpr(grad(every_other), f64(6))[0])

# %% [markdown]
# ## Starts known only at run time
#
# A slice whose start is a traced value, the row `i` of a loop, is a different
# primitive, `dynamic_slice`: its start indices are *operands* (scalar integers),
# and only the slice's size is a param, since the output's shape must be known
# while tracing. Its partner `dynamic_update_slice` writes a block into an array
# at a traced position. XLA keeps both inside the array: a start that would
# make the block stick out is moved back (clamped) until it fits, and so do we.
# A negative start first counts from the end, as in JAX's `lax`: `-1` is the
# last position.
#
# The transposes say the same as for `slice`, with traced starts: the cotangent
# of a block read at `start` is that block written into zeros at `start`; and
# for a block written into `x`, `x`'s cotangent is the incoming cotangent with
# the overwritten block zeroed, the block's is the cotangent read at `start`.

# %% tags=["export"]
dynamic_slice_p = Primitive("dynamic_slice")
dynamic_update_slice_p = Primitive("dynamic_update_slice")


def dynamic_slice(x: ArrayLike, start_indices, slice_sizes) -> ArrayLike:
    """The block of ``slice_sizes`` at ``start_indices`` (clamped to fit)."""
    x = _as_input(x, "dynamic_slice")
    starts = check_starts("dynamic_slice", get_aval(x), start_indices)
    sizes = check_slice_sizes(get_aval(x), slice_sizes)
    return bind(dynamic_slice_p, x, *starts, slice_sizes=sizes)


def dynamic_update_slice(x: ArrayLike, update: ArrayLike, start_indices) -> ArrayLike:
    """``x`` with ``update`` written at ``start_indices`` (clamped to fit)."""
    x, update = _as_input(x, "dynamic_update_slice"), _as_input(update, "update")
    check_update_block(get_aval(x), get_aval(update))
    starts = check_starts("dynamic_update_slice", get_aval(x), start_indices)
    return bind(dynamic_update_slice_p, x, update, *starts)


@dynamic_slice_p.def_rule("transpose")
def _dynamic_slice_transpose(cts, x, *starts, slice_sizes):
    (ct,) = cts  # the block, written into zeros where it was read
    ct_x = dynamic_update_slice(zeros_of(x.aval), ct, starts)
    return [ct_x] + [None] * len(starts)


@dynamic_update_slice_p.def_rule("transpose")
def _dynamic_update_slice_transpose(cts, x, update, *starts):
    (ct,) = cts
    block = _aval_of(update)
    ct_x = ct_update = None
    if _is_undef(x):  # x's elements under the block were overwritten: zero
        ct_x = dynamic_update_slice(ct, zeros_of(block), starts)
    if _is_undef(update):  # the block's cotangent is read where it was written
        ct_update = dynamic_slice(ct, starts, block.shape)
    return [ct_x, ct_update] + [None] * len(starts)


# %% [markdown]
# `zeros_of(aval)` is an array of zeros made by a `broadcast` of one zero, so
# that under `jit` it is an equation XLA fills in place, not a constant of the
# array's size shipped with every call. The checks, evaluation (wrap a
# negative start, clamp, then NumPy's slicing), abstract evaluation, `jvp` (the same block of the tangent)
# and lowering (StableHLO's ops of the same names) are folded. Batching is
# after `gather`, which it needs.


# %% tags=["export", "hide-input"]
# @title dynamic_slice, dynamic_update_slice: checks, evaluation, types, jvp, lowering
def zeros_of(aval: ShapedArray) -> ArrayLike:
    """Zeros of type ``aval``: a broadcast of one zero (an equation under jit)."""
    return full_of(aval, 0)


def full_of(aval: ShapedArray, value: Any) -> ArrayLike:
    """An array of type ``aval`` holding ``value``: a broadcast of one number."""
    one = np.asarray(value).astype(aval.dtype)
    return broadcast(one, aval.shape, tuple(range(aval.ndim))) if aval.ndim else one


def _wrap_negative(i: Any, n: int) -> Any:
    """NumPy's negative indices count from the end."""
    if get_aval(i).dtype.kind == "u":
        return i
    if not isinstance(i, Tracer):
        return np.where(np.asarray(i) < 0, np.asarray(i) + n, i).astype(
            get_aval(i).dtype
        )
    return select(i < 0, i + n, i)


def check_starts(name: str, aval: ShapedArray, starts: Any) -> list:
    """One scalar integer per axis of ``aval``; Python ints become int64."""
    try:
        starts = [
            np.asarray(s, np.int64) if type(s) is int else _as_input(s, name)
            for s in starts
        ]
    except TypeError:
        raise TypeError(
            f"{name}: start_indices must be a sequence of scalar integers, got "
            f"{_short_repr(starts)}"
        ) from None
    check_start_types(name, aval, [get_aval(s) for s in starts])
    return starts


def check_start_types(name: str, aval: ShapedArray, starts: list) -> None:
    if len(starts) != aval.ndim:
        raise TypeError(
            f"{name}: {len(starts)} start indices for {aval.str_short()}, "
            f"which has {aval.ndim} axes"
        )
    for s in starts:
        if s.shape or s.dtype.kind not in "iu":
            raise TypeError(
                f"{name}: each start index must be a scalar integer, got "
                f"{s.str_short()}"
            )


def check_slice_sizes(aval: ShapedArray, sizes: Any) -> tuple:
    sizes = _int_tuple_param("dynamic_slice", "slice_sizes", sizes, aval.ndim)
    if any(not 0 <= k <= n for k, n in zip(sizes, aval.shape)):
        raise TypeError(
            f"dynamic_slice: slice_sizes {sizes} do not fit in {aval.str_short()}"
        )
    return sizes


def check_update_block(aval: ShapedArray, block: ShapedArray) -> None:
    if (
        block.ndim != aval.ndim
        or block.dtype != aval.dtype
        or any(k > n for k, n in zip(block.shape, aval.shape))
    ):
        raise TypeError(
            f"dynamic_update_slice: update {block.str_short()} does not fit in "
            f"{aval.str_short()} (same dtype and number of axes, sizes no larger)"
        )


def _clamped_starts(shape, starts, sizes) -> list[int]:
    """Negative starts count from the end, then each is clamped so the block fits."""
    starts = [int(np.asarray(s)) for s in starts]
    starts = [s + n if s < 0 else s for s, n in zip(starts, shape)]
    return [min(max(s, 0), n - k) for s, n, k in zip(starts, shape, sizes)]


def _block(starts: list[int], sizes) -> tuple:
    return tuple(slice(s, s + k) for s, k in zip(starts, sizes))


@dynamic_slice_p.def_rule("impl")
def _dynamic_slice_impl(x, *starts, slice_sizes):
    x = np.asarray(x)
    return [x[_block(_clamped_starts(x.shape, starts, slice_sizes), slice_sizes)]]


@dynamic_update_slice_p.def_rule("impl")
def _dynamic_update_slice_impl(x, update, *starts):
    out, update = np.array(x, copy=True), np.asarray(update)
    out[_block(_clamped_starts(out.shape, starts, update.shape), update.shape)] = update
    return [out]


@dynamic_slice_p.def_rule("abstract_eval")
def _dynamic_slice_abstract_eval(x, *starts, slice_sizes):
    check_start_types("dynamic_slice", x, starts)
    return [ShapedArray(check_slice_sizes(x, slice_sizes), x.dtype)]


@dynamic_update_slice_p.def_rule("abstract_eval")
def _dynamic_update_slice_abstract_eval(x, update, *starts):
    check_update_block(x, update)
    check_start_types("dynamic_update_slice", x, starts)
    return [x]


@dynamic_slice_p.def_rule("jvp")
def _dynamic_slice_jvp(primals, tangents, *, slice_sizes):
    (x, *starts), (dx, *_) = primals, tangents
    params = dict(slice_sizes=slice_sizes)
    return [bind(dynamic_slice_p, x, *starts, **params)], [
        bind(dynamic_slice_p, dx, *starts, **params)
    ]


@dynamic_update_slice_p.def_rule("jvp")
def _dynamic_update_slice_jvp(primals, tangents):
    (x, update, *starts), (dx, dupdate, *_) = primals, tangents
    return [bind(dynamic_update_slice_p, x, update, *starts)], [
        bind(dynamic_update_slice_p, dx, dupdate, *starts)
    ]


def _i64_starts(starts: Sequence[ir.Value], avals: Sequence[ShapedArray], shape):
    """The start indices as i64 scalars (StableHLO wants one integer type),
    negative ones counted from the end; StableHLO then clamps them."""
    i64 = ShapedArray((), np.int64)
    out = []
    for s, a, n in zip(starts, avals, shape):
        s = s if a.dtype == np.int64 else hlo.convert(ir_type(i64), s)
        if a.dtype.kind != "u":
            zero = ir_constant(0, i64)
            negative = hlo.compare(
                s,
                zero,
                hlo.ComparisonDirectionAttr.get("LT"),
                compare_type=hlo.ComparisonTypeAttr.get("SIGNED"),
            )
            s = hlo.select(negative, hlo.add(s, ir_constant(n, i64)), s)
        out.append(s)
    return out


@dynamic_slice_p.def_rule("lower")
def _dynamic_slice_lower(ctx, avals_in, avals_out, x, *starts, slice_sizes):
    starts = _i64_starts(starts, avals_in[1:], avals_in[0].shape)
    return [hlo.dynamic_slice(x, starts, slice_sizes)]


@dynamic_update_slice_p.def_rule("lower")
def _dynamic_update_slice_lower(ctx, avals_in, avals_out, x, update, *starts):
    starts = _i64_starts(starts, avals_in[2:], avals_in[0].shape)
    return [hlo.dynamic_update_slice(x, update, starts)]


# %% [markdown]
# Reading a window of three at a traced start, and its gradient: ones where the
# window was, after clamping the start 5 back to 3.


# %%
def window_sum(x, i):
    return reduce_sum(dynamic_slice(x, (i,), (3,)))


print(jit(grad(window_sum))(np.arange(6.0), 5))
print(make_jaxpr(grad(window_sum), f64(6), i64())[0])

# %% [markdown]
# ## `gather`: many rows at once
#
# A slice reads one block. An embedding lookup reads many rows, one per token,
# at positions in an integer array: NumPy's `table[tokens]`. That is `gather`.
# JAX's `gather` can describe any such read through a set of *dimension
# numbers*; ours uses a smaller form that is enough for everything NumPy's
# indexing needs, and says the idea directly. `gather(x, i0, i1, ...)` takes
# one integer array per leading axis of `x` it indexes, all of one shape, and
# reads, for every position `p` of the index arrays,
#
# ```text
# out[p, ...] = x[i0[p], i1[p], ..., :]
# ```
#
# so the output has the index arrays' shape followed by the axes of `x` that
# are not indexed, taken whole (the *window*: a row of the table). With
# `batch_dims=b`, the first `b` axes of `x` and of the index arrays are paired
# instead, `out[n, p, ...] = x[n, i0[n, p], ...]` for `b = 1`: example `n`
# reads only from `x[n]`. That is what batching will need.
#
# Its mirror image writes: `scatter_add(x, updates, i0, i1, ...)` adds each
# window of `updates` into `x` at the indexed position, *accumulating* where
# positions repeat. `scatter` is the same with overwriting instead of adding
# (`x.at[i].set(v)`); where a position repeats, one of the updates wins (XLA
# does not promise which; the reference notes say what that means for the
# derivatives).

# %% tags=["export"]
gather_p = Primitive("gather")
scatter_add_p = Primitive("scatter-add")
scatter_p = Primitive("scatter")


def gather(x: ArrayLike, *indices: ArrayLike, batch_dims: int = 0) -> ArrayLike:
    """``x[i0, i1, ...]`` on leading axes (after ``batch_dims`` paired axes)."""
    x, indices = check_gather("gather", x, indices, batch_dims)
    return bind(gather_p, x, *indices, batch_dims=batch_dims)


def scatter_add(x, updates, *indices, batch_dims: int = 0) -> ArrayLike:
    """``x`` with ``updates`` added at ``x[i0, i1, ...]`` (repeats accumulate)."""
    x, updates, indices = check_scatter("scatter_add", x, updates, indices, batch_dims)
    return bind(scatter_add_p, x, updates, *indices, batch_dims=batch_dims)


def scatter(x, updates, *indices, batch_dims: int = 0) -> ArrayLike:
    """``x`` with ``updates`` written at ``x[i0, i1, ...]``."""
    x, updates, indices = check_scatter("scatter", x, updates, indices, batch_dims)
    return bind(scatter_p, x, updates, *indices, batch_dims=batch_dims)


# %% [markdown]
# Evaluation is NumPy's advanced indexing, and `np.add.at` for `scatter-add`,
# which accumulates over repeated positions where `out[idx] += u` would not.
# It is folded with the checks (index arrays of one integer type and shape, the
# paired axes of equal sizes, an `updates` array shaped like what the gather
# would read) and abstract evaluation.


# %% tags=["export", "hide-input"]
# @title gather and the scatters: checks, evaluation, abstract evaluation
def numpy_index(shape, indices, batch_dims: int) -> tuple:
    """NumPy's index tuple for ``x[batch..., i0, i1, ...]``; indices out of
    range are clamped to the nearest position (XLA's gather does the same)."""
    idx_shape = np.shape(indices[0])
    batch = [
        np.arange(idx_shape[d]).reshape(
            [-1 if e == d else 1 for e in range(len(idx_shape))]
        )
        for d in range(batch_dims)
    ]
    sizes = shape[batch_dims:]
    indices = [np.clip(np.asarray(i), 0, n - 1) for i, n in zip(indices, sizes)]
    return (*batch, *indices)


def in_bounds_index(shape, indices, batch_dims: int) -> tuple:
    """Which index positions fall inside the array, and their index tuple (a
    scatter drops the updates outside, as XLA's does)."""
    inside = np.ones(np.shape(indices[0]), bool)
    for i, n in zip(indices, shape[batch_dims:]):
        i = np.asarray(i)
        inside &= (i >= 0) & (i < n)
    index = numpy_index(shape, indices, batch_dims)
    return inside, tuple(np.broadcast_to(a, inside.shape)[inside] for a in index)


@gather_p.def_rule("impl")
def _gather_impl(x, *indices, batch_dims):
    return [np.asarray(x)[numpy_index(np.shape(x), indices, batch_dims)]]


def _scatter_impl_with(combine: Callable | None) -> Callable:
    """Evaluation of a scatter: ``combine.at`` (np.add, ...), or assignment."""

    def rule(x, updates, *indices, batch_dims):
        out = np.array(x, copy=True)
        inside, index = in_bounds_index(out.shape, indices, batch_dims)
        if combine is None:  # a repeated position: the last update wins
            out[index] = np.asarray(updates)[inside]
        else:
            combine.at(out, index, np.asarray(updates)[inside])
        return [out]

    return rule


scatter_add_p.def_rule("impl")(_scatter_impl_with(np.add))
scatter_p.def_rule("impl")(_scatter_impl_with(None))


def _gather_types(name, x, indices, batch_dims) -> tuple:
    """Check the types of a gather; return the index shape and the window."""
    if not isinstance(batch_dims, int) or batch_dims < 0:
        raise TypeError(f"{name}: batch_dims must be an int >= 0, got {batch_dims!r}")
    if not indices:
        raise TypeError(f"{name}: needs at least one index array")
    idx_shape = indices[0].shape
    for i in indices:
        if i.dtype.kind not in "iu" or i.shape != idx_shape:
            raise TypeError(
                f"{name}: index arrays must be integer arrays of one shape, got "
                f"{', '.join(j.str_short() for j in indices)}"
            )
    if (
        len(idx_shape) < batch_dims
        or x.ndim < batch_dims + len(indices)
        or x.shape[:batch_dims] != idx_shape[:batch_dims]
    ):
        raise TypeError(
            f"{name}: {len(indices)} index arrays of shape {idx_shape} with "
            f"batch_dims={batch_dims} do not fit {x.str_short()}"
        )
    return idx_shape, x.shape[batch_dims + len(indices) :]


def check_gather(name, x, indices, batch_dims) -> tuple:
    x = _as_input(x, name)
    indices = [_as_input(i, name) for i in indices]
    _gather_types(name, get_aval(x), [get_aval(i) for i in indices], batch_dims)
    return x, indices


def check_scatter(name, x, updates, indices, batch_dims) -> tuple:
    x, indices = check_gather(name, x, indices, batch_dims)
    updates = _as_input(updates, name)
    idx_avals = [get_aval(i) for i in indices]
    _check_scatter_types(name, get_aval(x), get_aval(updates), idx_avals, batch_dims)
    return x, updates, indices


def _check_scatter_types(name, x, updates, idx_avals, batch_dims) -> None:
    idx_shape, window = _gather_types(name, x, idx_avals, batch_dims)
    expected = ShapedArray((*idx_shape, *window), x.dtype)
    if updates != expected:
        raise TypeError(
            f"{name}: updates must have type {expected.str_short()} to fit "
            f"{x.str_short()} at indices of shape {idx_shape}, got "
            f"{updates.str_short()}"
        )


@gather_p.def_rule("abstract_eval")
def _gather_abstract_eval(x, *indices, batch_dims):
    idx_shape, window = _gather_types("gather", x, indices, batch_dims)
    return [ShapedArray((*idx_shape, *window), x.dtype)]


def _scatter_abstract_eval(name: str, numeric: bool) -> Callable:
    def rule(x, updates, *indices, batch_dims):
        _check_scatter_types(name, x, updates, indices, batch_dims)
        if numeric and x.dtype.kind not in "iuf":
            raise TypeError(f"{name}: expected a numeric array, got {x.str_short()}")
        return [x]

    return rule


for _prim, _name in [(scatter_add_p, "scatter_add"), (scatter_p, "scatter")]:
    _prim.def_rule("abstract_eval")(
        _scatter_abstract_eval(_name, _prim is scatter_add_p)
    )


# %% [markdown]
# ### A gather's transpose is a scatter-add
#
# `gather` is linear in `x` (the indices only say where to read), and so is
# `scatter-add` in `x` and `updates` together. Transposing them is the whole
# point of this chapter:
#
# - a cotangent for the rows that `gather` read goes back to where they were
#   read from: a `scatter-add` of the cotangent into zeros. Rows read twice
#   get both contributions, which `add` (and not `set`) gives.
# - a cotangent for the result of `scatter-add` goes unchanged to `x`, and to
#   each update as the cotangent at the position it was added to: a `gather`.


# %% tags=["export"]
@gather_p.def_rule("transpose")
def _gather_transpose(cts, x, *indices, batch_dims):
    (ct,) = cts  # add each row's cotangent where the row was read
    ct_x = scatter_add(zeros_of(x.aval), ct, *indices, batch_dims=batch_dims)
    return [ct_x] + [None] * len(indices)


@scatter_add_p.def_rule("transpose")
def _scatter_add_transpose(cts, x, updates, *indices, batch_dims):
    (ct,) = cts
    ct_x = ct if _is_undef(x) else None  # x was added to unchanged
    ct_updates = None
    if _is_undef(updates):  # each update: the cotangent where it was added
        ct_updates = gather(ct, *indices, batch_dims=batch_dims)
    return [ct_x, ct_updates] + [None] * len(indices)


# %% [markdown]
# The forward-mode rules are one line each (the same gather or scatter of the
# tangents). `scatter`'s transpose differs from `scatter-add`'s in two ways:
# the cotangent of `x` is zero where an update overwrote it, and only the
# update that won a repeated position gets a cotangent (the rule scatters the
# updates' ids and reads them back to see which one won).


# %% tags=["export", "hide-input"]
# @title jvp rules; scatter's transpose
@gather_p.def_rule("jvp")
def _gather_jvp(primals, tangents, *, batch_dims):
    (x, *indices), (dx, *_) = primals, tangents
    return [gather(x, *indices, batch_dims=batch_dims)], [
        gather(dx, *indices, batch_dims=batch_dims)
    ]


def _scatter_jvp(prim: Primitive) -> None:
    @prim.def_rule("jvp")
    def rule(primals, tangents, **params):
        (x, updates, *indices), (dx, dupdates, *_) = primals, tangents
        out = bind(prim, x, updates, *indices, **params)
        # the tangent takes the same winner at a repeated position as the
        # primal: evaluation and XLA on CPU apply updates in one fixed order
        return [out], [bind(prim, dx, dupdates, *indices, **params)]


_scatter_jvp(scatter_add_p)
_scatter_jvp(scatter_p)


def _per_window(mask, aval: ShapedArray, idx_ndim: int) -> ArrayLike:
    """A mask over index positions, broadcast over the windows of ``aval``."""
    window = tuple(range(idx_ndim, aval.ndim))
    return broadcast(mask, aval.shape, window) if window else mask


@scatter_p.def_rule("transpose")
def _scatter_transpose(cts, x, updates, *indices, batch_dims):
    (ct,) = cts
    up_aval = _aval_of(updates)
    ct_x = ct_updates = None
    if _is_undef(x):  # overwritten positions had no influence on the output
        ct_x = scatter(ct, zeros_of(up_aval), *indices, batch_dims=batch_dims)
    if _is_undef(updates):  # only the winners (a dropped update never wins)
        ct_updates = gather(ct, *indices, batch_dims=batch_dims)
        won = update_won(get_aval(ct).shape, indices, batch_dims)
        won = _per_window(won, up_aval, get_aval(indices[0]).ndim)
        ct_updates = select(won, ct_updates, zeros_of(up_aval))
    return [ct_x, ct_updates] + [None] * len(indices)


def update_won(shape, indices, batch_dims) -> ArrayLike:
    """Which updates a scatter keeps at a repeated position: scatter their
    ids, read the ids back, and compare."""
    idx_shape = get_aval(indices[0]).shape
    ids = np.arange(math.prod(idx_shape), dtype=np.int64).reshape(idx_shape)
    positions = shape[: batch_dims + len(indices)]
    board = np.full(positions, -1, np.int64)
    written = scatter(board, ids, *indices, batch_dims=batch_dims)
    return equal(gather(written, *indices, batch_dims=batch_dims), ids)


# %% [markdown]
# Now the embedding lookup: a table of 5 rows of 3 numbers, tokens that read
# rows 1, 4 and 1 again. The gradient of a loss that uses the rows is a
# `scatter-add` of the three cotangent rows into a table of zeros; row 1 gets
# two contributions. Apart from filling the table of zeros once ($V \cdot D$
# numbers, as JAX's gradient does too), the work is proportional to the number
# of tokens, $N \cdot D$ additions, where a one-hot product costs
# $N \cdot V \cdot D$ multiply-adds. No one-hot matrix appears.

# %%
table = np.arange(15.0).reshape(5, 3)
tokens = np.array([1, 4, 1])


def lookup_loss(table, tokens):
    rows = gather(table, tokens)  # (3 tokens, 3 numbers)
    return reduce_sum(mul(rows, rows))


print(make_jaxpr(grad(lookup_loss), f64(5, 3), i64(3))[0])
print(grad(lookup_loss)(table, tokens))

# %% [markdown]
# Three more scatters combine differently, for `x.at[i].multiply(v)`,
# `.min(v)` and `.max(v)`: `scatter-mul`, `scatter-min` and `scatter-max`.
# Their rules are folded (their derivatives are in the reference notes at
# the end): `scatter-mul` is linear in `x` alone, and `scatter-min` and
# `scatter-max` are not linear at all.

# %% tags=["export", "hide-input"]
# @title scatter-mul, scatter-min, scatter-max: evaluation, types, jvp, transpose
scatter_mul_p = Primitive("scatter-mul")
scatter_min_p = Primitive("scatter-min")
scatter_max_p = Primitive("scatter-max")


def _scatter_wrapper(prim: Primitive, name: str) -> Callable:
    def fn(x, updates, *indices, batch_dims: int = 0) -> ArrayLike:
        x, updates, indices = check_scatter(name, x, updates, indices, batch_dims)
        return bind(prim, x, updates, *indices, batch_dims=batch_dims)

    fn.__name__ = name
    fn.__doc__ = f"``x`` with ``updates`` combined by {name[8:]} at ``x[i0, ...]``."
    return fn


scatter_mul = _scatter_wrapper(scatter_mul_p, "scatter_mul")
scatter_min = _scatter_wrapper(scatter_min_p, "scatter_min")
scatter_max = _scatter_wrapper(scatter_max_p, "scatter_max")
for _prim, _name, _combine in [
    (scatter_mul_p, "scatter_mul", np.multiply),
    (scatter_min_p, "scatter_min", np.minimum),
    (scatter_max_p, "scatter_max", np.maximum),
]:
    _prim.def_rule("impl")(_scatter_impl_with(_combine))
    _prim.def_rule("abstract_eval")(_scatter_abstract_eval(_name, True))


@scatter_mul_p.def_rule("jvp")
def _scatter_mul_jvp(primals, tangents, *, batch_dims):
    (x, u, *indices), (dx, du, *_) = primals, tangents
    out = scatter_mul(x, u, *indices, batch_dims=batch_dims)
    t_out = scatter_mul(dx, u, *indices, batch_dims=batch_dims)
    if get_aval(x).dtype.kind != "f":
        return [out], [t_out]
    # d(prod of the updates at a position) = sum_k du_k * (prod of the others)
    # computed without dividing by zero: count the zero updates per position
    # and multiply the nonzero ones
    x_aval = get_aval(x)
    is_zero = numpy_equal(u, 0.0)
    nonzero_product = scatter_mul(
        full_of(x_aval, 1.0),
        numpy_where(is_zero, 1.0, u),
        *indices,
        batch_dims=batch_dims,
    )
    zero_count = scatter_add(
        zeros_of(x_aval),
        convert_element_type(is_zero, x_aval.dtype),
        *indices,
        batch_dims=batch_dims,
    )
    product_k = gather(nonzero_product, *indices, batch_dims=batch_dims)
    zeros_k = gather(zero_count, *indices, batch_dims=batch_dims)
    others = numpy_where(
        is_zero,
        numpy_where(numpy_equal(zeros_k, 1.0), product_k, 0.0),
        numpy_where(
            numpy_equal(zeros_k, 0.0),
            numpy_divide(product_k, numpy_where(is_zero, 1.0, u)),
            0.0,
        ),
    )
    d_product = scatter_add(
        zeros_of(x_aval), mul(du, others), *indices, batch_dims=batch_dims
    )
    return [out], [add(t_out, mul(x, d_product))]


@scatter_mul_p.def_rule("transpose")
def _scatter_mul_transpose(cts, x, updates, *indices, batch_dims):
    (ct,) = cts
    if _is_undef(updates):
        raise TypeError("scatter_mul is linear in its operand x only, not in updates")
    ct_x = scatter_mul(ct, updates, *indices, batch_dims=batch_dims)
    return [ct_x, None] + [None] * len(indices)


def _scatter_extremal_jvp(prim: Primitive) -> None:
    """The tangent of the value that won at each position; where several tie
    (updates, and x if it kept its value), their tangents are averaged."""

    @prim.def_rule("jvp")
    def rule(primals, tangents, *, batch_dims):
        (x, u, *indices), (dx, du, *_) = primals, tangents
        out = bind(prim, x, u, *indices, batch_dims=batch_dims)
        x_aval, u_aval = get_aval(x), get_aval(u)
        if x_aval.dtype.kind != "f":
            return [out], [zeros_of(x_aval)]
        p = dict(batch_dims=batch_dims)

        def count_at_positions(which):  # per update: how many share its position
            per_position = scatter_add(zeros_of(x_aval), which, *indices, **p)
            return gather(per_position, *indices, **p)

        target = gather(out, *indices, **p)
        won = numpy_equal(u, target)
        kept = numpy_equal(gather(x, *indices, **p), target)
        winners = count_at_positions(convert_element_type(won, x_aval.dtype))
        refs = count_at_positions(full_of(u_aval, 1.0))
        # (each denominator at least 1: it is 0 only for updates out of range,
        # whose tangents the last scatter-add drops anyway)
        share = numpy_divide(
            1.0, numpy_where(kept, winners + 1.0, numpy_maximum(winners, 1.0))
        )
        u_coef = numpy_where(won, share, 0.0)
        x_share = numpy_where(kept, numpy_divide(1.0, winners + 1.0), 0.0)
        x_coef = numpy_divide(x_share - 1.0, numpy_maximum(refs, 1.0))
        moved = add(mul(gather(dx, *indices, **p), x_coef), mul(du, u_coef))
        return [out], [scatter_add(dx, moved, *indices, **p)]


_scatter_extremal_jvp(scatter_min_p)
_scatter_extremal_jvp(scatter_max_p)
NOT_LINEAR.update({"scatter-min", "scatter-max"})  # no transpose rule


# %% [markdown]
# ### Batching a gather never loops
#
# `vmap` of a gather has three cases, each of them one gather with one more
# axis somewhere:
#
# - **Only `x` is batched**: every example reads the same positions, from its
#   own array. The batch axis is just one more axis taken whole: put it first
#   in the window, and it comes out after the index arrays' axes.
# - **Only the indices are batched**: one array, read at different positions
#   per example. The batch axis is one more axis of the index arrays (after the
#   paired axes), and so of the output.
# - **Both**: example `n` reads its own positions from its own array. Put the
#   batch axis first in `x` and in every index array, and pair them: one more
#   *batch dimension*, `batch_dims + 1`.


# %% tags=["export"]
@gather_p.def_rule("vmap")
def _gather_vmap(axis, vals, dims, *, batch_dims):
    (x, *indices), (bx, *b_indices) = vals, dims
    nb, k = batch_dims, len(indices)
    if all(b is None for b in b_indices):  # one index map for every example
        x = move_batch_axis(axis.size, bx, nb + k, x)
        return [gather(x, *indices, batch_dims=nb)], [get_aval(indices[0]).ndim]
    if bx is None:  # one array, an index map per example
        indices = [
            move_batch_axis(axis.size, b, nb, i) for i, b in zip(indices, b_indices)
        ]
        return [gather(x, *indices, batch_dims=nb)], [nb]
    x = move_batch_axis(axis.size, bx, 0, x)  # both: pair the batch axes
    indices = [move_batch_axis(axis.size, b, 0, i) for i, b in zip(indices, b_indices)]
    return [gather(x, *indices, batch_dims=nb + 1)], [0]


# %% [markdown]
# The scatters batch the same way (the folded cell), with `updates` following
# the index arrays: in the first case its batch axis is the first window axis,
# otherwise its leading axis. `dynamic_slice` and `dynamic_update_slice` with
# unbatched starts put the batch axis first and start it at 0. With batched
# starts, each example reads a block at its own position, and that is a
# gather, but not of the raw starts: a gather clamps each *position* on its
# own, where `dynamic_slice` moves the whole *block* back inside. (Start 5,
# size 3, on an axis of 6: `dynamic_slice` reads 3, 4, 5; a gather at 5, 6, 7
# would read 5, 5, 5.) So the rule first wraps a negative start and clamps it
# to fit the block, `start = clip(start, 0, n - size)`, then builds the
# positions `start + arange(size)` along each axis and gathers them (paired
# with the array's batch axis if it has one). `dynamic_update_slice` does the
# same with a `scatter`.


# %% tags=["export", "hide-input"]
# @title Batching the scatters, dynamic_slice and dynamic_update_slice
def _scatter_vmap(prim: Primitive) -> None:
    @prim.def_rule("vmap")
    def rule(axis, vals, dims, *, batch_dims, **params):
        (x, updates, *indices), (bx, bu, *b_indices) = vals, dims
        nb, k = batch_dims, len(indices)
        if all(b is None for b in b_indices):
            x = move_batch_axis(axis.size, bx, nb + k, x)
            updates = move_batch_axis(axis.size, bu, get_aval(indices[0]).ndim, updates)
            out = bind(prim, x, updates, *indices, batch_dims=nb, **params)
            return [out], [nb + k]
        x = move_batch_axis(axis.size, bx, 0, x)
        updates = move_batch_axis(axis.size, bu, 0, updates)
        indices = [
            move_batch_axis(axis.size, b, 0, i) for i, b in zip(indices, b_indices)
        ]
        return [bind(prim, x, updates, *indices, batch_dims=nb + 1, **params)], [0]


for _prim in [scatter_add_p, scatter_p, scatter_mul_p, scatter_min_p, scatter_max_p]:
    _scatter_vmap(_prim)


def block_positions(axis_size, shape, starts, b_starts, sizes) -> list:
    """Per example, the index arrays of a block of ``sizes`` at ``starts``
    (clamped to fit ``shape``): one array of shape (batch, *sizes) per axis."""
    out_shape = (axis_size, *sizes)
    positions = []
    for a, (s, b, n, k) in enumerate(zip(starts, b_starts, shape, sizes)):
        s = move_batch_axis(axis_size, b, 0, s)  # (batch,)
        s = numpy_clip(_wrap_negative(s, n), 0, n - k)
        offsets = np.arange(k, dtype=get_aval(s).dtype)
        others = tuple(d for d in range(len(out_shape)) if d != a + 1)
        s = broadcast(s, out_shape, tuple(range(1, len(out_shape))))
        positions.append(add(s, broadcast(offsets, out_shape, others)))
    return positions


@dynamic_slice_p.def_rule("vmap")
def _dynamic_slice_vmap(axis, vals, dims, *, slice_sizes):
    (x, *starts), (bx, *b_starts) = vals, dims
    if all(b is None for b in b_starts):
        x = move_batch_axis(axis.size, bx, 0, x)
        zero = np.zeros((), np.int64)
        sizes = (axis.size, *slice_sizes)
        return [bind(dynamic_slice_p, x, zero, *starts, slice_sizes=sizes)], [0]
    shape = (
        get_aval(x).shape
        if bx is None
        else get_aval(x).shape[:bx] + get_aval(x).shape[bx + 1 :]
    )
    positions = block_positions(axis.size, shape, starts, b_starts, slice_sizes)
    if bx is None:
        return [gather(x, *positions)], [0]
    x = move_batch_axis(axis.size, bx, 0, x)
    return [gather(x, *positions, batch_dims=1)], [0]


@dynamic_update_slice_p.def_rule("vmap")
def _dynamic_update_slice_vmap(axis, vals, dims):
    (x, update, *starts), (bx, bu, *b_starts) = vals, dims
    x = move_batch_axis(axis.size, bx, 0, x)
    update = move_batch_axis(axis.size, bu, 0, update)
    if all(b is None for b in b_starts):
        zero = np.zeros((), np.int64)
        return [bind(dynamic_update_slice_p, x, update, zero, *starts)], [0]
    shape, sizes = get_aval(x).shape[1:], get_aval(update).shape[1:]
    positions = block_positions(axis.size, shape, starts, b_starts, sizes)
    return [scatter(x, update, *positions, batch_dims=1)], [0]


# %% [markdown]
# Three windows of 3 at batched starts: 5 and −1 (which wraps to 5) both
# clamp to 3, as in JAX.

# %%
row, starts = np.arange(6.0) * 10, np.array([5, -1, 2])
print(vmap(lambda s: dynamic_slice(row, (s,), (3,)))(starts))
with jax.enable_x64(True):
    print(jax.vmap(lambda s: jax.lax.dynamic_slice(row, (s,), (3,)))(starts))

# %% [markdown]
# A batch of embedding tables read at a batch of token arrays is one gather
# with a batch dimension; the same tokens in every table, one gather whose
# window holds the batch axis:

# %%
print(make_jaxpr(vmap(gather), f64(4, 5, 3), i64(4, 2))[0])
print(make_jaxpr(vmap(gather, (0, None)), f64(4, 5, 3), i64(2))[0])

# %% [markdown]
# And the three cases give JAX's numbers: four tables of 5 rows, read at one
# array of tokens or at four.

# %%
rng = np.random.default_rng(2)
tables, token_rows = rng.normal(size=(4, 5, 3)), rng.integers(0, 5, size=(4, 2))
cases = {  # in_axes, table(s), token array(s)
    "tables batched": ((0, None), tables, token_rows[0]),
    "tokens batched": ((None, 0), tables[0], token_rows),
    "both batched": ((0, 0), tables, token_rows),
}
for name, (in_axes, t, i) in cases.items():
    ours = vmap(gather, in_axes)(t, i)
    with jax.enable_x64(True):
        theirs = jax.vmap(lambda t, i: t[i], in_axes)(jnp.asarray(t), i)
    print(f"{name:15}", ours.shape, np.allclose(ours, theirs, rtol=1e-12))


# %% [markdown]
# ### Lowering
#
# The gather and the scatters become `stablehlo.gather` and `stablehlo.scatter`, whose
# dimension numbers describe our form: the index arrays are stacked along a new
# last axis (the "index vector"), the indexed axes of `x` are *collapsed* (read
# with size 1 and dropped), the others are *offset* (window) axes, and the
# paired axes are *batching* dimensions. A scatter carries a small region that
# combines the old value with the update: `add`, `multiply`, `minimum`,
# `maximum`, or return the update.


# %% tags=["export", "hide-input"]
# @title Lowering to stablehlo.gather and stablehlo.scatter
def _stacked_indices(indices, avals) -> ir.Value:
    """One i64 index array with the index vector as its last axis."""
    shape = avals[0].shape
    column = ir_type(ShapedArray((*shape, 1), np.int64))
    i64 = ShapedArray(shape, np.int64)
    columns = []
    for i, a in zip(indices, avals):
        i = i if a.dtype == np.int64 else hlo.convert(ir_type(i64), i)
        columns.append(hlo.reshape(column, i))
    return columns[0] if len(columns) == 1 else hlo.concatenate(columns, len(shape))


@gather_p.def_rule("lower")
def _gather_lower(ctx, avals_in, avals_out, x, *indices, batch_dims):
    x_aval, idx_avals = avals_in[0], avals_in[1:]
    nb, k, r = batch_dims, len(indices), idx_avals[0].ndim
    dims = hlo.GatherDimensionNumbers.get(
        offset_dims=list(range(r, avals_out[0].ndim)),
        collapsed_slice_dims=list(range(nb, nb + k)),
        operand_batching_dims=list(range(nb)),
        start_indices_batching_dims=list(range(nb)),
        start_index_map=list(range(nb, nb + k)),
        index_vector_dim=r,
    )
    sizes = [1] * (nb + k) + list(x_aval.shape[nb + k :])
    out = hlo.gather(x, _stacked_indices(indices, idx_avals), dims, sizes)
    return [out]


def _lower_scatter(prim: Primitive, combine: Callable | None) -> None:
    @prim.def_rule("lower")
    def rule(ctx, avals_in, avals_out, x, updates, *indices, batch_dims):
        x_aval, up_aval, idx_avals = avals_in[0], avals_in[1], avals_in[2:]
        nb, k, r = batch_dims, len(indices), idx_avals[0].ndim
        dims = hlo.ScatterDimensionNumbers.get(
            update_window_dims=list(range(r, up_aval.ndim)),
            inserted_window_dims=list(range(nb, nb + k)),
            input_batching_dims=list(range(nb)),
            scatter_indices_batching_dims=list(range(nb)),
            scattered_dims_to_operand_dims=list(range(nb, nb + k)),
            index_vector_dim=r,
        )
        stacked = _stacked_indices(indices, idx_avals)
        op = hlo.ScatterOp([ir_type(avals_out[0])], [x], stacked, [updates], dims)
        scalar = ir_type(ShapedArray((), x_aval.dtype))
        body = op.regions[0].blocks.append(scalar, scalar)
        with ir.InsertionPoint(body):
            old, new = body.arguments
            hlo.ReturnOp([new if combine is None else combine(old, new)])
        return [op.results[0]]


_lower_scatter(scatter_add_p, hlo.add)
_lower_scatter(scatter_p, None)
_lower_scatter(scatter_mul_p, hlo.multiply)
_lower_scatter(scatter_min_p, hlo.minimum)
_lower_scatter(scatter_max_p, hlo.maximum)

# %% [markdown]
# The lookup's gradient, lowered: its gather and its scatter-add, with their
# dimension numbers (each token's index vector is one number, row `i`; the
# row's axis 0 is collapsed, its axis 1 is the window), then its numbers
# under `jit`, next to JAX's:

# %%
import re

lowered = lower_jaxpr(make_jaxpr(grad(lookup_loss), f64(5, 3), i64(3))[0])
for op, dims in re.findall(r'"stablehlo\.(\w+)".*?<\{(.*?)\}>', str(lowered)):
    print(op, dims.replace("#stablehlo.", ""))
print(jit(grad(lookup_loss))(table, tokens))
with jax.enable_x64(True):
    jax_loss = lambda t, i: jnp.sum(t[i] ** 2)  # noqa: E731
    print(jax.jit(jax.grad(jax_loss))(table, tokens))


# %% [markdown]
# ## The NumPy interface: `x[idx]` and `x.at[idx]`
#
# NumPy's indexing is a small language: ints, slices, `None` (a new axis of
# size 1), `...` (as many `:` as needed), integer arrays and boolean masks, in
# any mix, with a rule for where the axes of the index arrays go: the index
# arrays (an int among them counts as one of shape `()`) broadcast to one
# shape; if they stand next to each other, the axes of that shape take their
# place in the result, and if a slice separates them, those axes come first.
# Ours turns an index into as few of our primitives as it can:
#
# - only ints, slices with a positive step, `None` and `...`: one `slice` (none
#   if it would take everything) and a `reshape` (an int `i` is the slice
#   `i:i+1`, whose axis the reshape drops; a reshape to the same shape is
#   left out);
# - the same with traced scalar integers among them: one `dynamic_slice` and a
#   `reshape`;
# - anything else (integer arrays, boolean masks, negative steps): the
#   slices first, as one `slice`, then one `gather` whose index arrays give,
#   for every element of the result, its position along each indexed axis of
#   `x`. The axes that are taken whole (`:`, or a slice already done) are not
#   indexed: they are moved last (a `transpose`) and read as the gather's
#   window, so `x[:, i]` reads columns without an array of row numbers. A boolean mask becomes integer arrays with `np.nonzero`,
#   which only works when the mask is known while tracing: the shape of the
#   result depends on it.
#   Positions that the index does not hold as an array (a negative step,
#   `x[::-1]`, or a slice next to an integer array in a write) are computed
#   while tracing and enter the program as constants of the result's size:
#   the simple way, not the cheap one (JAX computes strided or reversed
#   positions in the program with `iota`, reads `x[::-1]` with `rev`, and
#   writes a unit-step slice next to an integer array as a window of its
#   scatter).
#
# Negative indices count from the end, as in NumPy. The parsing is folded: it
# expands `...`, checks each entry, and builds the plan.


# %% tags=["export"]
def getitem(x: ArrayLike, idx: Any) -> ArrayLike:
    """``x[idx]`` with NumPy's indexing rules."""
    plan = index_plan(get_aval(x), idx)
    if plan.kind == "empty":  # nothing to read
        return zeros_of(ShapedArray(plan.shape, get_aval(x).dtype))
    if plan.kind == "dynamic_slice":
        x = dynamic_slice(x, plan.starts, plan.sizes)
    elif plan.starts is not None:  # a static slice (before a gather, if any)
        x = lax_slice(x, plan.starts, plan.limits, plan.strides)
    if plan.kind == "gather":  # indexed axes first, whole axes as the window
        x = gather(permute(x, plan.perm), *plan.positions)
        x = permute(x, plan.out_perm)  # the result's axes in NumPy's order
    return reshape(x, plan.shape)


# %% [markdown]
# Writing goes through `x.at[idx]`, since JAX's arrays are immutable:
# `x.at[idx].set(v)` returns a new array with `v` written where `x[idx]` would
# read. The update is broadcast to the shape `x[idx]` has and converted to
# `x`'s dtype, and then one scatter writes it at the positions a gather plan
# would read: `scatter` for `set`, `scatter-add` for `add`, and so on. The
# `mode` says what happens to indices out of range (the next section).


# %% tags=["export"]
class IndexUpdateRef(NamedTuple):
    """``x.at[idx]``: what ``get``, ``set``, ``add``, ... act on."""

    x: ArrayLike
    idx: Any

    def get(self, *, mode=None, fill_value=None) -> ArrayLike:
        return read_with_mode(self.x, self.idx, mode, fill_value)

    def set(self, values: ArrayLike, *, mode=None) -> ArrayLike:
        return self._write(scatter, values, mode)

    def add(self, values: ArrayLike, *, mode=None) -> ArrayLike:
        return self._write(scatter_add, values, mode)

    def multiply(self, values: ArrayLike, *, mode=None) -> ArrayLike:
        return self._write(scatter_mul, values, mode)

    def min(self, values: ArrayLike, *, mode=None) -> ArrayLike:
        return self._write(scatter_min, values, mode)

    def max(self, values: ArrayLike, *, mode=None) -> ArrayLike:
        return self._write(scatter_max, values, mode)

    def _write(self, scatter_fn: Callable, values: ArrayLike, mode) -> ArrayLike:
        plan = index_plan(get_aval(self.x), self.idx, for_update=True)
        values = check_update_values(self.x, plan.shape, values)  # broadcast, cast
        if plan.kind == "empty":  # nothing to write
            return self.x
        x = permute(self.x, plan.perm)  # the axes as the gather would read them
        values = permute(values, inverse_perm(plan.out_perm))  # and the update
        x = scatter_fn(x, values, *bounded_positions(plan, mode))
        return permute(x, inverse_perm(plan.perm))


# %% [markdown]
# The folded cell has the parser, `index_plan`; it returns the kind of plan,
# the params of the slice, the positions for a gather or a scatter, the axis
# permutations and the shapes, with the errors a learner meets first: a float
# index, too many indices, a step of 0, a traced boolean mask. A scalar
# boolean, `x[True]` or `x[False]`, is NumPy's and JAX's too: a new axis of
# size 1 or 0, read as an index array of shape `(1,)` or `(0,)`.


# %% tags=["export", "hide-input"]
# @title index_plan: NumPy's index language, parsed into a slice or a gather
class IndexingError(IndexError, TypeError):
    """An index that does not fit the array (an IndexError, as in NumPy)."""


class NonConcreteBooleanIndexError(IndexingError):
    """A boolean mask index whose value is not known while tracing."""


class IndexPlan(NamedTuple):
    kind: str  # "slice", "dynamic_slice", "gather", "whole" (x) or "empty"
    shape: tuple  # the shape of x[idx]
    starts: Any = None  # slice, dynamic_slice
    limits: Any = None  # slice
    strides: Any = None  # slice
    sizes: Any = None  # dynamic_slice
    positions: Any = None  # gather: one index array per indexed axis
    perm: Any = None  # gather: x's indexed axes first, then the whole ones
    out_perm: Any = None  # gather: from the gather's axes to the result's
    indexed_shape: Any = None  # gather: the sizes of the indexed axes


def permute(x: ArrayLike, perm: Sequence[int]) -> ArrayLike:
    """``transpose(x, perm)``, or ``x`` itself for the identity."""
    return x if tuple(perm) == tuple(range(len(perm))) else transpose(x, perm)


def inverse_perm(perm: Sequence[int]) -> tuple:
    return tuple(int(i) for i in np.argsort(perm))


def _is_scalar_bool(item: Any) -> bool:
    """``True``, ``False``, a NumPy bool or a 0-d boolean array (not traced)."""
    return isinstance(item, (bool, np.bool_)) or (
        isinstance(item, np.ndarray) and item.shape == () and item.dtype == np.bool_
    )


def _entries(aval: ShapedArray, idx: Any) -> list:
    """The index as a list of (kind, axis, value): ("new",), ("slice", axis,
    (start, step, count)), ("int", axis, i), ("array", axis, array)."""
    if isinstance(idx, list):
        raise TypeError(
            f"indexing {aval.str_short()} with a list {_short_repr(idx)}: use a "
            "tuple for several indices, or an array, x[np.array(seq)], as in JAX"
        )
    items = list(idx) if isinstance(idx, tuple) else [idx]
    if sum(item is Ellipsis for item in items) > 1:
        raise IndexingError(f"indexing {aval.str_short()}: at most one ... is allowed")
    used = sum(_axes_used(aval, item) for item in items if item is not Ellipsis)
    if used > aval.ndim:
        raise IndexingError(
            f"Too many indices: array is {aval.ndim}-dimensional, but {used} were "
            f"indexed (indexing {aval.str_short()} with {_short_repr(idx)})"
        )
    if not any(item is Ellipsis for item in items):
        items.append(Ellipsis)
    at = next(k for k, item in enumerate(items) if item is Ellipsis)
    items[at : at + 1] = [slice(None)] * (aval.ndim - used)
    entries, axis = [], 0
    for item in items:
        if item is None:
            entries.append(("new",))
            continue
        if _is_scalar_bool(item):  # an index array on a new axis of size 1
            entries.append(("array", None, np.zeros(1 if item else 0, np.int64)))
            continue
        n = aval.shape[axis] if axis < aval.ndim else 0
        if isinstance(item, slice):
            start, stop, step = (
                _static_int(aval, v) for v in (item.start, item.stop, item.step)
            )
            if step == 0:
                raise ValueError(
                    f"indexing {aval.str_short()}: slice step cannot be zero"
                )
            start, stop, step = slice(start, stop, step).indices(n)
            entries.append(
                ("slice", axis, (start, step, len(range(start, stop, step))))
            )
            axis += 1
        elif _is_python_scalar(item) or isinstance(item, np.integer):
            entries.append(("int", axis, _static_int(aval, item)))
            axis += 1
        else:
            array = _index_array(aval, item)
            if get_aval(array).dtype == np.bool_:
                mask_shape = get_aval(array).shape
                if mask_shape != aval.shape[axis : axis + len(mask_shape)]:
                    raise IndexingError(
                        f"indexing {aval.str_short()}: boolean index did not match "
                        f"shape of indexed array: a mask of shape {mask_shape} "
                        f"for the axes {aval.shape[axis : axis + len(mask_shape)]}"
                    )
                for a in np.nonzero(array):
                    entries.append(("array", axis, a))
                    axis += 1
            else:
                entries.append(("array", axis, array))
                axis += 1
    return entries


def _axes_used(aval: ShapedArray, item: Any) -> int:
    if item is None or _is_scalar_bool(item):
        return 0
    if isinstance(item, (slice, int, np.integer)) or _is_python_scalar(item):
        return 1
    array = _index_array(aval, item)
    return get_aval(array).ndim if get_aval(array).dtype == np.bool_ else 1


def _static_int(aval: ShapedArray, value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, Tracer):
        value.check_live()
        raise TypeError(
            f"indexing {aval.str_short()}: a slice's start, stop and step must "
            f"be known while tracing, got a traced {value.aval.str_short()}; use "
            "dynamic_slice for a block at a traced position"
        )
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise TypeError(
            f"indexing {aval.str_short()}: Indexer must have integer or boolean "
            f"type, got {_short_repr(value)}"
        )
    return int(value)


def _index_array(aval: ShapedArray, item: Any) -> Any:
    """An index given as an array: NumPy's (kept static), or a tracer."""
    if isinstance(item, Tracer):
        item.check_live()
        if item.aval.dtype == np.bool_:
            raise NonConcreteBooleanIndexError(
                f"indexing {aval.str_short()} with a traced boolean mask "
                f"{item.aval.str_short()}: the shape of the result would depend "
                "on the mask's values, which are not known while tracing. Use "
                "jnp.where(mask, x, 0) (or a sum of the masked values) instead"
            )
    else:
        item = np.asarray(item)  # NumPy arrays, device Arrays, booleans
    dtype = get_aval(item).dtype
    if dtype.kind not in "biu":
        raise TypeError(
            f"indexing {aval.str_short()}: Indexer must have integer or boolean "
            f"type, got an index of type {get_aval(item).str_short()}"
        )
    return item


def index_plan(aval: ShapedArray, idx: Any, for_update: bool = False) -> IndexPlan:
    """How to compute ``x[idx]`` for ``x`` of type ``aval``."""
    entries = _entries(aval, idx)
    arrays = [e for e in entries if e[0] == "array"]
    simple = all(e[0] != "slice" or e[2][1] > 0 for e in entries)
    if for_update:
        return _gather_plan(aval, entries)
    if simple and all(get_aval(e[2]).ndim == 0 for e in arrays):
        return _slicing_plan(aval, entries)
    return _slice_then_gather_plan(aval, entries)


def _slice_then_gather_plan(aval: ShapedArray, entries: list) -> IndexPlan:
    """A read: the slices with a positive step that do not take their whole
    axis are done by a static slice first, so the gather reads them whole, as
    its window, instead of at positions given by a constant."""
    starts, limits, strides = [0] * aval.ndim, list(aval.shape), [1] * aval.ndim
    sliced = []
    for e in entries:
        if e[0] == "slice" and e[2][1] > 0 and e[2] != (0, 1, aval.shape[e[1]]):
            (start, step, count), axis = e[2], e[1]
            starts[axis], strides[axis] = start, step
            limits[axis] = past_last(start, count, step)
            e = ("slice", axis, (0, 1, count))
        sliced.append(e)
    if sliced == entries:
        return _gather_plan(aval, entries)
    shape = tuple(map(_sliced_size, starts, limits, strides))
    plan = _gather_plan(ShapedArray(shape, aval.dtype), sliced)
    return plan._replace(
        starts=tuple(starts), limits=tuple(limits), strides=tuple(strides)
    )


def _slicing_plan(aval: ShapedArray, entries: list) -> IndexPlan:
    """ints, positive-step slices, None, traced scalars: a (dynamic) slice."""
    starts, limits, strides = [0] * aval.ndim, list(aval.shape), [1] * aval.ndim
    shape, dynamic = [], False
    for e in entries:
        if e[0] == "new":
            shape.append(1)
        elif e[0] == "slice":
            axis, (start, step, count) = e[1], e[2]
            starts[axis], strides[axis] = start, step
            limits[axis] = start + (count - 1) * step + 1 if count else start
            shape.append(count)
        elif e[0] == "int" or not isinstance(e[2], Tracer):  # one element
            axis, n = e[1], aval.shape[e[1]]
            i = int(np.asarray(e[2]))
            i = i + n if i < 0 else i
            starts[axis] = min(max(i, 0), n - 1)  # JAX clamps reads
            limits[axis] = starts[axis] + 1
        else:  # a traced scalar: a dynamic start
            starts[e[1]], limits[e[1]], dynamic = e[2], None, True  # wrapped later
    if not dynamic:
        whole = starts == [0] * aval.ndim and limits == list(aval.shape)
        if whole and strides == [1] * aval.ndim:
            return IndexPlan("whole", tuple(shape))
        return IndexPlan(
            "slice", tuple(shape), tuple(starts), tuple(limits), tuple(strides)
        )
    if any(s != 1 for s in strides):
        return _slice_then_gather_plan(aval, entries)
    sizes = tuple(1 if hi is None else hi - lo for lo, hi in zip(starts, limits))
    starts = [s if isinstance(s, Tracer) else np.asarray(s, np.int64) for s in starts]
    return IndexPlan("dynamic_slice", tuple(shape), starts=starts, sizes=sizes)


def _gather_plan(aval: ShapedArray, entries: list) -> IndexPlan:
    """Everything else: the axes taken whole become the gather's window; for
    the others, the position of each element of x[idx] along each of them,
    as index arrays."""
    entries = [
        ("array", e[1], np.asarray(e[2])) if e[0] == "int" else e for e in entries
    ]
    adv = [k for k, e in enumerate(entries) if e[0] == "array"]
    contiguous = adv == list(range(adv[0], adv[0] + len(adv))) if adv else True
    adv_shape = np.broadcast_shapes(*(get_aval(entries[k][2]).shape for k in adv))
    # the result's axes, in order: ("new",), ("slice", axis) or ("array",)
    layout = []
    for k, e in enumerate(entries):
        if e[0] != "array":
            layout.append(e[:2])
        elif k == adv[0] and contiguous:
            layout.append(("array",))
    if not contiguous:
        layout.insert(0, ("array",))

    def entry_of(axis):
        return next(e for e in entries if e[0] != "new" and e[1] == axis)

    # axes taken whole (x[:, ...]) are read as the window; at least one is indexed
    whole = [
        a
        for a in range(aval.ndim)
        if entry_of(a)[0] == "slice" and entry_of(a)[2] == (0, 1, aval.shape[a])
    ]
    if len(whole) == aval.ndim:
        whole = whole[1:]
    indexed = [a for a in range(aval.ndim) if a not in whole]

    def sizes(item):
        if item[0] == "array":
            return list(adv_shape)
        if item[0] == "new":
            return [1]
        return [entry_of(item[1])[2][2]]

    shape = [n for item in layout for n in sizes(item)]
    # the gather's output: the positions' axes (the result's axes that are not
    # whole, in order), then the whole axes in x's order
    at, positions_axes, window_axes = 0, [], {}
    where = {}
    for item in layout:
        k = len(sizes(item))
        if item[0] == "slice" and item[1] in whole:
            window_axes[item[1]] = at
        else:
            where[item] = len(positions_axes)
            positions_axes.extend(range(at, at + k))
        at += k
    gather_axes = positions_axes + [window_axes[a] for a in whole]
    positions_shape = tuple(shape[d] for d in positions_axes)
    positions = []
    for axis in indexed:
        e = entry_of(axis)
        if e[0] == "slice":
            start, step, count = e[2]
            p = np.arange(count, dtype=np.int64) * step + start
            at = where[("slice", axis)]
            p = p.reshape([-1 if d == at else 1 for d in range(len(positions_shape))])
            positions.append(np.broadcast_to(p, positions_shape))
        else:
            p = broadcast_to(_wrap_negative(e[2], aval.shape[axis]), adv_shape)
            at = where[("array",)]
            block = range(at, at + len(adv_shape))
            others = tuple(d for d in range(len(positions_shape)) if d not in block)
            positions.append(broadcast(p, positions_shape, others) if others else p)
    if 0 in shape:  # an empty result: nothing to gather
        return IndexPlan("empty", tuple(shape))
    return IndexPlan(
        "gather",
        tuple(shape),
        positions=positions,
        perm=tuple(indexed + whole),
        out_perm=inverse_perm(gather_axes),
        indexed_shape=tuple(aval.shape[a] for a in indexed),
    )


def check_index_mode(name: str, mode: Any) -> str:
    """JAX's out-of-range modes; None is "promise_in_bounds" ("fill" for take)."""
    if mode is None:
        return "promise_in_bounds"
    mode = getattr(mode, "name", mode)  # a GatherScatterMode-like enum
    mode = {"FILL_OR_DROP": "fill", "CLIP": "clip"}.get(mode, str(mode).lower())
    if mode not in ("promise_in_bounds", "clip", "fill", "drop"):
        raise ValueError(
            f"{name}: mode must be None, 'promise_in_bounds', 'clip', 'fill' or "
            f"'drop', got {mode!r}"
        )
    return mode


def bounded_positions(plan: IndexPlan, mode: Any) -> list:
    """The plan's positions; with mode "clip", clamped into their axes."""
    if check_index_mode("at[]", mode) != "clip":
        return plan.positions
    return [
        numpy_clip(p, 0, max(n - 1, 0))
        for p, n in zip(plan.positions, plan.indexed_shape)
    ]


def in_bounds(shape, indices) -> ArrayLike:
    """A boolean array over the index positions: inside ``shape`` or not."""
    inside = True
    for i, n in zip(indices, shape):
        here = select(i >= 0, i < n, i >= 0)  # i >= 0 and i < n
        inside = here if inside is True else select(here, inside, here)
    return inside


def read_with_mode(x: ArrayLike, idx: Any, mode: Any, fill_value: Any) -> ArrayLike:
    """``x.at[idx].get(mode=..., fill_value=...)``: "clip" clamps the positions
    before the gather, "fill" (or "drop") puts ``fill_value`` where they are
    out of range; by default, the same as ``x[idx]``."""
    mode = check_index_mode("at[].get", mode)
    if mode == "promise_in_bounds":
        return getitem(x, idx)
    plan = index_plan(get_aval(x), idx, for_update=True)
    dtype = get_aval(x).dtype
    if plan.kind == "empty":
        return zeros_of(ShapedArray(plan.shape, dtype))
    out = gather(permute(x, plan.perm), *bounded_positions(plan, mode))
    if mode in ("fill", "drop"):
        inside = in_bounds(plan.indexed_shape, plan.positions)
        inside = _per_window(inside, get_aval(out), get_aval(plan.positions[0]).ndim)
        fill = _fill_value(dtype) if fill_value is None else fill_value
        out = select(inside, out, full_of(get_aval(out), fill))
    return reshape(permute(out, plan.out_perm), plan.shape)


def _fill_value(dtype: np.dtype) -> Any:
    """JAX's fill for out-of-range reads: NaN, the lowest int, or True."""
    if dtype.kind == "f":
        return np.nan
    if dtype.kind == "b":
        return True
    return np.iinfo(dtype).min if dtype.kind == "i" else np.iinfo(dtype).max


def check_update_values(x: ArrayLike, shape: tuple, values: ArrayLike) -> ArrayLike:
    """The update of ``x.at[idx]``, broadcast to ``x[idx]``'s shape, in x's dtype."""
    values = _as_input(values, "at[]")
    aval, x_aval = get_aval(values), get_aval(x)
    if aval.ndim > len(shape) or any(
        d not in (1, n) for d, n in zip(aval.shape[::-1], shape[::-1])
    ):
        raise ValueError(
            f"x.at[idx] of {x_aval.str_short()}: an update of shape {aval.shape} "
            f"does not broadcast to the indexed shape {shape}"
        )
    values = convert_element_type(values, x_aval.dtype)
    return broadcast_to(values, shape)


# %% [markdown]
# The operators: `x[idx]` and `x.at` on tracers and on arrays, and iteration.
# Iterating over a traced array was refused in the {ref}`appendix
# <appendix-comparisons>`, for lack of indexing; this replaces that refusal
# with JAX's behaviour: `for row in x` yields `x[0]`, `x[1]`, ...


# %% tags=["export"]
def _iterate_rows(self: ArrayOperators) -> Iterator[ArrayLike]:
    aval = get_aval(self)
    if not aval.shape:
        raise TypeError(f"iteration over a 0-d array: {aval.str_short()}")
    return iter([getitem(self, i) for i in range(aval.shape[0])])


ArrayOperators.__getitem__ = getitem
ArrayOperators.at = property(lambda self: _IndexUpdateHelper(self))
Tracer.__iter__ = Array.__iter__ = _iterate_rows


class _IndexUpdateHelper(NamedTuple):
    x: ArrayLike

    def __getitem__(self, idx: Any) -> IndexUpdateRef:
        return IndexUpdateRef(self.x, idx)


# %% [markdown]
# A few indices, and the jaxprs they make:

# %%
x = np.arange(12.0).reshape(3, 4)
print(make_jaxpr(lambda x: x[1:3, ::2], f64(3, 4))[0])
print(make_jaxpr(lambda x, i: x[i, None], f64(3, 4), i64())[0])
print(make_jaxpr(lambda x, i: x[:, i], f64(3, 4), i64(2))[0])
print(jit(lambda x: x[np.array([True, False, True]), -1])(x))
print(jit(lambda x: x.at[np.array([0, 0]), 1].add(10.0))(x))
print(jit(lambda x: x.at[np.array([0, 2]), 1].multiply(10.0))(x))


# %% [markdown]
# ## Indices out of range
#
# An index outside its axis cannot raise an error at run time (a compiled
# program has no exceptions), so each primitive has a rule for it. Ours are
# XLA's, as JAX's are: `gather` *clamps* each index into its axis and reads
# the nearest row; a scatter *drops* an update whose position is outside `x`;
# `dynamic_slice` and `dynamic_update_slice` count a negative start from the
# end and then move the block back inside. The front end counts negative
# integer-array indices from the end (a `select`) before the gather, as NumPy
# does. Two transposes need a second look.
#
# **A clamped read, a dropped gradient.** A gather that clamped read its row
# from the clamped position, but its transpose, a scatter-add at the same
# indices, drops: out of range, the gradient of a read is zero instead of the
# clamped row's derivative. JAX's `x[idx]` does the same: it *promises* that
# the indices are in range (its mode `PROMISE_IN_BOUNDS`) and does nothing
# for the gradient of those that are not. To read the nearest row *and* get
# its derivative, ask for `mode="clip"`: the indices are clamped in the
# program, before the gather, so the gather and its transpose only ever see
# indices in range.
#
# **A dropped update, no cotangent.** The transpose of a scatter-add gathers
# each update's cotangent at its position, and a gather clamps, so an update
# that was dropped would get the cotangent of its clamped neighbour. It had
# no effect on the output, so its cotangent should be zero: this wraps the
# rule registered above and masks the dropped updates' cotangents.


# %% tags=["export"]
def zero_dropped_updates(prim: Primitive) -> None:
    """Wrap ``prim``'s transpose rule: zero cotangent for the dropped updates."""
    in_range_rule = prim.rules["transpose"]

    @prim.def_rule("transpose")
    def rule(cts, x, updates, *indices, batch_dims):
        ct_x, ct_u, *rest = in_range_rule(
            cts, x, updates, *indices, batch_dims=batch_dims
        )
        if ct_u is not None:  # keep the cotangents of the updates inside x
            inside = in_bounds(get_aval(cts[0]).shape[batch_dims:], indices)
            inside = _per_window(inside, get_aval(ct_u), get_aval(indices[0]).ndim)
            ct_u = select(inside, ct_u, zeros_of(get_aval(ct_u)))
        return [ct_x, ct_u, *rest]


zero_dropped_updates(scatter_add_p)

# %% [markdown]
# `scatter`'s own transpose needs no mask: it gives a cotangent only to the
# update that won its position, and a dropped update never wins.
#
# **Modes.** `x.at[idx]`'s methods take JAX's `mode=`:
#
# - `None`, the default: the primitives' own rules, reads clamp and writes
#   drop (JAX reads with its mode `PROMISE_IN_BOUNDS` and writes with
#   `FILL_OR_DROP`, which give our values and gradients);
# - `"promise_in_bounds"`: for us the same as `None`. JAX's differs in one
#   gradient, that of a dropped update (reference notes at the end);
# - `"clip"`: the positions are clamped before the gather or the scatter, so
#   reads and writes both go to the nearest position, and so do gradients;
# - `"fill"` or `"drop"`: writes drop; `get` returns `fill_value` (NaN for
#   floats by default) where a position is out of range, with a `select`
#   after the gather.
#
# `take_along_axis` takes the same modes, and `take` takes `"fill"` and
# `"clip"`; both default to `"fill"`, as JAX's do. The same reads and writes,
# next to JAX's:

# %%
xs, far = np.arange(4.0), np.array([9, -1, -9, 2])  # 9 and -9 are out of range


def reads_and_writes(mode):
    return lambda x: (x.at[far].get(mode=mode), x.at[far].add(10.0, mode=mode))


for mode in [None, "clip", "fill"]:
    ours = jit(reads_and_writes(mode))(xs)
    with jax.enable_x64(True):
        theirs = jax.jit(reads_and_writes(mode))(xs)
    same = all(np.array_equal(a, b, equal_nan=True) for a, b in zip(ours, theirs))
    print(f"{mode!s:5}", *ours, same)


# %% [markdown]
# And the gradients of a read at 5 and 1 in a vector of 3: the default drops
# the position out of range, `"clip"` gives it to the last element.


# %%
def read_sum(mode):  # x[5] * 10 + x[1], read with mode
    weights = np.array([10.0, 1.0])
    return lambda x: (x.at[np.array([5, 1])].get(mode=mode) * weights).sum()


for mode in [None, "clip"]:
    ours = grad(read_sum(mode))(np.zeros(3))
    with jax.enable_x64(True):
        theirs = jax.grad(read_sum(mode))(jnp.zeros(3))
    print(f"{mode!s:5}", ours, theirs)


# %% [markdown]
# ## `take`, `take_along_axis`, `split`
#
# The rest of NumPy's indexing functions are built from these pieces, and
# folded: `take(a, indices, axis)` is `a[:, ..., indices]` along `axis`;
# `take_along_axis(a, indices, axis)` reads one element per position of
# `indices`, a gather whose other axes are paired batch dimensions; `split` is
# slices. Both reads default to JAX's mode `"fill"`. Next to them, `argmax`
# and `argmin`, which *make* indices (the token a greedy decoder picks, whose
# embedding it reads next): the first position of the maximum (or of a NaN, as
# JAX does), with comparisons and a `reduce_max`. `autodidax.lax` gets
# `slice`, `pad`, `dynamic_slice`, `dynamic_update_slice`, `gather` and the
# scatters under JAX's names.


# %% tags=["export", "hide-input"]
# @title take, take_along_axis, split, argmax, argmin; the lax names
def _check_take_mode(name: str, mode: Any, allowed: tuple) -> str:
    """take's modes: None is "fill", as in JAX."""
    if mode not in (None, *allowed):
        raise ValueError(
            f"{name}: mode must be None, {', '.join(map(repr, allowed))}, got {mode!r}"
        )
    return mode or "fill"


@numpy_function
def numpy_take(a, indices, axis=None, mode=None, fill_value=None) -> ArrayLike:
    """Elements (or slices along ``axis``) of ``a`` at ``indices``."""
    mode = _check_take_mode("take", mode, ("fill", "clip"))
    a = _as_input(a, "take")
    if axis is None:
        a, axis = reshape(a, (-1,)), 0
    axis = _normalize_axes("take", axis, get_aval(a).ndim)[0]
    indices = _index_array(get_aval(a), indices)
    if mode == "clip":  # as NumPy's take: clamped before counting from the end
        n = get_aval(a).shape[axis]
        indices, mode = numpy_clip(indices, 0, max(n - 1, 0)), "promise_in_bounds"
    return read_with_mode(a, (slice(None),) * axis + (indices,), mode, fill_value)


@numpy_function
def numpy_take_along_axis(arr, indices, axis=-1, mode=None, fill_value=None):
    """``arr`` read at ``indices`` along ``axis``, the other axes matched."""
    allowed = ("fill", "drop", "clip", "promise_in_bounds")
    mode = _check_take_mode("take_along_axis", mode, allowed)
    arr = _as_input(arr, "take_along_axis")
    aval = get_aval(arr)
    indices = _index_array(aval, indices)
    if axis is None:
        arr, indices, axis = reshape(arr, (-1,)), reshape(indices, (-1,)), 0
        aval = get_aval(arr)
    idx_aval = get_aval(indices)
    axis = _normalize_axes("take_along_axis", axis, aval.ndim)[0]
    if idx_aval.ndim != aval.ndim:
        raise TypeError(
            f"take_along_axis: indices {idx_aval.str_short()} must have as many "
            f"axes as the array {aval.str_short()}"
        )
    others = [
        tuple(1 if d == axis else n for d, n in enumerate(a.shape))
        for a in (aval, idx_aval)
    ]
    shape = list(np.broadcast_shapes(*others))  # the other axes must match
    n, k = aval.shape[axis], idx_aval.shape[axis]
    arr = broadcast_to(arr, tuple(shape[:axis] + [n] + shape[axis + 1 :]))
    indices = broadcast_to(indices, tuple(shape[:axis] + [k] + shape[axis + 1 :]))
    # the other axes first and paired (batch_dims): no positions to build
    perm = [d for d in range(aval.ndim) if d != axis] + [axis]
    arr, indices = permute(arr, perm), permute(_wrap_negative(indices, n), perm)
    positions = numpy_clip(indices, 0, max(n - 1, 0)) if mode == "clip" else indices
    out = gather(arr, positions, batch_dims=aval.ndim - 1)
    if mode in ("fill", "drop"):
        fill = _fill_value(aval.dtype) if fill_value is None else fill_value
        out = select(in_bounds((n,), [indices]), out, full_of(get_aval(out), fill))
    return permute(out, inverse_perm(perm))


@numpy_function
def numpy_split(ary, indices_or_sections, axis: int = 0) -> list:
    """``ary`` cut along ``axis``: into equal sections, or at the given indices."""
    ary = _as_input(ary, "split")
    aval = get_aval(ary)
    axis = _normalize_axes("split", axis, aval.ndim)[0]
    n = aval.shape[axis]
    if isinstance(indices_or_sections, (int, np.integer)):
        sections = int(indices_or_sections)
        if sections <= 0 or n % sections:
            raise ValueError(
                f"split: array split does not result in an equal division: "
                f"{aval.str_short()} has {n} elements along axis {axis}, not a "
                f"multiple of {sections}"
            )
        cuts = [n // sections * k for k in range(1, sections)]
    else:
        cuts = [int(c) for c in indices_or_sections]
    bounds = [0, *(min(max(c if c >= 0 else c + n, 0), n) for c in cuts), n]
    pieces = []
    for lo, hi in zip(bounds[:-1], bounds[1:]):
        start = [0] * aval.ndim
        limit = list(aval.shape)
        start[axis], limit[axis] = lo, max(lo, hi)
        pieces.append(lax_slice(ary, start, limit))
    return pieces


def _arg_extreme(name: str, reduce: Callable) -> Callable:
    def fn(a, axis=None, keepdims=False) -> ArrayLike:
        a = _as_input(a, name)
        if axis is None:
            flat = _arg_extreme(name, reduce)(reshape(a, (-1,)), 0)
            if keepdims:
                return reshape(flat, (1,) * get_aval(a).ndim)
            return flat
        if get_aval(a).dtype == np.bool_:
            a = convert_element_type(a, np.int64)
        aval = get_aval(a)
        axis = _normalize_axes(name, axis, aval.ndim)[0]
        n = aval.shape[axis]
        if n == 0:
            raise ValueError(
                f"{name}: an empty axis {axis} of {aval.str_short()} has no {name}"
            )
        best = broadcast(reduce(a, axis), aval.shape, (axis,))
        hit = equal(a, best)
        if aval.dtype.kind == "f":  # the first NaN wins, as in NumPy and JAX
            hit = select(hit, hit, not_equal(a, a))
        others = tuple(d for d in range(aval.ndim) if d != axis)
        positions = broadcast(np.arange(n, dtype=np.int64), aval.shape, others)
        candidates = select(
            hit, positions, full_of(ShapedArray(aval.shape, np.int64), n)
        )
        out = neg(reduce_max(neg(candidates), axis))
        return _keep_dims(out, a, axis, keepdims)

    fn.__name__ = f"numpy_{name}"
    return fn


def _reduce_min(x, axis):
    if get_aval(x).dtype.kind == "f":
        return neg(reduce_max(neg(x), axis))
    return numpy_min(x, axis)


numpy_argmax = numpy_function(_arg_extreme("argmax", reduce_max))
numpy_argmin = numpy_function(_arg_extreme("argmin", _reduce_min))

for _name, _fn in {
    "slice": lax_slice,
    "pad": pad,
    "dynamic_slice": dynamic_slice,
    "dynamic_update_slice": dynamic_update_slice,
    "gather": gather,
    "scatter_add": scatter_add,
    "scatter": scatter,
    "scatter_mul": scatter_mul,
    "scatter_min": scatter_min,
    "scatter_max": scatter_max,
}.items():
    setattr(lax_namespace, _name, _fn)


# %% [markdown]
# A cross-entropy loss picks each example's target log-probability with
# `take_along_axis`; its gradient scatters into the positions it read, and
# matches JAX's:


# %%
def cross_entropy(logits, labels, xnp=anp):  # xnp: autodidax.numpy or jax.numpy
    logp = logits - xnp.max(logits, axis=1, keepdims=True)
    logp = logp - xnp.log(xnp.sum(xnp.exp(logp), axis=1, keepdims=True))
    return -xnp.mean(xnp.take_along_axis(logp, labels[:, None], axis=1))


logits = np.random.default_rng(0).normal(size=(4, 5))
labels = np.array([0, 3, 3, 1])
print(jit(grad(cross_entropy))(logits, labels))
with jax.enable_x64(True):
    print(jax.jit(jax.grad(lambda z, y: cross_entropy(z, y, jnp)))(logits, labels))


# %% [markdown]
# ## Everything composes
#
# Indexing inside `cond`, under `vmap` and to second order, next to JAX: a
# Python loop over a traced array of tokens (iteration is indexing now) reads
# rows of a table at traced positions, batched over tables.


# %%
def pick_rows(table, tokens, xnp=anp, cond=cond):
    total = 0.0
    for t in tokens:  # t: a traced scalar, so table[t] is a dynamic_slice
        row = table[t]
        total = total + xnp.sum(row * row[0])
    first = table[tokens[0]]
    return total + cond(total > 0.0, lambda r: r[-1], lambda r: -r[1:].sum(), first)


tables = np.random.default_rng(1).normal(size=(2, 5, 3))
tokens = np.array([1, 4, 1])  # the lookup's tokens again
ours = jit(vmap(jacfwd(grad(pick_rows)), (0, None)))(tables, tokens)
with jax.enable_x64(True):
    jax_pick_rows = lambda t, i: pick_rows(t, i, jnp, jax.lax.cond)  # noqa: E731
    theirs = jax.vmap(jax.jacfwd(jax.grad(jax_pick_rows)), (0, None))(tables, tokens)
print(ours.shape, np.abs(np.asarray(ours) - np.asarray(theirs)).max())

# %% [markdown]
# ## Summary
#
# - A slice is linear: its transpose pads the cotangent with zeros (`pad`,
#   whose transpose is a slice again). A block at a traced start is
#   `dynamic_slice`, transposed into a `dynamic_update_slice` of zeros.
# - `gather(x, i0, i1, ...)` reads `x[i0[p], i1[p], ...]` for every position
#   `p`; `scatter-add` adds windows at such positions, and `scatter` writes them.
#   A gather's transpose is a scatter-add, and a scatter-add's is a gather: the
#   gradient of an embedding lookup adds into only the rows that were read.
# - Batching a gather never loops: a batched array gets a window axis, batched
#   indices get one more index axis, and both get a paired *batch dimension*.
# - `x[idx]` parses NumPy's index language into one slice, one dynamic slice,
#   or a slice and one gather (with a transpose on each side when axes taken
#   whole become its window), plus a reshape;
#   `x.at[idx].set/add/multiply/min/max` write with one scatter at the
#   positions a gather would read.
# - Out of range, reads clamp and writes drop, as in JAX; a read's gradient
#   there is dropped too, unless `mode="clip"` clamps the indices first.
#
# ## Exercises
#
# **1. A one-hot lookup, counted.** Write the embedding lookup of this chapter
# as a product with a one-hot matrix, check that its gradient agrees with the
# gather's, and print the jaxprs of both backward passes (the function `vjp`
# returns): which one does work proportional to the vocabulary for each token?

# %% tags=["hide-input"]
# @title A solution
one_hot = (tokens[:, None] == np.arange(table.shape[0])).astype(np.float64)


def one_hot_loss(table):
    rows = one_hot @ table  # (tokens, vocabulary) x (vocabulary, dimension)
    return reduce_sum(rows * rows)


print(np.allclose(grad(one_hot_loss)(table), grad(lookup_loss)(table, tokens)))
# The one-hot backward pass is a dot_general of the cotangent with the
# (tokens, vocabulary) one-hot matrix: tokens x vocabulary x dimension
# multiply-adds. The gather's is a scatter-add of tokens x dimension numbers.
for loss in [one_hot_loss, lambda table: lookup_loss(table, tokens)]:
    _, backward = vjp(loss, table)
    print(make_jaxpr(backward, f64())[0])


# %% [markdown]
# **2. `x.at[i].multiply` without `scatter-mul`.** Write `at_multiply(x, i, v)`,
# which multiplies the elements at integer positions `i` by `v` (accumulating
# over repeated positions), with `scatter_add`, `exp`, `log` and one
# multiplication only, for
# positive `v`. Check it against `x.at[i].multiply(v)`, ours and JAX's, with a
# repeated index.


# %% tags=["hide-input"]
# @title A solution
def at_multiply(x, i, v):
    # A product of positive factors is exp of a sum of logs: a scatter-add.
    factors = anp.exp(scatter_add(np.zeros(x.shape), anp.log(v), i))
    return x * factors


xs, pos, vals = np.arange(1.0, 5.0), np.array([0, 2, 0]), np.array([2.0, 3.0, 5.0])
print(at_multiply(xs, pos, vals))
print(jit(lambda x: x.at[pos].multiply(vals))(xs))
with jax.enable_x64(True):
    print(jnp.asarray(xs).at[pos].multiply(vals))

# %% [markdown]
# ## Reference notes
#
# The rest of the page is for reference: the errors, two details of the
# rules above, and how JAX's indexing differs from ours.
#
# ### Mistakes indexing catches
#
# The exception types are JAX's: an index of the wrong type is a `TypeError`,
# a step of 0 a `ValueError`, and an index that does not fit the array (too
# many indices, a mask of the wrong shape) an `IndexError`; ours is
# `IndexingError`, an `IndexError` that is also a `TypeError`, the type of the
# book's other errors about a bad argument. The messages name the array's
# type, in JAX's words where JAX has them.

# %%
show_error(jit(lambda x: x[1.0]), x)  # a float index
show_error(jit(lambda x: x[0, 1, 2]), x)  # three indices for two axes
show_error(jit(lambda x: x[::0]), x)  # a slice step of 0
show_error(jit(lambda x: x[x > 3.0]), x)  # a traced boolean mask
show_error(jit(lambda x: x.at[0].set(np.ones((2, 4)))), x)  # an update too big

# %% [markdown]
# ### Negative starts are wrapped inside the primitive
#
# The transpose of a `dynamic_slice` calls `dynamic_update_slice` with the very starts the read
# got, and must find the same block. So the wrapping of a negative start is
# part of the primitive (its evaluation and its lowering), not of the function
# that binds it: had `dynamic_slice` wrapped before binding, the transpose,
# calling `dynamic_update_slice`, would wrap a second time. A start of −10 on
# an axis of 6 is −4 after one wrap, which clamps to 0; after two it is 2.
# (JAX's `lax.dynamic_slice` wraps before binding, and its transpose binds the
# primitive directly instead of calling the function.)
#
# ### The derivatives of `scatter-mul`, `scatter-min` and `scatter-max`
#
# Where updates $u_1, \dots, u_m$ multiply into `x[p]`, the output is
# $x \, u_1 \cdots u_m$: linear in `x` (its transpose multiplies the
# cotangent by the same updates, a `scatter-mul`), and the tangent of $u_k$
# contributes $x$ times the product of the *other* updates. That product is found
# without dividing by an update that may be 0: per position, a `scatter-mul`
# multiplies the nonzero updates and a `scatter-add` counts the zero ones.
# With no zero, the product of the others is the position's product divided
# by $u_k$; with one zero, it is the product for the zero update and 0 for
# the rest; with two or more, 0. The tangents times those products are added
# per position (a `scatter-add`) and multiplied by $x$. `scatter-min` and
# `scatter-max` are not linear: the tangent follows the value that won, split
# evenly among ties (updates, and `x` if it kept its value), as JAX's does.
#
# ### Where real JAX differs
#
# The folded cell prints JAX's jaxprs for two programs of this chapter, `x[:, i]`
# and the gradient of the embedding lookup (with most params left out):

# %% tags=["hide-input"]
# @title JAX's jaxprs for x[:, i] and for the gradient of a lookup, shortened
import re


def show_jax(f, *args, keep=("mode",)):
    """JAX's jaxpr in float64, each equation's params cut down to ``keep``."""
    with jax.enable_x64(True):  # float64, as ours, in this cell only
        text = jax.make_jaxpr(f)(*args).pretty_print(use_color=False)

    def kept(match):
        lines = [line.strip() for line in match.group(1).splitlines()]
        return "[" + " ".join(ln for ln in lines if ln.split("=")[0] in keep) + "]"

    print(re.sub(r"\[\n(.*?)\n\s*\]", kept, text, flags=re.S))


show_jax(lambda x, i: x[:, i], x, np.array([0, 2]), keep=("dimension_numbers",))
show_jax(jax.grad(jax_loss), table, tokens)

# %% [markdown]
# - **Dimension numbers.** JAX's
#   [`lax.gather`](https://docs.jax.dev/en/latest/_autosummary/jax.lax.gather.html)
#   takes one stacked index array, a `GatherDimensionNumbers` and
#   `slice_sizes`, the fields of StableHLO's gather. A window axis can sit
#   anywhere in the output (`offset_dims=(0,)` above reads `x[:, i]` with no
#   `transpose`), and a window can be larger than one element along an indexed
#   axis, which ours cannot (JAX's batched `dynamic_slice` is a `CLIP`-mode
#   gather of a whole block; ours gathers every position of it).
# - **Modes.** JAX's gather and scatters take a
#   [`GatherScatterMode`](https://docs.jax.dev/en/latest/_autosummary/jax.lax.GatherScatterMode.html)
#   (`CLIP`, `FILL_OR_DROP`, `PROMISE_IN_BOUNDS`, `ONE_HOT`) as a param; ours
#   have one fixed rule each, and the front end clamps or fills around them.
#   The lookup's gradient above shows `PROMISE_IN_BOUNDS` because it is the
#   transpose of `t[i]`'s gather, which reads with that mode; `x.at[i].add(v)`
#   writes with `FILL_OR_DROP`. Asked for explicitly, `"promise_in_bounds"`
#   makes JAX's transpose of a write read the cotangent with clamping, so a
#   dropped update gets its clamped neighbour's cotangent; ours gets 0 (below).
#   JAX's `.at[]` also has `wrap_negative_indices`, its `take` a mode
#   `"wrap"`, and its `lax.dynamic_slice` an `allow_negative_indices`.
# - **Hints.** `unique_indices` and `indices_are_sorted` let XLA pick a faster
#   scatter; JAX's `dynamic_slice` batched over both the array and its starts
#   becomes a gather with both `True` (over the starts alone, both `False`).
#   We have neither. JAX's `scatter-mul` has no derivative with respect to
#   the updates unless `unique_indices=True`; ours has one.
# - **A repeated position in `set`.** One update wins in both. JAX's `jvp` of
#   `scatter` scatters ids so that the tangent takes the primal's winner on
#   any backend; ours scatters the tangents the same way as the primal and
#   relies on updates being applied in one fixed order, which NumPy and XLA on
#   CPU do but XLA does not promise in general.
# - **Index dtypes.** JAX converts the indices to `int32`, or to `int64` if an
#   axis is longer than $2^{31} - 1$ (`int_dtype_for_shape` in
#   `jax/_src/lax/utils.py`), as the `convert_element_type` above shows; we
#   keep the user's integer dtype and convert to 64 bits when lowering.
# - **More primitives.** JAX reverses an axis with `rev` (we gather), drops
#   and adds axes with `squeeze` and `broadcast_in_dim` (we reshape), has
#   `argmax` and `argmin` primitives (we compare and reduce) and a `split`
#   primitive, one equation with every piece's size (we slice), and its `pad`
#   takes the padding value as an operand (ours pads with zeros).
#
# The gradient of writes out of range with each mode, ours next to JAX's
# (positions 9 and −9 are dropped):

# %%
weights = np.arange(1.0, 5.0)


def write_loss(x, v, mode):  # a function of the updates v written at `far`
    return (x.at[far].add(v, mode=mode) * weights).sum()


for mode in [None, "promise_in_bounds"]:
    loss = lambda x, v, mode=mode: write_loss(x, v, mode)  # noqa: E731
    ours = grad(jit(loss), argnums=1)(xs, np.ones(4))
    with jax.enable_x64(True):
        theirs = jax.grad(loss, argnums=1)(jnp.asarray(xs), jnp.ones(4))
    print(f"{mode!s:17} {np.asarray(ours)} {np.asarray(theirs)}")
