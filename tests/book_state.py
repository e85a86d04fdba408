"""What a chapter starts from: the state that reading the book in one kernel
could change, as a fingerprint, and the check that compares two of them.

nbval runs every chapter in a fresh kernel of its own. A reader who runs the
whole book in one Jupyter kernel runs the same cells, in the same order, but
each chapter then starts from what the chapters before it left behind instead
of a fresh process. The chapter's first cell (``book_setup.load_book``) runs
the library code of the earlier chapters again in the notebook's namespace, so
every name the module defines is rebound either way; what can still differ is
everything else a cell can change and the next chapter's first cell does not
put back: JAX's configuration, NumPy's print options,
the working directory, ``sys.path``, the environment,
the warning filters, the devices XLA starts with, the modules imported, and
the state of the imported modules of the book (``autodidax``, ``figures``,
...), a function replaced in one of them, say.

So instead of running the book a second time in one kernel, the test session
(``tests/conftest.py``) asks each chapter's kernel twice for a fingerprint:

- ``start``: right after the chapter's own first cell, in its fresh kernel;
- ``next``: after its last cell, once the *next* chapter's first cell has run
  in the same kernel, which is the state the next chapter starts from when
  both share a kernel.

and compares the ``next`` of chapter k with the ``start`` of chapter k + 1.
If they agree on every entry, chapter k + 1 starts in one kernel from the
state it starts from alone, and so prints what nbval checked it prints; by
induction over the chapters the whole book does. Names that chapter k's demo
cells left in the namespace are allowed: a later chapter that read one
without defining it would fail on its own, in nbval.

This file is run inside the kernels (``exec``'d, not imported, so that taking
a fingerprint imports nothing and defines no name there) and imported by the
tests; it uses only the standard library at module level.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import types
import warnings
from typing import Any

# Names IPython keeps in the user namespace (history, output caching, exit).
IPYTHON_NAMES = {"In", "Out", "get_ipython", "exit", "quit", "open"}
# Modules of the book whose state is compared, when they are imported.
BOOK_MODULES = ("autodidax", "figures", "capstone_tools", "book_setup")
# Environment variables that differ from kernel to kernel on their own
# (the running test, the kernel's parent, the xdist worker that runs it).
VOLATILE_ENVIRONMENT = {"PYTEST_CURRENT_TEST", "JPY_PARENT_PID", "PYTEST_XDIST_WORKER"}
DEVICE_FLAG = "--xla_force_host_platform_device_count="
# How deep containers and objects are described; deeper parts by type only.
DEPTH = 3
ARRAY_BYTES = 1 << 24  # arrays up to 16 MB are described by their contents


def _digest(*parts: Any) -> str:
    return hashlib.sha1(repr(parts).encode()).hexdigest()[:16]


def describe_code(code: types.CodeType) -> str:
    """What a code object does, without its file name and line numbers."""
    consts = tuple(
        describe_code(c) if isinstance(c, types.CodeType) else repr(c)
        for c in code.co_consts
    )
    return _digest(code.co_code, code.co_names, code.co_varnames, consts)


def describe(value: Any, depth: int = DEPTH) -> str:
    """A short text that differs when ``value`` behaves differently (an
    object that cannot be looked into is described by its type)."""
    try:
        return _describe(value, depth)
    except Exception as error:
        kind = type(value)
        return f"<{kind.__module__}.{kind.__qualname__}: {type(error).__name__}>"


def _describe(value: Any, depth: int) -> str:
    kind = type(value)
    if value is None or kind in (bool, int, float, complex, str, bytes):
        text = repr(value)
        return text if len(text) <= 200 else _digest(text)
    if isinstance(value, types.ModuleType):
        return f"module {value.__name__}"
    if isinstance(value, (types.FunctionType, types.MethodType)):
        function = getattr(value, "__func__", value)
        defaults = describe(function.__defaults__, depth - 1)
        return f"function {describe_code(function.__code__)} {defaults}"
    if isinstance(value, (types.BuiltinFunctionType, type(len))):
        return f"builtin {getattr(value, '__qualname__', repr(value))}"
    if isinstance(value, type):
        members = {
            name: describe(member, 1)
            for name, member in vars(value).items()
            if isinstance(member, (types.FunctionType, classmethod, staticmethod))
            or not callable(member)
            and not name.startswith("__")
        }
        return f"class {value.__qualname__} {_digest(sorted(members.items()))}"
    if hasattr(value, "__array__") and hasattr(value, "dtype"):
        return _describe_array(value)
    if depth <= 0:
        return f"<{kind.__module__}.{kind.__qualname__}>"
    if isinstance(value, (list, tuple)):
        return f"{kind.__name__} {_digest([describe(v, depth - 1) for v in value])}"
    if isinstance(value, (set, frozenset)):
        items = sorted(describe(v, depth - 1) for v in value)
        return f"{kind.__name__} {_digest(items)}"
    if isinstance(value, dict):
        items = sorted(
            (describe(k, depth - 1), describe(v, depth - 1)) for k, v in value.items()
        )
        shown = "{" + ", ".join(f"{k}: {v}" for k, v in items) + "}"
        return shown if len(shown) <= 400 else f"dict {_digest(items)}"
    state = getattr(value, "__dict__", None)
    if isinstance(state, dict):
        return f"{kind.__qualname__} {describe(state, depth - 1)}"
    return f"<{kind.__module__}.{kind.__qualname__}>"


def _describe_array(value: Any) -> str:
    try:
        import numpy as np

        array = np.asarray(value)
    except Exception:  # a tracer leaked into the namespace, say
        return f"<{type(value).__qualname__}>"
    text = f"array {array.dtype} {array.shape}"
    if array.nbytes <= ARRAY_BYTES and array.dtype != object:
        text += " " + hashlib.sha1(np.ascontiguousarray(array).tobytes()).hexdigest()
    return text


def _device_count() -> str:
    """The number of CPU devices XLA has, or will have when it starts."""
    if "jax" in sys.modules:
        from jax._src import xla_bridge

        started = getattr(xla_bridge, "backends_are_initialized", None)
        if started is not None and started():
            import jax

            return str(jax.local_device_count("cpu"))
    for flag in os.environ.get("XLA_FLAGS", "").split():
        if flag.startswith(DEVICE_FLAG):
            return flag.removeprefix(DEVICE_FLAG)
    return "1"


def fingerprint(namespace: dict[str, Any]) -> dict[str, str]:
    """The state a chapter's cells can read, entry by entry (see the module's
    docstring). Keys: ``name:<n>`` for the notebook's names, ``module:<m>``
    for the imported modules, ``<m>.<n>`` for the public names of the book's
    modules, and one key for each other kind of state."""
    state: dict[str, str] = {}
    for name, value in namespace.items():
        if not name.startswith("_") and name not in IPYTHON_NAMES:
            state[f"name:{name}"] = describe(value)
    for name in sorted(sys.modules):
        if "." not in name:
            state[f"module:{name}"] = "imported"
    for module_name in BOOK_MODULES:
        module = sys.modules.get(module_name)
        if module is None:
            continue
        replaced = []
        for name, value in vars(module).items():
            if not name.startswith("_") and not isinstance(value, types.ModuleType):
                state[f"{module_name}.{name}"] = describe(value)
                if getattr(value, "__module__", None) == "__main__":
                    replaced.append(name)  # by a function of a notebook's
        state[f"replaced:{module_name}"] = describe(replaced)
    if "jax" in sys.modules:
        import jax

        for name, value in sorted(jax.config.values.items()):
            state[f"jax.config.{name}"] = describe(value)
    if "numpy" in sys.modules:
        import numpy as np

        state["numpy.printoptions"] = describe(np.get_printoptions())
        state["numpy.errstate"] = describe(np.geterr())
    # Not the global random generators (NumPy's, Python's): a fresh kernel
    # seeds them from the operating system, so a chapter whose output depended
    # on their state would print something else on every run, alone too.
    state["cwd"] = os.getcwd()
    state["sys.path"] = describe(sys.path)
    for name, value in os.environ.items():
        if name not in VOLATILE_ENVIRONMENT:
            state[f"environ:{name}"] = value
    state["warnings.filters"] = describe(warnings.filters)
    state["xla.devices"] = _device_count()
    return state


def differences(alone: dict[str, str], after: dict[str, str]) -> list[str]:
    """Where the state after the previous chapter (``after``, one kernel)
    differs from the state the chapter starts from alone (``alone``).

    Names and modules that only ``after`` has are what earlier cells left
    behind, and are allowed (see the module's docstring); so is the state of
    a book module that only ``after`` has imported, unless a function in it
    was replaced by one defined in a notebook."""
    found = []
    not_yet_imported = {
        key.removeprefix("replaced:") + "."
        for key in after
        if key.startswith("replaced:") and key not in alone
    }
    for key in sorted(set(alone) | set(after)):
        if key not in alone and key.startswith(("name:", "module:")):
            continue  # left behind by the cells before; nothing reads it
        if key.startswith(tuple(not_yet_imported)):
            # A book module the chapter imports later: when it does, it gets
            # the module as the chapters before left it, which is as fresh
            # unless one of them replaced a function in it (``replaced:``).
            continue
        if key.startswith("replaced:") and key not in alone:
            if after[key] != describe([]):
                found.append(f"{key}: functions of a notebook put in its place")
            continue
        if alone.get(key) != after.get(key):
            found.append(
                f"{key}: alone {alone.get(key, '(absent)')}, "
                f"after the chapter before {after.get(key, '(absent)')}"
            )
    return found


def write_fingerprint(namespace: dict[str, Any], path: str) -> None:
    """Save ``fingerprint(namespace)`` as JSON (what the kernels call)."""
    with open(path + ".tmp", "w", encoding="utf-8") as file:
        json.dump(fingerprint(namespace), file, indent=0, sort_keys=True)
    os.replace(path + ".tmp", path)  # readers never see half a file
