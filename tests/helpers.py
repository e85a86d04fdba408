"""Test helpers shared by the error tests of every part."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest


@contextmanager
def raises_clearly(
    exc_type: type | tuple[type, ...], match: str, then: Callable[[], None]
) -> Iterator:
    """Expect ``exc_type`` (TypeError/ValueError kinds, never an internal
    AssertionError/KeyError/AttributeError) with a message matching ``match``;
    afterwards run ``then``, a check that the interpreter is still usable."""
    kinds = exc_type if isinstance(exc_type, tuple) else (exc_type,)
    assert all(issubclass(kind, (TypeError, ValueError)) for kind in kinds)
    with pytest.raises(exc_type, match=match) as info:
        yield info
    assert not isinstance(info.value, (AssertionError, KeyError, AttributeError))
    then()


@contextmanager
def nothing_compiled() -> Iterator[None]:
    """Fail if anything is lowered or compiled inside the block: an error
    under jit must be found while tracing, before XLA sees the program."""
    import autodidax as ad

    def refuse(*args, **kwargs):
        raise AssertionError("lowered or compiled before the error was raised")

    saved = ad.compile_jaxpr, ad.lower_jaxpr
    ad.compile_jaxpr = ad.lower_jaxpr = refuse
    try:
        yield
    finally:
        ad.compile_jaxpr, ad.lower_jaxpr = saved


def count_impl_calls(monkeypatch, names: list[str]) -> dict[str, int]:
    """Count evaluations of the named primitives (a dict, updated live)."""
    import autodidax as ad

    calls = dict.fromkeys(names, 0)
    for name in names:
        impl = ad.PRIMITIVES[name].rules["impl"]

        def counting(*args, _impl=impl, _name=name, **params):
            calls[_name] += 1
            return _impl(*args, **params)

        monkeypatch.setitem(ad.PRIMITIVES[name].rules, "impl", counting)
    return calls
