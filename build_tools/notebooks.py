"""Keep each chapter's .ipynb and .py in step with its .md, format and execute.

``sync`` rebuilds the .ipynb and .py from the .md with jupytext, keeping the
outputs of the existing .ipynb for the cells that still match (jupytext's
``--update`` mechanism); ``check_chapter`` reports, without writing anything,
what ``sync`` would change; ``execute_chapter`` runs a chapter in a fresh
kernel and stores outputs with no timing or other run-dependent metadata.

jupytext, nbformat and nbclient are imported inside the functions: this module
must import on a bare Python (see build_tools/__init__.py).
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from build_tools.chapters import Chapter
from build_tools.formatting import FormatError, ruff_format

MYST_FORMAT = "md:myst"
PY_FORMAT = "py:percent"

# Metadata that records how and when a notebook was last run or viewed rather
# than what it contains; stripped so that re-running or re-syncing a chapter
# does not produce a diff. (Cell ids are kept: jupytext preserves them.)
VOLATILE_CELL_METADATA = ("execution", "ExecuteTime", "collapsed", "scrolled")
VOLATILE_NOTEBOOK_METADATA = ("papermill", "widgets", "vscode")

Notebook = Any  # nbformat.NotebookNode; kept loose to avoid importing nbformat

# Cells folded on the site (SPEC 2a) are folded in the notebook too: JupyterLab
# collapses a cell whose metadata has jupyter.source_hidden, Colab shows a cell
# with cellView "form" as its "# @title" line and hides the code.
FOLD_TAGS = ("hide-input", "hide-cell")
TITLE_PREFIX = "# @title "


class NotebookError(RuntimeError):
    """Formatting or executing a chapter failed; the message says where."""


def read_source(chapter: Chapter) -> Notebook:
    """The chapter's notebook as its .md (the source of truth) describes it."""
    import jupytext

    return jupytext.read(chapter.md, fmt=MYST_FORMAT)


def _writes(notebook: Notebook, fmt: str) -> str:
    """Text of ``notebook`` in format ``fmt``, exactly as jupytext.write saves it."""
    import jupytext

    text = jupytext.writes(notebook, fmt=fmt)
    return text if text.endswith("\n") else text + "\n"


def render_py(chapter: Chapter, source: Notebook) -> str:
    """The percent-format script paired with a chapter, formatted by ruff.

    jupytext separates cells by one blank line, where ruff wants two before a
    cell marker that precedes a function; formatting makes the script pass
    ``ruff format --check`` like the rest of the code.
    """
    return ruff_format(
        _writes(source, PY_FORMAT), chapter.root, chapter.rel(chapter.py)
    )


def render_ipynb(notebook: Notebook) -> str:
    """The .ipynb text of a notebook, without volatile metadata."""
    notebook = copy.deepcopy(notebook)
    for key in VOLATILE_NOTEBOOK_METADATA:
        notebook.metadata.pop(key, None)
    for cell in notebook.cells:
        for key in VOLATILE_CELL_METADATA:
            cell.metadata.pop(key, None)
    return _writes(notebook, "ipynb")


def _stable_ids(notebook: Notebook, kept_ids: set[str]) -> None:
    """Give cells that did not inherit an id from the old .ipynb a stable one.

    jupytext's reader gives new cells random ids; deriving them from the
    cell's position and content makes ``sync`` produce the same file on every
    machine.
    """
    used = set(kept_ids)
    for index, cell in enumerate(notebook.cells):
        if cell.get("id") in kept_ids:
            continue
        seed = f"{index}\0{cell.cell_type}\0{cell.source}"
        digest = hashlib.sha256(seed.encode()).hexdigest()
        start = 0
        while digest[start : start + 8] in used:  # practically never loops
            start += 1
        cell["id"] = digest[start : start + 8]
        used.add(cell["id"])


def is_folded(cell: Any) -> bool:
    """True for a code cell that the site shows folded (tagged hide-input/-cell)."""
    tags = cell.metadata.get("tags", [])
    return cell.cell_type == "code" and any(tag in tags for tag in FOLD_TAGS)


def fold_metadata(notebook: Notebook) -> Notebook:
    """Give folded cells the metadata that folds them in JupyterLab and Colab.

    Derived from the tags every time, so that a cell that is no longer folded
    loses it; the .md carries only the tag.
    """
    for cell in notebook.cells:
        if cell.cell_type != "code":
            continue
        jupyter = dict(cell.metadata.get("jupyter", {}))
        jupyter.pop("source_hidden", None)
        cell.metadata.pop("cellView", None)
        if is_folded(cell):
            jupyter["source_hidden"] = True
            cell.metadata["cellView"] = "form"
        if jupyter:
            cell.metadata["jupyter"] = jupyter
        else:
            cell.metadata.pop("jupyter", None)
    return notebook


def untitled_folded_cells(notebook: Notebook) -> list[int]:
    """Indexes (1-based) of folded cells whose first line is not a Colab title."""
    return [
        index
        for index, cell in enumerate(notebook.cells, start=1)
        if is_folded(cell) and not cell.source.startswith(TITLE_PREFIX)
    ]


def synced_ipynb(chapter: Chapter, source: Notebook | None = None) -> Notebook:
    """The .ipynb that ``sync`` writes: the .md's cells, old outputs where they fit."""
    import jupytext
    from jupytext.combine import combine_inputs_with_outputs

    source = read_source(chapter) if source is None else copy.deepcopy(source)
    if not chapter.ipynb.is_file():
        _stable_ids(source, set())
        return fold_metadata(source)
    old = jupytext.read(chapter.ipynb, fmt="ipynb")
    combined = combine_inputs_with_outputs(source, old, fmt=MYST_FORMAT)
    _stable_ids(combined, {cell.get("id") for cell in old.cells})
    return fold_metadata(combined)


def _write_if_changed(path: Path, text: str) -> bool:
    if path.is_file() and path.read_text(encoding="utf-8") == text:
        return False
    path.write_text(text, encoding="utf-8")
    return True


def sync_chapter(chapter: Chapter) -> list[Path]:
    """Regenerate the chapter's .ipynb and .py from its .md; return changed files."""
    source = read_source(chapter)
    changed = []
    if _write_if_changed(chapter.ipynb, render_ipynb(synced_ipynb(chapter, source))):
        changed.append(chapter.ipynb)
    if _write_if_changed(chapter.py, render_py(chapter, source)):
        changed.append(chapter.py)
    return changed


def _cell_inputs(cell: Any) -> tuple[str, str, str]:
    """What ``check`` compares for one cell: its type, source and metadata."""
    metadata = {
        key: value
        for key, value in cell.metadata.items()
        if key not in VOLATILE_CELL_METADATA
    }
    return cell.cell_type, cell.source, json.dumps(metadata, sort_keys=True)


def check_chapter(chapter: Chapter) -> list[str]:
    """Problems that make the chapter's .ipynb or .py differ from its .md."""
    import jupytext

    sync_hint = f"run `python3 build_tools/book.py sync {chapter.rel(chapter.md)}`"
    problems = []
    source = read_source(chapter)

    if not chapter.ipynb.is_file():
        problems.append(f"{chapter.rel(chapter.ipynb)} is missing; {sync_hint}")
    else:
        actual = jupytext.read(chapter.ipynb, fmt="ipynb")
        expected = synced_ipynb(chapter, source)
        actual_cells = [_cell_inputs(cell) for cell in actual.cells]
        expected_cells = [_cell_inputs(cell) for cell in expected.cells]
        if actual_cells != expected_cells:
            problems.append(
                f"{chapter.rel(chapter.ipynb)} is out of sync with "
                f"{chapter.rel(chapter.md)}: "
                f"{_first_difference(actual_cells, expected_cells)}; {sync_hint}"
            )
        for key in ("jupytext", "kernelspec"):
            if actual.metadata.get(key) != expected.metadata.get(key):
                problems.append(
                    f"{chapter.rel(chapter.ipynb)}: notebook metadata '{key}' differs "
                    f"from {chapter.rel(chapter.md)}; {sync_hint}"
                )

    for index in untitled_folded_cells(source):
        problems.append(
            f"{chapter.rel(chapter.md)}: folded code cell {index} must start with a "
            f"'{TITLE_PREFIX}...' line, the title Colab shows in place of its code"
        )

    if not chapter.py.is_file():
        problems.append(f"{chapter.rel(chapter.py)} is missing; {sync_hint}")
    elif chapter.py.read_text(encoding="utf-8") != render_py(chapter, source):
        problems.append(
            f"{chapter.rel(chapter.py)} differs from what {chapter.rel(chapter.md)} "
            f"produces; {sync_hint}"
        )
    return problems


def _first_difference(
    actual: list[tuple[str, str, str]], expected: list[tuple[str, str, str]]
) -> str:
    """Describe the first cell where the .ipynb differs from the .md."""
    for index, (got, want) in enumerate(zip(actual, expected, strict=False)):
        for field, got_value, want_value in zip(
            ("type", "source", "metadata/tags"), got, want, strict=True
        ):
            if got_value != want_value:
                return f"cell {index + 1} {field} differs"
    return f"it has {len(actual)} cells, the .md has {len(expected)}"


def format_chapter(chapter: Chapter) -> bool:
    """Format the code cells of the chapter's .md with ruff; True if it changed.

    The cells go through ``ruff format`` as a notebook (not as a script), so
    ruff keeps IPython magics and the trailing semicolons that hide a cell's
    output, and formats each cell on its own. Markdown cells keep their text;
    jupytext writes the file back in its canonical form (which may restyle the
    YAML of code-cell options once).
    """
    import jupytext

    original = chapter.md.read_text(encoding="utf-8")
    notebook = jupytext.reads(original, fmt=MYST_FORMAT)
    try:
        formatted_json = ruff_format(
            _writes(notebook, "ipynb"), chapter.root, chapter.rel(chapter.ipynb)
        )
    except FormatError as error:
        raise NotebookError(
            f"ruff could not format the code cells of {chapter.rel(chapter.md)}: "
            f"{error}"
        ) from error
    formatted = jupytext.reads(formatted_json, fmt="ipynb")
    for cell, formatted_cell in zip(notebook.cells, formatted.cells, strict=True):
        if cell.cell_type == "code":
            cell.source = formatted_cell.source
    # The author's file: never overwrite an edit saved while ruff was running.
    if chapter.md.read_text(encoding="utf-8") != original:
        raise NotebookError(
            f"{chapter.rel(chapter.md)} changed while it was being formatted; "
            "run the command again"
        )
    return _write_if_changed(chapter.md, _writes(notebook, MYST_FORMAT))


@contextlib.contextmanager
def _module_path(root: Path) -> Iterator[None]:
    """Put the repository root first on PYTHONPATH for kernels started inside.

    Chapters import the freshly tangled autodidax.py; this makes sure that the
    kernel finds it even before ``install`` has been run.
    """
    saved = os.environ.get("PYTHONPATH")
    parts = [str(root)] + ([saved] if saved else [])
    os.environ["PYTHONPATH"] = os.pathsep.join(parts)
    try:
        yield
    finally:
        if saved is None:
            del os.environ["PYTHONPATH"]
        else:
            os.environ["PYTHONPATH"] = saved


def execute_chapter(chapter: Chapter, timeout: int = 600) -> None:
    """Run the chapter's .ipynb top to bottom in a fresh kernel and store outputs.

    The kernel's working directory is book/, as for nbval and the site. Cells
    run with the .ipynb's own inputs: ``sync`` first if the .md changed.
    """
    import jupytext
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError

    notebook = jupytext.read(chapter.ipynb, fmt="ipynb")
    kernel_name = notebook.metadata.get("kernelspec", {}).get("name", "python3")
    client = NotebookClient(
        notebook,
        timeout=timeout,
        kernel_name=kernel_name,
        record_timing=False,  # no per-cell timestamps in the stored notebook
        resources={"metadata": {"path": str(chapter.md.parent)}},
    )
    try:
        with _module_path(chapter.root):
            client.execute()
    except CellExecutionError as error:
        raise NotebookError(
            f"executing {chapter.rel(chapter.ipynb)} failed:\n{error}"
        ) from error
    _write_if_changed(chapter.ipynb, render_ipynb(notebook))
