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
# step for step. In float64 the two loss curves agree to about one part in
# $10^{12}$ over the whole run.
#
# Most parts of the book have a job in it:
#
# | the model needs | built in |
# | --- | --- |
# | embeddings, `params["tok"][tokens]`, and their gradient | {ref}`indexing <indexing>` (a gather; its transpose adds into the rows read) |
# | attention: `einsum`, a causal mask, `softmax` | the {ref}`primitives appendix <appendix>` (`dot_general`, `select`, reductions) |
# | the layers, run by `lax.scan` over stacked weights | {ref}`Part 7 <part7>` |
# | each layer under `jax.checkpoint` | {ref}`Part 11 <part11>` |
# | `jax.jit(jax.value_and_grad(loss))` | {ref}`Part 3 <part3>` and {ref}`Part 4 <part4>` |
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
# The model's code uses NumPy for its initial parameters and three names from
# autodidax, and nothing else (the training loop below also cuts the batch
# windows out of the text with NumPy):

# %%
import numpy as np

import autodidax as jax
import autodidax.numpy as jnp
from autodidax import lax


# %% [markdown]
# The six code cells that follow, and one in the section on data
# parallelism, carry a cell tag, `model`. A small helper,
# `capstone_tools.model_namespace(backend)`, reads this chapter's source,
# takes those cells in order, and runs them after one backend's imports; with
# `"jax"` it returns the same functions, built on JAX. There is one copy of
# the model, and both libraries run it.
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
        "ln1_g": np.ones((L, D), dtype),
        "ln1_b": np.zeros((L, D), dtype),
        "w_qkv": normal(L, D, 3 * D),
        "w_o": normal(L, D, D),
        "ln2_g": np.ones((L, D), dtype),
        "ln2_b": np.zeros((L, D), dtype),
        "w_in": normal(L, D, d_ff),
        "b_in": np.zeros((L, d_ff), dtype),
        "w_out": normal(L, d_ff, D),
        "b_out": np.zeros((L, D), dtype),
    }
    return {
        "tok": normal(vocab_size, D),
        "pos": normal(context, D),
        "layers": layers,
        "lnf_g": np.ones(D, dtype),
        "lnf_b": np.zeros(D, dtype),
    }


# %% [markdown]
# **One layer** is the standard pre-norm transformer block. Attention first:
# each position's vector is projected to a query, a key and a value; `einsum`
# scores every query against every key, head by head; the mask keeps a
# position from looking at later ones (the model predicts the next character,
# so it must not see it); `softmax` (which subtracts the row's maximum before
# it exponentiates) turns scores into weights, and the output is the weighted
# sum of the values. Then an MLP with `gelu`. Each of the two reads a
# layer-normed copy of its input, and its output is added back to that input
# (a residual connection).


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
# The model is small, so that the whole chapter runs in about a minute on a
# laptop: two layers of width 32 with four heads, a context of 32 characters,
# batches of 16 windows, 200 steps, learning rate 0.003.

# %%
config = dict(vocab_size=len(vocab), d_model=32, n_layers=2, d_ff=128, context=32)
n_heads, batch_size, steps, lr = 4, 16, 200, 3e-3
params0 = init_params(np.random.default_rng(0), **config, dtype=np.float64)
key = jax.random.PRNGKey(0)
batches = sample_batches(key, data, steps=steps, batch_size=batch_size, context=32)
print(sum(leaf.size for leaf in jax.tree.leaves(params0)), "parameters")
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
# among 94 characters, as it should be for small random weights. Now JAX. The
# helper runs this chapter's `model` cells again, after JAX's imports, and
# returns what they define:

# %%
import jax as real_jax  # JAX itself: on this page, the name `jax` is autodidax

on_jax = capstone_tools.model_namespace("jax")  # the model cells, after:
print(capstone_tools.BACKENDS["jax"])

# %% [markdown]
# JAX computes in float32 unless `jax_enable_x64` is on; ours, in float64.
# So the JAX calls run under `jax.enable_x64(True)`, which turns it on for
# the calls inside the block only. Same key, same batches:

# %%
with real_jax.enable_x64(True):
    jax_batches = on_jax["sample_batches"](
        key, data, steps=steps, batch_size=batch_size, context=32
    )
print("same batches:", all(np.array_equal(a, b) for a, b in zip(batches, jax_batches)))

# %% [markdown]
# Then the training run, from the same `params0`:

# %%
with real_jax.enable_x64(True):
    jax_params, jax_losses = on_jax["train"](
        params0, jax_batches, n_heads=n_heads, lr=lr
    )
gap = np.abs(losses - jax_losses) / np.abs(jax_losses)
print(f"largest relative difference of the losses over {steps} steps: {gap.max():.1e}")
param_gap = max(
    np.max(np.abs(np.asarray(a) - np.asarray(b)))
    for a, b in zip(jax.tree.leaves(params), real_jax.tree.leaves(jax_params))
)
print(f"largest difference of a trained parameter: {param_gap:.1e}")

# %% mystnb={"image": {"alt": "Training loss against step, 0 to 199, for autodidax (a red line) and JAX (blue rings every 10 steps, lying on the line). The loss falls from about 4.5 to about 2.7, quickly at first, then slowly."}} tags=["hide-input"]
# @title Figure: the two loss curves
capstone_tools.loss_chart(
    {"autodidax": losses, "JAX": jax_losses},
    title="Training loss, autodidax and JAX, float64",
    ring_every=10,
)

# %% [markdown]
# The curves are one curve. The two libraries do not run the same compiled
# program (the next section shows that their roundings differ), but in float64 the
# differences are rounding errors of about $10^{-16}$, and 200 steps of
# Adam do not make them visible.
#
# ## Float32: how far the curves drift, and why
#
# In float32 a rounding error is about $10^{-7}$ of a value, where in
# float64 it is about $10^{-16}$. The same training, 50 steps, from the same
# parameters in float32 (JAX's default precision, so without `enable_x64`):

# %%
params0_f32 = init_params(np.random.default_rng(0), **config, dtype=np.float32)
first50 = (batches[0][:50], batches[1][:50])
_, losses_f32 = train(params0_f32, first50, n_heads=n_heads, lr=lr)
_, jax_losses_f32 = on_jax["train"](params0_f32, first50, n_heads=n_heads, lr=lr)
drift = np.abs(losses_f32 - jax_losses_f32) / np.abs(jax_losses_f32)
print("float32 gap below 1e-5 for steps 0-19:", bool(drift[:20].max() < 1e-5))
print("float32 gap above 1e-4 at step 49:    ", bool(drift[49] > 1e-4))
print("float64 gap below 1e-12 at every step:", bool(gap[:50].max() < 1e-12))

# %% [markdown]
# The last digits of a float32 gap depend on the processor: XLA chooses its
# vector instructions for the CPU it compiles on, and a sum taken in another
# order rounds differently. So the table and the figure below, computed on the
# machine that built this page, show other last digits on another machine
# (their cells are not compared when the tests re-run this page); the three
# lines above hold on every machine we test on.

# %% tags=["nbval-ignore-output"]
print("step   float32 gap   float64 gap (from the run above)")
for step in [0, 1, 10, 20, 30, 40, 49]:
    print(f"{step:4}   {drift[step]:11.1e}   {gap[step]:11.1e}")

# %% mystnb={"image": {"alt": "The relative difference between the losses of autodidax and JAX against the training step, 0 to 49, on a logarithmic axis. The float32 curve starts near 2e-7, stays near 1e-6 until step 20, then rises to about 4e-3. The float64 curve lies on the bottom line, zero, with a few blips to 1e-16, until step 20, then rises parallel to the float32 one, ten orders of magnitude lower, to about 2e-13."}} tags=["hide-input", "nbval-ignore-output"]
# @title Figure: the gap between the two libraries' losses, float32 and float64
capstone_tools.drift_chart(
    {"float32": drift, "float64": gap[:50]},
    title="Relative difference of the losses, autodidax against JAX",
    floor=1e-17,
)

# %% [markdown]
# At the first step the float32 losses are two rounding errors apart. For
# twenty steps the gap stays near $10^{-6}$; from step 20 to step 49 it grows
# more than a thousandfold, to four parts in a thousand: each step feeds the
# parameters' differences into the next one, and training amplifies them. In
# float64 the gap is zero or a single rounding error ($10^{-16}$) for the same
# twenty steps; then it grows too, by the same factor as the float32 gap from
# step 30 to step 49 (35-fold in both), about ten orders of magnitude lower. A
# wrong derivative would not look like this: it would show in float64 from the
# first step.
#
# Where do the two libraries round differently? Not in the formulas: our
# `softmax`, `log_softmax`, `gelu` and `var` compute what JAX's do, in the same
# order. Compiled alone, the loss of the first batch is the same float32
# number, to the last bit, in both:

# %%
inputs, targets = batches[0][0], batches[1][0]  # the first batch
ours_alone = jax.jit(loss_fn, static_argnums=3)(params0_f32, inputs, targets, n_heads)
jax_alone = real_jax.jit(on_jax["loss_fn"], static_argnums=3)(
    params0_f32, inputs, targets, n_heads
)
print("compiled alone:           ", float(ours_alone), float(jax_alone))
print("inside the training step: ", losses_f32[0], jax_losses_f32[0])

# %% [markdown]
# Inside the training step, JAX's loss is still that number; ours is two
# roundings away from it. There XLA compiles the forward pass together with
# the backward pass and Adam, into one program for each library, and the two
# programs are not the same program (ours broadcasts where JAX's operations
# take axes of size 1, for instance), so XLA is free to fuse and order them
# differently. We have not pinned down which operation rounds differently; in
# float64 the two programs give the same loss, to the last bit or one rounding,
# for twenty steps.
#
# (part12-memory)=
# ## What `checkpoint` saves
#
# Part 11's `saved_residuals` lists what reverse mode keeps for the backward
# pass; `residual_bytes` adds up their sizes (leaving out the arguments, which
# are alive anyway). Here is the loss on the first batch, with and without the
# checkpoint around each layer, in both libraries:

# %% tags=["hide-input"]
# @title saved_residuals: ours from the module (Part 11), JAX's from jax._src
from jax._src.ad_checkpoint import saved_residuals as jax_saved_residuals

from autodidax import residual_bytes, saved_residuals

# %%
for remat in [False, True]:
    ours = saved_residuals(
        lambda p, remat=remat: loss_fn(p, inputs, targets, n_heads, remat), params0
    )
    with real_jax.enable_x64(True):
        theirs = jax_saved_residuals(
            lambda p, remat=remat: on_jax["loss_fn"](
                p, inputs, targets, n_heads, remat
            ),
            params0,
        )
    print(
        f"remat={remat!s:5}  autodidax {residual_bytes(ours) / 1e6:5.2f} MB",
        f"  JAX {residual_bytes(theirs) / 1e6:5.2f} MB",
    )


# %% [markdown]
# Without the checkpoint, the scan stacks, once per layer, every value of the
# block that the backward pass reads: the layer norms' normalized values, the
# attention weights (batch × heads × 32 × 32 numbers a layer, 0.5 MB in
# float64), the MLP's pre-activations. With it, a layer keeps its input only,
# and the backward pass runs the layer forward again before going back
# through it. What is left is outside the layers: the final layer norm and
# the loss.
#
# Checkpointing cuts both libraries' residuals by a large factor, but ours
# keeps more than JAX's in both cases. Sorting our residuals by where they
# come from shows why:


# %% tags=["hide-input"]
# @title Our residuals with checkpoint, by where they come from
def residual_kind(where):
    if where.startswith("from a constant"):
        return "constants made while tracing"
    if where.startswith("output of broadcast"):
        return "full-size broadcasts"
    return "everything else"


kinds = {}
for aval, where in saved_residuals(
    lambda p: loss_fn(p, inputs, targets, n_heads), params0
):
    kinds.setdefault(residual_kind(where), []).append((aval, where))
for kind, found in kinds.items():
    print(f"{kind:30} {len(found):3} arrays  {residual_bytes(found) / 1e6:5.2f} MB")


# %% [markdown]
# - **Constants made while tracing.** When a derivative rule needs an array
#   of zeros (the tangent of the mask's `-1e9`, of the maximum that
#   `softmax` subtracts under `stop_gradient`), ours builds it at once, as an
#   array; it builds the causal mask at once too, since it depends on no
#   input. Made while tracing, these become constants of the program, and a `scan` passes its
#   constants to its backward pass, which keeps them. JAX keeps a tangent it
#   knows to be zero as a symbolic `Zero` (`jax/_src/ad_util.py`), and where
#   it needs the array it builds it inside the program, as an operation.
# - **Full-size broadcasts.** `x - x.max(axis=-1, keepdims=True)` subtracts an
#   array with an axis of size 1. Ours broadcasts it to full size first (a
#   `broadcast` primitive), and when the backward pass needs that operand it
#   keeps the full-size copy. JAX 0.10.2's element-wise operations take the
#   size-1 axis as it is, and keep the small array.
#
# What is left, 1.4 MB, is close to JAX's 1.2 MB. Both excesses are limits of
# this book's module, not of the model: it has no symbolic zeros and no
# element-wise primitives that take size-1 axes, and building them is work
# for a later chapter.
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
# The eight devices are CPU devices: the folded setup cell asks XLA for eight
# host devices (`--xla_force_host_platform_device_count=8`) before JAX starts,
# as {ref}`Part 9 <part9>` does; on a machine with eight accelerators the same
# code runs on them. Twenty steps on eight devices, two windows each, against
# the first twenty steps of the single-device run above, which is JAX's to
# about $10^{-12}$:

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
# The prompt is the first 32 characters of the text; after it, 150 characters
# chosen greedily, then 150 sampled (temperature 1, a fixed key):

# %%
prompt = data[:32]
greedy = generate(params, prompt, 150, n_heads=n_heads)
sampled = generate(params, prompt, 150, n_heads=n_heads, key=jax.random.PRNGKey(1))
print("greedy: ", vocab.decode(greedy))
print()
print("sampled:", vocab.decode(sampled))

# %% [markdown]
# Two hundred steps on batches of 16 windows of 32 characters have shown the
# model about 100,000 characters, about one pass over the text. It has learned
# which characters are common, where spaces go and a few short words. Greedy
# decoding falls into a loop of its likeliest word; sampling is more varied
# and less English.
#
# (part12-longer)=
# ## At a larger size: the benchmark
#
# This page keeps the model small so that it runs in about a minute. The
# benchmark `bench/bench_capstone.py` runs the same source, read from this
# page by `capstone_tools.model_namespace`, at a larger size, in float64, in
# both libraries step for step on the same batches, and times a training step.
# The capstone run of the last report in `bench/results.json`:

# %% tags=["hide-input"]
# @title The benchmark's capstone run, from bench/results.json
capstone_tools.longer_run(capstone_tools.load_report())

# %% [markdown]
# At this size almost all of a step's time is spent in the compiled program,
# not in Python; {ref}`How fast is it? <performance>` splits the step into
# its pieces.
#
# (part12-jax)=
# ## Where real JAX differs
#
# The model's source is the same on both; what differs is around it.
#
# - **Precision.** Our module computes in 64 bits by default, as JAX does with
#   `jax_enable_x64` on; JAX's default is 32 bits. This page turns it on for
#   the float64 runs with `jax.enable_x64(True)`, and leaves it off for the
#   float32 one. The attention's scale is written `(D // n_heads) ** 0.5`, a
#   Python float, which takes the dtype of the array it meets in both
#   libraries. `np.sqrt(D // n_heads)` would be a NumPy float64: it turns a
#   float32 array into float64 in ours and in JAX with `jax_enable_x64` on,
#   but JAX's default mode narrows it to float32.
# - **Memory.** The residuals differ in bytes, not in kind: ours keeps zeros
#   and masks made while tracing, and full-size broadcasts, where JAX keeps
#   symbolic zeros and size-1 axes ({ref}`above <part12-memory>`). The
#   checkpoint's effect is the same in both: each layer keeps its input only.
# - **`saved_residuals`** is `jax._src.ad_checkpoint.saved_residuals` in JAX
#   0.10.2, not a public name ({ref}`Part 11 <part11-measured>`).
# - **Data parallelism.** The docstring of `jax.pmap` in JAX 0.10.2 calls it
#   the old way of doing a parallel map and points to `jax.shard_map`, on
#   which `pmap` is now built ({ref}`Part 9 <part9>`). We have built `pmap`
#   only.
#
# ## Summary
#
# - A transformer written against JAX's API (embeddings by indexing,
#   attention with `einsum` and a causal mask, layer norm, `gelu`, layers
#   stacked and run by `lax.scan` under `jax.checkpoint`, Adam with
#   `jax.tree.map`, `jax.jit(jax.value_and_grad(loss))`) runs on autodidax
#   unchanged, and on JAX after changing three imports.
# - Trained from the same parameters on the same batches (drawn with
#   `jax.random`, equal bit for bit), the two loss curves agree to about
#   $10^{-12}$ relative in float64. In float32 they start two rounding errors
#   apart and drift to a few parts in a thousand in fifty steps; the float64
#   gap, zero at first, then grows at the same pace, ten orders of magnitude
#   lower. Training amplifies rounding, and the two libraries' compiled
#   programs round differently.
# - `checkpoint` around each layer leaves one saved activation per layer and
#   cuts the residual bytes several times over, in both libraries.
# - `pmap` with `pmean` over the gradients gives the single-device run again,
#   on eight devices.
#
# ## Exercises
#
# **1. Is the model causal?** Change the last character of a window. Which
# positions' scores change, and which would without the mask?

# %% tags=["hide-input"]
# @title Solution: only the last position sees the change
window = np.asarray(batches[0][0][:1])  # one window of the first batch
changed = window.copy()
changed[0, -1] = (changed[0, -1] + 1) % len(vocab)
scores = jax.jit(forward, static_argnums=2)
difference = np.abs(
    np.asarray(scores(params, window, n_heads) - scores(params, changed, n_heads))
)
print("largest change of the scores, by position:")
print(difference.max(axis=-1)[0].round(6))
# Every position but the last reads only characters before it, so only the
# last row changes. Without the mask every position would read the last
# character, and every row would change.

# %% [markdown]
# **2. Memory at a longer context.** Some residuals hold $B \cdot T \cdot D$
# numbers a layer (activations), others $B \cdot H \cdot T^2$ (attention scores
# and weights). Which kind grows faster from context 32 to 64? Measure the
# residual bytes without checkpoint at both.

# %% tags=["hide-input"]
# @title Solution: more than twice the bytes, since the T² terms grow fourfold
for context in [32, 64]:
    wider = init_params(
        np.random.default_rng(0), **{**config, "context": context}, dtype=np.float64
    )
    x = np.zeros((batch_size, context), np.int32)
    kept = saved_residuals(lambda p, x=x: loss_fn(p, x, x, n_heads, False), wider)
    print(f"context {context}: {residual_bytes(kept) / 1e6:.2f} MB")
# The terms linear in T double; the attention weights (and the scores they
# are computed from) grow four times: the total grows by more than 2x.

# %% [markdown]
# **3. Temperature.** Sample from the trained model at temperature 0.5 and
# 2.0. What changes, and why?

# %% tags=["hide-input"]
# @title Solution: low temperature is nearly greedy, high is nearly uniform
for temperature in [0.5, 2.0]:
    tokens = generate(
        params,
        prompt,
        80,
        n_heads=n_heads,
        key=jax.random.PRNGKey(1),
        temperature=temperature,
    )
    print(f"temperature {temperature}:", repr(vocab.decode(tokens[32:])))
# Dividing the scores by a temperature below 1 sharpens the distribution
# (toward the greedy choice); above 1 it flattens it (toward a uniform draw
# over all 94 characters).
