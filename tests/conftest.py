"""Shared test setup: float64 JAX, Hypothesis profiles, an interpreter-stack check."""

# ---- Part 9: eight host CPU devices (keep this block first) --------------------
# XLA reads XLA_FLAGS once, when JAX starts its CPU backend, so the flag is set
# here, before anything imports jax: every test process (xdist workers too) and
# every kernel a test starts (it inherits the environment) sees 8 devices. Other
# flags already in XLA_FLAGS are kept; a different device count is replaced.
# Nothing else changes: jax.devices()[0] stays the default device.
import os

HOST_DEVICES = 8
_flags = [
    flag
    for flag in os.environ.get("XLA_FLAGS", "").split()
    if not flag.startswith("--xla_force_host_platform_device_count=")
]
_flags.append(f"--xla_force_host_platform_device_count={HOST_DEVICES}")
os.environ["XLA_FLAGS"] = " ".join(_flags)
# ---- end of Part 9's block -----------------------------------------------------

import jax  # noqa: E402
import pytest  # noqa: E402
from hypothesis import HealthCheck, settings  # noqa: E402

# The reference computations in the differential tests run in float64. Only the
# test process switches this on; autodidax itself must never do it.
jax.config.update("jax_enable_x64", True)

# Hypothesis (tests/test_hypothesis.py). CI runs a small, fixed, derandomized
# budget so that it is fast and reproducible. The opt-in run,
# AUTODIDAX_HYPOTHESIS_EXAMPLES=N, runs N examples per single transformation
# (a third of that per composition of two) with a fresh random seed each time.
# Neither writes a Hypothesis example database into the repository.
_HYPOTHESIS_COMMON = dict(
    deadline=None,
    database=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile(
    "autodidax-ci", max_examples=30, derandomize=True, **_HYPOTHESIS_COMMON
)
_EXAMPLES = os.environ.get("AUTODIDAX_HYPOTHESIS_EXAMPLES")
if _EXAMPLES:
    settings.register_profile(
        "autodidax-large", max_examples=int(_EXAMPLES), **_HYPOTHESIS_COMMON
    )
    settings.load_profile("autodidax-large")
else:
    settings.load_profile("autodidax-ci")


@pytest.fixture
def clean_interpreter_stack():
    """Check that a test leaves only the evaluation level on the stack."""
    import autodidax

    assert len(autodidax._state.stack) == 1, "stack not clean before the test"
    yield
    assert len(autodidax._state.stack) == 1, "the interpreter stack was not popped"


@pytest.fixture
def compilations(monkeypatch) -> list:
    """A list that grows by one jaxpr each time autodidax compiles one."""
    import autodidax

    made: list = []
    original = autodidax.CompiledJaxpr

    class Counting(original):
        def __init__(self, jaxpr):
            made.append(jaxpr)
            super().__init__(jaxpr)

    monkeypatch.setattr(autodidax, "CompiledJaxpr", Counting)
    return made
