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
# one process by the benchmarks in the repository's `bench/` directory.
#
# Nothing is measured while this page is built. The numbers come from
# `bench/results.json`, the report that `python bench/run_all.py` wrote and that
# is committed with the code; the cells below only read it and draw it. Every
# number is a median over many calls, and every comparison is a ratio:
# **autodidax's time divided by JAX's**. Below 1, autodidax was faster; above 1,
# JAX was.

# %% tags=["hide-input"]
import json
import math
import textwrap
from html import escape
from pathlib import Path

from IPython.display import HTML, SVG

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
# distance from the line at 1. Green and red dots have a target in the
# {ref}`project's spec <performance-targets>` (met or missed); a short bar marks
# the target when it is a ratio to JAX. Blue dots are measured for comparison
# only.

# %% mystnb={"image": {"alt": "A dot chart with one row per benchmark (jit dispatch, compute-bound jit, first calls, make_jaxpr and grad at two sizes, eager operations, vmap of jit). Each dot is autodidax's median time divided by JAX's, on a logarithmic axis with a vertical line at 1, where both are equally fast; dots left of it are benchmarks where autodidax was faster. Short bars mark the targets 1.5 for jit dispatch and 1.02 for compute-bound jit."}} tags=["hide-input"]
GREEN, RED, BLUE, GREY = "#2e7d32", "#c62828", "#1f5fa8", "#888888"


def dot_color(row):
    if row["met"] is None:
        return BLUE
    return GREEN if row["met"] else RED


def ratio_chart(rows):
    """An SVG dot chart of autodidax / JAX per headline row (log axis)."""
    ratios = [row["ratios"]["autodidax"] for row in rows]
    marks = [row["target_ratio"] for row in rows if row["target_ratio"]]
    low = 10 ** math.floor(math.log10(min([*ratios, 1.0])))
    high = 10 ** math.ceil(math.log10(max([*ratios, *marks, 1.0])))
    left, right, top, row_height = 300, 650, 64, 26
    width, height = 740, top + row_height * len(rows) + 46

    def x(ratio):
        share = math.log(ratio / low) / math.log(high / low)
        return left + share * (right - left)

    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" '
        f'height="{height}" font-family="sans-serif" font-size="13">',
        "<title>autodidax time / JAX time, per benchmark</title>",
        f'<rect x="{left}" y="{top - 8}" width="{x(1.0) - left:.1f}" '
        f'height="{row_height * len(rows) + 8}" fill="#eef5ee"/>',
        f'<text x="{x(1.0) - 6:.1f}" y="{top - 16}" text-anchor="end" '
        f'fill="{GREEN}">autodidax faster</text>',
        f'<text x="{x(1.0) + 6:.1f}" y="{top - 16}" fill="{GREY}">JAX faster</text>',
    ]
    legend = [(GREEN, "target met"), (RED, "target missed"), (BLUE, "no target")]
    for i, (color, text) in enumerate(legend):
        parts.append(
            f'<circle cx="{left + 8 + 120 * i}" cy="14" r="5" fill="{color}"/>'
            f'<text x="{left + 18 + 120 * i}" y="18">{text}</text>'
        )
    bottom = top + row_height * len(rows)
    exponent = round(math.log10(low))
    while 10**exponent <= high:
        for step in (1, 2, 5):
            tick = step * 10.0**exponent
            if low <= tick <= high:
                label = f"{tick:g}"
                parts.append(
                    f'<line x1="{x(tick):.1f}" y1="{top - 8}" x2="{x(tick):.1f}" '
                    f'y2="{bottom}" stroke="#dddddd"/>'
                    f'<text x="{x(tick):.1f}" y="{bottom + 18}" '
                    f'text-anchor="middle" fill="#555555">{label}</text>'
                )
        exponent += 1
    parts.append(
        f'<line x1="{x(1.0):.1f}" y1="{top - 8}" x2="{x(1.0):.1f}" y2="{bottom}" '
        'stroke="#333333" stroke-width="1.5"/>'
        f'<text x="{(left + right) / 2}" y="{bottom + 38}" text-anchor="middle">'
        "autodidax time / JAX time (log scale)</text>"
    )
    previous = None
    for i, row in enumerate(rows):
        y = top + row_height * i + row_height / 2
        if previous is not None and row["benchmark"] != previous:
            parts.append(
                f'<line x1="10" y1="{y - row_height / 2:.1f}" x2="{right}" '
                f'y2="{y - row_height / 2:.1f}" stroke="#cccccc" '
                'stroke-dasharray="2,3"/>'
            )
        previous = row["benchmark"]
        label = escape(f"{row['benchmark']}, {row['case']}")
        ratio = row["ratios"]["autodidax"]
        parts.append(f'<text x="10" y="{y + 4:.1f}">{label}</text>')
        if row["target_ratio"]:
            target_x = x(row["target_ratio"])
            parts.append(
                f'<line x1="{target_x:.1f}" y1="{y - 8:.1f}" x2="{target_x:.1f}" '
                f'y2="{y + 8:.1f}" stroke="{GREY}" stroke-width="3"/>'
            )
        parts.append(
            f'<circle cx="{x(ratio):.1f}" cy="{y:.1f}" r="6" '
            f'fill="{dot_color(row)}"/>'
            f'<text x="{right + 12}" y="{y + 4:.1f}">{ratio:.2f}×</text>'
        )
    parts.append("</svg>")
    return SVG("".join(parts))


ratio_chart(report["headline"])


# %% [markdown]
# The same numbers as a table, with the times themselves. The last table is
# about growth: how much longer tracing and `grad` take for a program four times
# as long. Linear cost means a factor of 4; the target allows 4.4.


# %% tags=["hide-input"]
def number(value):
    return f"{value:.0f}" if value >= 100 else f"{value:.3g}"


def verdict(target, met):
    if target is None:
        return ""
    return f"{target}: " + ("met" if met else "<strong>missed</strong>")


def html_table(caption, header, rows, numeric):
    """An HTML table; the columns in ``numeric`` are right-aligned."""

    def cells(tag, values):
        return "".join(
            f'<{tag} style="text-align: {"right" if i in numeric else "left"}">'
            f"{value}</{tag}>"
            for i, value in enumerate(values)
        )

    body = "".join(f"<tr>{cells('td', row)}</tr>" for row in rows)
    return (
        f'<table class="table"><caption>{escape(caption)}</caption>'
        f"<thead><tr>{cells('th', header)}</tr></thead><tbody>{body}</tbody></table>"
    )


main_rows = [
    [
        escape(row["benchmark"]),
        escape(row["case"]),
        escape(row["unit"]),
        number(row["values"]["autodidax"]),
        number(row["values"]["jax"]),
        f"{row['ratios']['autodidax']:.2f}",
        verdict(row["target"], row["met"]),
    ]
    for row in report["headline"]
]
growth_rows = [
    [
        escape(growth["benchmark"]),
        f"{growth['sizes'][0]} → {growth['sizes'][-1]} primitives",
        f"{growth['time_ratios']['autodidax']:.2f}×",
        f"{growth['time_ratios']['jax']:.2f}×",
        verdict(f"≤ {growth['max_time_ratio']:.1f}×", growth["met"]),
    ]
    for growth in report["growth"]
]
HTML(
    html_table(
        "Medians per benchmark",
        ["benchmark", "case", "unit", "autodidax", "JAX", "autodidax / JAX", "target"],
        main_rows,
        numeric={3, 4, 5},
    )
    + html_table(
        "Growth: time at the larger size divided by time at the smaller",
        ["benchmark", "sizes", "autodidax", "JAX", "target"],
        growth_rows,
        numeric={2, 3},
    )
)

# %% [markdown]
# What each row measures, in full. JAX runs the same program written with
# `jax.lax` or `jax.numpy`, with its 64-bit mode switched on, so that both
# libraries compute in `float64`.

# %% tags=["hide-input"]
for row in report["headline"]:
    what = f"{row['benchmark']}, {row['case']}: {row['detail']}"
    print(textwrap.fill(what, 78, subsequent_indent="    "))

# %% [markdown]
# (performance-targets)=
# ## The targets
#
# The project's spec asks for three things, and the benchmarks check each:
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
# executable and back. {ref}`Part 3 <part3-fast-path>` times every step of that
# way and then builds a fast path for it: a table keyed by the arguments' shapes
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
