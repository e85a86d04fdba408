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
# (part8)=
# # Part 8: custom derivative rules with `custom_jvp` and `custom_vjp`
#
# :::{admonition} Where we are
# :class: note
# Every transformation of the book differentiates a function by differentiating
# its primitives one by one ({ref}`Part 1 <part1>`, {ref}`Part 4 <part4>`), and
# `cond` and `while_loop` ({ref}`Part 5 <part5>`, {ref}`Part 6 <part6>`) made
# control flow part of that. What a user cannot do yet is say: *for this
# function, use my derivative instead.*
# :::
#
# Differentiating primitive by primitive is always mechanical and usually right,
# but sometimes the derivative it builds is wasteful or numerically poor. A
# softplus written with a `select`, to stay finite for large inputs, has a
# gradient of NaN there, because reverse mode multiplies a zero cotangent by an
# infinite derivative (of `exp`) in the branch that was not taken. Gradient
# clipping wants a backward pass that is deliberately *not* the derivative.
# An implicit function, or an iterative solver, has a derivative that a formula
# gives far more cheaply than differentiating every iteration.
#
# JAX's answer is a pair of decorators. `custom_jvp` attaches a forward-mode
# rule to a function; `custom_vjp` attaches a forward pass that saves residuals
# and a backward pass that turns output cotangents into input cotangents. This
# chapter builds both, with JAX's API, and the interesting part is how they fit
# the interpreter stack: each interpreter does something different with a custom
# function. Evaluation ignores the rule; the JVP interpreter uses nothing *but*
# the rule; batching must batch the function and the rule together; staging must
# keep both in one equation; and reverse mode must end up calling `bwd`.
#
# The folded cell below loads the library code of the earlier chapters from the
# module `autodidax`, as in {ref}`Part 2 <part2-setup>`. In Colab it first
# installs the JAX release the book is tested with and fetches the module.

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

book_setup.load_book(globals(), before="part8_custom_rules")

# %% tags=["hide-input"]
# @title A scalar type; NumPy quiet about the overflows the examples cause

scalar = ShapedArray((), np.float64)
saved_errors = np.seterr(over="ignore", invalid="ignore")  # overflows are the point


# %% [markdown]
# ## A finite function with a NaN gradient
#
# Softplus, $\log(1 + e^x)$, overflows for large $x$: $e^{800}$ is infinite in
# float64. For large $x$ the function is $x$ to every digit, so a careful
# implementation picks that branch with a `select`:


# %%
def softplus_naive(x):
    return select(x > 30.0, x, log(1.0 + exp(x)))


print(softplus_naive(800.0), jvp(softplus_naive, (800.0,), (1.0,)))
print(grad(softplus_naive)(800.0))


# %% [markdown]
# The value and the forward-mode derivative are right, and the gradient is NaN.
# The `select` picks the first branch, so reverse mode sends a zero cotangent
# into the second. On its way back, the transpose of `log`'s derivative divides
# that zero by $1 + e^{800} = \infty$, which leaves zero; the transpose of
# `exp`'s derivative multiplies it by $e^{800} = \infty$, and $0 \cdot \infty$
# is NaN. Added to the first branch's cotangent, 1, the NaN stays. The fix
# inside the program is a second `select` that keeps the discarded branch's
# *input* harmless, easy to forget and hard to read. What we know, and the
# program does not, is that the derivative of softplus is the logistic function
# $1 / (1 + e^{-x})$, finite everywhere. We want to say so.
#
# ## `custom_jvp`: a function and its rule
#
# `custom_jvp(fun)` wraps a function; `defjvp(rule)` gives it a rule with the
# signature JAX uses: `rule(primals, tangents)` receives a tuple of the
# function's arguments and a tuple of their tangents, and returns the function's
# output and its tangent. Both may be pytrees.


# %%
def logistic(x):
    return 1.0 / (1.0 + exp(-x))


# %% [markdown]
# Before writing the class, decide what each interpreter should do with a call
# of a custom function:
#
# - **evaluation** (level 0) runs `fun` and ignores the rule;
# - **the JVP interpreter** runs the rule and never looks inside `fun`. The rule
#   is ordinary code running on values of the levels below, so an enclosing
#   JVP interpreter, lower on the stack, differentiates the rule itself: that
#   is how second derivatives work;
# - **batching** must batch `fun` and the rule alike, because a JVP interpreter
#   lower on the stack may still need the rule, now on batched values;
# - **staging** (`make_jaxpr`, `jit`) must record one equation that still
#   carries both, since a JVP may be applied to the jaxpr later.
#
# A primitive does all of that. `custom_jvp_call` is a
# {term}`higher-order primitive` whose parameters are `fun` traced to a jaxpr,
# `call_jaxpr`, and the rule. The rule stays a *Python function*, not a jaxpr.
# It could not be traced when the call is made: the rule usually calls the
# custom function itself (for the primal output), and tracing it would trace
# another call, whose rule would be traced, and so on forever. So the rule is
# kept as a function and runs only when a JVP interpreter uses it (if that
# happens while staging, running it records its operations). JAX does the
# same.

# %% tags=["export"]
custom_jvp_call_p = Primitive("custom_jvp_call", multiple_results=True)


class custom_jvp:
    """``fun`` with a forward-mode derivative rule of its own."""

    def __init__(self, fun: Callable, nondiff_argnums: Sequence[int] = ()) -> None:
        functools.update_wrapper(self, fun)
        self.fun, self.nondiff_argnums, self.rule = fun, tuple(nondiff_argnums), None

    def defjvp(self, rule: Callable) -> Callable:
        """Use ``rule(*nondiff_args, primals, tangents) -> (out, tangent_out)``."""
        self.rule = rule
        return rule

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        check_rule_defined(self, self.rule, "defjvp")
        args = resolve_kwargs(self, args, kwargs)
        if _outside_transformations(args):
            return run_outside_transformations(self, args)
        try:
            call = trace_custom(self, args)
        except ConcretizationError:  # fun needs values: maybe jvp can give them
            return jvp_of_concrete_call(self, args)

        def flat_rule(primals: list, tangents: list) -> tuple[list, list]:
            primals, tangents = call.unflatten(primals), call.unflatten(tangents)
            result = self.rule(*call.nondiff, primals, tangents)
            return check_jvp_rule_result(call, result)

        outs = bind(
            custom_jvp_call_p, *call.consts, *call.args, **call.params,
            jvp=Named(flat_rule, self.rule, call.traced_consts),
        )  # fmt: skip
        return tree_unflatten(call.out_tree, outs)


# %% [markdown]
# Called outside every transformation, a custom function simply runs `fun`, as
# in JAX, so Python control flow on its arguments works there. Keyword arguments
# are matched to `fun`'s parameters and passed by position (defaults filled in),
# as JAX does, so the rule sees every argument in `primals`. Otherwise,
# `trace_custom` does what `cond` does for a branch: it flattens the
# differentiable arguments, traces `fun` at their types
# with the {ref}`dynamic level <part2-dynamic>` set to its recorder, and returns the jaxpr's inputs and
# parameters. Arguments listed in `nondiff_argnums` are held fixed: `fun` is
# traced with them in place, and the rule receives them first, as in JAX.
# `Named` wraps a Python function so that it prints by its user's name in a
# jaxpr. Both are in the folded cell, with the checks.


# %% tags=["export", "hide-input"]
# @title trace_custom, Named, and the checks of calls and rules
class TracedCall(NamedTuple):
    """A custom function's call, traced at its arguments' types."""

    name: str
    nondiff: list  # the values of the nondiff_argnums arguments
    all_args: Callable  # differentiable args -> all args, nondiff ones in place
    args: list  # the flat differentiable arguments
    in_tree: PyTreeDef  # their structure: a tuple, one entry per argument
    consts: list
    out_tree: PyTreeDef
    params: dict  # name, call_jaxpr, num_consts

    def unflatten(self, flat: Sequence) -> tuple:
        return tree_unflatten(self.in_tree, flat)

    @property
    def in_types(self) -> list[ShapedArray]:
        return [get_aval(x) for x in self.args]

    @property
    def out_types(self) -> list[ShapedArray]:
        return [x.aval for x in self.params["call_jaxpr"].outs]

    @property
    def traced_consts(self) -> tuple[bool, ...]:
        return tuple(isinstance(c, Tracer) for c in self.consts)


def trace_custom(f: Any, args: tuple) -> TracedCall:
    """Trace ``f.fun`` at the types of ``args``, the nondiff ones held fixed."""
    name = getattr(f, "__name__", "custom function")
    fixed = check_nondiff_argnums(name, f.nondiff_argnums, args)

    def all_args(diff_args: Sequence) -> list:
        rest = iter(diff_args)
        return [args[i] if i in fixed else next(rest) for i in range(len(args))]

    diff = tuple(a for i, a in enumerate(args) if i not in fixed)
    flat, in_tree = tree_flatten(diff)
    flat = [_as_input(x, f"{name}: argument") for x in flat]
    avals = tree_unflatten(in_tree, [get_aval(x) for x in flat])
    jaxpr, consts, out_tree = _trace_to_jaxpr(
        lambda *d: f.fun(*all_args(d)), avals, who=name
    )
    nondiff = [args[i] for i in sorted(fixed)]
    check_no_traced_closure(name, tree_leaves(nondiff))
    params = dict(name=name, call_jaxpr=jaxpr, num_consts=len(consts))
    return TracedCall(name, nondiff, all_args, flat, in_tree, consts, out_tree, params)


def resolve_kwargs(f: Any, args: tuple, kwargs: dict) -> tuple:
    """``args`` and ``kwargs`` as positional arguments of ``f.fun``, as JAX does."""
    try:
        signature = inspect.signature(f.fun)
    except (TypeError, ValueError):  # no signature: only positional arguments
        signature = None
    if signature is None or isinstance(f.fun, functools.partial):
        if kwargs:
            raise TypeError(f"{_fn_name(f)}: takes no keyword arguments here")
        return args
    try:
        bound = signature.bind(*args, **kwargs)
    except TypeError as err:
        raise TypeError(f"{_fn_name(f)}: cannot take these arguments ({err})") from None
    bound.apply_defaults()
    if bound.kwargs:
        raise TypeError(
            f"{_fn_name(f)}: keyword-only arguments {sorted(bound.kwargs)} cannot "
            "be passed to a custom function: they have no position"
        )
    return bound.args


def _outside_transformations(args: tuple) -> bool:
    """No tracer in ``args`` and nothing being staged: plain evaluation."""
    no_tracers = not any(isinstance(x, Tracer) for x in tree_leaves(args))
    forced = getattr(_state, "trace_custom_calls", False)
    return no_tracers and _state.dynamic is _state.stack[0] and not forced


def run_outside_transformations(f: Any, args: tuple) -> Any:
    """``f.fun(*args)``; if its result is traced (``fun`` closes over a tracer
    of an enclosing transformation), the call is traced after all, as JAX
    does (so ``fun`` runs twice then)."""
    check_nondiff_argnums(_fn_name(f), f.nondiff_argnums, args)
    out = f.fun(*args)
    if not any(isinstance(x, Tracer) for x in tree_leaves(out)):
        return out
    _state.trace_custom_calls = True
    try:
        return f(*args)
    finally:
        _state.trace_custom_calls = False


class Named:
    """A Python function that prints as ``name`` (a rule in a jaxpr's params);
    ``traced_consts`` says which of the call's constants were tracers."""

    def __init__(self, fn: Callable, like: Any, traced_consts: tuple = ()) -> None:
        self.fn, self.name = fn, like if isinstance(like, str) else _fn_name(like)
        self.traced_consts = traced_consts

    def __call__(self, *args: Any) -> Any:
        return self.fn(*args)

    def __repr__(self) -> str:
        return self.name


def _fn_name(fn: Any) -> str:
    return getattr(fn, "__name__", type(fn).__name__)


def check_rule_defined(f: Any, rule: Any, how: str) -> None:
    if rule is None:
        raise TypeError(
            f"{_fn_name(f)} is a custom function without a rule: define one "
            f"with {_fn_name(f)}.{how}(...) before calling it"
        )


def check_nondiff_argnums(name: str, argnums: tuple, args: tuple) -> set[int]:
    for i in argnums:
        if not _is_axis(i) or not -len(args) <= i < len(args):
            raise ValueError(
                f"{name}: nondiff_argnums {argnums} is out of range for a call "
                f"with {len(args)} positional arguments"
            )
    return {int(i) % len(args) for i in argnums}


def check_no_traced_closure(name: str, nondiff: list) -> None:
    traced = [c for c in nondiff if isinstance(c, Tracer)]
    if traced:
        raise TypeError(
            f"{name}: a nondiff_argnums argument is a traced value "
            f"({traced[0].aval.str_short()}); its rule would treat it as a "
            "constant. Pass it as an ordinary (differentiable) argument instead."
        )


def jvp_of_concrete_call(f: Any, args: tuple) -> Any:
    """``f(*args)`` when ``f.fun`` branches on its values, so it cannot be
    traced: under jvp or grad of concrete (or known) values JAX never traces
    ``fun``; it calls the rule, which calls ``f`` on the primals. We do the
    same; anywhere else the ConcretizationError stands."""
    leaves, tree = tree_flatten(args)
    trace = find_top_trace(leaves)
    if isinstance(trace, PartialEvalTrace):
        known = [trace.full_raise(x).pval for x in leaves]
        if all(pval.is_known for pval in known):
            return f(*tree_unflatten(tree, [pval.const for pval in known]))
    fixed = check_nondiff_argnums(_fn_name(f), f.nondiff_argnums, args)
    nondiff = [args[i] for i in sorted(fixed)]
    if not isinstance(trace, JVPTrace) or any(
        isinstance(x, Tracer) for x in tree_leaves(nondiff)
    ):
        return trace_custom(f, args)  # raises the ConcretizationError again
    diff = tree_map(trace.full_raise, [a for i, a in enumerate(args) if i not in fixed])
    primals = tuple(tree_map(lambda t: t.primal, diff))
    tangents = tuple(tree_map(lambda t: t.tangent, diff))
    result = f.rule(*nondiff, primals, tangents)
    out, out_dot = _pair(f"{_fn_name(f)}: the custom_jvp rule", result, "out, tangent")
    return tree_map(lambda p, t: JVPTracer(trace, p, t), out, out_dot)


class ClosureDifferentiatedError(TypeError):
    """A custom function closes over a value that is being differentiated."""


def check_closure_not_differentiated(name: str, rule: Named, tangents: list) -> None:
    """The rule does not see ``fun``'s closed-over values, so their tangents
    must be zero (JAX refuses this case too). Values that were not traced
    when ``f`` was called are constants: their tangents are zero even when
    a jit made them inputs of its jaxpr."""
    traced = getattr(rule, "traced_consts", (True,) * len(tangents))
    for t, was_traced in zip(tangents, traced):
        if was_traced and (isinstance(t, Tracer) or np.any(np.asarray(t) != 0)):
            raise ClosureDifferentiatedError(
                f"{name}: the custom function closes over a value "
                f"({get_aval(t).str_short()}) that is being differentiated, "
                "but its rule only says how the output depends on its "
                "arguments. Pass that value to the custom function as an "
                "argument and let the rule handle it (JAX's "
                "jax.closure_convert does this conversion)."
            )


class Types(tuple):
    """A tuple of types that prints briefly, e.g. ``(float64[], float64[3])``."""

    def __repr__(self) -> str:
        return "(" + ", ".join(a.str_short() for a in self) + ")"


def _types(tree: PyTreeDef, avals: Sequence[ShapedArray]) -> str:
    return str(tree_unflatten(tree, [a.str_short() for a in avals])).replace("'", "")


def check_result(who: str, value: Any, tree: PyTreeDef, avals: list) -> list:
    """The leaves of ``value``, which must have structure ``tree``, types ``avals``."""
    leaves, got_tree = tree_flatten(value)
    leaves = [_as_input(x, who) for x in leaves]
    got = [get_aval(x) for x in leaves]
    if got_tree != tree or got != list(avals):
        raise TypeError(
            f"{who} must be {_types(tree, avals)}, but it is {_types(got_tree, got)}"
        )
    return leaves


def _pair(who: str, result: Any, what: str) -> tuple:
    if not isinstance(result, (tuple, list)) or len(result) != 2:
        raise TypeError(f"{who} must return a pair ({what}), got {_short_repr(result)}")
    return tuple(result)


def check_jvp_rule_result(call: TracedCall, result: Any) -> tuple[list, list]:
    who = f"{call.name}: the custom_jvp rule"
    out, out_dot = _pair(who, result, "primal_out, tangent_out")
    outs = check_result(f"{who}'s primal output", out, call.out_tree, call.out_types)
    out_dots = check_result(
        f"{who}'s tangent output", out_dot, call.out_tree, call.out_types
    )
    return outs, out_dots


# %% [markdown]
# The JVP interpreter's rule for `custom_jvp_call` is the whole point: call the
# user's rule on the operands' primals and tangents. The equation's first inputs
# are the constants of `fun`'s jaxpr, the values it closes over, and the rule is
# not given them. They may be tracers of an enclosing `jit` or `vmap`, which is
# fine, but not values being differentiated: the rule cannot say how the output
# depends on them, so a non-zero tangent there is an error (as in JAX).


# %% tags=["export"]
@custom_jvp_call_p.def_rule("jvp")
def _custom_jvp_call_jvp(primals, tangents, *, name, call_jaxpr, num_consts, jvp):
    check_closure_not_differentiated(name, jvp, tangents[:num_consts])
    return jvp(primals[num_consts:], tangents[num_consts:])


# %% [markdown]
# Evaluation, abstract evaluation and lowering treat the call as a call of its
# jaxpr: `eval_jaxpr` runs it, its output types are the jaxpr's, and it lowers
# to a call of a private function, like a nested `jit`. The rule plays no part.
# The same three rules will serve `custom_vjp` in the next section, so we make
# its primitive, `custom_vjp_call`, now and register them for both (abstract
# evaluation, with its check, is in the folded cell).

# %% tags=["export"]
custom_vjp_call_p = Primitive("custom_vjp_call", multiple_results=True)


def _custom_call_impl(*args, call_jaxpr, **params):
    return eval_jaxpr(call_jaxpr, args)


def _custom_call_lower(ctx, avals_in, avals_out, *args, call_jaxpr, **params):
    return _call_jaxpr(ctx, call_jaxpr, list(args))


for _prim in [custom_jvp_call_p, custom_vjp_call_p]:
    _prim.def_rule("impl")(_custom_call_impl)
    _prim.def_rule("lower")(_custom_call_lower)


# %% tags=["export", "hide-input"]
# @title Abstract evaluation: the call's types are its jaxpr's
def check_custom_call_types(name: str, call_jaxpr: Jaxpr, avals: Sequence) -> None:
    expected = jaxpr_type(call_jaxpr)
    if list(avals) != expected.in_types:
        got = ", ".join(a.str_short() for a in avals)
        raise TypeError(f"{name}: the call's jaxpr takes {expected}, got ({got})")


def _custom_call_abstract_eval(*avals, name, call_jaxpr, **params):
    check_custom_call_types(name, call_jaxpr, avals)
    return jaxpr_type(call_jaxpr).out_types


for _prim in [custom_jvp_call_p, custom_vjp_call_p]:
    _prim.def_rule("abstract_eval")(_custom_call_abstract_eval)


# %% [markdown]
# Here is softplus again, with its rule. The rule's primal output calls
# `softplus` itself, which is the usual style.


# %%
@custom_jvp
def softplus(x):
    return select(x > 30.0, x, log(1.0 + exp(x)))


@softplus.defjvp
def softplus_jvp(primals, tangents):
    (x,), (x_dot,) = primals, tangents
    return softplus(x), x_dot * logistic(x)


print(softplus(800.0), grad(softplus)(800.0), grad(softplus)(-800.0))
print(grad(softplus)(0.3), logistic(0.3))

# %% [markdown]
# The staged program keeps the call as one equation, with `fun`'s jaxpr
# indented under it and the rule printed by name:

# %%
print(make_jaxpr(softplus, scalar)[0])

# %% [markdown]
# Differentiating that program replaces the call by the rule. In the jaxpr of
# `jvp`, the primal half is again a `custom_jvp_call` (the rule called
# `softplus`), and the tangent half is the rule's `1 / (1 + exp(-x))`, with no
# trace of `select` or `log`:

# %%
print(make_jaxpr(lambda x, t: jvp(softplus, (x,), (t,)), scalar, scalar)[0])


# %% [markdown]
# ## Making it visible that the rule is used
#
# The rule need not be the derivative, and nothing checks that it is. A rule
# that claims the derivative of `sin` is 1 everywhere is obeyed by every mode of
# differentiation, compiled or not:


# %%
@custom_jvp
def sin_claiming_slope_one(x):
    return sin(x)


@sin_claiming_slope_one.defjvp
def slope_one(primals, tangents):
    return sin(primals[0]), tangents[0]


f = sin_claiming_slope_one
print(f(2.0), np.sin(2.0))
print(jvp(f, (2.0,), (1.0,))[1], grad(f)(2.0), jit(grad(f))(2.0), grad(jit(f))(2.0))

# %% [markdown]
# ## Higher derivatives: the rule is differentiated
#
# The JVP interpreter calls the rule on the primals and tangents it holds,
# which are values of the levels below it. The rule is ordinary code that binds
# primitives on those values, so the interpreters of enclosing transformations,
# lower on the stack, process its primitives like any others. In
# `grad(grad(softplus))`, the inner `grad`, higher on the stack, replaces the
# call by `x_dot * logistic(x)`, and the outer one differentiates that (and the
# rule's own call of `softplus`, with the rule again). The logistic function's
# derivative is $\sigma(x)(1 - \sigma(x))$:

# %%
for x in [0.3, 800.0]:
    s = logistic(x)
    print(grad(grad(softplus))(x), s * (1.0 - s))


# %% [markdown]
# ## `vmap`: batch the function and the rule
#
# When a batching interpreter processes a custom call, it cannot know whether
# a JVP interpreter lower on the stack will process the batched call next and
# want its rule. So its rule batches both: `fun`'s jaxpr with Part 3's
# `vmap_jaxpr`, and the rule with `batch_rule`, which wraps the rule in `vmap`,
# each tangent batched like its primal (the folded cell holds it). The result is
# again a `custom_jvp_call`, whose rule is the batched rule, printed
# `vmap(softplus_jvp)` in the jaxpr below.


# %% tags=["export"]
@custom_jvp_call_p.def_rule("vmap")
def _custom_jvp_call_vmap(axis, vals, dims, *, call_jaxpr, num_consts, jvp, name):
    batched = tuple(d is not None for d in dims)
    vals = [
        x if d is None else move_batch_axis(axis.size, d, 0, x)
        for x, d in zip(vals, dims)
    ]
    new_jaxpr, new_consts = vmap_jaxpr(call_jaxpr, axis, batched)
    outs = bind(
        custom_jvp_call_p, *new_consts, *vals, name=name, call_jaxpr=new_jaxpr,
        num_consts=len(new_consts) + num_consts,
        jvp=batch_rule(jvp, axis, batched[num_consts:], len(new_consts)),
    )  # fmt: skip
    return outs, [0] * len(outs)


# %% tags=["export", "hide-input"]
# @title batch_rule: the rule under vmap, each tangent batched like its primal
def batch_rule(rule: Named, axis: Axis, batched: tuple, n_new: int) -> Named:
    """``rule(primals, tangents)`` on a batch (axis 0) of the batched operands."""

    def batched_rule(primals: list, tangents: list) -> tuple[list, list]:
        n_out = []

        def flat(*args):
            outs, out_dots = rule(args[: len(primals)], args[len(primals) :])
            n_out.append(len(outs))
            return [*outs, *out_dots]

        in_axes = [0 if b else None for b in batched] * 2
        both = vmap_in_rule(flat, axis, in_axes, [*primals, *tangents])
        return both[: n_out[0]], both[n_out[0] :]

    traced = (False,) * n_new + rule.traced_consts  # the new constants: arrays
    return Named(batched_rule, f"vmap({rule})", traced)


def vmap_in_rule(f: Callable, axis: Axis, in_axes: list, args: list) -> list:
    """``vmap_flat``, but on the vmap of ``axis`` itself while it still runs,
    so that a rule closing over that vmap's tracers sees them batched along
    the same axis (a fresh vmap would treat them as another axis); outputs
    at axis 0."""
    stack = _state.stack
    level = next((lv for lv in stack[::-1] if lv.payload is axis), None)
    if level is None or level.trace_type is not BatchTrace:
        return vmap_flat(f, axis, in_axes, args)
    trace = BatchTrace(level)
    outs = f(
        *[x if a is None else BatchTracer(trace, x, a) for x, a in zip(args, in_axes)]
    )
    outs = [trace.full_raise(x) for x in _check_outputs("vmap", outs)]
    return [move_batch_axis(axis.size, t.batch_axis, 0, t.val) for t in outs]


# %%
xs = np.array([-800.0, 0.3, 800.0])
print(
    vmap(softplus)(xs),
    vmap(grad(softplus))(xs),
    grad(lambda v: reduce_sum(vmap(softplus)(v), 0))(xs),
)
print(make_jaxpr(vmap(softplus), ShapedArray((3,), np.float64))[0])


# %% [markdown]
# ## `custom_vjp`: a forward pass and a backward pass
#
# Sometimes the rule we want is a reverse-mode rule. Gradient clipping is the
# standard example: the function is the identity, and its backward pass should
# pass on the cotangent clipped to a range. No JVP rule says that, because the
# clipping happens to cotangents, which forward mode never sees.
#
# `custom_vjp(fun)` with `defvjp(fwd, bwd)` takes two functions, as in JAX.
# `fwd(*args)` returns the output and *residuals*: anything the backward pass
# will need, as a pytree. `bwd(residuals, cotangent)` returns a tuple with one
# cotangent per argument of `fun`; as in JAX, `None` may stand for a zero
# cotangent, of a whole argument or of any part of one. With `nondiff_argnums`, `fwd` takes all
# arguments, and `bwd` receives the nondiff ones first.
#
# Our reverse mode is built out of forward mode: `grad` is `linearize` (a JVP,
# partially evaluated) followed by transposition ({ref}`Part 4 <part4>`). So a
# `custom_vjp` function must survive a JVP interpreter, even though it has no
# JVP rule. The trick is in what the JVP rule leaves behind:
#
# - it runs `fwd` on the primals, which gives the primal output and the
#   residuals;
# - for the tangent output it binds a new primitive, `custom_lin`, on the
#   residuals and the input tangents. `custom_lin` stands for "the linear map
#   whose transpose is `bwd`". Under `linearize` the tangents are unknown, so
#   partial evaluation stages it into the linear jaxpr, with the residuals as
#   known inputs;
# - transposition meets `custom_lin` there, and its transpose rule calls `bwd`
#   with the residuals and the output cotangents.
#
# So `bwd` runs exactly where the backward pass of the function belongs, and
# `fun` itself is never differentiated. `custom_lin` has no forward meaning:
# nothing can compute its output, since we were only given its transpose. Its
# evaluation, lowering and JVP rules therefore raise the error that plain `jvp`
# of a `custom_vjp` function deserves.
#
# Transposition never checks that `bwd` is the transpose of anything: it just
# calls it with the cotangents. That is what lets `bwd` be *non-linear*, as the
# clipping below is: "the linear map whose transpose is `bwd`" is a fiction that
# holds only formally, and no interpreter ever runs the map itself. This is why
# `custom_vjp` can express gradient clipping and `custom_jvp` cannot: a JVP rule
# must be linear in the tangents, or `grad` would fail to transpose it.


# %% tags=["export"]
class custom_vjp:
    """``fun`` with a reverse-mode derivative rule of its own."""

    def __init__(self, fun: Callable, nondiff_argnums: Sequence[int] = ()) -> None:
        functools.update_wrapper(self, fun)
        self.fun, self.nondiff_argnums = fun, tuple(nondiff_argnums)
        self.fwd = self.bwd = None

    def defvjp(self, fwd: Callable, bwd: Callable) -> None:
        """``fwd(*args) -> (out, residuals)``; ``bwd(*nondiff, residuals, ct)``."""
        self.fwd, self.bwd = fwd, bwd

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        check_rule_defined(self, self.fwd, "defvjp")
        args = resolve_kwargs(self, args, kwargs)
        if _outside_transformations(args):
            return run_outside_transformations(self, args)
        call, res_tree = trace_custom(self, args), []

        def flat_fwd(*primals: Any) -> tuple[list, list]:
            result = self.fwd(*call.all_args(call.unflatten(primals)))
            outs, res = check_fwd_result(call, result)
            res_flat, tree = tree_flatten(res)
            res_tree.append(tree)
            return outs, res_flat

        def flat_bwd(res: list, cts: list) -> list:
            res, cts = (
                tree_unflatten(res_tree[0], res),
                tree_unflatten(call.out_tree, cts),
            )
            return check_bwd_result(call, self.bwd(*call.nondiff, res, cts))

        outs = bind(
            custom_vjp_call_p, *call.consts, *call.args, **call.params,
            fwd=Named(flat_fwd, self.fwd, call.traced_consts),
            bwd=Named(flat_bwd, self.bwd),
        )  # fmt: skip
        return tree_unflatten(call.out_tree, outs)


# %% tags=["export", "hide-input"]
# @title Checks: fwd returns the function's output type, bwd one cotangent per input
def check_fwd_result(call: TracedCall, result: Any) -> tuple[list, Any]:
    who = f"{call.name}: the custom_vjp fwd"
    out, res = _pair(who, result, "output, residuals")
    outs = check_result(f"{who}'s output", out, call.out_tree, call.out_types)
    return outs, res


def check_bwd_result(call: TracedCall, cts_in: Any) -> list:
    who = (
        f"{call.name}: the custom_vjp bwd's result (a tuple with one cotangent "
        "per differentiable argument)"
    )
    if isinstance(cts_in, list):
        cts_in = tuple(cts_in)
    expected = tree_unflatten(call.in_tree, call.in_types)
    cts_in = _zeros_for_none(cts_in, expected)
    return check_result(who, cts_in, call.in_tree, call.in_types)


def _zeros_for_none(ct: Any, expected: Any) -> Any:
    """``ct`` with zeros for each ``None`` standing for a part of ``expected``
    (a tree of types), as JAX's ``bwd`` may return."""
    if ct is None and expected is not None:
        return tree_map(zeros_like_aval, expected)
    same_kind = type(ct) is type(expected)
    if same_kind and isinstance(ct, (tuple, list)) and len(ct) == len(expected):
        parts = [_zeros_for_none(c, e) for c, e in zip(ct, expected)]
        return type(ct)(*parts) if hasattr(ct, "_fields") else type(ct)(parts)
    if same_kind and isinstance(ct, dict) and ct.keys() == expected.keys():
        return {k: _zeros_for_none(ct[k], expected[k]) for k in ct}
    return ct


# %% [markdown]
# The JVP rule of `custom_vjp_call`, and `custom_lin` with its transpose:

# %% tags=["export"]
custom_lin_p = Primitive("custom_lin", multiple_results=True)


@custom_vjp_call_p.def_rule("jvp")
def _custom_vjp_call_jvp(primals, tangents, *, call_jaxpr, num_consts, fwd, bwd, name):
    check_closure_not_differentiated(name, fwd, tangents[:num_consts])
    outs, res = fwd(*primals[num_consts:])
    out_types = Types(x.aval for x in call_jaxpr.outs)
    params = dict(name=name, num_res=len(res), bwd=bwd, out_types=out_types)
    return outs, bind(custom_lin_p, *res, *tangents[num_consts:], **params)


@custom_lin_p.def_rule("abstract_eval")
def _custom_lin_abstract_eval(*avals, name, num_res, bwd, out_types):
    return list(out_types)


@custom_lin_p.def_rule("transpose")
def _custom_lin_transpose(cts, *args, name, num_res, bwd, out_types):
    return [None] * num_res + bwd(list(args[:num_res]), list(cts))


# %% tags=["export", "hide-input"]
# @title custom_lin's forward rules: each says why it cannot run
class CustomVJPForwardModeError(TypeError):
    """Forward-mode differentiation of a function that has only a custom_vjp rule."""


def forward_mode_error(*args: Any, name: str, **params: Any) -> None:
    raise CustomVJPForwardModeError(
        f"jvp of {name}, a custom_vjp function: it has only a reverse-mode rule "
        "(fwd and bwd), and bwd maps output cotangents back to inputs, which "
        "cannot give the output tangents that forward mode (jvp, or running "
        "the linear map of linearize) needs. Use grad or vjp, or give "
        f"{name} a custom_jvp rule instead."
    )


for _kind in ["impl", "jvp", "lower"]:
    custom_lin_p.def_rule(_kind)(forward_mode_error)


# %% [markdown]
# Gradient clipping with `nondiff_argnums`: the clipping bound is the second
# argument, held fixed, and `bwd` receives it first. There is nothing to save
# for the backward pass, so the residuals are `None`.


# %%
@functools.partial(custom_vjp, nondiff_argnums=(1,))
def clip_gradient(x, bound):
    return x


def clip_fwd(x, bound):
    return x, None


def clip_bwd(bound, residuals, ct):
    return (maximum(-bound, -maximum(-bound, -ct)),)  # ct clipped to ±bound


clip_gradient.defvjp(clip_fwd, clip_bwd)


# %% [markdown]
# In `loss` below, the cotangent that reaches `bwd` is the derivative of the cube,
# $3x^2$, so the gradient is $3x^2$ clipped to $\pm 5$ (the last column, computed
# by NumPy), eagerly and compiled:


# %%
def loss(x):
    return clip_gradient(x, 5.0) ** 3


for x in [0.5, 2.0, -3.0]:
    print(x, loss(x), grad(loss)(x), jit(grad(loss))(x), np.clip(3 * x * x, -5.0, 5.0))

# %% [markdown]
# And the jaxprs: staged, the call carries `fwd` and `bwd` by name. Under
# `linearize`, the linear jaxpr holds a `custom_lin` equation whose inputs are
# the residuals (none here) and the tangent:

# %%
print(make_jaxpr(lambda x: clip_gradient(x, 5.0), scalar)[0])
_, linear_jaxpr, _ = linearize_flat(lambda x: [loss(x)], [np.float64(2.0)])
print(linear_jaxpr)

# %% [markdown]
# Forward mode has nothing to run, and says so:

# %%
show_error(jvp, loss, (2.0,), (1.0,))


# %% [markdown]
# ## `vmap` of a `custom_vjp` function
#
# Batching a `custom_vjp_call` batches all three pieces: `fun`'s jaxpr with
# `vmap_jaxpr`, and `fwd` and `bwd` by wrapping each in `vmap`, as `batch_rule`
# does for a JVP rule. Every operand is first given a batch axis at 0 (an
# unbatched one is broadcast), so that `bwd`, which returns one cotangent per
# operand, returns them all batched; the broadcast's transpose then sums the
# cotangent of an operand that was not batched. The batched `fwd` returns
# batched residuals, which the batched `bwd` receives. `custom_lin` batches the
# same way, wrapping the `bwd` it carries. Both rules are in the folded cell.


# %% tags=["export", "hide-input"]
# @title Batching custom_vjp_call and custom_lin: fwd and bwd wrapped in vmap
def batch_fwd(fwd: Named, axis: Axis, n_out: int, n_new: int) -> Named:
    """``fwd`` on a batch (axis 0) of every operand; outputs and residuals at 0."""

    def batched_fwd(*primals: Any) -> tuple[list, list]:
        def flat(*p):
            outs, res = fwd(*p)
            return [*outs, *res]

        both = vmap_in_rule(flat, axis, [0] * len(primals), list(primals))
        return both[:n_out], both[n_out:]

    traced = (False,) * n_new + fwd.traced_consts  # the new constants: arrays
    return Named(batched_fwd, f"vmap({fwd})", traced)


def batch_bwd(bwd: Callable, axis: Axis) -> Named:
    """``bwd(residuals, cts)`` on a batch (axis 0) of all of them."""

    def batched_bwd(res: list, cts: list) -> list:
        k = len(res)
        return vmap_in_rule(
            lambda *a: bwd(a[:k], a[k:]), axis, [0] * (k + len(cts)), [*res, *cts]
        )

    return Named(batched_bwd, f"vmap({bwd})")


@custom_vjp_call_p.def_rule("vmap")
def _custom_vjp_call_vmap(axis, vals, dims, *, call_jaxpr, num_consts, fwd, bwd, name):
    consts, operands = vals[:num_consts], vals[num_consts:]
    consts = [x if d is None else move_batch_axis(axis.size, d, 0, x)
              for x, d in zip(consts, dims)]  # fmt: skip
    operands = [
        move_batch_axis(axis.size, d, 0, x) for x, d in zip(operands, dims[num_consts:])
    ]
    batched = tuple(d is not None for d in dims[:num_consts]) + (True,) * len(operands)
    new_jaxpr, new_consts = vmap_jaxpr(call_jaxpr, axis, batched)
    outs = bind(
        custom_vjp_call_p, *new_consts, *consts, *operands, name=name,
        call_jaxpr=new_jaxpr, num_consts=len(new_consts) + num_consts,
        fwd=batch_fwd(fwd, axis, len(call_jaxpr.outs), len(new_consts)),
        bwd=batch_bwd(bwd, axis),
    )  # fmt: skip
    return outs, [0] * len(outs)


@custom_lin_p.def_rule("vmap")
def _custom_lin_vmap(axis, vals, dims, *, name, num_res, bwd, out_types):
    vals = [move_batch_axis(axis.size, d, 0, x) for x, d in zip(vals, dims)]
    out_types = Types(ShapedArray((axis.size, *t.shape), t.dtype) for t in out_types)
    params = dict(
        name=name, num_res=num_res, bwd=batch_bwd(bwd, axis), out_types=out_types
    )
    outs = bind(custom_lin_p, *vals, **params)
    return outs, [0] * len(outs)


# %%
xs = np.array([0.5, 2.0, -3.0])
print(vmap(grad(loss))(xs), grad(lambda v: reduce_sum(vmap(loss)(v), 0))(xs))
print(
    make_jaxpr(vmap(lambda x: clip_gradient(x, 5.0)), ShapedArray((3,), np.float64))[0]
)


# %% [markdown]
# ## Transposing a call
#
# A `custom_jvp_call` is transposed by transposing its jaxpr, with `xla_call`'s
# rule from {ref}`Part 4 <part4>`. A `custom_vjp_call` has no transpose rule,
# because transposing its jaxpr would ignore `bwd`, so it joins `NOT_LINEAR`, the
# {ref}`appendix <appendix-rule-table>`'s list of primitives without one.


# %% tags=["export", "hide-input"]
# @title Transposing calls: custom_jvp_call's jaxpr; custom_vjp_call never
# When does a call meet transposition? When a JVP rule applies a custom
# function to a tangent (JAX allows that too). Partial evaluation stages that
# call into the linear jaxpr, where transposition finds it. The function had
# better be linear.
@custom_jvp_call_p.def_rule("transpose")
def _custom_jvp_call_transpose(cts, *args, call_jaxpr, **params):
    return _xla_call_transpose(cts, *args, jaxpr=call_jaxpr)


NOT_LINEAR.update({"custom_vjp_call"})


# %% [markdown]
# ## Pytrees, and composition
#
# Arguments, outputs and residuals may be pytrees, as in JAX. Here a
# `custom_vjp` function takes a dict of parameters, returns a pair, and saves a
# tuple of residuals; `bwd` returns a tuple with one entry, a dict like the
# argument. Its backward pass is the true one, so `grad` agrees with `grad` of
# the same code without the rule, under `jit` and `vmap` too:


# %%
def scaled_sines_plain(params):
    return params["a"] * sin(params["w"]), params["a"] * cos(params["w"])


scaled_sines = custom_vjp(scaled_sines_plain)


def scaled_sines_fwd(params):
    a, w = params["a"], params["w"]
    return scaled_sines_plain(params), (a, sin(w), cos(w))


def scaled_sines_bwd(residuals, cts):
    a, s, c = residuals
    ct_sin, ct_cos = cts
    return ({"a": ct_sin * s + ct_cos * c, "w": (ct_sin * c - ct_cos * s) * a},)


scaled_sines.defvjp(scaled_sines_fwd, scaled_sines_bwd)


def total(f, w):
    first, second = f({"a": 1.5, "w": w})
    return first + second * 2.0


for f in [scaled_sines, scaled_sines_plain]:
    loss_of_w = functools.partial(total, f)
    print(grad(loss_of_w)(0.7), jit(vmap(grad(loss_of_w)))(xs))


# %% [markdown]
# ## Mistakes custom rules catch
#
# A rule's result is checked against the function's output every time the rule
# runs: its structure, and each leaf's shape and dtype. A `bwd` must return one
# cotangent per differentiable argument, in a tuple. Each error names the
# function, what was expected, and what came back:


# %%
@custom_jvp
def wrong_rule(x):
    return sin(x)


@wrong_rule.defjvp
def wrong_rule_jvp(primals, tangents):
    (x,), (x_dot,) = primals, tangents
    return sin(x), broadcast(x_dot, (3,), (0,))  # a vector tangent


show_error(grad(wrong_rule), 1.0)


# %% tags=["hide-input"]
# @title Two more mistakes: a bwd without a tuple, a custom function without a rule
def bwd_without_tuple(bound, residuals, ct):
    return ct  # not a tuple


@functools.partial(custom_vjp, nondiff_argnums=(1,))
def bad_bwd(x, bound):
    return x


bad_bwd.defvjp(clip_fwd, bwd_without_tuple)
show_error(grad(lambda x: bad_bwd(x, 5.0)), 1.0)
show_error(custom_jvp(sin), 1.0)  # no rule defined

# %% [markdown]
# ## Where real JAX differs
#
# The folded cell prints JAX's jaxprs for `softplus`, for the gradient of
# clipping, and for its own calls under `grad`:

# %% tags=["hide-input"]
# @title JAX's jaxprs for a custom_jvp and a custom_vjp function
import jax
import jax.numpy as jnp


@jax.custom_jvp
def jax_softplus(x):
    return jnp.where(x > 30.0, x, jnp.log(1.0 + jnp.exp(x)))


@jax_softplus.defjvp
def jax_softplus_jvp(primals, tangents):
    (x,), (x_dot,) = primals, tangents
    return jax_softplus(x), x_dot * jax.nn.sigmoid(x)


@functools.partial(jax.custom_vjp, nondiff_argnums=(1,))
def jax_clip_gradient(x, bound):
    return x


def jax_clip_bwd(bound, residuals, ct):
    return (jnp.clip(ct, -bound, bound),)


jax_clip_gradient.defvjp(clip_fwd, jax_clip_bwd)


def show_jax(f, *args):
    with jax.enable_x64(True):  # float64, as ours, in this cell only
        print(jax.make_jaxpr(f)(*args).pretty_print(use_color=False))


show_jax(jax_softplus, 1.0)
show_jax(jax.grad(jax_softplus), 1.0)
show_jax(lambda x: jax_clip_gradient(x, 5.0), 1.0)
show_jax(jax.grad(lambda x: jax_clip_gradient(x, 5.0) ** 3), 1.0)
try:
    jax.jvp(lambda x: jax_clip_gradient(x, 5.0), (1.0,), (1.0,))
except TypeError as err:
    print("jax.jvp:", err)


# %% [markdown]
# - JAX's primitives are called `custom_jvp_call` and `custom_vjp_call`, with
#   parameters much like ours: `call_jaxpr`, the rule as a Python callable
#   (`jvp_jaxpr_fun`, printed `jvp`, or `fwd_jaxpr_thunk` and `bwd`), and
#   `symbolic_zeros`. Under `grad`, JAX keeps
#   the primal `custom_jvp_call` (its result unused, printed `_`) and inlines the
#   rule's tangent computation; for `custom_vjp` the gradient jaxpr holds `fwd`'s
#   and `bwd`'s operations, traced in place, with no trace of the call.
# - JAX's JVP interpreter treats a `custom_vjp` call as ours does: it runs
#   `fwd` and binds a primitive named `custom_lin` (with parameters such as
#   `num_res`, `bwd`, `out_avals`, `in_zeros` and `symbolic_zeros`; see
#   `jax/_src/interpreters/ad.py`) whose evaluation raises the `TypeError`
#   printed above,
#   `can't apply forward-mode autodiff (jvp) to a custom_vjp function.`
#   Like ours, it raises when something tries to compute a `custom_lin`'s
#   output: at once for an eager `jvp`, when compiling under `jit`, and never
#   inside `make_jaxpr`, which only records the equation.
#   Its `grad` and `linearize`, though, do not run a JVP followed by partial
#   evaluation as ours do: they use a linearizing interpreter of JAX's own (the
#   only path in 0.10.2; the flag `jax_use_direct_linearize` that once chose
#   it is no longer read).
# - JAX's `custom_lin` has no real batching rule: the one registered for it
#   raises the same error (`jax/_src/custom_derivatives.py`), so `vmap` of a
#   `jvp` of a `custom_vjp` function fails while it is traced, even inside
#   `make_jaxpr`. Ours batches `custom_lin`, wrapping its `bwd` in `vmap`, so
#   `make_jaxpr` records the batched equation, and the error comes only when
#   something computes its output.
# - With `symbolic_zeros=True`, JAX's rules are told which tangents (or
#   cotangents) are known to be zero, so they can skip work; we have no symbolic
#   zeros at all, and pass arrays of zeros.
# - [`custom_jvp`](https://docs.jax.dev/en/latest/_autosummary/jax.custom_jvp.html)
#   also has `defjvps`, one rule per argument instead of one rule for all (with
#   [`custom_vjp`](https://docs.jax.dev/en/latest/_autosummary/jax.custom_vjp.html),
#   ours and JAX's `bwd` may return `None` for a zero cotangent).
# - Like JAX, ours accepts a custom function that closes over tracers of an
#   enclosing `jit` or `vmap` (they become extra inputs of the call), and
#   refuses a closure over a value that an enclosing `jvp` or `grad` is
#   differentiating: JAX raises an `UnexpectedTracerError` (or, for a
#   `custom_vjp` staged by `jit` and differentiated later, a
#   `CustomVJPException`), and
#   [`closure_convert`](https://docs.jax.dev/en/latest/_autosummary/jax.closure_convert.html)
#   turns closed-over values into arguments. Both refuse a `bwd` that
#   closes over a `vmap`'s tracer while `grad` runs outside that `vmap`: `bwd`
#   runs after the `vmap` has finished (an `UnexpectedTracerError`).
#   Ours refuses traced `nondiff_argnums`; JAX refuses them for a `custom_vjp`
#   but accepts them for a `custom_jvp`, whose gradient it stops.
# - JAX has dead-code elimination rules for both calls, and, like ours, a
#   transpose for `custom_jvp_call` that transposes its jaxpr (see
#   `jax/_src/custom_derivatives.py`). Its
#   [tutorial on custom derivative rules](https://docs.jax.dev/en/latest/notebooks/Custom_derivative_rules_for_Python_code.html)
#   covers the API in depth.
#
# ## Summary
#
# - A custom function is a higher-order primitive: `custom_jvp_call` or
#   `custom_vjp_call`, carrying `fun` as a jaxpr and the rule as a Python
#   function, printed by name. The rule stays Python because it usually calls
#   the function it belongs to, and tracing it eagerly would never end.
# - Evaluation, abstract evaluation and lowering treat the call as a call of
#   `fun`'s jaxpr; the JVP interpreter replaces it by the rule, and the
#   interpreters of enclosing transformations differentiate the rule, which
#   gives higher derivatives; batching batches the function and the rule together.
# - A `custom_vjp` function's JVP runs `fwd` and leaves a `custom_lin`
#   equation on the tangents; `linearize` stages it, and transposition calls
#   `bwd`. Nothing can run `custom_lin` forwards, so `jvp` of a `custom_vjp`
#   function is an error that says why.
# - Rules are obeyed, not checked: a wrong rule gives a wrong derivative in
#   every mode. Only the rule's structure and types are checked.
#
# ## Exercises
#
# **1. A straight-through estimator.** Rounding toward zero (a conversion to
# integers and back) has derivative zero almost everywhere, which stops training
# of quantized models. Write `truncate` with `custom_jvp` whose rule passes the
# tangent through unchanged, and compare `grad` of `x * truncate(x)` with and
# without the rule.


# %% tags=["hide-input"]
# @title A solution
def truncate_plain(x):
    return convert_element_type(convert_element_type(x, np.int64), np.float64)


truncate = custom_jvp(truncate_plain)


@truncate.defjvp
def truncate_jvp(primals, tangents):
    return truncate(primals[0]), tangents[0]  # as if truncate were the identity


for x in [2.7, -1.2]:
    # d/dx x * t(x) = t(x) + x * t'(x); t' is 0 without the rule, 1 with it
    print(grad(lambda x: x * truncate_plain(x))(x), grad(lambda x: x * truncate(x))(x))


# %% [markdown]
# **2. An implicit derivative.** Newton's method computes $\sqrt{a}$ with a
# `while_loop`, which has no reverse mode ({ref}`Part 6 <part6>`). Wrap it in
# `custom_vjp`: from $y^2 = a$ follows $dy/da = 1 / (2y)$, so `fwd` saves $y$
# and `bwd` returns the cotangent divided by $2y$, without differentiating the
# loop. Check `grad` against $1 / (2\sqrt{a})$, also under `jit` and `vmap`.


# %% tags=["hide-input"]
# @title A solution
@custom_vjp
def newton_sqrt(a):
    return while_loop(
        lambda y: abs_gap(y, a) > 1e-12 * a, lambda y: (y + a / y) * 0.5, a + 1.0
    )


def abs_gap(y, a):
    return maximum(y * y - a, a - y * y)


def newton_sqrt_fwd(a):
    y = newton_sqrt(a)
    return y, y


def newton_sqrt_bwd(y, ct):
    return (ct / (2.0 * y),)


newton_sqrt.defvjp(newton_sqrt_fwd, newton_sqrt_bwd)
points = np.array([0.5, 2.0, 9.0])
print(grad(newton_sqrt)(2.0), jit(grad(newton_sqrt))(2.0), 0.5 / np.sqrt(2.0))
print(vmap(grad(newton_sqrt))(points), 0.5 / np.sqrt(points))

# %% [markdown]
# **3. A rule that counts.** Give `sin` a `custom_jvp` rule that appends to a
# Python list each time it runs. How often does it run for `jit(grad(f))` called
# twice, and for `grad(grad(f))`? Explain the counts.

# %% tags=["hide-input"]
# @title A solution
runs = []


@custom_jvp
def counted_sin(x):
    return sin(x)


@counted_sin.defjvp
def counted_sin_jvp(primals, tangents):
    runs.append(1)
    (x,), (x_dot,) = primals, tangents
    return counted_sin(x), x_dot * cos(x)


d_sin = jit(grad(counted_sin))
print(d_sin(1.0), d_sin(2.0), "runs:", len(runs))  # traced once, run twice
runs.clear()
print(grad(grad(counted_sin))(1.0), -np.sin(1.0), "runs:", len(runs))
# Twice: the inner grad runs the rule, and the rule's own call of counted_sin,
# watched by the outer grad's JVP interpreter, runs the rule again.
_ = np.seterr(**saved_errors)  # NumPy warns about overflows again after this chapter
