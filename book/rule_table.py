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
# (`impl`), forward mode (`jvp`), batching (`vmap`), abstract evaluation, lowering
# to StableHLO, partial evaluation (during tracing, and of a staged jaxpr), and,
# where it is linear, transposition. The table below is not written by hand: it
# is read off the registries of the finished module (`PRIMITIVES`, each
# primitive's `rules`, `RULE_KINDS` and `NOT_LINEAR`) every time this page is
# built, and CI re-runs the page and compares.
#
# A cell reads *not linear* where a transpose rule would make no sense, and
# *generic* where {ref}`Part 4 <part4>`'s partial evaluation handles a primitive
# without a rule of its own: every primitive except those that hold a jaxpr.
# `xla_call`, `cond`, `scan` and `pmap` have rules that split their jaxpr in
# two; `while` has rules that keep the whole loop known or the whole loop
# unknown, because its jaxpr cannot be split ({ref}`Part 6 <part6>`). A
# cell reads *refused* where the rule exists only to raise a clear error, because
# the operation has no meaning there: evaluating a collective outside any
# `vmap` or `pmap` that binds its axis, and lowering `pmap` inside `jit`
# ({ref}`Part 9 <part9>`); evaluating, differentiating in forward mode or
# lowering `custom_lin`, the primitive that stands for a `custom_vjp` rule under
# `jvp`, which has no forward mode ({ref}`Part 8 <part8>`). Any other missing rule would show up as a gap, and in
# the first line of output.

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

rule_table(globals())

# %% [markdown]
# The {ref}`appendix <appendix-rule-table>` explains how the registries came to
# be, and {ref}`Part 1 <part1>` how a rule is attached to a primitive.
