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
from benchlib import CYCLE  # noqa: E402

import autodidax as ad  # noqa: E402

DEFAULT_SIZES = (1000, 2000, 3000, 4000)
QUICK_SIZES = (20, 80)
VECTOR_SIZE = 8
TARGET_US_PER_PRIMITIVE = 30.0


def autodidax_tracer(module: ModuleType = ad) -> tuple[dict, Callable[[Callable], int]]:
    """The chain's ops and a tracer, from this checkout's autodidax or
    ``module`` (e.g. an older version)."""
    ops = benchlib.ops_from(module)
    aval = module.ShapedArray((VECTOR_SIZE,), np.float64)

    def trace(f: Callable) -> int:
        jaxpr, _, _ = module.make_jaxpr(f, aval)
        return len(jaxpr.eqns)

    return ops, trace


def jax_tracer() -> tuple[dict, Callable[[Callable], int]]:
    import jax
    from jax import lax

    ops = benchlib.ops_from(lax)
    spec = jax.ShapeDtypeStruct((VECTOR_SIZE,), np.float64)

    def trace(f: Callable) -> int:
        return len(jax.make_jaxpr(f)(spec).jaxpr.eqns)

    return ops, trace


def time_tracing(ops: dict, trace: Callable, n: int, repeats: int) -> dict:
    """Median time of tracing a chain of ``n`` primitives (after one warm-up)."""
    eqns = trace(benchlib.chain(ops, n))  # warm-up; also checks the equation count
    times, cpu_times = [], []
    for _ in range(repeats):
        f = benchlib.chain(ops, n)
        gc.collect()
        start, cpu_start = time.perf_counter(), time.process_time()
        trace(f)
        times.append(time.perf_counter() - start)
        cpu_times.append(time.process_time() - cpu_start)
    return benchlib.scaling_row(n, eqns, times, cpu_times)


def summarize(results: dict[str, list[dict]], quick: bool) -> dict:
    """Scaling ratios and whether autodidax meets the SPEC targets."""
    summary = benchlib.scaling_summary(results, quick)
    summary["targets"].update(
        us_per_primitive_target=TARGET_US_PER_PRIMITIVE,
        us_per_primitive_met=all(
            row["us_per_primitive"] < TARGET_US_PER_PRIMITIVE
            for row in results["autodidax"]
        ),
    )
    return summary


def print_report(report: dict) -> None:
    benchlib.print_scaling_report(
        report,
        f"make_jaxpr of a chain of N primitives ({'/'.join(CYCLE)}) on "
        f"float64[{VECTOR_SIZE}]; median of {report['repeats']} runs",
    )
    targets = report["summary"]["targets"]
    note = "" if targets["meaningful"] else benchlib.QUICK_NOTE
    print(
        f"target: < {TARGET_US_PER_PRIMITIVE:.0f} us per primitive -> "
        f"{benchlib.verdict(targets['us_per_primitive_met'])}{note}"
    )


def main(argv: Sequence[str] | None = None) -> dict:
    """Run the benchmark, print the table, and return the report as a dict."""
    args = benchlib.parse_scaling_args(
        argv,
        description="Time make_jaxpr (autodidax and JAX) on chains of N primitives.",
        default_sizes=DEFAULT_SIZES,
        quick_sizes=QUICK_SIZES,
        unit="runs",
        check_help="exit with status 1 if autodidax misses a target (not with --quick)",
    )
    with benchlib.jax_x64():
        tracers = {"autodidax": autodidax_tracer()}
        if not args.no_jax:
            tracers["jax"] = jax_tracer()
        results = {
            library: [time_tracing(ops, trace, n, args.repeats) for n in args.sizes]
            for library, (ops, trace) in tracers.items()
        }
    report = {
        "benchmark": "make_jaxpr",
        "program": {"cycle": list(CYCLE), "vector": f"float64[{VECTOR_SIZE}]"},
        "sizes": args.sizes,
        "repeats": args.repeats,
        "quick": args.quick,
        "results": results,
        "summary": summarize(results, args.quick),
        "machine": benchlib.machine_info(),
    }
    benchlib.publish(report, print_report, args.json)
    targets = report["summary"]["targets"]
    if args.check and targets["meaningful"]:
        if not (targets["linear_scaling_met"] and targets["us_per_primitive_met"]):
            raise SystemExit(1)
    return report


if __name__ == "__main__":
    main()
