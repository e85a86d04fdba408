"""Figure- and table-drawing code for the book's pages.

Not part of the library: nothing here is tangled into ``autodidax.py``. A
chapter calls one function from here in a folded cell, so that its main path
shows the idea and not the drawing code. The chapters run with ``book/`` as
their working directory, so ``import figures`` finds this file; in Colab the
setup cell fetches it next to the notebook.
"""

from __future__ import annotations

# ---------------------------------------------------------------- Part 1


# ---------------------------------------------------------------- Part 2


def _trace_with_lines(fun, avals, make_jaxpr, trace_class):
    """make_jaxpr, also noting the line of ``fun`` behind each equation."""
    import sys

    lines_seen = []
    original = trace_class.process_primitive

    def process_primitive_noting_line(self, prim, tracers, params):
        frame = sys._getframe()
        while frame is not None and frame.f_code is not fun.__code__:
            frame = frame.f_back
        lines_seen.append(None if frame is None else frame.f_lineno)
        return original(self, prim, tracers, params)

    trace_class.process_primitive = process_primitive_noting_line
    try:
        jaxpr = make_jaxpr(fun, *avals)[0]
    finally:
        trace_class.process_primitive = original
    return jaxpr, lines_seen


def source_and_jaxpr_figure(fun, avals, make_jaxpr, trace_class):
    """An SVG of ``fun``'s source next to its jaxpr, each line of the source
    sharing a color with the equations it produced. ``make_jaxpr`` and the
    trace class are the chapter's (tracing records one equation per call of
    ``trace_class.process_primitive``)."""
    import inspect
    from html import escape

    from IPython.display import SVG

    jaxpr, eqn_lines = _trace_with_lines(fun, avals, make_jaxpr, trace_class)
    source, first_line = inspect.getsourcelines(fun)
    jaxpr_text = str(jaxpr).splitlines()
    palette = ["#fde2c8", "#d9f2d9", "#dbe9f6", "#f6d9f0", "#f2efc2"]
    used_lines = sorted({n for n in eqn_lines if n is not None})
    color_of = {n: palette[i % len(palette)] for i, n in enumerate(used_lines)}
    row, left, right, top = 22, 20, 440, 40
    height = top + row * max(len(source), len(jaxpr_text)) + 20
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="900" height="{height}" '
        'font-family="monospace" font-size="13">',
        "<title>A Python function next to its jaxpr</title>",
        f'<text x="{left}" y="22" font-family="sans-serif" font-weight="bold">'
        "Python source</text>",
        f'<text x="{right}" y="22" font-family="sans-serif" font-weight="bold">'
        "jaxpr</text>",
    ]
    source_y = {}
    for i, text in enumerate(source):
        y = top + row * i
        line_no = first_line + i
        source_y[line_no] = y
        if line_no in color_of:
            parts.append(
                f'<rect x="{left - 4}" y="{y}" width="380" height="{row - 2}" '
                f'fill="{color_of[line_no]}"/>'
            )
        parts.append(
            f'<text x="{left}" y="{y + 15}" xml:space="preserve">'
            f"{escape(text.rstrip())}</text>"
        )
    for i, text in enumerate(jaxpr_text):
        y = top + row * i
        eqn_index = i - 1  # line 0 is the header "{ lambda ..."
        if 0 <= eqn_index < len(eqn_lines) and eqn_lines[eqn_index] in color_of:
            line_no = eqn_lines[eqn_index]
            parts.append(
                f'<rect x="{right - 4}" y="{y}" width="440" height="{row - 2}" '
                f'fill="{color_of[line_no]}"/>'
                f'<line x1="{left + 376}" y1="{source_y[line_no] + row // 2}" '
                f'x2="{right - 4}" y2="{y + row // 2}" stroke="#999"/>'
            )
        parts.append(
            f'<text x="{right}" y="{y + 15}" xml:space="preserve">{escape(text)}</text>'
        )
    parts.append("</svg>")
    return SVG("".join(parts))


# ---------------------------------------------------------------- Part 4


# ---------------------------------------------------------------- appendix


# ---------------------------------------------------------------- performance
