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
# (part4)=
# # Part 4: `linearize`, `vjp` and `grad`
#
# :::{admonition} Where we are
# :class: note
# The module evaluates, differentiates in forward mode ([`jvp`](#part1-jvp)) and
# batches ([`vmap`](#part1-vmap)) as interpreters ({ref}`Part 1 <part1>`), records
# functions as jaxprs ([`make_jaxpr`](#part2-tracing), {ref}`Part 2 <part2>`), and
# compiles jaxprs with XLA through the higher-order primitive `xla_call` (`jit`,
# {ref}`Part 3 <part3>`), in any combination. Every derivative so far is forward
# mode.
# :::
#
# Forward mode, from {ref}`Part 1 <part1>`, computes one *column* of the
# Jacobian per pass: the effect of one input direction on all outputs. Training a
# model needs the opposite: the effect of *all* inputs (millions of parameters) on
# one output (the loss). That is one *row* of the Jacobian, and {term}`reverse mode` gets
# it in a single pass, at a cost proportional to running the function once.
#
# JAX does not implement reverse mode as a separate interpreter. It derives it
# from forward mode in two steps, each a transformation of its own:
#
# 1. **{term}`Partial evaluation`** splits a JVP into the part that depends only on the
#    primal inputs, which can be computed right away, and the part that depends
#    on the tangents, which is *{term}`linear`* in them and is recorded as a jaxpr. That
#    recorded half is the {term}`linearized <linearize>` function: this gives us `linearize`.
# 2. **{term}`Transposition`** runs a linear jaxpr backwards, turning a function from
#    input tangents to output tangents into one from output {term}`cotangents <cotangent>` to input
#    cotangents. Transposing the linearized function gives `vjp`, and `grad` is
#    `vjp` with a cotangent of 1.
#
# The folded cell below loads the library code of the earlier chapters from the
# module `autodidax`, as in {ref}`Part 2 <part2-setup>`. In Colab it first installs
# the JAX release the book is tested with and fetches the module.

# %% tags=["hide-input"]
from __future__ import annotations  # as in the module: postponed annotations

import importlib.metadata
import sys
from pathlib import Path

BOOK_JAX = "0.10.2"  # the JAX and jaxlib release this book is tested with


def installed_version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


found = {installed_version("jax"), installed_version("jaxlib")}
if found != {BOOK_JAX} and "google.colab" in sys.modules:
    # A fresh Colab runtime: install the book's JAX (Colab ships another one).
    import subprocess

    pins = [f"jax=={BOOK_JAX}", f"jaxlib=={BOOK_JAX}"]
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", *pins], check=True)
elif found != {BOOK_JAX}:
    print(
        f"This book is tested with jax and jaxlib {BOOK_JAX}; found {found}. "
        f"To match: pip install jax=={BOOK_JAX} jaxlib=={BOOK_JAX}"
    )
try:
    import autodidax
except ImportError:
    if Path("../autodidax.py").is_file():  # a checkout of the repository
        sys.path.insert(0, "..")
    else:  # e.g. in Colab: fetch the module this book builds
        import urllib.request

        urllib.request.urlretrieve(
            "https://raw.githubusercontent.com/autodidax-book/autodidax/main/"
            "autodidax.py",
            "autodidax.py",
        )
    import autodidax

autodidax.load_chapters(globals(), before="part4_grad")
np.set_printoptions(precision=6, suppress=True)


# %% [markdown]
# ## What needs to be split
#
# Here is the jaxpr of a JVP, the starting point of everything in this chapter.
# Tracing `jvp` with `make_jaxpr` records what the
# {ref}`JVP rules of Part 1 <part1-jvp-rules>` do at each primitive:


# %%
def f(x):
    y = sin(x) * 2.0
    return cos(y) * x


def f_jvp(x, x_dot):
    return jvp(f, (x,), (x_dot,))


scalar = ShapedArray((), np.float64)
print(make_jaxpr(f_jvp, scalar, scalar)[0])

# %% [markdown]
# Some equations depend only on `a`, the primal input: `sin a`, `cos a`, `cos f`, and
# so on. Others involve `b`, the tangent. If we know `x` but not yet `x_dot`, we
# can compute the first kind now and must postpone the second. The postponed
# equations only ever multiply the tangent by numbers computed from `x`, or add
# or negate tangents: as a function of the tangent they are linear. That is why
# the postponed part *is* the linear map $\dot x \mapsto f'(x)\,\dot x$.
#
# (part4-partial-eval)=
# ## Partial evaluation
#
# A partial evaluator is an interpreter (one more {ref}`trace <part1-stack>`) in which each value is either **{term}`known <known value>`**
# (we have it) or **{term}`unknown <unknown value>`** (we know only its type). We record that in a
# `PartialVal`.

# %% tags=["export"]
import weakref

RULE_KINDS = (*RULE_KINDS, "partial_eval", "partial_eval_jaxpr", "transpose")


class PartialVal(NamedTuple):
    """A value that is known (``const`` is set) or unknown (only ``aval``)."""

    aval: ShapedArray
    const: Any | None

    @classmethod
    def known(cls, val: Any) -> PartialVal:
        return cls(raise_to_shaped(get_aval(val)), val)

    @classmethod
    def unknown(cls, aval: ShapedArray) -> PartialVal:
        return cls(raise_to_shaped(aval), None)

    @property
    def is_known(self) -> bool:
        return self.const is not None


# %% [markdown]
# The partial evaluation interpreter computes immediately whatever depends only on
# known values. For everything else it builds a graph: each unknown tracer points
# to its **recipe**, which says how the value will be computed later. There are
# three kinds of recipe: the value is an input of the postponed computation; it
# is a known value that the postponed computation needs (a **{term}`residual`**); or it is
# an output of an equation whose inputs are other tracers.


# %% tags=["export"]
class InputRecipe(NamedTuple):
    """The tracer is an input of the staged-out jaxpr."""


class ConstRecipe(NamedTuple):
    """The tracer stands for a known value the staged-out jaxpr needs."""

    val: Any


class EqnRecipe(NamedTuple):
    """The tracer is an output of an equation on other tracers.

    The outputs are held by weak reference: a tracer points to its recipe, and
    a strong reference back would make every equation a reference cycle that
    only Python's garbage collector could free.
    """

    prim: Primitive
    tracers_in: list[PartialEvalTracer]
    params: dict[str, Any]
    avals_out: list[ShapedArray]
    tracer_refs_out: list[weakref.ref]


class PartialEvalTracer(Tracer):
    """A known value, or an unknown one with the recipe that will make it."""

    def __init__(self, trace: PartialEvalTrace, pval: PartialVal, recipe: Any) -> None:
        self._trace = trace
        self.pval = pval
        self.recipe = recipe

    @property
    def aval(self) -> ShapedArray:
        return self.pval.aval

    def full_lower(self) -> Any:
        return full_lower(self.pval.const) if self.pval.is_known else self

    def __bool__(self) -> bool:
        self.check_live()
        if self.pval.is_known:
            return bool(self.pval.const)
        return super().__bool__()


# %% [markdown]
# The trace's rules are few. Constants are known. A primitive applied to known
# values is simply applied, by calling `bind` on the values themselves — so the
# work happens at whatever interpreter sits below, possibly a compiler. A
# primitive with any unknown input is recorded: its known inputs become residuals
# (`instantiate_const`), its output types come from abstract evaluation, and its
# outputs are new unknown tracers whose recipe is the equation. A primitive may
# override this with a `partial_eval` rule of its own; `xla_call` will.


# %% tags=["export"]
class PartialEvalTrace(Trace):
    """Compute what is known; record what is not."""

    def new_arg(self, pval: PartialVal) -> PartialEvalTracer:
        recipe = None if pval.is_known else InputRecipe()
        return PartialEvalTracer(self, pval, recipe)

    def pure(self, val: Any) -> PartialEvalTracer:
        return PartialEvalTracer(self, PartialVal.known(val), None)

    lift = pure

    def instantiate_const(self, tracer: PartialEvalTracer) -> PartialEvalTracer:
        """An unknown tracer for ``tracer``; a known one becomes a residual."""
        if not tracer.pval.is_known:
            return tracer
        pval = PartialVal.unknown(tracer.aval)
        return PartialEvalTracer(self, pval, ConstRecipe(tracer.pval.const))

    def process_primitive(self, prim, tracers, params):
        if all(t.pval.is_known for t in tracers):
            outs = bind(prim, *[t.pval.const for t in tracers], **params)
            return outs if prim.multiple_results else [outs]
        rule = prim.rules.get("partial_eval")
        if rule is not None:
            return rule(self, tracers, **params)
        return self.stage(prim, tracers, params)

    def stage(self, prim, tracers, params) -> list[PartialEvalTracer]:
        """Record ``prim`` on ``tracers`` as an equation of the unknown part."""
        tracers_in = [self.instantiate_const(t) for t in tracers]
        avals_out = prim.rule("abstract_eval")(*[t.aval for t in tracers_in], **params)
        tracers_out = [
            PartialEvalTracer(self, PartialVal.unknown(aval), None)
            for aval in avals_out
        ]
        refs_out = [weakref.ref(t) for t in tracers_out]
        recipe = EqnRecipe(prim, tracers_in, params, avals_out, refs_out)
        for t in tracers_out:
            t.recipe = recipe
        return tracers_out


# %% [markdown]
# ### From a graph of recipes to a jaxpr
#
# When the function has finished, the unknown outputs hang at the end of a graph
# of recipes. Turning the graph into a jaxpr means listing its equations in an
# order where every equation comes after the equations that produce its inputs: a
# **topological sort**. We do it with an explicit stack rather than recursion, so
# a program of a hundred thousand equations does not exhaust Python's recursion
# limit, and we visit every recipe once, so the time is linear in the size of the
# graph. Residuals become the jaxpr's leading inputs, in the order we meet them.


# %% tags=["export"]
def toposort(roots: Sequence[Any], parents: Callable[[Any], Sequence[Any]]) -> list:
    """Nodes reachable from ``roots``, each after all of its parents.

    Iterative depth-first search: linear time, no recursion.
    """
    order: list = []
    seen: set[int] = set()
    stack = [(node, False) for node in reversed(roots)]
    while stack:
        node, parents_done = stack.pop()
        if parents_done:
            order.append(node)
            continue
        if id(node) in seen:
            continue
        seen.add(id(node))
        stack.append((node, True))
        stack.extend((p, False) for p in reversed(parents(node)) if id(p) not in seen)
    return order


def tracers_to_jaxpr(
    tracers_in: list[PartialEvalTracer], tracers_out: list[PartialEvalTracer]
) -> tuple[Jaxpr, list[Any]]:
    """The jaxpr that computes the unknown ``tracers_out`` from ``tracers_in``,
    with the residuals first among its inputs, and the residual values."""
    var_of: dict[int, Var] = {}

    def var(tracer: PartialEvalTracer) -> Var:
        if id(tracer) not in var_of:
            var_of[id(tracer)] = Var(tracer.aval)
        return var_of[id(tracer)]

    def eqn_parents(recipe: EqnRecipe) -> list[EqnRecipe]:
        return [t.recipe for t in recipe.tracers_in if isinstance(t.recipe, EqnRecipe)]

    roots = [t.recipe for t in tracers_out if isinstance(t.recipe, EqnRecipe)]
    recipes = toposort(roots, eqn_parents)

    residual_binders, residuals, seen_consts = [], [], set()

    def note_const(t: PartialEvalTracer) -> None:
        if isinstance(t.recipe, ConstRecipe) and id(t) not in seen_consts:
            seen_consts.add(id(t))
            residual_binders.append(var(t))
            residuals.append(t.recipe.val)

    eqns = []
    for recipe in recipes:
        for t in recipe.tracers_in:
            note_const(t)
        eqns.append(
            JaxprEqn(
                recipe.prim,
                [var(t) for t in recipe.tracers_in],
                recipe.params,
                [
                    Var(aval) if t is None else var(t)  # an unused output
                    for t, aval in zip(
                        [ref() for ref in recipe.tracer_refs_out], recipe.avals_out
                    )
                ],
            )
        )
    for t in tracers_out:
        note_const(t)
    in_binders = residual_binders + [var(t) for t in tracers_in]
    jaxpr = Jaxpr(in_binders, eqns, [var(t) for t in tracers_out])
    typecheck_jaxpr(jaxpr)
    return jaxpr, residuals


# %% [markdown]
# Running a flat function under partial evaluation follows the familiar pattern.
# `instantiate` says which outputs must come out unknown even if they happen to be
# known (for a linear map, a tangent output that turns out to be a constant zero
# must still be an output of the jaxpr). It is a function of the number of
# outputs, since that is only known once the function has run.


# %% tags=["export"]
def partial_eval_flat(
    f: Callable,
    pvals_in: list[PartialVal],
    instantiate: Callable[[int], Sequence[bool]],
) -> tuple[Jaxpr, list[PartialVal], list[Any]]:
    """Run ``f`` with some inputs known; return the jaxpr of the unknown part,
    the outputs (known ones with their values) and the residuals."""
    with new_level(PartialEvalTrace) as level:
        trace = PartialEvalTrace(level)
        tracers_in = [trace.new_arg(pval) for pval in pvals_in]
        outs = f(*tracers_in)
        tracers_out = [trace.full_raise(_as_input(out, "linearize")) for out in outs]
        tracers_out = [
            trace.instantiate_const(t) if inst else t
            for t, inst in zip(tracers_out, instantiate(len(tracers_out)))
        ]
        pvals_out = [t.pval for t in tracers_out]
        unknown_in = [t for t in tracers_in if not t.pval.is_known]
        unknown_out = [t for t in tracers_out if not t.pval.is_known]
        jaxpr, residuals = tracers_to_jaxpr(unknown_in, unknown_out)
    return jaxpr, pvals_out, residuals


# %% [markdown]
# (part4-linearize)=
# ## `linearize`
#
# `linearize` is now a sentence: partially evaluate the JVP with the primals known
# and the tangents unknown. The known outputs are the primal outputs; the jaxpr is
# the linear map from input tangents to output tangents, closed over residuals
# computed from the primals.


# %% tags=["export"]
def linearize_flat(
    f: Callable, primals: list[Any]
) -> tuple[list[Any], Jaxpr, list[Any]]:
    """Primal outputs, and the linear jaxpr (residuals first) of ``f`` at
    ``primals``."""
    n = len(primals)
    pvals_in = [PartialVal.known(p) for p in primals] + [
        PartialVal.unknown(raise_to_shaped(get_aval(p))) for p in primals
    ]

    def f_jvp(*primals_and_tangents):
        outs, outs_dot = jvp_flat(f, primals_and_tangents[:n], primals_and_tangents[n:])
        return [*outs, *outs_dot]

    def tangents_unknown(n_outs: int) -> list[bool]:
        return [False] * (n_outs // 2) + [True] * (n_outs // 2)

    jaxpr, pvals_out, residuals = partial_eval_flat(f_jvp, pvals_in, tangents_unknown)
    primal_pvals = pvals_out[: len(pvals_out) // 2]
    if not all(p.is_known for p in primal_pvals):
        raise TypeError("linearize: a primal output depends on the tangents")
    return [p.const for p in primal_pvals], jaxpr, residuals


# %% [markdown]
# The user-facing `linearize` adds pytrees and checks the tangents the linear map
# is given, since applying it to a wrongly shaped tangent would otherwise fail
# deep inside (or, worse, broadcast).


# %% tags=["export"]
def linearize(f: Callable, *primals: Any) -> tuple[Any, Callable]:
    """``f(*primals)`` and the linear map ``f_lin(*tangents)`` of ``f`` there."""
    primals_flat, in_tree = tree_flatten(primals)
    primals_flat = [_as_input(x, "linearize primal") for x in primals_flat]
    flat_f = flatten_fun(f, in_tree)
    primals_out, jaxpr, residuals = linearize_flat(flat_f, primals_flat)
    out_tree = flat_f.out_tree

    def f_lin(*tangents: Any) -> Any:
        tangents_flat, tangent_tree = tree_flatten(tangents)
        if tangent_tree != in_tree:
            raise TypeError(
                "linearize: the linear map takes tangents with the structure of "
                f"the primals, {in_tree}, got {tangent_tree}"
            )
        tangents_flat = [_as_input(t, "linearize tangent") for t in tangents_flat]
        _check_tangents("linearize", primals_flat, tangents_flat)
        outs = eval_jaxpr(jaxpr, [*residuals, *tangents_flat])
        return tree_unflatten(out_tree, outs)

    return tree_unflatten(out_tree, primals_out), f_lin


# %%
y, f_lin = linearize(f, 1.5)
print(y, f(1.5))
print(f_lin(1.0), jvp(f, (1.5,), (1.0,))[1])
primals_out, lin_jaxpr, residuals = linearize_flat(lambda x: [f(x)], [np.float64(1.5)])
print(lin_jaxpr)
print("residuals:", *residuals)


# %% [markdown]
# The linear jaxpr contains only the tangent half: multiplications of the tangent
# by residuals (numbers such as $\cos(1.5)$ computed while linearizing), and
# additions and negations. Each call of `f_lin` evaluates just that.
#
# (part4-pe-jaxprs)=
# ## Partial evaluation of jaxprs
#
# `linearize(jit(f))` must work too. A jitted function shows up to the partial
# evaluator as a single `xla_call` with some inputs known and some unknown, and
# the default rule would stage the *whole* call as unknown, postponing all of its
# primal work to every call of the linear map. Instead, `xla_call` gets a
# `partial_eval` rule that splits its jaxpr in two: a **known jaxpr** that runs
# now (compiled) and also returns the residuals the other half needs, and an
# **unknown jaxpr** that is staged, taking the residuals and the unknown inputs.
#
# Splitting a jaxpr is partial evaluation done on the program text instead of on
# traced values: walk the equations, mark each variable known or unknown, send
# each equation to the half its inputs allow, and collect as residuals the known
# variables that unknown equations read. A primitive may have its own
# `partial_eval_jaxpr` rule for that walk (a nested `xla_call` does, so nested jits
# split too). Such a rule returns an equation for each half, or `None` in place of
# the known one when none of the primitive's work can be done early.


# %% tags=["export"]
def partial_eval_jaxpr(
    jaxpr: Jaxpr, in_unknowns: Sequence[bool], instantiate: Sequence[bool] | None = None
) -> tuple[Jaxpr, Jaxpr, list[bool], int]:
    """Split ``jaxpr`` into ``(known, unknown, out_unknowns, num_residuals)``.

    ``known`` takes the known inputs and returns the known outputs followed by
    the residuals; ``unknown`` takes the residuals followed by the unknown
    inputs and returns the unknown outputs. ``instantiate[i]`` forces output
    ``i`` to be unknown.
    """
    if instantiate is None:
        instantiate = [False] * len(jaxpr.outs)
    unknown: set[Var] = {v for v, u in zip(jaxpr.in_binders, in_unknowns) if u}
    known_eqns: list[JaxprEqn] = []
    unknown_eqns: list[JaxprEqn] = []
    residuals: dict[Var, None] = {}  # an ordered set

    def is_unknown(x: Atom) -> bool:
        return isinstance(x, Var) and x in unknown

    for eqn in jaxpr.eqns:
        unks = [is_unknown(x) for x in eqn.inputs]
        rule = eqn.primitive.rules.get("partial_eval_jaxpr")
        if rule is not None and any(unks):
            eqn_known, eqn_unknown, outs_unknown, res = rule(unks, eqn)
            if eqn_known is not None:  # None: nothing of it can run early
                known_eqns.append(eqn_known)
            unknown_eqns.append(eqn_unknown)
            residuals.update(dict.fromkeys(res))
            unknown.update(v for v, u in zip(eqn.out_binders, outs_unknown) if u)
        elif any(unks):
            residuals.update(
                dict.fromkeys(
                    x for x, u in zip(eqn.inputs, unks) if isinstance(x, Var) and not u
                )
            )
            unknown_eqns.append(eqn)
            unknown.update(eqn.out_binders)
        else:
            known_eqns.append(eqn)

    out_unknowns = [is_unknown(x) or inst for x, inst in zip(jaxpr.outs, instantiate)]
    for x, unk in zip(jaxpr.outs, out_unknowns):
        if unk and isinstance(x, Var) and x not in unknown:
            residuals[x] = None  # a known output that must come out unknown
    known_in = [v for v, u in zip(jaxpr.in_binders, in_unknowns) if not u]
    unknown_in = [v for v, u in zip(jaxpr.in_binders, in_unknowns) if u]
    residual_vars = list(residuals)
    known_outs = [x for x, u in zip(jaxpr.outs, out_unknowns) if not u]
    jaxpr_known = Jaxpr(known_in, known_eqns, known_outs + residual_vars)
    # The unknown half binds the residuals afresh as its own inputs.
    jaxpr_unknown = Jaxpr(
        residual_vars + unknown_in,
        unknown_eqns,
        [x for x, u in zip(jaxpr.outs, out_unknowns) if u],
    )
    typecheck_jaxpr(jaxpr_known)
    typecheck_jaxpr(jaxpr_unknown)
    return jaxpr_known, jaxpr_unknown, out_unknowns, len(residual_vars)


# %% [markdown]
# The two rules for `xla_call` use it, through a cache: splitting the same jaxpr
# the same way must give the *same* two jaxprs, or every call of `grad(jit(f))`
# would compile its halves again. At trace time, the known half is *called*
# (by `bind`, so it is compiled and run) and the unknown half is recorded as an
# `xla_call` equation in the partial evaluator's graph. On a jaxpr, both halves
# become `xla_call` equations, connected by fresh residual variables.


# %% tags=["export"]
@functools.cache
def split_call_jaxpr(
    jaxpr: Jaxpr, in_unknowns: tuple[bool, ...]
) -> tuple[Jaxpr, Jaxpr, list[bool], int]:
    """partial_eval_jaxpr, remembered: the same split gives the same jaxpr
    objects, so their compiled code (cached per jaxpr) is reused."""
    return partial_eval_jaxpr(jaxpr, in_unknowns)


@xla_call_p.def_rule("partial_eval")
def _xla_call_partial_eval(trace, tracers, *, jaxpr):
    in_unknowns = [not t.pval.is_known for t in tracers]
    jaxpr_known, jaxpr_unknown, out_unknowns, num_res = split_call_jaxpr(
        jaxpr, tuple(in_unknowns)
    )
    known_vals = [t.pval.const for t in tracers if t.pval.is_known]
    known_outs_and_res = bind(xla_call_p, *known_vals, jaxpr=jaxpr_known)
    split = len(known_outs_and_res) - num_res
    known_outs, residuals = known_outs_and_res[:split], known_outs_and_res[split:]
    residual_tracers = [trace.instantiate_const(trace.pure(r)) for r in residuals]
    unknown_tracers = [t for t in tracers if not t.pval.is_known]
    unknown_outs = trace.stage(
        xla_call_p, residual_tracers + unknown_tracers, dict(jaxpr=jaxpr_unknown)
    )
    known_iter, unknown_iter = iter(known_outs), iter(unknown_outs)
    return [
        next(unknown_iter) if unk else trace.pure(next(known_iter))
        for unk in out_unknowns
    ]


@xla_call_p.def_rule("partial_eval_jaxpr")
def _xla_call_partial_eval_jaxpr(unks_in, eqn):
    jaxpr = eqn.params["jaxpr"]
    jaxpr_known, jaxpr_unknown, out_unknowns, num_res = split_call_jaxpr(
        jaxpr, tuple(unks_in)
    )
    known_outs = [v for v, u in zip(eqn.out_binders, out_unknowns) if not u]
    unknown_outs = [v for v, u in zip(eqn.out_binders, out_unknowns) if u]
    residuals = [Var(v.aval) for v in jaxpr_known.outs[len(known_outs) :]]
    known_ins = [x for x, u in zip(eqn.inputs, unks_in) if not u]
    unknown_ins = [x for x, u in zip(eqn.inputs, unks_in) if u]
    eqn_known = JaxprEqn(
        xla_call_p, known_ins, dict(jaxpr=jaxpr_known), known_outs + residuals
    )
    eqn_unknown = JaxprEqn(
        xla_call_p, residuals + unknown_ins, dict(jaxpr=jaxpr_unknown), unknown_outs
    )
    return eqn_known, eqn_unknown, out_unknowns, residuals


# %% [markdown]
# (part4-unzipped)=
# ### A jaxpr, unzipped
#
# Here is the split at work on the JVP jaxpr from the start of the chapter, with
# the primal input known and the tangent unknown. The figure colors each equation
# of the JVP jaxpr by the half it went to, and marks where each residual is made:
# the known values that cross from the first half to the second.

# %%
jvp_jaxpr_demo = make_jaxpr(f_jvp, scalar, scalar)[0]
known, unknown_half, out_unks, num_res = partial_eval_jaxpr(
    jvp_jaxpr_demo, [False, True]
)
names = _Names()
print(pp_jaxpr(jvp_jaxpr_demo, names=names))
print("known half:")
print(pp_jaxpr(known, names=names))
print("unknown half:")
print(pp_jaxpr(unknown_half, names=names))

# %% mystnb={"image": {"alt": "The JVP jaxpr of f, one equation per line. Equations that depend only on the primal input are colored blue and go to the known half; equations that involve the tangent are colored orange and go to the unknown half. The residual variables, computed in the known half and read by the unknown half, are listed between the two."}} tags=["hide-input"]
from html import escape

from IPython.display import SVG


def unzip_figure(jaxpr, known, unknown_half, num_res, names):
    known_eqns = {id(e) for e in known.eqns}
    residuals = set(unknown_half.in_binders[:num_res])
    lines = pp_jaxpr(jaxpr, names=names).splitlines()
    row, top = 22, 50
    height = top + row * len(lines) + 20
    blue, orange = "#dbe9f6", "#fde2c8"
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="720" height="{height}" '
        'font-family="monospace" font-size="13">',
        "<title>A JVP jaxpr split into its known and unknown halves</title>",
        f'<rect x="20" y="10" width="14" height="14" fill="{blue}" stroke="#555"/>'
        '<text x="40" y="22" font-family="sans-serif">known half (runs now)</text>'
        f'<rect x="230" y="10" width="14" height="14" fill="{orange}" stroke="#555"/>'
        '<text x="250" y="22" font-family="sans-serif">unknown half (the linear '
        "map)</text>",
    ]
    for i, text in enumerate(lines):
        y = top + row * i
        eqn_index = i - 1  # line 0 binds the inputs
        if 0 <= eqn_index < len(jaxpr.eqns):
            eqn = jaxpr.eqns[eqn_index]
            fill = blue if id(eqn) in known_eqns else orange
            parts.append(
                f'<rect x="16" y="{y}" width="440" height="{row - 2}" fill="{fill}"/>'
            )
            defined = eqn.out_binders
        else:
            defined = jaxpr.in_binders if i == 0 else []
        parts.append(
            f'<text x="20" y="{y + 15}" xml:space="preserve">{escape(text)}</text>'
        )
        marked = [names(v) for v in defined if v in residuals]
        if marked:
            parts.append(
                f'<text x="470" y="{y + 15}" font-family="sans-serif" fill="#a33">'
                f"&#8594; residual {', '.join(marked)}</text>"
            )
    parts.append("</svg>")
    return SVG("".join(parts))


unzip_figure(jvp_jaxpr_demo, known, unknown_half, num_res, names)

# %% [markdown]
# The blue equations form the known half: the primal computation, plus the
# derivatives of the primitives (`cos a`, `sin f`, ...) that only need the
# primal. The orange ones form the linear map. Everything that crosses from blue
# to orange is a residual, and that is exactly what reverse mode has to store
# between its forward and backward passes.
#
# With the `xla_call` rules in place, `linearize` sees through `jit`:

# %%
y_jit, f_lin_jit = linearize(jit(f), 1.5)
print(y_jit, f_lin_jit(1.0), f_lin(1.0))


# %% [markdown]
# (part4-transposition)=
# ## Transposition
#
# The linear map $\dot x \mapsto J \dot x$ has a **transpose**, $\bar y \mapsto J^T
# \bar y$, and that is the {term}`vector-Jacobian product` reverse mode needs. For a linear
# jaxpr we get the transpose mechanically, by running the jaxpr backwards: start
# from a **cotangent** for each output, walk the equations in reverse, and let each
# linear primitive turn the cotangent of its output into cotangents of its linear
# inputs. When a variable is used several times, its cotangents add up.
#
# Which inputs are linear? Those we do not have: in a linear jaxpr from
# `linearize`, the tangent inputs. We mark them with `UndefPrimal` ({term}`undefined primals <undefined primal>`), holding only
# their type. Equations that involve no undefined value (for instance a
# `broadcast` of a constant) are evaluated forward first, so their results are
# available to the linear equations as ordinary values.


# %% tags=["export"]
class UndefPrimal(NamedTuple):
    """A linear input whose value we do not have: only its type."""

    aval: ShapedArray


def backward_pass(
    jaxpr: Jaxpr, args: Sequence[Any], cotangents_out: Sequence[Any]
) -> list[Any]:
    """Transpose ``jaxpr`` with respect to its ``UndefPrimal`` arguments.

    Returns one cotangent per UndefPrimal argument, in order.
    """
    values: dict[Var, Any] = {}
    linear: set[Var] = set()
    for v, arg in zip(jaxpr.in_binders, args):
        if isinstance(arg, UndefPrimal):
            linear.add(v)
        else:
            values[v] = arg

    def read(x: Atom) -> Any:
        return x.val if isinstance(x, Lit) else values[x]

    # Forward: evaluate what does not involve the linear inputs.
    linear_eqns = []
    for eqn in jaxpr.eqns:
        if any(isinstance(x, Var) and x in linear for x in eqn.inputs):
            linear_eqns.append(eqn)
            linear.update(eqn.out_binders)
        else:
            outs = bind(eqn.primitive, *[read(x) for x in eqn.inputs], **eqn.params)
            outs = outs if eqn.primitive.multiple_results else [outs]
            values.update(zip(eqn.out_binders, outs))

    # Backward: accumulate cotangents, from the outputs to the inputs.
    cts: dict[Var, Any] = {}

    def add_ct(v: Atom, ct: Any) -> None:
        if ct is None or not (isinstance(v, Var) and v in linear):
            return
        cts[v] = ct if v not in cts else add(cts[v], ct)

    for x, ct in zip(jaxpr.outs, cotangents_out):
        add_ct(x, ct)
    for eqn in reversed(linear_eqns):
        cts_out = [cts.pop(v, None) for v in eqn.out_binders]
        if all(ct is None for ct in cts_out):
            continue  # nothing flows back through this equation
        cts_out = [
            zeros_like_aval(v.aval) if ct is None else ct
            for v, ct in zip(eqn.out_binders, cts_out)
        ]
        args_in = [
            UndefPrimal(x.aval) if isinstance(x, Var) and x in linear else read(x)
            for x in eqn.inputs
        ]
        cts_in = eqn.primitive.rule("transpose")(cts_out, *args_in, **eqn.params)
        for x, ct in zip(eqn.inputs, cts_in):
            add_ct(x, ct)
    return [
        cts.get(v, zeros_like_aval(arg.aval))
        for v, arg in zip(jaxpr.in_binders, args)
        if isinstance(arg, UndefPrimal)
    ]


def zeros_like_aval(aval: ShapedArray) -> np.ndarray:
    return np.zeros(aval.shape, aval.dtype)


# %% [markdown]
# Transpose rules exist only for linear primitives, and each is the adjoint of its
# primitive, written with primitives so that the result can be transformed again.
# A rule returns one cotangent per input, `None` for inputs that are not linear.
# The linear primitives are the five whose JVP rule in
# {ref}`Part 1 <part1-jvp-rules>` applies the primitive itself to the tangents,
# and `mul` when one of its operands is known.
#
# - `add`: the cotangent flows unchanged to each linear operand.
# - `neg`: negate it.
# - `mul`: linear in one operand when the other is known; multiply the cotangent
#   by the known one.
# - `reduce_sum` copies one number to many places on the way back: its transpose
#   is a `broadcast` along the summed axes. And `broadcast`'s transpose sums over
#   the inserted axes.
# - `transpose` by a permutation is undone by the inverse permutation.


# %% tags=["export"]
def _is_undef(x: Any) -> bool:
    return isinstance(x, UndefPrimal)


@add_p.def_rule("transpose")
def _add_transpose(cts, x, y):
    (ct,) = cts
    return [ct if _is_undef(x) else None, ct if _is_undef(y) else None]


@neg_p.def_rule("transpose")
def _neg_transpose(cts, x):
    (ct,) = cts
    return [neg(ct)]


@mul_p.def_rule("transpose")
def _mul_transpose(cts, x, y):
    (ct,) = cts
    if _is_undef(x) and _is_undef(y):
        raise TypeError("mul: transposing a product of two linear values")
    if _is_undef(x):
        return [mul(ct, y), None]
    return [None, mul(x, ct)]


@reduce_sum_p.def_rule("transpose")
def _reduce_sum_transpose(cts, x, *, axes):
    (ct,) = cts
    return [broadcast(ct, x.aval.shape, axes)]


@broadcast_p.def_rule("transpose")
def _broadcast_transpose(cts, x, *, shape, axes):
    (ct,) = cts
    return [reduce_sum(ct, axes)]


@transpose_p.def_rule("transpose")
def _transpose_transpose(cts, x, *, perm):
    (ct,) = cts
    inverse = [0] * len(perm)
    for i, p in enumerate(perm):
        inverse[p] = i
    return [transpose(ct, inverse)]


# %% [markdown]
# `xla_call` is linear in whatever its jaxpr is linear in, so its transpose rule
# transposes the jaxpr: it traces `backward_pass` over the inner jaxpr into a new
# jaxpr (cached per jaxpr and per pattern of linear inputs), and calls that with
# `xla_call`, so the backward pass is compiled too.


# %% tags=["export"]
@functools.cache
def transpose_jaxpr(jaxpr: Jaxpr, undefined: tuple[bool, ...]) -> tuple[Jaxpr, list]:
    """A jaxpr from (defined inputs, output cotangents) to the cotangents of
    the undefined inputs."""
    in_types = jaxpr_type(jaxpr).in_types
    out_types = jaxpr_type(jaxpr).out_types
    defined_types = [t for t, u in zip(in_types, undefined) if not u]

    def transposed(*args):
        defined, cts_out = args[: len(defined_types)], args[len(defined_types) :]
        it = iter(defined)
        full_args = [
            UndefPrimal(t) if u else next(it) for t, u in zip(in_types, undefined)
        ]
        return backward_pass(jaxpr, full_args, cts_out)

    new_jaxpr, consts, _ = make_jaxpr(transposed, *defined_types, *out_types)
    return new_jaxpr, [device_put(c) for c in consts]


@xla_call_p.def_rule("transpose")
def _xla_call_transpose(cts, *args, jaxpr):
    undefined = tuple(_is_undef(x) for x in args)
    new_jaxpr, consts = transpose_jaxpr(jaxpr, undefined)
    defined = [x for x in args if not _is_undef(x)]
    cts = [
        zeros_like_aval(t) if ct is None else ct
        for ct, t in zip(cts, jaxpr_type(jaxpr).out_types)
    ]
    cts_in = iter(bind(xla_call_p, *consts, *defined, *cts, jaxpr=new_jaxpr))
    return [next(cts_in) if u else None for u in undefined]


# %% [markdown]
# ### A linear program, transposed
#
# Here is `backward_pass` at work on the linear jaxpr of `f` that `linearize`
# printed above, with the cotangent 1.0 for its output. The figure is drawn from
# that run: each call of a transpose rule is recorded as it happens and written
# next to the equation it transposes.

# %% mystnb={"image": {"alt": "The linear jaxpr of f at x = 1.5, one equation per line, below a row that lists its residual inputs a to f with their values, and its tangent input g. Next to each equation are the cotangents backward_pass sent through it in a real run seeded with the cotangent 1.0 at the output o, to be read from the bottom up. Each mul by a residual multiplies the cotangent by that residual, neg flips its sign, and add passes it on unchanged. The input g, used by two equations, receives two contributions, which add up to the derivative of f at 1.5."}} tags=["hide-input"]
from html import escape

from IPython.display import SVG


def record_backward_pass(jaxpr, args, cotangents_out):
    """Run backward_pass, recording every transpose rule call in order."""
    calls = []

    def recording(prim, rule):
        def rule_and_record(cts, *args, **params):
            cts_in = rule(cts, *args, **params)
            calls.append((prim, cts, cts_in))
            return cts_in

        return rule_and_record

    originals = {e.primitive: e.primitive.rules.get("transpose") for e in jaxpr.eqns}
    for prim, rule in originals.items():
        if rule is not None:
            prim.rules["transpose"] = recording(prim, rule)
    try:
        cts_in = backward_pass(jaxpr, args, cotangents_out)
    finally:
        for prim, rule in originals.items():
            if rule is not None:
                prim.rules["transpose"] = rule
    return cts_in, calls


def transpose_figure(jaxpr, residuals, seed):
    """Transpose ``jaxpr`` (residuals first, then linear inputs) with the output
    cotangent ``seed``, and draw each equation with the cotangents it passed."""
    linear_in = jaxpr.in_binders[len(residuals) :]
    undefs = [UndefPrimal(v.aval) for v in linear_in]
    cts_in, calls = record_backward_pass(jaxpr, [*residuals, *undefs], [seed])
    # backward_pass visits the equations that involve linear values in reverse.
    linear, linear_eqns = set(linear_in), []
    for eqn in jaxpr.eqns:
        if any(isinstance(x, Var) and x in linear for x in eqn.inputs):
            linear_eqns.append(eqn)
            linear.update(eqn.out_binders)
    assert len(calls) == len(linear_eqns)
    received = {}  # variable -> cotangents it received, in backward order
    step = {}  # equation -> (cotangent of its output, cotangents it sends)
    for eqn, (prim, cts_out, cts_sent) in zip(reversed(linear_eqns), calls):
        assert prim is eqn.primitive
        sent = [(x, ct) for x, ct in zip(eqn.inputs, cts_sent) if ct is not None]
        for x, ct in sent:
            received.setdefault(x, []).append(ct)
        step[id(eqn)] = (cts_out[0], sent)

    def num(x):
        x = np.asarray(x)
        return f"{float(x):.4g}" if x.ndim == 0 else np.array2string(x, precision=3)

    names = _Names()
    eqn_lines = pp_jaxpr(jaxpr, names=names).splitlines()[1 : 1 + len(jaxpr.eqns)]
    blue, orange = "#dbe9f6", "#fde2c8"
    row, top, split, width = 24, 64, 300, 760
    rows = []  # (left text, right text, fill)
    known = "  ".join(
        f"{names(v)} = {num(r)}" for v, r in zip(jaxpr.in_binders, residuals)
    )
    rows.append((f"residuals  {known}", "", blue))
    for v, ct in zip(linear_in, cts_in):
        # in the order of the equations: the reverse of the order received
        terms = [num(c) for c in reversed(received.get(v, []))]
        terms = [t if i == 0 or t[0] != "-" else f"({t})" for i, t in enumerate(terms)]
        total = " + ".join(terms) + (f" = {num(ct)}" if len(terms) > 1 else "")
        rows.append((f"linear input  {names(v)}", f"ct {names(v)} = {total}", orange))
    for eqn, text in zip(jaxpr.eqns, eqn_lines):
        if id(eqn) not in step:
            rows.append((text.strip(), "", blue))
            continue
        ct_out, sent = step[id(eqn)]
        sends = ", ".join(
            f"ct {names(x)} {'+=' if len(received[x]) > 1 else '='} {num(ct)}"
            for x, ct in sent
        )
        rows.append(
            (
                text.strip(),
                f"ct {names(eqn.out_binders[0])} = {num(ct_out)}  \u2192  {sends}",
                orange,
            )
        )
    outs = " ".join(names(x) for x in jaxpr.outs)
    rows.append((f"output  {outs}", f"ct {outs} = {num(seed)}  (the seed)", orange))

    height = top + row * len(rows) + 16
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        'font-family="monospace" font-size="13">',
        "<title>A linear jaxpr transposed by backward_pass</title>",
        '<defs><marker id="tip" markerWidth="8" markerHeight="8" refX="4" refY="4" '
        'orient="auto"><path d="M0,0 L8,4 L0,8 z" fill="#a33"/></marker></defs>',
        '<text x="20" y="22" font-family="sans-serif" font-weight="bold">'
        "linear jaxpr (runs top to bottom)</text>",
        f'<text x="{split + 20}" y="22" font-family="sans-serif" font-weight="bold" '
        'fill="#a33">backward_pass: cotangents (runs bottom to top)</text>',
        f'<text x="{split + 20}" y="42" font-family="sans-serif" fill="#555">'
        "ct v: the cotangent of v; a variable used twice adds its cotangents"
        "</text>",
    ]
    for i, (left, right, fill) in enumerate(rows):
        y = top + row * i
        span = width - 56 if i == 0 else split - 4
        parts.append(
            f'<rect x="16" y="{y}" width="{span}" height="{row - 3}" fill="{fill}"/>'
            f'<text x="22" y="{y + 16}" xml:space="preserve">{escape(left)}</text>'
        )
        if right:
            parts.append(
                f'<text x="{split + 20}" y="{y + 16}" fill="#a33" '
                f'xml:space="preserve">{escape(right)}</text>'
            )
    y0, y1 = top + row * (len(rows) - 1) + 10, top + row + 10
    parts.append(
        f'<line x1="{width - 20}" y1="{y0}" x2="{width - 20}" y2="{y1}" '
        'stroke="#a33" stroke-width="2" marker-end="url(#tip)"/></svg>'
    )
    return SVG("".join(parts)), cts_in


primals_out, lin_jaxpr, residuals = linearize_flat(lambda x: [f(x)], [np.float64(1.5)])
figure, cts_in = transpose_figure(lin_jaxpr, residuals, np.float64(1.0))
assert np.allclose(cts_in[0], f_lin(1.0))  # one variable: the same number
figure


# %% [markdown]
# Read the right-hand column from the bottom up. The seed enters at the output
# `o`. `add` passes a cotangent unchanged to each of its linear operands, `neg`
# flips its sign, and each `mul` by a residual multiplies it by that residual. The
# tangent input `g` is used by two equations, so two cotangents flow back to it,
# and their sum is the derivative $f'(1.5)$: for a function of one variable the
# transpose of the linear map is the same number, the `f_lin(1.0)` printed above.
# The residuals get no cotangents: they are constants of the linear map.
#
# (part4-vjp)=
# ## `vjp` and `grad`
#
# `vjp` linearizes and hands back the transpose of the linear map. `grad` asks for
# the cotangent 1 of a scalar output. Both check what the user gives them:
# cotangents must match the outputs' structure, shapes and dtypes; `grad` needs a
# scalar float output and a float input.


# %% tags=["export"]
def vjp(f: Callable, *primals: Any) -> tuple[Any, Callable]:
    """``f(*primals)`` and ``f_vjp(*cotangents) -> tuple of input cotangents``."""
    primals_flat, in_tree = tree_flatten(primals)
    primals_flat = [_as_input(x, "vjp primal") for x in primals_flat]
    flat_f = flatten_fun(f, in_tree)
    primals_out, jaxpr, residuals = linearize_flat(flat_f, primals_flat)
    out_tree = flat_f.out_tree
    in_avals = [raise_to_shaped(get_aval(p)) for p in primals_flat]
    out_avals = [raise_to_shaped(get_aval(p)) for p in primals_out]

    def f_vjp(*cotangents: Any) -> tuple:
        cts_flat, ct_tree = tree_flatten(
            cotangents[0] if len(cotangents) == 1 else cotangents
        )
        if ct_tree != out_tree:
            raise TypeError(
                f"vjp: cotangents must have the structure of f's output, {out_tree}, "
                f"got {ct_tree}"
            )
        cts_flat = [_as_input(c, "vjp cotangent") for c in cts_flat]
        _check_cotangents(out_avals, cts_flat)
        undefs = [UndefPrimal(aval) for aval in in_avals]
        cts_in = backward_pass(jaxpr, [*residuals, *undefs], cts_flat)
        return tree_unflatten(in_tree, cts_in)

    return tree_unflatten(out_tree, primals_out), f_vjp


def _check_cotangents(out_avals: list[ShapedArray], cts: list[Any]) -> None:
    for i, (aval, ct) in enumerate(zip(out_avals, cts)):
        ct_aval = get_aval(ct)
        if ct_aval.shape != aval.shape or ct_aval.dtype != aval.dtype:
            raise ValueError(
                f"vjp: cotangent {i} should be {aval.str_short()} like the "
                f"output, got {ct_aval.str_short()}"
            )


def grad(f: Callable) -> Callable:
    """The gradient of a scalar-output ``f`` with respect to its first argument."""

    def gradient(x: Any, *rest: Any) -> Any:
        for leaf in tree_flatten(x)[0]:
            dtype = get_aval(_as_input(leaf, "grad")).dtype
            if dtype.kind != "f":
                raise TypeError(
                    f"grad: can only differentiate with respect to float inputs, "
                    f"got dtype {dtype.name}"
                )
        y, f_vjp = vjp(lambda x: f(x, *rest), x)
        out_tree = tree_flatten(y)[1]
        y_aval = get_aval(y) if out_tree == LEAF else None
        if y_aval is None or y_aval.shape != () or y_aval.dtype.kind != "f":
            what = f"a pytree {out_tree}" if y_aval is None else y_aval.str_short()
            raise TypeError(
                f"grad: f must return a float scalar (shape ()), got {what}; "
                "use vjp or jacfwd for other outputs"
            )
        (x_bar,) = f_vjp(np.ones((), y_aval.dtype))
        return x_bar

    return gradient


# %% [markdown]
# Let us check `grad` on the running example against the derivative we know:

# %%
print(grad(f)(1.5), jvp(f, (1.5,), (1.0,))[1])


def loss(w):
    return reduce_sum(sin(w) * w)


w = np.array([0.5, 1.0, 2.0])
print(grad(loss)(w), np.cos(w) * w + np.sin(w))


# %% [markdown]
# And `vjp` of a function with several inputs and outputs, checked against the
# Jacobian from `jacfwd`:


# %%
def two_out(x, y):
    return {"s": sin(x) * y, "t": reduce_sum(x * y)}


x0, y0 = np.array([0.3, 0.7]), np.array([2.0, -1.0])
out, f_vjp = vjp(two_out, x0, y0)
ct = {"s": np.array([1.0, 0.0]), "t": np.float64(1.0)}
x_bar, y_bar = f_vjp(ct)
J_s = jacfwd(lambda x: sin(x) * y0, x0)
print(x_bar, ct["s"] @ J_s + y0)
print(y_bar, np.sin(x0) * ct["s"] + x0)

# %% [markdown]
# ## Everything composes
#
# Each transformation is an interpreter or a jaxpr-to-jaxpr function built from
# `bind`, so they stack in any order. Here is a stress test: first and second
# derivatives, through nested `jit`, `jvp` and `grad` at several depths, all
# compared with the answer computed by hand. For $g(x) = \sin(x)\,x$:
# $g'(x) = \cos x \cdot x + \sin x$ and $g''(x) = 2\cos x - x \sin x$.

# %%
g = lambda x: sin(x) * x
x = 0.8
d1 = np.cos(x) * x + np.sin(x)
d2 = 2 * np.cos(x) - x * np.sin(x)
first = {
    "grad": grad(g)(x),
    "grad(jit)": grad(jit(g))(x),
    "jit(grad)": jit(grad(g))(x),
    "jit(grad(jit))": jit(grad(jit(g)))(x),
    "jvp(jit)": jvp(jit(g), (x,), (1.0,))[1],
}
second = {
    "grad(grad)": grad(grad(g))(x),
    "jit(grad(jit(grad)))": jit(grad(jit(grad(g))))(x),
    "jvp(grad)": jvp(grad(g), (x,), (1.0,))[1],
    "grad(jvp)": grad(lambda x: jvp(g, (x,), (1.0,))[1])(x),
    "jacfwd(grad)": jacfwd(grad(g), x),
    "vmap(grad(grad))": vmap(grad(grad(g)), (0,))(np.array([x, x]))[0],
}
for name, value in first.items():
    print(f"{name:22} {float(value): .12f}  {np.isclose(value, d1)}")
for name, value in second.items():
    print(f"{name:22} {float(value): .12f}  {np.isclose(value, d2)}")


# %% [markdown]
# ## What reverse mode costs
#
# The partial evaluator records each equation once and the topological sort
# visits it once; the backward pass visits each linear equation once. So `grad`
# of a program with $N$ primitives takes time proportional to $N$, and the
# backward pass does work proportional to the forward pass. The repository's
# `bench/` directory measures this against JAX.
#
# ## Where real JAX differs
#
# - JAX's partial evaluator and its JVP use *symbolic zeros*, so unused tangents
#   and cotangents cost nothing; ours materializes them as zero arrays.
# - `jax.linearize` and `jax.vjp` are built the same way as here (JVP, then
#   partial evaluation, then transposition); see
#   [the autodiff cookbook](https://docs.jax.dev/en/latest/notebooks/autodiff_cookbook.html).
#   JAX also has `custom_jvp`/`custom_vjp` rules, checkpointing (`jax.checkpoint`)
#   to trade residual memory for recomputation, and policies for which residuals
#   to save.
# - JAX's `grad` takes `argnums` and `has_aux`; ours differentiates the first
#   argument (which may be a pytree).
#
# ## Summary
#
# - Partial evaluation runs a function with some inputs known: known work is done
#   now, unknown work is recorded as a graph of recipes and turned into a jaxpr
#   by an iterative topological sort. Known values the unknown part needs are
#   residuals.
# - `linearize` is partial evaluation of the JVP with the tangents unknown.
# - `partial_eval_jaxpr` does the same split on program text, which gives
#   `xla_call` its rules, so `linearize(jit(f))` compiles the primal half.
# - Transposition runs a linear jaxpr backwards with one rule per linear
#   primitive; `vjp` transposes the linearized function and `grad` seeds it with 1.
#
# Every function so far has made its decisions in Python. {ref}`Part 5 <part5>`
# stages a conditional into the jaxpr itself and gives it all of these rules.
#
# ## Exercises
#
# **1. Reverse over forward.** A Hessian-vector product can be computed as the
# gradient of a directional derivative. Write `hvp(f, x, v)` with `grad` and `jvp`
# and check it against `jacfwd(grad(f), x) @ v`.


# %% tags=["hide-input"]
def hvp(fun, x, v):
    return grad(lambda x: jvp(fun, (x,), (v,))[1])(x)


h = lambda x: reduce_sum(sin(x) * x)
x0 = np.array([0.3, 1.1, -2.0])
v0 = np.array([1.0, -1.0, 0.5])
print(np.allclose(hvp(h, x0, v0), jacfwd(grad(h), x0) @ v0))


# %% [markdown]
# **2. Count the residuals.** For a chain of $n$ `sin`s, how many residuals does
# `linearize` keep? Check your answer by looking at the linear jaxpr's inputs.


# %% tags=["hide-input"]
def sin_chain(x, n):
    for _ in range(n):
        x = sin(x)
    return x


for n in [1, 2, 5]:
    _, lin, res = linearize_flat(lambda x, n=n: [sin_chain(x, n)], [np.float64(0.5)])
    print(n, "sins ->", len(res), "residuals")  # one cos per sin


# %% [markdown]
# **3. Transpose by hand.** `backward_pass` works on any linear jaxpr, not just
# those from `linearize`. Trace $v \mapsto (2v_0 + v_1, -v_1)$ with `make_jaxpr`
# and transpose it; compare with the transposed matrix.


# %% tags=["hide-input"]
def linear_map(v0, v1):
    return v0 * 2.0 + v1, neg(v1)


lin_jaxpr, lin_consts, _ = make_jaxpr(linear_map, scalar, scalar)
undef = [UndefPrimal(scalar), UndefPrimal(scalar)]
# The matrix is [[2, 1], [0, -1]]; its transpose maps (1, 0) to (2, 1) and
# (0, 1) to (0, -1).
print(*backward_pass(lin_jaxpr, [*lin_consts, *undef], [1.0, 0.0]))
print(*backward_pass(lin_jaxpr, [*lin_consts, *undef], [0.0, 1.0]))
