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

autodidax.load_chapters(globals(), before="part3_jit")
np.set_printoptions(precision=6, suppress=True)

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
# JAX's own transformations are involved.

# %% tags=["export"]
import functools
import weakref

# Import jax before jaxlib's MLIR bindings: jax's import configures jaxlib
# (among other things, it keeps the XLA runtime's C++ logging quiet).
import jax
import jax.extend.backend
from jaxlib.mlir import ir
from jaxlib.mlir.dialects import func as mlir_func
from jaxlib.mlir.dialects import stablehlo as hlo

RULE_KINDS = (*RULE_KINDS, "lower")


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


def ir_element_type(dtype: np.dtype) -> ir.Type:
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return ir.IntegerType.get_signless(1)
    bits = dtype.itemsize * 8
    floats = {16: ir.F16Type, 32: ir.F32Type, 64: ir.F64Type}
    if dtype.kind == "f" and bits in floats:
        return floats[bits].get()
    if dtype.kind == "i" and bits <= 64:
        return ir.IntegerType.get_signless(bits)
    if dtype.kind == "u" and bits <= 64:
        return ir.IntegerType.get_unsigned(bits)
    check_xla_dtype(dtype)
    raise TypeError(f"no StableHLO type for dtype {dtype.name}")


def check_xla_dtype(dtype: np.dtype, who: str = "jit") -> None:
    """Refuse a dtype that XLA has no type for (NumPy's float128, say)."""
    if dtype.kind not in "biuf" or dtype.itemsize > 8:
        raise TypeError(
            f"{who}: XLA has no type for dtype {dtype.name}; use booleans, "
            "integers of up to 64 bits, or float16/32/64"
        )


def ir_type(aval: ShapedArray) -> ir.RankedTensorType:
    return ir.RankedTensorType.get(aval.shape, ir_element_type(aval.dtype))


def ir_constant(value: Any, aval: ShapedArray) -> ir.Value:
    """A StableHLO constant holding the scalar ``value`` at every position."""
    element = ir_element_type(aval.dtype)
    if aval.dtype.kind == "f":
        attr = ir.FloatAttr.get(element, float(value))
    else:
        attr = ir.IntegerAttr.get(element, int(value))
    return hlo.constant(ir.DenseElementsAttr.get_splat(ir_type(aval), attr))


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


def _lower_comparison(prim: Primitive, direction: str) -> None:
    @prim.def_rule("lower")
    def rule(ctx, avals_in, avals_out, x, y):
        kind = avals_in[0].dtype.kind
        compare_type = {"f": "FLOAT", "u": "UNSIGNED", "b": "UNSIGNED"}.get(
            kind, "SIGNED"
        )
        return [
            hlo.compare(
                x,
                y,
                hlo.ComparisonDirectionAttr.get(direction),
                compare_type=hlo.ComparisonTypeAttr.get(compare_type),
            )
        ]


_lower_comparison(greater_p, "GT")
_lower_comparison(less_p, "LT")


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
    """The module being built, and the nested jaxprs already lowered into it."""

    def __init__(self) -> None:
        self.module = ir.Module.create()
        self.functions: dict[Jaxpr, str] = {}

    def function_for(self, jaxpr: Jaxpr) -> str:
        """The name of a private function computing ``jaxpr`` (made once)."""
        if jaxpr not in self.functions:
            name = f"jaxpr_{len(self.functions)}"
            self.functions[jaxpr] = name
            lower_to_function(self, jaxpr, name, public=False)
        return self.functions[jaxpr]


def _atom_aval(atom: Atom) -> ShapedArray:
    return atom.aval


def lower_to_function(
    ctx: LoweringContext, jaxpr: Jaxpr, name: str, public: bool
) -> mlir_func.FuncOp:
    in_types = [ir_type(v.aval) for v in jaxpr.in_binders]
    out_types = [ir_type(_atom_aval(x)) for x in jaxpr.outs]
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
            avals_in = [_atom_aval(x) for x in eqn.inputs]
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
# Here is a small function, its jaxpr, and the StableHLO we make of it. Apart from
# syntax, the two programs say the same thing line for line:


# %%
def scaled_wave(x):
    return reduce_sum(sin(x) * 2.0, axis=0)


jaxpr, consts, _ = make_jaxpr(scaled_wave, ShapedArray((3,), np.float64))
print(jaxpr)
print(str(lower_jaxpr(jaxpr)).rstrip())


# %% [markdown]
# ## Compiling and running
#
# To run the module we need XLA's client for the CPU, which `jaxlib` provides, and
# a way to move arrays onto its device and back. Device memory is managed by
# `jaxlib` buffer objects; `device_put` copies a NumPy array into one. (The
# `enable_x64` flag asks for float64 to be kept as float64; JAX's own front end
# would otherwise narrow it to float32 unless its global x64 switch is on, a
# switch this module never touches.)


# %% tags=["export"]
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


def device_put(x: np.ndarray) -> Array:
    """Copy a NumPy array to the device."""
    from jaxlib import _jax

    x = np.asarray(x)
    rt = runtime()
    aval = jax.core.ShapedArray(x.shape, x.dtype)
    buffer = _jax.batched_device_put(
        aval, rt.sharding, [x], [rt.device], True, enable_x64=True
    )
    return Array(buffer)


# %% [markdown]
# The `Array` class wraps such a buffer. It knows its shape and dtype without
# touching the data, so passing it back into a compiled function needs no copy
# to the host. Only printing it or handing it to NumPy copies it back
# (`__array__`, which NumPy calls, supports NumPy 2's `dtype` and `copy`
# arguments). It has the same operators as tracers; outside `jit` they compute
# eagerly, with NumPy.


# %% tags=["export"]
class Array(ArrayOperators):
    """An array in device memory: what jitted functions return."""

    __array_priority__ = 100

    def __init__(self, buffer: Any) -> None:
        self._buffer = buffer

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self._buffer.shape)

    @property
    def dtype(self) -> np.dtype:
        return np.dtype(self._buffer.dtype)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def aval(self) -> ShapedArray:
        return ShapedArray(self.shape, self.dtype)

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        return np.asarray(self._buffer, dtype=dtype, copy=copy)

    def __bool__(self) -> bool:
        return bool(np.asarray(self))

    def __float__(self) -> float:
        return float(np.asarray(self))

    def __int__(self) -> int:
        return int(np.asarray(self))

    def __len__(self) -> int:
        if not self.shape:
            raise TypeError("len() of a 0-d Array")
        return self.shape[0]

    def __str__(self) -> str:
        return str(np.asarray(self))

    def __repr__(self) -> str:
        body = np.array2string(np.asarray(self), separator=", ", prefix="Array(")
        return f"Array({body}, dtype={self.dtype.name})"


DEVICE_ARRAY_TYPES = (Array,)


def _as_buffer(x: Any) -> Any:
    """The device buffer for an argument of a compiled call."""
    if isinstance(x, Array):
        return x._buffer
    return device_put(x)._buffer


# %% [markdown]
# Compilation turns a jaxpr into a callable. The expensive part — lowering and
# XLA's compilation — happens once per jaxpr; the result is cached, keyed by the
# jaxpr object itself. Calling it moves each argument to the device if it is not
# there already, runs the executable, and wraps the outputs as `Array`s.


# %% tags=["export"]
class CompiledJaxpr:
    """An XLA executable for one jaxpr."""

    def __init__(self, jaxpr: Jaxpr) -> None:
        from jax._src.lib import xla_client

        rt = runtime()
        self.module_text = str(lower_jaxpr(jaxpr))
        self.executable = rt.client.compile_and_load(
            self.module_text,
            xla_client.DeviceList((rt.device,)),
            xla_client.CompileOptions(),
        )

    def __call__(self, *args: Any) -> list[Array]:
        buffers = [_as_buffer(x) for x in args]
        results = self.executable.execute_sharded(buffers)
        per_output = results.disassemble_into_single_device_arrays()
        return [Array(bufs[0]) for bufs in per_output]


_compiled: dict[Jaxpr, CompiledJaxpr] = {}


def compile_jaxpr(jaxpr: Jaxpr) -> CompiledJaxpr:
    """The executable for ``jaxpr``, compiled on first request."""
    compiled = _compiled.get(jaxpr)
    if compiled is None:
        compiled = _compiled[jaxpr] = CompiledJaxpr(jaxpr)
    return compiled


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
# compiles and runs, after a cheap check (defined below) that the arguments have
# the types the jaxpr expects. Because the jaxpr is a param, every interpreter that meets
# `xla_call` has the whole program in hand.

# %% tags=["export"]
xla_call_p = Primitive("xla_call", multiple_results=True)


@xla_call_p.def_rule("impl")
def _xla_call_impl(*args, jaxpr):
    check_call_types(jaxpr, args)
    return compile_jaxpr(jaxpr)(*args)


# %% [markdown]
# `jit(f)` is the user-facing wrapper. It flattens the arguments, traces `f` into a
# jaxpr for their types, and binds `xla_call`. Tracing happens once per *input
# signature* (the argument structure plus each leaf's shape and dtype), so a second
# call with new values of the same types goes straight to the compiled code. The
# constants the jaxpr needs are moved to the device once, at tracing time. The
# look-up-or-trace step is a function of its own, `trace_for_call`, because a
# {ref}`later section <part3-fast-path>` puts a shortcut in front of `jit` and
# reuses it.
#
# One subtlety: if `f` closes over a tracer of an outer transformation (say, `jit`
# inside a `jvp` of some other function), that tracer becomes one of the jaxpr's
# constants. Such a trace is only valid during that one outer transformation, so
# it is not cached.

# %% tags=["export"]
Traces = dict[tuple, tuple[Jaxpr, list[Any], PyTreeDef]]


def trace_for_call(
    f: Callable, traces: Traces, args_flat: list[Any], in_tree: PyTreeDef
) -> tuple[Jaxpr, list[Any], PyTreeDef]:
    """``f``'s jaxpr, constants and output structure for arguments with the
    types of ``args_flat``: from ``traces`` if seen before, else traced now."""
    avals = tuple(raise_to_shaped(get_aval(x)) for x in args_flat)
    key = (in_tree, avals)
    cached = traces.get(key)
    if cached is None:
        for aval in avals:
            check_xla_dtype(aval.dtype)
        abstract_args = tree_unflatten(in_tree, avals)
        jaxpr, consts, out_tree = _trace_to_jaxpr(
            f, abstract_args, dynamic=True, who="jit"
        )
        if any(isinstance(c, Tracer) for c in consts):
            return jaxpr, consts, out_tree  # valid for this call only
        consts = [device_put(c) for c in consts]
        cached = traces[key] = (jaxpr, consts, out_tree)
    return cached


def jit(f: Callable) -> Callable:
    """Compile ``f`` with XLA; trace once per input signature."""
    traces: Traces = {}

    @functools.wraps(f)
    def f_jitted(*args: Any) -> Any:
        args_flat, in_tree = tree_flatten(args)
        args_flat = [_as_input(x, "jit argument") for x in args_flat]
        jaxpr, consts, out_tree = trace_for_call(f, traces, args_flat, in_tree)
        outs = bind(xla_call_p, *consts, *args_flat, jaxpr=jaxpr)
        return tree_unflatten(out_tree, outs)

    f_jitted.traces = traces  # for the curious: what has been traced so far
    return f_jitted


# %% [markdown]
# Before `jit` works under other interpreters, `xla_call` needs their rules. The
# abstract evaluation rule checks the argument types against the jaxpr's input
# types and returns its output types; we remember each jaxpr's type, since
# checking a jaxpr takes time proportional to its size. The same check guards the
# `impl` rule above and the `jvp` and `vmap` rules below: a compiled program would
# happily read the bits of an integer array as floats.

# %% tags=["export"]
# Weak keys: a jaxpr that nobody uses any more takes its type with it.
_jaxpr_types: weakref.WeakKeyDictionary[Jaxpr, JaxprType] = weakref.WeakKeyDictionary()


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


@xla_call_p.def_rule("abstract_eval")
def _xla_call_abstract_eval(*avals_in, jaxpr):
    check_call_types(jaxpr, avals_in)
    return jaxpr_type(jaxpr).out_types


# %% [markdown]
# The JVP rule is where initial style pays off. It does not run `f` again; it
# transforms the jaxpr: trace `jvp` of the jaxpr's function (using Part 2's
# `eval_jaxpr`, which calls `bind`, which reaches the JVP rules of the
# primitives inside) into a new jaxpr that takes primals and tangents and returns
# both. Then it calls *that* jaxpr with `xla_call`, so the derivative is compiled
# too. The batching rule does the same with `vmap`, moving every batch axis to the
# front first.


# %% tags=["export"]
@functools.cache
def jvp_jaxpr(jaxpr: Jaxpr) -> tuple[Jaxpr, list[Any]]:
    """A jaxpr of (primals, tangents) -> (primal outputs, tangent outputs)."""
    in_types = jaxpr_type(jaxpr).in_types
    n = len(in_types)

    def primals_and_tangents_out(*args):
        primals_out, tangents_out = jvp_flat(jaxpr_as_fun(jaxpr), args[:n], args[n:])
        return [*primals_out, *tangents_out]

    new_jaxpr, consts, _ = make_jaxpr(primals_and_tangents_out, *in_types, *in_types)
    return new_jaxpr, [device_put(c) for c in consts]


@xla_call_p.def_rule("jvp")
def _xla_call_jvp(primals, tangents, *, jaxpr):
    check_call_types(jaxpr, primals)  # before building a jaxpr for these types
    new_jaxpr, consts = jvp_jaxpr(jaxpr)
    outs = bind(xla_call_p, *consts, *primals, *tangents, jaxpr=new_jaxpr)
    n = len(outs) // 2
    return outs[:n], outs[n:]


@functools.cache
def vmap_jaxpr(
    jaxpr: Jaxpr, axis_size: int, batched: tuple[bool, ...]
) -> tuple[Jaxpr, list[Any]]:
    """A jaxpr computing ``jaxpr`` on a batch (axis 0) of the batched inputs."""
    in_types = jaxpr_type(jaxpr).in_types
    batched_types = [
        ShapedArray((axis_size, *t.shape), t.dtype) if b else t
        for t, b in zip(in_types, batched)
    ]
    in_axes = tuple(0 if b else None for b in batched)
    batched_fun = vmap(jaxpr_as_fun(jaxpr), in_axes)
    new_jaxpr, consts, _ = make_jaxpr(batched_fun, *batched_types)
    return new_jaxpr, [device_put(c) for c in consts]


@xla_call_p.def_rule("vmap")
def _xla_call_vmap(axis_size, vals, dims, *, jaxpr):
    vals = [
        v if d is None else move_batch_axis(axis_size, d, 0, v)
        for v, d in zip(vals, dims)
    ]
    batched = tuple(d is not None for d in dims)
    avals = [get_aval(v) for v in vals]
    check_call_types(  # per example, before building a jaxpr for these types
        jaxpr,
        [ShapedArray(a.shape[b:], a.dtype) for a, b in zip(avals, batched)],
    )
    if not any(batched):
        return bind(xla_call_p, *vals, jaxpr=jaxpr), [None] * len(jaxpr.outs)
    new_jaxpr, consts = vmap_jaxpr(jaxpr, axis_size, batched)
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
print(sin(x) * y + cos(y))

# %% [markdown]
# The result is a device `Array`. It feeds the next jitted call without a trip
# through host memory, and converts to NumPy when asked:

# %%
z = wave(x, y)
print(type(z).__name__, z.shape, z.dtype)
print(repr(wave(z, z)))
host = np.asarray(z, dtype=np.float32)
print(host.dtype, np.asarray(z, copy=True).flags.writeable)


# %% [markdown]
# Because `xla_call` has a JVP rule, a batching rule and an abstract evaluation
# rule, `jit` composes with everything we have built, in any order. `jvp` of a
# jitted function compiles the derivative; `jit` of a `jvp` traces the
# derivative's equations into one compiled program; `vmap` of a jitted function
# compiles a batched program. All agree with eager evaluation:


# %%
def f(x):
    return sin(x) * x + 2.0


x0 = np.array([0.3, 1.2])
eager = jvp(f, (x0,), (np.ones(2),))
print(eager)
print(jvp(jit(f), (x0,), (np.ones(2),)))
print(jit(lambda x, t: jvp(f, (x,), (t,)))(x0, np.ones(2)))
print(vmap(jit(f), (0,))(np.stack([x0, 2 * x0])))

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
# Some Python is fine under `jvp` and `vmap` but not under `jit`, because `jit`
# traces with abstract values only. An `if` on a traced value cannot be decided
# without the value; `jit` says so, and points to `cond`, which Part 5 builds. A
# function whose result is not an array cannot be compiled. A shape mistake is
# found while tracing, before anything runs, and the error's traceback goes
# through the line of your function that made it.

# %%
import textwrap


def show_error(fn, *args):
    try:
        fn(*args)
    except Exception as e:
        print(textwrap.fill(f"{type(e).__name__}: {e}", 80, subsequent_indent="  "))


show_error(jit(lambda x: x if x > 0.0 else -x), 1.0)
show_error(jit(lambda x: "done"), 1.0)
show_error(jit(lambda x, y: x * y), np.ones(3), np.ones(2))


# %% [markdown]
# (part3-fast-path)=
# ## A fast path for repeated calls
#
# The first call of a jitted function pays for tracing and for XLA's compiler:
# tens of milliseconds. After that, a call with the same input signature should
# cost little more than starting the executable. Ours costs a lot more. Timing
# each step of one call of the small function `sin(x) * 2.0 + x` on a
# device-resident `float64[8]`, on the machine that produced the
# {ref}`performance page <performance>`, gives:
#
# | step of a repeated call | µs |
# | --- | ---: |
# | `tree_flatten` of the arguments | 0.9 |
# | `_as_input`, `get_aval` and `raise_to_shaped` on every leaf, for the key | 1.8 |
# | looking the key up in the trace cache (hashing a `PyTreeDef` and avals) | 0.4 |
# | `bind`: find the top trace, box the arguments, call the `impl` rule | 1.5 |
# | `check_call_types` in the `impl` rule | 0.7 |
# | running the executable (`execute_sharded`) | 2.3 |
# | turning its results into `Array`s | 2.6 |
# | `tree_unflatten` of the outputs | 0.2 |
#
# About 12 µs in all, where `jax.jit` needs about 3 µs for the same call. Only
# one row is work that differs from call to call: running the executable. Every
# other row recomputes an answer that the first call already found, and that
# depends only on the *types* of the arguments: their structure, their avals,
# which interpreter handles the call, that the types match the jaxpr, which
# executable to run. So we remember, per signature, what running needs, and skip
# the rest.
#
# **The key.** When every argument is an array on its own (no lists or dicts
# around it), the input signature is the tuple of each argument's shape and dtype.
# Both are cheap to read: a NumPy array has them as attributes, and so does the
# jaxlib buffer inside an `Array`, which keeps them in C++. No flattening is
# needed: "*n* arrays" is already said by the length of the tuple.
#
# **When the shortcut may be taken.** `bind` picks an interpreter by starting at
# the dynamic level and moving up to the level of the deepest tracer among the
# arguments (`find_top_trace`). If the dynamic level is the evaluation level at
# the bottom of the stack (nothing is being staged out by `make_jaxpr` or an
# outer `jit`) and no argument is a tracer (all are `Array`s or NumPy arrays),
# `bind` will choose the evaluation interpreter, whose `impl` rule checks the
# types and runs the compiled code. Running the code is the part the fast path
# keeps. Under `jvp`, `vmap` or `grad` the arguments of a jitted function are
# tracers, so those calls keep going through `bind` and `xla_call`'s rules. Python
# numbers, NumPy scalars and containers of arrays also take the full path; the
# shortcut is for the case that matters in a loop, and the full path handles the
# others as before.
#
# **Why skipping the checks is safe.** A signature gets an entry only after a
# full call with that signature succeeded: `_as_input` accepted every argument,
# tracing worked, and `check_call_types` compared the arguments with the jaxpr's
# input types. Those checks look at nothing but shapes and dtypes, which is
# exactly what the key holds, so a call with an equal key would pass them again.
# A call that differs in any shape or dtype, or has an argument the checks would
# reject, has another key (or none), takes the full path, and gets the same
# result or error as it always did. And as in the trace cache, a trace whose
# constants include a tracer of an outer transformation gets no entry.
#
# **Building the outputs in C++.** The last row of the table gets cheaper too.
# `CompiledJaxpr` asks the execution's results to split into one jaxlib array per
# output, then wraps each in an `Array`, a general route that costs as much as
# running the program. jaxlib can instead make the output arrays with a *result
# handler*, made once per output from its shape and dtype; the handler's `wrap`
# passes each new jaxlib array to our `Array` class. This is the same runtime
# layer `device_put` uses: we still borrow none of JAX's tracing or
# transformations.


# %% tags=["export"]
def result_handlers(jaxpr: Jaxpr) -> list[Any]:
    """Per output of ``jaxpr``, a jaxlib handler that turns an executable's
    output buffer into an ``Array``, building jaxlib's array object in C++."""
    from jaxlib import _jax

    sharding = runtime().sharding
    handlers = []
    for out in jaxpr.outs:
        aval = _atom_aval(out)
        handler = _jax.array_result_handler(
            jax.core.ShapedArray(aval.shape, aval.dtype),
            sharding,
            committed=True,
            _skip_checks=True,
        )
        handlers.append(handler.wrap(Array))
    return handlers


class FastCall:
    """What a call with an already seen signature needs, and nothing more:
    the executable, the constants' buffers, the result handlers and the
    structure of the output."""

    def __init__(self, jaxpr: Jaxpr, consts: list[Array], out_tree: PyTreeDef):
        self.execute = compile_jaxpr(jaxpr).executable.execute_sharded
        self.const_buffers = [c._buffer for c in consts]
        self.handlers = result_handlers(jaxpr)
        self.out_tree = out_tree

    def __call__(self, args: tuple) -> Any:
        buffers = [x._buffer if type(x) is Array else _as_buffer(x) for x in args]
        results = self.execute([*self.const_buffers, *buffers])
        outs = results.consume_with_handlers(self.handlers)
        if self.out_tree is LEAF:
            return outs[0]
        return tree_unflatten(self.out_tree, outs)


def array_signature(args: tuple) -> tuple | None:
    """The (shape, dtype) of every argument, when the call may take the fast
    path: nothing is being staged out and every argument is an ``Array`` or a
    NumPy array. None when it may not."""
    if _state.dynamic is not _state.stack[0]:
        return None  # make_jaxpr or an outer jit is recording: bind must see it
    signature = []
    for x in args:
        kind = type(x)
        if kind is Array:
            x = x._buffer  # jaxlib's array: shape and dtype are read in C++
        elif kind is not np.ndarray:
            return None  # a tracer, a number, a container...: the full path
        signature.append((x.shape, x.dtype))
    return tuple(signature)


# %% [markdown]
# The new `jit` tries the table first. On a miss it does what the first version
# did, and afterwards, if the call was eligible, it records a `FastCall` for the
# signature. `fast_calls` is attached to the jitted function next to `traces`.


# %% tags=["export"]
def jit(f: Callable) -> Callable:
    """Compile ``f`` with XLA; trace once per input signature; repeated calls
    on arrays skip the interpreters (the fast path)."""
    traces: Traces = {}
    fast_calls: dict[tuple, FastCall] = {}

    @functools.wraps(f)
    def f_jitted(*args: Any) -> Any:
        signature = array_signature(args)
        if signature is not None:
            fast_call = fast_calls.get(signature)
            if fast_call is not None:
                return fast_call(args)
        # The full path: check, trace if needed, bind.
        args_flat, in_tree = tree_flatten(args)
        args_flat = [_as_input(x, "jit argument") for x in args_flat]
        jaxpr, consts, out_tree = trace_for_call(f, traces, args_flat, in_tree)
        outs = bind(xla_call_p, *consts, *args_flat, jaxpr=jaxpr)
        if signature is not None and not any(isinstance(c, Tracer) for c in consts):
            fast_calls[signature] = FastCall(jaxpr, consts, out_tree)
        return tree_unflatten(out_tree, outs)

    f_jitted.traces = traces  # for the curious: what has been traced so far
    f_jitted.fast_calls = fast_calls  # and which signatures take the fast path
    return f_jitted


# %% [markdown]
# The first call below takes the full path (it traces, as the `print` shows) and
# leaves an entry behind; the second finds it. A device `Array` and a NumPy array
# of the same type share an entry, as they share a trace. The results agree with
# NumPy:


# %%
@jit
def scaled(x, y):
    print("tracing!")
    return sin(x) * 2.0 + y


a = device_put(np.linspace(0.0, 1.0, 4))
b = np.ones(4)
first = scaled(a, b)  # full path: trace, compile, add an entry
second = scaled(first, b)  # fast path
print(list(scaled.fast_calls))
print(second)
expected_first = np.sin(np.linspace(0.0, 1.0, 4)) * 2.0 + 1.0
print(np.sin(expected_first) * 2.0 + 1.0)

# %% [markdown]
# With the fast path, the same call takes about 3.8 µs on that machine, 1.25
# times as long as with `jax.jit`. Of that, running the executable and making
# the output array in C++ take about 2.8 µs; the remaining microsecond is
# Python: entering `f_jitted`, reading the interpreter state, the loop that
# builds the signature, hashing it, calling the `FastCall`, and calling our
# `Array` class for the output. `jax.jit` does these same steps, but
# all of them in C++ (`PjitFunction` in jaxlib's
# [`pjit.cc`](https://github.com/jax-ml/jax/blob/main/jaxlib/pjit.cc)): a
# repeated call never runs a line of Python. That, not a different algorithm, is
# the remaining gap.
#
# ## Where real JAX differs
#
# - JAX's `jit` has its fast path in C++: a call with a known signature checks
#   its arguments and launches the executable without running any Python, and
#   its signature also covers weak types, shardings, static arguments and
#   configuration such as the x64 switch. Ours, {ref}`above <part3-fast-path>`,
#   is the same idea in Python; the {ref}`performance page <performance>`
#   compares the two.
# - JAX keeps constants out of the compiled program too, but also deduplicates,
#   shards and donates buffers, and caches compiled code on disk.
# - In today's JAX the primitive behind `jit` is called `pjit` (it also handles
#   sharding across devices); older versions used a primitive named `xla_call`,
#   the name we borrow. See
#   [the JAX docs on `jit`](https://docs.jax.dev/en/latest/jit-compilation.html)
#   and the [StableHLO specification](https://openxla.org/stablehlo/spec).
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
# - A repeated call whose arguments are all arrays takes a fast path: a table
#   keyed by their shapes and dtypes leads straight to the executable, skipping
#   work whose answer depends only on those types.
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
nested_sin = jit(lambda x: sin(sin(sin(x))))
slope = jit(vmap(lambda x: jvp(nested_sin, (x,), (1.0,))[1], (0,)))
points = np.linspace(-2.0, 2.0, 5)
s1 = np.sin(points)
s2 = np.sin(s1)
by_hand = np.cos(s2) * np.cos(s1) * np.cos(points)
print(np.allclose(slope(points), by_hand))
