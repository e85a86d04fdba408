"""Benchmark: the cost of make_jaxpr as programs grow, next to jax.make_jaxpr.

The program is a straight chain of N primitives on a small float64 vector,
cycling through sin, mul, cos, add and neg (mul and add take the input as
their second operand), so its jaxpr has exactly N equations. The same chain is
written once with autodidax and once with jax.lax, and both are traced in this
one process. For every size we report the median over several runs of the
time of one make_jaxpr call, in milliseconds and in microseconds per
primitive, and the ratio of the time at the largest size to the time at the
smallest one.

SPEC section 6 asks for linear cost: 4x the operations in at most 4.4x the time
(for other sizes: the size ratio times 1.1), and under 30 microseconds per
primitive. The report says whether autodidax meets those targets; nothing
here fails on timing unless ``--check`` is given.

Run it from the repository root:

    python bench/bench_make_jaxpr.py                  # N = 1000 and 4000
    python bench/bench_make_jaxpr.py --sizes 500 2000 8000 --repeats 9
    python bench/bench_make_jaxpr.py --quick          # tiny sizes, a smoke run
    python bench/bench_make_jaxpr.py --json out.json  # also write the results

x64 mode is switched on for JAX in this process only (and restored when
``main`` returns), so both libraries trace float64 programs.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:  # measure this checkout's autodidax.py
    sys.path.insert(0, str(REPO_ROOT))

import autodidax as ad  # noqa: E402

DEFAULT_SIZES = (1000, 4000)
QUICK_SIZES = (20, 80)
VECTOR_SIZE = 8
TARGET_US_PER_PRIMITIVE = 30.0
TARGET_SLACK = 1.1  # time ratio allowed per unit of size ratio (4x -> 4.4x)
CYCLE = ("sin", "mul", "cos", "add", "neg")


def chain(ops: Any, n: int) -> Callable[[Any], Any]:
    """A fresh function applying ``n`` primitives of ``ops`` in a chain.

    ``ops`` maps the names in CYCLE to functions. A new function object per
    call keeps any tracing cache keyed on the function from being hit.
    """

    def f(x):
        y = x
        for i in range(n):
            name = CYCLE[i % len(CYCLE)]
            if name in ("mul", "add"):
                y = ops[name](y, x)
            else:
                y = ops[name](y)
        return y

    return f


def autodidax_tracer() -> tuple[dict, Callable[[Callable], int]]:
    ops = {"sin": ad.sin, "cos": ad.cos, "mul": ad.mul, "add": ad.add, "neg": ad.neg}
    aval = ad.ShapedArray((VECTOR_SIZE,), np.float64)

    def trace(f: Callable) -> int:
        jaxpr, _, _ = ad.make_jaxpr(f, aval)
        return len(jaxpr.eqns)

    return ops, trace


def jax_tracer() -> tuple[dict, Callable[[Callable], int]]:
    import jax
    from jax import lax

    ops = {
        "sin": lax.sin,
        "cos": lax.cos,
        "mul": lax.mul,
        "add": lax.add,
        "neg": lax.neg,
    }
    spec = jax.ShapeDtypeStruct((VECTOR_SIZE,), np.float64)

    def trace(f: Callable) -> int:
        return len(jax.make_jaxpr(f)(spec).jaxpr.eqns)

    return ops, trace


def time_tracing(ops: dict, trace: Callable, n: int, repeats: int) -> dict:
    """Median time of tracing a chain of ``n`` primitives (after one warm-up)."""
    eqns = trace(chain(ops, n))  # warm-up; also checks the equation count
    times = []
    for _ in range(repeats):
        f = chain(ops, n)
        gc.collect()
        start = time.perf_counter()
        trace(f)
        times.append(time.perf_counter() - start)
    median = statistics.median(times)
    return {
        "n": n,
        "eqns": eqns,
        "repeats": repeats,
        "median_s": median,
        "min_s": min(times),
        "max_s": max(times),
        "us_per_primitive": median / n * 1e6,
    }


def machine_info() -> dict:
    import jax
    import jaxlib

    try:
        commit = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        commit = ""
    return {
        "timestamp": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "processor": platform.processor(),
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "implementation": platform.python_implementation(),
        "numpy": np.__version__,
        "jax": jax.__version__,
        "jaxlib": jaxlib.__version__,
        "autodidax_commit": commit or None,
    }


def summarize(results: dict[str, list[dict]], quick: bool) -> dict:
    """Scaling ratios and whether autodidax meets the SPEC targets."""
    summary: dict[str, Any] = {}
    for library, rows in results.items():
        small, large = rows[0], rows[-1]
        size_ratio = large["n"] / small["n"]
        time_ratio = large["median_s"] / small["median_s"]
        summary[library] = {
            "smallest_n": small["n"],
            "largest_n": large["n"],
            "size_ratio": size_ratio,
            "time_ratio": time_ratio,
            "max_time_ratio": size_ratio * TARGET_SLACK,
            "us_per_primitive_largest": large["us_per_primitive"],
        }
    ours = summary["autodidax"]
    summary["targets"] = {
        "meaningful": not quick and ours["size_ratio"] > 1,
        "linear_scaling_met": ours["time_ratio"] <= ours["max_time_ratio"],
        "us_per_primitive_target": TARGET_US_PER_PRIMITIVE,
        "us_per_primitive_met": all(
            row["us_per_primitive"] < TARGET_US_PER_PRIMITIVE
            for row in results["autodidax"]
        ),
    }
    if "jax" in results:
        summary["autodidax_over_jax"] = [
            ours_row["median_s"] / jax_row["median_s"]
            for ours_row, jax_row in zip(results["autodidax"], results["jax"])
        ]
    return summary


def print_report(report: dict) -> None:
    results, summary = report["results"], report["summary"]
    print(
        f"make_jaxpr of a chain of N primitives ({'/'.join(CYCLE)}) on "
        f"float64[{VECTOR_SIZE}]; median of {report['repeats']} runs"
    )
    header = f"{'library':<10} {'N':>7} {'eqns':>7} {'median ms':>11} {'us/prim':>9}"
    print(header)
    print("-" * len(header))
    for library, rows in results.items():
        for row in rows:
            print(
                f"{library:<10} {row['n']:>7} {row['eqns']:>7} "
                f"{row['median_s'] * 1e3:>11.2f} {row['us_per_primitive']:>9.2f}"
            )
    print()
    for library in results:
        s = summary[library]
        print(
            f"{library:<10} time(N={s['largest_n']}) / time(N={s['smallest_n']}) = "
            f"{s['time_ratio']:.2f}x for {s['size_ratio']:.1f}x the primitives"
        )
    if "autodidax_over_jax" in summary:
        ratios = ", ".join(
            f"N={row['n']}: {r:.2f}x"
            for row, r in zip(results["autodidax"], summary["autodidax_over_jax"])
        )
        print(f"autodidax time / jax time: {ratios}")
    targets, ours = summary["targets"], summary["autodidax"]
    note = "" if targets["meaningful"] else " (quick run: sizes too small to judge)"
    print(
        f"target: time ratio <= {ours['max_time_ratio']:.2f}x -> "
        f"{'met' if targets['linear_scaling_met'] else 'MISSED'}{note}"
    )
    print(
        f"target: < {TARGET_US_PER_PRIMITIVE:.0f} us per primitive -> "
        f"{'met' if targets['us_per_primitive_met'] else 'MISSED'}{note}"
    )


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Time make_jaxpr (autodidax and JAX) on chains of N primitives."
    )
    parser.add_argument(
        "--sizes",
        type=int,
        nargs="+",
        help=f"program sizes N, smallest first (default: {DEFAULT_SIZES})",
    )
    parser.add_argument(
        "--repeats", type=int, help="timed runs per size (default 7, quick 3)"
    )
    parser.add_argument("--quick", action="store_true", help="tiny sizes, 3 runs")
    parser.add_argument("--json", metavar="PATH", help="also write results as JSON")
    parser.add_argument("--no-jax", action="store_true", help="time autodidax only")
    parser.add_argument(
        "--check",
        action="store_true",
        help="exit with status 1 if autodidax misses a target (not with --quick)",
    )
    args = parser.parse_args(argv)
    if args.sizes is None:
        args.sizes = list(QUICK_SIZES if args.quick else DEFAULT_SIZES)
    if args.repeats is None:
        args.repeats = 3 if args.quick else 7
    if any(n < 1 for n in args.sizes) or args.repeats < 1:
        parser.error("sizes and repeats must be positive")
    args.sizes = sorted(set(args.sizes))
    return args


def main(argv: Sequence[str] | None = None) -> dict:
    """Run the benchmark, print the table, and return the report as a dict."""
    args = parse_args(argv)
    import jax

    x64_before = jax.config.jax_enable_x64
    jax.config.update("jax_enable_x64", True)
    try:
        tracers = {"autodidax": autodidax_tracer()}
        if not args.no_jax:
            tracers["jax"] = jax_tracer()
        results = {
            library: [time_tracing(ops, trace, n, args.repeats) for n in args.sizes]
            for library, (ops, trace) in tracers.items()
        }
    finally:
        jax.config.update("jax_enable_x64", x64_before)
    report = {
        "benchmark": "make_jaxpr",
        "program": {"cycle": list(CYCLE), "vector": f"float64[{VECTOR_SIZE}]"},
        "sizes": args.sizes,
        "repeats": args.repeats,
        "quick": args.quick,
        "results": results,
        "summary": summarize(results, args.quick),
        "machine": machine_info(),
    }
    print_report(report)
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
        print(f"wrote {args.json}")
    targets = report["summary"]["targets"]
    if args.check and targets["meaningful"]:
        if not (targets["linear_scaling_met"] and targets["us_per_primitive_met"]):
            raise SystemExit(1)
    return report


if __name__ == "__main__":
    main()
