"""Benchmark: autodidax's jit next to jax.jit, in one process.

Three measurements, each made for both libraries on the same program with
device-resident float64 inputs (an autodidax ``Array`` from ``device_put``,
a JAX array from ``jax.device_put``):

(a) dispatch: the steady-state cost of calling a small jitted function,
    ``sin(x) * 2.0 + x`` on float64[8], already traced and compiled. Each call
    is timed on its own, in rounds that alternate between the libraries; the
    report gives the median over all calls, in microseconds. Target (SPEC
    section 6): autodidax within 1.5x of jax.jit.
(b) compute: a chain of sin/mul/cos/add (20 primitives) on float64[4_000_000],
    where the time goes into XLA's compiled code. Each call waits for its
    result (``block_until_ready`` on the output buffer). Median milliseconds
    over alternating repeats; target: within 2% of jax.jit (same XLA
    underneath).
(c) first call: trace + lower + compile + run, for a fresh function each time
    (a new Python function with its own constant, so no cache is hit), on
    float64[8] for both programs. Median milliseconds; no target, reported
    for comparison.

Run it from the repository root:

    python bench/bench_jit.py                  # full sizes
    python bench/bench_jit.py --quick          # tiny sizes, a smoke run
    python bench/bench_jit.py --json out.json  # also write the results
    python bench/bench_jit.py --check          # exit 1 if a target is missed

x64 mode is switched on for JAX in ``main`` only (and restored when it
returns), so both libraries compute in float64; autodidax itself does not
need it.
"""

from __future__ import annotations

import argparse
import functools
import gc
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType

import numpy as np

BENCH_DIR = str(Path(__file__).resolve().parent)
if BENCH_DIR not in sys.path:  # find benchlib also when loaded by path (tests)
    sys.path.insert(0, BENCH_DIR)

import benchlib  # noqa: E402  (also puts this checkout's autodidax on the path)

import autodidax as ad  # noqa: E402

DISPATCH_SIZE = 8
COMPUTE_SIZE = 4_000_000
QUICK_COMPUTE_SIZE = 10_000
CHAIN_LENGTH = 20
CHAIN_CYCLE = ("sin", "mul", "cos", "add")
TARGET_DISPATCH_RATIO = 1.5
TARGET_COMPUTE_RATIO = 1.02

FULL = {"calls": 2000, "rounds": 10, "repeats": 15, "first_calls": 5}
QUICK = {"calls": 50, "rounds": 2, "repeats": 3, "first_calls": 2}


# ---------------------------------------------------------------------------
# The programs, written once for each library
# ---------------------------------------------------------------------------


class Library:
    """What the benchmark needs from one library."""

    def __init__(
        self,
        name: str,
        ops: dict[str, Callable],
        jit: Callable,
        put: Callable,
        block: Callable,
    ) -> None:
        self.name = name
        self.ops = ops  # sin, cos, mul, add
        self.jit = jit
        self.put = put  # NumPy array -> device array
        self.block = block  # wait until a result is computed


def autodidax_library(module: ModuleType = ad, name: str = "autodidax") -> Library:
    """autodidax (this checkout's, or ``module``, e.g. an older version)."""
    return Library(
        name,
        benchlib.ops_from(module, CHAIN_CYCLE),
        module.jit,
        module.device_put,
        lambda out: out._buffer.block_until_ready(),
    )


def jax_library() -> Library:
    import jax
    from jax import lax

    return Library(
        "jax",
        benchlib.ops_from(lax, CHAIN_CYCLE),
        jax.jit,
        jax.device_put,
        lambda out: out.block_until_ready(),
    )


def small_function(lib: Library, scale: float = 2.0) -> Callable:
    """A fresh ``sin(x) * scale + x``."""
    sin, mul, add = lib.ops["sin"], lib.ops["mul"], lib.ops["add"]

    def f(x):
        return add(mul(sin(x), scale), x)

    return f


def chain_function(lib: Library, length: int = CHAIN_LENGTH, scale: float = 1.0):
    """A fresh chain of ``length`` primitives cycling through CHAIN_CYCLE
    (mul and add take the input as their second operand), times ``scale``."""
    ops = lib.ops

    def f(x):
        y = benchlib.apply_chain(ops, x, length, CHAIN_CYCLE)
        return ops["mul"](y, scale) if scale != 1.0 else y

    return f


def reference_chain(x: np.ndarray, length: int = CHAIN_LENGTH) -> np.ndarray:
    """The chain in NumPy, to check both libraries' results."""
    steps = {
        "sin": lambda y: np.sin(y),
        "cos": lambda y: np.cos(y),
        "mul": lambda y: y * x,
        "add": lambda y: y + x,
    }
    y = x
    for i in range(length):
        y = steps[CHAIN_CYCLE[i % len(CHAIN_CYCLE)]](y)
    return y


# ---------------------------------------------------------------------------
# Measurements
# ---------------------------------------------------------------------------


def stats_ms(times: list[float]) -> dict:
    """Statistics of a few timed calls, in ms."""
    return {"repeats": len(times), **benchlib.spread(times, "ms")}


def compile_all(
    libs: list[Library], make: Callable, x_host: np.ndarray
) -> tuple[dict, dict]:
    """Jit ``make(lib)`` for every library and run it once on ``x_host`` (to
    trace and compile). Returns the (function, device input) pairs and the
    outputs as NumPy arrays, both keyed by library name."""
    runners, outputs = {}, {}
    for lib in libs:
        f, x = lib.jit(make(lib)), lib.put(x_host)
        out = f(x)  # trace and compile
        lib.block(out)
        outputs[lib.name] = np.asarray(out)
        runners[lib.name] = (f, x)
    return runners, outputs


def measure_dispatch(libs: list[Library], calls: int, rounds: int) -> dict:
    """Per-call times of a compiled small function, rounds alternating."""
    x_host = np.linspace(-1.0, 1.0, DISPATCH_SIZE)
    runners, outputs = compile_all(libs, small_function, x_host)
    times = benchlib.per_call_times(
        {name: functools.partial(f, x) for name, (f, x) in runners.items()},
        calls,
        rounds,
        settle={lib.name: lib.block for lib in libs},
    )
    expected = np.sin(x_host) * 2.0 + x_host
    return {
        "program": f"sin(x) * 2.0 + x on float64[{DISPATCH_SIZE}]",
        **{name: benchlib.per_call_stats(t) for name, t in times.items()},
        "max_abs_error": {
            name: float(np.max(np.abs(out - expected))) for name, out in outputs.items()
        },
    }


def measure_compute(libs: list[Library], size: int, repeats: int) -> dict:
    """Times of a compiled chain on a large vector, waiting for each result."""
    x_host = np.linspace(-2.0, 2.0, size)
    runners, outputs = compile_all(libs, chain_function, x_host)
    times: dict[str, list[float]] = {lib.name: [] for lib in libs}
    for i in range(repeats):
        # Alternate which library goes first, so that neither always runs
        # right after the other's memory traffic.
        order = libs if i % 2 == 0 else libs[::-1]
        for lib in order:
            f, x = runners[lib.name]
            gc.collect()
            start = time.perf_counter()
            lib.block(f(x))
            times[lib.name].append(time.perf_counter() - start)
    step = max(1, size // 1000)  # check a sample against NumPy
    expected = reference_chain(x_host[::step])
    return {
        "program": f"chain of {CHAIN_LENGTH} primitives "
        f"({'/'.join(CHAIN_CYCLE)}) on float64[{size}]",
        "size": size,
        **{name: stats_ms(t) for name, t in times.items()},
        "max_abs_error": {
            name: float(np.max(np.abs(out[::step] - expected)))
            for name, out in outputs.items()
        },
    }


def measure_first_call(libs: list[Library], repeats: int) -> dict:
    """Trace + lower + compile + run of fresh functions on float64[8]."""
    x_host = np.linspace(-1.0, 1.0, DISPATCH_SIZE)
    results: dict[str, dict] = {}
    for program, make in (("small", small_function), ("chain", chain_function)):
        times: dict[str, list[float]] = {lib.name: [] for lib in libs}
        for i in range(repeats):
            scale = 2.0 + 0.001 * (i + 1)  # a new constant: nothing is cached
            for lib in libs:
                x = lib.put(x_host)
                f = lib.jit(make(lib, scale=scale))
                gc.collect()
                start = time.perf_counter()
                lib.block(f(x))
                times[lib.name].append(time.perf_counter() - start)
        results[program] = {name: stats_ms(t) for name, t in times.items()}
    return results


def add_ratios(results: dict, names: list[str]) -> None:
    """autodidax / jax for every measurement (when both ran)."""
    if "jax" not in names:
        return
    dispatch = results["dispatch"]
    dispatch["ratio"] = (
        dispatch["autodidax"]["median_us"] / dispatch["jax"]["median_us"]
    )
    compute = results["compute"]
    compute["ratio"] = compute["autodidax"]["median_ms"] / compute["jax"]["median_ms"]
    for row in results["first_call"].values():
        row["ratio"] = row["autodidax"]["median_ms"] / row["jax"]["median_ms"]


def summarize(results: dict, quick: bool) -> dict:
    dispatch = results["dispatch"].get("ratio")
    compute = results["compute"].get("ratio")
    return {
        "meaningful": not quick and dispatch is not None,
        "dispatch_target": TARGET_DISPATCH_RATIO,
        "dispatch_ratio": dispatch,
        "dispatch_met": dispatch is not None and dispatch <= TARGET_DISPATCH_RATIO,
        "compute_target": TARGET_COMPUTE_RATIO,
        "compute_ratio": compute,
        "compute_met": compute is not None and compute <= TARGET_COMPUTE_RATIO,
    }


# ---------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------


def _ratio(row: dict) -> str:
    return f"{row['ratio']:.3f}x" if "ratio" in row else "-"


def print_report(report: dict) -> None:
    results, targets = report["results"], report["summary"]
    names = report["libraries"]
    print("jit benchmark: autodidax next to jax.jit (float64, device-resident inputs)")
    header = f"{'measurement':<34} " + " ".join(f"{n:>12}" for n in names)
    header += f" {'ours/jax':>9}"
    print(header)
    print("-" * len(header))

    def line(label: str, row: dict, key: str, unit_scale: float = 1.0) -> None:
        values = " ".join(f"{row[n][key] * unit_scale:>12.2f}" for n in names)
        print(f"{label:<34} {values} {_ratio(row):>9}")

    dispatch = results["dispatch"]
    line(f"(a) dispatch, median us/call [{DISPATCH_SIZE}]", dispatch, "median_us")
    compute = results["compute"]
    line(f"(b) compute, median ms [{compute['size']}]", compute, "median_ms")
    for program, row in results["first_call"].items():
        line(f"(c) first call '{program}', median ms", row, "median_ms")
    print()
    print(
        f"dispatch: {dispatch[names[0]]['calls']} calls per library; "
        f"compute: {compute[names[0]]['repeats']} repeats; "
        f"first call: {results['first_call']['small'][names[0]]['repeats']} "
        "fresh functions"
    )
    errors = {**dispatch["max_abs_error"]}
    worst = max(max(errors.values()), max(compute["max_abs_error"].values()))
    print(f"largest difference from NumPy in the results: {worst:.1e}")
    if targets["dispatch_ratio"] is None:
        print("targets: not judged (JAX not run)")
        return
    note = "" if targets["meaningful"] else benchlib.QUICK_NOTE
    print(
        f"target: dispatch within {TARGET_DISPATCH_RATIO}x of jax.jit -> "
        f"{targets['dispatch_ratio']:.2f}x, "
        f"{benchlib.verdict(targets['dispatch_met'])}{note}"
    )
    print(
        f"target: compute within {(TARGET_COMPUTE_RATIO - 1) * 100:.0f}% of jax.jit "
        f"-> {targets['compute_ratio']:.3f}x, "
        f"{benchlib.verdict(targets['compute_met'])}{note}"
    )


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Time autodidax.jit next to jax.jit: dispatch, compute, first call."
    )
    parser.add_argument("--quick", action="store_true", help="tiny sizes, few runs")
    parser.add_argument("--json", metavar="PATH", help="also write results as JSON")
    parser.add_argument(
        "--check",
        action="store_true",
        help="exit with status 1 if autodidax misses a target (not with --quick)",
    )
    parser.add_argument(
        "--size", type=int, help=f"compute vector length (default {COMPUTE_SIZE:_})"
    )
    parser.add_argument(
        "--calls", type=int, help="dispatch: timed calls per round and library"
    )
    parser.add_argument("--rounds", type=int, help="dispatch: rounds per library")
    parser.add_argument("--repeats", type=int, help="compute: timed calls per library")
    parser.add_argument(
        "--first-calls", type=int, help="first call: fresh functions per library"
    )
    parser.add_argument("--no-jax", action="store_true", help="time autodidax only")
    args = parser.parse_args(argv)
    defaults = QUICK if args.quick else FULL
    for key, value in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.size is None:
        args.size = QUICK_COMPUTE_SIZE if args.quick else COMPUTE_SIZE
    counts = (args.size, args.calls, args.rounds, args.repeats, args.first_calls)
    if any(n < 1 for n in counts):
        parser.error("sizes and counts must be positive")
    return args


def main(argv: Sequence[str] | None = None) -> dict:
    """Run the benchmark, print the table, and return the report as a dict."""
    args = parse_args(argv)
    with benchlib.jax_x64():
        libs = [autodidax_library()]
        if not args.no_jax:
            libs.append(jax_library())
        results = {
            "dispatch": measure_dispatch(libs, args.calls, args.rounds),
            "compute": measure_compute(libs, args.size, args.repeats),
            "first_call": measure_first_call(libs, args.first_calls),
        }
    names = [lib.name for lib in libs]
    add_ratios(results, names)
    report = {
        "benchmark": "jit",
        "quick": args.quick,
        "libraries": names,
        "config": {
            "dispatch_size": DISPATCH_SIZE,
            "dispatch_calls_per_round": args.calls,
            "dispatch_rounds": args.rounds,
            "compute_size": args.size,
            "compute_repeats": args.repeats,
            "chain_length": CHAIN_LENGTH,
            "first_calls": args.first_calls,
        },
        "results": results,
        "summary": summarize(results, args.quick),
        "machine": benchlib.machine_info(),
    }
    benchlib.publish(report, print_report, args.json)
    summary = report["summary"]
    if args.check and summary["meaningful"]:
        if not (summary["dispatch_met"] and summary["compute_met"]):
            raise SystemExit(1)
    return report


if __name__ == "__main__":
    main()
