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


# ---------------------------------------------------------------- performance
