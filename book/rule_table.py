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
# Every primitive of the book needs one rule per interpreter: evaluation
# (`impl`), forward mode (`jvp`), batching (`vmap`), abstract evaluation
# (`abstract eval`), lowering to StableHLO (`lower`), partial evaluation during
# tracing (`partial eval`) and of a staged jaxpr (`partial eval jaxpr`), and
# transposition (`transpose`) where the primitive is linear in at least one
# operand (`mul` in either, `div` in its numerator, `select` in its branches),
# and counting what it costs without running it (`cost`, {ref}`analysis`).
# The table below is not written by hand: it is read off the registries of the
# finished module (`PRIMITIVES`, each primitive's `rules`, `RULE_KINDS` and
# `NOT_LINEAR`, `NEVER_TRANSPOSED`) every time this page is built. The *from* column names the
# chapter that adds the primitive. The first line of output lists the missing rules (`gaps`,
# which would read `MISSING` in their cells); it is empty.
#
# - *✓*: the primitive registers its own rule of this kind.
# - *not linear* (only under `transpose`): no transpose rule, because none
#   could work. Most of these primitives are not linear in any operand (`sin`,
#   `max`, ...). Four are here for their own reasons: `axis_index` has no
#   operand to be linear in; a `custom_vjp_call`
#   never reaches a linear jaxpr (the `custom_lin` it leaves there does, and
#   is transposed by running the function's `bwd`); and transposing `while`
#   would need every trip's primal values, which the loop does not save
#   ({ref}`Part 6 <part6>`; JAX registers a transpose rule for `while` that
#   only raises an error); `debug_print` has no outputs, so no output of a
#   linear jaxpr depends on it, and partial evaluation leaves it out
#   ({ref}`analysis`). A `custom_jvp_call`, by contrast, is transposed by
#   transposing its jaxpr, since a JVP rule may apply a `custom_jvp` function to
#   a tangent.
# - *never transposed* (only under `transpose`): linear, but never met by
#   transposition. `stop_gradient` is the identity, yet its tangent is always
#   a fresh zero, so it never appears in a linear jaxpr (JAX registers no
#   transpose rule for it either).
# - *generic* (only in the two partial-evaluation columns): {ref}`Part 4 <part4>`'s partial evaluation handles the primitive
#   without a rule of its own. Five primitives carry a jaxpr that the generic
#   rule would get wrong: `xla_call`, `cond`, `scan` and `pmap` split theirs
#   into a known and an unknown half, and `while`, which this book does not
#   split, is kept whole: evaluated when all its inputs are known, staged when
#   all are unknown, and a mix of the two (what reverse mode makes) is an error
#   that says why ({ref}`Part 6 <part6>`). The custom calls of {ref}`Part 8 <part8>` carry a
#   jaxpr too, but for them the generic answer is right: the call is known when
#   all its inputs are, and staged whole otherwise.
# - *refused*: the rule exists only to raise a clear error, where this book does
#   not support the operation: evaluating a collective outside any `vmap` or
#   `pmap` that binds its axis; evaluating,
#   differentiating in forward mode or lowering `custom_lin`, the primitive
#   that a `custom_vjp` function leaves in a linear jaxpr
#   ({ref}`Part 8 <part8>`).

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
