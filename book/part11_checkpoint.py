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
# (part11)=
# # Part 11: `checkpoint`, trading compute for memory
#
# :::{admonition} Where we are
# :class: note
# Reverse mode ({ref}`Part 4 <part4>`) splits a JVP into a known half, which
# runs now and computes the *residuals*, and an unknown half, the linear map,
# which reads them later; `scan` ({ref}`Part 7 <part7>`) stacks one row of
# residuals per trip. This chapter changes what gets saved.
# :::
#
# Between the forward pass and the backward pass, reverse mode keeps its
# residuals alive: every `cos x` the derivative of a `sin` will need, every
# activation a matrix product will be transposed against. For a deep network or
# a long loop they are what runs out of memory first, long before the
# parameters do. The remedy is old: keep fewer values and compute the others
# again when the backward pass needs them. JAX spells it `jax.checkpoint` (or
# `jax.remat`, for rematerialization).
#
# The whole idea fits in one sentence, and the rest of the chapter is that
# sentence made precise: **a checkpoint is a call whose partial evaluation saves
# less and recomputes more.** Part 4 split a jaxpr so that every value the
# unknown half needs is computed once, in the known half, and saved. A
# checkpoint splits it differently: the known half saves only the call's
# inputs (or what a *policy* allows), and the unknown half starts by computing
# again, from those inputs, whatever else it needs. Derivatives are the same;
# residuals are fewer; the backward pass does more work.
#
# ```text
#               forward pass           saved   backward pass
# plain:        y = sin x; c = cos x   c       x̄ = ȳ · c
# checkpoint:   y = sin x              x       c = cos x; x̄ = ȳ · c
# ```
#
# We build `checkpoint` as a primitive holding a jaxpr, give it every rule,
# and then the two rules that are the point: partial evaluation of tracers
# (what `linearize` and `grad` use) and of jaxprs (what `jit(grad)` uses). The
# split leaves dead code behind, so we also write dead-code elimination over
# jaxprs. Then the policies that decide what may be saved, with JAX's names,
# and a measurement: the residual memory of a loop of $n$ steps, saved whole,
# per step, and by the classic $\sqrt n$ scheme, next to `jax.checkpoint`.

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

book_setup.load_book(globals(), before="part11_checkpoint")

# %% tags=["hide-input"]
# @title JAX, to compare with; the NumPy front end
import jax
import jax.ad_checkpoint
import jax.numpy as jnp
from jax._src.ad_checkpoint import saved_residuals as jax_saved_residuals

anp = numpy_namespace  # outside the book: import autodidax.numpy as anp


# %% [markdown]
# (part11-measured)=
# ## The problem, measured
#
# What does reverse mode keep? `linearize_flat` ({ref}`Part 4 <part4-linearize>`)
# returns the residuals as values. To say *where* each one comes from, we run
# the same `linearize` under `make_jaxpr`: the residuals come out as outputs of
# a jaxpr, and each output is either an argument, a constant, or the output of
# some equation. That is what JAX's `saved_residuals` reports too (it lives in
# `jax._src.ad_checkpoint`; JAX 0.10.2 exports only `print_saved_residuals`
# publicly). Ours takes the same arguments and returns the same kind of list:
# `(type, where it comes from)`.


# %% tags=["export"]
def saved_residuals(f: Callable, *args: Any, **kwargs: Any) -> list[tuple]:
    """What ``vjp(f, *args)`` keeps for the backward pass: a list of
    (type, where it comes from), as JAX's ``saved_residuals``."""
    leaves, in_tree = tree_flatten((args, kwargs))
    leaves = [_as_input(x, "saved_residuals argument") for x in leaves]

    def residuals_of(*leaves):
        def f_flat(*leaves):
            a, k = tree_unflatten(in_tree, leaves)
            return tree_flatten(f(*a, **k))[0]

        return linearize_flat(f_flat, list(leaves))[2]  # the residuals

    jaxpr, consts, _ = make_jaxpr(residuals_of, *leaves)
    return describe_residuals(jaxpr, len(consts), argument_names(f, args, kwargs))


# %% tags=["export", "hide-input"]
# @title describe_residuals: where each output of the jaxpr comes from
import math
import types


def describe_residuals(jaxpr: Jaxpr, num_consts: int, arg_names: list[str]):
    """(type, source) for each output of ``jaxpr``, in JAX's order: literals,
    constants, arguments, then equation outputs in program order."""
    made_by = {v: (i, e) for i, e in enumerate(jaxpr.eqns) for v in e.out_binders}
    consts, inputs = _split(jaxpr.in_binders, num_consts)
    found = []
    for x in jaxpr.outs:
        if isinstance(x, Lit):
            found.append(((0, 0), x.aval, "from a literal"))
        elif x in consts:
            found.append(((1, consts.index(x)), x.aval, "from a constant"))
        elif x in inputs:
            i = inputs.index(x)
            found.append(((2, i), x.aval, f"from the argument {arg_names[i]}"))
        else:
            i, eqn = made_by[x]
            what = f"output of {eqn.primitive.name}"
            if eqn.primitive.name == "name":  # checkpoint_name, below
                what = f"named '{eqn.params['name']}'"
            found.append(((3, i), x.aval, what))
    return [(aval, what) for _, aval, what in sorted(found, key=lambda f: f[0])]


def argument_names(f: Callable, args: tuple, kwargs: dict) -> list[str]:
    """A name for each leaf of (args, kwargs): the parameter's, with the
    leaf's position inside it when the argument is a pytree."""
    try:
        params = list(inspect.signature(f).parameters)
    except (TypeError, ValueError):
        params = []
    names = []
    for i, a in enumerate(args):
        base = params[i] if i < len(params) else f"args[{i}]"
        leaves, tree = tree_flatten(a)
        names += (
            [base] if tree == LEAF else [f"{base}[{j}]" for j in range(len(leaves))]
        )
    for k, v in kwargs.items():
        leaves, tree = tree_flatten(v)
        names += [k] if tree == LEAF else [f"{k}[{j}]" for j in range(len(leaves))]
    return names


def residual_bytes(residuals: list[tuple], arguments: bool = False) -> int:
    """The bytes of the residuals; those that are arguments only if asked
    (they are alive anyway)."""
    return sum(
        math.prod(aval.shape) * np.dtype(aval.dtype).itemsize
        for aval, where in residuals
        if arguments or not where.startswith("from the argument")
    )


# %% [markdown]
# A small network: two layers, each a matrix product followed by `sin`.
# Reverse mode needs the three arguments (each matrix product is transposed
# against the other operand), the first layer's activations `h` (the second
# product's operand), and the two `cos` that are the derivatives of the `sin`s:


# %%
def mlp(W1, W2, x):
    h = anp.sin(x @ W1)
    return anp.sum(anp.sin(h @ W2))


def jax_mlp(W1, W2, x):
    h = jnp.sin(x @ W1)
    return jnp.sum(jnp.sin(h @ W2))


rng = np.random.default_rng(0)
W1, W2, x = rng.normal(size=(3, 4)), rng.normal(size=(4, 2)), rng.normal(size=(5, 3))
for aval, where in saved_residuals(mlp, W1, W2, x):
    print(f"{aval.str_short():16} {where}")
with jax.enable_x64(True):  # float64, as ours, in this cell only
    jax_found = jax_saved_residuals(jax_mlp, W1, W2, x)
print(
    "JAX saves",
    len(jax_found),
    "residuals, of types",
    [a.str_short() for a, _ in jax_found],
)


# %% [markdown]
# JAX saves the same six values (it also says on which line each was made; our
# jaxprs do not record source lines). Now make it deep: a chain of `depth`
# such layers, one weight matrix each, on a batch of 32 vectors of 64. Every
# layer adds an activation and a `cos` of the same size as the batch, so the
# residuals grow linearly with depth:


# %%
def deep(Ws, x):
    for W in Ws:
        x = anp.sin(x @ W)
    return anp.sum(x)


def jax_deep(Ws, x):
    for W in Ws:
        x = jnp.sin(x @ W)
    return jnp.sum(x)


x_batch = rng.normal(size=(32, 64))
print("depth  residuals (not arguments)   kB   JAX kB")
for depth in [2, 4, 8, 16]:
    Ws = [rng.normal(size=(64, 64)) / 8 for _ in range(depth)]
    ours = [r for r in saved_residuals(deep, Ws, x_batch) if "argument" not in r[1]]
    with jax.enable_x64(True):
        theirs = jax_saved_residuals(jax_deep, Ws, x_batch)
    kb, jax_kb = residual_bytes(ours) / 1e3, residual_bytes(theirs) / 1e3
    print(f"{depth:5}  {len(ours):25}   {kb:6.1f}   {jax_kb:6.1f}")

# %% [markdown]
# (part11-primitive)=
# ## The `checkpoint` primitive
#
# `checkpoint(fun)` returns a function that traces `fun` to a jaxpr (once per
# argument signature, as `jit` does) and binds one primitive, `checkpoint`,
# that carries it. Its parameters: the jaxpr, the policy (`None` means save
# nothing but the inputs), `prevent_cse` (below, under lowering) and
# `differentiated`, which is `False` for the call the user wrote and `True`
# for the recomputing calls that partial evaluation makes. As in JAX, the
# options are keyword-only, and `checkpoint` works as a decorator, plain or
# through `functools.partial`. The checks (folded) run when `checkpoint` is
# called, not later inside `grad`.

# %% tags=["export"]
checkpoint_p = Primitive("checkpoint", multiple_results=True)


def checkpoint(
    fun: Callable, *, prevent_cse: bool = True, policy=None, static_argnums=()
) -> Callable:
    """``fun``, whose reverse mode saves only its inputs (and what ``policy``
    allows) and computes the rest again in the backward pass."""
    static_argnums = check_checkpoint_args(fun, policy, static_argnums)
    policy = None if policy is None else Policy(policy)
    traces: dict = {}  # one jaxpr per signature, as for jit

    @functools.wraps(fun)
    def fun_remat(*args: Any, **kwargs: Any) -> Any:
        args = mark_static_args(args, static_argnums)
        args_flat, in_tree = tree_flatten((args, kwargs))
        args_flat = [_as_input(x, "checkpoint argument") for x in args_flat]
        jaxpr, consts, out_tree = trace_checkpointed(fun, traces, args_flat, in_tree)
        outs = bind(
            checkpoint_p, *consts, *args_flat, jaxpr=jaxpr,
            prevent_cse=prevent_cse, differentiated=False, policy=policy,
        )  # fmt: skip
        return tree_unflatten(out_tree, outs)

    return fun_remat


remat = checkpoint  # JAX's other name for it


# %% tags=["export", "hide-input"]
# @title Tracing once per signature; static arguments; policies' names; checks
def trace_checkpointed(fun: Callable, traces: dict, args_flat: list, in_tree):
    """``fun``'s jaxpr, constants and output tree at these argument types."""
    avals = tuple(ShapedArray(x.shape, x.dtype) for x in args_flat)
    key = (in_tree, avals)
    if key in traces:
        return traces[key]

    def call(args, kwargs):
        return fun(*map(_unmark, args), **kwargs)

    traced = _trace_to_jaxpr(call, tree_unflatten(in_tree, avals), who="checkpoint")
    if not any(isinstance(c, Tracer) for c in traced[1]):  # closes over no tracer
        traces[key] = traced
    return traced


def mark_static_args(args: tuple, static_argnums: tuple) -> tuple:
    """``args`` with the static ones wrapped in ``Static`` (a pytree node with
    no leaves: its value is part of the signature, never traced)."""
    if not static_argnums:
        return args
    n = len(args)
    for i in static_argnums:
        if not -n <= i < n:
            raise ValueError(
                f"checkpoint: static_argnums {i} is out of range: the function "
                f"was called with {n} positional argument(s)"
            )
    nums = {i % n for i in static_argnums}
    return tuple(
        _static(x, f"argument {i}") if i in nums else x for i, x in enumerate(args)
    )


class Policy:
    """A policy function, named by its ``__name__`` in printed jaxprs."""

    def __init__(self, fn: Callable) -> None:
        self.fn = fn.fn if isinstance(fn, Policy) else fn

    def __call__(self, prim: Primitive, *avals: ShapedArray, **params: Any) -> bool:
        return bool(self.fn(prim, *avals, **params))

    def __repr__(self) -> str:
        return getattr(self.fn, "__name__", None) or repr(self.fn)

    def __eq__(self, other: Any) -> bool:
        return isinstance(other, Policy) and other.fn == self.fn

    def __hash__(self) -> int:
        return hash(self.fn)


def check_checkpoint_args(fun: Any, policy: Any, static_argnums: Any) -> tuple:
    if not callable(fun):
        raise TypeError(
            f"checkpoint: fun must be a function, got {type(fun).__name__} "
            f"{_short_repr(fun)}"
        )
    if policy is not None and not callable(policy):
        hint = ""
        if isinstance(policy, str) and policy in _POLICY_NAMES:
            hint = f"; did you mean checkpoint_policies.{policy}?"
        raise TypeError(
            "checkpoint: policy must be None or a function "
            "policy(prim, *avals, **params) -> bool, such as "
            f"checkpoint_policies.dots_saveable; got {type(policy).__name__} "
            f"{_short_repr(policy)}{hint}"
        )
    nums = static_argnums
    nums = tuple(nums) if isinstance(nums, (tuple, list)) else (nums,)
    if not all(_is_axis(i) for i in nums):
        raise TypeError(
            "checkpoint: static_argnums must be an int or a tuple of ints, got "
            f"{static_argnums!r}"
        )
    return tuple(int(i) for i in nums)


_POLICY_NAMES = (
    "everything_saveable nothing_saveable dots_saveable "
    "dots_with_no_batch_dims_saveable save_only_these_names"
).split()


# %% [markdown]
# Most of its rules are those of any call, as `xla_call` has them
# ({ref}`Part 3 <part3>`): evaluation runs the jaxpr; abstract evaluation
# returns its output types; `jvp` and `vmap` transform the jaxpr
# (`jvp_jaxpr`, `vmap_jaxpr`) and bind `checkpoint` again on the result, so
# the checkpoint survives the transformation; the cost is the jaxpr's. They
# are folded. Two deserve a word.
#
# - **Transpose.** The unknown half of a checkpoint is not a purely linear
#   jaxpr: it recomputes primal values before using them. Part 4's
#   `backward_pass` already handles that: it evaluates first every equation
#   that reads no linear input, then runs the linear ones backwards. So the
#   transpose rule is `xla_call`'s (`transpose_jaxpr`), and it binds
#   `checkpoint` on the transposed jaxpr: the recomputation happens inside
#   the backward pass, where it belongs.
# - **Lowering and `prevent_cse`.** A checkpoint is lowered as a call of its
#   jaxpr. But the recomputation in the backward pass computes, from the same
#   inputs, the same values as the forward pass, and XLA's common-subexpression
#   elimination would merge the two and keep the forward values alive: the
#   saving undone. JAX prevents this by passing the inputs of a
#   `differentiated` checkpoint through `stablehlo.optimization_barrier`,
#   which XLA may not look through. Ours does the same when `prevent_cse` is
#   true (the default). Inside a `scan` body the merge cannot happen (the
#   forward values of one trip are gone by the time the backward loop runs),
#   which is why JAX's documentation suggests `prevent_cse=False` there.


# %% tags=["export", "hide-input"]
# @title The rules of a call: impl, abstract eval, jvp, vmap, transpose, lower, cost
@checkpoint_p.def_rule("impl")
def _checkpoint_impl(*args, jaxpr, **params):
    return eval_jaxpr(jaxpr, args)


@checkpoint_p.def_rule("abstract_eval")
def _checkpoint_abstract_eval(*avals, jaxpr, **params):
    check_custom_call_types("checkpoint", jaxpr, avals)
    return jaxpr_type(jaxpr).out_types


@checkpoint_p.def_rule("jvp")
def _checkpoint_jvp(primals, tangents, *, jaxpr, **params):
    new_jaxpr, consts = jvp_jaxpr(jaxpr)
    outs = bind(checkpoint_p, *consts, *primals, *tangents, jaxpr=new_jaxpr, **params)
    n = len(outs) // 2
    return outs[:n], outs[n:]


@checkpoint_p.def_rule("vmap")
def _checkpoint_vmap(axis, vals, dims, *, jaxpr, **params):
    vals = [
        v if d is None else move_batch_axis(axis.size, d, 0, v)
        for v, d in zip(vals, dims)
    ]
    batched = tuple(d is not None for d in dims)
    new_jaxpr, consts = vmap_jaxpr(jaxpr, axis, batched)
    outs = bind(checkpoint_p, *consts, *vals, jaxpr=new_jaxpr, **params)
    return outs, [0] * len(outs)


@checkpoint_p.def_rule("transpose")
def _checkpoint_transpose(cts, *args, jaxpr, **params):
    undefined = tuple(_is_undef(x) for x in args)
    new_jaxpr, consts = transpose_jaxpr(jaxpr, undefined)
    defined = [x for x in args if not _is_undef(x)]
    cts = [
        zeros_like_aval(t) if ct is None else ct
        for ct, t in zip(cts, jaxpr_type(jaxpr).out_types)
    ]
    cts_in = iter(
        bind(checkpoint_p, *consts, *defined, *cts, jaxpr=new_jaxpr, **params)
    )
    return [next(cts_in) if u else None for u in undefined]


@checkpoint_p.def_rule("lower")
def _checkpoint_lower(ctx, avals_in, avals_out, *args, jaxpr, **params):
    args = list(args)
    if params["prevent_cse"] and params["differentiated"] and args:
        args = list(hlo.OptimizationBarrierOp(args).results)
    return _call_jaxpr(ctx, jaxpr, args)


@checkpoint_p.def_rule("cost")
def _checkpoint_cost(ctx, avals_in, avals_out, *, jaxpr, **params):
    return ctx.cost(jaxpr, ctx.inputs)


# %% [markdown]
# A checkpointed function computes what the function computes, and its jaxpr
# is one equation holding the function's:


# %%
def two_sins(x):
    return anp.sin(anp.sin(x))


print(checkpoint(two_sins)(0.5), two_sins(0.5))
print(make_jaxpr(checkpoint(two_sins), 0.5)[0])


# %% [markdown]
# (part11-split)=
# ## Saving less: splitting with a policy
#
# Here is the heart of the chapter. {ref}`Part 4's <part4-pe-jaxprs>`
# `partial_eval_jaxpr` sends each equation to one half: the known half if its
# inputs are known, the unknown half otherwise; every known value the unknown
# half reads becomes a residual. `partial_eval_jaxpr_policy` adds one
# question for each known equation: *may its outputs be saved?* The policy
# answers, looking at the equation (its primitive, its input types, its
# parameters); no policy (`None`, the default) answers no. If yes, the equation stays in the known half and its outputs
# become residuals when needed, as before. If no, the equation goes to the
# known half (the forward pass needs it) **and also to the unknown half**,
# which computes it again.
#
# So a value the unknown half reads is of one of three kinds: unknown
# (computed there anyway); *available*, because it is an input of the jaxpr or
# the output of a recomputed equation; or known but not available, which makes
# it a saved residual. The unknown half takes the saved residuals first, then
# the jaxpr's inputs (a checkpoint always saves its inputs). It is built
# generously, with every recomputable equation, and then trimmed by
# dead-code elimination (`dce_jaxpr`, the next section): the forward pass
# needed all of them, the backward pass only some. An equation that holds a
# jaxpr of its own and has unknown inputs (a `scan`, say) is first split by its
# own rule, and its known part is then treated like any known equation.


# %% tags=["export"]
class RematSplit(NamedTuple):
    known: Jaxpr  # known inputs -> (known outputs, saved residuals)
    unknown: Jaxpr  # (saved residuals, the inputs it reads) -> unknown outputs
    out_unknowns: list[bool]
    num_res: int
    used_inputs: list[bool]  # the jaxpr's inputs that the unknown half reads


def partial_eval_jaxpr_policy(jaxpr: Jaxpr, in_unknowns, policy) -> RematSplit:
    unknown = {v for v, u in zip(jaxpr.in_binders, in_unknowns) if u}
    available = set(jaxpr.in_binders)  # in the unknown half without saving
    known_eqns, unknown_eqns, saved = [], [], {}

    def to_unknown_half(eqn: JaxprEqn) -> None:
        for x in eqn.inputs:
            if isinstance(x, Var) and x not in available and x not in unknown:
                saved[x] = None  # computed by the known half, saved for this one
        unknown_eqns.append(eqn)

    def to_known_half(eqn: JaxprEqn) -> None:
        known_eqns.append(eqn)
        avals = [x.aval for x in eqn.inputs]
        if policy is None or not policy(eqn.primitive, *avals, **eqn.params):
            to_unknown_half(eqn)  # not saveable: computed again
            available.update(eqn.out_binders)

    for eqn in jaxpr.eqns:
        unks = [isinstance(x, Var) and x in unknown for x in eqn.inputs]
        rule = eqn.primitive.rules.get("partial_eval_jaxpr")
        if not any(unks):
            to_known_half(eqn)
            continue
        if rule is not None:  # a jaxpr inside: split it by its own rule first
            eqn_known, eqn_unknown, _, _ = rule(unks, eqn)
            if eqn_known is not None:
                to_known_half(eqn_known)
            eqn = eqn_unknown
        to_unknown_half(eqn)
        unknown.update(eqn.out_binders)

    out_unknowns = [isinstance(x, Var) and x in unknown for x in jaxpr.outs]
    known_outs, unknown_outs = _split_by(out_unknowns, jaxpr.outs)
    saved = list(saved)
    unknown_half = Jaxpr(saved + jaxpr.in_binders, unknown_eqns, unknown_outs)
    unknown_half, used = dce_jaxpr(unknown_half, [True] * len(unknown_outs))
    used_saved, used_inputs = _split(used, len(saved))
    saved = _keep(used_saved, saved)
    known_in = [v for v, u in zip(jaxpr.in_binders, in_unknowns) if not u]
    known_half = Jaxpr(known_in, known_eqns, known_outs + saved)
    known_half, _ = dce_jaxpr(known_half, [True] * len(known_half.outs), True)
    return RematSplit(known_half, unknown_half, out_unknowns, len(saved), used_inputs)


def _keep(flags: Sequence[bool], xs: Sequence) -> list:
    return [x for x, f in zip(xs, flags) if f]


# %% [markdown]
# (part11-dce)=
# ## Dead-code elimination
#
# `dce_jaxpr(jaxpr, used_outputs)` returns the jaxpr without the equations
# that no used output needs, and which inputs it still reads. It walks the
# equations backwards, carrying the set of variables something needs: an
# equation is kept if one of its outputs is needed, and then its inputs are
# needed too. `instantiate` keeps inputs that are not read, when a caller needs
# the jaxpr's type to stay as it was. The signature is JAX's
# (`jax._src.interpreters.partial_eval.dce_jaxpr`).
#
# Two refinements make it a registry, `dce_rules`, rather than one loop. An
# equation that *does* something besides computing outputs (a `debug.print`,
# {ref}`analysis`) is never removed; `effectful_primitives` lists those
# primitives, and `has_effects` also looks inside the jaxprs an equation
# carries. And an equation that carries jaxprs can be trimmed inside: a rule
# receives which of its outputs are used and returns which inputs it reads and
# a smaller equation (or `None` to drop it). Everything without a rule is kept
# or dropped whole (`dce_whole`).

# %% tags=["export"]
dce_rules: dict[Primitive, Callable] = {}  # the others: dce_whole
effectful_primitives: set[Primitive] = {debug_print_p}  # never removed


def dce_jaxpr(
    jaxpr: Jaxpr, used_outputs: Sequence[bool], instantiate: Any = False
) -> tuple[Jaxpr, list[bool]]:
    """``jaxpr`` without what its used outputs do not need, and which of its
    inputs it still reads (``instantiate``: inputs kept even if unread)."""
    needed = {x for x, u in zip(jaxpr.outs, used_outputs) if u and isinstance(x, Var)}
    kept = []
    for eqn in reversed(jaxpr.eqns):
        used_outs = [v in needed for v in eqn.out_binders]
        rule = dce_rules.get(eqn.primitive, dce_whole)
        used_ins, new_eqn = rule(used_outs, eqn)
        if new_eqn is not None:
            kept.append(new_eqn)
            needed.update(x for x, u in zip(eqn.inputs, used_ins) if u)
    if isinstance(instantiate, bool):
        instantiate = [instantiate] * len(jaxpr.in_binders)
    used_inputs = [v in needed or i for v, i in zip(jaxpr.in_binders, instantiate)]
    new_jaxpr = Jaxpr(
        _keep(used_inputs, jaxpr.in_binders),
        kept[::-1],
        _keep(used_outputs, jaxpr.outs),
    )
    return new_jaxpr, used_inputs


def dce_whole(used_outputs: list[bool], eqn: JaxprEqn):
    """Keep the equation whole if an output is used or it has effects."""
    if any(used_outputs) or has_effects(eqn):
        return [True] * len(eqn.inputs), eqn
    return [False] * len(eqn.inputs), None


def has_effects(eqn: JaxprEqn) -> bool:
    """Does the equation (or a jaxpr inside it) do more than compute outputs?"""
    inner = [p for p in eqn.params.values() if isinstance(p, Jaxpr)]
    return eqn.primitive in effectful_primitives or any(
        has_effects(e) for jaxpr in inner for e in jaxpr.eqns
    )


# %% [markdown]
# The rules, folded: a call (`xla_call`, `checkpoint`) trims its jaxpr to the
# used outputs and reads what that jaxpr reads; a `cond` trims both branches
# and keeps the inputs either branch reads, so the two still have one type; a
# `scan` or `while` can drop a carry only if no used output needs it on a
# *later* trip, which is a fixed point like those of Parts 6 and 7 (a
# `while` also keeps every carry its condition reads). The calls of
# {ref}`Part 8 <part8>` are kept whole: their derivative rule is a Python
# function that computes every output, and trimming the call would need
# trimming the rule too. A later primitive that carries a jaxpr registers its
# own rule in `dce_rules`.


# %% tags=["export", "hide-input"]
# @title The rules for primitives that carry jaxprs: calls, cond, scan, while
def _dce_call(used_outputs, eqn):
    """A call (xla_call, checkpoint): remove the dead code inside it."""
    if not any(used_outputs) and not has_effects(eqn):
        return [False] * len(eqn.inputs), None
    new_jaxpr, used_inputs = dce_jaxpr(eqn.params["jaxpr"], used_outputs)
    new_eqn = JaxprEqn(
        eqn.primitive,
        _keep(used_inputs, eqn.inputs),
        dict(eqn.params, jaxpr=new_jaxpr),
        _keep(used_outputs, eqn.out_binders),
    )
    return used_inputs, new_eqn


def _dce_cond(used_outputs, eqn):
    """Both branches keep the inputs either branch reads."""
    if not any(used_outputs) and not has_effects(eqn):
        return [False] * len(eqn.inputs), None
    branches = [eqn.params["true_jaxpr"], eqn.params["false_jaxpr"]]
    reads = [dce_jaxpr(b, used_outputs)[1] for b in branches]
    used = [a or b for a, b in zip(*reads)]
    new_t, new_f = [dce_jaxpr(b, used_outputs, instantiate=used)[0] for b in branches]
    pred, operands = eqn.inputs[0], eqn.inputs[1:]
    new_eqn = JaxprEqn(
        eqn.primitive,
        [pred, *_keep(used, operands)],
        dict(eqn.params, true_jaxpr=new_t, false_jaxpr=new_f),
        _keep(used_outputs, eqn.out_binders),
    )
    return [True, *used], new_eqn


def _used_carries(body: Jaxpr, used_carry: list, used_rest: list, num_before: int):
    """Fixed point: a carry is used if a used output needs it on a later trip."""
    while True:
        used_in = dce_jaxpr(body, used_carry + used_rest)[1]
        carry_in = used_in[num_before : num_before + len(used_carry)]
        new = [a or b for a, b in zip(used_carry, carry_in)]
        if new == used_carry:
            return used_carry
        used_carry = new


def _dce_scan(used_outputs, eqn):
    if not any(used_outputs) and not has_effects(eqn):
        return [False] * len(eqn.inputs), None
    p = eqn.params
    nc, ncar, body = p["num_consts"], p["num_carry"], p["jaxpr"]
    used_carry, used_ys = _split(used_outputs, ncar)
    used_carry = _used_carries(body, used_carry, used_ys, nc)
    num_xs = len(body.in_binders) - nc - ncar
    new_body, used_in = dce_jaxpr(
        body, used_carry + used_ys, [False] * nc + used_carry + [False] * num_xs
    )
    new_params = dict(
        p, jaxpr=new_body, num_consts=sum(used_in[:nc]), num_carry=sum(used_carry)
    )
    new_outs = _keep(used_carry + used_ys, eqn.out_binders)
    return used_in, JaxprEqn(
        eqn.primitive, _keep(used_in, eqn.inputs), new_params, new_outs
    )


def _dce_while(used_outputs, eqn):
    if not any(used_outputs) and not has_effects(eqn):
        return [False] * len(eqn.inputs), None
    p = eqn.params
    cn, bn = p["cond_nconsts"], p["body_nconsts"]
    cond_reads = dce_jaxpr(p["cond_jaxpr"], [True])[1][cn:]
    used_carry = [a or b for a, b in zip(used_outputs, cond_reads)]
    used_carry = _used_carries(p["body_jaxpr"], used_carry, [], bn)
    new_cond, cond_used = dce_jaxpr(p["cond_jaxpr"], [True], [False] * cn + used_carry)
    new_body, body_used = dce_jaxpr(
        p["body_jaxpr"], used_carry, [False] * bn + used_carry
    )
    used_in = cond_used[:cn] + body_used[:bn] + used_carry
    new_params = dict(
        p,
        cond_jaxpr=new_cond,
        body_jaxpr=new_body,
        cond_nconsts=sum(cond_used[:cn]),
        body_nconsts=sum(body_used[:bn]),
    )
    new_outs = _keep(used_carry, eqn.out_binders)
    return used_in, JaxprEqn(
        eqn.primitive, _keep(used_in, eqn.inputs), new_params, new_outs
    )


dce_rules[xla_call_p] = _dce_call
dce_rules[checkpoint_p] = _dce_call
dce_rules[cond_p] = _dce_cond
dce_rules[scan_p] = _dce_scan
dce_rules[while_p] = _dce_while
# A custom rule computes every output of its call: the call is kept whole.
dce_rules[custom_jvp_call_p] = dce_whole
dce_rules[custom_vjp_call_p] = dce_whole

# %% [markdown]
# Here is the kind of jaxpr the split leaves behind, and DCE at work on it: a
# JVP of `two_sins`, with the primal output no longer used (only the tangent
# is). The `sin` of a `sin` (`f`) goes, and nothing else does: every other
# equation feeds the tangent.

# %%
scalar = ShapedArray((), np.float64)
jvp_of_two_sins = make_jaxpr(lambda x, t: jvp(two_sins, (x,), (t,)), scalar, scalar)[0]
print(jvp_of_two_sins)
tangent_only, used_inputs = dce_jaxpr(jvp_of_two_sins, [False, True])
print(tangent_only)


# %% [markdown]
# (part11-partial-eval)=
# ## The two partial-evaluation rules
#
# The tracing rule is the one `linearize`, `vjp` and `grad` meet. When they
# run a checkpointed function, its JVP rule binds `checkpoint` on the JVP
# jaxpr, and the partial evaluator underneath receives that equation with the
# primals known and the tangents unknown. The rule splits that jaxpr with the policy (`None`
# saves nothing but the inputs, as JAX's `nothing_saveable` does), runs the known half now, and stages
# the unknown half as a new `checkpoint` equation, `differentiated=True`,
# whose inputs are the saved residuals and the checkpoint's own inputs. Those
# inputs are what the checkpoint saves: `instantiate_const` turns a known one
# into a residual of the outer `linearize`. Splits are cached per jaxpr,
# pattern of unknowns and policy, as `split_call_jaxpr` is for `jit`.


# %% tags=["export"]
@functools.cache
def split_checkpoint(jaxpr: Jaxpr, in_unknowns: tuple, policy) -> RematSplit:
    return partial_eval_jaxpr_policy(jaxpr, in_unknowns, policy)


@checkpoint_p.def_rule("partial_eval")
def _checkpoint_partial_eval(trace, tracers, *, jaxpr, policy, **params):
    in_unknowns = tuple(not t.pval.is_known for t in tracers)
    s = split_checkpoint(jaxpr, in_unknowns, policy)
    known_outs = eval_jaxpr(s.known, [t.pval.const for t in tracers if t.pval.is_known])
    known_outs, saved = _split(known_outs, len(known_outs) - s.num_res)
    saved = [trace.instantiate_const(trace.pure(r)) for r in saved]
    inputs = [trace.instantiate_const(t) for t in _keep(s.used_inputs, tracers)]
    staged = dict(params, jaxpr=s.unknown, policy=policy, differentiated=True)
    unknown_outs = iter(trace.stage(checkpoint_p, saved + inputs, staged))
    known_outs = iter(known_outs)
    return [
        next(unknown_outs) if u else trace.pure(next(known_outs))
        for u in s.out_unknowns
    ]


# %% [markdown]
# The rule for jaxprs (used when a checkpoint sits inside a `jit` that is
# differentiated, or inside a `scan` body) makes the same split into two
# equations: a `checkpoint` of the known half, returning the saved residuals
# after its outputs, and a `differentiated` `checkpoint` of the unknown half.
# It is folded.


# %% tags=["export", "hide-input"]
# @title The partial_eval_jaxpr rule: the same split, as two equations
@checkpoint_p.def_rule("partial_eval_jaxpr")
def _checkpoint_partial_eval_jaxpr(unks_in, eqn):
    params = eqn.params
    s = split_checkpoint(params["jaxpr"], tuple(unks_in), params["policy"])
    known_outs, unknown_outs = _split_by(s.out_unknowns, eqn.out_binders)
    saved = [Var(x.aval) for x in s.known.outs[len(known_outs) :]]
    known_ins = [x for x, u in zip(eqn.inputs, unks_in) if not u]
    eqn_known = JaxprEqn(
        checkpoint_p, known_ins, dict(params, jaxpr=s.known), known_outs + saved
    )
    inputs = _keep(s.used_inputs, eqn.inputs)
    staged = dict(params, jaxpr=s.unknown, differentiated=True)
    eqn_unknown = JaxprEqn(checkpoint_p, saved + inputs, staged, unknown_outs)
    known_inputs = [  # the outer split must keep these as residuals
        x
        for x, u in zip(inputs, _keep(s.used_inputs, unks_in))
        if not u and isinstance(x, Var)
    ]
    return eqn_known, eqn_unknown, s.out_unknowns, saved + known_inputs


# %% [markdown]
# Now the point of it all. The linear map of `two_sins`, plainly and
# checkpointed. Plainly, `linearize` keeps two residuals, the two `cos`
# values, and the linear map only multiplies. Checkpointed, it keeps one: the
# input `x`. The linear map is one `checkpoint` equation whose jaxpr computes
# `sin` and the two `cos` again before multiplying; the second `sin`, which
# only the primal output needed, was removed by DCE.

# %%
for name, f in [("plain", two_sins), ("checkpointed", checkpoint(two_sins))]:
    _, lin_jaxpr, residuals = linearize_flat(lambda x, f=f: [f(x)], [np.float64(0.5)])
    print(f"{name}: residuals {[float(r) for r in residuals]}")
    print(lin_jaxpr)


# %% [markdown]
# The same with `vjp`, traced whole, forward and backward pass in one jaxpr.
# Plainly, the backward pass is two multiplications by values the forward
# pass computed. Checkpointed, the forward pass still computes `sin a` and
# `sin c`, but the backward pass is a `checkpoint` that starts from `a` and
# computes `sin` and the two `cos` again: the recomputation, visible.


# %%
def vjp_of(f):
    return lambda x, ct: vjp(f, x)[1](ct)


print(make_jaxpr(vjp_of(two_sins), scalar, scalar)[0])
print(make_jaxpr(vjp_of(checkpoint(two_sins)), scalar, scalar)[0])


# %% [markdown]
# The derivatives are the same, under every transformation and next to JAX:
# first and second order, through `jit` and `vmap`, with the checkpoint
# around a `cond`, nested in another checkpoint, and around a `scan`:


# %%
def layered(x):
    y = checkpoint(lambda x: anp.sin(x) * x)(x)  # a checkpoint inside a checkpoint
    return (
        cond(y > 0.0, anp.cos, anp.sin, y)
        + scan(lambda c, _: (anp.sin(c), None), y, None, 3)[0]
    )


def jax_layered(x):
    y = jax.checkpoint(lambda x: jnp.sin(x) * x)(x)
    branch = jax.lax.cond(y > 0.0, jnp.cos, jnp.sin, y)
    return branch + jax.lax.scan(lambda c, _: (jnp.sin(c), None), y, None, 3)[0]


f, jf = checkpoint(layered), jax.checkpoint(jax_layered)
xs = np.array([0.3, 1.2, -2.0])
with jax.enable_x64(True):
    checks = {
        "grad": (grad(f)(0.7), jax.grad(jf)(0.7)),
        "jit(grad)": (jit(grad(f))(0.7), jax.grad(jf)(0.7)),
        "grad(grad)": (grad(grad(f))(0.7), jax.grad(jax.grad(jf))(0.7)),
        "vmap(grad)": (vmap(grad(f))(xs), jax.vmap(jax.grad(jf))(xs)),
        "jvp": (jvp(f, (0.7,), (1.0,))[1], jax.jvp(jf, (0.7,), (1.0,))[1]),
    }
for name, (ours, theirs) in checks.items():
    print(f"{name:11} {np.allclose(ours, theirs, rtol=1e-12, atol=0)}")


# %% [markdown]
# (part11-policies)=
# ## Policies: what may be saved
#
# A policy is a function of an equation, `policy(prim, *avals, **params) ->
# bool`: may the outputs of this equation be saved? This is JAX's signature:
# `partial_eval_jaxpr_custom` in `jax/_src/interpreters/partial_eval.py`
# calls `saveable(eqn.primitive, *[x.aval for x in eqn.invars],
# **eqn.params)`. The book has JAX's five common policies, under JAX's names:


# %% tags=["export"]
def everything_saveable(prim: Primitive, *avals: ShapedArray, **params: Any) -> bool:
    return True  # the split of Part 4: a checkpoint that changes nothing


def nothing_saveable(prim: Primitive, *avals: ShapedArray, **params: Any) -> bool:
    return False  # save the inputs only (the default, policy=None)


def dots_saveable(prim: Primitive, *avals: ShapedArray, **params: Any) -> bool:
    return prim is dot_general_p  # save matrix products, recompute the rest


def dots_with_no_batch_dims_saveable(prim, *avals, **params) -> bool:
    if prim is not dot_general_p:
        return False
    _, (lhs_batch, rhs_batch) = params["dimension_numbers"]
    return not lhs_batch and not rhs_batch


class save_only_these_names:
    """Save the values tagged by ``checkpoint_name`` with one of these names."""

    def __init__(self, *names: str) -> None:
        self.names = frozenset(names)

    def __call__(self, prim: Primitive, *avals: ShapedArray, **params: Any) -> bool:
        return prim is name_p and params["name"] in self.names

    def __repr__(self) -> str:
        return f"save_only_these_names({', '.join(map(repr, sorted(self.names)))})"


checkpoint_policies = types.SimpleNamespace(
    everything_saveable=everything_saveable,
    nothing_saveable=nothing_saveable,
    dots_saveable=dots_saveable,
    dots_with_no_batch_dims_saveable=dots_with_no_batch_dims_saveable,
    save_only_these_names=save_only_these_names,
)

# %% [markdown]
# The last one needs names. `checkpoint_name(x, name)` is a primitive that
# returns `x` unchanged, under every interpreter, and carries `name` as a
# parameter, so a policy can see it. Its JVP names the primal only (the
# tangent must not be mistaken for the saved value), so `name` never appears in
# a linear jaxpr and needs no transpose rule. Its rules are folded.

# %% tags=["export"]
name_p = Primitive("name")


def checkpoint_name(x: Any, name: str) -> Any:
    """``x`` unchanged, tagged with ``name`` for ``save_only_these_names``."""
    check_checkpoint_name(x, name)
    return tree_map(lambda leaf: bind(name_p, leaf, name=name), x)


# %% tags=["export", "hide-input"]
# @title The rules of name: the identity everywhere; the check of its arguments
def check_checkpoint_name(x: Any, name: Any) -> None:
    if not isinstance(name, str):
        raise TypeError(
            f"checkpoint_name: name must be a str, got {type(name).__name__} "
            f"{_short_repr(name)}"
        )
    for leaf in tree_flatten(x)[0]:
        _as_input(leaf, f"checkpoint_name {name!r}")


@name_p.def_rule("impl")
def _name_impl(x, *, name):
    return [x]


@name_p.def_rule("abstract_eval")
def _name_abstract_eval(x, *, name):
    return [ShapedArray(x.shape, x.dtype)]


@name_p.def_rule("jvp")
def _name_jvp(primals, tangents, *, name):
    return [bind(name_p, primals[0], name=name)], [tangents[0]]


@name_p.def_rule("vmap")
def _name_vmap(axis, vals, dims, *, name):
    return [bind(name_p, vals[0], name=name)], dims


@name_p.def_rule("lower")
def _name_lower(ctx, avals_in, avals_out, x, *, name):
    return [x]


free_cost(name_p)
NEVER_TRANSPOSED.add("name")  # linear, but its tangent is never named


# %% [markdown]
# The same two-layer network, with its hidden activations named `h`, under
# every policy, next to JAX's count. `nothing_saveable` keeps only the three
# arguments; `dots_saveable` adds the two matrix products (the `sin`s and
# `cos`es are recomputed from them); `save_only_these_names("h")` adds `h`;
# `everything_saveable` keeps what the plain function keeps.


# %%
def named_mlp(lib, name):
    def mlp(W1, W2, x):
        h = name(lib.sin(x @ W1), "h")
        return lib.sum(lib.sin(h @ W2))

    return mlp


ours_mlp = named_mlp(anp, checkpoint_name)
jax_mlp_named = named_mlp(jnp, jax.ad_checkpoint.checkpoint_name)
policies = ["everything_saveable", "nothing_saveable", "dots_saveable"]
policies += ["dots_with_no_batch_dims_saveable", "save_only_these_names"]
for name in policies:
    ours, theirs = (
        getattr(checkpoint_policies, name),
        getattr(jax.checkpoint_policies, name),
    )
    if name == "save_only_these_names":
        ours, theirs = ours("h"), theirs("h")
    kept = saved_residuals(checkpoint(ours_mlp, policy=ours), W1, W2, x)
    with jax.enable_x64(True):
        jax_kept = jax_saved_residuals(
            jax.checkpoint(jax_mlp_named, policy=theirs), W1, W2, x
        )
    sources = ", ".join(where.replace("from the argument ", "") for _, where in kept)
    print(f"{name:33} {len(kept)} (JAX {len(jax_kept)}): {sources}")


# %% [markdown]
# A policy can be any function of that signature. Saving exactly what the
# backward pass of a `sin` needs, and nothing else, is one line, and it keeps
# the two `cos` values and the arguments (the activation `h` is recomputed):


# %%
def save_cosines(prim, *avals, **params):
    return prim is cos_p


print(
    [
        where
        for _, where in saved_residuals(checkpoint(mlp, policy=save_cosines), W1, W2, x)
    ]
)


# %% [markdown]
# (part11-memory)=
# ## Memory against trip count
#
# A loop is where checkpoints pay. Take a `scan` of $n$ steps over a state of
# 64 numbers, each step `h = sin(h * w)`, differentiated with respect to `w`
# and the initial state. There are three ways to write it:
#
# - **plain**: the known loop of {ref}`Part 7 <part7-partial-eval>` stacks
#   two residuals per step, `cos(h * w)` and `h`: $2n$ rows;
# - **checkpointed body**: `scan(checkpoint(step), ...)` saves only the body's
#   input, the state, per step: $n$ rows; each backward step recomputes its
#   `sin` and `cos`;
# - **$\sqrt n$ nested**: cut the loop into $k = \sqrt n$ chunks of $k$ steps;
#   an outer scan over chunks whose body, checkpointed, is an inner scan over
#   steps. The outer loop saves one state per chunk: $k$ rows. In the
#   backward pass each chunk is run again, forwards, to rebuild its $2k$ rows
#   of residuals, which are used and dropped: at any time, $k$ saved rows
#   plus one chunk's $2k$, memory of the order of $\sqrt n$, for one extra
#   forward pass in total.


# %%
def trip_count_losses(lib, n):
    scan_, checkpoint_, sin_, sum_ = lib
    k = math.isqrt(n)

    def plain(w, h0):
        return sum_(scan_(lambda h, _: (sin_(h * w), None), h0, None, length=n)[0])

    def body(w, h0):
        step = checkpoint_(lambda h, _: (sin_(h * w), None))
        return sum_(scan_(step, h0, None, length=n)[0])

    def sqrt_n(w, h0):
        def chunk(h, _):  # k steps
            return scan_(lambda h, _: (sin_(h * w), None), h, None, length=k)[0], None

        return sum_(scan_(checkpoint_(chunk), h0, None, length=k)[0])

    return {"plain": plain, "checkpointed body": body, "√n nested": sqrt_n}


OURS = (scan, checkpoint, anp.sin, anp.sum)
JAX = (jax.lax.scan, jax.checkpoint, jnp.sin, jnp.sum)
w0, h0 = np.linspace(0.5, 1.5, 64), np.linspace(-1.0, 1.0, 64)
sizes, measured = [16, 64, 256, 1024], {}
for n in sizes:
    for lib_name, lib in [("ours", OURS), ("JAX", JAX)]:
        for scheme, loss in trip_count_losses(lib, n).items():
            with jax.enable_x64(True):
                found = (saved_residuals if lib is OURS else jax_saved_residuals)(
                    loss, w0, h0
                )
            measured.setdefault((scheme, lib_name), []).append(residual_bytes(found))
for (scheme, lib_name), row in measured.items():
    print(f"{scheme:18} {lib_name:5}", "  ".join(f"{b / 1e3:7.1f} kB" for b in row))

# %% [markdown]
# The bytes are the same in both systems, size for size (the figure draws
# ours as lines, JAX's as rings on them). Plain and checkpointed body both
# grow linearly, a factor of 2 apart (parallel lines on the logarithmic
# scale); the nested scheme grows as $\sqrt n$, a line of half their slope. The arguments `w` and `h0` are left out of the count: they are
# alive anyway.

# %% mystnb={"image": {"alt": "Residual bytes against the trip count n (16, 64, 256, 1024), both axes logarithmic. Three lines for autodidax, plain, checkpointed body and the square-root scheme, and JAX's measurements as rings lying on the same points. The plain line is highest and grows linearly, the checkpointed body is half of it, and the square-root line rises with half the slope."}} tags=["hide-input"]
# @title Figure: residual bytes against trip count, ours and JAX's
from figures import residual_bytes_chart

residual_bytes_chart(sizes, measured)

# %% [markdown]
# Memory is bought with work. The cost interpreter of
# {ref}`the chapter on reading programs <analysis>` counts what `grad` of each
# program executes, each loop body multiplied by its trip count; here for
# $n = 1024$, next to the residual bytes measured above:

# %%
n = 1024
for scheme, loss in trip_count_losses(OURS, n).items():
    cost = cost_analysis(grad(loss, argnums=(0, 1)), w0, h0)
    kb = measured[(scheme, "ours")][sizes.index(n)] / 1e3
    print(
        f"{scheme:18} residuals {kb:7.1f} kB   flops {cost['flops']:9,.0f}"
        f"   sin/cos evaluations {cost['transcendentals']:9,.0f}"
    )

# %% [markdown]
# The checkpointed body halves the memory for a fifth more arithmetic (each
# backward step multiplies `h * w` again and takes its `cos`; the `sin` it
# would recompute is removed as dead code, so it evaluates no more sines and
# cosines than the plain loop). The nested scheme keeps a sixty-fourth of the
# memory and pays one more forward pass: one and a half times the sine and cosine
# evaluations of the plain loop. How much time that costs depends on the machine and the program:
# `bench/bench_checkpoint.py` times `jit(grad)` of the three programs in both
# systems (on a small body like this one, recomputing can cost less than
# writing residuals to memory and reading them back).
#
# (part11-errors)=
# ## Mistakes `checkpoint` catches
#
# The checks run when `checkpoint` or `checkpoint_name` is called:

# %% tags=["hide-input"]
# @title Errors: the messages of checkpoint's checks
show_error(checkpoint, 3.0)  # not a function
show_error(lambda: checkpoint(two_sins, policy="dots_saveable"))  # a name, not a policy
show_error(checkpoint(lambda x, n: x * n, static_argnums=2), 1.0, 2)  # no argument 2
show_error(checkpoint_name, 1.0, 7)  # a name that is not a string
show_error(checkpoint_name, "activations", "h")  # not an array


# %% [markdown]
# (part11-jax)=
# ## Where real JAX differs
#
# - **The primitive's name.** JAX's primitive is called `remat2` in this
#   release (its jaxprs print `remat2[...]`), with the same four parameters
#   as ours: `jaxpr`, `policy`, `prevent_cse`, `differentiated`. JAX's
#   `checkpoint` also takes `static_argnames`, and `prevent_cse` may be a
#   tuple with one flag per argument.
# - **Policies see inside.** JAX's split (`partial_eval_jaxpr_custom`) has a
#   rule for each primitive that carries a jaxpr (`jit`, `scan`, `cond`,
#   `while`), which applies the policy to the equations *inside*. Ours asks
#   the policy about a nested equation as a whole: with `dots_saveable`, a
#   matrix product inside a `jit` inside a checkpoint is recomputed by ours
#   and saved by JAX.
# - **A policy may answer more than yes or no.** JAX's policies may return
#   `Saveable`, `Recompute` or `Offloadable(src, dst)`: save the value in
#   another memory (host RAM) and bring it back for the backward pass.
#   `offload_dot_with_no_batch_dims` and `save_and_offload_only_these_names`
#   are such policies; JAX also has `save_any_names_but_these` and
#   `save_from_both_policies`. We have none of them.
# - **Precision.** JAX passes the floating-point values a checkpoint saves
#   through `reduce_precision` (`_insert_reduce_precision` in
#   `jax/_src/ad_checkpoint.py`), so that XLA computing in excess precision
#   cannot make the forward and backward values differ.
# - **Dead-code elimination** in JAX (`pe.dce_rules`) trims the outputs of
#   `custom_jvp` and `custom_vjp` calls too, pruning the rules along with the
#   call; ours keeps those calls whole. JAX's `while` has no rule: its loops
#   are kept whole, where ours drops carries that nothing needs.
# - **Residual counts follow the JVP rules.** The programs of this page use
#   `sin`, whose derivative both systems save as one `cos`. Where a JVP rule
#   is written differently the counts differ: for `tanh`, ours saves
#   $1 - y^2$ alone, JAX's saves $y$ and $1 - y$ (its rule computes the
#   tangent as $(\dot x + \dot x\, y)(1 - y)$).
# - **`saved_residuals`** is `jax._src.ad_checkpoint.saved_residuals`
#   (public: `jax.ad_checkpoint.print_saved_residuals`); its descriptions end
#   with the source line (`output of cos from model.py:12`).
#
# ## Summary
#
# - A checkpoint is a call (the primitive `checkpoint`, holding a jaxpr) with
#   every rule of a call, whose partial evaluation is different: its known
#   half saves only the call's inputs, or what a policy allows, and its
#   unknown half computes again what it needs.
# - `partial_eval_jaxpr_policy` is Part 4's split with one question per known
#   equation, asked of the policy: save its outputs, or send a copy of the
#   equation to the unknown half.
# - `dce_jaxpr` removes what no used output needs; primitives that carry
#   jaxprs trim them with rules in `dce_rules`, loops by a fixed point, and
#   effects are never removed.
# - Policies are functions of an equation: `everything_saveable`,
#   `nothing_saveable`, `dots_saveable`, `dots_with_no_batch_dims_saveable`,
#   `save_only_these_names` with `checkpoint_name`.
# - For a loop of $n$ steps, residual memory goes from $2n$ rows to $n$
#   (checkpointed body) to about $\sqrt n$ (nested scans with a checkpointed
#   outer body), the same bytes as JAX.
#
# ## Exercises
#
# **1. Checkpoint every other layer.** In `deep` with depth 8, wrap pairs of
# layers in `checkpoint`. How many residuals that are not arguments remain,
# and why that number?


# %% tags=["hide-input"]
# @title Solution: a checkpoint per pair of layers
def deep_pairs(Ws, x):
    pair = checkpoint(lambda W, V, x: anp.sin(anp.sin(x @ W) @ V))
    for W, V in zip(Ws[::2], Ws[1::2]):
        x = pair(W, V, x)
    return anp.sum(x)


Ws8 = [rng.normal(size=(64, 64)) / 8 for _ in range(8)]
kept = [r for r in saved_residuals(deep_pairs, Ws8, x_batch) if "argument" not in r[1]]
# Each of the 4 checkpoints saves its inputs; the weights are arguments, and
# the first x too, so 3 activations remain: the outputs of pairs 1 to 3.
print(len(kept), [aval.str_short() for aval, _ in kept])


# %% [markdown]
# **2. Does `nothing_saveable` recompute?** Count the `sin` and `cos`
# equations in the jaxpr of `grad(mlp)`, plainly and checkpointed with each
# of `nothing_saveable` and `everything_saveable`.


# %% tags=["hide-input"]
# @title Solution: counting equations, nested jaxprs included
def count(jaxpr, names):
    found = 0
    for eqn in jaxpr.eqns:
        found += eqn.primitive.name in names
        for p in eqn.params.values():
            found += count(p, names) if isinstance(p, Jaxpr) else 0
    return found


for label, f in [
    ("plain", mlp),
    ("nothing_saveable", checkpoint(mlp, policy=nothing_saveable)),
    ("everything_saveable", checkpoint(mlp, policy=everything_saveable)),
]:
    print(f"{label:20}", count(make_jaxpr(grad(f), W1, W2, x)[0], {"sin", "cos"}))
# Plain: 2 sins and 2 cos, all in the forward pass. nothing_saveable: the
# forward pass computes the 2 sins only (no cos: nothing there needs them),
# the backward pass the first sin again and the 2 cos: one equation more.
# everything_saveable is the plain split.

# %% [markdown]
# **3. A carry nobody needs.** A `scan` carries a counter and a value, and
# only the value is returned. What does `dce_jaxpr` do with the counter? And
# if the value's update reads the counter?


# %% tags=["hide-input"]
# @title Solution: the carry goes, unless a used carry reads it
def loop(x, reads_counter):
    def step(carry, _):
        i, v = carry
        v = anp.sin(v) + (i if reads_counter else 0.0)
        return (i + 1.0, v), None

    return scan(step, (0.0, x), None, length=4)[0][1]


for reads in [False, True]:
    jaxpr = make_jaxpr(functools.partial(loop, reads_counter=reads), scalar)[0]
    (scan_eqn,) = [e for e in jaxpr.eqns if e.primitive is scan_p]
    trimmed, _ = dce_jaxpr(jaxpr, [True])
    (new_scan,) = [e for e in trimmed.eqns if e.primitive is scan_p]
    print(
        f"reads counter: {reads}:",
        scan_eqn.params["num_carry"],
        "->",
        new_scan.params["num_carry"],
        "carries",
    )
