"""Shared pieces of the benchmarks in this folder (not a benchmark itself).

The chain-of-primitives program, timing statistics (including the per-call
timer of the dispatch-bound benchmarks), the JAX x64 scope, the machine
description and JSON output that every ``bench_*.py`` script uses, loading an
alternative ``autodidax.py`` (``run_all.py --module/--baseline``), and the
scaling summary, report and command line of the two scripts that time a chain
at several sizes (``bench_make_jaxpr.py`` and ``bench_grad.py``).

Importing this module puts the repository root on ``sys.path``, so that the
benchmarks measure this checkout's ``autodidax.py``. The scripts put their own
folder on ``sys.path`` before importing it, so it is found both when a script
runs as ``python bench/bench_x.py`` and when the tests load the scripts.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import gc
import hashlib
import importlib.util
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:  # measure this checkout's autodidax.py
    sys.path.insert(0, str(REPO_ROOT))

CYCLE = ("sin", "mul", "cos", "add", "neg")
TARGET_SLACK = 1.1  # time ratio allowed per unit of size ratio (4x -> 4.4x)
QUICK_NOTE = " (quick run: sizes too small to judge)"


# ---------------------------------------------------------------------------
# The program
# ---------------------------------------------------------------------------


def ops_from(module: Any, names: Sequence[str] = CYCLE) -> dict[str, Callable]:
    """The primitives ``names`` of one library (``autodidax`` or ``jax.lax``)."""
    return {name: getattr(module, name) for name in names}


def apply_chain(ops: dict, x: Any, n: int, cycle: Sequence[str] = CYCLE) -> Any:
    """Apply ``n`` primitives of ``ops`` to ``x`` in a chain, cycling through
    ``cycle``; mul and add take ``x`` as their second operand."""
    y = x
    for i in range(n):
        name = cycle[i % len(cycle)]
        y = ops[name](y, x) if name in ("mul", "add") else ops[name](y)
    return y


def chain(ops: dict, n: int) -> Callable[[Any], Any]:
    """A fresh function applying ``n`` primitives of ``ops`` in a chain.

    A new function object per call keeps any tracing cache keyed on the
    function from being hit.
    """

    def f(x):
        return apply_chain(ops, x, n)

    return f


# ---------------------------------------------------------------------------
# Statistics
# ---------------------------------------------------------------------------


def spread(times: Sequence[float], unit: str = "s") -> dict:
    """Median, minimum and maximum of ``times`` (seconds) in ``unit`` ("s" or
    "ms"), keyed ``median_<unit>``, ``min_<unit>`` and ``max_<unit>``."""
    scale = {"s": 1.0, "ms": 1e3}[unit]
    return {
        f"median_{unit}": statistics.median(times) * scale,
        f"min_{unit}": min(times) * scale,
        f"max_{unit}": max(times) * scale,
    }


def per_call_stats(times: Sequence[float]) -> dict:
    """Statistics of many calls, each timed on its own, in µs (the 90th
    percentile by nearest rank: at least 90% of the calls took no longer)."""
    ordered = sorted(times)
    return {
        "calls": len(times),
        "median_us": statistics.median(times) * 1e6,
        "mean_us": statistics.fmean(times) * 1e6,
        "min_us": ordered[0] * 1e6,
        "p90_us": ordered[math.ceil(0.9 * len(ordered)) - 1] * 1e6,
    }


def per_call_times(
    thunks: dict[str, Callable[[], Any]],
    calls: int,
    rounds: int,
    settle: dict[str, Callable[[Any], Any]] | None = None,
) -> dict[str, list[float]]:
    """Time every call of each thunk on its own: ``rounds`` rounds, each
    making ``calls`` calls of every thunk in turn (so that the libraries
    alternate and share the machine's ups and downs). The garbage collector is
    off inside a round and runs between rounds. After a thunk's calls in a
    round, ``settle[name](last result)`` may wait for the device. Returns the
    times in seconds, keyed like ``thunks``."""
    times: dict[str, list[float]] = {name: [] for name in thunks}
    clock = time.perf_counter
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        for _ in range(rounds):
            for name, thunk in thunks.items():
                record = times[name].append
                out = None
                for _ in range(calls):
                    start = clock()
                    out = thunk()
                    record(clock() - start)
                if settle and name in settle:
                    settle[name](out)
            gc.collect()
    finally:
        if gc_was_enabled:
            gc.enable()
    return times


def scaling_row(
    n: int, eqns: int, times: Sequence[float], cpu_times: Sequence[float] = ()
) -> dict:
    """One size's row of a scaling benchmark: its times and µs per primitive,
    and the median CPU time of the process (``time.process_time``), which the
    other programs on a shared machine disturb less than the wall clock."""
    row = {"n": n, "eqns": eqns, "repeats": len(times), **spread(times)}
    row["us_per_primitive"] = row["median_s"] / n * 1e6
    if cpu_times:
        row["median_cpu_s"] = statistics.median(cpu_times)
    return row


# ---------------------------------------------------------------------------
# Running and reporting
# ---------------------------------------------------------------------------


@contextlib.contextmanager
def jax_x64() -> Iterator[None]:
    """Switch JAX's 64-bit mode on inside the block and restore it after, so
    that the caller's JAX configuration is left as it was."""
    import jax

    x64_before = jax.config.jax_enable_x64
    jax.config.update("jax_enable_x64", True)
    try:
        yield
    finally:
        jax.config.update("jax_enable_x64", x64_before)


def _git(*args: str) -> str | None:
    """The output of a git command in this checkout, or None if it fails."""
    try:
        done = subprocess.run(
            ["git", *args], cwd=REPO_ROOT, capture_output=True, text=True, timeout=10
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout if done.returncode == 0 else None


def machine_info() -> dict:
    """The machine, the library versions and this checkout's git commit
    (and whether the checkout had uncommitted changes)."""
    import jax
    import jaxlib

    commit = (_git("rev-parse", "HEAD") or "").strip()
    status = _git("status", "--porcelain", "--untracked-files=no")
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
        "uncommitted_changes": None if status is None else bool(status.strip()),
        "load_average": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
    }


def load_module(path: str | Path, name: str) -> ModuleType:
    """Import the Python file ``path`` as a module called ``name``.

    With ``name="autodidax"`` it replaces the module that the benchmarks
    import (call it before importing them); with another name it is a second
    autodidax next to the first, e.g. an older version to compare with.
    """
    path = Path(path).resolve()
    if not path.is_file():
        raise FileNotFoundError(f"no module file {path}")
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def module_info(module: ModuleType) -> dict:
    """Where a measured autodidax module came from: its file and a hash."""
    path = Path(module.__file__).resolve()
    try:
        shown = path.relative_to(REPO_ROOT).as_posix()
    except ValueError:
        shown = str(path)
    return {
        "file": shown,
        "sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
    }


def publish(
    report: dict, print_report: Callable[[dict], None], json_path: str | None
) -> None:
    """Print ``report`` with the script's ``print_report`` and, when
    ``json_path`` is given, also write it there as indented JSON."""
    print_report(report)
    if json_path:
        Path(json_path).write_text(json.dumps(report, indent=2) + "\n")
        print(f"wrote {json_path}")


def verdict(met: bool) -> str:
    """How a report line says whether a target is met."""
    return "met" if met else "MISSED"


# ---------------------------------------------------------------------------
# Scaling benchmarks: one chain timed at several sizes N
# ---------------------------------------------------------------------------


def parse_scaling_args(
    argv: Sequence[str] | None,
    *,
    description: str,
    default_sizes: Sequence[int],
    quick_sizes: Sequence[int],
    unit: str,
    check_help: str,
    add_options: Callable[[argparse.ArgumentParser], None] | None = None,
) -> argparse.Namespace:
    """The command line of a scaling benchmark: ``--sizes``, ``--repeats``,
    ``--quick``, ``--json``, ``--no-jax``, then the script's own options
    (``add_options``), then ``--check``. ``unit`` names a timed repeat
    ("runs", "calls") in the help. Sizes come back sorted and distinct."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument(
        "--sizes",
        type=int,
        nargs="+",
        help=f"program sizes N, smallest first (default: {tuple(default_sizes)})",
    )
    parser.add_argument(
        "--repeats", type=int, help=f"timed {unit} per size (default 7, quick 3)"
    )
    parser.add_argument("--quick", action="store_true", help=f"tiny sizes, 3 {unit}")
    parser.add_argument("--json", metavar="PATH", help="also write results as JSON")
    parser.add_argument("--no-jax", action="store_true", help="time autodidax only")
    if add_options is not None:
        add_options(parser)
    parser.add_argument("--check", action="store_true", help=check_help)
    args = parser.parse_args(argv)
    if args.sizes is None:
        args.sizes = list(quick_sizes if args.quick else default_sizes)
    if args.repeats is None:
        args.repeats = 3 if args.quick else 7
    if any(n < 1 for n in args.sizes) or args.repeats < 1:
        parser.error("sizes and repeats must be positive")
    args.sizes = sorted(set(args.sizes))
    return args


def scaling_summary(results: dict[str, list[dict]], quick: bool) -> dict:
    """Per library, the time ratio of the largest N to the smallest next to
    the size ratio and its allowance (``TARGET_SLACK``); whether autodidax
    scales linearly (``targets``, which the script extends); and, when JAX
    ran, autodidax's time over JAX's at each N."""
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
    }
    if "jax" in results:
        summary["autodidax_over_jax"] = [
            ours_row["median_s"] / jax_row["median_s"]
            for ours_row, jax_row in zip(results["autodidax"], results["jax"])
        ]
    return summary


def print_scaling_report(
    report: dict, title: str, columns: Sequence[tuple[str, str, int, str]] = ()
) -> None:
    """Print a scaling benchmark's table (one row per library and N, plus
    ``columns`` given as (heading, row key, width, format)), its time ratios
    and the linear-scaling target; the script prints its other checks after."""
    results, summary = report["results"], report["summary"]
    print(title)
    header = f"{'library':<10} {'N':>7} {'eqns':>7} {'median ms':>11} {'us/prim':>9}"
    header += "".join(f" {heading:>{width}}" for heading, _, width, _ in columns)
    print(header)
    print("-" * len(header))
    for library, rows in results.items():
        for row in rows:
            print(
                f"{library:<10} {row['n']:>7} {row['eqns']:>7} "
                f"{row['median_s'] * 1e3:>11.2f} {row['us_per_primitive']:>9.2f}"
                + "".join(
                    f" {row[key]:>{width}{fmt}}" for _, key, width, fmt in columns
                )
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
    note = "" if targets["meaningful"] else QUICK_NOTE
    print(
        f"target: time ratio <= {ours['max_time_ratio']:.2f}x -> "
        f"{verdict(targets['linear_scaling_met'])}{note}"
    )
