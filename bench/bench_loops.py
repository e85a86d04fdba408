"""Benchmark: a jitted 100,000-step while_loop, next to jax.lax.while_loop;
the same program as a jitted scan, next to jax.lax.scan; and jit(grad) through
a 1,000-step scan, next to JAX's.

One program, written once for both libraries: the carry is a step counter and
a float64[8] vector, and each trip computes ``x * 0.99999 + sin(x) * 1e-5``
until the counter reaches the trip count. Both libraries compile it with
their ``jit`` into one StableHLO ``while`` loop, so the time is spent in XLA's
loop; the benchmark checks that autodidax's jaxpr has a single ``while``
equation whatever the trip count (the loop is traced once, never unrolled).

After one call that compiles it, each timed call runs the whole loop and
waits for the result; repeats alternate which library goes first. The report
gives the median, minimum and maximum in milliseconds, the ratio autodidax /
JAX (SPEC section 6: within 1.5x for the loops, 2x for the gradient), and the
largest difference of each result from a NumPy loop computing the same thing
(for the gradient: from JAX's).

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
        scan: Callable | None = None,
        grad: Callable | None = None,
    ) -> None:
        self.name = name
        self.jit = jit
        self.while_loop = while_loop
        self.sin = sin
        self.put = put  # NumPy array -> device array
        self.block = block  # wait until a result is computed
        self.count_eqns = count_eqns  # top-level equations of f's jaxpr
        self.scan = scan
        self.grad = grad


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
        scan=getattr(module, "scan", None),  # Part 7; older modules lack it
        grad=module.grad,
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
        scan=lax.scan,
        grad=jax.grad,
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


SCAN_GRAD_STEPS = 1_000
QUICK_SCAN_GRAD_STEPS = 100
GRAD_TARGET_RATIO = 2.0  # SPEC section 6: grad through a 1,000-step scan, within 2x


def scan_function(lib: Library, steps: int) -> Callable:
    """The while_loop's program as a scan of ``steps`` trips over no xs."""

    def body(x, _):
        return x * 0.99999 + lib.sin(x) * 1e-5, None

    def f(x):
        return lib.scan(body, x, None, length=steps)[0]

    return f


def scan_grad_function(lib: Library) -> Callable:
    """The gradient, with respect to a weight vector ``w``, of the sum of the
    final carry of ``h -> sin(h * w + x)`` over the rows of ``xs``."""

    def loss(w, xs):
        def body(h, x):
            h = lib.sin(h * w + x)
            return h, None

        return lib.scan(body, w * 0.0, xs)[0] @ w

    return lib.grad(loss)


def _time_calls(libs: list[Library], runners: dict, repeats: int) -> dict:
    """Median/min/max ms of each library's runner, calls interleaved."""
    times: dict[str, list[float]] = {lib.name: [] for lib in libs}
    for i in range(repeats):
        order = libs if i % 2 == 0 else libs[::-1]
        for lib in order:
            g, args = runners[lib.name]
            gc.collect()
            start = time.perf_counter()
            lib.block(g(*args))
            times[lib.name].append(time.perf_counter() - start)
    return {name: stats_ms(t) for name, t in times.items()}


def _with_ratios(row: dict, names: list[str]) -> dict:
    if "jax" in names:
        for name in names:
            if name != "jax":
                key = "ratio" if name == "autodidax" else f"ratio_{name}"
                row[key] = row[name]["median_ms"] / row["jax"]["median_ms"]
    return row


def measure_scan(libs: list[Library], steps: int, repeats: int) -> dict:
    """The while_loop's program as a jitted scan, next to jax.lax.scan."""
    libs = [lib for lib in libs if lib.scan is not None]
    x_host = np.linspace(-1.0, 2.0, VECTOR_SIZE)
    expected = reference(x_host, steps)
    runners, errors = {}, {}
    for lib in libs:
        g, x = lib.jit(scan_function(lib, steps)), lib.put(x_host)
        out = g(x)
        lib.block(out)
        errors[lib.name] = float(np.max(np.abs(np.asarray(out) - expected)))
        runners[lib.name] = (g, (x,))
    row = {
        "program": f"scan of {steps:_} steps of x * 0.99999 + sin(x) * 1e-5 "
        f"on float64[{VECTOR_SIZE}], jitted",
        "steps": steps,
        **_time_calls(libs, runners, repeats),
        "max_abs_error": errors,
    }
    return _with_ratios(row, [lib.name for lib in libs])


def measure_scan_grad(libs: list[Library], steps: int, repeats: int) -> dict:
    """jit(grad) through a scan of ``steps`` trips, next to JAX; the
    gradients are compared with the first library's (JAX's, if present)."""
    libs = [lib for lib in libs if lib.scan is not None]
    rng = np.random.default_rng(0)
    w_host = rng.uniform(0.5, 1.0, VECTOR_SIZE)
    xs_host = rng.normal(size=(steps, VECTOR_SIZE)) * 0.1
    runners, outs = {}, {}
    for lib in libs:
        g, w, xs = lib.jit(scan_grad_function(lib)), lib.put(w_host), lib.put(xs_host)
        out = g(w, xs)
        lib.block(out)
        outs[lib.name] = np.asarray(out)
        runners[lib.name] = (g, (w, xs))
    reference_out = outs.get("jax", next(iter(outs.values())))
    errors = {n: float(np.max(np.abs(o - reference_out))) for n, o in outs.items()}
    row = {
        "program": f"jit(grad) of a scan of {steps:_} steps of h -> sin(h * w + x) "
        f"on float64[{VECTOR_SIZE}]",
        "steps": steps,
        **_time_calls(libs, runners, repeats),
        "max_abs_difference_from_jax": errors,
    }
    return _with_ratios(row, [lib.name for lib in libs])


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
    for key, label, target in [
        ("scan", "jitted scan", TARGET_RATIO),
        ("scan_grad", "jit(grad) through scan", GRAD_TARGET_RATIO),
    ]:
        extra = report["results"].get(key)
        if extra is None:
            continue
        values = " ".join(f"{extra[n]['median_ms']:>12.3f}" for n in names)
        ratio = f"{extra['ratio']:.3f}x" if "ratio" in extra else "-"
        steps = f"{extra['steps']:_} steps"
        print(f"{label:<26} {values} {ratio:>9}  ({steps}, target {target}x)")
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
        scan_row = measure_scan(libs, args.steps, args.repeats)
        grad_steps = QUICK_SCAN_GRAD_STEPS if args.quick else SCAN_GRAD_STEPS
        grad_row = measure_scan_grad(libs, grad_steps, args.repeats)
    report = {
        "benchmark": "loops",
        "quick": args.quick,
        "libraries": [lib.name for lib in libs],
        "config": {
            "vector_size": VECTOR_SIZE,
            "steps": args.steps,
            "repeats": args.repeats,
        },
        "results": {"while_loop": row, "scan": scan_row, "scan_grad": grad_row},
        "summary": summary(row, args.quick),
        "machine": benchlib.machine_info(),
    }
    benchlib.publish(report, print_report, args.json)
    return report


if __name__ == "__main__":
    main()
