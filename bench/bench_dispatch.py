"""Benchmark: jit dispatch per kind of argument, and where the time of a call goes.

The same small jitted function, ``sin(x) * 2.0 + x``, called in steady state
(already traced and compiled) with four kinds of argument: a Python float, a
NumPy ``float64`` scalar, a NumPy ``float64[8]`` array and a device array
(autodidax's ``device_put`` / ``jax.device_put``). Two measurements:

(a) whole calls: each call timed on its own, in rounds that alternate between
    ``autodidax.jit`` (with its fast path), Part 3's ``jit``
    (``autodidax.full_path_jit``, when the module has it) and ``jax.jit``.
    Median µs per call and the ratio autodidax / JAX. Targets (SPEC section
    6): within 2x of ``jax.jit`` for a Python float and a NumPy scalar, within
    1.5x for a NumPy array and a device array.
(c) a floor: the jaxlib calls of one fast call alone (copy the argument, run
    the executable, make the output), with no Python of ours between them,
    timed in the same rounds as (a). No dispatch written in Python can be
    faster than this; its ratio to ``jax.jit`` says how close a target can be.
(b) the steps of one call: the steps of the full path (Part 3's ``jit``,
    ``bind`` and the ``impl`` rule of ``xla_call``) and of the fast path,
    written out here and timed with ``time.perf_counter_ns`` between every two
    steps, over many calls; median ns per step. The sum of the medians comes
    close to the whole call of (a), which shows that no step is missing.

Run it from the repository root:

    python bench/bench_dispatch.py                  # full counts (a few seconds)
    python bench/bench_dispatch.py --quick          # a smoke run
    python bench/bench_dispatch.py --json out.json  # also write the results
    python bench/bench_dispatch.py --no-jax         # autodidax alone

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
KINDS = ("python float", "numpy scalar", "numpy array", "device array")
TARGET_RATIOS = {
    "python float": 2.0,
    "numpy scalar": 2.0,
    "numpy array": 2.0,  # SPEC 6: host arguments, copied on every call
    "device array": 1.5,
}
FULL_PATH = "full_path"  # Part 3's jit, as a library name in the report
FLOOR = "jaxlib alone"  # (c), timed with the libraries, reported apart
FULL_STEPS = ("arguments", "signature", "bind", "copy", "execute", "outputs")
FAST_STEPS = ("signature", "copy", "execute", "outputs")
STEP_LABELS = {
    "arguments": "flatten and check the arguments",
    "signature": "signature and cache lookup",
    "bind": "bind and type checks",
    "copy": "copy to the device",
    "execute": "run the executable",
    "outputs": "wrap the outputs",
}

FULL = {"calls": 1000, "rounds": 10, "profile_calls": 3000}
QUICK = {"calls": 30, "rounds": 2, "profile_calls": 30}


def small_function(sin: Callable) -> Callable:
    def f(x):
        return sin(x) * 2.0 + x

    return f


def argument(kind: str, put: Callable[[np.ndarray], Any]) -> Any:
    """One argument of the given kind (``put`` makes a device array)."""
    vector = np.linspace(-1.0, 1.0, VECTOR_SIZE)
    return {
        "python float": lambda: 0.5,
        "numpy scalar": lambda: np.float64(0.5),
        "numpy array": lambda: vector,
        "device array": lambda: put(vector),
    }[kind]()


def jitted_functions(
    variants: dict[str, ModuleType], with_jax: bool
) -> dict[str, tuple[Callable, Callable]]:
    """Per library name: (jitted small function, device_put)."""
    functions = {}
    for name, module in variants.items():
        functions[name] = (module.jit(small_function(module.sin)), module.device_put)
    module = variants["autodidax"]
    if hasattr(module, "full_path_jit"):
        f = small_function(module.sin)
        functions[FULL_PATH] = (module.full_path_jit(f), module.device_put)
    if with_jax:
        import jax
        import jax.numpy as jnp

        functions["jax"] = (jax.jit(small_function(jnp.sin)), jax.device_put)
    return functions


def measure_calls(
    variants: dict[str, ModuleType], with_jax: bool, calls: int, rounds: int
) -> dict:
    """(a): per kind of argument, whole calls of every library, alternating."""
    functions = jitted_functions(variants, with_jax)
    results, floors = {}, {}
    for kind in KINDS:
        thunks, errors = {}, {}
        expected = np.sin(argument(kind, np.asarray)) * 2.0 + argument(kind, np.asarray)
        for name, (f, put) in functions.items():
            x = argument(kind, put)
            out = f(x)  # trace and compile (or find the trace)
            errors[name] = float(np.max(np.abs(np.asarray(out) - expected)))
            thunks[name] = lambda f=f, x=x: f(x)
        floor = jaxlib_calls_alone(variants["autodidax"], kind)
        if floor is not None:
            thunks[FLOOR] = floor
        times = benchlib.per_call_times(thunks, calls, rounds)
        row = {name: benchlib.per_call_stats(t) for name, t in times.items()}
        if floor is not None:
            floors[kind] = row.pop(FLOOR)
            if "jax" in row:
                floors[kind]["ratio"] = (
                    floors[kind]["median_us"] / row["jax"]["median_us"]
                )
        row["max_abs_error"] = errors
        if "jax" in row:
            row["ratios"] = {
                name: row[name]["median_us"] / row["jax"]["median_us"]
                for name in functions
                if name != "jax"
            }
        results[kind] = row
    return results, floors


def jaxlib_calls_alone(m: ModuleType, kind: str) -> Callable[[], Any] | None:
    """(c): the copy, run and output of a fast call, nothing else (None when
    the module has no fast path)."""
    if not hasattr(m, "input_signature"):
        return None
    f = m.jit(small_function(m.sin))
    x = argument(kind, m.device_put)
    f(x)  # the full path makes the entry
    fast_call = f.fast_calls[m.input_signature((x,))]
    run, handlers = fast_call.execute, fast_call.handlers
    consts, (copy,) = fast_call.const_buffers, fast_call.copiers
    if kind == "device array":
        buffer = x._buffer
        return lambda: run([*consts, buffer]).consume_with_handlers(handlers)
    return lambda: run([*consts, copy(x)]).consume_with_handlers(handlers)


# ---------------------------------------------------------------------------
# (b) The steps of one call, written out
# ---------------------------------------------------------------------------


def full_path_steps(m: ModuleType, f: Callable, traces: dict, args: tuple) -> tuple:
    """One call of Part 3's jit (jit, bind, xla_call's impl rule, the compiled
    call), step by step; returns (the output, ns per step)."""
    clock = time.perf_counter_ns
    t0 = clock()
    args_flat, in_tree = m.tree_flatten(args)
    args_flat = [m._as_input(x, "jit argument") for x in args_flat]
    t1 = clock()
    jaxpr, consts, out_tree = m.trace_for_call(f, traces, args_flat, in_tree)
    t2 = clock()
    # bind(xla_call_p, *consts, *args_flat, jaxpr=jaxpr) and the impl rule
    vals = [
        x if isinstance(x, m.Tracer) else m.as_array(x, "xla_call")
        for x in [*consts, *args_flat]
    ]
    trace = m.find_top_trace(vals)
    vals = [trace.full_raise(x) for x in vals]
    m.check_call_types(jaxpr, vals)
    compiled = m.compile_jaxpr(jaxpr)
    t3 = clock()
    buffers = [m._as_buffer(x) for x in vals]
    t4 = clock()
    results = compiled.executable.execute_sharded(buffers)
    t5 = clock()
    per_output = results.disassemble_into_single_device_arrays()
    outs = [m.full_lower(m.Array(bufs[0])) for bufs in per_output]
    out = m.tree_unflatten(out_tree, outs)
    t6 = clock()
    return out, (t1 - t0, t2 - t1, t3 - t2, t4 - t3, t5 - t4, t6 - t5)


def fast_path_steps(m: ModuleType, fast_calls: dict, args: tuple) -> tuple:
    """One call of the fast path, step by step; returns (output, ns per step)."""
    clock = time.perf_counter_ns
    t0 = clock()
    fast_call = fast_calls.get(m.input_signature(args))
    t1 = clock()
    buffers = list(fast_call.const_buffers)
    for x, to_device in zip(args, fast_call.copiers):
        buffers.append(x._buffer if type(x) is m.Array else to_device(x))
    t2 = clock()
    results = fast_call.execute(buffers)
    t3 = clock()
    outs = results.consume_with_handlers(fast_call.handlers)
    out = outs[0] if fast_call.out_tree is m.LEAF else None
    if out is None:
        out = m.tree_unflatten(fast_call.out_tree, outs)
    t4 = clock()
    return out, (t1 - t0, t2 - t1, t3 - t2, t4 - t3)


def median_steps(run: Callable[[], tuple], names: Sequence[str], calls: int) -> dict:
    """Median µs of each step over ``calls`` runs (garbage collector off)."""
    samples: list[tuple] = []
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        for _ in range(calls):
            samples.append(run()[1])
    finally:
        if gc_was_enabled:
            gc.enable()
    steps = {
        name: statistics.median(s[i] for s in samples) / 1e3
        for i, name in enumerate(names)
    }
    return {"steps_us": steps, "sum_us": sum(steps.values())}


def measure_steps(m: ModuleType, calls: int) -> dict:
    """(b): per kind of argument, the median of every step of the full path
    and of the fast path (when the module has one)."""
    results = {}
    has_fast_path = hasattr(m, "input_signature") and hasattr(m, "full_path_jit")
    for kind in KINDS:
        x = argument(kind, m.device_put)
        expected = np.sin(np.asarray(x)) * 2.0 + np.asarray(x)
        f, traces = small_function(m.sin), {}
        out, _ = full_path_steps(m, f, traces, (x,))  # trace and compile
        row = {
            "full_path": median_steps(
                lambda f=f, t=traces, x=x: full_path_steps(m, f, t, (x,)),
                FULL_STEPS,
                calls,
            )
        }
        errors = [float(np.max(np.abs(np.asarray(out) - expected)))]
        if has_fast_path:
            jitted = m.jit(f)
            jitted(x)  # the full path makes the entry
            out, _ = fast_path_steps(m, jitted.fast_calls, (x,))
            errors.append(float(np.max(np.abs(np.asarray(out) - expected))))
            row["fast_path"] = median_steps(
                lambda table=jitted.fast_calls, x=x: fast_path_steps(m, table, (x,)),
                FAST_STEPS,
                calls,
            )
        row["max_abs_error"] = max(errors)
        results[kind] = row
    return results


def run(variants: dict[str, ModuleType], with_jax: bool, config: dict) -> dict:
    """Both measurements (the ``results`` of a report)."""
    calls, floor = measure_calls(variants, with_jax, config["calls"], config["rounds"])
    return {
        "program": f"sin(x) * 2.0 + x, x a {' / '.join(KINDS)} "
        f"(arrays: float64[{VECTOR_SIZE}])",
        "calls": calls,
        "floor": floor,
        "steps": measure_steps(variants["autodidax"], config["profile_calls"]),
        "step_labels": STEP_LABELS,
        "target_ratios": TARGET_RATIOS,
    }


# ---------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------


def print_report(report: dict) -> None:
    results = report["results"]
    calls, steps = results["calls"], results["steps"]
    names = [
        name for name in calls[KINDS[0]] if name not in ("max_abs_error", "ratios")
    ]
    print(f"jit dispatch per kind of argument: {results['program']}, median µs/call")
    header = f"{'argument':<14}" + "".join(f" {n:>11}" for n in names)
    header += f" {'ours/jax':>9}  target"
    print(header)
    print("-" * len(header))
    for kind in KINDS:
        row = calls[kind]
        line = f"{kind:<14}" + "".join(f" {row[n]['median_us']:>11.2f}" for n in names)
        ratio = row.get("ratios", {}).get("autodidax")
        if ratio is not None:
            target = TARGET_RATIOS[kind]
            met = benchlib.verdict(ratio <= target)
            line += f" {ratio:>8.2f}x  <= {target}x: {met}"
        print(line)
    if results["floor"]:
        print()
        print("jaxlib's calls alone (copy, run, output), median µs/call")
        for kind, floor in results["floor"].items():
            line = f"{kind:<14} {floor['median_us']:>11.2f}"
            if "ratio" in floor:
                line += f" {floor['ratio']:>8.2f}x of jax.jit"
            print(line)
    print()
    print("the steps of one call, median µs per step")
    for kind in KINDS:
        for path in ("full_path", "fast_path"):
            if path not in steps[kind]:
                continue
            parts = steps[kind][path]
            detail = ", ".join(f"{k} {v:.2f}" for k, v in parts["steps_us"].items())
            print(f"{kind:<14} {path:<10} sum {parts['sum_us']:6.2f}: {detail}")
    if report["quick"]:
        print("quick run: too few calls to judge")


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Time jit dispatch per kind of argument, and the steps of a call."
    )
    parser.add_argument("--quick", action="store_true", help="few calls, a smoke run")
    parser.add_argument("--json", metavar="PATH", help="also write results as JSON")
    parser.add_argument("--no-jax", action="store_true", help="time autodidax only")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> dict:
    """Run the benchmark, print the table, and return the report as a dict."""
    args = parse_args(argv)
    config = dict(QUICK if args.quick else FULL)
    with benchlib.jax_x64():
        results = run({"autodidax": ad}, not args.no_jax, config)
    report = {
        "benchmark": "dispatch",
        "quick": args.quick,
        "config": config,
        "results": results,
        "machine": benchlib.machine_info(),
    }
    benchlib.publish(report, print_report, args.json)
    return report


if __name__ == "__main__":
    main()
