"""Tests of the random-numbers chapter (book/random.md) against jax.random.

Bit for bit: keys, split, fold_in, bits, uniform, normal, bernoulli, randint
and categorical against jax.random with the same key and arguments (JAX in
64-bit mode, as conftest sets it, which is our module's own convention),
eagerly, under jit, under vmap over keys and inside scan; floats compared as
their raw bits. The new integer primitives against jax.lax on uint32 (and
other integer) inputs, with wrapping; their rules (zero tangents, batching,
lowering); statistics as a supplement; the errors.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import raises_clearly

import autodidax as ad
from autodidax import random

pytestmark = pytest.mark.usefixtures("clean_interpreter_stack")

SEEDS = [0, 2**40 + 7, -3, 2**63 - 1]


def raw_bits(x) -> np.ndarray:
    x = np.asarray(x)
    return x.view(f"uint{8 * x.itemsize}") if x.dtype.kind == "f" else x


def assert_same_bits(ours, theirs) -> None:
    a, b = np.asarray(ours), np.asarray(theirs)
    assert a.dtype == b.dtype and a.shape == b.shape, (
        a.dtype,
        b.dtype,
        a.shape,
        b.shape,
    )
    assert np.array_equal(raw_bits(a), raw_bits(b))


def usable() -> None:
    assert np.asarray(random.PRNGKey(0)).shape == (2,)


# ------------------------------------------------------------------ keys


@pytest.mark.parametrize("seed", SEEDS)
def test_prngkey_split_fold_in_bits_equal_jax(seed):
    key, jkey = random.PRNGKey(seed), jax.random.PRNGKey(seed)
    assert_same_bits(key, jkey)
    assert_same_bits(ad.jit(random.PRNGKey)(np.int64(seed)), jkey)
    assert_same_bits(random.split(key), jax.random.split(jkey))
    assert_same_bits(random.split(key, 5), jax.random.split(jkey, 5))
    assert_same_bits(random.split(key, (2, 3)), jax.random.split(jkey, (2, 3)))
    for data in [0, 1, 7, 2**32 - 1]:
        assert_same_bits(random.fold_in(key, data), jax.random.fold_in(jkey, data))
    fold = ad.jit(random.fold_in)(key, np.uint32(12345))
    assert_same_bits(fold, jax.random.fold_in(jkey, 12345))


def test_key_is_the_raw_key_of_jax_random_key():
    for seed in [0, 9, 2**40 + 7]:
        assert_same_bits(random.key(seed), jax.random.key_data(jax.random.key(seed)))


@pytest.mark.parametrize("dtype", [np.uint8, np.uint16, np.uint32, np.uint64])
@pytest.mark.parametrize("shape", [(), (7,), (2, 0, 3)])
def test_bits_equal_jax(dtype, shape):
    key, jkey = random.PRNGKey(11), jax.random.PRNGKey(11)
    theirs = jax.random.bits(jkey, shape, dtype)
    assert_same_bits(random.bits(key, shape, dtype), theirs)
    assert_same_bits(ad.jit(lambda k: random.bits(k, shape, dtype))(key), theirs)


def test_bits_default_dtype_is_uint64_as_jax_with_x64():
    key = random.PRNGKey(3)
    assert_same_bits(
        random.bits(key, (4,)), jax.random.bits(jax.random.PRNGKey(3), (4,))
    )


# --------------------------------------------------------------- floats

SHAPES = [(), (5,), (0,), (2, 1, 3)]


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
@pytest.mark.parametrize("shape", SHAPES)
def test_uniform_equals_jax_eager_and_jit(dtype, shape):
    for lo, hi in [(0.0, 1.0), (-2.5, 3.0)]:
        # One jitted function for both seeds (the key is its argument): one
        # trace and compile, the second key through the cached executable.
        jitted = ad.jit(lambda k, lo=lo, hi=hi: random.uniform(k, shape, dtype, lo, hi))
        for seed in [0, 123]:
            key, jkey = random.PRNGKey(seed), jax.random.PRNGKey(seed)
            theirs = jax.random.uniform(jkey, shape, dtype, lo, hi)
            assert_same_bits(random.uniform(key, shape, dtype, lo, hi), theirs)
            assert_same_bits(jitted(key), theirs)


def test_uniform_with_array_bounds_equals_jax():
    key, jkey = random.PRNGKey(5), jax.random.PRNGKey(5)
    lo = np.array([-1.0, 0.0, 10.0], np.float32)
    hi = np.array([[1.0], [2.0]], np.float32)
    theirs = jax.random.uniform(jkey, (2, 3), np.float32, lo, hi)
    assert_same_bits(random.uniform(key, (2, 3), np.float32, lo, hi), theirs)
    traced = ad.jit(lambda k, a, b: random.uniform(k, (2, 3), np.float32, a, b))
    assert_same_bits(traced(key, lo, hi), theirs)


def test_uniform_default_dtype_is_float64_as_jax_with_x64():
    assert_same_bits(
        random.uniform(random.PRNGKey(1)), jax.random.uniform(jax.random.PRNGKey(1))
    )


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape", [(), (3, 5), (0,)])
def test_normal_equals_jax_eager_and_jit(dtype, shape):
    for seed in [0, 77]:
        key, jkey = random.PRNGKey(seed), jax.random.PRNGKey(seed)
        theirs = jax.random.normal(jkey, shape, dtype)
        assert_same_bits(random.normal(key, shape, dtype), theirs)
        assert_same_bits(ad.jit(lambda k: random.normal(k, shape, dtype))(key), theirs)


SAMPLERS = {
    "uniform32": lambda r, k: r.uniform(k, (3, 5), np.float32, -1.5, 4.0),
    "uniform64": lambda r, k: r.uniform(k, (4,), np.float64, -1.5, 4.0),
    "normal32": lambda r, k: r.normal(k, (6,), np.float32),
    "normal64": lambda r, k: r.normal(k, (2, 3)),
    "bits32": lambda r, k: r.bits(k, (5,), np.uint32),
    "split": lambda r, k: r.split(k, 3),
    "fold_in": lambda r, k: r.fold_in(k, 99),
    "bernoulli": lambda r, k: r.bernoulli(k, 0.3, (9,)),
    "randint": lambda r, k: r.randint(k, (6,), -5, 1000),
    "categorical": lambda r, k: r.categorical(
        k, np.log(np.array([0.2, 0.3, 0.5])), shape=(7,)
    ),
}


@pytest.mark.parametrize("name", sorted(SAMPLERS))
def test_vmap_over_keys_equals_jax(name):
    draw = SAMPLERS[name]
    keys, jkeys = (
        random.split(random.PRNGKey(8), 4),
        jax.random.split(jax.random.PRNGKey(8), 4),
    )
    theirs = jax.vmap(lambda k: draw(jax.random, k))(jkeys)
    assert_same_bits(ad.vmap(lambda k: draw(random, k))(keys), theirs)
    assert_same_bits(ad.jit(ad.vmap(lambda k: draw(random, k)))(keys), theirs)
    assert_same_bits(
        ad.vmap(lambda k: draw(random, k), in_axes=1, out_axes=1)(keys.T),
        jnp.moveaxis(theirs, 0, 1) if theirs.ndim > 1 else theirs,
    )


def test_inside_scan_a_key_per_step_equals_jax():
    def body(key, _):
        key, sub = random.split(key)
        return key, random.normal(sub, (3,), np.float32)

    def jbody(key, _):
        key, sub = jax.random.split(key)
        return key, jax.random.normal(sub, (3,), np.float32)

    _, ours = ad.scan(body, random.PRNGKey(4), None, length=5)
    _, theirs = jax.lax.scan(jbody, jax.random.PRNGKey(4), None, length=5)
    assert_same_bits(ours, theirs)


# ------------------------------------------------------------ discrete


@pytest.mark.parametrize("p", [0.0, 0.3, 1.0])
def test_bernoulli_equals_jax(p):
    key, jkey = random.PRNGKey(21), jax.random.PRNGKey(21)
    assert_same_bits(
        random.bernoulli(key, p, (3, 4)), jax.random.bernoulli(jkey, p, (3, 4))
    )
    ps = np.array([0.1, p, 0.9], np.float32)
    assert_same_bits(random.bernoulli(key, ps), jax.random.bernoulli(jkey, ps))
    assert_same_bits(
        random.bernoulli(key, ps, (2, 3)), jax.random.bernoulli(jkey, ps, (2, 3))
    )


@pytest.mark.parametrize("dtype", [np.int8, np.uint16, np.int32, np.uint64])
def test_randint_equals_jax(dtype):
    key, jkey = random.PRNGKey(13), jax.random.PRNGKey(13)
    for lo, hi in [(0, 10), (3, 3), (5, 2), (0, 256), (1, 2**31)]:
        theirs = jax.random.randint(jkey, (7,), lo, hi, dtype)
        assert_same_bits(random.randint(key, (7,), lo, hi, dtype), theirs)
    if np.dtype(dtype).kind == "i":
        lo = np.array([-5, 0, 7], np.int64)
        theirs = jax.random.randint(jkey, (2, 3), lo, 50, dtype)
        assert_same_bits(random.randint(key, (2, 3), lo, 50, dtype), theirs)


def test_randint_default_int64_and_wide_ranges_equal_jax():
    key, jkey = random.PRNGKey(2), jax.random.PRNGKey(2)
    for lo, hi in [(-(2**40), 2**50), (-(2**63), 2**63 - 1), (0, 1)]:
        assert_same_bits(
            random.randint(key, (5,), lo, hi), jax.random.randint(jkey, (5,), lo, hi)
        )
    traced = ad.jit(lambda k, a, b: random.randint(k, (4,), a, b))
    assert_same_bits(
        traced(key, np.int64(-3), np.int64(9)), jax.random.randint(jkey, (4,), -3, 9)
    )


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_categorical_equals_jax(dtype):
    logits = np.log(np.array([[0.1, 0.2, 0.7], [0.5, 0.25, 0.25]])).astype(dtype)
    for seed in [0, 5]:
        key, jkey = random.PRNGKey(seed), jax.random.PRNGKey(seed)
        for kwargs in [
            {},
            {"axis": 0},
            {"shape": (50, 2)},
            {"axis": 0, "shape": (4, 3)},
        ]:
            theirs = jax.random.categorical(jkey, logits, **kwargs)
            assert_same_bits(random.categorical(key, logits, **kwargs), theirs)


# -------------------------------------------------------- primitives


U32 = np.uint32


def uint32_inputs():
    rng = np.random.default_rng(0)
    x = rng.integers(0, 2**32, (6,), dtype=U32)
    x[:2] = [2**32 - 1, 2**32 - 2]  # near the top: additions wrap
    y = rng.integers(0, 2**32, (6,), dtype=U32)
    return x, y


@pytest.mark.parametrize(
    "ours, theirs",
    [
        (ad.add, jax.lax.add),
        (ad.mul, jax.lax.mul),
        (ad.bitwise_xor, jax.lax.bitwise_xor),
        (ad.bitwise_or, jax.lax.bitwise_or),
        (ad.bitwise_and, jax.lax.bitwise_and),
        (ad.rem, jax.lax.rem),
    ],
)
def test_bit_primitives_equal_lax_on_uint32(ours, theirs):
    x, y = uint32_inputs()
    y = np.maximum(y, 1)
    assert_same_bits(ours(x, y), theirs(x, y))
    assert_same_bits(ad.jit(ours)(x, y), theirs(x, y))
    assert_same_bits(
        ad.vmap(ours, in_axes=(0, None))(x.reshape(2, 3), y[:3]),
        jax.vmap(theirs, in_axes=(0, None))(x.reshape(2, 3), y[:3]),
    )


@pytest.mark.parametrize("dtype", [np.uint32, np.int32, np.uint64, np.int64, np.uint8])
@pytest.mark.parametrize(
    "ours, theirs",
    [
        (ad.shift_left, jax.lax.shift_left),
        (ad.shift_right_logical, jax.lax.shift_right_logical),
    ],
)
def test_shifts_equal_lax_including_wide_and_negative_shifts(ours, theirs, dtype):
    info = np.iinfo(dtype)
    rng = np.random.default_rng(1)
    x = rng.integers(info.min, info.max, (40,), dtype=dtype, endpoint=True)
    width = 8 * np.dtype(dtype).itemsize
    low = -3 if info.min < 0 else 0
    s = rng.integers(low, width + 9, (40,)).astype(dtype)
    assert_same_bits(ours(x, s), theirs(x, s))
    assert_same_bits(ad.jit(ours)(x, s), theirs(x, s))


def test_rem_of_signed_integers_has_the_sign_of_the_dividend():
    x = np.array([-7, 7, -7, 7, 0], np.int32)
    y = np.array([3, -3, -3, 3, 5], np.int32)
    assert_same_bits(ad.rem(x, y), jax.lax.rem(x, y))
    assert_same_bits(ad.jit(ad.rem)(x, y), jax.lax.rem(x, y))


@pytest.mark.parametrize(
    "x, dtype",
    [
        (np.array([0, 1, 0x3F800000, 2**32 - 1], np.uint32), np.float32),
        (np.array([1.5, -0.0, np.inf], np.float32), np.uint32),
        (np.array([1.5, -2.25], np.float64), np.uint64),
        (np.array([-1, 5], np.int32), np.uint32),
    ],
)
def test_bitcast_convert_type_equals_lax(x, dtype):
    theirs = jax.lax.bitcast_convert_type(x, dtype)
    assert_same_bits(ad.bitcast_convert_type(x, dtype), theirs)
    assert_same_bits(ad.jit(lambda v: ad.bitcast_convert_type(v, dtype))(x), theirs)
    batched = ad.vmap(lambda v: ad.bitcast_convert_type(v, dtype))(np.stack([x, x]))
    assert_same_bits(batched, np.stack([theirs, theirs]))


def test_iota_equals_lax():
    assert_same_bits(ad.iota(np.uint32, 7), jax.lax.iota(np.uint32, 7))
    assert_same_bits(ad.jit(lambda: ad.iota(np.int64, 5))(), jax.lax.iota(np.int64, 5))
    assert_same_bits(ad.iota(np.uint32, 0), jax.lax.iota(np.uint32, 0))


def test_erf_inv_equals_lax_bit_for_bit_and_its_derivative():
    for dtype in [np.float32, np.float64]:
        x = np.linspace(-0.99, 0.99, 41, dtype=dtype)
        assert_same_bits(ad.erf_inv(x), jax.lax.erf_inv(x))
        assert_same_bits(ad.jit(ad.erf_inv)(x), jax.lax.erf_inv(x))
    x = np.array([-0.5, 0.1, 0.7])
    ours = ad.vmap(ad.grad(ad.erf_inv))(x)
    np.testing.assert_allclose(ours, jax.vmap(jax.grad(jax.lax.erf_inv))(x), rtol=1e-12)
    # not linear: erf_inv(a + b) != erf_inv(a) + erf_inv(b)
    assert not np.isclose(ad.erf_inv(0.3 + 0.4), ad.erf_inv(0.3) + ad.erf_inv(0.4))


def test_bit_primitives_give_zero_tangents():
    x, y = uint32_inputs()
    for fn in [ad.bitwise_xor, ad.shift_left, ad.rem]:
        out, tangent = ad.jvp(
            fn, (x, np.maximum(y, 1)), (np.zeros_like(x), np.zeros_like(y))
        )
        assert_same_bits(out, fn(x, np.maximum(y, 1)))
        assert not np.any(np.asarray(tangent))
    _, tangent = ad.jvp(
        lambda v: ad.bitcast_convert_type(v, np.uint32),
        (np.float32([1.5]),),
        (np.float32([1.0]),),
    )
    assert not np.any(np.asarray(tangent))


def test_make_jaxpr_of_uniform_is_ordinary_primitives():
    jaxpr, _, _ = ad.make_jaxpr(
        lambda k: random.uniform(k, (4,), np.float32), ad.ShapedArray((2,), np.uint32)
    )
    names = set()

    def walk(j):
        for eqn in j.eqns:
            names.add(eqn.primitive.name)
            if "jaxpr" in eqn.params:
                walk(eqn.params["jaxpr"])

    walk(jaxpr)
    assert {
        "xor",
        "shift_left",
        "shift_right_logical",
        "or",
        "add",
        "bitcast_convert_type",
        "iota",
    } <= names
    assert "threefry2x32" not in names


def test_cost_of_the_bit_primitives_equals_xla():
    x = jnp.arange(12, dtype=jnp.uint32).reshape(3, 4)
    for ours, theirs in [
        (ad.bitwise_xor, jax.lax.bitwise_xor),
        (ad.shift_left, jax.lax.shift_left),
        (ad.rem, jax.lax.rem),
    ]:
        expected = jax.jit(theirs).lower(x, x + 1).compile().cost_analysis()
        costs = ad.cost_analysis(
            ours, ad.get_aval(np.asarray(x)), ad.get_aval(np.asarray(x))
        )
        assert costs["flops"] == expected["flops"]
        assert costs["bytes accessed"] == expected["bytes accessed"]
    f = jnp.full((12,), 0.3, jnp.float32)
    expected = jax.jit(jax.lax.erf_inv).lower(f).compile().cost_analysis()
    costs = ad.cost_analysis(ad.erf_inv, ad.ShapedArray((12,), np.float32))
    assert (costs["flops"], costs["transcendentals"]) == (
        expected["flops"],
        expected["transcendentals"],
    )


# ------------------------------------------------------ transformations


def test_grad_through_noise_equals_jax():
    def loss(w, key):
        return ad.reduce_sum(ad.sin(w * random.normal(key, (3,))))

    def jloss(w, key):
        return jnp.sum(jnp.sin(w * jax.random.normal(key, (3,))))

    w = np.array([0.5, -1.0, 2.0])
    ours = ad.jit(ad.grad(loss))(w, random.PRNGKey(3))
    np.testing.assert_allclose(
        ours, jax.grad(jloss)(w, jax.random.PRNGKey(3)), rtol=1e-12
    )


def test_statistics_of_10_5_samples():
    key = random.PRNGKey(0)
    u = np.asarray(random.uniform(key, (100_000,)))
    assert abs(u.mean() - 0.5) < 0.01 and abs(u.var() - 1 / 12) < 0.005
    assert u.min() >= 0.0 and u.max() < 1.0
    n = np.asarray(random.normal(key, (100_000,), np.float32))
    assert abs(n.mean()) < 0.02 and abs(n.var() - 1.0) < 0.02
    b = np.asarray(random.bernoulli(key, 0.25, (100_000,)))
    assert abs(b.mean() - 0.25) < 0.01
    r = np.asarray(random.randint(key, (100_000,), 0, 10))
    assert r.min() == 0 and r.max() == 9 and abs(r.mean() - 4.5) < 0.05


# -------------------------------------------------------------- errors


@pytest.mark.parametrize(
    "bad, kind, match",
    [
        (
            np.zeros(2, np.float32),
            TypeError,
            r"uniform: a key is a uint32 array of shape \(2,\).*float32\[2\]",
        ),
        (
            np.zeros(3, np.uint32),
            TypeError,
            r"uniform: a key is a uint32 array of shape \(2,\), got uint32\[3\]",
        ),
        (
            np.zeros((4, 2), np.uint32),
            ValueError,
            r"uint32\[4,2\] \(a batch of keys\? use vmap\)",
        ),
    ],
)
def test_a_key_of_the_wrong_shape_or_dtype_is_a_clear_error(bad, kind, match):
    with raises_clearly(kind, match, usable):
        random.uniform(bad, (3,))
    with raises_clearly(kind, match.replace("uniform", "split"), usable):
        random.split(bad)
    with raises_clearly(kind, match, usable):  # found while tracing
        ad.jit(lambda k: random.uniform(k, (3,)))(bad)
    with pytest.raises(kind):  # the same kind of exception as JAX's
        jax.random.uniform(jnp.asarray(bad), (3,))


def test_bad_shapes_and_num_are_clear_errors():
    key = random.PRNGKey(0)
    with raises_clearly(
        TypeError,
        r"normal: shape must be a tuple of non-negative integers, got 2.5",
        usable,
    ):
        random.normal(key, 2.5)
    with raises_clearly(
        ValueError, r"uniform: shape \(3, -1\) has a negative dimension", usable
    ):
        random.uniform(key, (3, -1))
    with raises_clearly(
        TypeError,
        r"split: num must be a tuple of non-negative integers, got 2.0",
        usable,
    ):
        random.split(key, 2.0)
    with raises_clearly(
        ValueError, r"bits: dtype must be an unsigned integer dtype, got int32", usable
    ):
        random.bits(key, (2,), np.int32)
    with raises_clearly(
        ValueError, r"uniform: dtype must be a float dtype, got int32", usable
    ):
        random.uniform(key, (2,), np.int32)


def test_bounds_that_do_not_broadcast_to_shape_are_clear_errors():
    key = random.PRNGKey(0)
    with raises_clearly(
        ValueError,
        r"uniform: minval and maxval must broadcast to shape \(3,\), got one of "
        r"shape \(5,\)",
        usable,
    ):
        random.uniform(key, (3,), minval=np.zeros(5))
    with raises_clearly(
        ValueError,
        r"randint: minval and maxval must broadcast to shape \(4,\), got one of "
        r"shape \(2, 4\)",
        usable,
    ):
        random.randint(key, (4,), np.zeros((2, 4), np.int64), 9)
    with pytest.raises(ValueError):  # JAX refuses it too
        jax.random.randint(jax.random.PRNGKey(0), (4,), jnp.zeros((2, 4), int), 9)


def test_bad_seeds_data_and_probabilities_are_clear_errors():
    key = random.PRNGKey(0)
    with raises_clearly(
        TypeError,
        r"PRNGKey: the seed must be an integer scalar, got float64\[\]",
        usable,
    ):
        random.PRNGKey(np.float64(1.5))
    with raises_clearly(
        TypeError,
        r"PRNGKey: the seed must be an integer scalar, got int64\[3\]",
        usable,
    ):
        random.PRNGKey(np.arange(3))
    with raises_clearly(
        TypeError, r"fold_in: data must be an integer scalar, got float64\[\]", usable
    ):
        random.fold_in(key, np.float64(2.0))
    with raises_clearly(
        TypeError, r"bernoulli: the probability p must be a float, got int64", usable
    ):
        random.bernoulli(key, np.int64(1))
    with raises_clearly(
        TypeError, r"randint: dtype must be an integer dtype, got float32", usable
    ):
        random.randint(key, (2,), 0, 5, np.float32)


def test_bit_primitives_refuse_floats_clearly():
    x = np.ones(3, np.float32)
    with raises_clearly(
        TypeError,
        r"xor: expected an integer or boolean array, got (dtype )?float32",
        usable,
    ):
        ad.bitwise_xor(x, x)
    with raises_clearly(
        TypeError,
        r"shift_left: expected an integer array, got (dtype )?float32",
        usable,
    ):
        ad.jit(ad.shift_left)(x, x)
    with raises_clearly(
        TypeError,
        r"bitcast_convert_type: cannot read the bits of float32\[3\] as float64",
        usable,
    ):
        ad.bitcast_convert_type(x, np.float64)


# ---------------------------------------------------------- permutation


@pytest.mark.parametrize(
    "draw",
    [
        lambda r, k: r.permutation(k, 10),
        lambda r, k: r.permutation(k, np.int64(7)),
        lambda r, k: r.permutation(k, np.arange(12.0).reshape(3, 4)),
        lambda r, k: r.permutation(k, np.arange(12.0).reshape(3, 4), axis=1),
        lambda r, k: r.permutation(k, np.arange(12).reshape(3, 4), 1, True),
        lambda r, k: r.permutation(k, np.arange(24.0).reshape(2, 3, 4), -1, True),
        lambda r, k: r.permutation(k, 1700),  # two rounds of sorting
        lambda r, k: r.permutation(k, 0),
    ],
)
def test_permutation_equals_jax(draw):
    keys = random.split(random.PRNGKey(6), 3)
    jkeys = jax.random.split(jax.random.PRNGKey(6), 3)
    assert_same_bits(draw(random, keys[0]), draw(jax.random, jkeys[0]))
    jitted = ad.jit(lambda k: draw(random, k))
    assert_same_bits(jitted(keys[1]), draw(jax.random, jkeys[1]))
    batched = ad.vmap(lambda k: draw(random, k))(keys)
    assert_same_bits(batched, jax.vmap(lambda k: draw(jax.random, k))(jkeys))


def test_sort_key_val_equals_lax_with_every_rule():
    rng = np.random.default_rng(3)
    keys = rng.integers(0, 4, (3, 6)).astype(np.uint32)  # many ties: stability
    values = rng.normal(size=(3, 6))
    for dim in (0, 1, -1):
        theirs = jax.lax.sort_key_val(keys, values, dim)
        jitted = ad.jit(lambda k, v, d=dim: ad.lax.sort_key_val(k, v, d))
        for ours in (ad.lax.sort_key_val(keys, values, dim), jitted(keys, values)):
            for a, b in zip(ours, theirs):
                assert_same_bits(a, b)
    signed = rng.integers(-5, 5, (7,))
    assert_same_bits(
        ad.lax.sort_key_val(signed, values[0, :1].repeat(7))[0], np.sort(signed)
    )
    batched = ad.vmap(ad.lax.sort_key_val, in_axes=(0, None))(keys, values[0])
    theirs = jax.vmap(jax.lax.sort_key_val, in_axes=(0, None))(keys, values[0])
    for a, b in zip(batched, theirs):
        assert_same_bits(a, b)

    def f(v):
        return ad.reduce_sum(ad.lax.sort_key_val(keys, v, 1)[1] * np.arange(6.0))

    def jf(v):
        return jnp.sum(jax.lax.sort_key_val(keys, v, 1)[1] * np.arange(6.0))

    np.testing.assert_allclose(ad.grad(f)(values), jax.grad(jf)(values), rtol=1e-12)
    np.testing.assert_allclose(
        ad.jit(ad.grad(f))(values), jax.grad(jf)(values), rtol=1e-12
    )
    costs = ad.cost_analysis(
        lambda k, v: ad.lax.sort_key_val(k, v, 0), keys[0], values[0]
    )
    xla = jax.jit(lambda k, v: jax.lax.sort_key_val(k, v, 0)).lower(keys[0], values[0])
    xla = xla.compile().cost_analysis()
    assert (costs["flops"], costs["bytes accessed"]) == (
        xla["flops"],
        xla["bytes accessed"],
    )


def test_sort_and_permutation_errors_are_clear():
    with raises_clearly(
        TypeError, r"sort_key_val: keys must be integers.*float64\[3\]", usable
    ):
        ad.lax.sort_key_val(np.ones(3), np.ones(3))
    with raises_clearly(
        TypeError, r"keys uint32\[3\] and values float64\[4\] must have", usable
    ):
        ad.lax.sort_key_val(np.ones(3, np.uint32), np.ones(4))
    with raises_clearly(
        TypeError, r"permutation: x must be an integer or an array", usable
    ):
        random.permutation(random.PRNGKey(0), 2.5)
