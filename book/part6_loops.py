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
# (part6)=
# # Part 6: loops with `while_loop` and `fori_loop`
#
# :::{admonition} Where we are
# :class: note
# {ref}`Part 5 <part5>` staged a decision: `cond` carries both branches as
# jaxprs and picks one when the program runs. The {ref}`appendix <appendix>`
# added the primitives a numerical program needs. What cannot be staged yet is
# repetition whose length depends on a traced value.
# :::
#
# Our tracers never see a Python loop, only what it does. When `jit` or
# `make_jaxpr` trace a `for` loop, they record the operations of every trip, one
# copy per trip, so the jaxpr grows with the number of iterations. A `while` loop whose test
# reads a traced value is worse off: the test needs a boolean, and a traced
# value has only a type.
#
# This chapter does for loops what Part 5 did for branches. `while_loop(cond_fun,
# body_fun, init_val)` becomes a primitive, `while`, whose parameters are two
# jaxprs: the condition, from the loop's state (the *carry*) to a boolean, and
# the body, from the carry to the next carry. The loop is traced once, whatever
# its trip count, and runs as a loop on the device. Then come its rules:
# evaluation, abstract evaluation, lowering to `stablehlo.while`, `jvp` and
# `vmap`, which both have to find out which parts of the carry they touch, and
# partial evaluation, where a loop of unknown length meets reverse mode and
# loses. `fori_loop`, the counting loop, is built on top.
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

book_setup.load_book(globals(), before="part6_loops")

# %% tags=["hide-input"]
# @title A scalar type for the examples

scalar = ShapedArray((), np.float64)


# %% [markdown]
# ## Where Python's loops stop working
#
# A Python `for` loop runs while the function is traced, so `make_jaxpr`
# records its body once per trip. Ten trips make a jaxpr twice as long as five:


# %%
def compound(x, steps):
    for _ in range(steps):
        x = x * 1.01 + 1.0
    return x


for steps in [5, 10, 100]:
    jaxpr = make_jaxpr(lambda x, steps=steps: compound(x, steps), scalar)[0]
    print(f"{steps:4} steps: {len(jaxpr.eqns)} equations")


# %% [markdown]
# That is sometimes what one wants (XLA gets straight-line code to optimize),
# but a million trips would make a million-line program, and the trip count
# must be a Python value. A `while` loop that tests a traced value cannot be
# traced at all. Here is a loop that counts how often a number can be halved
# before it drops to 1 or below:


# %%
def halvings(x):
    count = 0
    while x > 1.0:
        x, count = x * 0.5, count + 1
    return count


print(halvings(1000.0))
show_error(jit(halvings), 1000.0)

# %% [markdown]
# ## `while_loop` as a primitive
#
# `while_loop(cond_fun, body_fun, init_val)` means
#
# ```python
# val = init_val
# while cond_fun(val):
#     val = body_fun(val)
# return val
# ```
#
# with the carry `val` any {term}`pytree` of arrays. The wrapper traces both
# functions once, at the carry's type, into jaxprs. Closed-over values become
# their {term}`constants <constant>`, extra leading inputs, as for `cond`'s
# branches. Unlike the branches of `cond`, the two functions are not
# alternatives: both run on every trip, so their constants are not joined; the
# equation takes the condition's constants, then the body's, then the initial
# carry, and the parameters `cond_nconsts` and `body_nconsts` say where one
# group ends and the next begins.
#
# The body's output becomes its own next input, so it must have exactly the
# type of its input: the same pytree structure, shapes and dtypes. And the
# condition must return one boolean scalar. The wrapper checks both, so that a
# mistake is reported in terms of the user's functions.

# %% tags=["export"]
while_p = Primitive("while", multiple_results=True)


def while_loop(cond_fun: Callable, body_fun: Callable, init_val: Any) -> Any:
    """Run ``val = body_fun(val)`` while ``cond_fun(val)``; return ``val``."""
    init_flat, carry_tree = tree_flatten(init_val)
    init_flat = [_as_input(x, "while_loop: init_val") for x in init_flat]
    carry_types = [_type_of(x) for x in init_flat]
    carry_type = tree_unflatten(carry_tree, carry_types)
    cond_jaxpr, cond_consts, cond_tree = _trace_to_jaxpr(
        cond_fun, (carry_type,), who="while_loop: cond_fun"
    )
    check_loop_condition(cond_tree, cond_jaxpr)
    body_jaxpr, body_consts, body_tree = _trace_to_jaxpr(
        body_fun, (carry_type,), who="while_loop: body_fun"
    )
    check_carry_type_kept(carry_tree, carry_types, body_tree, body_jaxpr)
    outs = bind(
        while_p,
        *cond_consts,
        *body_consts,
        *init_flat,
        cond_jaxpr=cond_jaxpr,
        cond_nconsts=len(cond_consts),
        body_jaxpr=body_jaxpr,
        body_nconsts=len(body_consts),
    )
    return tree_unflatten(carry_tree, outs)


# %% tags=["export", "hide-input"]
# @title Checks: a boolean scalar condition, a body that keeps the carry's type
def _type_of(x: Any) -> ShapedArray:
    """The shape and dtype of an array or tracer, as a ShapedArray."""
    aval = get_aval(x)
    return ShapedArray(aval.shape, aval.dtype)


def _types_str(tree: PyTreeDef, avals: list[ShapedArray]) -> str:
    """A pytree of types, printed like ``(float64[], int64[])``."""
    text = str(tree_unflatten(tree, [a.str_short() for a in avals]))
    return text.replace("'", "")


def check_loop_condition(cond_tree: PyTreeDef, cond_jaxpr: Jaxpr) -> None:
    """Raise a TypeError unless cond_fun returned one boolean scalar."""
    returned = [x.aval for x in cond_jaxpr.outs]
    if cond_tree != LEAF or returned[0] != ShapedArray((), np.bool_):
        raise TypeError(
            "while_loop: cond_fun must return a boolean scalar (bool[]), but it "
            f"returned {_types_str(cond_tree, returned)}; compare to get one, "
            "e.g. less(i, 10)"
        )


def check_carry_type_kept(
    carry_tree: PyTreeDef,
    carry_types: list[ShapedArray],
    body_tree: PyTreeDef,
    body_jaxpr: Jaxpr,
) -> None:
    """Raise a TypeError unless body_fun returns the carry type it was given."""
    returned = [x.aval for x in body_jaxpr.outs]
    if body_tree != carry_tree or returned != carry_types:
        raise TypeError(
            "while_loop: body_fun must return a carry of the type it is given, "
            f"{_types_str(carry_tree, carry_types)}, but it returned "
            f"{_types_str(body_tree, returned)}"
        )


# %% [markdown]
# Evaluation is the loop itself, with `eval_jaxpr` running the two jaxprs.
# Abstract evaluation returns the carry's type: that the output type equals the
# input type is the whole point of the body check. For jaxprs that other
# transformations build, the rule checks that both jaxprs take and return what
# their place in the equation says (in a folded helper).


# %% tags=["export"]
@while_p.def_rule("impl")
def _while_impl(*args, cond_jaxpr, cond_nconsts, body_jaxpr, body_nconsts):
    cond_consts, body_consts, carry = _split(args, cond_nconsts, body_nconsts)
    while eval_jaxpr(cond_jaxpr, [*cond_consts, *carry])[0]:
        carry = eval_jaxpr(body_jaxpr, [*body_consts, *carry])
    return carry


@while_p.def_rule("abstract_eval")
def _while_abstract_eval(*avals, cond_jaxpr, cond_nconsts, body_jaxpr, body_nconsts):
    cond_consts, body_consts, carry = _split(avals, cond_nconsts, body_nconsts)
    check_loop_jaxprs(cond_jaxpr, cond_consts, body_jaxpr, body_consts, carry)
    return [_type_of_aval(a) for a in carry]


# %% tags=["export", "hide-input"]
# @title Helpers: cutting the operands into groups; checking the loop's jaxprs
def _split(items: Sequence, *counts: int) -> list[list]:
    """``items`` cut into pieces of the given lengths, then the rest."""
    pieces, start = [], 0
    for n in counts:
        pieces.append(list(items[start : start + n]))
        start += n
    return [*pieces, list(items[start:])]


def _type_of_aval(aval: ShapedArray) -> ShapedArray:
    return ShapedArray(aval.shape, aval.dtype)


def check_loop_jaxprs(
    cond_jaxpr: Jaxpr,
    cond_consts: list,
    body_jaxpr: Jaxpr,
    body_consts: list,
    carry: list,
) -> None:
    """Raise a TypeError unless the condition takes (its constants, the carry)
    to bool[] and the body takes (its constants, the carry) to the carry."""
    cond_consts, body_consts, carry = [
        [_type_of_aval(a) for a in group] for group in (cond_consts, body_consts, carry)
    ]
    expected = {
        "cond_jaxpr": (cond_jaxpr, cond_consts + carry, [ShapedArray((), np.bool_)]),
        "body_jaxpr": (body_jaxpr, body_consts + carry, carry),
    }
    for name, (jaxpr, in_types, out_types) in expected.items():
        found = typecheck_jaxpr(jaxpr)
        if found.in_types != in_types or found.out_types != out_types:
            raise TypeError(
                f"while: {name} has type {found}, but the loop's operands need "
                f"{JaxprType(in_types, out_types)}"
            )


# %% [markdown]
# With these two rules, `while_loop` runs and traces. Here is Newton's method
# for $\sqrt{a}$: starting above the root at $a + 1$, each step
# $x \mapsto (x + a/x)/2$ moves down towards it, and the loop stops once
# $x^2 - a$ is within a relative $10^{-12}$. The carry also counts the steps.
# The number $a$ is closed over, so it becomes a constant of both jaxprs:


# %%
def newton_sqrt(a):
    def not_converged(carry):
        x, steps = carry
        return x * x - a > 1e-12 * a

    def newton_step(carry):
        x, steps = carry
        return (x + a / x) * 0.5, steps + 1

    return while_loop(not_converged, newton_step, (a + 1.0, 0))


print(newton_sqrt(2.0), np.sqrt(2.0))
print(newton_sqrt(1e6), np.sqrt(1e6))
print(make_jaxpr(newton_sqrt, scalar)[0])


# %% [markdown]
# The printer from {ref}`Part 2 <part2-printing>` shows the two jaxprs under
# the equation, as it did for `cond`: `a` enters the loop twice, once as the
# condition's constant and once as the body's, followed by the initial carry
# `a + 1` and the literal `0`.
#
# ## Lowering: `stablehlo.while`
#
# {term}`StableHLO`'s loop, `stablehlo.while`, has operands, which are its
# initial state, and two regions: `cond`, whose block receives the state and
# returns a boolean scalar, and `body`, whose block receives the state and
# returns the next one. The whole state is carried, so we make the constants
# part of it: the loop's state is every operand of the equation, constants
# first, and the body hands the constants back unchanged. As for `cond`, each
# jaxpr is {term}`lowered <lowering>` once into a private function, and each
# region calls it (with `_call_jaxpr`, folded below).


# %% tags=["export"]
@while_p.def_rule("lower")
def _while_lower(
    ctx,
    avals_in,
    avals_out,
    *operands,
    cond_jaxpr,
    cond_nconsts,
    body_jaxpr,
    body_nconsts,
):
    types = [ir_type(a) for a in avals_in]
    loop = hlo.WhileOp(types, operands)  # the state: every operand
    with ir.InsertionPoint(loop.cond.blocks.append(*types)) as where:
        cond_consts, _, carry = _split(
            where.block.arguments, cond_nconsts, body_nconsts
        )
        hlo.ReturnOp(_call_jaxpr(ctx, cond_jaxpr, [*cond_consts, *carry]))
    with ir.InsertionPoint(loop.body.blocks.append(*types)) as where:
        state = list(where.block.arguments)
        _, body_consts, carry = _split(state, cond_nconsts, body_nconsts)
        new_carry = _call_jaxpr(ctx, body_jaxpr, [*body_consts, *carry])
        hlo.ReturnOp(state[: len(state) - len(carry)] + new_carry)
    return list(loop.results)[len(avals_in) - len(avals_out) :]


# %% tags=["export", "hide-input"]
# @title Helper: a call of a jaxpr lowered once to a private function
def _call_jaxpr(ctx: LoweringContext, jaxpr: Jaxpr, args: list) -> list:
    """Emit a call of ``jaxpr``, lowered once to a private function."""
    callee = ir.FlatSymbolRefAttr.get(ctx.function_for(jaxpr))
    out_types = [ir_type(x.aval) for x in jaxpr.outs]
    return list(mlir_func.CallOp(out_types, callee, args).results)


# %%
module = str(lower_jaxpr(make_jaxpr(newton_sqrt, scalar)[0]))
main = module[module.index("func.func @main") :]
print(
    main[: main.index("\n  }") + 4]
)  # main only: the private functions are the jaxprs


# %% [markdown]
# Now the loop compiles, and its trip count no longer matters to the size of
# the program. A loop of 100,000 steps of $x \mapsto 0.99999\,x + 0.001$ is a
# jaxpr of one equation, with a body of three, and the compiled loop agrees with
# the closed form $x_n = r^n x_0 + c\,(1 - r^n)/(1 - r)$:


# %%
def relax(x, n=100_000):
    def body(carry):
        i, x = carry
        return i + 1, x * 0.99999 + 0.001

    return while_loop(lambda carry: carry[0] < n, body, (0, x))[1]


jaxpr = make_jaxpr(relax, scalar)[0]
print(jaxpr)
r, c, n = 0.99999, 0.001, 100_000
print(jit(relax)(3.0), r**n * 3.0 + c * (1 - r**n) / (1 - r))


# %% [markdown]
# ## `jvp`: tangents join the carry
#
# Differentiating a loop means differentiating every trip. The derivative of
# one trip is the JVP of the body: it maps a carry and its tangent to the next
# carry and the next tangent. So the JVP of the loop is another loop whose carry
# holds both, with the JVP of the body as its body and the original condition,
# which reads only the primal half. The tangent runs alongside the primal, trip
# by trip, and the trip count stays unknown until the end.
#
# Carrying a tangent for every part of the carry would be correct but wasteful:
# a step counter, or any part of the carry that no input tangent ever reaches,
# would drag a zero tangent through every trip. So the rule first finds which
# carries can have a non-zero tangent. Our tangents are arrays, so a tangent is
# *known* to be zero only when it is a concrete array of zeros (what
# `JVPTrace.pure` gives a value that does not depend on the inputs), or when
# its dtype is not a float; a tracer could hold anything. Then it follows the
# dependences of the body jaxpr: an output depends on an input if some chain of
# equations leads from one to the other. The walk errs on the safe side: every
# output of an equation that reads a marked value is marked, and only carries
# whose dtype is a float (the `allowed` ones) can carry a tangent.
#
# One pass is not enough. Take a carry `(x, y, z)` and a body returning
# `(x * 2.0, x, y)`, with a tangent on `x` only. After one trip `y` has one, and
# after two trips `z` has one too. So the rule iterates: mark the carries
# reached from the marked constants and carries, add them to the marks, and
# repeat until nothing changes. Marks only grow and there are finitely many
# carries, so this stops, after at most as many rounds as there are carries.


# %% tags=["export"]
def reached_from(jaxpr: Jaxpr, marked: list[bool]) -> list[bool]:
    """Which outputs of ``jaxpr`` depend on the marked inputs."""
    reached = {v for v, m in zip(jaxpr.in_binders, marked) if m}
    for eqn in jaxpr.eqns:
        if any(isinstance(x, Var) and x in reached for x in eqn.inputs):
            reached.update(eqn.out_binders)
    return [isinstance(x, Var) and x in reached for x in jaxpr.outs]


def carry_fixed_point(
    body_jaxpr: Jaxpr, consts: list[bool], carry: list[bool], allowed: list[bool]
) -> list[bool]:
    """The carries that some number of trips through the body reaches from
    the marked constants and carries (only those ``allowed``)."""
    while True:
        reached = reached_from(body_jaxpr, consts + carry)
        new = [c or (r and a) for c, r, a in zip(carry, reached, allowed)]
        if new == carry:
            return carry
        carry = new


# %%
shift_body = make_jaxpr(lambda x, y, z: (x * 2.0, x, y), scalar, scalar, scalar)[0]
print("one trip:  ", reached_from(shift_body, [True, False, False]))
print(
    "any number:", carry_fixed_point(shift_body, [], [True, False, False], [True] * 3)
)


# %% [markdown]
# The rule then builds the new loop with `while_loop` itself, whose carry is
# the pair (primal carry, tangents of the marked carries). Its condition runs
# the old condition jaxpr on the primal half. Its body calls `jvp_flat` on the
# old body jaxpr, giving zero tangents to the unmarked carries and returning
# only the marked carries' tangents. The tangents of the body's constants are
# closed over, so they become constants of the new body. Calling `while_loop`
# from inside a rule binds the new `while` below the `jvp` interpreter, at the
# highest level among its operands, as every rule's `bind` does.


# %% tags=["export"]
@while_p.def_rule("jvp")
def _while_jvp(primals, tangents, **params):
    cond_jaxpr, body_jaxpr = params["cond_jaxpr"], params["body_jaxpr"]
    counts = (params["cond_nconsts"], params["body_nconsts"])
    cond_consts, body_consts, init = _split(primals, *counts)
    _, const_dots, init_dots = _split(tangents, *counts)
    _, const_nz, init_nz = _split([_maybe_nonzero(t) for t in tangents], *counts)
    is_float = [_type_of(x).dtype.kind == "f" for x in init]
    nonzero = carry_fixed_point(body_jaxpr, const_nz, init_nz, is_float)
    if not any(nonzero):  # no tangent gets into the carry: the loop as it was
        outs = bind(while_p, *primals, **params)
        return outs, [zeros_like(x) for x in outs]

    def cond_fun(carry):
        x, _ = carry
        return eval_jaxpr(cond_jaxpr, [*cond_consts, *x])[0]

    def body_fun(carry):
        x, x_dot = carry
        x_dots = _fill_zeros(x_dot, nonzero, x)
        c_dots = [d if nz else zeros_like(d) for d, nz in zip(const_dots, const_nz)]
        out, out_dot = jvp_flat(
            jaxpr_as_fun(body_jaxpr), [*body_consts, *x], [*c_dots, *x_dots]
        )
        return out, [d for d, nz in zip(out_dot, nonzero) if nz]

    init_dot = [d for d, nz in zip(init_dots, nonzero) if nz]
    out, out_dot = while_loop(cond_fun, body_fun, (init, init_dot))
    return out, _fill_zeros(out_dot, nonzero, out)


# %% tags=["export", "hide-input"]
# @title Helpers: tangents known to be zero
def _maybe_nonzero(tangent: Any) -> bool:
    """False for a tangent known to be zero: a concrete float array of zeros,
    or any integer or boolean tangent. True for a tracer."""
    if get_aval(tangent).dtype.kind != "f":
        return False
    return isinstance(tangent, Tracer) or bool(np.any(np.asarray(tangent)))


def _fill_zeros(tangents: list, marked: list[bool], like: list) -> list:
    """One tangent per value of ``like``: the next of ``tangents`` where
    marked, a zero array elsewhere."""
    given = iter(tangents)
    return [next(given) if m else zeros_like(x) for m, x in zip(marked, like)]


# %% [markdown]
# Newton's iteration converges to $\sqrt{a}$, and its tangent converges to the
# derivative, $1/(2\sqrt{a})$. Only `x` carries a tangent; the step counter
# does not:


# %%
def root(a):
    return newton_sqrt(a)[0]


for a in [2.0, 1e6]:
    value, slope = jvp(root, (a,), (1.0,))
    print(
        f"a={a:g}: sqrt {value:.15g}, slope {slope:.15g}, exact {0.5 / np.sqrt(a):.15g}"
    )
print(make_jaxpr(lambda a: jvp(root, (a,), (1.0,)), scalar)[0])


# %% [markdown]
# The new carry is `x`, the counter and the tangent of `x`; the counter has
# none. The tangent of `a` is the 1.0 we passed, a concrete value, so it appears
# as a literal (`sub 1.0 l`). The other literal zeros are the tangents of
# constants: we have no symbolic zeros, so a constant's zero tangent is
# multiplied and added like any other value.
#
# ## `vmap`: a loop per example
#
# Batching a loop raises the same question as differentiating it — which parts
# of the carry does the transformation touch? — plus a new one: what if the
# examples disagree on when to stop?
#
# The first question has the same answer. A carry is batched if it starts
# batched, or if the body makes it batched from batched constants or carries,
# after any number of trips: `carry_fixed_point` again, with every carry
# allowed. A carry nobody batches, such as the counter of a loop with a fixed
# trip count, stays one value for the whole batch.
#
# Then the predicate. If it does not depend on anything batched, all examples
# take the same number of trips, and the batched loop is the old loop with a
# batched body. If it does, example $k$ wants to stop after its own number of
# trips. One loop cannot stop at several times, so the batched loop keeps going
# while *any* example is still running, and an example that has finished must
# not change any more: after each trip of the batched body, a `select` per
# example keeps the new carry where the example's predicate was still true and
# the old carry where it was already false. Since that `select` can give each
# example a different carry, every carry is batched. As for `cond` in Part 5, running the body on
# finished examples and discarding the result is safe only because our
# primitives have no side effects; it can also compute, and throw away, values
# that overflow or divide by zero.


# %% tags=["export"]
@while_p.def_rule("vmap")
def _while_vmap(axis, vals, dims, **params):
    cond_jaxpr, body_jaxpr = params["cond_jaxpr"], params["body_jaxpr"]
    counts = (params["cond_nconsts"], params["body_nconsts"])
    vals = [
        x if d is None else move_batch_axis(axis.size, d, 0, x)
        for x, d in zip(vals, dims)
    ]
    cond_consts, body_consts, init = _split(vals, *counts)
    cond_b, body_b, init_b = _split([d is not None for d in dims], *counts)
    carry_b = carry_fixed_point(body_jaxpr, body_b, init_b, [True] * len(init))
    (pred_b,) = reached_from(cond_jaxpr, cond_b + carry_b)
    if pred_b:  # examples stop after different trips: each needs its own carry
        carry_b = [True] * len(init)
    init = [
        move_batch_axis(axis.size, None, 0, x) if b and not b0 else x
        for x, b, b0 in zip(init, carry_b, init_b)
    ]

    def running(carry):  # one predicate, or one per example
        args, batched = [*cond_consts, *carry], cond_b + carry_b
        return run_batched(cond_jaxpr, axis, args, batched, [pred_b])[0]

    def cond_fun(carry):
        return any_true(running(carry)) if pred_b else running(carry)

    def body_fun(carry):
        args, batched = [*body_consts, *carry], body_b + carry_b
        new = run_batched(body_jaxpr, axis, args, batched, carry_b)
        if not pred_b:
            return new
        still = running(carry)  # finished examples keep their old carry
        return [select(per_example(still, x), n, x) for n, x in zip(new, carry)]

    outs = while_loop(cond_fun, body_fun, init)
    return outs, [0 if b else None for b in carry_b]


# %% [markdown]
# The helper `run_batched` runs a jaxpr under a `BatchTrace` of its own, with
# the batched inputs along axis 0, and returns each output batched or not, as
# asked; `any_true` reduces a vector of booleans to one, and `per_example`
# broadcasts one boolean per example over the rest of a carry's axes.


# %% tags=["export", "hide-input"]
# @title Helpers: a jaxpr on a batch; "any" of a boolean vector; a predicate per example
def run_batched(
    jaxpr: Jaxpr,
    axis: Axis,
    args: list,
    batched: list[bool],
    out_batched: list[bool],
) -> list:
    """``jaxpr`` on ``args`` (batched along axis 0 where ``batched``); the
    outputs batched along axis 0 where ``out_batched``, else unbatched."""
    with new_level(BatchTrace, axis) as level:
        trace = BatchTrace(level)
        ins = [BatchTracer(trace, x, 0) if b else x for x, b in zip(args, batched)]
        outs = [trace.full_raise(x) for x in eval_jaxpr(jaxpr, ins)]
        return [
            move_batch_axis(axis.size, t.batch_axis, 0, t.val) if b else t.val
            for t, b in zip(outs, out_batched)
        ]


def any_true(preds: Any) -> Any:
    """Whether any element of the boolean vector ``preds`` is true."""
    return reduce_max(convert_element_type(preds, np.int32), 0) > 0


def per_example(pred: Any, x: Any) -> Any:
    """The boolean vector ``pred`` broadcast along the axes of ``x`` after 0."""
    shape = get_aval(x).shape
    if len(shape) == 1:
        return pred
    return broadcast(pred, shape, tuple(range(1, len(shape))))


# %% [markdown]
# Newton's method needs more steps for some numbers than for others, so a batch
# of them has a predicate per example. Each example gets its own root and its
# own step count, the same as running them one by one:

# %%
numbers = np.array([2.0, 0.01, 1e6, 1e-6])
print(vmap(newton_sqrt)(numbers))
print([newton_sqrt(a)[1] for a in numbers], np.sqrt(numbers))
print(make_jaxpr(vmap(newton_sqrt), ShapedArray((4,), np.float64))[0])

# %% [markdown]
# In the jaxpr, the condition ends with the reduction to one boolean, and the
# body recomputes the per-example predicate and ends with one `select` per
# carry. When the predicate does not depend on the batch, as in `relax`, whose
# trip count is fixed, the counter stays unbatched (`int64[]`) and the body has
# no `select`:

# %%
print(make_jaxpr(vmap(lambda x: relax(x, n=10)), ShapedArray((4,), np.float64))[0])


# %% [markdown]
# ## Partial evaluation, and why reverse mode stops here
#
# `linearize`, and with it `vjp` and `grad`, runs the JVP of a function with
# the primals known and the tangents unknown, and splits every equation into a
# part that runs now and a part that is staged into the linear function. For
# `cond`, Part 5 split both branches and passed *residuals*, values the known
# half computes for the unknown half. For a loop, the unknown half is a loop
# too, and its trip $k$ needs the residuals of trip $k$: every iteration's
# cosines, products, and so on. The known loop would have to save them all, one
# set per trip, in a buffer whose size is the trip count — which nobody knows
# until the loop has ended. `while` has no such buffer, and a jaxpr cannot
# describe an array whose length is found at run time.
#
# So a loop cannot be split the way `cond` was. When all inputs are known,
# {ref}`Part 4 <part4>`'s partial evaluation evaluates it at once. With known
# and unknown inputs mixed, as in a JVP loop (known primals, unknown tangents),
# one could run the known carries now and then stage the whole loop again,
# recomputing the primals on the unknown side; JAX does that (see the end of
# this part), and it is enough for `linearize`. It does not help `vjp`, whose
# transposition would have to run the tangent loop backwards, from the last
# trip to the first, with each trip's primal values at hand — the ones nobody
# saved. So our rules stage a loop whose inputs are all unknown, and refuse the
# mix early, with an error that says why and what to use instead. (Part 4 calls
# a primitive's partial-evaluation rule only when some input is unknown, so the
# rules below see either all unknown or a mix. The first serves tracing; the
# second splits a staged jaxpr, and returns Part 4's four parts: no known
# equation, the whole loop as the unknown one, every output unknown, no
# residuals.)


# %% tags=["export"]
class WhileLoopReverseModeError(TypeError):
    """Reverse-mode differentiation through a while loop, which has none."""


def no_reverse_mode() -> WhileLoopReverseModeError:
    return WhileLoopReverseModeError(
        "linearize, vjp and grad do not work through while_loop: reverse mode "
        "needs every trip's primal values, and the trip count is known only "
        "when the loop ends, so the loop cannot save them (linearize alone "
        "could recompute them; this book refuses the mix of known and unknown "
        "carries for all three). Use scan, or fori_loop with Python int bounds "
        "(Part 7); jvp works here."
    )


@while_p.def_rule("partial_eval")
def _while_partial_eval(trace, tracers, **params):
    if any(t.pval.is_known for t in tracers):
        raise no_reverse_mode()
    return trace.stage(while_p, tracers, params)


@while_p.def_rule("partial_eval_jaxpr")
def _while_partial_eval_jaxpr(unks_in, eqn):
    if not all(unks_in):
        raise no_reverse_mode()
    return None, eqn, [True] * len(eqn.out_binders), []


NOT_LINEAR.update({"while"})  # no transpose rule: see above

# %% [markdown]
# `while` joins `NOT_LINEAR`, the {ref}`appendix <appendix-rule-table>`'s list
# of primitives for which a transpose rule would make no sense: a loop is
# linear in its carry only in special cases, and in a linear jaxpr from
# `linearize` it cannot appear. The error comes while `grad` traces, eagerly or
# under `jit`, before anything runs:

# %%
show_error(jit(grad(root)), 2.0)

# %% [markdown]
# A loop whose inputs are all constants is no obstacle: no tangent reaches it,
# so it simply runs, under any interpreter. Here the loop computes $\sqrt 4$
# from a constant, and the derivative of `x * root(4.0)` is `root(4.0)`, 2:

# %%
print(grad(lambda x: x * root(4.0))(3.0))


# %% [markdown]
# ## `fori_loop`
#
# Most loops count. `fori_loop(lower, upper, body_fun, init_val)` runs
# `val = body_fun(i, val)` for `i` from `lower` up to, not including, `upper`.
# Here it is a `while_loop` whose carry is the pair `(i, val)`; the bounds must
# be integer scalars (a folded check makes Python ints take the other bound's
# dtype). Part 7 will make the case of Python-int bounds a
# `scan`, whose trip count is known when tracing, and which therefore has
# reverse mode.


# %% tags=["export"]
def fori_loop(lower: Any, upper: Any, body_fun: Callable, init_val: Any) -> Any:
    """``val = body_fun(i, val)`` for ``i`` from ``lower`` up to ``upper``."""
    lower, upper = check_loop_bounds(lower, upper)

    def step(carry):
        i, val = carry
        return i + 1, body_fun(i, val)

    return while_loop(lambda carry: carry[0] < upper, step, (lower, init_val))[1]


# %% tags=["export", "hide-input"]
# @title Checks: integer scalar bounds
def check_loop_bounds(lower: Any, upper: Any) -> list[Any]:
    """The bounds as integer scalars of one dtype (a Python int takes the
    other bound's); a TypeError otherwise."""
    dtypes = set()
    for name, bound in [("lower", lower), ("upper", upper)]:
        if isinstance(bound, int) and not isinstance(bound, bool):
            continue
        aval = _type_of(_as_input(bound, f"fori_loop: {name}"))
        if aval.dtype.kind not in "iu" or aval.shape != ():
            raise TypeError(
                f"fori_loop: {name} must be an integer scalar, got "
                f"{aval.str_short()} ({_short_repr(bound)})"
            )
        dtypes.add(aval.dtype)
    if len(dtypes) > 1:
        raise TypeError(
            "fori_loop: lower and upper must have the same dtype, got "
            f"{_type_of(lower).str_short()} and {_type_of(upper).str_short()}"
        )
    dtype = dtypes.pop() if dtypes else np.dtype(np.int64)
    return [np.asarray(b, dtype) if isinstance(b, int) else b for b in (lower, upper)]


# %% [markdown]
# A partial sum of the series $\sum_{k \ge 1} 1/k^2 = \pi^2/6$, with a bound
# given at run time, compiled once:


# %%
def basel(n):
    def add_term(k, total):
        k = convert_element_type(k, np.float64)
        return total + 1.0 / (k * k)

    return fori_loop(1, n + 1, add_term, 0.0)


basel_jit = jit(basel)
for n in [10, 1000, 100_000]:
    exact = sum(1 / k**2 for k in range(1, n + 1))
    print(f"{n:6}: {float(basel_jit(np.int64(n))):.15f} {exact:.15f}")
print(np.pi**2 / 6)


# %% [markdown]
# ## Everything composes
#
# The rules call `while_loop`, `eval_jaxpr` and `jvp_flat`, so they work at
# any height of the interpreter stack and in any order. Here is a loop that
# grows $y$ until it reaches 10, whose body closes over a weight `w`, and whose
# trip count depends on both `x` and `w`; for $x > 0$ and $w \ge 1.5$ every
# step increases $y$, so it stops. We batch it over pairs `(x, w)` and
# differentiate it with respect to `x`, in several orders of `jit`, `jvp` and
# `vmap` (the tests check every pair of them against JAX):


# %%
def power_tower(x, w):
    """Repeat y -> y * w + sin(y) from y = x until y reaches 10."""

    def body(carry):
        i, y = carry
        return i + 1, y * w + sin(y)

    return while_loop(lambda carry: carry[1] < 10.0, body, (0, x))[1]


# %% [markdown]
# Its derivative with respect to `x` satisfies a recurrence of its own, which a
# plain Python loop computes alongside the value: with $y' = w y + \sin y$, the
# tangent obeys $\dot y' = (w + \cos y)\,\dot y$.


# %%
def tower_reference(x, w):
    y, dy = x, 1.0
    while y < 10.0:
        y, dy = y * w + np.sin(y), dy * (w + np.cos(y))
    return y, dy


xs, ws = np.array([0.5, 1.0, 2.0, 3.0]), np.array([1.5, 2.0, 1.7, 3.0])
expected = np.array([tower_reference(x, w) for x, w in zip(xs, ws)]).T


def d_tower(x, w):
    return jvp(power_tower, (x, w), (1.0, 0.0))


results = {
    "vmap(jvp)": vmap(d_tower)(xs, ws),
    "jit(vmap(jvp))": jit(vmap(d_tower))(xs, ws),
    "vmap(jit(jvp))": vmap(jit(d_tower))(xs, ws),
    "jvp(vmap)": jvp(vmap(power_tower), (xs, ws), (np.ones(4), np.zeros(4))),
}
for name, (value, slope) in results.items():
    ok = np.allclose(value, expected[0]) and np.allclose(slope, expected[1])
    print(f"{name:16} {np.asarray(slope)}  {ok}")

# %% [markdown]
# ## Mistakes `while_loop` catches
#
# Each of these is reported while tracing, in terms of the call the user wrote
# (the folded cell makes the six mistakes; their messages are below it):

# %% tags=["hide-input"]
# @title Six mistakes: a float or vector condition, a tuple or scalar body, a float bound, grad
show_error(while_loop, lambda x: x, lambda x: x * 2.0, 1.0)
show_error(while_loop, lambda x: x < np.ones(3), lambda x: x * 2.0, np.zeros(3))
show_error(while_loop, lambda x: x < 5.0, lambda x: (x, x), 1.0)
show_error(while_loop, lambda v: reduce_sum(v) < 9.0, reduce_sum, np.ones(3))
show_error(fori_loop, 0.0, 3, lambda i, x: x, 1.0)
show_error(jit(grad(lambda x: fori_loop(0, 3, lambda i, y: y * x, 1.0))), 2.0)

# %% [markdown]
# The fourth body returns a scalar where it was given a vector. The last one is
# a `fori_loop` under `grad`: for now it is a `while_loop`, so it is refused
# too.
#
# ## Where real JAX differs
#
# The folded cell prints what JAX makes of `newton_sqrt`, of a `fori_loop`
# with Python-int bounds, and of one whose bound is traced:

# %% tags=["hide-input"]
# @title JAX's jaxprs for the same loops
import jax


def jax_newton(a):
    return jax.lax.while_loop(
        lambda c: c[0] * c[0] - a > 1e-12 * a,
        lambda c: ((c[0] + a / c[0]) * 0.5, c[1] + 1),
        (a + 1.0, 0),
    )


def show_jax(f, *args):
    with jax.enable_x64(True):  # float64, as ours, in this cell only
        print(jax.make_jaxpr(f)(*args).pretty_print(use_color=False))


show_jax(jax_newton, 2.0)
show_jax(lambda x: jax.lax.fori_loop(0, 5, lambda i, y: y * x, x), 1.0)
show_jax(lambda x, n: jax.lax.fori_loop(0, n, lambda i, y: y * x, x), 1.0, 5)


# %% [markdown]
# - JAX's `while` primitive has the same parameters as ours: `cond_jaxpr`,
#   `body_jaxpr`, `cond_nconsts` and `body_nconsts` (its jaxprs are closed
#   jaxprs, which carry their constants' values inside).
# - [`jax.lax.fori_loop`](https://docs.jax.dev/en/latest/_autosummary/jax.lax.fori_loop.html)
#   with bounds that are Python ints (or otherwise concrete) is a `scan` with a
#   fixed `length`, so `grad` works through it; with a traced bound it is a
#   `while` whose carry is `(i, upper, val)`.
# - [`jax.lax.while_loop`](https://docs.jax.dev/en/latest/_autosummary/jax.lax.while_loop.html)
#   refuses reverse mode too, with a `ValueError` that suggests `scan` or a
#   `fori_loop` with static bounds. But its partial evaluation does not give up
#   on the mix of known and unknown inputs: it runs the known carries as a
#   loop of their own, now, and stages the whole loop again for the unknown
#   ones, recomputing the known part on the way. So `jax.linearize` works
#   through a `while_loop`, and the error comes only from transposition.
# - JAX's `jvp` knows zero tangents symbolically (`ad.Zero`), and both its
#   `jvp` and `vmap` rules find their fixed points by transforming the body
#   jaxpr and looking at the result, rather than by a dependence walk (see
#   `_while_loop_jvp` and `_while_loop_batching_rule` in
#   `jax/_src/lax/control_flow/loops.py`).
# - Under `vmap` with a batched predicate, JAX keeps the predicate a boolean
#   vector inside the `while` equation; the "any" reduction and the per-example
#   `select` are emitted when the loop is lowered, not written into the jaxpr.
# - JAX lowers the two jaxprs inline into the regions of `stablehlo.while`
#   instead of calling private functions; it too carries the constants in the
#   loop's state.
# - Ordered side effects (`jax.debug.print` with `ordered=True`, for example)
#   are threaded through the loop as tokens. Under `vmap` with a batched
#   predicate, the body keeps running for examples that have finished, so a
#   `jax.debug.print` in it also prints their discarded trips. JAX allows that,
#   and refuses only `io_callback`s: an unordered one when the predicate is
#   batched, an ordered one in any batched loop (see `_while_loop_batching_rule`
#   in `jax/_src/lax/control_flow/loops.py`).
#
# ## Summary
#
# - A Python loop under `jit` is unrolled, and a Python `while` on a traced
#   value cannot run. `while_loop` is a primitive carrying a condition jaxpr and
#   a body jaxpr with their constants; it is traced once, and a loop of any
#   length is one equation.
# - The body must return exactly the carry type it receives; abstract
#   evaluation is then just "the carry's type", and lowering is
#   `stablehlo.while` with the constants carried in its state.
# - `jvp` puts tangents in the carry, and `vmap` batches the body; both first
#   find, by iterating the body's dependences to a fixed point, which carries
#   they touch. A predicate that differs per example keeps the loop running
#   while any example runs, with a `select` per example after each trip.
# - A loop cannot be split by partial evaluation into a known loop that saves
#   residuals and an unknown one that uses them: the known half would have to
#   save residuals for an unknown number of trips. So reverse mode
#   through `while_loop` is refused, with an error that points to `scan` (the
#   subject of Part 7) and to `fori_loop` with static bounds.
#
# ## Exercises
#
# **1. Bisection with a tolerance per example.** Write `bisect_sqrt(a, tol)`,
# which halves the interval `[0, a + 1]` around $\sqrt{a}$ until it is shorter
# than `tol`, and returns the midpoint and the number of halvings. Batch it over
# several tolerances for the same `a`. How many halvings should each need?


# %% tags=["hide-input"]
# @title A solution
def bisect_sqrt(a, tol):
    def wide(carry):
        lo, hi, steps = carry
        return hi - lo > tol

    def halve(carry):
        lo, hi, steps = carry
        mid = (lo + hi) * 0.5
        too_big = mid * mid > a
        return select(too_big, lo, mid), select(too_big, mid, hi), steps + 1

    lo, hi, steps = while_loop(wide, halve, (0.0, a + 1.0, 0))
    return (lo + hi) * 0.5, steps


tols = np.array([1e-2, 1e-6, 1e-12])
roots, steps = vmap(bisect_sqrt, (None, 0))(2.0, tols)
print(roots, steps)
# The width starts at 3 and halves each time: ceil(log2(3 / tol)) halvings.
print(np.ceil(np.log2(3.0 / tols)).astype(int), np.abs(roots - np.sqrt(2.0)) < tols)


# %% [markdown]
# **2. A gradient without reverse mode.** `grad(root)` is refused, but `root`
# has one input, so one `jvp` gives its whole derivative. For a function of
# several inputs, one `jvp` per input gives the gradient: write
# `forward_grad(f)` for a function of several scalars, use it on
# `power_tower`, and compare with central differences.


# %% tags=["hide-input"]
# @title A solution
def forward_grad(f):
    """The gradient of f(*scalars) by one jvp per argument."""

    def gradient(*args):
        directions = np.eye(len(args))
        return np.array([jvp(f, args, tuple(d))[1] for d in directions])

    return gradient


x, w, h = 0.5, 1.5, 1e-6
numeric = [
    (power_tower(x + h, w) - power_tower(x - h, w)) / (2 * h),
    (power_tower(x, w + h) - power_tower(x, w - h)) / (2 * h),
]
print(forward_grad(power_tower)(x, w), np.array(numeric))

# %% [markdown]
# **3. A batched bound.** Batch `basel` over several values of `n`. Which case
# of the `vmap` rule does it take, and which carries end up batched?

# %% tags=["hide-input"]
# @title A solution
ns = np.array([1, 10, 100], dtype=np.int64)
print("vmap:      ", vmap(basel)(ns))
print("one by one:", [float(basel(n)) for n in ns])
print("exact sums:", [sum(1 / k**2 for k in range(1, n + 1)) for n in ns])
# The bound is a constant of the condition and it is batched, so the predicate
# is batched: every carry gets a batch axis, the loop runs until the last
# example stops, and each trip ends with a select per carry.
print(make_jaxpr(vmap(basel), ShapedArray((3,), np.int64))[0])
