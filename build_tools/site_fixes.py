"""A Sphinx extension with fixes for the rendered site (listed in _config.yml).

Jupyter Book 1.x with Sphinx 7.4 writes every inline script that an extension
registers after the builder has started into each page *twice* (once with the
file name ``None``, once with ``""``), so a page declares sphinx-thebe's
``const THEBE_JS_URL`` twice and the browser reports a SyntaxError on every
page. This extension drops the repeated scripts before a page is rendered.
``tests/test_site_browser.py`` checks in a real browser that pages load
without console errors.

It also labels folded code cells: a folded cell starts with a Colab form
title (``# @title Checks: ...``, SPEC 2a), and the site shows that title on the
cell's toggle instead of the generic "Show code cell source", so a reader
knows what the folded code holds without opening it. (The title is code, so it
stays English on the Chinese site; the words around it do not.)
"""

from __future__ import annotations

import re
from typing import Any


def _folded_cell_pattern(show: str, hide: str) -> re.Pattern:
    """A folded cell's toggle (with myst-nb's labels ``show`` and ``hide``) and
    the first line of its source, a ``# @title`` comment."""
    return re.compile(
        r'(<p class="collapsed admonition-title">)' + re.escape(show) + r"(</p>\s*"
        r'<p class="expanded admonition-title">)' + re.escape(hide) + r"(</p>\s*"
        r"</summary>"
        r'\s*<div class="cell_input[^>]*>\s*<div class="highlight[^>]*>'
        r'<div class="highlight"><pre><span></span><span class="c1"># @title )'
        r"([^<]*)(</span>)"
    )


# What the toggle says after the title, per language of the site.
_SHOW_HIDE = {"zh_CN": ("（显示代码）", "（隐藏代码）")}
_SHOW_HIDE_EN = ("<em>(show code)</em>", "<em>(hide code)</em>")


def _code_spans_to_html(title: str) -> str:
    """Backquoted names in a title become <code>, as in the prose."""
    return re.sub(r"`([^`]+)`", r'<code class="docutils literal">\1</code>', title)


def label_folded_cells(
    app: Any, pagename: str, templatename: str, context: dict, doctree: Any
) -> None:
    """Show each folded cell's ``# @title`` on its toggle."""
    body = context.get("body")
    if not body or "# @title " not in body:
        return
    config = app.config
    pattern = _folded_cell_pattern(
        str(config.nb_code_prompt_show).replace("{type}", "source"),
        str(config.nb_code_prompt_hide).replace("{type}", "source"),
    )
    show, hide = _SHOW_HIDE.get(config.language or "en", _SHOW_HIDE_EN)

    def label(match: re.Match) -> str:
        title = _code_spans_to_html(match.group(4).strip())
        return (
            f"{match.group(1)}{title} {show}{match.group(2)}"
            f"{title} {hide}{match.group(3)}{match.group(4)}"
            f"{match.group(5)}"
        )

    context["body"] = pattern.sub(label, body)


def _script_key(script: Any) -> tuple:
    filename = getattr(script, "filename", script) or ""
    attributes = getattr(script, "attributes", {})
    return (filename, tuple(sorted(attributes.items())))


def drop_repeated_scripts(
    app: Any, pagename: str, templatename: str, context: dict, doctree: Any
) -> None:
    """Keep the first of several identical ``<script>`` entries of a page."""
    scripts = context.get("script_files")
    if not scripts:
        return
    seen: set[tuple] = set()
    unique = []
    for script in scripts:
        key = _script_key(script)
        if key not in seen:
            seen.add(key)
            unique.append(script)
    context["script_files"] = unique


def setup(app: Any) -> dict[str, Any]:
    # Late, after the themes' own handlers have edited the list.
    app.connect("html-page-context", drop_repeated_scripts, priority=900)
    app.connect("html-page-context", label_folded_cells)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
