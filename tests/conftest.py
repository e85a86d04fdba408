"""Shared test setup: float64 JAX and an interpreter-stack check."""

import jax
import pytest

# The reference computations in the differential tests run in float64. Only the
# test process switches this on; autodidax itself must never do it.
jax.config.update("jax_enable_x64", True)


@pytest.fixture
def clean_interpreter_stack():
    """Check that a test leaves only the evaluation level on the stack."""
    import autodidax

    assert len(autodidax._state.stack) == 1, "stack not clean before the test"
    yield
    assert len(autodidax._state.stack) == 1, "the interpreter stack was not popped"
