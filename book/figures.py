"""Figure- and table-drawing code for the book's pages.

Not part of the library: nothing here is tangled into ``autodidax.py``. A
chapter calls one function from here in a folded cell, so that its main path
shows the idea and not the drawing code. The chapters run with ``book/`` as
their working directory, so ``import figures`` finds this file; in Colab the
setup cell fetches it next to the notebook.
"""

from __future__ import annotations

# ---------------------------------------------------------------- Part 1


# ---------------------------------------------------------------- Part 4


# ---------------------------------------------------------------- appendix


class RuleTable:
    """Rows of (primitive, status per rule kind): an HTML table on the page,
    plain text in the notebook's text output (which the tests compare)."""

    def __init__(self, kinds, rows):
        self.kinds, self.rows = kinds, rows

    def __repr__(self):
        lines = [" ".join(f"{c:>20}" for c in ("primitive", *self.kinds))]
        lines += [" ".join(f"{c:>20}" for c in row) for row in self.rows]
        return "\n".join(lines)

    def _repr_html_(self):
        def cell(text, tag="td"):
            shown = {"yes": "✓"}.get(text, text.replace("_", " "))
            style = "text-align: center"
            if text not in ("yes", "primitive"):
                style += "; color: #6b7280" if tag == "td" else ""
            return f'<{tag} style="{style}">{shown}</{tag}>'

        head = "".join(cell(c, "th") for c in ("primitive", *self.kinds))
        body = "".join(
            f"<tr><td><code>{name}</code></td>{''.join(map(cell, statuses))}</tr>"
            for name, *statuses in self.rows
        )
        return (
            '<div style="overflow-x: auto"><table style="font-size: 0.85em">'
            f"<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>"
        )


# ---------------------------------------------------------------- performance
