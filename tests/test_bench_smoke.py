"""Smoke test of the benchmarks: they run and report sane fields.

No timing assertions: only that the numbers are there, positive and finite,
that the traced programs have the advertised number of equations, and that
JAX's configuration is left as it was.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import jax
import pytest
from conftest import FAST_COMPILE_FLAGS

REPO_ROOT = Path(__file__).resolve().parent.parent
BENCH = REPO_ROOT / "bench" / "bench_make_jaxpr.py"
BENCH_JIT = REPO_ROOT / "bench" / "bench_jit.py"
BENCH_GRAD = REPO_ROOT / "bench" / "bench_grad.py"
BENCH_OVERHEAD = REPO_ROOT / "bench" / "bench_overhead.py"
BENCH_LOOPS = REPO_ROOT / "bench" / "bench_loops.py"
BENCH_PMAP = REPO_ROOT / "bench" / "bench_pmap.py"
BENCH_INDEXING = REPO_ROOT / "bench" / "bench_indexing.py"
BENCH_RANDOM = REPO_ROOT / "bench" / "bench_random.py"
BENCH_DISPATCH = REPO_ROOT / "bench" / "bench_dispatch.py"
BENCH_CAPSTONE = REPO_ROOT / "bench" / "bench_capstone.py"
RUN_ALL = REPO_ROOT / "bench" / "run_all.py"
RESULTS = REPO_ROOT / "bench" / "results.json"
SCRIPTS = {
    "make_jaxpr": BENCH,
    "jit": BENCH_JIT,
    "grad": BENCH_GRAD,
    "overhead": BENCH_OVERHEAD,
    "loops": BENCH_LOOPS,
    "pmap": BENCH_PMAP,
    "indexing": BENCH_INDEXING,
    "random": BENCH_RANDOM,
    "dispatch": BENCH_DISPATCH,
    "capstone": BENCH_CAPSTONE,
    "run_all": RUN_ALL,
}


# ---------------------------------------------------------------------------
# Shared by the benchmarks
# ---------------------------------------------------------------------------


@functools.cache
def load(benchmark: str):
    """A benchmark script imported by path (once per test process)."""
    spec = importlib.util.spec_from_file_location(
        f"bench_{benchmark}", SCRIPTS[benchmark]
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def check_machine(report: dict) -> None:
    machine = report["machine"]
    assert machine["jax"] == jax.__version__
    assert machine["python"] and machine["numpy"] and machine["cpu_count"]


def check_scaling_report(
    report: dict, benchmark: str, sizes: list[int], libraries: set[str], eqns: int
) -> None:
    """What make_jaxpr and grad reports share; a row has ``n + eqns`` equations."""
    assert report["benchmark"] == benchmark
    assert report["sizes"] == sizes
    assert set(report["results"]) == libraries
    for rows in report["results"].values():
        assert [row["n"] for row in rows] == sizes
        for row in rows:
            assert row["eqns"] == row["n"] + eqns
            assert row["repeats"] == report["repeats"] >= 1
            for key in ("median_s", "min_s", "max_s", "us_per_primitive"):
                assert math.isfinite(row[key]) and row[key] > 0, key
            assert row["min_s"] <= row["median_s"] <= row["max_s"]
            assert math.isclose(
                row["us_per_primitive"], row["median_s"] / row["n"] * 1e6
            )
    summary = report["summary"]
    for library in libraries:
        lib = summary[library]
        assert lib["size_ratio"] == sizes[-1] / sizes[0]
        assert math.isfinite(lib["time_ratio"]) and lib["time_ratio"] > 0
        assert math.isclose(lib["max_time_ratio"], 1.1 * lib["size_ratio"])
    assert isinstance(summary["targets"]["linear_scaling_met"], bool)
    check_machine(report)


def run_quick_in_process(module, out_file: Path, capsys) -> tuple[dict, str]:
    """``main(["--quick", "--json", out_file])``: JAX's x64 setting is restored
    and the JSON file holds the returned report. Returns it and the output."""
    x64_before = jax.config.jax_enable_x64
    report = module.main(["--quick", "--json", str(out_file)])
    assert jax.config.jax_enable_x64 == x64_before  # restored by main
    assert json.loads(out_file.read_text()) == json.loads(json.dumps(report))
    return report, capsys.readouterr().out


def run_command_line(script: Path, out_file: Path, *flags: str) -> tuple[dict, str]:
    """The script in a fresh process (like the README says to run it), with
    ``--quick``, ``flags`` and ``--json out_file``; it must succeed. Returns
    the JSON report and the output."""
    done = subprocess.run(
        [sys.executable, str(script), "--quick", *flags, "--json", str(out_file)],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env=fast_compiling_environment(),
    )
    assert done.returncode == 0, done.stderr
    return json.loads(out_file.read_text()), done.stdout


def fast_compiling_environment() -> dict[str, str]:
    """This process's environment, with the XLA flags the test processes
    compile with (tests/conftest.py): a smoke run's numbers are not compared
    with anything stored, so it need not pay for XLA's optimisation passes
    (about half of the time of run_all.py --quick). AUTODIDAX_XLA_DEFAULTS=1
    leaves XLA's defaults."""
    env = dict(os.environ)
    if not env.get("AUTODIDAX_XLA_DEFAULTS"):
        given = env.get("XLA_FLAGS", "").split()
        names = {flag.split("=")[0] for flag in given}
        given += [f"{k}={v}" for k, v in FAST_COMPILE_FLAGS.items() if k not in names]
        env["XLA_FLAGS"] = " ".join(given)
    return env


@pytest.mark.parametrize(
    ("benchmark", "argv"),
    [
        ("make_jaxpr", ["--sizes", "0", "10"]),
        ("jit", ["--size", "0"]),
        ("grad", ["--repeats", "0"]),
        ("overhead", ["--rounds", "0"]),
        ("run_all", ["--sizes", "10"]),
        ("pmap", ["--calls", "0"]),
    ],
    ids=["make_jaxpr", "jit", "grad", "overhead", "run_all", "pmap"],
)
def test_bad_arguments_are_rejected(benchmark, argv, capsys):
    with pytest.raises(SystemExit):
        load(benchmark).main(argv)
    capsys.readouterr()


@pytest.mark.parametrize("script", SCRIPTS.values(), ids=SCRIPTS.keys())
def test_benchmark_is_not_collected_as_a_test(script):
    """pytest looks in tests/ only, and the benchmark's name is not test_*."""
    assert not script.name.startswith("test_")
    pyproject = (REPO_ROOT / "pyproject.toml").read_text()
    assert 'testpaths = ["tests"]' in pyproject


# ---------------------------------------------------------------------------
# bench_make_jaxpr.py
# ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def bench_module():
    return load("make_jaxpr")


def check_report(report: dict, sizes: list[int], libraries: set[str]) -> None:
    # One equation per primitive.
    check_scaling_report(report, "make_jaxpr", sizes, libraries, eqns=0)
    assert isinstance(report["summary"]["targets"]["us_per_primitive_met"], bool)


def test_quick_run_in_process(bench_module, tmp_path, capsys):
    report, printed = run_quick_in_process(
        bench_module, tmp_path / "report.json", capsys
    )
    check_report(report, list(bench_module.QUICK_SIZES), {"autodidax", "jax"})
    assert report["quick"] is True
    assert report["summary"]["targets"]["meaningful"] is False
    assert "us/prim" in printed and "autodidax" in printed and "jax" in printed
    assert "quick run" in printed


def test_custom_sizes_without_jax(bench_module, capsys):
    report = bench_module.main(["--sizes", "30", "10", "--repeats", "2", "--no-jax"])
    check_report(report, [10, 30], {"autodidax"})
    assert "autodidax_over_jax" not in report["summary"]
    capsys.readouterr()


def test_command_line_quick_run(tmp_path):
    report, printed = run_command_line(BENCH, tmp_path / "cli.json")
    assert "us/prim" in printed
    check_report(report, report["sizes"], {"autodidax", "jax"})


# ---------------------------------------------------------------------------
# bench_jit.py
# ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def bench_jit_module():
    return load("jit")


def check_jit_report(report: dict, libraries: list[str]) -> None:
    assert report["benchmark"] == "jit"
    assert report["libraries"] == libraries
    config, results = report["config"], report["results"]
    dispatch, compute = results["dispatch"], results["compute"]
    calls = config["dispatch_calls_per_round"] * config["dispatch_rounds"]
    for library in libraries:
        row = dispatch[library]
        assert row["calls"] == calls
        for key in ("median_us", "mean_us", "min_us", "p90_us"):
            assert math.isfinite(row[key]) and row[key] > 0, key
        assert row["min_us"] <= row["median_us"] <= row["p90_us"]
        for row in (
            compute[library],
            *(r[library] for r in results["first_call"].values()),
        ):
            for key in ("median_ms", "min_ms", "max_ms"):
                assert math.isfinite(row[key]) and row[key] > 0, key
            assert row["min_ms"] <= row["median_ms"] <= row["max_ms"]
        assert compute[library]["repeats"] == config["compute_repeats"]
        # Both libraries computed the right thing (float64 against NumPy).
        assert dispatch["max_abs_error"][library] < 1e-12
        assert compute["max_abs_error"][library] < 1e-9
    assert compute["size"] == config["compute_size"]
    assert set(results["first_call"]) == {"small", "chain"}
    summary = report["summary"]
    assert summary["dispatch_target"] == 1.5 and summary["compute_target"] == 1.02
    if "jax" in libraries:
        for row in (dispatch, compute, *results["first_call"].values()):
            assert math.isfinite(row["ratio"]) and row["ratio"] > 0
        assert summary["dispatch_ratio"] == dispatch["ratio"]
        assert summary["compute_ratio"] == compute["ratio"]
        assert isinstance(summary["dispatch_met"], bool)
        assert isinstance(summary["compute_met"], bool)
    else:
        assert "ratio" not in dispatch and summary["dispatch_ratio"] is None
    check_machine(report)


def test_jit_quick_run_in_process(bench_jit_module, tmp_path, capsys):
    report, printed = run_quick_in_process(
        bench_jit_module, tmp_path / "jit.json", capsys
    )
    check_jit_report(report, ["autodidax", "jax"])
    assert report["quick"] is True and report["summary"]["meaningful"] is False
    assert report["config"]["compute_size"] == bench_jit_module.QUICK_COMPUTE_SIZE
    assert "dispatch" in printed and "compute" in printed and "first call" in printed
    assert "ours/jax" in printed and "quick run" in printed


def test_jit_without_jax(bench_jit_module, capsys):
    report = bench_jit_module.main(
        ["--quick", "--no-jax", "--calls", "5", "--rounds", "1", "--size", "64"]
    )
    check_jit_report(report, ["autodidax"])
    assert report["config"]["compute_size"] == 64
    assert "not judged" in capsys.readouterr().out


def test_jit_command_line_quick_run(tmp_path):
    """As a script in a fresh process; --check does not judge a quick run."""
    report, printed = run_command_line(BENCH_JIT, tmp_path / "cli.json", "--check")
    assert "ours/jax" in printed
    check_jit_report(report, ["autodidax", "jax"])


# ---------------------------------------------------------------------------
# bench_grad.py
# ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def bench_grad_module():
    return load("grad")


def check_grad_report(report: dict, sizes: list[int], libraries: set[str]) -> None:
    # The chain, then one reduce_sum.
    check_scaling_report(report, "grad", sizes, libraries, eqns=1)
    for rows in report["results"].values():
        for row in rows:
            # Both libraries computed the right gradient (NumPy reference).
            assert 0 <= row["max_abs_error"] < 1e-9
    summary = report["summary"]
    assert summary["targets"]["gradients_correct"] is True
    if "jax" in libraries:
        assert len(summary["autodidax_over_jax"]) == len(sizes)
    else:
        assert "autodidax_over_jax" not in summary


def test_grad_quick_run_in_process(bench_grad_module, tmp_path, capsys):
    report, printed = run_quick_in_process(
        bench_grad_module, tmp_path / "grad.json", capsys
    )
    check_grad_report(report, list(bench_grad_module.QUICK_SIZES), {"autodidax", "jax"})
    assert report["quick"] is True and report["gc_during_timing"] is True
    assert report["summary"]["targets"]["meaningful"] is False
    assert "us/prim" in printed and "autodidax" in printed and "jax" in printed
    assert "quick run" in printed


def test_grad_custom_sizes_without_jax(bench_grad_module, capsys):
    report = bench_grad_module.main(
        ["--sizes", "30", "10", "--repeats", "2", "--no-jax", "--no-gc"]
    )
    check_grad_report(report, [10, 30], {"autodidax"})
    assert report["gc_during_timing"] is False
    capsys.readouterr()


def test_grad_reference_gradient_matches_jax(bench_grad_module):
    """The benchmark's NumPy reference is itself right (checked against JAX,
    in float64: conftest switches x64 on for the tests)."""
    import jax.numpy as jnp
    import numpy as np

    x = np.linspace(0.1, 0.8, 8)
    ops = {
        "sin": jnp.sin, "cos": jnp.cos, "mul": jnp.multiply,
        "add": jnp.add, "neg": jnp.negative, "sum": jnp.sum,
    }  # fmt: skip
    expected = jax.grad(bench_grad_module.chain(ops, 12))(x)
    actual = bench_grad_module.reference_gradient(12, x)
    np.testing.assert_allclose(actual, expected, rtol=1e-12)


def test_grad_command_line_quick_run(tmp_path):
    """As a script in a fresh process; --check does not judge a quick run's
    timing (only that the gradients are right)."""
    report, printed = run_command_line(BENCH_GRAD, tmp_path / "cli.json", "--check")
    assert "us/prim" in printed
    check_grad_report(report, report["sizes"], {"autodidax", "jax"})


# ---------------------------------------------------------------------------
# bench_overhead.py
# ---------------------------------------------------------------------------


def check_per_call(row: dict, calls: int) -> None:
    assert row["calls"] == calls
    for key in ("median_us", "mean_us", "min_us", "p90_us"):
        assert math.isfinite(row[key]) and row[key] > 0, key
    assert row["min_us"] <= row["median_us"] <= row["p90_us"]


def check_overhead_results(results: dict, config: dict, libraries: list[str]) -> None:
    eager, vmapped = results["eager"], results["vmap_of_jit"]
    assert set(eager) == {"sin", "add"}
    for row in eager.values():
        for library in libraries:
            check_per_call(row[library], config["eager_calls"] * config["rounds"])
            assert row["max_abs_error"][library] < 1e-12  # against NumPy
    for library in libraries:
        check_per_call(vmapped[library], config["vmap_calls"] * config["rounds"])
        assert vmapped["max_abs_error"][library] < 1e-12
    if "jax" in libraries:
        for row in (*eager.values(), vmapped):
            assert math.isclose(
                row["ratio"], row["autodidax"]["median_us"] / row["jax"]["median_us"]
            )


def test_overhead_quick_run_in_process(tmp_path, capsys):
    module = load("overhead")
    report, printed = run_quick_in_process(module, tmp_path / "overhead.json", capsys)
    assert report["benchmark"] == "overhead" and report["quick"] is True
    assert report["libraries"] == ["autodidax", "jax"]
    config = report["config"]
    check_overhead_results(
        report["results"],
        {
            "eager_calls": config["eager_calls_per_round"],
            "vmap_calls": config["vmap_calls_per_round"],
            "rounds": config["rounds"],
        },
        ["autodidax", "jax"],
    )
    check_machine(report)
    assert "eager sin" in printed and "vmap(jit)" in printed and "quick run" in printed


def test_overhead_without_jax(capsys):
    report = load("overhead").main(
        ["--no-jax", "--eager-calls", "3", "--vmap-calls", "2", "--rounds", "1"]
    )
    check_overhead_results(
        report["results"],
        {"eager_calls": 3, "vmap_calls": 2, "rounds": 1},
        ["autodidax"],
    )
    assert "ratio" not in report["results"]["vmap_of_jit"]
    capsys.readouterr()


# ---------------------------------------------------------------------------
# bench_indexing.py
# ---------------------------------------------------------------------------


def check_indexing_report(report: dict, libraries: list[str]) -> None:
    assert report["benchmark"] == "indexing"
    assert report["libraries"] == libraries
    config, results = report["config"], report["results"]
    rows = [results["embedding"], results["embedding_large"]]
    assert [row["vocabulary"] for row in rows] == list(config["vocabularies"])
    for row in rows:
        for library in libraries:
            stats = row[library]
            assert stats["repeats"] == config["repeats"]
            for key in ("median_ms", "min_ms", "max_ms"):
                assert math.isfinite(stats[key]) and stats[key] > 0, key
            assert stats["min_ms"] <= stats["median_ms"] <= stats["max_ms"]
            assert row["max_abs_difference_from_jax"][library] < 1e-3  # float32
        # The gradient is a scatter-add of the rows, not a one-hot product.
        used = row["primitives"]["autodidax"]
        assert "scatter-add" in used and "gather" in used
        assert "dot_general" not in used
    assert set(results["growth"]) == set(libraries)
    summary = report["summary"]
    assert summary["target_ratio"] == 1.2
    if "jax" in libraries:
        ratio = rows[0]["autodidax"]["median_ms"] / rows[0]["jax"]["median_ms"]
        assert math.isclose(rows[0]["ratio"], ratio)
        assert summary["met"] == (rows[0]["ratio"] <= 1.2)
    else:
        assert "ratio" not in rows[0] and summary["met"] is None
    check_machine(report)


def test_indexing_quick_run_in_process(tmp_path, capsys):
    module = load("indexing")
    report, printed = run_quick_in_process(module, tmp_path / "indexing.json", capsys)
    check_indexing_report(report, ["autodidax", "jax"])
    assert report["quick"] is True and report["summary"]["meaningful"] is False
    assert "growth from vocabulary" in printed and "quick run" in printed


def test_indexing_without_jax(capsys):
    report = load("indexing").main(["--no-jax", "--quick", "--repeats", "1"])
    check_indexing_report(report, ["autodidax"])
    capsys.readouterr()


# ---------------------------------------------------------------------------
# bench_random.py
# ---------------------------------------------------------------------------


def test_random_quick_run_in_process(tmp_path, capsys):
    report, printed = run_quick_in_process(load("random"), tmp_path / "r.json", capsys)
    assert report["benchmark"] == "random"
    assert report["libraries"] == ["autodidax", "jax"]
    for which in ("uniform", "normal"):
        row = report["results"][which]
        assert row["size"] == report["config"]["size"]
        assert row["bits_equal_to_jax"] == {"autodidax": True}
        for library in ("autodidax", "jax"):
            stats = row[library]
            assert stats["repeats"] == report["config"]["repeats"]
            assert math.isfinite(stats["median_ms"]) and stats["median_ms"] > 0
        ratio = row["autodidax"]["median_ms"] / row["jax"]["median_ms"]
        assert math.isclose(row["ratio"], ratio)
    assert report["summary"]["target_ratio"] == 1.2
    assert report["quick"] is True and "quick run" in printed
    check_machine(report)


# ---------------------------------------------------------------------------
# bench_loops.py
# ---------------------------------------------------------------------------


def check_loops_report(report: dict, libraries: list[str]) -> None:
    assert report["benchmark"] == "loops"
    assert report["libraries"] == libraries
    config, row = report["config"], report["results"]["while_loop"]
    assert row["steps"] == config["steps"]
    for library in libraries:
        stats = row[library]
        assert stats["repeats"] == config["repeats"]
        for key in ("median_ms", "min_ms", "max_ms"):
            assert math.isfinite(stats[key]) and stats[key] > 0, key
        assert stats["min_ms"] <= stats["median_ms"] <= stats["max_ms"]
        assert row["max_abs_error"][library] < 1e-9  # against a NumPy loop
    # The loop is traced once: one while equation, whatever the trip count.
    assert row["top_level_eqns"] == {"autodidax": 1}
    summary = report["summary"]
    assert summary["target_ratio"] == 1.5
    if "jax" in libraries:
        assert math.isclose(
            row["ratio"], row["autodidax"]["median_ms"] / row["jax"]["median_ms"]
        )
        assert summary["met"] == (row["ratio"] <= 1.5)
    else:
        assert "ratio" not in row and summary["met"] is None
    check_machine(report)


def test_loops_quick_run_in_process(tmp_path, capsys):
    module = load("loops")
    report, printed = run_quick_in_process(module, tmp_path / "loops.json", capsys)
    check_loops_report(report, ["autodidax", "jax"])
    assert report["quick"] is True and report["summary"]["meaningful"] is False
    assert report["config"]["steps"] == module.QUICK_STEPS
    assert "jitted while_loop" in printed and "quick run" in printed


def test_loops_without_jax(capsys):
    report = load("loops").main(["--no-jax", "--steps", "50", "--repeats", "1"])
    check_loops_report(report, ["autodidax"])
    assert report["config"]["steps"] == 50
    capsys.readouterr()


def test_loops_command_line_quick_run(tmp_path):
    report, printed = run_command_line(BENCH_LOOPS, tmp_path / "cli.json")
    assert "ours/jax" in printed
    check_loops_report(report, ["autodidax", "jax"])


# ---------------------------------------------------------------------------
# bench_dispatch.py
# ---------------------------------------------------------------------------

DISPATCH_KINDS = ["python float", "numpy scalar", "numpy array", "device array"]


def check_dispatch_results(results: dict, libraries: set[str], config: dict) -> None:
    """Whole calls per kind of argument (ours, Part 3's jit, JAX) and the
    steps of one call, full path and fast path."""
    calls, steps = results["calls"], results["steps"]
    assert list(calls) == list(steps) == DISPATCH_KINDS
    assert results["target_ratios"] == {  # SPEC section 6
        "python float": 2.0,
        "numpy scalar": 2.0,
        "numpy array": 2.0,
        "device array": 1.5,
    }
    for kind in DISPATCH_KINDS:
        row = calls[kind]
        assert set(row) - {"max_abs_error", "ratios"} == libraries
        for library in libraries:
            check_per_call(row[library], config["calls"] * config["rounds"])
            assert row["max_abs_error"][library] < 1e-12  # against NumPy
        if "jax" in libraries:
            assert set(row["ratios"]) == libraries - {"jax"}
            for name, ratio in row["ratios"].items():
                assert math.isclose(
                    ratio, row[name]["median_us"] / row["jax"]["median_us"]
                )
        else:
            assert "ratios" not in row
        floor = results["floor"][kind]  # jaxlib's calls alone, same rounds
        check_per_call(floor, config["calls"] * config["rounds"])
        if "jax" in libraries:
            assert math.isclose(
                floor["ratio"], floor["median_us"] / row["jax"]["median_us"]
            )
        else:
            assert "ratio" not in floor
        profile = steps[kind]
        assert profile["max_abs_error"] < 1e-12
        for path, names in (
            (
                "full_path",
                ["arguments", "signature", "bind", "copy", "execute", "outputs"],
            ),
            ("fast_path", ["signature", "copy", "execute", "outputs"]),
        ):
            assert list(profile[path]["steps_us"]) == names
            assert all(v >= 0 for v in profile[path]["steps_us"].values())
            assert math.isclose(
                profile[path]["sum_us"], sum(profile[path]["steps_us"].values())
            )
            assert set(names) <= set(results["step_labels"])


def test_dispatch_quick_run_in_process(tmp_path, capsys):
    module = load("dispatch")
    report, printed = run_quick_in_process(module, tmp_path / "dispatch.json", capsys)
    assert report["benchmark"] == "dispatch" and report["quick"] is True
    check_dispatch_results(
        report["results"], {"autodidax", "full_path", "jax"}, report["config"]
    )
    check_machine(report)
    assert "python float" in printed and "fast_path" in printed
    assert "quick run" in printed


def test_dispatch_without_jax(capsys):
    report = load("dispatch").main(["--quick", "--no-jax"])
    check_dispatch_results(
        report["results"], {"autodidax", "full_path"}, report["config"]
    )
    capsys.readouterr()


def test_dispatch_steps_are_the_calls_steps():
    """The written-out steps of the benchmark compute what the calls compute:
    Part 3's jit for the full path, the fast path's entry for the fast one."""
    import numpy as np

    import autodidax as ad

    module = load("dispatch")
    f = module.small_function(ad.sin)
    for kind in DISPATCH_KINDS:
        x = module.argument(kind, ad.device_put)
        traces: dict = {}
        out, steps = module.full_path_steps(ad, f, traces, (x,))
        assert len(steps) == len(module.FULL_STEPS) and len(traces) == 1
        expected = ad.full_path_jit(f)(x)
        np.testing.assert_array_equal(np.asarray(out), np.asarray(expected))
        jitted = ad.jit(f)
        jitted(x)
        out, steps = module.fast_path_steps(ad, jitted.fast_calls, (x,))
        assert len(steps) == len(module.FAST_STEPS)
        assert type(out) is ad.Array and out.dtype == expected.dtype
        np.testing.assert_array_equal(np.asarray(out), np.asarray(expected))


# ---------------------------------------------------------------------------
# bench_capstone.py
# ---------------------------------------------------------------------------


def check_capstone_results(results: dict, libraries: set[str], quick: bool) -> None:
    """Every library trained the same steps; the losses agree (float64)."""
    config = results["config"]
    assert config["d_model"] == (32 if quick else 128)  # the model size
    assert set(results["ms"]) == set(results["losses"]) == libraries
    for name in libraries:
        assert len(results["losses"][name]) == config["steps"] + 1
        assert all(math.isfinite(v) and v > 0 for v in results["losses"][name])
        assert 0 < results["min_ms"][name] <= results["ms"][name]
    for name, diff in results["max_rel_diff"].items():
        assert diff < 1e-6, name  # SPEC section 6: loss curves to 1e-6
        assert math.isclose(
            results["ratio"][name], results["ms"][name] / results["ms"]["jax"]
        )
    pieces = results["pieces_ms"]
    assert pieces["train_step"] == results["ms"]
    timed = {"train_step", "dispatch"}
    assert set(pieces) == timed if quick else timed | {"forward", "value_and_grad"}
    assert all(set(row) == libraries for row in pieces.values())


def test_capstone_quick_run_in_process(tmp_path, capsys):
    """The one line the issue asks for, and a report of two training runs."""
    module = load("capstone")
    report, printed = run_quick_in_process(module, tmp_path / "cap.json", capsys)
    assert report["benchmark"] == "capstone" and report["quick"] is True
    check_capstone_results(report["results"], {"autodidax", "jax"}, quick=True)
    line = printed.splitlines()[0]
    assert line.startswith("capstone: ours=") and " jax=" in line
    for word in ("ratio=", "max_rel_diff=", f"steps={module.QUICK['steps']}"):
        assert word in line
    check_machine(report)


# ---------------------------------------------------------------------------
# run_all.py: every benchmark, and the committed results file
# ---------------------------------------------------------------------------

HEADLINE_IDS = {"jit_dispatch", "jit_compute", "first_call_small", "first_call_chain"}
HEADLINE_IDS |= {"eager_sin", "eager_add", "vmap_of_jit"}
HEADLINE_IDS |= {"while_loop", "scan", "scan_grad"}
HEADLINE_IDS |= {"embedding_grad", "embedding_grad_large"}
HEADLINE_IDS |= {
    "jit_dispatch_python_float",
    "jit_dispatch_numpy_scalar",
    "jit_dispatch_numpy_array",
}
BENCHMARKS = {"jit", "dispatch", "make_jaxpr", "grad", "overhead", "loops", "pmap"}
BENCHMARKS |= {"indexing", "random", "checkpoint", "capstone"}
HEADLINE_IDS |= {"capstone_step"}
HEADLINE_IDS |= {"random_uniform", "random_normal"}
HEADLINE_IDS |= {"checkpoint_plain", "checkpoint_body", "checkpoint_sqrt_n"}


def check_all_report(report: dict, libraries: list[str], quick: bool) -> None:
    """What every report of run_all.py holds, quick or not."""
    assert report["benchmark"] == "all" and report["quick"] is quick
    assert report["libraries"] == libraries
    assert report["command"].startswith("python bench/run_all.py")
    results = report["results"]
    assert set(results) == BENCHMARKS
    sizes = {key: results[key]["sizes"] for key in ("make_jaxpr", "grad")}
    assert sizes["make_jaxpr"][-1] == 4 * sizes["make_jaxpr"][0]
    assert sizes["grad"][-1] == 4 * sizes["grad"][0]
    ids = set(HEADLINE_IDS)
    for key in ("make_jaxpr", "grad"):  # table rows at the smallest and largest
        ids |= {f"{key}_{sizes[key][0]}", f"{key}_{sizes[key][-1]}"}
    ids |= {"pmap_dispatch"}
    rows = report["headline"]
    row_ids = {row["id"] for row in rows}
    assert row_ids == ids and len(rows) == len(row_ids)
    for row in rows:
        assert set(row["values"]) == set(libraries), row["id"]
        for value in row["values"].values():
            assert math.isfinite(value) and value > 0, row["id"]
        assert set(row["ratios"]) == set(libraries) - {"jax"}
        for name, ratio in row["ratios"].items():
            assert math.isclose(ratio, row["values"][name] / row["values"]["jax"])
        assert (row["target"] is None) == (row["met"] is None)
        if row["target_ratio"] is not None:
            assert row["met"] == (row["ratios"]["autodidax"] <= row["target_ratio"])
    by_id = {row["id"]: row for row in rows}
    assert by_id["jit_dispatch"]["target_ratio"] == 1.5
    assert by_id["jit_compute"]["target_ratio"] == 1.02
    for key, target in (("while_loop", 1.5), ("scan", 1.5), ("scan_grad", 2.0)):
        assert by_id[key]["target_ratio"] == target
        loop = results["loops"][key]
        assert by_id[key]["values"]["jax"] == loop["jax"]["median_ms"]
    assert results["loops"]["while_loop"]["top_level_eqns"]["autodidax"] == 1
    assert results["loops"]["scan_grad"]["steps"] == (
        100 if quick else 1000
    )  # SPEC section 6: grad through a 1,000-step scan
    for key, row_id in (
        ("embedding", "embedding_grad"),
        ("embedding_large", "embedding_grad_large"),
    ):
        assert by_id[row_id]["target_ratio"] == 1.2  # SPEC section 6
        embedding = results["indexing"][key]
        assert by_id[row_id]["values"]["jax"] == embedding["jax"]["median_ms"]
    assert results["indexing"]["embedding"]["vocabulary"] == (
        1_000 if quick else 50_000
    )
    assert by_id["random_uniform"]["target_ratio"] == 1.2  # SPEC section 6
    assert by_id["random_normal"]["target"] is None  # SPEC: a target for uniform
    for key in ("uniform", "normal"):
        row = results["random"][key]
        assert by_id[f"random_{key}"]["values"]["jax"] == row["jax"]["median_ms"]
        assert row["bits_equal_to_jax"]["autodidax"] is True
    checkpoint = results["checkpoint"]
    assert checkpoint["config"]["steps"] == (16 if quick else 1024)
    for row_id, row in zip(
        ("checkpoint_plain", "checkpoint_body", "checkpoint_sqrt_n"), checkpoint["rows"]
    ):
        assert by_id[row_id]["target_ratio"] == 1.5
        assert by_id[row_id]["values"]["jax"] == row["ms"]["jax"]
        assert row["same_bytes"] is True  # the residuals JAX saves, byte for byte
    assert by_id["capstone_step"]["target_ratio"] == 1.15  # SPEC section 6
    check_capstone_results(results["capstone"], set(libraries), quick)
    assert by_id["capstone_step"]["values"] == results["capstone"]["ms"]
    assert by_id["pmap_dispatch"]["target_ratio"] == 2.0
    pmap = results["pmap"]["pmap"]
    assert pmap["devices"] == 8
    assert (
        by_id["pmap_dispatch"]["values"]["jax"] == pmap["sharded"]["jax"]["median_us"]
    )
    dispatch = results["dispatch"]["calls"]["device array"]
    assert by_id["jit_dispatch"]["values"]["jax"] == dispatch["jax"]["median_us"]
    for kind, target in (  # SPEC section 6
        ("python float", 2.0),
        ("numpy scalar", 2.0),
        ("numpy array", 2.0),
    ):
        row = by_id["jit_dispatch_" + kind.replace(" ", "_")]
        assert row["target_ratio"] == target
        calls = results["dispatch"]["calls"][kind]
        assert row["values"]["jax"] == calls["jax"]["median_us"]
    check_dispatch_results(
        results["dispatch"],
        {*libraries, "full_path"},
        results["dispatch"]["config"],
    )
    for growth in report["growth"]:
        assert growth["id"] in ("make_jaxpr", "grad")
        assert growth["size_ratio"] == 4.0
        assert math.isclose(growth["max_time_ratio"], 4.4)
        assert set(growth["time_ratios"]) == set(libraries)
        assert growth["met"] == (growth["time_ratios"]["autodidax"] <= 4.4)
    targets = report["targets"]
    assert targets["meaningful"] is (not quick)
    assert targets["all_met"] == all(targets["met"].values())
    assert set(targets["met"]) >= {"jit_dispatch", "jit_compute", "grad_linear"}
    # Every library computed the right numbers (NumPy references).
    assert set(report["max_abs_error"]) == set(libraries)
    assert all(error < 1e-9 for error in report["max_abs_error"].values())
    for name in libraries:
        if name != "jax":
            assert len(report["modules"][name]["sha256"]) == 64
    check_machine(report)
    assert report["machine"]["autodidax_commit"]


def test_run_all_quick_in_process(tmp_path, capsys):
    """Every benchmark, tiny sizes, in this process: a complete report."""
    module = load("run_all")
    report, printed = run_quick_in_process(module, tmp_path / "all.json", capsys)
    check_all_report(report, ["autodidax", "jax"], quick=True)
    assert report["modules"]["autodidax"]["file"] == "autodidax.py"
    for key in ("make_jaxpr", "grad"):  # CPU times next to wall-clock times
        for rows in report["results"][key]["results"].values():
            assert all(row["median_cpu_s"] > 0 for row in rows)
    for growth in report["growth"]:
        assert set(growth["cpu_time_ratios"]) == {"autodidax", "jax"}
        assert growth["cpu_met"] == (growth["cpu_time_ratios"]["autodidax"] <= 4.4)
    expected = ("jit dispatch", "make_jaxpr", "grad", "vmap of jit", "while_loop")
    expected += ("pmap dispatch",)
    for words in (*expected, "growth"):
        assert words in printed
    assert "targets not judged" in printed


def test_run_all_writes_the_results_file_only_for_a_full_run():
    module = load("run_all")
    assert module.parse_args([]).json == str(RESULTS)
    assert module.parse_args(["--json", "x.json"]).json == "x.json"
    assert module.parse_args(["--quick"]).json is None
    assert module.parse_args(["--baseline", "old.py"]).json is None
    assert module.parse_args(["--module", "other.py"]).json is None


def test_run_all_command_line_with_module_and_baseline(tmp_path):
    """As a script: --module and --baseline load other autodidax files (here
    copies of this checkout's), measured as 'autodidax' and 'baseline'."""
    ours, theirs = tmp_path / "ours.py", tmp_path / "theirs.py"
    source = (REPO_ROOT / "autodidax.py").read_text()
    ours.write_text(source)
    theirs.write_text(source)
    report, printed = run_command_line(
        RUN_ALL, tmp_path / "cli.json", "--module", str(ours), "--baseline", str(theirs)
    )
    check_all_report(report, ["autodidax", "baseline", "jax"], quick=True)
    modules = report["modules"]
    assert modules["autodidax"]["file"] == str(ours.resolve())
    assert modules["baseline"]["file"] == str(theirs.resolve())
    assert modules["autodidax"]["sha256"] == modules["baseline"]["sha256"]
    assert "base/jax" in printed


def test_committed_results_are_a_full_run():
    """bench/results.json, which the book's performance page draws, is the
    report of a full run of run_all.py on this checkout's autodidax."""
    report = json.loads(RESULTS.read_text(encoding="utf-8"))
    check_all_report(report, ["autodidax", "jax"], quick=False)
    assert report["results"]["make_jaxpr"]["sizes"] == [1000, 2000, 3000, 4000]
    assert report["results"]["grad"]["sizes"] == [500, 1000, 1500, 2000]
    assert report["results"]["loops"]["config"]["steps"] == 100_000
    assert report["results"]["jit"]["compute"]["size"] == 4_000_000
    assert report["modules"]["autodidax"]["file"] == "autodidax.py"


# ---------------------------------------------------------------------------
# bench_pmap.py
# ---------------------------------------------------------------------------


def check_pmap_report(report: dict, libraries: list[str]) -> None:
    assert report["benchmark"] == "pmap"
    assert report["libraries"] == libraries
    config, row = report["config"], report["results"]["pmap"]
    assert row["devices"] == 8  # the tests' processes and the script ask for 8
    for case in ("sharded", "numpy"):
        for library in libraries:
            check_per_call(
                row[case][library], config["calls_per_round"] * config["rounds"]
            )
        if "jax" in libraries:
            assert math.isclose(
                row[case]["ratio"],
                row[case]["autodidax"]["median_us"] / row[case]["jax"]["median_us"],
            )
        else:
            assert "ratio" not in row[case]
    for library in libraries:
        assert row["max_abs_error"][library] < 1e-12  # against NumPy
    summary = report["summary"]
    assert summary["target_ratio"] == 2.0
    assert summary["met"] == (
        None if summary["ratio"] is None else summary["ratio"] <= 2.0
    )
    check_machine(report)


def test_pmap_quick_run_in_process(tmp_path, capsys):
    module = load("pmap")
    report, printed = run_quick_in_process(module, tmp_path / "pmap.json", capsys)
    check_pmap_report(report, ["autodidax", "jax"])
    assert report["quick"] is True and report["summary"]["meaningful"] is False
    assert "sharded" in printed and "ours/jax" in printed and "quick run" in printed


def test_pmap_without_jax(capsys):
    report = load("pmap").main(["--no-jax", "--calls", "3", "--rounds", "1"])
    check_pmap_report(report, ["autodidax"])
    capsys.readouterr()


def test_pmap_command_line_asks_for_eight_devices(tmp_path):
    """As a script in a fresh process whose environment has no XLA_FLAGS:
    the script itself asks XLA for the 8 host devices."""

    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    out_file = tmp_path / "cli.json"
    done = subprocess.run(
        [sys.executable, str(BENCH_PMAP), "--quick", "--json", str(out_file)],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert done.returncode == 0, done.stderr
    check_pmap_report(json.loads(out_file.read_text()), ["autodidax", "jax"])
