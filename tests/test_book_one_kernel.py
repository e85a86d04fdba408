"""Reading the whole book in one kernel prints what each chapter prints alone.

nbval runs every chapter once, in a fresh kernel, and compares its outputs
with the stored ones. Instead of running every cell a second time, in one
kernel, the test session compares the state each chapter starts from at the
seams between chapters (``tests/book_state.py`` says what is compared and why
that suffices; ``tests/conftest.py`` takes the fingerprints in the nbval
kernels). These tests check the fingerprint itself, and run the whole check on
a small book of three chapters, the second of which leaves something behind.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
import types
import warnings
from pathlib import Path

import book_state
import jax
import nbformat
import numpy as np
import pytest

from build_tools.chapters import find_chapters

ROOT = Path(__file__).resolve().parent.parent


def test_every_chapter_opens_with_the_setup_cell() -> None:
    """The seams run the next chapter's first code cell: it must be the setup."""
    for chapter in find_chapters(ROOT):
        notebook = nbformat.read(chapter.ipynb, as_version=4)
        first = next(c for c in notebook.cells if c.cell_type == "code")
        assert f'load_book(globals(), before="{chapter.name}")' in first.source


def _changed(change, undo, namespace=None) -> list[str]:
    """The differences a change makes to the fingerprint (then undone)."""
    namespace = {} if namespace is None else namespace
    before = book_state.fingerprint(namespace)
    change()
    try:
        after = book_state.fingerprint(namespace)
    finally:
        undo()
    return book_state.differences(before, after)


def test_fingerprint_sees_what_a_cell_can_leave_behind(monkeypatch, tmp_path) -> None:
    options = np.get_printoptions()
    x64 = jax.config.jax_enable_x64
    cases = {
        "numpy.printoptions": (
            lambda: np.set_printoptions(linewidth=40),
            lambda: np.set_printoptions(**options),
        ),
        "jax.config.jax_enable_x64": (
            lambda: jax.config.update("jax_enable_x64", not x64),
            lambda: jax.config.update("jax_enable_x64", x64),
        ),
        "environ:AUTODIDAX_TEST_VARIABLE": (
            lambda: os.environ.__setitem__("AUTODIDAX_TEST_VARIABLE", "1"),
            lambda: os.environ.pop("AUTODIDAX_TEST_VARIABLE"),
        ),
        "cwd": (lambda: os.chdir(tmp_path), lambda: os.chdir(ROOT)),
        "sys.path": (
            lambda: sys.path.append(str(tmp_path)),
            lambda: sys.path.remove(str(tmp_path)),
        ),
        "warnings.filters": (
            lambda: warnings.filterwarnings("ignore", "autodidax-test"),
            lambda: warnings.filters.pop(0),
        ),
    }
    monkeypatch.chdir(ROOT)
    for key, (change, undo) in cases.items():
        found = _changed(change, undo)
        assert len(found) == 1 and found[0].startswith(f"{key}:"), (key, found)


def test_fingerprint_sees_a_changed_name_and_a_replaced_function(monkeypatch) -> None:
    def square(x):
        return x * x

    def cube(x):
        return x * x * x

    namespace = {"f": square, "n": 3, "table": {"a": [1, 2]}}
    assert _changed(lambda: namespace.update(f=cube), lambda: None, namespace)
    namespace["f"] = square
    assert _changed(lambda: namespace["table"]["a"].append(3), lambda: None, namespace)

    fake = types.ModuleType("figures")  # a book module, as a notebook sees it
    fake.draw = square
    monkeypatch.setitem(sys.modules, "figures", fake)
    replacement = types.FunctionType(cube.__code__, {"__name__": "__main__"})
    replacement.__module__ = "__main__"  # defined in a notebook's cell
    found = _changed(lambda: setattr(fake, "draw", replacement), lambda: None)
    assert [line.split(":")[0] for line in found] == ["figures.draw", "replaced"]


def test_names_and_modules_left_behind_are_allowed(monkeypatch) -> None:
    alone = book_state.fingerprint({"f": len})
    after = book_state.fingerprint({"f": len, "demo_value": 2})
    after["module:some_module_a_demo_imported"] = "imported"
    assert book_state.differences(alone, after) == []

    # A book module that only the chapter before imported: allowed, unless a
    # function in it was replaced by a notebook's.
    fake = types.ModuleType("figures")
    fake.draw = len
    monkeypatch.delitem(sys.modules, "figures", raising=False)
    alone = book_state.fingerprint({})
    monkeypatch.setitem(sys.modules, "figures", fake)
    assert book_state.differences(alone, book_state.fingerprint({})) == []
    patched = types.FunctionType((lambda x: x).__code__, {})
    patched.__module__ = "__main__"
    fake.draw = patched
    found = book_state.differences(alone, book_state.fingerprint({}))
    assert [line.split(":")[0] for line in found] == ["replaced"]


SMALL_BOOK_TOC = """\
format: jb-book
root: book/intro
parts:
  - caption: A small book
    chapters:
      - file: book/one
      - file: book/two
      - file: book/three
"""
HEADER = """\
---
jupytext:
  formats: ipynb,md:myst
kernelspec:
  display_name: Python 3 (ipykernel)
  language: python
  name: python3
---
"""


def _small_book(root: Path) -> None:
    """Three chapters whose first cells are the book's setup cell, in small;
    chapter two's last cell changes NumPy's line width and leaves it so."""
    shutil.copytree(ROOT / "build_tools", root / "build_tools")
    (root / "tests").mkdir()
    for name in ("conftest.py", "book_state.py"):
        shutil.copy(ROOT / "tests" / name, root / "tests" / name)
    (root / "tests" / "test_nothing.py").write_text("def test_nothing():\n    pass\n")
    (root / "_toc.yml").write_text(SMALL_BOOK_TOC)
    (root / "book").mkdir()
    last_cells = {
        "one": "print(np.arange(30))",
        "two": "np.set_printoptions(linewidth=40)\nprint(np.arange(30))",
        "three": "print(np.arange(30))",
    }
    for name, last in last_cells.items():
        (root / "book" / f"{name}.md").write_text(HEADER + f"# {name}\n")
        setup = textwrap.dedent(f"""\
            import numpy as np
            np.set_printoptions(precision=6)  # what load_book(before={name!r}) does
        """)
        notebook = nbformat.v4.new_notebook()
        notebook.cells = [nbformat.v4.new_code_cell(s) for s in (setup, last)]
        nbformat.write(notebook, root / "book" / f"{name}.ipynb")


def test_a_chapter_that_leaves_state_behind_fails_at_the_seam(tmp_path) -> None:
    """The whole check, on a small book: nbval runs each chapter alone (all
    cells pass, since nothing is stored to compare against: --nbval-lax), and
    the seam after chapter two fails, naming what it left behind."""
    _small_book(tmp_path)
    pages = [f"book/{name}.ipynb" for name in ("one", "two", "three")]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for name in ("AUTODIDAX_BOOK_STATE", "PYTEST_ADDOPTS"):
        env.pop(name, None)  # a directory of its own; this run's options only
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q"]
        + ["--nbval-lax", "--nbval-current-env", "tests/test_nothing.py", *pages],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 1, run.stdout + run.stderr
    failed = [line for line in run.stdout.splitlines() if line.startswith("FAILED")]
    assert len(failed) == 1, run.stdout
    assert "three would start differently after two in one kernel" in run.stdout
    assert "numpy.printoptions" in run.stdout
    assert "one would start" not in run.stdout and "two would start" not in run.stdout


@pytest.fixture(autouse=True)
def _keep_directory():
    here = os.getcwd()
    yield
    os.chdir(here)
