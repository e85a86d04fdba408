"""Figure- and table-drawing code for the book's pages.

Not part of the library: nothing here is tangled into ``autodidax.py``. A
chapter calls one function from here in a folded cell, so that its main path
shows the idea and not the drawing code. The chapters run with ``book/`` as
their working directory, so ``import figures`` finds this file; in Colab the
setup cell fetches it next to the notebook.
"""

from __future__ import annotations

# ---------------------------------------------------------------- Part 1


def draw_interpreter_stack(stack, x):
    """Part 1: the interpreter stack and the nesting of the tracer ``x``, as an SVG.

    ``stack`` is a list of ``Level`` objects (bottom first) and ``x`` the tracer a
    function received; both are live objects from the chapter.
    """
    from IPython.display import SVG

    colors = {"EvalTrace": "#dbe9f6", "JVPTrace": "#fde2c8", "BatchTrace": "#d9f2d9"}
    # what each rule binds, one level down, when spy applies sin
    passes_down = {"BatchTrace": "sin", "JVPTrace": "sin, cos and mul"}
    box_h, gap, top = 50, 28, 44
    bottom = top + len(stack) * box_h + (len(stack) - 1) * gap
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="700" height="{bottom + 50}"'
        ' font-family="sans-serif" font-size="13">',
        "<title>Interpreter stack during jvp(vmap(spy))</title>",
        '<defs><marker id="arrow" markerWidth="8" markerHeight="8" refX="4" '
        'refY="4" orient="auto"><path d="M0,0 L8,4 L0,8 z" fill="#333"/>'
        "</marker></defs>",
        '<text x="20" y="24" font-weight="bold">interpreter stack</text>',
        '<text x="390" y="24" font-weight="bold">the argument spy receives</text>',
    ]
    for level in stack:
        y = top + (len(stack) - 1 - level.number) * (box_h + gap)
        name = level.trace_type.__name__
        payload = "" if level.payload is None else f" (batch size {level.payload})"
        parts.append(
            f'<rect x="60" y="{y}" width="280" height="{box_h}" rx="6" '
            f'fill="{colors[name]}" stroke="#555"/>'
            f'<text x="74" y="{y + 30}">level {level.number}: {name}{payload}</text>'
        )
        if level.number > 0:  # the arrow of a bind passed one level down
            y0, y1 = y + box_h + 2, y + box_h + gap - 4
            parts.append(
                f'<line x1="200" y1="{y0}" x2="200" y2="{y1}" stroke="#333" '
                'marker-end="url(#arrow)"/>'
                f'<text x="212" y="{y0 + 16}" fill="#333">rule binds '
                f"{passes_down[name]}</text>"
            )
    # the two ends of the stack, labelled
    parts.append(
        f'<text x="20" y="{top + 30}" fill="#333" font-weight="bold">top</text>'
        f'<text x="20" y="{bottom - 20}" fill="#333" font-weight="bold">bottom'
        "</text>"
    )
    # The argument: one box per tracer, outermost first, arrays innermost.
    node, tangent, nesting = x, None, 0
    while hasattr(node, "_trace"):
        level = node._trace.level
        inset = 14 * nesting
        color = colors[level.trace_type.__name__]
        parts.append(
            f'<rect x="{390 + inset}" y="{top + 32 * nesting}" '
            f'width="{290 - 2 * inset}" height="{bottom - top - 44 * nesting}" '
            f'rx="6" fill="{color}" stroke="#555"/>'
            f'<text x="{402 + inset}" y="{top + 32 * nesting + 20}">'
            f"{type(node).__name__} (level {level.number})</text>"
        )
        if hasattr(node, "batch_axis"):
            node = node.val
        else:
            node, tangent = node.primal, node.tangent
        nesting += 1
    inset, y = 14 * nesting, top + 32 * nesting
    for label, value in [("primal", node), ("tangent", tangent)]:
        shape = ",".join(str(d) for d in value.shape)
        parts.append(
            f'<rect x="{390 + inset}" y="{y}" width="{290 - 2 * inset}" '
            f'height="34" rx="4" fill="{colors["EvalTrace"]}" stroke="#555"/>'
            f'<text x="{402 + inset}" y="{y + 22}">{label}: '
            f"{value.dtype.name}[{shape}] NumPy array</text>"
        )
        y += 42
    parts.append(
        f'<text x="20" y="{bottom + 32}" fill="#333">sin enters at the top; each '
        "rule binds again on what its tracers hold, down to level 0 at the bottom."
        "</text></svg>"
    )
    return SVG("".join(parts))


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
