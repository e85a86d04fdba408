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
# splitting a fused projection into three is impossible. This chapter adds
# indexing the way JAX has it, as a handful of primitives whose rules carry two
# of the nicest ideas of the book:
#
# - **a read's transpose is a write.** The transpose of taking a slice is
#   padding the cotangent with zeros; the transpose of `gather` (fetching rows
#   at traced positions) is `scatter-add` (adding rows at those positions). So
#   the gradient of an embedding lookup touches only the rows it read.
# - **batching a gather adds a batch dimension to its index map**, instead of
#   looping over examples.
#
# In order: the static `slice` and its transpose `pad`; `dynamic_slice` and
# `dynamic_update_slice`, whose start is known only when the program runs;
# `gather`, `scatter-add` and `scatter`; and the NumPy interface on top: `x[i]`,
# `x[1:3]`, `x[..., None]`, integer-array and boolean-mask indices, `x.at[i].set(v)`,
# `take`, `take_along_axis`, `split`, `argmax`.

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
# linear. Its transpose answers: which input cotangent does a cotangent of the
# slice come from? Every element that was taken gets its cotangent back, every
# other element gets zero: the cotangent, padded with zeros before (`start`),
# after, and between the taken elements (`stride - 1` of them). That is a second
# primitive, `pad`, whose own transpose is again a slice.

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


@slice_p.def_rule("transpose")
def _slice_transpose(cts, x, *, start_indices, limit_indices, strides):
    (ct,) = cts
    taken = get_aval(ct).shape
    end = map(_past_last, start_indices, taken, strides)  # where the taken ones end
    high = [n - e for n, e in zip(x.aval.shape, end)]
    return [pad(ct, start_indices, high, [s - 1 for s in strides])]


@pad_p.def_rule("transpose")
def _pad_transpose(cts, x, *, low, high, interior):
    (ct,) = cts
    steps = [i + 1 for i in interior]
    limits = map(_past_last, low, x.aval.shape, steps)
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


def _past_last(start: int, count: int, step: int) -> int:
    """The position after the last of ``count`` elements taken every ``step``."""
    return start + (count - 1) * step + 1 if count else start


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
#
# The transposes say the same as for `slice`, with traced starts: the cotangent
# of a block read at `start` is that block written into zeros at `start`; and
# for a block written into `x`, `x`'s cotangent is the incoming cotangent with
# the overwritten block zeroed, the block's is the cotangent read at `start`.

# %% tags=["export"]
dynamic_slice_p = Primitive("dynamic_slice")
dynamic_update_slice_p = Primitive("dynamic_update_slice")


def dynamic_slice(x, start_indices, slice_sizes, *, allow_negative_indices=True):
    """The block of ``slice_sizes`` at ``start_indices`` (clamped to fit)."""
    x = _as_input(x, "dynamic_slice")
    starts = check_starts("dynamic_slice", get_aval(x), start_indices)
    if allow_negative_indices:  # as in JAX's lax, -1 is the last position
        starts = [_wrap_negative(s, n) for s, n in zip(starts, get_aval(x).shape)]
    sizes = check_slice_sizes(get_aval(x), slice_sizes)
    return bind(dynamic_slice_p, x, *starts, slice_sizes=sizes)


def dynamic_update_slice(x, update, start_indices, *, allow_negative_indices=True):
    """``x`` with ``update`` written at ``start_indices`` (clamped to fit)."""
    x, update = _as_input(x, "dynamic_update_slice"), _as_input(update, "update")
    check_update_block(get_aval(x), get_aval(update))
    starts = check_starts("dynamic_update_slice", get_aval(x), start_indices)
    if allow_negative_indices:
        starts = [_wrap_negative(s, n) for s, n in zip(starts, get_aval(x).shape)]
    return bind(dynamic_update_slice_p, x, update, *starts)


@dynamic_slice_p.def_rule("transpose")
def _dynamic_slice_transpose(cts, x, *starts, slice_sizes):
    (ct,) = cts
    ct_x = dynamic_update_slice(
        zeros_of(x.aval), ct, starts, allow_negative_indices=False
    )
    return [ct_x] + [None] * len(starts)


@dynamic_update_slice_p.def_rule("transpose")
def _dynamic_update_slice_transpose(cts, x, update, *starts):
    (ct,) = cts
    block = _aval_of(update)
    exact = dict(allow_negative_indices=False)  # starts as the primitive got them
    ct_x = (
        dynamic_update_slice(ct, zeros_of(block), starts, **exact)
        if _is_undef(x)
        else None
    )
    ct_update = (
        dynamic_slice(ct, starts, block.shape, **exact) if _is_undef(update) else None
    )
    return [ct_x, ct_update] + [None] * len(starts)


# %% [markdown]
# `zeros_of(aval)` is an array of zeros made by a `broadcast` of one zero, so
# that under `jit` it is an equation XLA fills in place, not a constant of the
# array's size shipped with every call. The checks, evaluation (clamp, then
# NumPy's slicing), abstract evaluation, `jvp` (the same block of the tangent)
# and lowering (StableHLO's ops of the same names) are folded. Batching is
# after `gather`, which it needs.


# %% tags=["export", "hide-input"]
# @title dynamic_slice, dynamic_update_slice: checks, evaluation, types, jvp, lowering
def zeros_of(aval: ShapedArray) -> ArrayLike:
    """Zeros of type ``aval``: a broadcast of one zero (an equation under jit)."""
    zero = np.zeros((), aval.dtype)
    return broadcast(zero, aval.shape, tuple(range(aval.ndim))) if aval.ndim else zero


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
    starts = [int(np.asarray(s)) for s in starts]
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


def _i64_scalars(starts: Sequence[ir.Value], avals: Sequence[ShapedArray]) -> list:
    """The start indices as i64 scalars: StableHLO wants one integer type."""
    i64 = ir_type(ShapedArray((), np.int64))
    return [
        s if a.dtype == np.int64 else hlo.convert(i64, s) for s, a in zip(starts, avals)
    ]


@dynamic_slice_p.def_rule("lower")
def _dynamic_slice_lower(ctx, avals_in, avals_out, x, *starts, slice_sizes):
    return [hlo.dynamic_slice(x, _i64_scalars(starts, avals_in[1:]), slice_sizes)]


@dynamic_update_slice_p.def_rule("lower")
def _dynamic_update_slice_lower(ctx, avals_in, avals_out, x, update, *starts):
    starts = _i64_scalars(starts, avals_in[2:])
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
# (`x.at[i].set(v)`); where a position repeats, one of the updates wins.
#
# The evaluation rules are NumPy's advanced indexing and `np.add.at`, which
# accumulates over repeated indices where `out[idx] += u` would not:

# %% tags=["export"]
gather_p = Primitive("gather")
scatter_add_p = Primitive("scatter-add")
scatter_p = Primitive("scatter")


def gather(x: ArrayLike, *indices: ArrayLike, batch_dims: int = 0) -> ArrayLike:
    """``x[i0, i1, ...]`` on leading axes (after ``batch_dims`` paired axes)."""
    x, indices = check_gather("gather", x, indices, batch_dims)
    return bind(gather_p, x, *indices, batch_dims=batch_dims)


def scatter_add(x, updates, *indices, batch_dims: int = 0, mode="drop") -> ArrayLike:
    """``x`` with ``updates`` added at ``x[i0, i1, ...]`` (repeats accumulate;
    positions out of range dropped, or clamped with ``mode="clip"``)."""
    x, updates, indices = check_scatter("scatter_add", x, updates, indices, batch_dims)
    mode = check_scatter_mode(mode)
    return bind(scatter_add_p, x, updates, *indices, batch_dims=batch_dims, mode=mode)


def scatter(x, updates, *indices, batch_dims: int = 0) -> ArrayLike:
    """``x`` with ``updates`` written at ``x[i0, i1, ...]``."""
    x, updates, indices = check_scatter("scatter", x, updates, indices, batch_dims)
    return bind(scatter_p, x, updates, *indices, batch_dims=batch_dims)


@gather_p.def_rule("impl")
def _gather_impl(x, *indices, batch_dims):
    return [np.asarray(x)[numpy_index(np.shape(x), indices, batch_dims, clamp=True)]]


@scatter_add_p.def_rule("impl")
def _scatter_add_impl(x, updates, *indices, batch_dims, mode):
    out = np.array(x, copy=True)
    if mode == "clip":
        indices = numpy_index(out.shape, indices, batch_dims, clamp=True)[batch_dims:]
    inside, index = in_bounds_index(out.shape, indices, batch_dims)
    np.add.at(out, index, np.asarray(updates)[inside])
    return [out]


# %% [markdown]
# `numpy_index` turns the index arrays into NumPy's index tuple (an `arange`
# for each batch axis, the index arrays clamped), and `in_bounds_index` keeps
# only the positions inside the array. They are folded with the checks (index
# arrays of one integer type and shape, the paired axes of equal sizes, an
# `updates` array shaped like the gather would read), abstract evaluation, and
# `scatter`'s evaluation (an assignment).


# %% tags=["export", "hide-input"]
# @title gather and the scatters: index tuples, checks, abstract evaluation
def numpy_index(shape, indices, batch_dims: int, clamp: bool) -> tuple:
    """NumPy's index tuple for ``x[batch..., i0, i1, ...]``."""
    idx_shape = np.shape(indices[0])
    batch = [
        np.arange(idx_shape[d]).reshape(
            [-1 if e == d else 1 for e in range(len(idx_shape))]
        )
        for d in range(batch_dims)
    ]
    indices = [np.asarray(i) for i in indices]
    if clamp:
        sizes = shape[batch_dims:]
        indices = [np.clip(i, 0, n - 1).astype(i.dtype) for i, n in zip(indices, sizes)]
    return (*batch, *indices)


def in_bounds_index(shape, indices, batch_dims: int) -> tuple:
    """Which index positions fall inside the array, and their index tuple."""
    inside = np.ones(np.shape(indices[0]), bool)
    for i, n in zip(indices, shape[batch_dims:]):
        i = np.asarray(i)
        inside &= (i >= 0) & (i < n)
    index = numpy_index(shape, indices, batch_dims, clamp=False)
    return inside, tuple(np.broadcast_to(a, inside.shape)[inside] for a in index)


@scatter_p.def_rule("impl")
def _scatter_impl(x, updates, *indices, batch_dims):
    out = np.array(x, copy=True)
    inside, index = in_bounds_index(out.shape, indices, batch_dims)
    out[index] = np.asarray(updates)[inside]  # a repeated position: the last wins
    return [out]


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


def check_scatter_mode(mode: Any) -> str:
    if mode not in ("drop", "clip"):
        raise ValueError(f"scatter_add: mode must be 'drop' or 'clip', got {mode!r}")
    return mode


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


def _scatter_abstract_eval(name: str) -> Callable:
    def rule(x, updates, *indices, batch_dims, mode="drop"):
        _check_scatter_types(name, x, updates, indices, batch_dims)
        if name == "scatter_add" and x.dtype.kind not in "iuf":
            raise TypeError(
                f"scatter_add: expected a numeric array, got {x.str_short()}"
            )
        return [x]

    return rule


for _prim, _name in [(scatter_add_p, "scatter_add"), (scatter_p, "scatter")]:
    _prim.def_rule("abstract_eval")(_scatter_abstract_eval(_name))


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
    (ct,) = cts
    zeros = zeros_of(x.aval)
    # mode="clip": add where the gather read, at the clamped positions
    ct_x = scatter_add(zeros, ct, *indices, batch_dims=batch_dims, mode="clip")
    return [ct_x] + [None] * len(indices)


@scatter_add_p.def_rule("transpose")
def _scatter_add_transpose(cts, x, updates, *indices, batch_dims, mode):
    (ct,) = cts
    ct_updates = None
    if _is_undef(updates):
        ct_updates = gather(ct, *indices, batch_dims=batch_dims)
        if mode == "drop":  # a dropped update had no effect: zero cotangent
            ct_updates = zero_where_dropped(ct_updates, ct, indices, batch_dims)
    return [ct if _is_undef(x) else None, ct_updates] + [None] * len(indices)


# %% [markdown]
# The two lines about `mode` only matter for indices out of range, the subject
# of the next section; with indices in range, they change nothing. The
# forward-mode rules are one line each
# (the same gather or scatter of the tangents), and `scatter`'s transpose
# differs from `scatter-add`'s in two ways: the cotangent of `x` is zero where
# an update overwrote it, and only the update that won a repeated position gets
# a cotangent.


# %% tags=["export", "hide-input"]
# @title Bounds in the transposes; jvp rules; scatter's transpose
def in_bounds(shape, indices, batch_dims) -> ArrayLike:
    """A boolean array over the index positions: inside the array or not."""
    inside = True
    for i, n in zip(indices, shape[batch_dims:]):
        here = select(i >= 0, i < n, i >= 0)  # i >= 0 and i < n
        inside = here if inside is True else select(here, inside, here)
    return inside


def zero_where_dropped(values, ct, indices, batch_dims) -> ArrayLike:
    """``values`` (one window per index position), zero where the index was
    outside ``ct``'s shape (a scatter dropped that update)."""
    inside = in_bounds(get_aval(ct).shape, indices, batch_dims)
    aval = get_aval(values)
    idx_ndim = get_aval(indices[0]).ndim
    window = tuple(range(idx_ndim, aval.ndim))
    inside = broadcast(inside, aval.shape, window) if window else inside
    return select(inside, values, zeros_of(aval))


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


@scatter_p.def_rule("transpose")
def _scatter_transpose(cts, x, updates, *indices, batch_dims):
    (ct,) = cts
    up_aval = _aval_of(updates)
    ct_x = ct_updates = None
    if _is_undef(x):  # overwritten positions had no influence on the output
        ct_x = scatter(ct, zeros_of(up_aval), *indices, batch_dims=batch_dims)
    if _is_undef(updates):
        ct_updates = gather(ct, *indices, batch_dims=batch_dims)
        ct_updates = zero_where_dropped(ct_updates, ct, indices, batch_dims)
        won = update_won(get_aval(ct).shape, indices, batch_dims)
        idx_ndim = get_aval(indices[0]).ndim
        window = tuple(range(idx_ndim, up_aval.ndim))
        won = broadcast(won, up_aval.shape, window) if window else won
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
# ### Indices out of range
#
# An index outside its axis cannot fail at run time (a compiled program has no
# exceptions), so each primitive has a rule, XLA's: a gather *clamps* the index
# into the axis and reads the nearest row, and a scatter *drops* an update
# whose position is outside `x`. The transposes follow from those rules. A
# clamped read took its row from the clamped position, so the gather's
# transpose adds its cotangent there: a `scatter-add` with `mode="clip"`,
# which clamps instead of dropping. A dropped update had no effect on the
# output, so its cotangent is zero (`zero_where_dropped`, folded above).
#
# ### Batching adds a batch dimension to the index map
#
# `vmap` of a gather has three cases, and none of them loops.
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
# unbatched starts put the batch axis first and start it at 0; with batched
# starts, each example reads a block at its own position, which is a gather (or
# a scatter) of that block's positions.


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


_scatter_vmap(scatter_add_p)
_scatter_vmap(scatter_p)


def block_positions(axis_size, shape, starts, b_starts, sizes) -> list:
    """Per example, the index arrays of a block of ``sizes`` at ``starts``
    (clamped to fit ``shape``): one array of shape (batch, *sizes) per axis."""
    out_shape = (axis_size, *sizes)
    positions = []
    for a, (s, b, n, k) in enumerate(zip(starts, b_starts, shape, sizes)):
        s = move_batch_axis(axis_size, b, 0, s)  # (batch,)
        s = numpy_clip(s, 0, n - k)
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
# A batch of embedding tables read at a batch of token arrays is one gather
# with a batch dimension; the same tokens in every table, one gather whose
# window holds the batch axis:

# %%
print(make_jaxpr(vmap(gather), f64(4, 5, 3), i64(4, 2))[0])
print(make_jaxpr(vmap(gather, (0, None)), f64(4, 5, 3), i64(2))[0])


# %% [markdown]
# ### Lowering
#
# The three primitives become `stablehlo.gather` and `stablehlo.scatter`, whose
# dimension numbers describe our form: the index arrays are stacked along a new
# last axis (the "index vector"), the indexed axes of `x` are *collapsed* (read
# with size 1 and dropped), the others are *offset* (window) axes, and the
# paired axes are *batching* dimensions. A scatter carries a small region that
# combines the old value with the update: `add`, or return the update.


# %% tags=["export", "hide-input"]
# @title Lowering to stablehlo.gather and stablehlo.scatter
def _stacked_indices(indices, avals, clamp_to=None) -> ir.Value:
    """One i64 index array with the index vector as its last axis (each
    index clamped into [0, size) if the sizes ``clamp_to`` are given)."""
    shape = avals[0].shape
    column = ir_type(ShapedArray((*shape, 1), np.int64))
    i64 = ShapedArray(shape, np.int64)
    columns = []
    for k, (i, a) in enumerate(zip(indices, avals)):
        i = i if a.dtype == np.int64 else hlo.convert(ir_type(i64), i)
        if clamp_to is not None:
            top = ir_constant(max(clamp_to[k] - 1, 0), i64)
            i = hlo.clamp(ir_constant(0, i64), i, top)
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
    def rule(ctx, avals_in, avals_out, x, updates, *indices, batch_dims, mode="drop"):
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
        sizes = x_aval.shape[nb:] if mode == "clip" else None
        stacked = _stacked_indices(indices, idx_avals, sizes)
        op = hlo.ScatterOp([ir_type(avals_out[0])], [x], stacked, [updates], dims)
        scalar = ir_type(ShapedArray((), x_aval.dtype))
        body = op.regions[0].blocks.append(scalar, scalar)
        with ir.InsertionPoint(body):
            old, new = body.arguments
            hlo.ReturnOp([new if combine is None else combine(old, new)])
        return [op.results[0]]


_lower_scatter(scatter_add_p, hlo.add)
_lower_scatter(scatter_p, None)

# %%
print(jit(grad(lookup_loss))(table, tokens))
with jax.enable_x64(True):
    jax_loss = lambda t, i: jnp.sum(t[i] ** 2)  # noqa: E731
    print(jax.jit(jax.grad(jax_loss))(table, tokens))


# %% [markdown]
# ## The NumPy interface: `x[idx]` and `x.at[idx]`
#
# NumPy's indexing is a small language: ints, slices, `None` (a new axis of
# size 1), `...` (as many `:` as needed), integer arrays and boolean masks, in
# any mix, with rules for where the axes of the index arrays go. Ours turns an
# index into as few of our primitives as it can:
#
# - only ints, slices with a positive step, `None` and `...`: one `slice` and a
#   `reshape` (an int `i` is the slice `i:i+1`, whose axis the reshape drops);
# - the same with traced scalar integers among them: one `dynamic_slice` and a
#   `reshape`;
# - anything else (integer arrays, boolean masks, negative steps): one
#   `gather` whose index arrays give, for every element of the result, its
#   position along each indexed axis of `x`; the trailing axes of `x` that the
#   index takes whole stay a window. A boolean mask becomes integer arrays
#   with `np.nonzero`, which only works when the mask is known while tracing:
#   the shape of the result depends on it.
#
# Negative indices count from the end, as in NumPy; an index out of range is
# clamped for reading, as JAX's indexing does. The parsing is folded: it
# expands `...`, checks each entry, and builds the plan.


# %% tags=["export"]
def getitem(x: ArrayLike, idx: Any) -> ArrayLike:
    """``x[idx]`` with NumPy's indexing rules (JAX's bounds: reads clamp)."""
    plan = index_plan(get_aval(x), idx)
    if plan.kind == "empty":  # nothing to read
        return zeros_of(ShapedArray(plan.shape, get_aval(x).dtype))
    if plan.kind == "slice":
        x = lax_slice(x, plan.starts, plan.limits, plan.strides)
    elif plan.kind == "dynamic_slice":
        x = dynamic_slice(x, plan.starts, plan.sizes)
    else:
        x = gather(x, *plan.positions)
    return reshape(x, plan.shape)


# %% [markdown]
# Writing goes through `x.at[idx]`, since JAX's arrays are immutable:
# `x.at[idx].set(v)` returns a new array with `v` written where `x[idx]` would
# read. The update is broadcast to the shape `x[idx]` has and converted to
# `x`'s dtype, and then one `scatter` or `scatter-add` writes it at the
# positions a gather plan would read, with JAX's bounds: updates out of range
# are dropped.


# %% tags=["export"]
class IndexUpdateRef(NamedTuple):
    """``x.at[idx]``: what ``set``, ``add`` and ``get`` act on."""

    x: ArrayLike
    idx: Any

    def get(self) -> ArrayLike:
        return getitem(self.x, self.idx)

    def set(self, values: ArrayLike) -> ArrayLike:
        return self._write(scatter, values)

    def add(self, values: ArrayLike) -> ArrayLike:
        return self._write(scatter_add, values)

    def _write(self, scatter_fn: Callable, values: ArrayLike) -> ArrayLike:
        plan = index_plan(get_aval(self.x), self.idx, for_update=True)
        values = check_update_values(self.x, plan.shape, values)  # broadcast, cast
        if plan.kind == "empty":  # nothing to write
            return self.x
        values = reshape(values, plan.gather_shape)
        return scatter_fn(self.x, values, *plan.positions)


# %% [markdown]
# The folded cell has the parser, `index_plan`; it returns the kind of plan,
# the params of the slice, the positions for a gather or a scatter, and the
# shapes, with the errors a learner meets first: a float index, too many
# indices, a step of 0, a traced boolean mask.


# %% tags=["export", "hide-input"]
# @title index_plan: NumPy's index language, parsed into a slice or a gather
class IndexingError(IndexError, TypeError):
    """An index that does not fit the array (an IndexError, as in NumPy)."""


class NonConcreteBooleanIndexError(IndexingError):
    """A boolean mask index whose value is not known while tracing."""


class IndexPlan(NamedTuple):
    kind: str  # "slice", "dynamic_slice", "gather" or "empty"
    shape: tuple  # the shape of x[idx]
    starts: Any = None  # slice, dynamic_slice
    limits: Any = None  # slice
    strides: Any = None  # slice
    sizes: Any = None  # dynamic_slice
    positions: Any = None  # gather: one index array per indexed leading axis
    gather_shape: Any = None  # the shape the gather reads (x[idx] before reshaping)


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
            f"Too many indices: {aval.str_short()} has {aval.ndim} axes, but "
            f"{used} were indexed by {_short_repr(idx)}"
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
                        f"indexing {aval.str_short()}: a boolean mask of shape "
                        f"{mask_shape} does not match the axes it indexes, "
                        f"{aval.shape[axis : axis + len(mask_shape)]}"
                    )
                for a in np.nonzero(array):
                    entries.append(("array", axis, a))
                    axis += 1
            else:
                entries.append(("array", axis, array))
                axis += 1
    return entries


def _axes_used(aval: ShapedArray, item: Any) -> int:
    if item is None:
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
    if not for_update and simple and all(get_aval(e[2]).ndim == 0 for e in arrays):
        return _slicing_plan(aval, entries)
    return _gather_plan(aval, entries)


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
        return IndexPlan(
            "slice", tuple(shape), tuple(starts), tuple(limits), tuple(strides)
        )
    if any(s != 1 for s in strides):
        return _gather_plan(aval, entries)
    sizes = tuple(1 if hi is None else hi - lo for lo, hi in zip(starts, limits))
    starts = [s if isinstance(s, Tracer) else np.asarray(s, np.int64) for s in starts]
    return IndexPlan("dynamic_slice", tuple(shape), starts=starts, sizes=sizes)


def _gather_plan(aval: ShapedArray, entries: list) -> IndexPlan:
    """Everything else: the position of each element of x[idx] along each
    indexed axis, as index arrays shaped like the result."""
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
    shape, where = [], {}
    for item in layout:
        where[item] = len(shape)
        if item[0] == "array":
            shape.extend(adv_shape)
        elif item[0] == "new":
            shape.append(1)
        else:
            shape.append(next(e[2][2] for e in entries if e[:2] == item))
    # trailing axes of x taken whole, last in the result too: the window
    window = 0
    for axis in reversed(range(1, aval.ndim)):  # axis 0 is always indexed
        e = next(e for e in entries if e[0] != "new" and e[1] == axis)
        if (
            e[0] != "slice"
            or e[2] != (0, 1, aval.shape[axis])
            or where[("slice", axis)] != len(shape) - (aval.ndim - axis)
        ):
            break
        window += 1
    positions_shape = tuple(shape[: len(shape) - window])
    positions = []
    for axis in range(aval.ndim - window):
        e = next(e for e in entries if e[0] != "new" and e[1] == axis)
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
    gather_shape = (*positions_shape, *aval.shape[aval.ndim - window :])
    if 0 in gather_shape:  # an empty result: nothing to gather
        return IndexPlan("empty", tuple(shape), gather_shape=gather_shape)
    return IndexPlan(
        "gather", tuple(shape), positions=positions, gather_shape=gather_shape
    )


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


# %% [markdown]
# ## `take`, `take_along_axis`, `split`, `argmax`
#
# The rest of the NumPy interface is built from these pieces, and folded:
# `take(a, indices, axis)` is `a[:, ..., indices]` along `axis` and
# `take_along_axis(a, indices, axis)` reads one element per position of
# `indices`, both with JAX's default mode, which *fills* out-of-range positions
# (NaN for floats) instead of clamping; `split` is slices; `argmax` and
# `argmin` find the first position of the maximum (or of a NaN, as JAX does),
# with comparisons and a `reduce_max`. `autodidax.lax` gets `slice`,
# `dynamic_slice`, `dynamic_update_slice`, `gather`, `scatter_add`, `scatter`
# and `pad`.


# %% tags=["export", "hide-input"]
# @title take, take_along_axis, split, argmax, argmin; the lax names
def _fill_value(dtype: np.dtype) -> Any:
    """JAX's fill for out-of-range reads: NaN, the lowest int, or True."""
    if dtype.kind == "f":
        return np.nan
    if dtype.kind == "b":
        return True
    return np.iinfo(dtype).min if dtype.kind == "i" else np.iinfo(dtype).max


def _check_mode(name: str, mode: Any) -> str:
    if mode not in (None, "fill", "clip"):
        raise ValueError(f"{name}: mode must be None, 'fill' or 'clip', got {mode!r}")
    return mode or "fill"


def _fill_outside(out, indices, n, out_axes_of_indices, fill_value) -> ArrayLike:
    """``out`` with ``fill_value`` where ``indices`` (wrapped) fell outside [0, n)."""
    inside = in_bounds((n,), [_wrap_negative(indices, n)], 0)
    aval = get_aval(out)
    new_axes = tuple(d for d in range(aval.ndim) if d not in out_axes_of_indices)
    inside = broadcast_to(inside, tuple(aval.shape[d] for d in out_axes_of_indices))
    inside = broadcast(inside, aval.shape, new_axes) if new_axes else inside
    fill = _fill_value(aval.dtype) if fill_value is None else fill_value
    return select(inside, out, full_of(aval, fill))


def full_of(aval: ShapedArray, value: Any) -> ArrayLike:
    """An array of type ``aval`` holding ``value``: a broadcast of one number."""
    one = np.asarray(value).astype(aval.dtype)
    return broadcast(one, aval.shape, tuple(range(aval.ndim))) if aval.ndim else one


@numpy_function
def numpy_take(a, indices, axis=None, mode=None, fill_value=None) -> ArrayLike:
    """Elements (or slices along ``axis``) of ``a`` at ``indices``."""
    mode = _check_mode("take", mode)
    a = _as_input(a, "take")
    if axis is None:
        a, axis = reshape(a, (-1,)), 0
    ndim = get_aval(a).ndim
    axis = _normalize_axes("take", axis, ndim)[0]
    indices = _index_array(get_aval(a), indices)
    n = get_aval(a).shape[axis]
    if mode == "clip":
        indices = numpy_clip(indices, 0, max(n - 1, 0))
    out = getitem(a, (slice(None),) * axis + (indices,))
    if mode == "clip":
        return out
    idx_axes = tuple(range(axis, axis + get_aval(indices).ndim))
    return _fill_outside(out, indices, n, idx_axes, fill_value)


@numpy_function
def numpy_take_along_axis(arr, indices, axis=-1, mode=None, fill_value=None):
    """``arr`` read at ``indices`` along ``axis``, the other axes matched."""
    mode = _check_mode("take_along_axis", mode)
    arr = _as_input(arr, "take_along_axis")
    aval = get_aval(arr)
    indices = _index_array(aval, indices)
    idx_aval = get_aval(indices)
    if axis is None:
        arr, aval, axis = reshape(arr, (-1,)), ShapedArray((aval.size,), aval.dtype), 0
        indices = reshape(indices, (-1,))
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
    shape[axis] = idx_aval.shape[axis]
    shape, n = tuple(shape), aval.shape[axis]
    positions = []
    for d in range(aval.ndim):
        if d == axis:
            if mode == "clip":
                p = numpy_clip(indices, 0, max(n - 1, 0))
            else:
                p = _wrap_negative(indices, n)
        else:
            p = np.arange(shape[d]).reshape(
                [-1 if e == d else 1 for e in range(len(shape))]
            )
        positions.append(broadcast_to(p, shape))
    out = gather(arr, *positions)
    if mode == "clip":
        return out
    return _fill_outside(
        out, broadcast_to(indices, shape), n, tuple(range(len(shape))), fill_value
    )


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
ours = jit(vmap(jacfwd(grad(pick_rows)), (0, None)))(tables, tokens)
with jax.enable_x64(True):
    jax_pick_rows = lambda t, i: pick_rows(t, i, jnp, jax.lax.cond)  # noqa: E731
    theirs = jax.vmap(jax.jacfwd(jax.grad(jax_pick_rows)), (0, None))(tables, tokens)
print(ours.shape, np.abs(np.asarray(ours) - np.asarray(theirs)).max())

# %% [markdown]
# ## Mistakes indexing catches

# %%
show_error(jit(lambda x: x[1.0]), x)  # a float index
show_error(jit(lambda x: x[0, 1, 2]), x)  # three indices for two axes
show_error(jit(lambda x: x[::0]), x)  # a slice step of 0
show_error(jit(lambda x: x[x > 3.0]), x)  # a traced boolean mask
show_error(jit(lambda x: x.at[0].set(np.ones((2, 4)))), x)  # an update too big


# %% [markdown]
# ## Where real JAX differs
#
# The folded cell prints JAX's jaxprs for a traced row index and for the
# gradient of an embedding lookup:


# %% tags=["hide-input"]
# @title JAX's jaxprs: a traced row index, and the gradient of a lookup
def show_jax(f, *args):
    with jax.enable_x64(True):  # float64, as ours, in this cell only
        print(jax.make_jaxpr(f)(*args).pretty_print(use_color=False))


show_jax(lambda x, i: x[i], x, 1)
show_jax(jax.grad(jax_loss), table, tokens)


# %% [markdown]
# - **Dimension numbers.** JAX's
#   [`lax.gather`](https://docs.jax.dev/en/latest/_autosummary/jax.lax.gather.html)
#   takes one stacked index array and a `GatherDimensionNumbers`
#   (`offset_dims`, `collapsed_slice_dims`, `start_index_map`,
#   `operand_batching_dims`, `start_indices_batching_dims`) plus
#   `slice_sizes`, the fields StableHLO's gather has; it can read windows
#   larger than one element along an indexed axis, which ours cannot (our
#   batched `dynamic_slice` reads every position of its block instead). Its
#   scatters take a `ScatterDimensionNumbers` and an `update_jaxpr`. Our
#   `gather(x, *indices, batch_dims=)` is the special case that NumPy's
#   indexing needs, and lowers to those same dimension numbers.
# - **Modes.** JAX's gather and scatters take a `mode`:
#   [`GatherScatterMode`](https://docs.jax.dev/en/latest/_autosummary/jax.lax.GatherScatterMode.html)
#   `CLIP`, `FILL_OR_DROP`, `PROMISE_IN_BOUNDS` (and `ONE_HOT`). `x[idx]`
#   records `PROMISE_IN_BOUNDS` after wrapping negative indices, and XLA's
#   gather then clamps; `x.at[idx].set` drops out-of-range updates; `jnp.take`
#   and `jnp.take_along_axis` fill with NaN by default. Ours computes the
#   same values, with gathers that clamp, scatters that drop (or clamp, with
#   `mode="clip"`, in a gather's transpose), and filling done by a `select` in
#   the front end.
# - **Gradients out of range.** Because `x[idx]` promises in-range indices,
#   JAX's gradient of a read at an out-of-range position is not the derivative
#   of the clamped read: its `scatter-add` drops that position (the gradient of
#   `x[jnp.array([5, 1])].sum()` for a 3-vector is `[0, 1, 0]`). Ours adds at the clamped
#   position (`[0, 1, 1]`), as the transpose of the read we compute.
# - **Boolean masks.** A traced mask is JAX's `NonConcreteBooleanIndexError`,
#   an `IndexError`; ours has the same name and is also a `TypeError`.
# - **Hints.** `unique_indices` and `indices_are_sorted` let XLA pick a faster
#   scatter; JAX's `dynamic_slice`, batched over both the array and its
#   starts, becomes a `gather` with `indices_are_sorted=True` and
#   `unique_indices=True` (batched over the starts alone, both are `False`).
#   We have neither hint.
# - **Index dtypes.** JAX converts indices to `int32` (its default index
#   type) before gathering, as the jaxprs above show; we keep the user's
#   integer dtype and convert to 64 bits when lowering.
# - **More primitives.** JAX reverses an axis with `rev` (for `x[::-1]`),
#   drops axes with `squeeze` and adds them with `broadcast_in_dim`, has
#   `argmax` and `argmin` primitives and `scatter-mul`, `scatter-min` and
#   `scatter-max` (`x.at[i].multiply/min/max`), and its `pad` takes the padding
#   value as an operand. We use a gather, `reshape`, a composition of
#   comparisons, and zero padding. A `scatter` with repeated indices has one
#   winner in both; JAX's `jvp` of `scatter` makes primal and tangent agree
#   on it by scattering ids, where ours relies on a fixed order of updates.
#
# ## Summary
#
# - A slice is linear: its transpose pads the cotangent with zeros (`pad`,
#   whose transpose is a slice again). A block at a traced start is
#   `dynamic_slice`, transposed into a `dynamic_update_slice` of zeros.
# - `gather(x, i0, i1, ...)` reads `x[i0[p], i1[p], ...]` for every position
#   `p`; `scatter-add` adds windows at such positions, and `scatter` writes them.
#   A gather's transpose is a scatter-add, and a scatter-add's is a gather: the
#   gradient of an embedding lookup touches only the rows that were read.
# - Batching a gather never loops: a batched array gets a window axis, batched
#   indices get one more index axis, and both get a paired *batch dimension*.
# - `x[idx]` parses NumPy's index language into one slice, one dynamic slice
#   or one gather, plus a reshape; `x.at[idx].set/add` write with a scatter at
#   the positions a gather would read. Reads clamp, writes drop out-of-range
#   positions, and `take`/`take_along_axis` fill, as in JAX.
#
# ## Exercises
#
# **1. A one-hot lookup, counted.** Write the embedding lookup of this chapter
# as a product with a one-hot matrix, check that it agrees with `gather`, and
# compare the gradients' jaxprs: which one does work proportional to the
# vocabulary for each token?


# %% tags=["hide-input"]
# @title A solution
def one_hot_loss(table, tokens):
    one_hot = (tokens[:, None] == np.arange(table.shape[0])).astype(table.dtype)
    rows = one_hot @ table  # (tokens, vocabulary) x (vocabulary, dimension)
    return reduce_sum(rows * rows)


print(np.allclose(grad(one_hot_loss)(table, tokens), grad(lookup_loss)(table, tokens)))
# The one-hot version's gradient is a dot_general of the (tokens, vocabulary)
# one-hot matrix with the cotangent: tokens x vocabulary x dimension
# multiply-adds. The gather's is a scatter-add of tokens x dimension numbers.
print(make_jaxpr(grad(one_hot_loss), f64(5, 3), i64(3))[0])


# %% [markdown]
# **2. `x.at[i].multiply`.** Write `at_multiply(x, i, v)`, which multiplies the
# elements at integer positions `i` by `v` (accumulating over repeated
# positions), with the primitives of this chapter and `exp`/`log` only for
# positive `v`. Check it against JAX's `x.at[i].multiply(v)` with a repeated
# index.


# %% tags=["hide-input"]
# @title A solution
def at_multiply(x, i, v):
    # A product of positive factors is exp of a sum of logs: a scatter-add.
    factors = anp.exp(scatter_add(np.zeros(x.shape), anp.log(v), i))
    return x * factors


xs, pos, vals = np.arange(1.0, 5.0), np.array([0, 2, 0]), np.array([2.0, 3.0, 5.0])
print(at_multiply(xs, pos, vals))
with jax.enable_x64(True):
    print(jnp.asarray(xs).at[pos].multiply(vals))
