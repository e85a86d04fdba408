"""A Sphinx extension with fixes for the rendered site (listed in _config.yml).

Jupyter Book 1.x with Sphinx 7.4 writes every inline script that an extension
registers after the builder has started into each page *twice* (once with the
file name ``None``, once with ``""``), so a page declares sphinx-thebe's
``const THEBE_JS_URL`` twice and the browser reports a SyntaxError on every
page. This extension drops the repeated scripts before a page is rendered.
``tests/test_site_browser.py`` checks in a real browser that pages load
without console errors.
"""

from __future__ import annotations

from typing import Any


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
    return {"parallel_read_safe": True, "parallel_write_safe": True}
