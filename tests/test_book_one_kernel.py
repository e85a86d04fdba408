"""Reading the whole book in one kernel prints what each chapter prints alone.

nbval runs every chapter notebook in a fresh kernel of its own and compares the
outputs with the stored ones. This test runs all chapters, in table-of-contents
order, one after another in a single kernel (as a reader going through the book
in one Jupyter session would) and compares each cell's printed output with the
stored output of the same cell.
"""

from __future__ import annotations

from pathlib import Path

import nbformat
from nbclient import NotebookClient

from build_tools.chapters import find_chapters

ROOT = Path(__file__).resolve().parent.parent


def _text_output(cell: nbformat.NotebookNode) -> str:
    """The text a cell shows: streams and text results (SVG for figures), joined.

    Joined, because a kernel may split one printed text into several stream
    messages differently from run to run.
    """
    texts = []
    for output in cell.get("outputs", []):
        if output["output_type"] == "stream":
            texts.append(output["text"])
        elif "data" in output:
            data = output["data"]
            texts.append(data.get("image/svg+xml") or data.get("text/plain", ""))
    return "".join("".join(t) if isinstance(t, list) else t for t in texts)


def test_all_chapters_in_one_kernel_print_the_stored_outputs() -> None:
    chapters = find_chapters(ROOT)
    assert chapters, "the book has no chapters"
    stored = [nbformat.read(ch.ipynb, as_version=4) for ch in chapters]

    combined = nbformat.v4.new_notebook(metadata=stored[0].metadata)
    origin = []  # (chapter name, cell) for every code cell of the combined book
    for chapter, notebook in zip(chapters, stored, strict=True):
        for cell in notebook.cells:
            if cell.cell_type == "code":
                fresh = nbformat.v4.new_code_cell(cell.source)
                combined.cells.append(fresh)
                origin.append((chapter.name, cell))

    client = NotebookClient(
        combined,
        timeout=600,
        kernel_name="python3",
        resources={"metadata": {"path": str(ROOT / "book")}},
    )
    client.execute()

    for fresh, (name, cell) in zip(combined.cells, origin, strict=True):
        assert _text_output(fresh) == _text_output(cell), (
            f"{name}: a cell prints differently when the chapters share a "
            f"kernel:\n{cell.source}"
        )
