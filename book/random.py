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
# (random)=
# # Random numbers as pure functions
#
# :::{admonition} Where we are
# :class: note
# Every program so far was deterministic, and noise (a model's initial weights,
# dropout masks) had to be drawn with NumPy on the host and passed in. This
# chapter builds `autodidax.random`, equal bit for bit to `jax.random`, out of
# nothing but integer primitives.
# :::
#
# A random number generator as NumPy has it is an object with a hidden state
# that every draw advances. Transformations do not get along with hidden state:
# `jit` runs the Python function once and keeps the program, `vmap` runs it once
# for a whole batch, and reverse mode may run parts of it again. JAX's answer,
# which this chapter rebuilds, has three steps:
#
# 1. **A key is an array.** Randomness comes from an explicit value that is
#    passed in, never from state that is mutated. `split` turns one key into
#    new ones.
# 2. **Bits come from a counter-based hash.** The random bits at position $i$ are
#    a hash of the key and the counter $i$ (Threefry-2x32, made of integer
#    additions, rotations and exclusive ors). Nothing is sequential, so the
#    whole array is computed in parallel, and the same key always gives the
#    same bits.
# 3. **Floats come from bits.** Random bits become the mantissa of a float in
#    $[1, 2)$; subtract 1 and scale. Normal, Bernoulli and categorical samples
#    are functions of those floats, and a permutation is a sort by random bits.
#
# Since every step is made of ordinary primitives, `jit`, `vmap`, `grad` and
# lowering need nothing new.

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

book_setup.load_book(globals(), before="random")

# %% tags=["hide-input"]
# @title JAX, to check the answers against; same_bits, compare_with_jax
import collections

import jax
import jax.numpy as jnp

anp = numpy_namespace  # outside the book: import autodidax.numpy as anp


def same_bits(ours, theirs) -> bool:
    """Equal dtype, shape and bits (floats compared as unsigned integers)."""
    a, b = np.asarray(ours), np.asarray(theirs)
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if a.dtype.kind == "f":
        a, b = a.view(f"uint{8 * a.itemsize}"), b.view(f"uint{8 * b.itemsize}")
    return bool(np.array_equal(a, b))


def compare_with_jax(draw):
    """Bits of draw(random, key) against draw(jax.random, key): eagerly,
    under jit, and under vmap over four keys."""
    key = np.array([0, 7], np.uint32)  # PRNGKey(7), the same in both
    keys = np.asarray(jax.random.split(key, 4))
    with jax.enable_x64(True):
        theirs = draw(jax.random, key)
        theirs_batched = jax.vmap(lambda k: draw(jax.random, k))(keys)
    return (
        same_bits(draw(random, key), theirs),
        same_bits(jit(lambda k: draw(random, k))(key), theirs),
        same_bits(vmap(lambda k: draw(random, k))(keys), theirs_batched),
    )


# %% [markdown]
# ## Why keys
#
# Here is the obvious way to add noise: a NumPy generator, drawn from inside the
# function. Under `jit` the function runs once, while it is traced; the noise it
# drew became a constant of the compiled program, and every call returns it
# again.

# %%
numpy_rng = np.random.default_rng(0)


def add_noise(x):
    return x + numpy_rng.normal(size=x.shape)


noisy = jit(add_noise)
print(noisy(np.zeros(3)))
print(noisy(np.zeros(3)))  # the same "random" numbers

# %% [markdown]
# Under `vmap` the function also runs once, for the whole batch, with `x.shape`
# the shape of one example. Every example gets the same noise:

# %%
print(vmap(add_noise)(np.zeros((4, 3))))


# %% [markdown]
# (And reverse mode, which may evaluate a function again to recompute what it
# did not save, would see different noise the second time.) The fix is to make
# the randomness an input. A **key** is a small array, two `uint32` words; a
# function that needs noise takes a key; a function that needs noise twice
# **splits** its key into new keys instead of reusing it. Nothing is mutated,
# so tracing once is correct, and a batch of keys under `vmap` gives every
# example its own noise. The rest of the chapter builds the functions that turn
# a key into numbers.
#
# ## Unsigned integers and bit operations
#
# Our arrays already hold `uint32` (the dtype check of
# {ref}`Part 1 <part1>` accepts every unsigned kind), and `add` on them already
# wraps around modulo $2^{32}$: NumPy's `np.add` on `uint32` arrays wraps, and
# so does XLA's. What is missing are the operations on bits. They get the
# names `jax.lax` gives them: `xor`, `or` and `and` (wrappers `bitwise_xor`,
# `bitwise_or`, `bitwise_and`), `shift_left` and `shift_right_logical` (which
# fills with zeros, also for signed integers), and `rem`, the remainder of an
# integer division, which `randint` needs. Their rules are the ones of any
# elementwise binary primitive: NumPy evaluates them, batching aligns the two
# batch axes, abstract evaluation checks the operands, and each lowers to the
# StableHLO operation of (nearly) the same name. Their derivative is a zero tangent:
# integers do not vary smoothly, so the JVP rule returns `zeros_like(out)`, the
# rule the comparisons use; and none of them is linear, so none gets a transpose
# rule.
#
# One detail needs care. NumPy's `right_shift` of a signed integer copies the
# sign bit into the vacated places (an arithmetic shift), where
# `shift_right_logical` fills them with zeros. The folded `numpy_shift` shifts
# the bits as an unsigned integer of the same width, and gives 0 for a shift by
# the bit width or more, or by a negative amount, as XLA defines it; the same
# cell holds the wrappers and the abstract evaluation rule. Then every rule is
# registered in one loop:


# %% tags=["export", "hide-input"]
# @title numpy_shift: logical shifts, 0 past the bit width, as in XLA; wrappers
def numpy_shift(shift: Callable) -> Callable:
    def shifted(x, y):
        x, y = np.asarray(x), np.asarray(y)
        unsigned = np.dtype(f"uint{8 * x.dtype.itemsize}")
        ux, uy = x.view(unsigned), y.view(unsigned)  # a negative shift is huge
        width = 8 * x.dtype.itemsize
        out = np.where(uy < width, shift(ux, np.minimum(uy, width - 1)), 0)
        return np.asarray(out, unsigned).view(x.dtype)

    return shifted


def _integer_kinds(prim: Primitive) -> tuple[str, str]:
    if "shift" in prim.name or prim.name == "rem":
        return "iu", "an integer"
    return "biu", "an integer or boolean"


def _integer_abstract_eval(prim: Primitive) -> None:
    @prim.def_rule("abstract_eval")
    def rule(x, y):
        check_binary_operands(prim.name, x, y)
        _check_aval_kind(prim.name, x, *_integer_kinds(prim))
        return [ShapedArray(x.shape, x.dtype)]


def _bind_integer(prim: Primitive, x: ArrayLike, y: ArrayLike) -> ArrayLike:
    x, y = _binary_operands(prim.name, x, y)
    _check_kind(prim.name, x, *_integer_kinds(prim))
    return bind(prim, x, y)


def bitwise_xor(x: ArrayLike, y: ArrayLike) -> ArrayLike:
    """Elementwise exclusive or of integer (or boolean) arrays."""
    return _bind_integer(xor_p, x, y)


def bitwise_or(x: ArrayLike, y: ArrayLike) -> ArrayLike:
    """Elementwise or of integer (or boolean) arrays."""
    return _bind_integer(or_p, x, y)


def bitwise_and(x: ArrayLike, y: ArrayLike) -> ArrayLike:
    """Elementwise and of integer (or boolean) arrays."""
    return _bind_integer(and_p, x, y)


def shift_left(x: ArrayLike, y: ArrayLike) -> ArrayLike:
    """``x << y`` elementwise; a shift by the bit width or more gives 0."""
    return _bind_integer(shift_left_p, x, y)


def shift_right_logical(x: ArrayLike, y: ArrayLike) -> ArrayLike:
    """``x >> y`` elementwise, filling with zeros (also for signed integers)."""
    return _bind_integer(shift_right_logical_p, x, y)


def rem(x: ArrayLike, y: ArrayLike) -> ArrayLike:
    """The remainder of integer division, with the sign of ``x`` (C's ``%``)."""
    return _bind_integer(rem_p, x, y)


# %% tags=["export"]
xor_p = Primitive("xor")
or_p = Primitive("or")
and_p = Primitive("and")
shift_left_p = Primitive("shift_left")
shift_right_logical_p = Primitive("shift_right_logical")
rem_p = Primitive("rem")
BIT_OPS = {
    xor_p: (np.bitwise_xor, hlo.xor),
    or_p: (np.bitwise_or, hlo.or_),
    and_p: (np.bitwise_and, hlo.and_),
    shift_left_p: (numpy_shift(np.left_shift), hlo.shift_left),
    shift_right_logical_p: (numpy_shift(np.right_shift), hlo.shift_right_logical),
    rem_p: (np.fmod, hlo.remainder),  # the sign of x, as C's % and XLA's rem
}
for _prim, (_np_fn, _hlo_fn) in BIT_OPS.items():
    NOT_LINEAR.add(_prim.name)
    _impl_from_numpy(_prim, _np_fn)
    _comparison_jvp(_prim)  # integers out: a zero tangent
    _binary_vmap(_prim)
    _integer_abstract_eval(_prim)
    _lower_with(_prim, _hlo_fn)
    per_element_cost(_prim)  # one operation per element, as XLA counts

# %% [markdown]
# Two more primitives complete the kit. `bitcast_convert_type(x, dtype)` reads
# the bits of `x` as another dtype of the same width, with no rounding: it is
# NumPy's `x.view(dtype)` and StableHLO's `bitcast_convert`. It is how random
# bits become a float. `iota(dtype, n)` is the array $0, 1, \dots, n - 1$,
# computed where the program runs rather than built with NumPy and passed in
# as a constant (a million counters are four megabytes). It has no operands, so
# `jvp` and `vmap`, which only see primitives applied to their tracers, never
# meet it; its batching rule is there for completeness. Both give zero tangents and are not linear. Their rules are folded.

# %% tags=["export"]
bitcast_convert_type_p = Primitive("bitcast_convert_type")
iota_p = Primitive("iota")
NOT_LINEAR.update(["bitcast_convert_type", "iota"])


def bitcast_convert_type(x: ArrayLike, new_dtype: Any) -> ArrayLike:
    """The bits of ``x`` read as ``new_dtype`` of the same width."""
    new_dtype = check_array_dtype("bitcast_convert_type", new_dtype)
    check_same_width(get_aval(x, "bitcast_convert_type"), new_dtype)
    return bind(bitcast_convert_type_p, x, new_dtype=new_dtype)


def iota(dtype: Any, size: int) -> ArrayLike:
    """0, 1, ..., size - 1, computed where the program runs."""
    dtype = check_array_dtype("iota", dtype)
    return bind(iota_p, dtype=dtype, shape=(check_size("iota", size),), dimension=0)


# %% tags=["export", "hide-input"]
# @title The rules of bitcast_convert_type and iota; their checks
@bitcast_convert_type_p.def_rule("impl")
def _bitcast_convert_type_impl(x, *, new_dtype):
    return [np.asarray(x).view(new_dtype)]


@bitcast_convert_type_p.def_rule("abstract_eval")
def _bitcast_convert_type_abstract_eval(x, *, new_dtype):
    check_same_width(x, new_dtype)
    return [ShapedArray(x.shape, new_dtype)]


@bitcast_convert_type_p.def_rule("jvp")
def _bitcast_convert_type_jvp(primals, tangents, *, new_dtype):
    out = bitcast_convert_type(primals[0], new_dtype)
    return [out], [zeros_like(out)]


@bitcast_convert_type_p.def_rule("lower")
def _bitcast_convert_type_lower(ctx, avals_in, avals_out, x, *, new_dtype):
    return [hlo.bitcast_convert(ir_type(avals_out[0]), x)]


_elementwise_vmap_with_params(bitcast_convert_type_p)
per_element_cost(bitcast_convert_type_p)  # XLA counts one flop per element


def check_same_width(x: ShapedArray, new_dtype: np.dtype) -> None:
    if x.dtype.itemsize != new_dtype.itemsize or np.bool_ in (x.dtype, new_dtype):
        raise TypeError(
            f"bitcast_convert_type: cannot read the bits of {x.str_short()} as "
            f"{new_dtype.name}: the widths differ"
        )


def check_size(name: str, size: Any) -> int:
    if not _is_axis(size) or size < 0:
        raise TypeError(f"{name}: size must be a non-negative integer, got {size!r}")
    return int(size)


@iota_p.def_rule("impl")
def _iota_impl(*, dtype, shape, dimension):
    line = np.arange(shape[dimension], dtype=dtype)
    line = line.reshape(-1, *[1] * (len(shape) - dimension - 1))
    return [np.broadcast_to(line, shape)]


@iota_p.def_rule("abstract_eval")
def _iota_abstract_eval(*, dtype, shape, dimension):
    return [ShapedArray(shape, dtype)]


@iota_p.def_rule("jvp")
def _iota_jvp(primals, tangents, **params):
    out = bind(iota_p, **params)
    return [out], [zeros_like(out)]


@iota_p.def_rule("vmap")
def _iota_vmap(axis, vals, dims, **params):  # no operands: never batched
    return [bind(iota_p, **params)], [None]


@iota_p.def_rule("lower")
def _iota_lower(ctx, avals_in, avals_out, *, dtype, shape, dimension):
    return [hlo.iota(ir_type(avals_out[0]), dimension)]


per_element_cost(iota_p, flops=0)  # it writes its output, as XLA counts

# %% [markdown]
# A check against `jax.lax`, eagerly and under `jit`, of all seven operations
# on `uint32` numbers near the top of the range (so that the additions wrap)
# and on `int32` numbers, some negative, with shift amounts past the bit width
# and negative. The last line shows the detail: the `int32` numbers shifted
# right by one place, logically by ours, arithmetically by NumPy's `>>`.

# %%
rng = np.random.default_rng(0)
big = rng.integers(2**32 - 100, 2**32, 5, dtype=np.uint32)  # additions wrap
signed = np.array([-8, -1, 7, -(2**30), 100], np.int32)
shifts = np.array([1, 31, 32, -1, 3])  # 32 and -1 are out of range: 0
for ours in [add, bitwise_xor, bitwise_or, bitwise_and, shift_left,
             shift_right_logical, rem]:  # fmt: skip
    theirs = getattr(jax.lax, ours.__name__)  # the same names
    print(f"{ours.__name__:20}", *[
        same_bits(f(x, shifts.astype(x.dtype)), theirs(x, shifts.astype(x.dtype)))
        for x in (big, signed) for f in (ours, jit(ours))])  # fmt: skip
one = np.ones(5, np.int32)
print(shift_right_logical(signed, one), signed >> one)


# %% [markdown]
# ## Threefry-2x32: bits from a counter
#
# Threefry is a family of hash functions published by Salmon, Moraes, Dror and
# Shaw (2011) for exactly this purpose: random numbers computed in parallel.
# The 2x32 variant maps two 32-bit words of *counter* and two of *key* to two
# 32-bit words that look random. It is 20 rounds of three operations on the
# two words $(x_1, x_2)$: add the second word into the first, rotate the second
# left by a fixed amount, and xor it with the first. After every four rounds it
# adds a word of the key schedule (the two key words and a third made from
# their xor with a constant) and the block's number. The rotation amounts
# alternate between two fixed lists.


# %% tags=["export"]
def rotate_left(x: ArrayLike, r: int) -> ArrayLike:
    return bitwise_or(shift_left(x, r), shift_right_logical(x, 32 - r))


def threefry2x32(key1, key2, x1, x2):
    """Hash the counter words x1, x2 under the key words key1, key2
    (uint32 arrays of one shape)."""
    rotations = [(13, 15, 26, 6), (17, 29, 16, 24)]
    ks = [key1, key2, bitwise_xor(bitwise_xor(key1, key2), 0x1BD11BDA)]
    x1, x2 = add(x1, ks[0]), add(x2, ks[1])
    for block in range(5):
        for r in rotations[block % 2]:
            x1 = add(x1, x2)
            x2 = bitwise_xor(x1, rotate_left(x2, r))
        x1 = add(x1, ks[(block + 1) % 3])
        x2 = add(add(x2, ks[(block + 2) % 3]), block + 1)
    return x1, x2


# %% [markdown]
# To fill an array of any shape with random bits, hash the counters
# $0, 1, 2, \dots$ laid out in that shape, all under the same key. JAX counts in
# 64 bits, a high word (zero for any array of fewer than $2^{32}$ elements) and a
# low word, and hashes the pair; so do we.


# %% tags=["export"]
def hash_counters(key, shape):
    """Threefry of the counters 0, 1, 2, ... laid out in ``shape``: two
    uint32 arrays of that shape."""
    counter_lo = reshape(iota(np.uint32, math.prod(shape)), shape)
    counter_hi = full_of(ShapedArray(shape, np.uint32), 0)
    key1, key2 = (broadcast_to(k, shape) for k in (key[0], key[1]))
    return threefry2x32(key1, key2, counter_hi, counter_lo)


# %% [markdown]
# ## Keys: `PRNGKey`, `split`, `fold_in`, `bits`
#
# A key made from a seed is just the seed's two 32-bit halves. Splitting hashes
# the counters $0, \dots, n - 1$ under the old key and uses the two words of
# each hash as a new key. `fold_in` hashes one number, the data, into a new key
# (a cheap way to derive a key per step or per layer). `bits` hashes counters
# too, and combines the two words: xor them into one 32-bit number, or join
# them into a 64-bit one.
#
# The functions are written as `random_<name>`; a decorator, `random_function`,
# puts each into the module `autodidax.random` under JAX's name, so that
# `random.split` is `random_split`. The folded cell holds it and the checks: a
# key must be a `uint32` array of shape `(2,)`, a shape a tuple of non-negative
# integers, a seed an integer.

# %% tags=["export", "hide-input"]
# @title The module autodidax.random; checks of keys, shapes, seeds and dtypes
import functools
import math
import sys
import types

from jaxlib.mlir.dialects import chlo

random_namespace = types.ModuleType("autodidax.random", "Random numbers from keys.")
random = random_namespace  # for `from autodidax import random`
if __name__ != "__main__":  # in the module: `import autodidax.random as random`
    sys.modules[f"{__name__}.random"] = random_namespace


for _fn in [bitwise_xor, bitwise_or, bitwise_and, shift_left, shift_right_logical]:
    setattr(lax_namespace, _fn.__name__, _fn)  # JAX's lax names
for _fn in [rem, bitcast_convert_type, iota]:
    setattr(lax_namespace, _fn.__name__, _fn)


def random_function(fn: Callable) -> Callable:
    """Decorator: put ``random_<name>`` into the namespace as ``<name>``."""
    setattr(random_namespace, fn.__name__.removeprefix("random_"), fn)
    return fn


def check_key(name, key):
    aval = get_aval(_as_input(key, name))
    if aval.dtype != np.uint32:
        raise TypeError(
            f"{name}: a key is a uint32 array of shape (2,) (from random.PRNGKey "
            f"or random.split), got {aval.str_short()}"
        )
    if aval.shape != (2,):
        batched = aval.ndim > 1 and aval.shape[-1] == 2
        hint = " (a batch of keys? use vmap)" if batched else ""
        raise (ValueError if batched else TypeError)(  # as JAX
            f"{name}: a key is a uint32 array of shape (2,), got "
            f"{aval.str_short()}{hint}"
        )


def check_shape_arg(name, shape, what="shape"):
    dims = (shape,) if _is_axis(shape) else shape
    if not isinstance(dims, (tuple, list)) or not all(_is_axis(d) for d in dims):
        raise TypeError(
            f"{name}: {what} must be a tuple of non-negative integers, got {shape!r}"
        )
    if any(d < 0 for d in dims):
        raise ValueError(f"{name}: {what} {tuple(dims)} has a negative dimension")
    if math.prod(dims) >= 2**32:
        raise ValueError(f"{name}: {what} {tuple(dims)} has 2**32 elements or more")
    return tuple(int(d) for d in dims)


def check_key_and_shape(name, key, shape):
    check_key(name, key)
    return check_shape_arg(name, shape, "num" if name == "split" else "shape")


def check_seed(seed):
    if type(seed) is int:
        if not -(2**63) <= seed < 2**64:
            raise ValueError(f"PRNGKey: the seed {seed} does not fit in 64 bits")
        return np.asarray(seed, np.uint64 if seed >= 2**63 else np.int64)
    aval = get_aval(_as_input(seed, "PRNGKey"))
    if aval.shape != () or aval.dtype.kind not in "iu":
        raise TypeError(
            f"PRNGKey: the seed must be an integer scalar, got {aval.str_short()}"
            " (for a batch of seeds, use vmap)"
        )
    return seed


def check_key_and_data(key, data):
    """The key checked; ``data`` as a uint32 scalar."""
    check_key("fold_in", key)
    if type(data) is int:
        if not 0 <= data < 2**32:
            raise ValueError(f"fold_in: data {data} does not fit in uint32")
        return np.uint32(data)
    aval = get_aval(_as_input(data, "fold_in"))
    if aval.shape != () or aval.dtype.kind not in "iu":
        raise TypeError(
            f"fold_in: data must be an integer scalar, got {aval.str_short()}"
        )
    return convert_element_type(data, np.uint32)


def check_bits_dtype(dtype):
    dtype = check_array_dtype("bits", dtype)
    if dtype.kind != "u":
        raise ValueError(
            f"bits: dtype must be an unsigned integer dtype, got {dtype.name}"
        )
    return dtype


def check_float_dtype(name, dtype):
    dtype = check_array_dtype(name, dtype)
    if dtype.kind != "f":
        raise ValueError(f"{name}: dtype must be a float dtype, got {dtype.name}")
    return dtype


def bounds_like(name, shape, dtype, *bounds):
    """Each bound as an array of ``dtype`` with as many axes as ``shape``
    (leading axes of size 1), checked to broadcast to ``shape``."""
    out = []
    for bound in bounds:
        if _is_python_scalar(bound):
            bound = np.asarray(bound, dtype)
        bound = convert_element_type(_as_input(bound, name), dtype)
        b_shape = get_aval(bound).shape
        try:
            fits = np.broadcast_shapes(b_shape, shape) == shape
        except ValueError:
            fits = False
        if len(b_shape) > len(shape) or not fits:
            raise ValueError(
                f"{name}: minval and maxval must broadcast to shape {shape}, got "
                f"one of shape {b_shape}"
            )
        out.append(reshape(bound, (1,) * (len(shape) - len(b_shape)) + b_shape))
    return out


@functools.cache
def compiled(core, *static):
    """``core`` with its static arguments, as one jitted function."""
    return jit(functools.partial(core, *static))


# %% tags=["export"]
@random_function
def random_PRNGKey(seed):
    """A key, uint32[2], from an integer seed: its high and low 32 bits."""
    seed = check_seed(seed)
    high = convert_element_type(shift_right_logical(seed, 32), np.uint32)
    return numpy_stack([high, convert_element_type(seed, np.uint32)])


random.key = random_PRNGKey  # JAX's key(seed) differs: see the end


@random_function
def random_split(key, num=2):
    """``num`` new keys (a number or a shape): uint32[*num, 2]."""
    bits1, bits2 = hash_counters(key, check_key_and_shape("split", key, num))
    return numpy_stack([bits1, bits2], axis=-1)


@random_function
def random_fold_in(key, data):
    """A new key from a key and an integer."""
    data = check_key_and_data(key, data)
    bits1, bits2 = threefry2x32(key[0], key[1], np.uint32(0), data)
    return numpy_stack([bits1, bits2])


@random_function
def random_bits(key, shape=(), dtype=np.uint64):
    """Random unsigned integers of ``dtype`` in ``shape``."""
    shape, dtype = check_key_and_shape("bits", key, shape), check_bits_dtype(dtype)
    bits1, bits2 = hash_counters(key, shape)
    if dtype.itemsize == 8:  # the two words side by side
        high = shift_left(convert_element_type(bits1, dtype), 32)
        return bitwise_or(high, convert_element_type(bits2, dtype))
    return convert_element_type(bitwise_xor(bits1, bits2), dtype)


# %% [markdown]
# The first check: keys, splits, folds and bits against `jax.random`, for a few
# seeds (including one above $2^{32}$ and a negative one).

# %%
with jax.enable_x64(True):  # JAX in 64-bit mode, as our module is
    for seed in [0, 42, 2**40 + 7, -3]:
        key, jkey = random.PRNGKey(seed), jax.random.PRNGKey(seed)
        print(seed, same_bits(key, jkey),
              same_bits(random.split(key, 3), jax.random.split(jkey, 3)),
              same_bits(random.fold_in(key, 7), jax.random.fold_in(jkey, 7)),
              same_bits(random.bits(key, (2, 3)), jax.random.bits(jkey, (2, 3))))  # fmt: skip


# %% [markdown]
# ## Floats from bits
#
# A float32 is a sign bit, 8 exponent bits and 23 mantissa bits. With the sign
# and exponent of 1.0 and any mantissa, it is a number in $[1, 2)$, and the
# $2^{23}$ mantissas give $2^{23}$ equally spaced numbers there. So: keep the top
# 23 of 32 random bits, put the bits of 1.0 in front, read the result as a
# float, and subtract 1. Scaling to $[\text{minval}, \text{maxval})$ is one
# multiplication and one addition; a final `maximum` guards against rounding
# below `minval`. float64 does the same with 52 of 64 bits.


# %% tags=["export"]
@random_function
def random_uniform(key, shape=(), dtype=np.float64, minval=0.0, maxval=1.0):
    """Floats in [minval, maxval)."""
    shape = check_key_and_shape("uniform", key, shape)
    dtype = check_float_dtype("uniform", dtype)
    minval, maxval = bounds_like("uniform", shape, dtype, minval, maxval)
    return compiled(uniform_core, shape, dtype)(key, minval, maxval)


def uniform_core(shape, dtype, key, minval, maxval):
    nbits, nmant = np.finfo(dtype).bits, np.finfo(dtype).nmant
    uint = np.dtype(f"uint{nbits}")
    mantissa = shift_right_logical(random_bits(key, shape, uint), nbits - nmant)
    one = int(np.array(1.0, dtype).view(uint))  # the bits of 1.0
    floats = bitcast_convert_type(bitwise_or(mantissa, one), dtype)  # [1, 2)
    floats = numpy_subtract(floats, 1.0)
    scaled = numpy_add(numpy_multiply(floats, numpy_subtract(maxval, minval)), minval)
    return numpy_maximum(minval, scaled)


# %% [markdown]
# `compiled(core, shape, dtype)` is `jit` of the core with its static arguments,
# cached. JAX runs its samplers as jitted functions too, even when they are
# called outside `jit`, and bit-for-bit equality needs it: XLA on CPU (at its
# default optimization level) fuses
# `floats * (maxval - minval) + minval` into one fused multiply-add, which rounds
# once, where NumPy's multiplication followed by an addition rounds twice. Here
# is the whole generator as a jaxpr, traced for four float32 numbers; it is
# nothing but the primitives above. The generator sits inside one `xla_call`
# (that is `compiled`). We count its equations by primitive, then print the
# lines where the bits become floats, from the last `shift_right_logical` on.
# The many `broadcast`s are scalar constants (rotation amounts, the bits of
# 1.0) made into arrays of the counters' shape, because our binary primitives
# take operands of one shape; JAX's jaxprs would show them as literals.

# %%
uniform4 = lambda key: random.uniform(key, (4,), np.float32)  # noqa: E731
jaxpr, _, _ = make_jaxpr(uniform4, ShapedArray((2,), np.uint32))
body = jaxpr.eqns[-1].params["jaxpr"]  # the xla_call's jaxpr
print(collections.Counter(eqn.primitive.name for eqn in body.eqns))
lines = str(body).splitlines()
shift = max(i for i, line in enumerate(lines) if "shift_right_logical" in line)
print("...", *lines[shift - 1 : shift + 6], "...", sep="\n")

# %% [markdown]
# Read from the top: shift the 32 random bits right by 9, keeping 23; `or` them
# with 1065353216, the bits of 1.0f; reinterpret the word as a float32
# (`bitcast_convert_type`), which lands in $[1, 2)$; subtract 1.0. The
# multiplication, addition and `maximum` that scale the result follow.
#
# JAX's own jaxpr of `jax.random.uniform` is shorter: the raw key is wrapped into
# a typed key, and the bits come from one primitive, `random_bits`, which is
# lowered through JAX's primitive `threefry2x32` (on CPU, as a loop over the five
# blocks of rounds). Keeping the hash one primitive lets JAX lower it differently
# per platform: on CPU as the rolled loop just mentioned, elsewhere unrolled.
# (`jax/_src/random/threefry2x32.py` also registers a GPU kernel, but JAX uses
# it only when the setting `jax_threefry_gpu_kernel_lowering` is on, and it is
# off by default.) Ours is unrolled into its additions, rotations and xors.
# Both give the same bits. The folded setup cell defined
# `compare_with_jax(draw)`, which calls `draw(random, key)` and
# `draw(jax.random, key)` and compares the bits: eagerly, under `jit`, and
# under `vmap` over four keys.

# %%
for dtype in [np.float32, np.float64]:
    print(dtype.__name__, compare_with_jax(
        lambda r, k, dtype=dtype: r.uniform(k, (3, 5), dtype, -2.5, 3.0)))  # fmt: skip


# %% [markdown]
# ## Normal, Bernoulli, integers, categories
#
# The other samplers are functions of uniform floats or bits, and each follows
# JAX's recipe exactly, since a different but correct recipe would give
# different numbers.
#
# - **`normal`**: $\sqrt 2\,\mathrm{erf}^{-1}(u)$ for $u$ uniform in $(-1, 1)$
#   is a standard normal number (the normal inverse CDF at $p$ is
#   $\sqrt 2\,\mathrm{erf}^{-1}(2p - 1)$, and $2p - 1$ is uniform in
#   $(-1, 1)$ when $p$ is uniform in $(0, 1)$). This needs one
#   more primitive, `erf_inv`, which StableHLO's sister dialect CHLO provides
#   and which is expanded into a polynomial approximation when the program is
#   compiled. NumPy has no `erf_inv`, and bit-for-bit equality needs that very
#   polynomial, so the evaluation rule runs the primitive through XLA.
# - **`bernoulli(key, p)`**: `uniform(key) < p`.
# - **`randint(key, shape, minval, maxval)`**: two $n$-bit words of random
#   bits per number, `higher` and `lower`, spell the number
#   $\text{higher}\cdot 2^n + \text{lower}$, reduced modulo the span
#   $s$ = `maxval - minval`. It is never formed: its remainder is
#   $((\text{higher} \bmod s)\,(2^n \bmod s) + \text{lower} \bmod s) \bmod s$,
#   and $2^n \bmod s$ is the square of $2^{n/2} \bmod s$. For spans up to
#   $2^{n/2}$ every product stays below $2^n$; for larger ones the square wraps
#   to 0 in $n$-bit arithmetic, leaving $\text{lower} \bmod s$ (JAX's recipe,
#   wrap included).
# - **`categorical(key, logits, axis=-1, shape=None)`**: the Gumbel-max trick.
#   Add $-\log(-\log u)$ noise to the logits and take the `argmax` along
#   `axis`; the winner is category $i$ with probability
#   $\mathrm{softmax}(\text{logits})_i$. The logits' other axes are a batch of
#   distributions, and `shape` is the shape of the result: it ends with that
#   batch shape, and its leading axes are independent draws from each
#   distribution (below, logits of shape `(2, 3)` and `shape=(4, 2)`: four draws
#   from each of two distributions over three categories).


# %% tags=["export"]
@random_function
def random_normal(key, shape=(), dtype=np.float64):
    """Standard normal floats."""
    shape = check_key_and_shape("normal", key, shape)
    dtype = check_float_dtype("normal", dtype)
    return compiled(normal_core, shape, dtype)(key)


def normal_core(shape, dtype, key):
    lo = np.nextafter(np.array(-1.0, dtype), np.array(0.0, dtype))  # > -1
    u = uniform_core(shape, dtype, key, *bounds_like("normal", shape, dtype, lo, 1.0))
    return numpy_multiply(np.array(np.sqrt(2), dtype), erf_inv(u))


@random_function
def random_bernoulli(key, p=0.5, shape=None):
    """Booleans, True with probability ``p``."""
    p = check_probability(p)
    shape = check_key_and_shape("bernoulli", key, p.shape if shape is None else shape)
    (p,) = bounds_like("bernoulli", shape, p.dtype, p)
    return compiled(bernoulli_core, shape)(key, p)


def bernoulli_core(shape, key, p):
    bounds = bounds_like("bernoulli", shape, get_aval(p).dtype, 0.0, 1.0)
    return numpy_less(uniform_core(shape, get_aval(p).dtype, key, *bounds), p)


@random_function
def random_categorical(key, logits, axis=-1, shape=None):
    """Indices along ``axis``, drawn with probabilities softmax(logits)."""
    logits, axis, shape = check_categorical(key, logits, axis, shape)
    return compiled(categorical_core, shape, axis)(key, logits)


def categorical_core(shape, axis, key, logits):
    aval = get_aval(logits)
    prefix = shape[: len(shape) - (aval.ndim - 1)]  # samples per distribution
    noise_shape, tiny = (*prefix, *aval.shape), np.finfo(aval.dtype).tiny
    bounds = bounds_like("categorical", noise_shape, aval.dtype, tiny, 1.0)
    gumbel = neg(log(neg(log(uniform_core(noise_shape, aval.dtype, key, *bounds)))))
    logits = reshape(logits, (1,) * len(prefix) + aval.shape)
    return numpy_argmax(numpy_add(gumbel, logits), axis=len(prefix) + axis)


# %% tags=["export", "hide-input"]
# @title The primitive erf_inv (evaluated by XLA), randint, and the checks
erf_inv_p = Primitive("erf_inv")
NOT_LINEAR.add("erf_inv")


def erf_inv(x: ArrayLike) -> ArrayLike:
    """The inverse of the error function, elementwise, for floats in (-1, 1)."""
    _check_kind("erf_inv", x, "f", "a float")
    return bind(erf_inv_p, x)


@erf_inv_p.def_rule("jvp")
def _erf_inv_jvp(primals, tangents):
    (x,), (dx,) = primals, tangents
    out = erf_inv(x)  # d/dx erfinv(x) = sqrt(pi)/2 * exp(erfinv(x)^2)
    return [out], [mul(dx, mul(exp(mul(out, out)), math.sqrt(math.pi) / 2))]


@erf_inv_p.def_rule("impl")
def _erf_inv_impl(x):
    return [np.asarray(_erf_inv_on_xla(x))]  # XLA's polynomial, bit for bit


_erf_inv_on_xla = jit(lambda x: bind(erf_inv_p, x))
lax_namespace.erf_inv = erf_inv
_unary_abstract_eval(erf_inv_p, "f", "a float")
_unary_vmap(erf_inv_p)


@erf_inv_p.def_rule("lower")
def _erf_inv_lower(ctx, avals_in, avals_out, x):
    with_chlo(ir.Context.current)
    return [chlo.erf_inv(x)]


@erf_inv_p.def_rule("cost")
def _erf_inv_cost(ctx, avals_in, avals_out):
    n, (out,) = avals_out[0].size, avals_out  # XLA's expansion, counted by XLA
    flops = {4: 37, 8: 100}[out.dtype.itemsize]
    return Cost(flops * n, 2 * n, io_bytes(avals_in, avals_out))


@random_function
def random_randint(key, shape, minval, maxval, dtype=np.int64):
    """Integers in [minval, maxval)."""
    shape = check_key_and_shape("randint", key, shape)
    dtype = check_int_dtype(dtype)
    sampling = dtype if dtype.itemsize >= 4 else np.dtype(np.int32)  # less bias
    minval, maxval = integer_bounds(minval, maxval, dtype)
    out = compiled(randint_core, shape, sampling)(key, minval, maxval)
    return convert_element_type(out, dtype)


def randint_core(shape, dtype, key, minval, maxval):
    nbits = 8 * dtype.itemsize
    uint = np.dtype(f"uint{nbits}")
    top = min(np.iinfo(dtype).max, np.iinfo(get_aval(maxval).dtype).max)
    maxval_out_of_range = numpy_greater(maxval, top)
    minval, maxval = clip_to(minval, dtype), clip_to(maxval, dtype)
    minval, maxval = bounds_like("randint", shape, dtype, minval, maxval)
    (out_of_range,) = bounds_like("randint", shape, np.bool_, maxval_out_of_range)
    minval, maxval, out_of_range = [
        broadcast_to(v, shape) for v in (minval, maxval, out_of_range)
    ]
    keys = random_split(key)
    higher, lower = random_bits(keys[0], shape, uint), random_bits(keys[1], shape, uint)
    span = convert_element_type(numpy_subtract(maxval, minval), uint)
    span = numpy_where(numpy_less_equal(maxval, minval), np.ones((), uint), span)
    wider = bitwise_and(out_of_range, greater(maxval, minval))
    span = numpy_where(wider, numpy_add(span, 1), span)
    # (higher * 2**nbits + lower) % span, without overflow
    multiplier = rem(full_of(ShapedArray(shape, uint), 2 ** (nbits // 2)), span)
    multiplier = rem(mul(multiplier, multiplier), span)
    offset = add(mul(rem(higher, span), multiplier), rem(lower, span))
    return numpy_add(minval, convert_element_type(rem(offset, span), dtype))


def clip_to(v, dtype):
    """``v`` (an integer array) converted to ``dtype``, clipped, not wrapped."""
    own = np.iinfo(get_aval(v).dtype)
    lo, hi = max(np.iinfo(dtype).min, own.min), min(np.iinfo(dtype).max, own.max)
    return convert_element_type(numpy_clip(v, lo, hi), dtype)


def integer_bounds(minval, maxval, dtype):
    out = []
    for bound in (minval, maxval):
        if type(bound) is int:
            if not -(2**63) <= bound < 2**63:
                raise ValueError(f"randint: the bound {bound} does not fit in int64")
            bound = np.asarray(bound, np.int64)
        if get_aval(_as_input(bound, "randint")).dtype.kind not in "iu":
            bound = convert_element_type(bound, np.int64)
        out.append(bound)
    if dtype.itemsize < 4:  # sampled as int32, as in JAX
        info = np.iinfo(dtype)
        low, high = (clip_to(convert_element_type(b, np.int32), np.int32) for b in out)
        out = [
            numpy_clip(low, info.min, info.max),
            numpy_clip(high, info.min, info.max + 1),
        ]
    return out


def check_int_dtype(dtype):
    dtype = check_array_dtype("randint", dtype)
    if dtype.kind not in "iu":
        raise TypeError(f"randint: dtype must be an integer dtype, got {dtype.name}")
    return dtype


def check_probability(p):
    if _is_python_scalar(p):
        p = np.asarray(p, np.float64)
    dtype = get_aval(_as_input(p, "bernoulli")).dtype
    if dtype.kind != "f":
        raise TypeError(
            f"bernoulli: the probability p must be a float, got {dtype.name}"
        )
    return p


def check_categorical(key, logits, axis, shape):
    check_key("categorical", key)
    aval = get_aval(_as_input(logits, "categorical"))
    if aval.dtype.kind != "f" or aval.ndim == 0:
        raise TypeError(
            "categorical: logits must be floats with an axis of categories, "
            f"got {aval.str_short()}"
        )
    axis = _normalize_axes("categorical", axis, aval.ndim)[0]
    batch_shape = tuple(d for i, d in enumerate(aval.shape) if i != axis)
    shape = batch_shape if shape is None else check_shape_arg("categorical", shape)
    if shape[len(shape) - len(batch_shape) :] != batch_shape:
        raise ValueError(
            f"categorical: shape {shape} must end with the batch shape "
            f"{batch_shape} of logits {aval.str_short()} without axis {axis}"
        )
    return logits, axis, shape


# %% [markdown]
# Each of them, eagerly, under `jit` and under `vmap` over keys, in float32 and
# float64, against JAX:

# %%
logits = np.log(np.array([[0.1, 0.2, 0.7], [0.5, 0.25, 0.25]]))
samplers = {
    "normal f32": lambda r, k: r.normal(k, (5,), np.float32),
    "normal f64": lambda r, k: r.normal(k, (2, 3)),
    "bernoulli": lambda r, k: r.bernoulli(k, 0.3, (6,)),
    "randint": lambda r, k: r.randint(k, (6,), -5, 100),
    "categorical": lambda r, k: r.categorical(k, logits, shape=(4, 2)),
}
for name, draw in samplers.items():
    print(f"{name:12}", compare_with_jax(draw))


# %% [markdown]
# ## Permutations: one more primitive, `sort`
#
# `permutation(key, x)` shuffles `x` along an axis. JAX does it without a
# sequential algorithm: draw a random 32-bit number for every element and sort
# the elements by those numbers. Two elements can draw the same number, and a
# stable sort then keeps their order; so JAX repeats the sort with fresh numbers.
# Since each sort is stable, the final order compares two elements by the last
# round's numbers, on a tie by the round before, and so on: a pair keeps its
# original order only if it tied in *every* round. What must differ in some
# round is each pair, not all elements in one round. A given pair ties in all
# of $r$ rounds with probability $2^{-32r}$, and there are fewer than $n^2/2$
# pairs, so asking for $(2^{32} - 1)^r \ge n^3$, that is
# $r = \lceil 3 \log n / \log(2^{32} - 1) \rceil$ rounds (the code's formula),
# keeps the chance of any such tie below $1/n$: one round for up to about 1600
# elements, two up to millions.
#
# That needs a sort, which our module does not have yet. `sort_key_val(keys,
# values, dimension)` is JAX's `lax` function for it, and `sort` the primitive:
# it sorts `keys` stably along `dimension` and moves `values` the same way. Its
# rules, folded below, hold no surprises: NumPy's stable `argsort` evaluates it;
# batching moves the batch axis in front and sorts along `dimension + 1`; it
# lowers to `stablehlo.sort` with a small comparator block (one `compare LT` of
# the keys); its JVP sorts one more operand, the positions $0, 1, 2, \dots$, to
# learn the permutation and applies it to the tangents with
# `take_along_axis`; and it is not linear (moving values is linear, but the
# permutation depends on the keys). Its cost is XLA's: $n \lceil \log_2 n
# \rceil$ comparisons for $n$ elements.


# %% tags=["export"]
@random_function
def random_permutation(key, x, axis=0, independent=False):
    """``x`` shuffled along ``axis`` (an int ``x``: a shuffled ``arange(x)``)."""
    x, axis = check_permutation(key, x, axis)
    if independent or get_aval(x).ndim == 1:
        return compiled(shuffle_core, axis)(key, x)
    order = compiled(shuffle_core, 0)(key, np.arange(get_aval(x).shape[axis]))
    return numpy_take(x, order, axis=axis)


def shuffle_core(axis, key, x):
    n = get_aval(x).size
    for _ in range(int(np.ceil(3 * np.log(max(1, n)) / np.log(2**32 - 1)))):
        key, subkey = random_split(key)
        sort_keys = random_bits(subkey, get_aval(x).shape, np.uint32)
        _, x = sort_key_val(sort_keys, x, axis)
    return x


# %% tags=["export", "hide-input"]
# @title The primitive sort: sort_key_val, its rules and checks; permutation's checks
sort_p = Primitive("sort", multiple_results=True)
NOT_LINEAR.add("sort")


def sort_key_val(keys: ArrayLike, values: ArrayLike, dimension: int = -1):
    """``keys`` sorted (stably) along ``dimension``, and ``values`` moved alike."""
    keys, values = _as_input(keys, "sort_key_val"), _as_input(values, "sort_key_val")
    dimension = check_sort(get_aval(keys), get_aval(values), dimension)
    outs = bind(sort_p, keys, values, dimension=dimension, is_stable=True, num_keys=1)
    return tuple(outs)


@sort_p.def_rule("impl")
def _sort_impl(*operands, dimension, is_stable, num_keys):
    order = np.argsort(operands[0], axis=dimension, kind="stable")
    return [np.take_along_axis(np.asarray(x), order, dimension) for x in operands]


@sort_p.def_rule("abstract_eval")
def _sort_abstract_eval(*avals, dimension, is_stable, num_keys):
    check_sort(*avals[:2], dimension)
    return [ShapedArray(a.shape, a.dtype) for a in avals]


@sort_p.def_rule("jvp")
def _sort_jvp(primals, tangents, *, dimension, **params):
    shape = get_aval(primals[0]).shape
    positions = bind(iota_p, dtype=np.dtype(np.int64), shape=shape, dimension=dimension)
    *outs, order = bind(sort_p, *primals, positions, dimension=dimension, **params)
    moved = [numpy_take_along_axis(t, order, axis=dimension) for t in tangents]
    return outs, moved


@sort_p.def_rule("vmap")
def _sort_vmap(axis, vals, dims, *, dimension, **params):
    vals = [move_batch_axis(axis.size, d, 0, v) for v, d in zip(vals, dims)]
    outs = bind(sort_p, *vals, dimension=dimension + 1, **params)
    return outs, [0] * len(outs)


@sort_p.def_rule("lower")
def _sort_lower(ctx, avals_in, avals_out, *operands, dimension, is_stable, num_keys):
    i64 = ir.IntegerType.get_signless(64)
    sort = hlo.SortOp(
        [ir_type(a) for a in avals_out],
        list(operands),
        dimension=ir.IntegerAttr.get(i64, dimension),
        is_stable=ir.BoolAttr.get(is_stable),
    )
    scalars = [ir_type(ShapedArray((), a.dtype)) for a in avals_in]
    block = sort.comparator.blocks.append(*[t for t in scalars for _ in (0, 1)])
    kind = "SIGNED" if avals_in[0].dtype.kind == "i" else "UNSIGNED"
    with ir.InsertionPoint(block):
        less_than = hlo.compare(
            block.arguments[0],
            block.arguments[1],
            hlo.ComparisonDirectionAttr.get("LT"),
            compare_type=hlo.ComparisonTypeAttr.get(kind),
        )
        hlo.ReturnOp([less_than])
    return list(sort.results)


@sort_p.def_rule("cost")
def _sort_cost(ctx, avals_in, avals_out, **params):
    n = avals_in[0].size  # XLA counts n * ceil(log2 n) comparisons
    flops = n * math.ceil(math.log2(n)) if n > 1 else 0
    return Cost(flops, 0, io_bytes(avals_in, avals_out))


def check_sort(keys: ShapedArray, values: ShapedArray, dimension: Any) -> int:
    if keys.dtype.kind not in "biu":
        raise TypeError(
            f"sort_key_val: keys must be integers or booleans (this book's sort "
            f"compares no floats), got {keys.str_short()}"
        )
    if keys.shape != values.shape:
        raise TypeError(
            f"sort_key_val: keys {keys.str_short()} and values "
            f"{values.str_short()} must have one shape"
        )
    return _normalize_axes("sort_key_val", dimension, keys.ndim)[0]


def check_permutation(key, x, axis):
    check_key("permutation", key)
    if type(x) is int or (get_aval(_as_input(x, "permutation")).ndim == 0):
        if get_aval(x).dtype.kind not in "iu":
            raise TypeError(
                "permutation: x must be an integer or an array of at least one "
                f"axis, got {get_aval(x).str_short()}"
            )
        return np.arange(int(x)), 0
    return x, _normalize_axes("permutation", axis, get_aval(x).ndim)[0]


lax_namespace.sort_key_val = sort_key_val

# %% [markdown]
# The shuffles equal JAX's, for an `arange`, for the rows of a matrix, for each
# row independently, and for an array large enough to need two rounds of
# sorting:

# %%
matrix = np.arange(12.0).reshape(3, 4)
for name, draw in {
    "arange(10)": lambda r, k: r.permutation(k, 10),
    "rows": lambda r, k: r.permutation(k, matrix),
    "each row": lambda r, k: r.permutation(k, matrix, axis=1, independent=True),
    "2000 (2 rounds)": lambda r, k: r.permutation(k, 2000),
}.items():
    print(f"{name:16}", compare_with_jax(draw))


# %% [markdown]
# ## Randomness and the transformations
#
# Because a key is an ordinary array and the generator is ordinary primitives,
# the transformations need nothing new. Back to the opening demo: with a key as
# an argument, a jitted function gives new noise for a new key, and under
# `vmap` each example gets its own key and so its own noise.


# %%
def add_noise(x, key):
    return x + random.normal(key, x.shape)


noisy = jit(add_noise)
print(noisy(np.zeros(3), random.PRNGKey(0)))
print(noisy(np.zeros(3), random.PRNGKey(1)))
print(vmap(add_noise)(np.zeros((4, 3)), random.split(random.PRNGKey(0), 4)))


# %% [markdown]
# Dropout is the common case: during training, zero each activation with
# probability `rate` and scale the rest by $1/(1 - \text{rate})$. Here it sits in
# a training step that is jitted, computes per-example gradients with `vmap`
# (one key per example, split from the step's key) and takes the mean. The same
# program in JAX (folded) gives the same weights, up to the order of
# floating-point sums.


# %%
def dropout(key, x, rate):
    keep = random.bernoulli(key, 1.0 - rate, x.shape)
    return anp.where(keep, x / (1.0 - rate), 0.0)


def loss(w, key, x, y):
    hidden = dropout(key, anp.tanh(x @ w), rate=0.5)
    return anp.sum((hidden - y) ** 2)


@jit
def step(w, key, xs, ys):
    keys = random.split(key, xs.shape[0])
    grads = vmap(grad(loss), in_axes=(None, 0, 0, 0))(w, keys, xs, ys)
    return w - 0.1 * anp.mean(grads, axis=0)


# %% tags=["hide-input"]
# @title The same step in JAX: jax_step
def jax_dropout(key, x, rate):
    keep = jax.random.bernoulli(key, 1.0 - rate, x.shape)
    return jnp.where(keep, x / (1.0 - rate), 0.0)


def jax_loss(w, key, x, y):
    hidden = jax_dropout(key, jnp.tanh(x @ w), rate=0.5)
    return jnp.sum((hidden - y) ** 2)


@jax.jit
def jax_step(w, key, xs, ys):
    keys = jax.random.split(key, xs.shape[0])
    grads = jax.vmap(jax.grad(jax_loss), in_axes=(None, 0, 0, 0))(w, keys, xs, ys)
    return w - 0.1 * grads.mean(axis=0)


# %% [markdown]
# Three steps of each, from the same weights and keys:

# %%
data_rng = np.random.default_rng(1)
w0, xs, ys = (
    data_rng.normal(size=(3, 4)),
    data_rng.normal(size=(8, 3)),
    data_rng.normal(size=(8, 4)),
)
key, w, jw = random.PRNGKey(0), w0, w0
with jax.enable_x64(True):
    for i in range(3):
        w = step(w, random.fold_in(key, i), xs, ys)
        jw = jax_step(jw, jax.random.fold_in(key, i), xs, ys)
print(
    "largest difference from JAX after 3 steps:",
    float(np.max(np.abs(np.asarray(w) - np.asarray(jw)))),
)


# %% [markdown]
# `grad` differentiates with respect to `w` only; the key is an integer array,
# and integers have no tangents. The noise is a function of the key alone, so
# the forward pass and any recomputation of it (reverse mode through a
# {ref}`checkpoint <part11>` runs the forward pass again) draw exactly the same
# numbers:
# nothing about the generator's state could have changed in between, because
# there is none.
#
# ## Where real JAX differs
#
# - **Typed keys.** `jax.random.key(seed)` returns a *typed* key array, of shape
#   `()` and dtype `key<fry>`, which is not an integer array and refuses
#   arithmetic; `jax.random.PRNGKey(seed)` returns the raw `uint32[2]` we use
#   everywhere. `jax.random.key_data` turns a typed key into those two words,
#   and they equal `PRNGKey`'s. Our `random.key` returns the raw key too.
# - **Other generators.** JAX's default implementation is `threefry2x32`
#   (the setting `jax_default_prng_impl`). It also has `rbg` and `unsafe_rbg`,
#   built on XLA's own random-bit generator instead of a hash written with
#   integer operations, and a few others, chosen with
#   `jax.random.key(seed, impl=...)`; they give other numbers.
# - **The partitionable setting.** `jax_threefry_partitionable` is on by default
#   in the installed JAX. With it, each number's counter is its position in the
#   output, which is what we implemented; with it off, JAX hashes the counters
#   in two halves (`jax/_src/random/threefry2x32.py`) and gives other numbers.
# - **64-bit defaults.** Our module's default dtypes are 64-bit (float64,
#   `uint64` bits, `int64` integers), as in JAX with `jax_enable_x64` on.
#   Without it, JAX's defaults are 32-bit, and a seed keeps only its low 32
#   bits: `PRNGKey(2**40 + 7)` is then the key of 7.
# - **What is missing.** The other distributions of `jax.random` (gamma, beta,
#   truncated normal, ...), each a function of uniform floats or bits like the
#   ones above, and `choice`. Our `sort` compares integer keys only; JAX's also
#   sorts floats (in a total order that places NaNs), several keys at once, and
#   any number of operands.
#
# ## Exercises
#
# **1. A stream of keys.** Write `keys_for_steps(key, n)` that returns the `n`
# keys `fold_in(key, 0)`, ..., `fold_in(key, n - 1)` as one `uint32[n, 2]` array,
# with `vmap` instead of a Python loop.


# %% tags=["hide-input"]
# @title A solution
def keys_for_steps(key, n):
    return vmap(lambda i: random.fold_in(key, i))(np.arange(n, dtype=np.uint32))


print(same_bits(keys_for_steps(key, 5),
                jnp.stack([jax.random.fold_in(key, i) for i in range(5)])))  # fmt: skip


# %% [markdown]
# **2. Exponential noise.** JAX's `jax.random.exponential(key, shape)` is
# $-\log(1 - u)$ for uniform $u$ (JAX writes it with `log1p`, which our module
# does not have). Write it with `random.uniform` and `log`, and check that the
# mean of $10^5$ samples is close to 1.


# %% tags=["hide-input"]
# @title A solution
def exponential(key, shape):
    return neg(log(1.0 - random.uniform(key, shape)))


print(float(np.mean(exponential(key, (100_000,)))))
