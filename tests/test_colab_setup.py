"""The first cell of every chapter: in Colab it installs the pinned JAX and
fetches what the notebook needs; locally it installs and fetches nothing.

The cell is run here for real (with book/book_setup.py behind it), with only
the outside world replaced: the Colab marker module, pip (``subprocess.run``),
the installed versions, the downloads, and whether ``autodidax`` imports.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import os
import re
import shutil
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
FIRST = "part1_interpreters"


def pinned(package: str) -> str:
    text = (REPO_ROOT / "requirements.txt").read_text(encoding="utf-8")
    found = re.search(rf"^{package}==(\S+)$", text, re.M)
    assert found, f"{package} is not pinned in requirements.txt"
    return found.group(1)


def setup_cells() -> dict[str, tuple[int, str]]:
    """Chapter name -> (index among code cells, source) of its setup cell."""
    cells = {}
    for md in sorted(BOOK.glob("*.md")):
        if not md.read_text(encoding="utf-8").startswith("---\njupytext:"):
            continue
        notebook = jupytext.read(md)
        code = [cell for cell in notebook.cells if cell.cell_type == "code"]
        for index, cell in enumerate(code):
            if "book_setup.load_book(" in cell.source:
                cells[md.stem] = (index, cell.source)
                break
    return cells


SETUP = setup_cells()
CHAPTERS = sorted(SETUP)
LATER = [name for name in CHAPTERS if name != FIRST]


def test_every_chapter_starts_with_the_setup_cell() -> None:
    toc = (REPO_ROOT / "_toc.yml").read_text(encoding="utf-8")
    chapters = re.findall(r"file: book/(\S+)", toc)
    for name in chapters:
        md = BOOK / f"{name}.md"
        if md.read_text(encoding="utf-8").startswith("---\njupytext:"):
            assert name in SETUP, f"{md.name} has no setup cell"
            assert SETUP[name][0] == 0, f"{md.name}: the setup cell is not first"


def test_setup_cells_are_identical_but_for_the_chapter_name() -> None:
    normalized = {
        name: source.replace(f'before="{name}"', 'before="<chapter>"')
        for name, (_, source) in SETUP.items()
    }
    first = normalized[CHAPTERS[0]]
    for name in CHAPTERS:
        assert normalized[name] == first, f"{name}'s setup cell differs"
        assert f'before="{name}"' in SETUP[name][1]


def test_setup_pins_the_jax_of_requirements_txt() -> None:
    source = (BOOK / "book_setup.py").read_text(encoding="utf-8")
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
    """Stand-ins for Colab, pip, the installed versions and the downloads."""

    def __init__(self, monkeypatch, workdir: Path, *, colab: bool, version: str):
        self.pip_calls: list[list[str]] = []
        self.downloads: list[tuple[str, str]] = []
        self.module_found = True
        self.workdir = workdir
        if colab:
            monkeypatch.setitem(sys.modules, "google.colab", types.ModuleType("x"))
        else:
            monkeypatch.delitem(sys.modules, "google.colab", raising=False)

        def fake_version(package: str) -> str:
            if version == "missing":
                raise importlib.metadata.PackageNotFoundError(package)
            return version

        real_import_module = importlib.import_module

        def fake_import_module(name: str, *args, **kwargs):
            if name == "autodidax":
                if self.module_found or ".." in sys.path:
                    return autodidax
                raise ImportError("No module named 'autodidax'")
            return real_import_module(name, *args, **kwargs)

        monkeypatch.setattr(importlib.metadata, "version", fake_version)
        monkeypatch.setattr(importlib, "import_module", fake_import_module)
        monkeypatch.setattr(subprocess, "run", self.fake_run)
        monkeypatch.setattr(urllib.request, "urlretrieve", self.fake_urlretrieve)
        monkeypatch.setattr(sys, "path", [str(workdir), *sys.path])
        monkeypatch.delitem(sys.modules, "book_setup", raising=False)

    def fake_run(self, cmd, check=False, **kwargs):
        assert check, "a failed pip install must stop the notebook"
        self.pip_calls.append(list(cmd))
        return subprocess.CompletedProcess(cmd, 0)

    def fake_urlretrieve(self, url: str, filename: str):
        self.downloads.append((url, filename))
        if filename == "book_setup.py":  # the real helper, as if downloaded
            shutil.copy(BOOK / "book_setup.py", self.workdir / filename)
        if filename == "autodidax.py":
            self.module_found = True
        return filename, None

    def run_cell(self, chapter: str, *, module_installed: bool) -> dict:
        self.module_found = module_installed
        namespace = {"__name__": "__main__"}
        code = compile(SETUP[chapter][1], f"<setup cell of {chapter}>", "exec")
        exec(code, namespace)
        return namespace

    def fetched(self) -> set[str]:
        return {filename for _, filename in self.downloads}


@pytest.fixture
def in_colab_dir(tmp_path, monkeypatch):
    """A working directory like Colab's: the notebook alone, no repository."""
    workdir = tmp_path / "content"
    workdir.mkdir()
    monkeypatch.chdir(workdir)
    return workdir


@pytest.mark.parametrize("chapter", LATER)
def test_fresh_colab_runtime_installs_pinned_jax_and_fetches_module(
    chapter, monkeypatch, in_colab_dir, capsys
) -> None:
    world = FakeWorld(monkeypatch, in_colab_dir, colab=True, version="0.4.33")
    namespace = world.run_cell(chapter, module_installed=False)
    version = pinned("jax")
    assert len(world.pip_calls) == 1
    cmd = world.pip_calls[0]
    assert cmd[:4] == [sys.executable, "-m", "pip", "install"]
    assert f"jax=={version}" in cmd and f"jaxlib=={version}" in cmd
    assert world.fetched() == {"book_setup.py", "figures.py", "autodidax.py"}
    urls = dict((name, url) for url, name in world.downloads)
    assert urls["autodidax.py"].endswith("/main/autodidax.py")
    assert urls["figures.py"].endswith("/main/book/figures.py")
    assert urls["book_setup.py"].endswith("/main/book/book_setup.py")
    assert callable(namespace["bind"]) and callable(namespace["jvp"])
    assert capsys.readouterr().out == ""


def test_part1_in_colab_needs_no_jax_and_no_module(monkeypatch, in_colab_dir) -> None:
    world = FakeWorld(monkeypatch, in_colab_dir, colab=True, version="missing")
    namespace = world.run_cell(FIRST, module_installed=False)
    assert world.pip_calls == []
    assert world.fetched() == {"book_setup.py", "figures.py"}
    assert namespace["np"].get_printoptions()["precision"] == 6
    assert "bind" not in namespace
    namespace["show_error"](lambda: 1 / 0)  # the pages' error printer is there


def test_colab_without_jax_installs_it(monkeypatch, in_colab_dir) -> None:
    world = FakeWorld(monkeypatch, in_colab_dir, colab=True, version="missing")
    world.run_cell(LATER[0], module_installed=False)
    assert len(world.pip_calls) == 1


def test_colab_with_the_right_jax_installs_nothing(monkeypatch, in_colab_dir) -> None:
    world = FakeWorld(monkeypatch, in_colab_dir, colab=True, version=pinned("jax"))
    world.run_cell(LATER[0], module_installed=False)
    assert world.pip_calls == []
    assert "autodidax.py" in world.fetched()


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_in_the_book_directory_nothing_is_installed_or_downloaded(
    chapter, monkeypatch, capsys
) -> None:
    monkeypatch.chdir(BOOK)
    world = FakeWorld(monkeypatch, BOOK, colab=False, version=pinned("jax"))
    namespace = world.run_cell(chapter, module_installed=True)
    assert world.pip_calls == [] and world.downloads == []
    assert capsys.readouterr().out == ""
    assert callable(namespace.get("bind", print)) and "np" in namespace


def test_local_jax_mismatch_is_reported_not_installed(
    monkeypatch, in_colab_dir, capsys
) -> None:
    world = FakeWorld(monkeypatch, in_colab_dir, colab=False, version="0.4.33")
    world.run_cell(LATER[0], module_installed=True)
    assert world.pip_calls == []
    out = capsys.readouterr().out
    assert "0.4.33" in out and f"pip install jax=={pinned('jax')}" in out


def test_repository_checkout_uses_its_module(monkeypatch, tmp_path) -> None:
    """Binder, or a clone without `pip install`: the module one level up."""
    book = tmp_path / "book"
    book.mkdir()
    for name in ("book_setup.py", "figures.py"):
        shutil.copy(BOOK / name, book / name)
    (tmp_path / "autodidax.py").write_text("# the tangled module\n")
    monkeypatch.chdir(book)
    world = FakeWorld(monkeypatch, book, colab=False, version=pinned("jax"))
    namespace = world.run_cell(LATER[0], module_installed=False)
    assert world.downloads == [] and world.pip_calls == []
    assert sys.path[0] == ".."
    assert callable(namespace["bind"])


def load_book_setup(monkeypatch) -> types.ModuleType:
    monkeypatch.syspath_prepend(str(BOOK))
    monkeypatch.delitem(sys.modules, "book_setup", raising=False)
    return importlib.import_module("book_setup")


def test_part9_asks_xla_for_host_devices_before_jax_starts(monkeypatch) -> None:
    book_setup = load_book_setup(monkeypatch)
    assert book_setup.HOST_DEVICES == {"part9_named_axes": 8, "part12_capstone": 8}
    monkeypatch.setattr(book_setup, "jax_backend_started", lambda: False)
    flag = "--xla_force_host_platform_device_count"
    monkeypatch.delenv("XLA_FLAGS", raising=False)
    book_setup.use_host_devices(8)
    assert os.environ["XLA_FLAGS"] == f"{flag}=8"
    monkeypatch.setenv("XLA_FLAGS", "--xla_cpu_enable_fast_math=false")
    book_setup.use_host_devices(8)  # other flags are kept
    assert os.environ["XLA_FLAGS"].split() == [
        "--xla_cpu_enable_fast_math=false",
        f"{flag}=8",
    ]
    monkeypatch.setenv("XLA_FLAGS", f"{flag}=4")
    book_setup.use_host_devices(8)  # the user's own choice is left alone
    assert os.environ["XLA_FLAGS"] == f"{flag}=4"


def test_part9_says_to_restart_when_jax_started_with_fewer_devices(
    monkeypatch, capsys
) -> None:
    import jax

    book_setup = load_book_setup(monkeypatch)
    monkeypatch.setattr(book_setup, "jax_backend_started", lambda: True)
    monkeypatch.setattr(jax, "local_device_count", lambda backend=None: 1)
    monkeypatch.setenv("XLA_FLAGS", "")
    book_setup.use_host_devices(8)
    out = capsys.readouterr().out
    assert "8 devices" in out and "started with 1" in out and "Restart" in out
    assert os.environ["XLA_FLAGS"] == ""  # too late to change
    monkeypatch.setattr(jax, "local_device_count", lambda backend=None: 8)
    book_setup.use_host_devices(8)
    assert capsys.readouterr().out == ""
