"""Benchmark: residual memory and ``jit(grad)`` time of a long ``scan``,
plain, with a checkpointed body, and by the sqrt(n) scheme (nested scans with a
checkpointed outer body), in autodidax next to ``jax.checkpoint``.

One program, written once for both libraries: a scan of ``steps`` trips over a
float64[64] state, each trip ``h = sin(h * w)``, differentiated with respect
to ``w`` and the initial state. For each of the three ways of writing it the
benchmark measures

- the bytes of the residuals that reverse mode keeps, from each library's
  ``saved_residuals`` (arguments left out: they are alive anyway). Target: the
  same bytes as JAX;
- the time of one call of the jitted gradient, after a call that compiles it,
  with repeats alternating which library goes first. Target: within 1.5x of
  JAX (the issue's target for the sqrt(n) scheme).

The book's chapter on ``checkpoint`` prints the committed report
``bench/checkpoint_results.json``; write it with ``--json``.

Run it from the repository root:

    python bench/bench_checkpoint.py                 # 1024 steps, 9 repeats
    python bench/bench_checkpoint.py --quick         # a smoke run
    python bench/bench_checkpoint.py --json bench/checkpoint_results.json
    python bench/bench_checkpoint.py --no-jax        # autodidax alone

x64 mode is switched on for JAX in ``main`` only (and restored after).
"""

from __future__ import annotations

import argparse
import gc
import math
import statistics
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

import autodidax as ad  # noqa: E402

WIDTH = 64
STEPS = 1024
QUICK_STEPS = 16
REPEATS = 9
QUICK_REPEATS = 2
TARGET_RATIO = 1.5
SCHEMES = ("plain", "checkpointed body", "sqrt(n) nested")


def has_checkpoint(module: ModuleType) -> bool:
    """Whether ``module`` (maybe an older autodidax) has Part 11's checkpoint."""
    return hasattr(module, "checkpoint") and hasattr(module, "saved_residuals")


def library(name: str, module: ModuleType | None = None) -> dict:
    """What the programs need from one library: JAX when ``name`` is "jax",
    else ``module`` (by default the autodidax next to this script)."""
    if name != "jax":
        m = ad if module is None else module
        anp = m.numpy_namespace
        return dict(
            scan=m.scan, checkpoint=m.checkpoint, sin=anp.sin, sum=anp.sum,
            jit=m.jit, grad=m.grad, saved_residuals=m.saved_residuals,
            block=lambda out: [x._buffer.block_until_ready() for x in out],
        )  # fmt: skip
    import jax
    import jax.numpy as jnp
    from jax._src.ad_checkpoint import saved_residuals

    return dict(
        scan=jax.lax.scan, checkpoint=jax.checkpoint, sin=jnp.sin, sum=jnp.sum,
        jit=jax.jit, grad=jax.grad, saved_residuals=saved_residuals,
        block=lambda out: [x.block_until_ready() for x in out],
    )  # fmt: skip


def losses(lib: dict, steps: int) -> dict[str, Callable]:
    """The three ways of writing the loop, for ``lib``."""
    scan, checkpoint, sin, total = (
        lib["scan"],
        lib["checkpoint"],
        lib["sin"],
        lib["sum"],
    )
    k = math.isqrt(steps)

    def plain(w, h0):
        return total(scan(lambda h, _: (sin(h * w), None), h0, None, length=steps)[0])

    def body(w, h0):
        step = checkpoint(lambda h, _: (sin(h * w), None))
        return total(scan(step, h0, None, length=steps)[0])

    def sqrt_n(w, h0):
        def chunk(h, _):
            return scan(lambda h, _: (sin(h * w), None), h, None, length=k)[0], None

        return total(scan(checkpoint(chunk), h0, None, length=k)[0])

    return dict(zip(SCHEMES, [plain, body, sqrt_n]))


def residual_bytes(residuals: Sequence[tuple]) -> int:
    return sum(
        math.prod(aval.shape) * np.dtype(aval.dtype).itemsize
        for aval, where in residuals
        if not where.startswith("from the argument")
    )


def measure(
    names: list[str],
    steps: int,
    repeats: int,
    modules: dict[str, ModuleType] | None = None,
) -> list[dict]:
    """Residual bytes and jit(grad) times of the three schemes; ``modules``
    maps a library's name to the autodidax module to measure under it."""
    w0, h0 = np.linspace(0.5, 1.5, WIDTH), np.linspace(-1.0, 1.0, WIDTH)
    modules = modules or {}
    libs = {name: library(name, modules.get(name)) for name in names}
    rows = []
    for scheme in SCHEMES:
        runners, nbytes, grads = {}, {}, {}
        for name, lib in libs.items():
            loss = losses(lib, steps)[scheme]
            nbytes[name] = residual_bytes(lib["saved_residuals"](loss, w0, h0))
            g = lib["jit"](lib["grad"](loss, argnums=(0, 1)))
            out = g(w0, h0)  # trace and compile
            lib["block"](out)
            grads[name] = [np.asarray(x) for x in out]
            runners[name] = g
        times: dict[str, list[float]] = {name: [] for name in names}
        for i in range(repeats):
            for name in names if i % 2 == 0 else names[::-1]:
                gc.collect()
                start = time.perf_counter()
                libs[name]["block"](runners[name](w0, h0))
                times[name].append(time.perf_counter() - start)
        row = {
            "scheme": scheme,
            "bytes": nbytes,
            "ms": {name: statistics.median(t) * 1e3 for name, t in times.items()},
        }
        if "jax" in names:
            row["ratio"] = row["ms"]["autodidax"] / row["ms"]["jax"]
            row["same_bytes"] = nbytes["autodidax"] == nbytes["jax"]
            row["max_abs_grad_difference"] = max(
                float(np.max(np.abs(a - b)))
                for a, b in zip(grads["autodidax"], grads["jax"])
            )
        rows.append(row)
    return rows


def print_report(report: dict) -> None:
    print(
        f"scan of {report['steps']} steps on float64[{report['width']}], "
        f"jit(grad) median of {report['repeats']} calls"
    )
    for row in report["rows"]:
        line = f"{row['scheme']:18}"
        for name, b in row["bytes"].items():
            line += f"  {name} {b / 1e3:8.1f} kB {row['ms'][name]:8.2f} ms"
        if "ratio" in row:
            met = row["ratio"] <= TARGET_RATIO and row["same_bytes"]
            line += f"  ratio {row['ratio']:.2f} ({benchlib.verdict(met)})"
        print(line)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run")
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument("--json", default=None, help="also write the report here")
    parser.add_argument("--no-jax", action="store_true", help="autodidax alone")
    args = parser.parse_args(argv)
    if args.steps is None:
        args.steps = QUICK_STEPS if args.quick else STEPS
    if args.repeats is None:
        args.repeats = QUICK_REPEATS if args.quick else REPEATS
    if args.steps < 1 or args.repeats < 1:
        parser.error("--steps and --repeats must be at least 1")
    return args


def main(argv: Sequence[str] | None = None) -> dict:
    """Run the benchmark, print the table, and return the report as a dict."""
    args = parse_args(argv)
    names = ["autodidax"] + ([] if args.no_jax else ["jax"])
    with benchlib.jax_x64():
        rows = measure(names, args.steps, args.repeats)
    report = {
        "benchmark": "checkpoint",
        "quick": args.quick,
        "steps": args.steps,
        "width": WIDTH,
        "repeats": args.repeats,
        "target_ratio": TARGET_RATIO,
        "rows": rows,
        "machine": benchlib.machine_info(),
    }
    benchlib.publish(report, print_report, args.json)
    return report


if __name__ == "__main__":
    main()
