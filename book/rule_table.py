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
# (rule-table)=
# # Every primitive, every rule
#
# A primitive is a name plus one rule per interpreter: evaluation (`impl`),
# forward mode (`jvp`), batching (`vmap`), abstract evaluation (`abstract
# eval`), lowering to StableHLO (`lower`), partial evaluation during tracing
# (`partial eval`) and of a staged jaxpr (`partial eval jaxpr`), and
# transposition (`transpose`) where the primitive is linear in at least one
# operand (`mul` in either, `div` in its numerator, `select` in its branches),
# and counting what it costs without running it (`cost`, {ref}`analysis`).
# The table below is read off the registries of the finished module
# (`PRIMITIVES`, each primitive's `rules`, `RULE_KINDS`, `NOT_LINEAR` and
# `NEVER_TRANSPOSED`) every time this page is built, and shows that every pair
# of a primitive and a rule kind is accounted for: each cell holds a rule, or
# one of the reasons below for having none. A cell with neither is a *gap*;
# the first line of output lists the gaps, and it is empty. The *from* column
# names the chapter that adds the primitive.
#
# Each cell is decided in this order (by `rule_status` in `book/figures.py`):
#
# 1. The primitive has a rule of that kind: *✓*, or *refused* when the rule
#    only raises a clear error (it is marked so, or its body is one `raise`
#    statement): evaluating a collective outside any `vmap` or `pmap` that binds
#    its axis, or evaluating, differentiating in forward mode or lowering
#    `custom_lin`, the primitive that a `custom_vjp` function leaves in a linear
#    jaxpr ({ref}`Part 8 <part8>`).
# 2. No `transpose` rule: *not linear* for the primitives in `NOT_LINEAR`, which
#    are not linear in any operand (`sin`, `max`, `pmax`, ...; each is tested:
#    a function made of that primitive alone gives $f(a + b) \ne f(a) + f(b)$
#    for some inputs). Four members of `NOT_LINEAR` show their own reason:
#    *no operand* (`axis_index` has nothing to be linear in); *via bwd*
#    (`custom_vjp_call` never reaches a linear jaxpr; the `custom_lin` it
#    leaves there does, and is transposed by running the function's `bwd`);
#    *trips not saved* (transposing `while` would need every trip's primal
#    values, which the loop does not save, {ref}`Part 6 <part6>`; JAX registers a
#    transpose rule for `while` that only raises an error); and *no outputs*
#    (`debug_print` returns nothing, so no output of a linear jaxpr depends on
#    it, and partial evaluation leaves it out, {ref}`analysis`). *Never transposed*
#    marks the primitives in `NEVER_TRANSPOSED`: `stop_gradient` is linear, but
#    its tangent is always a fresh zero, so it never appears in a linear jaxpr
#    (JAX registers no transpose rule for it either); `name`, the primitive of
#    `checkpoint_name` ({ref}`Part 11 <part11>`), is the identity, but its JVP
#    names the primal only, so it never reaches a linear jaxpr either (nor
#    does JAX's `name`, which has no transpose rule).
# 3. No partial-evaluation rule: *generic*, unless the primitive is one of the
#    six that carry a jaxpr the generic rule would get wrong. The generic rule
#    is {ref}`Part 4 <part4>`'s: an equation whose inputs are all known is
#    evaluated now, and one with an unknown input is staged whole. The
#    `partial eval` column is partial evaluation while tracing (what
#    `linearize` does); `partial eval jaxpr` splits a jaxpr that is already
#    staged, such as the body of a `jit` call. The six that need their own
#    rules, in both columns, are `xla_call`, `cond`, `scan` and `pmap`, which
#    split their jaxpr into a known and an unknown half; `checkpoint`, which
#    splits it so that the unknown half recomputes what a policy does not let
#    it save ({ref}`Part 11 <part11>`); and `while`, which this book keeps
#    whole and refuses to split ({ref}`Part 6 <part6>`). For them, and
#    for everything else, a missing rule is a gap.
#
# A word on names. Most rows match a JAX primitive, some under other names
# (JAX's `jit`, `select_n` and `broadcast_in_dim` for our `xla_call`, `select`
# and `broadcast`; JAX's `pmap` is built from `jit` and `shard_map`,
# {ref}`Part 9 <part9>`). `keep_gradient`
# ({ref}`Part 5 <part5>`) is the book's own: the identity in value, whose
# derivative is zeroed where a batched `cond` did not take a branch, so that a
# NaN from the untaken branch cannot reach a gradient. JAX has no such
# primitive; its batched `cond` gets the same effect with `select_n` and
# `stop_gradient`. And `custom_jvp_call` is transposed by transposing its
# jaxpr, as JAX's is (a rule kept in its table of "fancy" transposes,
# `jax/_src/custom_derivatives.py`).

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

book_setup.load_book(globals(), before="rule_table")

# %%
from figures import rule_table

rule_table(globals())  # reads the registries of the module loaded above

# %% [markdown]
# The {ref}`appendix <appendix-rule-table>` explains how the registries came to
# be, and {ref}`Part 1 <part1>` how a rule is attached to a primitive.
