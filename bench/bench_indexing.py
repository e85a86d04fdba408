"""Benchmark: a jitted embedding lookup and its gradient, next to JAX, at two
vocabulary sizes.

One program, written once for both libraries: ``loss(table, tokens, w) =
sum(tanh(table[tokens]) * w)`` for a float32 table of ``vocabulary x 256``
and 512 tokens; each step is ``jit(value_and_grad(loss))``, which gathers 512
rows and scatter-adds their cotangents into a table-sized gradient. The work
per token does not depend on the vocabulary (a one-hot product would do
``vocabulary x 256`` multiply-adds per token); what grows with it is only
the zero-filled gradient table, in both libraries. The benchmark checks that
autodidax's gradient jaxpr has a ``scatter-add`` and no ``dot_general``.

After one call that compiles it, each timed call runs a step and waits for
its results; repeats alternate which library goes first. The report gives the
median, minimum and maximum in milliseconds per step, the ratio autodidax /
JAX (SPEC section 6: within 1.2x), the growth of each library's step time
from the smaller vocabulary to the larger, and the largest difference of
autodidax's loss and gradient from JAX's.

Run it from the repository root:

    python bench/bench_indexing.py                  # vocabularies 50,000 and 200,000
    python bench/bench_indexing.py --quick          # a smoke run
    python bench/bench_indexing.py --repeats 21
    python bench/bench_indexing.py --json out.json  # also write the results
    python bench/bench_indexing.py --no-jax         # autodidax alone

x64 mode is switched on for JAX in ``main`` only (and restored when it
returns); the arrays are float32 in both libraries.
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

DIMENSION = 256
TOKENS = 512
VOCABULARIES = (50_000, 200_000)
QUICK = {"vocabularies": (1_000, 4_000), "dimension": 32, "tokens": 64}
REPEATS = 15
QUICK_REPEATS = 2
TARGET_RATIO = 1.2  # SPEC section 6: within 1.2x of JAX


class Library:
    """What this benchmark needs from one library."""

    def __init__(self, name, jit, value_and_grad, numpy, put, block, jaxpr=None):
        self.name = name
        self.jit = jit
        self.value_and_grad = value_and_grad
        self.np = numpy
        self.put = put  # NumPy array -> device array
        self.block = block  # wait until a result is computed
        self.jaxpr = jaxpr  # (f, *args) -> the primitive names of f's jaxpr


def has_indexing(module: ModuleType) -> bool:
    """Whether ``module`` (maybe an older autodidax) has the indexing chapter."""
    return hasattr(module, "gather_p")


def autodidax_library(module: ModuleType = ad, name: str = "autodidax") -> Library:
    def primitive_names(f: Callable, *args: Any) -> list[str]:
        return [e.primitive.name for e in module.make_jaxpr(f, *args)[0].eqns]

    def block(outs: Any) -> None:
        for out in module.tree_leaves(outs):
            out._buffer.block_until_ready()

    return Library(
        name,
        jit=module.jit,
        value_and_grad=module.value_and_grad,
        numpy=module.numpy,
        put=module.device_put,
        block=block,
        jaxpr=primitive_names,
    )


def jax_library() -> Library:
    import jax
    import jax.numpy as jnp

    return Library(
        "jax",
        jit=jax.jit,
        value_and_grad=jax.value_and_grad,
        numpy=jnp,
        put=jax.device_put,
        block=jax.block_until_ready,
    )


def step_function(lib: Library) -> Callable:
    """The benchmark's program for ``lib``: loss and gradient of a lookup."""
    xnp = lib.np

    def loss(table, tokens, w):
        return xnp.sum(xnp.tanh(table[tokens]) * w)

    return lib.value_and_grad(loss)


def inputs(vocabulary: int, dimension: int, tokens: int) -> tuple:
    rng = np.random.default_rng(0)
    table = rng.normal(size=(vocabulary, dimension)).astype(np.float32)
    ids = rng.integers(0, vocabulary, size=tokens)
    w = rng.normal(size=(tokens, dimension)).astype(np.float32)
    return table, ids, w


def stats_ms(times: Sequence[float]) -> dict:
    return {
        "repeats": len(times),
        "median_ms": statistics.median(times) * 1e3,
        "min_ms": min(times) * 1e3,
        "max_ms": max(times) * 1e3,
    }


def measure(
    libs: list[Library], vocabulary: int, dimension: int, tokens: int, repeats: int
) -> dict:
    """Step times at one vocabulary size, calls interleaved."""
    host = inputs(vocabulary, dimension, tokens)
    runners, outs, primitives = {}, {}, {}
    for lib in libs:
        step = step_function(lib)
        if lib.jaxpr is not None:
            primitives[lib.name] = sorted(set(lib.jaxpr(step, *host)))
        g, args = lib.jit(step), [lib.put(a) for a in host]
        out = g(*args)  # trace and compile
        lib.block(out)
        (value, grad) = out
        outs[lib.name] = (float(np.asarray(value)), np.asarray(grad))
        runners[lib.name] = (g, args)
    times: dict[str, list[float]] = {lib.name: [] for lib in libs}
    for i in range(repeats):
        order = libs if i % 2 == 0 else libs[::-1]
        for lib in order:
            g, args = runners[lib.name]
            gc.collect()
            start = time.perf_counter()
            lib.block(g(*args))
            times[lib.name].append(time.perf_counter() - start)
    reference = outs.get("jax", next(iter(outs.values())))
    row = {
        "program": f"jit(value_and_grad) of sum(tanh(table[tokens]) * w), table "
        f"float32[{vocabulary},{dimension}], {tokens} tokens",
        "vocabulary": vocabulary,
        **{name: stats_ms(t) for name, t in times.items()},
        "max_abs_difference_from_jax": {
            name: max(abs(v - reference[0]), float(np.max(np.abs(g - reference[1]))))
            for name, (v, g) in outs.items()
        },
        "primitives": primitives,
    }
    names = [lib.name for lib in libs]
    if "jax" in names:
        for name in names:
            if name != "jax":
                key = "ratio" if name == "autodidax" else f"ratio_{name}"
                row[key] = row[name]["median_ms"] / row["jax"]["median_ms"]
    return row


def run(libs: list[Library], config: dict, repeats: int) -> dict:
    """Both vocabulary sizes, and each library's growth from one to the other."""
    rows = [
        measure(libs, v, config["dimension"], config["tokens"], repeats)
        for v in config["vocabularies"]
    ]
    growth = {
        lib.name: rows[1][lib.name]["median_ms"] / rows[0][lib.name]["median_ms"]
        for lib in libs
    }
    return {"embedding": rows[0], "embedding_large": rows[1], "growth": growth}


def print_report(report: dict) -> None:
    names = report["libraries"]
    results = report["results"]
    print(f"indexing benchmark: {results['embedding']['program']}, ms per step")
    header = f"{'vocabulary':<12} " + " ".join(f"{n:>12}" for n in names)
    header += f" {'ours/jax':>9}"
    print(header)
    print("-" * len(header))
    for key in ("embedding", "embedding_large"):
        row = results[key]
        values = " ".join(f"{row[n]['median_ms']:>12.3f}" for n in names)
        ratio = f"{row['ratio']:.3f}x" if "ratio" in row else "-"
        print(f"{row['vocabulary']:<12_} {values} {ratio:>9}")
    growth = ", ".join(f"{n} {g:.2f}x" for n, g in results["growth"].items())
    sizes = [results[k]["vocabulary"] for k in ("embedding", "embedding_large")]
    print(f"growth from vocabulary {sizes[0]:_} to {sizes[1]:_}: {growth}")
    ours = results["embedding"]["primitives"].get("autodidax", [])
    print(f"autodidax's step uses: {', '.join(ours)}")
    summary = report["summary"]
    if not summary["meaningful"]:
        print("quick run: sizes too small to judge")
    elif summary["ratio"] is not None:
        print(
            f"target: within {TARGET_RATIO}x of JAX: {benchlib.verdict(summary['met'])}"
        )


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Time a jitted embedding lookup and its gradient, next to JAX."
    )
    parser.add_argument("--quick", action="store_true", help="small sizes, a smoke run")
    parser.add_argument("--json", metavar="PATH", help="also write results as JSON")
    parser.add_argument("--repeats", type=int, help="timed steps per library")
    parser.add_argument("--no-jax", action="store_true", help="time autodidax only")
    args = parser.parse_args(argv)
    if args.repeats is None:
        args.repeats = QUICK_REPEATS if args.quick else REPEATS
    if args.repeats < 1:
        parser.error("counts must be positive")
    return args


def config_for(quick: bool) -> dict:
    if quick:
        return dict(QUICK)
    return {"vocabularies": VOCABULARIES, "dimension": DIMENSION, "tokens": TOKENS}


def summary(results: dict, quick: bool) -> dict:
    ratio = results["embedding"].get("ratio")
    return {
        "meaningful": not quick,
        "target_ratio": TARGET_RATIO,
        "ratio": ratio,
        "met": None if ratio is None else ratio <= TARGET_RATIO,
    }


def main(argv: Sequence[str] | None = None) -> dict:
    """Run the benchmark, print the table, and return the report as a dict."""
    args = parse_args(argv)
    config = config_for(args.quick)
    with benchlib.jax_x64():
        libs = [autodidax_library()]
        if not args.no_jax:
            libs.append(jax_library())
        results = run(libs, config, args.repeats)
    report = {
        "benchmark": "indexing",
        "quick": args.quick,
        "libraries": [lib.name for lib in libs],
        "config": {**config, "repeats": args.repeats},
        "results": results,
        "summary": summary(results, args.quick),
        "machine": benchlib.machine_info(),
    }
    benchlib.publish(report, print_report, args.json)
    return report


if __name__ == "__main__":
    main()
