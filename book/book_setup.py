"""The first cell of every chapter: the right JAX, the module, earlier chapters.

Not part of the library (nothing here is tangled into ``autodidax.py``). A
chapter's folded first cell fetches this file when it is missing (Colab opens
a notebook on its own) and calls ``load_book``:

- in Colab, where ``google.colab`` is imported, it installs the JAX release
  the book is tested with when the runtime has another one; elsewhere it only
  says which release to install;
- it imports ``autodidax``: installed, from the repository checkout around the
  notebook (Binder, a clone), or downloaded next to the notebook;
- it fetches ``figures.py``, the pages' drawing code, when it is missing;
- it gives the notebook ``show_error``, which the pages use to print an
  error message instead of stopping;
- it runs the library code of the chapters before this one in the notebook's
  own namespace (``autodidax.load_chapters``), so that a chapter which
  replaces a function changes the earlier code that calls it, as when the
  whole book runs in one kernel;
- for a chapter that runs on several devices (Part 9), it asks XLA for that
  many CPU devices before JAX starts, or says what to do if JAX has already
  started with fewer.

Part 1 needs only NumPy: for it, nothing is installed or imported.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import os
import subprocess
import sys
import textwrap
import urllib.request
from pathlib import Path
from types import ModuleType

BOOK_JAX = "0.10.2"  # the JAX and jaxlib release this book is tested with
BOOK_URL = "https://raw.githubusercontent.com/autodidax-book/autodidax/main/"
FIRST_CHAPTER = "part1_interpreters"
HOST_DEVICES = {"part9_named_axes": 8, "part12_capstone": 8}  # several devices
DEVICE_FLAG = "--xla_force_host_platform_device_count"


def installed_version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def ensure_jax() -> None:
    """Install the book's JAX in Colab; elsewhere, say if another one is found."""
    found = {installed_version("jax"), installed_version("jaxlib")}
    if found == {BOOK_JAX}:
        return
    if "google.colab" in sys.modules:
        pins = [f"jax=={BOOK_JAX}", f"jaxlib=={BOOK_JAX}"]
        pip = [sys.executable, "-m", "pip", "install", "-q", *pins]
        subprocess.run(pip, check=True)
    else:
        print(
            f"This book is tested with jax and jaxlib {BOOK_JAX}; found {found}. "
            f"To match: pip install jax=={BOOK_JAX} jaxlib=={BOOK_JAX}"
        )


def fetch_if_missing(name: str, url_path: str) -> None:
    """Download ``url_path`` of the book's repository as ``name``, unless present."""
    if not Path(name).is_file():
        urllib.request.urlretrieve(BOOK_URL + url_path, name)


def import_autodidax() -> ModuleType:
    """The module: installed, in the checkout around book/, or downloaded here."""
    try:
        return importlib.import_module("autodidax")
    except ImportError:
        pass
    if Path("../autodidax.py").is_file():  # a checkout of the repository
        sys.path.insert(0, "..")
    else:  # e.g. Colab: fetch the module this book builds
        fetch_if_missing("autodidax.py", "autodidax.py")
        if "" not in sys.path and "." not in sys.path:
            sys.path.insert(0, ".")
    importlib.invalidate_caches()
    return importlib.import_module("autodidax")


def show_error(fn, *args) -> None:
    """Call ``fn(*args)`` and print the error it raises, instead of stopping."""
    try:
        fn(*args)
    except Exception as e:
        print(textwrap.fill(f"{type(e).__name__}: {e}", 80, subsequent_indent="  "))


def jax_backend_started() -> bool:
    """Has JAX created its devices yet? (Importing jax alone does not.)"""
    if "jax" not in sys.modules:
        return False
    from jax._src import xla_bridge  # no public API says this

    started = getattr(xla_bridge, "backends_are_initialized", None)
    return started() if started else bool(getattr(xla_bridge, "_backends", {}))


def use_host_devices(count: int) -> None:
    """Ask XLA for ``count`` CPU devices; this works only before JAX starts
    its backend, so if it has started with fewer, say how to start afresh."""
    if jax_backend_started():
        import jax

        found = jax.local_device_count("cpu")
        if found < count:
            print(
                f"This chapter runs on {count} devices, but JAX has already "
                f"started with {found}, and the number is fixed once it starts. "
                "Restart the runtime (Colab: Runtime > Restart session; "
                "Jupyter: Kernel > Restart) and run this chapter first."
            )
        return
    flags = os.environ.get("XLA_FLAGS", "")
    if DEVICE_FLAG not in flags:
        os.environ["XLA_FLAGS"] = f"{flags} {DEVICE_FLAG}={count}".strip()


def load_book(namespace: dict, *, before: str) -> None:
    """Prepare a chapter notebook (returns nothing, so the cell shows nothing)."""
    if before in HOST_DEVICES:
        use_host_devices(HOST_DEVICES[before])
    fetch_if_missing("figures.py", "book/figures.py")
    namespace["show_error"] = show_error  # the pages' demos of error messages
    if before == FIRST_CHAPTER:
        import numpy as np

        namespace["np"] = np
        np.set_printoptions(precision=6, suppress=True)
        return
    ensure_jax()
    autodidax = import_autodidax()
    autodidax.load_chapters(namespace, before=before)
    namespace["np"].set_printoptions(precision=6, suppress=True)
