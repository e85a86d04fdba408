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
# (analysis)=
# # Interpreters that read programs: costs and `debug.print`
#
# :::{admonition} Where we are
# :class: note
# Every interpreter so far turned a program into values: evaluation computes
# them, `jvp` and `vmap` compute more of them, lowering hands them to XLA. This
# chapter writes two interpreters with other purposes. The first reads a jaxpr
# and adds up what it *costs*, without running it. The second gives a compiled
# program a way to print.
# :::
#
# A jaxpr is data: a list of equations, each naming a primitive, its inputs'
# types and its parameters. An interpreter that walks those equations does not
# have to compute anything. Give each primitive a **cost rule** (how many
# floating-point operations it does, how many transcendental functions it
# evaluates, how many bytes it reads and writes) and the walk adds up what the
# whole program costs. A 20000×20000 matrix product is counted as fast as a 2×2
# one, because only the types are read. Control flow is the one exception: a
# loop's trip count or a `cond`'s predicate may depend on values, and when the
# arguments make them knowable, the interpreter evaluates just the equations
# they depend on (and says so with an error when it cannot).
#
# The second half of the chapter goes the other way: `debug.print` is a
# primitive that every interpreter must carry along, so that a compiled program
# can still talk back to Python.
#
# The counting interpreter is the FLOPS transformation of mini-JAX, one of the
# systems this book grew from, and it makes a claim of reverse-mode autodiff
# measurable: a gradient costs a small constant times the function itself. The
# idea to take away: **the same jaxpr, read by a different interpreter, gives a
# different kind of answer.**

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

book_setup.load_book(globals(), before="analysis")

# %% [markdown]
# ## A cost for every equation
#
# Here is one layer of a neural network and its jaxpr, traced at types only:

# %%
anp = numpy_namespace  # outside the book: import autodidax.numpy as anp


def layer(w, b, x):
    return anp.tanh(x @ w + b)


w, b, x = (
    ShapedArray((16, 32), np.float64),
    ShapedArray((32,), np.float64),
    ShapedArray((8, 16), np.float64),
)
print(make_jaxpr(layer, w, b, x)[0])


# %% [markdown]
# Reading it for its cost: the product does 8·32 dot products of length 16, a
# multiply and an add each, so 2·8·32·16 = 8192 operations; the `broadcast`
# only moves data; the `add` does one operation per element (256); `tanh` is
# one transcendental per element. A `Cost` holds the three numbers XLA reports,
# and adds up:


# %% tags=["export"]
@dataclass(frozen=True)
class Cost:
    """What running some code costs, in the units of XLA's cost analysis."""

    flops: int = 0  # arithmetic operations (a multiply-add counts 2)
    transcendentals: int = 0  # sin, exp, log, tanh, ... (one per element)
    bytes_accessed: int = 0  # bytes read and written by the operations

    def __add__(self, other: Cost) -> Cost:
        return Cost(*(a + b for a, b in zip(astuple(self), astuple(other))))

    def __mul__(self, times: int) -> Cost:  # a loop body run `times` times
        return Cost(*(a * times for a in astuple(self)))

    __rmul__ = __mul__

    def as_dict(self) -> dict[str, float]:
        """XLA's key names and number type."""
        keys = ("flops", "transcendentals", "bytes accessed")
        return {key: float(n) for key, n in zip(keys, astuple(self))}


# %% [markdown]
# The interpreter walks the equations and asks each primitive's `cost` rule,
# registered with `def_rule` like every other kind of rule. A rule gets the
# equation's types, its parameters, and a context `ctx` that a few rules need:
# `ctx.known(i)` is the value of input `i` when it can be known before running
# (a loop's trip count, a `cond`'s predicate), `None` otherwise, and
# `ctx.cost(jaxpr, inputs)` counts a jaxpr inside the equation.


# %% tags=["export"]
def jaxpr_cost(jaxpr: Jaxpr, inputs: list[Callable], axis_sizes=None) -> Cost:
    """What running ``jaxpr`` costs. ``inputs[i]()`` is input i's value, or
    None when only its type is known."""
    known = KnownValues(jaxpr, inputs)
    total = Cost()
    for eqn in jaxpr.eqns:
        ctx = CostContext(
            [functools.partial(known, x) for x in eqn.inputs], axis_sizes or {}
        )
        avals_in = [x.aval for x in eqn.inputs]
        avals_out = [v.aval for v in eqn.out_binders]
        total += eqn.primitive.rule("cost")(ctx, avals_in, avals_out, **eqn.params)
    return total


def cost_analysis(f: Callable, *args: Any) -> dict[str, float]:
    """What ``f(*args)`` costs; each argument an array or a ShapedArray."""
    jaxpr, consts, _ = make_jaxpr(f, *args)
    inputs = [given(c) for c in consts] + [given(x) for x in tree_leaves(args)]
    return jaxpr_cost(jaxpr, inputs).as_dict()


def given(x: Any) -> Callable[[], Any]:
    """An input's value on demand: None for a ShapedArray (a type, no value)."""
    return lambda: None if isinstance(x, ShapedArray) else x


# %% [markdown]
# The context, and the values it can know, are in the folded cell. A value is
# known when it follows from known inputs; it is computed only when a rule asks
# for it, so a program whose cost does not depend on its data runs nothing.

# %% tags=["export", "hide-input"]
# @title CostContext, and KnownValues: values computed only when a rule asks
from dataclasses import astuple


class CostContext(NamedTuple):
    inputs: list[Callable[[], Any]]  # each input's value on demand, or None
    axis_sizes: dict  # the named axes of an enclosing pmap: name -> size

    def known(self, i: int) -> Any:
        """Input ``i``'s value if it follows from known inputs, else None."""
        return self.inputs[i]()

    def cost(self, jaxpr: Jaxpr, inputs: list[Callable], more_axes=None) -> Cost:
        return jaxpr_cost(jaxpr, inputs, {**self.axis_sizes, **(more_axes or {})})


UNKNOWN = given(ShapedArray((), np.float64))  # an input known by its type only


class KnownValues:
    """The values of a jaxpr's variables that follow from its known inputs,
    each computed (with ``bind``) the first time it is asked for."""

    def __init__(self, jaxpr: Jaxpr, inputs: list[Callable]) -> None:
        self.inputs = dict(zip(jaxpr.in_binders, inputs))
        self.made_by = {v: eqn for eqn in jaxpr.eqns for v in eqn.out_binders}
        self.values: dict[Var, Any] = {}

    def __call__(self, atom: Atom) -> Any:
        if isinstance(atom, Lit):
            return atom.val
        if atom not in self.values:
            for var in toposort([atom], self._parents):  # parents first, no recursion
                if var not in self.values:
                    self._compute(var)
        return self.values[atom]

    def _parents(self, var: Var) -> list[Var]:
        eqn = None if var in self.values else self.made_by.get(var)
        return [x for x in eqn.inputs if isinstance(x, Var)] if eqn else []

    def _compute(self, var: Var) -> None:
        if var in self.inputs:
            self.values[var] = self.inputs[var]()
            return
        eqn = self.made_by[var]
        ins = [self(x) for x in eqn.inputs]
        if any(v is None for v in ins):
            outs = [None] * len(eqn.out_binders)
        else:
            outs = bind(eqn.primitive, *ins, **eqn.params)
            outs = outs if eqn.primitive.multiple_results else [outs]
        self.values.update(zip(eqn.out_binders, outs))


# %% [markdown]
# Now the rules. Most primitives cost a fixed amount per output element:
# arithmetic and comparisons one operation, `sin`, `exp`, `tanh` and the other
# transcendental functions one transcendental, and `transpose`, `broadcast` and
# `reshape` nothing but the bytes they move. Every rule counts as bytes accessed
# what its operation reads and writes: its inputs and its output.


# %% tags=["export"]
def io_bytes(avals_in: list[ShapedArray], avals_out: list[ShapedArray]) -> int:
    return sum(a.size * a.dtype.itemsize for a in [*avals_in, *avals_out])


def per_element_cost(prim: Primitive, flops=1, transcendentals=0) -> None:
    @prim.def_rule("cost")
    def rule(ctx, avals_in, avals_out, **params):
        n = avals_out[0].size
        return Cost(flops * n, transcendentals * n, io_bytes(avals_in, avals_out))


for prim in [add_p, sub_p, mul_p, div_p, neg_p, max_p, select_p]:
    per_element_cost(prim)
for prim in [sin_p, cos_p, exp_p, log_p, tanh_p, sqrt_p, rsqrt_p, erf_p]:
    per_element_cost(prim, flops=0, transcendentals=1)
for prim in [transpose_p, broadcast_p, reshape_p]:
    per_element_cost(prim, flops=0)


@dot_general_p.def_rule("cost")
def _dot_general_cost(ctx, avals_in, avals_out, *, dimension_numbers):
    (x, _), (out,) = avals_in, avals_out
    (x_contract, _), _ = dimension_numbers
    length = math.prod(x.shape[i] for i in x_contract)  # of each dot product
    return Cost(2 * out.size * length, 0, io_bytes(avals_in, avals_out))


# %% [markdown]
# The folded cell gives the remaining first-order primitives their rules: the
# comparisons and `convert_element_type` (one operation per element, as XLA
# counts them), `integer_pow` (the multiplications of its lowering), the
# reductions (one operation per element that disappears), the two identities
# `stop_gradient` and `keep_gradient` (nothing: they vanish in compiled code),
# {ref}`Part 9 <part9>`'s collectives, and the indexing primitives (the bytes
# they move; the combining scatters also one operation per update).

# %% tags=["export", "hide-input"]
# @title Cost rules: comparisons, convert, powers, reductions, collectives, indexing
for prim in [gt_p, lt_p, eq_p, ne_p, le_p, ge_p, convert_element_type_p]:
    per_element_cost(prim)


@integer_pow_p.def_rule("cost")
def _integer_pow_cost(ctx, avals_in, avals_out, *, y):
    # the lowering squares once per binary digit after the first, multiplies
    # once per further digit that is set, and divides once for y < 0
    n = abs(y)
    per_element = max(n.bit_length() - 1, 0) + max(n.bit_count() - 1, 0) + (y < 0)
    return Cost(per_element * avals_out[0].size, 0, io_bytes(avals_in, avals_out))


@pow_p.def_rule("cost")
def _pow_cost(ctx, avals_in, avals_out):
    # one transcendental per element, and one conversion if the exponent is
    # an integer array (the lowering converts it to the base's dtype)
    (x, y), (out,) = avals_in, avals_out
    flops = out.size if y.dtype != x.dtype else 0
    return Cost(flops, out.size, io_bytes(avals_in, avals_out))


def reduction_cost(prim: Primitive) -> None:
    @prim.def_rule("cost")
    def rule(ctx, avals_in, avals_out, *, axes):
        (x,), (out,) = avals_in, avals_out
        init = x.dtype.itemsize  # the lowering's starting value is read too
        return Cost(max(x.size - out.size, 0), 0, io_bytes(avals_in, avals_out) + init)


reduction_cost(reduce_sum_p)
reduction_cost(reduce_max_p)


def free_cost(prim: Primitive) -> None:
    """A primitive that compiles to nothing (an identity) costs nothing."""
    prim.def_rule("cost")(lambda ctx, avals_in, avals_out, **params: Cost())


free_cost(stop_gradient_p)
free_cost(keep_gradient_p)
free_cost(axis_index_p)

# The indexing chapter's primitives move data: they cost the bytes they read
# and write, and scatter-add (-mul, -min, -max) one operation per element of
# its updates.
for prim in [slice_p, pad_p, dynamic_slice_p, dynamic_update_slice_p]:
    per_element_cost(prim, flops=0)
for prim in [gather_p, scatter_p]:
    per_element_cost(prim, flops=0)


def _scatter_combine_cost(ctx, avals_in, avals_out, **params):
    updates = avals_in[1]
    return Cost(updates.size, 0, io_bytes(avals_in, avals_out))


for prim in [scatter_add_p, scatter_mul_p, scatter_min_p, scatter_max_p]:
    prim.def_rule("cost")(_scatter_combine_cost)


def all_reduce_cost(prim: Primitive) -> None:
    """Each member combines the values of all n members: n - 1 operations
    per element, on every member."""

    @prim.def_rule("cost")
    def rule(ctx, avals_in, avals_out, *, axis_name):
        if axis_name not in ctx.axis_sizes:
            raise unbound_axis_error(axis_name, f"cost_analysis of {prim.name}")
        n = ctx.axis_sizes[axis_name]
        return Cost((n - 1) * avals_out[0].size, 0, io_bytes(avals_in, avals_out))


all_reduce_cost(psum_p)
all_reduce_cost(pmax_p)
per_element_cost(all_gather_p, flops=0)

# custom_lin cannot run forwards (Part 8), so it has no cost to count either
_ = custom_lin_p.def_rule("cost")(forward_mode_error)

# %% [markdown]
# Here is the layer, at the types of a batch of 8, then at types far too large
# to fit in memory: nothing is allocated, so the second count is as fast as the
# first.

# %%
print(cost_analysis(layer, w, b, x))
big = ShapedArray((20000, 20000), np.float64)
print(cost_analysis(lambda a, b: a @ b, big, big))


# %% [markdown]
# ## Programs inside programs
#
# The primitives that carry jaxprs cost what their jaxprs cost. A `jit` call
# costs its body; a `scan` costs its body times its length, counted once at the
# types of a trip (the carry changes from trip to trip, so its value is not
# known):


# %% tags=["export"]
@xla_call_p.def_rule("cost")
def _xla_call_cost(ctx, avals_in, avals_out, *, jaxpr):
    return ctx.cost(jaxpr, ctx.inputs)


@scan_p.def_rule("cost")
def _scan_cost(ctx, avals_in, avals_out, *, jaxpr, num_consts, length, **params):
    changing = [UNKNOWN] * (len(avals_in) - num_consts)  # carry and rows
    return length * ctx.cost(jaxpr, ctx.inputs[:num_consts] + changing)


# %% [markdown]
# A `cond` costs the branch it takes, when its predicate can be known before
# running; otherwise the dearer branch, key by key (the same choice XLA makes,
# below). A `while_loop`'s trip count is known only by running it, so the rule
# runs the loop, trip by trip, computing only what its condition needs (a
# counter, say, but not the rest of the carry) and adding up each trip's cost;
# when the condition depends on a value known only by its type, it says so. (`fori_loop` with Python `int` bounds is a `scan`, whose
# length is a parameter: it is counted without running anything.)


# %% tags=["export"]
@cond_p.def_rule("cost")
def _cond_cost(ctx, avals_in, avals_out, *, true_jaxpr, false_jaxpr):
    pred, operands = ctx.known(0), ctx.inputs[1:]
    if pred is None:  # decided at run time: count the dearer branch
        return most(ctx.cost(true_jaxpr, operands), ctx.cost(false_jaxpr, operands))
    return ctx.cost(true_jaxpr if pred else false_jaxpr, operands)


@while_p.def_rule("cost")
def _while_cost(ctx, avals_in, avals_out, **params):
    cond_jaxpr, body_jaxpr = params["cond_jaxpr"], params["body_jaxpr"]
    cond_consts, body_consts, carry = _split(
        ctx.inputs, params["cond_nconsts"], params["body_nconsts"]
    )
    total = Cost()
    while True:  # run the loop, as much of it as the condition needs
        total += ctx.cost(cond_jaxpr, cond_consts + carry)
        if not known_condition(cond_jaxpr, cond_consts + carry, avals_in):
            return total
        total += ctx.cost(body_jaxpr, body_consts + carry)
        carry = values_on_demand(body_jaxpr, body_consts + carry)


# %% [markdown]
# The custom-rule calls of {ref}`Part 8 <part8>` cost their function (the rule
# runs only under differentiation, where it has been traced into the jaxpr),
# and a `pmap` costs its body on every device (folded).


# %% tags=["export", "hide-input"]
# @title Cost rules: custom calls, pmap; helpers: most, running a loop's condition
def _custom_call_cost(ctx, avals_in, avals_out, *, call_jaxpr, **params):
    return ctx.cost(call_jaxpr, ctx.inputs)


custom_jvp_call_p.def_rule("cost")(_custom_call_cost)
custom_vjp_call_p.def_rule("cost")(_custom_call_cost)


@pmap_p.def_rule("cost")
def _pmap_cost(ctx, avals_in, avals_out, *, jaxpr, axis_name, axis_size):
    # every device runs the body on its own row: counted at types, n times
    rows = [UNKNOWN] * len(avals_in)
    return axis_size * ctx.cost(jaxpr, rows, {axis_name: axis_size})


def most(a: Cost, b: Cost) -> Cost:
    """The larger of two costs, key by key."""
    return Cost(*(max(x, y) for x, y in zip(astuple(a), astuple(b))))


class UnknownTripCountError(ValueError):
    """cost_analysis met a while_loop whose trip count depends on values it
    does not know (arguments given as ShapedArrays)."""


def values_on_demand(jaxpr: Jaxpr, inputs: list[Callable]) -> list[Callable]:
    """The outputs of ``jaxpr``, each computed when first asked for."""
    known = KnownValues(jaxpr, inputs)
    return [functools.partial(known, out) for out in jaxpr.outs]


def known_condition(cond_jaxpr: Jaxpr, inputs: list[Callable], avals: list) -> bool:
    """The loop condition's value on this trip; an error if it is unknown."""
    (pred,) = values_on_demand(cond_jaxpr, inputs)
    if pred() is not None:
        return bool(pred())
    raise UnknownTripCountError(
        "cost_analysis: cannot count a while_loop whose trip count depends on "
        "values known only by their types (the loop's inputs are "
        f"{', '.join(a.str_short() for a in avals)}): pass arrays instead of "
        "ShapedArrays for the arguments the condition depends on, or write the "
        "loop as fori_loop with Python int bounds or as scan, whose trip count "
        "is in the program"
    )


# %% [markdown]
# A scan of 100 steps costs 100 times its body, and under `jit` nothing
# changes. A `cond` costs its dearer branch when its predicate depends on an
# argument given by type, and the branch it takes when the argument is an
# array:


# %%
def step(carry, x):
    return anp.sin(carry) * x, carry


def run(xs):
    return scan(step, np.zeros(3), xs)[0]


rows = ShapedArray((100, 3), np.float64)
print(cost_analysis(lambda x: step(x, x)[0], ShapedArray((3,), np.float64)))
print(cost_analysis(jit(run), rows))


def pick(x):
    return cond(reduce_sum(x) > 0.0, anp.sin, lambda x: x * x, x)


print(cost_analysis(pick, ShapedArray((3,), np.float64)))  # either branch
print(cost_analysis(pick, np.ones(3)))  # 3 sines; the predicate: 2 adds, 1 compare


# %% [markdown]
# A `while_loop` can be counted only when its trip count can be known:


# %%
def halve_until_small(x):
    return while_loop(lambda v: reduce_sum(v) > 1.0, lambda v: v * 0.5, x)


print(cost_analysis(halve_until_small, np.full(4, 3.0)))
show_error(lambda: cost_analysis(halve_until_small, ShapedArray((4,), np.float64)))


# %% [markdown]
# Each of the 4 trips that run costs 4 multiplications and a sum of 4 elements
# (3 additions) and a comparison; the condition is evaluated a fifth time,
# when it says stop. A `fori_loop` whose bound is an argument is a
# `while_loop` too, but its condition reads only the counter and the bound, so
# the rest of its carry may be given by type: here 5 trips of 3
# multiplications, the counter's increment and its comparison, and a sixth
# comparison.


# %%
def double_n_times(n, x):
    return fori_loop(0, n, lambda i, v: v * 2.0, x)


print(cost_analysis(double_n_times, 5, ShapedArray((3,), np.float64)))

# %% [markdown]
# (analysis-xla)=
# ## Checked against XLA
#
# XLA has its own cost analysis, over its optimized program, and JAX shows it:
# `jax.jit(f).lower(*args).compile().cost_analysis()` returns a dict with
# these three keys among others. The folded cell writes a few loop-free programs twice, with
# `autodidax` and with `jax.numpy`, and prints both counts side by side; JAX's
# `Lowered.cost_analysis()` adds XLA's count of the program before XLA
# optimizes it.

# %% tags=["hide-input"]
# @title The same programs in autodidax and JAX, counted by both
import jax
import jax.numpy as jnp
from figures import cost_comparison_table

rng = np.random.default_rng(0)
m34, m45, v100 = rng.normal(size=(3, 4)), rng.normal(size=(4, 5)), rng.normal(size=100)
w1, b1, x8 = rng.normal(size=(16, 32)), rng.normal(size=32), rng.normal(size=(8, 16))
stack_a, stack_b = rng.normal(size=(4, 3, 5)), rng.normal(size=(4, 5, 2))
positive = rng.uniform(0.5, 2.0, size=(6, 7))


def softmax(np_, x):
    e = np_.exp(x - np_.max(x, axis=1, keepdims=True))
    return e / np_.sum(e, axis=1, keepdims=True)


PROGRAMS = [  # name, ours, JAX's, arguments
    ("product 3×4 @ 4×5", lambda a, b: a @ b, lambda a, b: a @ b, (m34, m45)),
    (
        "layer tanh(x @ w + b)",
        lambda w, b, x: layer(w, b, x),
        lambda w, b, x: jnp.tanh(x @ w + b),
        (w1, b1, x8),
    ),
    (
        "sin(x) * 2 + x",
        lambda x: anp.sin(x) * 2.0 + x,
        lambda x: jnp.sin(x) * 2.0 + x,
        (v100,),
    ),
    (
        "sums and maxima",
        lambda x: anp.sum(x, axis=0) + anp.max(x, axis=0),
        lambda x: x.sum(axis=0) + x.max(axis=0),
        (positive,),
    ),
    (
        "softmax over rows",
        lambda x: softmax(anp, x),
        lambda x: softmax(jnp, x),
        (positive,),
    ),
    (
        "x**3 + x**-2 + log x",
        lambda x: x**3 + x**-2 + anp.log(x),
        lambda x: x**3 + x**-2 + jnp.log(x),
        (positive,),
    ),
    (
        "vmap of a product",
        vmap(lambda a, b: a @ b),
        jax.vmap(lambda a, b: a @ b),
        (stack_a, stack_b),
    ),
    ("dot of two vectors", lambda u: u @ u, lambda u: u @ u, (v100,)),
]


def xla_costs(f, *args):
    lowered = jax.jit(f).lower(*args)
    return lowered.compile().cost_analysis(), lowered.cost_analysis()


with jax.enable_x64(True):
    comparison = [
        (name, cost_analysis(ours, *args), *xla_costs(theirs, *args))
        for name, ours, theirs, args in PROGRAMS
    ]
cost_comparison_table(comparison)


# %% [markdown]
# Before XLA optimizes, every count of operations agrees with ours. After,
# most still do; where they part, XLA's optimizer changed the program (the
# folded cell above prints nothing else, but `jax.jit(f).lower(*args).compile().as_text()`
# shows the optimized program):
#
# - **Softmax**: dividing 42 elements by their row's sum became 6 reciprocals
#   (one per row) and 42 multiplications: 6 operations more.
# - **Powers**: `x**3` and `x**-2` both start with `x * x`; XLA computes it
#   once for both (common-subexpression elimination): 42 operations fewer.
# - **A dot of two vectors**: ours counts 2·100 for a product of length 100.
#   XLA's CPU compiler rewrote it as an elementwise multiply (100) and a sum in
#   two stages: sums over 4 windows of 32, the input padded to 128 elements
#   (4·31 = 124 additions), then a sum of the 4 partial sums (3), which makes 227.
# - **Bytes accessed.** We count what each equation reads and writes, as if
#   every intermediate went to memory; so does XLA before optimizing, which
#   agrees with ours where JAX's program has the same operations. After
#   optimizing, XLA *fuses* chains of elementwise operations into one loop
#   that keeps its intermediates in registers, and counts only what each fused
#   loop reads and writes.
# - **Zeros.** XLA leaves a key out when its count is zero (`transcendentals`
#   for a product); ours always returns all three.
#
# Two more differences appear only in programs with control flow. XLA counts
# a loop's body **once**, whatever its trip count, because it analyses the
# program's text, not its run; and for a conditional it takes each key's
# maximum over the branches, as ours does for an unknown predicate:


# %% tags=["hide-input"]
# @title A loop of 10 and of 1000 trips, and a cond, counted by XLA
def jax_loop(trips):
    return lambda x: jax.lax.fori_loop(0, trips, lambda i, c: jnp.sin(c) * 2.0, x)


def our_loop(trips):
    return lambda x: fori_loop(0, trips, lambda i, c: anp.sin(c) * 2.0, x)


def jax_pick(p, x):
    return jax.lax.cond(p, jnp.sin, lambda x: x * x, x)


def flops_and_transcendentals(costs):
    return {k: costs.get(k) for k in ("flops", "transcendentals")}


with jax.enable_x64(True):
    for trips in (10, 1000):
        xla = xla_costs(jax_loop(trips), np.ones(3))[0]
        print(f"XLA, {trips} trips:", flops_and_transcendentals(xla))
        ours = cost_analysis(our_loop(trips), np.ones(3))
        print(f"ours, {trips} trips:", flops_and_transcendentals(ours))
    xla = xla_costs(jax_pick, True, np.ones(3))[0]
    print("XLA, cond:", flops_and_transcendentals(xla))
ours = cost_analysis(
    lambda p, x: cond(p, anp.sin, lambda x: x * x, x),
    ShapedArray((), np.bool_),
    ShapedArray((3,), np.float64),
)
print("ours, cond:", flops_and_transcendentals(ours))


# %% [markdown]
# XLA's loop counts are the same for 10 and 1000 trips: its body's 3
# multiplications and 3 sines plus the loop counter's increment and
# comparison. Ours grow with the trip count, and count the counter's
# increment on every trip. XLA's `cond` count has one operation more than
# ours: JAX's `cond` turns the boolean predicate into an integer branch index
# (a `convert_element_type`) before branching.
#
# (analysis-cheap-gradient)=
# ## The cheap-gradient principle, measured
#
# Reverse mode promises that the gradient of a scalar function costs a small
# constant times the function itself, however many inputs it has. With a cost
# interpreter the promise can be checked: count `f`, count `grad(f)`, divide.
# Here for an MLP of growing depth (each layer `tanh(h @ w + b)`, width 64, a
# batch of 32), for a `scan` RNN of growing length, and for the
# {ref}`appendix <appendix>`'s two-layer network:


# %%
def mlp_loss(params, x):
    for w, b in params:
        x = anp.tanh(x @ w + b)
    return anp.sum(x * x)


def rnn_loss(w, xs):
    def cell(h, x):
        h = anp.tanh(h @ w + x)
        return h, anp.sum(h)

    return anp.sum(scan(cell, np.zeros(64), xs)[1])


def gradient_ratio(f, *args):
    return cost_analysis(grad(f), *args)["flops"] / cost_analysis(f, *args)["flops"]


layer_types = (ShapedArray((64, 64), np.float64), ShapedArray((64,), np.float64))
batch = ShapedArray((32, 64), np.float64)
depths = [1, 2, 4, 8]
mlp_ratios = [gradient_ratio(mlp_loss, [layer_types] * d, batch) for d in depths]
lengths = [1, 10, 100, 1000]
rnn_ratios = [
    gradient_ratio(rnn_loss, layer_types[0], ShapedArray((n, 64), np.float64))
    for n in lengths
]
print(
    "MLP, grad/forward by depth:", {d: round(r, 2) for d, r in zip(depths, mlp_ratios)}
)
print(
    "RNN, grad/forward by length:",
    {n: round(r, 2) for n, r in zip(lengths, rnn_ratios)},
)

# %% tags=["hide-input"]
# @title The appendix's network, and the plot
from figures import gradient_ratio_chart


def predict(params, x):
    hidden = anp.tanh(x @ params["w1"] + params["b1"])
    return hidden @ params["w2"] + params["b2"]


def appendix_loss(params, x, y):
    return anp.mean((predict(params, x) - y) ** 2)


appendix_types = {
    "w1": ShapedArray((1, 32), np.float64),
    "b1": ShapedArray((32,), np.float64),
    "w2": ShapedArray((32, 1), np.float64),
    "b2": ShapedArray((1,), np.float64),
}
column = ShapedArray((64, 1), np.float64)
appendix_ratio = gradient_ratio(appendix_loss, appendix_types, column, column)
print(f"the appendix's network: grad/forward = {appendix_ratio:.2f}")
gradient_ratio_chart(
    {"MLP (depth)": (depths, mlp_ratios), "scan RNN (length)": (lengths, rnn_ratios)}
)


# %% [markdown]
# The ratio stays near 3 whatever the depth or the length. `grad` runs the
# forward pass too (its values are needed backwards), and the backward pass of
# a matrix product is two matrix products of the same size, one for the
# weights' cotangent and one for the input's: 1 + 2 products for each one of
# the function. (For the first layer of the MLP the third product is one JAX
# does not do: the batch is not differentiated, but our `jvp` gives it a
# tangent of zeros and multiplies it by the weights like any other. JAX marks
# such a tangent as a *symbolic zero* and skips the product, so its count for
# the same MLP is 2.0 at depth 1 and approaches 3 only as the depth grows.) Every elementwise operation is matched by a few elementwise
# operations, which the products outweigh. That is the cheap-gradient principle:
# the constant does not grow with the size of the program, nor with the number
# of parameters.
#
# The principle is about *one* output. For a function with many outputs the
# comparison turns around. A Jacobian built in forward mode (`jacfwd`) costs
# one JVP per *input*; in reverse mode (`jacrev`), one VJP per *output*. With
# `vmap` doing the repetitions, both show up in the count:


# %%
def many_to_one(x):  # 200 inputs, 1 output
    return anp.sum(anp.sin(x) * x)


def one_to_many(t):  # 1 input, 200 outputs
    return anp.sin(t * np.linspace(0.0, 1.0, 200))


wide, scalar = ShapedArray((200,), np.float64), ShapedArray((), np.float64)
for name, f, arg in [
    ("200 -> 1", many_to_one, wide),
    ("1 -> 200", one_to_many, scalar),
]:
    fwd = cost_analysis(jacfwd(f), arg)["flops"]
    rev = cost_analysis(jacrev(f), arg)["flops"]
    print(f"{name}: jacfwd {fwd:>8.0f} flops, jacrev {rev:>8.0f} flops")

# %% [markdown]
# With many inputs and one output, reverse mode wins by about the number of
# inputs; with one input and many outputs, forward mode wins by about the
# number of outputs.
#
# (analysis-debug-print)=
# ## `debug.print`: a compiled program that talks back
#
# Put `print(x)` in a function and `jit` it: the print runs once, while the
# function is traced, and shows a tracer. The compiled program has no Python
# left in it. JAX's answer, `jax.debug.print(fmt, *args, **kwargs)`, is a
# *primitive* whose lowering asks the compiled program to call back into
# Python with the values. It is an interpreter problem like any other: each
# interpreter needs a rule for it.

# %% tags=["export"]
debug_print_p = Primitive("debug_print", multiple_results=True)


def debug_print(fmt: str, *args: Any, ordered: bool = False, **kwargs: Any) -> None:
    """Print ``fmt.format(*args, **kwargs)`` with the values the program
    computes, also under jit, vmap and differentiation."""
    check_format(fmt, args, kwargs)
    leaves, tree = tree_flatten((args, kwargs))
    leaves = [_as_input(x, "debug.print") for x in leaves]
    bind(debug_print_p, *leaves, fmt=fmt, tree=tree, batch_dims=0)


def print_formatted(fmt: str, tree: PyTreeDef, leaves: list, batch_dims: int) -> None:
    """One line per example: ``batch_dims`` leading axes are vmap's."""
    leaves = [np.asarray(x) for x in leaves]
    for index in np.ndindex(*(leaves[0].shape[:batch_dims] if leaves else ())):
        args, kwargs = tree_unflatten(tree, [x[index] for x in leaves])
        print(fmt.format(*args, **kwargs))


@debug_print_p.def_rule("impl")
def _debug_print_impl(*leaves, fmt, tree, batch_dims):
    print_formatted(fmt, tree, leaves, batch_dims)
    return []


# %% [markdown]
# The transformations each take a line. Staging records the equation (it has
# no outputs, but the builder keeps every equation it is given); `jvp` prints
# the primal values and leaves the tangents out; `vmap` prints one line per
# example, by moving the batch axis next to the leading axes that
# `print_formatted` loops over, and counting it as one more.


# %% tags=["export"]
@debug_print_p.def_rule("abstract_eval")
def _debug_print_abstract_eval(*avals, **params):
    return []


@debug_print_p.def_rule("jvp")
def _debug_print_jvp(primals, tangents, **params):
    bind(debug_print_p, *primals, **params)
    return [], []


@debug_print_p.def_rule("vmap")
def _debug_print_vmap(axis, vals, dims, *, fmt, tree, batch_dims):
    # this axis joins the leading ones as the last (it varies fastest, as in JAX)
    vals = [move_batch_axis(axis.size, d, batch_dims, x) for x, d in zip(vals, dims)]
    bind(debug_print_p, *vals, fmt=fmt, tree=tree, batch_dims=batch_dims + 1)
    return [], []


# %% [markdown]
# Lowering is where the callback happens. XLA's CPU runtime, as shipped in
# jaxlib, has a custom call named `xla_ffi_python_cpu_callback`: when the
# compiled program reaches it, XLA calls a Python function with the custom
# call's operands as NumPy arrays. Which function is given by an `index`
# attribute: the position of the function in the list of *host callbacks*
# handed to XLA's compiler with the module. {ref}`Part 3 <part3>`'s
# `xla_compile` passes `HOST_CALLBACKS` when a module contains such a call; the
# rule adds its function to that list and emits the call.
# `has_side_effect` tells XLA that the call matters even though nothing uses
# its (absent) results, so no optimization removes it.


# %% tags=["export"]
@debug_print_p.def_rule("lower")
def _debug_print_lower(ctx, avals_in, avals_out, *leaves, fmt, tree, batch_dims):
    def callback(*arrays):  # called by the compiled program, on the host
        print_formatted(fmt, tree, arrays, batch_dims)
        return ()

    check_one_replica(ctx)
    HOST_CALLBACKS.append(callback)
    index = ir.IntegerAttr.get(ir.IntegerType.get_unsigned(64), len(HOST_CALLBACKS) - 1)
    hlo.CustomCallOp(
        [],
        list(leaves),
        call_target_name="xla_ffi_python_cpu_callback",
        has_side_effect=True,
        backend_config=ir.DictAttr.get({"index": index}),
        api_version=ir.IntegerAttr.get(ir.IntegerType.get_signless(32), 4),  # typed FFI
    )
    return []


# %% [markdown]
# The rest of the interpreters (partial evaluation, transposition, cost) need
# no work or a line each (folded), as does the `debug` namespace; a format
# that does not fit its arguments is an error when `debug.print` is called,
# before anything runs.


# %% tags=["export", "hide-input"]
# @title The debug namespace; a cost rule; checks: the format, no pmap
@debug_print_p.def_rule("cost")
def _debug_print_cost(ctx, avals_in, avals_out, **params):
    return Cost()  # a host callback does no arithmetic XLA counts


# No transpose rule: the jvp rule prints primals only, and a print of tangents
# (in a custom_jvp rule, say) leaves no equation in a linear jaxpr, since no
# output depends on it; so, like sin, it is "not linear" in the rule table.
NOT_LINEAR.update({"debug_print"})


debug = types.ModuleType(
    "autodidax.debug", "Printing from transformed and compiled code."
)
debug.print = debug_print
if __name__ != "__main__":  # in the module: `from autodidax import debug`
    sys.modules[f"{__name__}.debug"] = debug


class DebugPrintInPmapError(TypeError):
    """debug.print inside pmap, whose programs this book compiles without
    host callbacks."""


def check_one_replica(ctx: LoweringContext) -> None:
    if ctx.replicas is not None:
        raise DebugPrintInPmapError(
            "debug.print inside pmap: this book compiles pmap's program for "
            f"{ctx.replicas} replicas without host callbacks, so it cannot print; "
            "print under vmap (same values, one line per example) or outside pmap"
        )


class DebugPrintFormatError(ValueError, LookupError):
    """A debug.print format that does not fit its arguments (a LookupError as
    well, like the IndexError or KeyError that JAX raises)."""


class _Probe:
    """Stands for an argument while the format is tried; records its use."""

    def __init__(self) -> None:
        self.used = False

    def __format__(self, spec: str) -> str:
        self.used = True
        return ""

    def __getattr__(self, name: str) -> _Probe:
        self.used = True
        return self

    def __getitem__(self, key: Any) -> _Probe:
        self.used = True
        return self


def check_format(fmt: Any, args: tuple, kwargs: dict) -> None:
    if not isinstance(fmt, str):
        raise TypeError(
            f"debug.print: the format must be a str, got {_short_repr(fmt)}"
        )
    probes = [_Probe() for _ in args]
    given = f"{len(args)} positional argument(s) and keywords {sorted(kwargs)}"
    try:
        fmt.format(*probes, **{k: _Probe() for k in kwargs})
    except IndexError:
        raise DebugPrintFormatError(
            f"debug.print: the format {fmt!r} asks for more positional arguments "
            f"than it was given ({given})"
        ) from None
    except KeyError as e:
        raise DebugPrintFormatError(
            f"debug.print: the format {fmt!r} asks for {e} but it was given {given}"
        ) from None
    except ValueError as e:
        raise DebugPrintFormatError(f"debug.print: bad format {fmt!r}: {e}") from None
    unused = [i for i, p in enumerate(probes) if not p.used]
    if unused:
        raise DebugPrintFormatError(
            f"debug.print: the format {fmt!r} does not use the positional "
            f"argument(s) at position {unused} ({given})"
        )


# %% [markdown]
# That is all: a print from compiled code, under `vmap`, and under `grad`,
# where it prints the primal value once and does not touch the gradient:


# %%
def noisy(x):
    debug.print("x = {}, sin x = {s}", x, s=anp.sin(x))
    return x * x


print(jit(noisy)(np.array([1.0, 2.0])))
print(vmap(noisy)(np.array([1.0, 2.0])))
print(grad(noisy)(3.0))
print(
    str(lower_jaxpr(make_jaxpr(noisy, ShapedArray((), np.float64))[0])).splitlines()[3]
)


# %% [markdown]
# Inside a loop, the callback runs on every trip of the compiled loop:


# %%
def count_down(n):
    def body(i):
        debug.print("i = {}", i)
        return i - 1

    return while_loop(lambda i: i > 0, body, n)


_ = jit(count_down)(np.int64(3))

# %% [markdown]
# A format that asks for an argument it was not given, or leaves a positional
# argument out, is refused at the call, eagerly and while tracing:

# %%
show_error(lambda: debug.print("{} and {}", 1.0))
show_error(lambda: jit(lambda x: debug.print("{y}", x))(1.0))


# %% [markdown]
# **Ordering.** [`jax.debug.print`](https://docs.jax.dev/en/latest/_autosummary/jax.debug.print.html)
# promises an order only to prints called with `ordered=True`, and only among
# themselves: a compiled program may run independent operations in any order,
# so two unordered prints may appear swapped. `ordered=True` adds an *effect*
# to the jaxpr, and a token threaded through the compiled program that the
# ordered prints pass from one to the next. Ours
# accepts `ordered=` for compatibility and does nothing with it: there are no
# tokens, and the order is whatever XLA's CPU runtime gives, which in our
# tests is program order, on the calling thread, before the call returns.
#
# ## Where real JAX differs
#
# - **XLA's cost analysis.** `jax.jit(f).lower(*args).compile().cost_analysis()`
#   (`jax.stages.Compiled.cost_analysis`) returns XLA's `HloCostAnalysis` of
#   the optimized program, as a dict with more keys than ours (such as
#   `utilization0{}` and `bytes accessed0{}`, per operand); JAX's
#   `Lowered.cost_analysis()` analyses the program before XLA optimizes it. As
#   shown above, XLA counts a loop body once and leaves out keys whose count is
#   zero. JAX's counts come from XLA, for a lowered or compiled program; ours
#   come from the jaxpr, and never compile anything.
# - **Effects and tokens.** A JAX jaxpr records which equations have effects:
#   `jax.make_jaxpr` of a function calling `jax.debug.print` shows a
#   `debug_print` equation, and the jaxpr's `effects` contain a
#   `DebugEffect`; with `ordered=True`, an `OrderedDebugEffect`, which makes
#   the lowering thread a token through the program (`main` takes and returns
#   a `!stablehlo.token`, and the callback passes it on). Effects also keep
#   dead-code elimination from deleting the print, a pass our jaxprs do not
#   have yet.
# - **The callback's route.** JAX lowers `debug_print` through
#   `jax._src.callback.emit_python_callback`, which emits the same
#   `xla_ffi_python_cpu_callback` custom call on CPU (other targets on GPU
#   and TPU) and collects the callbacks in its lowering context. We rely on
#   two private pieces of jaxlib: that custom call's name and attribute, and
#   the `host_callbacks=` argument of the client's `compile_and_load`.
# - **Under `vmap`**, JAX also prints one line per example, as ours does.
#   **Under `grad`**, both print the primal value once; JAX also registers a
#   transpose rule for `debug_print` that drops it, where ours has none and
#   needs none, because partial evaluation keeps only equations that an output
#   depends on. **Inside `pmap`**,
#   JAX prints one line per device; ours refuses (its `pmap` compiles without
#   host callbacks).
#
# ## Summary
#
# - A cost interpreter reads a jaxpr's equations and adds up a cost per
#   primitive (`flops`, `transcendentals`, `bytes accessed`): a `cost` rule
#   per primitive, registered like any other rule. With types as inputs,
#   nothing runs, whatever the sizes.
# - Higher-order primitives cost their jaxprs: `jit` its body, `scan` its body
#   times its length, `cond` the branch taken (or the dearer one), a
#   `while_loop` what its run costs, when the run can be known.
# - For loop-free programs the counts equal XLA's, except where XLA's optimizer
#   changed the program; XLA counts a loop body once.
# - Measured, a gradient costs about 3 times its function, at any depth or
#   length; for Jacobians, forward mode wins with few inputs and reverse mode
#   with few outputs.
# - `debug.print` is a primitive whose lowering calls back into Python from
#   the compiled program (a host callback); it prints primals under `jvp` and
#   `grad`, and one line per example under `vmap`.
#
# ## Exercises
#
# **1. Peak memory, roughly.** Write `largest_intermediate(f, *args)`, another
# interpreter over the jaxpr that returns the size in bytes of the largest
# value any equation produces. Try it on `mlp_loss` and on its gradient.


# %% tags=["hide-input"]
# @title A solution
def largest_intermediate(f, *args):
    jaxpr, _, _ = make_jaxpr(f, *args)

    def walk(jaxpr):
        sizes = [0]
        for eqn in jaxpr.eqns:
            sizes += [v.aval.size * v.aval.dtype.itemsize for v in eqn.out_binders]
            sizes += [walk(p) for p in eqn.params.values() if isinstance(p, Jaxpr)]
        return max(sizes)

    return walk(jaxpr)


print(largest_intermediate(mlp_loss, [layer_types] * 2, batch))
print(largest_intermediate(grad(mlp_loss), [layer_types] * 2, batch))

# %% [markdown]
# **2. Which branch?** Count `pick` on an array whose sum is negative. Which
# branch is counted, and why does the sum's cost still appear?

# %% tags=["hide-input"]
# @title A solution
print(cost_analysis(pick, -np.ones(3)))  # x * x: 3 flops, plus 2 for the sum
# and 1 for the comparison: the predicate is computed (that is how the branch
# is known), and counted, since the program computes it too.

# %% [markdown]
# **3. A print that counts.** Use `debug.print` inside a `scan` body under
# `jit` to print the running sum of a sequence, and check the last line
# against `np.cumsum`.


# %% tags=["hide-input"]
# @title A solution
def running_sum(xs):
    def body(total, x):
        total = total + x
        debug.print("total = {}", total)
        return total, total

    return scan(body, 0.0, xs)[1]


sums = jit(running_sum)(np.arange(1.0, 5.0))
print(np.asarray(sums), np.cumsum(np.arange(1.0, 5.0)))
