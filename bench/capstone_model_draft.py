"""TEMPORARY: the capstone's model for bench_capstone.py, until Part 12 exists.

``bench_capstone.py`` runs the model of Part 12 through
``book/capstone_tools.py``'s ``model_namespace(backend)`` when that file is
in the checkout. Until then it runs this copy of the draft model, written with
the same names and call forms as the chapter's cells tagged ``model``
(``init_params``, ``loss_fn``, ``adam_init``, ``adam_step``, ``train_step``
jitted with ``n_heads`` static). Delete this file once the chapter is merged.

Where the autodidax module still lacks a function the model calls
(``jnp.einsum``, ``jnp.tril``, ``jnp.var``, ``jax.nn``, ``jax.tree``, ``**`` of
a traced integer), ``fill_in`` adds a stand-in, for this benchmark only.
"""

from __future__ import annotations

import types

MODEL = """
def init_params(rng, *, vocab_size, d_model, n_layers, d_ff, context, dtype):
    def normal(*shape):
        return (0.02 * rng.standard_normal(shape)).astype(dtype)

    L, D = n_layers, d_model
    layers = {
        "ln1_g": np.ones((L, D), dtype), "ln1_b": np.zeros((L, D), dtype),
        "w_qkv": normal(L, D, 3 * D), "w_o": normal(L, D, D),
        "ln2_g": np.ones((L, D), dtype), "ln2_b": np.zeros((L, D), dtype),
        "w_in": normal(L, D, d_ff), "b_in": np.zeros((L, d_ff), dtype),
        "w_out": normal(L, d_ff, D), "b_out": np.zeros((L, D), dtype),
    }
    return {
        "tok": normal(vocab_size, D), "pos": normal(context, D), "layers": layers,
        "lnf_g": np.ones(D, dtype), "lnf_b": np.zeros(D, dtype),
    }


def layer_norm(x, g, b, eps=1e-5):
    mean = x.mean(axis=-1, keepdims=True)
    var = jnp.var(x, axis=-1, keepdims=True)
    return (x - mean) * lax.rsqrt(var + eps) * g + b


def attention(x, p, n_heads):
    B, T, D = x.shape
    q, k, v = jnp.split(x @ p["w_qkv"], 3, axis=-1)

    def heads(t):
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
"""


def fill_in(namespace: dict, module: types.ModuleType, source: str) -> str:
    """Stand-ins for what an older autodidax ``module`` lacks, put into the
    model's ``namespace`` (this benchmark only); returns ``source``, with
    ``b**t`` of the traced step count written as ``exp(t log b)`` when the
    module has no ``pow_p`` primitive."""
    import numpy as np

    anp, lax = namespace["jnp"], namespace["lax"]

    def einsum(spec, a, b):  # the two two-operand forms the model uses
        ins, out = spec.split("->")
        sa, sb = ins.split(",")
        batch = [c for c in sa if c in sb and c in out]
        contract = [c for c in sa if c in sb and c not in out]
        dims = (
            ([sa.index(c) for c in contract], [sb.index(c) for c in contract]),
            ([sa.index(c) for c in batch], [sb.index(c) for c in batch]),
        )
        free = [c for c in sa + sb if c not in batch and c not in contract]
        order = batch + free
        return anp.transpose(lax.dot_general(a, b, dims), [order.index(c) for c in out])

    def tril(x):
        rows, cols = anp.arange(x.shape[0])[:, None], anp.arange(x.shape[1])[None, :]
        return anp.where(rows >= cols, x, anp.zeros_like(x))

    def var(x, axis, keepdims=False):
        centred = x - x.mean(axis=axis, keepdims=True)
        return (centred * centred).mean(axis=axis, keepdims=keepdims)

    def softmax(x, axis=-1):
        e = anp.exp(x - lax.stop_gradient(x.max(axis=axis, keepdims=True)))
        return e / e.sum(axis=axis, keepdims=True)

    def log_softmax(x, axis=-1):
        s = x - lax.stop_gradient(x.max(axis=axis, keepdims=True))
        return s - anp.log(anp.exp(s).sum(axis=axis, keepdims=True))

    def gelu(x):
        return 0.5 * x * (1 + anp.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3)))

    missing = {
        k: v
        for k, v in (("einsum", einsum), ("tril", tril), ("var", var))
        if not hasattr(anp, k)
    }
    if missing:
        namespace["jnp"] = types.SimpleNamespace(
            **{k: getattr(anp, k) for k in dir(anp) if not k.startswith("__")},
            **missing,
        )
    if not hasattr(module, "nn") or not hasattr(module, "tree"):
        nn = types.SimpleNamespace(softmax=softmax, log_softmax=log_softmax, gelu=gelu)
        namespace["jax"] = types.SimpleNamespace(
            **{k: getattr(module, k) for k in dir(module) if not k.startswith("__")},
            nn=getattr(module, "nn", nn),
            tree=getattr(module, "tree", types.SimpleNamespace(map=module.tree_map)),
        )
    if not hasattr(module, "pow_p"):
        source = source.replace("b1**t", "jnp.exp(t * np.log(b1))")
        source = source.replace("b2**t", "jnp.exp(t * np.log(b2))")
    return source
