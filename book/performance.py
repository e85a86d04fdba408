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
# The autodidax module is written to be read, not to be fast. Still, it runs real programs
# on a real compiler, so it is fair to ask how its costs compare with JAX's, and
# the answers say a lot about where the time in a system like this goes. This
# page first does one piece of performance work from start to end: it finds
# where the time of a repeated `jit` call goes, step by step, and builds the one
# piece of the module that exists only for speed, a fast path for calling a
# jitted function again. Then it compares the two libraries on the same small
# programs, measured on one machine in one process by the benchmarks in the
# repository's `bench/` directory.
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
# Nothing is measured while this page is built. The numbers come from
# `bench/results.json`, the report that `python bench/run_all.py` wrote; the
# cells below only read it and draw it. Every number is a median over many
# calls, and every comparison is a ratio: **autodidax's time divided by JAX's**.
# Below 1, autodidax was faster; above 1, JAX was. The cell below prints what
# the report measured: the machine (a small one, shared with other work, so the
# absolute times are noisy; the ratios are steadier, because the two libraries
# take turns in the same process), and the commit of autodidax it measured,
# with "plus uncommitted changes" when the working tree differed from that
# commit during the run. To measure your own checkout, run the benchmarks
# yourself (see the end of this page).

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
commit = (machine["autodidax_commit"] or "unknown")[:10]
changes = " plus uncommitted changes" if machine["uncommitted_changes"] else ""
load = machine["load_average_at_start"][0]
print(f"command:   {report['command']}")
print(f"measured:  {machine['timestamp']}, load average {load:.2f} at the start")
print(f"machine:   {machine['platform']}, {machine['cpu_count']} CPUs")
print(
    f"versions:  Python {machine['python']}, NumPy {machine['numpy']}, "
    f"JAX {machine['jax']}, jaxlib {machine['jaxlib']}"
)
print(f"autodidax: commit {commit}{changes}")

# %% [markdown]
# (performance-fast-path)=
# ## Where the time of one call goes
#
# The first call of a jitted function pays for tracing and for XLA's compiler:
# tens of milliseconds. After that, a call with the same input signature should
# cost little more than starting the executable. With Part 3's `jit` it costs
# a lot more, and more still when the argument lives on the host, a Python
# number, a NumPy scalar or a NumPy array, which is what a learner passes most
# of the time (`f(3.0)`, `f(np.float64(0.5))`, `f(np.linspace(0, 1, 8))`).
#
# To make something faster, first find out where its time goes. Python's
# profiler, `cProfile`, is the first tool to reach for, and it names the
# functions a call spends its time in. For a call that takes a few tens of
# microseconds it is too coarse: one call of Part 3's `jit` makes about a
# hundred Python function calls, most of them small, and the profiler's
# bookkeeping for each is of the same order as the work of the small ones, so
# it changes the very proportions we want to see. Here the better tool is a
# stopwatch: write out the steps of one call
# by hand, read `time.perf_counter_ns()` between every two steps, repeat that
# many thousands of times, and take the median of each step. For the full path
# of Part 3's `jit`, the timed steps look like this (a sketch of the benchmark's
# code, not run here):
#
# ```python
# t0 = time.perf_counter_ns()
# args_flat, in_tree = tree_flatten(args)
# args_flat = [_as_input(x, "jit argument") for x in args_flat]
# t1 = time.perf_counter_ns()  # 1. flatten and check the arguments
# jaxpr, consts, out_tree = trace_for_call(f, traces, args_flat, in_tree)
# t2 = time.perf_counter_ns()  # 2. avals, the cache key, the cache lookup
# # and so on, a clock reading after each of the other four steps:
# # 3. bind: box the arguments, find the top trace, check types against the jaxpr
# # 4. copy the arguments to the device
# # 5. run the executable
# # 6. split the results into outputs and wrap each in an Array
# ```
#
# `bench/bench_dispatch.py` does this for Part 3's `jit` (the *full path*), for
# the fast path built below, and for four kinds of argument, then times whole
# calls of both and of `jax.jit` on the same function, `sin(x) * 2.0 + x`. The
# chart shows the medians of that report. Next to each bar, in parentheses, is
# the median of whole calls. The two are timed separately, and the written-out
# steps skip the Python calls that connect them in the real code (entering the
# jitted function, `bind`, the `impl` rule, the compiled call), so a bar's sum
# and its whole call need not agree. Read a bar for its proportions, which
# steps are long and which are short; the table further down has the whole
# calls.

# %% mystnb={"image": {"alt": "Stacked horizontal bars, two per kind of argument (Python float, NumPy scalar, NumPy array, device Array), the upper one for Part 3's jit and the lower one for the fast path. Each bar is split into the steps of one call (flatten and check the arguments, signature and cache lookup, bind and type checks, copy to the device, run the executable, wrap the outputs), and a black tick marks the time of a jax.jit call with the same argument."}} tags=["hide-input"]
# @title Chart: the steps of one call, before and after the fast path
from figures import dispatch_profile_chart

dispatch_profile_chart(report["results"]["dispatch"])


# %% [markdown]
# Reading the chart from the top: with Part 3's `jit`, a Python float spends
# most of its call in steps that have nothing to do with running the program.
# It is flattened as a pytree, converted to a NumPy array and checked; an aval
# is built for the cache key; `bind` finds the top trace, boxes the argument and
# calls the `impl` rule, which checks the types against the jaxpr again; and
# `device_put` converts the number to an array once more, builds JAX's aval
# for it, copies it to the device and wraps it in an `Array`; after the run,
# every output is split out of the results and wrapped again. A NumPy scalar
# or array takes the same way. A device `Array` skips the copy, so its bar is
# the shortest. In every bar, only one step does work that differs from call to
# call: running the executable (and, for a host argument, copying its value).
# Every other step recomputes an answer that the first call already found,
# and that depends only on the *types* of the arguments: their structure, their
# avals, which interpreter handles the call, that the types match the jaxpr,
# which executable to run, how to copy a value of that type to the device. So
# we remember, per signature, what running needs, and skip the rest.
#
# ## A fast path for repeated calls
#
# **The key.** When every argument is an array or a number on its own (no
# lists or dicts around it), the input signature is the tuple of each
# argument's shape and dtype. Both are cheap to read: a NumPy array or NumPy
# scalar has them as attributes, and so does the jaxlib array inside an `Array`,
# which keeps them in C++. For a number, the full path asks NumPy what it
# becomes (`np.asarray(3.0)` is a 0-d `float64` array, `np.asarray(True)` a
# `bool`, `np.asarray(3)` an `int64`, `np.asarray(np.float32(3))` a `float32`),
# so the key for it is that same shape and dtype, found in a table by the
# number's type (quicker than converting the number to find out). A Python
# float, `np.float64(3.0)` and `np.array(3.0)` therefore share one entry, as
# they share one trace. One exception: NumPy makes an integer beyond the range
# of `int64` a `uint64` or an object array, so such an integer takes the full
# path, which converts or rejects it as before. No flattening is needed: "*n*
# arguments" is already said by the length of the tuple.
#
# **When the shortcut may be taken.** `bind` hands an operation to the highest
# level among the dynamic level and the levels of the arguments' tracers
# (`find_top_trace`). If the dynamic level is level 0, the evaluation
# interpreter at the bottom of the stack (nothing is being staged out by
# `make_jaxpr` or an outer `jit`), and no argument is a tracer, `bind` will
# choose the evaluation interpreter, whose `impl` rule checks the types and runs
# the compiled code. Running the code is the part the fast path keeps. Under
# `jvp`, `vmap` or `grad` the arguments of a jitted function are tracers, so
# those calls keep going through `bind` and `xla_call`'s rules. Containers of
# arrays also take the full path; the shortcut is for the calls that matter in
# a loop, and the full path handles the others as before.
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
# **Copying arguments with their type known.** The full path's `device_put`
# converts its argument with `np.asarray`, builds JAX's aval for it, and hands
# both to jaxlib's `batched_device_put`, which copies the value to the device.
# With the type fixed by the signature, the aval can be built once, when the
# entry is made; jaxlib's copy accepts a Python number, a NumPy scalar or a NumPy
# array as it is, so the conversion goes too. What remains per call is the copy,
# which, as in Part 3's `device_put`, is finished before the call returns, so
# that the argument's memory is never shared (for small arrays this is no
# slower than jaxlib's other options).
#
# **Building the outputs in C++.** The last step gets cheaper too.
# `CompiledJaxpr` asks the execution's results to split into one jaxlib array
# per output, then wraps each in an `Array`, a general route that costs as much
# as running the program. jaxlib can instead make the output arrays with a
# *result handler*, made once per output from its shape and dtype; the handler's
# `wrap` passes each new jaxlib array to our `Array` class. This is the same
# runtime layer `device_put` uses: we still borrow none of JAX's tracing or
# transformations.
#
# The folded cell makes both kinds of helper, once per input and output of the
# jaxpr: a copier per input with jaxlib's `batched_device_put`, and a result
# handler per output with jaxlib's `array_result_handler`.


# %% tags=["export", "hide-input"]
# @title Copiers and result handlers: jaxlib moves the values, in C++
def host_copiers(avals: Sequence[ShapedArray]) -> list[Callable[[Any], Any]]:
    """Per aval, a function copying a Python number, NumPy scalar or NumPy
    array of that type to the device as a jaxlib array."""
    from jaxlib import _jax

    sharding, devices = runtime().sharding, [runtime().device]
    copy_now = _jax.HostBufferSemantics.IMMUTABLE_ONLY_DURING_CALL  # as device_put

    def copier(aval: ShapedArray) -> Callable[[Any], Any]:
        jax_aval = jax.core.ShapedArray(aval.shape, aval.dtype)
        return lambda x: _jax.batched_device_put(
            jax_aval, sharding, [x], devices, True, False, copy_now, True
        )

    return [copier(aval) for aval in avals]


def result_handlers(jaxpr: Jaxpr) -> list[Any]:
    """Per output of ``jaxpr``, a jaxlib handler that turns an executable's
    output buffer into an ``Array``, building jaxlib's array object in C++."""
    from jaxlib import _jax

    sharding = runtime().sharding
    handlers = []
    for out in jaxpr.outs:
        aval = out.aval
        handler = _jax.array_result_handler(
            jax.core.ShapedArray(aval.shape, aval.dtype),
            sharding,
            committed=True,
            _skip_checks=True,
        )
        handlers.append(handler.wrap(Array))
    return handlers


# The key of a number, by its type: the shape and dtype that np.asarray (the
# full path's conversion) gives it. Python's numbers, and NumPy's scalars of
# booleans, integers and floats of up to 64 bits.
NUMBER_TYPES = (bool, int, float, *(np.dtype(c).type for c in "?bhilqBHILQefd"))
SCALAR_KEYS = {kind: ((), np.asarray(kind()).dtype) for kind in NUMBER_TYPES}
INT64_MIN, INT64_MAX = int(np.iinfo(np.int64).min), int(np.iinfo(np.int64).max)


# %% [markdown]
# A `FastCall` holds what a call with a known signature needs, and
# `input_signature` computes the key, or `None` when the call must take the full
# path:


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
            x = x._buffer  # jaxlib's array: shape and dtype are read in C++
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


# %% [markdown]
# **This replaces `jit` from Part 3** because the table must be consulted
# before anything Part 3's `jit` does on a call (flattening and converting the
# arguments, looking up the trace, `bind`). A hook in Part 3's `jit`, filled in
# here, would avoid the replacement, but it would put code into Part 3 that
# serves only this page, where Part 3 means to show `jit` as simply as it can.
# Part 3's `jit`, whose every call takes the full path, stays available as
# `full_path_jit` (the tests and the benchmarks compare with it).
#
# The change, as a diff would show it: in `jit`, the lines marked `# new` are
# added, the docstring gains a clause, and nothing else differs from Part 3's.
# The new `jit` tries the table first, and returns at once on a hit. On a miss
# it runs Part 3's `jit` body unchanged (with its `trace_for_call`), and
# afterwards, if the call was eligible (`stands_alone`, also new), it records a
# `FastCall` for the signature. A call whose jaxpr has a collective over an
# axis name it does not bind itself is not eligible: `bind` hands such a call to
# the `vmap` or `pmap` interpreter that binds the name ({ref}`Part 9 <part9>`),
# even when no argument is that interpreter's tracer, and the fast path, which
# never calls `bind`, would skip that interpreter. The table is attached to the
# jitted function as `fast_calls`, next to `traces`.

# %% tags=["export"]
full_path_jit = jit  # Part 3's jit, kept under this name before jit is replaced


def stands_alone(jaxpr: Jaxpr, consts: list) -> bool:
    """Whether a call needs nothing but its arguments: no tracer among its
    constants, no collective over an axis an enclosing vmap binds (Part 9)."""
    closed = not any(isinstance(c, Tracer) for c in consts)
    return closed and not free_axis_names(jaxpr)


def jit(f: Callable) -> Callable:
    """Compile ``f`` with XLA; trace once per input signature; repeated calls
    on arrays and numbers skip the interpreters (the fast path)."""
    traces: Traces = {}
    fast_calls: dict[tuple, FastCall] = {}  # new

    @functools.wraps(f)
    def f_jitted(*args: Any) -> Any:
        signature = input_signature(args)  # new: the fast path, on a hit
        if signature is not None:  # new
            fast_call = fast_calls.get(signature)  # new
            if fast_call is not None:  # new
                return fast_call(args)  # new
        args_flat, in_tree = tree_flatten(args)
        args_flat = [_as_input(x, "jit argument") for x in args_flat]
        jaxpr, consts, out_tree = trace_for_call(f, traces, args_flat, in_tree)
        outs = bind(xla_call_p, *consts, *args_flat, jaxpr=jaxpr)
        if signature is not None and stands_alone(jaxpr, consts):  # new
            fast_calls[signature] = FastCall(jaxpr, consts, out_tree)  # new
        return tree_unflatten(out_tree, outs)

    f_jitted.traces = traces  # for the curious: what has been traced so far
    f_jitted.fast_calls = fast_calls  # new: which signatures take the fast path
    return f_jitted


# %% [markdown]
# The first call below takes the full path (it traces, as the `print` shows) and
# leaves an entry behind; `first` has the type of `a`, so the second call's
# signature is that entry's key, and the call takes the fast path. A device
# `Array` and a NumPy array of the same type share an entry, as they share a
# trace, and so do a Python float and a NumPy `float64` scalar. The results
# agree with NumPy:


# %%
@jit
def scaled(x, y):
    print("tracing!")
    return sin(x) * 2.0 + y


a = device_put(np.linspace(0.0, 1.0, 4))
b = np.ones(4)
first = scaled(a, b)  # full path: trace, compile, add an entry
print(len(scaled.fast_calls))  # one entry, for the signature of (a, b)
print(input_signature((first, b)) in scaled.fast_calls)  # the same signature
second = scaled(first, b)  # fast path: no trace, no bind
print(second)
expected_first = np.sin(np.linspace(0.0, 1.0, 4)) * 2.0 + 1.0
print(np.sin(expected_first) * 2.0 + 1.0)
print(scaled(0.5, 1.0), scaled(np.float64(0.5), 1.0))  # one trace, one entry
print(np.sin(0.5) * 2.0 + 1.0)

# %% [markdown]
# The fast path steps aside where it must, and shares what it can. Under
# `make_jaxpr` the call goes through `bind`, so the jaxpr still has its
# `xla_call` equation (and "tracing!" stays silent: the full path finds the
# trace of the first call). A NumPy array with the type of `a` finds the entry
# that `a` left, and after all these calls the table holds two entries, one per
# signature:

# %%
vector = ShapedArray((4,), np.float64)
print(make_jaxpr(scaled, vector, vector)[0])  # staged out: the full path
print(scaled(np.linspace(0.0, 1.0, 4), b))  # fast path: the entry of (a, b)
print(expected_first)
print(len(scaled.fast_calls))
for signature in scaled.fast_calls:
    print(signature)

# %% [markdown]
# Reading the lower bar of each pair in the chart above: what remains of a fast
# call is running the executable, the copy of a host argument, making the
# output array in C++, and a few microseconds of Python: entering
# `f_jitted`, reading the interpreter state, the loop that builds the
# signature, hashing it, calling the `FastCall`, and calling our `Array` class
# for the output. `jax.jit` does these same steps, but all of them in C++ (see
# below): a repeated call never runs a line of Python. With a device `Array`,
# that is the whole gap.
#
# With a host argument, the largest piece left is the copy, about as long as
# the run itself: it goes through jaxlib's Python API, `batched_device_put`, which
# builds a whole jaxlib array object for the argument, where JAX's C++ dispatch
# copies and runs in one call with no Python object for it. Timed with no line
# of our Python between them, jaxlib's three calls of a fast call (copy, run,
# make the output) already take about 1.4 times JAX's whole call for a NumPy array
# (the column *jaxlib alone / JAX* below), which is why host arguments have a
# target of 2× and device arrays one of 1.5×.
#
# The folded cell prints the medians behind the chart, each ratio to `jax.jit`
# with its target, and that floor:

# %% tags=["hide-input"]
# @title Table: median µs per call, Part 3's jit, the fast path and jax.jit
from figures import dispatch_kinds_table

dispatch_kinds_table(report["results"]["dispatch"])

# %% [markdown]
# ## The numbers
#
# Here is every benchmark, the dispatch ones above included. JAX runs the same
# programs written with `jax.lax` or `jax.numpy`, with its 64-bit mode switched
# on, so that both libraries compute in `float64`. Each row of the
# chart is one benchmark: a dot at autodidax's time over JAX's,
# on a logarithmic axis, so that "twice as slow" and "twice as fast" are the same
# distance from the line at 1. Green and red dots have a
# {ref}`target <performance-targets>` (met or missed); a short bar marks
# the target when it is a ratio to JAX. Blue dots are measured for comparison
# only.

# %% mystnb={"image": {"alt": "A dot chart with one row per benchmark (jit dispatch for four kinds of argument, compute-bound jit, first calls, make_jaxpr and grad at two sizes, eager operations, vmap of jit, jitted while_loop and scan, jit of grad through scan, and pmap dispatch on eight devices). Each dot is autodidax's median time divided by JAX's, on a logarithmic axis with a vertical line at 1, where both are equally fast; dots left of it are benchmarks where autodidax was faster. Short bars mark the targets (2 or 1.5 for jit dispatch, 1.02 for compute-bound jit, 1.5 for the loops and 2 for grad through scan)."}} tags=["hide-input"]
# @title Chart: autodidax time / JAX time per benchmark
from figures import benchmark_ratio_chart

benchmark_ratio_chart(report["headline"])

# %% [markdown]
# The same numbers as a table, with the times themselves. The last table is
# about growth: how much longer tracing and `grad` take for a program four times
# as long. Linear cost means a factor of 4; the target allows 4.4.

# %% tags=["hide-input"]
# @title Tables: medians per benchmark, and growth
from figures import benchmark_tables

benchmark_tables(report)

# %% [markdown]
# (performance-targets)=
# ## The targets
#
# The benchmarks check these targets:
#
# - **`jit` dispatch within 1.5× of `jax.jit` for a device array, and within
#   2× for a Python float, a NumPy scalar or a NumPy array.** Calling an
#   already compiled function should not cost much more than it does in JAX,
#   even though JAX does it in C++ and we do it in Python. Host arguments get
#   more room because each call copies them to the device: from Python,
#   jaxlib's calls alone take about 1.4 times JAX's whole call for a NumPy array.
# - **Compute-bound `jit` within 2% of `jax.jit`.** When the time is spent in
#   the compiled program, both libraries run the code of the same compiler, so
#   there is no excuse for a difference.
# - **Tracing and `grad` linear in program size, and tracing under 30 µs per
#   primitive.** Four times the primitives may take at most 4.4 times as long:
#   nothing in tracing or differentiating should look at the whole program once
#   per primitive.
# - **Loops within 1.5× of `jax.lax`, `grad` through `scan` within 2×.** A
#   jitted `while_loop` or `scan` of 100,000 steps runs in XLA's loop, so it
#   should cost what JAX's does; the gradient through a 1,000-step `scan` is a
#   forward loop that saves residuals and a backward loop over them.
# - **`pmap` dispatch within 2× of `jax.pmap`** on eight host devices, with
#   the same outputs as `jax.pmap` (the tests check that).
#
# ## Where the time goes, benchmark by benchmark
#
# **`jit` dispatch.** A call of a compiled function on eight numbers does almost
# no arithmetic; what is measured is the way from the Python call to the
# executable and back, which {ref}`the first sections <performance-fast-path>`
# took apart. With a device array, what remains after the fast path is XLA's own
# launch and the creation of the output array (the same calls JAX makes), plus
# a microsecond or two of Python. With a host argument, each call also copies
# it to the device, through a Python API that costs more than JAX's C++ copy.
#
# **Compute-bound `jit`.** With four million elements, a call spends its time in
# XLA's loop over the data; both libraries hand XLA the same twenty elementwise
# operations, and XLA fuses them into the same loop. The ratio is 1 up to the
# noise of the machine.
#
# **Loops.** A jitted `while_loop` or `scan` is one `stablehlo.while` for
# both libraries, so the time is XLA's loop, and the ratio is close to 1. The
# gradient through `scan` is two loops, the forward one saving its residuals
# and the backward one reading them. JAX builds its pair with `scan`'s
# linearize rule and transposition, we build ours by `jvp`, partial evaluation
# and transposition ({ref}`Part 7 <part7>`), but the two pairs are loops of the
# same kind, so here too the time is XLA's.
#
# **The first call.** Tracing and lowering a 20-primitive function take about a
# millisecond; XLA's compiler takes the rest, for both libraries.
# JAX lowers with more information than we do (sharding, source locations,
# effects, layouts) and goes through more caching layers, which costs it a little
# more per fresh function.
#
# **`make_jaxpr`.** Tracing calls `bind` once per primitive, which finds the top
# trace, boxes the arguments, runs the abstract evaluation rule and records an
# equation; none of these steps looks at earlier equations, so the work per
# primitive does not depend on the length of the program. The measured time
# per primitive did grow in this run (13 µs at 1,000 primitives, 16.5 µs at
# 4,000), a miss of the growth target, while another full run on this machine
# met it (3.70×): the growth varies from run to run by more than the target's
# margin. JAX's tracer does the same and more per equation: it records where in
# your Python code the equation came from, and it tracks effects and weak types.
#
# The chart below shows the growth for every size measured, not only for the
# two in the table: the median time of one call against the number of
# primitives, for both libraries, each divided by its own time at the largest
# size (the absolute times are in the table), so that cost in proportion to the
# program puts the points on the dashed diagonal. Cost that grew faster than the
# program would bend the points below the diagonal at the small sizes. The bars
# run from the fastest to the slowest of the repeats at each size: on a busy
# machine a single median can sit well off the line (a garbage collection or
# another process falling into a run), and the bars show how far. Hollow
# circles: CPU time (`time.process_time`), less disturbed by other processes.

# %% mystnb={"image": {"alt": "Two scatter plots side by side, make_jaxpr and eager grad. Each shows, for autodidax and for JAX, the median time of one call divided by that library's time at the largest size, against the number of primitives in the program, with bars from the fastest to the slowest run, hollow circles for CPU time, and a dashed diagonal from zero where cost in proportion to size would put the points."}} tags=["hide-input"]
# @title Chart: time against program size, make_jaxpr and grad
from figures import scaling_chart

scaling_chart(report)

# %% [markdown]
# **`grad`.** Eager `grad` runs `jvp` with partial evaluation over the function,
# evaluating the known half as it goes, then runs the transposed equations
# backwards; every primitive is visited a few times, and again nothing is
# quadratic (four times the program took 3.8 times as long in this run). The
# large ratio in our favour has a simple cause: autodidax evaluates eager
# operations with NumPy on the host, which for eight numbers takes well under a
# microsecond, while JAX runs each eager operation as a small
# compiled XLA program, forward and backward. For large arrays, or on a GPU,
# JAX's choice is the one that pays; in real programs one would also `jit` the
# gradient.
#
# **Eager operations.** The same difference in the small: an autodidax `sin` is
# `bind`, the evaluation interpreter and one NumPy call. `jax.numpy.sin` is itself
# a jitted function, so an eager call goes through JAX's C++ dispatch and starts
# a tiny compiled program. Ours takes about 0.7 of JAX's time: on eight numbers,
# a NumPy call is cheaper than starting a compiled program, even from C++.
#
# **`vmap` of `jit`.** Each call runs the batching interpreter over one
# `xla_call` equation: its batching rule finds the batched jaxpr in a cache and
# binds `xla_call` again, now with no tracers, which runs the batched executable.
# In JAX the inner jitted function meets batching tracers, so its C++ entry
# point hands the call to Python: `jit`'s Python path traces the function
# (once, at the unbatched type) and binds the `jit` primitive, whose batching
# rule, in Python, builds (or finds) the batched jaxpr and binds it. Only then
# does the call reach C++ again, through a `pjit` object made for that jaxpr
# (`_pjit_call_impl` in `jax/_src/pjit.py`). The Python steps before it are
# what cost. In JAX too, `jit` outermost, `jax.jit(jax.vmap(f))`, is one C++
# dispatch per call (and the same order is the fast one here).
#
# **`pmap`.** {ref}`Part 9 <part9>`'s `pmap` of a small function with a
# `psum`, on eight host devices, each call waiting for its result: a call takes
# between half a millisecond and a millisecond, where a one-device `jit` call
# takes under twenty microseconds. Much of that is XLA running the program on
# eight devices and waiting for every one of them, the same work in both
# libraries. What differs is the way there: Part 9's `pmap` has no fast path
# like `jit`'s, so every call of ours runs Python (flattening and checking the
# arguments, looking up the trace, `bind` and the `impl` rule). In this run a
# call took 1.6 times as long as a call of `jax.pmap`, within the target of 2×.
#
# ## What real JAX does differently
#
# - **Dispatch in C++.** `jax.jit` returns an object implemented in C++
#   (`PjitFunction` in jaxlib's
#   [`pjit.cc`](https://github.com/jax-ml/jax/blob/main/jaxlib/pjit.cc)). Its
#   signature covers more than ours (weak types, shardings, static arguments,
#   and configuration such as the x64 switch), on a hit no Python runs at all,
#   and host arguments are copied to the device in C++ too. That is the whole
#   remaining gap in `jit` dispatch.
# - **Weak types.** JAX remembers that an argument was a Python number: its
#   type is *weak*, and gives way to the other operand's dtype, so
#   `jax.jit(lambda x, y: x * y)(np.ones(3, np.float32), 2.0)` computes in
#   `float32`. We have no weak types: the `2.0` is a `float64`, as `np.asarray`
#   makes it, and the mixed dtypes are an error, on both paths alike. Weak
#   types are part of JAX's signature, so a Python float and a NumPy `float64`
#   scalar are two entries of JAX's cache (two traces), where they are one
#   here.
# - **Asynchronous dispatch.** A JAX call returns as soon as the computation is
#   enqueued, before it has run ([asynchronous
#   dispatch](https://docs.jax.dev/en/latest/async_dispatch.html)). We use the
#   same runtime, so our calls return early too; that is why the benchmarks wait
#   for results explicitly where the computation itself is being timed.
# - **Caching at every level.** JAX caches traced jaxprs per function and
#   signature, lowered modules, and compiled executables, and it can keep
#   compiled programs on disk across processes (the [persistent compilation
#   cache](https://docs.jax.dev/en/latest/persistent_compilation_cache.html)). We
#   cache traces per signature and executables per jaxpr, in memory.
# - **Eager operations are compiled.** JAX has one execution path, XLA, for
#   eager operations too, so eager code behaves the same on every device. We use
#   NumPy for eager evaluation, which is quick for small arrays on the CPU and
#   nothing else.
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
# `--baseline` measures a second version of `autodidax.py` (for instance
# `git show HEAD~1:autodidax.py > old_autodidax.py`) as a third column next to
# the others, in the same process, which is the fair way to see what a change
# did. Each benchmark also runs on its own (`bench/bench_jit.py`,
# `bench_dispatch.py`, `bench_make_jaxpr.py`, `bench_grad.py`, `bench_overhead.py`,
# `bench_loops.py`), with more
# options; `bench/README.md` describes them. After a new full run,
# `python build_tools/book.py refresh book/performance.md` redraws this page.
#
# Timings move with the machine and with whatever else it is doing, dispatch
# times most of all. Compare runs made on the same machine, close together, and
# look at the load average the report records.
