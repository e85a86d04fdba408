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


# ---------------------------------------------------------------- performance
