"""Shared test setup: float64 JAX, Hypothesis profiles, an interpreter-stack check."""

# ---- Part 9: eight host CPU devices (keep this block first) --------------------
# XLA reads XLA_FLAGS once, when JAX starts its CPU backend, so the flag is set
# here, before anything imports jax: every test process (xdist workers too) and
# every kernel a test starts (it inherits the environment) sees 8 devices. Other
# flags already in XLA_FLAGS are kept; a different device count is replaced.
# Nothing else changes: jax.devices()[0] stays the default device.
import functools
import gc
import os
import shutil
import tempfile
from pathlib import Path

HOST_DEVICES = 8
_flags = [
    flag
    for flag in os.environ.get("XLA_FLAGS", "").split()
    if not flag.startswith("--xla_force_host_platform_device_count=")
]
_flags.append(f"--xla_force_host_platform_device_count={HOST_DEVICES}")
os.environ["XLA_FLAGS"] = " ".join(_flags)
# ---- end of Part 9's block -----------------------------------------------------

import jax  # noqa: E402
import pytest  # noqa: E402
from hypothesis import HealthCheck, settings  # noqa: E402

# The reference computations in the differential tests run in float64. Only the
# test process switches this on; autodidax itself must never do it.
jax.config.update("jax_enable_x64", True)

# Hypothesis (tests/test_hypothesis.py). CI runs a small, fixed, derandomized
# budget so that it is fast and reproducible. The opt-in run,
# AUTODIDAX_HYPOTHESIS_EXAMPLES=N, runs N examples per single transformation
# (a third of that per composition of two) with a fresh random seed each time.
# Neither writes a Hypothesis example database into the repository.
_HYPOTHESIS_COMMON = dict(
    deadline=None,
    database=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile(
    "autodidax-ci", max_examples=30, derandomize=True, **_HYPOTHESIS_COMMON
)
_EXAMPLES = os.environ.get("AUTODIDAX_HYPOTHESIS_EXAMPLES")
if _EXAMPLES:
    settings.register_profile(
        "autodidax-large", max_examples=int(_EXAMPLES), **_HYPOTHESIS_COMMON
    )
    settings.load_profile("autodidax-large")
else:
    settings.load_profile("autodidax-ci")

# XLA compiles a few thousand small programs in this suite (JAX's references and
# autodidax's jit); compiling, not running, was half of the suite's time. Two
# flags make XLA's CPU compiler about 2.5x cheaper: no LLVM optimisation passes,
# and XLA's older loop emitters instead of its fusion emitters. A third compiles
# each program as one LLVM module instead of splitting it for parallel threads,
# which only adds work when both cores already run a test (6% less CPU on the
# tests of Parts 3-5; it divides the same code differently). Both sides of a
# comparison compile with them; no fast-math, but exp, log, tanh and the like
# may round differently in the last bit or two from XLA's defaults (far inside
# the tests' 1e-9). XLA reads XLA_FLAGS once per process, on its first use, so
# this sets them, starts the backend, and puts XLA_FLAGS back: the kernels and
# scripts that tests start, which print numbers compared with the notebooks'
# stored outputs, run with XLA's defaults. AUTODIDAX_XLA_DEFAULTS=1 runs the
# tests with XLA's defaults too.
# JAX's compilation cache, for the references: the tests build fresh functions,
# so jax.jit compiles the same program again in test after test (about a
# quarter of the compiles in Parts 3-5's tests); with the cache, a repeat loads
# the executable instead (6% less CPU there). One directory per run, made by the
# first pytest process and shared by its xdist workers (they inherit
# AUTODIDAX_JAX_CACHE), deleted at the end. Set here, not through JAX's
# environment variables, so that kernels and scripts the tests start, which
# compile with XLA's default flags, never load an executable compiled with the
# flags below. autodidax compiles without JAX's caches, as always.
_JAX_CACHE = os.environ.get("AUTODIDAX_JAX_CACHE")
_OWN_JAX_CACHE = _JAX_CACHE is None
if _OWN_JAX_CACHE:
    _JAX_CACHE = os.environ["AUTODIDAX_JAX_CACHE"] = tempfile.mkdtemp(
        prefix="autodidax-jax-cache-"
    )
jax.config.update("jax_compilation_cache_dir", _JAX_CACHE)
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)


# JAX's compilation cache above is on disk, so that the two workers share it;
# a repeat within one process then still read the file, decompressed and
# deserialized the executable (half the cost of compiling it again). The
# executables this process compiled or read are kept in memory too, by the
# same key, and a repeat takes them from there.
def _keep_jax_executables_in_memory() -> None:
    from jax._src import compiler

    read, write = compiler._cache_read, compiler._cache_write
    kept: dict[str, tuple] = {}

    def read_kept(module_name, cache_key, *args, **kwargs):
        if cache_key in kept:
            return kept[cache_key]
        found = read(module_name, cache_key, *args, **kwargs)
        if found[0] is not None:
            kept[cache_key] = found
        return found

    def write_kept(cache_key, compile_time_secs, module_name, backend, executable,
                   host_callbacks):  # fmt: skip
        if not host_callbacks:
            kept[cache_key] = (executable, int(compile_time_secs))
        write(cache_key, compile_time_secs, module_name, backend, executable,
              host_callbacks)  # fmt: skip

    compiler._cache_read, compiler._cache_write = read_kept, write_kept


if hasattr(
    __import__("jax._src.compiler", fromlist=["_"]), "_cache_read"
):  # JAX 0.10.2's names; another JAX simply reads the disk
    _keep_jax_executables_in_memory()


def pytest_unconfigure(config) -> None:
    if _OWN_JAX_CACHE:
        shutil.rmtree(_JAX_CACHE, ignore_errors=True)
    if _OWN_STATE_DIR:
        shutil.rmtree(_STATE_DIR, ignore_errors=True)


FAST_COMPILE_FLAGS = {
    "--xla_backend_optimization_level": "0",
    "--xla_cpu_use_fusion_emitters": "false",
    "--xla_cpu_parallel_codegen_split_count": "1",
}
if not os.environ.get("AUTODIDAX_XLA_DEFAULTS"):
    _before = os.environ.get("XLA_FLAGS")
    _given = (_before or "").split()
    _names = {flag.split("=")[0] for flag in _given}
    _given += [f"{k}={v}" for k, v in FAST_COMPILE_FLAGS.items() if k not in _names]
    os.environ["XLA_FLAGS"] = " ".join(_given)
    jax.jit(lambda x: x + 1)(0.0).block_until_ready()  # XLA reads the flags here
    if _before is None:
        del os.environ["XLA_FLAGS"]
    else:
        os.environ["XLA_FLAGS"] = _before


# ---- One MLIR context per thread for JAX's references ----------------------
# JAX lowers every program it compiles into a new MLIR context, and making one
# (registering and loading some twenty dialects) takes about 4 ms: the suite's
# JAX references lower some 20,000 programs, so a tenth of the suite's CPU went
# into making contexts. A context can hold any number of modules, so the test
# processes give JAX one context per thread and reuse it: the lowered modules,
# and so the references, are the same (tests/test_suite_caches.py checks the
# text). Kernels and scripts the tests start are not affected.
def _reuse_jax_mlir_contexts() -> None:
    import threading

    from jax._src.interpreters import mlir

    fresh_context = getattr(mlir, "make_ir_context", None)
    if fresh_context is None:  # another JAX: nothing to reuse
        return
    per_thread = threading.local()

    def reused_context():
        context = getattr(per_thread, "context", None)
        if context is None:
            context = per_thread.context = fresh_context()
        return context

    reused_context.fresh = fresh_context
    mlir.make_ir_context = reused_context


_reuse_jax_mlir_contexts()


# ---- One XLA compilation per distinct program of ours -----------------------
# Tests build new functions, so autodidax traces and compiles the same small
# programs again in test after test (a quarter of its XLA compilations in the
# tests of Parts 3-5 and the appendix were repeats). In the test processes,
# XLA's executable for a StableHLO module is kept by the module's text and
# reused: the same text compiles to the same program. Modules that call back
# into Python (debug.print) are compiled each time, since their callbacks are
# bound when they compile. autodidax's own caches (jit's traces, compiled
# jaxprs) are untouched, so the tests that count traces and compilations
# count what they did.
def _share_compiled_programs() -> None:
    import autodidax

    compile_module = autodidax.xla_compile
    executables: dict[str, object] = {}

    def compile_once(module_text: str):
        if "python_cpu_callback" in module_text:
            return compile_module(module_text)
        found = executables.get(module_text)
        if found is None:
            found = executables[module_text] = compile_module(module_text)
        return found

    compile_once.uncached = compile_module
    compile_once.executables = executables
    autodidax.xla_compile = compile_once


_share_compiled_programs()


@pytest.fixture
def clean_interpreter_stack():
    """Check that a test leaves only the evaluation level on the stack."""
    import autodidax

    assert len(autodidax._state.stack) == 1, "stack not clean before the test"
    yield
    assert len(autodidax._state.stack) == 1, "the interpreter stack was not popped"


@pytest.fixture
def compilations(monkeypatch) -> list:
    """A list that grows by one jaxpr each time autodidax compiles one."""
    import autodidax

    made: list = []
    original = autodidax.CompiledJaxpr

    class Counting(original):
        def __init__(self, jaxpr):
            made.append(jaxpr)
            super().__init__(jaxpr)

    monkeypatch.setattr(autodidax, "CompiledJaxpr", Counting)
    return made


# Scheduling for `pytest -n 2 --dist loadgroup` (what `book.py test` runs): xdist
# hands tests to whichever worker is free, in collection order, so the modules
# whose tests take seconds each go first and the thousands of quick error tests
# last; then both workers stay busy to the end instead of one finishing a long
# test alone. Order only: every test still runs, and each module keeps its order.
#
# Before all of these, largest first, come the groups that must stay on one
# worker: the browser tests (one Chromium and one site server for the module),
# and, when the session also runs nbval (`book.py test` does), the cells of each
# chapter notebook, which run in order in one kernel. xdist 3.8 would read them
# from xdist_group marks, but it records a test's group in `item._nodeid`, which
# pytest 9 no longer reads, and then runs every test on its own; so the
# scheduler below forms the groups from the test ids.
ONE_WORKER_MODULES = ["tests/test_site_browser.py"]


@pytest.hookimpl(optionalhook=True)  # an xdist hook: pytest may run without it
def pytest_xdist_make_scheduler(config, log):
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadGroupScheduling

    class Groups(LoadGroupScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            if path.endswith(".ipynb") or path in ONE_WORKER_MODULES:
                return path
            return nodeid

    return Groups(config, log)


LONG_TESTS_FIRST = [
    "test_book_one_kernel.py",
    "test_translations.py",
    "test_scale.py",
    "test_hypothesis.py",
    "test_bench_smoke.py",
    "test_threads.py",
    "test_part7_hypothesis.py",
    "test_part6_hypothesis.py",
    "test_part9_hypothesis.py",
]
QUICK_TESTS_LAST = [
    "test_part1_errors.py",
    "test_part2_errors.py",
    "test_part3_errors.py",
    "test_part4_errors.py",
    "test_part5_errors.py",
    "test_appendix_errors.py",
    "test_error_catalogue.py",
    "test_colab_setup.py",
]


def pytest_collection_modifyitems(items: list) -> None:
    def rank(item) -> tuple[int, int]:
        name = item.path.name
        if name in LONG_TESTS_FIRST:
            return (0, LONG_TESTS_FIRST.index(name))
        if name in QUICK_TESTS_LAST:
            return (2, QUICK_TESTS_LAST.index(name))
        return (1, 0)

    items.sort(key=rank)  # stable: collection order within each rank


# Python's garbage collector, in a test process that lives for thousands of
# tests: a full collection walks every object that survived so far (JAX, the
# collected tests, the caches that grow with each jit), and ran often enough to
# take a third of the CPU of the scale, Hypothesis and benchmark tests. So after
# each test, once its garbage is collected, the survivors are frozen: later
# collections skip them (cheap now: only the previous test's objects are new).
# Reference counting still frees frozen objects; only a cycle among them that
# becomes garbage later is never collected. No test relies on when the
# collector runs.
def pytest_collection_finish(session) -> None:
    gc.collect()
    gc.freeze()


@pytest.hookimpl(trylast=True)  # after the test's fixtures are torn down
def pytest_runtest_teardown(item, nextitem) -> None:
    gc.collect()
    gc.freeze()


# ---- The book in one kernel (tests/book_state.py) -----------------------------
# nbval runs each chapter once, in a fresh kernel. That reading the whole book
# in one kernel prints the same is checked at the chapters' seams instead of by
# running every cell a second time: each chapter's kernel writes a fingerprint
# of its state after its first cell ("start") and, after its last cell, once
# the next chapter's first cell has run there too ("next"), which is where the
# next chapter starts from in a shared kernel. Chapter k's "next" must equal
# chapter k+1's "start" (tests/book_state.py says why that suffices). The two
# fingerprints come from different kernels, perhaps on different workers, so
# whichever of the two cells finishes second compares them, and fails if they
# differ. One directory per run, like the JAX cache above.
import book_state  # noqa: E402

_STATE_DIR = os.environ.get("AUTODIDAX_BOOK_STATE")
_OWN_STATE_DIR = _STATE_DIR is None
if _OWN_STATE_DIR:
    _STATE_DIR = os.environ["AUTODIDAX_BOOK_STATE"] = tempfile.mkdtemp(
        prefix="autodidax-book-state-"
    )
_BOOK_STATE_CODE = os.path.join(os.path.dirname(__file__), "book_state.py")


@functools.cache
def _chapters() -> dict:
    """The book's chapters by name, in table-of-contents order."""
    from build_tools.chapters import find_chapters

    root = Path(__file__).resolve().parent.parent
    return {chapter.name: chapter for chapter in find_chapters(root)}


def _first_code_cell(chapter) -> str:
    import nbformat

    notebook = nbformat.read(chapter.ipynb, as_version=4)
    return next(cell.source for cell in notebook.cells if cell.cell_type == "code")


def _run_in_kernel(kernel, code: str, what: str) -> None:
    """Run ``code`` in an nbval kernel; fail with its error if it raises. Its
    messages are read here, so the next cell sees only its own."""
    import queue

    msg_id = kernel.execute_cell_input(code, allow_stdin=False)
    while True:
        try:
            reply = kernel.get_message(stream="shell", timeout=600)
        except queue.Empty:
            pytest.fail(f"{what}: the kernel did not answer", pytrace=False)
        if reply["parent_header"].get("msg_id") == msg_id:
            break
    kernel.await_idle(msg_id, timeout=600)
    content = reply["content"]
    if content["status"] != "ok":
        trace = "\n".join(content.get("traceback", []))
        pytest.fail(f"{what} failed in the kernel:\n{trace}", pytrace=False)


def _fingerprint_code(path: str) -> str:
    return (
        "def _autodidax_book_state():\n"
        "    helper = {}\n"
        f"    with open({_BOOK_STATE_CODE!r}, encoding='utf-8') as source:\n"
        f"        exec(compile(source.read(), {_BOOK_STATE_CODE!r}, 'exec'), helper)\n"
        f"    helper['write_fingerprint'](globals(), {path!r})\n"
        "_autodidax_book_state()\n"
        "del _autodidax_book_state\n"
    )


def _compare_seam(before: str, chapter: str) -> None:
    """Compare chapter ``before``'s "next" with ``chapter``'s "start" if both
    have been written; fail on a difference."""
    import json

    after_path = os.path.join(_STATE_DIR, f"{before}.next.json")
    alone_path = os.path.join(_STATE_DIR, f"{chapter}.start.json")
    if not (os.path.exists(after_path) and os.path.exists(alone_path)):
        return  # the other kernel has not got there yet: it will compare
    with open(after_path, encoding="utf-8") as file:
        after = json.load(file)
    with open(alone_path, encoding="utf-8") as file:
        alone = json.load(file)
    found = book_state.differences(alone, after)
    if found:
        listed = "\n  ".join(found[:20])
        more = f"\n  ... and {len(found) - 20} more" if len(found) > 20 else ""
        pytest.fail(
            f"{chapter} would start differently after {before} in one kernel "
            f"than on its own:\n  {listed}{more}",
            pytrace=False,
        )


class _BookSeams:
    """A plugin, not a conftest hook: hooks of tests/conftest.py apply to the
    tests under tests/ only, and the notebooks' cells are under book/."""

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_call(self, item):
        result = yield  # the cell itself; its failure is reported as it is
        notebook = getattr(item.parent, "nb", None)
        chapters = _chapters()
        name = item.path.stem
        if notebook is None or item.path.suffix != ".ipynb" or name not in chapters:
            return result
        order = list(chapters)
        position = order.index(name)
        kernel = item.parent.kernel
        if item.cell_num == 0:
            path = os.path.join(_STATE_DIR, f"{name}.start.json")
            _run_in_kernel(kernel, _fingerprint_code(path), f"{name}: fingerprint")
            if position > 0:
                _compare_seam(order[position - 1], name)
        last = sum(cell.cell_type == "code" for cell in notebook.cells) - 1
        if item.cell_num == last and position + 1 < len(order):
            following = order[position + 1]
            what = f"{following}'s first cell, run after {name} in its kernel"
            _run_in_kernel(kernel, _first_code_cell(chapters[following]), what)
            path = os.path.join(_STATE_DIR, f"{name}.next.json")
            _run_in_kernel(kernel, _fingerprint_code(path), f"{name}: fingerprint")
            _compare_seam(name, following)
        return result


def pytest_configure(config) -> None:
    config.pluginmanager.register(_BookSeams(), "autodidax-book-seams")
