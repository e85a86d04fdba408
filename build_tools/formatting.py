"""Run ``ruff format`` on text, with the project's configuration."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


class FormatError(ValueError):
    """ruff could not format the text (usually a syntax error); says where."""


def ruff_format(source: str, root: Path, filename: str) -> str:
    """``source`` formatted by ruff as if it were the file ``root/filename``.

    The file name picks the settings that apply (from root's pyproject.toml)
    and the kind of input: a name ending in .ipynb means notebook JSON, which
    ruff formats cell by cell, keeping magics and output-hiding semicolons.
    """
    result = subprocess.run(
        [sys.executable, "-m", "ruff", "format", "--stdin-filename", filename, "-"],
        input=source,
        capture_output=True,
        text=True,
        cwd=root,
        check=False,
    )
    if result.returncode != 0:
        raise FormatError(f"ruff format failed on {filename}:\n{result.stderr.strip()}")
    return result.stdout
