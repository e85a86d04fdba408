"""Benchmark: the capstone's training step, autodidax next to JAX.

The model of Part 12 (a character-level transformer: a ``scan`` over layers
with a ``checkpoint``ed body, ``jit(value_and_grad(loss))`` and Adam with
``tree_map``) is one source run on both libraries, in float64. Both start from
the same parameters and take a step on the same batch, in turns (the order
alternating), so that they share the machine's ups and downs. The benchmark
reports

- the median time of a training step, from the call until its loss is on the
  host, for each library, and their ratio (target: at most 1.15, SPEC section
  6), over ``steps`` steps after a first step that compiles;
- ``max_rel_diff``: the largest relative difference between the two loss
  curves over the run (target: at most 1e-6);
- a breakdown of a step: the median time of the jitted loss alone (the forward
  pass), of the jitted ``value_and_grad`` (forward and backward), of the whole
  step (also Adam's update), each timed on every step with that step's
  parameters and batch, and of a step's call until it returns, before the
  device has finished (the Python work of dispatching it, and whatever of
  the run the runtime does before returning). A ``--quick`` run times whole
  steps only.

It prints one line

    capstone: ours=<ms> jax=<ms> ratio=<r> max_rel_diff=<d> steps=<n>

then the breakdown. Run it from the repository root:

    python bench/bench_capstone.py                 # d_model 128, 4 layers, ...
    python bench/bench_capstone.py --quick         # tiny sizes: a smoke run
    python bench/bench_capstone.py --json PATH     # also write the report

The model's source is Part 12's cells tagged ``model``, read by
``book/capstone_tools.py``.
"""

from __future__ import annotations

import argparse
import functools
import gc
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

FULL = dict(
    vocab_size=65, d_model=128, n_layers=4, n_heads=4, d_ff=512, context=64,
    batch_size=32, steps=20, pieces=True,
)  # fmt: skip
QUICK = dict(
    vocab_size=65, d_model=32, n_layers=2, n_heads=2, d_ff=64, context=16,
    batch_size=4, steps=20, pieces=False,
)  # fmt: skip
LEARNING_RATE = 1e-3
TARGET_RATIO = 1.15
TARGET_REL_DIFF = 1e-6
PIECES = ("forward", "value_and_grad", "train_step", "dispatch")


# ---------------------------------------------------------------------------
# The model, on each library
# ---------------------------------------------------------------------------


def capstone_tools() -> ModuleType:
    """book/capstone_tools.py, loaded by its path (putting book/ on sys.path
    would let book/random.py shadow the standard library's random)."""
    import importlib.util

    path = benchlib.REPO_ROOT / "book" / "capstone_tools.py"
    spec = importlib.util.spec_from_file_location("capstone_tools", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def model_source() -> tuple[str, str]:
    """The model's code, Part 12's cells tagged ``model``, and where it is."""
    return capstone_tools().model_source(), "book/part12_capstone.md"


def model_namespace(module: ModuleType | None) -> dict:
    """The model's functions on JAX (``module`` None) or on an autodidax
    module (its imports rewritten to that module's name)."""
    source, _ = model_source()
    if module is None:
        header = "import jax\nimport jax.numpy as jnp\nfrom jax import lax\n"
    else:
        missing = [name for name in ("nn", "tree") if not hasattr(module, name)]
        if missing:
            raise ValueError(
                f"bench_capstone: {module.__file__} has no {', '.join(missing)}; "
                "the capstone needs an autodidax with Part 12's additions"
            )
        name = module.__name__
        header = f"import {name} as jax\nimport {name}.numpy as jnp\n"
        header += f"from {name} import lax\n"
    namespace: dict = {"__name__": "capstone_model"}
    exec("import numpy as np\n" + header, namespace)
    exec(compile(source, "<capstone model>", "exec"), namespace)
    return namespace


class Library:
    """One library's model, its jitted pieces, and its training state."""

    def __init__(self, name: str, module: ModuleType | None, config: dict) -> None:
        self.name = name
        ns = model_namespace(module)
        jax = ns["jax"]
        n_heads = config["n_heads"]
        rng = np.random.default_rng(0)
        self.params = ns["init_params"](
            rng, vocab_size=config["vocab_size"], d_model=config["d_model"],
            n_layers=config["n_layers"], d_ff=config["d_ff"],
            context=config["context"], dtype=np.float64,
        )  # fmt: skip
        self.opt_state = ns["adam_init"](self.params)
        loss = functools.partial(ns["loss_fn"], n_heads=n_heads)
        self.forward = jax.jit(loss)
        self.value_and_grad = jax.jit(jax.value_and_grad(loss))
        self.train_step = functools.partial(
            ns["train_step"], n_heads=n_heads, lr=LEARNING_RATE
        )

    def step(self, inputs: np.ndarray, targets: np.ndarray) -> tuple[float, float]:
        """One training step: (seconds until the call returned, seconds until
        the loss was on the host); the loss is kept in ``self.last_loss``."""
        clock = time.perf_counter
        start = clock()
        self.params, self.opt_state, loss = self.train_step(
            self.params, self.opt_state, inputs, targets
        )
        returned = clock()
        self.last_loss = float(loss)
        return returned - start, clock() - start


def make_batches(config: dict, count: int) -> tuple[np.ndarray, np.ndarray]:
    """``count`` batches of random character ids: inputs and, shifted by one,
    targets, each (count, batch_size, context) of int32."""
    rng = np.random.default_rng(1)
    shape = (count, config["batch_size"], config["context"] + 1)
    data = rng.integers(0, config["vocab_size"], size=shape).astype(np.int32)
    return data[..., :-1], data[..., 1:]


def time_call(fn: Callable, *args: object) -> float:
    """Seconds for ``fn(*args)`` and every array it returns to be ready."""
    start = time.perf_counter()
    out = fn(*args)
    for leaf in out if isinstance(out, tuple) else (out,):
        np.asarray(leaf)  # waits for the device
    return time.perf_counter() - start


# ---------------------------------------------------------------------------
# Measuring
# ---------------------------------------------------------------------------


def measure(libs: list[Library], config: dict) -> dict:
    """Train all ``libs`` side by side; on every step also time the pieces
    (with ``config["pieces"]``); return the results."""
    steps = config["steps"]
    inputs, targets = make_batches(config, steps + 1)
    losses: dict[str, list[float]] = {lib.name: [] for lib in libs}
    times: dict[tuple, list[float]] = {}
    separately = ("forward", "value_and_grad") if config["pieces"] else ()
    first_ms = {}
    for lib in libs:  # the first step (and first pieces) trace and compile
        for piece in separately:
            time_call(getattr(lib, piece), lib.params, inputs[0], targets[0])
        first_ms[lib.name] = lib.step(inputs[0], targets[0])[1] * 1e3
        losses[lib.name].append(lib.last_loss)
    for i in range(1, steps + 1):
        x, y = inputs[i], targets[i]
        for lib in libs if i % 2 else libs[::-1]:
            for piece in separately:
                gc.collect()
                t = time_call(getattr(lib, piece), lib.params, x, y)
                times.setdefault((piece, lib.name), []).append(t)
            gc.collect()
            returned, done = lib.step(x, y)
            losses[lib.name].append(lib.last_loss)
            times.setdefault(("train_step", lib.name), []).append(done)
            times.setdefault(("dispatch", lib.name), []).append(returned)
    pieces = {
        piece: {
            lib.name: statistics.median(times[piece, lib.name]) * 1e3 for lib in libs
        }
        for piece in PIECES
        if (piece, libs[0].name) in times
    }
    ms = dict(pieces["train_step"])
    result = {
        "ms": ms,
        "min_ms": {lib.name: min(times["train_step", lib.name]) * 1e3 for lib in libs},
        "first_step_ms": first_ms,
        "losses": losses,
        "pieces_ms": pieces,
    }
    if "jax" in ms:
        ref = np.array(losses["jax"])
        result["ratio"] = {n: ms[n] / ms["jax"] for n in ms if n != "jax"}
        result["max_rel_diff"] = {
            n: float(np.max(np.abs(np.array(losses[n]) - ref) / np.abs(ref)))
            for n in ms
            if n != "jax"
        }
    return result


def run(modules: dict[str, ModuleType], config: dict, with_jax: bool = True) -> dict:
    """The benchmark for the autodidax ``modules`` (by library name), and
    JAX; JAX's 64-bit mode is on while it runs."""
    with benchlib.jax_x64():
        libs = [Library(name, m, config) for name, m in modules.items()]
        if with_jax:
            libs.append(Library("jax", None, config))
        results = measure(libs, config)
    return {"config": config, "model_source": model_source()[1], **results}


def summary_line(results: dict, name: str = "autodidax") -> str:
    ms = results["ms"]
    return (
        f"capstone: ours={ms[name]:.1f} jax={ms['jax']:.1f} "
        f"ratio={results['ratio'][name]:.3f} "
        f"max_rel_diff={results['max_rel_diff'][name]:.2e} "
        f"steps={results['config']['steps']}"
    )


def print_report(report: dict) -> None:
    results = report["results"]
    if "jax" in results["ms"]:
        print(summary_line(results))
    names = list(results["ms"])
    print("  step-time breakdown, median ms: " + "  ".join(f"{n:>10}" for n in names))
    labels = {
        "forward": "jit(loss): forward",
        "value_and_grad": "jit(value_and_grad)",
        "train_step": "train step (+ Adam)",
        "dispatch": "  of which: until the call returns",
    }
    for piece in PIECES:
        row = results["pieces_ms"].get(piece)
        if row is None:  # a quick run times whole steps only
            continue
        print(f"  {labels[piece]:34}" + "  ".join(f"{row[n]:10.2f}" for n in names))
    print(f"  model: {results['model_source']}")
    if report["quick"]:
        print("  (quick run: sizes too small to judge)")
    elif "ratio" in results:
        met = results["ratio"]["autodidax"] <= TARGET_RATIO
        met = met and results["max_rel_diff"]["autodidax"] <= TARGET_REL_DIFF
        print(f"  target ratio <= {TARGET_RATIO}, max_rel_diff <= 1e-6: "
              f"{benchlib.verdict(met)}")  # fmt: skip


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes, a smoke run")
    parser.add_argument("--steps", type=int, default=None, help="timed steps")
    parser.add_argument("--json", default=None, help="also write the report here")
    parser.add_argument("--no-jax", action="store_true", help="autodidax alone")
    args = parser.parse_args(argv)
    if args.steps is not None and args.steps < 1:
        parser.error("--steps must be at least 1")
    return args


def config_for(quick: bool, steps: int | None = None) -> dict:
    config = dict(QUICK if quick else FULL)
    if steps is not None:
        config["steps"] = steps
    return config


def main(argv: Sequence[str] | None = None) -> dict:
    """Run the benchmark, print the line and the breakdown, return the report."""
    args = parse_args(argv)
    import autodidax

    config = config_for(args.quick, args.steps)
    report = {
        "benchmark": "capstone",
        "quick": args.quick,
        "target_ratio": TARGET_RATIO,
        "target_rel_diff": TARGET_REL_DIFF,
        "results": run({"autodidax": autodidax}, config, not args.no_jax),
        "machine": benchlib.machine_info(),
    }
    benchlib.publish(report, print_report, args.json)
    return report


if __name__ == "__main__":
    main()
