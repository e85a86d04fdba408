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
# (part5)=
# # Part 5: staged control flow with `cond`
#
# :::{admonition} Where we are
# :class: note
# Every transformation of the book exists and composes with the others: `jvp`
# and `vmap` ({ref}`Part 1 <part1>`), `make_jaxpr` ({ref}`Part 2 <part2>`), `jit`
# ({ref}`Part 3 <part3>`), and `linearize`, `vjp` and `grad`
# ({ref}`Part 4 <part4>`). What none of them can stage yet is a decision: a
# branch taken on a traced value.
# :::
#
# So far a function's control flow has been Python's business. Under `jvp` and
# `grad` that is fine: a `JVPTracer` knows its primal value, so an `if` on it
# simply takes one path, and the derivative is the derivative of that path. Two
# of our transformations cannot do this. While `jit` or `make_jaxpr` trace a
# function, a value is only a type, so there is nothing to branch on
# ({ref}`Part 2 <part2>` made that a `ConcretizationError`). Under `vmap` a value
# is a whole batch, and different examples may want different branches.
#
# The way out is to stop asking Python to choose. A conditional becomes a
# primitive, `cond`, which receives *both* branches as jaxprs and picks one when
# the program runs ({term}`initial style`, as for `jit`). It is our second
# *{term}`higher-order <higher-order primitive>`* primitive, after
# {ref}`Part 3 <part3>`'s `xla_call`, and as with `xla_call` the work is in its
# rules: each transformation must say what it does to a program that contains two
# programs. This chapter writes all of them — evaluation, abstract evaluation,
# lowering to StableHLO, `jvp`, `vmap` (including a predicate that differs per
# example), both kinds of partial evaluation, and transposition — so that `cond`
# works under `jit`, `grad`, `vmap` and any nesting of them.
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

autodidax.load_chapters(globals(), before="part5_cond")
np.set_printoptions(precision=6, suppress=True)

# %% [markdown]
# ## Where Python's `if` stops working
#
# Here is a function with a kink: a sine on one side of zero, a scaled cosine on
# the other. Written with a Python `if`, it evaluates and differentiates, but it
# cannot be compiled, and it cannot be batched over inputs with different signs.

# %% tags=["hide-input"]
import textwrap


def show_error(fn, *args):
    try:
        fn(*args)
    except Exception as e:
        print(textwrap.fill(f"{type(e).__name__}: {e}", 80, subsequent_indent="  "))


# %%
def kinked(x):
    if x > 0.0:
        return sin(x) * x
    return cos(x) * 3.0


print(kinked(1.2), grad(kinked)(1.2), grad(kinked)(-0.5))
show_error(jit(kinked), 1.2)
show_error(vmap(kinked), np.array([1.2, -0.5]))

# %% [markdown]
# ## `cond` as a primitive
#
# `cond(pred, true_fn, false_fn, *operands)` means "`true_fn(*operands)` if `pred`
# else `false_fn(*operands)`", with `pred` a boolean scalar. The wrapper does
# the work Python's `if` used to do at once, but symbolically: it traces each
# branch into a jaxpr at the operands' types and binds one `cond` primitive that
# holds both.
#
# Two details make the branches fit into a single equation. First, the equation's
# output types must not depend on the branch taken, so both branches must return
# the same pytree of the same shapes and dtypes; the wrapper checks this, since a
# mismatch is a mistake in the user's program, and says which output differs.
# Second, a branch may use values it does not receive as operands — arrays it
# closes over, or tracers of an enclosing transformation. Tracing turns them into
# {term}`constants <constant>`: extra leading inputs of that branch's jaxpr. The two branches
# usually close over different things, yet `cond` has one list of inputs. So we
# **join the constants**: the equation's inputs are the true branch's constants,
# then the false branch's, then the operands, and each jaxpr gets unused input
# binders for the other branch's constants. Both jaxprs then have the same input
# type, and the operands of `cond` are simply whatever the taken branch reads.

# %% tags=["export"]
import inspect

cond_p = Primitive("cond", multiple_results=True)


def _with_unused_inputs(jaxpr: Jaxpr, at: int, avals: list[ShapedArray]) -> Jaxpr:
    """``jaxpr`` with inputs of types ``avals`` inserted at position ``at``,
    which it ignores."""
    new_binders = [Var(aval) for aval in avals]
    in_binders = jaxpr.in_binders[:at] + new_binders + jaxpr.in_binders[at:]
    return Jaxpr(in_binders, jaxpr.eqns, jaxpr.outs)


def join_consts(
    true_jaxpr: Jaxpr, true_consts: list, false_jaxpr: Jaxpr, false_consts: list
) -> tuple[Jaxpr, Jaxpr]:
    """Make two branches, each taking its own constants first, take the same
    inputs: (true constants, false constants, operands)."""

    def avals(consts: list) -> list[ShapedArray]:
        return [raise_to_shaped(get_aval(c)) for c in consts]

    return (
        _with_unused_inputs(true_jaxpr, len(true_consts), avals(false_consts)),
        _with_unused_inputs(false_jaxpr, 0, avals(true_consts)),
    )


# %% [markdown]
# The checks come first, so that every mistake is reported in terms of the user's
# call: a predicate that is not a boolean scalar, a branch that is not callable or
# cannot take the operands, branches whose results differ in structure or type.


# %% tags=["export"]
def _check_predicate(pred: Any) -> Any:
    pred = _as_input(pred, "cond predicate")
    _check_predicate_aval(get_aval(pred))
    return pred


def _check_predicate_aval(aval: ShapedArray) -> None:
    if aval.dtype != np.bool_:
        raise TypeError(
            f"cond: the predicate must be a boolean scalar (bool[]), got "
            f"{aval.str_short()}; compare to get a boolean, e.g. greater(x, 0.0)"
        )
    if aval.shape != ():
        raise TypeError(
            f"cond: the predicate must be a boolean scalar (bool[]), got "
            f"{aval.str_short()}; to choose elementwise use select, and to "
            "choose per example of a batch apply vmap to a function using cond"
        )


def _check_branch_fn(fn: Any, name: str, operands: tuple) -> None:
    if not callable(fn):
        raise TypeError(f"cond: {name} must be a function, got {_short_repr(fn)}")
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):  # e.g. some builtins: let the call decide
        return
    try:
        signature.bind(*operands)
    except TypeError as err:
        raise TypeError(
            f"cond: {name} cannot be called with the {len(operands)} operand(s) "
            f"given to cond ({err})"
        ) from None


def _check_branch_outputs(
    true_tree: PyTreeDef, true_jaxpr: Jaxpr, false_tree: PyTreeDef, false_jaxpr: Jaxpr
) -> None:
    if true_tree != false_tree:
        raise TypeError(
            "cond: true_fn and false_fn must return the same structure, but "
            f"true_fn returns {true_tree} and false_fn returns {false_tree}"
        )
    for i, (x, y) in enumerate(zip(true_jaxpr.outs, false_jaxpr.outs)):
        if x.aval != y.aval:
            raise TypeError(
                f"cond: true_fn and false_fn must return the same types, but "
                f"output {i} is {x.aval.str_short()} from true_fn and "
                f"{y.aval.str_short()} from false_fn"
            )


# %% [markdown]
# Now `cond` itself. The branches are traced with `_trace_to_jaxpr` from Part 2,
# in a {ref}`dynamic trace <part2-dynamic>` of their own, so every operation in a branch is recorded even
# if it uses only constants.


# %% tags=["export"]
def cond(pred: Any, true_fn: Callable, false_fn: Callable, *operands: Any) -> Any:
    """``true_fn(*operands)`` if the boolean scalar ``pred`` is true, else
    ``false_fn(*operands)``; both branches are staged, one is run."""
    pred = _check_predicate(pred)
    _check_branch_fn(true_fn, "true_fn", operands)
    _check_branch_fn(false_fn, "false_fn", operands)
    ops_flat, in_tree = tree_flatten(operands)
    ops_flat = [_as_input(x, "cond operand") for x in ops_flat]
    abstract_ops = tree_unflatten(
        in_tree, [raise_to_shaped(get_aval(x)) for x in ops_flat]
    )
    true_jaxpr, true_consts, true_tree = _trace_to_jaxpr(
        true_fn, abstract_ops, dynamic=True, who="cond: true_fn"
    )
    false_jaxpr, false_consts, false_tree = _trace_to_jaxpr(
        false_fn, abstract_ops, dynamic=True, who="cond: false_fn"
    )
    _check_branch_outputs(true_tree, true_jaxpr, false_tree, false_jaxpr)
    true_jaxpr, false_jaxpr = join_consts(
        true_jaxpr, true_consts, false_jaxpr, false_consts
    )
    outs = bind(
        cond_p,
        pred,
        *true_consts,
        *false_consts,
        *ops_flat,
        true_jaxpr=true_jaxpr,
        false_jaxpr=false_jaxpr,
    )
    return tree_unflatten(true_tree, outs)


# %% [markdown]
# The two simplest rules. Evaluation runs the chosen branch's jaxpr with
# `eval_jaxpr`. Abstract evaluation checks what the wrapper guaranteed — useful
# for jaxprs built by hand or by other transformations, which the type checker
# sees only through this rule — and returns the branches' common output types.


# %% tags=["export"]
@cond_p.def_rule("impl")
def _cond_impl(pred, *args, true_jaxpr, false_jaxpr):
    _check_predicate_aval(get_aval(pred))
    return eval_jaxpr(true_jaxpr if pred else false_jaxpr, args)


@cond_p.def_rule("abstract_eval")
def _cond_abstract_eval(pred, *avals_in, true_jaxpr, false_jaxpr):
    _check_predicate_aval(pred)
    true_type = typecheck_jaxpr(true_jaxpr)
    false_type = typecheck_jaxpr(false_jaxpr)
    given = [raise_to_shaped(a) for a in avals_in]
    for name, branch_type in [("true", true_type), ("false", false_type)]:
        if branch_type.in_types != given:
            got = ", ".join(a.str_short() for a in given)
            raise TypeError(
                f"cond: the {name} branch takes {branch_type} but the operands "
                f"are ({got})"
            )
    if true_type.out_types != false_type.out_types:
        raise TypeError(
            f"cond: the branches return different types: {true_type} and {false_type}"
        )
    return true_type.out_types


# %% [markdown]
# With these two rules `cond` already evaluates, traces and prints. The printer
# from {ref}`Part 2 <part2-printing>` shows jaxpr-valued parameters indented under their equation, in
# alphabetical order, so the false branch comes first (JAX prints its branches
# in that order too, by index: 0 for false, 1 for true).


# %%
def kinked(x):
    return cond(x > 0.0, lambda x: sin(x) * x, lambda x: cos(x) * 3.0, x)


print(kinked(1.2), kinked(-0.5))
scalar = ShapedArray((), np.float64)
print(make_jaxpr(kinked, scalar)[0])

# %% [markdown]
# Closures show the joining of constants. Each branch below closes over a
# different array; both become inputs of the `cond` equation, and each branch
# jaxpr has a binder for the other's array that it never reads:

# %%
scale, shift = np.array([1.0, 2.0, 3.0]), np.array([0.5, 0.5, 0.5])


def scale_or_shift(p, v):
    return cond(p, lambda v: v * scale, lambda v: v + shift, v)


vector = ShapedArray((3,), np.float64)
print(make_jaxpr(scale_or_shift, ShapedArray((), np.bool_), vector)[0])


# %% [markdown]
# ## Lowering: `stablehlo.if`
#
# {term}`StableHLO` has a conditional of its own, `stablehlo.if`: an operation with a
# boolean scalar operand and two *regions*, small blocks of code that end in
# `stablehlo.return`. Regions may read values defined outside them, so the
# operands need no plumbing. As for a nested `xla_call`, each branch is
# {term}`lowered <lowering>`
# once to a private function and called, and XLA inlines the calls when it
# compiles.


# %% tags=["export"]
@cond_p.def_rule("lower")
def _cond_lower(ctx, avals_in, avals_out, pred, *operands, true_jaxpr, false_jaxpr):
    out_types = [ir_type(aval) for aval in avals_out]
    if_op = hlo.IfOp(out_types, pred)
    for region, jaxpr in [
        (if_op.true_branch, true_jaxpr),
        (if_op.false_branch, false_jaxpr),
    ]:
        callee = ir.FlatSymbolRefAttr.get(ctx.function_for(jaxpr))
        block = region.blocks.append()
        with ir.InsertionPoint(block):
            call = mlir_func.CallOp(out_types, callee, operands)
            hlo.ReturnOp(call.results)
    return list(if_op.results)


# %%
print(str(lower_jaxpr(make_jaxpr(kinked, scalar)[0])).rstrip())

# %% [markdown]
# And `jit` now compiles the function it could not trace before. Tracing happens
# once; each call runs the branch its predicate selects, on the device.

# %%
kinked_jit = jit(kinked)
print(kinked_jit(1.2), kinked_jit(-0.5), kinked(1.2), kinked(-0.5))


# %% [markdown]
# ## `jvp`: differentiate both branches
#
# The derivative of a conditional is the conditional of the derivatives: whichever
# branch runs, its JVP gives the tangent. So the `jvp` rule replaces each branch
# by its JVP jaxpr — the `jvp_jaxpr` of Part 3, which takes primals and tangents
# and returns both — and binds `cond` on the primal operands followed by their
# tangents. The predicate is a boolean, so it has no tangent to pass.
#
# The JVP jaxprs may have constants of their own (zero tangents, for instance),
# which we join as before. One more point: Part 3 cached `jvp_jaxpr` per jaxpr,
# which suits `jit`, whose jaxprs live as long as the jitted function. A `cond`'s
# branches are traced again whenever the enclosing Python function runs, so a
# cache would keep every version alive. We call the uncached function, which
# `functools.cache` keeps as `jvp_jaxpr.__wrapped__`.


# %% tags=["export"]
@cond_p.def_rule("jvp")
def _cond_jvp(primals, tangents, *, true_jaxpr, false_jaxpr):
    pred, *operands = primals
    operand_tangents = tangents[1:]  # the predicate's tangent is not needed
    true_jvp, true_consts = jvp_jaxpr.__wrapped__(true_jaxpr)
    false_jvp, false_consts = jvp_jaxpr.__wrapped__(false_jaxpr)
    true_jvp, false_jvp = join_consts(true_jvp, true_consts, false_jvp, false_consts)
    outs = bind(
        cond_p,
        pred,
        *true_consts,
        *false_consts,
        *operands,
        *operand_tangents,
        true_jaxpr=true_jvp,
        false_jaxpr=false_jvp,
    )
    n = len(outs) // 2
    return outs[:n], outs[n:]


# %%
for x in [1.2, -0.5]:
    _, slope = jvp(kinked, (x,), (1.0,))
    by_hand = np.cos(x) * x + np.sin(x) if x > 0 else -3.0 * np.sin(x)
    print(x, slope, by_hand)
print(make_jaxpr(lambda x, t: jvp(kinked, (x,), (t,)), scalar, scalar)[0])

# %% [markdown]
# (part5-vmap)=
# ## `vmap`: a shared predicate, or one per example
#
# Batching `cond` has two cases, depending on whether the predicate itself is
# batched.
#
# **The predicate is the same for the whole batch.** Then one branch runs for every
# example, and we batch both branches with Part 3's `vmap_jaxpr` (uncached, for
# the reason above): `cond` of the batched branches, with the batch axis of every
# output at 0.
#
# **The predicate differs per example.** Now no single branch is right for the
# batch. We run *both* branches on the whole batch and then choose, example by
# example, which result to keep. Choosing elementwise needs a primitive we have
# not had yet: `select(pred, on_true, on_false)`, the
# {term}`elementwise conditional <select>`
# (NumPy's `where`). It gets every rule, like any other primitive. It is linear in
# its two value operands, so it also has a transpose: the output cotangent flows to
# `on_true` where the predicate is true and to `on_false` where it is false.

# %% tags=["export"]
select_p = Primitive("select")


def _check_select(pred: ShapedArray, on_true: ShapedArray, on_false: ShapedArray):
    check_binary_operands("select", on_true, on_false)
    if pred.dtype != np.bool_ or pred.shape != on_true.shape:
        raise TypeError(
            f"select: the predicate must be a boolean array shaped like the "
            f"operands, bool{list(on_true.shape)}, got {pred.str_short()}"
        )


def select(pred: ArrayLike, on_true: ArrayLike, on_false: ArrayLike) -> ArrayLike:
    """Elementwise ``on_true if pred else on_false`` (NumPy's ``where``)."""
    args = [_as_input(x, "select") for x in (pred, on_true, on_false)]
    _check_select(*[get_aval(x) for x in args])
    return bind(select_p, *args)


_impl_from_numpy(select_p, np.where)


@select_p.def_rule("abstract_eval")
def _select_abstract_eval(pred, on_true, on_false):
    _check_select(pred, on_true, on_false)
    return [ShapedArray(on_true.shape, on_true.dtype)]


@select_p.def_rule("jvp")
def _select_jvp(primals, tangents):
    pred, on_true, on_false = primals
    _, true_dot, false_dot = tangents
    return [select(pred, on_true, on_false)], [select(pred, true_dot, false_dot)]


@select_p.def_rule("vmap")
def _select_vmap(axis_size, vals, dims):
    out_axis = next(d for d in dims if d is not None)
    vals = [move_batch_axis(axis_size, d, out_axis, x) for x, d in zip(vals, dims)]
    return [bind(select_p, *vals)], [out_axis]


@select_p.def_rule("lower")
def _select_lower(ctx, avals_in, avals_out, pred, on_true, on_false):
    return [hlo.select(pred, on_true, on_false)]


@select_p.def_rule("transpose")
def _select_transpose(cts, pred, on_true, on_false):
    (ct,) = cts
    if _is_undef(pred):
        raise TypeError("select: the predicate cannot be a linear input")
    zeros = zeros_like(ct)
    return [
        None,
        select(pred, ct, zeros) if _is_undef(on_true) else None,
        select(pred, zeros, ct) if _is_undef(on_false) else None,
    ]


# %% [markdown]
# With `select` in hand, the batching rule for `cond`:


# %% tags=["export"]
@cond_p.def_rule("vmap")
def _cond_vmap(axis_size, vals, dims, *, true_jaxpr, false_jaxpr):
    (pred, *operands), (pred_dim, *operand_dims) = vals, dims
    operands = [
        x if d is None else move_batch_axis(axis_size, d, 0, x)
        for x, d in zip(operands, operand_dims)
    ]
    batched = tuple(d is not None for d in operand_dims)
    if pred_dim is None:  # one branch for the whole batch
        true_b, true_consts = vmap_jaxpr.__wrapped__(true_jaxpr, axis_size, batched)
        false_b, false_consts = vmap_jaxpr.__wrapped__(false_jaxpr, axis_size, batched)
        true_b, false_b = join_consts(true_b, true_consts, false_b, false_consts)
        outs = bind(
            cond_p,
            pred,
            *true_consts,
            *false_consts,
            *operands,
            true_jaxpr=true_b,
            false_jaxpr=false_b,
        )
        return outs, [0] * len(outs)
    # A predicate per example: run both branches, then choose per example.
    pred = move_batch_axis(axis_size, pred_dim, 0, pred)
    true_outs = _run_batched(true_jaxpr, axis_size, operands, batched)
    false_outs = _run_batched(false_jaxpr, axis_size, operands, batched)
    outs = []
    for on_true, on_false in zip(true_outs, false_outs):
        shape = get_aval(on_true).shape
        pred_b = pred  # one predicate per example, for all of its elements
        if len(shape) > 1:
            pred_b = broadcast(pred, shape, tuple(range(1, len(shape))))
        outs.append(select(pred_b, on_true, on_false))
    return outs, [0] * len(outs)


def _run_batched(
    jaxpr: Jaxpr, axis_size: int, operands: list, batched: tuple[bool, ...]
) -> list:
    """Every output of ``jaxpr`` for every example, batched along axis 0."""
    if any(batched):
        in_axes = [0 if b else None for b in batched]
        return vmap_flat(jaxpr_as_fun(jaxpr), in_axes, operands)
    outs = eval_jaxpr(jaxpr, operands)  # same for every example: broadcast it
    return [move_batch_axis(axis_size, None, 0, x) for x in outs]


# %% [markdown]
# Both cases at work, on the function that defeated `vmap` at the start of the
# chapter (a batched predicate) and on a batch under one shared predicate:

# %%
xs = np.array([1.2, -0.5, 0.3])
print(vmap(kinked)(xs))
print(np.where(xs > 0, np.sin(xs) * xs, np.cos(xs) * 3.0))
print(make_jaxpr(vmap(kinked), vector)[0])
print(vmap(scale_or_shift, (None, 0))(True, np.ones((2, 3))))


def double_or_negate(p, v):  # two outputs of different ranks
    return cond(
        p,
        lambda v: (v * 2.0, reduce_sum(v)),
        lambda v: (neg(v), reduce_sum(v) * 3.0),
        v,
    )


print(*vmap(double_or_negate)(np.array([True, False]), np.ones((2, 3))), sep="\n")


# %% [markdown]
# Turning a `cond` into a `select` is only a faithful translation because running
# a branch whose result is thrown away does nothing else. Every primitive in this
# book is a pure function of its inputs, so that holds here. In a system where a
# branch could print, write to a buffer, or raise on bad data, computing both
# sides would change the program's meaning, and a batched predicate would need a
# different strategy (or would have to be refused). Even with pure branches there
# are two costs to keep in mind: the work of both branches is always done, and
# the discarded branch still computes on inputs it was meant to be protected
# from. If the `cond` exists to avoid, say, a logarithm of a negative number, the
# unselected side produces a NaN, which `select` drops from the value — but
# reverse mode multiplies that side's derivative by a zero cotangent, and `0 ×
# ∞` is a NaN that does reach the gradient.
#
# (part5-partial-eval)=
# ## Partial evaluation: both branches, split the same way
#
# `linearize` and `grad` partially evaluate a JVP ({ref}`Part 4 <part4>`). When
# they meet a `cond` whose predicate is known — the usual case, since the
# predicate is computed from primal values — the default rule would stage the
# whole `cond` as unknown, postponing all of its primal work into the linear map.
# As with `xla_call`, we split instead: partially evaluate *each branch* with
# [`partial_eval_jaxpr`](#part4-pe-jaxprs), run a `cond` of the known halves now, and stage a `cond` of
# the unknown halves, which takes the residuals.
#
# The two halves of a `cond` must again have one type each, and three things can
# disagree between the branches:
#
# - **Which outputs are unknown.** An output may be known in one branch (say, a
#   constant) and unknown in the other. We split once to learn each branch's
#   unknown outputs, take the union, and split again with those outputs forced
#   unknown (`partial_eval_jaxpr`'s `instantiate`).
# - **The residuals.** Each branch's known half hands different
#   {term}`residuals <residual>` to its
#   unknown half. We join them like constants: both known halves return the true
#   branch's residuals followed by the false branch's, each filling the other
#   branch's slots with zeros, and both unknown halves take the whole list and
#   ignore the other branch's part.
# - **The predicate** is needed by both `cond`s, so it becomes a residual too.
#
# The zeros are made inside the known jaxpr by new equations: a scalar literal
# zero, broadcast to the residual's shape.


# %% tags=["export"]
def _with_zero_outputs(jaxpr: Jaxpr, at: int, avals: list[ShapedArray]) -> Jaxpr:
    """``jaxpr`` with outputs of zeros of types ``avals`` inserted at ``at``."""
    eqns, zeros = list(jaxpr.eqns), []
    for aval in avals:
        zero = Lit(np.zeros((), aval.dtype))
        if aval.shape == ():
            zeros.append(zero)
            continue
        out = Var(aval)
        params = dict(shape=aval.shape, axes=tuple(range(aval.ndim)))
        eqns.append(JaxprEqn(broadcast_p, [zero], params, [out]))
        zeros.append(out)
    return Jaxpr(jaxpr.in_binders, eqns, jaxpr.outs[:at] + zeros + jaxpr.outs[at:])


class BranchSplit(NamedTuple):
    """Both branches of a cond, each split into known and unknown halves."""

    true_known: Jaxpr  # known inputs -> known outputs, residuals (true, false)
    false_known: Jaxpr
    true_unknown: Jaxpr  # residuals (true, false), unknown inputs -> unknown outputs
    false_unknown: Jaxpr
    out_unknowns: list[bool]
    num_residuals: int


def split_branches(
    true_jaxpr: Jaxpr, false_jaxpr: Jaxpr, in_unknowns: list[bool]
) -> BranchSplit:
    """Partially evaluate both branches the same way, with joined residuals."""
    first = [partial_eval_jaxpr(j, in_unknowns) for j in (true_jaxpr, false_jaxpr)]
    out_unknowns = [t or f for t, f in zip(first[0][2], first[1][2])]
    (true_k, true_u, _, n_true), (false_k, false_u, _, n_false) = [
        partial_eval_jaxpr(j, in_unknowns, out_unknowns)
        for j in (true_jaxpr, false_jaxpr)
    ]
    true_res = [v.aval for v in true_u.in_binders[:n_true]]
    false_res = [v.aval for v in false_u.in_binders[:n_false]]
    n_known_outs = out_unknowns.count(False)
    return BranchSplit(
        _with_zero_outputs(true_k, len(true_k.outs), false_res),
        _with_zero_outputs(false_k, n_known_outs, true_res),
        _with_unused_inputs(true_u, n_true, false_res),
        _with_unused_inputs(false_u, 0, true_res),
        out_unknowns,
        n_true + n_false,
    )


# %% [markdown]
# The two rules then follow the pattern of `xla_call`'s. At trace time, the known
# `cond` is bound right away, so its work happens now (compiled, if we are under
# `jit`). On a jaxpr, the equation is replaced by two `cond` equations joined by
# fresh residual variables. If the predicate itself is unknown, nothing can be
# decided early, and the whole `cond` goes to the unknown side.


# %% tags=["export"]
@cond_p.def_rule("partial_eval")
def _cond_partial_eval(trace, tracers, *, true_jaxpr, false_jaxpr):
    pred, *operands = tracers
    if not pred.pval.is_known:
        params = dict(true_jaxpr=true_jaxpr, false_jaxpr=false_jaxpr)
        return trace.stage(cond_p, tracers, params)
    in_unknowns = [not t.pval.is_known for t in operands]
    split = split_branches(true_jaxpr, false_jaxpr, in_unknowns)
    known_vals = [t.pval.const for t in operands if t.pval.is_known]
    known_outs_and_res = bind(
        cond_p,
        pred.pval.const,
        *known_vals,
        true_jaxpr=split.true_known,
        false_jaxpr=split.false_known,
    )
    n_known = len(known_outs_and_res) - split.num_residuals
    known_outs, residuals = known_outs_and_res[:n_known], known_outs_and_res[n_known:]
    staged_inputs = [
        trace.instantiate_const(pred),
        *[trace.instantiate_const(trace.pure(r)) for r in residuals],
        *[t for t in operands if not t.pval.is_known],
    ]
    unknown_outs = trace.stage(
        cond_p,
        staged_inputs,
        dict(true_jaxpr=split.true_unknown, false_jaxpr=split.false_unknown),
    )
    known_iter, unknown_iter = iter(known_outs), iter(unknown_outs)
    return [
        next(unknown_iter) if unknown else trace.pure(next(known_iter))
        for unknown in split.out_unknowns
    ]


@cond_p.def_rule("partial_eval_jaxpr")
def _cond_partial_eval_jaxpr(unks_in, eqn):
    pred_unknown, *in_unknowns = unks_in
    pred, *operands = eqn.inputs
    if pred_unknown:  # everything waits for the predicate
        known_vars = [
            x for x, u in zip(eqn.inputs, unks_in) if isinstance(x, Var) and not u
        ]
        return None, eqn, [True] * len(eqn.out_binders), known_vars
    split = split_branches(
        eqn.params["true_jaxpr"], eqn.params["false_jaxpr"], in_unknowns
    )
    known_outs = [v for v, u in zip(eqn.out_binders, split.out_unknowns) if not u]
    unknown_outs = [v for v, u in zip(eqn.out_binders, split.out_unknowns) if u]
    residuals = [Var(x.aval) for x in split.true_known.outs[len(known_outs) :]]
    known_ins = [x for x, u in zip(operands, in_unknowns) if not u]
    unknown_ins = [x for x, u in zip(operands, in_unknowns) if u]
    eqn_known = JaxprEqn(
        cond_p,
        [pred, *known_ins],
        dict(true_jaxpr=split.true_known, false_jaxpr=split.false_known),
        known_outs + residuals,
    )
    eqn_unknown = JaxprEqn(
        cond_p,
        [pred, *residuals, *unknown_ins],
        dict(true_jaxpr=split.true_unknown, false_jaxpr=split.false_unknown),
        unknown_outs,
    )
    pred_residual = [pred] if isinstance(pred, Var) else []
    return eqn_known, eqn_unknown, split.out_unknowns, pred_residual + residuals


# %% [markdown]
# Here is the split on the JVP of `kinked`, with the primal known and the tangent
# unknown. The known `cond` returns the primal output and five residuals: three
# for the true branch ($\cos x$, $x$ and $\sin x$) and two for the false branch
# ($\sin x$, and $\cos x$ times the zero tangent of the constant 3.0, since our
# JVP has no symbolic zeros). Each branch puts literal zeros in the other's slots.
# The unknown `cond` takes the predicate, the five residuals and the tangent, and
# each of its branches reads only its own residuals.

# %%
kinked_jvp = make_jaxpr(lambda x, t: jvp(kinked, (x,), (t,)), scalar, scalar)[0]
known, unknown_half, out_unks, num_res = partial_eval_jaxpr(kinked_jvp, [False, True])
names = _Names()
print("known half:")
print(pp_jaxpr(known, names=names))
print("unknown half:")
print(pp_jaxpr(unknown_half, names=names))


# %% [markdown]
# ## Transposition, and `grad`
#
# In a linear jaxpr from `linearize`, a `cond` takes the predicate and residuals,
# which are known, and tangents, which are the linear inputs. Whichever branch
# runs is linear in those tangents, so `cond` is linear in them, and its transpose
# is a `cond` of the transposed branches: {ref}`Part 4 <part4-transposition>`'s `transpose_jaxpr` (uncached
# again) turns each branch into a jaxpr from its known inputs and output
# cotangents to the cotangents of its linear inputs, the constants are joined,
# and the same predicate picks the branch. The predicate itself is never a linear
# input: it only chooses.


# %% tags=["export"]
@cond_p.def_rule("transpose")
def _cond_transpose(cts, pred, *args, true_jaxpr, false_jaxpr):
    if _is_undef(pred):
        raise TypeError("cond: the predicate cannot be a linear input")
    undefined = tuple(_is_undef(x) for x in args)
    true_t, true_consts = transpose_jaxpr.__wrapped__(true_jaxpr, undefined)
    false_t, false_consts = transpose_jaxpr.__wrapped__(false_jaxpr, undefined)
    true_t, false_t = join_consts(true_t, true_consts, false_t, false_consts)
    out_types = [x.aval for x in true_jaxpr.outs]
    cts = [zeros_like_aval(t) if ct is None else ct for ct, t in zip(cts, out_types)]
    defined = [x for x in args if not _is_undef(x)]
    cts_in = iter(
        bind(
            cond_p,
            pred,
            *true_consts,
            *false_consts,
            *defined,
            *cts,
            true_jaxpr=true_t,
            false_jaxpr=false_t,
        )
    )
    return [None] + [next(cts_in) if u else None for u in undefined]


# %% [markdown]
# That was the last rule. `grad` of `kinked`, eagerly, compiled, and batched over
# points on both sides of the kink:


# %%
def kinked_slope(x):
    return np.cos(x) * x + np.sin(x) if x > 0 else -3.0 * np.sin(x)


for x in [1.2, -0.5]:
    print(x, grad(kinked)(x), jit(grad(kinked))(x), kinked_slope(x))
print(vmap(grad(kinked))(xs), np.array([kinked_slope(x) for x in xs]))


# %% [markdown]
# ## Everything composes, again
#
# Conditionals nest, close over values of enclosing transformations, and mix with
# every transformation in every order. Here is a function whose outer `cond`
# contains another `cond` in one branch, and whose branches close over `w`, a
# value being differentiated. Its derivative with respect to `x`, by hand, is
# $2\cos(2x)\,w$ for $x > 1$, $-\sin(x)$ for $0 < x \le 1$ and $w$ otherwise.


# %%
def nested(x, w):
    def positive(x):
        return cond(x > 1.0, lambda x: sin(x * 2.0) * w, lambda x: cos(x), x)

    return cond(x > 0.0, positive, lambda x: x * w, x)


def nested_slope(x, w):
    if x > 1.0:
        return 2.0 * np.cos(2.0 * x) * w
    return -np.sin(x) if x > 0.0 else w


points, w = np.array([1.7, 0.4, -0.8]), 1.5
expected = np.array([nested_slope(x, w) for x in points])
d_nested = grad(nested)
results = {
    "vmap(grad)": vmap(d_nested, (0, None))(points, w),
    "vmap(jit(grad))": vmap(jit(d_nested), (0, None))(points, w),
    "jit(vmap(grad))": jit(vmap(d_nested, (0, None)))(points, w),
    "vmap(grad(jit))": vmap(grad(jit(nested)), (0, None))(points, w),
    "jvp per point": np.array(
        [jvp(lambda x: nested(x, w), (x,), (1.0,))[1] for x in points]
    ),
    "linearize per point": np.array(
        [linearize(lambda x: nested(x, w), x)[1](1.0) for x in points]
    ),
}
for name, value in results.items():
    print(f"{name:20} {np.asarray(value)}  {np.allclose(value, expected)}")


# %% [markdown]
# Second derivatives go through the same rules twice. For the true branch of
# `kinked`, $(x \sin x)'' = 2\cos x - x \sin x$; for the false branch,
# $(3\cos x)'' = -3\cos x$:


# %%
def kinked_curvature(x):
    return 2 * np.cos(x) - x * np.sin(x) if x > 0 else -3.0 * np.cos(x)


print(vmap(grad(grad(kinked)))(xs), np.array([kinked_curvature(x) for x in xs]))
print(jit(grad(jit(grad(kinked))))(-0.5), kinked_curvature(-0.5))

# %% [markdown]
# ## Mistakes `cond` catches
#
# Each of these is reported while tracing, before anything runs, in terms of the
# call the user wrote.

# %%
one = np.float64(1.0)
show_error(cond, 1, sin, cos, one)  # an integer predicate
show_error(cond, np.array([True, False]), sin, cos, one)  # not a scalar
show_error(cond, True, lambda x: x, lambda x: (x, x), one)  # structures differ
show_error(cond, True, lambda x: x, lambda x: broadcast(x, (3,), (0,)), one)
show_error(cond, True, lambda x, y: x * y, lambda x: x, one)  # arity
show_error(jit(lambda x: cond(x, sin, cos, x)), one)  # float predicate, under jit


# %% [markdown]
# ## Where real JAX differs
#
# - [`jax.lax.cond`](https://docs.jax.dev/en/latest/_autosummary/jax.lax.cond.html)
#   also accepts an integer predicate (nonzero is true), and is built on the more
#   general [`jax.lax.switch`](https://docs.jax.dev/en/latest/_autosummary/jax.lax.switch.html):
#   its `cond` primitive takes an integer index and a tuple of branches, and a
#   boolean predicate becomes index 0 (false) or 1 (true).
# - Under `vmap` with a batched predicate, JAX also runs every branch and selects
#   (with `select_n`), but it first wraps each branch's operands in
#   `stop_gradient` for the examples that do not take it, so derivatives never
#   flow through the discarded side and the `0 × ∞` problem above cannot reach
#   the gradient. See the
#   [FAQ entry on NaN gradients with `where`](https://docs.jax.dev/en/latest/faq.html#gradients-contain-nan-where-using-where).
# - JAX's partial evaluation of `cond` also fills the other branch's residual
#   slots with zeros, but lets the branches share slots of the same type, so a
#   `cond` stores about as many residuals as its hungrier branch rather than the
#   sum. It also forwards known inputs instead of returning them as residuals,
#   removes inputs and outputs that no branch uses, and caches traced branches.
# - Branching on Python values is still fine in JAX, as here: use `cond` only
#   when the predicate is a traced value.
#
# ## Summary
#
# - `cond` is a primitive whose parameters are two jaxprs with one type. Tracing
#   the branches turns their closed-over values into constants, and joining the
#   constants gives both branches the same inputs.
# - Evaluation runs one branch; lowering emits `stablehlo.if`; `jvp` and `vmap`
#   of a `cond` are `cond`s of the transformed branches.
# - A predicate that varies across a batch turns `cond` into both branches
#   followed by a `select`, which is faithful only because our primitives have no
#   side effects.
# - Partial evaluation splits both branches the same way and joins their
#   residuals; transposition transposes both branches. Together they give
#   `linearize`, `vjp` and `grad` through `cond`, in any composition with `jit`
#   and `vmap`.
#
# ## Exercises
#
# **1. `switch`.** Write `switch(index, branches, *operands)`, which runs
# `branches[index]` for an integer scalar `index` in `range(len(branches))`, out
# of nested `cond`s. Check it under `jit` and `grad`.


# %% tags=["hide-input"]
# offset: where branches[0] sits in the original list of branches.
def switch(index, branches, *operands, offset=0):
    if len(branches) == 1:
        return branches[0](*operands)
    middle = len(branches) // 2
    return cond(
        less(index, np.int64(offset + middle)),
        lambda *ops: switch(index, branches[:middle], *ops, offset=offset),
        lambda *ops: switch(index, branches[middle:], *ops, offset=offset + middle),
        *operands,
    )


fns = [sin, cos, lambda x: x * 2.0, neg]
for i in range(4):
    value = jit(lambda i, x: switch(i, fns, x))(np.int64(i), 0.3)
    slope = grad(lambda x, i=i: switch(np.int64(i), fns, x))(0.3)
    print(i, float(value), float(fns[i](0.3)), float(slope))


# %% [markdown]
# **2. Absolute value.** Define `abs_` with `cond` and check `vmap(grad(abs_))`
# against `np.sign` on points of both signs. Which `vmap` case does it use, and
# what does its jaxpr look like?


# %% tags=["hide-input"]
def abs_(x):
    return cond(x > 0.0, lambda x: x, neg, x)


pts = np.array([-2.0, -0.1, 0.5, 3.0])
print(vmap(grad(abs_))(pts), np.sign(pts))
# The predicate depends on the batched input, so both branches run and a
# select chooses per example:
print(make_jaxpr(vmap(grad(abs_)), ShapedArray((4,), np.float64))[0])


# %% [markdown]
# **3. Wasted residuals.** Linearize a `cond` whose true branch is a chain of five
# `sin`s and whose false branch is the identity. How many residuals does the
# linear map keep, and what are their values when the predicate is false?


# %% tags=["hide-input"]
def five_sins(x):
    for _ in range(5):
        x = sin(x)
    return x


def chain_or_not(x):
    return cond(x > 0.0, five_sins, lambda x: x, x)


for x in [0.7, -0.7]:
    _, lin_jaxpr, residuals = linearize_flat(
        lambda x: [chain_or_not(x)], [np.float64(x)]
    )
    # The predicate, then one cosine per sin; the false branch keeps none.
    # When the predicate is false, the true branch's slots hold zeros.
    pred, *cosines = residuals
    print(f"x={x}: {len(residuals)} residuals, predicate {bool(pred)},", end=" ")
    print(np.array(cosines))
