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
# page compares the two on the same small programs, measured on one machine in
# one process by the benchmarks in the repository's `bench/` directory. It also
# builds the one piece of the module that exists only for speed: a fast path for
# calling a jitted function again.
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
# `bench/results.json`, the report that `python bench/run_all.py` wrote and that
# is committed with the code; the cells below only read it and draw it. Every
# number is a median over many calls, and every comparison is a ratio:
# **autodidax's time divided by JAX's**. Below 1, autodidax was faster; above 1,
# JAX was.

# %% tags=["hide-input"]
# @title Read the benchmark report
import json
import textwrap
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
# ## The numbers
#
# Each row of the chart is one benchmark: a dot at autodidax's time over JAX's,
# on a logarithmic axis, so that "twice as slow" and "twice as fast" are the same
# distance from the line at 1. Green and red dots have a
# {ref}`target <performance-targets>` (met or missed); a short bar marks
# the target when it is a ratio to JAX. Blue dots are measured for comparison
# only.

# %% mystnb={"image": {"alt": "A dot chart with one row per benchmark (jit dispatch, compute-bound jit, first calls, make_jaxpr and grad at two sizes, eager operations, vmap of jit). Each dot is autodidax's median time divided by JAX's, on a logarithmic axis with a vertical line at 1, where both are equally fast; dots left of it are benchmarks where autodidax was faster. Short bars mark the targets 1.5 for jit dispatch and 1.02 for compute-bound jit."}} tags=["hide-input"]
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
# What each row measures, in full. JAX runs the same program written with
# `jax.lax` or `jax.numpy`, with its 64-bit mode switched on, so that both
# libraries compute in `float64`.

# %% tags=["hide-input"]
# @title What each benchmark measures
for row in report["headline"]:
    what = f"{row['benchmark']}, {row['case']}: {row['detail']}"
    print(textwrap.fill(what, 78, subsequent_indent="    "))


# %% [markdown]
# (performance-targets)=
# ## The targets
#
# The benchmarks check three targets:
#
# - **`jit` dispatch within 1.5× of `jax.jit`.** Calling an already compiled
#   function should not cost much more than it does in JAX, even though JAX does
#   it in C++ and we do it in Python.
# - **Compute-bound `jit` within 2% of `jax.jit`.** When the time is spent in
#   the compiled program, both libraries run the code of the same compiler, so
#   there is no excuse for a difference.
# - **Tracing and `grad` linear in program size, and tracing under 30 µs per
#   primitive.** Four times the primitives may take at most 4.4 times as long:
#   nothing in tracing or differentiating should look at the whole program once
#   per primitive.
#
# ## Where the time goes
#
# **`jit` dispatch.** A call of a compiled function on eight numbers does almost
# no arithmetic; what is measured is the way from the Python call to the
# executable and back. The {ref}`next section <performance-fast-path>` times every
# step of that way and then builds a fast path for it: a table keyed by the arguments' shapes
# and dtypes that leads straight to the executable, skipping flattening, avals,
# `bind` and the type checks, all of which the first call with that signature
# already did. What remains is XLA's own launch and the creation of the output
# array (the same calls JAX makes), plus about a microsecond of Python.
#
# **Compute-bound `jit`.** With four million elements, a call spends its time in
# XLA's loop over the data; both libraries hand XLA the same twenty elementwise
# operations, and XLA fuses them into the same loop. The ratio is 1 up to the
# noise of the machine.
#
# **The first call.** Tracing and lowering a 20-primitive function take about a
# millisecond; XLA's compiler takes the rest, for both libraries.
# JAX lowers with more information than we do (sharding, source locations,
# effects, layouts) and goes through more caching layers, which costs it a little
# more per fresh function.
#
# **`make_jaxpr`.** Tracing calls `bind` once per primitive, which finds the top
# trace, boxes the arguments, runs the abstract evaluation rule and records an
# equation; nothing looks at earlier equations, so the cost is linear. JAX's
# tracer does the same and more per equation: it records where in your Python
# code the equation came from, tracks effects and weak types, and applies
# dtype promotion rules. That extra work per equation is why JAX's tracer is no
# faster than this one.
#
# **`grad`.** Eager `grad` runs `jvp` with partial evaluation over the function,
# evaluating the known half as it goes, then runs the transposed equations
# backwards; every primitive is visited a few times, and again nothing is
# quadratic. The large ratio in our favour has a simple cause: autodidax
# evaluates eager operations with NumPy on the host, which for eight numbers
# takes well under a microsecond, while JAX runs each eager operation as a small
# compiled XLA program, forward and backward. For large arrays, or on a GPU,
# JAX's choice is the one that pays; in real programs one would also `jit` the
# gradient.
#
# **Eager operations.** The same difference in the small: an autodidax `sin` is
# `bind`, the evaluation interpreter and one NumPy call. `jax.numpy.sin` is itself
# a jitted function, so an eager call goes through JAX's C++ dispatch and starts
# a tiny compiled program. The two end up costing about the same.
#
# **`vmap` of `jit`.** Each call runs the batching interpreter over one
# `xla_call` equation: its batching rule finds the batched jaxpr in a cache and
# binds `xla_call` again, now with no tracers, which runs the batched executable.
# In JAX the inner jitted function is reached through `bind` as well, so it takes
# JAX's general Python path for its `jit` primitive instead of the C++ one, with
# more to check and more to look up. JAX's advice is to put `jit` outermost,
# `jax.jit(jax.vmap(f))`, which makes the whole call one C++ dispatch (and the
# same order is the fast one here).
#
# (performance-fast-path)=
# ## A fast path for repeated calls
#
# The first call of a jitted function pays for tracing and for XLA's compiler:
# tens of milliseconds. After that, a call with the same input signature should
# cost little more than starting the executable. Ours costs a lot more. Timing
# each step of one call of the small function `sin(x) * 2.0 + x` on a
# device-resident `float64[8]`, with Part 3's `jit`, on the machine that produced
# the numbers above, gives:
#
# | step of a repeated call | µs |
# | --- | ---: |
# | `tree_flatten` of the arguments | 0.9 |
# | `_as_input` and the aval of every leaf, for the key | 1.8 |
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
# **When the shortcut may be taken.** `bind` hands an operation to the highest
# level among the dynamic level and the levels of the arguments' tracers
# (`find_top_trace`). If the dynamic level is level 0, the evaluation
# interpreter at the bottom of the stack (nothing is being staged out by
# `make_jaxpr` or an outer `jit`), and no argument is a tracer (all are `Array`s
# or NumPy arrays), `bind` will choose the evaluation interpreter, whose `impl`
# rule checks the types and runs the compiled code. Running the code is the part the fast path
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
#
# The folded cell makes those handlers with jaxlib's `array_result_handler`, one
# per output of the jaxpr.


# %% tags=["export", "hide-input"]
# @title Result handlers: jaxlib builds the output arrays
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


# %% [markdown]
# A `FastCall` holds what a call with a known signature needs, and
# `array_signature` computes the key, or `None` when the call must take the full
# path:


# %% tags=["export"]
class FastCall:
    """What a call with a known signature needs, and nothing more."""

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
    """The (shape, dtype) of every argument, or None for the full path."""
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
# The new `jit` replaces Part 3's. It tries the table first. On a miss it does
# what Part 3's `jit` does (with its `trace_for_call`), and afterwards, if the
# call was eligible, it records a `FastCall` for the signature. The table is
# attached to the jitted function as `fast_calls`, next to `traces`.


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
# `Array` class for the output. `jax.jit` does these same steps, but all of
# them in C++ (see below): a repeated call never runs a line of Python. That, not a different algorithm, is
# the remaining gap.
#
# ## What real JAX does differently
#
# - **Dispatch in C++.** `jax.jit` returns an object implemented in C++
#   (`PjitFunction` in jaxlib's
#   [`pjit.cc`](https://github.com/jax-ml/jax/blob/main/jaxlib/pjit.cc)). Its
#   signature covers more than ours (weak types, shardings, static arguments,
#   and configuration such as the x64 switch), and on a hit no Python runs at
#   all. That is the whole remaining gap in `jit` dispatch.
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
# python bench/run_all.py          # about a minute; writes bench/results.json
# python bench/run_all.py --quick  # tiny sizes: checks that everything runs
# python bench/run_all.py --baseline old_autodidax.py --json compare.json
# ```
#
# `--baseline` measures a second version of `autodidax.py` (for instance
# `git show HEAD~1:autodidax.py > old_autodidax.py`) as a third column next to
# the others, in the same process, which is the fair way to see what a change
# did. Each benchmark also runs on its own (`bench/bench_jit.py`,
# `bench_make_jaxpr.py`, `bench_grad.py`, `bench_overhead.py`), with more
# options; `bench/README.md` describes them. After a new full run,
# `python build_tools/book.py refresh book/performance.md` redraws this page.
#
# Timings move with the machine and with whatever else it is doing, dispatch
# times most of all. Compare runs made on the same machine, close together, and
# look at the load average the report records.
