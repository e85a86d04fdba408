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
# (part12)=
# # Part 12: a transformer, trained with autodidax
#
# :::{admonition} Where we are
# :class: note
# Eleven parts built JAX's transformations one at a time, each tested on small
# programs. This one uses them all at once, on a program a JAX user might
# write on a good day: a small language model, trained from scratch.
# :::
#
# A library earns trust on a real program, one that nobody wrote to fit it. So
# this chapter writes one the way a JAX user would: a character-level
# transformer (the architecture of GPT, in miniature) that reads the prose of
# this book's first five parts and learns to write more of it. Nothing in it
# is special to autodidax. It begins with
#
# ```python
# import autodidax as jax
# import autodidax.numpy as jnp
# from autodidax import lax
# ```
#
# and, with those three lines changed to `import jax`, `import jax.numpy as
# jnp` and `from jax import lax`, the same source runs on JAX. We do exactly
# that, and train both from the same initial parameters on the same batches,
# step for step. In float64 the two loss curves must agree to one part in a
# million over the whole run; they do, far better.
#
# Every part of the book has a job in it:
#
# | the model needs | built in |
# | --- | --- |
# | embeddings, `params["tok"][tokens]`, and their gradient | {ref}`indexing <indexing>` (a gather; its transpose adds into the rows read) |
# | attention: `einsum`, a causal mask, `softmax` | the {ref}`primitives appendix <appendix-primitives>` (`dot_general`, `select`, reductions) |
# | the layers, run by `lax.scan` over stacked weights | {ref}`Part 7 <part7>` |
# | each layer under `jax.checkpoint` | {ref}`Part 11 <part11>` |
# | `jax.jit(jax.value_and_grad(loss))` | {ref}`Parts 3 and 4 <part3>` |
# | Adam, written with `jax.tree.map` over a nested dict | {ref}`Part 1 <part1>`'s pytrees |
# | the batches, drawn with `jax.random` | {ref}`random numbers <random>` |
# | data parallelism: `jax.pmap` and `lax.pmean` | {ref}`Part 9 <part9>` |
#
# The plan: the model first, then the data, then the training run next to JAX
# with its loss curves; float32 and why it drifts; what `checkpoint` saves;
# the same training on eight devices; and text written by the trained model.

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

book_setup.load_book(globals(), before="part12_capstone")

# %% [markdown]
# (part12-model)=
# ## The model, as a JAX user writes it
#
# The imports of the model are these, and nothing else:

# %%
import numpy as np

import autodidax as jax
import autodidax.numpy as jnp
from autodidax import lax


# %% [markdown]
# The code cells of this section are tagged `model`. A small helper,
# `capstone_tools.model_namespace(backend)`, reads this chapter's source,
# takes those cells in order, and runs them after one backend's imports; with
# `"jax"` it gives the same functions, built on JAX. There is one copy of the
# model, and both libraries run it.
#
# **Parameters** are a nested dict of NumPy arrays, drawn once from a seeded
# NumPy generator so that both libraries start from the same numbers. The
# layers' weights are *stacked*: `layers["w_qkv"]` has shape `(n_layers,
# d_model, 3 * d_model)`, one row per layer, which is the shape `scan` wants to
# walk through.


# %% tags=["model"]
def init_params(rng, *, vocab_size, d_model, n_layers, d_ff, context, dtype):
    """A nested dict of arrays; each leaf under "layers" has one row per layer."""

    def normal(*shape):
        return (0.02 * rng.standard_normal(shape)).astype(dtype)

    L, D = n_layers, d_model
    layers = {
        "ln1_g": np.ones((L, D), dtype), "ln1_b": np.zeros((L, D), dtype),
        "w_qkv": normal(L, D, 3 * D), "w_o": normal(L, D, D),
        "ln2_g": np.ones((L, D), dtype), "ln2_b": np.zeros((L, D), dtype),
        "w_in": normal(L, D, d_ff), "b_in": np.zeros((L, d_ff), dtype),
        "w_out": normal(L, d_ff, D), "b_out": np.zeros((L, D), dtype),
    }  # fmt: skip
    return {
        "tok": normal(vocab_size, D), "pos": normal(context, D), "layers": layers,
        "lnf_g": np.ones(D, dtype), "lnf_b": np.zeros(D, dtype),
    }  # fmt: skip


# %% [markdown]
# **One layer** is the standard pre-norm transformer block. Attention first:
# each position's vector is projected to a query, a key and a value; `einsum`
# scores every query against every key, head by head; the mask keeps a
# position from looking at later ones (the model predicts the next character,
# so it must not see it); `softmax` (which subtracts the row's maximum before
# it exponentiates) turns scores into weights, and the output is the weighted
# sum of the values. Then an MLP with `gelu`. Both are added to their input
# (residual connections), after a layer norm.


# %% tags=["model"]
def layer_norm(x, g, b, eps=1e-5):
    mean = x.mean(axis=-1, keepdims=True)
    var = jnp.var(x, axis=-1, keepdims=True)
    return (x - mean) * lax.rsqrt(var + eps) * g + b


def attention(x, p, n_heads):
    B, T, D = x.shape
    q, k, v = jnp.split(x @ p["w_qkv"], 3, axis=-1)

    def heads(t):  # (B, T, D) -> (B, T, heads, D // heads)
        return t.reshape(B, T, n_heads, D // n_heads)

    scores = jnp.einsum("bqhd,bkhd->bhqk", heads(q), heads(k)) / (D // n_heads) ** 0.5
    causal = jnp.tril(jnp.ones((T, T), dtype=bool))
    scores = jnp.where(causal, scores, -1e9)
    weights = jax.nn.softmax(scores, axis=-1)
    out = jnp.einsum("bhqk,bkhd->bqhd", weights, heads(v)).reshape(B, T, D)
    return out @ p["w_o"]


def block(x, p, n_heads):
    x = x + attention(layer_norm(x, p["ln1_g"], p["ln1_b"]), p, n_heads)
    h = jax.nn.gelu(layer_norm(x, p["ln2_g"], p["ln2_b"]) @ p["w_in"] + p["b_in"])
    return x + h @ p["w_out"] + p["b_out"]


# %% [markdown]
# **The forward pass** looks up each character's embedding and adds a
# position's, runs the layers with `lax.scan` (the carry is the activations,
# the scanned-over input is the dict of stacked weights, so each trip gets one
# layer's weights), and scores every character of the vocabulary at every
# position against the final vectors, reusing the embedding matrix. Each layer
# is wrapped in `jax.checkpoint`, so its activations are recomputed in the
# backward pass instead of saved; `remat=False` turns that off, for the
# measurement below. The loss is the cross-entropy of the next character:
# `log_softmax` of the scores, the entry of the right character picked by
# `take_along_axis`, averaged.


# %% tags=["model"]
def forward(params, tokens, n_heads, remat=True):
    T = tokens.shape[1]
    x = params["tok"][tokens] + params["pos"][:T]

    def layer(x, p):
        return block(x, p, n_heads), None

    x, _ = lax.scan(jax.checkpoint(layer) if remat else layer, x, params["layers"])
    x = layer_norm(x, params["lnf_g"], params["lnf_b"])
    return x @ params["tok"].T


def loss_fn(params, inputs, targets, n_heads, remat=True):
    logp = jax.nn.log_softmax(forward(params, inputs, n_heads, remat), axis=-1)
    picked = jnp.take_along_axis(logp, targets[..., None], axis=-1)
    return -picked.mean()


# %% [markdown]
# **Adam** keeps two running averages per parameter, of the gradient and of
# its square, and a step count; each is a `tree.map` over the nested dict. The
# training step is `value_and_grad` of the loss followed by Adam, under `jit`.
# The number of heads changes the shapes, so it is a static argument, given by
# keyword; the learning rate is an ordinary traced one.


# %% tags=["model"]
def adam_init(params):
    zeros = jax.tree.map(jnp.zeros_like, params)
    return zeros, zeros, 0


def adam_step(params, grads, state, lr=1e-3, b1=0.9, b2=0.999, eps=1e-8):
    m, v, t = state
    t = t + 1
    m = jax.tree.map(lambda m, g: b1 * m + (1 - b1) * g, m, grads)
    v = jax.tree.map(lambda v, g: b2 * v + (1 - b2) * g * g, v, grads)

    def update(p, m, v):
        mhat = m / (1 - b1**t)
        vhat = v / (1 - b2**t)
        return p - lr * mhat / (jnp.sqrt(vhat) + eps)

    return jax.tree.map(update, params, m, v), (m, v, t)


def train_step(params, opt_state, inputs, targets, *, n_heads, lr):
    loss, grads = jax.value_and_grad(loss_fn)(params, inputs, targets, n_heads)
    params, opt_state = adam_step(params, grads, opt_state, lr=lr)
    return params, opt_state, loss


train_step = jax.jit(train_step, static_argnames="n_heads")


# %% [markdown]
# **Batches** are windows of the text at random places. The places come from
# one call of `jax.random.randint`, so all the batches are a pure function of
# one key; autodidax's `random` equals JAX's bit for bit, so both libraries
# draw the same windows. Training is then a plain Python loop over them.


# %% tags=["model"]
def sample_batches(key, data, *, steps, batch_size, context):
    """For each step, batch_size windows of context + 1 characters: the inputs
    and, one character later, the targets; each (steps, batch_size, context)."""
    starts = jax.random.randint(
        key, (steps, batch_size), 0, len(data) - context, jnp.int32
    )
    windows = data[np.asarray(starts)[..., None] + np.arange(context + 1)]
    return windows[..., :-1], windows[..., 1:]


def train(params, batches, *, n_heads, lr):
    """A step of Adam per batch; the trained parameters and every step's loss."""
    opt_state, losses = adam_init(params), []
    for inputs, targets in zip(*batches):
        params, opt_state, loss = train_step(
            params, opt_state, inputs, targets, n_heads=n_heads, lr=lr
        )
        losses.append(loss)
    return params, np.array([float(loss) for loss in losses])


# %% [markdown]
# **Writing text** runs the model on the last `context` characters and picks
# the next one: the most likely (greedy), or a draw from the model's
# distribution (`jax.random.categorical`, with a key folded with the
# position), as often as asked.


# %% tags=["model"]
def next_logits(params, window, n_heads):
    return forward(params, window[None], n_heads)[0, -1]


next_logits = jax.jit(next_logits, static_argnames="n_heads")


def generate(params, prompt, length, *, n_heads, key=None, temperature=1.0):
    """``prompt`` (token ids, at least ``context`` of them) and ``length`` more:
    greedy if ``key`` is None, else sampled."""
    tokens, context = list(prompt), params["pos"].shape[0]
    for i in range(length):
        logits = next_logits(params, np.array(tokens[-context:]), n_heads=n_heads)
        if key is None:
            tokens.append(int(jnp.argmax(logits)))
        else:
            draw = jax.random.categorical(
                jax.random.fold_in(key, i), logits / temperature
            )
            tokens.append(int(draw))
    return tokens


# %% [markdown]
# That is the whole model: about a hundred lines, with nothing in them that
# JAX would not accept.
#
# (part12-data)=
# ## The data
#
# The text is `data/book_prose.txt`: the prose of Parts 1 to 5 (headings and
# paragraphs, without code cells, labels or directives), cut once from the
# chapters and committed, so that it stays the same when the chapters change.
# Its vocabulary is the characters it uses, sorted.

# %% tags=["hide-input"]
# @title The text and its vocabulary (`capstone_tools`, next to the notebook)
try:
    import capstone_tools
except ImportError:  # Colab: fetch it first
    book_setup.fetch_if_missing("capstone_tools.py", "book/capstone_tools.py")
    import capstone_tools

text = capstone_tools.load_text()
vocab = capstone_tools.Vocabulary(text)
data = vocab.encode(text)  # one int32 per character

# %%
print(f"{len(text):,} characters, {len(vocab)} distinct:")
print(repr("".join(vocab.chars)))
print(text[:300])

# %% [markdown]
# The model is small, so that the whole chapter runs in a minute on a laptop:
# two layers of width 32 with four heads, a context of 32 characters, batches
# of 16 windows, 300 steps.

# %%
config = dict(vocab_size=len(vocab), d_model=32, n_layers=2, d_ff=128, context=32)
n_heads, batch_size, steps, lr = 4, 16, 200, 3e-3
params0 = init_params(np.random.default_rng(0), **config, dtype=np.float64)
key = jax.random.PRNGKey(0)
batches = sample_batches(key, data, steps=steps, batch_size=batch_size, context=32)
print(sum(leaf.size for leaf in jax.tree_leaves(params0)), "parameters")
print("inputs, targets:", batches[0].shape, batches[1].shape)

# %% [markdown]
# (part12-training)=
# ## Training, next to JAX
#
# Ours first:

# %%
params, losses = train(params0, batches, n_heads=n_heads, lr=lr)
print(f"loss: {losses[0]:.4f} at the first step, {losses[-1]:.4f} at the last")

# %% [markdown]
# The first loss is about $\ln 94 \approx 4.54$, the loss of a uniform guess
# among 94 characters, as it should be for small random weights. Now the same
# cells on JAX, in float64 like ours (`jax.enable_x64`, for these calls only),
# from the same `params0` and the same key. First the batches, which must be
# the same:

# %% tags=["hide-input"]
# @title The model's cells again, run on JAX (`model_namespace("jax")`)
import jax as real_jax  # the name `jax` is autodidax on this page

on_jax = capstone_tools.model_namespace("jax")

# %%
with real_jax.enable_x64(True):
    jax_batches = on_jax["sample_batches"](
        key, data, steps=steps, batch_size=batch_size, context=32
    )
print("same batches:", all(np.array_equal(a, b) for a, b in zip(batches, jax_batches)))

# %% [markdown]
# Then the training run:

# %%
with real_jax.enable_x64(True):
    jax_params, jax_losses = on_jax["train"](
        params0, jax_batches, n_heads=n_heads, lr=lr
    )
gap = np.abs(losses - jax_losses) / np.abs(jax_losses)
print(f"largest relative difference of the losses over {steps} steps: {gap.max():.1e}")
leaf_gaps = jax.tree_map(
    lambda a, b: float(np.max(np.abs(np.asarray(a) - np.asarray(b)))),
    params,
    jax_params,
)
print(
    f"largest difference of a trained parameter: {max(jax.tree_leaves(leaf_gaps)):.1e}"
)

# %% mystnb={"image": {"alt": "Training loss against step, 0 to 300, for autodidax (a red line) and JAX (blue rings every 10 steps, lying on the line). The loss falls from about 4.5 to about 2.5."}} tags=["hide-input"]
# @title Figure: the two loss curves
capstone_tools.loss_chart(
    {"autodidax": losses, "JAX": jax_losses},
    title="Training loss, autodidax and JAX, float64",
    ring_every=10,
)

# %% [markdown]
# The curves are one curve. Not because the two libraries compute the same
# operations (they do not: our `var`, `softmax` and `gelu` are written with
# other primitives than JAX's, and XLA fuses the two programs differently),
# but because in float64 those differences are rounding errors of about
# $10^{-16}$, and 300 steps of Adam do not blow them up to anything visible.
#
# ## Float32: how far the curves drift, and why
#
# In float32 the rounding errors are of about $10^{-7}$, nine orders of
# magnitude larger. The same run, 100 steps, with float32 parameters (JAX's
# default precision, so no `enable_x64`):

# %%
params0_f32 = init_params(np.random.default_rng(0), **config, dtype=np.float32)
short = (batches[0][:50], batches[1][:50])  # the first 50 batches
_, losses_f32 = train(params0_f32, short, n_heads=n_heads, lr=lr)
_, jax_losses_f32 = on_jax["train"](params0_f32, short, n_heads=n_heads, lr=lr)
drift = np.abs(losses_f32 - jax_losses_f32) / np.abs(jax_losses_f32)
for step in [0, 1, 10, 30, 49]:
    print(f"step {step:3}: relative difference {drift[step]:.1e}")

# %% [markdown]
# At the first step the two losses differ by about one float32 rounding error;
# then the gap grows. That is what different rounding does to training, not a
# sign of a wrong derivative: every Adam step feeds the parameters' tiny
# differences back into the next forward pass, and near the start, where
# $\sqrt{\hat v}$ is small, Adam divides by it and amplifies them. To check
# that explanation, train JAX against *itself*, with one parameter changed by
# the smallest possible float32 step (one unit in the last place):

# %%
nudged = jax.tree_map(np.copy, params0_f32)
nudged["tok"][0, 0] = np.nextafter(nudged["tok"][0, 0], np.float32(1))
_, jax_nudged = on_jax["train"](nudged, short, n_heads=n_heads, lr=lr)
self_drift = np.abs(jax_nudged - jax_losses_f32) / np.abs(jax_losses_f32)
for step in [0, 1, 10, 30, 49]:
    print(f"step {step:3}: JAX against JAX nudged by one ulp {self_drift[step]:.1e}")

# %% [markdown]
# JAX against a one-ulp nudge of itself drifts by the same order as
# autodidax against JAX: the size of the gap is set by float32 and by
# training, not by either library.
#
# (part12-memory)=
# ## What `checkpoint` saves
#
# Part 11's `saved_residuals` lists what reverse mode keeps for the backward
# pass; `residual_bytes` adds up their sizes (leaving out the arguments, which
# are alive anyway). Here is the loss on one batch, with and without the
# checkpoint around each layer, in both libraries:

# %% tags=["hide-input"]
# @title saved_residuals: ours from the module (Part 11), JAX's from jax._src
from jax._src.ad_checkpoint import saved_residuals as jax_saved_residuals

from autodidax import residual_bytes, saved_residuals

# %%
inputs, targets = batches[0][0], batches[1][0]  # the first batch
print("             autodidax        JAX")
for remat in [False, True]:

    def loss_of(p, remat=remat):
        return loss_fn(p, inputs, targets, n_heads, remat)

    def jax_loss_of(p, remat=remat):
        return on_jax["loss_fn"](p, inputs, targets, n_heads, remat)

    ours = residual_bytes(saved_residuals(loss_of, params0))
    with real_jax.enable_x64(True):
        theirs = residual_bytes(jax_saved_residuals(jax_loss_of, params0))
    print(f"remat={remat!s:5}  {ours / 1e3:8.1f} kB  {theirs / 1e3:8.1f} kB")


# %% [markdown]
# Without the checkpoint, the scan stacks every intermediate value of the
# block that the backward pass needs, once per layer: the layer norms'
# normalized values, the attention weights (batch × heads × 32 × 32 per layer),
# the MLP's pre-activations. With it, a layer saves its input only, and the
# backward pass runs the layer forward again first. The attention weights
# alone are $16 \cdot 4 \cdot 32 \cdot 32 \cdot 8$ bytes = 524 kB a layer,
# which is why the saving grows with the context: the weights grow as its
# square.
#
# (part12-pmap)=
# ## Data parallel, on eight devices
#
# Data parallelism splits each batch across devices. Every device holds the
# whole model, computes the loss and the gradients on its share of the batch,
# and then all of them average the gradients (`lax.pmean`) before taking the
# same Adam step, so the copies never diverge. Averaging the per-device means
# of equal shares is the mean over the whole batch, so the result is the
# single-device run again. The step, as `pmap` wants it: a function of arrays
# with a leading device axis; the hyper-parameters are closed over.


# %% tags=["model"]
def parallel_train_step(params, opt_state, inputs, targets, *, n_heads, lr):
    loss, grads = jax.value_and_grad(loss_fn)(params, inputs, targets, n_heads)
    loss, grads = lax.pmean((loss, grads), axis_name="devices")
    params, opt_state = adam_step(params, grads, opt_state, lr=lr)
    return params, opt_state, loss


def parallel_train(params, batches, *, n_heads, lr, devices):
    """``train``, with each batch split over ``devices`` devices."""

    def step_fn(params, opt_state, inputs, targets):
        return parallel_train_step(
            params, opt_state, inputs, targets, n_heads=n_heads, lr=lr
        )

    step_fn = jax.pmap(step_fn, axis_name="devices")

    def replicate(tree):  # one copy per device, stacked
        return jax.tree.map(lambda x: np.stack([np.asarray(x)] * devices), tree)

    def shard(x):  # (batch, ...) -> (devices, batch // devices, ...)
        return x.reshape(devices, -1, *x.shape[1:])

    params, opt_state, losses = replicate(params), replicate(adam_init(params)), []
    for inputs, targets in zip(*batches):
        params, opt_state, loss = step_fn(
            params, opt_state, shard(inputs), shard(targets)
        )
        losses.append(loss[0])
    one_copy = jax.tree.map(lambda x: x[0], params)
    return one_copy, np.array([float(loss) for loss in losses])


# %% [markdown]
# Twenty steps on eight devices, two windows each, against the first twenty
# steps of the single-device run above:

# %%
print(len(jax.devices()), "devices")
first = (batches[0][:20], batches[1][:20])
pmap_params, pmap_losses = parallel_train(
    params0, first, n_heads=n_heads, lr=lr, devices=8
)
print(
    "largest relative difference of the losses:",
    f"{np.max(np.abs(pmap_losses - losses[:20]) / losses[:20]):.1e}",
)

# %% [markdown]
# The difference is rounding again: eight partial means added by an
# all-reduce instead of one sum over the whole batch.
#
# (part12-text)=
# ## Text from the trained model
#
# The prompt is the first 32 characters of the text; after it, 200 characters
# chosen greedily, then 200 sampled (temperature 1, a fixed key):

# %%
prompt = data[:32]
greedy = generate(params, prompt, 200, n_heads=n_heads)
sampled = generate(params, prompt, 200, n_heads=n_heads, key=jax.random.PRNGKey(1))
print("greedy: ", vocab.decode(greedy))
print()
print("sampled:", vocab.decode(sampled))

# %% [markdown]
# Three hundred steps on batches of 16 windows have shown the model about
# 150,000 characters, a pass and a half over the text: it has learned which
# characters are common, some short words and where spaces go. Greedy
# decoding falls into a loop of its likeliest words; sampling is more varied
# and less English.
#
# (part12-longer)=
# ## A longer run
#
# ## Where real JAX differs
#
# ## Summary
#
# ## Exercises
