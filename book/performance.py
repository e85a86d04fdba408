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
# (performance)=
# # How fast is it?
#
# The autodidax module is written to be read, not to be fast, yet it runs real
# programs through a real compiler, so its costs can be set next to JAX's. This
# page does one piece of performance work from start to end: it finds where the
# time of a repeated `jit` call goes, builds a fast path that skips the parts
# whose answer never changes, and shows the fast path being taken. At the end, a
# short summary compares the two libraries on other small programs.
#
# The folded cell below loads the library code of the chapters from the module
# `autodidax`, as in {ref}`Part 2 <part2-setup>`. In Colab it first installs the
# JAX release the book is tested with and fetches the module.

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

book_setup.load_book(globals(), before="performance")

# %% [markdown]
# (performance-fast-path)=
# ## Where the time of one call goes
#
# The first call of a jitted function traces it and runs XLA's compiler, which
# takes milliseconds. A later call with arguments of the same types finds the
# trace and the executable in caches, so it ought to cost little more than
# running the executable. With Part 3's `jit` it costs several times what a
# `jax.jit` call does.
#
# A first hint of why: count the Python functions that one repeated call runs.
# The folded cell defines `python_calls(f, *args)`, which calls `f` with Python's
# profiling hook (`sys.setprofile`) switched on and returns the name and module
# of every Python function that started during the call. Here it watches a
# second call of a function jitted with Part 3's `jit`, which this page has not
# replaced yet:

# %% tags=["hide-input"]
# @title python_calls: which Python functions a call runs
import sys
from collections import Counter


def python_calls(f, *args):
    """Call f(*args); return (module, function) for every Python function
    that started during the call, in order."""
    seen = []

    def note(frame, event, arg):
        if event == "call":
            module = frame.f_globals.get("__name__", "?")
            seen.append((module, frame.f_code.co_qualname.replace("<locals>.", "")))

    sys.setprofile(note)
    try:
        f(*args)
    finally:
        sys.setprofile(None)
    return seen


# %%
def scaled_sin(x, y):
    print("tracing!")
    return sin(x) * 2.0 + y


part3_scaled = jit(scaled_sin)  # Part 3's jit
a = device_put(np.linspace(0.0, 1.0, 4))
b = np.ones(4)
part3_scaled(a, b)  # first call: trace and compile
calls = python_calls(part3_scaled, a, b)  # second call: both caches hit
names = Counter(name for module, name in calls)
print(len(calls), "Python function calls")
for name in ["bind", "trace_for_call", "check_call_types", "device_put"]:
    print(f"  {name}: {names[name]}")

# %% [markdown]
# More than a hundred Python calls, for a call that finds everything it needs in
# caches. Counting says how much runs, not how long it takes. For that, the
# benchmark `bench/bench_dispatch.py` writes out the steps of one call by hand,
# reads `time.perf_counter_ns()` between every two of them over thousands of
# calls, and keeps each step's median. Nothing is timed while this page is
# built: the folded cell reads the report of one run of `python
# bench/run_all.py`. The machine is small and shared, so absolute times are
# noisy; comparisons are ratios, autodidax's time divided by JAX's, measured
# in turns in the same process.

# %% tags=["hide-input"]
# @title Read the benchmark report
import json
from pathlib import Path

RESULTS = Path("../bench/results.json")  # the notebook runs in book/
if not RESULTS.is_file():  # e.g. in Colab: fetch the committed report
    import urllib.request

    RESULTS = Path("results.json")
    urllib.request.urlretrieve(
        "https://raw.githubusercontent.com/autodidax-book/autodidax/main/"
        "bench/results.json",
        RESULTS,
    )
report = json.loads(RESULTS.read_text(encoding="utf-8"))
machine = report["machine"]
print(
    f"measured {machine['timestamp'][:10]} on {machine['cpu_count']} CPUs, "
    f"JAX {machine['jax']}"
)

# %% [markdown]
# The chart shows the median of every step of a call of `sin(x) * 2.0 + x`,
# for four kinds of argument: three that live on the host (a Python float, a
# NumPy scalar, a NumPy array of eight numbers) and a device `Array`. A black
# tick marks a whole `jax.jit` call with the same argument. A bar sums the
# steps' medians, and shows which steps are long; the number in parentheses,
# the median of whole calls, is the better total. Both stop when the call
# returns, before its result is ready (they time *dispatch*).

# %% mystnb={"image": {"alt": "Stacked horizontal bars, one per kind of argument (Python float, NumPy scalar, NumPy array, device Array), for Part 3's jit. Each bar is split into the steps of one call (flatten and check the arguments, signature and cache lookup, bind and type checks, copy to the device, run the executable, wrap the outputs), and a black tick marks the time of a jax.jit call with the same argument."}} tags=["hide-input"]
# @title Chart: the steps of one call of Part 3's jit
from figures import dispatch_profile_chart

dispatch_profile_chart(report["results"]["dispatch"], paths=["full_path"])


# %% [markdown]
# Reading the bars: with Part 3's `jit`, a host argument is flattened as a
# pytree, converted to a NumPy array and checked; an aval is built for the
# cache key; `bind` finds the top trace, boxes the argument and calls the
# `impl` rule, which checks the types against the jaxpr again; `device_put`
# converts the argument once more, builds JAX's aval for it and copies it to the
# device; after the run, each output is split out of the results and wrapped in
# an `Array`. Of all this, only running the executable, and copying a host
# argument's value, does work that differs from call to call. Every other step
# recomputes an answer the first call already found, and that answer depends
# only on the *types* of the arguments: their structure and avals, which
# interpreter handles the call, that the types match the jaxpr, which
# executable to run, how to copy a value of each type. So we can remember,
# per signature, what running needs, and skip the rest.
#
# ## A fast path for repeated calls
#
# **This replaces `jit` from Part 3 because a table of known signatures must be
# consulted before anything Part 3's `jit` does on a call.** Part 3's `jit`
# stays available as `full_path_jit`, for the tests and the benchmarks.
#
# **The key.** When every argument is an array or a number on its own (no
# lists or dicts around it), the signature is the tuple of each argument's
# shape and dtype. A NumPy array has both as attributes, and so does the jaxlib
# array inside an `Array`. A number, whether a Python `bool`, `int` or `float`
# or a NumPy scalar such as `np.float64(3.0)`, is looked up by its exact type
# in a table, `SCALAR_KEYS`, which holds the shape and dtype the full path's
# `np.asarray` gives a number of that type (`np.asarray(3.0)` is a 0-d
# `float64` array, `np.asarray(True)` a `bool`, `np.asarray(3)` an `int64`).
# So a Python float, `np.float64(3.0)` and `np.array(3.0)` have one key, as
# they have one trace. A type not in the table (a tracer, a list) gets no key
# and takes the full path, and so does an integer beyond the range of `int64`,
# which NumPy would not make an `int64`.
#
# **Pytrees, keyword and static arguments.** A training step takes a dict of
# parameters, an optimizer state and keyword arguments, and its `n_heads` may
# be static. Such a call is flattened once, as the full path flattens it: the
# leaves, and a tree structure that holds the dict keys, the keywords and the
# static values. The key is that structure together with the leaves' key, so a
# different dict, keyword or static value, or a leaf of another shape or dtype,
# misses and takes the full path. The flat key above is kept for calls whose
# positional arguments are all arrays or numbers: it costs no flattening.
#
# **When the shortcut may be taken.** `bind` gives an operation to the highest
# of the dynamic level and the levels of the arguments' tracers. When the
# dynamic level is 0 (no `make_jaxpr` or outer `jit` is staging out) and no
# argument is a tracer, `bind` would pick the evaluation interpreter, whose
# `impl` rule checks types and runs the executable. That is the only case the
# fast path handles; under `jvp`, `vmap` or `grad`, calls still go through `bind`.
#
# **Why skipping the checks is safe.** A signature gets an entry only after a
# full call with it succeeded: every argument was accepted, tracing worked, and
# the arguments' types matched the jaxpr's. Those checks look only at shapes and
# dtypes, which is exactly what the key holds, so a call with an equal key
# would pass them again. Any other call has a different key, or none, and takes
# the full path, with the result or error it always had.
#
# **Moving values without the detours.** Two jaxlib calls do the per-call work.
# The copy: `batched_device_put`, the same call Part 3's `device_put` makes,
# needs JAX's aval for the argument; with the type fixed by the signature, that
# aval is built once, when the entry is made, and jaxlib accepts a Python
# number or NumPy value as it is. Its batch is the pieces of *one* array, one
# per device (its signature takes one aval; JAX's own `batched_device_put`, in
# `jax/_src/interpreters/pxla.py`, passes it the same), so a call with several
# host arguments makes one copy each. The outputs: instead of splitting the results
# into one jaxlib array per output and wrapping each, the general route, jaxlib
# can build the outputs itself with a *result handler*, made once per output
# from its aval; `wrap(Array)` makes it hand each new jaxlib array to our
# `Array` class. Both are built once per entry:


# %% tags=["export"]
def host_copiers(avals: Sequence[ShapedArray]) -> list[Callable[[Any], Any]]:
    """Per input aval: a function copying a host value of that type to the
    device, returning a jaxlib array."""
    from jaxlib import _jax

    rt = runtime()
    copy_now = _jax.HostBufferSemantics.IMMUTABLE_ONLY_DURING_CALL  # as device_put

    def copier(aval: ShapedArray) -> Callable[[Any], Any]:
        jax_aval = jax.core.ShapedArray(aval.shape, aval.dtype)  # built once
        # (aval, sharding, values, devices, committed, force_copy, semantics, x64)
        return lambda x: _jax.batched_device_put(
            jax_aval, rt.sharding, [x], [rt.device], True, False, copy_now, True
        )

    return [copier(aval) for aval in avals]


def result_handlers(jaxpr: Jaxpr) -> list[Any]:
    """Per output of ``jaxpr``: a jaxlib handler that makes the output's
    jaxlib array and wraps it in our ``Array``."""
    from jaxlib import _jax

    handlers = []
    for out in jaxpr.outs:
        jax_aval = jax.core.ShapedArray(out.aval.shape, out.aval.dtype)
        # _skip_checks skips JAX's Python check that the buffer's device, shape
        # and dtype match the sharding and aval (ArrayImpl._check_and_rearrange);
        # safe: this jaxpr's executable, on this one device, made the buffer.
        handler = _jax.array_result_handler(
            jax_aval, runtime().sharding, committed=True, _skip_checks=True
        )
        handlers.append(handler.wrap(Array))
    return handlers


# %% [markdown]
# The folded cell holds two checks that the code below calls by name: the table
# `SCALAR_KEYS`, with the `int64` range, and `stands_alone`, which refuses
# an entry to a call that needs more than its arguments (a constant that is a
# tracer of an outer transformation, or a collective over an axis that an
# enclosing `vmap` binds, {ref}`Part 9 <part9>`, which only `bind` would find).

# %% tags=["export", "hide-input"]
# @title Checks: the keys of numbers, and which calls may have an entry
# The key of a number, by its type: the shape and dtype that np.asarray (the
# full path's conversion) gives it. Python's numbers, and NumPy's scalars of
# booleans, integers and floats of up to 64 bits.
NUMBER_TYPES = (bool, int, float, *(np.dtype(c).type for c in "?bhilqBHILQefd"))
SCALAR_KEYS = {kind: ((), np.asarray(kind()).dtype) for kind in NUMBER_TYPES}
INT64_MIN, INT64_MAX = int(np.iinfo(np.int64).min), int(np.iinfo(np.int64).max)


def stands_alone(jaxpr: Jaxpr, consts: list) -> bool:
    """Whether a call needs nothing but its arguments: no tracer among its
    constants, no collective over an axis an enclosing vmap binds (Part 9)."""
    closed = not any(isinstance(c, Tracer) for c in consts)
    return closed and not free_axis_names(jaxpr)


# %% [markdown]
# A `FastCall` holds what a call with a known signature needs: the executable,
# the constants' buffers, a copier per input and a handler per output.
# `input_signature` computes the key, or `None` when the call must take the
# full path:


# %% tags=["export"]
class FastCall:
    """What a call with a known signature needs, and nothing more."""

    def __init__(self, jaxpr: Jaxpr, consts: list[Array], out_tree: PyTreeDef):
        self.execute = compile_jaxpr(jaxpr).executable.execute_sharded
        self.const_buffers = [c._buffer for c in consts]
        inputs = jaxpr.in_binders[len(consts) :]
        self.copiers = host_copiers([v.aval for v in inputs])
        self.handlers = result_handlers(jaxpr)
        self.out_tree = out_tree

    def __call__(self, args: tuple) -> Any:
        buffers = list(self.const_buffers)
        for x, to_device in zip(args, self.copiers):
            buffers.append(x._buffer if type(x) is Array else to_device(x))
        outs = self.execute(buffers).consume_with_handlers(self.handlers)
        if self.out_tree is LEAF:
            return outs[0]
        return tree_unflatten(self.out_tree, outs)


def input_signature(args: tuple) -> tuple | None:
    """The (shape, dtype) of every argument, or None for the full path."""
    if _state.dynamic is not _state.stack[0]:
        return None  # make_jaxpr or an outer jit is recording: bind must see it
    signature = []
    for x in args:
        kind = type(x)
        if kind is Array:
            x = x._buffer  # the jaxlib array inside: its shape and dtype
        elif kind is not np.ndarray:
            key = SCALAR_KEYS.get(kind)
            if key is None:
                return None  # not a number (a Tracer, a list): the full path
            if kind is int and not INT64_MIN <= x <= INT64_MAX:
                return None  # NumPy makes it no int64: the full path
            signature.append(key)
            continue
        signature.append((x.shape, x.dtype))
    return tuple(signature)


# %% tags=["export"]
full_path_jit = jit  # Part 3's jit, kept under this name before jit is replaced


def jit(f: Callable, static_argnums=(), static_argnames=()) -> Callable:
    """Compile ``f`` with XLA; trace once per input signature; repeated calls
    on arrays and numbers skip the interpreters (the fast path)."""
    traces: Traces = {}
    fast_calls: dict[tuple, FastCall] = {}  # new
    call_f = StaticArgs(f, static_argnums, static_argnames)

    @functools.wraps(f)
    def f_jitted(*args: Any, **kwargs: Any) -> Any:
        # new: the fast path, on a hit; flat positional arguments need no flattening
        flat = not kwargs and not call_f.static  # new
        signature = input_signature(args) if flat else None  # new
        fast_call = None if signature is None else fast_calls.get(signature)  # new
        if fast_call is not None:  # new
            return fast_call(args)  # new
        leaves, in_tree = tree_flatten(call_f.mark_static(args, kwargs))
        if signature is None:  # new: a pytree, keywords or static values
            leaf_signature = input_signature(leaves)  # new: None for the full path
            if leaf_signature is not None:  # new
                signature = (in_tree, leaf_signature)  # new
                fast_call = fast_calls.get(signature)  # new
                if fast_call is not None:  # new
                    return fast_call(leaves)  # new
        args_flat = [_as_input(x, "jit argument") for x in leaves]
        jaxpr, consts, out_tree = trace_for_call(call_f, traces, args_flat, in_tree)
        outs = bind(xla_call_p, *consts, *args_flat, jaxpr=jaxpr)
        if signature is not None and stands_alone(jaxpr, consts):  # new
            fast_calls[signature] = FastCall(jaxpr, consts, out_tree)  # new
        return tree_unflatten(out_tree, outs)

    f_jitted.traces = traces  # for the curious: what has been traced so far
    f_jitted.fast_calls = fast_calls  # new: which signatures take the fast path
    return f_jitted


# %% [markdown]
# Here is the fast path being taken. `scaled` is the same Python function as
# `part3_scaled` above, jitted with the new `jit`; its first call takes the
# full path, traces, and leaves an entry. Then the profiling hook watches a
# repeated call of each:

# %%
scaled = jit(scaled_sin)  # the new jit
scaled(a, b)  # first call: the full path, which adds an entry
print(len(scaled.fast_calls), "entry")

for label, f in [("Part 3's jit", part3_scaled), ("new jit", scaled)]:
    names = Counter(name for module, name in python_calls(f, a, b))
    total = sum(names.values())
    print(f"{label}: {total} Python calls, bind {names['bind']}")

for module, name in python_calls(scaled, a, b):
    print(f"  {module:24} {name}")

# %% [markdown]
# The repeated call of the new `jit` never reaches `bind`: it runs eight
# Python functions where Part 3's `jit` runs more than a hundred. In order:
# `f_jitted` and `input_signature` compute the key, reading the device
# `Array`'s shape and dtype, which JAX's array class provides as Python
# properties; `FastCall.__call__` runs the entry; the copier of the NumPy
# argument `b` calls jaxlib, which asks one method of JAX's sharding class, in
# Python, for its description; then the executable runs and the result handler
# builds the output in C++, calling back into Python only for our `Array`
# class.
#
# The results agree with NumPy, whichever path a call takes. A NumPy array with
# the type of `a` has `a`'s key and finds its entry. A Python float traces and
# adds an entry; a NumPy `float64` scalar has the same key, so its call takes
# the fast path at once, without tracing or `bind`. Under `make_jaxpr` the
# dynamic level is not 0, so the call goes through `bind` and the jaxpr keeps
# its `xla_call` equation (no "tracing!": the full path finds the trace from
# before). Two signatures, two entries:

# %%
print(scaled(np.linspace(0.0, 1.0, 4), b))  # a NumPy array: the entry of (a, b)
print(np.sin(np.linspace(0.0, 1.0, 4)) * 2.0 + 1.0)
print(scaled(0.5, 1.0), np.sin(0.5) * 2.0 + 1.0)  # a Python float: a new entry
calls = python_calls(scaled, np.float64(0.5), 1.0)  # a NumPy scalar: that entry
names = Counter(name for module, name in calls)
print(f"np.float64(0.5): {len(calls)} Python calls, bind {names['bind']}")
print(scaled(np.float64(0.5), 1.0))
vector = ShapedArray((4,), np.float64)
print(make_jaxpr(scaled, vector, vector)[0])  # staged out: the full path
for signature in scaled.fast_calls:
    print(signature)

# %% [markdown]
# ## How much faster?
#
# `jax.jit` does the same kind of lookup, but in C++: on a repeated call it runs
# no Python at all. We cannot match that from Python, so the targets leave
# room. A call with a device `Array` should take at most 1.5 times as long as a
# `jax.jit` call, and one with a host argument at most 2 times, because a host
# argument is copied on every call, through jaxlib's Python API. How much room
# that copy needs was measured too: jaxlib's three calls of a fast call (copy,
# run, make the output), timed back to back with none of our Python between
# them, take about 1.4 times as long as JAX's whole call for a NumPy array (the
# column *jaxlib alone / JAX* in the table below). No Python dispatch built on
# these calls can do better.
#
# The chart now shows each step of the fast path (the lower bar of each pair)
# under the full path's steps from before:

# %% mystnb={"image": {"alt": "Stacked horizontal bars, two per kind of argument (Python float, NumPy scalar, NumPy array, device Array), the upper one for Part 3's jit and the lower one for the fast path. Each bar is split into the steps of one call; the fast path has only the signature lookup, the copy, the run and the outputs. A black tick marks the time of a jax.jit call with the same argument."}} tags=["hide-input"]
# @title Chart: the steps of one call, Part 3's jit and the fast path
dispatch_profile_chart(report["results"]["dispatch"])

# %% tags=["hide-input"]
# @title Table: median µs per call, Part 3's jit, the fast path and jax.jit
from figures import dispatch_kinds_table

dispatch_kinds_table(report["results"]["dispatch"])

# %% [markdown]
# What remains of a fast call is the run, the copy of a host argument, making
# the output in C++, and a few microseconds of the Python listed above. For a
# device `Array` that Python is the whole gap to `jax.jit`. For a host argument
# the copy is the largest piece left, about as long as the run itself (for the
# NumPy array, 11.1 µs of copy and 9.5 µs of run): jaxlib's `batched_device_put`
# builds a complete jaxlib array object for the argument, where JAX's dispatch
# copies the argument in C++, without running any Python. The NumPy-scalar row
# is slower than the Python-float row for Part 3's `jit`, the fast path and
# `jax.jit` alike, while the fastest calls of the two kinds (the report keeps
# the minimum too) took about the same time in all three: read that difference
# as the noise of one run on a shared machine.
#
# ## Other programs, in brief
#
# The same benchmark run compares the two libraries on other small programs,
# written for JAX with `jax.lax` or `jax.numpy`, in `float64` for both. They use
# nothing this page built; they show where the two libraries' costs differ when
# dispatch is not the question. A ratio below 1 means autodidax is faster:

# %% tags=["hide-input"]
# @title Table: autodidax / JAX per benchmark, and what decides the ratio
from figures import benchmark_summary_table

benchmark_summary_table(
    report,
    [
        ("compute-bound jit", ["jit_compute"], [], "the same XLA program in both"),
        (
            "jit, first call",
            ["first_call_small", "first_call_chain"],
            [],
            "both pay for XLA's compiler",
        ),
        (
            "make_jaxpr",
            ["make_jaxpr_1000", "make_jaxpr_4000"],
            ["make_jaxpr"],
            "our Python per primitive against JAX's, which also records source"
            " locations and effects",
        ),
        (
            "eager sin, add",
            ["eager_sin", "eager_add"],
            [],
            "ours evaluate with NumPy; JAX runs every eager operation as a small"
            " compiled program (jax.numpy.sin is itself a jitted function)",
        ),
        ("eager grad", ["grad_500", "grad_2000"], ["grad"], "as for eager sin"),
        (
            "vmap of jit",
            ["vmap_of_jit"],
            [],
            "ours finds the batched jaxpr in a cache; JAX's inner jit meets"
            " batching tracers and takes its Python path",
        ),
        (
            "while_loop, scan, grad of scan",
            ["while_loop", "scan", "scan_grad"],
            [],
            "one XLA loop in both (two for the gradient)",
        ),
        (
            "pmap",
            ["pmap_dispatch"],
            [],
            "our Python on every call: Part 9's pmap has no fast path",
        ),
        (
            "embedding grad (V = 50k, 200k)",
            ["embedding_grad", "embedding_grad_large"],
            [],
            "a gather forward and a scatter-add backward in both (the indexing"
            " chapter); only the zero-filled gradient table grows with V",
        ),
        (
            "random uniform, normal",
            ["random_uniform", "random_normal"],
            [],
            "the same bits in both; on a CPU JAX compiles the Threefry hash as a"
            " loop over its rounds, ours is straight-line code",
        ),
        (
            "checkpoint: plain, body, √n",
            ["checkpoint_plain", "checkpoint_body", "checkpoint_sqrt_n"],
            [],
            "jit(grad) of a 1,024-step scan; XLA loops in both, saving the same"
            " residuals byte for byte (Part 11)",
        ),
        (
            "capstone training step",
            ["capstone_step"],
            [],
            "Part 12's transformer, jit(value_and_grad) and Adam: nearly the same"
            " XLA program in both (see below)",
        ),
    ],
)

# %% [markdown]
# Every target is met but one in this run: `pmap` dispatch took 2.07 times
# as long as `jax.pmap`'s (653 µs against 316 µs; the target is 2). Part 9's
# `pmap` runs its Python path on every call, and this ratio moves from run to
# run on a shared machine: the previous run of the same command, in the git
# history of `bench/results.json`, measured 1.62 (977 µs against 603 µs).
# Tracing with `make_jaxpr` grows in proportion to the program: from 1,000 to
# 4,000 primitives it took 4.10 times as long, 15.4 to 15.9 µs per primitive
# at every size. The folded cell holds every median, the growth ratios, and a
# chart of time against size.

# %% tags=["hide-input", "hide-output"]
# @title Details: every median, the growth ratios, time against program size
from IPython.display import display

from figures import benchmark_tables, scaling_chart

display(benchmark_tables(report))
scaling_chart(report)

# %% [markdown]
# ## A training step
#
# The capstone, Part 12, trains a small transformer. Its training step is one
# jitted call whose arguments are a nested dict of fourteen arrays, Adam's state (two
# more such dicts and a step count), a batch, a keyword learning rate and a
# static `n_heads`: the kind of call the fast path now takes, flattened once
# and matched by its tree structure. The benchmark `bench/bench_capstone.py` runs
# the chapter's model on both libraries, in float64, step for step on the same
# batches, and times each step until its loss is on the host. The table splits
# a step into the jitted loss alone (the forward pass), the jitted
# `value_and_grad` (forward and backward), and the whole step (also Adam's
# update); the last row is the time until a step's call returns:

# %% tags=["hide-input"]
# @title Table: the capstone's training step, piece by piece, ours and JAX's
from figures import capstone_breakdown_table

capstone = report["results"]["capstone"]
print(
    f"step: ratio {capstone['ratio']['autodidax']:.2f}, loss curves apart by at "
    f"most {capstone['max_rel_diff']['autodidax']:.1e} (relative)"
)
capstone_breakdown_table(capstone)

# %% [markdown]
# A step's call returns long before the step is done (the last row): dispatch
# is not where its time goes. When the capstone first ran, a step took 1.6
# times JAX's time, and the difference was in the compiled program. Counting
# the operations of both optimized programs by kind (what our executable's
# `hlo_modules()` and JAX's `compile().as_text()` print) showed two loops, the
# same number of matrix products and the same gathers and scatters on both
# sides, and one difference that mattered: `x @ w`, with a stack of matrices
# `x` (batch, positions, features) and one weight matrix `w`, copied `w` once
# per batch row and multiplied row by row, so the backward pass built a
# weight gradient per row and then summed them. Lowered as one `dot_general`
# that contracts `x`'s last axis with `w`'s first, as JAX does (the
# appendix's `@`), the product needs no copies, and the step runs in about
# the time of JAX's. What is left differs in small ways: a few all-zero
# tangents of constants, which our `jvp` makes as arrays and the compiled
# program receives as inputs; the layer weights, which the forward loop saves
# as residuals although they are its inputs; and the gradient of `split`,
# which we build from three padded slices where JAX concatenates.
#
# ## What real JAX does differently
#
# - **Dispatch in C++.** `jax.jit` returns an object implemented in C++
#   (`PjitFunction` in jaxlib's
#   [`pjit.cc`](https://github.com/jax-ml/jax/blob/main/jaxlib/pjit.cc)). Its
#   signature covers more than ours (weak types, shardings, static arguments,
#   and configuration such as the x64 switch), on a hit no Python runs at all,
#   and host arguments are copied to the device in C++ too.
# - **Weak types.** JAX remembers that an argument was a Python number: its
#   type is *weak*, and gives way to the other operand's dtype, so
#   `jax.jit(lambda x, y: x * y)(np.ones(3, np.float32), 2.0)` computes in
#   `float32`. Our jitted functions have no weak arguments: the `2.0` is a
#   `float64`, as `np.asarray` makes it, and the product is promoted to
#   `float64`, on both paths alike. Weak
#   types are part of JAX's signature, so a Python float and a NumPy `float64`
#   scalar are two entries of JAX's cache (two traces), where they are one
#   here.
# - **Asynchronous dispatch.** A JAX call returns as soon as the computation is
#   enqueued, before it has run ([asynchronous
#   dispatch](https://docs.jax.dev/en/latest/async_dispatch.html)). We use the
#   same runtime, so our calls return early too. The dispatch times on this
#   page stop at that return; the benchmarks that time the computation itself
#   wait for its result.
# - **Caching at every level.** JAX caches traced jaxprs per function and
#   signature, lowered modules, and compiled executables, and it can keep
#   compiled programs on disk across processes (the [persistent compilation
#   cache](https://docs.jax.dev/en/latest/persistent_compilation_cache.html)). We
#   cache traces per signature and executables per jaxpr, in memory.
#
# For timing your own JAX code, see [benchmarking and
# profiling](https://docs.jax.dev/en/latest/201/profiling.html) in the JAX docs.
#
# ## Running the benchmarks yourself
#
# From the repository root, with the pinned requirements installed:
#
# ```bash
# python bench/run_all.py          # a minute or two; writes bench/results.json
# python bench/run_all.py --quick  # tiny sizes: checks that everything runs
# python bench/run_all.py --baseline old_autodidax.py --json compare.json
# ```
#
# `--baseline` times a second version of `autodidax.py` (for instance
# `git show HEAD~1:autodidax.py > old_autodidax.py`) in the same process, as a
# third column, which is the fair way to see what a change did.
# `bench/README.md` describes each benchmark and its options. Timings move with
# the machine and with whatever else it is doing, dispatch times most of all:
# compare runs made close together on the same machine.
