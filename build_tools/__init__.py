"""Build tooling for the Autodidax book: chapters, tangling, sync/check, execution.

Every module here imports only the standard library at import time, so the
driver (``build_tools/book.py``) runs on a bare Python before anything is
installed; the pipeline's own dependencies are imported inside the functions
that need them.
"""
