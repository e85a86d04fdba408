#!/usr/bin/env python3
"""Driver for the Autodidax book pipeline.

Usage: python3 build_tools/book.py COMMAND [CHAPTER ...]

  install   pip-install requirements.txt and autodidax (editable) into this Python
  sync      regenerate book/<name>.ipynb and .py from book/<name>.md
  tangle    regenerate autodidax.py from the chapters' export-tagged cells
  execute   run the chapter notebooks in fresh kernels, storing their outputs
  refresh   after editing a chapter: format its code, sync, tangle, execute
  check     fail if a generated file is out of date (changes nothing)
  test      install, then check, lint, the site build, pytest and nbval;
            with chapters (``test book/part7_scan.md``): check, lint, and only
            those chapters' notebooks and tests (CHAPTER_TESTS), about a minute
  site      install, then build the HTML site into _build/html (English) and
            _build/html/zh_CN (Chinese); --lang en or --lang zh builds one
  catalogues  update the translation catalogues (locales/) from the pages
  translations  per page: messages translated, fuzzy, untranslated; fails
            unless every message is translated

sync, execute, refresh and test take chapters (``book/<name>.md`` or ``<name>``);
without any they work on every chapter of _toc.yml. refresh also updates the
translation catalogues (of every page: a new page gets its catalogue).

This script imports only the standard library at module level, so it runs on
a bare Python: ``install`` (also the first step of ``test`` and ``site``)
brings in everything else.
"""

from __future__ import annotations

import argparse
import importlib
import os
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # make build_tools importable as a package

# These modules import only the standard library at import time too.
from build_tools import (  # noqa: E402
    chapters,
    check,
    formatting,
    i18n,
    notebooks,
    tangle,
)

PYTHON = sys.executable
# jupyter-book has no ``python -m`` entry point; call its CLI through this
# interpreter so that the build uses the same environment as everything else.
JUPYTER_BOOK = [PYTHON, "-c", "from jupyter_book.cli.main import main; main()"]
# --all: a fresh Sphinx environment, so that every page is read again and no
# warning hides behind an incremental build. --keep-going with -W reports all
# warnings, then fails.
SITE_BUILD = JUPYTER_BOOK + [
    "build",
    "--warningiserror",
    "--nitpick",
    "--keep-going",
    "--all",
    ".",
]
SITE_INDEX = ROOT / "_build" / "html" / "index.html"
# The Chinese site: built into its own tree (its own doctrees; myst-nb writes
# jupyter_execute beside html), then copied under the English site's zh_CN/.
ZH_BUILD = ROOT / "_build" / "zh_CN"
ZH_SITE_BUILD = i18n.sphinx_argv(
    "html", ZH_BUILD / "html", ZH_BUILD / ".doctrees", language="zh_CN"
)
ZH_SITE_DIR = SITE_INDEX.parent / "zh_CN"
CATALOGUE_CHECK = [PYTHON, str(ROOT / "build_tools" / "i18n.py"), "check"]
LINT_TARGETS = [
    "autodidax.py",
    "build_tools",
    "tests",
    "bench",
    "book/book_setup.py",
    "book/figures.py",
    "book/capstone_tools.py",
]


class StepFailed(Exception):
    """A step of a command failed; its own output already says why."""


def banner(text: str) -> None:
    print(f"\n==> {text}", flush=True)


STEP_TIMES: list[tuple[str, float]] = []  # (step, seconds), for the summary


def run(step: str, argv: Sequence[str], env: dict[str, str] | None = None) -> None:
    """Run one external step from the repository root; raise StepFailed if it fails."""
    run_together(step, [argv], env)


def run_together(
    step: str, commands: Sequence[Sequence[str]], env: dict[str, str] | None = None
) -> None:
    """Run the commands of one step at the same time; StepFailed if one fails."""
    banner(step)
    started = time.monotonic()
    processes = [subprocess.Popen(argv, cwd=ROOT, env=env) for argv in commands]
    code = max(process.wait() for process in processes)
    elapsed = time.monotonic() - started
    STEP_TIMES.append((step, elapsed))
    if code != 0:
        raise StepFailed(f"{step} failed (exit code {code})")
    print(f"    ({step}: ok, {elapsed:.1f}s)", flush=True)


def _junit_cases(paths: Sequence[Path]) -> list:
    """The test cases of pytest JUnit XML reports (none from an unreadable one)."""
    import xml.etree.ElementTree as ElementTree

    cases = []
    for path in paths:
        try:
            cases += list(ElementTree.parse(path).getroot().iter("testcase"))
        except (OSError, ElementTree.ParseError):
            pass
    return cases


def junit_counts(paths: Sequence[Path], cells: bool) -> str:
    """'N passed, M skipped' from pytest JUnit XML reports: of the notebook
    cells nbval ran if ``cells``, else of the other tests."""
    passed = skipped = failed = 0
    for case in _junit_cases(paths):
        # nbval names a cell's class after its notebook: book.part1_x.ipynb
        if case.get("classname", "").endswith(".ipynb") != cells:
            continue
        outcomes = {child.tag for child in case}
        if "skipped" in outcomes:
            skipped += 1
        elif outcomes & {"failure", "error"}:
            failed += 1
        else:
            passed += 1
    counts = f"{passed} passed"
    if failed:
        counts += f", {failed} failed"
    if skipped:
        counts += f", {skipped} skipped"
    return counts


def skip_reasons(paths: Sequence[Path]) -> list[str]:
    """One line per distinct reason for skipping in JUnit XML reports, with
    the number of tests it skipped (pytest's -rs prints one per location)."""
    import collections

    reasons = collections.Counter(
        skip.get("message", "").removeprefix("Skipped: ") or "(no reason given)"
        for case in _junit_cases(paths)
        for skip in case.iter("skipped")
    )
    return [f"{n} skipped: {reason}" for reason, n in sorted(reasons.items())]


def minutes(seconds: float) -> str:
    return f"{int(seconds // 60)}m{seconds % 60:02.0f}s"


# ---------------------------------------------------------------- commands


def requirement_lines(root: Path = ROOT) -> list[str]:
    """The requirements of requirements.txt (``name==version``), no comments."""
    text = (root / "requirements.txt").read_text(encoding="utf-8")
    lines = (line.split("#", 1)[0].strip() for line in text.splitlines())
    return [line for line in lines if line]


def unmet_requirements(root: Path = ROOT) -> list[str]:
    """What ``install`` would change in this Python: [] when nothing.

    Each pin of requirements.txt against the installed version, and autodidax
    installed in editable mode from this checkout. Reads package metadata
    only, so it takes a fraction of a second where pip takes half a minute.
    """
    import importlib.metadata
    import json

    unmet = []
    for line in requirement_lines(root):
        name, _, version = line.partition("==")
        try:
            found = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            found = None
        if found != version:
            unmet.append(f"{name}=={version} (found {found or 'none'})")
    # The checkout's autodidax.egg-info may shadow the installed metadata on
    # sys.path, so look at every autodidax distribution found.
    editable_here = False
    for dist in importlib.metadata.distributions(name="autodidax"):
        direct_url = json.loads(dist.read_text("direct_url.json") or "{}")
        editable = direct_url.get("dir_info", {}).get("editable", False)
        editable_here |= editable and direct_url.get("url") == root.as_uri()
    if not editable_here:
        unmet.append(f"autodidax (editable, from {root})")
    return unmet


def cmd_install(args: argparse.Namespace) -> None:
    started = time.monotonic()
    unmet = unmet_requirements()
    if not unmet and not getattr(args, "force", False):
        banner(f"install into {PYTHON}")
        print(
            "    the pinned requirements and autodidax are already installed; "
            f"skipped ({time.monotonic() - started:.1f}s; `install --force` "
            "reinstalls)",
            flush=True,
        )
        return
    env = {**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    # requirements.txt pins every package (it is a pip freeze), so pip need not
    # resolve dependencies (--no-deps), and two pips install half of the pins
    # each, at the same time: most of pip's time goes into reading the package
    # index, on one core. (pip freeze leaves out wheel, which a pinned package
    # requires; requirements.txt pins it by hand.) `pip check` then confirms
    # that every requirement is met.
    # --no-compile: Python compiles the few modules it imports on first use,
    # instead of pip compiling every file of every package (about 15 s).
    pins = requirement_lines(ROOT)
    pip = [PYTHON, "-m", "pip", "install", "-q", "--no-compile", "--no-deps"]
    halves = [pip + pins[0::2] + ["-e", "."], pip + pins[1::2]]
    run_together(f"install into {PYTHON}", halves, env=env)
    run("pip check", [PYTHON, "-m", "pip", "check"], env=env)
    importlib.invalidate_caches()  # later steps of this process import them


def cmd_sync(args: argparse.Namespace) -> None:
    for chapter in chapters.select_chapters(ROOT, args.chapters):
        changed = notebooks.sync_chapter(chapter)
        status = ", ".join(chapter.rel(path) for path in changed) or "unchanged"
        print(f"sync {chapter.rel(chapter.md)}: {status}")


def cmd_tangle(args: argparse.Namespace) -> None:
    changed = tangle.write_module(ROOT)
    print(f"tangle: {tangle.MODULE_FILE} {'written' if changed else 'unchanged'}")


def cmd_execute(args: argparse.Namespace) -> None:
    for chapter in chapters.select_chapters(ROOT, args.chapters):
        started = time.monotonic()
        print(f"execute {chapter.rel(chapter.ipynb)} ...", flush=True)
        notebooks.execute_chapter(chapter)
        elapsed = time.monotonic() - started
        print(f"execute {chapter.rel(chapter.ipynb)}: done ({elapsed:.1f}s)")


def cmd_refresh(args: argparse.Namespace) -> None:
    # Tangle before executing: later chapters import the module.
    for chapter in chapters.select_chapters(ROOT, args.chapters):
        changed = notebooks.format_chapter(chapter)
        print(f"format {chapter.rel(chapter.md)}: {'reformatted' if changed else 'ok'}")
    cmd_sync(args)
    cmd_tangle(args)
    cmd_execute(args)
    cmd_catalogues(args)


def cmd_catalogues(args: argparse.Namespace) -> None:
    """Merge the pages' messages into the catalogues of every language."""
    banner("update the translation catalogues (locales/)")
    changes = i18n.extract()
    for line in changes:
        print(f"    {line}")
    print(f"    catalogues: {'updated' if changes else 'already up to date'}")


def cmd_translations(args: argparse.Namespace) -> None:
    rows = i18n.coverage("zh_CN")
    print(i18n.coverage_table(rows))
    fuzzy = sum(row.fuzzy for row in rows)
    untranslated = sum(row.untranslated for row in rows)
    if fuzzy or untranslated:
        raise StepFailed(
            f"{fuzzy} fuzzy and {untranslated} untranslated message(s) in "
            "locales/zh_CN (fuzzy: the English changed since it was "
            "translated; the Chinese page shows the English until the entry is "
            "updated and its fuzzy flag removed)"
        )


def cmd_check(args: argparse.Namespace) -> None:
    problems = check.check_repo(ROOT)
    for problem in problems:
        print(f"check: {problem}", file=sys.stderr)
    if problems:
        raise StepFailed(f"check found {len(problems)} problem(s)")
    count = len(chapters.find_chapters(ROOT))
    print(f"check: {count} chapter(s) and {tangle.MODULE_FILE} are in sync")


def share_bytecode(cache: Path) -> None:
    """Let the steps' processes share one bytecode cache if none may be written.

    With PYTHONDONTWRITEBYTECODE set (and ``install`` runs pip --no-compile),
    every pytest worker, kernel and script would compile jax, numpy and the
    rest from source on import, about 2 s each. Instead they write and reuse
    .pyc files in ``cache``, outside the source tree; ``test`` deletes it.
    """
    if os.environ.pop("PYTHONDONTWRITEBYTECODE", None):
        os.environ["PYTHONPYCACHEPREFIX"] = str(cache)


def cmd_test(args: argparse.Namespace) -> None:
    import shutil
    import tempfile

    started = time.monotonic()
    scratch = Path(tempfile.mkdtemp(prefix="autodidax-test-"))
    share_bytecode(scratch / "pycache")
    try:
        run_tests(args, started, scratch)
    finally:
        shutil.rmtree(scratch / "pycache", ignore_errors=True)


# The tests that belong to each chapter, for ``test book/<chapter>.md``: test
# files (under tests/), and the chapter's claims about JAX in
# tests/test_jax_claims.py, which are named after their page
# (test_part7_...). tests/test_pipeline.py checks that every chapter and
# every test file is here or in WHOLE_BOOK_TESTS.
CHAPTER_TESTS: dict[str, tuple[str, ...]] = {
    "part1_interpreters": ("test_part1_differential.py", "test_part1_errors.py"),
    "part2_jaxprs": ("test_part2_jaxprs.py", "test_part2_errors.py"),
    "part3_jit": ("test_part3_jit.py", "test_part3_errors.py", "test_host_copies.py"),
    "part4_grad": ("test_part4_grad.py", "test_part4_errors.py"),
    "part5_cond": ("test_part5_cond.py", "test_part5_errors.py"),
    "appendix_primitives": (
        "test_appendix_primitives.py",
        "test_appendix_errors.py",
        "test_comparisons.py",
        "test_dtypes_and_methods.py",
        "test_nn_and_numpy.py",
    ),
    "indexing": ("test_indexing.py",),
    "part6_loops": ("test_part6_loops.py", "test_part6_hypothesis.py"),
    "part7_scan": ("test_part7_scan.py", "test_part7_hypothesis.py"),
    "part8_custom_rules": (
        "test_part8_custom_rules.py",
        "test_custom_rules_semantics.py",
    ),
    "part9_named_axes": ("test_part9_named_axes.py", "test_part9_hypothesis.py"),
    "analysis": ("test_analysis.py",),
    "random": ("test_random.py",),
    "part10_stackless": ("test_part10_stackless.py", "test_part10_hypothesis.py"),
    "part11_checkpoint": ("test_part11_checkpoint.py",),
    "part12_capstone": ("test_part12_capstone.py",),
    "performance": ("test_fast_path.py", "test_api_corners.py", "test_bench_smoke.py"),
    "rule_table": (),
}
# Test files about the whole book or module rather than one chapter: the full
# run only.
WHOLE_BOOK_TESTS = (
    "test_book_one_kernel.py",
    "test_clean_state.py",
    "test_colab_setup.py",
    "test_error_catalogue.py",
    "test_hypothesis.py",
    "test_jax_api_programs.py",
    "test_jax_claims.py",
    "test_jax_upstream.py",
    "test_pipeline.py",
    "test_scale.py",
    "test_site_browser.py",
    "test_threads.py",
    "test_translations.py",
)
BROWSER_TESTS = "tests/test_site_browser.py"


def claims_prefix(chapter: str) -> str:
    """The name prefix of a chapter's claims in tests/test_jax_claims.py."""
    return "test_" + chapter.split("_")[0] + "_"


class Background:
    """A step's processes running while other steps run, their output kept
    in a file and printed when the step ends (whole if it failed, else its
    last line), so that it does not interleave with pytest's progress."""

    def __init__(
        self,
        step: str,
        commands: Sequence[Sequence[str]],
        log: Path,
        env: dict[str, str] | None = None,
    ) -> None:
        self.step, self.log = step, log
        self.started = time.monotonic()
        self.file = log.open("w", encoding="utf-8")
        self.processes = [
            subprocess.Popen(
                argv, cwd=ROOT, env=env, stdout=self.file, stderr=subprocess.STDOUT
            )
            for argv in commands
        ]

    def wait(self) -> bool:
        """Wait for the step; print how it went; True if it succeeded."""
        code = max(process.wait() for process in self.processes)
        elapsed = time.monotonic() - self.started
        self.file.close()
        STEP_TIMES.append((self.step, elapsed))
        banner(self.step)
        text = self.log.read_text(encoding="utf-8", errors="replace").rstrip()
        if code != 0:
            print(text, flush=True)
            print(f"    ({self.step}: FAILED, exit code {code})", flush=True)
            return False
        last = text.splitlines()[-1] if text else ""
        print(f"    {last}\n    ({self.step}: ok, {elapsed:.1f}s)", flush=True)
        return True


def run_tests(args: argparse.Namespace, started: float, reports: Path) -> None:
    cmd_install(args)
    if args.chapters:
        run_checks_and_lint()
        run_chapter_tests(args, started, reports)
        return

    # The whole suite, on both cores all the time: the main pytest session
    # (the tests and nbval, which re-executes every chapter notebook in a
    # fresh kernel and compares its outputs with the stored ones) starts at
    # once, and the other steps run beside it: check and lint, then the site
    # build (both languages, and the check that the translation catalogues
    # hold exactly the pages' messages), then the browser tests on that build
    # (which spend most of their time waiting for Chromium to load and settle
    # a page: 14 s of CPU in 45 s). Run one after another, the single-process
    # steps left a core idle. loadgroup keeps the cells of each notebook (in
    # order) on one worker and schedules the notebooks and the long modules
    # first (tests/conftest.py). Every step runs to its end; the command
    # fails if any failed, after saying which.
    chapter_list = chapters.find_chapters(ROOT)
    main_report, browser_report = reports / "pytest.xml", reports / "browser.xml"
    pytest = [PYTHON, "-m", "pytest", "-n", "2", "--dist", "loadgroup"]
    pytest += [f"--junitxml={main_report}", "tests", f"--ignore={BROWSER_TESTS}"]
    step = "pytest tests/"
    if chapter_list:
        pytest += ["--nbval", "--nbval-current-env", "--nbval-cell-timeout=600"]
        pytest += [chapter.rel(chapter.ipynb) for chapter in chapter_list]
        step += " and nbval (re-execute every chapter, compare outputs)"
    banner(f"{step}, with the other steps beside it")
    main_started = time.monotonic()
    main = subprocess.Popen(pytest, cwd=ROOT)

    failed = []
    for name, argv in checks_and_lint(chapter_list):
        if not Background(name, [argv], reports / "step.log").wait():
            failed.append(name)
    site = Background(
        "site build, English and Chinese (warnings are errors), "
        "and the translation catalogues check",
        [SITE_BUILD, ZH_SITE_BUILD, CATALOGUE_CHECK],
        reports / "site.log",
    )
    if site.wait():
        publish_translation()
        try:
            wait_for_system_packages()
        except StepFailed as failure:
            print(f"    {failure}", flush=True)
            failed.append("the Debian packages")
        else:
            browser = [PYTHON, "-m", "pytest", "-q", f"--junitxml={browser_report}"]
            env = {**os.environ, "AUTODIDAX_SITE_HTML": str(SITE_INDEX.parent)}
            tests = Background(
                "the browser tests", [browser + [BROWSER_TESTS]], reports / "b.log", env
            )
            if not tests.wait():
                failed.append("the browser tests")
    else:
        failed += ["site build", "the browser tests (no site to open)"]

    code = main.wait()
    STEP_TIMES.append((step, time.monotonic() - main_started))
    banner(step)
    print(f"    ({step}: {'ok' if code == 0 else 'FAILED'})", flush=True)
    if code != 0:
        failed.append("pytest tests/ and nbval")
    if failed:
        raise StepFailed(f"these steps failed: {'; '.join(failed)}")
    report_summary(started, [main_report, browser_report], len(chapter_list))


def checks_and_lint(chapter_list: Sequence) -> list[tuple[str, list[str]]]:
    """check (generated files in sync), ruff check and ruff format --check."""
    lint_targets = [target for target in LINT_TARGETS if (ROOT / target).exists()]
    lint_targets += [chapter.rel(chapter.py) for chapter in chapter_list]
    # A fresh interpreter for check: the packages were possibly just installed.
    return [
        ("check", [PYTHON, __file__, "check"]),
        ("ruff check", [PYTHON, "-m", "ruff", "check", *lint_targets]),
        (
            "ruff format --check",
            [PYTHON, "-m", "ruff", "format", "--check", *lint_targets],
        ),
    ]


def run_checks_and_lint() -> None:
    for name, argv in checks_and_lint(chapters.find_chapters(ROOT)):
        run(name, argv)


def wait_for_system_packages() -> None:
    """Wait for the Debian packages ``.ci/run`` installs in the background
    (Chromium and a Chinese font, for the browser tests), if it does: the
    file AUTODIDAX_SYSTEM_PACKAGES names appears holding apt's exit status."""
    status_file = os.environ.get("AUTODIDAX_SYSTEM_PACKAGES")
    if not status_file:
        return
    banner("wait for the Debian packages .ci/run installs")
    waited = time.monotonic()
    while not os.path.exists(status_file):
        time.sleep(0.5)
    status = Path(status_file).read_text().strip()
    STEP_TIMES.append(("wait for Debian packages", time.monotonic() - waited))
    if status != "0":
        log = Path(status_file + ".log")
        print(log.read_text() if log.exists() else "(no log)", flush=True)
        raise StepFailed(f"installing the Debian packages failed (exit code {status})")
    print(f"    (installed; waited {time.monotonic() - waited:.1f}s)", flush=True)


def run_chapter_tests(args: argparse.Namespace, started: float, reports: Path) -> None:
    """``test book/<chapter>.md``: the chapters' notebooks (nbval) and the
    tests that belong to them (CHAPTER_TESTS), no site build."""
    selected = chapters.select_chapters(ROOT, args.chapters)
    files, claims = [], []
    for chapter in selected:
        files += [f"tests/{name}" for name in CHAPTER_TESTS.get(chapter.name, ())]
        claims.append(claims_prefix(chapter.name))
    report = reports / "pytest.xml"
    pytest = [PYTHON, "-m", "pytest", "-n", "2", "--dist", "loadgroup"]
    pytest += [f"--junitxml={report}", "--nbval", "--nbval-current-env"]
    pytest += ["--nbval-cell-timeout=600"]
    pytest += [chapter.rel(chapter.ipynb) for chapter in selected]
    # The chapters' claims about JAX, by name, from test_jax_claims.py; -k
    # keeps every other test (the chapters' own files, the cells).
    keep = " or ".join(claims)
    pytest += ["-k", f"not test_jax_claims or {keep}", "tests/test_jax_claims.py"]
    pytest += files
    names = ", ".join(chapter.name for chapter in selected)
    run(f"pytest: nbval of {names} and its tests", pytest)
    report_summary(started, [report], len(selected))
    print(
        "\nThat was one chapter's loop. Before submitting, run the whole "
        "suite (what CI runs): python3 build_tools/book.py test",
        flush=True,
    )


def report_summary(started: float, reports: Sequence[Path], notebooks: int) -> None:
    for line in skip_reasons(reports):
        print(f"    {line}")
    summary = [f"pytest {junit_counts(reports, cells=False)}"]
    if notebooks:
        chapters_run = f"{notebooks} chapter{'s' if notebooks > 1 else ''}"
        cells = junit_counts(reports, cells=True)
        summary.append(f"nbval {chapters_run}, {cells} cells")
    steps = ", ".join(f"{step.split(' (')[0]} {sec:.0f}s" for step, sec in STEP_TIMES)
    banner(
        f"test: all steps passed in {minutes(time.monotonic() - started)}: "
        f"{'; '.join(summary)} ({steps})"
    )


def publish_translation() -> None:
    """Copy the Chinese site under the English one's zh_CN/."""
    import shutil

    shutil.rmtree(ZH_SITE_DIR, ignore_errors=True)
    shutil.copytree(ZH_BUILD / "html", ZH_SITE_DIR)


def build_site(step: str, lang: str = "all") -> None:
    """Build the English site, the Chinese one or both (at the same time)."""
    builds = {"en": [SITE_BUILD], "zh": [ZH_SITE_BUILD]}.get(
        lang, [SITE_BUILD, ZH_SITE_BUILD]
    )
    run_together(step, builds)
    if lang != "en":
        publish_translation()


def cmd_site(args: argparse.Namespace) -> None:
    cmd_install(args)
    build_site("site build", args.lang)
    if args.lang != "zh":
        print(f"\nThe site is in {SITE_INDEX.parent}; open {SITE_INDEX}")
    if args.lang != "en":
        print(
            f"The Chinese site is in {ZH_SITE_DIR}; open {ZH_SITE_DIR / 'index.html'}"
        )


# name: (function, takes chapter arguments, help)
COMMANDS: dict[str, tuple[Callable[[argparse.Namespace], None], bool, str]] = {
    "install": (cmd_install, False, "install the pinned tools and autodidax"),
    "sync": (cmd_sync, True, "regenerate .ipynb/.py from the chapters' .md"),
    "tangle": (cmd_tangle, False, "regenerate autodidax.py"),
    "execute": (cmd_execute, True, "execute chapter notebooks, storing outputs"),
    "refresh": (
        cmd_refresh,
        True,
        "format, sync, tangle and execute; update the catalogues",
    ),
    "check": (cmd_check, False, "fail if a generated file is out of date"),
    "test": (
        cmd_test,
        True,
        "install and run every check and test; with chapters, their loop only",
    ),
    "site": (cmd_site, False, "install and build the HTML site"),
    "catalogues": (cmd_catalogues, False, "update the translation catalogues"),
    "translations": (cmd_translations, False, "report the translation coverage"),
}


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="book.py",
        description="Driver for the Autodidax book pipeline.",
        epilog="sync, execute, refresh and test take chapters (book/<name>.md or "
        "<name>); without any they work on every chapter of _toc.yml.",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (function, takes_chapters, help_text) in COMMANDS.items():
        sub = commands.add_parser(name, help=help_text, description=help_text)
        if takes_chapters:
            sub.add_argument("chapters", nargs="*", help="chapters (default: all)")
        if name == "install":
            sub.add_argument(
                "--force", action="store_true", help="reinstall even if satisfied"
            )
        if name == "site":
            sub.add_argument(
                "--lang",
                choices=["en", "zh", "all"],
                default="all",
                help="build the English site, the Chinese one or both (default)",
            )
        sub.set_defaults(function=function, chapters=[], force=False, lang="all")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        args.function(args)
    except StepFailed as failure:
        print(f"\nbook.py {args.command}: FAILED: {failure}", file=sys.stderr)
        return 1
    except ModuleNotFoundError as error:
        print(
            f"book.py {args.command}: missing Python package {error.name!r}; run "
            "`python3 build_tools/book.py install` first (in a virtualenv)",
            file=sys.stderr,
        )
        return 2
    except (
        chapters.ChapterError,
        formatting.FormatError,
        notebooks.NotebookError,
        tangle.TangleError,
    ) as error:
        print(f"book.py {args.command}: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
