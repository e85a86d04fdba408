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
# (part3)=
# # Part 3: `jit`, compiling jaxprs with XLA
#
# {ref}`Part 2 <part2>` taught us to turn a Python function into a jaxpr: a small,
# typed, self-contained program. This chapter hands that program to a real
# compiler. {term}`XLA`, the compiler behind JAX and TensorFlow, takes programs written in
# **{term}`StableHLO`**, an array language much like our jaxprs, and turns them into fast
# machine code for CPUs, GPUs and TPUs. We will:
#
# 1. translate ({term}`lower <lowering>`) each primitive to StableHLO, using the MLIR Python
#    bindings that ship inside `jaxlib`;
# 2. compile the result with XLA's client library, and cache the executable;
# 3. introduce a device-resident `Array`, so that results stay on the device and
#    feed the next compiled call directly;
# 4. package all that as `jit`, a **{term}`higher-order primitive`** that carries a jaxpr,
#    with rules that let `jvp`, `vmap` and `make_jaxpr` see through it.
#
# Nothing here needs a GPU: XLA compiles for the CPU just as well, and everything
# below runs on it.
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

book_setup.load_book(globals(), before="part3_jit")

# %% [markdown]
# ## Two ways to process a function
#
# The interpreters of Part 1 process a function **one primitive at a time**, as
# it runs: `jvp` never sees the whole function, only each `bind` as it happens.
# JAX calls this *{term}`final style`*: the transformation is applied at the last moment,
# primitive by primitive, and the function's Python code runs under it.
#
# A compiler cannot work like that. It needs the entire computation before it
# runs any of it. So `jit` works in **{term}`initial style`**: it first traces the function
# into a jaxpr (with `make_jaxpr` from Part 2), and only then decides what to do
# with the whole program. The jaxpr travels as a *{term}`parameter <params>`* of a new primitive,
# `xla_call`, and `jit(f)(x)` is nothing more than `bind(xla_call_p, x,
# jaxpr=<f's jaxpr>)`.
#
# That one choice buys composition for free. An interpreter that meets
# `xla_call` gets the *whole* jaxpr in the params and can transform it as a unit:
# `jvp` turns it into the jaxpr of the derivative and calls that, still compiled;
# `vmap` turns it into the jaxpr of the batched function; `make_jaxpr` records a
# single `xla_call` equation with the inner jaxpr nested inside. Only the
# evaluation interpreter at the bottom actually compiles and runs it.
#
# The imports of this chapter: the MLIR bindings (the Python API for building
# StableHLO programs) come with `jaxlib`, the compiled half of JAX that also
# contains XLA. We use `jaxlib` only as a compiler and a device runtime; none of
# JAX's own transformations are involved. From `jax` itself we take only XLA's
# CPU client and the few types its calls expect. We import it before `jaxlib`
# because its import sets XLA's C++ log level (`TF_CPP_MIN_LOG_LEVEL`); without
# that, starting the client prints info lines.

# %% tags=["export"]
import functools

import jax  # before jaxlib: it quiets XLA's C++ info logs
import jax.extend.backend
from jaxlib.mlir import ir
from jaxlib.mlir.dialects import func as mlir_func
from jaxlib.mlir.dialects import stablehlo as hlo


# %% [markdown]
# ## Lowering to StableHLO
#
# StableHLO programs are written in MLIR, a framework for building compiler
# intermediate languages. For our purposes MLIR looks like this: a *module*
# contains *functions*; a function's body is a list of *operations*, each taking
# *values* and producing new values; every value has a type such as
# `tensor<3x4xf64>`. That is almost exactly a jaxpr, so lowering is a walk over
# the equations that emits one or a few operations per equation.
#
# Types first. A `ShapedArray` of shape `(3, 4)` and dtype `float64` becomes the
# tensor type `tensor<3x4xf64>`; booleans are one-bit integers (`i1`).


# %% tags=["export"]
def ir_element_type(dtype: np.dtype) -> ir.Type:
    dtype = np.dtype(dtype)
    check_xla_dtype(dtype)
    bits = dtype.itemsize * 8
    if dtype.kind == "b":
        return ir.IntegerType.get_signless(1)
    if dtype.kind == "f":
        return {16: ir.F16Type, 32: ir.F32Type, 64: ir.F64Type}[bits].get()
    if dtype.kind == "i":
        return ir.IntegerType.get_signless(bits)
    return ir.IntegerType.get_unsigned(bits)


def ir_type(aval: ShapedArray) -> ir.RankedTensorType:
    return ir.RankedTensorType.get(aval.shape, ir_element_type(aval.dtype))


def ir_constant(value: Any, aval: ShapedArray) -> ir.Value:
    """A StableHLO constant holding the scalar ``value`` at every position."""
    element = ir_element_type(aval.dtype)
    if aval.dtype.kind == "f":
        attr = ir.FloatAttr.get(element, float(value))
    else:
        attr = ir.IntegerAttr.get(element, int_bits(value))
    return hlo.constant(ir.DenseElementsAttr.get_splat(ir_type(aval), attr))


# %% [markdown]
# MLIR builds everything inside a *context* that knows the dialects in use;
# `mlir_context()` makes one, with the `func` and `stablehlo` dialects loaded.
# XLA has no type for some NumPy dtypes, such as `float128`; `check_xla_dtype`
# refuses them with a `TypeError` that names the dtype. Both are in the folded
# cell.


# %% tags=["export", "hide-input"]
# @title The MLIR context; int_bits; checks: dtypes that XLA has no type for
def int_bits(value: Any) -> int:
    """``value`` as the int64 with the same 64 bits: MLIR's Python binding
    takes an int64, so a uint64 above 2**63 - 1 is passed as a negative one."""
    value = int(value)
    return value - 2**64 if value >= 2**63 else value


@functools.cache
def mlir_context() -> ir.Context:
    """One MLIR context with the dialects we use (func and stablehlo)."""
    from jaxlib.mlir._mlir_libs import _jax_mlir_ext

    registry = ir.DialectRegistry()
    _jax_mlir_ext.register_dialects(registry)
    context = ir.Context()
    context.append_dialect_registry(registry)
    context.load_all_available_dialects()
    hlo.register_dialect(context)
    return context


def check_xla_dtype(dtype: np.dtype, who: str = "jit") -> None:
    """Refuse a dtype that XLA has no type for (NumPy's float128, say)."""
    if dtype.kind not in "biuf" or dtype.itemsize > 8:
        raise TypeError(
            f"{who}: XLA has no type for dtype {dtype.name}; use booleans, "
            "integers of up to 64 bits, or float16/32/64"
        )


# %% [markdown]
# A lowering rule receives a context object (more on it below), the abstract
# values of the equation's inputs and outputs, the MLIR values of its inputs, and
# its params; it returns the MLIR values of the outputs. Most rules are a single
# StableHLO operation.


# %% tags=["export"]
def _lower_with(prim: Primitive, make_op: Callable) -> None:
    @prim.def_rule("lower")
    def rule(ctx, avals_in, avals_out, *operands):
        return [make_op(*operands)]


_lower_with(add_p, hlo.add)
_lower_with(mul_p, hlo.multiply)
_lower_with(neg_p, hlo.negate)
_lower_with(sin_p, hlo.sine)
_lower_with(cos_p, hlo.cosine)


@transpose_p.def_rule("lower")
def _transpose_lower(ctx, avals_in, avals_out, x, *, perm):
    return [hlo.transpose(x, ir.DenseI64ArrayAttr.get(perm))]


@broadcast_p.def_rule("lower")
def _broadcast_lower(ctx, avals_in, avals_out, x, *, shape, axes):
    # StableHLO names where the operand's axes go, not where the new ones are.
    kept = [i for i in range(len(shape)) if i not in axes]
    out_type = ir_type(avals_out[0])
    return [hlo.broadcast_in_dim(out_type, x, ir.DenseI64ArrayAttr.get(kept))]


# %% [markdown]
# The comparisons are one `stablehlo.compare` each, told the direction (`GT`,
# `LT`) and whether to compare as floats, signed or unsigned integers; their rules
# are in the folded cell.


# %% tags=["export", "hide-input"]
# @title Lowering rules for greater and less
def _lower_comparison(prim: Primitive, direction: str) -> None:
    @prim.def_rule("lower")
    def rule(ctx, avals_in, avals_out, x, y):
        kind = {"f": "FLOAT", "i": "SIGNED"}.get(avals_in[0].dtype.kind, "UNSIGNED")
        direction_attr = hlo.ComparisonDirectionAttr.get(direction)
        kind_attr = hlo.ComparisonTypeAttr.get(kind)
        return [hlo.compare(x, y, direction_attr, compare_type=kind_attr)]


_lower_comparison(gt_p, "GT")
_lower_comparison(lt_p, "LT")


# %% [markdown]
# `reduce_sum` is the one structured operation: StableHLO's `reduce` takes an
# initial value and a small *region*, a function body that says how to combine two
# elements. For a sum, the region adds them and the initial value is zero.


# %% tags=["export"]
@reduce_sum_p.def_rule("lower")
def _reduce_sum_lower(ctx, avals_in, avals_out, x, *, axes):
    (x_aval,), (out_aval,) = avals_in, avals_out
    scalar = ShapedArray((), x_aval.dtype)
    zero = ir_constant(0, scalar)
    reduce = hlo.ReduceOp(
        [ir_type(out_aval)], [x], [zero], ir.DenseI64ArrayAttr.get(axes)
    )
    body = reduce.regions[0].blocks.append(ir_type(scalar), ir_type(scalar))
    with ir.InsertionPoint(body):
        hlo.ReturnOp([hlo.add(*body.arguments)])
    return [reduce.result]


# %% [markdown]
# Now the walk over a jaxpr. It creates an MLIR function whose arguments are the
# jaxpr's input binders, lowers each equation in order with its rule (literals
# become constants), and returns the jaxpr's outputs. The context object holds the
# module being built, so that a rule can add *more* functions to it: that is how
# `xla_call` below lowers a nested jaxpr to a function call.


# %% tags=["export"]
class LoweringContext:
    """The module being built, and the jaxprs already lowered into it."""

    def __init__(self) -> None:
        self.module = ir.Module.create()
        self.functions: dict[Jaxpr, str] = {}

    def function_for(self, jaxpr: Jaxpr) -> str:
        """The name of a function computing ``jaxpr`` (made once)."""
        if jaxpr not in self.functions:
            name = f"jaxpr_{len(self.functions)}"
            self.functions[jaxpr] = name
            lower_to_function(self, jaxpr, name, public=False)
        return self.functions[jaxpr]


def lower_to_function(
    ctx: LoweringContext, jaxpr: Jaxpr, name: str, public: bool
) -> mlir_func.FuncOp:
    in_types = [ir_type(v.aval) for v in jaxpr.in_binders]
    out_types = [ir_type(x.aval) for x in jaxpr.outs]
    with ir.InsertionPoint(ctx.module.body):
        function = mlir_func.FuncOp(name, ir.FunctionType.get(in_types, out_types))
    if not public:
        function.sym_visibility = ir.StringAttr.get("private")
    block = function.add_entry_block()
    env: dict[Var, ir.Value] = dict(zip(jaxpr.in_binders, block.arguments))

    def read(atom: Atom) -> ir.Value:
        if isinstance(atom, Lit):
            return ir_constant(atom.val, atom.aval)
        return env[atom]

    with ir.InsertionPoint(block):
        for eqn in jaxpr.eqns:
            rule = eqn.primitive.rule("lower")
            avals_in = [x.aval for x in eqn.inputs]
            avals_out = [v.aval for v in eqn.out_binders]
            operands = [read(x) for x in eqn.inputs]
            outs = rule(ctx, avals_in, avals_out, *operands, **eqn.params)
            env.update(zip(eqn.out_binders, outs))
        mlir_func.ReturnOp([read(x) for x in jaxpr.outs])
    return function


def lower_jaxpr(jaxpr: Jaxpr) -> ir.Module:
    """A StableHLO module whose public function ``main`` computes ``jaxpr``."""
    with mlir_context(), ir.Location.unknown():
        ctx = LoweringContext()
        lower_to_function(ctx, jaxpr, "main", public=True)
        ctx.module.operation.verify()
    return ctx.module


# %% [markdown]
# Here is a small function, its jaxpr, and the StableHLO we make of it. Each
# equation becomes one operation, plus a `stablehlo.constant` for each literal (the
# `2.0`, and the zero that `reduce` starts from):


# %%
def scaled_wave(x):
    return reduce_sum(sin(x) * 2.0, axis=0)


jaxpr, consts, _ = make_jaxpr(scaled_wave, ShapedArray((3,), np.float64))
print(jaxpr)
print(str(lower_jaxpr(jaxpr)).rstrip())


# %% [markdown]
# ## Compiling and running
#
# To run the module we need XLA's client for the CPU, which `jaxlib` provides;
# `runtime()` in the folded cell below returns it with its first device.
# Device memory is managed by `jaxlib` buffer objects; `device_put`, in the same
# cell, copies a NumPy array into one, keeping float64 as float64 (JAX's own front end
# would narrow it to float32 unless its global x64 switch is on, a switch this
# module never touches).


# %% tags=["export", "hide-input"]
# @title XLA's CPU client: runtime, and device_put to copy an array to it
# device_put asks for the copy to be finished before it returns. Left to
# choose, jaxlib on CPU may let the buffer share the NumPy array's memory, and
# an Array would then change whenever the NumPy array is written to.
class _Runtime(NamedTuple):
    client: Any
    device: Any
    sharding: Any


@functools.cache
def runtime() -> _Runtime:
    """XLA's CPU client and its first device (created on first use)."""
    client = jax.extend.backend.get_backend("cpu")
    device = client.local_devices()[0]
    return _Runtime(client, device, jax.sharding.SingleDeviceSharding(device))


# Python functions that compiled programs call back (`debug.print`, in the
# chapter on interpreters that read programs); a module names one by position.
HOST_CALLBACKS: list[Callable] = []


def compile_with_host_callbacks(module_text: str, devices: Any) -> Any:
    """xla_compile for a module that calls back into Python."""
    from jax._src.lib import xla_client

    with mlir_context():  # jaxlib takes host callbacks with a parsed module only
        module = ir.Module.parse(module_text)
    return runtime().client.compile_and_load(
        module, devices, xla_client.CompileOptions(), host_callbacks=HOST_CALLBACKS
    )


def device_put(x: np.ndarray) -> Array:
    """Copy a NumPy array to the device."""
    from jaxlib import _jax

    x = np.asarray(x)
    rt = runtime()
    aval = jax.core.ShapedArray(x.shape, x.dtype)
    # Copy before returning: the buffer never shares the NumPy array's memory.
    copy_now = _jax.HostBufferSemantics.IMMUTABLE_ONLY_DURING_CALL
    buffer = _jax.batched_device_put(
        aval, rt.sharding, [x], [rt.device], True, False, copy_now, True
    )
    return Array(buffer)


# %% [markdown]
# The call into XLA is two functions. `xla_compile` hands the client a module's
# text and gets an executable back; `xla_execute` runs an executable on device
# buffers and returns the buffers of its outputs (one list per output, one
# buffer per device: we have one).


# %% tags=["export"]
def xla_compile(module_text: str) -> Any:
    """XLA's executable for a StableHLO module, on our one device."""
    from jax._src.lib import xla_client

    rt = runtime()
    devices = xla_client.DeviceList((rt.device,))
    if "python_cpu_callback" in module_text:  # debug.print: folded above
        return compile_with_host_callbacks(module_text, devices)
    return rt.client.compile_and_load(module_text, devices, xla_client.CompileOptions())


def xla_execute(executable: Any, buffers: list) -> list:
    """Run ``executable`` on device buffers; the buffers of its outputs."""
    results = executable.execute_sharded(buffers)
    per_output = results.disassemble_into_single_device_arrays()
    return [bufs[0] for bufs in per_output]


# %% [markdown]
# The `Array` class wraps such a buffer. It knows its shape and dtype without
# touching the data, so passing it back into a compiled function needs no copy
# to the host. Only handing it to NumPy (`__array__`) copies it back. It has the
# same operators as tracers; outside `jit` they compute eagerly, with NumPy.


# %% tags=["export"]
class Array(ArrayOperators):
    """An array in device memory: what jitted functions return."""

    def __init__(self, buffer: Any) -> None:
        self._buffer = buffer

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self._buffer.shape)

    @property
    def dtype(self) -> np.dtype:
        return np.dtype(self._buffer.dtype)

    @property
    def aval(self) -> ShapedArray:
        return ShapedArray(self.shape, self.dtype)

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        return np.asarray(self._buffer, dtype=dtype, copy=copy)


# let as_array (Part 1) accept Arrays as they are, without a copy
DEVICE_ARRAY_TYPES = (Array,)


def _as_buffer(x: Any) -> Any:
    """The device buffer for an argument of a compiled call."""
    if isinstance(x, Array):
        return x._buffer
    return device_put(x)._buffer


# %% [markdown]
# The module's `Array` also behaves like a NumPy array in the small ways Python
# code expects: `ndim`, `len()`, `bool()`, `float()`, `int()`, printing, and
# winning over NumPy in mixed arithmetic; unfold to see them.


# %% tags=["export", "hide-input"]
# @title Array: ndim, len, Python numbers, printing
def _array_len(self: Array) -> int:
    if not self.shape:
        raise TypeError("len() of a 0-d Array")
    return self.shape[0]


def _array_repr(self: Array) -> str:
    body = np.array2string(np.asarray(self), separator=", ", prefix="Array(")
    return f"Array({body}, dtype={self.dtype.name})"


Array.__array_priority__ = 100  # NumPy defers to our operators: np_array * Array
Array.ndim = property(lambda self: len(self.shape))
Array.__len__ = _array_len
Array.__bool__ = lambda self: bool(np.asarray(self))
Array.__float__ = lambda self: float(np.asarray(self))
Array.__int__ = lambda self: int(np.asarray(self))
Array.__str__ = lambda self: str(np.asarray(self))
Array.__repr__ = _array_repr


# %% [markdown]
# Compilation turns a jaxpr into a callable. The expensive part — lowering and
# XLA's compilation — happens once per jaxpr; the result is cached, keyed by the
# jaxpr object itself. Calling it moves each argument to the device if it is not
# there already, runs the executable, and wraps the outputs as `Array`s.


# %% tags=["export"]
class CompiledJaxpr:
    """An XLA executable for one jaxpr."""

    def __init__(self, jaxpr: Jaxpr) -> None:
        self.module_text = str(lower_jaxpr(jaxpr))
        self.executable = xla_compile(self.module_text)

    def __call__(self, *args: Any) -> list[Array]:
        buffers = [_as_buffer(x) for x in args]
        return [Array(b) for b in xla_execute(self.executable, buffers)]


_compiled: dict[Jaxpr, CompiledJaxpr] = {}


def compile_jaxpr(jaxpr: Jaxpr) -> CompiledJaxpr:
    """The executable for ``jaxpr``, compiled on first request."""
    if jaxpr not in _compiled:
        _compiled[jaxpr] = CompiledJaxpr(jaxpr)
    return _compiled[jaxpr]


# %%
compiled = compile_jaxpr(jaxpr)
out = compiled(np.array([0.5, 1.0, 2.0]))
print(out)
print(2 * np.sin([0.5, 1.0, 2.0]).sum())

# %% [markdown]
# ## `jit` as a primitive
#
# Now the pieces come together. `xla_call` is a primitive with several outputs
# (one per output of its jaxpr); its only param is the jaxpr. Its `impl` rule
# compiles and runs, after checking that the arguments have the types the jaxpr
# expects (a compiled program would happily read the bits of an integer array as
# floats; the checks are folded further down). Because the jaxpr is a param, every interpreter that meets
# `xla_call` has the whole program in hand.

# %% tags=["export"]
xla_call_p = Primitive("xla_call", multiple_results=True)


@xla_call_p.def_rule("impl")
def _xla_call_impl(*args, jaxpr):
    check_call_types(jaxpr, args)
    return compile_jaxpr(jaxpr)(*args)


# %% [markdown]
# `jit(f)` is the user-facing wrapper: flatten the arguments, find or make
# `f`'s jaxpr for their types (`trace_for_call`), and bind `xla_call` on it.
# Tracing happens once per *input signature* (the argument structure plus each
# leaf's shape and dtype), so a second call with new values of the same types
# goes straight to the compiled code. The tracing is Part 2's `_trace_to_jaxpr`,
# the function behind `make_jaxpr`.
#
# As in JAX, `jit` also takes `static_argnums` and `static_argnames`: arguments
# whose values are part of the signature instead of being traced (so a new value
# traces again). `StaticArgs`, folded after the cell, wraps `f` so that it is
# called as `call_f(args, kwargs)` and marks those values; without static
# arguments it simply calls `f`.

# %% tags=["export"]
Traces = dict[tuple, tuple[Jaxpr, list[Any], PyTreeDef]]


def trace_for_call(f, traces: Traces, args_flat: list, in_tree: PyTreeDef):
    """``f``'s jaxpr, constants and output tree for arguments of these types."""
    avals = tuple(ShapedArray(x.shape, x.dtype) for x in args_flat)
    key = (in_tree, avals)
    if key not in traces:
        args = tree_unflatten(in_tree, avals)
        jaxpr, consts, out_tree = _trace_to_jaxpr(f, args, who="jit")
        if any(isinstance(c, Tracer) for c in consts):  # f closes over a tracer
            return jaxpr, consts, out_tree  # of an outer transformation: no cache
        traces[key] = (jaxpr, [device_put(c) for c in consts], out_tree)
    return traces[key]


def jit(f: Callable, static_argnums=(), static_argnames=()) -> Callable:
    """Compile ``f`` with XLA; trace once per input signature, which includes
    the values of the static arguments; keyword arguments are traced too."""
    traces: Traces = {}
    call_f = StaticArgs(f, static_argnums, static_argnames)  # call_f(args, kwargs)

    @functools.wraps(f)
    def f_jitted(*args: Any, **kwargs: Any) -> Any:
        args_flat, in_tree = tree_flatten(call_f.mark_static(args, kwargs))
        args_flat = [_as_input(x, "jit argument") for x in args_flat]  # arrays
        jaxpr, consts, out_tree = trace_for_call(call_f, traces, args_flat, in_tree)
        outs = bind(xla_call_p, *consts, *args_flat, jaxpr=jaxpr)
        return tree_unflatten(out_tree, outs)

    f_jitted.traces = traces  # for the curious: what has been traced so far
    return f_jitted


# %% [markdown]
# Static values must be hashable, as in JAX; the folded cell marks them.

# %% tags=["export", "hide-input"]
# @title Static and keyword arguments: jit's signature is (args, kwargs)
import inspect


class Static:
    """A static argument: a pytree node with no leaves whose structure is
    its value, so the value is part of the signature and is never traced."""

    def __init__(self, value: Any) -> None:
        self.value = value


register_pytree_node(Static, lambda s: ((), s.value), lambda value, _: Static(value))


def _unmark(x: Any) -> Any:
    return x.value if isinstance(x, Static) else x


class StaticArgs:
    """``f`` called as ``call_f(args, kwargs)``, and which of its arguments
    are static (positions and names resolved against ``f``'s signature)."""

    def __init__(self, f: Callable, static_argnums: Any, static_argnames: Any):
        self.f = f
        nums = _int_tuple(static_argnums, "static_argnums")
        names = _str_tuple(static_argnames, "static_argnames")
        self.static = bool(nums or names)
        if self.static:
            nums, names = _resolve_static(f, nums, names)
        self.nums, self.names = frozenset(nums), frozenset(names)

    def __call__(self, args: tuple, kwargs: dict) -> Any:
        if not self.static:
            return self.f(*args, **kwargs)
        kwargs = {k: _unmark(v) for k, v in kwargs.items()}
        return self.f(*map(_unmark, args), **kwargs)

    def mark_static(self, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        """``(args, kwargs)`` with each static value wrapped in ``Static``."""
        if not self.static:
            return args, kwargs
        n = len(args)
        nums = {i % n for i in self.nums if -n <= i < n}  # f(*args): per call
        args = tuple(
            _static(x, f"argument {i}") if i in nums else x for i, x in enumerate(args)
        )
        kwargs = {
            k: _static(v, f"argument {k!r}") if k in self.names else v
            for k, v in kwargs.items()
        }
        return args, kwargs


def _static(value: Any, what: str) -> Static:
    try:
        hash(value)
    except TypeError:
        raise ValueError(
            f"jit: static {what} must be hashable (its value is part of the "
            f"signature), got {type(value).__name__} {_short_repr(value)}; pass "
            "arrays as ordinary (traced) arguments"
        ) from None
    return Static(value)


def _int_tuple(nums: Any, name: str) -> tuple[int, ...]:
    nums = nums if isinstance(nums, (tuple, list)) else (nums,)
    if not all(_is_axis(i) for i in nums):
        raise TypeError(f"jit: {name} must be an int or a tuple of ints, got {nums!r}")
    return tuple(int(i) for i in nums)


def _str_tuple(names: Any, name: str) -> tuple[str, ...]:
    names = (names,) if isinstance(names, str) else names
    if not isinstance(names, (tuple, list)) or not all(
        isinstance(s, str) for s in names
    ):
        raise TypeError(f"jit: {name} must be a str or a tuple of strs, got {names!r}")
    return tuple(names)


def _resolve_static(f: Callable, nums: tuple, names: tuple) -> tuple[tuple, tuple]:
    """As JAX: positions are checked against ``f``'s positional parameters
    (negative ones count from the end of each call's positional arguments); a
    static position also makes its name static, and back."""
    try:
        params = list(inspect.signature(f).parameters.values())
    except (TypeError, ValueError):  # no signature: take the numbers as given
        return nums, names
    kinds = inspect.Parameter
    positional = [
        p.name
        for p in params
        if p.kind in (kinds.POSITIONAL_ONLY, kinds.POSITIONAL_OR_KEYWORD)
    ]
    if not any(p.kind == kinds.VAR_POSITIONAL for p in params):
        n = len(positional)
        for i in nums:
            if not -n <= i < n:
                raise ValueError(
                    f"jit: static_argnums {i} is out of range: "
                    f"{getattr(f, '__name__', 'f')} takes {n} positional argument(s)"
                )
    keyword = [p.name for p in params if p.kind != kinds.POSITIONAL_ONLY]
    unknown = [s for s in names if s not in keyword]
    if unknown and not any(p.kind == kinds.VAR_KEYWORD for p in params):
        raise ValueError(
            f"jit: static_argnames {unknown} are not parameters of "
            f"{getattr(f, '__name__', 'f')}"
        )
    names += tuple(positional[i] for i in nums if 0 <= i < len(positional))
    nums += tuple(positional.index(s) for s in names if s in positional)
    return nums, names


# %% [markdown]
# Before `jit` works under other interpreters, `xla_call` needs their rules. The
# abstract evaluation rule checks the argument types against the jaxpr's input
# types and returns its output types. `jaxpr_type(jaxpr)` is Part 2's
# `typecheck_jaxpr` remembered per jaxpr (its cache is in the folded cell
# below), since checking a jaxpr takes time proportional to its size. The same
# check guards the `impl` rule above and the `jvp` and `vmap` rules below.


# %% tags=["export"]
@xla_call_p.def_rule("abstract_eval")
def _xla_call_abstract_eval(*avals_in, jaxpr):
    check_call_types(jaxpr, avals_in)
    return jaxpr_type(jaxpr).out_types


# %% tags=["export", "hide-input"]
# @title Checks: argument types against the jaxpr; jaxpr_type and its cache
import weakref

_jaxpr_types: weakref.WeakKeyDictionary[Jaxpr, JaxprType] = (
    weakref.WeakKeyDictionary()
)  # weak keys: a jaxpr nobody uses is not kept alive by its type


def jaxpr_type(jaxpr: Jaxpr) -> JaxprType:
    """typecheck_jaxpr, remembered per jaxpr."""
    if jaxpr not in _jaxpr_types:
        _jaxpr_types[jaxpr] = typecheck_jaxpr(jaxpr)
    return _jaxpr_types[jaxpr]


def check_call_types(jaxpr: Jaxpr, args: Sequence[Any]) -> None:
    """Raise a TypeError unless ``args`` (arrays, tracers or avals) have the
    shapes and dtypes of ``jaxpr``'s inputs. Cheap: no avals are built."""
    expected = jaxpr_type(jaxpr)
    if len(args) != len(expected.in_types) or any(
        x.shape != t.shape or x.dtype != t.dtype
        for x, t in zip(args, expected.in_types)
    ):
        got = ", ".join(ShapedArray(x.shape, x.dtype).str_short() for x in args)
        raise TypeError(
            f"xla_call: the jaxpr takes {expected} but was called with ({got})"
        )
    check_xla_dtypes(expected.in_types)


def check_batched_call_types(jaxpr: Jaxpr, vals: list, batched: tuple) -> None:
    """check_call_types for one example of a batch (batch axes at 0)."""
    avals = [get_aval(v) for v in vals]
    per_example = [ShapedArray(a.shape[b:], a.dtype) for a, b in zip(avals, batched)]
    check_call_types(jaxpr, per_example)


def check_xla_dtypes(avals: Sequence[ShapedArray]) -> None:
    for aval in avals:
        check_xla_dtype(aval.dtype)


# %% [markdown]
# The JVP rule is where initial style pays off. It does not run `f` again; it
# transforms the jaxpr. `jaxpr_as_fun` (Part 2) turns the jaxpr back into a Python
# function; `make_jaxpr` of its `jvp`, traced at the input types twice over
# (primals, then tangents), gives a new jaxpr from (primals, tangents) to (primal
# outputs, tangent outputs). Like every traced jaxpr it may have constants, which
# come first among its inputs. The rule binds `xla_call` on that new jaxpr, so the
# interpreter below (evaluation, in the end) compiles the derivative too.
# `jvp_jaxpr` is `jvp_jaxpr_uncached` behind a cache, so differentiating the same
# jitted function again neither traces nor compiles its derivative anew.


# %% tags=["export"]
def jvp_jaxpr_uncached(jaxpr: Jaxpr) -> tuple[Jaxpr, list[Any]]:
    """A jaxpr of (primals, tangents) -> (primal outputs, tangent outputs)."""
    in_types = jaxpr_type(jaxpr).in_types
    n = len(in_types)

    def primals_and_tangents_out(*args):
        primals_out, tangents_out = jvp_flat(jaxpr_as_fun(jaxpr), args[:n], args[n:])
        return [*primals_out, *tangents_out]

    new_jaxpr, consts, _ = make_jaxpr(primals_and_tangents_out, *in_types, *in_types)
    return new_jaxpr, [device_put(c) for c in consts]


jvp_jaxpr = functools.cache(jvp_jaxpr_uncached)


@xla_call_p.def_rule("jvp")
def _xla_call_jvp(primals, tangents, *, jaxpr):
    check_call_types(jaxpr, primals)
    new_jaxpr, consts = jvp_jaxpr(jaxpr)
    outs = bind(xla_call_p, *consts, *primals, *tangents, jaxpr=new_jaxpr)
    n = len(outs) // 2
    return outs[:n], outs[n:]


# %% [markdown]
# Here is the derivative's jaxpr for `scaled_wave` from above. Its inputs are `a b
# c`: `b` is the primal and `c` the tangent. `a` is the tangent of the broadcast
# `2.0`, three zeros. Our `jvp` has no symbolic zeros, so that tangent is a real
# NumPy array made while tracing; like every array the traced function closes
# over, it becomes a constant of the jaxpr, passed in as its first input.

# %%
print(jvp_jaxpr(jaxpr)[0])


# %% [markdown]
# The batching rule does the same with `vmap`. It first moves every batch axis to
# the front, so that the new jaxpr takes each batched input with the batch on axis
# 0 and returns every output batched on axis 0. The new jaxpr is traced under the
# same `Axis` as the call, name included.


# %% tags=["export"]
def vmap_jaxpr_uncached(jaxpr: Jaxpr, axis: Axis, batched: tuple[bool, ...]):
    """A jaxpr computing ``jaxpr`` on a batch (axis 0) of the batched inputs."""
    in_types = jaxpr_type(jaxpr).in_types
    batched_types = [
        ShapedArray((axis.size, *t.shape), t.dtype) if b else t
        for t, b in zip(in_types, batched)
    ]
    in_axes = [0 if b else None for b in batched]

    def batched_fun(*args):
        return vmap_flat(jaxpr_as_fun(jaxpr), axis, in_axes, list(args))

    new_jaxpr, consts, _ = make_jaxpr(batched_fun, *batched_types)
    return new_jaxpr, [device_put(c) for c in consts]


vmap_jaxpr = functools.cache(vmap_jaxpr_uncached)


@xla_call_p.def_rule("vmap")
def _xla_call_vmap(axis, vals, dims, *, jaxpr):
    vals = [
        v if d is None else move_batch_axis(axis.size, d, 0, v)
        for v, d in zip(vals, dims)
    ]
    batched = tuple(d is not None for d in dims)
    check_batched_call_types(jaxpr, vals, batched)
    new_jaxpr, consts = vmap_jaxpr(jaxpr, axis, batched)
    outs = bind(xla_call_p, *consts, *vals, jaxpr=new_jaxpr)
    return outs, [0] * len(outs)


# %% [markdown]
# Finally, lowering. A jitted function called inside another jitted function
# leaves an `xla_call` equation in the outer jaxpr. We lower it to a **call** of a
# separate function in the same module, rather than pasting its equations inline:
# the module stays the same size as the program, a function called twice is
# lowered once, and XLA is free to inline it anyway when it optimizes.


# %% tags=["export"]
@xla_call_p.def_rule("lower")
def _xla_call_lower(ctx, avals_in, avals_out, *operands, jaxpr):
    callee = ctx.function_for(jaxpr)
    out_types = [ir_type(a) for a in avals_out]
    call = mlir_func.CallOp(out_types, ir.FlatSymbolRefAttr.get(callee), operands)
    return list(call.results)


# %% [markdown]
# ## Using `jit`
#
# Time to try it. The first call traces and compiles; the second, with new
# values of the same shape, reuses both — the `print` inside the function shows
# when tracing happens. A call with a new shape traces again.


# %%
@jit
def wave(x, y):
    print("tracing!")
    return sin(x) * y + cos(y)


x = np.array([0.0, 1.0, 2.0])
y = np.array([1.0, 2.0, 3.0])
print(wave(x, y))
print(wave(x + 1.0, y))
print(wave(np.ones(2), np.ones(2)))
print(sin(x) * y + cos(y))  # eager, for comparison

# %% [markdown]
# The result is a device `Array`. It feeds the next jitted call without a trip
# through host memory (`_as_buffer` hands the executable the very buffer `z`
# holds), and converts to NumPy when asked:

# %%
z = wave(x, y)
print(type(z).__name__, z.shape, z.dtype)
print(_as_buffer(z) is z._buffer)
print(repr(wave(z, z)))
print(np.asarray(z, dtype=np.float32))


# %% [markdown]
# Because `xla_call` has a JVP rule, a batching rule and an abstract evaluation
# rule, `jit` composes with everything we have built, in any order. `jvp` of a
# jitted function compiles the derivative; `jit` of a `jvp` traces the
# derivative's equations into one compiled program; `vmap` of a jitted function
# compiles a batched program. All agree with eager evaluation (the last line is
# the eager result for the batch):


# %%
def f(x):
    return sin(x) * x + 2.0


x0 = np.array([0.3, 1.2])
print(jvp(f, (x0,), (np.ones(2),)))
print(jvp(jit(f), (x0,), (np.ones(2),)))
print(jit(lambda x, t: jvp(f, (x,), (t,)))(x0, np.ones(2)))
print(vmap(jit(f), (0,))(np.stack([x0, 2 * x0])))
print(np.stack([f(x0), f(2 * x0)]))

# %% [markdown]
# Under `make_jaxpr`, `jvp` of the jitted `f` is a single `xla_call` whose jaxpr
# returns both the primal and the tangent:

# %%
print(make_jaxpr(lambda x: jvp(jit(f), (x,), (1.0,)), ShapedArray((), np.float64))[0])

# %% [markdown]
# Nested `jit`s show up as nested jaxprs, and lower to function calls:

# %%
inner = jit(lambda x: sin(x) * 2.0)
outer = jit(lambda x: inner(x) + inner(cos(x)))
outer_jaxpr = make_jaxpr(outer, ShapedArray((), np.float64))[0]
print(outer_jaxpr)
print(outer(1.0), 2 * np.sin(1.0) + 2 * np.sin(np.cos(1.0)))

# %%
(call_eqn,) = outer_jaxpr.eqns
print(str(lower_jaxpr(call_eqn.params["jaxpr"])).rstrip())

# %% [markdown]
# ## What `jit` refuses, and why
#
# An `if` on a traced value works under `jvp`, whose primal is concrete, but not
# under `jit`, which knows only types: the branch cannot be decided without the
# value. `jit` says so, and points to `cond`, which Part 5 builds. Two other
# mistakes that any transformation would catch, a result that is not an array and
# operands whose shapes do not match, are caught under `jit` while tracing, before
# anything runs.
#
# `show_error`, from the setup cell, calls a function and prints the error it
# raises.

# %%
show_error(jit(lambda x: x if x > 0.0 else -x), 1.0)
show_error(jit(lambda x: "done"), 1.0)
show_error(jit(lambda x, y: x * y), np.ones(3), np.ones(2))

# %% [markdown]
# ## Where real JAX differs
#
# - The primitive behind `jax.jit` is called `jit` (`jit_p` in JAX's source), and
#   a jaxpr prints it as `jit[name=... jaxpr={ ... }]`. Besides the jaxpr, its
#   params carry shardings, layouts, donated arguments and compiler options, and
#   its lowering emits a call of a nested function, as ours does. Older JAX
#   versions called it `pjit` (its module is still `jax/_src/pjit.py`), and
#   before that `xla_call`, the name we borrow.
#   See [the JAX docs on `jit`](https://docs.jax.dev/en/latest/jit-compilation.html)
#   and the [StableHLO specification](https://openxla.org/stablehlo/spec).
# - A jitted function in JAX is a C++ object (`PjitFunction`): a repeated call
#   with a known signature checks its arguments and launches the executable
#   without running any Python. The {ref}`performance page <performance>` builds
#   the same shortcut in Python and compares the two.
# - We pass a jaxpr's constants to the executable as extra arguments, uploaded
#   once; JAX, by default, embeds every closed-over array in the StableHLO module
#   as a `stablehlo.constant`, however large. Only the flag
#   `jax_use_simplified_jaxpr_constants`, off by default, makes it pass the large
#   ones as arguments (see `jax/_src/core.py` and
#   [the JAX docs on constants](https://docs.jax.dev/en/latest/internals/constants.html)).
# - On CPU, `jax.device_put` and `jax.jit` in JAX 0.10.2 copy a NumPy argument
#   to the device asynchronously: the copy may still be under way when they
#   return, so writing to the NumPy array right after the call can change the
#   JAX array or the result. `jax.device_put`
#   of an array whose memory is 64-byte aligned does not copy at all: the JAX
#   array shares the memory, and every later write changes it, an open bug
#   ([jax-ml/jax#37830](https://github.com/jax-ml/jax/issues/37830)). Our
#   `device_put` copies before it returns.
# - JAX can also donate argument buffers to the computation and can keep compiled
#   programs in a [cache on disk](https://docs.jax.dev/en/latest/persistent_compilation_cache.html).
# - JAX lowers with source locations attached to every operation, so compiler
#   errors and profiles point at your Python lines.
#
# ## Summary
#
# - `jit` works in *initial style*: trace the whole function into a jaxpr first,
#   then act on the program. The jaxpr rides as a param of the primitive
#   `xla_call`.
# - Lowering maps each equation to StableHLO operations through one `lower` rule
#   per primitive; a nested `xla_call` becomes a call of a private function.
# - XLA compiles the module; executables are cached per jaxpr, traces per input
#   signature, and results stay on the device as `Array`s.
# - `xla_call`'s own rules transform the jaxpr as a whole (`jvp_jaxpr`,
#   `vmap_jaxpr`), so `jit` composes with `jvp`, `vmap` and `make_jaxpr`.
#
# Next, {ref}`Part 4 <part4>` derives reverse mode from what we have: `linearize`,
# `vjp` and `grad`.
#
# ## Exercises
#
# **1. Look at what XLA did.** The executable can show the optimized HLO that XLA
# produced (`compiled.executable.hlo_modules()[0].to_string()`). Compile `outer`
# from above and check that XLA inlined the nested call: the optimized program
# has no `call` instruction left.

# %% tags=["hide-input"]
# @title Solution 1
ours = str(lower_jaxpr(outer_jaxpr))
optimized = compile_jaxpr(outer_jaxpr).executable.hlo_modules()[0].to_string()
print("calls in our module:", ours.count("call @"))
print("calls after XLA's optimization:", optimized.count(" call("))


# %% [markdown]
# **2. Count the traces.** Write a decorator `count_traces(f)` that counts how
# often `f`'s Python body runs, and use it to show that `jit` traces once per
# shape and dtype, not once per call, and that Python scalars of the same type
# share a trace.


# %% tags=["hide-input"]
# @title Solution 2
def count_traces(f):
    def counted(*args):
        counted.count += 1
        return f(*args)

    counted.count = 0
    return counted


body = count_traces(lambda x: x * 2.0)
doubled = jit(body)
for value in [
    1.0,
    2.0,
    np.float64(3.0),
    np.ones(3),
    np.zeros(3),
    np.ones(3, np.float32),
]:
    doubled(value)
print(body.count)  # float64[] once, float64[3] once, float32[3] once

# %% [markdown]
# **3. A compiled derivative loop.** Use `jit` and `jvp` to compute the derivative
# of $x \mapsto \sin(\sin(\sin(x)))$ at many points at once with `vmap`, and
# compare with the chain rule evaluated in NumPy.

# %% tags=["hide-input"]
# @title Solution 3
nested_sin = jit(lambda x: sin(sin(sin(x))))
slope = jit(vmap(lambda x: jvp(nested_sin, (x,), (1.0,))[1], (0,)))
points = np.linspace(-2.0, 2.0, 5)
s1 = np.sin(points)
s2 = np.sin(s1)
by_hand = np.cos(s2) * np.cos(s1) * np.cos(points)
print(np.allclose(slope(points), by_hand))
