"""Tests of the book tooling (build_tools/) on small fake books in a temp dir."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from build_tools.chapters import ChapterError, find_chapters, select_chapters
from build_tools.check import check_repo
from build_tools.notebooks import execute_chapter, format_chapter, sync_chapter
from build_tools.tangle import (
    MODULE_FILE,
    TangleError,
    exported_cells,
    tangle,
    write_module,
)

REPO_ROOT = Path(__file__).resolve().parent.parent

JUPYTEXT_HEADER = """\
---
jupytext:
  formats: ipynb,md:myst,py:percent
  text_representation:
    extension: .md
    format_name: myst
    format_version: 0.13
    jupytext_version: 1.19.6
kernelspec:
  display_name: Python 3
  language: python
  name: python3
---
"""


def code(source: str, *tags: str) -> str:
    """A MyST code cell, with ``:tags:`` if any are given."""
    options = f":tags: [{', '.join(tags)}]\n\n" if tags else ""
    return f"```{{code-cell}} ipython3\n{options}{source.strip()}\n```"


def write_book(root: Path, chapters: dict[str, list[str]]) -> Path:
    """Write a fake book: _toc.yml, a plain page and book/<name>.md per chapter.

    ``chapters`` maps names to cells (markdown text or ``code(...)``); the toc
    lists the plain page book/intro.md first, then the chapters in dict order.
    """
    book = root / "book"
    book.mkdir(parents=True, exist_ok=True)
    toc = ["format: jb-book", "root: book/intro", "parts:", "  - caption: Part"]
    toc += ["    chapters:", *(f"      - file: book/{name}" for name in chapters)]
    (root / "_toc.yml").write_text("\n".join(toc) + "\n")
    (book / "intro.md").write_text("# Intro\n\nA plain page.\n")
    for name, cells in chapters.items():
        body = "\n\n".join(["# " + name, *cells])
        (book / f"{name}.md").write_text(JUPYTEXT_HEADER + "\n" + body + "\n")
    return root


def sync_all(root: Path) -> None:
    for chapter in find_chapters(root):
        sync_chapter(chapter)
    write_module(root)


# ------------------------------------------------------------------ tangling


def test_only_export_cells_are_tangled_in_toc_order(tmp_path: Path) -> None:
    # Toc order (zeta before alpha) differs from alphabetical order on purpose.
    write_book(
        tmp_path,
        {
            "zeta": [code("A = 1", "export"), code("print('demo z')")],
            "alpha": [
                "Some prose.",
                code("B = A + 1", "export", "hide-input"),
                code("B"),
                code("C = 3", "export"),
            ],
        },
    )
    text = tangle(tmp_path)
    assert '"""' in text.splitlines()[0] and "GENERATED" in text
    body = text[text.index("# ==== chapter:") : text.index("# ==== book support")]
    expected = (
        "# ==== chapter: zeta ====\n\nA = 1\n\n"
        "# ==== chapter: alpha ====\n\nB = A + 1\n\nC = 3\n\n"
    )
    assert body == expected
    assert "demo" not in text
    assert "# ==== chapter: intro" not in text  # a plain page is not a chapter


def test_plain_pages_are_not_chapters(tmp_path: Path) -> None:
    write_book(tmp_path, {"ch": [code("X = 1", "export")]})
    assert [chapter.name for chapter in find_chapters(tmp_path)] == ["ch"]


def test_later_definition_wins(tmp_path: Path) -> None:
    write_book(
        tmp_path,
        {
            "one": [code("def f():\n    return 'first'", "export")],
            "two": [code("def f():\n    return 'second'", "export")],
        },
    )
    namespace: dict[str, object] = {}
    exec(compile(tangle(tmp_path), MODULE_FILE, "exec"), namespace)
    assert namespace["f"]() == "second"  # type: ignore[operator]


def test_tangle_output_is_ruff_formatted(tmp_path: Path) -> None:
    write_book(tmp_path, {"ch": [code("x=[1,2,\n3]", "export")]})
    assert "x = [1, 2, 3]\n" in tangle(tmp_path)


@pytest.mark.parametrize("magic", ["%time y = 1", "!pip install numpy", "%%timeit"])
def test_magic_in_export_cell_raises(tmp_path: Path, magic: str) -> None:
    write_book(tmp_path, {"ch": [code("x = 1", "export"), code(magic, "export")]})
    with pytest.raises(TangleError, match=r"book/ch\.md, code cell 2.*magic"):
        tangle(tmp_path)


def test_magic_in_demo_cell_is_fine(tmp_path: Path) -> None:
    write_book(
        tmp_path, {"ch": [code("%pip install -q numpy"), code("x = 1", "export")]}
    )
    (chapter,) = find_chapters(tmp_path)
    assert exported_cells(chapter) == ["x = 1"]


def test_syntax_error_in_export_cell_raises(tmp_path: Path) -> None:
    write_book(tmp_path, {"ch": [code("def f(:\n    pass", "export")]})
    with pytest.raises(TangleError, match="not valid Python"):
        tangle(tmp_path)


# ---------------------------------------------------------------- sync/check


def test_sync_then_check_is_clean_and_idempotent(tmp_path: Path) -> None:
    write_book(tmp_path, {"ch": [code("x = 1", "export"), code("x + 1")]})
    sync_all(tmp_path)
    assert check_repo(tmp_path) == []
    (chapter,) = find_chapters(tmp_path)
    before = chapter.ipynb.read_text()
    assert sync_chapter(chapter) == []  # nothing to rewrite
    assert chapter.ipynb.read_text() == before


def test_check_reports_missing_generated_files(tmp_path: Path) -> None:
    write_book(tmp_path, {"ch": [code("x = 1", "export")]})
    problems = "\n".join(check_repo(tmp_path))
    assert "book/ch.ipynb is missing" in problems
    assert "book/ch.py is missing" in problems
    assert f"{MODULE_FILE} is missing" in problems


def test_check_detects_out_of_sync_notebook(tmp_path: Path) -> None:
    write_book(tmp_path, {"ch": [code("x = 1", "export"), code("x + 1")]})
    sync_all(tmp_path)
    md = tmp_path / "book" / "ch.md"
    md.write_text(md.read_text().replace("x + 1", "x + 2"))
    problems = check_repo(tmp_path)
    assert any(
        p.startswith("book/ch.ipynb is out of sync") and "cell 3 source" in p
        for p in problems
    ), problems
    assert any(p.startswith("book/ch.py differs") for p in problems), problems


def test_check_detects_changed_tags(tmp_path: Path) -> None:
    write_book(tmp_path, {"ch": [code("x = 1", "export"), code("y = 2")]})
    sync_all(tmp_path)
    md = tmp_path / "book" / "ch.md"
    md.write_text(md.read_text().replace("y = 2", ":tags: [hide-input]\n\ny = 2"))
    problems = check_repo(tmp_path)
    assert any("ch.ipynb" in p and "metadata/tags" in p for p in problems), problems


def test_check_detects_removed_export_tag(tmp_path: Path) -> None:
    write_book(tmp_path, {"ch": [code("# @title x\nx = 1", "export", "hide-input")]})
    sync_all(tmp_path)
    md = tmp_path / "book" / "ch.md"
    md.write_text(md.read_text().replace("[export, hide-input]", "[hide-input]"))
    problems = check_repo(tmp_path)
    assert any("ch.ipynb" in p and "metadata/tags" in p for p in problems), problems
    assert any(p.startswith(f"{MODULE_FILE} differs") for p in problems), problems


def test_folded_cells_fold_in_jupyterlab_and_colab(tmp_path: Path) -> None:
    folded = code("# @title Set x\nx = 1", "export", "hide-input")
    write_book(tmp_path, {"ch": [folded, code("x + 1")]})
    sync_all(tmp_path)
    assert check_repo(tmp_path) == []
    (chapter,) = find_chapters(tmp_path)
    cells = json.loads(chapter.ipynb.read_text())["cells"]
    hidden, shown = (cell for cell in cells if cell["cell_type"] == "code")
    assert hidden["metadata"]["jupyter"] == {"source_hidden": True}
    assert hidden["metadata"]["cellView"] == "form"
    assert "jupyter" not in shown["metadata"] and "cellView" not in shown["metadata"]
    # Unfolding the cell in the .md takes the metadata away again.
    md = chapter.md
    md.write_text(md.read_text().replace("[export, hide-input]", "[export]"))
    sync_chapter(chapter)
    cells = json.loads(chapter.ipynb.read_text())["cells"]
    assert all("cellView" not in cell["metadata"] for cell in cells)
    assert all("jupyter" not in cell["metadata"] for cell in cells)


def test_check_requires_a_colab_title_on_folded_cells(tmp_path: Path) -> None:
    write_book(tmp_path, {"ch": [code("x = 1", "hide-input")]})
    sync_all(tmp_path)
    problems = check_repo(tmp_path)
    assert any(
        "book/ch.md: folded code cell 2 must start with a '# @title" in p
        for p in problems
    ), problems


def test_generated_script_passes_ruff_format_check(tmp_path: Path) -> None:
    cells = ["Prose.", code("def f(x):\n    return x", "export"), "More.", code("f(1)")]
    write_book(tmp_path, {"ch": cells})
    sync_all(tmp_path)
    result = subprocess.run(
        [sys.executable, "-m", "ruff", "format", "--check", "book/ch.py"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_check_detects_stale_module(tmp_path: Path) -> None:
    write_book(tmp_path, {"ch": [code("x = 1", "export")]})
    sync_all(tmp_path)
    module = tmp_path / MODULE_FILE
    module.write_text(module.read_text() + "\nhand_edit = True\n")
    assert any(p.startswith(f"{MODULE_FILE} differs") for p in check_repo(tmp_path))


def test_check_detects_module_behind_its_chapter(tmp_path: Path) -> None:
    write_book(tmp_path, {"ch": [code("x = 1", "export")]})
    sync_all(tmp_path)
    md = tmp_path / "book" / "ch.md"
    md.write_text(md.read_text().replace("x = 1", "x = 2"))
    (chapter,) = find_chapters(tmp_path)
    sync_chapter(chapter)  # notebooks in sync, module not re-tangled
    assert check_repo(tmp_path) == [
        f"{MODULE_FILE} differs from a fresh tangle of the chapters (edited by "
        "hand, or a chapter changed since); run `python3 build_tools/book.py tangle`"
    ]


def test_check_changes_no_file(tmp_path: Path) -> None:
    write_book(tmp_path, {"ch": [code("x = 1", "export")]})
    sync_all(tmp_path)
    (tmp_path / "book" / "ch.md").write_text(
        (tmp_path / "book" / "ch.md").read_text() + "\nMore prose.\n"
    )
    snapshot = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    assert check_repo(tmp_path)
    assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == snapshot


def test_sync_keeps_outputs_of_unchanged_cells(tmp_path: Path) -> None:
    write_book(tmp_path, {"ch": [code("x = 1", "export"), code("x + 1"), code("x")]})
    (chapter,) = find_chapters(tmp_path)
    sync_chapter(chapter)
    notebook = json.loads(chapter.ipynb.read_text())
    output = {"output_type": "stream", "name": "stdout", "text": ["stored\n"]}
    for cell in notebook["cells"]:
        if cell["cell_type"] == "code":
            cell["outputs"] = [output]
            cell["metadata"]["execution"] = {"iopub.status.idle": "2026-01-01"}
    chapter.ipynb.write_text(json.dumps(notebook))
    chapter.md.write_text(chapter.md.read_text().replace("x + 1", "x + 10"))
    sync_chapter(chapter)
    cells = json.loads(chapter.ipynb.read_text())["cells"]
    code_cells = [cell for cell in cells if cell["cell_type"] == "code"]
    assert [cell["outputs"] == [output] for cell in code_cells] == [True] * 3
    assert "".join(code_cells[1]["source"]) == "x + 10"
    assert all("execution" not in cell["metadata"] for cell in code_cells)


def test_select_chapters_by_path_or_name(tmp_path: Path) -> None:
    write_book(tmp_path, {"a": [code("A = 1")], "b": [code("B = 1")]})
    for name in (
        "b",
        "book/b",
        "book/b.md",
        "book/b.ipynb",
        str(tmp_path / "book/b.py"),
    ):
        assert [c.name for c in select_chapters(tmp_path, [name])] == ["b"]
    assert [c.name for c in select_chapters(tmp_path, [])] == ["a", "b"]
    with pytest.raises(ChapterError, match="'book/intro.md' is not a chapter"):
        select_chapters(tmp_path, ["book/intro.md"])


def test_check_requires_chapter_md_excluded_from_site(tmp_path: Path) -> None:
    write_book(tmp_path, {"ch": [code("x = 1", "export")]})
    sync_all(tmp_path)
    (tmp_path / "_config.yml").write_text("exclude_patterns: [_build]\n")
    assert check_repo(tmp_path) == [
        "_config.yml: add 'book/ch.md' to exclude_patterns, so that the site "
        "renders the chapter once, from book/ch.ipynb"
    ]
    (tmp_path / "_config.yml").write_text("exclude_patterns: [_build, book/ch.md]\n")
    assert check_repo(tmp_path) == []


# ------------------------------------------------------- format and execute


def test_format_chapter_formats_code_only(tmp_path: Path) -> None:
    prose = "Prose   with  odd spacing   stays as it is."
    write_book(
        tmp_path,
        {
            "ch": [
                prose,
                code("x=[1,2,\n3]", "export"),
                code("%pip install -q x"),
                code("x ;"),
            ]
        },
    )
    (chapter,) = find_chapters(tmp_path)
    assert format_chapter(chapter)
    text = chapter.md.read_text()
    assert prose in text
    assert ":tags: [export]\n\nx = [1, 2, 3]\n" in text
    assert "%pip install -q x\n" in text  # magics survive
    assert "\nx;\n" in text  # the output-hiding semicolon survives
    assert not format_chapter(chapter)  # already formatted


def test_execute_stores_outputs_deterministically(tmp_path: Path) -> None:
    cells = [
        code("import os\n\nVALUE = 41", "export"),
        code("VALUE + 1"),
        code("os.getcwd()"),
    ]
    write_book(tmp_path, {"ch": cells})
    (chapter,) = find_chapters(tmp_path)
    sync_chapter(chapter)
    execute_chapter(chapter, timeout=120)
    first = chapter.ipynb.read_text()
    notebook = json.loads(first)
    code_cells = [cell for cell in notebook["cells"] if cell["cell_type"] == "code"]
    assert "".join(code_cells[1]["outputs"][0]["data"]["text/plain"]) == "42"
    # The kernel ran in book/, as nbval and the site expect.
    assert "".join(code_cells[2]["outputs"][0]["data"]["text/plain"]).endswith("/book'")
    assert all("execution" not in cell["metadata"] for cell in code_cells)
    execute_chapter(chapter, timeout=120)
    assert chapter.ipynb.read_text() == first  # re-running produces no diff
    assert check_repo(tmp_path) == [
        f"{MODULE_FILE} is missing; run `python3 build_tools/book.py tangle`"
    ]


# ------------------------------------------------------------ the real module


def test_import_autodidax_prints_nothing(tmp_path: Path) -> None:
    # Exit code 1 if Python found another autodidax than this repository's.
    script = textwrap.dedent(
        """
        import pathlib, sys
        import autodidax
        sys.exit(pathlib.Path(autodidax.__file__).parent != pathlib.Path(sys.argv[1]))
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", script, str(REPO_ROOT)],
        cwd=tmp_path,  # any directory
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        capture_output=True,
        text=True,
        check=False,
    )
    assert (result.returncode, result.stdout, result.stderr) == (0, "", "")


def _load_tangled(root: Path, name: str = "tangled_book"):
    """Import the module tangled in ``root`` under a fresh name."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, root / "autodidax.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_load_chapters_runs_earlier_chapters_in_a_namespace(tmp_path: Path) -> None:
    # Chapter two replaces a helper that chapter one's function calls; a
    # notebook of chapter two must see chapter one's code alone, and its own
    # replacement must then change the behaviour of chapter one's function.
    write_book(
        tmp_path,
        {
            "one": [
                code(
                    "def helper():\n    return 1\n\n\ndef api():\n    return helper()",
                    "export",
                )
            ],
            "two": [code("def helper():\n    return 2", "export")],
        },
    )
    write_module(tmp_path)
    module = _load_tangled(tmp_path)
    assert module.api() == 2  # the module itself holds the final definitions

    namespace: dict = {}
    module.load_chapters(namespace, before="two")
    assert namespace["api"]() == 1  # only chapter one ran
    exec("def helper():\n    return 2", namespace)  # what chapter two's cell does
    assert namespace["api"]() == 2

    with pytest.raises(ValueError, match="no chapter 'three'"):
        module.load_chapters({}, before="three")


def test_namespace_cells_make_a_module_and_replace_no_main_name(tmp_path: Path) -> None:
    write_book(
        tmp_path,
        {
            "one": [
                code(
                    "def helper():\n    return 'main'\n\n\ndef api():\n"
                    "    return helper()",
                    "export",
                )
            ],
            "two": [
                code("def helper():\n    return 'namespace'", "export-extra"),
                code(
                    'def api():\n    """Doc\n    string."""\n    return helper()',
                    "export-extra",
                ),
                code("X = 1", "export"),
                code("print(api())"),
            ],
        },
    )
    write_module(tmp_path)
    module = _load_tangled(tmp_path, "tangled_ns")
    assert (module.api(), module.helper(), module.X) == ("main", "main", 1)
    assert module.extra.api() == "namespace"
    assert module.extra.__name__ == "tangled_ns.extra"
    assert sys.modules["tangled_ns.extra"] is module.extra
    import inspect

    source_file = Path(inspect.getsourcefile(module.extra.api))
    assert source_file == tmp_path / "autodidax.py"
    assert "return helper()" in inspect.getsource(module.extra.api)
    namespace: dict = {}
    module.load_chapters(namespace, before="two")  # chapter two's notebook
    assert namespace["api"]() == "main" and "extra" not in namespace


@pytest.mark.parametrize(
    "source, problem",
    [
        ("X = 0\n\n\ndef f():\n    global X\n    X = 1", "global"),
        ('TEXT = """two\nlines"""', "multi-line string"),
    ],
)
def test_namespace_cells_refuse_what_a_function_body_changes(
    tmp_path: Path, source: str, problem: str
) -> None:
    write_book(tmp_path, {"ch": [code(source, "export-extra")]})
    with pytest.raises(TangleError, match=problem):
        tangle(tmp_path)


def test_load_chapters_tracebacks_point_into_the_module(tmp_path: Path) -> None:
    write_book(
        tmp_path,
        {
            "one": [code("def fail():\n    raise RuntimeError('boom')", "export")],
            "two": [code("X = 1", "export")],
        },
    )
    write_module(tmp_path)
    module = _load_tangled(tmp_path, "tangled_book_tb")
    namespace: dict = {}
    module.load_chapters(namespace, before="two")
    with pytest.raises(RuntimeError) as info:
        namespace["fail"]()
    frame = info.traceback[-1]
    assert Path(str(frame.path)) == tmp_path / "autodidax.py"
    line = (tmp_path / "autodidax.py").read_text().splitlines()[frame.lineno]
    assert "raise RuntimeError" in line


def test_every_chapter_and_test_file_has_a_place_in_the_test_table() -> None:
    """``book.py test book/<chapter>.md`` runs the files CHAPTER_TESTS gives
    the chapter; every test file belongs to a chapter or to the whole book,
    and every chapter's claims are found by the name prefix it uses."""
    from build_tools import book

    names = {chapter.name for chapter in find_chapters(REPO_ROOT)}
    assert set(book.CHAPTER_TESTS) == names
    listed = [f for files in book.CHAPTER_TESTS.values() for f in files]
    listed += list(book.WHOLE_BOOK_TESTS)
    on_disk = sorted(path.name for path in (REPO_ROOT / "tests").glob("test_*.py"))
    assert sorted(listed) == on_disk  # each once
    claims = (REPO_ROOT / "tests" / "test_jax_claims.py").read_text()
    for name in names:
        assert f"def {book.claims_prefix(name)}" in claims, name
