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
