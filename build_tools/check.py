"""``check``: is everything generated from the chapters up to date?

Reports (never fixes) chapters whose .ipynb inputs or .py differ from their
.md, an ``autodidax.py`` that differs from a fresh tangle, and chapters whose
.md the site build would see next to their .ipynb.
"""

from __future__ import annotations

import fnmatch
from pathlib import Path

from build_tools.chapters import (
    CONFIG_FILE,
    Chapter,
    find_chapters,
    site_exclude_patterns,
)
from build_tools.notebooks import check_chapter
from build_tools.tangle import check_module


def check_site_config(root: Path, chapters: list[Chapter]) -> list[str]:
    """Every chapter's .md must be excluded from the site, which renders the .ipynb.

    Otherwise Sphinx finds two source files for one page. Does nothing when
    there is no _config.yml (e.g. in the tests' small fake books).
    """
    patterns = site_exclude_patterns(root)
    if patterns is None:
        return []
    problems = []
    for chapter in chapters:
        md = chapter.rel(chapter.md)
        if not any(fnmatch.fnmatchcase(md, pattern) for pattern in patterns):
            problems.append(
                f"{CONFIG_FILE}: add '{md}' to exclude_patterns, so that the site "
                f"renders the chapter once, from {chapter.rel(chapter.ipynb)}"
            )
    return problems


def check_repo(root: Path) -> list[str]:
    """All problems found, each naming the file and how to fix it; [] if none."""
    chapters = find_chapters(root)
    problems = []
    for chapter in chapters:
        problems.extend(check_chapter(chapter))
    problems.extend(check_module(root))
    problems.extend(check_site_config(root, chapters))
    return problems
