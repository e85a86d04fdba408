"""Benchmark: jitted ``random.uniform`` of a million float32 numbers, next to
``jax.random.uniform``.

One program, written once for both libraries: ``jit(lambda key:
uniform(key, (n,), float32))`` with ``n = 10**6``. Both build the same
computation (Threefry-2x32 of the counters 0..n-1, then a mantissa
bit-trick); ours is made of ordinary integer primitives, JAX's of its
``threefry2x32`` primitive, so XLA compiles two programs that should cost the
same (SPEC section 6: within 1.2x). The benchmark also checks that the two
results are equal bit for bit, and times ``random.normal`` the same way.

After one call that compiles it, each timed call draws numbers with a fresh
key (a device array made before the timing) and waits for the result;
repeats alternate which library goes first. The report gives the median,
minimum and maximum in milliseconds per call and the ratio autodidax / JAX.

Run it from the repository root:

    python bench/bench_random.py                  # n = 1,000,000
    python bench/bench_random.py --quick          # a smoke run
    python bench/bench_random.py --repeats 41
    python bench/bench_random.py --json out.json  # also write the results

x64 mode is switched on for JAX in ``main`` only (and restored when it
returns); the numbers are float32 in both libraries.
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

SIZE = 10**6
QUICK_SIZE = 10**4
REPEATS = 21
QUICK_REPEATS = 2
KEYS = 4  # distinct keys, cycled through the timed calls
TARGET_RATIO = 1.2  # SPEC section 6: within 1.2x of JAX


class Library:
    """What this benchmark needs from one library."""

    def __init__(self, name, jit, random, put, block):
        self.name = name
        self.jit = jit
        self.random = random  # the module with PRNGKey, split, uniform, normal
        self.put = put  # NumPy array -> device array
        self.block = block  # wait until a result is computed


def has_random(module: ModuleType) -> bool:
    """Whether ``module`` (maybe an older autodidax) has the random chapter."""
    return hasattr(module, "random_uniform")


def autodidax_library(module: ModuleType = ad, name: str = "autodidax") -> Library:
    return Library(
        name,
        jit=module.jit,
        random=module.random,
        put=module.device_put,
        block=lambda out: out._buffer.block_until_ready(),
    )


def jax_library() -> Library:
    import jax

    return Library(
        "jax",
        jit=jax.jit,
        random=jax.random,
        put=jax.device_put,
        block=jax.block_until_ready,
    )


def sampler(lib: Library, which: str, size: int) -> Callable:
    draw = getattr(lib.random, which)
    return lib.jit(lambda key: draw(key, (size,), np.float32))


def stats_ms(times: Sequence[float]) -> dict:
    return {
        "repeats": len(times),
        "median_ms": statistics.median(times) * 1e3,
        "min_ms": min(times) * 1e3,
        "max_ms": max(times) * 1e3,
    }


def measure(libs: list[Library], which: str, size: int, repeats: int) -> dict:
    """Time one sampler in every library, calls interleaved."""
    host_keys = [np.array([0, k], np.uint32) for k in range(KEYS)]  # PRNGKey(k)
    runners: dict[str, Any] = {}
    first: dict[str, np.ndarray] = {}
    for lib in libs:
        f, keys = sampler(lib, which, size), [lib.put(k) for k in host_keys]
        out = f(keys[0])  # trace and compile
        lib.block(out)
        first[lib.name] = np.asarray(out)
        runners[lib.name] = (f, keys)
    times: dict[str, list[float]] = {lib.name: [] for lib in libs}
    for i in range(repeats):
        order = libs if i % 2 == 0 else libs[::-1]
        for lib in order:
            f, keys = runners[lib.name]
            key = keys[i % KEYS]
            gc.collect()
            start = time.perf_counter()
            lib.block(f(key))
            times[lib.name].append(time.perf_counter() - start)
    reference = first.get("jax")
    row = {
        "program": f"jit(random.{which}(key, ({size},), float32))",
        "size": size,
        **{name: stats_ms(t) for name, t in times.items()},
        "bits_equal_to_jax": {
            name: bool(np.array_equal(out.view(np.uint32), reference.view(np.uint32)))
            for name, out in first.items()
            if reference is not None and name != "jax"
        },
    }
    if "jax" in times:
        for lib in libs:
            if lib.name != "jax":
                key = "ratio" if lib.name == "autodidax" else f"ratio_{lib.name}"
                row[key] = row[lib.name]["median_ms"] / row["jax"]["median_ms"]
    return row


def run(libs: list[Library], size: int, repeats: int) -> dict:
    return {
        "uniform": measure(libs, "uniform", size, repeats),
        "normal": measure(libs, "normal", size, repeats),
    }


def print_report(report: dict) -> None:
    names = report["libraries"]
    results = report["results"]
    size = results["uniform"]["size"]
    print(f"random benchmark: jitted samplers of {size:_} float32 numbers, ms per call")
    header = f"{'sampler':<10} " + " ".join(f"{n:>12}" for n in names)
    header += f" {'ours/jax':>9} {'same bits':>10}"
    print(header)
    print("-" * len(header))
    for key in ("uniform", "normal"):
        row = results[key]
        values = " ".join(f"{row[n]['median_ms']:>12.3f}" for n in names)
        ratio = f"{row['ratio']:.3f}x" if "ratio" in row else "-"
        same = row["bits_equal_to_jax"].get("autodidax", "-")
        print(f"{key:<10} {values} {ratio:>9} {str(same):>10}")
    summary = report["summary"]
    if not summary["meaningful"]:
        print("quick run: sizes too small to judge")
    elif summary["ratio"] is not None:
        print(
            f"target: uniform within {TARGET_RATIO}x of JAX: "
            f"{benchlib.verdict(summary['met'])}"
        )


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Time jitted random.uniform and random.normal, next to JAX."
    )
    parser.add_argument("--quick", action="store_true", help="small sizes, a smoke run")
    parser.add_argument("--json", metavar="PATH", help="also write results as JSON")
    parser.add_argument("--repeats", type=int, help="timed calls per library")
    parser.add_argument("--no-jax", action="store_true", help="time autodidax only")
    args = parser.parse_args(argv)
    if args.repeats is None:
        args.repeats = QUICK_REPEATS if args.quick else REPEATS
    if args.repeats < 1:
        parser.error("counts must be positive")
    return args


def summary(results: dict, quick: bool) -> dict:
    ratio = results["uniform"].get("ratio")
    return {
        "meaningful": not quick,
        "target_ratio": TARGET_RATIO,
        "ratio": ratio,
        "met": None if ratio is None else ratio <= TARGET_RATIO,
    }


def main(argv: Sequence[str] | None = None) -> dict:
    """Run the benchmark, print the table, and return the report as a dict."""
    args = parse_args(argv)
    size = QUICK_SIZE if args.quick else SIZE
    with benchlib.jax_x64():
        libs = [autodidax_library()]
        if not args.no_jax:
            libs.append(jax_library())
        results = run(libs, size, args.repeats)
    report = {
        "benchmark": "random",
        "quick": args.quick,
        "libraries": [lib.name for lib in libs],
        "config": {"size": size, "repeats": args.repeats},
        "results": results,
        "summary": summary(results, args.quick),
        "machine": benchlib.machine_info(),
    }
    benchlib.publish(report, print_report, args.json)
    return report


if __name__ == "__main__":
    main()
