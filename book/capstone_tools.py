"""The capstone's shared pieces: its model on either library, its text, its chart.

Not part of the library: nothing here is tangled into ``autodidax.py``. The
model of Part 12 lives in that chapter, in the code cells tagged ``model``;
they import nothing and use four names: ``np``, ``jax``, ``jnp`` and ``lax``.
``model_namespace(backend)`` runs those cells, in order, after one backend's
imports, so that the chapter, its tests (``tests/test_part12_capstone.py``)
and the benchmark (``bench/bench_capstone.py``) all run the very same source
on ``autodidax`` and on JAX.

The text the model learns from is ``data/book_prose.txt``, a frozen copy of the
prose of Parts 1-5 (``data/README.md`` says how it was cut); ``load_text``
and ``Vocabulary`` give every user the same characters. The batches come from
the model's own ``sample_batches`` (a ``model`` cell), a function of a key, so
that both libraries draw the same ones.

In Colab, where the notebook is alone, the chapter's folded cell fetches this
file; this file fetches the chapter's source and the text the same way.
"""

from __future__ import annotations

import math
import re
import urllib.request
from html import escape
from pathlib import Path

BOOK_URL = "https://raw.githubusercontent.com/autodidax-book/autodidax/main/"
CHAPTER = "part12_capstone"
MODEL_TAG = "model"
TEXT = "data/book_prose.txt"
BACKENDS = {
    "autodidax": (
        "import autodidax as jax\n"
        "import autodidax.numpy as jnp\n"
        "from autodidax import lax\n"
    ),
    "jax": "import jax\nimport jax.numpy as jnp\nfrom jax import lax\n",
}
HERE = Path(__file__).resolve().parent


def repository_file(path: str) -> Path:
    """``path`` (relative to the repository root) in the checkout around this
    file, or else downloaded next to the notebook (e.g. in Colab)."""
    in_checkout = HERE.parent / path
    if in_checkout.is_file():
        return in_checkout
    local = Path(Path(path).name)
    if not local.is_file():
        urllib.request.urlretrieve(BOOK_URL + path, local)
    return local


# ---------------------------------------------------------------- the model

_CODE_CELL = re.compile(
    r"^```\{code-cell\}[^\n]*\n(?P<options>(?::[^\n]*\n)*)\n?(?P<body>.*?)^```$",
    re.DOTALL | re.MULTILINE,
)


def model_source(chapter_md: Path | None = None) -> str:
    """The code of the chapter's cells tagged ``model``, in order."""
    if chapter_md is None:
        chapter_md = repository_file(f"book/{CHAPTER}.md")
    text = Path(chapter_md).read_text(encoding="utf-8")
    cells = []
    for found in _CODE_CELL.finditer(text):
        tags = re.search(r"^:tags:\s*\[(.*)\]\s*$", found["options"], re.MULTILINE)
        names = [t.strip() for t in tags.group(1).split(",")] if tags else []
        if MODEL_TAG in names:
            cells.append(found["body"].rstrip() + "\n")
    if not cells:
        raise ValueError(f"{chapter_md} has no code cell tagged {MODEL_TAG!r}")
    return "\n\n".join(cells)


def model_namespace(backend: str) -> dict:
    """Run the model's cells after ``backend``'s imports ("autodidax" or
    "jax") and return the names they define (and ``np``, ``jax``, ``jnp``,
    ``lax``)."""
    if backend not in BACKENDS:
        raise ValueError(
            f"model_namespace: backend must be one of {sorted(BACKENDS)}, "
            f"got {backend!r}"
        )
    source = "import numpy as np\n" + BACKENDS[backend] + "\n" + model_source()
    namespace: dict = {"__name__": f"capstone_model_{backend}"}
    exec(compile(source, f"<{CHAPTER} model cells on {backend}>", "exec"), namespace)
    return namespace


# ---------------------------------------------------------------- the data


def load_text() -> str:
    """The frozen text the model learns from."""
    return repository_file(TEXT).read_text(encoding="utf-8")


class Vocabulary:
    """The characters of a text, sorted; a character's id is its position."""

    def __init__(self, text: str) -> None:
        self.chars = sorted(set(text))
        self.ids = {c: i for i, c in enumerate(self.chars)}

    def __len__(self) -> int:
        return len(self.chars)

    def encode(self, text: str):
        import numpy as np

        return np.array([self.ids[c] for c in text], dtype=np.int32)

    def decode(self, ids) -> str:
        return "".join(self.chars[int(i)] for i in ids)


# ---------------------------------------------------------------- the chart

_COLORS = ["#c0392b", "#2471a3", "#229954", "#8e44ad"]


def SVG(text: str):
    """An SVG picture the notebook displays (IPython's, whose text form is
    the same in every run)."""
    from IPython.display import SVG as IPythonSVG

    return IPythonSVG(text)


def _chart_frame(title, width, height, left, top, w, h) -> list[str]:
    """The SVG header, the title, both axes and the x label of a chart."""
    return [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" '
        f'height="{height}" font-family="sans-serif" font-size="13">',
        f"<title>{escape(title)}</title>",
        f'<line x1="{left}" y1="{top}" x2="{left}" y2="{top + h}" stroke="#333"/>',
        f'<line x1="{left}" y1="{top + h}" x2="{left + w}" y2="{top + h}" '
        'stroke="#333"/>',
        f'<text x="{left + w / 2}" y="{top + h + 42}" text-anchor="middle">'
        "training step</text>",
    ]


def loss_chart(curves: dict, *, title: str, ring_every: int = 0):
    """Loss against step for each named curve. The first curve is drawn as a
    line; each later one as a line too, or, with ``ring_every``, as rings
    every so many steps, so that a curve lying on the first stays visible."""
    w, h, left, top = 520, 260, 60, 30
    width, height = w + left + 190, h + top + 60
    values = [v for curve in curves.values() for v in curve]
    steps = max(len(curve) for curve in curves.values())
    lo, hi = min(values), max(values)
    lo, hi = math.floor(lo * 2) / 2, math.ceil(hi * 2) / 2

    def px(step):
        return left + step / max(steps - 1, 1) * w

    def py(loss):
        return top + h - (loss - lo) / (hi - lo) * h

    parts = [
        *_chart_frame(title, width, height, left, top, w, h),
        f'<text x="16" y="{top + h / 2}" text-anchor="middle" '
        f'transform="rotate(-90 16 {top + h / 2})">loss (nats per character)</text>',
    ]
    tick = 0.5 if hi - lo <= 4 else 1.0
    value = lo
    while value <= hi + 1e-9:
        parts.append(
            f'<text x="{left - 6}" y="{py(value) + 4:.1f}" text-anchor="end" '
            f'fill="#555555">{value:g}</text>'
            f'<line x1="{left}" y1="{py(value):.1f}" x2="{left + w}" '
            f'y2="{py(value):.1f}" stroke="#eeeeee"/>'
        )
        value += tick
    step_tick = 10 ** max(0, len(str(steps - 1)) - 1)
    if (steps - 1) / step_tick < 4:
        step_tick //= 2 or 1
    for step in range(0, steps, max(step_tick, 1)):
        parts.append(
            f'<text x="{px(step):.1f}" y="{top + h + 18}" text-anchor="middle" '
            f'fill="#555555">{step}</text>'
        )
    for i, (name, curve) in enumerate(curves.items()):
        color = _COLORS[i % len(_COLORS)]
        points = [(px(s), py(v)) for s, v in enumerate(curve)]
        if i and ring_every:
            for s in range(0, len(points), ring_every):
                x, y = points[s]
                parts.append(
                    f'<circle cx="{x:.1f}" cy="{y:.1f}" r="5" fill="none" '
                    f'stroke="{color}" stroke-width="1.5"><title>{escape(name)}, '
                    f"step {s}: {curve[s]:.6f}</title></circle>"
                )
            marker = (
                f'<circle cx="{left + w + 34}" cy="{top + 10 + 22 * i}" r="5" '
                f'fill="none" stroke="{color}" stroke-width="1.5"/>'
            )
        else:
            line = " ".join(f"{x:.1f},{y:.1f}" for x, y in points)
            parts.append(
                f'<polyline points="{line}" fill="none" stroke="{color}" '
                'stroke-width="1.5"/>'
            )
            y = top + 10 + 22 * i
            marker = (
                f'<line x1="{left + w + 24}" y1="{y}" x2="{left + w + 44}" '
                f'y2="{y}" stroke="{color}" stroke-width="2"/>'
            )
        parts.append(
            marker + f'<text x="{left + w + 52}" y="{top + 14 + 22 * i}">'
            f"{escape(name)}</text>"
        )
    parts.append("</svg>")
    return SVG("".join(parts))


# ---------------------------------------------------------------- the benchmark


def load_report() -> dict:
    """The benchmark report, ``bench/results.json``."""
    import json

    return json.loads(repository_file("bench/results.json").read_text("utf-8"))


def longer_run(report: dict) -> None:
    """Show the capstone entry of a benchmark report, as
    ``bench/bench_capstone.py`` writes it into ``report["results"]["capstone"]``:
    ``config`` (the run's settings), ``ms`` (the median time of a training
    step, per library), ``losses`` (per library, one per step), ``ratio``
    (autodidax's time over JAX's), ``max_rel_diff`` (of the losses), and
    ``note``. Missing pieces are left out."""
    from IPython.display import display

    entry = report.get("results", {}).get("capstone")
    if not entry:
        print("This report has no capstone run yet: python bench/bench_capstone.py")
        return
    config = entry.get("config", {})
    shown = ["d_model", "n_layers", "n_heads", "d_ff", "context", "batch_size"]
    print(", ".join(f"{k} {config[k]}" for k in shown if k in config))
    for library, ms in entry.get("ms", {}).items():
        print(f"{library:10} {ms:8.1f} ms a training step")
    if "ratio" in entry:
        print(f"autodidax's time over JAX's: {entry['ratio']['autodidax']:.2f}")
    if "max_rel_diff" in entry:
        gap = entry["max_rel_diff"]["autodidax"]
        steps = len(entry.get("losses", {}).get("jax", []))
        print(
            f"largest relative difference of the losses over {steps} steps: {gap:.0e}"
        )
    curves = {
        "JAX" if library == "jax" else library: losses
        for library, losses in entry.get("losses", {}).items()
    }
    if len(curves) == 2 and min(map(len, curves.values())) >= 10:
        display(loss_chart(curves, title="The benchmark's run", ring_every=1))


def drift_chart(curves: dict, *, title: str, floor: float = 1e-9):
    """Relative differences against step, the y axis logarithmic; a value
    below ``floor`` (zero: the two runs agree exactly) is drawn at it."""
    w, h, left, top = 520, 220, 70, 20
    width, height = w + left + 260, h + top + 60
    steps = max(len(curve) for curve in curves.values())
    top_exp = max(
        math.ceil(math.log10(max(max(curve), floor))) for curve in curves.values()
    )
    bottom_exp = math.floor(math.log10(floor))

    def px(step):
        return left + step / max(steps - 1, 1) * w

    def py(value):
        exponent = math.log10(max(value, floor))
        return top + h - (exponent - bottom_exp) / (top_exp - bottom_exp) * h

    parts = [
        *_chart_frame(title, width, height, left, top, w, h),
        f'<text x="14" y="{top + h / 2}" text-anchor="middle" '
        f'transform="rotate(-90 14 {top + h / 2})">relative difference</text>',
    ]
    for exponent in range(bottom_exp, top_exp + 1):
        label = "0" if exponent == bottom_exp else f"1e{exponent}"
        y = py(10.0**exponent)
        parts.append(
            f'<text x="{left - 6}" y="{y + 4:.1f}" text-anchor="end" '
            f'fill="#555555">{label}</text>'
            f'<line x1="{left}" y1="{y:.1f}" x2="{left + w}" y2="{y:.1f}" '
            'stroke="#eeeeee"/>'
        )
    for step in range(0, steps, 10):
        parts.append(
            f'<text x="{px(step):.1f}" y="{top + h + 18}" text-anchor="middle" '
            f'fill="#555555">{step}</text>'
        )
    for i, (name, curve) in enumerate(curves.items()):
        color = _COLORS[i % len(_COLORS)]
        line = " ".join(f"{px(s):.1f},{py(v):.1f}" for s, v in enumerate(curve))
        parts.append(
            f'<polyline points="{line}" fill="none" stroke="{color}" '
            'stroke-width="1.5"/>'
        )
        y = top + 10 + 22 * i
        parts.append(
            f'<line x1="{left + w + 14}" y1="{y}" x2="{left + w + 34}" y2="{y}" '
            f'stroke="{color}" stroke-width="2"/>'
            f'<text x="{left + w + 42}" y="{y + 4}">{escape(name)}</text>'
        )
    parts.append("</svg>")
    return SVG("".join(parts))
