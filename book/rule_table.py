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
# operand (`mul` in either, `div` in its numerator, `select` in its branches).
# The table below is not written by hand: it is read off the registries of the
# finished module (`PRIMITIVES`, each primitive's `rules`, `RULE_KINDS` and
# `NOT_LINEAR`) every time this page is built, with the chapter that adds each
# primitive (*from*). CI re-runs the page, compares its printed output with the
# stored one, and would show any missing rule in the first line of output, the
# list of `gaps` (a gap reads `MISSING` in its cell).
#
# A cell that is not ✓ says why there is no rule of the usual kind:
#
# - *not linear*: a transpose rule would make no sense, because the primitive is
#   not linear in any operand (`sin`, `max`, ...). `while` is listed here too,
#   for a different reason: transposing a loop would need every trip's primal
#   values, which the loop does not save ({ref}`Part 6 <part6>`; JAX registers
#   a transpose rule for `while` that raises an error instead).
# - *generic*: {ref}`Part 4 <part4>`'s partial evaluation handles the primitive
#   without a rule of its own. That is every primitive except the five whose
#   jaxpr must be split in two or kept whole by a rule: `xla_call`, `cond`,
#   `scan` and `pmap` split theirs, and `while` keeps the whole loop known or
#   the whole loop unknown ({ref}`Part 6 <part6>`). The custom calls of
#   {ref}`Part 8 <part8>` carry a jaxpr too, but a call is known or staged as a
#   whole, so the generic rule fits them.
# - *refused*: the rule exists only to raise a clear error, where this book does
#   not support the operation: evaluating a collective outside any `vmap` or
#   `pmap` that binds its axis, and lowering `pmap` inside `jit` (JAX runs it;
#   ours compiles `jit` for one device, {ref}`Part 9 <part9>`); evaluating,
#   differentiating in forward mode or lowering `custom_lin`, the primitive
#   that stands for a `custom_vjp` rule inside `linearize` and has no forward
#   mode ({ref}`Part 8 <part8>`).

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
