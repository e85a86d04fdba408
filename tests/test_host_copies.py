"""Arrays are values: writing to a NumPy array after handing it to autodidax
changes nothing that autodidax already made from it.

On CPU, jaxlib's ``batched_device_put`` may let a device buffer share the NumPy
array's memory when that memory is 64-byte aligned (the default, zero-copy
semantics), and JAX 0.10.2's own ``device_put`` and ``jit`` do so
(jax-ml/jax#37830). Ours asks for a copy finished before the call returns:
in Part 3's ``device_put`` and the performance page's fast-path copiers. Part
9's ``shard_rows`` hands jaxlib fresh copies of the rows, which nothing else
can write to. Each test writes to the NumPy array right after the call
and compares with NumPy on a copy of the original values taken before.
"""

from __future__ import annotations

import numpy as np
import pytest

import autodidax as ad

pytestmark = pytest.mark.usefixtures("clean_interpreter_stack")

SIZE = 1 << 20  # large enough that an execution still runs when the call returns


def aligned_values(size: int = SIZE) -> np.ndarray:
    """Float64 values in memory aligned to 64 bytes: the case jaxlib may share."""
    raw = np.empty(size + 8)
    skip = (-raw.ctypes.data % 64) // 8
    x = raw[skip : skip + size]
    x[:] = np.linspace(-2.0, 2.0, size)
    assert x.ctypes.data % 64 == 0
    return x


def many_steps(x):
    for _ in range(12):
        x = ad.sin(x) * 0.5 + x
    return x


def many_steps_numpy(x: np.ndarray) -> np.ndarray:
    for _ in range(12):
        x = np.sin(x) * 0.5 + x
    return x


def test_device_put_copies():
    x = aligned_values()
    original = x.copy()
    a = ad.device_put(x)
    x[:] = 0.0
    np.testing.assert_array_equal(np.asarray(a), original)


@pytest.mark.parametrize("jit", [ad.jit, ad.full_path_jit], ids=["fast", "full"])
def test_jit_result_ignores_later_writes_to_its_argument(jit):
    f = jit(many_steps)
    f(aligned_values())  # trace, compile; the next calls take the fast path
    for _ in range(3):
        x = aligned_values()
        expected = many_steps_numpy(x.copy())
        out = f(x)
        x[:] = 0.0  # while the executable may still be running
        np.testing.assert_allclose(np.asarray(out), expected, rtol=1e-12, atol=0)


def test_pmap_rows_are_copies():
    devices = tuple(ad.devices()[:2])
    x = aligned_values(len(devices) * 4096).reshape(len(devices), 4096)
    original = x.copy()
    rows = ad.shard_rows(x, devices)  # what pmap does with a host argument
    x[:] = 0.0
    np.testing.assert_array_equal(np.asarray(rows), original)


@pytest.mark.parametrize(
    "x",
    [
        np.broadcast_to(np.arange(3.0), (4, 3)),  # vmap's and pmap's constants
        np.zeros((4, 0)),  # rows with no elements
        np.arange(12.0).reshape(3, 4).T,  # rows that are not contiguous
    ],
    ids=["broadcast", "empty-rows", "transposed"],
)
def test_pmap_rows_of_unusual_layouts(x):
    devices = tuple(ad.devices()[: x.shape[0]])
    np.testing.assert_array_equal(np.asarray(ad.shard_rows(x, devices)), x)
    out = ad.pmap(lambda row: row * 2.0)(x)
    np.testing.assert_array_equal(np.asarray(out), x * 2.0)
