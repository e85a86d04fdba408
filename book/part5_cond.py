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
# So far a function's control flow has been Python's business, and for some of
# our transformations that is fine. Under `jvp`, a `JVPTracer` carries its primal
# value, so an `if` on it takes one path, and the derivative is the derivative of
# that path. Under `linearize` and `grad` an `if` works too, for a different
# reason: partial evaluation runs while the function runs, and the primal half of
# every value is known, so the comparison is ordinary Python on a number; only
# the linear half is staged ({ref}`Part 4 <part4-partial-eval>`). A Python `if`
# fails only where the value is not known while tracing. Under `jit` or
# `make_jaxpr` a value is only a type, so there is nothing to branch on
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

book_setup.load_book(globals(), before="part5_cond")


# %% [markdown]
# ## Where Python's `if` stops working
#
# Here is a function with a jump at zero: $x \sin x$ on one side,
# $3 \cos x$ on the other. Written with a Python `if`, it evaluates and differentiates, but it
# cannot be compiled, and it cannot be batched over inputs with different signs.


# %%
def jumpy(x):
    if x > 0.0:
        return sin(x) * x
    return cos(x) * 3.0


print(jumpy(1.2), grad(jumpy)(1.2), grad(jumpy)(-0.5))
show_error(jit(jumpy), 1.2)
show_error(vmap(jumpy), np.array([1.2, -0.5]))

# %% [markdown]
# ## `cond` as a primitive
#
# `cond(pred, true_fn, false_fn, *operands)` means "`true_fn(*operands)` if `pred`
# else `false_fn(*operands)`", with `pred` a scalar: a boolean, or a number that
# counts as true when it is nonzero, as in JAX (the wrapper compares it with zero).
# The wrapper does
# the work Python's `if` used to do at once, but symbolically: it traces each
# branch into a jaxpr at the operands' types and binds one `cond` primitive that
# holds both.
#
# Two details make the branches fit into a single equation. First, the equation's
# output types must not depend on the branch taken, so both branches must return
# the same pytree of the same shapes and dtypes. Second, a branch may use values
# it does not receive as operands — arrays it closes over, or tracers of an
# enclosing transformation. Tracing turns them into
# {term}`constants <constant>`: extra leading inputs of that branch's jaxpr. The
# two branches usually close over different things, yet `cond` has one list of
# inputs. So we **join the constants**: the equation's inputs are the true
# branch's constants, then the false branch's, then the operands, and each jaxpr
# gets unused input binders for the other branch's constants. Both jaxprs then
# have the same input type, and at run time the taken branch simply ignores the
# inputs meant for the other. `join_consts` returns the joined constants and the two
# branches as the keyword parameters of the equation.

# %% tags=["export"]
cond_p = Primitive("cond", multiple_results=True)


def _with_unused_inputs(jaxpr: Jaxpr, at: int, avals: list) -> Jaxpr:
    """``jaxpr`` with inputs of types ``avals``, which it ignores, at ``at``."""
    binders, new = jaxpr.in_binders, [Var(aval) for aval in avals]
    return Jaxpr(binders[:at] + new + binders[at:], jaxpr.eqns, jaxpr.outs)


def join_consts(
    true_jaxpr: Jaxpr, true_consts: list, false_jaxpr: Jaxpr, false_consts: list
) -> tuple[list, dict]:
    """Both branches' constants, and both branches taking all of them."""
    true_avals = [get_aval(c) for c in true_consts]
    false_avals = [get_aval(c) for c in false_consts]
    branches = dict(
        true_jaxpr=_with_unused_inputs(true_jaxpr, len(true_consts), false_avals),
        false_jaxpr=_with_unused_inputs(false_jaxpr, 0, true_avals),
    )
    return [*true_consts, *false_consts], branches


# %% [markdown]
# Now `cond` itself. The branches are traced with `_trace_to_jaxpr` from Part 2,
# with the {ref}`dynamic level <part2-dynamic>` set to their own recorder, so every operation in a
# branch is recorded even if it uses only constants.


# %% tags=["export"]
def cond(pred: Any, true_fn: Callable, false_fn: Callable, *operands: Any) -> Any:
    """``true_fn(*operands)`` if ``pred`` else ``false_fn(*operands)``, staged."""
    pred = check_predicate(pred)
    check_branch_fns(true_fn, false_fn, operands)
    ops_flat, in_tree = tree_flatten(operands)
    ops_flat = [_as_input(x, "cond operand") for x in ops_flat]
    avals = tree_unflatten(in_tree, [get_aval(x) for x in ops_flat])
    true_jaxpr, true_consts, out_tree = _trace_to_jaxpr(
        true_fn, avals, who="cond: true_fn"
    )
    false_jaxpr, false_consts, false_tree = _trace_to_jaxpr(
        false_fn, avals, who="cond: false_fn"
    )
    check_branches_match(out_tree, true_jaxpr, false_tree, false_jaxpr)
    consts, branches = join_consts(true_jaxpr, true_consts, false_jaxpr, false_consts)
    outs = bind(cond_p, pred, *consts, *ops_flat, **branches)
    return tree_unflatten(out_tree, outs)


# %% [markdown]
# The checks report every mistake in terms of the user's call: a predicate that
# is not a boolean scalar, a branch that is not callable or cannot take the
# operands, branches whose results differ in structure or type (saying which
# output differs). The folded cell holds them, with the checks the rules below
# make on `cond` equations that other code builds.

# %% tags=["export", "hide-input"]
# @title Checks: the predicate, the branch functions, the branches' types
import inspect


def check_predicate(pred: Any) -> Any:
    """``pred`` as a boolean scalar; a number is true where nonzero, as in JAX."""
    pred = _as_input(pred, "cond predicate")
    aval = get_aval(pred)
    if aval.shape == () and aval.dtype.kind in "iuf":
        return _nonzero(pred, aval)
    check_predicate_type(aval)
    return pred


def _nonzero(x: Any, aval: ShapedArray) -> Any:
    """``x != 0`` with the comparisons we have; NaN is nonzero, as in JAX."""
    zero, one = np.zeros((), aval.dtype), np.ones((), aval.dtype)
    # Below one, x is nonzero if positive or negative; NaN is not below one.
    below_one_nonzero = select(greater(x, zero), np.True_, less(x, zero))
    return select(less(x, one), below_one_nonzero, np.True_)


def check_predicate_type(aval: ShapedArray) -> None:
    if aval.dtype != np.bool_:
        raise TypeError(
            f"cond: the predicate must be a boolean scalar (bool[]), got "
            f"{aval.str_short()}; compare to get a boolean, e.g. greater(x, 0.0)"
        )
    if aval.shape != ():
        raise TypeError(
            f"cond: the predicate must be a boolean scalar (or a number), got "
            f"{aval.str_short()}; to choose elementwise use select, and to "
            "choose per example of a batch apply vmap to a function using cond"
        )


def check_branch_fns(true_fn: Any, false_fn: Any, operands: tuple) -> None:
    for fn, name in [(true_fn, "true_fn"), (false_fn, "false_fn")]:
        if not callable(fn):
            raise TypeError(f"cond: {name} must be a function, got {_short_repr(fn)}")
        try:
            signature = inspect.signature(fn)
        except (TypeError, ValueError):  # e.g. some builtins: let the call decide
            continue
        try:
            signature.bind(*operands)
        except TypeError as err:
            raise TypeError(
                f"cond: {name} cannot be called with the {len(operands)} "
                f"operand(s) given to cond ({err})"
            ) from None


def check_branches_match(
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


def check_branch_types(avals_in: Sequence, true_type: Any, false_type: Any) -> None:
    given = list(avals_in)
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


def check_predicate_not_linear(who: str, pred: Any) -> None:
    if _is_undef(pred):
        raise TypeError(f"{who}: the predicate cannot be a linear input")


# %% [markdown]
# The two simplest rules. Evaluation runs the chosen branch's jaxpr with
# `eval_jaxpr`. Abstract evaluation checks what the wrapper guaranteed — useful
# for jaxprs built by hand or by other transformations, which the type checker
# sees only through this rule — and returns the branches' common output types.


# %% tags=["export"]
@cond_p.def_rule("impl")
def _cond_impl(pred, *args, true_jaxpr, false_jaxpr):
    check_predicate_type(get_aval(pred))
    return eval_jaxpr(true_jaxpr if pred else false_jaxpr, args)


@cond_p.def_rule("abstract_eval")
def _cond_abstract_eval(pred, *avals_in, true_jaxpr, false_jaxpr):
    check_predicate_type(pred)
    true_type, false_type = typecheck_jaxpr(true_jaxpr), typecheck_jaxpr(false_jaxpr)
    check_branch_types(avals_in, true_type, false_type)
    return true_type.out_types


# %% [markdown]
# With these two rules `cond` already evaluates, traces and prints. The printer
# from {ref}`Part 2 <part2-printing>` shows jaxpr-valued parameters indented under their equation, in
# alphabetical order, so the false branch comes first (JAX prints its branches
# in that order too, by index: 0 for false, 1 for true).


# %%
def jumpy(x):
    return cond(x > 0.0, lambda x: sin(x) * x, lambda x: cos(x) * 3.0, x)


print(jumpy(1.2), jumpy(-0.5))
scalar = ShapedArray((), np.float64)
print(make_jaxpr(jumpy, scalar)[0])

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
        with ir.InsertionPoint(region.blocks.append()):
            call = mlir_func.CallOp(out_types, callee, operands)
            hlo.ReturnOp(call.results)
    return list(if_op.results)


# %%
print(str(lower_jaxpr(make_jaxpr(jumpy, scalar)[0])).rstrip())

# %% [markdown]
# And `jit` now compiles the function it could not trace before. Tracing happens
# once; each call runs the branch its predicate selects, on the device.

# %%
jumpy_jit = jit(jumpy)
print(jumpy_jit(1.2), jumpy_jit(-0.5), jumpy(1.2), jumpy(-0.5))


# %% [markdown]
# ## `jvp`: differentiate both branches
#
# The derivative of a conditional is the conditional of the derivatives: whichever
# branch runs, its JVP gives the tangent. So the `jvp` rule replaces each branch
# by its JVP jaxpr — the `jvp_jaxpr` of Part 3, which takes primals and tangents
# and returns both — and binds `cond` on the primal operands followed by their
# tangents. The predicate is a boolean, so it has no tangent to pass.
#
# Transforming each branch with a jaxpr-to-jaxpr transformation and joining the
# constants the transformed branches bring (zero tangents, for instance) is what
# the `vmap` and transpose rules will do too, so one helper does it for all three.
# (It takes the uncached transformations, `jvp_jaxpr_uncached` and the others,
# since branches are new jaxprs on every trace.)


# %% tags=["export"]
def transform_branches(transform: Callable, branches: dict, *args: Any) -> tuple:
    """Apply ``transform`` to both branches and join the constants it makes."""
    true_jaxpr, true_consts = transform(branches["true_jaxpr"], *args)
    false_jaxpr, false_consts = transform(branches["false_jaxpr"], *args)
    return join_consts(true_jaxpr, true_consts, false_jaxpr, false_consts)


@cond_p.def_rule("jvp")
def _cond_jvp(primals, tangents, **branches):
    pred, *operands = primals
    consts, jvp_branches = transform_branches(jvp_jaxpr_uncached, branches)
    outs = bind(cond_p, pred, *consts, *operands, *tangents[1:], **jvp_branches)
    n = len(outs) // 2
    return outs[:n], outs[n:]


# %%
def jumpy_slope(x):
    return np.cos(x) * x + np.sin(x) if x > 0 else -3.0 * np.sin(x)


for x in [1.2, -0.5]:
    print(x, jvp(jumpy, (x,), (1.0,))[1], jumpy_slope(x))
print(make_jaxpr(lambda x, t: jvp(jumpy, (x,), (t,)), scalar, scalar)[0])

# %% [markdown]
# (part5-vmap)=
# ## `vmap`: a shared predicate, or one per example
#
# Batching `cond` has two cases, depending on whether the predicate itself is
# batched.
#
# **The predicate is the same for the whole batch.** Then one branch runs for every
# example, and we batch both branches with Part 3's `vmap_jaxpr`: `cond` of the
# batched branches, with the batch axis of every output at 0.
#
# **The predicate differs per example.** Now no single branch is right for the
# batch. We run *both* branches on the whole batch and then choose, example by
# example, which result to keep. Choosing elementwise needs a primitive we have
# not had yet: `select(pred, on_true, on_false)`, the
# {term}`elementwise conditional <select>`
# (NumPy's `where`).

# %% tags=["export"]
select_p = Primitive("select")


def select(pred: ArrayLike, on_true: ArrayLike, on_false: ArrayLike) -> ArrayLike:
    """Elementwise ``on_true if pred else on_false`` (NumPy's ``where``)."""
    args = [_as_input(x, "select") for x in (pred, on_true, on_false)]
    check_select_operands(*[get_aval(x) for x in args])
    return bind(select_p, *args)


# %% [markdown]
# It gets every rule, like any other primitive; they are in the folded cell. Its
# JVP selects between the tangents with the same predicate, and it lowers to
# `stablehlo.select`. It is linear in its two value operands, so it also has a
# transpose: the output cotangent flows to `on_true` where the predicate is true
# and to `on_false` where it is false.


# %% tags=["export", "hide-input"]
# @title select: its check and its rules
def check_select_operands(
    pred: ShapedArray, on_true: ShapedArray, on_false: ShapedArray
):
    check_binary_operands("select", on_true, on_false)
    if pred.dtype != np.bool_ or pred.shape != on_true.shape:
        raise TypeError(
            f"select: the predicate must be a boolean array shaped like the "
            f"operands, bool{list(on_true.shape)}, got {pred.str_short()}"
        )


_impl_from_numpy(select_p, np.where)


@select_p.def_rule("abstract_eval")
def _select_abstract_eval(pred, on_true, on_false):
    check_select_operands(pred, on_true, on_false)
    return [ShapedArray(on_true.shape, on_true.dtype)]


@select_p.def_rule("jvp")
def _select_jvp(primals, tangents):
    pred, on_true, on_false = primals
    _, true_dot, false_dot = tangents
    return [select(pred, on_true, on_false)], [select(pred, true_dot, false_dot)]


@select_p.def_rule("vmap")
def _select_vmap(axis, vals, dims):
    out_axis = next(d for d in dims if d is not None)
    vals = [move_batch_axis(axis.size, d, out_axis, x) for x, d in zip(vals, dims)]
    return [bind(select_p, *vals)], [out_axis]


@select_p.def_rule("lower")
def _select_lower(ctx, avals_in, avals_out, pred, on_true, on_false):
    return [hlo.select(pred, on_true, on_false)]


@select_p.def_rule("transpose")
def _select_transpose(cts, pred, on_true, on_false):
    (ct,) = cts
    check_predicate_not_linear("select", pred)
    zeros = zeros_like(ct)
    return [
        None,
        select(pred, ct, zeros) if _is_undef(on_true) else None,
        select(pred, zeros, ct) if _is_undef(on_false) else None,
    ]


# %% [markdown]
# With `select` in hand, the batching rule for `cond`. In the second case,
# `_run_batched` computes a branch for every example, and `_select_per_example`
# broadcasts each example's predicate over that example's elements before it
# selects; both are in the folded cell after it, with `keep_gradient`, which the
# end of this section explains.


# %% tags=["export"]
@cond_p.def_rule("vmap")
def _cond_vmap(axis, vals, dims, **branches):
    (pred, *operands), (pred_dim, *operand_dims) = vals, dims
    batched = tuple(d is not None for d in operand_dims)
    operands = [
        x if d is None else move_batch_axis(axis.size, d, 0, x)
        for x, d in zip(operands, operand_dims)
    ]
    if pred_dim is None:  # one branch for the whole batch
        consts, vmapped = transform_branches(
            vmap_jaxpr_uncached, branches, axis, batched
        )
        outs = bind(cond_p, pred, *consts, *operands, **vmapped)
        return outs, [0] * len(outs)
    # A predicate per example: run both branches, then choose per example.
    pred = move_batch_axis(axis.size, pred_dim, 0, pred)
    operands = [move_batch_axis(axis.size, None, 0, x) if not b else x
                for x, b in zip(operands, batched)]  # fmt: skip
    true_outs = _run_batched(branches["true_jaxpr"], axis, pred, operands)
    false_outs = _run_batched(branches["false_jaxpr"], axis, _not(pred), operands)
    outs = [_select_per_example(pred, t, f) for t, f in zip(true_outs, false_outs)]
    return outs, [0] * len(outs)


# %% tags=["export", "hide-input"]
# @title Both branches for every example, then a select per example
def _run_batched(jaxpr: Jaxpr, axis: Axis, taken: Any, operands: list) -> list:
    """Every output of ``jaxpr`` for every example (all batched along axis 0),
    differentiable only through the examples that ``taken`` says take it."""
    # An example also runs the branch it did not take, on values meant for the
    # other one (say, residuals that partial evaluation filled with zeros), so
    # a division by zero there is expected; select throws that result away.
    # Silence NumPy's warnings about it, as compiled code never warns.
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        operands = [keep_gradient(_per_example(taken, x), x) for x in operands]
        return vmap_flat(jaxpr_as_fun(jaxpr), axis, [0] * len(operands), operands)


def _per_example(pred: Any, x: Any) -> Any:
    """``pred[i]`` for every element of example ``x[i]``: a bool array like ``x``."""
    shape = get_aval(x).shape
    if len(shape) > 1:
        return broadcast(pred, shape, tuple(range(1, len(shape))))
    return pred


def _select_per_example(pred: Any, on_true: Any, on_false: Any) -> Any:
    """Choose ``on_true[i]`` or ``on_false[i]`` by ``pred[i]``, for each example i."""
    return select(_per_example(pred, on_true), on_true, on_false)


def _not(pred: Any) -> Any:
    shape = get_aval(pred).shape
    return select(pred, np.zeros(shape, np.bool_), np.ones(shape, np.bool_))


keep_gradient_p = Primitive("keep_gradient")


def keep_gradient(pred: Any, x: Any) -> Any:
    """``x``, whose derivative is kept where ``pred`` is true and zero elsewhere."""
    return bind(keep_gradient_p, pred, x)


_impl_from_numpy(keep_gradient_p, lambda pred, x: np.asarray(x))
_lower_with(keep_gradient_p, lambda pred, x: x)


@keep_gradient_p.def_rule("abstract_eval")
def _keep_gradient_abstract_eval(pred, x):
    check_select_operands(pred, x, x)
    return [ShapedArray(x.shape, x.dtype)]


@keep_gradient_p.def_rule("jvp")
def _keep_gradient_jvp(primals, tangents):
    (pred, x), (_, x_dot) = primals, tangents
    return [keep_gradient(pred, x)], [select(pred, x_dot, zeros_like(x_dot))]


@keep_gradient_p.def_rule("vmap")
def _keep_gradient_vmap(axis, vals, dims):
    out_axis = next(d for d in dims if d is not None)
    vals = [move_batch_axis(axis.size, d, out_axis, x) for x, d in zip(vals, dims)]
    return [bind(keep_gradient_p, *vals)], [out_axis]


@keep_gradient_p.def_rule("transpose")
def _keep_gradient_transpose(cts, pred, x):  # as a linear map, the identity
    check_predicate_not_linear("keep_gradient", pred)
    return [None, cts[0]]


# %% [markdown]
# Both cases at work, on the function that defeated `vmap` at the start of the
# chapter (a batched predicate: both branches and a `select`) and on a batch under
# one shared predicate, whose jaxpr has a single `cond` with branches working on
# the whole batch:

# %%
xs = np.array([1.2, -0.5, 0.3])
print(vmap(jumpy)(xs), np.where(xs > 0, np.sin(xs) * xs, np.cos(xs) * 3.0))
print(make_jaxpr(vmap(jumpy), vector)[0])
print(vmap(scale_or_shift, (None, 0))(True, np.ones((2, 3))))
batch = ShapedArray((2, 3), np.float64)
print(make_jaxpr(lambda v: vmap(scale_or_shift, (None, 0))(True, v), batch)[0])


# %% [markdown]
# Turning a `cond` into a `select` is only a faithful translation because running
# a branch whose result is thrown away does nothing else. Every primitive in this
# book is a pure function of its inputs, so that holds here. In a system where a
# branch could print, write to a buffer, or raise on bad data, computing both
# sides would change the program's meaning, and a batched predicate would need a
# different strategy (or would have to be refused). Even with pure branches there
# are two costs to keep in mind: the work of both branches is always done, and
# the discarded branch still computes on inputs it was meant to be protected
# from. If the `cond` exists to keep, say, a logarithm (one of the
# {ref}`appendix's <appendix>` primitives) away from zero, the
# unselected side computes $\log 0 = -\infty$, which `select` drops from the
# value. When the batched function is differentiated (`grad` of a `vmap`),
# reverse mode multiplies that side's derivative, $1/0 = \infty$, by the zero
# cotangent `select` sends it, and `0 × ∞` is a NaN, which would flow on into the
# gradient of the operand. So `_run_batched` passes each operand through
# `keep_gradient(taken, x)`, a primitive whose value is `x` and whose tangent is
# `x`'s where the example takes this branch and zero elsewhere. Its JVP is a
# `select`, whose transpose drops the NaN, as JAX's rule does (see below and
# the end of the next section).
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
#   branch's slots with zeros (`_with_zero_outputs`), and both unknown halves
#   take the whole list and ignore the other branch's part.
# - **The predicate** is needed by both `cond`s, so it becomes a residual too.
#
# `split_branches` does the first two with Part 4's `partial_eval_jaxpr(jaxpr,
# in_unknowns, instantiate)`, which returns the known jaxpr, the unknown jaxpr,
# which outputs are unknown, and how many residuals pass from one to the other;
# a first call per branch only asks which outputs are unknown. It returns the
# parameters of both `cond`s, the unknown outputs, and the types of the
# residuals.


# %% tags=["export"]
def split_branches(branches: dict, in_unknowns: list[bool]) -> tuple:
    """Partially evaluate both branches the same way, with joined residuals."""
    jaxprs = branches["true_jaxpr"], branches["false_jaxpr"]
    first = [partial_eval_jaxpr(j, in_unknowns)[2] for j in jaxprs]
    out_unknowns = [t or f for t, f in zip(*first)]
    (true_k, true_u, _, n_true), (false_k, false_u, _, n_false) = [
        partial_eval_jaxpr(j, in_unknowns, out_unknowns) for j in jaxprs
    ]
    true_res = [v.aval for v in true_u.in_binders[:n_true]]
    false_res = [v.aval for v in false_u.in_binders[:n_false]]
    known = dict(
        true_jaxpr=_with_zero_outputs(true_k, len(true_k.outs), false_res),
        false_jaxpr=_with_zero_outputs(false_k, out_unknowns.count(False), true_res),
    )
    unknown = dict(
        true_jaxpr=_with_unused_inputs(true_u, n_true, false_res),
        false_jaxpr=_with_unused_inputs(false_u, 0, true_res),
    )
    return known, unknown, out_unknowns, true_res + false_res


# %% [markdown]
# The zeros are made inside the known jaxpr by new equations: a scalar literal
# zero, broadcast to the residual's shape. The folded cell holds that, and
# `_split_by`, which splits a list into the items flagged `False` and those
# flagged `True`.


# %% tags=["export", "hide-input"]
# @title Helpers: outputs of zeros for the other branch's slots; _split_by
def _split_by(flags: list[bool], xs: Sequence) -> tuple[list, list]:
    """The items of ``xs`` whose flag is false, and those whose flag is true."""
    return [x for x, f in zip(xs, flags) if not f], [x for x, f in zip(xs, flags) if f]


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


# %% [markdown]
# Here is the split on the JVP of `jumpy`, whose second equation is the `cond`,
# with the primal known and the tangent unknown. The known `cond` returns the
# primal output and five residuals: three for the true branch ($\cos x$, $x$ and
# $\sin x$) and two for the false branch ($\sin x$, and $\cos x$ times the zero
# tangent of the constant 3.0, since our JVP has no symbolic zeros). Each branch
# puts literal zeros in the other's slots. The unknown `cond` takes the predicate,
# the five residuals and the tangent, and each of its branches reads only its own
# residuals.

# %%
jumpy_jvp = make_jaxpr(lambda x, t: jvp(jumpy, (x,), (t,)), scalar, scalar)[0]
known, unknown, out_unks, res_avals = split_branches(
    jumpy_jvp.eqns[1].params, [False, True]
)
for half, branches in [("known", known), ("unknown", unknown)]:
    for name in ["true_jaxpr", "false_jaxpr"]:
        print(f"{half} {name}:", branches[name])


# %% [markdown]
# With the branches split, the trace-time rule, for a known predicate:
#
# 1. Bind a `cond` of the known halves on the predicate and the known operands.
#    It runs now (compiled, if we are under `jit`) and returns the known outputs
#    followed by the joined residuals.
# 2. Turn the predicate and each residual into an input of the staged program
#    (`instantiate_const`).
# 3. Stage a `cond` of the unknown halves on the predicate, the residuals and the
#    unknown operands.
# 4. Put the outputs back in their original order.
#
# If the predicate itself is unknown, nothing can be decided early, and the whole
# `cond` is staged.


# %% tags=["export"]
@cond_p.def_rule("partial_eval")
def _cond_partial_eval(trace, tracers, **branches):
    pred, *operands = tracers
    if not pred.pval.is_known:
        return trace.stage(cond_p, tracers, branches)
    in_unknowns = [not t.pval.is_known for t in operands]
    known, unknown, out_unknowns, res_avals = split_branches(branches, in_unknowns)
    known_ops, unknown_ops = _split_by(in_unknowns, operands)
    outs = bind(cond_p, pred.pval.const, *[t.pval.const for t in known_ops], **known)
    n = len(outs) - len(res_avals)
    known_outs, residuals = iter(outs[:n]), outs[n:]
    residuals = [trace.instantiate_const(trace.pure(r)) for r in residuals]
    staged_inputs = [trace.instantiate_const(pred), *residuals, *unknown_ops]
    unknown_outs = iter(trace.stage(cond_p, staged_inputs, unknown))
    return [
        next(unknown_outs) if u else trace.pure(next(known_outs)) for u in out_unknowns
    ]


# %% [markdown]
# The rule for partial evaluation of a jaxpr mirrors it: it replaces the equation
# by the same two `cond`s, as equations joined by fresh residual variables, and
# reports the predicate as a residual too.


# %% tags=["export", "hide-input"]
# @title The jaxpr rule: two cond equations joined by residual variables
@cond_p.def_rule("partial_eval_jaxpr")
def _cond_partial_eval_jaxpr(unks_in, eqn):
    (pred_unknown, *in_unknowns), (pred, *operands) = unks_in, eqn.inputs
    if pred_unknown:  # everything waits for the predicate
        known_vars = [
            x for x, u in zip(eqn.inputs, unks_in) if isinstance(x, Var) and not u
        ]
        return None, eqn, [True] * len(eqn.out_binders), known_vars
    known, unknown, out_unknowns, res_avals = split_branches(eqn.params, in_unknowns)
    residuals = [Var(aval) for aval in res_avals]
    outs_known, outs_unknown = _split_by(out_unknowns, eqn.out_binders)
    ins_known, ins_unknown = _split_by(in_unknowns, operands)
    eqn_known = JaxprEqn(cond_p, [pred, *ins_known], known, outs_known + residuals)
    eqn_unknown = JaxprEqn(
        cond_p, [pred, *residuals, *ins_unknown], unknown, outs_unknown
    )
    pred_residual = [pred] if isinstance(pred, Var) else []
    return eqn_known, eqn_unknown, out_unknowns, pred_residual + residuals


# %% [markdown]
# ## Transposition, and `grad`
#
# In a linear jaxpr from `linearize`, a `cond` takes the predicate and residuals,
# which are known, and tangents, which are the linear inputs. Whichever branch
# runs is linear in those tangents, so `cond` is linear in them, and its transpose
# is a `cond` of the transposed branches: {ref}`Part 4 <part4-transposition>`'s
# `transpose_jaxpr` turns each branch into a jaxpr from its known inputs and
# output cotangents to the cotangents of its linear inputs, the constants are
# joined, and the same predicate picks the branch. The predicate itself is never
# a linear input: it only chooses. A missing output cotangent (`None`) becomes
# zeros, since the transposed branches take every cotangent.


# %% tags=["export"]
@cond_p.def_rule("transpose")
def _cond_transpose(cts, pred, *args, **branches):
    check_predicate_not_linear("cond", pred)
    undefined = tuple(_is_undef(x) for x in args)
    consts, transposed = transform_branches(
        transpose_jaxpr_uncached, branches, undefined
    )
    out_types = [x.aval for x in branches["true_jaxpr"].outs]
    cts = [zeros_like_aval(t) if ct is None else ct for ct, t in zip(cts, out_types)]
    defined = [x for x in args if not _is_undef(x)]
    cts_in = iter(bind(cond_p, pred, *consts, *defined, *cts, **transposed))
    return [None] + [next(cts_in) if u else None for u in undefined]


# %% [markdown]
# That was the last rule. `grad` of `jumpy`, eagerly, compiled, and batched over
# points on both sides of the jump:

# %%
for x in [1.2, -0.5]:
    print(x, grad(jumpy)(x), jit(grad(jumpy))(x), jumpy_slope(x))
print(vmap(grad(jumpy))(xs), np.array([jumpy_slope(x) for x in xs]))


# %% [markdown]
# And `grad` of a batched `cond`, where `keep_gradient` does its job: the branch
# not taken for $10^{200}$ is the cube, whose derivative
# overflows to infinity; the gradient of the batched function is still the
# derivative of the branch each example takes:


# %%
def capped_cube(x):  # x cubed, but x itself beyond 1e100
    return cond(x > 1e100, lambda x: x, lambda x: x * x * x, x)


big = np.array([2.0, 1e200])
with np.errstate(over="ignore", invalid="ignore"):  # 0 × ∞, computed then dropped
    print(grad(lambda v: reduce_sum(vmap(capped_cube)(v), (0,)))(big))
print(vmap(grad(capped_cube))(big))


# %% [markdown]
# ## Everything composes, again
#
# Conditionals nest, close over values of enclosing transformations, and mix with
# every transformation in every order. Here is a function whose outer `cond`
# contains another `cond` in one branch, and whose branches close over `w`, an
# argument of the enclosing function. Its derivative with respect to `x`, by hand,
# is $2\cos(2x)\,w$ for $x > 1$, $-\sin(x)$ for $0 < x \le 1$ and $w$ otherwise.
# The last line differentiates with respect to `w` instead, through the closures:
# by hand, $\sin(2x)$, $0$ and $x$ on the three pieces.


# %%
def nested(x, w):
    def positive(x):
        return cond(x > 1.0, lambda x: sin(x * 2.0) * w, lambda x: cos(x), x)

    return cond(x > 0.0, positive, lambda x: x * w, x)


points, w = np.array([1.7, 0.4, -0.8]), 1.5
expected = [2.0 * np.cos(2.0 * 1.7) * w, -np.sin(0.4), w]  # by hand, as above
d_nested = grad(nested)
results = {
    "vmap(jit(grad))": vmap(jit(d_nested), (0, None))(points, w),
    "jit(vmap(grad))": jit(vmap(d_nested, (0, None)))(points, w),
    "vmap(grad(jit))": vmap(grad(jit(nested)), (0, None))(points, w),
    "linearize": [linearize(lambda x: nested(x, w), x)[1](1.0) for x in points],
}
for name, value in results.items():
    print(f"{name:16} {np.asarray(value)}  {np.allclose(value, expected)}")
d_w = vmap(lambda x: grad(lambda w: nested(x, w))(w))(points)
print(f"{'d/dw':16} {d_w}  {np.allclose(d_w, [np.sin(3.4), 0.0, -0.8])}")


# %% [markdown]
# Second derivatives go through the same rules twice. For the true branch of
# `jumpy`, $(x \sin x)'' = 2\cos x - x \sin x$; for the false branch,
# $(3\cos x)'' = -3\cos x$:


# %%
def jumpy_curvature(x):
    return 2 * np.cos(x) - x * np.sin(x) if x > 0 else -3.0 * np.cos(x)


print(vmap(grad(grad(jumpy)))(xs), np.array([jumpy_curvature(x) for x in xs]))
print(jit(grad(jit(grad(jumpy))))(-0.5), jumpy_curvature(-0.5))


# %% [markdown]
# ## More than two branches: `switch`
#
# `switch(index, branches, *operands)` runs `branches[index](*operands)` for an
# integer scalar `index`. Out of `cond`s it is a binary search: the first `cond`
# asks whether the index falls in the first half of the list, and each branch
# searches its half. An index below zero always goes left and one past the end
# always goes right, so it lands on the first or the last branch: JAX's
# clamping of out-of-range indices comes for free. Checks on the index and the
# branches are in the folded cell.


# %% tags=["export"]
def switch(index: Any, branches: Sequence[Callable], *operands: Any) -> Any:
    """``branches[index](*operands)``, ``index`` clamped to the list, staged."""
    index, branches = check_switch_args(index, branches)
    return _search_branches(index, branches, 0, operands)


def _search_branches(index, branches, offset: int, operands: tuple) -> Any:
    if len(branches) == 1:  # offset: where branches[0] is in the full list
        return branches[0](*operands)
    middle = len(branches) // 2
    return cond(
        less(index, np.asarray(offset + middle, get_aval(index).dtype)),
        lambda *ops: _search_branches(index, branches[:middle], offset, ops),
        lambda *ops: _search_branches(index, branches[middle:], offset + middle, ops),
        *operands,
    )


# %% tags=["export", "hide-input"]
# @title Checks: an integer scalar index, a nonempty list of functions
def check_switch_args(index: Any, branches: Any) -> tuple[Any, tuple]:
    index = _as_input(index, "switch index")
    aval = get_aval(index)
    if aval.shape != () or aval.dtype.kind not in "iu":
        raise TypeError(
            f"switch: the index must be an integer scalar, got {aval.str_short()}"
        )
    if not isinstance(branches, (list, tuple)) or not branches:
        raise ValueError(
            f"switch: branches must be a nonempty list of functions, got "
            f"{_short_repr(branches)}"
        )
    for i, fn in enumerate(branches):
        if not callable(fn):
            raise TypeError(f"switch: branches[{i}] must be a function, got "
                            f"{_short_repr(fn)}")  # fmt: skip
    return index, tuple(branches)


# %% [markdown]
# Four branches under `jit`, with indices in and out of range, and the gradient
# of the one that runs:

# %%
fns = [sin, cos, lambda x: x * 2.0, neg]
pick = jit(lambda i, x: switch(i, fns, x))
for i in [-1, 0, 1, 2, 3, 7]:
    slope = grad(lambda x, i=i: switch(i, fns, x))(0.3)
    print(i, pick(i, 0.3), fns[min(max(i, 0), 3)](0.3), slope)

# %% [markdown]
# ## Mistakes `cond` catches
#
# Each of these is reported while tracing, before anything runs, in terms of the
# call the user wrote.

# %%
one = np.float64(1.0)
show_error(cond, np.array([True, False]), sin, cos, one)  # not a scalar
show_error(cond, True, lambda x: x, lambda x: (x, x), one)  # structures differ
show_error(cond, True, lambda x: x, lambda x: broadcast(x, (3,), (0,)), one)
show_error(cond, True, lambda x, y: x * y, lambda x: x, one)  # arity
show_error(switch, 1.0, [sin, cos], one)  # a float index


# %% [markdown]
# ## Where real JAX differs
#
# - [`jax.lax.cond`](https://docs.jax.dev/en/latest/_autosummary/jax.lax.cond.html)
#   shares its primitive with
#   [`jax.lax.switch`](https://docs.jax.dev/en/latest/_autosummary/jax.lax.switch.html):
#   JAX's `cond` primitive takes an integer index and a tuple of branches, a
#   boolean predicate becomes index 0 (false) or 1 (true), and `switch` clamps
#   its index with a `clamp` and binds one `cond` with all its branches, where
#   ours stages a search of two-way `cond`s.
# - Under `vmap` with a batched predicate, JAX also runs every branch and selects
#   (with `select_n`), and it gives each branch, as its operand, a `select` of
#   the operand and its `stop_gradient` (the {ref}`appendix <appendix>` adds
#   ours), which is what our `keep_gradient` means. See the
#   [FAQ entry on NaN gradients with `where`](https://docs.jax.dev/en/latest/faq.html#gradients-contain-nan-where-using-where).
# - JAX's partial evaluation of `cond` also gives each branch the other's
#   residual slots, but fills them with uninitialized buffers (an `empty2`
#   equation in the printed jaxpr) rather than zeros, and lets the branches share
#   slots of the same type, so a `cond` stores about as many residuals as its
#   hungrier branch rather than the sum. Its dead-code elimination removes a
#   `cond`'s inputs and outputs that nothing uses; when it is traced, an output
#   that both branches return unchanged from an input is taken straight from
#   that input instead of from the `cond`; and traced branches are cached.
# - JAX's reverse mode does not run a JVP and then partially evaluate it: `cond`
#   has a linearize rule that does both in one step, splitting each branch into
#   its primal half (which also returns residuals) and its linear half directly.
# - Branching on Python values is still fine in JAX, as here: use `cond` only
#   when the predicate is a traced value.
#
# ## Summary
#
# - `cond` is a primitive whose parameters are two jaxprs with one type. Tracing
#   the branches turns their closed-over values into constants, and joining the
#   constants gives both branches the same inputs.
# - Evaluation runs one branch; lowering emits `stablehlo.if`; `jvp` of a `cond`,
#   and `vmap` of one whose predicate is shared by the batch, are `cond`s of the
#   transformed branches.
# - A predicate that varies across a batch turns `cond` into both branches
#   followed by a `select`, which is faithful only because our primitives have no
#   side effects; each branch is differentiated only for the examples that take
#   it.
# - Partial evaluation splits both branches the same way and joins their
#   residuals; transposition transposes both branches. Together they give
#   `linearize`, `vjp` and `grad` through `cond`, in any composition with `jit`
#   and `vmap`.
#
# ## Exercises
#
# **1. A chain instead of a search.** Write `chain_switch(index, branches,
# *operands)` from a chain of `cond`s, one per branch but the last: "is `index`
# below 1? if not, is it below 2? ...". Does it clamp like `switch`? Count the
# `cond` equations each version stages for eight branches, and how many
# predicates a call evaluates at most.


# %% tags=["hide-input"]
# @title Solution 1: a chain of conds
def chain_switch(index, branches, *operands, offset=0):
    if len(branches) == 1:
        return branches[0](*operands)
    return cond(
        less(index, np.int64(offset + 1)),
        branches[0],
        lambda *ops: chain_switch(index, branches[1:], *ops, offset=offset + 1),
        *operands,
    )


def count_conds(jaxpr):  # the cond equations of a jaxpr and of its branches
    conds = [e for e in jaxpr.eqns if e.primitive is cond_p]
    inner = [count_conds(e.params[b]) for e in conds for b in e.params]
    return len(conds) + sum(inner)


eight = [lambda x, k=k: x * float(k) for k in range(8)]
int_scalar = ShapedArray((), np.int64)
for f in [switch, chain_switch]:
    jaxpr = make_jaxpr(lambda i, x, f=f: f(i, eight, x), int_scalar, scalar)[0]
    values = [float(f(i, eight, 1.0)) for i in [-3, 5, 9]]
    print(f.__name__, count_conds(jaxpr), values)
# Both clamp, and both stage 7 conds; a call evaluates at most 3 predicates in
# switch (the depth of the search) and 7 in the chain.

# %% [markdown]
# **2. Absolute value.** Define `abs_` with `cond` and check `vmap(grad(abs_))`
# against `np.sign` on points of both signs. Which `vmap` case does it use, and
# what does its jaxpr look like?


# %% tags=["hide-input"]
# @title Solution 2: absolute value
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
# @title Solution 3: wasted residuals
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
