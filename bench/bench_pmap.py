"""Benchmark: steady-state ``pmap`` dispatch on 8 host CPU devices, autodidax
next to ``jax.pmap``.

One small program for both libraries, mapped over the rows of a
float64[8, 4] input (one row per device): ``sin(x) * 2.0 + psum(x, "i")``.
After a first call that traces and compiles it, every call is timed on its
own, from the call until its result is ready, in rounds that alternate
between the libraries (garbage collector off inside a round). Waiting for
each result is not only fair to both libraries, it is necessary: on XLA's CPU
backend, hundreds of collective programs queued without waiting can take all
the threads of its pool while each waits for a participant that has no thread
left, and the process aborts (seen with ``jax.pmap`` alone, 300 calls on 2
cores). Two cases:

- **sharded input**: the input is already on the devices, one row each (the
  result of an earlier ``pmap``, as in a training loop that keeps its
  parameters on the devices). The SPEC section 6 target is about this one:
  within 2x of ``jax.pmap``.
- **NumPy input**: a host array, split and copied to the devices by every call.

The report gives the median, mean, minimum and 90th percentile in µs per
call, the ratio autodidax / JAX, and the largest difference of each result
from NumPy.

The 8 devices: XLA reads ``XLA_FLAGS`` when JAX starts its CPU backend, so
this module adds ``--xla_force_host_platform_device_count=8`` to it when it is
imported (before anything has started the backend). If the backend was
already started with fewer devices, the benchmark maps over as many rows as
there are devices and says so (the report's ``devices``).

Run it from the repository root:

    python bench/bench_pmap.py                  # full counts (a few seconds)
    python bench/bench_pmap.py --quick          # a smoke run
    python bench/bench_pmap.py --json out.json  # also write the results
    python bench/bench_pmap.py --no-jax         # autodidax alone
    python bench/bench_pmap.py --calls 500 --rounds 20 --width 4

x64 mode is switched on for JAX in ``main`` only (and restored when it
returns), so both libraries compute in float64.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

HOST_DEVICES = 8
DEVICE_FLAG = "--xla_force_host_platform_device_count"


def request_host_devices(count: int = HOST_DEVICES) -> None:
    """Ask XLA for ``count`` CPU devices (only effective before JAX starts its
    backend); other flags already in XLA_FLAGS are kept."""
    flags = os.environ.get("XLA_FLAGS", "").split()
    if not any(flag.startswith(DEVICE_FLAG + "=") for flag in flags):
        os.environ["XLA_FLAGS"] = " ".join([*flags, f"{DEVICE_FLAG}={count}"])


request_host_devices()

import numpy as np  # noqa: E402

BENCH_DIR = str(Path(__file__).resolve().parent)
if BENCH_DIR not in sys.path:  # find benchlib also when loaded by path (tests)
    sys.path.insert(0, BENCH_DIR)

import benchlib  # noqa: E402  (also puts this checkout's autodidax on the path)

import autodidax as ad  # noqa: E402

WIDTH = 4  # elements per device
AXIS = "i"
TARGET_RATIO = 2.0  # SPEC section 6: pmap dispatches within 2x of jax.pmap
FULL = {"calls": 300, "rounds": 10}
QUICK = {"calls": 20, "rounds": 2}


class Library:
    """What this benchmark needs from one library."""

    def __init__(
        self,
        name: str,
        pmap: Callable,
        psum: Callable,
        sin: Callable,
        block: Callable[[Any], Any],
    ) -> None:
        self.name = name
        self.pmap = pmap
        self.psum = psum
        self.sin = sin
        self.block = block  # wait until a result is computed, on the devices


def autodidax_library(module: ModuleType = ad, name: str = "autodidax") -> Library:
    """autodidax (this checkout's, or ``module``, e.g. an older version)."""
    return Library(
        name,
        pmap=module.pmap,
        psum=module.psum,
        sin=module.sin,
        block=lambda out: out._buffer.block_until_ready(),
    )


def jax_library() -> Library:
    import jax
    from jax import lax

    return Library(
        "jax",
        pmap=jax.pmap,
        psum=lax.psum,
        sin=lax.sin,
        block=lambda out: out.block_until_ready(),
    )


def has_pmap(module: ModuleType) -> bool:
    """Whether ``module`` (e.g. an older autodidax) has Part 9's pmap."""
    return all(hasattr(module, name) for name in ("pmap", "psum", "devices"))


def device_count() -> int:
    import jax

    return len(jax.devices())


def program(lib: Library) -> Callable:
    """The benchmark's per-device program."""

    def f(x):
        return lib.sin(x) * 2.0 + lib.psum(x, AXIS)

    return f


def reference(x: np.ndarray) -> np.ndarray:
    """The same in NumPy, over all rows."""
    return np.sin(x) * 2.0 + x.sum(axis=0)


def call_and_wait(f: Callable, block: Callable, x: Any) -> Any:
    """``f(x)``, returned when every device has finished its row (no copy
    to the host)."""
    out = f(x)
    block(out)
    return out


def measure(libs: list[Library], calls: int, rounds: int, width: int) -> dict:
    """Per-call times of the compiled pmap, for sharded and NumPy inputs."""
    rows = min(HOST_DEVICES, device_count())
    x_host = np.linspace(-1.0, 1.0, rows * width).reshape(rows, width)
    expected = reference(x_host)
    runners: dict[str, tuple] = {}
    errors: dict[str, float] = {}
    blocks = {lib.name: lib.block for lib in libs}
    for lib in libs:
        f = lib.pmap(program(lib), axis_name=AXIS)
        sharded = lib.pmap(lambda x: x * 1.0)(x_host)  # rows on their devices
        out = f(sharded)  # trace and compile
        errors[lib.name] = float(np.max(np.abs(np.asarray(out) - expected)))
        errors[lib.name] = max(
            errors[lib.name], float(np.max(np.abs(np.asarray(f(x_host)) - expected)))
        )
        runners[lib.name] = (f, sharded)
    cases = {}
    for case, arg in (("sharded", lambda r: r[1]), ("numpy", lambda r: x_host)):
        times = benchlib.per_call_times(
            {
                name: functools.partial(
                    call_and_wait, runner[0], blocks[name], arg(runner)
                )
                for name, runner in runners.items()
            },
            calls,
            rounds,
        )
        row = {name: benchlib.per_call_stats(t) for name, t in times.items()}
        if "jax" in row:
            for name in runners:
                if name != "jax":
                    key = "ratio" if name == "autodidax" else f"ratio_{name}"
                    row[key] = row[name]["median_us"] / row["jax"]["median_us"]
        cases[case] = row
    return {
        "program": f'sin(x) * 2.0 + psum(x, "{AXIS}") per device, '
        f"float64[{rows}, {width}] over {rows} devices",
        "devices": rows,
        "width": width,
        **cases,
        "max_abs_error": errors,
    }


def summary(row: dict, quick: bool) -> dict:
    ratio = row["sharded"].get("ratio")
    return {
        "meaningful": not quick and row["devices"] == HOST_DEVICES,
        "target_ratio": TARGET_RATIO,
        "ratio": ratio,
        "met": None if ratio is None else ratio <= TARGET_RATIO,
    }


def print_report(report: dict) -> None:
    row, names = report["results"]["pmap"], report["libraries"]
    print(f"pmap benchmark: {row['program']}, µs per call (median)")
    header = f"{'input':<24} " + " ".join(f"{n:>12}" for n in names)
    header += f" {'ours/jax':>9}"
    print(header)
    print("-" * len(header))
    for case, label in (("sharded", "sharded (on devices)"), ("numpy", "NumPy")):
        values = " ".join(f"{row[case][n]['median_us']:>12.1f}" for n in names)
        ratio = f"{row[case]['ratio']:.2f}x" if "ratio" in row[case] else "-"
        print(f"{label:<24} {values} {ratio:>9}")
    errors = ", ".join(f"{n} {e:.1e}" for n, e in row["max_abs_error"].items())
    print(f"largest difference from NumPy: {errors}")
    s = report["summary"]
    if not s["meaningful"]:
        why = "quick run" if report["quick"] else f"only {row['devices']} devices"
        print(f"target not judged: {why}")
    elif s["ratio"] is not None:
        print(
            f"target: sharded-input dispatch within {TARGET_RATIO}x of jax.pmap: "
            f"{benchlib.verdict(s['met'])}"
        )


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Time pmap dispatch on 8 host devices, autodidax next to JAX."
    )
    parser.add_argument("--quick", action="store_true", help="few calls, a smoke run")
    parser.add_argument("--json", metavar="PATH", help="also write results as JSON")
    parser.add_argument("--calls", type=int, help="timed calls per round")
    parser.add_argument("--rounds", type=int, help="rounds of calls")
    parser.add_argument("--width", type=int, default=WIDTH, help="elements per row")
    parser.add_argument("--no-jax", action="store_true", help="time autodidax only")
    args = parser.parse_args(argv)
    defaults = QUICK if args.quick else FULL
    args.calls = defaults["calls"] if args.calls is None else args.calls
    args.rounds = defaults["rounds"] if args.rounds is None else args.rounds
    if min(args.calls, args.rounds, args.width) < 1:
        parser.error("counts must be positive")
    return args


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Run the benchmark, print the table, and return the report as a dict."""
    args = parse_args(argv)
    with benchlib.jax_x64():
        libs = [autodidax_library()]
        if not args.no_jax:
            libs.append(jax_library())
        row = measure(libs, args.calls, args.rounds, args.width)
    report = {
        "benchmark": "pmap",
        "quick": args.quick,
        "libraries": [lib.name for lib in libs],
        "config": {"calls_per_round": args.calls, "rounds": args.rounds},
        "results": {"pmap": row},
        "summary": summary(row, args.quick),
        "machine": benchlib.machine_info(),
    }
    benchlib.publish(report, print_report, args.json)
    return report


if __name__ == "__main__":
    main()
