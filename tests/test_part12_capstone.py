"""Tests of Part 12, the capstone: the transformer of the chapter's ``model``
cells, run on autodidax and on JAX from the same source
(``capstone_tools.model_namespace``).

One training step's loss and gradients equal JAX's (float64 to 1e-9 per
leaf, float32 to 1e-5); three Adam steps equal; the ``pmap`` data-parallel
version equals the single-device one; ``checkpoint`` reduces the saved
residuals in both libraries (the scan keeps only each layer's input);
generation is deterministic for a fixed key and picks the tokens JAX's
does; the batches are JAX's; the helper's errors. The model is the
chapter's, made smaller (the cost of a test is XLA compiling it, not
running it).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import jax
import numpy as np
import pytest
from jax._src.ad_checkpoint import saved_residuals as jax_saved_residuals

import autodidax as ad

ROOT = Path(__file__).resolve().parent.parent


def _load_tools():
    # Imported from its file: putting book/ on sys.path would let the chapter
    # scripts there (book/random.py) shadow standard modules.
    spec = importlib.util.spec_from_file_location(
        "capstone_tools", ROOT / "book" / "capstone_tools.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


tools = _load_tools()
OURS = tools.model_namespace("autodidax")
JAX = tools.model_namespace("jax")
TEXT = tools.load_text()
VOCAB = tools.Vocabulary(TEXT)
DATA = VOCAB.encode(TEXT)
CONFIG = dict(vocab_size=len(VOCAB), d_model=16, n_layers=2, d_ff=32, context=8)
N_HEADS, BATCH, LR = 2, 8, 3e-3


def params_of(dtype):
    return OURS["init_params"](np.random.default_rng(0), **CONFIG, dtype=dtype)


def batches(steps):
    key = ad.random.PRNGKey(0)
    return OURS["sample_batches"](
        key, DATA, steps=steps, batch_size=BATCH, context=CONFIG["context"]
    )


def assert_trees_close(ours, theirs, rtol, atol):
    ours_leaves, ours_tree = ad.tree_flatten(ours)
    theirs_leaves, theirs_tree = jax.tree_util.tree_flatten(theirs)
    assert len(ours_leaves) == len(theirs_leaves)
    for a, b in zip(ours_leaves, theirs_leaves):
        a, b = np.asarray(a), np.asarray(b)
        assert a.dtype == b.dtype and a.shape == b.shape
        np.testing.assert_allclose(a, b, rtol=rtol, atol=atol)


def test_the_chapter_has_the_model_and_the_helper_runs_it_on_both() -> None:
    source = tools.model_source()
    for name in ["def init_params", "def forward", "def loss_fn", "def adam_step"]:
        assert name in source
    assert "import" not in source  # the cells use the backend's names only
    assert OURS["jax"] is ad and JAX["jax"] is jax
    assert len(VOCAB) == len(set(TEXT)) and VOCAB.decode(DATA[:50]) == TEXT[:50]


def test_sampled_batches_are_jaxs() -> None:
    ours = batches(3)
    theirs = JAX["sample_batches"](
        jax.random.PRNGKey(0), DATA, steps=3, batch_size=BATCH, context=8
    )
    for a, b in zip(ours, theirs):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    inputs, targets = ours
    np.testing.assert_array_equal(inputs[..., 1:], targets[..., :-1])


@pytest.mark.parametrize("dtype, tol", [(np.float64, 1e-9), (np.float32, 1e-5)])
def test_one_step_loss_and_gradients_equal_jaxs(dtype, tol) -> None:
    params = params_of(dtype)
    inputs, targets = (x[0] for x in batches(1))

    def loss_and_grads(ns):
        step = ns["jax"].jit(ns["jax"].value_and_grad(ns["loss_fn"]), static_argnums=3)
        return step(params, inputs, targets, N_HEADS)

    loss, grads = loss_and_grads(OURS)
    jax_loss, jax_grads = loss_and_grads(JAX)
    assert np.asarray(loss).dtype == dtype
    np.testing.assert_allclose(float(loss), float(jax_loss), rtol=tol)
    assert_trees_close(grads, jax_grads, rtol=tol, atol=tol)


def test_three_adam_steps_equal_jaxs() -> None:
    params = params_of(np.float64)
    trained, losses = OURS["train"](params, batches(3), n_heads=N_HEADS, lr=LR)
    jax_trained, jax_losses = JAX["train"](params, batches(3), n_heads=N_HEADS, lr=LR)
    np.testing.assert_allclose(losses, jax_losses, rtol=1e-9)
    assert_trees_close(trained, jax_trained, rtol=1e-9, atol=1e-9)
    assert losses[2] < losses[0]  # Adam took steps downhill


def test_pmap_data_parallel_equals_one_device() -> None:
    params, steps = params_of(np.float64), batches(2)
    single, losses = OURS["train"](params, steps, n_heads=N_HEADS, lr=LR)
    parallel, parallel_losses = OURS["parallel_train"](
        params, steps, n_heads=N_HEADS, lr=LR, devices=8
    )
    np.testing.assert_allclose(parallel_losses, losses, rtol=1e-9)
    ours_leaves = ad.tree_leaves(parallel)
    for a, b in zip(ours_leaves, ad.tree_leaves(single)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-9, atol=1e-9)


def test_checkpoint_saves_fewer_residuals_in_both() -> None:
    # The bytes differ from JAX's (the chapter says why: zeros made while
    # tracing become constants, and broadcasts are saved at full size); what
    # both must show is the cut, and that the layers' stacked residuals go.
    params = params_of(np.float64)
    inputs, targets = (x[0] for x in batches(1))
    found = {}
    for remat in [False, True]:
        ours = ad.saved_residuals(
            lambda p, r=remat: OURS["loss_fn"](p, inputs, targets, N_HEADS, r), params
        )
        theirs = jax_saved_residuals(
            lambda p, r=remat: JAX["loss_fn"](p, inputs, targets, N_HEADS, r), params
        )
        stacked = [a for a, where in ours if where == "output of scan"]
        jax_stacked = [a for a, where in theirs if "output of scan" in where]
        # the stacked activations: one row per layer, then the batch axis
        stacked = [a for a in stacked if a.shape[1:2] == (BATCH,)]
        jax_stacked = [a for a in jax_stacked if a.shape[1:2] == (BATCH,)]
        found[remat] = (ad.residual_bytes(ours), ad.residual_bytes(theirs))
        found[remat] += (len(stacked), len(jax_stacked))
    assert found[True][0] < found[False][0] / 2
    assert found[True][1] < found[False][1] / 2
    # with checkpoint, the scan keeps one activation per layer: its input
    assert found[True][2:] == (1, 1)


def test_generation_is_deterministic_and_picks_jaxs_tokens() -> None:
    params = params_of(np.float64)
    prompt = DATA[:8]
    key = ad.random.PRNGKey(1)
    sampled = OURS["generate"](params, prompt, 6, n_heads=N_HEADS, key=key)
    assert sampled == OURS["generate"](params, prompt, 6, n_heads=N_HEADS, key=key)
    assert sampled[:8] == list(prompt) and len(sampled) == 14
    jax_sampled = JAX["generate"](params, prompt, 6, n_heads=N_HEADS, key=key)
    assert sampled == jax_sampled
    greedy = OURS["generate"](params, prompt, 4, n_heads=N_HEADS)
    assert greedy == JAX["generate"](params, prompt, 4, n_heads=N_HEADS)


def test_model_namespace_names_a_wrong_backend() -> None:
    with pytest.raises(ValueError, match="backend must be one of .* got 'numpy'"):
        tools.model_namespace("numpy")
