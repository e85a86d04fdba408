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
# Reverse mode need not be a separate interpreter. We derive it from forward
# mode in two steps, each a transformation of its own, the design JAX's
# reverse mode was built on:
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
# One invariant joins the two steps: every JVP rule builds its output tangent
# from the input tangents with *linear* primitives only (`add`, `neg`, `mul` by a
# known value, `reduce_sum`, `broadcast`, `transpose`), so the recorded half is
# always a jaxpr that transposition can run backwards. A new primitive whose JVP
# rule applied, say, `sin` to a tangent would break `grad`, not `jvp`.
#
# JAX 0.10.2 still transposes, but instead of running the whole JVP under a
# partial evaluator it linearizes one primitive at a time, recording the same
# kind of linear jaxpr; {ref}`the end of this chapter <part4-jax-differs>` says
# how.
#
# The folded cell below loads the library code of the earlier chapters from the
# module `autodidax`, as in {ref}`Part 2 <part2-setup>`. In Colab it first installs
# the JAX release the book is tested with and fetches the module.

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

book_setup.load_book(globals(), before="part4_grad")


# %% [markdown]
# ## What needs to be split
#
# Here is the jaxpr of a JVP, the starting point of everything in this chapter.
# Tracing `jvp` with `make_jaxpr` records what the
# {ref}`JVP rules of Part 1 <part1-jvp-rules>` do at each primitive:


# %%
def f(x):
    y = sin(x) * x
    return cos(y)


def f_jvp(x, x_dot):
    return jvp(f, (x,), (x_dot,))


scalar = ShapedArray((), np.float64)
print(make_jaxpr(f_jvp, scalar, scalar)[0])


# %% [markdown]
# Some equations depend only on `a`, the primal input: `sin a`, `cos a`, `cos f`
# (`f` here is the jaxpr variable holding $\sin a \cdot a$), and so on. Others
# involve `b`, the tangent. If we know `x` but not yet `x_dot`, we can compute the first kind now and must postpone the second. The postponed
# equations only ever multiply the tangent by numbers computed from `x`, or add
# or negate tangents: as a function of the tangent they are linear. That is why
# the postponed part *is* the linear map $\dot x \mapsto f'(x)\,\dot x$.
#
# `linearize` will not split this jaxpr after the fact; it splits while the
# function runs. (Splitting a jaxpr's text is needed too, for `jit`; it comes
# after `grad`, in {ref}`Reverse mode through jit <part4-jit>`.)
#
# (part4-partial-eval)=
# ## Partial evaluation
#
# A partial evaluator is an interpreter (one more {ref}`trace <part1-stack>`) in which each value is either **{term}`known <known value>`**
# (we have it) or **{term}`unknown <unknown value>`** (we know only its type). We record that in a
# `PartialVal`.


# %% tags=["export"]
class PartialVal(NamedTuple):
    """A value that is known (``const`` is set) or unknown (only ``aval``)."""

    aval: ShapedArray
    const: Any | None

    @classmethod
    def known(cls, val: Any) -> PartialVal:
        return cls(get_aval(val), val)

    @classmethod
    def unknown(cls, aval: ShapedArray) -> PartialVal:
        return cls(aval, None)

    @property
    def is_known(self) -> bool:
        return self.const is not None


# %% [markdown]
# The partial evaluation interpreter computes immediately whatever depends only on
# known values. For everything else it builds a graph: each unknown tracer points
# to its **recipe**, which says how the value will be computed later. There are
# three kinds of recipe: the value is an input of the postponed computation; it
# is a known value that the postponed computation needs (a **{term}`residual`**); or it is
# an output of an equation whose inputs are other tracers. A known tracer needs
# no recipe, and answers Python's `if` with its value.


# %% tags=["export"]
class InputRecipe(NamedTuple):
    """The tracer is an input of the staged-out jaxpr."""


class ConstRecipe(NamedTuple):
    """The tracer stands for a known value the staged-out jaxpr needs."""

    val: Any


class EqnRecipe(NamedTuple):
    """The tracers ``tracers_out`` are the outputs of an equation."""

    prim: Primitive
    tracers_in: list[PartialEvalTracer]
    params: dict[str, Any]
    tracers_out: WeakTracers


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


# %% tags=["export", "hide-input"]
# @title WeakTracers: an equation's outputs, held by weak reference
# Each output points to its recipe; strong references back would make every
# equation a reference cycle that only Python's garbage collector frees.
class _UnusedOutput(NamedTuple):
    """Stands in for an output tracer that nothing refers to any more."""

    aval: ShapedArray


class WeakTracers:
    """Tracers held by weak reference; one that nobody kept any more reads as
    an ``_UnusedOutput`` of its type (the same object each time)."""

    def __init__(self, tracers: Sequence[PartialEvalTracer]) -> None:
        self._refs = [weakref.ref(t) for t in tracers]
        self._unused = [_UnusedOutput(t.aval) for t in tracers]

    def __iter__(self) -> Iterator[PartialEvalTracer | _UnusedOutput]:
        for ref, unused in zip(self._refs, self._unused):
            tracer = ref()
            yield unused if tracer is None else tracer

    def __len__(self) -> int:
        return len(self._refs)


# %% [markdown]
# The trace's rules are few. Constants are known. A primitive applied to known
# values is simply applied, by calling `bind` on the values themselves — so the
# work happens lower on the stack: in the evaluation interpreter at the bottom, or
# in whatever transformation was pushed before the partial evaluator (a `jit`
# building its jaxpr, for instance). A
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
        recipe = EqnRecipe(prim, tracers_in, params, WeakTracers(tracers_out))
        for t in tracers_out:
            t.recipe = recipe
        return tracers_out


# %% [markdown]
# ### From a graph of recipes to a jaxpr
#
# When the function has finished, the unknown outputs hang at the end of a graph
# of recipes. Turning the graph into a jaxpr means listing its equations in an
# order where every equation comes after the equations that produce its inputs: a
# **topological sort**. A depth-first search does it: visit a node's parents
# first, then write the node down; a set of visited nodes makes shared parents
# appear once. Residuals become the jaxpr's leading inputs, in the order we meet
# them.


# %% tags=["export"]
def toposort(roots: Sequence[Any], parents: Callable[[Any], Sequence[Any]]) -> list:
    """Nodes reachable from ``roots``, each after all of its parents."""
    order, seen = [], set()
    # A stack, not recursion: no depth limit.
    stack = [(root, False) for root in reversed(roots)]
    while stack:
        node, parents_done = stack.pop()
        if parents_done:
            order.append(node)
        elif id(node) not in seen:
            seen.add(id(node))
            stack.append((node, True))
            stack.extend((p, False) for p in reversed(parents(node)))
    return order


def tracers_to_jaxpr(
    tracers_in: list[PartialEvalTracer], tracers_out: list[PartialEvalTracer]
) -> tuple[Jaxpr, list[Any]]:
    """The jaxpr from (residuals, ``tracers_in``) to ``tracers_out``, and the
    residuals' values."""
    var_of: dict[int, Var] = {}

    def var(t: PartialEvalTracer) -> Var:
        if id(t) not in var_of:
            var_of[id(t)] = Var(t.aval)
        return var_of[id(t)]

    def eqn_parents(recipe: EqnRecipe) -> list[EqnRecipe]:
        return [t.recipe for t in recipe.tracers_in if isinstance(t.recipe, EqnRecipe)]

    def consts(tracers):  # the residuals among ``tracers``, by id
        return {id(t): t for t in tracers if isinstance(t.recipe, ConstRecipe)}

    roots = [t.recipe for t in tracers_out if isinstance(t.recipe, EqnRecipe)]
    residuals, eqns = {}, []
    for r in toposort(roots, eqn_parents):
        residuals.update(consts(r.tracers_in))
        ins, outs = [var(t) for t in r.tracers_in], [var(t) for t in r.tracers_out]
        eqns.append(JaxprEqn(r.prim, ins, r.params, outs))
    residuals.update(consts(tracers_out))
    in_binders = [var(t) for t in [*residuals.values(), *tracers_in]]
    jaxpr = Jaxpr(in_binders, eqns, [var(t) for t in tracers_out])
    typecheck_jaxpr(jaxpr)
    return jaxpr, [t.recipe.val for t in residuals.values()]


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
    """The jaxpr of ``f``'s unknown part, its outputs, and the residuals."""
    with new_level(PartialEvalTrace) as level:
        trace = PartialEvalTrace(level)
        tracers_in = [trace.new_arg(pval) for pval in pvals_in]
        tracers_out = [trace.full_raise(out) for out in f(*tracers_in)]
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
# and the tangents unknown. It pushes a partial evaluator on the interpreter stack
# and then runs `jvp` on top of it, so the JVP interpreter's primal values are
# known values of the partial evaluator: real numbers, computed line by line as
# the Python function executes. The known half is never written down; it is
# simply Python running. Only the unknown half, the tangent work, is recorded.
# The known outputs are the primal outputs; the jaxpr is the linear map from
# input tangents to output tangents; the residuals computed from the primals are
# its first inputs, and the function `linearize` returns supplies them.


# %% tags=["export"]
def linearize_flat(
    f: Callable, primals: list[Any]
) -> tuple[list[Any], Jaxpr, list[Any]]:
    """Primal outputs, and the linear jaxpr (residuals first) of ``f`` at
    ``primals``."""
    n = len(primals)
    pvals_in = [PartialVal.known(p) for p in primals] + [
        PartialVal.unknown(get_aval(p)) for p in primals
    ]

    def f_jvp(*primals_and_tangents):
        outs, outs_dot = jvp_flat(f, primals_and_tangents[:n], primals_and_tangents[n:])
        return [*outs, *outs_dot]

    def tangents_unknown(n_outs: int) -> list[bool]:
        return [False] * (n_outs // 2) + [True] * (n_outs // 2)

    jaxpr, pvals_out, residuals = partial_eval_flat(f_jvp, pvals_in, tangents_unknown)
    primal_pvals = pvals_out[: len(pvals_out) // 2]
    _check_primal_outputs_known(primal_pvals)
    return [p.const for p in primal_pvals], jaxpr, residuals


# %% [markdown]
# The user-facing `linearize` adds pytrees. The linear map it returns checks the
# tangents it is given (`_flatten_and_check_tangents`, in the folded cell below),
# since a wrongly shaped tangent would otherwise fail deep inside the jaxpr's
# evaluation or, worse, broadcast.


# %% tags=["export"]
def linearize(f: Callable, *primals: Any) -> tuple[Any, Callable]:
    """``f(*primals)`` and the linear map ``f_lin(*tangents)`` of ``f`` there."""
    primals_flat, in_tree = tree_flatten(primals)
    primals_flat = [_as_input(x, "linearize primal") for x in primals_flat]
    flat_f = flatten_fun(f, in_tree)
    primals_out, jaxpr, residuals = linearize_flat(flat_f, primals_flat)
    out_tree = flat_f.out_tree

    def f_lin(*tangents: Any) -> Any:
        tangents_flat = _flatten_and_check_tangents(tangents, in_tree, primals_flat)
        outs = eval_jaxpr(jaxpr, [*residuals, *tangents_flat])
        return tree_unflatten(out_tree, outs)

    return tree_unflatten(out_tree, primals_out), f_lin


# %% tags=["export", "hide-input"]
# @title Checks: linearize's primal outputs are known; tangents match the primals
def _check_primal_outputs_known(primal_pvals: list[PartialVal]) -> None:
    if not all(p.is_known for p in primal_pvals):
        raise TypeError("linearize: a primal output depends on the tangents")


def _flatten_and_check_tangents(
    tangents: tuple, in_tree: PyTreeDef, primals_flat: list[Any]
) -> list[Any]:
    """The leaves of ``tangents``, which must match the primals in structure,
    shape and dtype."""
    tangents_flat, tangent_tree = tree_flatten(tangents)
    if tangent_tree != in_tree:
        raise TypeError(
            "linearize: the linear map takes tangents with the structure of "
            f"the primals, {in_tree}, got {tangent_tree}"
        )
    tangents_flat = [_as_input(t, "linearize tangent") for t in tangents_flat]
    _check_tangents("linearize", primals_flat, tangents_flat)
    return tangents_flat


# %%
y, f_lin = linearize(f, 1.5)
print(y, f(1.5))
print(f_lin(1.0), jvp(f, (1.5,), (1.0,))[1])
primals_out, lin_jaxpr, residuals = linearize_flat(lambda x: [f(x)], [np.float64(1.5)])
print(lin_jaxpr)
print("residuals:", *residuals)


# %% [markdown]
# The linear jaxpr contains only the tangent half: multiplications of the tangent
# by residuals, and additions and negations. The residuals are numbers computed
# from $x = 1.5$ while linearizing: $\cos 1.5$ (the derivative of `sin`), $x$
# itself, $\sin 1.5$, and $\sin(\sin(1.5) \cdot 1.5)$ (the derivative of `cos`,
# before its sign flip). Each call of `f_lin` evaluates just that.
#
# Because the split happens while the function runs, a Python `if` on a primal
# value works under `linearize` (and so under `grad`) just as under `jvp`. `bent`
# takes a Python `if` on its input; linearized at two points, it gives two
# different linear jaxprs, each with only the branch taken:


# %%
def bent(x):
    if x > 0.0:
        return sin(x) * x
    return neg(x)


for x0 in [1.5, -1.5]:
    _, lin_jaxpr, residuals = linearize_flat(lambda x: [bent(x)], [np.float64(x0)])
    print(f"at x = {x0}:", lin_jaxpr, "residuals:", *residuals)


# %% [markdown]
# At $x = 1.5$ the comparison, `sin` and `cos` were computed by running Python on
# known values: `sin` and `cos` left their results as residuals, and the
# comparison, consumed by the `if`, left nothing. At $x = -1.5$ nothing is left
# but `neg`. The comparison itself never reached the jaxpr: it was known.
#
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
# available to the linear equations as ordinary values (a jaxpr from `linearize`
# has none; a linear function traced by hand with `make_jaxpr` may).


# %% tags=["export"]
class UndefPrimal(NamedTuple):
    """A linear input whose value we do not have: only its type."""

    aval: ShapedArray


def backward_pass(
    jaxpr: Jaxpr, args: Sequence[Any], cotangents_out: Sequence[Any]
) -> list[Any]:
    """The cotangents of the ``UndefPrimal`` arguments of linear ``jaxpr``."""
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
# {ref}`Part 1 <part1-jvp-rules>` applies the primitive itself to the tangents
# (`add`, `neg`, `reduce_sum`, `broadcast` and `transpose`), and `mul` when one
# of its operands is known.
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
    _check_one_operand_linear(x, y)
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
# A product is linear in one operand only when the other is known; the folded
# check says so if both are linear.


# %% tags=["export", "hide-input"]
# @title Check: a mul to transpose has one linear operand
def _check_one_operand_linear(x: Any, y: Any) -> None:
    if _is_undef(x) and _is_undef(y):
        raise TypeError("mul: transposing a product of two linear values")


# %% [markdown]
# ### A linear program, transposed
#
# Here is `backward_pass` at work on the linear jaxpr of `f` that `linearize`
# printed above, with the cotangent 1.0 for its output. The figure is drawn from
# that run: each call of a transpose rule is recorded as it happens and written
# next to the equation it transposes.

# %% mystnb={"image": {"alt": "The linear jaxpr of f at x = 1.5, one equation per line, below a row that lists its residual inputs a to d with their values, and its tangent input e. Next to each equation are the cotangents backward_pass sent through it in a real run seeded with the cotangent 1.0 at the output k, to be read from the bottom up. Each mul by a residual multiplies the cotangent by that residual, neg flips its sign, and add passes it on unchanged. The input e, used by two equations, receives two contributions, which add up to the derivative of f at 1.5."}} tags=["hide-input"]
# @title Figure: backward_pass on the linear jaxpr of f, recorded as it runs
from figures import draw_transposition

primals_out, lin_jaxpr, residuals = linearize_flat(lambda x: [f(x)], [np.float64(1.5)])
figure, cts_in = draw_transposition(lin_jaxpr, residuals, np.float64(1.0), ns=globals())
assert np.allclose(cts_in[0], f_lin(1.0))  # one variable: the same number
figure


# %% [markdown]
# Read the right-hand column from the bottom up. The seed enters at the output
# `k`. `add` passes a cotangent unchanged to each of its linear operands, `neg`
# flips its sign, and each `mul` by a residual multiplies it by that residual. The
# tangent input `e` is used by two equations, so two cotangents flow back to it,
# and their sum is the derivative $f'(1.5)$: for a function of one variable the
# transpose of the linear map is the same number, the `f_lin(1.0)` printed above.
# The residuals get no cotangents: they are constants of the linear map.
#
# (part4-vjp)=
# ## `vjp` and `grad`
#
# `vjp` linearizes and returns the transpose of the linear map. `grad` is `vjp`
# asked for the cotangent 1 of a scalar output. The checks of what the user
# gives them, and `argnums`, `has_aux` and `value_and_grad` as in JAX, are in
# the folded cell after them.


# %% tags=["export"]
def vjp(f: Callable, *primals: Any) -> tuple[Any, Callable]:
    """``f(*primals)`` and ``f_vjp(*cotangents) -> tuple of input cotangents``."""
    primals_flat, in_tree = tree_flatten(primals)
    primals_flat = [_as_input(x, "vjp primal") for x in primals_flat]
    flat_f = flatten_fun(f, in_tree)
    primals_out, jaxpr, residuals = linearize_flat(flat_f, primals_flat)
    out_tree = flat_f.out_tree
    out_avals = [get_aval(p) for p in primals_out]
    undefs = [UndefPrimal(get_aval(p)) for p in primals_flat]

    def f_vjp(residuals: list, *cotangents: Any) -> tuple:
        cts_flat = _flatten_and_check_cotangents(cotangents, out_tree, out_avals)
        cts_in = backward_pass(jaxpr, [*residuals, *undefs], cts_flat)
        return tree_unflatten(in_tree, cts_in)

    return tree_unflatten(out_tree, primals_out), Partial(f_vjp, residuals)


def grad(f: Callable, argnums=0, has_aux=False) -> Callable:
    """The gradient of a scalar-output ``f`` with respect to argument(s) ``argnums``."""

    def gradient(*args: Any, **kwargs: Any) -> Any:
        f_x, x = _fix_other_args(f, args, kwargs, argnums, has_aux)
        _check_float_inputs(x)
        y, aux, f_vjp = _vjp_with_aux(f_x, x)
        _check_scalar_float_output(y)
        (x_bar,) = f_vjp(np.ones((), get_aval(y).dtype))
        return (x_bar, aux) if has_aux else x_bar

    return gradient


# %% tags=["export", "hide-input"]
# @title Checks: cotangents, grad's input and output types; argnums, has_aux; Partial
# Cotangents must match the outputs' structure, shapes and dtypes; grad needs a
# float input and a scalar float output. grad differentiates the argument (or
# tuple of arguments) named by argnums and passes keyword arguments through.
# vjp returns a Partial, f_vjp with its residuals fixed: a pytree whose leaves
# are the residuals, so it can be returned from jit or kept as a residual of a
# custom rule (Part 8). JAX's jax.vjp returns a pytree of residuals too (its own
# class, jax._src.api.VJP, in JAX 0.10.2).
class Partial:
    """``func`` with its first arguments fixed, and a pytree whose leaves are
    theirs (``func`` is its static part), like JAX's ``jax.tree_util.Partial``."""

    def __init__(self, func: Callable, *args: Any) -> None:
        self.func, self.args = func, args

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.func(*self.args, *args, **kwargs)

    def __repr__(self) -> str:
        return f"Partial({getattr(self.func, '__name__', 'function')}, ...)"


register_pytree_node(
    Partial, lambda p: (p.args, p.func), lambda func, args: Partial(func, *args)
)


def _fix_other_args(
    f: Callable, args: tuple, kwargs: dict, argnums: Any, has_aux: bool
):
    """``f`` as a function of the chosen positional argument (or tuple of them)
    only, returning ``(value, aux)``; ``aux`` is None without ``has_aux``. The
    keyword arguments are held fixed, as JAX does: never differentiated."""
    nums = _check_argnums(argnums, len(args), "grad")

    def f_x(x: Any) -> tuple[Any, Any]:
        new_args = list(args)
        for i, xi in zip(nums, x if isinstance(argnums, tuple) else (x,)):
            new_args[i] = xi
        out = f(*new_args, **kwargs)
        if not has_aux:
            return out, None
        if not (isinstance(out, (tuple, list)) and len(out) == 2):
            raise TypeError(
                "grad: with has_aux=True, f must return a pair (value, aux), "
                f"got {type(out).__name__}"
            )
        return tuple(out)

    chosen = tuple(args[i] for i in nums)
    return f_x, chosen if isinstance(argnums, tuple) else chosen[0]


def value_and_grad(f: Callable, argnums=0, has_aux=False) -> Callable:
    """``f``'s value (with ``aux``) and ``grad(f, argnums, has_aux)``'s gradient."""

    def value_and_gradient(*args: Any, **kwargs: Any) -> tuple[Any, Any]:
        f_x, x = _fix_other_args(f, args, kwargs, argnums, has_aux)
        _check_float_inputs(x)
        y, aux, f_vjp = _vjp_with_aux(f_x, x)
        _check_scalar_float_output(y)
        (x_bar,) = f_vjp(np.ones((), get_aval(y).dtype))
        return ((y, aux) if has_aux else y), x_bar

    return value_and_gradient


def _vjp_with_aux(f_x: Callable, x: Any):
    """``vjp`` of ``f_x(x) -> (y, aux)``, with the pullback of ``y`` only."""
    (y, aux), f_vjp = vjp(f_x, x)
    zeros = tree_map(lambda a: np.zeros(get_aval(a).shape, get_aval(a).dtype), aux)
    return y, aux, lambda ct: f_vjp((ct, zeros))


def _flatten_and_check_cotangents(
    cotangents: tuple, out_tree: PyTreeDef, out_avals: list[ShapedArray]
) -> list[Any]:
    """The leaves of the cotangents (one argument, or one per output), which
    must match the outputs in structure, shape and dtype."""
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
    return cts_flat


def _check_cotangents(out_avals: list[ShapedArray], cts: list[Any]) -> None:
    for i, (aval, ct) in enumerate(zip(out_avals, cts)):
        ct_aval = get_aval(ct)
        if ct_aval.shape != aval.shape or ct_aval.dtype != aval.dtype:
            raise ValueError(
                f"vjp: cotangent {i} should be {aval.str_short()} like the "
                f"output, got {ct_aval.str_short()}"
            )


def _check_float_inputs(x: Any) -> None:
    for leaf in tree_flatten(x)[0]:
        dtype = get_aval(_as_input(leaf, "grad")).dtype
        if dtype.kind != "f":
            raise TypeError(
                f"grad: can only differentiate with respect to float inputs, "
                f"got dtype {dtype.name}"
            )


def _check_scalar_float_output(y: Any) -> None:
    out_tree = tree_flatten(y)[1]
    y_aval = get_aval(y) if out_tree == LEAF else None
    if y_aval is None or y_aval.shape != () or y_aval.dtype.kind != "f":
        what = f"a pytree {out_tree}" if y_aval is None else y_aval.str_short()
        raise TypeError(
            f"grad: f must return a float scalar (shape ()), got {what}; "
            "use vjp or jacfwd for other outputs"
        )


# %% [markdown]
# Let us check `grad` on the running example against the derivative we know:

# %%
print(grad(f)(1.5), jvp(f, (1.5,), (1.0,))[1])


def loss(w):
    return reduce_sum(sin(w) * w)


w = np.array([0.5, 1.0, 2.0])
print(grad(loss)(w), np.cos(w) * w + np.sin(w))


# %% [markdown]
# Reverse mode gives the Jacobian a row at a time: the VJP with the basis vector
# $e_i$ is row $i$. Batching those VJPs with `vmap` over the rows of an identity
# gives `jacrev`, the mirror image of Part 1's `jacfwd`, which builds it a column
# at a time. It wins when a function has fewer outputs than inputs. Composing the
# two gives the Hessian: forward over reverse. `jacobian` is JAX's other name for `jacrev`.


# %% tags=["export"]
def jacrev(f: Callable, argnums=0) -> Callable:
    """Curried, as ``jacfwd``; one VJP per row."""
    return jacobian_per_leaf(jacrev_at, f, argnums)


def jacrev_at(f: Callable, x: Any) -> Any:
    y, f_vjp = vjp(f, x)
    return map_over_basis(lambda ct: f_vjp(ct)[0], get_aval(y))


def hessian(f: Callable, argnums=0) -> Callable:
    return jacfwd(jacrev(f, argnums), argnums)


jacobian = jacrev  # JAX's other name for it

# %%
print(np.allclose(jacrev(loss)(w), grad(loss)(w)))
print(np.allclose(hessian(loss)(w), np.diag(2 * np.cos(w) - w * np.sin(w))))


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
J_s = jacfwd(lambda x: sin(x) * y0)(x0)
print(x_bar, ct["s"] @ J_s + y0)
print(y_bar, np.sin(x0) * ct["s"] + x0)


# %% [markdown]
# (part4-jit)=
# ## Reverse mode through `jit`
#
# Nothing differentiated so far called `jit`. A jitted function is one `xla_call`
# whose work is hidden in its jaxpr, and reverse mode needs two more rules for it:
# one that splits a call into a known and an unknown half, and one that
# transposes it. Both work on the jaxpr itself, not on traced values.
#
# (part4-pe-jaxprs)=
# ### Partial evaluation of jaxprs
#
# Under `linearize`, a jitted function reaches the partial evaluator as one
# `xla_call` with its primal inputs known and its tangent inputs unknown. The
# default rule would stage the whole call, so even the primal outputs would come
# out unknown, and `linearize` would stop with "a primal output depends on the
# tangents". Instead, `xla_call` gets a
# `partial_eval` rule that splits its jaxpr in two: a **known jaxpr** that runs
# now (compiled) and also returns the residuals the other half needs, and an
# **unknown jaxpr** that is staged, taking the residuals and the unknown inputs.
#
# Splitting a jaxpr is partial evaluation done on the program itself instead of on
# traced values: walk the equations, mark each variable known or unknown, send
# each equation to the known half if all its inputs are known and to the unknown half otherwise, and collect as residuals the known
# variables that unknown equations read. The known jaxpr takes the known inputs
# and returns the known outputs followed by the residuals; the unknown jaxpr
# takes the residuals followed by the unknown inputs and returns the unknown
# outputs. `instantiate[i]` forces output `i` into the unknown half, as
# `instantiate` did for `partial_eval_flat`. A primitive may have its own
# `partial_eval_jaxpr` rule for that walk (a nested `xla_call` does, so nested jits
# split too). Such a rule returns an equation for each half, or `None` in place of
# the known one when none of the primitive's work can be done early.


# %% tags=["export"]
def partial_eval_jaxpr(
    jaxpr: Jaxpr, in_unknowns: Sequence[bool], instantiate: Sequence[bool] | None = None
) -> tuple[Jaxpr, Jaxpr, list[bool], int]:
    """Split ``jaxpr`` into ``(known, unknown, out_unknowns, num_residuals)``."""
    if instantiate is None:
        instantiate = [False] * len(jaxpr.outs)
    unknown = {v for v, u in zip(jaxpr.in_binders, in_unknowns) if u}
    known_eqns, unknown_eqns = [], []
    residuals: dict[Var, None] = {}  # an ordered set

    def is_unknown(x: Atom) -> bool:
        return isinstance(x, Var) and x in unknown

    for eqn in jaxpr.eqns:
        unks = [is_unknown(x) for x in eqn.inputs]
        rule = eqn.primitive.rules.get("partial_eval_jaxpr")
        if not any(unks):
            known_eqns.append(eqn)
        elif rule is not None:
            eqn_known, eqn_unknown, outs_unknown, res = rule(unks, eqn)
            if eqn_known is not None:  # None: nothing of it can run early
                known_eqns.append(eqn_known)
            unknown_eqns.append(eqn_unknown)
            residuals.update(dict.fromkeys(res))
            unknown.update(v for v, u in zip(eqn.out_binders, outs_unknown) if u)
        else:
            known_ins = [x for x, u in zip(eqn.inputs, unks) if not u]
            residuals.update(dict.fromkeys(x for x in known_ins if isinstance(x, Var)))
            unknown_eqns.append(eqn)
            unknown.update(eqn.out_binders)

    out_unknowns = [is_unknown(x) or inst for x, inst in zip(jaxpr.outs, instantiate)]
    for x, unk in zip(jaxpr.outs, out_unknowns):
        if unk and isinstance(x, Var) and x not in unknown:
            residuals[x] = None  # a known output that must come out unknown
    residual_vars = list(residuals)
    known_in = [v for v, u in zip(jaxpr.in_binders, in_unknowns) if not u]
    unknown_in = [v for v, u in zip(jaxpr.in_binders, in_unknowns) if u]
    known_outs = [x for x, u in zip(jaxpr.outs, out_unknowns) if not u]
    unknown_outs = [x for x, u in zip(jaxpr.outs, out_unknowns) if u]
    jaxpr_known = Jaxpr(known_in, known_eqns, known_outs + residual_vars)
    jaxpr_unknown = Jaxpr(residual_vars + unknown_in, unknown_eqns, unknown_outs)
    typecheck_jaxpr(jaxpr_known)
    typecheck_jaxpr(jaxpr_unknown)
    return jaxpr_known, jaxpr_unknown, out_unknowns, len(residual_vars)


# %% [markdown]
# (part4-unzipped)=
# ### A jaxpr, unzipped
#
# Here is the split at work on the JVP jaxpr from the start of the chapter, with
# the primal input known and the tangent unknown. The two halves are printed with
# the variable names of that first print (the folded helper `names_as_printed`
# collects them), so each line can be found in the original. The figure after
# them colors each equation of the JVP jaxpr by the half it went to, and marks
# where each residual is made: the known values that cross from the known half to
# the unknown one.


# %% tags=["hide-input"]
# @title Helper: the names pp_jaxpr gives a jaxpr's variables
def names_as_printed(jaxpr: Jaxpr) -> _Names:
    """The names of ``pp_jaxpr(jaxpr)``; passed on, they name its halves alike."""
    names = _Names()
    pp_jaxpr(jaxpr, names=names)
    return names


# %%
jvp_jaxpr_demo = make_jaxpr(f_jvp, scalar, scalar)[0]
known, unknown_half, out_unks, num_res = partial_eval_jaxpr(
    jvp_jaxpr_demo, [False, True]
)
names = names_as_printed(jvp_jaxpr_demo)
print("known half:")
print(pp_jaxpr(known, names=names))
print("unknown half:")
print(pp_jaxpr(unknown_half, names=names))

# %% mystnb={"image": {"alt": "The JVP jaxpr of f, one equation per line. Equations that depend only on the primal input are colored blue and go to the known half; equations that involve the tangent are colored orange and go to the unknown half. Each residual variable, computed in the known half and read by the unknown half, is marked with an arrow at the line that defines it."}} tags=["hide-input"]
# @title Figure: the JVP jaxpr, colored by the half each equation went to
from figures import draw_unzipped_jaxpr

draw_unzipped_jaxpr(jvp_jaxpr_demo, known, unknown_half, num_res, names, ns=globals())


# %% [markdown]
# The blue equations form the known half: the primal computation, plus the
# derivatives of the primitives (`cos a`, `sin f`, ...) that only need the
# primal. The orange ones form the linear map. Everything that crosses from blue
# to orange is a residual, and that is exactly what reverse mode has to store
# between its forward and backward passes. The residuals `d a c k` here are
# `linearize`'s `a b c d` above: the same four values, in the same order, under
# the names of a different print.
#
# ### Splitting a jitted call
#
# `xla_call` gets two rules, for two situations. The `partial_eval` rule is used
# when the partial evaluator meets a jit call as the function runs
# (`linearize(jit(f))`): it runs the known half now (`bind` compiles and runs it)
# and records the unknown half as an `xla_call` equation. The `partial_eval_jaxpr`
# rule is used when the function `partial_eval_jaxpr`, walking an outer jaxpr,
# meets an inner `xla_call` (a jit inside a jit): it turns that one equation into
# two, joined by residual variables. Both split the inner jaxpr with `split_call_jaxpr`, which remembers
# its answers: splitting the same jaxpr the same way must give the *same* two
# jaxprs, or every call of `grad(jit(f))` would compile its halves again.


# %% tags=["export"]
@functools.cache
def split_call_jaxpr(jaxpr: Jaxpr, in_unknowns: tuple[bool, ...]) -> tuple:
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
# With the `xla_call` rules in place, `linearize` sees through `jit`:

# %%
y_jit, f_lin_jit = linearize(jit(f), 1.5)
print(y_jit, f_lin_jit(1.0), f_lin(1.0))


# %% [markdown]
# ### Transposing a jitted call
#
# `xla_call` is linear in whatever its jaxpr is linear in, so its transpose rule
# transposes the jaxpr: it traces `backward_pass` over the inner jaxpr into a new
# jaxpr (cached per jaxpr and per pattern of linear inputs), and calls that with
# `xla_call`, so the backward pass is compiled too.


# %% tags=["export"]
def transpose_jaxpr_uncached(
    jaxpr: Jaxpr, undefined: tuple[bool, ...]
) -> tuple[Jaxpr, list]:
    """A jaxpr from (defined inputs, output cotangents) to input cotangents."""
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


transpose_jaxpr = functools.cache(transpose_jaxpr_uncached)


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
# With both rules, `grad` sees through `jit` too; the next section checks it,
# with `jit` inside and outside `grad` at several depths.
#
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
    "jacfwd(grad)": jacfwd(grad(g))(x),
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
# backward pass does work proportional to the forward pass.
# The chapter {ref}`How fast is it? <performance>` measures this against JAX.
#
# (part4-jax-differs)=
# ## Where real JAX differs
#
# - JAX's JVP, partial evaluator and transposition use *symbolic zeros*
#   (`jax._src.interpreters.ad.Zero`), so tangents and cotangents known to be zero
#   cost nothing; ours materializes them as zero arrays.
# - In JAX 0.10.2, `jax.linearize` and `jax.vjp` do not run a JVP under a
#   separate partial evaluator. They *linearize directly*: one interpreter
#   (`LinearizeTrace`) computes each primal value with the enclosing interpreter and
#   records the tangent operation into a jaxpr at once, using a linearization rule
#   of the primitive where it has one and a per-primitive JVP followed by partial
#   evaluation where it does not (`fallback_linearize_rule` calls
#   `linearize_from_jvp`, in `jax/_src/interpreters/ad.py`; `sin`, `jit`,
#   `scan` and `cond` have rules of their own, `mul` and `cos` do not). The
#   result is the split we built here. The flag
#   `jax_use_direct_linearize` is still defined, but 0.10.2 no longer reads it;
#   direct linearization is the only path. A `jit` call, too, is split by a
#   linearization rule of its primitive (`_pjit_linearize`, which calls
#   `ad.linearize_jaxpr`; see `jax/_src/pjit.py`). When `grad`, `vjp` or
#   `linearize` meets a `jit` call directly, JAX's partial-evaluation rules for
#   `jit` are not called; they are when the call sits in the body of a `scan`
#   or `fori_loop` (whose reverse mode partially evaluates the body) or under
#   `jax.checkpoint`.
# - JAX removes residuals the linear jaxpr does not need (dead-code elimination);
#   ours keeps every known value an unknown equation read. JAX marks linear
#   inputs with `UndefinedPrimal`, as our `UndefPrimal` does.
# - JAX also has `custom_jvp`/`custom_vjp` rules, checkpointing (`jax.checkpoint`)
#   to trade residual memory for recomputation, and policies
#   (`jax.checkpoint_policies`) for which residuals to save. See
#   [the autodiff cookbook](https://docs.jax.dev/en/latest/notebooks/autodiff_cookbook.html).
# - JAX's `grad` also takes `holomorphic` and `allow_int`, and its `vjp` takes
#   `has_aux`; ours has `argnums` and `has_aux` on `grad` and `value_and_grad` only.
#
# ## Summary
#
# - Partial evaluation runs a function with some inputs known: known work is done
#   now, unknown work is recorded as a graph of recipes and turned into a jaxpr
#   by a topological sort. Known values the unknown part needs are residuals.
#   The split happens while the function runs, so Python control flow on
#   primal values just works.
# - `linearize` is partial evaluation of the JVP with the tangents unknown.
# - Transposition runs a linear jaxpr backwards with one rule per linear
#   primitive; `vjp` transposes the linearized function and `grad` seeds it with 1.
# - For `jit`, `partial_eval_jaxpr` does the same split on the jaxpr itself and
#   `transpose_jaxpr` turns a linear jaxpr into its transposed jaxpr; they give
#   `xla_call` its rules, so reverse mode sees through `jit`.
#
# Every branch so far was a Python `if` on a known value. {ref}`Part 5 <part5>`
# stages a conditional into the jaxpr itself and gives it all of these rules.
#
# ## Exercises
#
# **1. Reverse over forward.** A Hessian-vector product can be computed as the
# gradient of a directional derivative. Write `hvp(f, x, v)` with `grad` and `jvp`
# and check it against `jacfwd(grad(f))(x) @ v`.


# %% tags=["hide-input"]
# @title Solution: hvp as the gradient of a JVP
def hvp(fun, x, v):
    return grad(lambda x: jvp(fun, (x,), (v,))[1])(x)


h = lambda x: reduce_sum(sin(x) * x)
x0 = np.array([0.3, 1.1, -2.0])
v0 = np.array([1.0, -1.0, 0.5])
print(np.allclose(hvp(h, x0, v0), hessian(h)(x0) @ v0))


# %% [markdown]
# **2. Count the residuals.** For a chain of $n$ `sin`s, how many residuals does
# `linearize` keep? Check your answer by looking at the linear jaxpr's inputs.


# %% tags=["hide-input"]
# @title Solution: one residual per sin
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
# and transpose it: seeded with the cotangent $e_i$, it should give back row $i$
# of the map's matrix $A$ (that is, $A^T e_i$).


# %% tags=["hide-input"]
# @title Solution: transposing a linear map by hand
def linear_map(v0, v1):
    return v0 * 2.0 + v1, neg(v1)


lin_jaxpr, lin_consts, _ = make_jaxpr(linear_map, scalar, scalar)
undef = [UndefPrimal(scalar), UndefPrimal(scalar)]
# A = [[2, 1], [0, -1]]; the cotangent e_i gives row i of A: (2, 1), (0, -1).
print(*backward_pass(lin_jaxpr, [*lin_consts, *undef], [1.0, 0.0]))
print(*backward_pass(lin_jaxpr, [*lin_consts, *undef], [0.0, 1.0]))
