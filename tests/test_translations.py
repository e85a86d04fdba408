"""The Chinese edition's machinery (README "The Chinese edition").

Most tests work on a tiny two-page book in a temporary directory, built with
the repository's own configuration and Sphinx extensions: catalogues are
extracted deterministically and hold prose but no code or math; a translated
page shows the translation (and its part caption, which sphinx-external-toc
would leave English); a changed English paragraph turns its entry fuzzy and
the page shows the new English text, never the stale translation; the check
that ``book.py test`` runs names the page and the command that updates the
catalogues. The coverage report of ``book.py translations`` is compared with
counts read from the repository's catalogue files by a parser of its own.

That the real Chinese site builds without warnings is a step of ``book.py
test`` (and of ``tests/test_site_browser.py`` when run on its own), which
build it once per run.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import yaml

from build_tools import i18n

REPO_ROOT = Path(__file__).resolve().parent.parent

INTRO = """# A tiny book

The tiny book has one chapter.
"""
CHAPTER = """# The chapter

The first paragraph says one thing.

The second paragraph says another.

```python
print("code is never translated")
```

$$
e^{i\\pi} + 1 = 0
$$
"""
CHINESE = {
    "Chapters": "各章",
    "The chapter": "这一章",
    "The first paragraph says one thing.": "第一段说一件事。",
    "The second paragraph says another.": "第二段说另一件事。",
}
CHANGED = "The first paragraph now says something else."


def make_book(root: Path) -> None:
    """Two pages, with the repository's Sphinx settings and extensions."""
    config = yaml.safe_load((REPO_ROOT / "_config.yml").read_text(encoding="utf-8"))
    config["title"] = "A tiny book"
    config["exclude_patterns"] = ["_build", "build_tools", "locales"]
    (root / "_config.yml").write_text(yaml.safe_dump(config), encoding="utf-8")
    toc = {
        "format": "jb-book",
        "root": "intro",
        "parts": [{"caption": "Chapters", "chapters": [{"file": "chapter"}]}],
    }
    (root / "_toc.yml").write_text(yaml.safe_dump(toc), encoding="utf-8")
    (root / "intro.md").write_text(INTRO, encoding="utf-8")
    (root / "chapter.md").write_text(CHAPTER, encoding="utf-8")
    shutil.copytree(REPO_ROOT / "build_tools", root / "build_tools")
    shutil.copytree(REPO_ROOT / "_static", root / "_static")


def build_chinese(root: Path) -> str:
    """Build the Chinese site (warnings are errors); the chapter's HTML."""
    out = root / "_build" / "zh_CN"
    argv = i18n.sphinx_argv("html", out / "html", out / ".doctrees", "zh_CN", root)
    build = subprocess.run(argv, cwd=root, capture_output=True, text=True, check=False)
    assert build.returncode == 0, build.stdout[-3000:] + build.stderr[-3000:]
    return (out / "html" / "chapter.html").read_text(encoding="utf-8")


def translate(path: Path, translations: dict[str, str]) -> None:
    catalogue = i18n.read_catalogue(path)
    for message in catalogue:
        if message.id in translations:
            message.string = translations[message.id]
    i18n.write_catalogue(path, catalogue)


def test_catalogues_translation_and_fuzzy_fallback(tmp_path: Path) -> None:
    make_book(tmp_path)
    catalogues = i18n.catalogue_dir("zh_CN", tmp_path)

    # Extraction: one catalogue per page, prose only.
    changes = i18n.extract(tmp_path)
    assert len(changes) == 2, changes
    assert sorted(i18n.po_files("zh_CN", tmp_path)) == ["chapter", "intro"]
    chapter_po = catalogues / "chapter.po"
    ids = [m.id for m in i18n.read_catalogue(chapter_po) if m.id]
    assert ids == [
        "The chapter",
        "The first paragraph says one thing.",
        "The second paragraph says another.",
    ]
    intro_ids = [m.id for m in i18n.read_catalogue(catalogues / "intro.po") if m.id]
    assert "Chapters" in intro_ids, intro_ids  # the part caption of _toc.yml
    intro_po = catalogues / "intro.po"
    first_intro = intro_po.read_bytes()

    # A translated page shows the translation, and so does the sidebar.
    translate(chapter_po, CHINESE)
    translate(catalogues / "intro.po", CHINESE)
    html = build_chinese(tmp_path)
    for chinese in CHINESE.values():
        assert chinese in html
    assert "The first paragraph says one thing." not in html
    assert "code is never translated" in html
    assert 'href="../chapter.html"' in html  # the switch to the English page

    # The English paragraph changes: the check fails, naming the page and the
    # command that updates the catalogues ...
    chapter = tmp_path / "chapter.md"
    chapter.write_text(
        CHAPTER.replace("The first paragraph says one thing.", CHANGED),
        encoding="utf-8",
    )
    potdir = tmp_path / "pot"
    i18n.build_pot(potdir, tmp_path / "doctrees", tmp_path)
    problems = i18n.stale_catalogues(potdir, "zh_CN", tmp_path)
    assert len(problems) == 1 and "chapter.po" in problems[0], problems
    assert "1 message(s) missing, 1 obsolete" in problems[0]
    assert i18n.report_stale(problems) == 1
    # ... and updating them keeps the old translation, marked fuzzy. The
    # intro, unchanged, is extracted anew by a second Sphinx run: byte for
    # byte the same catalogue (extraction is deterministic).
    intro_po.unlink()
    assert i18n.merge_catalogues(potdir, "zh_CN", tmp_path) == [
        f"Create: {intro_po.relative_to(tmp_path)}",
        f"Update: {chapter_po.relative_to(tmp_path)} +1, -1",
    ]
    assert intro_po.read_bytes() == first_intro
    translate(intro_po, CHINESE)
    assert i18n.merge_catalogues(potdir, "zh_CN", tmp_path) == []
    assert i18n.stale_catalogues(potdir, "zh_CN", tmp_path) == []
    entry = i18n.read_catalogue(chapter_po).get(CHANGED)
    assert (
        entry.fuzzy and entry.string == CHINESE["The first paragraph says one thing."]
    )
    coverage = {row.page: row for row in i18n.coverage("zh_CN", tmp_path)}
    assert coverage["chapter"] == i18n.Coverage("chapter", 3, 2, 1, 0)

    # The page shows the new English paragraph, not the stale translation.
    html = build_chinese(tmp_path)
    assert CHANGED in html
    assert CHINESE["The first paragraph says one thing."] not in html
    assert CHINESE["The second paragraph says another."] in html


# ------------------------------------------------- the repository's catalogues


def count_po(path: Path) -> tuple[int, int, int, int]:
    """(messages, translated, fuzzy, untranslated) of a catalogue, read with a
    parser of its own: entries are separated by blank lines; the header (empty
    msgid) and obsolete (#~) entries are not messages."""
    messages = translated = fuzzy = 0
    for block in path.read_text(encoding="utf-8").split("\n\n"):
        lines = [line for line in block.splitlines() if not line.startswith("#~")]
        key = next(
            (i for i, line in enumerate(lines) if line.startswith("msgid ")), None
        )
        if (
            key is None
            or lines[key] == 'msgid ""'
            and (key + 1 >= len(lines) or not lines[key + 1].startswith('"'))
        ):
            continue  # no entry, or the header
        messages += 1
        flags = [line for line in lines if line.startswith("#,")]
        if any("fuzzy" in line for line in flags):
            fuzzy += 1
            continue
        start = next(i for i, line in enumerate(lines) if line.startswith("msgstr "))
        text = "".join(
            line.split('"', 1)[1].rsplit('"', 1)[0] for line in lines[start:]
        )
        translated += bool(text)
    return messages, translated, fuzzy, messages - translated - fuzzy


def test_translations_report_matches_the_catalogue_files() -> None:
    report = subprocess.run(
        [sys.executable, "build_tools/book.py", "translations"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    rows = {}
    for line in report.stdout.splitlines()[1:]:
        fields = line.split()
        if len(fields) == 5 and fields[1].isdigit():
            rows[fields[0]] = tuple(int(field) for field in fields[1:])
    expected = {
        page: count_po(path) for page, path in i18n.po_files("zh_CN", REPO_ROOT).items()
    }
    assert expected, "no catalogues in locales/zh_CN"
    total = tuple(sum(column) for column in zip(*expected.values()))
    assert rows == {**expected, "total": total}, report.stdout
    incomplete = total[2] + total[3] > 0
    assert report.returncode == (1 if incomplete else 0), report.stderr
    if incomplete:
        assert "fuzzy" in report.stderr and "untranslated" in report.stderr
