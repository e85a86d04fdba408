"""Benchmark: the cost of grad as programs grow, next to jax.grad (not jitted).

The program is a scalar function of a small float64 vector: a straight chain
of N primitives cycling through sin, mul, cos, add and neg (mul and add take
the input as their second operand), followed by one reduce_sum, so its jaxpr
has N + 1 equations. The same function is written once with autodidax and
once with jax.lax, and both libraries differentiate it with ``grad`` in this
one process, eagerly (no jit on either side): each call traces the JVP,
partially evaluates it and runs the backward pass. For every size we report
the median over several calls of the time of one ``grad(f)(x)`` call, in
milliseconds and in microseconds per primitive, the ratio of the time at the
largest size to the time at the smallest one, and how far each library's
gradient is from a NumPy reference (forward mode written out by hand).

SPEC section 6 asks for linear cost: 4x the primitives in at most 4.4x the time
(for other sizes: the size ratio times 1.1). The report says whether autodidax
meets it; nothing here fails on timing unless ``--check`` is given.

Run it from the repository root:

    python bench/bench_grad.py                  # N = 500 and 2000
    python bench/bench_grad.py --sizes 500 2000 8000 --repeats 9
    python bench/bench_grad.py --quick          # tiny sizes, a smoke run
    python bench/bench_grad.py --json out.json  # also write the results
    python bench/bench_grad.py --no-gc          # collector off while timing

x64 mode is switched on for JAX in this process only (and restored when
``main`` returns), so both libraries differentiate float64 programs.
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

DEFAULT_SIZES = (500, 2000)
QUICK_SIZES = (20, 80)
VECTOR_SIZE = 8
TARGET_SLACK = 1.1  # time ratio allowed per unit of size ratio (4x -> 4.4x)
MAX_ABS_ERROR = 1e-9  # both gradients must match the NumPy reference
CYCLE = ("sin", "mul", "cos", "add", "neg")


def chain(ops: dict, n: int) -> Callable[[Any], Any]:
    """The loss ``reduce_sum(chain_n(x))``, with ``ops`` mapping the names in
    CYCLE (and "sum") to one library's functions."""

    def loss(x):
        y = x
        for i in range(n):
            name = CYCLE[i % len(CYCLE)]
            if name in ("mul", "add"):
                y = ops[name](y, x)
            else:
                y = ops[name](y)
        return ops["sum"](y)

    return loss


def reference_gradient(n: int, x: np.ndarray) -> np.ndarray:
    """The gradient of the chain by forward mode with NumPy: carry the
    Jacobian of y with respect to x (a diagonal matrix here) along."""
    y, dy = x, np.eye(x.size)  # dy[i, j] = d y_i / d x_j
    eye = np.eye(x.size)
    for i in range(n):
        name = CYCLE[i % len(CYCLE)]
        if name == "sin":
            y, dy = np.sin(y), np.cos(y)[:, None] * dy
        elif name == "cos":
            y, dy = np.cos(y), -np.sin(y)[:, None] * dy
        elif name == "mul":
            y, dy = y * x, x[:, None] * dy + y[:, None] * eye
        elif name == "add":
            y, dy = y + x, dy + eye
        else:
            y, dy = -y, -dy
    return dy.sum(axis=0)


class Library:
    """One library's ops, how to count the equations of the loss, and grad."""

    def __init__(
        self, name: str, ops: dict, count_eqns: Callable, grad: Callable
    ) -> None:
        self.name = name
        self.ops = ops
        self.count_eqns = count_eqns
        self.grad = grad


def autodidax_library() -> Library:
    ops = {
        "sin": ad.sin,
        "cos": ad.cos,
        "mul": ad.mul,
        "add": ad.add,
        "neg": ad.neg,
        "sum": ad.reduce_sum,
    }
    aval = ad.ShapedArray((VECTOR_SIZE,), np.float64)

    def count_eqns(f: Callable) -> int:
        return len(ad.make_jaxpr(f, aval)[0].eqns)

    return Library("autodidax", ops, count_eqns, ad.grad)


def jax_library() -> Library:
    import jax
    import jax.numpy as jnp
    from jax import lax

    ops = {
        "sin": lax.sin,
        "cos": lax.cos,
        "mul": lax.mul,
        "add": lax.add,
        "neg": lax.neg,
        "sum": jnp.sum,
    }
    spec = jax.ShapeDtypeStruct((VECTOR_SIZE,), np.float64)

    def count_eqns(f: Callable) -> int:
        return len(jax.make_jaxpr(f)(spec).jaxpr.eqns)

    return Library("jax", ops, count_eqns, jax.grad)


def time_grad(
    lib: Library, n: int, repeats: int, x: np.ndarray, gc_off: bool = False
) -> dict:
    """Median time of ``grad(loss)(x)`` for a chain of ``n`` primitives, after
    one warm-up call; also the largest error against the NumPy reference.

    With ``gc_off`` the cyclic garbage collector is disabled during each timed
    call (a diagnosis: how much of the time is Python's collector)."""
    loss = chain(lib.ops, n)
    eqns = lib.count_eqns(loss)
    expected = reference_gradient(n, x)
    error = float(np.max(np.abs(np.asarray(lib.grad(loss)(x)) - expected)))  # warm-up
    times = []
    for _ in range(repeats):
        gc.collect()
        if gc_off:
            gc.disable()
        try:
            start = time.perf_counter()
            result = lib.grad(loss)(x)
            times.append(time.perf_counter() - start)
        finally:
            gc.enable()
        error = max(error, float(np.max(np.abs(np.asarray(result) - expected))))
    median = statistics.median(times)
    return {
        "n": n,
        "eqns": eqns,
        "repeats": repeats,
        "median_s": median,
        "min_s": min(times),
        "max_s": max(times),
        "us_per_primitive": median / n * 1e6,
        "max_abs_error": error,
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
    """Scaling ratios, whether autodidax meets the SPEC target, and whether
    every gradient was right."""
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
            "max_abs_error": max(row["max_abs_error"] for row in rows),
        }
    ours = summary["autodidax"]
    summary["targets"] = {
        "meaningful": not quick and ours["size_ratio"] > 1,
        "linear_scaling_met": ours["time_ratio"] <= ours["max_time_ratio"],
        "max_abs_error_allowed": MAX_ABS_ERROR,
        "gradients_correct": all(
            summary[library]["max_abs_error"] <= MAX_ABS_ERROR for library in results
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
        f"grad of reduce_sum(chain of N primitives ({'/'.join(CYCLE)})) on "
        f"float64[{VECTOR_SIZE}], eager (no jit); median of {report['repeats']} calls"
        + ("" if report["gc_during_timing"] else "; garbage collector off")
    )
    header = (
        f"{'library':<10} {'N':>7} {'eqns':>7} {'median ms':>11} {'us/prim':>9} "
        f"{'max |err|':>10}"
    )
    print(header)
    print("-" * len(header))
    for library, rows in results.items():
        for row in rows:
            print(
                f"{library:<10} {row['n']:>7} {row['eqns']:>7} "
                f"{row['median_s'] * 1e3:>11.2f} {row['us_per_primitive']:>9.2f} "
                f"{row['max_abs_error']:>10.1e}"
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
        f"check: gradients within {MAX_ABS_ERROR:.0e} of NumPy -> "
        f"{'yes' if targets['gradients_correct'] else 'NO'}"
    )


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Time grad (autodidax and JAX) on chains of N primitives."
    )
    parser.add_argument(
        "--sizes",
        type=int,
        nargs="+",
        help=f"program sizes N, smallest first (default: {DEFAULT_SIZES})",
    )
    parser.add_argument(
        "--repeats", type=int, help="timed calls per size (default 7, quick 3)"
    )
    parser.add_argument("--quick", action="store_true", help="tiny sizes, 3 calls")
    parser.add_argument("--json", metavar="PATH", help="also write results as JSON")
    parser.add_argument("--no-jax", action="store_true", help="time autodidax only")
    parser.add_argument(
        "--no-gc",
        action="store_true",
        help="disable Python's garbage collector during each timed call",
    )
    parser.add_argument(
        "--check",
        action="store_true",
        help="exit with status 1 if autodidax misses the target or a gradient "
        "is wrong (the target is not judged with --quick)",
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

    x = np.linspace(0.1, 0.8, VECTOR_SIZE)
    x64_before = jax.config.jax_enable_x64
    jax.config.update("jax_enable_x64", True)
    try:
        libraries = [autodidax_library()]
        if not args.no_jax:
            libraries.append(jax_library())
        results = {
            lib.name: [
                time_grad(lib, n, args.repeats, x, gc_off=args.no_gc)
                for n in args.sizes
            ]
            for lib in libraries
        }
    finally:
        jax.config.update("jax_enable_x64", x64_before)
    report = {
        "benchmark": "grad",
        "program": {
            "cycle": list(CYCLE),
            "then": "reduce_sum",
            "vector": f"float64[{VECTOR_SIZE}]",
            "jit": False,
        },
        "sizes": args.sizes,
        "repeats": args.repeats,
        "quick": args.quick,
        "gc_during_timing": not args.no_gc,
        "results": results,
        "summary": summarize(results, args.quick),
        "machine": machine_info(),
    }
    print_report(report)
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
        print(f"wrote {args.json}")
    targets = report["summary"]["targets"]
    if args.check:
        if not targets["gradients_correct"]:
            raise SystemExit(1)
        if targets["meaningful"] and not targets["linear_scaling_met"]:
            raise SystemExit(1)
    return report


if __name__ == "__main__":
    main()
