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
import contextlib
import io
import os
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path

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
    )
    return result if isinstance(result, int) else 1


def sphinx_argv(
    builder: str,
    outdir: Path,
    doctreedir: Path,
    language: str | None = None,
    root: Path = ROOT,
) -> list[str]:
    """The command that runs :func:`sphinx_build` in a fresh Python."""
    argv = [sys.executable, str(Path(__file__).resolve()), "sphinx", builder]
    argv += [str(outdir), str(doctreedir), "--root", str(root)]
    if language:
        argv += ["--language", language]
    return argv


def gettext_argv(potdir: Path, doctreedir: Path, root: Path = ROOT) -> list[str]:
    return sphinx_argv("gettext", potdir, doctreedir, root=root)


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


def merge_catalogues(potdir: Path, language: str, root: Path = ROOT) -> list[str]:
    """``sphinx-intl update`` of the catalogues from the templates in
    ``potdir`` (no line wrapping, no obsolete entries); catalogues of pages
    without a template are deleted. Returns one line per change."""
    from sphinx_intl import basic

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        basic.update(
            str(root / "locales"),
            str(potdir),
            (language,),
            line_width=0,
            ignore_obsolete=True,
            jobs=1,
        )
    changes = [
        line.strip()
        for line in out.getvalue().splitlines()
        if "Not Changed" not in line
    ]
    templates = pot_files(potdir)
    for page, path in po_files(language, root).items():
        if page not in templates:
            path.unlink()
            changes.append(f"Delete: {path.relative_to(root)} (no such page)")
    return changes


def extract(root: Path = ROOT) -> list[str]:
    """Bring every language's catalogues up to date with the English pages."""
    potdir = GETTEXT_DIR / "pot" if root == ROOT else root / "_build/gettext/pot"
    build_pot(potdir, potdir.parent / ".doctrees", root)
    changes = []
    for language in LANGUAGES.values():
        changes += merge_catalogues(potdir, language, root)
    return changes


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
    commands.add_parser("extract", help="update the catalogues from the pages")
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
        )
    for line in extract():
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
