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
import gc
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
from benchlib import CYCLE  # noqa: E402

import autodidax as ad  # noqa: E402

DEFAULT_SIZES = (500, 1000, 1500, 2000)
QUICK_SIZES = (20, 80)
VECTOR_SIZE = 8
MAX_ABS_ERROR = 1e-9  # both gradients must match the NumPy reference


def chain(ops: dict, n: int) -> Callable[[Any], Any]:
    """The loss ``reduce_sum(chain_n(x))``, with ``ops`` mapping the names in
    CYCLE (and "sum") to one library's functions."""

    def loss(x):
        return ops["sum"](benchlib.apply_chain(ops, x, n))

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


def autodidax_library(module: ModuleType = ad, name: str = "autodidax") -> Library:
    """autodidax (this checkout's, or ``module``, e.g. an older version)."""
    ops = {**benchlib.ops_from(module), "sum": module.reduce_sum}
    aval = module.ShapedArray((VECTOR_SIZE,), np.float64)

    def count_eqns(f: Callable) -> int:
        return len(module.make_jaxpr(f, aval)[0].eqns)

    return Library(name, ops, count_eqns, module.grad)


def jax_library() -> Library:
    import jax
    import jax.numpy as jnp
    from jax import lax

    ops = {**benchlib.ops_from(lax), "sum": jnp.sum}
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
    times, cpu_times = [], []
    for _ in range(repeats):
        gc.collect()
        if gc_off:
            gc.disable()
        try:
            start, cpu_start = time.perf_counter(), time.process_time()
            result = lib.grad(loss)(x)
            times.append(time.perf_counter() - start)
            cpu_times.append(time.process_time() - cpu_start)
        finally:
            gc.enable()
        error = max(error, float(np.max(np.abs(np.asarray(result) - expected))))
    row = benchlib.scaling_row(n, eqns, times, cpu_times)
    return {**row, "max_abs_error": error}


def summarize(results: dict[str, list[dict]], quick: bool) -> dict:
    """Scaling ratios, whether autodidax meets the SPEC target, and whether
    every gradient was right."""
    summary = benchlib.scaling_summary(results, quick)
    for library, rows in results.items():
        summary[library]["max_abs_error"] = max(row["max_abs_error"] for row in rows)
    summary["targets"].update(
        max_abs_error_allowed=MAX_ABS_ERROR,
        gradients_correct=all(
            summary[library]["max_abs_error"] <= MAX_ABS_ERROR for library in results
        ),
    )
    return summary


def print_report(report: dict) -> None:
    benchlib.print_scaling_report(
        report,
        f"grad of reduce_sum(chain of N primitives ({'/'.join(CYCLE)})) on "
        f"float64[{VECTOR_SIZE}], eager (no jit); median of {report['repeats']} calls"
        + ("" if report["gc_during_timing"] else "; garbage collector off"),
        columns=[("max |err|", "max_abs_error", 10, ".1e")],
    )
    targets = report["summary"]["targets"]
    print(
        f"check: gradients within {MAX_ABS_ERROR:.0e} of NumPy -> "
        f"{'yes' if targets['gradients_correct'] else 'NO'}"
    )


def add_options(parser: argparse.ArgumentParser) -> None:
    """This benchmark's own option, next to the shared ones."""
    parser.add_argument(
        "--no-gc",
        action="store_true",
        help="disable Python's garbage collector during each timed call",
    )


def main(argv: Sequence[str] | None = None) -> dict:
    """Run the benchmark, print the table, and return the report as a dict."""
    args = benchlib.parse_scaling_args(
        argv,
        description="Time grad (autodidax and JAX) on chains of N primitives.",
        default_sizes=DEFAULT_SIZES,
        quick_sizes=QUICK_SIZES,
        unit="calls",
        check_help="exit with status 1 if autodidax misses the target or a gradient "
        "is wrong (the target is not judged with --quick)",
        add_options=add_options,
    )
    x = np.linspace(0.1, 0.8, VECTOR_SIZE)
    with benchlib.jax_x64():
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
        "machine": benchlib.machine_info(),
    }
    benchlib.publish(report, print_report, args.json)
    targets = report["summary"]["targets"]
    if args.check:
        if not targets["gradients_correct"]:
            raise SystemExit(1)
        if targets["meaningful"] and not targets["linear_scaling_met"]:
            raise SystemExit(1)
    return report


if __name__ == "__main__":
    main()
