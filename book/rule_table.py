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
# operand (`mul` in either, `div` in its numerator, `select` in its branches).
# The table below is read off the registries of the finished module
# (`PRIMITIVES`, each primitive's `rules`, `RULE_KINDS`, `NOT_LINEAR` and
# `NEVER_TRANSPOSED`) every time this page is built, and shows that every pair
# of a primitive and a rule kind is accounted for: each cell holds a rule, or
# one of the reasons below for having none. A cell with neither is a *gap*;
# the first line of output lists the gaps, and it is empty. The *from* column
# names the chapter that adds the primitive.
#
# - *✓*: the primitive registers its own rule of this kind.
# - *not linear* (only under `transpose`): not linear in any operand (`sin`,
#   `max`, `pmax`, ...), so no transpose rule could work. Each of these is
#   tested: for each one, a function made of that primitive alone gives
#   $f(a + b) \ne f(a) + f(b)$ for some inputs.
# - *no operand* (`axis_index`): nothing to be linear in.
# - *via bwd* (`custom_vjp_call`): never reaches a linear jaxpr; the
#   `custom_lin` it leaves there does, and is transposed by running the
#   function's `bwd` ({ref}`Part 8 <part8>`).
# - *trips not saved* (`while`): transposing would need every trip's primal
#   values, which the loop does not save ({ref}`Part 6 <part6>`; JAX registers a
#   transpose rule for `while` that only raises an error).
# - *never transposed* (`stop_gradient`): linear, but its tangent is always a
#   fresh zero, so it never appears in a linear jaxpr (JAX registers no
#   transpose rule for it either).
# - *generic* (only in the two partial-evaluation columns): {ref}`Part 4 <part4>`'s
#   partial evaluation handles the primitive without a rule of its own. Five
#   primitives carry a jaxpr that the generic rule would get wrong: `xla_call`,
#   `cond`, `scan` and `pmap` split theirs into a known and an unknown half, and
#   `while`, which this book does not split, is kept whole: evaluated when all
#   its inputs are known, staged when all are unknown, and a mix of the two
#   (what reverse mode makes) is an error that says why ({ref}`Part 6 <part6>`).
#   The custom calls of {ref}`Part 8 <part8>` carry a jaxpr too, but for them the
#   generic answer is right: the call is known when all its inputs are, and
#   staged whole otherwise.
# - *refused*: the rule exists only to raise a clear error, where this book does
#   not support the operation: evaluating a collective outside any `vmap` or
#   `pmap` that binds its axis; evaluating, differentiating in forward mode or
#   lowering `custom_lin`, the primitive that a `custom_vjp` function leaves in
#   a linear jaxpr ({ref}`Part 8 <part8>`).
#
# Two rows have no counterpart of the same shape in JAX. `keep_gradient`
# ({ref}`Part 5 <part5>`) is the book's own: the identity in value, whose
# derivative is zeroed where a batched `cond` did not take a branch, so that a
# NaN from the untaken branch cannot reach a gradient. And `custom_jvp_call`
# is transposed by transposing its jaxpr, as a JVP rule may apply a
# `custom_jvp` function to a tangent; JAX does the same, with a rule kept in
# its table of "fancy" transposes (`jax/_src/custom_derivatives.py`).

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
