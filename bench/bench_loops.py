"""Benchmark: a jitted 100,000-step while_loop, next to jax.lax.while_loop.

One program, written once for both libraries: the carry is a step counter and
a float64[8] vector, and each trip computes ``x * 0.99999 + sin(x) * 1e-5``
until the counter reaches the trip count. Both libraries compile it with
their ``jit`` into one StableHLO ``while`` loop, so the time is spent in XLA's
loop; the benchmark checks that autodidax's jaxpr has a single ``while``
equation whatever the trip count (the loop is traced once, never unrolled).

After one call that compiles it, each timed call runs the whole loop and
waits for the result; repeats alternate which library goes first. The report
gives the median, minimum and maximum in milliseconds, the ratio autodidax /
JAX (SPEC section 6: within 1.5x), and the largest difference of each result
from a NumPy loop computing the same thing.

Run it from the repository root:

    python bench/bench_loops.py                  # 100,000 steps, 9 repeats
    python bench/bench_loops.py --quick          # a smoke run
    python bench/bench_loops.py --steps 1000000 --repeats 5
    python bench/bench_loops.py --json out.json  # also write the results
    python bench/bench_loops.py --no-jax         # autodidax alone

x64 mode is switched on for JAX in ``main`` only (and restored when it
returns), so both libraries compute in float64.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

BENCH_DIR = str(Path(__file__).resolve().parent)
if BENCH_DIR not in sys.path:  # find benchlib also when loaded by path (tests)
    sys.path.insert(0, BENCH_DIR)

import benchlib  # noqa: E402  (also puts this checkout's autodidax on the path)

import autodidax as ad  # noqa: E402

VECTOR_SIZE = 8
STEPS = 100_000
QUICK_STEPS = 1_000
REPEATS = 9
QUICK_REPEATS = 2
TARGET_RATIO = 1.5  # SPEC section 6: within 1.5x of jax.lax


class Library:
    """What this benchmark needs from one library."""

    def __init__(
        self,
        name: str,
        jit: Callable,
        while_loop: Callable,
        sin: Callable,
        put: Callable[[np.ndarray], Any],
        block: Callable[[Any], Any],
        count_eqns: Callable[[Callable, np.ndarray], int] | None = None,
    ) -> None:
        self.name = name
        self.jit = jit
        self.while_loop = while_loop
        self.sin = sin
        self.put = put  # NumPy array -> device array
        self.block = block  # wait until a result is computed
        self.count_eqns = count_eqns  # top-level equations of f's jaxpr


def autodidax_library(module: ModuleType = ad, name: str = "autodidax") -> Library:
    """autodidax (this checkout's, or ``module``, e.g. an older version)."""

    def count_eqns(f: Callable, x: np.ndarray) -> int:
        return len(module.make_jaxpr(f, x)[0].eqns)

    return Library(
        name,
        jit=module.jit,
        while_loop=module.while_loop,
        sin=module.sin,
        put=module.device_put,
        block=lambda out: out._buffer.block_until_ready(),
        count_eqns=count_eqns,
    )


def jax_library() -> Library:
    import jax
    from jax import lax

    return Library(
        "jax",
        jit=jax.jit,
        while_loop=lax.while_loop,
        sin=lax.sin,
        put=jax.device_put,
        block=lambda out: out.block_until_ready(),
    )


def loop_function(lib: Library, steps: int) -> Callable:
    """The benchmark's program, for ``lib``: ``steps`` trips of the update."""

    def body(carry):
        i, x = carry
        return i + 1, x * 0.99999 + lib.sin(x) * 1e-5

    def f(x):
        return lib.while_loop(lambda carry: carry[0] < steps, body, (0, x))[1]

    return f


def reference(x: np.ndarray, steps: int) -> np.ndarray:
    """The same loop in NumPy."""
    for _ in range(steps):
        x = x * 0.99999 + np.sin(x) * 1e-5
    return x


def stats_ms(times: Sequence[float]) -> dict:
    return {
        "repeats": len(times),
        "median_ms": statistics.median(times) * 1e3,
        "min_ms": min(times) * 1e3,
        "max_ms": max(times) * 1e3,
    }


def measure(libs: list[Library], steps: int, repeats: int) -> dict:
    """Times of the compiled loop, each call waiting for its result."""
    x_host = np.linspace(-1.0, 2.0, VECTOR_SIZE)
    expected = reference(x_host, steps)
    runners, errors, eqns = {}, {}, {}
    for lib in libs:
        f = loop_function(lib, steps)
        if lib.count_eqns is not None:
            eqns[lib.name] = lib.count_eqns(f, x_host)
        g, x = lib.jit(f), lib.put(x_host)
        out = g(x)  # trace and compile
        lib.block(out)
        errors[lib.name] = float(np.max(np.abs(np.asarray(out) - expected)))
        runners[lib.name] = (g, x)
    times: dict[str, list[float]] = {lib.name: [] for lib in libs}
    for i in range(repeats):
        order = libs if i % 2 == 0 else libs[::-1]
        for lib in order:
            g, x = runners[lib.name]
            gc.collect()
            start = time.perf_counter()
            lib.block(g(x))
            times[lib.name].append(time.perf_counter() - start)
    row = {
        "program": f"while_loop of {steps:_} steps of x * 0.99999 + sin(x) * 1e-5 "
        f"on float64[{VECTOR_SIZE}], jitted",
        "steps": steps,
        **{name: stats_ms(t) for name, t in times.items()},
        "max_abs_error": errors,
        "top_level_eqns": eqns,
    }
    names = [lib.name for lib in libs]
    if "jax" in names:
        for name in names:
            if name != "jax":
                key = "ratio" if name == "autodidax" else f"ratio_{name}"
                row[key] = row[name]["median_ms"] / row["jax"]["median_ms"]
    return row


def print_report(report: dict) -> None:
    row, names = report["results"]["while_loop"], report["libraries"]
    print(f"loops benchmark: {row['program']}, median ms per call")
    header = f"{'measurement':<26} " + " ".join(f"{n:>12}" for n in names)
    header += f" {'ours/jax':>9}"
    print(header)
    print("-" * len(header))
    values = " ".join(f"{row[n]['median_ms']:>12.3f}" for n in names)
    ratio = f"{row['ratio']:.3f}x" if "ratio" in row else "-"
    print(f"{'jitted while_loop':<26} {values} {ratio:>9}")
    eqns = ", ".join(f"{n} {k}" for n, k in row["top_level_eqns"].items())
    print(f"top-level jaxpr equations: {eqns}")
    errors = ", ".join(f"{n} {e:.1e}" for n, e in row["max_abs_error"].items())
    print(f"largest difference from NumPy: {errors}")
    summary = report["summary"]
    if not summary["meaningful"]:
        print("quick run: too few steps to judge")
    elif summary["ratio"] is not None:
        print(
            f"target: within {TARGET_RATIO}x of jax.lax.while_loop: "
            f"{benchlib.verdict(summary['met'])}"
        )


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Time a jitted while_loop, autodidax next to jax.lax."
    )
    parser.add_argument("--quick", action="store_true", help="few steps, a smoke run")
    parser.add_argument("--json", metavar="PATH", help="also write results as JSON")
    parser.add_argument("--steps", type=int, help="trips of the loop")
    parser.add_argument("--repeats", type=int, help="timed calls per library")
    parser.add_argument("--no-jax", action="store_true", help="time autodidax only")
    args = parser.parse_args(argv)
    if args.steps is None:
        args.steps = QUICK_STEPS if args.quick else STEPS
    if args.repeats is None:
        args.repeats = QUICK_REPEATS if args.quick else REPEATS
    if min(args.steps, args.repeats) < 1:
        parser.error("counts must be positive")
    return args


def summary(row: dict, quick: bool) -> dict:
    ratio = row.get("ratio")
    return {
        "meaningful": not quick,
        "target_ratio": TARGET_RATIO,
        "ratio": ratio,
        "met": None if ratio is None else ratio <= TARGET_RATIO,
    }


def main(argv: Sequence[str] | None = None) -> dict:
    """Run the benchmark, print the table, and return the report as a dict."""
    args = parse_args(argv)
    with benchlib.jax_x64():
        libs = [autodidax_library()]
        if not args.no_jax:
            libs.append(jax_library())
        row = measure(libs, args.steps, args.repeats)
    report = {
        "benchmark": "loops",
        "quick": args.quick,
        "libraries": [lib.name for lib in libs],
        "config": {
            "vector_size": VECTOR_SIZE,
            "steps": args.steps,
            "repeats": args.repeats,
        },
        "results": {"while_loop": row},
        "summary": summary(row, args.quick),
        "machine": benchlib.machine_info(),
    }
    benchlib.publish(report, print_report, args.json)
    return report


if __name__ == "__main__":
    main()
