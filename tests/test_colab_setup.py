"""The first cell of every chapter that builds on earlier ones: in Colab it
installs the pinned JAX and fetches the module; locally it installs nothing.

The cell is run here for real, with only the outside world replaced: the
Colab marker module, pip (``subprocess.run``), the installed versions, the
download, and whether ``import autodidax`` finds the module.
"""

from __future__ import annotations

import builtins
import importlib.metadata
import re
import subprocess
import sys
import types
import urllib.request
from pathlib import Path

import jupytext
import pytest

import autodidax

REPO_ROOT = Path(__file__).resolve().parent.parent
BOOK = REPO_ROOT / "book"


def pinned(package: str) -> str:
    text = (REPO_ROOT / "requirements.txt").read_text(encoding="utf-8")
    found = re.search(rf"^{package}==(\S+)$", text, re.M)
    assert found, f"{package} is not pinned in requirements.txt"
    return found.group(1)


def setup_cells() -> dict[str, str]:
    """Chapter name -> source of the cell that calls load_chapters."""
    cells = {}
    for md in sorted(BOOK.glob("*.md")):
        if not md.read_text(encoding="utf-8").startswith("---\njupytext:"):
            continue
        notebook = jupytext.read(md)
        for cell in notebook.cells:
            if cell.cell_type == "code" and "load_chapters(" in cell.source:
                cells[md.stem] = cell.source
                break
    return cells


SETUP = setup_cells()
CHAPTERS = sorted(SETUP)


def test_chapters_after_part1_have_the_setup_cell() -> None:
    toc = (REPO_ROOT / "_toc.yml").read_text(encoding="utf-8")
    for md in BOOK.glob("part*.md"):
        if md.stem != "part1_interpreters":
            assert md.stem in SETUP, f"{md.name} has no load_chapters cell"
            assert f"book/{md.stem}" in toc


def test_setup_cells_are_identical_but_for_the_chapter_name() -> None:
    normalized = {
        name: source.replace(f'before="{name}"', 'before="<chapter>"')
        for name, source in SETUP.items()
    }
    first = normalized[CHAPTERS[0]]
    for name in CHAPTERS:
        assert normalized[name] == first, f"{name}'s setup cell differs"
        assert f'before="{name}"' in SETUP[name]


def test_setup_cell_pins_the_jax_of_requirements_txt() -> None:
    source = SETUP[CHAPTERS[0]]
    assert pinned("jax") == pinned("jaxlib")
    assert f'BOOK_JAX = "{pinned("jax")}"' in source


def test_binder_environment_matches_requirements_txt() -> None:
    lines = (REPO_ROOT / "binder" / "requirements.txt").read_text().splitlines()
    pins = [line for line in lines if line and not line.startswith("#")]
    assert {"jax", "jaxlib", "numpy"} <= {p.split("==")[0] for p in pins}
    for pin in pins:
        package, version = pin.split("==")
        assert pinned(package) == version, pin


class FakeWorld:
    """Stand-ins for Colab, pip, the installed versions and the download."""

    def __init__(self, monkeypatch, tmp_path: Path, *, colab: bool, version: str):
        self.pip_calls: list[list[str]] = []
        self.downloads: list[tuple[str, str]] = []
        self.module_found = True
        self.tmp_path = tmp_path
        if colab:
            monkeypatch.setitem(sys.modules, "google.colab", types.ModuleType("x"))
        else:
            monkeypatch.delitem(sys.modules, "google.colab", raising=False)

        def fake_version(package: str) -> str:
            if version == "missing":
                raise importlib.metadata.PackageNotFoundError(package)
            return version

        monkeypatch.setattr(importlib.metadata, "version", fake_version)
        monkeypatch.setattr(subprocess, "run", self.fake_run)
        monkeypatch.setattr(urllib.request, "urlretrieve", self.fake_urlretrieve)
        monkeypatch.setattr(sys, "path", list(sys.path))

    def fake_run(self, cmd, check=False, **kwargs):
        assert check, "a failed pip install must stop the notebook"
        self.pip_calls.append(list(cmd))
        return subprocess.CompletedProcess(cmd, 0)

    def fake_urlretrieve(self, url: str, filename: str):
        self.downloads.append((url, filename))
        self.module_found = True
        return filename, None

    def fake_import(self, name, *args, **kwargs):
        if name == "autodidax" and not self.module_found:
            if ".." in sys.path:
                return autodidax
            raise ImportError("No module named 'autodidax'")
        return builtins.__import__(name, *args, **kwargs)

    def run_cell(self, chapter: str, *, module_installed: bool) -> dict:
        self.module_found = module_installed
        namespace = {
            "__name__": "__main__",
            "__builtins__": {**vars(builtins), "__import__": self.fake_import},
        }
        exec(compile(SETUP[chapter], f"<setup cell of {chapter}>", "exec"), namespace)
        return namespace


@pytest.fixture
def in_book_dir(tmp_path, monkeypatch):
    """A working directory like Colab's: no repository around it."""
    workdir = tmp_path / "content"
    workdir.mkdir()
    monkeypatch.chdir(workdir)
    return workdir


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_fresh_colab_runtime_installs_pinned_jax_and_fetches_module(
    chapter, monkeypatch, in_book_dir, capsys
) -> None:
    world = FakeWorld(monkeypatch, in_book_dir, colab=True, version="0.4.33")
    namespace = world.run_cell(chapter, module_installed=False)
    version = pinned("jax")
    assert len(world.pip_calls) == 1
    cmd = world.pip_calls[0]
    assert cmd[:4] == [sys.executable, "-m", "pip", "install"]
    assert f"jax=={version}" in cmd and f"jaxlib=={version}" in cmd
    assert len(world.downloads) == 1
    url, filename = world.downloads[0]
    assert url.endswith("/main/autodidax.py") and filename == "autodidax.py"
    assert callable(namespace["bind"]) and callable(namespace["jvp"])
    assert capsys.readouterr().out == ""


def test_colab_without_jax_installs_it(monkeypatch, in_book_dir) -> None:
    world = FakeWorld(monkeypatch, in_book_dir, colab=True, version="missing")
    world.run_cell(CHAPTERS[0], module_installed=False)
    assert len(world.pip_calls) == 1


def test_colab_with_the_right_jax_installs_nothing(monkeypatch, in_book_dir) -> None:
    world = FakeWorld(monkeypatch, in_book_dir, colab=True, version=pinned("jax"))
    world.run_cell(CHAPTERS[0], module_installed=False)
    assert world.pip_calls == []
    assert len(world.downloads) == 1


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_locally_nothing_is_installed_or_downloaded(
    chapter, monkeypatch, in_book_dir, capsys
) -> None:
    world = FakeWorld(monkeypatch, in_book_dir, colab=False, version=pinned("jax"))
    namespace = world.run_cell(chapter, module_installed=True)
    assert world.pip_calls == [] and world.downloads == []
    assert capsys.readouterr().out == ""
    assert callable(namespace["bind"])


def test_local_jax_mismatch_is_reported_not_installed(
    monkeypatch, in_book_dir, capsys
) -> None:
    world = FakeWorld(monkeypatch, in_book_dir, colab=False, version="0.4.33")
    world.run_cell(CHAPTERS[0], module_installed=True)
    assert world.pip_calls == []
    out = capsys.readouterr().out
    assert "0.4.33" in out and f"pip install jax=={pinned('jax')}" in out


def test_repository_checkout_uses_its_module(monkeypatch, tmp_path) -> None:
    """Binder, or a clone without `pip install`: the module one level up."""
    book = tmp_path / "book"
    book.mkdir()
    (tmp_path / "autodidax.py").write_text("# the tangled module\n")
    monkeypatch.chdir(book)
    world = FakeWorld(monkeypatch, book, colab=False, version=pinned("jax"))
    namespace = world.run_cell(CHAPTERS[0], module_installed=False)
    assert world.downloads == [] and world.pip_calls == []
    assert sys.path[0] == ".."
    assert callable(namespace["bind"])
