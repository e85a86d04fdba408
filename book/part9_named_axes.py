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
# (part9)=
# # Part 9: named axes and several devices
#
# :::{admonition} Where we are
# :class: note
# Every program so far ran on one device. `vmap` ({ref}`Part 1 <part1>`) maps a
# function over a batch, but each example is computed on its own and never
# sees the others. This part gives the examples of a batch a way to talk to each
# other, and then spreads them over several devices.
# :::
#
# Data-parallel training is the reason. Each device holds a copy of the
# model's parameters and a slice of the batch; it computes the gradient of the
# loss on its slice; then every device needs the *average* of all the
# gradients, so that all copies take the same step. That average is a
# **{term}`collective`**: an operation whose result on one member depends on the values
# of all members. JAX spells it `pmean(grads, axis_name="devices")`, and the
# name says which group of members to average over.
#
# The same program makes sense on one device. Under `vmap(f, axis_name="i")`
# the members are the examples of the batch, and `psum(x, "i")` is the sum of
# `x` over the batch: one `reduce_sum`. So we build collectives twice. First as
# primitives whose batching rule reduces over the named batch axis; that is all
# they need to run, and to be differentiated, on one device. Then `pmap`: the
# same kind of function, traced once, compiled once by XLA for several
# **{term}`replicas <replica>`** (one copy of the program per device), with the collectives
# lowered to StableHLO's cross-replica operations.
#
# The idea to take away: **a collective finds its interpreter by name, not by
# data dependence.** Until now `bind` chose the interpreter from the tracers
# among the inputs. `psum(3.0, "i")` has no tracer among its inputs, and
# `axis_index("i")` has no inputs at all, yet both must be handled by the
# interpreter that bound `"i"`.
#
# The folded cell below loads the earlier chapters. For this chapter it also
# asks XLA for eight CPU devices, which must happen before JAX starts; if JAX
# has already started with fewer (say, in a reused Colab runtime), it says so.

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

book_setup.load_book(globals(), before="part9_named_axes")

# %% [markdown]
# ## What a collective means under `vmap`
#
# Here is the behaviour we want, shown with JAX itself. Each row of `x` is one
# member of the {term}`named axis` `"i"`; dividing by `psum` normalizes every column;
# `axis_index` tells each member its position.

# %%
import jax

x = np.arange(1.0, 13.0).reshape(4, 3)
with jax.enable_x64(True):  # float64, as ours, in this cell only
    print(jax.vmap(lambda row: row / jax.lax.psum(row, "i"), axis_name="i")(x))
    print(jax.vmap(lambda row: jax.lax.psum(3.0, "i"), axis_name="i")(x))
    print(jax.vmap(lambda row: jax.lax.axis_index("i"), axis_name="i")(x))


# %% [markdown]
# The second line is the interesting one. `psum(3.0, "i")` adds up the value
# `3.0` held by each of the four members: 12. Nothing about `3.0` says it
# belongs to the batch, so data dependence would hand it to the evaluation
# interpreter, which has never heard of `"i"`, and it would come back as 3.
#
# (part9-axis-env)=
# ## Where a name is bound
#
# Since Part 1, a `BatchTrace`'s level carries its `Axis`, and
# `vmap(..., axis_name="i")` puts the name there. So the interpreter stack
# already says which interpreter maps over `"i"`: the innermost `BatchTrace`
# level whose axis has that name. `pmap` (below) binds its name while it traces
# a function, and keeps that binding in a short list of **axis frames**: a
# name, a size, and the level that handles collectives over it. For `pmap` that
# level is the tracing interpreter (`_state.dynamic`, Part 2's dynamic level),
# so that its collectives are recorded as equations and lowered to the
# devices' collectives later. Looking a name
# up searches both, innermost first, and fails if nothing binds it. JAX raises
# `NameError` for an unbound axis name; ours subclasses it (and `ValueError`,
# like the book's other errors about bad arguments).


# %% tags=["export"]
class UnboundAxisError(NameError, ValueError):
    """A collective names an axis that no enclosing vmap or pmap binds."""


class AxisFrame(NamedTuple):
    name: Hashable  # what collectives call the axis
    size: int
    level: Level  # the interpreter that handles collectives over it


def axis_frames() -> list[AxisFrame]:
    """Every bound axis name, sorted by level: the innermost last."""
    vmaps = [
        AxisFrame(level.payload.name, level.payload.size, level)
        for level in _state.stack
        if level.trace_type is BatchTrace and level.payload.name is not None
    ]
    return sorted(vmaps + _pmap_frames.frames, key=lambda f: f.level.number)


def lookup_axis(name: Hashable, who: str = "collective") -> AxisFrame:
    for frame in reversed(axis_frames()):
        if frame.name == name:
            return frame
    raise unbound_axis_error(name, who)


# %% tags=["export", "hide-input"]
# @title pmap's frames (bind_axis); checks: the unbound-axis error
class _PmapFrames(threading.local):
    def __init__(self) -> None:
        self.frames: list[AxisFrame] = []  # innermost last


_pmap_frames = _PmapFrames()


@contextmanager
def bind_axis(name: Hashable, size: int, level: Level) -> Iterator[None]:
    """Make ``name`` refer to an axis of ``size`` handled by ``level``."""
    if name is None:
        yield
        return
    _pmap_frames.frames.append(AxisFrame(name, size, level))
    try:
        yield
    finally:
        _pmap_frames.frames.pop()


def check_replicas(ctx: LoweringContext, name: Hashable) -> int:
    if ctx.replicas is None:
        raise UnboundAxisError(
            f"a collective over axis {name!r} reached XLA outside pmap: only "
            "pmap compiles for several replicas (under vmap, a collective "
            "becomes an operation on the batch axis before compilation)"
        )
    return ctx.replicas


def unbound_axis_error(name: Hashable, who: str) -> UnboundAxisError:
    bound = [frame.name for frame in axis_frames()]
    where = f"the names bound here are {bound}" if bound else "no axis is bound here"
    return UnboundAxisError(
        f"{who}: unbound axis name {name!r}: no enclosing vmap(..., "
        f"axis_name=...) or pmap(..., axis_name=...) binds it ({where})"
    )


# %% [markdown]
# While a named `vmap` runs, its level is on the stack with its name:


# %%
def show_frames(row):
    print(axis_frames())
    return row


_ = vmap(vmap(show_frames, axis_name="cols"), axis_name="rows")(x)

# %% [markdown]
# **This replaces `bind` from Part 1**, because the lesson of this part is that
# data dependence is not enough to choose an interpreter. The change is one line
# (the `if` marked `new`, and its helper `reach_axes`): `bind` still picks the
# highest level among its inputs' tracers, and for a primitive that uses axis
# names, the levels that bound those names join the contest. The collectives use
# names; so do calls whose jaxprs contain collectives (`jit`, `cond`, the loops,
# the custom-rule calls), which join `AXIS_USERS` with `pmap` below. For every other primitive `bind`
# does what it did before.

# %% tags=["export"]
AXIS_USERS: dict[Primitive, Callable[[dict], Any]] = {}  # prim -> names it uses


def bind(prim: Primitive, *args: Any, **params: Any) -> Any:
    """Apply a primitive: the single entry point of every operation."""
    args = [x if isinstance(x, Tracer) else as_array(x, prim.name) for x in args]
    trace = find_top_trace(args)
    if prim in AXIS_USERS:  # new: reach the interpreters that bound its axes
        trace = reach_axes(trace, AXIS_USERS[prim](params), prim.name)
    tracers = [trace.full_raise(x) for x in args]
    outs = trace.process_primitive(prim, tracers, params)
    outs = [full_lower(out) for out in outs]
    return outs if prim.multiple_results else outs[0]


def reach_axes(trace: Trace, names: Any, who: str) -> Trace:
    """The higher of ``trace`` and the levels that bound ``names``."""
    for name in names:
        level = lookup_axis(name, who).level
        if level.number > trace.level.number:
            trace = level.trace_type(level)
    return trace


# %% [markdown]
# So `psum(3.0, "i")` under `vmap(..., axis_name="i")` goes to the `vmap`'s
# `BatchTrace` although `3.0` is a plain number: `full_raise` boxes it as a
# `BatchTracer` with no batch axis, and the batching rule of `psum` (below)
# makes it `3.0 * 4`. An `axis_index("i")` with no inputs at all arrives at
# the same interpreter the same way. A batching rule gets its trace's `Axis`,
# so a collective's rule can tell whether the name is *its* axis
# (`axis.name == axis_name`). And the rules that batch a sub-jaxpr (`jit`'s,
# `cond`'s, a loop's body) already pass that `Axis`, name included, to the
# inner `vmap` (Parts 3, 5–8), so a `psum` inside a `jit` inside a named `vmap`
# reaches an interpreter that knows the name. A call whose inputs do not depend
# on the batch at all (`jit(lambda: psum(1.0, "i"))()`) reaches the `vmap`
# because the call joins `AXIS_USERS`; its batching rule then batches its jaxpr
# with nothing batched but the name.
#
# (part9-collectives)=
# ## The collectives
#
# Four primitives, plus `pmean`, which is a `psum` divided by the axis size
# (JAX defines it the same way). `all_gather` carries the axis size as a
# parameter, because its output type depends on it. As in JAX, the wrappers
# apply to every leaf of a pytree (a model's gradients are usually a dict of
# arrays), and `psum`, `pmax` and `pmean` also take a tuple of names, binding
# one primitive per name.

# %% tags=["export"]
psum_p = Primitive("psum")
pmax_p = Primitive("pmax")
all_gather_p = Primitive("all_gather")
axis_index_p = Primitive("axis_index")
COLLECTIVES = (psum_p, pmax_p, all_gather_p, axis_index_p)
for _prim in COLLECTIVES:
    AXIS_USERS[_prim] = lambda params: (params["axis_name"],)


def psum(x: Any, axis_name: Any) -> Any:
    """Sum every leaf of ``x`` over the axis ``axis_name`` (or over each axis
    of a tuple of names): every member gets the total."""
    return on_leaves_and_names(psum_p, x, axis_name)


def pmax(x: Any, axis_name: Any) -> Any:
    return on_leaves_and_names(pmax_p, x, axis_name)


def pmean(x: Any, axis_name: Any) -> Any:
    size = np.prod([axis_size(name, "pmean") for name in names_of(axis_name)])
    return tree_map(lambda total: total / int(size), psum(x, axis_name))


def all_gather(x: Any, axis_name: Hashable) -> Any:
    """Every member's ``x`` (each leaf), stacked along a new leading axis."""
    size = axis_size(axis_name, "all_gather")

    def gather(leaf):
        return bind(all_gather_p, leaf, axis_name=axis_name, axis_size=size)

    return tree_map(gather, x)


def axis_index(axis_name: Hashable) -> ArrayLike:
    """This member's position along ``axis_name`` (an int32 scalar)."""
    return bind(axis_index_p, axis_name=axis_name)


# %% [markdown]
# Each batching rule has two cases. If this `vmap` bound the name, the
# collective is an operation on the batch axis: `psum` is a `reduce_sum` over
# it, `pmax` a `reduce_max`, `all_gather` moves the batch axis to the front
# and hands every member the whole stack, and `axis_index` is the vector
# `0, 1, ..., n-1` batched along the axis (an *iota*). The results of `psum`,
# `pmax` and `all_gather` are the same for every member, so they are
# unbatched; `axis_index`'s differs per member and stays batched. If another axis is meant, the batch
# rides along: the collective is bound again on the batched value, and `bind`
# takes it to the level that bound the other name, with this batch axis as one
# more data axis.


# %% tags=["export"]
@psum_p.def_rule("vmap")
def _psum_vmap(axis, vals, dims, *, axis_name):
    (x,), (d,) = vals, dims
    if axis.name != axis_name:  # another axis: the batch rides along
        return [psum(x, axis_name)], [d]
    if d is None:  # the same value in every member: the sum is N times it
        aval = get_aval(x)
        return [mul(x, np.full(aval.shape, axis.size, aval.dtype))], [None]
    return [reduce_sum(x, d)], [None]


@axis_index_p.def_rule("vmap")
def _axis_index_vmap(axis, vals, dims, *, axis_name):
    return [np.arange(axis.size, dtype=np.int32)], [0]


# %% tags=["export", "hide-input"]
# @title The batching rules of pmax and all_gather; pytrees and tuples of names
@pmax_p.def_rule("vmap")
def _pmax_vmap(axis, vals, dims, *, axis_name):
    (x,), (d,) = vals, dims
    if axis.name != axis_name:
        return [pmax(x, axis_name)], [d]
    if d is None:
        return [x], [None]
    return [reduce_max(x, d)], [None]


@all_gather_p.def_rule("vmap")
def _all_gather_vmap(axis, vals, dims, *, axis_name, axis_size):
    (x,), (d,) = vals, dims
    if axis.name != axis_name:
        out_dim = None if d is None else d + 1
        return [all_gather(x, axis_name)], [out_dim]
    return [move_batch_axis(axis_size, d, 0, x)], [None]


def axis_size(axis_name: Hashable, who: str = "pmean") -> int:
    return lookup_axis(axis_name, who).size


def names_of(axis_name: Any) -> tuple:
    return axis_name if isinstance(axis_name, tuple) else (axis_name,)


def on_leaves_and_names(prim: Primitive, x: Any, axis_name: Any) -> Any:
    """``prim`` on every leaf of ``x``, over each axis that ``axis_name`` names."""

    def on_leaf(leaf):
        for name in names_of(axis_name):
            leaf = bind(prim, leaf, axis_name=name)
        return leaf

    return tree_map(on_leaf, x)


# %% [markdown]
# The remaining rules are short. A collective's type is its input's (plus the
# leading axis for `all_gather`). Its derivative is the collective of the
# tangent, since summing and gathering are linear; `pmax`'s tangent comes from
# the members that hold the maximum, shared evenly among ties. The transpose of
# `psum` is `psum`: every member's input contributes to every member's output.
# Evaluation never sees a collective, because `bind` always raises it to the
# interpreter that bound its axis.

# %% tags=["export", "hide-input"]
# @title The collectives' other rules: types, derivatives, transposes
for _prim in (psum_p, pmax_p):
    _prim.def_rule("abstract_eval")(lambda x, *, axis_name: [x])


@all_gather_p.def_rule("abstract_eval")
def _all_gather_abstract_eval(x, *, axis_name, axis_size):
    return [ShapedArray((axis_size, *x.shape), x.dtype)]


@axis_index_p.def_rule("abstract_eval")
def _axis_index_abstract_eval(*, axis_name):
    return [ShapedArray((), np.dtype(np.int32))]


def _unreachable_impl(prim: Primitive) -> None:
    @prim.def_rule("impl")
    def rule(*args, axis_name, **params):
        # bind always raises a collective to the level that bound its axis,
        # so plain evaluation never sees one; if it does, the axis is unbound
        raise unbound_axis_error(axis_name, prim.name)

    rule.only_raises = True  # the rule table says so


for _prim in COLLECTIVES:
    _unreachable_impl(_prim)


@psum_p.def_rule("jvp")
def _psum_jvp(primals, tangents, *, axis_name):
    return [psum(primals[0], axis_name)], [psum(tangents[0], axis_name)]


@all_gather_p.def_rule("jvp")
def _all_gather_jvp(primals, tangents, **params):
    return [bind(all_gather_p, primals[0], **params)], [
        bind(all_gather_p, tangents[0], **params)
    ]


@pmax_p.def_rule("jvp")
def _pmax_jvp(primals, tangents, *, axis_name):
    (x,), (t,) = primals, tangents
    out = pmax(x, axis_name)
    at_max = convert_element_type(numpy_equal(x, out), get_aval(x).dtype)
    return [out], [psum(t * at_max, axis_name) / psum(at_max, axis_name)]


@axis_index_p.def_rule("jvp")
def _axis_index_jvp(primals, tangents, *, axis_name):
    out = axis_index(axis_name)
    return [out], [zeros_like(out)]


@psum_p.def_rule("transpose")
def _psum_transpose(cts, x, *, axis_name):
    (ct,) = cts
    return [None if ct is None else psum(ct, axis_name)]


@all_gather_p.def_rule("transpose")
def _all_gather_transpose(cts, x, *, axis_name, axis_size):
    (ct,) = cts
    if ct is None:
        return [None]
    total = psum(ct, axis_name)  # my row of the gathered sum is my cotangent
    mine = numpy_equal(np.arange(axis_size, dtype=np.int32), axis_index(axis_name))
    zeros = np.zeros(get_aval(total).shape, get_aval(total).dtype)
    return [reduce_sum(select(per_example(mine, total), total, zeros), 0)]


NOT_LINEAR.update({"pmax", "axis_index"})

# %% [markdown]
# The collectives, and the loops of Parts 6 and 7, join `autodidax.lax` under
# JAX's names:

# %% tags=["export"]
for _fn in [while_loop, fori_loop, scan, psum, pmean, pmax, all_gather, axis_index]:
    setattr(lax_namespace, _fn.__name__, _fn)


# %% [markdown]
# Now the examples of the start, on our own interpreters:


# %%
def normalize(row):
    return row / psum(row, "i")


print(vmap(normalize, axis_name="i")(x))
print(vmap(lambda row: psum(3.0, "i"), axis_name="i")(x))
print(vmap(lambda row: axis_index("i"), axis_name="i")(x))


# %% [markdown]
# Two names nest. Below, the outer `vmap` maps over the rows (`"rows"`), the
# inner one over the entries of a row (`"cols"`); `psum` over `"cols"` is a row
# sum and `pmax` over `"rows"` a column maximum. Each collective reaches the
# `vmap` that bound its name, whatever sits in between.


# %%
def entry(v):
    return v / psum(v, "cols") + pmax(v, "rows")


print(vmap(vmap(entry, axis_name="cols"), axis_name="rows")(x))

# %% [markdown]
# A collective inside `jit` inside a named `vmap` is staged into the jitted
# jaxpr as an equation; `xla_call`'s batching rule then batches that jaxpr under
# the same name, and the `psum` becomes a `reduce_sum` in the compiled program.
# A name that nothing binds is an error raised while tracing, naming the axis:

# %%
print(vmap(jit(normalize), axis_name="i")(x))
show_error(vmap(lambda row: psum(row, "j"), axis_name="i"), x)


# %% [markdown]
# (part9-devices)=
# ## Several devices
#
# With `XLA_FLAGS=--xla_force_host_platform_device_count=8` set before JAX
# starts, XLA's CPU client offers eight devices. They share the machine's
# processor cores, but to XLA they are separate devices with separate memory, so the programs
# below are the ones that would run on eight accelerators.


# %% tags=["export", "hide-input"]
# @title devices(): the CPU client's devices
def devices() -> list:
    """The devices XLA's CPU client offers (8 with the book's XLA_FLAGS)."""
    return runtime().client.local_devices()


# %%
devices()

# %% [markdown]
# `pmap(f)` runs `f` once per row of its inputs, each row on its own device. XLA
# calls this SPMD, a single program on multiple data: we compile **one**
# program, and tell XLA to run `n` replicas of it, replica `k` on device `k`
# with row `k` of every input. Collectives become StableHLO's cross-replica
# operations:
#
# - `psum` and `pmax` are `stablehlo.all_reduce`, whose region says how two
#   values combine (an `add` or a `maximum`) and whose `replica_groups` say who
#   takes part (here all replicas, one group);
# - `all_gather` is `stablehlo.all_gather` along axis 0, after a reshape gives
#   each replica's value a leading axis of size one;
# - `axis_index` is `stablehlo.replica_id`, an unsigned 32-bit integer that we
#   convert to `int32`.

# %% tags=["export", "hide-input"]
# @title Lowering psum, pmax and axis_index: all_reduce and replica_id
LoweringContext.replicas = None  # pmap's lowering sets the number of replicas


def replica_groups(ctx: LoweringContext, name: Hashable) -> ir.Attribute:
    """All replicas in one group: the collective spans every device."""
    n = check_replicas(ctx, name)
    groups = np.arange(n, dtype=np.int64).reshape(1, n)
    return ir.DenseIntElementsAttr.get(groups)


def _all_reduce_lower(combine: Callable) -> Callable:
    def rule(ctx, avals_in, avals_out, x, *, axis_name):
        op = hlo.AllReduceOp([x.type], [x], replica_groups(ctx, axis_name))
        scalar = ir_type(ShapedArray((), avals_in[0].dtype))
        body = op.regions[0].blocks.append(scalar, scalar)
        with ir.InsertionPoint(body):
            hlo.ReturnOp([combine(*body.arguments)])
        return [op.result]

    return rule


psum_p.def_rule("lower")(_all_reduce_lower(hlo.add))
pmax_p.def_rule("lower")(_all_reduce_lower(hlo.maximum))


@axis_index_p.def_rule("lower")
def _axis_index_lower(ctx, avals_in, avals_out, *, axis_name):
    replica_groups(ctx, axis_name)  # refuses a collective outside pmap
    index = hlo.ReplicaIdOp().result  # a 32-bit unsigned integer
    return [hlo.convert(ir_type(avals_out[0]), index)]


# %% tags=["export", "hide-input"]
# @title Lowering all_gather: each replica's row, gathered along a new axis 0
@all_gather_p.def_rule("lower")
def _all_gather_lower(ctx, avals_in, avals_out, x, *, axis_name, axis_size):
    (x_aval,), (out_aval,) = avals_in, avals_out
    row = hlo.reshape(ir_type(ShapedArray((1, *x_aval.shape), x_aval.dtype)), x)
    groups = replica_groups(ctx, axis_name)
    return [hlo.AllGatherOp([ir_type(out_aval)], [row], 0, groups).result]


# %% [markdown]
# The lowering rules read the number of replicas from the lowering context. A
# pmapped function's module wraps its jaxpr in a `main` that takes one row of
# each input, shaped `(1, ...)`, reshapes it to the row's own shape, calls the
# jaxpr's function, and reshapes the results back. (Why the `(1, ...)`: the
# jaxlib array we hand over is the whole `(n, ...)` input split by rows, and
# each device's piece of it keeps its leading axis of size one.) Compiling sets
# `num_replicas` and passes the devices, in order.


# %% tags=["export", "hide-input"]
# @title The module for one replica (lower_pmap) and its executable (CompiledPmap)
def lower_pmap(jaxpr: Jaxpr, n: int) -> ir.Module:
    """A module for one replica: ``main`` takes and returns one row per input
    and output (shape ``(1, ...)``) and calls the lowered ``jaxpr`` on them."""
    with mlir_context(), ir.Location.unknown():
        ctx = LoweringContext()
        ctx.replicas = n  # new: collectives span n replicas
        body = ctx.function_for(jaxpr)
        row = lambda aval: ir_type(ShapedArray((1, *aval.shape), aval.dtype))  # noqa: E731
        ins = [row(v.aval) for v in jaxpr.in_binders]
        outs = [row(x.aval) for x in jaxpr.outs]
        with ir.InsertionPoint(ctx.module.body):
            main = mlir_func.FuncOp("main", ir.FunctionType.get(ins, outs))
        block = main.add_entry_block()
        with ir.InsertionPoint(block):
            args = [
                hlo.reshape(ir_type(v.aval), a)
                for v, a in zip(jaxpr.in_binders, block.arguments)
            ]
            out_types = [ir_type(x.aval) for x in jaxpr.outs]
            call = mlir_func.CallOp(out_types, ir.FlatSymbolRefAttr.get(body), args)
            mlir_func.ReturnOp([hlo.reshape(t, r) for t, r in zip(outs, call.results)])
        ctx.module.operation.verify()
    return ctx.module


class CompiledPmap:
    """One XLA executable for ``n`` replicas, one per device."""

    def __init__(self, jaxpr: Jaxpr, n: int, chosen: tuple = ()) -> None:
        from jax._src.lib import xla_client

        self.devices = chosen or tuple(devices()[:n])
        self.module_text = str(lower_pmap(jaxpr, n))
        options = xla_client.CompileOptions()
        options.num_replicas = n
        ids = np.array([[d.id] for d in self.devices])  # replica i on device i
        options.device_assignment = xla_client.DeviceAssignment.create(ids)
        self.executable = runtime().client.compile_and_load(
            self.module_text, xla_client.DeviceList(tuple(self.devices)), options
        )
        out_avals = _pmap_abstract_eval(jaxpr=jaxpr, axis_name=None, axis_size=n)
        self.handlers = row_result_handlers(out_avals, self.devices)

    def __call__(self, *args: Any) -> list[ShardedArray]:
        arrays = [shard_rows(x, self.devices) for x in args]
        results = self.executable.execute_sharded(arrays)
        outs = results.consume_with_handlers(self.handlers)  # n pieces -> 1 array
        wait_until_ready(outs)
        return [ShardedArray(out) for out in outs]


# %% tags=["export", "hide-input"]
# @title Result handlers; waiting for each run; one executable per (jaxpr, rows)
def row_result_handlers(avals: list, devices: tuple) -> list:
    """Per output, jaxlib's handler that joins its pieces into one array."""
    from jaxlib import _jax

    sharding = rows_sharding(devices)
    return [
        _jax.array_result_handler(
            jax.core.ShapedArray(aval.shape, aval.dtype),
            sharding,
            committed=True,
            _skip_checks=True,
        )
        for aval in avals
    ]


def wait_until_ready(outs: list) -> None:
    # On XLA's CPU devices, a collective waits until every replica of its run
    # has arrived. With many runs in flight on few cores, one run's replicas can
    # wait behind another's until XLA gives up and aborts the process (real JAX's
    # pmap does, on the 2-core machine that builds this book), so we let each
    # run finish before starting the next.
    for out in outs:
        out.block_until_ready()


_compiled_pmaps: dict[tuple[Jaxpr, tuple], CompiledPmap] = {}


def compile_pmap(jaxpr: Jaxpr, n: int) -> CompiledPmap:
    """The executable for ``n`` replicas on the first ``n`` devices of the
    enclosing pmap's ``devices=`` (of ``devices()`` without one)."""
    chosen = tuple((getattr(_state, "pmap_devices", None) or devices())[:n])
    if (jaxpr, chosen) not in _compiled_pmaps:
        _compiled_pmaps[jaxpr, chosen] = CompiledPmap(jaxpr, n, chosen)
    return _compiled_pmaps[jaxpr, chosen]


@contextmanager
def running_on(chosen: Sequence | None) -> Iterator[None]:
    """Run the pmaps of the block on ``chosen`` devices (``pmap(devices=)``)."""
    previous = getattr(_state, "pmap_devices", None)
    _state.pmap_devices = previous if chosen is None else list(chosen)
    try:
        yield
    finally:
        _state.pmap_devices = previous


# %% [markdown]
# The executable takes each input as one jaxlib array split by rows, row `k`
# on device `k`, and its outputs come back split the same way. They stay there:
# a `ShardedArray` is an `Array` whose rows live on different devices. Printing
# it gathers the rows; passing it to the same `pmap` again reuses them in place;
# passing it to a `jit` copies the gathered rows to the first device once. Both
# halves of the runtime are jaxlib calls with no idea of their own, so they are
# folded.


# %% tags=["export", "hide-input"]
# @title ShardedArray: rows on their devices; shard_rows puts an input there
class ShardedArray(Array):
    """An array whose rows live on different devices: row ``i`` on device ``i``."""

    def __init__(self, rows: Any) -> None:
        self._rows = rows

    @functools.cached_property
    def _buffer(self) -> Any:  # for one-device calls: gathered, on device 0
        return device_put(np.asarray(self._rows))._buffer


def shard_rows(x: Any, devices: tuple) -> Any:
    """``x`` as one array of ``len(devices)`` shards, row ``i`` on device ``i``."""
    sharding = rows_sharding(devices)
    if isinstance(x, ShardedArray) and x._rows.sharding == sharding:
        return x._rows  # already in place: no copy
    from jaxlib import _jax

    x = np.asarray(x)
    aval = jax.core.ShapedArray(x.shape, x.dtype)
    # Fresh rows: a buffer may share a row's memory, and nothing else can write it.
    rows = [x[i : i + 1].copy() for i in range(len(devices))]
    return _jax.batched_device_put(aval, sharding, rows, devices, True, enable_x64=True)


# %% tags=["export", "hide-input"]
# @title A ShardedArray's shape and host copy; where an array lives; a sharding by rows
ShardedArray.shape = property(lambda self: tuple(self._rows.shape))
ShardedArray.dtype = property(lambda self: np.dtype(self._rows.dtype))
ShardedArray.__array__ = lambda self, dtype=None, copy=None: np.asarray(
    self._rows, dtype=dtype, copy=copy
)

# Where an array lives, as JAX says it: the set of its devices, and its pieces
Array.devices = lambda self: self._buffer.devices()
Array.addressable_shards = property(lambda self: self._buffer.addressable_shards)
ShardedArray.devices = lambda self: self._rows.devices()
ShardedArray.addressable_shards = property(lambda self: self._rows.addressable_shards)


@functools.cache
def rows_sharding(devices: tuple) -> jax.sharding.Sharding:
    """Axis 0 split across ``devices``, one row on each."""
    mesh = jax.sharding.Mesh(np.array(devices), ("rows",))
    return jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("rows"))


# %% [markdown]
# (part9-pmap)=
# ## `pmap`
#
# `pmap_p` is a higher-order primitive, like `xla_call`, whose parameters are
# the traced function (the program for one row), the axis name and the number
# of rows. Its primitive always maps axis 0 of every input and output; the
# user-facing `pmap` moves `in_axes` to the front, gives every device a copy of
# an input with `in_axes=None` and of the jaxpr's constants, and moves the
# outputs' device axis to `out_axes`. While tracing, it binds the axis name to
# the tracing interpreter, so that collectives in the function are staged as
# equations. The jaxpr is traced once per row type and number of rows, and
# compiled once per jaxpr and number of rows. As in JAX, `devices=` (a list
# from `devices()`) says where the rows run: row `i` on the list's `i`-th
# device.

# %% tags=["export"]
pmap_p = Primitive("pmap", multiple_results=True)


def pmap(
    f: Callable,
    axis_name: Hashable = None,
    in_axes: Any = 0,
    out_axes: int = 0,
    devices: Sequence | None = None,
):
    """Run ``f`` on every row of the mapped inputs, one row per device (the
    first ones of ``devices``, if given), with collectives over ``axis_name``
    communicating between the devices."""
    traces: dict[tuple, tuple] = {}

    def pmapped(*args: Any) -> Any:
        args_flat, axes_flat, in_tree = _flatten_pmap_args(in_axes, args)
        n = check_pmap_rows(args_flat, axes_flat, devices)
        rows = [move_batch_axis(n, ax, 0, x) for x, ax in zip(args_flat, axes_flat)]
        one_row = [ShapedArray(get_aval(x).shape[1:], get_aval(x).dtype) for x in rows]
        body = with_axis(f, axis_name, n)
        jaxpr, consts, out_tree = trace_for_pmap(body, traces, n, one_row, in_tree)
        consts = [move_batch_axis(n, None, 0, c) for c in consts]  # a copy per row
        with running_on(devices):
            outs = bind(
                pmap_p, *consts, *rows, jaxpr=jaxpr, axis_name=axis_name, axis_size=n
            )
        outs = [move_batch_axis(n, 0, pmap_out_axis(out_axes, x), x) for x in outs]
        return tree_unflatten(out_tree, outs)

    return pmapped


def with_axis(f: Callable, axis_name: Hashable, size: int) -> Callable:
    """``f``, with ``axis_name`` bound to the interpreter that traces it."""

    def f_with_axis(*args):
        with bind_axis(axis_name, size, _state.dynamic):
            return f(*args)

    return f_with_axis


@pmap_p.def_rule("impl")
def _pmap_impl(*args, jaxpr, axis_name, axis_size):
    return compile_pmap(jaxpr, axis_size)(*args)


# %% tags=["export", "hide-input"]
# @title The axis names a call uses and does not bind; pmap's output types
def free_axis_names(jaxpr: Jaxpr) -> frozenset:
    if jaxpr not in _free_names:
        names = set()
        for eqn in jaxpr.eqns:
            if eqn.primitive in AXIS_USERS:
                names |= set(AXIS_USERS[eqn.primitive](eqn.params))
        _free_names[jaxpr] = frozenset(names)
    return _free_names[jaxpr]


_free_names: weakref.WeakKeyDictionary[Jaxpr, frozenset] = weakref.WeakKeyDictionary()


def _names_in_jaxpr_params(params: dict) -> frozenset:
    jaxprs = [v for v in params.values() if isinstance(v, Jaxpr)]
    return frozenset().union(*map(free_axis_names, jaxprs))


for _prim in PRIMITIVES.values():
    if _prim.name in (
        "xla_call",
        "cond",
        "while",
        "scan",
        "custom_jvp_call",
        "custom_vjp_call",
    ):
        AXIS_USERS[_prim] = _names_in_jaxpr_params


AXIS_USERS[pmap_p] = lambda params: (
    free_axis_names(params["jaxpr"]) - {params["axis_name"]}
)


@pmap_p.def_rule("abstract_eval")
def _pmap_abstract_eval(*avals_in, jaxpr, axis_name, axis_size):
    return [
        ShapedArray((axis_size, *t.shape), t.dtype) for t in jaxpr_type(jaxpr).out_types
    ]


# %% tags=["export", "hide-input"]
# @title Checks: pmap's in_axes, row counts and device count
def _flatten_pmap_args(in_axes: Any, args: tuple) -> tuple[list, list, PyTreeDef]:
    try:
        return _flatten_vmap_args(in_axes, args)
    except (TypeError, ValueError) as e:  # vmap's checks, in pmap's name
        raise type(e)(str(e).replace("vmap", "pmap")) from None


def pmap_out_axis(out_axes: Any, out: Any) -> int:
    ndim = get_aval(out).ndim
    if not _is_axis(out_axes) or not -ndim <= out_axes < ndim:
        raise ValueError(
            f"pmap: out_axes must be an int in [{-ndim}, {ndim}) for an output "
            f"of shape {get_aval(out).shape} (including the device axis), "
            f"got {out_axes!r}"
        )
    return out_axes % ndim


def trace_for_pmap(f, traces: dict, n: int, one_row: list, in_tree: PyTreeDef):
    """As jit's trace_for_call: one jaxpr per row type (and number of rows)."""
    key = (n, in_tree, tuple(one_row))
    if key not in traces:
        for aval in one_row:
            check_xla_dtype(aval.dtype, "pmap")
        args = tree_unflatten(in_tree, one_row)
        traced = _trace_to_jaxpr(f, args, who="pmap")
        jaxpr, consts, out_tree = traced
        if any(isinstance(c, Tracer) for c in consts):
            return traced  # valid for this call only
        traces[key] = (jaxpr, [device_put(c) for c in consts], out_tree)
    return traces[key]


def check_pmap_rows(args: list, axes: list, given: Sequence | None = None) -> int:
    """The number of rows (one per device), checked against the devices."""
    (n,) = {get_aval(x).shape[ax] for x, ax in zip(args, axes) if ax is not None}
    available = len(devices())
    if n == 0:
        raise ValueError("pmap: the mapped axis has 0 rows: nothing to run")
    if given is not None:
        check_given_devices(n, given)
    if n > available:
        raise ValueError(
            f"pmap: the mapped axis has {n} rows but there are only {available} "
            f"devices; map over at most {available} rows (e.g. reshape to "
            f"({available}, -1, ...) and vmap inside each device)"
        )
    return n


# %% [markdown]
# The same `normalize`, now on four devices. The result's rows are still on
# the devices that computed them, as the picture after the output shows:

# %%
y = pmap(normalize, axis_name="i")(x)
print(y)
print([shard.device.id for shard in y.addressable_shards])

# %% mystnb={"image": {"alt": "Four lanes, one per device. On the left, the input rows [1, 2, 3] to [10, 11, 12], each with an arrow to its device box, device 0 to device 3, each running the same program. One vertical band crosses all four boxes: the psum, an all_reduce with add, which gives every replica the total. On the right, each device box points to its output row, which stays on that device."}} tags=["hide-input"]
# @title Drawing the rows on their devices (the code is in figures.py)
from figures import draw_rows_on_devices

draw_rows_on_devices(x, y)

# %% [markdown]
# Here is the jaxpr of one row, with the `psum` staged as an equation, and the
# module XLA compiles for it: the row comes in as
# `tensor<1x3xf64>`, and the `psum` is an `all_reduce` over the group
# `[[0, 1, 2, 3]]` with an `add` in its region.

# %%
one_row = ShapedArray((3,), np.float64)
row_jaxpr, _, _ = make_jaxpr(with_axis(normalize, "i", 4), one_row)
print(row_jaxpr)
print(lower_pmap(row_jaxpr, 4))

# %% [markdown]
# `pmap` over more rows than devices is an error (with `vmap` inside, each
# device can take a block of rows), and so are leading axes of different sizes:

# %%
show_error(pmap(normalize, axis_name="i"), np.ones((9, 3)))
show_error(pmap(lambda a, b: a + b), np.ones((4, 3)), np.ones((2, 3)))


# %% [markdown]
# ## Transformations compose
#
# `pmap_p` needs the same rules as `xla_call`, each a small twist on Part 3's
# and Part 4's:
#
# - **JVP**: a `pmap` of the JVP jaxpr of the body, primals and tangents all
#   split by rows;
# - **batching**: the device axis is axis 0, so the batch goes to axis 1, and
#   the body is batched like any other sub-jaxpr;
# - **partial evaluation**: a known `pmap` that also returns the residuals
#   (one per row, so they stay on the devices), and a staged unknown `pmap`
#   that takes them;
# - **transposition**: a `pmap` of the transposed body.
#
# Each of these traces a new body, which may contain collectives over the
# `pmap`'s own axis (the JVP of a `psum` is a `psum`), so the axis name is bound
# while the new body is traced. A `pmap` inside `jit` is lowered as its body
# batched over the rows (the folded lowering rule below), so `jit(pmap(f))`
# gives `pmap(f)`'s values.


# %% tags=["export"]
def check_given_devices(n: int, given: Sequence) -> None:
    known = devices()
    for d in given:
        if d not in known:
            raise TypeError(
                f"pmap: devices= must hold devices from devices(), got {d!r}"
            )
    if len(set(given)) != len(given):
        raise ValueError(f"pmap: devices= names a device twice: {list(given)}")
    if n > len(given):
        raise ValueError(
            f"pmap: the mapped axis has {n} rows but devices= gives only "
            f"{len(given)} devices; give at least {n}"
        )


def rows_of(n: int, consts: list) -> list:
    """Constants of a new body, one copy per device (pmap maps every input)."""
    return [move_batch_axis(n, None, 0, c) for c in consts]


@pmap_p.def_rule("jvp")
def _pmap_jvp(primals, tangents, *, jaxpr, axis_name, axis_size):
    with bind_axis(axis_name, axis_size, _state.dynamic):
        new_jaxpr, consts = jvp_jaxpr(jaxpr)
    params = dict(axis_name=axis_name, axis_size=axis_size)
    outs = bind(
        pmap_p,
        *rows_of(axis_size, consts),
        *primals,
        *tangents,
        jaxpr=new_jaxpr,
        **params,
    )
    n = len(outs) // 2
    return outs[:n], outs[n:]


# %% tags=["export", "hide-input"]
# @title pmap's batching and transpose rules
@pmap_p.def_rule("vmap")
def _pmap_vmap(axis, vals, dims, *, jaxpr, axis_name, axis_size):
    # Axis 0 is the devices' axis, so each row's batch goes to axis 1.
    vals = [
        v if d is None else move_batch_axis(axis.size, d, 1, v)
        for v, d in zip(vals, dims)
    ]
    batched = tuple(d is not None for d in dims)
    with bind_axis(axis_name, axis_size, _state.dynamic):
        new_jaxpr, consts = vmap_jaxpr(jaxpr, axis, batched)
    params = dict(axis_name=axis_name, axis_size=axis_size)
    outs = bind(pmap_p, *rows_of(axis_size, consts), *vals, jaxpr=new_jaxpr, **params)
    return outs, [1] * len(outs)


@pmap_p.def_rule("transpose")
def _pmap_transpose(cts, *args, jaxpr, axis_name, axis_size):
    undefined = tuple(_is_undef(x) for x in args)
    with bind_axis(axis_name, axis_size, _state.dynamic):
        new_jaxpr, consts = transpose_jaxpr(jaxpr, undefined)
    defined = [x for x in args if not _is_undef(x)]
    out_types = _pmap_abstract_eval(
        jaxpr=jaxpr, axis_name=axis_name, axis_size=axis_size
    )
    cts = [zeros_like_aval(t) if ct is None else ct for ct, t in zip(cts, out_types)]
    params = dict(axis_name=axis_name, axis_size=axis_size)
    cts_in = iter(
        bind(
            pmap_p,
            *rows_of(axis_size, consts),
            *defined,
            *cts,
            jaxpr=new_jaxpr,
            **params,
        )
    )
    return [next(cts_in) if u else None for u in undefined]


# %% tags=["export", "hide-input"]
# @title pmap's partial evaluation: known rows now, unknown rows staged (as xla_call's)
@pmap_p.def_rule("partial_eval")
def _pmap_partial_eval(trace, tracers, *, jaxpr, **params):
    in_unknowns = [not t.pval.is_known for t in tracers]
    jaxpr_known, jaxpr_unknown, out_unknowns, num_res = split_call_jaxpr(
        jaxpr, tuple(in_unknowns)
    )
    known_vals = [t.pval.const for t in tracers if t.pval.is_known]
    known_outs_and_res = bind(pmap_p, *known_vals, jaxpr=jaxpr_known, **params)
    split = len(known_outs_and_res) - num_res
    known_outs, residuals = known_outs_and_res[:split], known_outs_and_res[split:]
    residual_tracers = [trace.instantiate_const(trace.pure(r)) for r in residuals]
    unknown_tracers = [t for t in tracers if not t.pval.is_known]
    unknown_outs = trace.stage(
        pmap_p, residual_tracers + unknown_tracers, dict(jaxpr=jaxpr_unknown, **params)
    )
    known_iter, unknown_iter = iter(known_outs), iter(unknown_outs)
    return [
        next(unknown_iter) if unk else trace.pure(next(known_iter))
        for unk in out_unknowns
    ]


@pmap_p.def_rule("partial_eval_jaxpr")
def _pmap_partial_eval_jaxpr(unks_in, eqn):
    params = {k: v for k, v in eqn.params.items() if k != "jaxpr"}
    jaxpr_known, jaxpr_unknown, out_unknowns, num_res = split_call_jaxpr(
        eqn.params["jaxpr"], tuple(unks_in)
    )
    known_outs = [v for v, u in zip(eqn.out_binders, out_unknowns) if not u]
    unknown_outs = [v for v, u in zip(eqn.out_binders, out_unknowns) if u]
    n = params["axis_size"]
    residuals = [
        Var(ShapedArray((n, *v.aval.shape), v.aval.dtype))
        for v in jaxpr_known.outs[len(known_outs) :]
    ]
    known_ins = [x for x, u in zip(eqn.inputs, unks_in) if not u]
    unknown_ins = [x for x, u in zip(eqn.inputs, unks_in) if u]
    eqn_known = JaxprEqn(
        pmap_p, known_ins, dict(jaxpr=jaxpr_known, **params), known_outs + residuals
    )
    eqn_unknown = JaxprEqn(
        pmap_p,
        residuals + unknown_ins,
        dict(jaxpr=jaxpr_unknown, **params),
        unknown_outs,
    )
    return eqn_known, eqn_unknown, out_unknowns, residuals


# %% tags=["export", "hide-input"]
# @title Lowering pmap inside jit: its rows as a batch on jit's device
class PmapInsideJitError(TypeError):
    """pmap was staged into a program that already runs one row per device."""


@pmap_p.def_rule("lower")
def _pmap_lower(ctx, avals_in, avals_out, *args, jaxpr, axis_name, axis_size):
    if ctx.replicas is not None:
        raise PmapInsideJitError(
            "pmap inside another pmap is not supported: the enclosing program "
            "already runs one row per device; use vmap for the inner mapped "
            "axis (jit inside pmap, and pmap inside jit, are fine)"
        )
    # The same values as pmap: the body batched over the rows, collectives
    # and all (vmap with the same axis name), called on jit's one device.
    batched, consts = vmap_jaxpr(jaxpr, Axis(axis_size, axis_name), (True,) * len(args))
    operands = [*(dense_constant(c) for c in consts), *args]
    callee = ctx.function_for(batched)
    out_types = [ir_type(a) for a in avals_out]
    call = mlir_func.CallOp(out_types, ir.FlatSymbolRefAttr.get(callee), operands)
    return list(call.results)


def dense_constant(value: Any) -> ir.Value:
    """A StableHLO constant holding the array ``value``."""
    x = np.ascontiguousarray(np.asarray(value))
    if x.dtype == np.bool_:  # MLIR packs booleans; build them from int8
        as_int = hlo.constant(ir.DenseElementsAttr.get(x.astype(np.int8)))
        return hlo.convert(ir_type(ShapedArray(x.shape, x.dtype)), as_int)
    return hlo.constant(ir.DenseElementsAttr.get(x))


# %% [markdown]
# A `jit` inside the `pmap`ped function is an ordinary call in the body: its
# jaxpr, `psum` and all, is staged as an `xla_call` equation and lowered to a
# function that every replica calls. And `grad` goes through a `pmap` with a
# `psum` in it, and agrees with JAX (in the folded cell below):

# %%
print(pmap(jit(normalize), axis_name="i")(x))

w = np.array([0.5, -0.3, 0.2])


def per_device(w, row):
    return sin(row * w) / psum(row * row, "i")


def loss(w):
    return reduce_sum(pmap(per_device, axis_name="i", in_axes=(None, 0))(w, x))


print(grad(loss)(w))


# %% tags=["hide-input"]
# @title The same gradient with JAX
def jax_loss(w):
    def per_device(w, row):
        return jax.numpy.sin(row * w) / jax.lax.psum(row * row, "i")

    return jax.pmap(per_device, axis_name="i", in_axes=(None, 0))(w, x).sum()


with jax.enable_x64(True):
    print(jax.grad(jax_loss)(w))

# %% [markdown]
# ### Data-parallel training
#
# Finally the program this chapter set out to run: a linear model, a batch of
# 64 examples split over 8 devices, each device computing the gradient on its
# 8 examples, and `pmean` averaging the gradients so that every device takes
# the same step. Three steps (JAX's, in the folded cell after them, are the
# same):

# %%
rng = np.random.default_rng(0)
features = rng.normal(size=(8, 8, 3))  # (devices, examples per device, features)
targets = features @ np.array([1.0, -2.0, 0.5]) + 0.1 * rng.normal(size=(8, 8))


def mse(w, xs, ys):
    errors = xs @ w - ys
    return reduce_sum(errors * errors) / ys.shape[0]


def sgd_step(w, xs, ys):
    return w - 0.1 * pmean(grad(mse)(w, xs, ys), "batch")


parallel_step = pmap(sgd_step, axis_name="batch")
ws = np.zeros((8, 3))  # one copy of the parameters per device
for step in range(3):
    ws = parallel_step(ws, features, targets)
    print(step, np.asarray(ws)[0])
print("the same on every device:", bool(np.all(np.asarray(ws) == np.asarray(ws)[0])))


# %% tags=["hide-input"]
# @title The same three steps with JAX, and the largest difference
def jax_sgd_step(w, xs, ys):
    g = jax.grad(lambda w: jax.numpy.mean((xs @ w - ys) ** 2))(w)
    return w - 0.1 * jax.lax.pmean(g, "batch")


with jax.enable_x64(True):
    jax_ws = np.zeros((8, 3))
    jax_parallel_step = jax.pmap(jax_sgd_step, axis_name="batch")
    for step in range(3):
        jax_ws = jax_parallel_step(jax_ws, features, targets)
        print(step, jax_ws[0])
    print("largest difference from ours:", np.abs(np.asarray(ws) - jax_ws).max())

# %% [markdown]
# Every device holds the same parameters after each step (row 0 is printed,
# and the last line checks the others), and they agree with JAX's to rounding.
#
# ## Where real JAX differs
#
# - **`pmap` is built from other parts.** In JAX 0.10.2, `jax.pmap` is `jit`
#   of `shard_map`: the printed jaxpr shows a `jit` equation whose body is a
#   `shard_map` over a one-axis mesh, with the collectives inside written as
#   `psum[axes=('i',) ...]`. There is no `pmap` primitive any more. Its body
#   receives each device's block as `f64[1,3]` and squeezes it to a row, as
#   our `main` does with a reshape.

# %%
with jax.enable_x64(True):
    jaxpr = jax.make_jaxpr(jax.pmap(lambda r: r / jax.lax.psum(r, "i"), "i"))(x)
    print(jaxpr.pretty_print(use_color=False))


# %% [markdown]
# - **`pmap` inside `jit`.** JAX compiles `jit(pmap(f))` into one program that
#   still spreads the rows over the devices (a `shard_map` inside the `jit`);
#   ours lowers the `pmap` as a `vmap` with the same axis name into `jit`'s
#   one-device program, so the values agree but the rows share one device.
# - **No levels, no frames pointing at them.** JAX's tracing no longer keeps
#   an interpreter stack of levels (it became "stackless"): `bind` goes to the
#   *current*, innermost trace, and a trace passes an operation it does not
#   own to its parent trace. The axis sizes live in the tracing context
#   (`jax._src.core.AxisEnv`, whose lookup raises `NameError` for an unbound
#   name), and each batching trace carries its axis name (`AxisData.name`); a
#   collective's batching rule reduces if the name is its own and otherwise
#   hands the collective on. So JAX finds a collective's interpreter by name
#   walking *down* from the top, where ours raises it *up* to the level that
#   bound the name; the answers are the same.
# - **Under `vmap`, JAX's `axis_index` is an `iota` primitive**, not a
#   constant. And its `psum` over a tuple of axis names is one primitive with
#   `axes=(...)`, where ours binds one `psum` per name.
# - **Shardings instead of replicas.** Modern JAX programs usually do not call
#   `pmap`: they `jit` a function of arrays that carry a
#   [sharding](https://docs.jax.dev/en/latest/sharded-computation.html) (how
#   an array is split over a mesh of devices), and the compiler's partitioner
#   (GSPMD, and now Shardy) decides where each operation runs and inserts the
#   collectives itself. [`shard_map`](https://docs.jax.dev/en/latest/notebooks/shard_map.html)
#   is the explicit form, where the user writes the per-device program and its
#   collectives, as in this chapter. Ours compiles for replicas; JAX compiles
#   one program for `num_partitions` partitions (`jax.pmap(f).lower(x)` shows
#   `mhlo.num_partitions = 4`, `mhlo.num_replicas = 1` for four rows), and its
#   `all_reduce` carries a channel handle, as collectives across partitions
#   must.
# - **Multi-host.** On a cluster, each process sees only its local devices, and
#   collectives cross the network; JAX's
#   [multi-process guide](https://docs.jax.dev/en/latest/multi_process.html)
#   explains how. Ours is one process.
# - **Derivatives of `pmax`.** JAX has none (`grad` of a `pmax` is a
#   `NotImplementedError`); ours shares the tangent among the members that
#   hold the maximum.
#
# ## Summary
#
# - A name is bound to a size and to the interpreter that handles it:
#   `vmap(..., axis_name=)` puts its name in its own level's `Axis` (since
#   Part 1); `pmap` pushes an axis frame naming the interpreter that traces
#   its function.
# - `bind` raises a collective (and a call whose jaxpr contains one) to the
#   level that bound its axis: a collective finds its interpreter by name,
#   which is how `psum(3.0, "i")` and `axis_index("i")` work.
# - Under a named `vmap`, collectives are operations on the batch axis:
#   `psum` is `reduce_sum`, `axis_index` an iota; a rule that batches a
#   sub-jaxpr keeps the name.
# - `pmap` compiles one program for `n` replicas, collectives lowered to
#   `all_reduce`, `all_gather` and `replica_id`; it runs on one `n`-piece array
#   per input and leaves its outputs on the devices.
# - With JVP, batching, partial evaluation and transpose rules for `pmap_p`,
#   `grad` goes through `pmap`, and `pmap(grad(...))` with `pmean` is a
#   data-parallel training step.
#
# ## Exercises
#
# **1. A softmax over devices.** Write `softmax_over(v, name)`, which
# subtracts the maximum over the axis (for stability), exponentiates, and
# divides by the sum over the axis. Check it under `vmap` and `pmap` against a
# softmax over axis 0 in NumPy.


# %% tags=["hide-input"]
# @title A solution
def softmax_over(v, name):
    e = exp(v - pmax(v, name))
    return e / psum(e, name)


def numpy_softmax(a):
    e = np.exp(a - a.max(axis=0))
    return e / e.sum(axis=0)


print(
    np.allclose(
        vmap(lambda v: softmax_over(v, "i"), axis_name="i")(x), numpy_softmax(x)
    )
)
print(
    np.allclose(
        pmap(lambda v: softmax_over(v, "i"), axis_name="i")(x), numpy_softmax(x)
    )
)


# %% [markdown]
# **2. A cumulative sum with `all_gather` and `axis_index`.** Each member
# should get the sum of the values of the members at or before its position.
# Gather everything, then keep what comes before you.


# %% tags=["hide-input"]
# @title A solution
def cumsum_over(v, name):
    everything = all_gather(v, name)  # (n, ...) on every member
    n = everything.shape[0]
    mine = broadcast(axis_index(name), (n,), (0,))
    upto = less(np.arange(n, dtype=np.int32), mine + 1)
    zeros = np.zeros(everything.shape, everything.dtype)
    return reduce_sum(select(per_example(upto, everything), everything, zeros), 0)


print(pmap(lambda v: cumsum_over(v, "i"), axis_name="i")(x))
print(np.cumsum(x, axis=0))


# %% [markdown]
# **3. Blocks of rows.** `pmap` takes at most one row per device. Write
# `pmap_blocks(f)`, which reshapes `(k * 8, ...)` inputs into
# `(8, k, ...)`, runs `vmap(f)` inside `pmap`, and reshapes back, so that `f`
# sees one example at a time. Which axis name should a `psum` over *all*
# examples use? (Both: sum over the examples of the block, then over devices.)


# %% tags=["hide-input"]
# @title A solution
def pmap_blocks(f, n_devices=8):
    def run(xs):
        blocks = reshape(xs, (n_devices, -1, *xs.shape[1:]))
        out = pmap(vmap(f, axis_name="block"), axis_name="device")(blocks)
        return reshape(out, (-1, *out.shape[2:]))

    return run


def share(v):
    return v / psum(psum(v, "block"), "device")


many = np.arange(1.0, 49.0).reshape(16, 3)
print(np.allclose(pmap_blocks(share)(many), many / many.sum(axis=0)))
