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

# The figures of Part 4 draw real runs of the chapter's own code. The chapter
# passes its namespace (``ns=globals()``), since a notebook that loads the
# earlier chapters defines its own ``Var``, ``UndefPrimal``, ``backward_pass``.

_BLUE, _ORANGE = "#dbe9f6", "#fde2c8"


def draw_unzipped_jaxpr(jaxpr, known, unknown_half, num_res, names, *, ns):
    """An SVG of ``jaxpr``, each equation colored by the half
    ``partial_eval_jaxpr`` sent it to, with its residuals marked."""
    from html import escape

    from IPython.display import SVG

    known_eqns = {id(e) for e in known.eqns}
    residuals = set(unknown_half.in_binders[:num_res])
    lines = ns["pp_jaxpr"](jaxpr, names=names).splitlines()
    row, top = 22, 50
    height = top + row * len(lines) + 20
    blue, orange = _BLUE, _ORANGE
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="720" height="{height}" '
        'font-family="monospace" font-size="13">',
        "<title>A JVP jaxpr split into its known and unknown halves</title>",
        f'<rect x="20" y="10" width="14" height="14" fill="{blue}" stroke="#555"/>'
        '<text x="40" y="22" font-family="sans-serif">known half (runs now)</text>'
        f'<rect x="230" y="10" width="14" height="14" fill="{orange}" stroke="#555"/>'
        '<text x="250" y="22" font-family="sans-serif">unknown half (the linear '
        "map)</text>",
    ]
    for i, text in enumerate(lines):
        y = top + row * i
        eqn_index = i - 1  # line 0 binds the inputs
        if 0 <= eqn_index < len(jaxpr.eqns):
            eqn = jaxpr.eqns[eqn_index]
            fill = blue if id(eqn) in known_eqns else orange
            parts.append(
                f'<rect x="16" y="{y}" width="440" height="{row - 2}" fill="{fill}"/>'
            )
            defined = eqn.out_binders
        else:
            defined = jaxpr.in_binders if i == 0 else []
        parts.append(
            f'<text x="20" y="{y + 15}" xml:space="preserve">{escape(text)}</text>'
        )
        marked = [names(v) for v in defined if v in residuals]
        if marked:
            parts.append(
                f'<text x="470" y="{y + 15}" font-family="sans-serif" fill="#a33">'
                f"&#8594; residual {', '.join(marked)}</text>"
            )
    parts.append("</svg>")
    return SVG("".join(parts))


def _record_backward_pass(ns, jaxpr, args, cotangents_out):
    """Run backward_pass, recording every transpose rule call in order."""
    calls = []

    def recording(prim, rule):
        def rule_and_record(cts, *args, **params):
            cts_in = rule(cts, *args, **params)
            calls.append((prim, cts, cts_in))
            return cts_in

        return rule_and_record

    originals = {e.primitive: e.primitive.rules.get("transpose") for e in jaxpr.eqns}
    for prim, rule in originals.items():
        if rule is not None:
            prim.rules["transpose"] = recording(prim, rule)
    try:
        cts_in = ns["backward_pass"](jaxpr, args, cotangents_out)
    finally:
        for prim, rule in originals.items():
            if rule is not None:
                prim.rules["transpose"] = rule
    return cts_in, calls


def draw_transposition(jaxpr, residuals, seed, *, ns):
    """Transpose ``jaxpr`` (residuals first, then linear inputs) with the output
    cotangent ``seed``; return an SVG of each equation with the cotangents it
    passed, and the input cotangents."""
    from html import escape

    import numpy as np
    from IPython.display import SVG

    Var, UndefPrimal = ns["Var"], ns["UndefPrimal"]
    linear_in = jaxpr.in_binders[len(residuals) :]
    undefs = [UndefPrimal(v.aval) for v in linear_in]
    cts_in, calls = _record_backward_pass(ns, jaxpr, [*residuals, *undefs], [seed])
    # backward_pass visits the equations that involve linear values in reverse.
    linear, linear_eqns = set(linear_in), []
    for eqn in jaxpr.eqns:
        if any(isinstance(x, Var) and x in linear for x in eqn.inputs):
            linear_eqns.append(eqn)
            linear.update(eqn.out_binders)
    assert len(calls) == len(linear_eqns)
    received = {}  # variable -> cotangents it received, in backward order
    step = {}  # equation -> (cotangent of its output, cotangents it sends)
    for eqn, (prim, cts_out, cts_sent) in zip(reversed(linear_eqns), calls):
        assert prim is eqn.primitive
        sent = [(x, ct) for x, ct in zip(eqn.inputs, cts_sent) if ct is not None]
        for x, ct in sent:
            received.setdefault(x, []).append(ct)
        step[id(eqn)] = (cts_out[0], sent)

    def num(x):
        x = np.asarray(x)
        return f"{float(x):.4g}" if x.ndim == 0 else np.array2string(x, precision=3)

    names = ns["_Names"]()
    eqn_lines = ns["pp_jaxpr"](jaxpr, names=names).splitlines()
    eqn_lines = eqn_lines[1 : 1 + len(jaxpr.eqns)]
    blue, orange = _BLUE, _ORANGE
    row, top, split, width = 24, 64, 300, 760
    rows = []  # (left text, right text, fill)
    known = "  ".join(
        f"{names(v)} = {num(r)}" for v, r in zip(jaxpr.in_binders, residuals)
    )
    rows.append((f"residuals  {known}", "", blue))
    for v, ct in zip(linear_in, cts_in):
        # in the order of the equations: the reverse of the order received
        terms = [num(c) for c in reversed(received.get(v, []))]
        terms = [t if i == 0 or t[0] != "-" else f"({t})" for i, t in enumerate(terms)]
        total = " + ".join(terms) + (f" = {num(ct)}" if len(terms) > 1 else "")
        rows.append((f"linear input  {names(v)}", f"ct {names(v)} = {total}", orange))
    for eqn, text in zip(jaxpr.eqns, eqn_lines):
        if id(eqn) not in step:
            rows.append((text.strip(), "", blue))
            continue
        ct_out, sent = step[id(eqn)]
        sends = ", ".join(
            f"ct {names(x)} {'+=' if len(received[x]) > 1 else '='} {num(ct)}"
            for x, ct in sent
        )
        rows.append(
            (
                text.strip(),
                f"ct {names(eqn.out_binders[0])} = {num(ct_out)}  \u2192  {sends}",
                orange,
            )
        )
    outs = " ".join(names(x) for x in jaxpr.outs)
    rows.append((f"output  {outs}", f"ct {outs} = {num(seed)}  (the seed)", orange))

    height = top + row * len(rows) + 16
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        'font-family="monospace" font-size="13">',
        "<title>A linear jaxpr transposed by backward_pass</title>",
        '<defs><marker id="tip" markerWidth="8" markerHeight="8" refX="4" refY="4" '
        'orient="auto"><path d="M0,0 L8,4 L0,8 z" fill="#a33"/></marker></defs>',
        '<text x="20" y="22" font-family="sans-serif" font-weight="bold">'
        "linear jaxpr (runs top to bottom)</text>",
        f'<text x="{split + 20}" y="22" font-family="sans-serif" font-weight="bold" '
        'fill="#a33">backward_pass: cotangents (runs bottom to top)</text>',
        f'<text x="{split + 20}" y="42" font-family="sans-serif" fill="#555">'
        "ct v: the cotangent of v; a variable used twice adds its cotangents"
        "</text>",
    ]
    for i, (left, right, fill) in enumerate(rows):
        y = top + row * i
        span = width - 56 if i == 0 else split - 4
        parts.append(
            f'<rect x="16" y="{y}" width="{span}" height="{row - 3}" fill="{fill}"/>'
            f'<text x="22" y="{y + 16}" xml:space="preserve">{escape(left)}</text>'
        )
        if right:
            parts.append(
                f'<text x="{split + 20}" y="{y + 16}" fill="#a33" '
                f'xml:space="preserve">{escape(right)}</text>'
            )
    y0, y1 = top + row * (len(rows) - 1) + 10, top + row + 10
    parts.append(
        f'<line x1="{width - 20}" y1="{y0}" x2="{width - 20}" y2="{y1}" '
        'stroke="#a33" stroke-width="2" marker-end="url(#tip)"/></svg>'
    )
    return SVG("".join(parts)), cts_in


# ---------------------------------------------------------------- appendix


class RuleTable:
    """Rows of (primitive, status per rule kind): an HTML table on the page,
    plain text in the notebook's text output (which the tests compare)."""

    def __init__(self, kinds, rows, origins=None):
        self.kinds, self.rows = kinds, rows
        self.origins = origins or {}  # primitive name -> the chapter that adds it

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

        head = "".join(cell(c, "th") for c in ("primitive", "from", *self.kinds))
        body = "".join(
            f"<tr><td><code>{name}</code></td>"
            f"<td>{self.origins.get(name, '')}</td>{''.join(map(cell, statuses))}</tr>"
            for name, *statuses in self.rows
        )
        return (
            '<div style="overflow-x: auto"><table style="font-size: 0.85em">'
            f"<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>"
        )


# The primitives whose partial evaluation needs a rule of its own: Part 4's
# generic rule does not fit them. (Part 8's custom calls carry jaxprs too, but
# the generic rule is right for them: a call is known or staged as a whole.)
HIGHER_ORDER = ("xla_call", "cond", "while", "scan", "pmap", "checkpoint")


# NOT_LINEAR primitives that are there for a reason other than being
# non-linear in every operand (the rule table page explains each).
_NO_TRANSPOSE_REASONS = {
    "axis_index": "no operand",
    "custom_vjp_call": "via bwd",
    "while": "trips not saved",
    "debug_print": "no outputs",
}


def rule_status(prim, kind, not_linear, never_transposed=frozenset()):
    """One cell of the table: "yes", "refused", "not linear", "never
    transposed", "generic" or "MISSING".

    A rule is "refused" when it exists only to raise a clear error (Part 9's
    lowering of pmap inside jit, the evaluation of a collective, Part 8's
    forward rules of custom_lin): it is marked ``only_raises`` or its body is
    one ``raise`` statement."""
    rule = prim.rules.get(kind)
    if rule is not None and (
        getattr(rule, "only_raises", False) or _body_only_raises(rule)
    ):
        return "refused"
    if rule is not None:
        return "yes"
    if kind == "transpose" and prim.name in not_linear:
        return _NO_TRANSPOSE_REASONS.get(prim.name, "not linear")
    if kind == "transpose" and prim.name in never_transposed:
        return "never transposed"
    if kind.startswith("partial_eval") and prim.name not in HIGHER_ORDER:
        return "generic"
    return "MISSING"


def rule_table(ns):
    """Print the size and gaps of the primitive x rule table, then return it.

    ``ns`` is the namespace holding the registries (a chapter's ``globals()``):
    ``PRIMITIVES``, ``RULE_KINDS``, ``NOT_LINEAR`` and ``NEVER_TRANSPOSED``.
    """
    kinds, not_linear = ns["RULE_KINDS"], ns["NOT_LINEAR"]
    never = ns["NEVER_TRANSPOSED"]
    rows = [
        (name, *(rule_status(prim, kind, not_linear, never) for kind in kinds))
        for name, prim in sorted(ns["PRIMITIVES"].items())
    ]
    gaps = [(r[0], k) for r in rows for k, s in zip(kinds, r[1:]) if s == "MISSING"]
    print(f"{len(rows)} primitives, {len(kinds)} kinds of rule, gaps: {gaps}")
    return RuleTable(kinds, rows, primitive_origins())


_CHAPTER_LABELS = {
    "appendix_primitives": "appendix",
    "indexing": "indexing",
    "performance": "performance",
    "analysis": "reading programs",
    "random": "random numbers",
}


def primitive_origins():
    """Primitive name -> the chapter whose library code creates it, read from
    the tangled module's chapter markers."""
    import importlib.util
    import re

    source = open(importlib.util.find_spec("autodidax").origin).read()
    marks = [
        (m.start(), m.group(1))
        for m in re.finditer(r"^# ==== chapter: (\S+) ====$", source, re.M)
    ]
    origins = {}
    for m in re.finditer(r'Primitive\(\s*"([\w-]+)"', source):
        chapter = [name for start, name in marks if start < m.start()][-1]
        part = re.match(r"part(\d+)_", chapter)
        origins.setdefault(
            m.group(1),
            f"Part {part.group(1)}" if part else _CHAPTER_LABELS.get(chapter, chapter),
        )
    return origins


# ---------------------------------------------------------------- performance

import math
from html import escape

from IPython.display import HTML, SVG

_BENCH_GREEN, _BENCH_RED, _BENCH_BLUE, _BENCH_GREY = (
    "#2e7d32",
    "#c62828",
    "#1f5fa8",
    "#888888",
)


def _bench_dot_color(row):
    if row["met"] is None:
        return _BENCH_BLUE
    return _BENCH_GREEN if row["met"] else _BENCH_RED


def benchmark_ratio_chart(rows):
    """An SVG dot chart of autodidax / JAX per headline row (log axis)."""
    ratios = [row["ratios"]["autodidax"] for row in rows]
    marks = [row["target_ratio"] for row in rows if row["target_ratio"]]
    low = 10 ** math.floor(math.log10(min([*ratios, 1.0])))
    high = 10 ** math.ceil(math.log10(max([*ratios, *marks, 1.0])))
    left, right, top, row_height = 300, 650, 64, 26
    width, height = 740, top + row_height * len(rows) + 46

    def x(ratio):
        share = math.log(ratio / low) / math.log(high / low)
        return left + share * (right - left)

    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" '
        f'height="{height}" font-family="sans-serif" font-size="13">',
        "<title>autodidax time / JAX time, per benchmark</title>",
        f'<rect x="{left}" y="{top - 8}" width="{x(1.0) - left:.1f}" '
        f'height="{row_height * len(rows) + 8}" fill="#eef5ee"/>',
        f'<text x="{x(1.0) - 6:.1f}" y="{top - 16}" text-anchor="end" '
        f'fill="{_BENCH_GREEN}">autodidax faster</text>',
        f'<text x="{x(1.0) + 6:.1f}" y="{top - 16}" fill="{_BENCH_GREY}">JAX faster</text>',
    ]
    legend = [
        (_BENCH_GREEN, "target met"),
        (_BENCH_RED, "target missed"),
        (_BENCH_BLUE, "no target"),
    ]
    for i, (color, text) in enumerate(legend):
        parts.append(
            f'<circle cx="{left + 8 + 120 * i}" cy="14" r="5" fill="{color}"/>'
            f'<text x="{left + 18 + 120 * i}" y="18">{text}</text>'
        )
    bottom = top + row_height * len(rows)
    exponent = round(math.log10(low))
    while 10**exponent <= high:
        for step in (1, 2, 5):
            tick = step * 10.0**exponent
            if low <= tick <= high:
                label = f"{tick:g}"
                parts.append(
                    f'<line x1="{x(tick):.1f}" y1="{top - 8}" x2="{x(tick):.1f}" '
                    f'y2="{bottom}" stroke="#dddddd"/>'
                    f'<text x="{x(tick):.1f}" y="{bottom + 18}" '
                    f'text-anchor="middle" fill="#555555">{label}</text>'
                )
        exponent += 1
    parts.append(
        f'<line x1="{x(1.0):.1f}" y1="{top - 8}" x2="{x(1.0):.1f}" y2="{bottom}" '
        'stroke="#333333" stroke-width="1.5"/>'
        f'<text x="{(left + right) / 2}" y="{bottom + 38}" text-anchor="middle">'
        "autodidax time / JAX time (log scale)</text>"
    )
    previous = None
    for i, row in enumerate(rows):
        y = top + row_height * i + row_height / 2
        if previous is not None and row["benchmark"] != previous:
            parts.append(
                f'<line x1="10" y1="{y - row_height / 2:.1f}" x2="{right}" '
                f'y2="{y - row_height / 2:.1f}" stroke="#cccccc" '
                'stroke-dasharray="2,3"/>'
            )
        previous = row["benchmark"]
        label = escape(f"{row['benchmark']}, {row['case']}")
        ratio = row["ratios"]["autodidax"]
        parts.append(f'<text x="10" y="{y + 4:.1f}">{label}</text>')
        if row["target_ratio"]:
            target_x = x(row["target_ratio"])
            parts.append(
                f'<line x1="{target_x:.1f}" y1="{y - 8:.1f}" x2="{target_x:.1f}" '
                f'y2="{y + 8:.1f}" stroke="{_BENCH_GREY}" stroke-width="3"/>'
            )
        parts.append(
            f'<circle cx="{x(ratio):.1f}" cy="{y:.1f}" r="6" '
            f'fill="{_bench_dot_color(row)}"/>'
            f'<text x="{right + 12}" y="{y + 4:.1f}">{ratio:.2f}×</text>'
        )
    parts.append("</svg>")
    return SVG("".join(parts))


def _bench_number(value):
    return f"{value:.0f}" if value >= 100 else f"{value:.3g}"


def _bench_verdict(target, met):
    if target is None:
        return ""
    return f"{target}: " + ("met" if met else "<strong>missed</strong>")


def _bench_html_table(caption, header, rows, numeric):
    """An HTML table; the columns in ``numeric`` are right-aligned."""

    def cells(tag, values):
        return "".join(
            f'<{tag} style="text-align: {"right" if i in numeric else "left"}">'
            f"{value}</{tag}>"
            for i, value in enumerate(values)
        )

    body = "".join(f"<tr>{cells('td', row)}</tr>" for row in rows)
    return (
        f'<table class="table"><caption>{escape(caption)}</caption>'
        f"<thead><tr>{cells('th', header)}</tr></thead><tbody>{body}</tbody></table>"
    )


def benchmark_tables(report):
    """HTML tables of a bench report: medians per benchmark, and growth."""
    main_rows = [
        [
            escape(row["benchmark"]),
            escape(row["case"]),
            escape(row["unit"]),
            _bench_number(row["values"]["autodidax"]),
            _bench_number(row["values"]["jax"]),
            f"{row['ratios']['autodidax']:.2f}",
            _bench_verdict(row["target"], row["met"]),
        ]
        for row in report["headline"]
    ]
    growth_rows = []
    for growth in report["growth"]:
        kinds = [("time_ratios", "met", "")]
        if "cpu_time_ratios" in growth:  # reports from before lack CPU times
            kinds.append(("cpu_time_ratios", "cpu_met", " (CPU time)"))
        for ratios, met, which in kinds:
            growth_rows.append(
                [
                    escape(growth["benchmark"]) + which,
                    f"{growth['sizes'][0]} → {growth['sizes'][-1]} primitives",
                    f"{growth[ratios]['autodidax']:.2f}×",
                    f"{growth[ratios]['jax']:.2f}×",
                    _bench_verdict(f"≤ {growth['max_time_ratio']:.1f}×", growth[met]),
                ]
            )
    return HTML(
        _bench_html_table(
            "Medians per benchmark",
            [
                "benchmark",
                "case",
                "unit",
                "autodidax",
                "JAX",
                "autodidax / JAX",
                "target",
            ],
            main_rows,
            numeric={3, 4, 5},
        )
        + _bench_html_table(
            "Growth: time at the larger size divided by time at the smaller",
            ["benchmark", "sizes", "autodidax", "JAX", "target"],
            growth_rows,
            numeric={2, 3},
        )
    )


def benchmark_summary_table(report, groups):
    """HTML table, one row per group of benchmarks: the range of autodidax /
    JAX over the group's rows of ``report["headline"]``, their targets and
    growth targets, and a note on what decides the ratio.

    ``groups``: (label, headline ids, growth ids, note) per row.
    """
    headline = {row["id"]: row for row in report["headline"]}
    growth = {row["id"]: row for row in report["growth"]}
    rows = []
    for label, ids, growth_ids, note in groups:
        ratios = [headline[i]["ratios"]["autodidax"] for i in ids]
        low, high = min(ratios), max(ratios)
        span = (
            f"{low:.2f}" if f"{low:.2f}" == f"{high:.2f}" else f"{low:.2f}–{high:.2f}"
        )
        by_target = {}  # target -> the benchmarks it applies to
        for i in ids:
            row = headline[i]
            if row["target"] is not None:
                target = row["target"]
                if target.startswith("<") and "/" in row["unit"]:  # a time per unit
                    target += " per " + row["unit"].split("/", 1)[1]
                by_target.setdefault(target, []).append(row["benchmark"])
        verdicts = [
            escape(target)
            + (f" ({escape(', '.join(names))})" if len(by_target) > 1 else "")
            for target, names in by_target.items()
        ]
        met = [headline[i]["met"] for i in ids if headline[i]["target"] is not None]
        if verdicts:
            verdicts = [
                "; ".join(verdicts)
                + (": met" if all(met) else ": <strong>missed</strong>")
            ]
        for i in growth_ids:
            g = growth[i]
            verdicts.append(
                f"{g['size_ratio']:.0f}× the primitives in ≤ {g['max_time_ratio']:.1f}×"
                f" the time ({g['time_ratios']['autodidax']:.2f}×): "
                + ("met" if g["met"] else "<strong>missed</strong>")
            )
        rows.append([escape(label), span, "; ".join(verdicts), escape(note)])
    return HTML(
        _bench_html_table(
            "Other programs: autodidax's median time / JAX's",
            ["benchmark", "autodidax / JAX", "target", "what decides the ratio"],
            rows,
            numeric={1},
        )
    )


_STEP_COLORS = {
    "arguments": "#9e9e9e",
    "signature": "#f9a825",
    "bind": "#c62828",
    "copy": "#6a1b9a",
    "execute": "#1f5fa8",
    "outputs": "#2e7d32",
}
_DISPATCH_KINDS = {
    "python float": "Python float",
    "numpy scalar": "NumPy scalar",
    "numpy array": "NumPy array",
    "device array": "device Array",
}


def dispatch_profile_chart(dispatch, paths=("full_path", "fast_path")):
    """Stacked bars: the median of every step of one call, per kind of
    argument, Part 3's jit above the fast path (``paths`` picks which of the
    two are drawn); a tick at jax.jit's call."""
    steps, calls, labels = dispatch["steps"], dispatch["calls"], dispatch["step_labels"]
    longest = max(row["full_path"]["sum_us"] for row in steps.values())
    jax_times = [
        calls[kind]["jax"]["median_us"] for kind in steps if "jax" in calls[kind]
    ]
    scale_max = max([longest, *jax_times]) * 1.05
    left, right, top, bar, gap = 110, 470, 70, 18, 26
    width = 690
    height = top + len(steps) * (len(paths) * bar + gap) + 40

    def x(us):
        return left + us / scale_max * (right - left)

    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" '
        f'height="{height}" font-family="sans-serif" font-size="13">',
        "<title>The steps of one jitted call</title>",
    ]
    for i, (step, label) in enumerate(labels.items()):
        column, line = i % 3, i // 3
        lx, ly = 10 + 225 * column, 16 + 20 * line
        parts.append(
            f'<rect x="{lx}" y="{ly - 10}" width="12" height="12" '
            f'fill="{_STEP_COLORS[step]}"/>'
            f'<text x="{lx + 18}" y="{ly}">{escape(label)}</text>'
        )
    y = top
    for kind, row in steps.items():
        parts.append(
            f'<text x="10" y="{y + bar + 4}" font-weight="bold">'
            f"{escape(_DISPATCH_KINDS.get(kind, kind))}</text>"
        )
        for path, name in (("full_path", "Part 3's jit"), ("fast_path", "fast path")):
            if path not in row or path not in paths:
                continue
            start = 0.0
            for step, us in row[path]["steps_us"].items():
                parts.append(
                    f'<rect x="{x(start):.1f}" y="{y}" width="{x(start + us) - x(start):.1f}" '
                    f'height="{bar - 2}" fill="{_STEP_COLORS[step]}">'
                    f"<title>{escape(labels[step])}: {us:.2f} µs</title></rect>"
                )
                start += us
            whole = (
                calls[kind]
                .get("autodidax" if path == "fast_path" else "full_path", {})
                .get("median_us")
            )
            text = f"{name}: {start:.1f}"
            if whole is not None:
                text += f" (call {whole:.1f})"
            parts.append(
                f'<text x="{x(start) + 6:.1f}" y="{y + bar - 5}">{text}</text>'
            )
            y += bar
        if "jax" in calls[kind]:
            jx = x(calls[kind]["jax"]["median_us"])
            parts.append(
                f'<line x1="{jx:.1f}" y1="{y - len(paths) * bar - 3}" x2="{jx:.1f}" y2="{y + 1}" '
                'stroke="#000000" stroke-width="2.5"/>'
            )
        y += gap
    parts.append(
        f'<line x1="{left}" y1="{top - 6}" x2="{left}" y2="{y - gap + 4}" stroke="#333333"/>'
    )
    for tick in range(0, int(scale_max) + 1, 10 if scale_max > 40 else 5):
        parts.append(
            f'<text x="{x(tick):.1f}" y="{y}" text-anchor="middle" fill="#555555">'
            f"{tick}</text>"
        )
    parts.append(
        f'<text x="{(left + right) / 2}" y="{y + 22}" text-anchor="middle">'
        "µs (medians): sum of the steps (whole call); black tick: jax.jit's call"
        "</text></svg>"
    )
    return SVG("".join(parts))


def dispatch_kinds_table(dispatch):
    """HTML table: median µs per call per kind of argument, three ways, and
    the floor: jaxlib's calls alone, as a ratio to JAX."""
    rows = []
    floors = dispatch.get("floor", {})
    for kind, row in dispatch["calls"].items():
        ratio = row["ratios"]["autodidax"]
        target = dispatch["target_ratios"][kind]
        full = row.get("full_path", {}).get("median_us")
        floor = floors.get(kind, {}).get("ratio")
        rows.append(
            [
                escape(_DISPATCH_KINDS.get(kind, kind)),
                "" if full is None else _bench_number(full),
                _bench_number(row["autodidax"]["median_us"]),
                _bench_number(row["jax"]["median_us"]),
                f"{ratio:.2f}",
                "" if floor is None else f"{floor:.2f}",
                _bench_verdict(f"≤ {target}×", ratio <= target),
            ]
        )
    return HTML(
        _bench_html_table(
            "jit dispatch, median µs per call of sin(x) * 2.0 + x",
            [
                "argument",
                "Part 3's jit",
                "fast path",
                "jax.jit",
                "fast path / JAX",
                "jaxlib alone / JAX",
                "target",
            ],
            rows,
            numeric={1, 2, 3, 4, 5},
        )
    )


def capstone_breakdown_table(capstone):
    """HTML table: where the time of the capstone's training step goes, median
    ms per piece for autodidax and JAX (bench_capstone.py's report)."""
    pieces = capstone["pieces_ms"]

    def row(label, values):
        ours, jax = values["autodidax"], values["jax"]
        return [
            escape(label),
            _bench_number(ours),
            _bench_number(jax),
            f"{ours / jax:.2f}",
        ]

    rows = [
        row("jit(loss): the forward pass", pieces["forward"]),
        row("jit(value_and_grad): forward and backward", pieces["value_and_grad"]),
        row("training step: also Adam's update", pieces["train_step"]),
        row("… of which until the call returns", pieces["dispatch"]),
    ]
    config = capstone["config"]
    caption = (
        f"capstone training step (d_model {config['d_model']}, {config['n_layers']} "
        f"layers, context {config['context']}, batch {config['batch_size']}, "
        "float64), median ms"
    )
    return HTML(
        _bench_html_table(
            caption, ["piece", "autodidax", "JAX", "autodidax / JAX"], rows, {1, 2, 3}
        )
    )


def scaling_chart(report):
    """Two panels, make_jaxpr and grad: each library's time per call against
    program size, both relative to the largest size, so that linear cost is
    the diagonal; bars from the fastest to the slowest run."""
    panels = [
        ("make_jaxpr", "make_jaxpr of a chain"),
        ("grad", "eager grad of a chain"),
    ]
    colors = {"autodidax": _BENCH_GREEN, "jax": _BENCH_BLUE}
    panel_w, panel_h, margin = 300, 240, 70
    width, height = 2 * (panel_w + margin) + 30, panel_h + 134
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" '
        f'height="{height}" font-family="sans-serif" font-size="13">',
        "<title>Time against program size for make_jaxpr and grad</title>",
    ]
    for i, (name, color) in enumerate(colors.items()):
        parts.append(
            f'<circle cx="{margin + 8 + 110 * i}" cy="14" r="5" fill="{color}"/>'
            f'<text x="{margin + 18 + 110 * i}" y="18">{name}</text>'
        )
    parts.append(
        f'<line x1="{margin + 230}" y1="14" x2="{margin + 260}" y2="14" '
        f'stroke="{_BENCH_GREY}" stroke-dasharray="4,3"/>'
        f'<text x="{margin + 268}" y="18">linear: time in proportion to size</text>'
    )
    if any(
        "median_cpu_s" in row for row in report["results"]["grad"]["results"]["jax"]
    ):
        parts.append(
            f'<circle cx="{margin + 8}" cy="34" r="4" fill="white" '
            f'stroke="{_BENCH_GREY}" stroke-width="2"/>'
            f'<text x="{margin + 18}" y="38">CPU time (filled: wall-clock time)</text>'
        )
    for p, (key, title) in enumerate(panels):
        data = report["results"][key]
        x0, y0 = margin + p * (panel_w + margin), 70
        n_max = max(data["sizes"])
        y_top = 1.25

        def px(share, x0=x0):
            return x0 + share * panel_w

        def py(share, y0=y0, y_top=y_top):
            return y0 + panel_h - share / y_top * panel_h

        parts.append(
            f'<text x="{x0 + panel_w / 2}" y="{y0 - 10}" text-anchor="middle" '
            f'font-weight="bold">{escape(title)}</text>'
            f'<line x1="{x0}" y1="{y0}" x2="{x0}" y2="{y0 + panel_h}" stroke="#333"/>'
            f'<line x1="{x0}" y1="{y0 + panel_h}" x2="{x0 + panel_w}" '
            f'y2="{y0 + panel_h}" stroke="#333"/>'
            f'<line x1="{px(0):.1f}" y1="{py(0):.1f}" x2="{px(1):.1f}" '
            f'y2="{py(1):.1f}" stroke="{_BENCH_GREY}" stroke-dasharray="4,3"/>'
        )
        for n in data["sizes"]:
            parts.append(
                f'<text x="{px(n / n_max):.1f}" y="{y0 + panel_h + 16}" '
                f'text-anchor="middle" fill="#555555">{n}</text>'
            )
        for share in (0.0, 0.5, 1.0):
            parts.append(
                f'<text x="{x0 - 6}" y="{py(share) + 4:.1f}" text-anchor="end" '
                f'fill="#555555">{share:g}</text>'
            )
        parts.append(
            f'<text x="{x0 + panel_w / 2}" y="{y0 + panel_h + 36}" '
            'text-anchor="middle">primitives in the program</text>'
            f'<text x="{x0 - 40}" y="{y0 + panel_h / 2}" text-anchor="middle" '
            f'transform="rotate(-90 {x0 - 40} {y0 + panel_h / 2})">'
            "time / time at the largest size</text>"
        )
        for offset, (library, rows) in zip((-4, 4), data["results"].items()):
            color = colors.get(library, _BENCH_GREY)
            scale = rows[-1]["median_s"]
            largest_ms = scale * 1e3
            for row in rows:
                cx = px(row["n"] / n_max) + offset
                low = min(row["min_s"] / scale, y_top)
                high = min(row["max_s"] / scale, y_top)
                ms = row["median_s"] * 1e3
                parts.append(
                    f'<line x1="{cx:.1f}" y1="{py(low):.1f}" x2="{cx:.1f}" '
                    f'y2="{py(high):.1f}" stroke="{color}" stroke-opacity="0.5" '
                    'stroke-width="2"/>'
                    f'<circle cx="{cx:.1f}" cy="{py(row["median_s"] / scale):.1f}" '
                    f'r="5" fill="{color}"><title>{library}, N={row["n"]}: '
                    f"median {ms:.2f} ms</title></circle>"
                )
                if "median_cpu_s" in rows[-1] and "median_cpu_s" in row:
                    share = row["median_cpu_s"] / rows[-1]["median_cpu_s"]
                    parts.append(
                        f'<circle cx="{cx:.1f}" cy="{py(min(share, y_top)):.1f}" '
                        f'r="4" fill="white" stroke="{color}" stroke-width="2">'
                        f"<title>{library}, N={row['n']}: CPU time, relative "
                        f"{share:.2f}</title></circle>"
                    )
            parts.append(
                f'<text x="{x0 + 8}" y="{y0 + 14 + 16 * (offset > 0)}" '
                f'fill="{color}">{library}: {_bench_number(largest_ms)} ms at N={n_max}'
                "</text>"
            )
    parts.append("</svg>")
    return SVG("".join(parts))


# ---------------------------------------------------------------- analysis


def cost_comparison_table(rows):
    """Our counts next to XLA's: ``rows`` of (program, ours, XLA's after
    optimization, XLA's before), each count a dict with XLA's key names."""

    def n(costs, key):
        value = costs.get(key)
        return "—" if value is None else f"{value:,.0f}"

    header = [
        "program",
        "flops: ours",
        "XLA",
        "XLA unopt.",
        "transc.: ours",
        "XLA",
        "bytes: ours",
        "XLA",
        "XLA unopt.",
    ]
    body = [
        [
            escape(name),
            n(ours, "flops"),
            n(xla, "flops"),
            n(before, "flops"),
            n(ours, "transcendentals"),
            n(xla, "transcendentals"),
            n(ours, "bytes accessed"),
            n(xla, "bytes accessed"),
            n(before, "bytes accessed"),
        ]
        for name, ours, xla, before in rows
    ]
    caption = (
        "cost_analysis (ours), and XLA's cost analysis of JAX's program: "
        "optimized (compile().cost_analysis()) and unoptimized "
        "(lower().cost_analysis()); — : no such key"
    )
    table = _bench_html_table(caption, header, body, set(range(1, 9)))
    table = table.replace('<table class="table">', '<table style="font-size: 0.85em">')
    return HTML(f'<div style="overflow-x: auto">{table}</div>')


def gradient_ratio_chart(series):
    """grad's flops over the function's, against size (log scale), one line
    per ``series`` entry: name -> (sizes, ratios)."""
    colors = [_BENCH_GREEN, _BENCH_BLUE]
    w, h, margin = 420, 220, 60
    width, height = w + 2 * margin, h + 90
    top = max(max(r) for _, r in series.values()) * 1.25

    def py(ratio):
        return 40 + h - ratio / top * h

    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" '
        f'height="{height}" font-family="sans-serif" font-size="13">',
        "<title>Flops of grad over flops of the function, against size</title>",
        f'<line x1="{margin}" y1="40" x2="{margin}" y2="{40 + h}" stroke="#333"/>',
        f'<line x1="{margin}" y1="{40 + h}" x2="{margin + w}" y2="{40 + h}" '
        'stroke="#333"/>',
        f'<text x="{margin + w / 2}" y="{h + 84}" text-anchor="middle">'
        "depth or length (log scale)</text>",
        f'<text x="16" y="{40 + h / 2}" text-anchor="middle" '
        f'transform="rotate(-90 16 {40 + h / 2})">grad flops / forward flops</text>',
    ]
    for tick in range(int(top) + 1):
        parts.append(
            f'<text x="{margin - 6}" y="{py(tick) + 4:.1f}" text-anchor="end" '
            f'fill="#555555">{tick}</text>'
        )
    for i, (name, (sizes, ratios)) in enumerate(series.items()):
        color = colors[i % len(colors)]
        lo, hi = math.log(min(sizes)), math.log(max(sizes))

        def px(size, lo=lo, hi=hi):
            return margin + 20 + (math.log(size) - lo) / (hi - lo) * (w - 40)

        points = " ".join(f"{px(s):.1f},{py(r):.1f}" for s, r in zip(sizes, ratios))
        parts.append(
            f'<polyline points="{points}" fill="none" stroke="{color}" '
            'stroke-width="2"/>'
        )
        for s, r in zip(sizes, ratios):
            parts.append(
                f'<circle cx="{px(s):.1f}" cy="{py(r):.1f}" r="4" fill="{color}">'
                f"<title>{escape(name)} {s}: {r:.2f}</title></circle>"
            )
            parts.append(
                f'<text x="{px(s):.1f}" y="{40 + h + 16 + 15 * i}" '
                f'text-anchor="middle" fill="{color}">{s}</text>'
            )
        parts.append(
            f'<circle cx="{margin + 8 + 200 * i}" cy="14" r="5" fill="{color}"/>'
            f'<text x="{margin + 18 + 200 * i}" y="18">{escape(name)}</text>'
        )
    parts.append("</svg>")
    return SVG("".join(parts))


# ---------------------------------------------------------------- Part 9


def _body_only_raises(rule) -> bool:
    """Whether ``rule``'s body (after any docstring) is a single ``raise``."""
    import ast
    import inspect
    import textwrap

    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(rule)))
    except (OSError, TypeError, SyntaxError):  # no source to read
        return False
    if not (tree.body and isinstance(tree.body[0], ast.FunctionDef)):
        return False  # a lambda or a call: not a plain function definition
    body = tree.body[0].body
    if (
        body
        and isinstance(body[0], ast.Expr)
        and isinstance(body[0].value, ast.Constant)
    ):
        body = body[1:]  # the docstring
    return len(body) == 1 and isinstance(body[0], ast.Raise)


def draw_rows_on_devices(x, y, collective="psum: all_reduce (add)"):
    """Part 9: ``y = pmap(f)(x)`` as lanes, one per device: row ``k`` of ``x``
    goes to device ``k``, every device runs the same program, the collective
    joins them in the middle, and row ``k`` of ``y`` stays on device ``k``."""
    import numpy as np
    from IPython.display import SVG

    def row_text(values):
        return "[" + ", ".join(f"{v:.3g}" for v in values) + "]"

    shards = y.addressable_shards
    lane_h, top, n = 46, 56, len(shards)
    height = top + n * lane_h + 30
    mid = 400
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="760" height="{height}"'
        ' font-family="sans-serif" font-size="13">',
        f"<title>pmap over {n} devices: one row per device, one collective</title>",
        '<defs><marker id="rows-arrow" markerWidth="8" markerHeight="8" refX="6" '
        'refY="4" orient="auto"><path d="M0,0 L8,4 L0,8 z" fill="#333"/>'
        "</marker></defs>",
        '<text x="20" y="24" font-weight="bold">input row</text>',
        f'<text x="{mid - 90}" y="24" font-weight="bold">one replica per device</text>',
        '<text x="590" y="24" font-weight="bold">output row, still there</text>',
    ]
    for k, shard in enumerate(shards):
        y0 = top + k * lane_h
        out = np.asarray(shard.data)[0]
        parts.append(
            f'<text x="20" y="{y0 + 24}">{row_text(np.asarray(x)[k])}</text>'
            f'<rect x="{mid - 150}" y="{y0}" width="300" height="{lane_h - 12}" '
            'rx="6" fill="#dbe9f6" stroke="#555"/>'
            f'<text x="{mid - 138}" y="{y0 + 22}">device {shard.device.id}: the '
            "same program</text>"
            f'<text x="590" y="{y0 + 24}">{row_text(out)}</text>'
        )
        for x0, x1 in [(160, mid - 156), (mid + 152, 584)]:
            parts.append(
                f'<line x1="{x0}" y1="{y0 + 17}" x2="{x1}" y2="{y0 + 17}" '
                'stroke="#333" marker-end="url(#rows-arrow)"/>'
            )
    band_top, band_bottom = top - 8, top + n * lane_h - 4
    parts.append(
        f'<rect x="{mid + 60}" y="{band_top}" width="28" '
        f'height="{band_bottom - band_top}" rx="4" fill="#fde2c8" stroke="#b45309"/>'
        f'<text x="{mid + 20}" y="{band_bottom + 22}" fill="#b45309">{collective}: '
        "every replica gets the total</text></svg>"
    )
    return SVG("".join(parts))


# --------------------------------------------------------------- dtype promotion

PROMOTION_TYPES = ["bool", "int32", "int64", "float32", "float64", "int", "float"]
_SHORT = {"bool": "bool", "int32": "i32", "int64": "i64", "float32": "f32"}
_SHORT.update({"float64": "f64", "int": "int", "float": "float"})


def _jax_result_dtype(a, b):
    """The dtype jax.numpy gives ``x + y`` for two types of PROMOTION_TYPES
    ("int" and "float" are Python numbers), with 64-bit types on."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    def operand(name):
        if name in ("int", "float"):
            return {"int": 1, "float": 1.5}[name]
        return jnp.ones(2, np.dtype(name))

    with jax.enable_x64(True):
        return np.dtype(jnp.add(operand(a), operand(b)).dtype)


def promotion_table(promote_types, types=PROMOTION_TYPES):
    """Print ours for every pair of ``types``, and how many pairs agree with
    jax.numpy (a cell that disagrees is marked with ``!`` and JAX's dtype)."""
    width = 9
    print(" " * 7 + "".join(_SHORT[t].rjust(width) for t in types))
    disagree = 0
    for a in types:
        cells = []
        for b in types:
            ours = promote_types(a, b)
            theirs = _jax_result_dtype(a, b)
            cell = _SHORT.get(ours.name, ours.name)
            if ours != theirs:
                disagree += 1
                cell += "!" + _SHORT.get(theirs.name, theirs.name)
            cells.append(cell.rjust(width))
        print(_SHORT[a].ljust(7) + "".join(cells))
    pairs = len(types) ** 2
    print(f"\nagrees with jax.numpy on {pairs - disagree} of {pairs} pairs")


# ---------------------------------------------------------------- Part 11


def residual_bytes_chart(sizes, measured):
    """Residual bytes against trip count, both axes logarithmic. ``measured``
    maps (scheme, library) -> bytes per size; autodidax ("ours") is drawn as
    lines with dots, the other library as rings on the same scale."""
    colors = ["#c0392b", _BENCH_BLUE, _BENCH_GREEN, "#8e44ad"]
    w, h, margin = 440, 240, 70
    width, height = w + 2 * margin + 150, h + 90
    values = [b for row in measured.values() for b in row if b > 0]
    lo_b, hi_b = math.log(min(values)) - 0.3, math.log(max(values)) + 0.3
    lo_n, hi_n = math.log(min(sizes)), math.log(max(sizes))

    def px(n):
        return margin + 20 + (math.log(n) - lo_n) / (hi_n - lo_n) * (w - 40)

    def py(b):
        return 30 + h - (math.log(b) - lo_b) / (hi_b - lo_b) * h

    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" '
        f'height="{height}" font-family="sans-serif" font-size="13">',
        "<title>Residual bytes against the trip count of a scan</title>",
        f'<line x1="{margin}" y1="30" x2="{margin}" y2="{30 + h}" stroke="#333"/>',
        f'<line x1="{margin}" y1="{30 + h}" x2="{margin + w}" y2="{30 + h}" '
        'stroke="#333"/>',
        f'<text x="{margin + w / 2}" y="{h + 78}" text-anchor="middle">'
        "trip count n (log scale)</text>",
        f'<text x="16" y="{30 + h / 2}" text-anchor="middle" '
        f'transform="rotate(-90 16 {30 + h / 2})">residual bytes (log scale)</text>',
    ]
    for n in sizes:
        parts.append(
            f'<text x="{px(n):.1f}" y="{30 + h + 18}" text-anchor="middle" '
            f'fill="#555555">{n}</text>'
        )
    exponent = int(math.floor(lo_b / math.log(10))) + 1
    while math.log(10**exponent) <= hi_b:
        label = f"{10**exponent / 1e3:g} kB"
        parts.append(
            f'<text x="{margin - 6}" y="{py(10**exponent) + 4:.1f}" '
            f'text-anchor="end" fill="#555555">{label}</text>'
        )
        exponent += 1
    schemes = list(dict.fromkeys(scheme for scheme, _ in measured))
    for i, scheme in enumerate(schemes):
        color = colors[i % len(colors)]
        for (name, lib), row in measured.items():
            if name != scheme:
                continue
            points = [(px(n), py(b)) for n, b in zip(sizes, row)]
            if lib == "ours":
                line = " ".join(f"{x:.1f},{y:.1f}" for x, y in points)
                parts.append(
                    f'<polyline points="{line}" fill="none" stroke="{color}" '
                    'stroke-width="2"/>'
                )
            for (x, y), n, b in zip(points, sizes, row):
                fill, r = (color, 4) if lib == "ours" else ("none", 8)
                parts.append(
                    f'<circle cx="{x:.1f}" cy="{y:.1f}" r="{r}" fill="{fill}" '
                    f'stroke="{color}" stroke-width="1.5"><title>{escape(scheme)}, '
                    f"{escape(lib)}, n = {n}: {b} bytes</title></circle>"
                )
        y = 40 + 22 * i
        parts.append(
            f'<line x1="{margin + w + 14}" y1="{y}" x2="{margin + w + 34}" '
            f'y2="{y}" stroke="{color}" stroke-width="2"/>'
            f'<text x="{margin + w + 40}" y="{y + 4}">{escape(scheme)}</text>'
        )
    y = 40 + 22 * len(schemes)
    parts.append(
        f'<circle cx="{margin + w + 24}" cy="{y}" r="7" fill="none" stroke="#333"/>'
        f'<text x="{margin + w + 40}" y="{y + 4}">JAX</text>'
    )
    parts.append("</svg>")
    return SVG("".join(parts))
