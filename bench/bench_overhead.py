"""Benchmark: per-operation overhead outside jit, next to JAX, in one process.

Two measurements, each made for both libraries on the same small programs:

(a) eager: one primitive applied outside any transformation, ``sin(x)`` and
    ``add(x, y)`` on float64[8]. autodidax evaluates it with NumPy (its
    evaluation interpreter), on NumPy arrays; JAX dispatches ``jax.numpy.sin``
    and ``jax.numpy.add`` on device arrays. What is timed is everything
    between the call and its result: for 8 numbers that is almost all
    overhead (argument checks, choosing the interpreter, dispatch).
(b) vmap of jit: ``vmap(jit(f))`` for ``f(x) = sin(x) * 2.0 + x``, called on a
    device-resident float64[16, 8] batch, steady state (the batched program
    is already compiled). Each call runs the batching interpreter over the
    jitted call, which turns the jaxpr into a batched one (cached) and runs
    its executable.

Every call is timed on its own, in rounds that alternate between the
libraries (garbage collector off inside a round); the report gives the median
in microseconds and the ratio autodidax / JAX. There is no SPEC target for
these two; they show where the per-operation costs of the two designs lie.

Run it from the repository root:

    python bench/bench_overhead.py                  # full counts
    python bench/bench_overhead.py --quick          # a smoke run
    python bench/bench_overhead.py --json out.json  # also write the results

x64 mode is switched on for JAX in ``main`` only (and restored when it
returns), so both libraries compute in float64.
"""

from __future__ import annotations

import argparse
import sys
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
BATCH_SIZE = 16

# Timed calls per round and rounds, per measurement.
FULL = {"eager_calls": 2000, "vmap_calls": 500, "rounds": 10}
QUICK = {"eager_calls": 50, "vmap_calls": 20, "rounds": 2}


class Library:
    """What this benchmark needs from one library."""

    def __init__(
        self,
        name: str,
        eager_ops: dict[str, Callable],
        eager_input: Callable[[np.ndarray], Any],
        vmap: Callable,
        jit: Callable,
        ops: dict[str, Callable],
        put: Callable[[np.ndarray], Any],
        block: Callable[[Any], Any],
    ) -> None:
        self.name = name
        self.eager_ops = eager_ops  # "sin", "add": eager functions
        self.eager_input = eager_input  # NumPy array -> the library's eager input
        self.vmap = vmap  # vmap(f) with batch axis 0
        self.jit = jit
        self.ops = ops  # sin, mul, add for the vmapped function
        self.put = put  # NumPy array -> device array
        self.block = block  # wait until a result is computed


def autodidax_library(module: ModuleType = ad, name: str = "autodidax") -> Library:
    """autodidax (this checkout's, or ``module``, e.g. an older version).
    Eager operations run on NumPy arrays: autodidax evaluates with NumPy."""
    ops = benchlib.ops_from(module, ("sin", "mul", "add"))
    return Library(
        name,
        eager_ops={"sin": module.sin, "add": module.add},
        eager_input=lambda x: x,
        vmap=lambda f: module.vmap(f, (0,)),
        jit=module.jit,
        ops=ops,
        put=module.device_put,
        block=lambda out: out._buffer.block_until_ready(),
    )


def jax_library() -> Library:
    import jax
    import jax.numpy as jnp
    from jax import lax

    return Library(
        "jax",
        eager_ops={"sin": jnp.sin, "add": jnp.add},
        eager_input=jax.device_put,
        vmap=jax.vmap,
        jit=jax.jit,
        ops=benchlib.ops_from(lax, ("sin", "mul", "add")),
        put=jax.device_put,
        block=lambda out: out.block_until_ready(),
    )


def _block_any(out: Any) -> None:
    """Wait for a JAX result; NumPy results are ready already."""
    if hasattr(out, "block_until_ready"):
        out.block_until_ready()


def measure_eager(libs: list[Library], calls: int, rounds: int) -> dict:
    """Per-call times of ``sin(x)`` and ``add(x, y)`` outside any transformation."""
    x_host = np.linspace(-1.0, 1.0, VECTOR_SIZE)
    y_host = np.linspace(0.5, 2.0, VECTOR_SIZE)
    expected = {"sin": np.sin(x_host), "add": x_host + y_host}
    results: dict[str, Any] = {}
    for op, want in expected.items():
        thunks, errors = {}, {}
        for lib in libs:
            fn = lib.eager_ops[op]
            args = [lib.eager_input(x_host)]
            if op == "add":
                args.append(lib.eager_input(y_host))
            out = np.asarray(fn(*args))
            errors[lib.name] = float(np.max(np.abs(out - want)))
            thunks[lib.name] = lambda fn=fn, args=args: fn(*args)
        times = benchlib.per_call_times(
            thunks, calls, rounds, settle={lib.name: _block_any for lib in libs}
        )
        results[op] = {
            "program": f"{op} on float64[{VECTOR_SIZE}]",
            **{name: benchlib.per_call_stats(t) for name, t in times.items()},
            "max_abs_error": errors,
        }
    return results


def vmapped_function(lib: Library) -> Callable:
    """``vmap(jit(f))`` for a fresh ``f(x) = sin(x) * 2.0 + x``."""
    sin, mul, add = lib.ops["sin"], lib.ops["mul"], lib.ops["add"]

    def f(x):
        return add(mul(sin(x), 2.0), x)

    return lib.vmap(lib.jit(f))


def measure_vmap_of_jit(libs: list[Library], calls: int, rounds: int) -> dict:
    """Per-call times of ``vmap(jit(f))`` on a device-resident batch."""
    x_host = np.linspace(-2.0, 2.0, BATCH_SIZE * VECTOR_SIZE).reshape(
        BATCH_SIZE, VECTOR_SIZE
    )
    expected = np.sin(x_host) * 2.0 + x_host
    thunks, errors = {}, {}
    for lib in libs:
        g, x = vmapped_function(lib), lib.put(x_host)
        out = g(x)  # trace and compile the batched program
        lib.block(out)
        errors[lib.name] = float(np.max(np.abs(np.asarray(out) - expected)))
        thunks[lib.name] = lambda g=g, x=x: g(x)
    times = benchlib.per_call_times(
        thunks, calls, rounds, settle={lib.name: lib.block for lib in libs}
    )
    return {
        "program": f"vmap(jit(sin(x) * 2.0 + x)) on float64[{BATCH_SIZE},"
        f"{VECTOR_SIZE}]",
        **{name: benchlib.per_call_stats(t) for name, t in times.items()},
        "max_abs_error": errors,
    }


def add_ratios(results: dict, names: list[str]) -> None:
    """Every other library's median over JAX's (when JAX ran), as
    ``ratio`` for autodidax and ``ratio_<name>`` for the others."""
    if "jax" not in names:
        return
    for row in (*results["eager"].values(), results["vmap_of_jit"]):
        for name in names:
            if name != "jax":
                key = "ratio" if name == "autodidax" else f"ratio_{name}"
                row[key] = row[name]["median_us"] / row["jax"]["median_us"]


def print_report(report: dict) -> None:
    results, names = report["results"], report["libraries"]
    print("overhead benchmark: eager operations and vmap of jit, median us per call")
    header = f"{'measurement':<34} " + " ".join(f"{n:>12}" for n in names)
    header += f" {'ours/jax':>9}"
    print(header)
    print("-" * len(header))
    rows = [
        *(
            (f"(a) eager {op} [{VECTOR_SIZE}]", row)
            for op, row in results["eager"].items()
        ),
        (f"(b) vmap(jit) [{BATCH_SIZE}x{VECTOR_SIZE}]", results["vmap_of_jit"]),
    ]
    for label, row in rows:
        values = " ".join(f"{row[n]['median_us']:>12.2f}" for n in names)
        ratio = f"{row['ratio']:.3f}x" if "ratio" in row else "-"
        print(f"{label:<34} {values} {ratio:>9}")
    errors = [
        error
        for row in (*results["eager"].values(), results["vmap_of_jit"])
        for error in row["max_abs_error"].values()
    ]
    print(f"largest difference from NumPy in the results: {max(errors):.1e}")
    if report["quick"]:
        print("quick run: counts too small to judge")


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Time eager operations and vmap of jit, autodidax next to JAX."
    )
    parser.add_argument("--quick", action="store_true", help="few calls, a smoke run")
    parser.add_argument("--json", metavar="PATH", help="also write results as JSON")
    parser.add_argument(
        "--eager-calls", type=int, help="eager: timed calls per round and library"
    )
    parser.add_argument(
        "--vmap-calls", type=int, help="vmap of jit: timed calls per round and library"
    )
    parser.add_argument("--rounds", type=int, help="rounds per measurement")
    parser.add_argument("--no-jax", action="store_true", help="time autodidax only")
    args = parser.parse_args(argv)
    for key, value in (QUICK if args.quick else FULL).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if min(args.eager_calls, args.vmap_calls, args.rounds) < 1:
        parser.error("counts must be positive")
    return args


def run(libs: list[Library], args: argparse.Namespace) -> dict:
    """Both measurements, with ratios to JAX (the ``results`` of a report)."""
    results = {
        "eager": measure_eager(libs, args.eager_calls, args.rounds),
        "vmap_of_jit": measure_vmap_of_jit(libs, args.vmap_calls, args.rounds),
    }
    add_ratios(results, [lib.name for lib in libs])
    return results


def main(argv: Sequence[str] | None = None) -> dict:
    """Run the benchmark, print the table, and return the report as a dict."""
    args = parse_args(argv)
    with benchlib.jax_x64():
        libs = [autodidax_library()]
        if not args.no_jax:
            libs.append(jax_library())
        results = run(libs, args)
    report = {
        "benchmark": "overhead",
        "quick": args.quick,
        "libraries": [lib.name for lib in libs],
        "config": {
            "vector_size": VECTOR_SIZE,
            "batch_size": BATCH_SIZE,
            "eager_calls_per_round": args.eager_calls,
            "vmap_calls_per_round": args.vmap_calls,
            "rounds": args.rounds,
        },
        "results": results,
        "machine": benchlib.machine_info(),
    }
    benchlib.publish(report, print_report, args.json)
    return report


if __name__ == "__main__":
    main()
