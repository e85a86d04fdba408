"""The Chinese edition: message catalogues, the translated site, coverage.

Sphinx's gettext machinery, driven from ``_config.yml`` (no ``conf.py``):

* ``extract`` builds the English pages with Sphinx's ``gettext`` builder into
  ``_build/gettext/pot`` (one ``.pot`` per page, ``gettext_compact: false``),
  then merges them into ``locales/zh_CN/LC_MESSAGES/<page>.po`` with
  ``sphinx-intl update``: a new page gets a new catalogue, a new message an
  empty entry, a changed message keeps its old translation marked *fuzzy*
  (Sphinx skips fuzzy entries, so the page shows the English text until a
  translator confirms it), a removed message is dropped. Catalogues of pages
  that left the table of contents are deleted.
* ``stale_catalogues`` compares the catalogues with a fresh extraction without
  writing anything (``book.py test`` fails on any difference).
* ``coverage`` counts messages, translated, fuzzy and untranslated per page
  (``sphinx-intl stat`` counts fuzzy entries as translated).
* ``sphinx_build`` runs one Sphinx build the way ``jupyter-book build`` does,
  with the output and doctree directories and the language given, so that the
  Chinese site is built into its own tree (``_build/zh_CN``) next to the
  English one.

Run as a script (``python build_tools/i18n.py sphinx ...``) it performs one
Sphinx build in a fresh process; ``book.py`` runs the builds that way, two at a
time.

Only the standard library is imported at module level; Sphinx, Jupyter Book,
Babel and sphinx-intl are imported by the functions that need them.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
LOCALE_DIR = ROOT / "locales"
# The languages of the site besides English: the name used on the command line
# (``--lang zh``) and Sphinx's language code (the catalogues' directory).
LANGUAGES = {"zh": "zh_CN"}
GETTEXT_DIR = ROOT / "_build" / "gettext"
# The header of every catalogue is the same whenever it is extracted: Sphinx
# takes the creation date from SOURCE_DATE_EPOCH when it is set (and the
# copyright's year: 2026-01-01 00:00 UTC).
FIXED_EPOCH = "1767225600"
PROJECT = "Autodidax"


def catalogue_dir(language: str, root: Path = ROOT) -> Path:
    return root / "locales" / language / "LC_MESSAGES"


# ---------------------------------------------------------------- Sphinx


def sphinx_build(
    builder: str,
    outdir: Path,
    doctreedir: Path,
    *,
    root: Path = ROOT,
    language: str | None = None,
    overrides: dict[str, object] | None = None,
    strict: bool = True,
    quiet: bool = False,
) -> int:
    """One Sphinx build of the book in ``root`` as ``jupyter-book build`` runs
    it (``_config.yml``, ``_toc.yml``, ``--nitpick``), with every page read
    again; with ``strict``, warnings are errors (reported all, then failing).
    Returns Sphinx's status code."""
    from jupyter_book.sphinx import build_sphinx

    config = {
        "external_toc_path": (root / "_toc.yml").as_posix(),
        "latex_individualpages": False,
        "nitpicky": True,
        **(overrides or {}),
    }
    if language:
        config["language"] = language
    result = build_sphinx(
        str(root),
        str(outdir),
        noconfig=True,
        path_config=str(root / "_config.yml"),
        confoverrides=config,
        doctreedir=str(doctreedir),
        builder=builder,
        warningiserror=strict,
        keep_going=strict,
        freshenv=True,
        quiet=quiet,
    )
    return result if isinstance(result, int) else 1


def sphinx_argv(
    builder: str,
    outdir: Path,
    doctreedir: Path,
    language: str | None = None,
    root: Path = ROOT,
    quiet: bool = False,
) -> list[str]:
    """The command that runs :func:`sphinx_build` in a fresh Python."""
    argv = [sys.executable, str(Path(__file__).resolve()), "sphinx", builder]
    argv += [str(outdir), str(doctreedir), "--root", str(root)]
    if language:
        argv += ["--language", language]
    if quiet:
        argv.append("--quiet")
    return argv


def gettext_argv(potdir: Path, doctreedir: Path, root: Path = ROOT) -> list[str]:
    """The gettext build: warnings only (the pages are the English site's)."""
    return sphinx_argv("gettext", potdir, doctreedir, root=root, quiet=True)


def gettext_env() -> dict[str, str]:
    return {**os.environ, "SOURCE_DATE_EPOCH": FIXED_EPOCH}


def build_pot(potdir: Path, doctreedir: Path, root: Path = ROOT) -> None:
    """Extract every page's messages into ``potdir`` (emptied first)."""
    import subprocess

    shutil.rmtree(potdir, ignore_errors=True)
    code = subprocess.call(
        gettext_argv(potdir, doctreedir, root), cwd=root, env=gettext_env()
    )
    if code != 0:
        raise RuntimeError(f"the gettext build failed (exit code {code})")


# ---------------------------------------------------------------- catalogues


def pot_files(potdir: Path) -> dict[str, Path]:
    """Page (``book/intro``) -> its ``.pot`` file."""
    return {
        path.relative_to(potdir).with_suffix("").as_posix(): path
        for path in sorted(potdir.rglob("*.pot"))
    }


def po_files(language: str, root: Path = ROOT) -> dict[str, Path]:
    """Page (``book/intro``) -> its catalogue, for the catalogues that exist."""
    base = catalogue_dir(language, root)
    return {
        path.relative_to(base).with_suffix("").as_posix(): path
        for path in sorted(base.rglob("*.po"))
    }


def read_catalogue(path: Path) -> Any:
    from babel.messages.pofile import read_po

    with path.open("rb") as file:
        return read_po(file)


def write_catalogue(path: Path, catalogue: Any) -> None:
    """Write as ``sphinx-intl update -w 0`` does (no wrapping, no obsolete)."""
    from babel.messages.pofile import write_po

    with path.open("wb") as file:
        write_po(file, catalogue, width=0, ignore_obsolete=True)


def merge_catalogues(potdir: Path, language: str, root: Path = ROOT) -> list[str]:
    """``sphinx-intl update`` of the catalogues from the templates in
    ``potdir`` (no line wrapping, no obsolete entries); catalogues of pages
    without a template are deleted. Returns one line per change."""
    from sphinx_intl import basic

    # sphinx-intl's `update` command, one catalogue after the other: its own
    # loop forks a process pool, which a process that imported JAX should not.
    changes = []
    for page, pot in pot_files(potdir).items():
        po = catalogue_dir(language, root) / f"{page}.po"
        po.parent.mkdir(parents=True, exist_ok=True)
        item = basic.UpdateItem(str(po), str(pot), language, 0, True)
        result = basic._update_single_file(item)
        rel = po.relative_to(root)
        if result.status == "create":
            changes.append(f"Create: {rel}")
        elif result.status == "update":
            changes.append(f"Update: {rel} +{result.added}, -{result.deleted}")
    templates = pot_files(potdir)
    for page, path in po_files(language, root).items():
        if page not in templates:
            path.unlink()
            changes.append(f"Delete: {path.relative_to(root)} (no such page)")
            continue
        # sphinx-intl rewrites a catalogue only when its set of messages
        # changes, so entries left obsolete (#~) by other tools would stay.
        catalogue = read_catalogue(path)
        if catalogue.obsolete:
            changes.append(
                f"Drop {len(catalogue.obsolete)} obsolete entries: "
                f"{path.relative_to(root)}"
            )
            write_catalogue(path, catalogue)
    return sorted(changes)


def extract(root: Path = ROOT) -> list[str]:
    """Bring every language's catalogues up to date with the English pages."""
    potdir = root / "_build" / "gettext" / "pot"
    build_pot(potdir, potdir.parent / ".doctrees", root)
    changes = []
    for language in LANGUAGES.values():
        changes += merge_catalogues(potdir, language, root)
    return changes


def stale_catalogues(potdir: Path, language: str, root: Path = ROOT) -> list[str]:
    """How the catalogues differ from the templates in ``potdir``: one line
    per page whose catalogue is missing, has no page, lacks entries for some
    of the page's messages or holds entries for messages the page no longer
    has (obsolete). [] when they are up to date."""
    templates = pot_files(potdir)
    catalogues = po_files(language, root)
    problems = []
    for page in sorted(templates.keys() | catalogues.keys()):
        if page not in catalogues:
            problems.append(f"{page}: no catalogue")
            continue
        rel = catalogues[page].relative_to(root)
        if page not in templates:
            problems.append(f"{rel}: no such page")
            continue
        wanted = {m.id for m in read_catalogue(templates[page]) if m.id}
        catalogue = read_catalogue(catalogues[page])
        have = {m.id for m in catalogue if m.id}
        missing = wanted - have
        obsolete = (have - wanted) | set(catalogue.obsolete)
        if missing or obsolete:
            example = next(iter(sorted(missing) or sorted(map(str, obsolete))))
            problems.append(
                f"{rel}: {len(missing)} message(s) missing, {len(obsolete)} "
                f"obsolete (e.g. {example[:60]!r})"
            )
    return problems


UPDATE_COMMAND = "python3 build_tools/book.py catalogues"


def check_catalogues(root: Path = ROOT) -> list[str]:
    """Extract the pages' messages into a scratch directory and compare them
    with every language's catalogues (nothing in the repository changes)."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        potdir = Path(tmp) / "pot"
        build_pot(potdir, Path(tmp) / ".doctrees", root)
        problems = []
        for language in LANGUAGES.values():
            problems += stale_catalogues(potdir, language, root)
    return problems


def report_stale(problems: Sequence[str]) -> int:
    """Print what :func:`check_catalogues` found; the exit code."""
    for line in problems:
        print(f"catalogues: {line}", file=sys.stderr)
    if problems:
        print(
            "catalogues: the translation catalogues are out of date with the "
            f"pages; update them with `{UPDATE_COMMAND}` (`book.py refresh` "
            "does it too) and commit locales/",
            file=sys.stderr,
        )
        return 1
    print("catalogues: every page's catalogue is up to date")
    return 0


@dataclass(frozen=True)
class Coverage:
    """How much of one page's catalogue is translated."""

    page: str
    messages: int
    translated: int
    fuzzy: int
    untranslated: int


def coverage(language: str, root: Path = ROOT) -> list[Coverage]:
    """Per page: its messages, and how many are translated, fuzzy (a
    translation of an older English text, not shown) or untranslated."""
    rows = []
    for page, path in po_files(language, root).items():
        entries = [m for m in read_catalogue(path) if m.id]
        fuzzy = sum(1 for m in entries if m.fuzzy)
        translated = sum(1 for m in entries if not m.fuzzy and m.string)
        rows.append(
            Coverage(
                page,
                len(entries),
                translated,
                fuzzy,
                len(entries) - fuzzy - translated,
            )
        )
    return rows


def coverage_table(rows: Sequence[Coverage]) -> str:
    """The rows as a plain-text table with a total."""
    total = Coverage(
        "total",
        sum(r.messages for r in rows),
        sum(r.translated for r in rows),
        sum(r.fuzzy for r in rows),
        sum(r.untranslated for r in rows),
    )
    width = max(len(r.page) for r in [*rows, total])
    header = ("page", "messages", "translated", "fuzzy", "untranslated")
    lines = [f"{header[0]:<{width}}  " + "  ".join(f"{h:>12}" for h in header[1:])]
    for row in [*rows, total]:
        if row is total:
            lines.append("-" * len(lines[0]))
        numbers = (row.messages, row.translated, row.fuzzy, row.untranslated)
        lines.append(f"{row.page:<{width}}  " + "  ".join(f"{n:>12}" for n in numbers))
    return "\n".join(lines)


# ---------------------------------------------------------------- CLI


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="i18n.py", description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    sphinx = commands.add_parser("sphinx", help="one Sphinx build of the book")
    sphinx.add_argument("builder")
    sphinx.add_argument("outdir", type=Path)
    sphinx.add_argument("doctreedir", type=Path)
    sphinx.add_argument("--root", type=Path, default=ROOT)
    sphinx.add_argument("--language")
    sphinx.add_argument("--quiet", action="store_true", help="warnings only")
    for name, help_text in [
        ("extract", "update the catalogues from the pages"),
        ("check", "fail if the catalogues are out of date"),
    ]:
        command = commands.add_parser(name, help=help_text)
        command.add_argument("--root", type=Path, default=ROOT)
    args = parser.parse_args(argv)
    if args.command == "sphinx":
        overrides: dict[str, object] = {}
        if args.builder == "gettext":
            overrides["project"] = PROJECT
        return sphinx_build(
            args.builder,
            args.outdir,
            args.doctreedir,
            root=args.root,
            language=args.language,
            overrides=overrides,
            quiet=args.quiet,
        )
    if args.command == "check":
        return report_stale(check_catalogues(args.root))
    for line in extract(args.root):
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
