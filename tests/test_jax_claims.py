"""The book's statements about real JAX, checked against the installed JAX.

SPEC 2b: every sentence of the book that says what JAX does and that running
the installed JAX can check has a test here. Each test quotes or paraphrases
its sentence and names the page (``book/<page>.md``). The tests compare with
JAX's own behaviour, never with autodidax; when JAX is upgraded, the tests
that fail here are the list of sentences to rewrite.

The test process runs with ``jax_enable_x64`` on (tests/conftest.py); a claim
about float32 switches it off inside a ``jax.enable_x64(False)`` block, and
every configuration change is undone before the test returns.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import os
import re
import subprocess
import sys
import threading

import jax
import jax.extend
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax._src import config as jax_config
from jax._src import core
from jax._src import custom_derivatives as jax_custom
from jax._src import pjit as jax_pjit
from jax._src.interpreters import ad as jax_ad
from jax._src.interpreters import batching as jax_batching
from jax._src.interpreters import partial_eval as jax_pe
from jax._src.lax.control_flow import conditionals as jax_conditionals
from jax._src.lax.control_flow import loops as jax_loops

# ------------------------------------------------------------------ helpers


def jaxpr_text(f, *args, x64: bool = True) -> str:
    with jax.enable_x64(x64):
        return jax.make_jaxpr(f)(*args).pretty_print(use_color=False)


def all_eqns(jaxpr):
    """Every equation of ``jaxpr`` and of the jaxprs in its params."""
    jaxpr = getattr(jaxpr, "jaxpr", jaxpr)
    for eqn in jaxpr.eqns:
        yield eqn
        for param in eqn.params.values():
            for sub in param if isinstance(param, tuple | list) else [param]:
                if isinstance(sub, core.Jaxpr | core.ClosedJaxpr):
                    yield from all_eqns(sub)


def primitive_names(f, *args) -> list[str]:
    return [eqn.primitive.name for eqn in all_eqns(jax.make_jaxpr(f)(*args))]


def lowered_text(f, *args) -> str:
    return jax.jit(f).lower(*args).as_text()


@contextlib.contextmanager
def counting_rule(monkeypatch, registry: dict, primitive, log: list, tag: str):
    """Within the block, each call of JAX's rule ``registry[primitive]`` appends
    ``tag`` to ``log``; the rule is put back when the block ends (and, through
    ``monkeypatch``, even if the test fails inside it)."""
    original = registry[primitive]

    def counted(*args, **kwargs):
        log.append(tag)
        return original(*args, **kwargs)

    monkeypatch.setitem(registry, primitive, counted)
    try:
        yield
    finally:
        registry[primitive] = original


# ------------------------------------------------------------------ intro.md


def test_intro_transformations_compose():
    # intro: "`jax.grad` differentiates a function, `jax.vmap` vectorizes it,
    # `jax.jit` compiles it ..., and any of them can be applied to the result
    # of another": jax.jit(jax.grad(f)).
    f = jax.jit(jax.vmap(jax.grad(jnp.sin)))
    np.testing.assert_allclose(f(jnp.array([0.0, 1.0])), np.cos([0.0, 1.0]))


# ------------------------------------------------------------------ Part 1


def test_part1_broadcast_in_dim_names_kept_axes():
    # part1_interpreters: "its `broadcast` is `lax.broadcast_in_dim`, which
    # names the axes that are *kept* rather than the ones inserted".
    text = jaxpr_text(lambda x: lax.broadcast_in_dim(x, (2, 3), (1,)), jnp.ones(3))
    assert "broadcast_in_dim[broadcast_dimensions=(1,)" in text
    out = lax.broadcast_in_dim(jnp.arange(3.0), (2, 3), (1,))
    np.testing.assert_array_equal(out, np.broadcast_to(np.arange(3.0), (2, 3)))


def test_part1_lax_add_wants_one_dtype():
    # part1_interpreters: "JAX's `lax` layer ... wants one dtype".
    with pytest.raises(TypeError, match="same dtypes"):
        lax.add(jnp.ones(3), jnp.ones(3, jnp.int32))


def test_part1_lax_add_wants_one_rank():
    # part1_interpreters and appendix_primitives: lax wants "one rank".
    with pytest.raises(TypeError, match="same number of dimensions"):
        lax.add(jnp.ones(3), jnp.ones((2, 3)))


def test_part1_lax_add_takes_rank0_operand():
    # part1_interpreters and appendix_primitives: "a rank-0 operand goes
    # with any rank" (no broadcast in the jaxpr).
    text = jaxpr_text(lax.add, jnp.ones(3), jnp.ones(()))
    assert re.search(r"add a b", text) and "broadcast" not in text


def test_part1_lax_add_stretches_size1_axes():
    # part1_interpreters and appendix_primitives: lax "stretches axes of size 1".
    jaxpr = jax.make_jaxpr(lax.add)(jnp.ones((1, 3)), jnp.ones((2, 3)))
    assert [e.primitive.name for e in jaxpr.eqns] == ["add"]
    assert jaxpr.out_avals[0].shape == (2, 3)


def test_part1_symbolic_zeros_cost_nothing_for_other_inputs():
    # part1_interpreters: "JAX ... uses symbolic zeros, so differentiating with
    # respect to one input out of many costs nothing for the others": the
    # gradient jaxpr with respect to x has no derivative of cos(y) (a sin of y).
    jaxpr = jax.make_jaxpr(jax.grad(lambda x, y: jnp.sin(x) * jnp.cos(y)))(1.0, 2.0)
    sins = [e for e in jaxpr.eqns if e.primitive.name == "sin"]
    assert len(sins) == 1 and sins[0].invars[0] is jaxpr.jaxpr.invars[0]
    # ... "A zero passed to `jax.jvp` as a tangent is an ordinary array, though,
    # and is computed with": the derivative of cos(y), sin(y), is computed.
    f = lambda x, y: jnp.sin(x) * jnp.cos(y)  # noqa: E731
    jaxpr = jax.make_jaxpr(lambda x, y: jax.jvp(f, (x, y), (1.0, 0.0)))(1.0, 2.0)
    y = jaxpr.jaxpr.invars[1]
    assert any(e.primitive.name == "sin" and e.invars[0] is y for e in jaxpr.eqns)


def test_part1_python_numbers_weakly_typed():
    # part1_interpreters: "`x * 2.0` keeps the dtype of a `float32` array `x`,
    # and an integer `x` is promoted to a float".
    with jax.enable_x64(False):
        assert (jnp.ones(3, jnp.float32) * 2.0).dtype == jnp.float32
        assert (jnp.ones(3, jnp.int32) * 2.0).dtype == jnp.float32
    assert jnp.issubdtype((jnp.ones(3, jnp.int32) * 2.0).dtype, jnp.floating)


def test_part1_vmap_parameters():
    # part1_interpreters: "`jax.vmap` supports `in_axes` given as a pytree
    # prefix ... as well as `out_axes` trees, named axes and `spmd_axis_name`".
    params = inspect.signature(jax.vmap).parameters
    assert {"in_axes", "out_axes", "axis_name", "spmd_axis_name"} <= set(params)
    out = jax.vmap(lambda d: d["a"] + d["b"], in_axes=({"a": 0, "b": None},))(
        {"a": jnp.arange(3.0), "b": 1.0}
    )
    np.testing.assert_array_equal(out, [1.0, 2.0, 3.0])
    out = jax.vmap(lambda x: {"y": x}, out_axes={"y": 1})(jnp.ones((2, 3)))
    assert out["y"].shape == (3, 2)


def test_part1_stackless_trace_context():
    # part1_interpreters: "JAX no longer keeps a stack of numbered levels ...
    # the trace of the running transformation is held in a context (`trace_ctx`
    # in `jax._src.core`) ... it runs the operations of its rules under its
    # parent, the trace it was started under". glossary: "today's JAX has no stack".
    assert not hasattr(core, "MainTrace")
    seen = []

    def f(x):
        seen.append(core.trace_ctx.trace)
        return x

    jax.jvp(f, (1.0,), (1.0,))
    (trace,) = seen
    assert type(trace).__name__ == "JVPTrace"
    assert trace.parent_trace is core.eval_trace


def test_part1_comparison_tangent_is_float0():
    # part1_interpreters: "Real JAX gives such outputs [of comparisons] a special
    # tangent dtype called `float0`".
    _, tangent = jax.jvp(lambda x: x > 0, (1.0,), (1.0,))
    assert tangent.dtype == jax.dtypes.float0


def test_part1_pytree_none_is_empty_container_and_dicts_sorted():
    # part1_interpreters: "the dict's leaves come out in sorted key order ...
    # and `None` is an empty container rather than a leaf, as in JAX".
    leaves = jax.tree_util.tree_leaves([None, {"w": 1, "b": 2}])
    assert leaves == [2, 1]


def test_part1_jacfwd_layout_and_hessian():
    # part1_interpreters: the Jacobian puts "the input axes behind the output
    # axes, the layout JAX uses"; "As in JAX, `jacfwd(f)` returns a function;
    # `jacfwd` of `jacfwd` is the Hessian".
    jac = jax.jacfwd(lambda x: x[:2] * 2.0)
    assert callable(jac)
    assert jax.eval_shape(jac, jnp.ones(3)).shape == (2, 3)
    hessian = jax.jit(jax.jacfwd(jax.jacfwd(lambda x: jnp.sum(x**3))))(jnp.arange(3.0))
    np.testing.assert_allclose(hessian, np.diag(6.0 * np.arange(3.0)))


# ------------------------------------------------------------------ Part 2


def test_part2_make_jaxpr_returns_closed_jaxpr_and_takes_shapes():
    # part2_jaxprs: "`jax.make_jaxpr(f)(*example_args)` takes example *values*
    # (or `jax.ShapeDtypeStruct`s) and returns a `ClosedJaxpr`".
    closed = jax.make_jaxpr(jnp.sin)(jax.ShapeDtypeStruct((3,), jnp.float64))
    assert isinstance(closed, core.ClosedJaxpr)
    assert closed.in_avals[0].shape == (3,)


def test_part2_printer_separates_constants():
    # part2_jaxprs: for `lambda x: x + c`, with `c` a NumPy array of three
    # floats, JAX prints
    # `{ lambda a:f32[3]; b:f32[3]. let c:f32[3] = add b a in (c,) }`.
    c = np.array([1.0, 2.0, 3.0])
    text = jaxpr_text(lambda x: x + c, np.ones(3, np.float32), x64=False)
    assert text == "{ lambda a:f32[3]; b:f32[3]. let c:f32[3] = add b a in (c,) }"


def test_part2_equations_carry_source_info_effects_and_context():
    # part2_jaxprs: "JAX's equations carry more: source information (a traceback
    # and a stack of names ...), effects, and a context of compilation settings".
    (eqn,) = jax.make_jaxpr(jnp.sin)(1.0).eqns
    assert eqn.source_info.traceback is not None
    assert hasattr(eqn.source_info, "name_stack")
    assert hasattr(eqn, "effects") and hasattr(eqn, "ctx")


def test_part2_weak_scalar_is_a_literal_without_broadcast():
    # part2_jaxprs: "`x * 2.0` on a vector records `mul a 2.0:f32[]`: a literal,
    # printed with its type, and no `broadcast`".
    text = jaxpr_text(lambda x: x * 2.0, np.ones(3, np.float32), x64=False)
    assert "mul a 2.0:f32[]" in text and "broadcast" not in text


def test_part2_current_trace_is_thread_local():
    # part2_jaxprs: "`bind` hands every operation to the *current trace*, held
    # in a thread-local context".
    other_thread = []

    def f(x):
        thread = threading.Thread(
            target=lambda: other_thread.append(core.trace_ctx.trace)
        )
        thread.start()
        thread.join()
        assert type(core.trace_ctx.trace).__name__ == "DynamicJaxprTrace"
        return x

    jax.make_jaxpr(f)(1.0)
    assert other_thread == [core.eval_trace]


def test_part2_operations_on_constants_are_staged():
    # part2_jaxprs / glossary (omnistaging): under `make_jaxpr`, operations on
    # constants alone are recorded instead of being computed on the spot.
    text = jaxpr_text(lambda x: x + jnp.sin(jnp.float64(1.0)), 1.0)
    assert "sin" in text


# ------------------------------------------------------------------ Part 3


def test_part3_jit_primitive_name_and_params():
    # part3_jit: "The primitive behind `jax.jit` is called `jit` (`jit_p` in
    # JAX's source), and a jaxpr prints it as `jit[name=... jaxpr={ ... }]`.
    # Besides the jaxpr, its params carry shardings, layouts, donated arguments
    # and compiler options".
    jaxpr = jax.make_jaxpr(jax.jit(jnp.sin))(1.0)
    (eqn,) = jaxpr.eqns
    assert eqn.primitive is jax_pjit.jit_p and eqn.primitive.name == "jit"
    # "Older JAX versions called it `pjit` (its module is still
    # `jax/_src/pjit.py`)"
    assert jax_pjit.__file__.endswith("jax/_src/pjit.py")
    assert {
        "jaxpr",
        "in_shardings",
        "out_shardings",
        "in_layouts",
        "out_layouts",
        "donated_invars",
        "compiler_options_kvs",
    } <= set(eqn.params)
    assert re.search(r"jit\[\s*name=sin\s*jaxpr=\{", str(jaxpr))


def test_part3_jit_lowers_to_a_call_of_a_nested_function():
    # part3_jit: "its lowering emits a call of a nested function, as ours does".
    text = lowered_text(lambda x: jax.jit(jnp.sin)(x), 1.0)
    assert "call @sin(" in text and "func.func private @sin(" in text


def test_part3_jitted_function_is_a_cpp_object():
    # part3_jit: "A jitted function in JAX is a C++ object (`PjitFunction`)".
    # performance: "`jax.jit` returns an object implemented in C++".
    f = jax.jit(jnp.sin)
    assert type(f).__name__ == "PjitFunction"
    assert type(f).__module__.startswith("jaxlib")


def test_part3_importing_jax_sets_the_cpp_log_level():
    # part3_jit: "We import it before `jaxlib` because its import sets XLA's C++
    # log level (`TF_CPP_MIN_LOG_LEVEL`)".
    source = inspect.getsource(jax)
    assert "_os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '1')" in source
    assert source.index("TF_CPP_MIN_LOG_LEVEL") < source.index("from jax")


def test_part3_closed_over_arrays_are_embedded_by_default():
    # part3_jit: "JAX, by default, embeds every closed-over array in the
    # StableHLO module as a `stablehlo.constant`, however large".
    big = jnp.arange(100_000.0)
    text = lowered_text(lambda x: x + big, 1.0)
    (main,) = re.findall(r"func\.func public @main\(([^)]*)\)", text)
    assert main.count("%arg") == 1
    assert 'stablehlo.constant dense<"0x' in text


def test_part3_constants_max_bytes_belongs_to_a_flag_that_is_off():
    # part3_jit: "Only the flag `jax_use_simplified_jaxpr_constants`, off by
    # default, makes it pass the large ones as arguments" (the large ones: above
    # `jax_embedded_constants_max_bytes`).
    assert jax.config.values["jax_use_simplified_jaxpr_constants"] is False
    assert "jax_embedded_constants_max_bytes" in jax.config.values
    source = inspect.getsource(core).split("def jaxpr_const_args(", 1)[1]
    body = source.split("\ndef ", 1)[0]
    assert "if not config.use_simplified_jaxpr_constants.value:\n    return []" in body


def test_part3_numpy_arguments_are_put_with_zero_copy_semantics():
    # part3_jit: "On CPU, `jax.device_put` and `jax.jit` in JAX 0.10.2 copy a
    # NumPy argument to the device asynchronously: the copy may still be under
    # way when they return". Whether a write lands before the copy is a race,
    # so this checks the cause, not the race (seen in experiments for both, on
    # arrays of a million float64s that are not 64-byte aligned): a NumPy array
    # is put on the device by pxla._shard_np_array, whose batched_device_put
    # leaves jaxlib's host-buffer semantics at its default, ZERO_COPY, which
    # lets the runtime read the NumPy memory after the call returns
    # (IMMUTABLE_ONLY_DURING_CALL, what autodidax asks for, copies first).
    from jax._src.interpreters import pxla
    from jaxlib import _jax

    assert "batched_device_put(" in inspect.getsource(pxla._shard_np_array)

    assert "host_buffer_semantics: jaxlib._jax.HostBufferSemantics = " in (
        _jax.batched_device_put.__doc__
    )
    assert "HostBufferSemantics.ZERO_COPY" in _jax.batched_device_put.__doc__
    assert "host_buffer_semantics" not in inspect.getsource(pxla.batched_device_put)


def test_part3_device_put_shares_aligned_numpy_memory():
    # part3_jit: "`jax.device_put` of an array whose memory is 64-byte aligned
    # does not copy at all: the JAX array shares the memory, and every later
    # write changes it, an open bug".
    raw = np.zeros(64 + 8 * 16, np.uint8)
    start = (-raw.ctypes.data) % 64
    host = raw[start : start + 8 * 16].view(np.float64)
    assert host.ctypes.data % 64 == 0
    host[:] = 1.0
    device = jax.device_put(host)
    device.block_until_ready()
    host[:] = 2.0
    assert float(device[0]) == 2.0


def test_part3_donation_and_disk_cache_exist():
    # part3_jit: "JAX can also donate argument buffers to the computation and
    # can keep compiled programs in a cache on disk".
    assert "donate_argnums" in inspect.signature(jax.jit).parameters
    assert "jax_compilation_cache_dir" in jax.config.values


def test_part3_lowering_has_source_locations():
    # part3_jit: "JAX lowers with source locations attached to every operation,
    # so compiler errors and profiles point at your Python lines".
    def the_function_here(x):
        return jnp.sin(x)

    text = jax.jit(the_function_here).lower(1.0).as_text(debug_info=True)
    assert "loc(" in text and "test_jax_claims.py" in text


def test_part3_front_end_narrows_float64_without_x64():
    # part3_jit: "JAX's own front end would narrow it [float64] to float32
    # unless its global x64 switch is on".
    with jax.enable_x64(False):
        assert jnp.asarray(np.ones(2)).dtype == jnp.float32
        assert jax.device_put(np.ones(2)).dtype == jnp.float32
    assert jnp.asarray(np.ones(2)).dtype == jnp.float64


# ------------------------------------------------------------------ Part 4


def test_part4_symbolic_zero_class():
    # part4_grad: "JAX's JVP, partial evaluator and transposition use *symbolic
    # zeros* (`jax._src.interpreters.ad.Zero`)".
    assert inspect.isclass(jax_ad.Zero)
    zero = jax_ad.Zero(core.ShapedArray((), jnp.float64))
    assert zero.aval.shape == ()


def test_part4_linearize_trace_and_undefined_primal_exist():
    # part4_grad: "one interpreter (`LinearizeTrace`) ... JAX marks linear inputs
    # with `UndefinedPrimal`".
    assert inspect.isclass(jax_ad.LinearizeTrace)
    assert inspect.isclass(jax_ad.UndefinedPrimal)


def test_part4_linearize_uses_the_linearize_trace(monkeypatch):
    # part4_grad: "`jax.linearize` and `jax.vjp` ... *linearize directly*: one
    # interpreter (`LinearizeTrace`) computes each primal value ... and records
    # the tangent operation into a jaxpr at once".
    seen = []

    def f(x):
        seen.append(type(core.trace_ctx.trace).__name__)
        return jnp.sin(x)

    jax.linearize(f, 1.0)
    jax.vjp(f, 1.0)
    assert seen == ["LinearizeTrace", "LinearizeTrace"]


def test_part4_direct_linearize_flag_is_defined_but_not_read(monkeypatch):
    # part4_grad: "The flag `jax_use_direct_linearize` is still defined, but
    # 0.10.2 no longer reads it; direct linearization is the only path".
    # part8_custom_rules says the same.
    assert "jax_use_direct_linearize" in jax.config.values
    log: list = []
    with counting_rule(
        monkeypatch, jax_ad.primitive_linearizations, jax_pjit.jit_p, log, "lin"
    ):
        with jax_config.use_direct_linearize(False):
            jax.grad(jax.jit(lambda x: jnp.sin(x) * x))(1.0)
    assert log == ["lin"]


def test_part4_few_primitives_linearize_directly_the_rest_fall_back(monkeypatch):
    # part4_grad: "the few primitives with a linearization rule of their own
    # (`sin`, `jit`, `scan`, `cond`, ...) use it, and the rest, `mul` and `cos`
    # among them, run their JVP rule under a partial evaluator
    # (`fallback_linearize_rule` calls `linearize_from_jvp`, in
    # `jax/_src/interpreters/ad.py`)".
    rules = jax_ad.primitive_linearizations
    for prim in [lax.sin_p, jax_pjit.jit_p, jax_loops.scan_p, jax_conditionals.cond_p]:
        assert prim in rules
    assert lax.mul_p not in rules and lax.cos_p not in rules
    assert len(rules) < len(jax_ad.primitive_jvps) / 4
    assert "linearize_from_jvp(" in inspect.getsource(jax_ad.fallback_linearize_rule)
    assert "pe.JaxprTrace(" in inspect.getsource(jax_ad.linearize_from_jvp)
    fell_back: list = []
    original = jax_ad.fallback_linearize_rule

    def counted(prim, *args, **kwargs):
        fell_back.append(prim.name)
        return original(prim, *args, **kwargs)

    monkeypatch.setattr(jax_ad, "fallback_linearize_rule", counted)
    jax.linearize(lambda x: jnp.cos(x) * x, 1.0)
    assert sorted(fell_back) == ["cos", "mul"]
    fell_back.clear()
    jax.linearize(jnp.sin, 1.0)
    assert fell_back == []


@contextlib.contextmanager
def counting_jit_rules(monkeypatch, log: list):
    """Count calls of jit's linearization rule ("lin") and of its two
    partial-evaluation rules ("pe", "pe2")."""
    jit_p = jax_pjit.jit_p
    with (
        counting_rule(monkeypatch, jax_ad.primitive_linearizations, jit_p, log, "lin"),
        counting_rule(monkeypatch, jax_pe.custom_partial_eval_rules, jit_p, log, "pe"),
        counting_rule(
            monkeypatch, jax_pe.partial_eval_jaxpr_custom_rules, jit_p, log, "pe2"
        ),
    ):
        yield


def test_part4_jit_split_by_its_linearize_rule(monkeypatch):
    # part4_grad: "A `jit` call, too, is split by a linearization rule of its
    # primitive (`_pjit_linearize`, which calls `ad.linearize_jaxpr`) ... When
    # `grad`, `vjp` or `linearize` meets a `jit` call directly, JAX's
    # partial-evaluation rules for `jit` are not called".
    assert jax_ad.primitive_linearizations[jax_pjit.jit_p] is jax_pjit._pjit_linearize
    assert "ad.linearize_jaxpr(" in inspect.getsource(jax_pjit._pjit_linearize)
    log: list = []
    with counting_jit_rules(monkeypatch, log):
        f = jax.jit(lambda x: jnp.sin(x) * x)
        jax.grad(f)(1.0)
        jax.vjp(f, 1.0)
        jax.linearize(f, 1.0)
    assert log == ["lin", "lin", "lin"]


@pytest.mark.parametrize("where", ["scan", "fori_loop", "checkpoint"])
def test_part4_jit_partial_eval_rules_used_inside_loops(monkeypatch, where):
    # part4_grad: "[JAX's partial-evaluation rules for `jit`] are [called] when
    # the call sits in the body of a `scan` or `fori_loop` (whose reverse mode
    # partially evaluates the body) or under `jax.checkpoint`".
    f = jax.jit(lambda x: jnp.sin(x) * x)
    loops = {
        "scan": lambda x: lax.scan(lambda c, _: (f(c), None), x, None, length=3)[0],
        "fori_loop": lambda x: lax.fori_loop(0, 3, lambda i, c: f(c), x),
        "checkpoint": jax.checkpoint(f),
    }
    log: list = []
    with counting_jit_rules(monkeypatch, log):
        jax.grad(loops[where])(1.0)
    assert {"pe", "pe2"} & set(log)


def test_part4_residuals_not_needed_are_removed():
    # part4_grad: "JAX removes residuals the linear jaxpr does not need
    # (dead-code elimination)": sin(x) is computed but the linear map of
    # sin(x) + 2x keeps only cos(x), not sin(x).
    _, f_lin = jax.linearize(lambda x: jnp.sin(x) + 2.0 * x, 1.0)
    jaxpr = jax.make_jaxpr(f_lin)(1.0)
    residuals = [float(c) for c in jaxpr.consts if np.ndim(c) == 0]
    assert np.cos(1.0) in residuals and np.sin(1.0) not in residuals


def test_part4_checkpoint_and_policies_exist():
    # part4_grad: "JAX also has `custom_jvp`/`custom_vjp` rules, checkpointing
    # (`jax.checkpoint`) ... and policies (`jax.checkpoint_policies`)".
    assert callable(jax.custom_jvp) and callable(jax.custom_vjp)
    assert callable(jax.checkpoint)
    assert callable(jax.checkpoint_policies.nothing_saveable)


def test_part4_grad_and_vjp_parameters():
    # part4_grad: "JAX's `grad` also takes `holomorphic` and `allow_int`, and
    # its `vjp` takes `has_aux`".
    grad_params = inspect.signature(jax.grad).parameters
    assert {"argnums", "has_aux", "holomorphic", "allow_int"} <= set(grad_params)
    assert "has_aux" in inspect.signature(jax.vjp).parameters


def test_part4_grad_wants_float_input_and_scalar_output():
    # part4_grad: "`grad` needs a float input and a scalar float output. As in JAX".
    with pytest.raises(TypeError, match="real- or complex-valued inputs"):
        jax.grad(lambda x: x * 1.0)(1)
    with pytest.raises(TypeError, match="scalar-output"):
        jax.grad(lambda x: x * jnp.ones(2))(1.0)


def test_part4_reverse_mode_still_transposes():
    # part4_grad: "JAX 0.10.2 still transposes": linear primitives have
    # transpose rules, and the gradient of a linear function is its transpose.
    assert lax.mul_p in jax_ad.primitive_transposes
    assert lax.reduce_sum_p in jax_ad.primitive_transposes
    grad = jax.grad(lambda x: jnp.sum(3.0 * x))(jnp.ones(2))
    np.testing.assert_array_equal(grad, [3.0, 3.0])


# ------------------------------------------------------------------ Part 5


def test_part5_cond_takes_number_predicates():
    # part5_cond: "`jax.lax.cond` also accepts an integer or floating-point
    # scalar as the predicate (nonzero is true)".
    branches = (lambda x: x + 1.0, lambda x: x - 1.0)
    assert float(lax.cond(2, *branches, 1.0)) == 2.0
    assert float(lax.cond(0, *branches, 1.0)) == 0.0
    assert float(lax.cond(0.5, *branches, 1.0)) == 2.0


def test_part5_cond_primitive_is_switch_on_an_index():
    # part5_cond: "its `cond` primitive takes an integer index and a tuple of
    # branches, and a boolean predicate becomes index 0 (false) or 1 (true)";
    # "JAX prints its branches in that order too, by index: 0 for false".
    jaxpr = jax.make_jaxpr(
        lambda p, x: lax.cond(p, lambda x: x + 1.0, lambda x: x - 1.0, x)
    )(True, 1.0)
    convert, cond = jaxpr.eqns
    assert convert.primitive.name == "convert_element_type"
    assert convert.params["new_dtype"] == np.int32
    assert cond.primitive.name == "cond" and isinstance(cond.params["branches"], tuple)
    false_branch, true_branch = cond.params["branches"]
    assert [e.primitive.name for e in false_branch.eqns] == ["sub"]
    assert [e.primitive.name for e in true_branch.eqns] == ["add"]
    assert lax.switch(1, [lambda: 0, lambda: 1]) == 1


def test_part5_vmap_of_cond_selects_with_stop_gradient():
    # part5_cond: "Under `vmap` with a batched predicate, JAX also runs every
    # branch and selects (with `select_n`), but it first wraps each branch's
    # operands in `stop_gradient` for the examples that do not take it, so ...
    # the `0 x inf` problem above cannot reach the gradient".
    def f(x):
        return lax.cond(x > 0, jnp.sqrt, lambda x: 0.0 * x, x)

    names = primitive_names(jax.vmap(f), jnp.ones(2))
    assert "select_n" in names and "stop_gradient" in names and "cond" not in names
    xs = jnp.array([-1.0, 4.0])
    grads = jax.grad(lambda xs: jnp.sum(jax.vmap(f)(xs)))(xs)
    np.testing.assert_array_equal(grads, [0.0, 0.25])
    where = jax.grad(lambda xs: jnp.sum(jnp.where(xs > 0, jnp.sqrt(xs), 0.0)))(xs)
    assert np.isnan(where[0])  # the problem the stop_gradient avoids


def _cond_grad_jaxpr():
    def g(x):
        return lax.cond(
            x > 0, lambda x: jnp.sin(x) * jnp.cos(x), lambda x: jnp.exp(x) * x, x
        )

    return jax.make_jaxpr(jax.grad(g))(1.0)


def test_part5_cond_residual_slots_are_empty2_and_shared():
    # part5_cond: "JAX's partial evaluation of `cond` also gives each branch the
    # other's residual slots, but fills them with uninitialized buffers (an
    # `empty2` equation in the printed jaxpr) ... and lets the branches share
    # slots of the same type, so a `cond` stores about as many residuals as its
    # hungrier branch rather than the sum."
    jaxpr = _cond_grad_jaxpr()
    primal_cond = next(e for e in jaxpr.eqns if e.primitive.name == "cond")
    assert "empty2" in str(jaxpr)
    # exp branch: 2 residuals (exp x, x); sin*cos branch: 4 (sin, cos, ...)
    n_residuals = len(primal_cond.outvars) - 1
    assert n_residuals == 4


def test_part5_cond_has_a_linearize_rule():
    # part5_cond: "`cond` has a linearize rule that does both in one step,
    # splitting each branch into its primal half ... and its linear half".
    assert jax_conditionals.cond_p in jax_ad.primitive_linearizations
    conds = [e for e in _cond_grad_jaxpr().eqns if e.primitive.name == "cond"]
    assert len(conds) == 2  # the primal cond and the (transposed) linear one


def test_part5_cond_number_predicate_nan_is_true():
    # part5_cond (check_predicate): a number predicate is "nonzero is true",
    # and "NaN is nonzero, as in JAX".
    branches = (lambda x: x + 1.0, lambda x: x - 1.0)
    assert float(lax.cond(float("nan"), *branches, 1.0)) == 2.0
    assert float(lax.cond(-0.0, *branches, 1.0)) == 0.0
    assert float(lax.cond(np.uint8(3), *branches, 1.0)) == 2.0


def test_part5_switch_clamps_with_one_cond():
    # part5_cond: "JAX's clamping of out-of-range indices"; "`switch` clamps its
    # index with a `clamp` and binds one `cond` with all its branches".
    branches = [lambda x: x + 1.0, lambda x: x * 2.0, lambda x: -x]
    assert float(lax.switch(-5, branches, 3.0)) == 4.0
    assert float(lax.switch(9, branches, 3.0)) == -3.0
    jaxpr = jax.make_jaxpr(lambda i, x: lax.switch(i, branches, x))(0, 1.0)
    names = [e.primitive.name for e in jaxpr.eqns]
    assert "clamp" in names and names.count("cond") == 1
    (cond,) = [e for e in jaxpr.eqns if e.primitive.name == "cond"]
    assert len(cond.params["branches"]) == 3


# ------------------------------------------------------------------ Part 6


def test_part6_while_primitive_params():
    # part6_loops: "JAX's `while` primitive has the same parameters as ours:
    # `cond_jaxpr`, `body_jaxpr`, `cond_nconsts` and `body_nconsts` (its jaxprs
    # are closed jaxprs ...)".
    jaxpr = jax.make_jaxpr(
        lambda a: lax.while_loop(lambda c: c < a, lambda c: c * a, 1.0)
    )(2.0)
    (eqn,) = jaxpr.eqns
    assert eqn.primitive.name == "while"
    assert set(eqn.params) == {
        "cond_jaxpr",
        "body_jaxpr",
        "cond_nconsts",
        "body_nconsts",
    }
    assert isinstance(eqn.params["body_jaxpr"], core.ClosedJaxpr)


def test_part6_fori_loop_static_bounds_is_scan():
    # part6_loops: "`jax.lax.fori_loop` with bounds that are Python ints ... is
    # a `scan` with a fixed `length`, so `grad` works through it".
    f = lambda x: lax.fori_loop(0, 5, lambda i, y: y * x, x)  # noqa: E731
    (eqn,) = jax.make_jaxpr(f)(1.0).eqns
    assert eqn.primitive.name == "scan" and eqn.params["length"] == 5
    np.testing.assert_allclose(jax.grad(f)(1.5), 6 * 1.5**5)


def test_part6_fori_loop_traced_bound_is_while_with_i_upper_val():
    # part6_loops: "with a traced bound it is a `while` whose carry is
    # `(i, upper, val)`".
    f = lambda x, n: lax.fori_loop(0, n, lambda i, y: y * x, x)  # noqa: E731
    (eqn,) = jax.make_jaxpr(f)(1.0, 5).eqns
    assert eqn.primitive.name == "while"
    body = eqn.params["body_jaxpr"]
    carry_types = [(a.dtype.name, a.shape) for a in body.out_avals]
    assert carry_types == [("int64", ()), ("int64", ()), ("float64", ())]


def test_part6_while_loop_reverse_mode_error():
    # part6_loops: "`jax.lax.while_loop` refuses reverse mode too, with a
    # `ValueError` that suggests `scan` or a `fori_loop` with static bounds."
    f = lambda a: lax.while_loop(lambda c: c < 10.0, lambda c: c * a, 1.0)  # noqa: E731
    with pytest.raises(ValueError, match=r"lax\.scan.*fori_loop with static"):
        jax.grad(f)(2.0)


def test_part6_while_loop_linearizes_and_fails_only_in_transposition():
    # part6_loops: "So `jax.linearize` works through a `while_loop`, and the
    # error comes only from transposition."
    f = lambda a: lax.while_loop(lambda c: c < 10.0, lambda c: c * a, 1.0)  # noqa: E731
    y, f_lin = jax.linearize(f, 2.0)
    assert float(y) == 16.0 and float(f_lin(1.0)) == 32.0
    _, f_vjp = jax.vjp(f, 2.0)  # the forward part runs
    with pytest.raises(ValueError, match="Reverse-mode differentiation"):
        f_vjp(1.0)


def test_part6_while_linearize_runs_known_loop_and_restages():
    # part6_loops: "it runs the known carries as a loop of their own, now, and
    # stages the whole loop again for the unknown ones, recomputing the known
    # part": linearize stages a known loop (counter, primal) and then the whole
    # loop again, counter and primal with the tangent.
    def f(x):
        body = lambda c: (c[0] + 1, c[1] * x)  # noqa: E731
        return lax.while_loop(lambda c: c[0] < 3, body, (0, x))[1]

    jaxpr = jax.make_jaxpr(lambda x: jax.linearize(f, x)[1](1.0))(2.0)
    known, whole = [e for e in jaxpr.eqns if e.primitive.name == "while"]
    carries = [
        [a.dtype.name for a in e.params["body_jaxpr"].out_avals] for e in (known, whole)
    ]
    assert carries == [["int64", "float64"], ["int64", "float64", "float64"]]


def test_part6_batched_predicate_stays_in_while():
    # part6_loops: "Under `vmap` with a batched predicate, JAX keeps the
    # predicate a boolean vector inside the `while` equation; the "any"
    # reduction and the per-example `select` are emitted when the loop is
    # lowered, not written into the jaxpr."
    def f(x):
        return lax.while_loop(lambda c: c < x, lambda c: c + 1.0, 0.0)

    jaxpr = jax.make_jaxpr(jax.vmap(f))(jnp.arange(3.0))
    (eqn,) = [e for e in jaxpr.eqns if e.primitive.name == "while"]
    assert str(eqn.params["cond_jaxpr"].out_avals[0]) == "bool[3]"
    names = [e.primitive.name for e in all_eqns(jaxpr)]
    assert not {"reduce_or", "select_n"} & set(names)
    text = lowered_text(jax.vmap(f), jnp.arange(3.0))
    assert "stablehlo.reduce" in text and "stablehlo.select" in text


def test_part6_while_lowered_inline_with_constants_in_state():
    # part6_loops: "JAX lowers the two jaxprs inline into the regions of
    # `stablehlo.while` instead of calling private functions; it too carries the
    # constants in the loop's state."
    def f(a, x):
        return lax.while_loop(lambda c: c < a, lambda c: jnp.sin(c) * a, x)

    text = lowered_text(f, 2.0, 1.0)
    assert "stablehlo.while(" in text and "func.func private" not in text
    (header,) = re.findall(r"stablehlo\.while\((.*)\)", text)
    assert header.count("%iterArg") == 3  # a for cond, a for body, the carry


def _while_with_effect(effect):
    def f(x):
        def body(c):
            effect(c[0])
            return c[0] + 1, c[1]

        return lax.while_loop(lambda c: c[0] < c[1], body, (0, x))

    return jax.vmap(f)


def test_part6_batched_predicate_with_debug_print_runs(capfd):
    # part6_loops: "the body keeps running for examples that have finished, so
    # a `jax.debug.print` in it also prints their discarded trips. JAX allows
    # that".
    f = _while_with_effect(lambda i: jax.debug.print("trip {}", i, ordered=True))
    out = f(jnp.array([1, 3]))
    jax.effects_barrier()
    np.testing.assert_array_equal(out[0], [1, 3])
    printed = capfd.readouterr().out.split("\n")
    assert printed.count("trip 1") == 3  # example 0 printed its discarded trips


def test_part6_batched_predicate_refuses_io_callbacks():
    # part6_loops: "and refuses only `io_callback`s: an unordered one when the
    # predicate is batched, an ordered one in any batched loop".
    from jax.experimental import io_callback

    unordered = _while_with_effect(lambda i: io_callback(lambda v: None, None, i))
    with pytest.raises(Exception, match="Unordered IO effects not supported in while"):
        unordered(jnp.array([1, 3]))
    ordered = _while_with_effect(
        lambda i: io_callback(lambda v: None, None, i, ordered=True)
    )
    with pytest.raises(Exception, match="Ordered IO effects not supported in vmap"):
        ordered(jnp.array([1, 3]))


def test_part6_fixed_points_by_transforming_the_body():
    # part6_loops: "both its `jvp` and `vmap` rules find their fixed points by
    # transforming the body jaxpr and looking at the result".
    assert "batching.batch_jaxpr(" in inspect.getsource(
        jax_loops._while_loop_batching_rule
    )
    assert "ad.jvp_jaxpr(" in inspect.getsource(jax_loops._while_loop_jvp)


# ------------------------------------------------------------------ Part 7


def _rnn_loss(w, xs):
    def step(h, x):
        h = jnp.tanh(h * w + x)
        return h, h

    return jnp.sum(lax.scan(step, 0.5, xs)[1])


def test_part7_scan_params():
    # part7_scan: "JAX's `scan` primitive has our parameters (`jaxpr`, `length`,
    # `num_consts`, `num_carry`, `reverse`) plus `unroll`", and no others (the
    # `linear` and `_split_transpose` of earlier releases are gone).
    scans = [e for e in all_eqns(jax.make_jaxpr(_rnn_loss)(0.8, jnp.ones(3)))]
    (eqn,) = [e for e in scans if e.primitive.name == "scan"]
    assert set(eqn.params) == {
        "jaxpr",
        "length",
        "num_consts",
        "num_carry",
        "reverse",
        "unroll",
    }


def test_part7_split_transpose_accepted_and_ignored():
    # `jax.lax.scan` still accepts a `_split_transpose` argument, and the jaxpr
    # is the same whichever value it gets: the argument is ignored.
    assert "_split_transpose" in inspect.signature(lax.scan).parameters

    def f(split):
        return lax.scan(
            lambda c, x: (c + x, c), 0.0, jnp.ones(3), _split_transpose=split
        )

    assert str(jax.make_jaxpr(lambda: f(True))()) == str(
        jax.make_jaxpr(lambda: f(False))()
    )


def _jax_linear_map_jaxpr(f, w):
    """The jaxpr of the linear map that ``jax.linearize(f, w)`` returns (its
    constants are the residuals), in float64."""
    with jax.enable_x64(True):
        _, linear = jax.linearize(f, w)
        return jax.make_jaxpr(linear)(w)


def test_part7_linear_scan_reads_stacked_residuals_and_w_as_constant():
    # part7_scan: "Its linear loop above reads the same kind of stacked
    # residuals as ours, one row per trip (`a`, `b`, `c`: the old `h`, the new
    # one, and one minus the new one, a factor of the derivative of `tanh`),
    # and the weight `w` is a constant of the loop (the literal `0.8`), not a
    # stack"; "its constants `a`, `b`, `c` are the residuals, and `d` is the
    # tangent of `w`".
    xs = np.sin(np.arange(3.0))

    def rnn_loss(w):  # the chapter's: the loss adds the squares
        def step(h, x):
            h = jnp.tanh(h * w + x)
            return h, h * h

        return jnp.sum(lax.scan(step, 0.5, xs)[1])

    closed = _jax_linear_map_jaxpr(rnn_loss, 0.8)
    (eqn,) = [e for e in closed.jaxpr.eqns if e.primitive.name == "scan"]
    residuals = closed.jaxpr.constvars
    (tangent_w,) = closed.jaxpr.invars
    num_consts, num_carry = eqn.params["num_consts"], eqn.params["num_carry"]
    consts, rows = eqn.invars[:num_consts], eqn.invars[num_consts + num_carry :]
    assert rows == residuals and [v.aval.shape for v in rows] == [(3,)] * 3
    assert isinstance(consts[0], core.Literal) and consts[0].val == 0.8  # w
    assert consts[1] is tangent_w
    h = np.zeros(4)
    h[0] = 0.5
    for t in range(3):
        h[t + 1] = np.tanh(0.8 * h[t] + xs[t])
    old_h, new_h, factor = (np.asarray(c) for c in closed.consts)
    np.testing.assert_allclose(old_h, h[:3])
    np.testing.assert_allclose(new_h, h[1:])
    np.testing.assert_allclose(factor, 1.0 - h[1:])  # (1 - t)(1 + t) = 1 - t^2


def test_part7_linear_scan_zero_tangents():
    # part7_scan: "Its tangents can be symbolic zeros: a carry whose tangent
    # stays zero on every trip is dropped from the linear loop, and no zero is
    # saved as a residual; a carry whose tangent becomes non-zero starts from
    # an instantiated zero (the `0.0` above)".
    xs = np.sin(np.arange(3.0))

    def two_carries(w):  # k's tangent stays zero on every trip
        def step(carry, x):
            h, k = carry
            h = jnp.tanh(h * w + x)
            return (h, k + x), h * k

        return jnp.sum(lax.scan(step, (0.5, 0.0), xs)[1])

    closed = _jax_linear_map_jaxpr(two_carries, 0.8)
    (eqn,) = [e for e in closed.jaxpr.eqns if e.primitive.name == "scan"]
    assert eqn.params["num_carry"] == 1  # only h's tangent
    (init,) = eqn.invars[eqn.params["num_consts"] :][:1]
    assert isinstance(init, core.Literal) and init.val == 0.0

    def matrix_loss(W):  # as the chapter's memory example, smaller
        def step(h, x):
            h = jnp.tanh(W @ h + x)
            return h, jnp.sum(h * h)

        return jnp.sum(lax.scan(step, jnp.zeros(4), seq)[1])

    rng = np.random.default_rng(1)
    W0, seq = rng.normal(size=(4, 4)) * 0.1, rng.normal(size=(5, 4))
    closed = _jax_linear_map_jaxpr(matrix_loss, W0)
    assert [c.shape for c in closed.consts] == [(4, 4), (5, 4), (5, 4), (5, 4)]
    assert not any(np.all(np.asarray(c) == 0) for c in closed.consts)
    (eqn,) = [e for e in closed.jaxpr.eqns if e.primitive.name == "scan"]
    init = eqn.invars[eqn.params["num_consts"]]
    (zeros,) = [e for e in closed.jaxpr.eqns if init in e.outvars]
    assert zeros.primitive.name == "broadcast_in_dim"
    assert isinstance(zeros.invars[0], core.Literal) and zeros.invars[0].val == 0.0


def test_part7_linearized_rnn_residuals_and_w_as_constant():
    # part7_scan: "In the gradient, the transposed loop has `reverse=True`,
    # and its carry holds the cotangent of `w` being summed next to that of
    # `h`" (and the known loop emits the old `h`, the new one and the tanh
    # factor, `w` reaching the transposed loop as a constant).
    jaxpr = jax.make_jaxpr(jax.grad(_rnn_loss))(0.8, jnp.ones(3))
    forward, backward = [e for e in jaxpr.eqns if e.primitive.name == "scan"]
    assert not forward.params["reverse"] and backward.params["reverse"]
    assert backward.params["num_carry"] == 2  # ct of w and ct of h
    stacked = [v for v in forward.outvars if v.aval.shape == (3,)]
    assert len(stacked) == 4  # ys, then old h, new h and 1 - tanh(...)
    body = forward.params["jaxpr"].jaxpr
    old_h = body.invars[forward.params["num_consts"]]
    assert body.outvars[2] is old_h  # the old h is a residual
    assert body.outvars[3] is body.outvars[0]  # and so is the new one
    assert "sub 1.0" in str(forward.params["jaxpr"])  # the tanh factor
    assert backward.params["num_consts"] == 1
    assert backward.invars[0] is jaxpr.jaxpr.invars[0]  # w, a constant


def test_part7_named_scan_rules_exist():
    # part7_scan: `_scan_known_hoisting` and `_scan_partial_eval_custom` in
    # jax/_src/lax/control_flow/loops.py; "`scan` has a linearize rule
    # (`_scan_linearize`)"; "JAX's rule (`_scan_transpose_fancy` in this
    # release)". performance: grad of scan uses scan's linearize rule.
    assert callable(jax_loops._scan_known_hoisting)
    assert jax_pe.partial_eval_jaxpr_custom_rules[jax_loops.scan_p] is (
        jax_loops._scan_partial_eval_custom
    )
    assert (
        jax_ad.primitive_linearizations[jax_loops.scan_p] is jax_loops._scan_linearize
    )
    assert jax_ad.fancy_transposes[jax_loops.scan_p] is jax_loops._scan_transpose_fancy
    # JAX's transpose rule also handles mutable references (`jax.Ref`).
    assert inspect.isclass(jax.Ref)
    assert "AbstractRef" in inspect.getsource(jax_loops._scan_transpose_fancy)


def test_part7_grad_of_scan_uses_its_linearize_rule(monkeypatch):
    # part7_scan: "JAX's reverse mode does not run the JVP scan and then split
    # it: `scan` has a linearize rule". performance: "JAX builds its pair with
    # `scan`'s linearize rule and transposition".
    log: list = []
    scan_p = jax_loops.scan_p
    with (
        counting_rule(monkeypatch, jax_ad.primitive_linearizations, scan_p, log, "lin"),
        counting_rule(monkeypatch, jax_ad.primitive_jvps, scan_p, log, "jvp"),
        counting_rule(monkeypatch, jax_pe.custom_partial_eval_rules, scan_p, log, "pe"),
    ):
        jax.grad(lambda w: _rnn_loss(w, jnp.ones(3)))(0.8)
    assert log == ["lin"]


def test_part7_remat_is_checkpoint():
    # part7_scan: "`jax.checkpoint` (also called `remat`)".
    assert "Alias of :func:`jax.checkpoint`" in jax.remat.__doc__
    a = jax.make_jaxpr(jax.remat(jnp.sin))(1.0)
    b = jax.make_jaxpr(jax.checkpoint(jnp.sin))(1.0)
    assert str(a) == str(b) and "remat2[" in str(a)  # JAX's name for the primitive


def test_part7_unroll_true_removes_the_loop():
    # part7_scan: "`unroll=True` removes the loop altogether".
    def f(xs, unroll):
        return lax.scan(lambda c, x: (c + x, c), 0.0, xs, unroll=unroll)

    assert "stablehlo.while" in lowered_text(lambda xs: f(xs, 1), jnp.ones(3))
    assert "stablehlo.while" not in lowered_text(lambda xs: f(xs, True), jnp.ones(3))


def test_part7_body_is_called_as_private_function():
    # JAX's lowered scan calls the body from the loop's region as a private
    # function (`@closed_call`), next to two small private functions that read
    # a row of `xs` and write a row of `ys`.
    text = lowered_text(
        lambda xs: lax.scan(lambda c, x: (jnp.sin(c) + x, c), 0.0, xs), jnp.ones(3)
    )
    privates = re.findall(r"func\.func private @(\w+)", text)
    assert sorted(privates) == [
        "closed_call",
        "dynamic_index_in_dim",
        "dynamic_update_index_in_dim",
    ]


def test_part7_pass_through_carry_and_forwarded_rows():
    # part7_scan: "before it binds `scan`, JAX turns a carry that the body passes
    # through unchanged into a constant, and takes a `y` that is just the row of
    # an `xs` from `xs` itself".
    jaxpr = jax.make_jaxpr(
        lambda xs: lax.scan(lambda c, x: ((c[0] + x, c[1]), x), (0.0, 1.0), xs)
    )(jnp.ones(3))
    (eqn,) = jaxpr.eqns
    assert eqn.params["num_carry"] == 1 and len(eqn.outvars) == 1
    assert jaxpr.jaxpr.outvars[-1] is jaxpr.jaxpr.invars[0]


# ------------------------------------------------------------------ Part 8


@jax.custom_jvp
def _softplus(x):
    return jnp.log(1.0 + jnp.exp(x))


@_softplus.defjvp
def _softplus_jvp(primals, tangents):
    return _softplus(primals[0]), tangents[0] * jax.nn.sigmoid(primals[0])


@functools.partial(jax.custom_vjp, nondiff_argnums=(1,))
def _clip_gradient(x, bound):
    return x


_clip_gradient.defvjp(
    lambda x, bound: (x, None), lambda bound, _, ct: (jnp.clip(ct, -bound, bound),)
)


def test_part8_custom_call_primitives_and_params():
    # part8_custom_rules: "JAX's primitives are called `custom_jvp_call` and
    # `custom_vjp_call`, with parameters much like ours: `call_jaxpr`, the rule
    # as a Python callable (`jvp_jaxpr_fun`, printed `jvp`, or
    # `fwd_jaxpr_thunk` and `bwd`), and `symbolic_zeros`."
    (jvp_eqn,) = jax.make_jaxpr(_softplus)(1.0).eqns
    assert jvp_eqn.primitive.name == "custom_jvp_call"
    assert {"call_jaxpr", "jvp_jaxpr_fun", "symbolic_zeros"} <= set(jvp_eqn.params)
    assert "jvp=_softplus_jvp" in str(jax.make_jaxpr(_softplus)(1.0))
    (vjp_eqn,) = jax.make_jaxpr(lambda x: _clip_gradient(x, 5.0))(1.0).eqns
    assert vjp_eqn.primitive.name == "custom_vjp_call"
    assert {"call_jaxpr", "fwd_jaxpr_thunk", "bwd", "symbolic_zeros"} <= set(
        vjp_eqn.params
    )


def test_part8_grad_keeps_unused_primal_custom_jvp_call():
    # part8_custom_rules: "Under `grad`, JAX keeps the primal `custom_jvp_call`
    # (its result unused, printed `_`) and inlines the rule's tangent computation".
    jaxpr = jax.make_jaxpr(jax.grad(_softplus))(1.0)
    first = jaxpr.eqns[0]
    assert first.primitive.name == "custom_jvp_call"
    assert re.search(r"_:f64\[\] = custom_jvp_call", str(jaxpr))
    assert "logistic" in [e.primitive.name for e in jaxpr.eqns[1:]]


def test_part8_grad_of_custom_vjp_has_no_call():
    # part8_custom_rules: "for `custom_vjp` the gradient jaxpr holds `fwd`'s and
    # `bwd`'s operations, traced in place, with no trace of the call".
    names = primitive_names(jax.grad(lambda x: _clip_gradient(x, 5.0) ** 3), 1.0)
    assert "custom_vjp_call" not in names and "custom_lin" not in names
    assert {"min", "max"} <= set(names)  # bwd's clip


def test_part8_jvp_of_custom_vjp_binds_custom_lin():
    # part8_custom_rules: "JAX's JVP interpreter treats a `custom_vjp` call as
    # ours does: it runs `fwd` and binds a primitive named `custom_lin` (with
    # parameters such as `num_res`, `bwd`, `out_avals`, `in_zeros` and
    # `symbolic_zeros`) whose evaluation raises the `TypeError` ..., `can't
    # apply forward-mode autodiff (jvp) to a custom_vjp function.` Like ours,
    # it raises when something tries to compute a `custom_lin`'s output: at
    # once for an eager `jvp`, when compiling under `jit`, and never inside
    # `make_jaxpr`, which only records the equation."
    def jvp_of_clip(x):
        return jax.jvp(lambda x: _clip_gradient(x, 5.0), (x,), (x,))

    (eqn,) = jax.make_jaxpr(jvp_of_clip)(1.0).eqns
    assert eqn.primitive is jax_ad.custom_lin_p and eqn.primitive.name == "custom_lin"
    params = {"num_res", "bwd", "out_avals", "in_zeros", "symbolic_zeros"}
    assert params == set(eqn.params)
    message = "can't apply forward-mode autodiff (jvp) to a custom_vjp function."
    for run in [jvp_of_clip, jax.jit(jvp_of_clip)]:
        with pytest.raises(TypeError) as info:
            run(1.0)
        assert str(info.value) == message


def test_part8_custom_lin_batching_rule_raises():
    # part8_custom_rules: "JAX's `custom_lin` has no real batching rule: the one
    # registered for it raises the same error (`jax/_src/custom_derivatives.py`),
    # so `vmap` of a `jvp` of a `custom_vjp` function fails while it is traced,
    # even inside `make_jaxpr`."
    assert "batching.primitive_batchers[ad.custom_lin_p] = " in inspect.getsource(
        jax_custom
    )
    rule = jax_batching.fancy_primitive_batchers[jax_ad.custom_lin_p]
    wrapped = [cell.cell_contents for cell in rule.__closure__]
    assert jax_ad.raise_custom_vjp_error_on_jvp in wrapped

    def vmap_of_jvp(xs):
        return jax.vmap(
            lambda x: jax.jvp(lambda x: _clip_gradient(x, 5.0), (x,), (x,))
        )(xs)

    message = "can't apply forward-mode autodiff (jvp) to a custom_vjp function."
    with pytest.raises(TypeError, match=re.escape(message)):
        jax.make_jaxpr(vmap_of_jvp)(jnp.ones(3))


def test_part8_symbolic_zeros_option():
    # part8_custom_rules: "With `symbolic_zeros=True`, JAX's rules are told which
    # tangents (or cotangents) are known to be zero".
    assert "symbolic_zeros" in inspect.signature(jax.custom_jvp.defjvp).parameters
    assert "symbolic_zeros" in inspect.signature(jax.custom_vjp.defvjp).parameters

    @jax.custom_jvp
    def f(x, y):
        return x * y

    seen = []

    @functools.partial(f.defjvp, symbolic_zeros=True)
    def _(primals, tangents):
        seen.append([type(t).__name__ for t in tangents])
        x, y = primals
        return f(x, y), jnp.zeros_like(x)

    jax.jvp(lambda x: f(x, 2.0), (1.0,), (1.0,))
    assert seen[0][1] == "SymbolicZero"


def test_part8_defjvps_and_bwd_none():
    # part8_custom_rules: "`custom_jvp` also has `defjvps`, one rule per
    # argument ...; a `custom_vjp`'s `bwd` may return `None` for an argument
    # whose cotangent is zero".
    @jax.custom_jvp
    def f(x, y):
        return x * y

    f.defjvps(lambda t, ans, x, y: t * y, lambda t, ans, x, y: t * x)
    assert float(jax.grad(f, 1)(3.0, 2.0)) == 3.0

    @jax.custom_vjp
    def g(x, y):
        return x * y

    g.defvjp(lambda x, y: (x * y, y), lambda y, ct: (ct * y, None))
    assert jax.grad(g, (0, 1))(3.0, 2.0) == (2.0, 0.0)


def test_part8_closures_over_differentiated_values_refused():
    # part8_custom_rules: "JAX refuses a closure over a value that is being
    # differentiated (an `UnexpectedTracerError`; `closure_convert` turns
    # closed-over values into arguments) ... but accepts a closure over the
    # tracers of other transformations, such as an enclosing `jit`".
    def outer(y):
        @jax.custom_vjp
        def f(x):
            return x * y

        f.defvjp(lambda x: (x * y, None), lambda _, ct: (ct * y,))
        return f(2.0)

    with pytest.raises(jax.errors.UnexpectedTracerError):
        jax.grad(outer)(3.0)
    assert float(jax.jit(outer)(3.0)) == 6.0
    assert callable(jax.closure_convert)


def test_part9_pmap_devices_places_row_i_on_the_ith_device():
    # part9_named_axes: "As in JAX, `devices=` ... says where the rows run: row
    # `i` on the list's `i`-th device."
    chosen = [jax.devices()[5], jax.devices()[1], jax.devices()[3]]
    out = jax.pmap(lambda x: x * 2.0, devices=chosen)(jnp.arange(3.0))
    assert [s.device.id for s in out.addressable_shards] == [5, 1, 3]


def test_part1_vmap_batches_keyword_arguments_along_axis_0():
    # part1_interpreters: "Keyword arguments are batched along axis 0, whatever
    # `in_axes` says, as in JAX."
    m = jnp.arange(6.0).reshape(2, 3)
    out = jax.vmap(lambda x, *, y: x + y, in_axes=1)(m, y=m.T)
    assert out.tolist() == (m.T + m.T).tolist()
    with pytest.raises(ValueError):
        jax.vmap(lambda x, *, y: x + y, in_axes=1)(m, y=m)


def test_part4_vjp_function_is_a_pytree_of_residuals():
    # part4_grad: the function vjp returns, "like JAX's, ... is a pytree whose
    # leaves are the residuals, so it can be returned from `jit`".
    _, f_vjp = jax.vjp(lambda x: jnp.sin(x) * x, 1.0)
    leaves = jax.tree.leaves(f_vjp)
    assert leaves and all(isinstance(x, jax.Array) for x in leaves)
    returned = jax.jit(lambda x: jax.vjp(lambda x: jnp.sin(x) * x, x)[1])(1.0)
    assert float(returned(1.0)[0]) == float(f_vjp(1.0)[0])
    # part4_grad's folded cell: "its own class, jax._src.api.VJP, in JAX 0.10.2"
    assert f"{type(f_vjp).__module__}.{type(f_vjp).__name__}" == "jax._src.api.VJP"


def test_part8_closures_over_vmap_tracers_and_staged_custom_vjp():
    # part8_custom_rules: JAX "accepts a custom function that closes over
    # tracers of an enclosing `jit` or `vmap`", raises "a `CustomVJPException`"
    # for "a `custom_vjp` staged by `jit` and differentiated later", and "a
    # `bwd` that closes over a `vmap`'s tracer while `grad` runs outside that
    # `vmap`" is refused by both (an `UnexpectedTracerError`).
    def make(y, use_in_bwd):
        @jax.custom_vjp
        def f(x):
            return x * y

        f.defvjp(
            lambda x: (x * y, y),
            lambda r, ct: (ct * (y if use_in_bwd else r),),
        )
        return f

    vmapped = jax.vmap(lambda y: make(y, True)(2.0))(jnp.array([1.0, 3.0]))
    assert vmapped.tolist() == [2.0, 6.0]
    with pytest.raises(jax_ad.CustomVJPException):
        jax.grad(jax.jit(lambda y: make(y, False)(2.0)))(0.5)
    with pytest.raises(jax.errors.UnexpectedTracerError):
        jax.grad(
            lambda x: jax.vmap(lambda y: make(y, True)(x))(jnp.array([1.0, 3.0])).sum()
        )(2.0)


def test_part8_traced_nondiff_argnums():
    # part8_custom_rules: JAX refuses "traced `nondiff_argnums` of a
    # `custom_vjp`, but accepts ... traced `nondiff_argnums` of a `custom_jvp`,
    # whose gradient it stops".
    with pytest.raises(Exception, match="nondiff_argnums"):
        jax.grad(lambda b: _clip_gradient(2.0, b))(5.0)

    @functools.partial(jax.custom_jvp, nondiff_argnums=(1,))
    def scale(x, s):
        return x * s

    scale.defjvp(lambda s, p, t: (scale(p[0], s), t[0] * s))
    assert float(jax.grad(lambda s: scale(2.0, s))(3.0)) == 0.0


def test_part8_dce_and_transpose_rules_of_custom_calls():
    # part8_custom_rules: "JAX has dead-code elimination rules for both calls,
    # and, like ours, a transpose for `custom_jvp_call` that transposes its
    # jaxpr."
    assert jax_custom.custom_jvp_call_p in jax_pe.dce_rules
    assert jax_custom.custom_vjp_call_p in jax_pe.dce_rules
    transpose = jax_ad.fancy_transposes[jax_custom.custom_jvp_call_p]
    assert "backward_pass" in inspect.getsource(transpose)


def test_part8_eager_call_runs_fun():
    # part8_custom_rules: "Called outside every transformation, a custom
    # function simply runs `fun`, as in JAX, so Python control flow on its
    # arguments works there."
    calls = []

    @jax.custom_jvp
    def f(x):
        calls.append(type(x))
        return x * 2.0 if x > 0 else x

    f.defjvp(lambda p, t: (f(p[0]), t[0]))
    assert float(f(3.0)) == 6.0
    assert len(calls) == 1 and not issubclass(calls[0], core.Tracer)


def test_part8_keyword_arguments_resolved_to_positions():
    # part8_custom_rules: "Keyword arguments are matched to `fun`'s parameters
    # and passed by position (defaults filled in), as JAX does, so the rule sees
    # every argument in `primals`."
    seen = []

    @jax.custom_jvp
    def f(x, y=2.0, z=3.0):
        return x * y * z

    @f.defjvp
    def _(primals, tangents):
        seen.append(tuple(float(p) for p in primals))
        return f(*primals), tangents[0]

    jax.jvp(lambda x: f(x, z=5.0), (1.0,), (1.0,))
    assert seen == [(1.0, 2.0, 5.0)]
    assert "resolve_kwargs" in inspect.getsource(jax.custom_jvp.__call__)


def test_part8_bwd_none_for_parts_of_arguments():
    # part8_custom_rules: "as in JAX, `None` may stand for a zero cotangent, of a
    # whole argument or of any part of one".
    @jax.custom_vjp
    def f(x, pair):
        return x * pair[0] + pair[1]

    f.defvjp(lambda x, p: (f(x, p), x), lambda x, ct: (None, (ct * x, None)))
    assert jax.grad(f, (0, 1))(2.0, (3.0, 4.0)) == (0.0, (2.0, 0.0))


# ------------------------------------------------------------------ Part 9

ROWS = np.arange(12.0).reshape(4, 3)


def test_part9_pmap_is_jit_of_shard_map():
    # part9_named_axes: "`jax.pmap` is `jit` of `shard_map`: the printed jaxpr
    # shows a `jit` equation whose body is a `shard_map` over a one-axis mesh,
    # with the collectives inside written as `psum[axes=('i',) ...]`. There is
    # no `pmap` primitive any more. Its body receives each device's block as
    # `f64[1,3]` and squeezes it to a row".
    f = jax.pmap(lambda r: r / lax.psum(r, "i"), "i")
    text = jaxpr_text(f, ROWS)
    jaxpr = jax.make_jaxpr(f)(ROWS)
    assert [e.primitive.name for e in jaxpr.eqns] == ["jit"]
    names = primitive_names(f, ROWS)
    assert "shard_map" in names and "squeeze" in names
    assert not any("pmap" in name for name in names)
    registered = {
        value.name
        for name, module in list(sys.modules.items())
        if name.startswith("jax._src")
        for value in list(vars(module).values())
        if isinstance(value, core.Primitive)
    }
    assert "shard_map" in registered
    assert not any("pmap" in name for name in registered)
    assert "psum[axes=('i',)" in text and "c:f64[1,3]" in text
    assert "Mesh('i': 4" in text


def test_part9_unbound_axis_name_is_name_error():
    # part9_named_axes: "JAX raises `NameError` for an unbound axis name";
    # "`jax._src.core.AxisEnv`, whose lookup raises `NameError`".
    assert inspect.isclass(core.AxisEnv)
    with pytest.raises(NameError, match="unbound axis name: k"):
        core.AxisEnv().axis_size("k")
    with pytest.raises(NameError, match="unbound axis name: j"):
        jax.vmap(lambda r: lax.psum(r, "j"), axis_name="i")(ROWS)


def test_part9_batching_trace_carries_its_axis_name():
    # part9_named_axes: "each batching trace carries its axis name
    # (`AxisData.name`)".
    seen = []

    def f(r):
        seen.append(core.trace_ctx.trace.axis_data.name)
        return r

    jax.vmap(f, axis_name="rows")(ROWS)
    assert seen == ["rows"]


def test_part9_axis_index_under_vmap_is_iota():
    # part9_named_axes: "Under `vmap`, JAX's `axis_index` is an `iota` primitive".
    names = primitive_names(
        jax.vmap(lambda r: lax.axis_index("i"), axis_name="i"), ROWS
    )
    assert names == ["iota"]


def test_part9_psum_over_names_is_one_primitive():
    # part9_named_axes: "its `psum` over a tuple of axis names is one primitive
    # with `axes=(...)`".
    f = jax.vmap(
        jax.vmap(lambda x: lax.psum(x, ("i", "j")), axis_name="j"), axis_name="i"
    )
    psums = [e for e in all_eqns(jax.make_jaxpr(f)(ROWS)) if e.primitive.name == "psum"]
    assert len(psums) == 1 and len(psums[0].params["axes"]) == 2


def test_part9_pmap_compiles_partitions_with_channel_handles():
    # part9_named_axes: "`jax.pmap(f).lower(x)` shows `mhlo.num_partitions = 4`,
    # `mhlo.num_replicas = 1` for four rows), and its `all_reduce` carries a
    # channel handle".
    text = jax.pmap(lambda r: lax.psum(r, "i"), "i").lower(ROWS).as_text()
    assert "mhlo.num_partitions = 4" in text and "mhlo.num_replicas = 1" in text
    assert re.search(r"all_reduce.*channel_handle", text)
    # "the compiler's partitioner (GSPMD, and now Shardy)": Shardy is the
    # default, and the lowered module is written in its `sdy` dialect.
    assert jax.config.values["jax_use_shardy_partitioner"] is True
    assert "sdy.mesh @mesh" in text


def test_part9_pmax_has_no_derivative():
    # part9_named_axes: "JAX has none (`grad` of a `pmax` is a
    # `NotImplementedError`)".
    with pytest.raises(NotImplementedError, match="pmax"):
        jax.grad(
            lambda r: jax.vmap(lambda r: lax.pmax(r, "i"), axis_name="i")(r).sum()
        )(ROWS)


def test_part9_jit_with_shardings_inserts_collectives():
    # part9_named_axes: "they `jit` a function of arrays that carry a sharding
    # ..., and the compiler's partitioner ... inserts the collectives itself";
    # "`shard_map` is the explicit form".
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:4]), ("rows",))
    sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("rows"))
    x = jax.device_put(ROWS, sharding)
    compiled = jax.jit(lambda x: x.sum(0)).lower(x).compile().as_text()
    assert "all-reduce" in compiled
    np.testing.assert_allclose(jax.jit(lambda x: x.sum(0))(x), ROWS.sum(0))
    assert callable(jax.shard_map)


def test_part9_pmap_inside_jit_works():
    # part9_named_axes: "`pmap` inside `jit` works in JAX".
    f = jax.pmap(lambda r: r / lax.psum(r, "i"), "i")
    np.testing.assert_allclose(jax.jit(f)(ROWS), ROWS / ROWS.sum(0))


def test_part9_pmean_is_psum_over_size():
    # part9_named_axes: "`pmean`, which is a `psum` divided by the axis size
    # (JAX defines it the same way)"; "JAX spells it `pmean(grads,
    # axis_name=...)`".
    assert "axis_name" in inspect.signature(lax.pmean).parameters
    names = primitive_names(jax.vmap(lambda r: lax.pmean(r, "i"), axis_name="i"), ROWS)
    assert names[:1] == ["psum"] and "div" in names


def test_part9_collectives_take_pytrees():
    # part9_named_axes: "As in JAX, the wrappers apply to every leaf of a pytree".
    out = jax.vmap(lambda d: lax.psum(d, "i"), axis_name="i")({"a": ROWS, "b": ROWS})
    np.testing.assert_allclose(out["b"], np.broadcast_to(ROWS.sum(0), ROWS.shape))


# ------------------------------------------------------------------ appendix


def test_rule_table_jax_has_no_keep_gradient_but_cuts_the_untaken_branch():
    # rule_table: "JAX has no such primitive; its batched cond gets the same
    # effect with select_n and stop_gradient"; and its primitives' names.
    assert not hasattr(lax, "keep_gradient")

    def f(x):
        return lax.cond(x > 0, jnp.sqrt, lambda x: 0.0 * x, x)

    def loss(xs):
        return jnp.sum(jax.vmap(f)(xs))

    with jax.enable_x64(True):
        xs = jnp.array([0.0, 4.0])
        names = {e.primitive.name for e in jax.make_jaxpr(jax.grad(loss))(xs).eqns}
        np.testing.assert_array_equal(jax.grad(loss)(xs), [0.0, 0.25])
    assert {"select_n", "stop_gradient"} <= names
    assert {"jit", "select_n", "broadcast_in_dim"} <= {
        p.name for p in (jax_pjit.jit_p, lax.select_n_p, lax.broadcast_in_dim_p)
    }


def test_appendix_python_protocols_on_a_traced_scalar_refuse_in_jax():
    # appendix_primitives: hash, float, if and len of a traced scalar all
    # refuse under jax.jit; len of a traced vector is its leading size.
    from jax.errors import ConcretizationTypeError, TracerBoolConversionError

    for use, error in [
        (hash, TypeError),
        (float, ConcretizationTypeError),
        (bool, TracerBoolConversionError),
        (len, TypeError),
    ]:
        with pytest.raises(error):
            jax.jit(lambda x, use=use: x * use(x))(2.0)
    np.testing.assert_array_equal(
        jax.jit(lambda x: x * len(x))(np.arange(3.0)), [0.0, 3.0, 6.0]
    )


def test_appendix_stop_gradient_has_no_transpose_rule_in_jax():
    # appendix_primitives / rule_table: "JAX registers no transpose rule for
    # it either" (stop_gradient).
    assert not any(p.name == "stop_gradient" for p in jax_ad.primitive_transposes)
    with pytest.raises(NotImplementedError, match="stop_gradient"):
        jax.linear_transpose(lax.stop_gradient, 1.0)(2.0)


def test_appendix_empty_max_raises_but_lax_reduce_max_is_minus_inf():
    # appendix_primitives: max and min of no elements are a ValueError in
    # jax.numpy; lax.reduce_max answers -inf, the identity of max.
    with pytest.raises(ValueError, match="zero-size array to reduction operation max"):
        jnp.max(jnp.zeros((2, 0)), axis=1)
    with pytest.raises(ValueError, match="zero-size array to reduction operation min"):
        jnp.min(jnp.zeros(0))
    assert jnp.max(jnp.zeros((0, 3)), axis=1).shape == (0,)
    assert float(lax.reduce_max(jnp.zeros(0), (0,))) == -np.inf


def test_part1_comparison_primitives_named_gt_lt():
    # part1_interpreters: "The primitives get JAX's names, `gt` and `lt`; the
    # wrappers keep NumPy's, `greater` and `less`."
    jaxpr = jax.make_jaxpr(lambda x: (jnp.greater(x, 1.0), jnp.less(x, 1.0)))(2.0)
    assert [e.primitive.name for e in jaxpr.eqns] == ["gt", "lt"]


def test_part1_rules_run_under_the_parent_trace():
    # part1_interpreters: "(Real JAX reaches the same result another way, by
    # running a rule's operations under the parent of its trace ...)": a JVP
    # trace keeps the trace it was started under and binds its rules there.
    source = inspect.getsource(jax_ad.JVPTrace.process_primitive)
    assert "set_current_trace(self.parent_trace)" in source


@pytest.mark.parametrize("name", ["eq", "ne", "lt", "le", "gt", "ge"])
def test_appendix_comparisons_are_primitives_named_as_lax(name):
    # appendix_primitives: "Four comparison primitives join `gt` and `lt` ...
    # with JAX's names: `eq`, `ne`, `le` and `ge`"; "JAX's `lax` module holds
    # its primitives' wrappers under the primitives' names (`lax.eq`, ...)".
    op = {"eq": "__eq__", "ne": "__ne__", "lt": "__lt__", "le": "__le__",
          "gt": "__gt__", "ge": "__ge__"}[name]  # fmt: skip
    jaxpr = jax.make_jaxpr(lambda x: getattr(x, op)(3.0))(2.0)
    assert [e.primitive.name for e in jaxpr.eqns] == [name]
    (eqn,) = jax.make_jaxpr(getattr(lax, name))(2.0, 3.0).eqns
    assert eqn.primitive.name == name


def test_appendix_eq_under_jit_in_cond_gives_six():
    # appendix_primitives: "`f(3.0)` gave 9.0 where JAX gives 6.0".
    f = jax.jit(lambda x: lax.cond(x == 3.0, jnp.add, jnp.multiply, x, x))
    assert float(f(3.0)) == 6.0


def test_appendix_comparison_lowers_to_stablehlo_compare():
    # appendix_primitives: "lowering emits `stablehlo.compare` with a direction".
    text = jax.jit(lambda x, y: x == y).lower(1.0, 2.0).as_text()
    assert re.search(r"stablehlo\.compare\s+EQ", text)


def test_appendix_tracers_and_arrays_are_unhashable():
    # appendix_primitives: "A tracer is unhashable, as in JAX".
    with pytest.raises(TypeError, match="unhashable"):
        jax.jit(lambda x: hash(x))(1.0)
    with pytest.raises(TypeError, match="unhashable"):
        hash(jnp.ones(2))


def test_appendix_python_protocols_on_tracers():
    # appendix_primitives: each protocol "works as it does in JAX or refuses":
    # float()/int()/index of a traced value raise, len() is the leading size,
    # iterating a 0-d value raises; JAX's == defers to unknown types.
    for protocol in (float, int, lambda x: [0, 1][x]):
        with pytest.raises(TypeError):
            jax.jit(lambda x, p=protocol: p(x))(1)
    assert int(jax.jit(lambda x: len(x))(jnp.ones(4))) == 4
    with pytest.raises(TypeError, match="0-d"):
        jax.jit(lambda x: list(x))(1.0)
    assert jnp.ones(2).__eq__(None) is NotImplemented


def test_appendix_promotion_lattice():
    # appendix_primitives: "`jax.numpy` combines different dtypes by a promotion
    # lattice (`int32 + float32` is `float32`)".
    out = jnp.ones(2, jnp.int32) + jnp.ones(2, jnp.float32)
    assert out.dtype == jnp.float32


def test_appendix_convert_element_type_weak_type_param():
    # appendix_primitives: "JAX's `convert_element_type` accordingly has a
    # `weak_type` param."
    (eqn,) = jax.make_jaxpr(lambda x: x.astype(jnp.float32))(1).eqns
    assert eqn.primitive.name == "convert_element_type"
    assert "weak_type" in eqn.params


def test_appendix_col_plus_row_jaxpr():
    # appendix_primitives: "`jax.make_jaxpr` of `col + row` above shows one
    # `broadcast_in_dim` that adds the row's leading axis, then an `add` of
    # shapes `(3, 1)` and `(1, 4)`."
    jaxpr = jax.make_jaxpr(jnp.add)(jnp.ones((3, 1)), jnp.ones(4))
    eqns = jaxpr.eqns
    assert [e.primitive.name for e in eqns] == ["broadcast_in_dim", "add"]
    assert eqns[0].outvars[0].aval.shape == (1, 4)
    assert [v.aval.shape for v in eqns[1].invars] == [(3, 1), (1, 4)]


def test_appendix_dot_general_params():
    # appendix_primitives: "`lax.dot_general` also takes a `precision`, a
    # `preferred_element_type` ... and an `out_sharding`".
    params = inspect.signature(lax.dot_general).parameters
    assert {"precision", "preferred_element_type", "out_sharding"} <= set(params)


def test_appendix_pow_and_integer_pow():
    # appendix_primitives: "JAX has a general `pow` primitive for non-integer
    # exponents; `x ** 2` still becomes `integer_pow`".
    assert primitive_names(lambda x: x**2, 1.5) == ["integer_pow"]
    assert primitive_names(lambda x: x**1.5, 1.5) == ["pow"]


def test_appendix_integer_pow_lowered_by_squaring():
    # appendix_primitives: "`integer_pow`, lowered by repeated squaring as here".
    text = lowered_text(lambda x: x**13, 1.5)
    assert text.count("stablehlo.multiply") == 5  # 13 = 1101b: 3 squares, 2 products


def test_appendix_max_ties_split_evenly():
    # appendix_primitives: "We give each operand half, as JAX does: then
    # `maximum(x, x)` ... has slope exactly 1"; "ours (and JAX's) splits the
    # slope evenly among the tied inputs".
    assert jax.grad(jnp.maximum, (0, 1))(2.0, 2.0) == (0.5, 0.5)
    assert float(jax.grad(lambda x: jnp.maximum(x, x))(2.0)) == 1.0


def test_appendix_reduce_max_ties_averaged():
    # appendix_primitives: "if several elements share the maximum, we average
    # their tangents, which generalizes the half-and-half rule and is again
    # JAX's choice".
    grad = jax.grad(jnp.max)(jnp.array([1.0, 3.0, 3.0, 3.0]))
    np.testing.assert_allclose(grad, [0.0, 1 / 3, 1 / 3, 1 / 3])


def test_appendix_dot_general_is_one_primitive():
    # appendix_primitives: "JAX describes every such product with one
    # primitive, `dot_general`".
    for a, b in [((3,), (3,)), ((2, 3), (3,)), ((2, 3), (3, 4))]:
        assert primitive_names(jnp.dot, jnp.ones(a), jnp.ones(b)) == ["dot_general"]


def test_appendix_abs_round_clip_conventions():
    # appendix_primitives (folded): "|x|; its derivative at 0 is 1, as JAX's";
    # "Round half to even, as NumPy and JAX; its derivative is zero";
    # "``x`` limited to [min, max], as JAX: minimum(max, maximum(min, x))".
    assert float(jax.grad(jnp.abs)(0.0)) == 1.0
    assert not jnp.signbit(jnp.abs(-0.0))  # "-0.0 becomes 0.0"
    np.testing.assert_array_equal(jnp.round(jnp.array([0.5, 1.5, 2.5])), [0, 2, 2])
    assert float(jax.grad(jnp.round)(1.3)) == 0.0
    (clip,) = jax.make_jaxpr(lambda x: jnp.clip(x, -1.0, 1.0))(0.5).eqns
    assert [e.primitive.name for e in clip.params["jaxpr"].eqns] == ["max", "min"]


# ------------------------------------------------------------------ performance


def test_performance_jnp_functions_are_jitted():
    # performance: "`jax.numpy.sin` is itself a jitted function, so an eager
    # call goes through JAX's C++ dispatch".
    assert type(jnp.sin).__name__ == "PjitFunction"


def test_performance_weak_types_and_two_cache_entries():
    # performance: "`jax.jit(lambda x, y: x * y)(np.ones(3, np.float32), 2.0)`
    # computes in `float32`"; "a Python float and a NumPy `float64` scalar are
    # two entries of JAX's cache (two traces)".
    assert jax.jit(lambda x, y: x * y)(np.ones(3, np.float32), 2.0).dtype == jnp.float32
    traces = []

    @jax.jit
    def f(x):
        traces.append(x)
        return x * 2.0

    f(0.5)
    f(np.float64(0.5))
    f(0.25)
    assert len(traces) == 2


def test_performance_vmap_of_jit_goes_through_python_batching_rule(monkeypatch):
    # performance: "In JAX the inner jitted function meets batching tracers, so
    # its C++ entry point hands the call to Python: `jit`'s Python path traces
    # the function (once, at the unbatched type) and binds the `jit` primitive,
    # whose batching rule, in Python, builds (or finds) the batched jaxpr and
    # binds it. Only then does the call reach C++ again, through a `pjit` object
    # made for that jaxpr (`_pjit_call_impl`)".
    log: list = []
    seen: list = []

    def f(x):
        seen.append((type(x).__name__, x.shape))
        return jnp.sin(x) * 2.0 + x

    registry = jax_batching.fancy_primitive_batchers
    with counting_rule(monkeypatch, registry, jax_pjit.jit_p, log, "batch"):
        g = jax.vmap(jax.jit(f))
        g(jnp.ones((4, 2)))
        g(jnp.ones((4, 2)))
    assert log == ["batch", "batch"]
    assert seen == [("DynamicJaxprTracer", (2,))]  # jit's trace, not a BatchTracer
    assert "_jax.pjit(" in inspect.getsource(jax_pjit._pjit_call_impl)


def test_performance_matmul_of_a_stack_by_a_matrix_is_one_dot_general():
    # performance: "`x @ w` with a stack of matrices `x` ... and one weight
    # matrix `w` ... Lowered as one `dot_general` that contracts `x`'s last axis
    # with `w`'s first, as JAX does".
    jaxpr = jax.make_jaxpr(lambda x, w: x @ w)(np.ones((2, 3, 4)), np.ones((4, 5)))
    (eqn,) = jaxpr.eqns
    assert eqn.primitive.name == "dot_general"
    assert eqn.params["dimension_numbers"] == (((2,), (0,)), ((), ()))


def test_performance_split_gradient_concatenates():
    # performance: "the gradient of `split`, which we build from three padded
    # slices where JAX concatenates".
    def loss(x):
        a, b, c = jnp.split(x, 3, axis=-1)
        return (a * b * c).sum()

    names = {
        e.primitive.name for e in jax.make_jaxpr(jax.grad(loss))(np.ones((2, 6))).eqns
    }
    assert "concatenate" in names and "pad" not in names


def test_performance_tracer_records_source_effects_and_weak_types():
    # performance: "JAX's tracer does the same and more per equation: it
    # records where in your Python code the equation came from, and it tracks
    # effects and weak types" (the benchmark traces jax.lax operations).
    closed = jax.make_jaxpr(lambda x: lax.mul(lax.sin(x), x))(1.0)
    eqn = closed.eqns[0]
    assert eqn.source_info.traceback is not None
    assert eqn.effects == frozenset()
    assert closed.jaxpr.invars[0].aval.weak_type  # a Python float


def test_performance_caches():
    # performance: "JAX caches traced jaxprs per function and signature ... and
    # it can keep compiled programs on disk across processes".
    traces = []

    @jax.jit
    def f(x):
        traces.append(1)
        return x + 1.0

    f(jnp.ones(2))
    f(jnp.ones(2))
    f(jnp.ones(3))
    assert len(traces) == 2
    assert "jax_compilation_cache_dir" in jax.config.values


# ------------------------------------------------------------------ more claims


def test_part1_primitives_are_called_primitives():
    # part1_interpreters: "JAX calls them **primitives**".
    assert isinstance(lax.sin_p, jax.extend.core.Primitive)
    assert lax.sin_p.name == "sin"


def test_part5_cond_dce_forwarding_and_branch_cache():
    # part5_cond: "Its dead-code elimination removes a `cond`'s inputs and
    # outputs that nothing uses; when it is traced, an output that both branches
    # return unchanged from an input is taken straight from that input instead
    # of from the `cond`; and traced branches are cached."
    traced = []

    def true_branch(x, z):
        traced.append(1)
        return jnp.sin(x), jnp.cos(x), x

    def false_branch(x, z):
        return jnp.cos(x), x * 2.0, x

    def g(x, z):
        return lax.cond(x > 0, true_branch, false_branch, x, z)

    jaxpr = jax.make_jaxpr(g)(1.0, 2.0)
    (cond,) = [e for e in jaxpr.eqns if e.primitive.name == "cond"]
    assert len(cond.outvars) == 2  # the third output is forwarded
    assert jaxpr.jaxpr.outvars[2] is jaxpr.jaxpr.invars[0]
    pruned, used_inputs = jax_pe.dce_jaxpr(jaxpr.jaxpr, [True, False, False])
    (cond,) = [e for e in pruned.eqns if e.primitive.name == "cond"]
    assert len(cond.outvars) == 1 and len(cond.invars) == 2  # index and x
    assert used_inputs == [True, False]
    jax.make_jaxpr(g)(1.0, 2.0)
    assert len(traced) == 1


def test_part8_rule_stays_a_python_function():
    # part8_custom_rules: "The rule stays a *Python function*, not a jaxpr ...
    # it runs only when a JVP interpreter uses it ... JAX does the same."
    calls = []

    @jax.custom_jvp
    def f(x):
        return jnp.sin(x)

    @f.defjvp
    def f_jvp(primals, tangents):
        calls.append(1)
        return f(primals[0]), jnp.cos(primals[0]) * tangents[0]

    (eqn,) = jax.make_jaxpr(f)(1.0).eqns
    rule = eqn.params["jvp_jaxpr_fun"]
    assert not isinstance(rule, core.Jaxpr | core.ClosedJaxpr) and calls == []
    jax.jvp(f, (1.0,), (1.0,))
    assert calls == [1]


def test_part8_rule_may_apply_custom_function_to_a_tangent():
    # part8_custom_rules (the note in the folded transpose cell): "a JVP rule
    # applies a custom function to a tangent (JAX allows that too)".
    @jax.custom_jvp
    def double(x):
        return 2.0 * x

    double.defjvp(lambda p, t: (double(p[0]), double(t[0])))
    assert float(jax.grad(lambda x: double(double(x)))(1.0)) == 4.0


def test_part8_pytree_arguments_outputs_and_residuals():
    # part8_custom_rules: "Arguments, outputs and residuals may be pytrees, as in
    # JAX"; "`custom_vjp(fun)` with `defvjp(fwd, bwd)` takes two functions".
    @jax.custom_vjp
    def f(params):
        return params["w"] * params["b"], params["b"]

    def fwd(params):
        return f(params), (params["w"], params["b"])

    def bwd(res, cts):
        w, b = res
        return ({"w": cts[0] * b, "b": cts[0] * w + cts[1]},)

    f.defvjp(fwd, bwd)
    grads = jax.grad(lambda p: sum(f(p)))({"w": 3.0, "b": 2.0})
    assert grads == {"w": 2.0, "b": 4.0}


def test_part9_collective_batching_rule_hands_on_other_names():
    # part9_named_axes: "a collective's batching rule reduces if the name is its
    # own and otherwise hands the collective on".
    def inner(x):
        return lax.psum(x, "i")  # names the outer vmap's axis

    out = jax.vmap(jax.vmap(inner, axis_name="j"), axis_name="i")(ROWS)
    np.testing.assert_allclose(out, np.broadcast_to(ROWS.sum(0), ROWS.shape))


def python_functions_called(f, *args) -> list[str]:
    """The Python functions that run while ``f(*args)`` is called (the result
    is waited for afterwards, outside the profile)."""
    called = []

    def profile(frame, event, arg):
        if event == "call":
            called.append(frame.f_code.co_name)

    sys.setprofile(profile)
    try:
        out = f(*args)
    finally:
        sys.setprofile(None)
    out.block_until_ready()
    return called


def test_performance_cached_call_runs_no_python():
    # performance: "on a hit no Python runs at all, and host arguments are
    # copied to the device in C++ too"; part3_jit: "a repeated call with a
    # known signature checks its arguments and launches the executable without
    # running any Python".
    f = jax.jit(lambda x: jnp.sin(x) * 2.0 + x)
    host = np.ones(8)
    f(host).block_until_ready()
    assert python_functions_called(f, host) == []


def test_performance_array_shape_and_dtype_are_python_properties():
    # performance: the fast path reads "the device `Array`'s shape and dtype,
    # which JAX's array class provides as Python properties" (the demo lists
    # ArrayImpl.shape and ArrayImpl.dtype among the Python calls).
    from jax._src.array import ArrayImpl

    for name in ("shape", "dtype"):
        attribute = inspect.getattr_static(ArrayImpl, name)
        assert isinstance(attribute, property)
        assert inspect.isfunction(attribute.fget)
    x = jax.device_put(np.ones(4))
    assert "shape" in python_functions_called(lambda: (x.shape, x)[1])
    assert "dtype" in python_functions_called(lambda: (x.dtype, x)[1])


def test_performance_batched_device_put_asks_the_sharding_in_python():
    # performance: "the copier of the NumPy argument `b` calls jaxlib, which
    # asks one method of JAX's sharding class, in Python, for its description"
    # (SingleDeviceSharding._to_xla_hlo_sharding in the demo's list).
    from jax._src import sharding_impls
    from jaxlib import _jax

    device = jax.devices()[0]
    sharding = sharding_impls.SingleDeviceSharding(device)
    aval = core.ShapedArray((4,), np.float64)
    semantics = _jax.HostBufferSemantics.IMMUTABLE_ONLY_DURING_CALL

    copy = functools.partial(  # a C function: the profile sees jaxlib's calls only
        _jax.batched_device_put,
        *(aval, sharding, [np.ones(4)], [device], True, False, semantics, True),
    )
    copy()
    called = python_functions_called(copy)
    assert called == ["_to_xla_hlo_sharding"]
    assert "_to_xla_hlo_sharding" in vars(sharding_impls.SingleDeviceSharding)


def test_performance_skip_checks_skips_a_python_check():
    # performance, result_handlers: "_skip_checks skips JAX's Python check that
    # the buffer's device, shape and dtype match the sharding and aval
    # (ArrayImpl._check_and_rearrange)".
    from jax._src import sharding_impls
    from jax._src.array import ArrayImpl
    from jaxlib import _jax

    sharding = sharding_impls.SingleDeviceSharding(jax.devices()[0])
    aval = core.ShapedArray((4,), np.float64)
    buffer = jax.device_put(np.ones(4))
    assert inspect.isfunction(ArrayImpl._check_and_rearrange)
    for skip in (False, True):
        handler = _jax.array_result_handler(
            aval, sharding, committed=True, _skip_checks=skip
        )
        handler([buffer])  # a first call may fill jaxlib's caches
        called = python_functions_called(handler, [buffer])
        assert ("_check_and_rearrange" in called) is not skip, (skip, called)


def test_performance_signature_includes_x64_switch():
    # performance: "Its signature covers more than ours (weak types, shardings,
    # static arguments, and configuration such as the x64 switch)".
    traces = []

    @functools.partial(jax.jit, static_argnums=1)
    def f(x, n):
        traces.append(n)
        return x * n

    f(1.0, 2)
    f(1.0, 3)  # a new static argument
    with jax.enable_x64(False):
        f(1.0, 2)  # the x64 switch
    f(1, 2)
    assert len(traces) == 4


def test_glossary_xla_ships_in_jaxlib():
    # glossary: "XLA ... The optimizing compiler behind JAX, shipped inside
    # `jaxlib`".
    import jaxlib.xla_client

    assert jaxlib.xla_client.__name__ == "jaxlib.xla_client"
    assert jax.extend.backend.get_backend("cpu").platform == "cpu"


def test_part3_initial_and_final_style_are_jax_terms():
    # part3_jit: "JAX calls this *final style*" and `jit` "works in *initial
    # style*": the names JAX's source uses for the two ways of tracing.
    assert callable(jax_custom._initial_style_jaxpr)
    assert "processed in final style" in inspect.getsource(core)


def test_part3_jaxlib_holds_mlir_bindings_and_xla():
    # part3_jit: "the MLIR bindings (the Python API for building StableHLO
    # programs) come with `jaxlib`, the compiled half of JAX that also contains
    # XLA".
    from jaxlib.mlir.dialects import stablehlo

    assert callable(stablehlo.WhileOp)
    assert jax.extend.backend.get_backend("cpu").platform == "cpu"


def test_part9_host_platform_device_count_flag():
    # part9_named_axes: "With `XLA_FLAGS=--xla_force_host_platform_device_count=8`
    # set before JAX starts, XLA's CPU client offers eight devices"
    # (tests/conftest.py sets the flag before importing jax).
    import os

    assert "--xla_force_host_platform_device_count=8" in os.environ["XLA_FLAGS"]
    assert len(jax.devices("cpu")) == 8


def test_appendix_broadcast_in_dim_stretches_size1_axes():
    # appendix_primitives: "JAX's `broadcast_in_dim` can stretch axes of size 1
    # directly".
    out = lax.broadcast_in_dim(jnp.arange(3.0).reshape(1, 3), (2, 3), (0, 1))
    np.testing.assert_array_equal(out, np.broadcast_to(np.arange(3.0), (2, 3)))


def test_appendix_a_few_hundred_primitives():
    # appendix_primitives: "`jax.numpy` implements most of NumPy's API on top of
    # a few hundred primitives".
    import jax.scipy  # noqa: F401  (loads the rest of JAX's primitives)

    names = {
        value.name
        for name, module in list(sys.modules.items())
        if name.startswith("jax._src")
        for value in list(vars(module).values())
        if isinstance(value, core.Primitive)
    }
    assert 100 <= len(names) < 1000


def test_performance_eager_operations_run_through_xla():
    # performance: "JAX has one execution path, XLA, for eager operations too":
    # a primitive's eager evaluation compiles and runs it (apply_primitive).
    from jax._src import dispatch

    assert lax.sin_p.impl.func is dispatch.apply_primitive
    assert isinstance(jnp.sin(jnp.ones(2)), jax.Array)


def test_appendix_jax_namespaces_and_array_methods():
    # appendix_primitives: what ports from JAX missed here: "indexing and
    # slicing of traced arrays (`x[:, 0]`, `x.at[...]`), `jax.lax` and
    # `jax.tree_util`/`jax.tree` as namespaces ..., `jax.random`, `jax.nn`,
    # `sqrt` ..., `jnp.linalg`, and the methods of arrays (`x.sum()`, `x.T`,
    # `x.reshape`)": each of them exists in JAX.
    import jax.random

    for namespace in (jax.lax, jax.tree_util, jax.tree, jax.random, jax.nn):
        assert inspect.ismodule(namespace) or hasattr(namespace, "map")
    assert callable(jnp.sqrt) and callable(jnp.linalg.norm)
    x = jnp.arange(6.0).reshape(2, 3)
    assert float(x.sum()) == 15.0 and x.T.shape == (3, 2)
    assert (
        float(jax.jit(lambda x: x[:, 0].sum() + x.at[0, 0].set(9.0)[0, 0])(x)) == 12.0
    )


def test_performance_jit_of_vmap_is_one_cpp_dispatch():
    # performance: "In JAX too, `jit` outermost, `jax.jit(jax.vmap(f))`, is one
    # C++ dispatch per call".
    f = jax.jit(jax.vmap(lambda x: jnp.sin(x) * 2.0 + x))
    x = jnp.ones((4, 2))
    f(x).block_until_ready()
    assert python_functions_called(f, x) == []


def test_part9_collectives_take_a_tuple_of_names():
    # part9_named_axes: "`psum`, `pmax` and `pmean` also take a tuple of names"
    # (as in JAX).
    def inner(x):
        return lax.pmax(x, ("i", "j")) + lax.pmean(x, ("i", "j"))

    out = jax.vmap(jax.vmap(inner, axis_name="j"), axis_name="i")(ROWS)
    np.testing.assert_allclose(out, np.full(ROWS.shape, ROWS.max() + ROWS.mean()))


def test_part7_zero_tangents_are_not_carried():
    # part7_scan: "Its tangents can be symbolic zeros, so no zero tangent is
    # ever carried": a carry that does not depend on w has no tangent carry in
    # the linear scan.
    def f(w):
        def step(carry, x):
            h, k = carry
            return (jnp.sin(h * w + x), k + 1.0), None

        return lax.scan(step, (0.5, 0.0), jnp.ones(3))[0]

    _, f_lin = jax.linearize(f, 0.8)
    (eqn,) = [e for e in jax.make_jaxpr(f_lin)(1.0).eqns if e.primitive.name == "scan"]
    assert eqn.params["num_carry"] == 1


def test_part9_all_gather_carries_axis_size():
    # part9_named_axes: "`all_gather` carries the axis size as a parameter,
    # because its output type depends on it" (so does JAX's).
    f = jax.pmap(lambda r: lax.all_gather(r, "i"), "i")
    (eqn,) = [
        e for e in all_eqns(jax.make_jaxpr(f)(ROWS)) if e.primitive.name == "all_gather"
    ]
    assert eqn.params["axis_size"] == 4 and eqn.outvars[0].aval.shape == (4, 3)


# ------------------------------------------------------------------ dtypes


def test_part1_lax_add_refuses_a_float_with_an_int_array():
    # part1_interpreters: "Our wrappers refuse to mix a float number with an
    # integer array, as `lax.add` refuses".
    with pytest.raises(TypeError, match="same dtypes"):
        lax.add(jnp.ones(3, jnp.int32), 1.5)


def test_appendix_lax_add_refuses_mixed_dtypes():
    # appendix_primitives: "`add` of an `int32` and a `float32` array is an
    # error, as `lax.add` is in JAX".
    with pytest.raises(TypeError, match="same dtypes"):
        lax.add(jnp.ones(3, jnp.int32), jnp.ones(3, jnp.float32))


@pytest.mark.parametrize(
    "dtype, inexact",
    [("bool", "float32"), ("int8", "float32"), ("int32", "float32"),
     ("uint32", "float32"), ("int64", "float64"), ("uint64", "float64"),
     ("float16", "float16"), ("float32", "float32"), ("float64", "float64")],
)  # fmt: skip
def test_appendix_float_functions_make_integers_floats_of_their_width(dtype, inexact):
    # appendix_primitives: "64-bit integers become `float64`, narrower ones
    # `float32`" (sin, true division, mean), with 64-bit types on.
    x = jnp.ones(3, dtype)
    for out in (jnp.sin(x), jnp.mean(x), x / x):
        assert out.dtype == np.dtype(inexact)


def test_appendix_weak_argument_of_a_jitted_function():
    # appendix_primitives: "a jitted function's argument `2.0` is a weak
    # `float64`, so its product with a `float32` array is `float32`".
    out = jax.jit(lambda x, y: x * y)(np.ones(3, np.float32), 2.0)
    assert out.dtype == np.float32


def test_appendix_python_number_takes_the_arrays_dtype():
    # appendix_primitives: "a Python number takes the dtype of the array next
    # to it (`x * 2` keeps `x`'s dtype)", and only when nothing else decides
    # does it become a 64-bit type.
    for dtype in (jnp.int32, jnp.float32, jnp.uint8):
        assert (jnp.ones(2, dtype) * 2).dtype == dtype
    assert (jnp.ones(2, jnp.int32) * 2.0).dtype == jnp.float64
    assert (jnp.ones(2, jnp.bool_) + 1).dtype == jnp.int64


def test_jax_compiles_pmap_inside_jit_across_devices():
    """Part 9, "Where real JAX differs": jit(pmap(f)) is one program with a
    shard_map inside the jit, and its rows stay spread over the devices."""
    f = jax.pmap(lambda x: jax.lax.psum(x, "i"), axis_name="i")
    rows = np.arange(8.0).reshape(4, 2)
    text = str(jax.make_jaxpr(jax.jit(f))(rows))
    assert "shard_map" in text and "psum" in text
    assert len(jax.jit(f)(rows).devices()) == 4


# ------------------------------------------------------------------ indexing


def _jaxpr_text(f, *args) -> str:
    return str(jax.make_jaxpr(f)(*args))


def test_indexing_dynamic_slice_clamps_and_wraps_negative_starts():
    # indexing: "XLA keeps both inside the array: a start that would make the
    # block stick out is moved back (clamped)"; "as in JAX's lax, -1 is the
    # last position" (allow_negative_indices=True by default).
    x = jnp.arange(6.0)
    np.testing.assert_array_equal(lax.dynamic_slice(x, (5,), (3,)), [3.0, 4.0, 5.0])
    np.testing.assert_array_equal(lax.dynamic_slice(x, (-2,), (2,)), [4.0, 5.0])
    out = lax.dynamic_update_slice(x, jnp.zeros(2), (9,))
    np.testing.assert_array_equal(out, [0.0, 1.0, 2.0, 3.0, 0.0, 0.0])
    for fn in (lax.dynamic_slice, lax.dynamic_update_slice):
        param = inspect.signature(fn).parameters["allow_negative_indices"]
        assert param.default is True


def test_indexing_reads_clamp_writes_drop_take_fills():
    # indexing: an index out of range "is clamped for reading, as JAX's
    # indexing does"; scatters drop updates out of range, "as XLA's scatter
    # does"; `jnp.take` and `jnp.take_along_axis` "fill with NaN by default";
    # negative indices count from the end.
    x = jnp.arange(4.0)
    idx = jnp.array([9, -1, -9])
    np.testing.assert_array_equal(x[idx], [3.0, 3.0, 0.0])
    np.testing.assert_array_equal(x[7], 3.0)
    np.testing.assert_array_equal(x.at[idx].set(-1.0), [0.0, 1.0, 2.0, -1.0])
    np.testing.assert_array_equal(x.at[idx].add(1.0), [0.0, 1.0, 2.0, 4.0])
    np.testing.assert_array_equal(jnp.take(x, idx), [np.nan, 3.0, np.nan])
    out = jnp.take_along_axis(x, idx, axis=0)
    np.testing.assert_array_equal(out, [np.nan, 3.0, np.nan])
    assert jnp.take(jnp.arange(4), jnp.array([9]))[0] == np.iinfo(np.int64).min
    np.testing.assert_array_equal(jnp.take(x, idx, mode="clip"), [3.0, 0.0, 0.0])


def test_indexing_arrays_are_immutable_and_at_writes():
    # indexing: "JAX's arrays are immutable: `x.at[idx].set(v)` returns a new
    # array"; repeated positions: add accumulates, set keeps one update.
    x = jnp.zeros(3)
    with pytest.raises(TypeError, match="immutable"):
        x[0] = 1.0
    np.testing.assert_array_equal(x.at[jnp.array([1, 1])].add(2.0), [0.0, 4.0, 0.0])
    assert float(x.at[jnp.array([1, 1])].set(jnp.array([5.0, 6.0]))[1]) in (5.0, 6.0)
    np.testing.assert_array_equal(x, [0.0, 0.0, 0.0])


def test_indexing_jax_primitives_for_indexing():
    # indexing, "Where real JAX differs": x[1:3] is `slice`, a traced row
    # index a `dynamic_slice` and a `squeeze`, an integer array a `gather`
    # with PROMISE_IN_BOUNDS after wrapping negative indices (`select_n`), and
    # the indices converted to int32; x[::-1] is `rev`, x[..., None]
    # `broadcast_in_dim`; x.at[i].set a `scatter` with FILL_OR_DROP;
    # multiply/min/max are `scatter-mul`/`scatter-min`/`scatter-max`; argmax
    # and argmin are primitives; pad takes the padding value as an operand.
    x = jnp.ones((3, 4))
    assert "slice[" in _jaxpr_text(lambda x: x[1:3], x)
    text = _jaxpr_text(lambda x, i: x[i], x, 1)
    assert "dynamic_slice" in text and "squeeze" in text
    text = _jaxpr_text(lambda x, i: x[i], x, jnp.array([0, 2]))
    assert "gather[" in text and "PROMISE_IN_BOUNDS" in text
    assert "select_n" in text and "new_dtype=int32" in text
    assert "rev[" in _jaxpr_text(lambda x: x[::-1], x)
    assert "broadcast_in_dim" in _jaxpr_text(lambda x: x[..., None], x)
    text = _jaxpr_text(lambda x: x.at[jnp.array([0, 1])].set(2.0), x)
    assert "scatter[" in text and "FILL_OR_DROP" in text
    assert "scatter-mul" in _jaxpr_text(lambda x: x.at[0].multiply(2.0), x)
    assert "scatter-min" in _jaxpr_text(lambda x: x.at[0].min(2.0), x)
    assert "scatter-max" in _jaxpr_text(lambda x: x.at[0].max(2.0), x)
    assert "argmax[" in _jaxpr_text(jnp.argmax, x)
    assert "argmin[" in _jaxpr_text(jnp.argmin, x)
    assert "pad[" in _jaxpr_text(lambda x: lax.pad(x, 0.0, [(1, 1, 0)] * 2), x)
    assert list(inspect.signature(lax.pad).parameters)[:2] == [
        "operand",
        "padding_value",
    ]


def test_indexing_gradient_of_a_lookup_is_scatter_add():
    # indexing: the gradient of an embedding lookup is a `scatter-add` (the
    # jaxpr printed in "Where real JAX differs"), whose params include
    # ScatterDimensionNumbers and an update_jaxpr.
    table, tokens = jnp.ones((5, 3)), jnp.array([1, 4, 1])
    text = _jaxpr_text(jax.grad(lambda t: jnp.sum(t[tokens] ** 2)), table)
    assert "scatter-add[" in text and "ScatterDimensionNumbers" in text
    assert "update_jaxpr" in text and "dot_general" not in text


def test_indexing_gather_dimension_numbers_and_modes():
    # indexing: lax.gather takes one stacked index array, a
    # GatherDimensionNumbers (offset_dims, collapsed_slice_dims,
    # start_index_map, operand_batching_dims, start_indices_batching_dims)
    # and slice_sizes; gathers and scatters take a GatherScatterMode (CLIP,
    # FILL_OR_DROP, PROMISE_IN_BOUNDS, ONE_HOT); unique_indices and
    # indices_are_sorted are hints.
    params = list(inspect.signature(lax.gather).parameters)
    assert params[:4] == [
        "operand",
        "start_indices",
        "dimension_numbers",
        "slice_sizes",
    ]
    assert {"unique_indices", "indices_are_sorted", "mode"} <= set(params)
    assert lax.GatherDimensionNumbers._fields == (
        "offset_dims",
        "collapsed_slice_dims",
        "start_index_map",
        "operand_batching_dims",
        "start_indices_batching_dims",
    )
    assert set(lax.GatherScatterMode.__members__) == {
        "CLIP",
        "FILL_OR_DROP",
        "PROMISE_IN_BOUNDS",
        "ONE_HOT",
    }
    assert {"unique_indices", "indices_are_sorted", "mode"} <= set(
        inspect.signature(lax.scatter_add).parameters
    )


def test_indexing_batched_dynamic_slice_is_a_sorted_unique_gather():
    # indexing: "JAX's `dynamic_slice`, batched over both the array and its
    # starts, becomes a `gather` with `indices_are_sorted=True` and
    # `unique_indices=True`; batched over the starts alone, both are False".
    f = jax.vmap(lambda x, i: lax.dynamic_slice(x, (i,), (2,)))
    text = _jaxpr_text(f, jnp.ones((4, 5)), jnp.arange(4))
    assert "gather[" in text
    assert "indices_are_sorted=True" in text and "unique_indices=True" in text
    g = jax.vmap(lambda x, i: lax.dynamic_slice(x, (i,), (2,)), in_axes=(None, 0))
    text = _jaxpr_text(g, jnp.ones(5), jnp.arange(4))
    assert "gather[" in text
    assert "indices_are_sorted=False" in text and "unique_indices=False" in text


def test_indexing_out_of_range_gradient_is_dropped_in_jax():
    # indexing, "Where real JAX differs": JAX's x[idx] promises in-range
    # indices; out of range its forward pass clamps, and its gradient drops
    # the position (a scatter-add that drops), where ours adds at the clamped
    # position.
    x = jnp.arange(3.0)
    assert float(x[jnp.array([5])][0]) == 2.0
    g = jax.grad(lambda x: jnp.sum(x[jnp.array([5, 1])]))(x)
    np.testing.assert_array_equal(g, [0.0, 1.0, 0.0])


def test_indexing_scatter_jvp_scatters_ids():
    # indexing: "JAX's `jvp` of `scatter` makes primal and tangent agree on
    # it by scattering ids" (_scatter_jvp in jax/_src/lax/slicing.py).
    from jax._src.lax import slicing

    source = inspect.getsource(slicing._scatter_jvp)
    assert "update_ids" in source and "scattered_ids" in source


def test_indexing_argmax_takes_the_first_nan_and_traced_masks_fail():
    # indexing: argmax finds "the first position of the maximum (or of a NaN,
    # as JAX does)"; a traced boolean mask raises NonConcreteBooleanIndexError,
    # an IndexError.
    assert int(jnp.argmax(jnp.array([1.0, np.nan, 3.0, np.nan]))) == 1
    assert int(jnp.argmax(jnp.array([1.0, 3.0, 3.0]))) == 1
    assert issubclass(jax.errors.NonConcreteBooleanIndexError, IndexError)
    with pytest.raises(jax.errors.NonConcreteBooleanIndexError):
        jax.jit(lambda x: x[x > 0])(jnp.ones(3))


def test_indexing_at_modes():
    # indexing, "Modes": None or "promise_in_bounds": reads clamp, writes
    # drop; "clip": positions clamped for reads and writes; "fill" or "drop":
    # writes drop and get returns fill_value, NaN by default; the gradient of a
    # read out of range is dropped by default, and "clip" gives it to the
    # nearest element.
    x = jnp.arange(4.0)
    far = jnp.array([9, -1, -9, 2])
    for mode in [None, "promise_in_bounds"]:
        np.testing.assert_array_equal(x.at[far].get(mode=mode), [3.0, 3.0, 0.0, 2.0])
        np.testing.assert_array_equal(x.at[far].add(10.0, mode=mode), [0, 1, 12, 13])
    np.testing.assert_array_equal(x.at[far].get(mode="clip"), [3.0, 3.0, 0.0, 2.0])
    np.testing.assert_array_equal(x.at[far].add(10.0, mode="clip"), [10, 1, 12, 23])
    for mode in ["fill", "drop"]:
        out = x.at[far].get(mode=mode)
        np.testing.assert_array_equal(out, [np.nan, 3.0, np.nan, 2.0])
        np.testing.assert_array_equal(x.at[far].set(-1.0, mode=mode), [0, 1, -1, -1])
    assert float(x.at[9].get(mode="fill", fill_value=-5.0)) == -5.0
    w = jnp.array([10.0, 1.0])

    def read(mode):
        return lambda x: jnp.sum(x.at[jnp.array([5, 1])].get(mode=mode) * w)

    np.testing.assert_array_equal(jax.grad(read(None))(jnp.zeros(3)), [0, 1, 0])
    np.testing.assert_array_equal(jax.grad(read("clip"))(jnp.zeros(3)), [0, 1, 10])
    # take_along_axis takes the same modes (take: fill and clip, and "wrap")
    idx = jnp.array([9, -1, 2])
    for mode in ["fill", "drop", "clip", "promise_in_bounds"]:
        jnp.take_along_axis(x, idx, axis=0, mode=mode)
    np.testing.assert_array_equal(jnp.take(x, idx, mode="wrap"), [1.0, 3.0, 2.0])
    assert "wrap_negative_indices" in inspect.signature(type(x.at[0]).set).parameters


def test_indexing_dynamic_slice_wraps_before_binding():
    # indexing: "JAX's `lax.dynamic_slice` wraps before binding, and its
    # transpose binds the primitive directly instead of calling the function"
    # (_dynamic_slice_transpose_fancy in jax/_src/lax/slicing.py).
    from jax._src.lax import slicing

    text = _jaxpr_text(lambda x, i: lax.dynamic_slice(x, (i,), (2,)), jnp.ones(6), 1)
    assert "select_n" in text and "dynamic_slice[" in text
    source = inspect.getsource(slicing._dynamic_slice_transpose_fancy)
    assert "dynamic_update_slice_p.bind" in source


def test_indexing_windows_anywhere_and_positions_in_the_program():
    # indexing, "Where real JAX differs": x[:, i] is one gather with
    # offset_dims=(0,), no transpose; x[1:3, i] reads a window, x[::2, i]
    # builds its positions with iota (no constant).
    x = jnp.ones((4, 5))
    text = _jaxpr_text(lambda x, i: x[:, i], x, jnp.array([0, 2]))
    assert "offset_dims=(0,)" in text and "transpose" not in text
    jaxpr = jax.make_jaxpr(lambda x, i: x[1:3, i])(x, jnp.array([0, 1]))
    assert not jaxpr.consts and "slice_sizes=(2, 1)" in str(jaxpr)
    jaxpr = jax.make_jaxpr(lambda x, i: x[::2, i])(x, jnp.array([0, 1]))
    assert not jaxpr.consts and "iota" in str(jaxpr)


def test_indexing_scatter_mul_min_max_derivatives():
    # indexing: "JAX's `scatter-mul` has no derivative with respect to the
    # updates unless `unique_indices=True`"; scatter-min/max: "their
    # derivative follows the updates that won and splits the tangent evenly
    # between ties, as JAX's does".
    x = jnp.array([1.0, 2.0, 3.0])
    two = jnp.array([0, 0])
    with pytest.raises(NotImplementedError, match="unique_indices"):
        jax.grad(lambda v: x.at[two].multiply(v).sum())(jnp.array([2.0, 3.0]))
    one_each = jnp.array([0, 1])
    g = jax.grad(lambda v: x.at[one_each].multiply(v, unique_indices=True).sum())
    np.testing.assert_array_equal(g(jnp.array([2.0, 3.0])), [1.0, 2.0])
    g = jax.grad(lambda v: x.at[two].max(v).sum())(jnp.array([5.0, 5.0]))
    np.testing.assert_array_equal(g, [0.5, 0.5])
    gx, gv = jax.grad(lambda x, v: x.at[two].min(v).sum(), (0, 1))(
        x, jnp.array([1.0, 4.0])
    )  # a tie of x[0] with the first update
    np.testing.assert_array_equal(gx, [0.5, 1.0, 1.0])
    np.testing.assert_array_equal(gv, [0.5, 0.0])


def test_indexing_index_dtype_split_booleans_and_index_errors():
    # indexing: JAX converts indices to "int32, or to int64 if an axis is
    # longer than 2**31 - 1 (int_dtype_for_shape in jax/_src/lax/utils.py, called from
    # jax/_src/numpy/indexing.py)"; JAX has a `split` primitive ("one equation
    # with every piece's size"); x[True] / x[False] add an axis of size 1 / 0;
    # "Too many indices" is an IndexError with JAX's wording.
    from jax._src.lax import utils as lax_utils
    from jax._src.numpy import indexing

    assert lax_utils.int_dtype_for_shape((5, 3), signed=True) == np.int32
    assert lax_utils.int_dtype_for_shape((2**31,), signed=True) == np.int64
    assert "int_dtype_for_shape" in inspect.getsource(indexing)
    text = _jaxpr_text(lambda t: jnp.split(t, 3), jnp.ones(6))
    assert text.count("split[") == 1 and "sizes=" in text
    x = jnp.ones((3, 4))
    assert x[True].shape == (1, 3, 4) and x[False].shape == (0, 3, 4)
    assert x[0, True].shape == (1, 4) and x[jnp.array([0, 2]), True].shape == (2, 4)
    with pytest.raises(
        IndexError, match="Too many indices: array is 2-dimensional, but 3 were indexed"
    ):
        x[0, 1, 2]
    # "an index of the wrong type is a TypeError, a step of 0 a ValueError,
    # ... a mask of the wrong shape an IndexError"
    with pytest.raises(TypeError, match="Indexer must have integer or boolean type"):
        x[1.0]
    with pytest.raises(ValueError, match="slice step cannot be zero"):
        x[::0]
    with pytest.raises(IndexError, match="boolean index did not match shape"):
        x[jnp.array([True, False])]


# ------------------------------------------------- analysis (book/analysis.md)


def _xla_costs(f, *args):
    """XLA's cost analysis of JAX's program: after and before optimization."""
    lowered = jax.jit(f).lower(*args)
    return lowered.compile().cost_analysis(), lowered.cost_analysis()


def test_indexing_at_writes_fill_or_drop_and_promise_in_bounds_gradient():
    # indexing, "Modes" and reference notes: "JAX reads with its mode
    # PROMISE_IN_BOUNDS and writes with FILL_OR_DROP"; "Asked for explicitly,
    # "promise_in_bounds" makes JAX's transpose of a write read the cotangent
    # with clamping, so a dropped update gets its clamped neighbour's
    # cotangent"; the lookup's gradient shows PROMISE_IN_BOUNDS because it is
    # the transpose of t[i]'s gather; JAX's batched dynamic_slice is a CLIP
    # gather of a whole block.
    xs, far, w = jnp.arange(4.0), jnp.array([9, -1, -9, 2]), jnp.arange(1.0, 5.0)
    assert "FILL_OR_DROP" in _jaxpr_text(lambda x: x.at[far].add(1.0), xs)
    assert "PROMISE_IN_BOUNDS" in _jaxpr_text(lambda x: x[far], xs)
    text = _jaxpr_text(jax.grad(lambda t: jnp.sum(t[far] ** 2)), xs)
    assert "scatter-add" in text and "PROMISE_IN_BOUNDS" in text

    def grad_of_updates(mode):
        f = lambda v: jnp.sum(xs.at[far].add(v, mode=mode) * w)  # noqa: E731
        return np.asarray(jax.grad(f)(jnp.ones(4)))

    for mode in [None, "fill", "drop"]:
        np.testing.assert_array_equal(grad_of_updates(mode), [0, 4, 0, 3])
    np.testing.assert_array_equal(grad_of_updates("promise_in_bounds"), [4, 4, 1, 3])
    batched = _jaxpr_text(
        jax.vmap(lambda x, s: jax.lax.dynamic_slice(x, (s,), (3,))),
        jnp.ones((2, 6)),
        jnp.array([5, 0]),
    )
    assert "mode=GatherScatterMode.CLIP" in batched and "slice_sizes=(1, 3)" in batched


def test_indexing_jax_builds_write_positions_in_the_program():
    # indexing, the NumPy interface: "JAX computes strided or reversed
    # positions in the program with `iota`, reads `x[::-1]` with `rev`, and
    # writes a unit-step slice next to an integer array as a window of its
    # scatter".
    x, i = jnp.ones((6, 4)), jnp.array([0, 2])
    assert "iota" in _jaxpr_text(lambda x: x.at[::2, i].set(0.0), x)
    assert "iota" in _jaxpr_text(lambda x: x.at[::-1, i].set(0.0), x)
    assert "rev[" in _jaxpr_text(lambda x: x[::-1], x)
    window = _jaxpr_text(lambda x: x.at[1:3, i].set(0.0), x)
    assert "iota" not in window and "update_window_dims=(0,)" in window


def test_analysis_compiled_cost_analysis_keys():
    # analysis: "`jax.jit(f).lower(*args).compile().cost_analysis()` returns a
    # dict with the same three keys", "with more keys than ours (such as
    # `utilization0{}` and `bytes accessed0{}`)", and "XLA leaves a key out
    # when its count is zero (`transcendentals` for a product)";
    # `jax.stages.Compiled.cost_analysis` and `Lowered.cost_analysis()` exist.
    compiled, lowered = _xla_costs(lambda a, b: a @ b, np.ones((3, 4)), np.ones((4, 5)))
    assert {"flops", "bytes accessed", "utilization0{}", "bytes accessed0{}"} <= set(
        compiled
    )
    assert "transcendentals" not in compiled and compiled["flops"] == 2 * 3 * 4 * 5
    assert "transcendentals" in _xla_costs(jnp.sin, np.ones(3))[0]
    assert callable(jax.stages.Compiled.cost_analysis)
    assert callable(jax.stages.Lowered.cost_analysis) and lowered["flops"] == 120


def test_analysis_xla_counts_a_loop_body_once():
    # analysis: "XLA counts a loop's body once, whatever its trip count": the
    # same counts for 10 and 1000 trips, the body's 3 multiplications and 3
    # sines plus the counter's increment and comparison.
    def loop(trips):
        return lambda x: lax.fori_loop(0, trips, lambda i, c: jnp.sin(c) * 2.0, x)

    counts = [_xla_costs(loop(n), np.ones(3))[0] for n in (10, 1000)]
    assert counts[0]["flops"] == counts[1]["flops"] == 3 + 2
    assert counts[0]["transcendentals"] == counts[1]["transcendentals"] == 3


def test_analysis_xla_cond_takes_the_larger_branch_key_by_key():
    # analysis: "for a conditional it takes each key's maximum over the
    # branches"; "XLA's `cond` count has one operation more than ours: JAX's
    # `cond` turns the boolean predicate into an integer branch index (a
    # `convert_element_type`)".
    def pick(p, x):
        return lax.cond(p, jnp.sin, lambda x: x * x, x)

    compiled, _ = _xla_costs(pick, True, np.ones(3))
    assert compiled["transcendentals"] == 3 and compiled["flops"] == 3 + 1
    jaxpr = jax.make_jaxpr(pick)(True, np.ones(3))
    assert jaxpr.eqns[0].primitive.name == "convert_element_type"
    assert jaxpr.eqns[0].params["new_dtype"] == np.int32


def test_analysis_xla_optimizer_rewrites():
    # analysis: softmax's division became 6 reciprocals and 42 multiplications
    # (6 more); x**3 and x**-2 share x * x (42 fewer); a dot of two vectors of
    # 100 became a multiply and a two-stage sum over windows of 32 (227).
    x = np.ones((6, 7))

    def softmax(x):
        e = jnp.exp(x - x.max(axis=1, keepdims=True))
        return e / e.sum(axis=1, keepdims=True)

    after, before = _xla_costs(softmax, x)
    assert (after["flops"], before["flops"]) == (162, 156)
    hlo = jax.jit(softmax).lower(x).compile().as_text()
    assert re.search(r"f64\[6\]\{0\} divide", hlo)
    after, before = _xla_costs(lambda x: x**3 + x**-2 + jnp.log(x), x)
    assert (after["flops"], before["flops"]) == (210, 252)
    v = np.ones(100)
    after, before = _xla_costs(lambda u: u @ u, v)
    assert (after["flops"], before["flops"]) == (227, 200)
    hlo = jax.jit(lambda u: u @ u).lower(v).compile().as_text()
    assert "reduce-window" in hlo and "size=32" in hlo


def test_analysis_debug_print_effects_and_lowering():
    # analysis: "`jax.make_jaxpr` of a function calling `jax.debug.print`
    # shows a `debug_print` equation, and the jaxpr's `effects` contain a
    # `DebugEffect`; with `ordered=True`, an `OrderedDebugEffect`, which makes
    # the lowering thread a token through the program"; JAX "emits the same
    # `xla_ffi_python_cpu_callback` custom call on CPU" through
    # `jax._src.callback.emit_python_callback`.
    from jax._src import callback

    def show(x, ordered=False):
        jax.debug.print("{}", x, ordered=ordered)
        return x

    jaxpr = jax.make_jaxpr(show)(1.0)
    assert [e.primitive.name for e in jaxpr.eqns] == ["debug_print"]
    assert [type(e).__name__ for e in jaxpr.effects] == ["DebugEffect"]
    ordered = jax.make_jaxpr(functools.partial(show, ordered=True))(1.0)
    assert [type(e).__name__ for e in ordered.effects] == ["OrderedDebugEffect"]
    text = jax.jit(show).lower(1.0).as_text()
    assert "custom_call @xla_ffi_python_cpu_callback" in text
    assert "has_side_effect = true" in text
    text = jax.jit(functools.partial(show, ordered=True)).lower(1.0).as_text()
    assert "!stablehlo.token" in text
    assert callable(callback.emit_python_callback)


def test_analysis_debug_print_under_vmap_and_grad(capsys):
    # analysis: "Under `vmap`, JAX also prints one line per example";
    # "Under `grad`, both print the primal value once".
    def show(x):
        jax.debug.print("x = {}", x)
        return x * x

    capsys.readouterr()
    jax.vmap(show)(np.arange(3.0))
    jax.grad(show)(2.0)
    jax.effects_barrier()
    assert capsys.readouterr().out.splitlines() == [
        "x = 0.0",
        "x = 1.0",
        "x = 2.0",
        "x = 2.0",
    ]


def test_analysis_debug_print_format_errors():
    # analysis: JAX refuses a format that does not fit its arguments "with
    # IndexError, KeyError or ValueError", while tracing too.
    with pytest.raises(IndexError):
        jax.debug.print("{} and {}", 1.0)
    with pytest.raises(KeyError):
        jax.jit(lambda x: jax.debug.print("{y}", x))(1.0)
    with pytest.raises(ValueError, match="Unused positional arguments"):
        jax.debug.print("{}", 1.0, 2.0)


def test_analysis_debug_print_transpose_drops_it():
    # analysis: "JAX also registers a transpose rule for `debug_print` that
    # drops it" (no cotangents for its inputs; jax/_src/debugging.py).
    from jax._src import debugging

    rule = jax_ad.primitive_transposes[debugging.debug_print_p]
    assert rule([], 1.0, 2.0, fmt="{} {}") == [None, None]


def test_analysis_python_print_under_jit_shows_a_tracer_once(capsys):
    # analysis: "Put `print(x)` in a function and `jit` it: the print runs
    # once, while the function is traced, and shows a tracer."
    f = jax.jit(lambda x: (print(x), x * 2)[1])
    capsys.readouterr()
    f(1.0)
    f(2.0)
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 1 and out[0].startswith("JitTracer")


def test_analysis_debug_print_inside_pmap_prints_per_device(capsys):
    # analysis: "Inside `pmap`, JAX prints one line per device".
    def show(r):
        jax.debug.print("r = {}", r)
        return r

    capsys.readouterr()
    jax.pmap(show)(np.arange(3.0))
    jax.effects_barrier()
    assert sorted(capsys.readouterr().out.splitlines()) == [
        "r = 0.0",
        "r = 1.0",
        "r = 2.0",
    ]


def test_analysis_jax_skips_the_zero_tangent_product_of_an_mlp():
    # analysis: "JAX marks such a tangent as a symbolic zero and skips the
    # product, so its count for the same MLP is 2.0 at depth 1 and approaches
    # 3 only as the depth grows"; compile().cost_analysis() has the three keys
    # among others.
    def loss(params, x):
        for w, b in params:
            x = jnp.tanh(x @ w + b)
        return jnp.sum(x * x)

    def ratio(depth):
        params = [(jnp.ones((64, 64)), jnp.ones(64))] * depth
        x = jnp.ones((32, 64))
        grad_cost = jax.jit(jax.grad(loss)).lower(params, x).cost_analysis()
        return (
            grad_cost["flops"] / jax.jit(loss).lower(params, x).cost_analysis()["flops"]
        )

    with jax.enable_x64(True):
        assert 1.95 < ratio(1) < 2.05
        assert 2.5 < ratio(8) < 3.0
        keys = jax.jit(loss).lower([(jnp.ones((2, 2)), jnp.ones(2))], jnp.ones((1, 2)))
        keys = set(keys.compile().cost_analysis())
    assert {"flops", "transcendentals", "bytes accessed"} < keys


# ------------------------------------------------ random numbers (book/random.md)


def test_random_uint32_add_wraps_and_wide_shifts_give_zero_in_xla():
    # random: "add on them already wraps around modulo 2**32 ... XLA's" and
    # "XLA defines [a shift by the bit width or more] as 0".
    top = np.array([2**32 - 1, 2**32 - 2], np.uint32)
    ones = np.array([1, 5], np.uint32)
    np.testing.assert_array_equal(jax.jit(jax.lax.add)(top, ones), [0, 3])
    x = np.array([7, 7, 7], np.uint32)
    s = np.array([32, 33, 100], np.uint32)
    np.testing.assert_array_equal(jax.jit(jax.lax.shift_left)(x, s), [0, 0, 0])
    np.testing.assert_array_equal(jax.jit(jax.lax.shift_right_logical)(x, s), [0, 0, 0])


def test_random_jax_samplers_are_jitted_and_use_random_bits():
    # random: "JAX runs its samplers as jitted functions too, even when they
    # are called outside jit"; its jaxpr wraps the raw key into a typed key and
    # draws the bits with one primitive, random_bits.
    jaxpr = jax.make_jaxpr(lambda k: jax.random.uniform(k, (3,)))(jax.random.PRNGKey(0))
    names = [eqn.primitive.name for eqn in jaxpr.eqns]
    assert names == ["random_wrap", "jit"]
    assert jaxpr.eqns[1].params["name"] == "_uniform"
    inner = [eqn.primitive.name for eqn in jaxpr.eqns[1].params["jaxpr"].eqns]
    assert "random_bits" in inner and "threefry2x32" not in inner
    assert "bitcast_convert_type" in inner


def test_random_xla_fuses_the_scaling_of_uniform_into_one_rounding():
    # random: "XLA on CPU (at its default optimization level) fuses floats *
    # (maxval - minval) + minval into one fused multiply-add, which rounds
    # once, where NumPy's multiplication followed by an addition rounds
    # twice". The tests compile with optimization level 0 (conftest), so the
    # check runs in a fresh process with XLA's default flags.
    script = """
import jax, jax.numpy as jnp, numpy as np
key = jax.random.PRNGKey(7)
u = np.asarray(jax.random.uniform(key, (1000,), jnp.float32))
theirs = np.asarray(jax.random.uniform(key, (1000,), jnp.float32, -2.5, 3.0))
lo, span = np.float32(-2.5), np.float32(5.5)
once = (u.astype(np.float64) * np.float64(span) + lo).astype(np.float32)
twice = u * span + lo
print(int(np.sum(np.maximum(lo, once) != theirs)),
      int(np.sum(np.maximum(lo, twice) != theirs)))
"""
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    out = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    once_wrong, twice_wrong = map(int, out.stdout.split())
    assert once_wrong == 0 and twice_wrong > 0


def test_random_threefry2x32_is_a_primitive_lowered_as_a_loop_on_cpu():
    # random: "the bits come from one primitive, random_bits, which is lowered
    # through JAX's primitive threefry2x32 (on CPU, as a loop over the five
    # blocks of rounds)".
    key = jax.random.PRNGKey(0)
    counts = jnp.arange(4, dtype=jnp.uint32)
    jaxpr = jax.make_jaxpr(jax.extend.random.threefry_2x32)(key, counts)
    assert "threefry2x32" in [eqn.primitive.name for eqn in jaxpr.eqns]
    text = jax.jit(lambda k: jax.random.uniform(k, (3,))).lower(key).as_text()
    assert re.search(r"func\.func private @threefry2x32", text)
    assert "stablehlo.while" in text
    assert jax.devices()[0].platform == "cpu"


def test_random_erf_inv_is_a_chlo_operation():
    # random: "erf_inv, which StableHLO's sister dialect CHLO provides".
    assert "chlo.erf_inv" in jax.jit(jax.lax.erf_inv).lower(jnp.ones(3)).as_text()


def test_random_typed_keys_and_key_data():
    # random: "jax.random.key(seed) returns a typed key array, of shape () and
    # dtype key<fry> ... refuses arithmetic"; key_data gives PRNGKey's words.
    typed = jax.random.key(42)
    assert typed.shape == () and str(typed.dtype) == "key<fry>"
    with pytest.raises(TypeError):
        typed + 1
    raw = jax.random.PRNGKey(42)
    assert raw.dtype == np.uint32 and raw.shape == (2,)
    np.testing.assert_array_equal(jax.random.key_data(typed), raw)


def test_random_default_implementation_and_other_generators():
    # random: "JAX's default implementation is threefry2x32 (the setting
    # jax_default_prng_impl). It also has rbg and unsafe_rbg ... and a few
    # others, chosen with jax.random.key(seed, impl=...); they give other
    # numbers."
    from jax._src.random import prng

    assert jax.config.jax_default_prng_impl == "threefry2x32"
    assert {"threefry2x32", "rbg", "unsafe_rbg"} < set(prng.prngs)
    fry = jax.random.uniform(jax.random.key(0), (4,))
    rbg = jax.random.uniform(jax.random.key(0, impl="rbg"), (4,))
    assert not np.array_equal(fry, rbg)


def test_random_threefry_partitionable_is_on_and_changes_the_numbers():
    # random: "jax_threefry_partitionable is on by default in the installed
    # JAX ... with it off, JAX ... gives other numbers".
    assert jax.config.jax_threefry_partitionable is True
    key = jax.random.PRNGKey(0)
    on = jax.random.uniform(key, (5,))
    with jax.threefry_partitionable(False):
        off = jax.random.uniform(key, (5,))
    assert not np.array_equal(on, off)


def test_random_32_bit_defaults_without_x64():
    # random: "Without it, JAX's defaults are 32-bit, and a seed keeps only its
    # low 32 bits: PRNGKey(2**40 + 7) is then the key of 7."
    with jax.enable_x64(False):
        assert jax.random.uniform(jax.random.PRNGKey(0)).dtype == jnp.float32
        assert jax.random.bits(jax.random.PRNGKey(0)).dtype == jnp.uint32
        np.testing.assert_array_equal(jax.random.PRNGKey(2**40 + 7), [0, 7])
    with jax.enable_x64(True):
        assert jax.random.uniform(jax.random.PRNGKey(0)).dtype == jnp.float64
        np.testing.assert_array_equal(jax.random.PRNGKey(2**40 + 7), [256, 7])


def test_random_permutation_sorts_and_exponential_uses_log1p():
    # random: "JAX shuffles by sorting on random bits" and exponential
    # "JAX writes it with log1p".
    key = jax.random.PRNGKey(0)
    perm = jax.make_jaxpr(lambda k: jax.random.permutation(k, 5))(key)
    assert "sort" in str(perm)
    expo = jax.make_jaxpr(lambda k: jax.random.exponential(k, (5,)))(key)
    assert "log1p" in str(expo)


def test_random_permutation_sort_rounds():
    # random: "JAX repeats the sort with fresh numbers ... (one round for up
    # to about 1600 elements, two up to millions)".
    key = jax.random.PRNGKey(0)

    def sorts(n):
        jaxpr = jax.make_jaxpr(lambda k: jax.random.permutation(k, n))(key)
        return str(jaxpr).count(" sort[")

    assert sorts(1600) == 1 and sorts(1700) == 2
    assert sorts(2_000_000) == 2 and sorts(3_000_000) == 3


def test_random_threefry_gpu_kernel_is_used_only_when_its_setting_is_on():
    # random: "threefry2x32.py also registers a GPU kernel, but JAX uses it
    # only when the setting jax_threefry_gpu_kernel_lowering is on, and it is
    # off by default".
    import inspect

    from jax._src.random import threefry2x32

    assert jax.config.jax_threefry_gpu_kernel_lowering is False
    source = inspect.getsource(threefry2x32._threefry2x32_gpu_lowering_rule)
    assert "if not config.threefry_gpu_kernel_lowering.value" in source
    assert "return _threefry2x32_lowering_rule(" in source
    module = inspect.getsource(threefry2x32)  # the default lowering: unrolled
    assert "partial(_threefry2x32_lowering, use_rolled_loops=False)" in module


def test_random_rbg_uses_xla_bit_generator_and_sort_features():
    # random: rbg is "built on XLA's own random-bit generator"; JAX's sort
    # "also sorts floats (in a total order that places NaNs), several keys at
    # once, and any number of operands".
    key = jax.random.key(0, impl="rbg")
    lowered = jax.jit(jax.random.uniform).lower(key).as_text()
    assert "stablehlo.rng_bit_generator" in lowered
    x = np.array([np.nan, 1.0, -np.inf, 0.5])
    assert np.isnan(jax.lax.sort(x)[-1]) and jax.lax.sort(x)[0] == -np.inf
    a, b, c = np.array([1, 0, 1, 0]), np.array([2, 3, 1, 0]), np.arange(4.0)
    _, _, moved = jax.lax.sort((a, b, c), num_keys=2)
    np.testing.assert_array_equal(moved, [3.0, 1.0, 2.0, 0.0])


# ------------------------------------------------------------------ Part 11: checkpoint


def _checkpoint_module():
    from jax._src import ad_checkpoint

    return ad_checkpoint


def test_part11_saved_residuals_is_private_print_saved_residuals_public():
    # part11_checkpoint: "it lives in `jax._src.ad_checkpoint`; JAX 0.10.2
    # exports only `print_saved_residuals` publicly".
    import jax.ad_checkpoint

    assert callable(_checkpoint_module().saved_residuals)
    assert not hasattr(jax.ad_checkpoint, "saved_residuals")
    assert callable(jax.ad_checkpoint.print_saved_residuals)


def test_part11_saved_residuals_of_the_mlp_name_arguments_and_source_lines():
    # part11_checkpoint: "JAX saves the same six values (it also says on which
    # line each was made)"; "its descriptions end with the source line".
    def mlp(W1, W2, x):
        h = jnp.sin(x @ W1)
        return jnp.sum(jnp.sin(h @ W2))

    found = _checkpoint_module().saved_residuals(
        mlp, jnp.ones((3, 4)), jnp.ones((4, 2)), jnp.ones((5, 3))
    )
    sources = [s for _, s in found]
    assert len(found) == 6
    assert sources[:3] == [
        "from the argument W1",
        "from the argument W2",
        "from the argument x",
    ]
    assert all(re.match(r"output of (sin|cos) from .*:\d+", s) for s in sources[3:])


def test_part11_remat2_primitive_and_its_params():
    # part11_checkpoint: "JAX's primitive is called `remat2` in this release
    # (its jaxprs print `remat2[...]`), with the same four parameters".
    jaxpr = jax.make_jaxpr(jax.checkpoint(jnp.sin))(1.0)
    (eqn,) = jaxpr.eqns
    assert eqn.primitive.name == "remat2"
    assert set(eqn.params) == {"jaxpr", "policy", "prevent_cse", "differentiated"}
    assert "remat2[" in str(jaxpr)
    assert eqn.params["policy"] is None and eqn.params["differentiated"] is False


def test_part11_checkpoint_signature_keyword_only_static_argnames_tuple_cse():
    # part11_checkpoint: "As in JAX, the options are keyword-only"; "JAX's
    # `checkpoint` also takes `static_argnames`, and `prevent_cse` may be a
    # tuple with one flag per argument".
    params = inspect.signature(jax.checkpoint).parameters
    for name in ["prevent_cse", "policy", "static_argnums", "static_argnames"]:
        assert params[name].kind is inspect.Parameter.KEYWORD_ONLY
    f = jax.checkpoint(lambda x, y: jnp.sin(x) * y, prevent_cse=(True, False))
    assert np.isclose(jax.grad(f)(0.3, 2.0), 2.0 * np.cos(0.3))
    assert jax.remat(jnp.sin)(0.5) == jnp.sin(0.5)


def test_part11_prevent_cse_is_an_optimization_barrier_on_differentiated_calls():
    # part11_checkpoint: "JAX prevents this by passing the inputs of a
    # `differentiated` checkpoint through `stablehlo.optimization_barrier`".
    def text(prevent_cse, differentiate):
        f = jax.checkpoint(lambda x: jnp.sin(jnp.sin(x)), prevent_cse=prevent_cse)
        return jax.jit(jax.grad(f) if differentiate else f).lower(0.5).as_text()

    assert "optimization_barrier" in text(True, True)
    assert "optimization_barrier" not in text(False, True)
    assert "optimization_barrier" not in text(True, False)


def test_part11_docstring_suggests_prevent_cse_false_inside_scan():
    # part11_checkpoint: "which is why JAX's documentation suggests
    # `prevent_cse=False` there" (inside a scan body).
    doc = " ".join(jax.checkpoint.__doc__.split())
    assert "when used inside a :func:`~jax.lax.scan`" in doc
    assert "``prevent_cse`` can be set to False" in doc


def test_part11_policy_is_called_with_the_primitive_avals_and_params():
    # part11_checkpoint: a policy is `policy(prim, *avals, **params)`; JAX's
    # split calls `saveable(eqn.primitive, *[x.aval for x in eqn.invars],
    # **eqn.params)`.
    seen = []

    def policy(prim, *avals, **params):
        seen.append((prim, avals, params))
        return False

    f = jax.checkpoint(lambda x: jnp.sum(jnp.sin(x) * 2.0), policy=policy)
    jax.grad(f)(jnp.ones(3))
    assert seen
    sin_calls = [s for s in seen if s[0] is lax.sin_p]
    assert sin_calls
    prim, avals, params = sin_calls[0]
    assert all(isinstance(a, core.ShapedArray) for a in avals)
    assert avals[0].shape == (3,) and "accuracy" in params
    assert jax_pe.partial_eval_jaxpr_custom.__module__.endswith("partial_eval")


def test_part11_no_policy_saves_what_nothing_saveable_saves():
    # part11_checkpoint: "`None` saves nothing but the inputs, as JAX's
    # `nothing_saveable` does" (remat_partial_eval: policy or nothing_saveable).
    def f(W, x):
        return jnp.sum(jnp.sin(jnp.sin(x @ W)))

    saved = _checkpoint_module().saved_residuals
    args = (jnp.ones((3, 3)), jnp.ones((2, 3)))
    plain = [s for _, s in saved(jax.checkpoint(f), *args)]
    nothing = jax.checkpoint(f, policy=jax.checkpoint_policies.nothing_saveable)
    assert plain == [s for _, s in saved(nothing, *args)]
    assert plain == ["from the argument W", "from the argument x"]


def test_part11_policies_see_inside_a_jit():
    # part11_checkpoint: "with `dots_saveable`, a matrix product inside a `jit`
    # inside a checkpoint is [...] saved by JAX"; JAX's split has rules for
    # `jit`, `scan`, `cond`, `while`.
    W = jnp.ones((3, 3))
    f = lambda x: jnp.sum(jnp.sin(jax.jit(lambda x: x @ W)(x)))  # noqa: E731
    g = jax.checkpoint(f, policy=jax.checkpoint_policies.dots_saveable)
    sources = [s for _, s in _checkpoint_module().saved_residuals(g, jnp.ones((2, 3)))]
    assert any(s.startswith("output of jitted function") for s in sources)
    names = {p.name for p in jax_pe.partial_eval_jaxpr_custom_rules}
    assert {"jit", "scan", "cond", "while", "remat2"} <= names


def test_part11_other_policies_and_offloading():
    # part11_checkpoint: JAX's policies may return `Saveable`, `Recompute` or
    # `Offloadable(src, dst)`; `offload_dot_with_no_batch_dims`,
    # `save_and_offload_only_these_names`, `save_any_names_but_these`,
    # `save_from_both_policies` exist; the five of the book too.
    import jax.ad_checkpoint

    names = set(vars(jax.checkpoint_policies))
    assert {
        "everything_saveable", "nothing_saveable", "dots_saveable",
        "dots_with_no_batch_dims_saveable", "save_only_these_names",
        "offload_dot_with_no_batch_dims", "save_and_offload_only_these_names",
        "save_any_names_but_these", "save_from_both_policies",
    } <= names  # fmt: skip
    for name in ["Saveable", "Recompute", "Offloadable"]:
        assert hasattr(jax.ad_checkpoint, name)
    policy = jax.checkpoint_policies.offload_dot_with_no_batch_dims(
        "device", "pinned_host"
    )
    assert policy(lax.sin_p) is jax.ad_checkpoint.Recompute


def test_part11_residuals_pass_through_reduce_precision():
    # part11_checkpoint: "JAX passes each residual a checkpoint saves through
    # `reduce_precision` (`_insert_reduce_precision` in
    # `jax/_src/ad_checkpoint.py`)".
    assert callable(_checkpoint_module()._insert_reduce_precision)
    W = jnp.ones((3, 3))
    g = jax.checkpoint(
        lambda x: jnp.sum(jnp.sin(x @ W)), policy=jax.checkpoint_policies.dots_saveable
    )
    jaxpr = jax.make_jaxpr(lambda x: jax.vjp(g, x)[1](1.0))(jnp.ones((2, 3)))
    assert "reduce_precision" in [e.primitive.name for e in jaxpr.eqns]


def test_part11_dce_rules_trim_custom_calls_not_while():
    # part11_checkpoint: "Dead-code elimination in JAX (`pe.dce_rules`) trims
    # the outputs of `custom_jvp` and `custom_vjp` calls too [...] JAX's
    # `while` has no rule"; the name primitive has no transpose rule; the
    # signature of `dce_jaxpr` is (jaxpr, used_outputs, instantiate).
    assert jax_custom.custom_jvp_call_p in jax_pe.dce_rules
    assert jax_custom.custom_vjp_call_p in jax_pe.dce_rules
    assert _checkpoint_module().remat_p in jax_pe.dce_rules
    assert jax_loops.while_p not in jax_pe.dce_rules
    assert _checkpoint_module().name_p not in jax_ad.primitive_transposes
    assert list(inspect.signature(jax_pe.dce_jaxpr).parameters) == [
        "jaxpr",
        "used_outputs",
        "instantiate",
    ]


def test_part11_tanh_saves_y_and_one_minus_y():
    # part11_checkpoint: "for `tanh`, [...] JAX's saves $y$ and $1 - y$ (its
    # rule computes the tangent as xdot (1 - y) + xdot (1 - y) y)".
    found = _checkpoint_module().saved_residuals(jnp.tanh, 0.5)
    assert [s.split(" from ")[0] for _, s in found] == [
        "output of tanh",
        "output of sub",
    ]
    jaxpr = jax.make_jaxpr(lambda x: jax.vjp(jnp.tanh, x)[1](1.0))(0.5)
    assert [e.primitive.name for e in jaxpr.eqns] == [
        "tanh",
        "sub",
        "mul",
        "mul",
        "add_any",
    ]


# ------------------------------------------------------ part10_stackless


def test_part10_context_and_its_context_managers():
    # part10_stackless: "JAX's context is `jax._src.core.trace_ctx`;
    # `set_current_trace(trace)` and `take_current_trace()` are its context
    # managers."
    assert hasattr(core, "trace_ctx")
    with core.take_current_trace() as taken:
        assert taken is core.eval_trace  # at top level, the evaluation trace
    seen = []

    def f(x):
        trace = core.trace_ctx.trace
        with core.set_current_trace(trace.parent_trace):
            seen.append(core.trace_ctx.trace)
        seen.append(core.trace_ctx.trace)
        return x

    jax.jvp(f, (1.0,), (1.0,))
    assert seen[0] is core.eval_trace and type(seen[1]).__name__ == "JVPTrace"


def test_part10_bind_makes_eval_trace_current_and_rules_run_under_parent():
    # part10_stackless: "`Primitive.bind` works as ours: it takes the current
    # trace and makes the evaluation trace (`core.eval_trace`) current ...
    # `JVPTrace.process_primitive` runs the JVP rule inside
    # `with core.set_current_trace(self.parent_trace)`" and (chapter intro)
    # "a transformation applies its rules with the trace it was started under,
    # its *parent*, made current".
    assert "trace_ctx.set_trace(eval_trace)" in inspect.getsource(core.Primitive.bind)
    assert "core.set_current_trace(self.parent_trace)" in inspect.getsource(
        jax_ad.JVPTrace.process_primitive
    )
    probe = core.Primitive("part10_probe")
    seen = []

    def impl(x):
        seen.append(("impl", core.trace_ctx.trace))
        return x

    def rule(primals, tangents):
        seen.append(("jvp", core.trace_ctx.trace))
        return probe.bind(primals[0]), tangents[0]

    probe.def_impl(impl)
    probe.def_abstract_eval(lambda x: x)
    jax_ad.primitive_jvps[probe] = rule
    try:
        outer = []

        def inner_derivative(x):
            outer.append(core.trace_ctx.trace)
            return jax.jvp(probe.bind, (x,), (1.0,))[1]

        jax.jvp(inner_derivative, (1.0,), (1.0,))
    finally:
        del jax_ad.primitive_jvps[probe]
    # the inner JVP trace's rule runs with the outer JVP trace current; the
    # outer rule runs with the evaluation trace current; impl sees eval_trace.
    kinds = [(kind, trace) for kind, trace in seen]
    assert kinds[0] == ("jvp", outer[0])
    assert kinds[1] == ("jvp", core.eval_trace)
    assert kinds[-1] == ("impl", core.eval_trace)


def test_part10_traces_have_parents_and_tags():
    # part10_stackless: "A JVP trace is `JVPTrace(parent_trace, tag)`, and it
    # recognizes its tracers by `tracer._trace.tag is self.tag` ... the tag is a
    # `TraceTag` ... Batching is `BatchTrace(parent_trace, tag, axis_data)`."
    assert list(inspect.signature(jax_ad.JVPTrace.__init__).parameters) == [
        "self",
        "parent_trace",
        "tag",
    ]
    assert list(inspect.signature(jax_batching.BatchTrace.__init__).parameters) == [
        "self",
        "parent_trace",
        "tag",
        "axis_data",
    ]
    assert "val._trace.tag is self.tag" in inspect.getsource(
        jax_ad.JVPTrace.to_primal_tangent_pair
    )
    seen = []

    def inner(y):
        seen.append((core.trace_ctx.trace, y))
        return y

    def outer(x):
        seen.append((core.trace_ctx.trace, x))
        return jax.jvp(inner, (x,), (1.0,))[1]

    jax.jvp(outer, (1.0,), (1.0,))
    (outer_trace, x), (inner_trace, y) = seen
    assert inner_trace.parent_trace is outer_trace
    assert isinstance(outer_trace.tag, core.TraceTag)
    assert inner_trace.tag is not outer_trace.tag
    assert x._trace is outer_trace and y._trace is inner_trace


def test_part10_constants_go_to_the_parent_by_symbolic_zeros():
    # part10_stackless: "JAX's tangents for constants are symbolic zeros
    # (`Zero`), so 'is this operation mine' is 'does any input have a non-zero
    # tangent'" (jax/_src/interpreters/ad.py, JVPTrace.process_primitive).
    source = inspect.getsource(jax_ad.JVPTrace.process_primitive)
    assert "all(type(t) is Zero for t in tangents_in)" in source
    assert "bind_with_trace(self.parent_trace" in source


def test_part10_find_top_trace_is_public_in_extend_and_levels_are_gone():
    # part10_stackless: "`find_top_trace` survives as a one-line function that
    # ignores its argument and returns the current trace; it is public in
    # `jax.extend.core`, and only its old `jax.core` alias is deprecated (its
    # warning points to `jax.extend.core`). Levels, sublevels and `MainTrace`
    # are gone".
    import warnings

    import jax.extend.core as jex_core

    assert core.find_top_trace(object()) is core.trace_ctx.trace
    body = inspect.getsource(core.find_top_trace).strip().splitlines()
    assert body[-1].strip() == "return unsafe_get_current_trace()"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert jex_core.find_top_trace is core.find_top_trace  # no warning
    with pytest.warns(DeprecationWarning, match="jax.extend.core.find_top_trace"):
        jax.core.find_top_trace  # noqa: B018 - the attribute access warns
    seen = []

    def f(x):
        seen.append(core.find_top_trace([]) is core.trace_ctx.trace)
        return x

    jax.jvp(f, (1.0,), (1.0,))
    assert seen == [True]
    for gone in ["MainTrace", "new_main", "new_base_main", "Sublevel", "cur_sublevel"]:
        assert not hasattr(core, gone), gone


def test_part10_traces_process_with_eval_trace_current(monkeypatch):
    # part10_stackless: "`Primitive.bind` works as ours: it takes the current
    # trace and makes the evaluation trace (`core.eval_trace`) current while
    # `bind_with_trace` hands the primitive to that trace's `process_primitive`
    # (a hand-inlined `with take_current_trace()`)."
    bind_source = inspect.getsource(core.Primitive.bind)
    assert 'equivalent to "with take_current_trace()"' in bind_source
    assert "self.bind_with_trace(prev_trace" in bind_source
    assert "trace.process_primitive(self, args, params)" in inspect.getsource(
        core.Primitive.bind_with_trace
    )
    seen = []
    original = jax_ad.JVPTrace.process_primitive

    def spy(self, primitive, tracers, params):
        seen.append(core.trace_ctx.trace)
        return original(self, primitive, tracers, params)

    monkeypatch.setattr(jax_ad.JVPTrace, "process_primitive", spy)
    jax.jvp(lambda x: jax.jvp(lax.sin, (x,), (1.0,))[1], (1.0,), (1.0,))
    assert seen and all(trace is core.eval_trace for trace in seen)


def test_part10_a_jvp_rule_without_its_parent_current_fails(monkeypatch):
    # part10_stackless: "`JVPTrace.process_primitive` runs the JVP rule inside
    # `with core.set_current_trace(self.parent_trace)`, and the evaluation
    # trace refuses tracers (`check_eval_args`), so a rule run without it
    # fails ... with an `UnexpectedTracerError`."
    source = inspect.getsource(jax_ad.JVPTrace.process_primitive)
    assert "with core.set_current_trace(self.parent_trace):" in source
    assert "jvp(primals_in, tangents_in, **params)" in source
    assert "check_eval_args(args)" in inspect.getsource(
        core.EvalTrace.process_primitive
    )

    def careless(self, primitive, tracers, params):  # the `with` line removed
        primals_in, tangents_in = zip(*map(self.to_primal_tangent_pair, tracers))
        rule = jax_ad.primitive_jvps[primitive]
        primal_out, tangent_out = rule(primals_in, tangents_in, **params)
        return jax_ad.maybe_jvp_tracer(self, primal_out, tangent_out)

    monkeypatch.setattr(jax_ad.JVPTrace, "process_primitive", careless)
    one = jax.jvp(lax.sin, (3.0,), (1.0,))[1]  # one level: still right
    np.testing.assert_allclose(one, np.cos(3.0))
    with pytest.raises(jax.errors.UnexpectedTracerError):
        jax.jvp(lambda x: jax.jvp(lax.sin, (x,), (1.0,))[1], (3.0,), (1.0,))


def test_part10_leaked_tracer_raises_unexpected_tracer_error():
    # part10_stackless: "JAX detects a leaked tracer when it reaches `bind`
    # with an invalidated trace (`trace.is_valid()`), or when the evaluation
    # trace meets any tracer at all, and raises `UnexpectedTracerError`."
    assert "is_valid()" in inspect.getsource(core.Primitive.bind)
    assert "escaped_tracer_error" in inspect.getsource(core.check_eval_args)
    leaked = []
    jax.jvp(lambda x: leaked.append(x) or x, (1.0,), (1.0,))
    with pytest.raises(jax.errors.UnexpectedTracerError):
        jnp.sin(leaked[0])
    staged = []
    jax.make_jaxpr(lambda x: staged.append(x) or x)(1.0)
    with pytest.raises(jax.errors.UnexpectedTracerError):
        jnp.sin(staged[0])


def test_part10_jvp_leaks_stay_valid_vmap_leaks_do_not():
    # part10_stackless: "a tracer leaked from jax.vmap is refused later, but
    # one leaked from jax.jvp stays valid, and jax.make_jaxpr of a function
    # that closes over it records it as a constant without complaint".
    from_jvp, from_vmap = [], []
    jax.jvp(lambda x: from_jvp.append(x) or jnp.sin(x), (1.0,), (1.0,))
    jax.vmap(lambda x: from_vmap.append(x) or x)(jnp.ones(3))
    assert from_jvp[0]._trace.is_valid()
    assert not from_vmap[0]._trace.is_valid()
    jaxpr = jax.make_jaxpr(lambda y: y * from_jvp[0])(2.0)
    assert [eqn.primitive.name for eqn in jaxpr.eqns] == ["mul"]
    assert len(jaxpr.jaxpr.constvars) == 1
    with pytest.raises(jax.errors.UnexpectedTracerError):
        jax.make_jaxpr(lambda y: y * from_vmap[0])(2.0)


def test_part10_linearize_trace_uses_linearization_rules_or_jvp():
    # part10_stackless: LinearizeTrace "runs a linearization rule with its
    # parent current (from primitive_linearizations, or derived from the JVP
    # rule when the primitive has none) ... then applies the linear function
    # it returns to the tangents with the tangent trace current".
    source = inspect.getsource(jax_ad.LinearizeTrace.process_primitive)
    assert "primitive_linearizations.get(primitive, fallback)" in source
    assert "set_current_trace(self.parent_trace)" in source
    assert "set_current_trace(self.tangent_trace)" in source
    assert "primitive_jvps" in inspect.getsource(jax_ad.fallback_linearize_rule)


def test_part10_perturbation_confusion_program():
    # part10_stackless: d/dx [x * d/dy (x + y) at y=1] at x=1 is 1 in JAX.
    def derivative(fn):
        return lambda x: jax.jvp(fn, (x,), (1.0,))[1]

    assert derivative(lambda x: x * derivative(lambda y: x + y)(1.0))(1.0) == 1.0


def test_part10_linearize_trace_stages_tangents():
    # part10_stackless: "JAX 0.10.2 also records tangents in a staging trace
    # (its tangent_trace), but with one trace, LinearizeTrace".
    source = inspect.getsource(jax_ad.linearize_subtrace_2)
    assert "tangent_trace = pe.DynamicJaxprTrace" in source
    assert "LinearizeTrace(parent_trace, tangent_trace" in source


# ---- appendix_primitives: jax.nn, einsum, pow (issue 34) -----------------------


def test_appendix_nn_softmax_shifts_by_a_stop_gradient_max():
    # "The maximum is wrapped in `stop_gradient`, as in JAX" (softmax's
    # default path, with jax_softmax_custom_jvp off, and log_softmax).
    assert jax.config.jax_softmax_custom_jvp is False
    for fn in (jax.nn.softmax, jax.nn.log_softmax):
        names = [e.primitive.name for e in jax.make_jaxpr(fn)(np.ones(3)).eqns]
        inner = str(jax.make_jaxpr(fn)(np.ones(3)))
        assert "stop_gradient" in names or "stop_gradient" in inner
        assert "reduce_max" in inner


def test_appendix_nn_conventions():
    # "gelu (JAX's tanh approximation by default ...)", "relu (whose
    # derivative at 0 is 0, as JAX's)", one_hot: "JAX has deprecated other
    # dtypes" (than integers), and "a diagonal, which `jnp.einsum` allows".
    assert inspect.signature(jax.nn.gelu).parameters["approximate"].default is True
    assert float(jax.grad(jax.nn.relu)(0.0)) == 0.0
    with pytest.warns(DeprecationWarning, match="integer-typed"):
        jax.nn.one_hot(np.array([1.0]), 3)
    np.testing.assert_array_equal(jnp.einsum("ii->i", np.eye(2)), [1.0, 1.0])


def test_appendix_pow_takes_an_integer_exponent_unconverted():
    # "JAX has a second primitive, `pow`, whose exponent is an operand ... an
    # integer array (which the lowering converts, so that `0.9 ** t` needs no
    # conversion in the jaxpr)"; `x ** 2` is integer_pow.
    jaxpr = jax.make_jaxpr(lambda t: 0.9**t)(1)
    (eqn,) = [e for e in jaxpr.eqns if e.primitive.name == "pow"]
    assert eqn.invars[1] is jaxpr.jaxpr.invars[0]  # the int64 t itself
    assert str(eqn.invars[1].aval.dtype) == "int64"
    text = jax.jit(lambda t: 0.9**t).lower(1).as_text()
    assert re.search(r"stablehlo.convert %arg0 : \(tensor<i64>\) -> tensor<f64>", text)
    assert "stablehlo.power" in text
    assert "integer_pow" in str(jax.make_jaxpr(lambda x: x**2)(1.0))


def test_appendix_pow_derivatives_at_zero():
    # "an integer exponent of 0 has slope 0 in the base ... log x is taken as
    # log 1 = 0 where x = 0, so that 0**y ... has slope 0 in y"
    _, dx = jax.jvp(lambda x: x ** np.int64(0) + 0 * x, (0.0,), (1.0,))
    _, d_int = jax.jvp(lambda x: jax.lax.pow(x, np.int64(0)), (0.0,), (1.0,))
    _, dy = jax.jvp(lambda y: jax.lax.pow(0.0, y), (2.0,), (1.0,))
    assert float(dx) == 0.0 and float(d_int) == 0.0 and float(dy) == 0.0


def test_appendix_jnp_power_of_ints_squares_six_times():
    # "JAX's `jnp.power` also raises an integer base to a traced integer
    # exponent (six rounds of squaring and selecting ...)"
    jaxpr = jax.make_jaxpr(lambda x, y: x**y)(np.int32(1), 2)
    assert "pow" not in {e.primitive.name for e in jaxpr.eqns}
    assert str(jaxpr).count("shift_right_logical") == 6
    assert jax.jit(lambda x, y: x**y)(np.int32(3), 4) == 81


def test_part12_float32_default_and_numpy_scalars():
    # part12_capstone: "JAX's default is 32 bits ... `np.sqrt(D // n_heads)` is
    # a NumPy float64, which would turn a float32 model into float64 in ours
    # (and in JAX with `jax_enable_x64` on), but not in JAX's default mode,
    # which narrows it to float32"; a Python float takes the array's dtype.
    x = jnp.ones(3, jnp.float32)
    with jax.enable_x64(False):
        assert jnp.zeros(2).dtype == jnp.float32
        assert (x / np.float64(2.0)).dtype == jnp.float32
        assert (x / 2.0).dtype == jnp.float32
    with jax.enable_x64(True):
        assert (x / np.float64(2.0)).dtype == jnp.float64
        assert (x / 2.0).dtype == jnp.float32


def test_part12_softmax_var_gelu_formulas():
    # part12_capstone: JAX's `softmax` subtracts the maximum under
    # `stop_gradient` (its custom-JVP version is off by default,
    # `jax_softmax_custom_jvp`); `jnp.var` squares the centered values with
    # `square`; `gelu` is by default the tanh approximation, computed as
    # x * (0.5 * (1 + tanh(...))) with `integer_pow` for the cube.
    x = np.ones((2, 3), np.float32)
    assert jax.config.jax_softmax_custom_jvp is False

    def names(fn):
        found = []

        def walk(jaxpr):
            for eqn in jaxpr.eqns:
                found.append(eqn.primitive.name)
                for sub in jax.extend.core.jaxprs_in_params(eqn.params):
                    walk(sub)

        walk(jax.make_jaxpr(fn)(x).jaxpr)
        return found

    assert "stop_gradient" in names(jax.nn.softmax)
    assert "custom_jvp_call" not in names(jax.nn.softmax)
    assert "square" in names(lambda x: jnp.var(x, axis=-1))
    gelu = names(jax.nn.gelu)
    assert gelu[0] == "integer_pow" and gelu[-1] == "mul" and "tanh" in gelu
    assert inspect.signature(jax.nn.gelu).parameters["approximate"].default is True


def test_part12_pmap_docstring_points_to_shard_map():
    # part12_capstone: "JAX 0.10.2's docstring of `jax.pmap` calls it the old
    # way of doing a parallel map and points to `jax.shard_map`".
    assert jax.pmap.__doc__.startswith(
        "Old way of doing parallel map. Use :py:func:`jax.shard_map` instead."
    )


def test_part12_elementwise_ops_take_size_one_axes_and_keep_them_small():
    # part12_capstone: "JAX 0.10.2's element-wise operations take the size-1
    # axis as it is, and keep the small array" (ours broadcasts it first).
    x, s = np.ones((2, 3)), np.full((2, 1), 2.0)
    jaxpr = jax.make_jaxpr(lambda x, s: x - s)(x, s)
    assert [e.primitive.name for e in jaxpr.eqns] == ["sub"]
    assert jaxpr.eqns[0].invars[1].aval.shape == (2, 1)
    found = _checkpoint_module().saved_residuals(
        lambda x, s: jnp.sum(jnp.sin(x * s)), x, s
    )
    assert sorted(aval.shape for aval, _ in found) == [(2, 1), (2, 3), (2, 3)]
    assert not any("broadcast" in where for _, where in found)


def test_part12_zero_tangents_are_symbolic_and_built_inside_the_program():
    # part12_capstone: "JAX keeps a tangent it knows to be zero as a symbolic
    # `Zero` (`jax/_src/ad_util.py`), and where it needs the array it builds
    # it inside the program, as an operation" (no array of zeros becomes a
    # constant of the program).
    from jax._src import ad_util

    assert "class Zero" in inspect.getsource(ad_util)

    def masked(x):  # the causal mask and its -1e9, as in the chapter's model
        causal = jnp.tril(jnp.ones((4, 4), dtype=bool))
        return jnp.sum(jax.nn.softmax(jnp.where(causal, x, -1e9)) ** 2)

    closed = jax.make_jaxpr(jax.grad(masked))(np.ones((4, 4)))
    assert closed.consts == []
    assert "broadcast_in_dim" in str(closed)


def test_part12_tanh_jvp_rule():
    # part12_capstone: "JAX's rule for `tanh`, inside `gelu`, is
    # (xdot + xdot y)(1 - y)" (at the default accuracy).
    jaxpr = jax.make_jaxpr(lambda x, t: jax.jvp(jnp.tanh, (x,), (t,)))(0.5, 1.0)
    assert [e.primitive.name for e in jaxpr.eqns] == [
        "tanh",
        "mul",
        "add",
        "sub",
        "mul",
    ]
