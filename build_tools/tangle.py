"""Tangle the chapters' export-tagged code cells into ``autodidax.py``.

The module is: a header docstring, then for each chapter in ``_toc.yml`` order
a marker line ``# ==== chapter: <name> ====`` followed by that chapter's code
cells tagged ``export``, in order. Later definitions replace earlier ones, as
when the chapters run one after another in a single kernel. The result is
passed through ``ruff format`` so that it is deterministic.
"""

from __future__ import annotations

from pathlib import Path

from build_tools.chapters import Chapter, find_chapters
from build_tools.formatting import ruff_format
from build_tools.notebooks import read_source

MODULE_FILE = "autodidax.py"
EXPORT_TAG = "export"

HEADER = '''\
"""Autodidax: a small JAX core built from scratch.

GENERATED FILE: do not edit it by hand. It is tangled from the code cells
tagged ``export`` in the book's chapters (book/*.md, in _toc.yml order) by
build_tools/tangle.py. To change it, edit a chapter and regenerate it with

    python3 build_tools/book.py tangle

or, to also resync and re-execute the chapter's notebook,

    python3 build_tools/book.py refresh book/<chapter>.md
"""
'''


class TangleError(ValueError):
    """An export cell cannot go into the module; the message says which one."""


def marker(chapter: Chapter) -> str:
    """The comment line that opens a chapter's section of the module."""
    return f"# ==== chapter: {chapter.name} ===="


def exported_cells(chapter: Chapter) -> list[str]:
    """The sources of the chapter's code cells tagged ``export``, in order.

    Raises TangleError for an IPython magic or shell escape (a line starting
    with ``%`` or ``!``), which plain Python cannot import, and for any other
    syntax error.
    """
    sources = []
    code_cell_number = 0
    for cell in read_source(chapter).cells:
        if cell.cell_type != "code":
            continue
        code_cell_number += 1
        if EXPORT_TAG not in cell.metadata.get("tags", []):
            continue
        where = f"{chapter.rel(chapter.md)}, code cell {code_cell_number}"
        for line in cell.source.splitlines():
            if line.startswith(("%", "!")):
                raise TangleError(
                    f"{where} is tagged '{EXPORT_TAG}' but uses the IPython magic "
                    f"{line!r}; export cells must be plain Python (move the magic "
                    "to a cell without the tag)"
                )
        try:
            compile(cell.source, where, "exec")
        except SyntaxError as error:
            raise TangleError(
                f"{where} is tagged '{EXPORT_TAG}' but is not valid Python: {error}"
            ) from error
        sources.append(cell.source.strip("\n"))
    return sources


def tangle_unformatted(root: Path) -> str:
    """The module text before ``ruff format``."""
    parts = [HEADER]
    for chapter in find_chapters(root):
        parts.append(marker(chapter))
        parts.extend(exported_cells(chapter))
    return "\n\n".join(part.strip("\n") for part in parts) + "\n"


def tangle(root: Path) -> str:
    """The text of ``autodidax.py`` as the chapters define it."""
    return ruff_format(tangle_unformatted(root), root, MODULE_FILE)


def write_module(root: Path) -> bool:
    """Write ``autodidax.py``; return True if its content changed."""
    text = tangle(root)
    path = root / MODULE_FILE
    if path.is_file() and path.read_text(encoding="utf-8") == text:
        return False
    path.write_text(text, encoding="utf-8")
    return True


def check_module(root: Path) -> list[str]:
    """Problems if ``autodidax.py`` is missing or differs from a fresh tangle."""
    path = root / MODULE_FILE
    hint = "run `python3 build_tools/book.py tangle`"
    if not path.is_file():
        return [f"{MODULE_FILE} is missing; {hint}"]
    if path.read_text(encoding="utf-8") != tangle(root):
        return [
            f"{MODULE_FILE} differs from a fresh tangle of the chapters "
            f"(edited by hand, or a chapter changed since); {hint}"
        ]
    return []
