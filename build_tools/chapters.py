"""Find the book's chapters: the table of contents and the jupytext pairing.

A chapter is a page of ``_toc.yml`` whose ``book/<name>.md`` starts with a
jupytext header (YAML front matter with a ``jupytext:`` key). It is paired with
``book/<name>.ipynb`` (executed, outputs stored) and ``book/<name>.py``
(percent format); the ``.md`` is the source of truth. A ``.md`` without that
header is a plain page of the site, not a chapter.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

BOOK_DIR = "book"
TOC_FILE = "_toc.yml"
CONFIG_FILE = "_config.yml"


class ChapterError(ValueError):
    """The table of contents or a chapter name given on the command line is wrong."""


@dataclass(frozen=True)
class Chapter:
    """One chapter: its name (path under book/ without suffix) and its files."""

    root: Path
    name: str

    @property
    def md(self) -> Path:
        return self.root / BOOK_DIR / f"{self.name}.md"

    @property
    def ipynb(self) -> Path:
        return self.md.with_suffix(".ipynb")

    @property
    def py(self) -> Path:
        return self.md.with_suffix(".py")

    def rel(self, path: Path) -> str:
        """``path`` relative to the repository root, for messages."""
        return path.relative_to(self.root).as_posix()


_FRONT_MATTER = re.compile(r"\A---[ \t]*\n(.*?)^---[ \t]*$", re.DOTALL | re.MULTILINE)


def has_jupytext_header(md: Path) -> bool:
    """True if the markdown file opens with front matter holding a jupytext key."""
    match = _FRONT_MATTER.match(md.read_text(encoding="utf-8"))
    return bool(match and re.search(r"^jupytext:", match.group(1), re.MULTILINE))


def _load_yaml(path: Path) -> Any:
    import yaml  # PyYAML comes with jupyter-book; imported lazily (see __init__)

    with path.open(encoding="utf-8") as stream:
        return yaml.safe_load(stream)


def _toc_entries(node: Any) -> Iterator[str]:
    """Yield the ``file`` entries of a jb-book/jb-article toc, in reading order."""
    if isinstance(node, list):
        for item in node:
            yield from _toc_entries(item)
    elif isinstance(node, dict):
        if "glob" in node:
            raise ChapterError(
                f"{TOC_FILE}: 'glob' entries are not supported; list each page "
                "with 'file:' so that the chapter order is explicit"
            )
        for key in ("root", "file"):
            if key in node:
                yield str(node[key])
        for key in ("parts", "chapters", "sections"):
            if key in node:
                yield from _toc_entries(node[key])


def toc_pages(root: Path) -> list[str]:
    """The pages of ``_toc.yml`` in order, as paths relative to root without suffix."""
    toc_path = root / TOC_FILE
    if not toc_path.is_file():
        raise ChapterError(f"{toc_path} not found")
    pages = []
    for entry in _toc_entries(_load_yaml(toc_path)):
        path = Path(entry)
        if path.suffix in (".md", ".ipynb"):
            path = path.with_suffix("")
        pages.append(path.as_posix())
    return pages


def find_chapters(root: Path) -> list[Chapter]:
    """All chapters in table-of-contents order."""
    chapters = []
    for page in toc_pages(root):
        prefix = f"{BOOK_DIR}/"
        if not page.startswith(prefix):
            continue  # chapters live in book/; other pages are left alone
        chapter = Chapter(root, page.removeprefix(prefix))
        if chapter.md.is_file() and has_jupytext_header(chapter.md):
            chapters.append(chapter)
    return chapters


def select_chapters(root: Path, names: Sequence[str]) -> list[Chapter]:
    """The chapters named on the command line, or all of them if none is named.

    A name may be ``book/<name>.md`` (or its .ipynb/.py twin), ``book/<name>``
    or just ``<name>``; the result keeps table-of-contents order.
    """
    chapters = find_chapters(root)
    if not names:
        return chapters
    by_name = {chapter.name: chapter for chapter in chapters}
    wanted = set()
    book_dir = (root / BOOK_DIR).resolve()
    for name in names:
        path = Path(name)
        if path.suffix in (".md", ".ipynb", ".py"):
            path = path.with_suffix("")
        # A path that points into book/ from the current directory wins;
        # otherwise the name is read relative to book/ (with or without "book/").
        resolved = path.resolve()
        if resolved.is_relative_to(book_dir) and resolved.parent.is_dir():
            key = resolved.relative_to(book_dir).as_posix()
        else:
            key = path.as_posix().removeprefix(f"{BOOK_DIR}/")
        if key not in by_name:
            known = ", ".join(sorted(by_name)) or "none"
            raise ChapterError(
                f"{name!r} is not a chapter (a {BOOK_DIR}/*.md with a jupytext header "
                f"listed in {TOC_FILE}); chapters: {known}"
            )
        wanted.add(key)
    return [chapter for chapter in chapters if chapter.name in wanted]


def site_exclude_patterns(root: Path) -> list[str] | None:
    """The ``exclude_patterns`` of ``_config.yml``, or None if there is no config."""
    config_path = root / CONFIG_FILE
    if not config_path.is_file():
        return None
    config = _load_yaml(config_path) or {}
    return [str(pattern) for pattern in config.get("exclude_patterns") or []]
