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
# (part7)=
# # Part 7: `scan`, a loop with reverse mode
#
# :::{admonition} Where we are
# :class: note
# {ref}`Part 6 <part6>` staged loops: `while_loop` is one equation whatever its
# trip count, and `jvp` and `vmap` go through it. Reverse mode does not: a loop
# whose length is known only when it ends cannot save what each trip's
# derivative needs, so `grad` through `while_loop` is refused.
# :::
#
# The loops people differentiate are mostly not of that kind. A recurrent
# network reads a sequence of known length; an ODE solver takes a fixed number
# of steps; a training loop runs for a set number of epochs. In each, the trip
# count is a Python number when the function is traced. That is all reverse
# mode needs: the known half of the loop can then save the values each trip's
# derivative needs in arrays with one row per trip, and the backward pass can
# read them from the last row to the first. A staged or compiled program must
# know the shape of every array before it runs; with the trip count known,
# the shape of those arrays is known too.
#
# This chapter builds that loop, `scan(f, init, xs)`. It walks along the
# leading axis of `xs`, threads a carry through the trips like `while_loop`,
# and also stacks a value `y` from every trip into an output array. The rules of
# Part 6 come back in a new form (evaluation, abstract evaluation, lowering to
# `stablehlo.while`, `jvp` and `vmap` with their fixed points), and then the two
# ideas of {ref}`Part 4 <part4>` meet a loop for the first time: partial
# evaluation splits the body into a known loop, which runs forward and saves
# each trip's {term}`residuals <residual>` as extra stacked outputs, and an
# unknown loop; transposition turns the unknown loop into a loop that runs the
# other way. With those, `grad` of a recurrent network works, compiled, batched
# and to second order.
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

book_setup.load_book(globals(), before="part7_scan")

# %% tags=["hide-input"]
# @title JAX, to compare with; a scalar type for the examples
import jax
import jax.numpy as jnp


scalar = ShapedArray((), np.float64)


# %% [markdown]
# ## A loop that reads a sequence
#
# A running total is the smallest loop of this kind: it reads one number per
# trip and emits one number per trip. Written in Python and traced, it is
# unrolled, one `add` per number, so the program grows with the sequence (4,
# 8 and 100 numbers):


# %%
def running_total(xs):
    total, totals = 0.0, []
    for x in xs:
        total = total + x
        totals.append(total)
    return totals


print([len(make_jaxpr(running_total, [scalar] * n)[0].eqns) for n in [4, 8, 100]])

# %% [markdown]
# `scan` is that loop as one primitive. Its meaning, in Python:
#
# ```python
# def scan_meaning(f, init, xs, length, reverse=False):  # length: the rows of xs
#     carry, ys = init, [None] * length
#     for i in (reversed(range(length)) if reverse else range(length)):
#         carry, ys[i] = f(carry, xs[i])  # every leaf of xs at row i; y to row i
#     return carry, stack(ys)             # every leaf of y, stacked
# ```
#
# The carry is a {term}`pytree` whose type the body must keep, as in
# `while_loop`. The inputs `xs` are a pytree of arrays that share one leading
# length, the trip count; `f` receives one row of each. The outputs `y` are a
# pytree too, and the scan returns them stacked along a new leading axis. With
# `xs=None` (the default) the trips read nothing, and `length` gives their number. With
# `reverse=True` the trips run from the last row to the first, and row `i` of
# `ys` still belongs to row `i` of `xs`.
#
# ## `scan` as a primitive
#
# The wrapper traces `f` once, at the carry's type and the type of one row of
# `xs`, and binds one primitive, `scan`, with the body jaxpr as a parameter.
# The equation's inputs are the body's {term}`constants <constant>`, then the
# initial carry, then `xs`; `num_consts` and `num_carry` say where each group
# ends. Unlike `while`, the trip count is a parameter too: `length`, a Python
# int, and so is the direction, `reverse`.

# %% tags=["export"]
scan_p = Primitive("scan", multiple_results=True)


def scan(
    f: Callable,
    init: Any,
    xs: Any = None,
    length: int | None = None,
    reverse: bool = False,
) -> tuple[Any, Any]:
    """Loop ``carry, y = f(carry, x)`` over the rows of ``xs``; stack the ys."""
    init_flat, carry_tree = tree_flatten(init)
    xs_flat, xs_tree = tree_flatten(xs)
    init_flat, xs_flat, length = check_scan_inputs(init_flat, xs_flat, length)
    carry_types = [_type_of(x) for x in init_flat]
    carry_type = tree_unflatten(carry_tree, carry_types)
    row_type = tree_unflatten(xs_tree, [_row_type(_type_of(x)) for x in xs_flat])
    jaxpr, consts, out_tree = _trace_to_jaxpr(f, (carry_type, row_type), who="scan: f")
    ys_tree = check_scan_body(carry_tree, carry_types, out_tree, jaxpr)
    outs = bind(
        scan_p,
        *consts,
        *init_flat,
        *xs_flat,
        jaxpr=jaxpr,
        num_consts=len(consts),
        num_carry=len(init_flat),
        length=length,
        reverse=bool(reverse),
    )
    carry, ys = _split(outs, len(init_flat))
    return tree_unflatten(carry_tree, carry), tree_unflatten(ys_tree, ys)


# %% [markdown]
# The checks (folded) say in the user's terms what is wrong with the call:
# leaves of `xs` without a leading axis or with different leading lengths, a
# `length` that disagrees with `xs`, no `xs` and no `length`, a body that does
# not return a pair, or one that changes the carry's type.


# %% tags=["export", "hide-input"]
# @title Checks: one leading length for xs; a body returning (carry, y)
def _row_type(aval: ShapedArray) -> ShapedArray:
    """The type of one row: the leading axis dropped."""
    return ShapedArray(aval.shape[1:], aval.dtype)


def _stacked_type(aval: ShapedArray, length: int) -> ShapedArray:
    """The type of ``length`` rows of type ``aval``."""
    return ShapedArray((length, *aval.shape), aval.dtype)


def check_scan_inputs(init_flat: list, xs_flat: list, length: Any) -> tuple:
    """(init_flat, xs_flat, the trip count) with the leaves as arrays; the trip
    count is the leading length that xs share, or ``length``."""
    init_flat = [_as_input(x, "scan: init") for x in init_flat]
    xs_flat = [_as_input(x, "scan: xs") for x in xs_flat]
    if length is not None and (
        not isinstance(length, (int, np.integer))
        or isinstance(length, bool)
        or length < 0
    ):
        raise TypeError(
            f"scan: length must be a non-negative Python int, got {_short_repr(length)}"
        )
    types = [_type_of(x) for x in xs_flat]
    for t in types:
        if t.shape == ():
            raise ValueError(
                "scan: every leaf of xs needs a leading axis to scan over, got "
                f"a scalar {t.str_short()}"
            )
    lengths = sorted({t.shape[0] for t in types})
    if len(lengths) > 1:
        shapes = ", ".join(t.str_short() for t in types)
        raise ValueError(
            f"scan: the leaves of xs must share one leading length, got {shapes}"
        )
    if not lengths and length is None:
        raise ValueError(
            "scan: with no xs, give the number of trips as length=..., e.g. "
            "scan(f, init, None, length=10)"
        )
    if lengths and length is not None and lengths[0] != length:
        raise ValueError(
            f"scan: length={length} disagrees with the leading length of xs, "
            f"{lengths[0]}"
        )
    return init_flat, xs_flat, int(length) if length is not None else lengths[0]


def check_scan_body(
    carry_tree: PyTreeDef, carry_types: list, out_tree: PyTreeDef, jaxpr: Jaxpr
) -> PyTreeDef:
    """The tree of y; a TypeError unless f returned (a carry of the type it
    was given, y)."""
    returned = [x.aval for x in jaxpr.outs]
    if out_tree.node_type not in (tuple, list) or len(out_tree.children) != 2:
        raise TypeError(
            "scan: f must return a pair (carry, y), but it returned "
            f"{_types_str(out_tree, returned)}"
        )
    new_tree, ys_tree = out_tree.children
    new_types = returned[: new_tree.num_leaves]
    if new_tree != carry_tree or new_types != carry_types:
        raise TypeError(
            "scan: f must return a carry of the type it is given, "
            f"{_types_str(carry_tree, carry_types)}, but it returned "
            f"{_types_str(new_tree, new_types)}"
        )
    return ys_tree


def check_scan_jaxpr(
    jaxpr: Jaxpr, consts: list, carry: list, xs: list, length: int
) -> None:
    """A TypeError unless ``jaxpr`` takes (consts, carry, rows of xs) to
    (carry, y) and xs have ``length`` rows."""
    consts = [_type_of_aval(a) for a in consts]
    carry = [_type_of_aval(a) for a in carry]
    if any(a.shape[:1] != (length,) for a in xs):
        got = ", ".join(a.str_short() for a in xs)
        raise TypeError(f"scan: xs must have {length} rows, got ({got})")
    in_types = consts + carry + [_row_type(a) for a in xs]
    found = typecheck_jaxpr(jaxpr)
    if found.in_types != in_types or found.out_types[: len(carry)] != carry:
        ins = ", ".join(t.str_short() for t in in_types)
        outs = ", ".join(t.str_short() for t in carry)
        raise TypeError(
            f"scan: the body has type {found}, but the operands need "
            f"({ins}) -> ({outs}, ...)"
        )


# %% [markdown]
# Evaluation is the Python loop above, with `eval_jaxpr` running the body and
# each `y` written into its row of a preallocated array. Abstract evaluation
# returns the carry's type and, for each `y`, a type with `length` rows; like
# `while`'s, it checks the body against the operands, which matters for a `scan`
# equation built by code other than the wrapper, such as a rule that rewrites a
# jaxpr.


# %% tags=["export"]
@scan_p.def_rule("impl")
def _scan_impl(*args, jaxpr, num_consts, num_carry, length, reverse):
    consts, carry, xs = _split(args, num_consts, num_carry)
    xs = [np.asarray(x) for x in xs]
    ys = [
        np.empty((length, *y.aval.shape), y.aval.dtype) for y in jaxpr.outs[num_carry:]
    ]
    for i in reversed(range(length)) if reverse else range(length):
        outs = eval_jaxpr(jaxpr, [*consts, *carry, *[x[i] for x in xs]])
        carry = outs[:num_carry]
        for stack, y in zip(ys, outs[num_carry:]):
            stack[i] = y
    return [*carry, *ys]


@scan_p.def_rule("abstract_eval")
def _scan_abstract_eval(*avals, jaxpr, num_consts, num_carry, length, reverse):
    consts, carry, xs = _split(avals, num_consts, num_carry)
    check_scan_jaxpr(jaxpr, consts, carry, xs, length)
    ys = [_stacked_type(y.aval, length) for y in jaxpr.outs[num_carry:]]
    return [_type_of_aval(a) for a in carry] + ys


# %% [markdown]
# The running total as a scan: the carry is the total so far, and each trip
# emits it. The jaxpr has one equation, and the printer of
# {ref}`Part 2 <part2-printing>` shows the body under it:


# %%
def cumsum(xs):
    return scan(lambda total, x: (total + x, total + x), 0.0, xs)[1]


numbers = np.array([1.0, 2.0, 3.0, 4.0])
print(cumsum(numbers), np.cumsum(numbers))
print(make_jaxpr(cumsum, ShapedArray((4,), np.float64))[0])

# %% [markdown]
# A thousand rows make the same jaxpr, with `length=1000`:

# %%
long = make_jaxpr(cumsum, ShapedArray((1000,), np.float64))[0]
print(len(long.eqns), long.eqns[0].params["length"])


# %% [markdown]
# ## Lowering: a `stablehlo.while` that reads and writes rows
#
# The lowering follows Part 6's pattern for `while` (folded): a
# `stablehlo.while` whose state adds a counter `i` and one zero-filled buffer
# per `y`; each trip reads row `i` of every `xs` with `dynamic_slice` (row
# `length - 1 - i` when `reverse`), calls the lowered body, writes each `y`
# into the same row of its buffer with `dynamic_update_slice`, and adds one to
# `i`.


# %% tags=["export", "hide-input"]
# @title The lowering rule: a stablehlo.while with a counter and row buffers
@scan_p.def_rule("lower")
def _scan_lower(
    ctx, avals_in, avals_out, *operands, jaxpr, num_consts, num_carry, length, reverse
):
    index = ShapedArray((), np.int64)
    ys_avals = avals_out[num_carry:]
    if length == 0:  # no trips, and no row to read
        return [
            *operands[num_consts : num_consts + num_carry],
            *[ir_constant(0, a) for a in ys_avals],
        ]
    state = [ir_constant(0, index), *operands, *[ir_constant(0, a) for a in ys_avals]]
    types = [v.type for v in state]
    loop = hlo.WhileOp(types, state)
    with ir.InsertionPoint(loop.cond.blocks.append(*types)) as where:
        i = where.block.arguments[0]
        hlo.ReturnOp([_lower_less(i, ir_constant(length, index))])
    with ir.InsertionPoint(loop.body.blocks.append(*types)) as where:
        i, *state = where.block.arguments
        num_xs = len(operands) - num_consts - num_carry
        consts, carry, xs, ys = _split(state, num_consts, num_carry, num_xs)
        row = hlo.subtract(ir_constant(length - 1, index), i) if reverse else i
        xs_avals = avals_in[num_consts + num_carry :]
        rows = [_read_row(x, row, aval) for x, aval in zip(xs, xs_avals)]
        outs = _call_jaxpr(ctx, jaxpr, [*consts, *carry, *rows])
        ys = [_write_row(stack, y, row) for stack, y in zip(ys, outs[num_carry:])]
        i = hlo.add(i, ir_constant(1, index))
        hlo.ReturnOp([i, *consts, *outs[:num_carry], *xs, *ys])
    results = list(loop.results)
    carry_at = 1 + num_consts
    return results[carry_at : carry_at + num_carry] + results[len(results) - len(ys) :]


# %% tags=["export", "hide-input"]
# @title Helpers: comparing indices; reading and writing one row of an array
def _lower_less(x: ir.Value, y: ir.Value) -> ir.Value:
    direction = hlo.ComparisonDirectionAttr.get("LT")
    signed = hlo.ComparisonTypeAttr.get("SIGNED")
    return hlo.compare(x, y, direction, compare_type=signed)


def _row_start(row: ir.Value, ndim: int) -> list[ir.Value]:
    """The index of the first element of ``row``: (row, 0, 0, ...)."""
    return [row] + [ir_constant(0, ShapedArray((), np.int64)) for _ in range(ndim - 1)]


def _read_row(x: ir.Value, row: ir.Value, aval: ShapedArray) -> ir.Value:
    """``x[row]``, with ``row`` known only when the program runs."""
    block = hlo.dynamic_slice(x, _row_start(row, aval.ndim), [1, *aval.shape[1:]])
    return hlo.reshape(ir_type(_row_type(aval)), block)


def _write_row(stack: ir.Value, y: ir.Value, row: ir.Value) -> ir.Value:
    """``stack`` with row ``row`` replaced by ``y``."""
    shape = ir.RankedTensorType(stack.type).shape
    element = ir.RankedTensorType(y.type).element_type
    y = hlo.reshape(ir.RankedTensorType.get([1, *shape[1:]], element), y)
    return hlo.dynamic_update_slice(stack, y, _row_start(row, len(shape)))


# %% [markdown]
# The lowered running total of four numbers. The loop's state is the counter,
# the carry, the input and the buffer of `ys`; the `cond` region compares the
# counter with 4, and the `do` region reads row `%iterArg` of the input with
# `dynamic_slice`, calls the body (`@jaxpr_0`), writes its `y` into the
# buffer with `dynamic_update_slice`, and adds one to the counter. For a
# million numbers only the shapes and the bound 4 would change.

# %%
print(lower_jaxpr(make_jaxpr(cumsum, ShapedArray((4,), np.float64))[0]))


# %% [markdown]
# ## `jvp`: tangents join the carry
#
# The JVP of a scan is a scan of the JVP of its body, as for `while`: the
# carry holds each carry's tangent, and now `xs` holds each row's tangent and
# `ys` each output's. As in Part 6, only the carries that some tangent can
# reach get one, found by iterating the body's dependences to a fixed point.
# Part 6's `carry_fixed_point` takes the body's inputs as (constants, carry);
# here the rows of `xs` are inputs too, so `scan_fixed_point` hands it the body
# with its inputs reordered, the rows counted among the constants: both are
# read afresh on every trip, and neither is fed back from one trip to the next.


# %% tags=["export"]
def scan_fixed_point(
    jaxpr: Jaxpr, num_consts: int, num_carry: int, marked: list, allowed: list
) -> list[bool]:
    """The carries that some number of trips reaches from the marked inputs."""
    consts, carry, xs = _split(jaxpr.in_binders, num_consts, num_carry)
    body = Jaxpr(consts + xs + carry, jaxpr.eqns, jaxpr.outs)  # rows first
    consts, carry, xs = _split(marked, num_consts, num_carry)
    return carry_fixed_point(body, consts + xs, carry, allowed)


# %% [markdown]
# The rule itself is Part 6's with rows added: a `scan` whose carry is
# (carries, tangents of the marked carries) and whose rows are (rows, their
# non-zero tangents), with a body that calls `jvp_flat` on the old body and
# emits each `y` next to its tangent. The tangents of the constants are closed
# over, so they become constants of the new scan.


# %% tags=["export"]
@scan_p.def_rule("jvp")
def _scan_jvp(primals, tangents, *, jaxpr, num_consts, num_carry, length, reverse):
    nonzero = [_maybe_nonzero(t) for t in tangents]
    consts, init, xs = _split(primals, num_consts, num_carry)
    const_dots, init_dots, xs_dots = _split(tangents, num_consts, num_carry)
    const_nz, _, xs_nz = _split(nonzero, num_consts, num_carry)
    is_float = [_type_of(x).dtype.kind == "f" for x in init]
    carry_nz = scan_fixed_point(jaxpr, num_consts, num_carry, nonzero, is_float)
    const_dots = [d if nz else zeros_like(d) for d, nz in zip(const_dots, const_nz)]

    def body(carry, row):
        (c, c_dot), (x, x_dot) = carry, row
        c_dot, x_dot = _fill_zeros(c_dot, carry_nz, c), _fill_zeros(x_dot, xs_nz, x)
        outs, out_dots = jvp_flat(
            jaxpr_as_fun(jaxpr), [*consts, *c, *x], [*const_dots, *c_dot, *x_dot]
        )
        new_dots = [d for d, nz in zip(out_dots, carry_nz) if nz]
        return (outs[:num_carry], new_dots), (outs[num_carry:], out_dots[num_carry:])

    init_dots = [d for d, nz in zip(init_dots, carry_nz) if nz]
    xs_dots = [d for d, nz in zip(xs_dots, xs_nz) if nz]
    (carry, carry_dots), (ys, ys_dots) = scan(
        body, (init, init_dots), (xs, xs_dots), length=length, reverse=reverse
    )
    return [*carry, *ys], [*_fill_zeros(carry_dots, carry_nz, carry), *ys_dots]


# %% [markdown]
# The running example of the rest of the chapter is a recurrence of the kind
# a recurrent network computes: a hidden `state`, updated from each input
# `x` by $\text{state} \mapsto \tanh(\text{weight} \cdot \text{state} + x)$,
# where the `weight` is closed over. The loss adds the squares of all hidden
# states. (The names are whole words so that they do not clash with the
# one-letter names of printed jaxprs.)


# %%
def rnn_loss(weight, xs):
    def step(state, x):
        state = tanh(state * weight + x)
        return state, state * state

    state, squares = scan(step, 0.5, xs)
    return reduce_sum(squares, 0)


inputs = np.sin(np.arange(20.0))
weight, eps = 0.8, 1e-6
numeric = (rnn_loss(weight + eps, inputs) - rnn_loss(weight - eps, inputs)) / (2 * eps)
print(jvp(lambda w: rnn_loss(w, inputs), (weight,), (1.0,)), numeric)


# %% [markdown]
# The jaxpr of that JVP, three steps long. The scan's constant is `weight`
# (`b`, read in the body as `g`); the weight's tangent is closed over by the
# new body, and here it is a concrete 1.0, the literal in `mul h 1.0`. The
# carry holds the state and its tangent (`h` and `i` in the body), starting at
# 0.5 and 0.0, the row is `j`, and the body emits the new state and its
# tangent (`q`, `t`), then the square and its tangent (`u`, `x`). Two lines are
# noise: our JVP has no symbolic zeros, so the row's tangent, which is zero,
# is a real `0.0` that `add n 0.0` adds; and `r` and `u` are both `mul q q`,
# once for the derivative of `tanh` and once for the square, since nothing
# removes duplicates.


# %%
def loss_jvp(weight):
    return jvp(lambda w: rnn_loss(w, inputs[:3]), (weight,), (1.0,))


print(make_jaxpr(loss_jvp, scalar)[0])


# %% [markdown]
# ## `vmap`: which carries, which outputs
#
# Batching a scan needs no per-example predicate: every example takes the
# same `length` trips. It only has to know which carries are batched
# (`scan_fixed_point` again, every carry allowed) and then which `y`s are
# (those the batched inputs reach in one trip). One more detail is the batch
# axis of `xs`: the loop cuts rows along axis 0, so a batched `xs` gets its
# batch axis at 1, and each row then has it at 0; a batched `y` comes out
# with its batch axis at 1 for the same reason. The rule (folded) then runs
# the body with `run_batched` from Part 6 inside a new `scan`.


# %% tags=["export", "hide-input"]
# @title The vmap rule: batch the body; xs and ys batched at axis 1
@scan_p.def_rule("vmap")
def _scan_vmap(axis, vals, dims, *, jaxpr, num_consts, num_carry, length, reverse):
    batched = [d is not None for d in dims]
    consts_b, init_b, xs_b = _split(batched, num_consts, num_carry)
    carry_b = scan_fixed_point(
        jaxpr, num_consts, num_carry, batched, [True] * num_carry
    )
    ys_b = reached_from(jaxpr, consts_b + carry_b + xs_b)[num_carry:]
    vals = [
        x if d is None else move_batch_axis(axis.size, d, 0, x)
        for x, d in zip(vals, dims)
    ]
    consts, init, xs = _split(vals, num_consts, num_carry)
    init = [
        move_batch_axis(axis.size, None, 0, x) if b and not b0 else x
        for x, b, b0 in zip(init, carry_b, init_b)
    ]
    xs = [move_batch_axis(axis.size, 0, 1, x) if b else x for x, b in zip(xs, xs_b)]

    def body(carry, row):
        args, args_b = [*consts, *carry, *row], consts_b + carry_b + xs_b
        outs = run_batched(jaxpr, axis, args, args_b, carry_b + ys_b)
        return outs[:num_carry], outs[num_carry:]

    carry, ys = scan(body, init, xs, length=length, reverse=reverse)
    return [*carry, *ys], [0 if b else None for b in carry_b] + [
        1 if b else None for b in ys_b
    ]


# %% [markdown]
# Running totals of three sequences at once, from three starting totals:

# %%
starts, rows = np.array([0.0, 10.0, 100.0]), np.arange(12.0).reshape(3, 4)


def totals_from(start, xs):
    return scan(lambda total, x: (total + x, total + x), start, xs)


print(vmap(totals_from)(starts, rows))
print(starts[:, None] + np.cumsum(rows, axis=1))


# %% [markdown]
# (part7-partial-eval)=
# ## Partial evaluation: a known loop that saves every trip
#
# `linearize` runs the JVP with the primals known and the tangents unknown.
# In the JVP scan above, the carry holds `state` (known) next to its tangent
# (unknown), the constants hold `weight` (known) and its tangent (unknown),
# and the body mixes them. The default rule would stage the whole scan as
# unknown, primal work included, and `linearize` could not return the primal
# output. So, as for `cond` in {ref}`Part 5 <part5-partial-eval>`, the rule
# splits the body with {ref}`Part 4 <part4-pe-jaxprs>`'s `partial_eval_jaxpr`
# and makes two scans of the halves: a known loop that runs now and an
# unknown loop that is staged. The new problem is the residuals. The known
# body computes them on every trip, and trip $k$ of the unknown loop needs
# those of trip $k$. So the known scan emits them as extra stacked `ys`, one
# row per trip, in arrays whose size is known because `length` is; the
# unknown scan reads them back as extra `xs`, row $k$ on trip $k$. This is
# what `while_loop` could not do. The two loops, with each scan's three
# groups of inputs (constants; carries; rows) separated by semicolons:
#
# ```text
# known loop:    (known consts; known carries; known rows)
#                  -> (known carries, known ys, residuals)   residuals: extra ys
# unknown loop:  (unknown consts; unknown carries; unknown rows, residuals)
#                  -> (unknown carries, unknown ys)          residuals: extra xs
# ```
#
# (Hoisting, an optional memory saving described after the rule, later moves
# the residuals that are the same on every trip out of the known loop and
# into the unknown loop's constants.)
#
# `split_scan` builds the two bodies. Block 1 decides which carries are
# unknown: a carry with a known initial value becomes unknown if the body
# makes it unknown on some trip (the tangent of `state` does, through the
# tangent of `weight`), a fixed point as for `jvp`, in which each round asks
# `partial_eval_jaxpr` which outputs of the body are unknown. Block 2 splits
# the body with those carries' outputs forced to be unknown (the
# `instantiate` argument), so that each half returns exactly the carries it
# takes; the known half returns the residuals after its ys. Block 3 moves the
# residuals, which `partial_eval_jaxpr` puts first among the unknown half's
# inputs, to the end, where a scan's rows are.


# %% tags=["export"]
class ScanSplit(NamedTuple):
    """A scan body split by partial evaluation (see split_scan)."""

    carry_unknown: list[bool]
    out_unknown: list[bool]  # of the scan's outputs: carries, then ys
    known_body: Jaxpr  # (consts; carries; rows) -> (carries, ys, residuals)
    unknown_body: Jaxpr  # (consts; carries; rows, residuals) -> (carries, ys)
    num_res_consts: int = 0  # residuals read as constants, first: see hoisting


def split_scan(
    jaxpr: Jaxpr, num_consts: int, num_carry: int, unknown: list[bool]
) -> ScanSplit:
    """Split a scan body into a known loop, whose ys end with one row of
    residuals per trip, and an unknown loop, which reads them as its last xs."""
    consts_u, carry_u, xs_u = _split(unknown, num_consts, num_carry)
    # 1: fixed point on unknown carries
    while True:
        out_u = partial_eval_jaxpr(jaxpr, consts_u + carry_u + xs_u)[2]
        new = [c or o for c, o in zip(carry_u, out_u)]
        if new == carry_u:
            break
        carry_u = new
    # 2: split known/unknown; the known body returns the residuals last
    num_ys = len(jaxpr.outs) - num_carry
    known_body, unknown_body, out_u, num_res = partial_eval_jaxpr(
        jaxpr, consts_u + carry_u + xs_u, carry_u + [False] * num_ys
    )
    # 3: the unknown body reads the residuals as its last rows
    residuals, rest = _split(unknown_body.in_binders, num_res)
    unknown_body = Jaxpr(rest + residuals, unknown_body.eqns, unknown_body.outs)
    return ScanSplit(carry_u, out_u, known_body, unknown_body)


# %% [markdown]
# Why block 1 asks `partial_eval_jaxpr` rather than use Part 6's dependence
# walk `reached_from`: that walk marks *every* output of an equation with an
# unknown input. A `cond` or `scan` inside the body that reads a primal and a
# tangent computes primal outputs too, and the walk would call them unknown;
# a primal carry fed by them would then be computed in the unknown loop,
# which must hold only linear work. `partial_eval_jaxpr` splits such nested
# equations with their own rules, and reports their primal outputs known.
#
# The rule for tracing runs the known scan now and stages the unknown one,
# with the stacked residuals as its last `xs`. The unknown scan also needs the
# initial value of every unknown carry; when that value is known (the tangent
# of the initial `state` is a known zero), `instantiate_const` makes it an
# input of the staged program, so it is kept as a residual too. The line
# under the comment `# optional` is a memory saving, explained next; without
# it every residual would be stacked, `res_consts` would be empty, and
# `known_consts` unchanged.


# %% tags=["export"]
@scan_p.def_rule("partial_eval")
def _scan_partial_eval(
    trace, tracers, *, jaxpr, num_consts, num_carry, length, reverse
):
    unknown = [not t.pval.is_known for t in tracers]
    s = split_scan(jaxpr, num_consts, num_carry, unknown)
    consts, init, xs = _split(tracers, num_consts, num_carry)
    known_consts, unknown_consts = _split_by(unknown[:num_consts], consts)
    known_xs, unknown_xs = _split_by(unknown[num_consts + num_carry :], xs)
    known_init, unknown_init = _split_by(s.carry_unknown, init)
    known_consts = [t.pval.const for t in known_consts]
    # optional: residuals that are the same on every trip, computed once
    res_consts, known_consts, s = hoist_invariant_residuals(s, known_consts)
    # the known loop runs now; its ys end with the residual rows
    known_outs = bind(
        scan_p,
        *known_consts,
        *[t.pval.const for t in known_init + known_xs],
        jaxpr=s.known_body,
        num_consts=len(known_consts),
        num_carry=len(known_init),
        length=length,
        reverse=reverse,
    )
    known_outs, res_rows = _split(known_outs, s.out_unknown.count(False))
    # the unknown loop is staged; it reads the residual rows as its last xs
    residuals = [trace.instantiate_const(trace.pure(r)) for r in res_consts + res_rows]
    res_consts, res_rows = _split(residuals, len(res_consts))
    unknown_init = [trace.instantiate_const(t) for t in unknown_init]
    unknown_params = dict(
        jaxpr=s.unknown_body,
        num_consts=len(res_consts) + len(unknown_consts),
        num_carry=len(unknown_init),
        length=length,
        reverse=reverse,
    )
    staged = [*res_consts, *unknown_consts, *unknown_init, *unknown_xs, *res_rows]
    unknown_outs = iter(trace.stage(scan_p, staged, unknown_params))
    known_outs = iter(known_outs)
    return [
        next(unknown_outs) if u else trace.pure(next(known_outs)) for u in s.out_unknown
    ]


# %% [markdown]
# **Hoisting, to save memory.** The split above is already correct. But some
# residuals depend only on known constants and are the same on every trip (in
# the RNN, `weight` itself); stacking them would store `length` copies of one
# value. `hoist_residuals` (folded) finds them by splitting the known body a
# second time with `partial_eval_jaxpr`, now treating what changes from trip
# to trip (the carries and rows) as "unknown". The half that depends only on
# the constants, `before`, runs once before the loop and returns the
# loop-invariant residuals and the known scan's constants; the other half is
# the new known body. The unknown body then reads the invariant residuals as
# its first constants (`num_res_consts` of them), and only the rest as rows.


# %% tags=["export", "hide-input"]
# @title Hoisting: residuals that are the same on every trip, computed once
def hoist_residuals(s: ScanSplit, num_known_consts: int) -> tuple[Jaxpr, ScanSplit]:
    """(before, split): ``before`` takes the known loop's constants to (the
    residuals that are the same on every trip, the new known loop's
    constants); the new unknown body reads those residuals as constants."""
    num_known_outs = s.out_unknown.count(False)
    num_res = len(s.known_body.outs) - num_known_outs
    varies = [i >= num_known_consts for i in range(len(s.known_body.in_binders))]
    before, known_body, outs_vary, _ = partial_eval_jaxpr(
        s.known_body, varies, [True] * num_known_outs + [False] * num_res
    )
    binders = s.unknown_body.in_binders
    rest, residuals = _split(binders, len(binders) - num_res)
    invariant, per_trip = _split_by(outs_vary[num_known_outs:], residuals)
    unknown_body = Jaxpr(
        invariant + rest + per_trip, s.unknown_body.eqns, s.unknown_body.outs
    )
    return before, s._replace(
        known_body=known_body, unknown_body=unknown_body, num_res_consts=len(invariant)
    )


def hoist_invariant_residuals(s: ScanSplit, known_consts: list) -> tuple:
    """Run ``before`` now: (the residuals that are the same on every trip,
    the known loop's new constants, the new split)."""
    before, s = hoist_residuals(s, len(known_consts))
    res_consts, known_consts = _split(
        eval_jaxpr(before, known_consts), s.num_res_consts
    )
    return res_consts, known_consts, s


# %% [markdown]
# The rule for jaxprs, which `grad` of a jitted function uses
# ({ref}`Part 4 <part4-pe-jaxprs>`), builds the same two scans as equations. A
# rule returns one known equation, so `before` and the known scan go into one
# `xla_call` (a nested `jit`); the folded cell has it, with a helper that
# copies a jaxpr's equations onto other inputs.


# %% tags=["export", "hide-input"]
# @title The partial_eval_jaxpr rule: the same split, as equations
def _inline_jaxpr(jaxpr: Jaxpr, inputs: list) -> tuple[list[JaxprEqn], list]:
    """The equations of ``jaxpr`` applied to ``inputs`` (with fresh
    variables), and its outputs."""
    env: dict[Var, Any] = dict(zip(jaxpr.in_binders, inputs))

    def read(x: Atom) -> Any:
        return env[x] if isinstance(x, Var) else x

    eqns = []
    for eqn in jaxpr.eqns:
        outs = [Var(v.aval) for v in eqn.out_binders]
        inputs = [read(x) for x in eqn.inputs]
        eqns.append(JaxprEqn(eqn.primitive, inputs, eqn.params, outs))
        env.update(zip(eqn.out_binders, outs))
    return eqns, [read(x) for x in jaxpr.outs]


@scan_p.def_rule("partial_eval_jaxpr")
def _scan_partial_eval_jaxpr(unks_in, eqn):
    params = eqn.params
    num_consts, num_carry = params["num_consts"], params["num_carry"]
    s = split_scan(params["jaxpr"], num_consts, num_carry, unks_in)
    consts, init, xs = _split(eqn.inputs, num_consts, num_carry)
    known_consts, unknown_consts = _split_by(unks_in[:num_consts], consts)
    known_xs, unknown_xs = _split_by(unks_in[num_consts + num_carry :], xs)
    known_init, unknown_init = _split_by(s.carry_unknown, init)
    known_outs, unknown_outs = _split_by(s.out_unknown, eqn.out_binders)
    before, s = hoist_residuals(s, len(known_consts))
    # The known side, in one xla_call: the equations of before, then the loop.
    ins = [Var(x.aval) for x in known_consts + known_init + known_xs]
    ins_consts, ins_loop = _split(ins, len(known_consts))
    before_eqns, before_outs = _inline_jaxpr(before, ins_consts)
    res_consts_in, loop_consts = _split(before_outs, s.num_res_consts)
    row_avals = [x.aval for x in s.known_body.outs[len(known_outs) :]]
    loop_outs = [Var(x.aval) for x in known_outs]
    loop_outs += [Var(_stacked_type(a, params["length"])) for a in row_avals]
    known_params = dict(
        params,
        jaxpr=s.known_body,
        num_consts=len(loop_consts),
        num_carry=len(known_init),
    )
    loop = JaxprEqn(scan_p, [*loop_consts, *ins_loop], known_params, loop_outs)
    inner = Jaxpr(ins, [*before_eqns, loop], [*loop_outs, *res_consts_in])
    res_consts = [Var(x.aval) for x in res_consts_in]
    res_rows = [Var(x.aval) for x in loop_outs[len(known_outs) :]]
    eqn_known = JaxprEqn(
        xla_call_p,
        known_consts + known_init + known_xs,
        dict(jaxpr=inner),
        [*known_outs, *res_rows, *res_consts],
    )
    unknown_params = dict(
        params,
        jaxpr=s.unknown_body,
        num_consts=len(res_consts) + len(unknown_consts),
        num_carry=len(unknown_init),
    )
    staged = [*res_consts, *unknown_consts, *unknown_init, *unknown_xs, *res_rows]
    eqn_unknown = JaxprEqn(scan_p, staged, unknown_params, unknown_outs)
    init_unknown = unks_in[num_consts : num_consts + num_carry]
    instantiated = [  # known initial values of unknown carries that are variables
        x
        for x, u, carry_u in zip(init, init_unknown, s.carry_unknown)
        if carry_u and not u and isinstance(x, Var)
    ]
    return eqn_known, eqn_unknown, s.out_unknown, res_consts + res_rows + instantiated


# %% [markdown]
# Here is the split on the JVP of the RNN loss, three steps long, with the
# primal inputs known and the tangent of `weight` unknown. Both halves are
# printed with one set of names, so a residual has the same name in both.
#
# - The known half is the `xla_call`. Inside it, the loop's body (`q` is
#   `weight`, `r` the old `state`, `s` the row) returns the new state `v`,
#   the square `y`, and three residuals per trip: the old state `r`,
#   $1 - \tanh^2$ `x`, and the new state `v`, stacked into `n`, `o`, `p`,
#   which leave the call as `e`, `f`, `g`. `weight` is a residual too, but
#   the same on every trip: it leaves the call once, as `h`, not as a stack
#   of three copies. (Here `before` has no equations,
#   since `weight` is itself a known constant.)
# - The unknown half's scan takes `h` and the tangent of `weight`, `aa`, as
#   constants, the tangent of the state as its carry, and the stacks `e`,
#   `f`, `g` as rows; its body reads them as `q`, `r`, `x`, `v`. The
#   initial tangent of the state appears as the literal `0.0`: in a jaxpr, a
#   known literal needs no residual. (The tracing rule, which holds a value
#   rather than a literal, makes it a residual: see {ref}`What reverse mode
#   saves <part7-memory>`.) `add ah 0.0` adds the row's zero tangent, as in
#   the JVP above.

# %%
three = ShapedArray((3,), np.float64)
rnn_jvp = make_jaxpr(
    lambda w, xs, t: jvp(lambda w: rnn_loss(w, xs), (w,), (t,)), scalar, three, scalar
)[0]
known, unknown_half, out_unks, num_res = partial_eval_jaxpr(
    rnn_jvp, [False, False, True]
)
names = _Names()
print("known half:")
print(pp_jaxpr(known, names=names))
print("unknown half:")
print(pp_jaxpr(unknown_half, names=names))


# %% [markdown]
# (part7-transpose)=
# ## Transposition: the same loop, backwards
#
# The unknown scan is linear in its unknown inputs: the tangents of the
# constants, the carries, and the tangent rows of `xs`. Its known inputs are
# the residuals, invariant ones among the constants and stacked ones among
# `xs`. Transposing a loop means transposing every trip, in the opposite
# order: the last trip's output cotangents are known first. So the transpose
# of a scan is a scan with `reverse` flipped, whose body is the transposed
# body ({ref}`Part 4 <part4-jit>`'s `transpose_jaxpr`):
#
# - the carry's cotangent is the carry of the new loop: each backward trip
#   turns the cotangent of a trip's output carry into that of its input carry;
# - each trip's `y` cotangent is a row of the new loop's `xs`, next to that
#   trip's residual rows, and the cotangent of each row of `xs` is a `y` of
#   the new loop;
# - the linear constants (here the tangent of `weight`) are used on every trip, so
#   their cotangent is a sum over trips: the new loop carries it as an
#   accumulator that starts at zero and adds each trip's part.
#
# Every carry is treated as linear, even one whose initial value is known. In
# the RNN, the unknown scan's only carry is the tangent of `state`, which
# starts as a known zero (the tangent of the initial 0.5: the literal `0.0` in
# the jaxpr above, a residual under `linearize`); the backward loop computes
# its cotangent anyway, and the rule drops it, since a known input needs none.
#
# The rule relies on the order of `transpose_jaxpr`'s result: the transposed
# body takes its own constants, then the body's known inputs in order (the
# residual constants, then the residual rows), then the cotangents of the
# body's outputs (carries, then ys); it returns the cotangents of the body's
# linear inputs in order (linear constants, carries, linear rows).


# %% tags=["export"]
@scan_p.def_rule("transpose")
def _scan_transpose(cts, *args, jaxpr, num_consts, num_carry, length, reverse):
    consts, init, xs = _split(args, num_consts, num_carry)
    linear = [_is_undef(x) for x in consts] + [True] * num_carry
    linear += [_is_undef(x) for x in xs]
    body_t, body_t_consts = transpose_jaxpr_uncached(jaxpr, tuple(linear))
    res_consts = [x for x in consts if not _is_undef(x)]
    res_xs = [x for x in xs if not _is_undef(x)]
    out_types = [x.aval for x in jaxpr.outs[:num_carry]]
    out_types += [_stacked_type(x.aval, length) for x in jaxpr.outs[num_carry:]]
    cts = [zeros_like_aval(t) if ct is None else ct for ct, t in zip(cts, out_types)]
    ct_carry, ct_ys = _split(cts, num_carry)
    ct_consts = [zeros_like_aval(x.aval) for x in consts if _is_undef(x)]

    def body(carry, row):  # one trip, backwards
        (ct_consts, ct_carry), (res_row, ct_y) = carry, row
        args = [*body_t_consts, *res_consts, *res_row, *ct_carry, *ct_y]
        outs = eval_jaxpr(body_t, args)
        d_consts, ct_carry, ct_row = _split(outs, len(ct_consts), num_carry)
        return ([add(a, d) for a, d in zip(ct_consts, d_consts)], ct_carry), ct_row

    (ct_consts, ct_init), ct_xs = scan(
        body, (ct_consts, ct_carry), (res_xs, ct_ys), length=length, reverse=not reverse
    )
    ct_consts, ct_xs = iter(ct_consts), iter(ct_xs)
    return [
        *[next(ct_consts) if _is_undef(x) else None for x in consts],
        *[ct if _is_undef(x) else None for x, ct in zip(init, ct_init)],
        *[next(ct_xs) if _is_undef(x) else None for x in xs],
    ]


# %% [markdown]
# Unlike `while`, `scan` gets a transpose rule: its trip count is known, so
# partial evaluation could stack each trip's residuals, and the transposed loop
# runs that known number of trips backwards over them. That was the last rule. The gradient of
# the RNN loss with respect to the weight, eagerly, compiled, and through a
# jitted loss, next to JAX's:


# %% tags=["hide-input"]
# @title The same loss in JAX, to compare with
def jax_rnn_loss(weight, xs):
    def step(state, x):
        state = jnp.tanh(state * weight + x)
        return state, state * state

    return jnp.sum(jax.lax.scan(step, 0.5, xs)[1])


# %%
with jax.enable_x64(True):  # float64, as ours, in this cell only
    expected = jax.grad(jax_rnn_loss)(0.8, inputs)
    print("jax:      ", float(expected))
for name, g in [
    ("grad", grad(rnn_loss)),
    ("jit(grad)", jit(grad(rnn_loss))),
    ("grad(jit)", grad(jit(rnn_loss))),
]:
    print(f"{name:10}", float(g(0.8, inputs)), np.isclose(g(0.8, inputs), expected))

# %% [markdown]
# The transposed loop of the linear map, with `reverse=True`: its carry is
# the cotangent of `weight` being summed (`h`) and the cotangent of `state`
# (`i`); its rows are the three stacked residuals and the cotangents of the
# squares. The residuals here are concrete values, so `make_jaxpr` shows the
# stacks as the constants `a`, `b`, `c` and inlines the scalar `weight` as
# the literal `0.8`; that is why the loop has `num_consts=0`.

# %%
_, lin_jaxpr, res = linearize_flat(
    lambda w: [rnn_loss(w, inputs[:3])], [np.float64(0.8)]
)
backward = lambda ct: backward_pass(lin_jaxpr, [*res, UndefPrimal(scalar)], [ct])
print(make_jaxpr(backward, scalar)[0])

# %% [markdown]
# ## Everything composes
#
# The rules call `scan`, `eval_jaxpr`, `jvp_flat` and `run_batched`, so they
# stack in any order. Per-example gradients through the loop, one weight per
# example and one sequence per example, against JAX:

# %%
weights = np.array([0.3, 0.8, 1.5])
sequences = np.sin(np.arange(60.0)).reshape(3, 20)
per_example = jit(vmap(grad(rnn_loss)))(weights, sequences)
with jax.enable_x64(True):
    jax_per_example = jax.vmap(jax.grad(jax_rnn_loss))(weights, sequences)
print(per_example, np.allclose(per_example, jax_per_example))

# %% [markdown]
# Second derivatives differentiate the transposed scan, itself a scan:

# %%
second = grad(grad(rnn_loss))(0.8, inputs)
with jax.enable_x64(True):
    jax_second = jax.grad(jax.grad(jax_rnn_loss))(0.8, inputs)
print(float(second), float(jax_second), np.isclose(second, jax_second))


# %% [markdown]
# (part7-memory)=
# ## What reverse mode saves
#
# Forward mode carries a tangent alongside the primal and forgets each trip as
# soon as it is done. Reverse mode cannot: the backward loop needs each trip's
# residuals, so the known loop keeps them all. How much is that? The residuals
# that `linearize` keeps are the inputs of the linear jaxpr before the
# tangents, and their types say their sizes. For an RNN of 10,000 steps with a
# hidden state of 64 numbers and a $64 \times 64$ weight matrix:


# %%
def rnn_matrix_loss(W, xs):
    def step(h, x):
        h = tanh(W @ h + x)
        return h, reduce_sum(h * h, 0)

    return reduce_sum(scan(step, np.zeros(64), xs)[1], 0)


rng = np.random.default_rng(1)
W0, seq = rng.normal(size=(64, 64)) * 0.1, rng.normal(size=(10_000, 64))
_, lin_jaxpr, residuals = linearize_flat(lambda W: [rnn_matrix_loss(W, seq)], [W0])
for r in residuals:
    aval = get_aval(r)
    print(f"{aval.str_short():22} {aval.size * aval.dtype.itemsize / 1e6:8.3f} MB")
total = sum(np.asarray(r).nbytes for r in residuals)
print(f"total {total / 1e6:.1f} MB; the inputs xs are {seq.nbytes / 1e6:.1f} MB")


# %% [markdown]
# The weight matrix is saved once, hoisted out of the loop. The two vectors
# are zeros, which our JVP, having no symbolic zeros, keeps as values. The
# first is the tangent of the initial state, the known initial value of an
# unknown carry that `instantiate_const` made a residual. The second is the tangent of a
# row, which the JVP body makes as zeros of a row's shape on every trip; it is
# the same on every trip, so it is hoisted, and one vector of 64 numbers
# stands for all 10,000 rows. The three stacks have one row per trip: the
# state before the trip, $1 - \tanh^2$, and the state after it, 5.12 MB each,
# as big as the inputs; together, three times their size. Memory grows
# linearly with the trip count; that is the price of reverse mode through a
# loop. The usual remedy, recomputing instead of
# saving, is described under {ref}`Where real JAX differs <part7-jax>`.
#
# ## `fori_loop`, now with reverse mode
#
# Part 6 made `fori_loop` a `while_loop` and promised better for bounds that
# are Python ints. Then the trip count is known while tracing, and the loop is
# a scan over no `xs`, whose carry holds the index. A traced bound still makes
# a `while_loop`.


# %% tags=["export"]
def fori_loop(lower: Any, upper: Any, body_fun: Callable, init_val: Any) -> Any:
    """``val = body_fun(i, val)`` for ``i`` from ``lower`` up to ``upper``."""
    static = all(type(b) is int for b in (lower, upper))  # Python ints
    lower, upper = check_loop_bounds(lower, upper)

    def step(carry):
        i, val = carry
        return i + 1, body_fun(i, val)

    if static:  # the trip count is known now: a scan, which has reverse mode
        trips = max(int(upper) - int(lower), 0)
        carry, _ = scan(lambda c, _: (step(c), None), (lower, init_val), None, trips)
        return carry[1]
    return while_loop(lambda carry: carry[0] < upper, step, (lower, init_val))[1]


# %% [markdown]
# The example Part 6 had to refuse, $x \cdot x^3 = x^4$ by three
# multiplications, now has a gradient, $4x^3$:

# %%
power = lambda x: fori_loop(0, 3, lambda i, c: c * x, x)
print(grad(power)(1.5), jit(grad(power))(1.5), 4 * 1.5**3)
print(make_jaxpr(power, scalar)[0])

# %% [markdown]
# ## Mistakes `scan` catches
#
# The checks of the wrapper run while tracing; the folded cell shows their
# messages for each mistake.

# %% tags=["hide-input"]
# @title Errors: the messages of scan's checks
keep = lambda c, x: (c, x)
show_error(scan, keep, 0.0, (np.ones(3), np.ones(4)))  # two lengths
show_error(scan, keep, 0.0, np.ones(3), 4)  # length disagrees with xs
show_error(scan, keep, 0.0, None)  # no xs, no length
show_error(scan, lambda c, x: (c * np.ones(2), x), 0.0, np.ones(3))  # new carry type
show_error(scan, lambda c, x: c + x, 0.0, np.ones(3))  # not a pair
show_error(scan, lambda c, x: (c > 0.0, x), 0.0, np.ones(3))  # carry changes dtype

# %% [markdown]
# (part7-jax)=
# ## Where real JAX differs
#
# The folded cell prints the linear map that JAX 0.10.2's `jax.linearize`
# returns for the RNN loss, three steps long, as a jaxpr: its constants `a`,
# `b`, `c` are the residuals, and `d` is the tangent of `weight`.

# %% tags=["hide-input"]
# @title JAX's linear map of the RNN loss, from jax.linearize
with jax.enable_x64(True):  # float64, as ours, in this cell only
    _, jax_linear = jax.linearize(lambda w: jax_rnn_loss(w, inputs[:3]), 0.8)
    print(jax.make_jaxpr(jax_linear)(1.0).pretty_print(use_color=False))


# %% [markdown]
# - JAX's `scan` primitive has our parameters (`jaxpr`, `length`,
#   `num_consts`, `num_carry`, `reverse`) plus `unroll`. Its linear loop above
#   reads the same kind of stacked residuals as ours, one row per trip (`a`,
#   `b`, `c`: the old state, the new one, and one minus the new one, a factor of
#   the derivative of `tanh`), and `weight` is a constant of the loop
#   (the literal `0.8`), not a stack. In the gradient, the transposed loop has
#   `reverse=True`, and its carry holds the cotangent of `weight` being summed
#   next to that of the state, as in our transpose rule.
# - **Hoisting.** JAX hoists loop-invariant residuals the same way we do: it
#   partially evaluates the known body once more with the carries and rows
#   unknown (`_scan_known_hoisting` in `jax/_src/lax/control_flow/loops.py`,
#   and the same idea in `_scan_partial_eval_custom`). It also *forwards*:
#   a residual that is just an input of the body (a row of `xs`, a constant)
#   is not copied into a stacked output but taken from the input directly,
#   which our split does not do.
# - **Linearize in one step.** JAX's reverse mode does not run the JVP scan
#   and then split it: `scan` has a linearize rule (`_scan_linearize`) that
#   produces the primal loop with its residuals and the linear loop at once,
#   with its own fixed point over which carries have non-zero tangents. Its
#   tangents can be symbolic zeros: a carry whose tangent stays zero on every
#   trip is dropped from the linear loop, and no zero is saved as a residual;
#   a carry whose tangent becomes non-zero starts from an instantiated zero
#   (the `0.0` above).
# - **Transposition.** JAX's rule (`_scan_transpose_fancy` in this release)
#   also sorts the inputs into invariant residuals, linear constants, linear
#   carries, linear rows and stacked residuals, and accumulates the constants'
#   cotangents in the backward carry.
# - **Trading memory for time.** The memory above grows with the trip count.
#   [`jax.checkpoint`](https://docs.jax.dev/en/latest/gradient-checkpointing.html)
#   (also called `remat`) applied to the body makes the known loop save only
#   the body's inputs (or what a policy allows), and the backward loop
#   recomputes the rest of each trip from them. Nesting scans and
#   checkpointing the outer body gives memory that grows with the square root
#   of the trip count. {ref}`Part 11 <part11>` builds `checkpoint`.
# - [`unroll`](https://docs.jax.dev/en/latest/_autosummary/jax.lax.scan.html)
#   copies the body several times into one trip of the `stablehlo.while`,
#   which gives XLA more straight-line code to optimize and fewer loop
#   iterations; `unroll=True` removes the loop altogether.
#
# ## Summary
#
# - `scan(f, init, xs)` is a primitive carrying one body jaxpr, with the
#   counts of constants and carries, the trip count `length` and the direction
#   `reverse`. A trip count known while tracing is what distinguishes it from
#   `while_loop`.
# - Evaluation and lowering walk along the rows of `xs`: the lowering is a
#   `stablehlo.while` with a counter, which reads rows with `dynamic_slice`
#   and writes the stacked `ys` with `dynamic_update_slice`.
# - `jvp` and `vmap` transform the body and find, by a fixed point, which
#   carries they touch; rows of `xs` count like constants in that search.
# - Partial evaluation splits the body into a known loop and an unknown loop;
#   the known loop runs now and saves its residuals as extra stacked `ys`,
#   which the unknown loop reads back as extra `xs`. As an optional memory
#   saving, residuals that depend only on known constants are computed once,
#   outside the loop. Transposition is a scan in the other direction over the
#   transposed body, summing the cotangents of the constants in its carry.
# - Together they give `grad` through loops, under `jit` and `vmap`, and to
#   second order, and `fori_loop` with Python-int bounds becomes a scan that has them
#   too. The price is memory: one row of residuals per trip.
#
# ## Exercises
#
# **1. A polynomial by Horner's rule.** Evaluate $p(x) = \sum_k c_k x^{n-k}$
# with a scan over the coefficients `c` (highest power first) whose carry is
# the value so far. Check `grad` with respect to `x` and with respect to `c`
# against NumPy's `polyder` and the powers of `x`.


# %% tags=["hide-input"]
# @title A solution
def horner(x, coeffs):
    return scan(lambda acc, c: (acc * x + c, None), 0.0, coeffs)[0]


coeffs, x0 = np.array([2.0, -1.0, 0.5, 3.0]), 1.3
print(horner(x0, coeffs), np.polyval(coeffs, x0))
print(grad(horner)(x0, coeffs), np.polyval(np.polyder(coeffs), x0))
# d p / d c_k = x^(n-k): the powers of x, highest first.
print(grad(lambda c: horner(x0, c))(coeffs), x0 ** np.arange(3, -1, -1))


# %% [markdown]
# **2. A reverse scan and its gradient.** With `reverse=True`, compute the
# discounted returns of reinforcement learning,
# $G_t = r_t + \gamma G_{t+1}$, for a sequence of rewards. Check them against
# a Python loop, and check that the gradient of $\sum_t G_t$ with respect to
# the rewards is $\sum_{s \le t} \gamma^{t-s}$. Which direction does the
# transposed scan run?


# %% tags=["hide-input"]
# @title A solution
def returns(rewards, gamma=0.9):
    return scan(
        lambda g, r: (r + gamma * g, r + gamma * g), 0.0, rewards, reverse=True
    )[1]


rewards = np.array([1.0, 0.0, 2.0, 0.5])
expected, g = [], 0.0
for r in rewards[::-1]:
    g = r + 0.9 * g
    expected.insert(0, g)
print(returns(rewards), np.array(expected))
print(grad(lambda r: reduce_sum(returns(r), 0))(rewards))
print(np.array([sum(0.9 ** (t - s) for s in range(t + 1)) for t in range(4)]))
# The transposed scan runs forwards: in a backward loop the first reward's
# cotangent is complete last, in a forward one first.
vjp_jaxpr = make_jaxpr(
    lambda r, ct: vjp(lambda r: reduce_sum(returns(r), 0), r)[1](ct), rewards, scalar
)[0]
print(
    "reverse:", [e.params["reverse"] for e in vjp_jaxpr.eqns if e.primitive is scan_p]
)


# %% [markdown]
# **3. What is hoisted.** Change the RNN's body so that it uses
# `cos(weight)` as well as `weight`: `tanh(state * cos(weight) + x)`. How many residuals does `linearize`
# keep for 1,000 steps, which are stacked and which are not? Does the linear
# loop compute anything on every trip that is the same on every trip?


# %% tags=["hide-input"]
# @title A solution
def cos_rnn_loss(weight, xs):
    def step(state, x):
        state = tanh(state * cos(weight) + x)
        return state, state * state

    return reduce_sum(scan(step, 0.5, xs)[1], 0)


inputs_1000 = np.sin(np.arange(1000.0))
_, _, residuals = linearize_flat(
    lambda w: [cos_rnn_loss(w, inputs_1000)], [np.float64(0.8)]
)
print("residuals:", [get_aval(r).str_short() for r in residuals])
# The scalars are sin(weight) and cos(weight), computed once before the loop,
# and the zero tangent of the initial state. The stacked ones are per trip:
# the old state, 1 - tanh^2 and the new state. The linear loop reads
# cos(weight) as a constant; it does recompute sin(weight) * (its tangent) on
# every trip, since that product involves the tangent, which is unknown.
print("sin(0.8):", residuals[0], np.sin(0.8))
print("cos(0.8):", residuals[1], np.cos(0.8))
