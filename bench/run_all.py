"""Every benchmark in one command: autodidax next to JAX, in one process.

Runs, for autodidax and for JAX on the same programs (float64 throughout):

- ``jit``, from ``bench_jit.py``: steady-state dispatch of a small jitted
  function; a compute-bound jitted call on 4 million elements with
  device-resident inputs; the first call (trace + lower + compile + run);
- ``dispatch``, from ``bench_dispatch.py``: ``jit`` dispatch with a Python
  float, a NumPy scalar, a NumPy array and a device array, next to Part 3's
  ``jit`` and ``jax.jit``, and the median of every step of one call;
- ``make_jaxpr``, from ``bench_make_jaxpr.py``: tracing a chain of 1000, 2000,
  3000 and 4000 primitives (cost per primitive, and how it grows);
- ``grad``, from ``bench_grad.py``: eager ``grad`` of a chain of 500, 1000,
  1500 and 2000 primitives (cost per primitive, and how it grows);
- ``overhead``, from ``bench_overhead.py``: eager ``sin`` and ``add`` on a
  small array, and ``vmap`` of a jitted function;
- ``loops``, from ``bench_loops.py``: a jitted ``while_loop`` and ``scan`` of
  100,000 steps next to ``jax.lax``, and ``jit(grad)`` through a 1,000-step
  ``scan``.
- ``indexing``, from ``bench_indexing.py``: a jitted embedding lookup and its
  gradient (a gather and a scatter-add) at vocabularies of 50,000 and
  200,000, next to JAX;
- ``pmap``, from ``bench_pmap.py``: ``pmap`` of a small function with a
  ``psum`` over 8 host CPU devices, next to ``jax.pmap`` (importing
  ``bench_pmap`` asks XLA for the 8 devices, before anything starts JAX's
  backend; the other benchmarks run on device 0 as before);
- ``random``, from ``bench_random.py``: jitted ``random.uniform`` and
  ``random.normal`` of 10^6 float32 numbers, next to ``jax.random`` (with a
  check that the bits are equal);
- ``checkpoint``, from ``bench_checkpoint.py``: ``jit(grad)`` of a 1,024-step
  ``scan`` written three ways (plain, checkpointed body, sqrt(n) nested), with
  the residual bytes of each, next to ``jax.checkpoint``;
- ``capstone``, from ``bench_capstone.py``: Part 12's training step (a small
  transformer, ``jit(value_and_grad)`` and Adam) next to the same model in
  JAX, with the loss curves' largest relative difference and the step-time
  breakdown (forward, forward and backward, whole step).

It prints one table of the headline numbers (autodidax's time, JAX's time, and
their ratio, the number the targets of SPEC section 6 are about) and writes a
JSON report with every measurement, the headline rows, the targets, the
machine, the library versions and the git commit. The book's page "How fast is
it?" draws its chart and table from the committed ``bench/results.json``.

Run it from the repository root:

    python bench/run_all.py                   # full sizes, a minute or two;
                                              # writes bench/results.json
    python bench/run_all.py --quick           # tiny sizes, a smoke run (CI)
    python bench/run_all.py --json PATH       # write the report to PATH
    python bench/run_all.py --module PATH     # measure another autodidax.py
    python bench/run_all.py --baseline PATH   # ... and this one, side by side

``--baseline`` measures a second autodidax (say, ``git show
HEAD~1:autodidax.py > /tmp/before.py``) as a third library named
``baseline``, interleaved with the others in the same process, so that
before/after ratios come from one run on one machine. A full run without
``--module`` or ``--baseline`` writes ``bench/results.json`` unless ``--json``
says otherwise; other runs write a file only when ``--json`` is given.

Python's garbage collector stays on, as in a user's program, but before each
benchmark the objects that already exist (the imports, earlier benchmarks'
leftovers) are frozen out of its way (``gc.freeze``), so that a collection
during a timed call costs only what that benchmark allocated. JAX's 64-bit
mode is switched on while the benchmarks run and restored after.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

BENCH_DIR = str(Path(__file__).resolve().parent)
if BENCH_DIR not in sys.path:  # find the scripts also when loaded by path (tests)
    sys.path.insert(0, BENCH_DIR)

import bench_capstone  # noqa: E402
import bench_checkpoint  # noqa: E402
import bench_dispatch  # noqa: E402
import bench_grad  # noqa: E402
import bench_indexing  # noqa: E402
import bench_jit  # noqa: E402
import bench_loops  # noqa: E402
import bench_make_jaxpr  # noqa: E402
import bench_overhead  # noqa: E402
import bench_pmap  # noqa: E402  (sets XLA_FLAGS: 8 host devices; JAX starts later)
import bench_random  # noqa: E402
import benchlib  # noqa: E402

import autodidax  # noqa: E402

DEFAULT_JSON = Path(BENCH_DIR) / "results.json"
BASELINE = "baseline"


# ---------------------------------------------------------------------------
# Running
# ---------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Run every benchmark, autodidax next to JAX, and write a JSON "
        "report (bench/results.json for a full run)."
    )
    parser.add_argument("--quick", action="store_true", help="tiny sizes, a smoke run")
    parser.add_argument("--json", metavar="PATH", help="write the report to PATH")
    parser.add_argument(
        "--module",
        metavar="PATH",
        help="measure this autodidax.py instead of the checkout's",
    )
    parser.add_argument(
        "--baseline",
        metavar="PATH",
        help="also measure this autodidax.py, as a library named 'baseline'",
    )
    args = parser.parse_args(argv)
    if args.json is None and not (args.quick or args.module or args.baseline):
        args.json = str(DEFAULT_JSON)
    return args


def run_jit(variants: dict[str, ModuleType], quick: bool) -> dict:
    """bench_jit's three measurements."""
    config = dict(bench_jit.QUICK if quick else bench_jit.FULL)
    config["size"] = bench_jit.QUICK_COMPUTE_SIZE if quick else bench_jit.COMPUTE_SIZE
    libs = [bench_jit.autodidax_library(m, name) for name, m in variants.items()]
    libs.append(bench_jit.jax_library())
    return {
        "config": config,
        "dispatch": bench_jit.measure_dispatch(libs, config["calls"], config["rounds"]),
        "compute": bench_jit.measure_compute(libs, config["size"], config["repeats"]),
        "first_call": bench_jit.measure_first_call(libs, config["first_calls"]),
    }


def run_dispatch(variants: dict[str, ModuleType], quick: bool) -> dict:
    """bench_dispatch's whole calls per kind of argument, and the steps of a call."""
    config = dict(bench_dispatch.QUICK if quick else bench_dispatch.FULL)
    return {"config": config, **bench_dispatch.run(variants, True, config)}


def run_make_jaxpr(variants: dict[str, ModuleType], quick: bool) -> dict:
    """bench_make_jaxpr's scaling rows, per library."""
    sizes = list(
        bench_make_jaxpr.QUICK_SIZES if quick else bench_make_jaxpr.DEFAULT_SIZES
    )
    repeats = 3 if quick else 7
    tracers = {
        name: bench_make_jaxpr.autodidax_tracer(m) for name, m in variants.items()
    }
    tracers["jax"] = bench_make_jaxpr.jax_tracer()
    rows = {
        name: [bench_make_jaxpr.time_tracing(ops, trace, n, repeats) for n in sizes]
        for name, (ops, trace) in tracers.items()
    }
    return {"sizes": sizes, "repeats": repeats, "results": rows}


def run_grad(variants: dict[str, ModuleType], quick: bool) -> dict:
    """bench_grad's scaling rows, per library (garbage collector on)."""
    import numpy as np

    sizes = list(bench_grad.QUICK_SIZES if quick else bench_grad.DEFAULT_SIZES)
    repeats = 3 if quick else 7
    libs = [bench_grad.autodidax_library(m, name) for name, m in variants.items()]
    libs.append(bench_grad.jax_library())
    x = np.linspace(0.1, 0.8, bench_grad.VECTOR_SIZE)
    rows = {
        lib.name: [bench_grad.time_grad(lib, n, repeats, x) for n in sizes]
        for lib in libs
    }
    return {"sizes": sizes, "repeats": repeats, "results": rows}


def run_overhead(variants: dict[str, ModuleType], quick: bool) -> dict:
    """bench_overhead's two measurements."""
    args = bench_overhead.parse_args(["--quick"] if quick else [])
    libs = [bench_overhead.autodidax_library(m, name) for name, m in variants.items()]
    libs.append(bench_overhead.jax_library())
    config = {
        "eager_calls": args.eager_calls,
        "vmap_calls": args.vmap_calls,
        "rounds": args.rounds,
    }
    return {"config": config, **bench_overhead.run(libs, args)}


def run_loops(variants: dict[str, ModuleType], quick: bool) -> dict:
    """bench_loops' jitted while_loop, jitted scan, and jit(grad) through scan."""
    steps = bench_loops.QUICK_STEPS if quick else bench_loops.STEPS
    repeats = bench_loops.QUICK_REPEATS if quick else bench_loops.REPEATS
    libs = [bench_loops.autodidax_library(m, name) for name, m in variants.items()]
    libs.append(bench_loops.jax_library())
    config = {"steps": steps, "repeats": repeats}
    grad_steps = (
        bench_loops.QUICK_SCAN_GRAD_STEPS if quick else bench_loops.SCAN_GRAD_STEPS
    )
    return {
        "config": config,
        "while_loop": bench_loops.measure(libs, steps, repeats),
        "scan": bench_loops.measure_scan(libs, steps, repeats),
        "scan_grad": bench_loops.measure_scan_grad(libs, grad_steps, repeats),
    }


def run_indexing(variants: dict[str, ModuleType], quick: bool) -> dict | None:
    """bench_indexing's embedding lookup and gradient at two vocabularies
    (None if a variant predates the indexing chapter)."""
    if not all(bench_indexing.has_indexing(m) for m in variants.values()):
        return None
    config = bench_indexing.config_for(quick)
    repeats = bench_indexing.QUICK_REPEATS if quick else bench_indexing.REPEATS
    libs = [bench_indexing.autodidax_library(m, name) for name, m in variants.items()]
    libs.append(bench_indexing.jax_library())
    return {
        "config": {**config, "repeats": repeats},
        **bench_indexing.run(libs, config, repeats),
    }


def run_random(variants: dict[str, ModuleType], quick: bool) -> dict | None:
    """bench_random's jitted uniform and normal (None if a variant predates
    the random-numbers chapter)."""
    if not all(bench_random.has_random(m) for m in variants.values()):
        return None
    size = bench_random.QUICK_SIZE if quick else bench_random.SIZE
    repeats = bench_random.QUICK_REPEATS if quick else bench_random.REPEATS
    libs = [bench_random.autodidax_library(m, name) for name, m in variants.items()]
    libs.append(bench_random.jax_library())
    return {
        "config": {"size": size, "repeats": repeats},
        **bench_random.run(libs, size, repeats),
    }


def run_checkpoint(variants: dict[str, ModuleType], quick: bool) -> dict | None:
    """bench_checkpoint's three schemes (None if a variant predates Part 11)."""
    if not all(bench_checkpoint.has_checkpoint(m) for m in variants.values()):
        return None
    steps = bench_checkpoint.QUICK_STEPS if quick else bench_checkpoint.STEPS
    repeats = bench_checkpoint.QUICK_REPEATS if quick else bench_checkpoint.REPEATS
    rows = bench_checkpoint.measure([*variants, "jax"], steps, repeats, variants)
    return {
        "config": {"steps": steps, "width": bench_checkpoint.WIDTH, "repeats": repeats},
        "rows": rows,
    }


def run_capstone(variants: dict[str, ModuleType], quick: bool) -> dict:
    """bench_capstone's training steps, side by side."""
    return bench_capstone.run(variants, bench_capstone.config_for(quick))


def run_pmap(variants: dict[str, ModuleType], quick: bool) -> dict | None:
    """bench_pmap's dispatch (None if a variant predates Part 9's pmap)."""
    if not all(bench_pmap.has_pmap(m) for m in variants.values()):
        return None
    config = dict(bench_pmap.QUICK if quick else bench_pmap.FULL)
    libs = [bench_pmap.autodidax_library(m, name) for name, m in variants.items()]
    libs.append(bench_pmap.jax_library())
    row = bench_pmap.measure(libs, config["calls"], config["rounds"], bench_pmap.WIDTH)
    return {"config": config, "pmap": row}


@contextlib.contextmanager
def frozen_heap() -> Iterator[None]:
    """Collect garbage, then freeze every surviving object for the block.

    A full pass of Python's garbage collector walks every tracked object in
    the process: the hundred thousand that importing JAX makes, and whatever
    earlier benchmarks left behind. Frozen objects are skipped, so a pass
    during a timed call costs what the benchmark itself allocated, the same
    in whichever order the benchmarks run. The collector stays on."""
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


# ---------------------------------------------------------------------------
# Headline numbers
# ---------------------------------------------------------------------------


def _row(
    row_id: str,
    benchmark: str,
    case: str,
    detail: str,
    unit: str,
    values: dict[str, float],
    target: str | None = None,
    met: bool | None = None,
    target_ratio: float | None = None,
) -> dict:
    """One headline row: each library's value and its ratio to JAX's.
    ``case`` tells the rows of one benchmark apart in a few characters;
    ``detail`` says in full what was measured. ``target`` says the SPEC
    target in words, ``met`` whether autodidax meets it, and ``target_ratio``
    is the largest ratio allowed when the target is a ratio to JAX."""
    ratios = {
        name: value / values["jax"] for name, value in values.items() if name != "jax"
    }
    return {
        "id": row_id,
        "benchmark": benchmark,
        "case": case,
        "detail": detail,
        "unit": unit,
        "values": values,
        "ratios": ratios,
        "target": target,
        "target_ratio": target_ratio,
        "met": met,
    }


def headline(results: dict, names: list[str]) -> tuple[list[dict], list[dict]]:
    """The rows of the summary table (one per measurement; ratios to JAX)
    and of the growth table (time at the largest size over the smallest)."""
    jit, make_jaxpr, grad = results["jit"], results["make_jaxpr"], results["grad"]
    overhead = results["overhead"]
    rows = []

    def per_call(r: dict, key: str) -> dict[str, float]:
        return {name: r[name][key] for name in names}

    calls = results["dispatch"]["calls"]
    for kind, case in (
        ("python float", "Python float"),
        ("numpy scalar", "NumPy scalar"),
        ("numpy array", f"NumPy float64[{bench_dispatch.VECTOR_SIZE}]"),
    ):
        values = per_call(calls[kind], "median_us")
        allowed = bench_dispatch.TARGET_RATIOS[kind]
        rows.append(
            _row(
                "jit_dispatch_" + kind.replace(" ", "_"),
                "jit dispatch",
                case,
                f"sin(x) * 2.0 + x, compiled, x a {case}",
                "µs/call",
                values,
                f"≤ {allowed}×",
                values["autodidax"] / values["jax"] <= allowed,
                allowed,
            )
        )
    # The device-array row is bench_dispatch's too, so that the page shows one
    # measurement per kind of argument (bench_jit times the same call apart).
    dispatch = per_call(calls["device array"], "median_us")
    allowed = bench_dispatch.TARGET_RATIOS["device array"]
    rows.append(
        _row(
            "jit_dispatch",
            "jit dispatch",
            f"device float64[{bench_dispatch.VECTOR_SIZE}]",
            f"sin(x) * 2.0 + x, compiled, x a device array "
            f"float64[{bench_dispatch.VECTOR_SIZE}]",
            "µs/call",
            dispatch,
            f"≤ {allowed}×",
            dispatch["autodidax"] / dispatch["jax"] <= allowed,
            allowed,
        )
    )
    compute = per_call(jit["compute"], "median_ms")
    rows.append(
        _row(
            "jit_compute",
            "jit compute-bound",
            f"float64[{jit['compute']['size']:,}]".replace(",", "_"),
            f"chain of {bench_jit.CHAIN_LENGTH} primitives on "
            f"float64[{jit['compute']['size']:,}]".replace(",", "_"),
            "ms/call",
            compute,
            f"≤ {bench_jit.TARGET_COMPUTE_RATIO}×",
            compute["autodidax"] / compute["jax"] <= bench_jit.TARGET_COMPUTE_RATIO,
            bench_jit.TARGET_COMPUTE_RATIO,
        )
    )
    for program, case, what in (
        ("small", "small function", "sin(x) * 2.0 + x"),
        (
            "chain",
            f"{bench_jit.CHAIN_LENGTH}-primitive chain",
            f"chain of {bench_jit.CHAIN_LENGTH} primitives",
        ),
    ):
        rows.append(
            _row(
                f"first_call_{program}",
                "jit first call",
                case,
                f"{what} on float64[{bench_jit.DISPATCH_SIZE}]: trace, lower, "
                "compile, run",
                "ms",
                per_call(jit["first_call"][program], "median_ms"),
            )
        )
    growth = []
    for key, benchmark, data, what, per_prim_target in (
        ("make_jaxpr", "make_jaxpr", make_jaxpr, "chain of", 30.0),
        ("grad", "grad (eager)", grad, "reduce_sum of a chain of", None),
    ):
        sizes = data["sizes"]
        for i, n in enumerate(sizes):
            if i not in (0, len(sizes) - 1):
                continue  # the sizes between are drawn, not tabled
            values = {
                name: data["results"][name][i]["us_per_primitive"] for name in names
            }
            target = met = None
            if per_prim_target is not None:
                target = f"< {per_prim_target:.0f} µs"
                met = values["autodidax"] < per_prim_target
            rows.append(
                _row(
                    f"{key}_{n}",
                    benchmark,
                    f"N={n}",
                    f"{what} {n} primitives",
                    "µs/primitive",
                    values,
                    target,
                    met,
                )
            )
        size_ratio = sizes[-1] / sizes[0]
        time_ratios = {
            name: data["results"][name][-1]["median_s"]
            / data["results"][name][0]["median_s"]
            for name in names
        }
        allowed = size_ratio * benchlib.TARGET_SLACK
        cpu_time_ratios = {
            name: data["results"][name][-1]["median_cpu_s"]
            / data["results"][name][0]["median_cpu_s"]
            for name in names
        }
        growth.append(
            {
                "id": key,
                "benchmark": benchmark,
                "sizes": sizes,
                "size_ratio": size_ratio,
                "time_ratios": time_ratios,
                "cpu_time_ratios": cpu_time_ratios,
                "max_time_ratio": allowed,
                "met": time_ratios["autodidax"] <= allowed,
                "cpu_met": cpu_time_ratios["autodidax"] <= allowed,
            }
        )
    for op, row in overhead["eager"].items():
        rows.append(
            _row(
                f"eager_{op}",
                "eager operation",
                op,
                f"{op} on float64[{bench_overhead.VECTOR_SIZE}] "
                "(autodidax: NumPy arrays; JAX: jax.numpy on device arrays)",
                "µs/op",
                per_call(row, "median_us"),
            )
        )
    rows.append(
        _row(
            "vmap_of_jit",
            "vmap of jit",
            f"float64[{bench_overhead.BATCH_SIZE},{bench_overhead.VECTOR_SIZE}]",
            f"vmap(jit(sin(x) * 2.0 + x)) on float64[{bench_overhead.BATCH_SIZE},"
            f"{bench_overhead.VECTOR_SIZE}], compiled",
            "µs/call",
            per_call(overhead["vmap_of_jit"], "median_us"),
        )
    )
    loops = results["loops"]
    for key, benchmark, allowed in (
        ("while_loop", "jit while_loop", bench_loops.TARGET_RATIO),
        ("scan", "jit scan", bench_loops.TARGET_RATIO),
        ("scan_grad", "jit(grad) of scan", bench_loops.GRAD_TARGET_RATIO),
    ):
        loop = loops[key]
        values = per_call(loop, "median_ms")
        rows.append(
            _row(
                key,
                benchmark,
                f"{loop['steps']:_} steps",
                loop["program"],
                "ms/call",
                values,
                f"≤ {allowed}×",
                values["autodidax"] / values["jax"] <= allowed,
                allowed,
            )
        )
    if results.get("indexing"):
        target = bench_indexing.TARGET_RATIO
        for key, row_id in (("embedding", "embedding_grad"),
                            ("embedding_large", "embedding_grad_large")):  # fmt: skip
            row = results["indexing"][key]
            values = per_call(row, "median_ms")
            rows.append(
                _row(
                    row_id,
                    "embedding grad",
                    f"vocabulary {row['vocabulary']:_}",
                    row["program"] + ", jitted; each call waits",
                    "ms/call",
                    values,
                    f"≤ {target}×",
                    values["autodidax"] / values["jax"] <= target,
                    target,
                )
            )
    if results.get("pmap"):
        pmap = results["pmap"]["pmap"]
        values = per_call(pmap["sharded"], "median_us")
        target = bench_pmap.TARGET_RATIO
        rows.append(
            _row(
                "pmap_dispatch",
                "pmap dispatch",
                f"{pmap['devices']} devices",
                pmap["program"] + ", input already on the devices; each call waits",
                "µs/call",
                values,
                f"≤ {target}×",
                values["autodidax"] / values["jax"] <= target,
                target,
            )
        )
    if results.get("random"):
        target = bench_random.TARGET_RATIO  # SPEC section 6: uniform only
        for key in ("uniform", "normal"):
            row = results["random"][key]
            values = per_call(row, "median_ms")
            rows.append(
                _row(
                    f"random_{key}",
                    "random",
                    key,
                    row["program"] + "; each call waits",
                    "ms/call",
                    values,
                    f"≤ {target}×" if key == "uniform" else None,
                    values["autodidax"] / values["jax"] <= target
                    if key == "uniform"
                    else None,
                    target if key == "uniform" else None,
                )
            )
    if results.get("checkpoint"):
        target = bench_checkpoint.TARGET_RATIO
        steps = results["checkpoint"]["config"]["steps"]
        ids = ("checkpoint_plain", "checkpoint_body", "checkpoint_sqrt_n")
        for row_id, row in zip(ids, results["checkpoint"]["rows"]):
            values = {name: row["ms"][name] for name in names}
            rows.append(
                _row(
                    row_id,
                    "checkpoint",
                    row["scheme"],
                    f"jit(grad) of a {steps}-step scan, {row['scheme']}; "
                    "each call waits",
                    "ms/call",
                    values,
                    f"≤ {target}×",
                    values["autodidax"] / values["jax"] <= target,
                    target,
                )
            )
    if results.get("capstone"):
        capstone = results["capstone"]
        config, target = capstone["config"], bench_capstone.TARGET_RATIO
        values = {name: capstone["ms"][name] for name in names}
        rows.append(
            _row(
                "capstone_step",
                "capstone",
                "training step",
                f"Part 12's training step: d_model {config['d_model']}, "
                f"{config['n_layers']} layers, context {config['context']}, batch "
                f"{config['batch_size']}; median of {config['steps']} steps, "
                "each until its loss is on the host",
                "ms/step",
                values,
                f"≤ {target}×",
                values["autodidax"] / values["jax"] <= target
                and capstone["max_rel_diff"]["autodidax"]
                <= bench_capstone.TARGET_REL_DIFF,
                target,
            )
        )
    return rows, growth


def targets(rows: list[dict], growth: list[dict], quick: bool) -> dict:
    """Whether autodidax meets each target of SPEC section 6."""
    met = {row["id"]: row["met"] for row in rows if row["met"] is not None}
    met.update({f"{g['id']}_linear": g["met"] for g in growth})
    return {"meaningful": not quick, "met": met, "all_met": all(met.values())}


def max_abs_errors(results: dict, names: list[str]) -> dict[str, float]:
    """The largest difference from the NumPy references, per library."""
    jit, overhead = results["jit"], results["overhead"]
    sources = [
        jit["dispatch"]["max_abs_error"],
        jit["compute"]["max_abs_error"],
        *(row["max_abs_error"] for row in overhead["eager"].values()),
        overhead["vmap_of_jit"]["max_abs_error"],
        results["loops"]["while_loop"]["max_abs_error"],
        results["loops"]["scan"]["max_abs_error"],
        *(
            {k: e for k, e in row["max_abs_error"].items() if k in names}
            for row in results["dispatch"]["calls"].values()
        ),
        *([results["pmap"]["pmap"]["max_abs_error"]] if results.get("pmap") else []),
    ]
    worst: dict[str, float] = {}
    for errors in sources:
        for name, error in errors.items():
            worst[name] = max(worst.get(name, 0.0), error)
    for name, rows in results["grad"]["results"].items():
        worst[name] = max(worst.get(name, 0.0), *(r["max_abs_error"] for r in rows))
    return worst


# ---------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------


def _fmt(value: float) -> str:
    return f"{value:.3g}" if value < 100 else f"{value:.0f}"


def print_report(report: dict) -> None:
    names = report["libraries"]
    others = [name for name in names if name != "jax"]
    print("all benchmarks: autodidax next to JAX (float64), medians")
    header = f"{'benchmark':<18} {'case':<19} {'unit':<13}"
    header += "".join(f" {name:>10}" for name in names)
    header += "".join(f" {name[:4] + '/jax':>9}" for name in others)
    header += "  target"
    print(header)
    print("-" * len(header))
    for row in report["headline"]:
        line = f"{row['benchmark']:<18} {row['case']:<19} {row['unit']:<13}"
        line += "".join(f" {_fmt(row['values'][name]):>10}" for name in names)
        line += "".join(f" {row['ratios'][name]:>8.2f}x" for name in others)
        if row["target"]:
            line += f"  {row['target']}: {benchlib.verdict(row['met'])}"
        print(line)
    print()
    for g in report["growth"]:
        ratios = ", ".join(f"{name} {r:.2f}x" for name, r in g["time_ratios"].items())
        print(
            f"growth of {g['benchmark']}, time(N={g['sizes'][-1]}) / "
            f"time(N={g['sizes'][0]}): {ratios}; target <= {g['max_time_ratio']:.2f}x: "
            f"{benchlib.verdict(g['met'])}"
        )
        if "cpu_time_ratios" in g:
            ratios = ", ".join(
                f"{name} {r:.2f}x" for name, r in g["cpu_time_ratios"].items()
            )
            print(
                f"    the same in CPU time: {ratios}: {benchlib.verdict(g['cpu_met'])}"
            )
    errors = ", ".join(f"{name} {e:.1e}" for name, e in report["max_abs_error"].items())
    print(f"largest difference from NumPy: {errors}")
    summary = report["targets"]
    if not summary["meaningful"]:
        print("targets not judged: quick run, sizes too small")
    else:
        print(f"all targets met: {'yes' if summary['all_met'] else 'NO'}")


def main(argv: Sequence[str] | None = None) -> dict:
    """Run every benchmark, print the summary, write the JSON report (see the
    module docstring for where), and return the report."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    module = autodidax
    if args.module:
        module = benchlib.load_module(args.module, "autodidax_under_test")
    variants = {"autodidax": module}
    if args.baseline:
        variants[BASELINE] = benchlib.load_module(args.baseline, "autodidax_baseline")
    names = [*variants, "jax"]
    machine_before = benchlib.machine_info()
    with benchlib.jax_x64():
        results: dict[str, Any] = {}
        for key, run in (
            ("jit", run_jit),
            ("dispatch", run_dispatch),
            ("make_jaxpr", run_make_jaxpr),
            ("grad", run_grad),
            ("overhead", run_overhead),
            ("loops", run_loops),
            ("indexing", run_indexing),
            ("pmap", run_pmap),
            ("random", run_random),
            ("checkpoint", run_checkpoint),
            ("capstone", run_capstone),
        ):
            print(f"running {key} ...", flush=True)
            with frozen_heap():
                results[key] = run(variants, args.quick)
    rows, growth = headline(results, names)
    machine = benchlib.machine_info()
    machine["load_average_at_start"] = machine_before["load_average"]
    report = {
        "benchmark": "all",
        "command": " ".join(["python", "bench/run_all.py", *argv]),
        "quick": args.quick,
        "libraries": names,
        "garbage_collector": "on; collected and frozen before each benchmark",
        "modules": {name: benchlib.module_info(m) for name, m in variants.items()},
        "headline": rows,
        "growth": growth,
        "targets": targets(rows, growth, args.quick),
        "max_abs_error": max_abs_errors(results, names),
        "results": results,
        "machine": machine,
    }
    benchlib.publish(report, print_report, args.json)
    return report


if __name__ == "__main__":
    main()
