"""Autodidax: a small JAX core built from scratch.

GENERATED FILE: do not edit it by hand. It is tangled from the code cells
tagged ``export`` in the book's chapters (book/*.md, in _toc.yml order) by
build_tools/tangle.py; cells tagged ``export-<name>`` build the module
``autodidax.<name>``. To change it, edit a chapter and regenerate it with

    python3 build_tools/book.py tangle

or, to also resync and re-execute the chapter's notebook,

    python3 build_tools/book.py refresh book/<chapter>.md
"""

# ==== chapter: part1_interpreters ====

# @title Imports: NumPy and a few helpers from the standard library
from __future__ import annotations

import threading
from collections.abc import Callable, Hashable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

# @title Registries the book's rule table reads: PRIMITIVES, RULE_KINDS
PRIMITIVES: dict[str, Primitive] = {}  # every primitive, by name
RULE_KINDS: list[str] = []  # every kind of rule, in the order first registered


class Primitive:
    """A named operation with one rule per interpreter."""

    def __init__(self, name: str, multiple_results: bool = False) -> None:
        self.name = name
        self.multiple_results = multiple_results  # see `bind`, below
        self.rules: dict[str, Callable] = {}
        PRIMITIVES[name] = self

    def def_rule(self, kind: str) -> Callable:
        """Decorator: register a function as this primitive's ``kind`` rule."""

        def register(rule):
            self.rules[kind] = rule
            if kind not in RULE_KINDS:
                RULE_KINDS.append(kind)
            return rule

        return register


# @title Looking up a rule (checks: a missing rule); `prim.bind(...)`, as in JAX
def _primitive_rule(self: Primitive, kind: str) -> Callable:
    """The ``kind`` rule, or a clear error if the primitive has none."""
    if kind not in self.rules:
        raise NotImplementedError(f"primitive '{self.name}' has no {kind} rule")
    return self.rules[kind]


def _primitive_bind(self: Primitive, *args: Any, **params: Any) -> Any:
    return bind(self, *args, **params)


Primitive.rule = _primitive_rule
Primitive.bind = _primitive_bind
Primitive.__repr__ = lambda self: self.name

add_p = Primitive("add")
mul_p = Primitive("mul")
neg_p = Primitive("neg")
sin_p = Primitive("sin")
cos_p = Primitive("cos")


def add(x: ArrayLike, y: ArrayLike) -> ArrayLike:
    x, y = _binary_operands("add", x, y)
    return bind(add_p, x, y)


def mul(x: ArrayLike, y: ArrayLike) -> ArrayLike:
    x, y = _binary_operands("mul", x, y)
    return bind(mul_p, x, y)


def neg(x: ArrayLike) -> ArrayLike:
    _check_kind("neg", x, "iuf", "a numeric (not boolean)")
    return bind(neg_p, x)


def sin(x: ArrayLike) -> ArrayLike:
    _check_kind("sin", x, "f", "a float")
    return bind(sin_p, x)


def cos(x: ArrayLike) -> ArrayLike:
    _check_kind("cos", x, "f", "a float")
    return bind(cos_p, x)


# @title Checks: dtypes; the operands of binary primitives (and Python numbers)
ArrayLike = Any
"""Anything that can stand for an array: NumPy arrays and scalars, Python
numbers, and tracers."""


def _check_kind(name: str, x: ArrayLike, kinds: str, expected: str) -> None:
    """Refuse dtypes the operation does not define (NumPy would quietly return
    floats for the sine of integers, for example)."""
    dtype = get_aval(x, name, 0).dtype
    if dtype.kind not in kinds:
        raise TypeError(f"{name}: expected {expected} array, got dtype {dtype.name}")


def _binary_operands(name: str, x: ArrayLike, y: ArrayLike) -> tuple[Any, Any]:
    """The operands of a binary primitive, checked to have one shape and dtype;
    a Python number becomes an array like the other operand."""
    if _is_python_scalar(x) and _is_python_scalar(y):
        dtype = np.result_type(type(x), type(y))  # e.g. 2.0 and 3 give float64
        x, y = np.asarray(x, dtype), np.asarray(y, dtype)
    elif _is_python_scalar(x):
        x = _scalar_like(name, x, y)
    elif _is_python_scalar(y):
        y = _scalar_like(name, y, x)
    check_binary_operands(name, get_aval(x, name, 0), get_aval(y, name, 1))
    return x, y


def _bind_binary(prim: Primitive, x: ArrayLike, y: ArrayLike) -> ArrayLike:
    """``bind`` a binary primitive to its checked operands (later parts' wrappers)."""
    return bind(prim, *_binary_operands(prim.name, x, y))


def _is_python_scalar(x: Any) -> bool:
    return type(x) in (bool, int, float)


def _scalar_like(name: str, c: bool | int | float, other: ArrayLike) -> ArrayLike:
    """Turn the Python number ``c`` into an array shaped like ``other`` (with
    the ``broadcast`` primitive, which comes after ``jvp``)."""
    aval = get_aval(other)
    _check_scalar_fits(name, c, aval.dtype)
    const = np.asarray(c, dtype=aval.dtype)
    if aval.ndim == 0:
        return const
    return broadcast(const, aval.shape, tuple(range(aval.ndim)))


def _check_scalar_fits(name: str, c: bool | int | float, dtype: np.dtype) -> None:
    """Refuse every conversion that would change the number's value."""
    kind = dtype.kind
    if (kind == "b" and type(c) is not bool) or (kind in "iu" and type(c) is float):
        raise TypeError(
            f"{name}: cannot combine the {type(c).__name__} {c!r} with an array "
            f"of dtype {dtype.name}; use a constant of the array's kind"
        )
    if kind in "iu" and not np.iinfo(dtype).min <= c <= np.iinfo(dtype).max:
        raise TypeError(
            f"{name}: the integer {c} does not fit in the dtype "
            f"{dtype.name} of the other operand"
        )


def check_binary_operands(name: str, x: ShapedArray, y: ShapedArray) -> None:
    """Raise a TypeError unless two operands have the same shape and dtype."""
    if x.shape != y.shape:
        raise TypeError(
            f"{name}: operands must have the same shape, got {x.str_short()} and "
            f"{y.str_short()} (use broadcast to make them match)"
        )
    if x.dtype != y.dtype:
        raise TypeError(
            f"{name}: operands must have the same dtype, got {x.str_short()} and "
            f"{y.str_short()}"
        )


class Level:
    """One entry on the interpreter stack; ``payload`` is the transformation's
    own data, such as a batch size."""

    def __init__(self, number: int, trace_type: type[Trace], payload: Any) -> None:
        self.number, self.trace_type, self.payload = number, trace_type, payload


# @title How a level prints: Level(1, JVPTrace)
Level.__repr__ = lambda self: f"Level({self.number}, {self.trace_type.__name__})"


class Trace:
    """An interpreter: how to process primitives applied to its tracers."""

    def __init__(self, level: Level) -> None:
        self.level = level

    def pure(self, val): ...

    def lift(self, tracer): ...

    def process_primitive(self, prim, tracers, params): ...

    def full_raise(self, val: Any) -> Any:
        """Make ``val`` a tracer of this trace, boxing it if needed."""
        if not isinstance(val, Tracer):
            return self.pure(val)
        level = val._trace.level
        if level is self.level:
            return val
        if level.number < self.level.number:
            return self.lift(val)
        raise _leaked_tracer_error(val)  # a finished transformation's tracer


class ShapedArray:
    """The abstract value of an array: its shape and dtype, not its contents."""

    __slots__ = ("shape", "dtype")

    def __init__(self, shape: Sequence[int], dtype: Any) -> None:
        self.shape = tuple(int(d) for d in shape)
        self.dtype = np.dtype(dtype)


def get_aval(x: Any, context: str = "autodidax", position: int | None = None):
    """The abstract value of a tracer, array or number."""
    if isinstance(x, Tracer):
        return x.aval
    x = as_array(x, context, position)
    return ShapedArray(x.shape, x.dtype)


# @title Comparing and printing avals; checks: what counts as an array
def _aval_eq(self: ShapedArray, other: object) -> bool:
    same_type = type(other) is ShapedArray
    return same_type and self.shape == other.shape and self.dtype == other.dtype


def _aval_size(self: ShapedArray) -> int:
    return int(np.prod(self.shape, dtype=np.int64))


def _aval_str_short(self: ShapedArray) -> str:
    """Compact form such as ``float64[3,4]``."""
    return f"{self.dtype.name}[{','.join(str(d) for d in self.shape)}]"


def _aval_repr(self: ShapedArray) -> str:
    return f"ShapedArray(shape={self.shape}, dtype={self.dtype.name})"


ShapedArray.__eq__ = _aval_eq
ShapedArray.__hash__ = lambda self: hash((self.shape, self.dtype))
ShapedArray.ndim = property(lambda self: len(self.shape))
ShapedArray.size = property(_aval_size)
ShapedArray.str_short = _aval_str_short
ShapedArray.__repr__ = _aval_repr

_ARRAY_KINDS = "biuf"  # bool, signed int, unsigned int, float

DEVICE_ARRAY_TYPES: tuple[type, ...] = ()
"""Array types that live on an accelerator: Part 3 sets it to its device
array type, which is then accepted as it is, without a copy to NumPy."""


def as_array(
    x: Any, context: str = "autodidax", position: int | None = None
) -> np.ndarray:
    """Convert a NumPy array or Python/NumPy number to an ndarray, or fail."""
    if isinstance(x, DEVICE_ARRAY_TYPES):
        return x
    if isinstance(x, np.ndarray):
        arr = x
    elif isinstance(x, (bool, int, float, np.generic)):
        arr = np.asarray(x)
    else:
        raise _not_an_array_error(x, context, position)
    if arr.dtype.kind not in _ARRAY_KINDS:
        raise TypeError(
            f"{context}: expected an array of booleans, integers or floats, got "
            f"dtype {arr.dtype} ({_short_repr(x)})"
        )
    return arr


def _not_an_array_error(x: Any, context: str, position: int | None) -> TypeError:
    where = "" if position is None else f" at position {position}"
    if isinstance(x, (list, tuple)):
        n = len(x)
        return TypeError(
            f"{context}: expected an array or a number{where}, got a "
            f"{type(x).__name__} of {n} value{'' if n == 1 else 's'}. A "
            f"{type(x).__name__} is a pytree of separate values, not an array: "
            "to use a list of numbers as one array, convert it with np.asarray "
            "before passing it in (e.g. to the transformed function)"
        )
    return TypeError(
        f"{context}: expected an array or a number{where}, got "
        f"{type(x).__name__} {_short_repr(x)}"
    )


def _short_repr(x: Any, limit: int = 40) -> str:
    text = repr(x)
    return text if len(text) <= limit else text[: limit - 3] + "..."


# @title Operators on tracers: `x * y` is `mul(x, y)`, or the appendix's, via OPERATORS
OPERATORS: dict[str, Callable] = {}
"""Functions for the operators by name ("add", "sub", "mul", "greater",
"less"), registered by a later chapter (the appendix's NumPy front end); an
operator with none registered calls our wrapper."""


def _add_negated(x: ArrayLike, y: ArrayLike) -> ArrayLike:
    """``x - y`` as ``add`` and ``neg``. A Python number is negated by Python,
    so it stays a Python number and keeps broadcasting like one."""
    return add(x, -y if _is_python_scalar(y) else neg(y))


class ArrayOperators:
    """Python's operators, spelled with our wrappers. Tracers have them (and
    so, from Part 3 on, do arrays that live on a device)."""

    def __add__(self, other):
        return OPERATORS.get("add", add)(self, other)

    def __radd__(self, other):
        return OPERATORS.get("add", add)(other, self)

    def __mul__(self, other):
        return OPERATORS.get("mul", mul)(self, other)

    def __rmul__(self, other):
        return OPERATORS.get("mul", mul)(other, self)

    def __neg__(self):
        return neg(self)

    def __sub__(self, other):
        return OPERATORS.get("sub", _add_negated)(self, other)

    def __rsub__(self, other):
        return OPERATORS.get("sub", _add_negated)(other, self)

    def __gt__(self, other):
        return OPERATORS.get("greater", greater)(self, other)

    def __lt__(self, other):
        return OPERATORS.get("less", less)(self, other)


class Tracer(ArrayOperators):
    """A stand-in for an array while a transformation runs a function."""

    _trace: Trace

    @property
    def aval(self) -> ShapedArray: ...

    def full_lower(self) -> Any:
        return self


def full_lower(x: Any) -> Any:
    return x.full_lower() if isinstance(x, Tracer) else x


# @title A tracer's shape and printing; checks: Python, NumPy and leaked tracers
def _tracer_bool(self: Tracer) -> bool:
    raise _concretization_error(self)


def _tracer_array(self: Tracer, dtype=None, copy=None):
    raise _numpy_conversion_error(self)


def _tracer_repr(self: Tracer) -> str:
    return f"{type(self).__name__}<{self.aval.str_short()}>"


Tracer.shape = property(lambda self: self.aval.shape)
Tracer.dtype = property(lambda self: self.aval.dtype)
Tracer.ndim = property(lambda self: self.aval.ndim)
Tracer.__array_ufunc__ = None  # let our reflected operators win over NumPy's
Tracer.__bool__ = _tracer_bool
Tracer.__array__ = _tracer_array
Tracer.__repr__ = _tracer_repr


class ConcretizationError(TypeError):
    """Python needed an actual value (e.g. for ``if``) from an abstract tracer."""


class UnexpectedTracerError(TypeError):
    """A tracer was used after the transformation that made it had finished."""


def _check_live(self: Tracer) -> None:
    """Refuse to be used after the transformation that made this tracer
    has finished (``_is_live`` is defined below, with the stack)."""
    if not _is_live(self):
        raise _leaked_tracer_error(self)


Tracer.check_live = _check_live


def _concretization_error(tracer: Tracer) -> ConcretizationError:
    tracer.check_live()
    return ConcretizationError(
        f"the truth value of a traced {tracer.aval.str_short()} value is not "
        "known while tracing, so Python `if`/`while`/`bool()` cannot use it"
    )


def _numpy_conversion_error(tracer: Tracer) -> TypeError:
    tracer.check_live()
    return TypeError(
        f"a {type(tracer).__name__} cannot be turned into a NumPy array: it "
        "stands for a value being transformed. Use autodidax's operations "
        "(add, mul, sin, ...) instead of NumPy functions on traced values."
    )


class EvalTrace(Trace):
    """The interpreter at level 0: apply each primitive to concrete arrays."""

    def pure(self, val: Any) -> Any:
        return val

    lift = pure

    def process_primitive(self, prim, tracers, params):
        return prim.rule("impl")(*tracers, **params)


def _impl_from_numpy(prim, np_fn):
    prim.def_rule("impl")(lambda *args: [np_fn(*args)])


for _prim, _np_fn in [(add_p, np.add), (mul_p, np.multiply), (neg_p, np.negative),
                      (sin_p, np.sin), (cos_p, np.cos)]:  # fmt: skip
    _impl_from_numpy(_prim, _np_fn)


class _InterpreterState(threading.local):  # each thread has its own stack
    def __init__(self) -> None:
        self.stack: list[Level] = [Level(0, EvalTrace, None)]


_state = _InterpreterState()


@contextmanager
def new_level(trace_type: type[Trace], payload: Any = None) -> Iterator[Level]:
    """Push a level on top of the stack for one run of a transformation."""
    stack = _state.stack
    level = Level(len(stack), trace_type, payload)
    stack.append(level)
    try:
        yield level
    finally:
        stack.pop()


def _search_start() -> Level:  # the bottom of the stack (Part 2 changes this)
    return _state.stack[0]


def find_top_trace(args: Sequence[Any]) -> Trace:
    """The trace of the highest level among the tracers in ``args``."""
    top = _search_start()
    for x in args:
        if isinstance(x, Tracer):
            x.check_live()
            if x._trace.level.number > top.number:
                top = x._trace.level
    return top.trace_type(top)


def bind(prim: Primitive, *args: Any, **params: Any) -> Any:
    """Apply a primitive: the single entry point of every operation."""
    args = [x if isinstance(x, Tracer) else as_array(x, prim.name) for x in args]
    trace = find_top_trace(args)
    tracers = [trace.full_raise(x) for x in args]
    outs = trace.process_primitive(prim, tracers, params)
    outs = [full_lower(out) for out in outs]
    return outs if prim.multiple_results else outs[0]


# @title Checks: is a tracer's transformation still running?
def _is_live(tracer: Tracer) -> bool:
    """Is the tracer's level still on the stack (its transformation running)?"""
    level, stack = tracer._trace.level, _state.stack
    return level.number < len(stack) and stack[level.number] is level


def _leaked_tracer_error(tracer: Tracer) -> UnexpectedTracerError:
    kind = tracer._trace.level.trace_type.__name__
    return UnexpectedTracerError(
        f"found a {type(tracer).__name__} ({kind}) whose transformation has "
        "already finished: a traced value escaped its transformation, for "
        "example by being stored in a global or a list inside the transformed "
        "function. Return values from the function instead."
    )


def zeros_like(x: Any) -> np.ndarray:
    aval = get_aval(x)
    return np.zeros(aval.shape, aval.dtype)


class JVPTracer(Tracer):
    """A value being differentiated: its primal and its tangent."""

    def __init__(self, trace: JVPTrace, primal: Any, tangent: Any) -> None:
        self._trace, self.primal, self.tangent = trace, primal, tangent

    @property
    def aval(self) -> ShapedArray:
        return get_aval(self.primal)


class JVPTrace(Trace):
    """The forward-mode differentiation interpreter."""

    def pure(self, val: Any) -> JVPTracer:
        return JVPTracer(self, val, zeros_like(val))  # a constant: zero tangent

    lift = pure

    def process_primitive(self, prim, tracers, params):
        primals = [t.primal for t in tracers]
        tangents = [t.tangent for t in tracers]
        primals_out, tangents_out = prim.rule("jvp")(primals, tangents, **params)
        return [JVPTracer(self, p, t) for p, t in zip(primals_out, tangents_out)]


def _linear_jvp(prim: Primitive) -> None:
    @prim.def_rule("jvp")
    def rule(primals, tangents, **params):
        return [bind(prim, *primals, **params)], [bind(prim, *tangents, **params)]


for _prim in [add_p, neg_p]:
    _linear_jvp(_prim)


@mul_p.def_rule("jvp")
def _mul_jvp(primals, tangents):
    (x, y), (dx, dy) = primals, tangents
    return [mul(x, y)], [add(mul(dx, y), mul(x, dy))]


@sin_p.def_rule("jvp")
def _sin_jvp(primals, tangents):
    (x,), (dx,) = primals, tangents
    return [sin(x)], [mul(dx, cos(x))]


@cos_p.def_rule("jvp")
def _cos_jvp(primals, tangents):
    (x,), (dx,) = primals, tangents
    return [cos(x)], [neg(mul(dx, sin(x)))]


def jvp_flat(f, primals, tangents):
    """JVP of ``f``, a function from a list of arrays to a list of arrays."""
    with new_level(JVPTrace) as level:
        trace = JVPTrace(level)
        tracers_in = [JVPTracer(trace, p, t) for p, t in zip(primals, tangents)]
        outs = _check_outputs("jvp", f(*tracers_in))
        tracers_out = [trace.full_raise(out) for out in outs]
        primals_out = [full_lower(t.primal) for t in tracers_out]
        tangents_out = [full_lower(t.tangent) for t in tracers_out]
    return primals_out, tangents_out


# @title Checks: values entering or leaving a transformation; JVPTracer's repr
def _jvp_tracer_repr(self: JVPTracer) -> str:
    return f"JVPTracer(primal={self.primal!r}, tangent={self.tangent!r})"


JVPTracer.__repr__ = _jvp_tracer_repr


def _as_input(x: Any, context: str) -> Any:
    """A live tracer, or ``x`` as a NumPy array; anything else is an error."""
    if isinstance(x, Tracer):
        x.check_live()
        return x
    return as_array(x, context)


def _check_outputs(name: str, outs: list) -> list:
    """Each output of a transformed function must be an array or a live tracer."""
    return [_as_input(out, f"{name}: output of the function") for out in outs]


gt_p = Primitive("gt")
lt_p = Primitive("lt")


def greater(x: ArrayLike, y: ArrayLike) -> ArrayLike:
    """Elementwise ``x > y``, a boolean array (the primitive ``gt``)."""
    x, y = _binary_operands("greater", x, y)
    return bind(gt_p, x, y)


def less(x: ArrayLike, y: ArrayLike) -> ArrayLike:
    """Elementwise ``x < y``, a boolean array (the primitive ``lt``)."""
    x, y = _binary_operands("less", x, y)
    return bind(lt_p, x, y)


def _comparison_jvp(prim: Primitive) -> None:
    @prim.def_rule("jvp")
    def rule(primals, tangents):
        out = bind(prim, *primals)
        return [out], [zeros_like(out)]


for _prim, _np_fn in [(gt_p, np.greater), (lt_p, np.less)]:
    _impl_from_numpy(_prim, _np_fn)
    _comparison_jvp(_prim)


def _jvp_tracer_bool(self: JVPTracer) -> bool:
    self.check_live()
    return bool(self.primal)


JVPTracer.__bool__ = _jvp_tracer_bool

reduce_sum_p = Primitive("reduce_sum")
transpose_p = Primitive("transpose")
broadcast_p = Primitive("broadcast")


def reduce_sum(x: ArrayLike, axis: int | Sequence[int] | None = None) -> ArrayLike:
    """Sum over ``axis`` (an int, a sequence of ints, or None for all axes)."""
    ndim = get_aval(x, "reduce_sum", 0).ndim
    if axis is None:
        axis = tuple(range(ndim))
    return bind(reduce_sum_p, x, axes=_normalize_axes("reduce_sum", axis, ndim))


def transpose(x: ArrayLike, perm: Sequence[int]) -> ArrayLike:
    """Permute the axes of ``x``: output axis ``i`` is input axis ``perm[i]``."""
    return bind(transpose_p, x, perm=_check_perm(x, perm))


def broadcast(x: ArrayLike, shape: Sequence[int], axes: Sequence[int]) -> ArrayLike:
    """Broadcast ``x`` to ``shape`` by inserting new axes at positions ``axes``."""
    shape, axes = _check_broadcast(x, shape, axes)
    return bind(broadcast_p, x, shape=shape, axes=axes)


# @title Checks: axes, shapes and permutations given to the wrappers
def _normalize_axes(name: str, axes: int | Sequence[int], ndim: int) -> tuple:
    """Check axis numbers against ``ndim`` and make negative ones positive."""
    if isinstance(axes, (int, np.integer)) and not isinstance(axes, bool):
        axes = (axes,)
    try:
        axes = tuple(axes)
    except TypeError:
        raise TypeError(
            f"{name}: axes must be integers, got {type(axes).__name__}"
        ) from None
    out = []
    for a in axes:
        if not isinstance(a, (int, np.integer)) or isinstance(a, bool):
            raise TypeError(f"{name}: axes must be integers, got {a!r}")
        if not -ndim <= a < ndim:
            raise ValueError(
                f"{name}: axis {a} is out of range for an array of rank {ndim}"
            )
        out.append(int(a) % ndim)
    if len(set(out)) != len(out):
        raise ValueError(f"{name}: repeated axis in {axes}")
    return tuple(out)


def _check_perm(x: ArrayLike, perm: Sequence[int]) -> tuple:
    """``perm`` as a tuple of non-negative axes, if it permutes the axes of ``x``."""
    aval = get_aval(x)
    try:
        axes = _normalize_axes("transpose", perm, aval.ndim)
    except ValueError as e:
        if "repeated" not in str(e):
            raise
        axes = ()
    if sorted(axes) != list(range(aval.ndim)):
        given = tuple(int(a) for a in ((perm,) if np.ndim(perm) == 0 else perm))
        raise ValueError(
            f"transpose: perm {given} is not a permutation of the axes of "
            f"{aval.str_short()}"
        )
    return axes


def _check_shape(name: str, shape: Sequence[int]) -> tuple:
    """Check that ``shape`` is a sequence of non-negative integers."""
    try:
        dims = tuple(shape)
    except TypeError:
        raise TypeError(
            f"{name}: shape must be a sequence of integers, got {shape!r}"
        ) from None
    for d in dims:
        if not isinstance(d, (int, np.integer)) or isinstance(d, bool) or d < 0:
            raise ValueError(
                f"{name}: shape must contain non-negative integers, got {shape!r}"
            )
    return tuple(int(d) for d in dims)


def _check_broadcast(x: ArrayLike, shape: Sequence[int], axes: Sequence[int]):
    """Canonical ``(shape, axes)`` of a broadcast, if the axes of the result
    that are not in ``axes`` have the input's sizes, in order."""
    in_shape = get_aval(x).shape
    shape = _check_shape("broadcast", shape)
    axes = _normalize_axes("broadcast", axes, len(shape))
    kept = [size for i, size in enumerate(shape) if i not in axes]
    if tuple(kept) != in_shape:
        raise ValueError(
            f"broadcast: cannot broadcast an array of shape {in_shape} to shape "
            f"{shape} by inserting axes {axes}: the remaining axes have sizes "
            f"{tuple(kept)}, which must equal the input shape"
        )
    return shape, tuple(sorted(axes))


@reduce_sum_p.def_rule("impl")
def _reduce_sum_impl(x, *, axes):
    return [np.sum(np.asarray(x), axis=axes, dtype=x.dtype)]  # booleans stay booleans


@transpose_p.def_rule("impl")
def _transpose_impl(x, *, perm):
    return [np.transpose(np.asarray(x), perm)]


@broadcast_p.def_rule("impl")
def _broadcast_impl(x, *, shape, axes):
    return [np.broadcast_to(np.expand_dims(x, axes), shape)]


for _prim in [reduce_sum_p, transpose_p, broadcast_p]:
    _linear_jvp(_prim)


class NodeHandler(NamedTuple):
    """How to take a container apart and put it back together."""

    to_children: Callable  # container -> (children, aux), aux hashable
    from_children: Callable  # (aux, children) -> container


PYTREE_NODES: dict[type, NodeHandler] = {}


def register_pytree_node(
    node_type: type, to_children: Callable, from_children: Callable
) -> None:
    """Teach the pytree functions a new container type."""
    PYTREE_NODES[node_type] = NodeHandler(to_children, from_children)


register_pytree_node(tuple, lambda t: (t, None), lambda _, kids: tuple(kids))


@dataclass(frozen=True)
class PyTreeDef:
    """The structure of a pytree, without its leaves."""

    node_type: type | None  # None marks a leaf
    aux: Hashable = None
    children: tuple[PyTreeDef, ...] = ()


LEAF = PyTreeDef(None)


def tree_flatten(tree: Any) -> tuple[list[Any], PyTreeDef]:
    """Split a pytree into its list of leaves and its structure."""
    leaves: list[Any] = []

    def visit(node: Any) -> PyTreeDef:
        handler = node_handler(type(node))  # None for a leaf
        if handler is None:
            leaves.append(node)
            return LEAF
        children, aux = handler.to_children(node)
        return PyTreeDef(type(node), aux, tuple(visit(c) for c in children))

    return leaves, visit(tree)


def tree_unflatten(treedef: PyTreeDef, leaves: Sequence[Any]) -> Any:
    """Rebuild a pytree of structure ``treedef`` from its leaves."""
    leaves = _check_leaf_count(treedef, leaves)
    remaining = iter(leaves)

    def build(node: PyTreeDef) -> Any:
        if node.node_type is None:
            return next(remaining)
        kids = [build(child) for child in node.children]
        return PYTREE_NODES[node.node_type].from_children(node.aux, kids)

    return build(treedef)


# @title Lists, dicts and None as pytrees; printing a PyTreeDef; checks
def _num_leaves(self: PyTreeDef) -> int:
    if self.node_type is None:
        return 1
    return sum(child.num_leaves for child in self.children)


PyTreeDef.num_leaves = property(_num_leaves)


def node_handler(node_type: type) -> NodeHandler | None:
    """How to take ``node_type`` apart, or None for a leaf; a namedtuple class
    is registered on first sight."""
    handler = PYTREE_NODES.get(node_type)
    if (
        handler is None
        and issubclass(node_type, tuple)
        and hasattr(node_type, "_fields")
    ):
        register_pytree_node(
            node_type, lambda t: (tuple(t), None), lambda _, kids: node_type(*kids)
        )
        handler = PYTREE_NODES[node_type]
    return handler


register_pytree_node(list, lambda xs: (xs, None), lambda _, kids: list(kids))
register_pytree_node(
    dict,
    lambda d: ([d[k] for k in sorted(d)], tuple(sorted(d))),
    lambda keys, kids: dict(zip(keys, kids)),
)
register_pytree_node(type(None), lambda _: ((), None), lambda _, kids: None)


def _treedef_str(self: PyTreeDef) -> str:
    if self.node_type is None:
        return "*"
    kids = [str(child) for child in self.children]
    if self.node_type is tuple:
        return "(" + ", ".join(kids) + ("," if len(kids) == 1 else "") + ")"
    if self.node_type is list:
        return "[" + ", ".join(kids) + "]"
    if self.node_type is dict:
        items = (f"{key!r}: {kid}" for key, kid in zip(self.aux, kids))
        return "{" + ", ".join(items) + "}"
    if self.node_type is type(None):
        return "None"
    return f"{self.node_type.__name__}({', '.join(kids)})"


PyTreeDef.__str__ = _treedef_str


def _check_leaf_count(treedef: PyTreeDef, leaves: Sequence[Any]) -> list[Any]:
    leaves = list(leaves)
    if len(leaves) != treedef.num_leaves:
        raise ValueError(
            f"tree_unflatten: structure {treedef} has {treedef.num_leaves} "
            f"leaves, got {len(leaves)}"
        )
    return leaves


# @title Tree utilities: tree_leaves, tree_structure, tree_map
def tree_leaves(tree: Any) -> list[Any]:
    return tree_flatten(tree)[0]


def tree_structure(tree: Any) -> PyTreeDef:
    return tree_flatten(tree)[1]


def tree_map(f: Callable, tree: Any, *rest: Any) -> Any:
    """``f`` applied leaf by leaf; ``rest`` are trees of the same structure."""
    leaves, treedef = tree_flatten(tree)
    others = [tree_flatten(r) for r in rest]
    for _, other_def in others:
        if other_def != treedef:
            raise ValueError(f"tree_map: structures differ, {treedef} and {other_def}")
    columns = zip(leaves, *(other for other, _ in others))
    return tree_unflatten(treedef, [f(*xs) for xs in columns])


class flatten_fun:
    """``f(*args)`` as a function of the leaves of ``args``; sets ``out_tree``."""

    def __init__(self, f: Callable, in_tree: PyTreeDef) -> None:
        self.f, self.in_tree = f, in_tree
        self.out_tree: PyTreeDef | None = None

    def __call__(self, *leaves: Any) -> list[Any]:
        args = tree_unflatten(self.in_tree, leaves)
        out_leaves, self.out_tree = tree_flatten(self.f(*args))
        return out_leaves


def jvp(f: Callable, primals: tuple, tangents: tuple) -> tuple[Any, Any]:
    """Evaluate ``f(*primals)`` and its derivative in the direction ``tangents``."""
    primals_flat, tangents_flat, in_tree = _flatten_jvp_args(primals, tangents)
    flat_f = flatten_fun(f, in_tree)
    primals_out, tangents_out = jvp_flat(flat_f, primals_flat, tangents_flat)
    out_tree = flat_f.out_tree
    return tree_unflatten(out_tree, primals_out), tree_unflatten(out_tree, tangents_out)


# @title Checks: primals and tangents must match
def _flatten_jvp_args(primals: Any, tangents: Any) -> tuple[list, list, PyTreeDef]:
    """Flatten ``jvp``'s primals and tangents, checking that they match."""
    if not isinstance(primals, (tuple, list)) or not isinstance(
        tangents, (tuple, list)
    ):
        raise TypeError(
            "jvp: primals and tangents must be tuples with one entry per "
            f"argument of f, got {type(primals).__name__} and "
            f"{type(tangents).__name__}"
        )
    primals_flat, in_tree = tree_flatten(tuple(primals))
    tangents_flat, tangent_tree = tree_flatten(tuple(tangents))
    if in_tree != tangent_tree:
        raise TypeError(
            "jvp: primals and tangents must have the same structure, got "
            f"{in_tree} and {tangent_tree}"
        )
    primals_flat = [_as_input(x, "jvp primal") for x in primals_flat]
    tangents_flat = [_as_input(x, "jvp tangent") for x in tangents_flat]
    _check_tangents("jvp", primals_flat, tangents_flat)
    return primals_flat, tangents_flat, in_tree


def _check_tangents(name: str, primals: list, tangents: list) -> None:
    for i, (p, t) in enumerate(zip(primals, tangents)):
        p_aval, t_aval = get_aval(p), get_aval(t)
        if p_aval.shape != t_aval.shape:
            raise ValueError(
                f"{name}: tangent {i} has shape {t_aval.shape} but its primal has "
                f"shape {p_aval.shape}; each tangent must match its primal"
            )
        if p_aval.dtype != t_aval.dtype:
            raise TypeError(
                f"{name}: tangent {i} has dtype {t_aval.dtype.name} but its primal "
                f"has dtype {p_aval.dtype.name}; each tangent must match its primal"
            )


BatchAxis = int | None


class BatchTracer(Tracer):
    """A batch of values stacked along ``batch_axis`` (None: not batched)."""

    def __init__(self, trace: BatchTrace, val: Any, batch_axis: BatchAxis) -> None:
        self._trace, self.val, self.batch_axis = trace, val, batch_axis

    @property
    def aval(self) -> ShapedArray:
        aval, ax = get_aval(self.val), self.batch_axis
        if ax is None:
            return aval
        return ShapedArray(aval.shape[:ax] + aval.shape[ax + 1 :], aval.dtype)

    def full_lower(self) -> Any:
        return full_lower(self.val) if self.batch_axis is None else self


class Axis(NamedTuple):
    """The axis a vmap maps over: its size, and an optional name."""

    size: int
    name: Hashable = None


class BatchTrace(Trace):
    """The batching interpreter; its level's payload is its ``Axis``."""

    def pure(self, val: Any) -> BatchTracer:
        return BatchTracer(self, val, None)

    lift = pure

    @property
    def axis(self) -> Axis:
        return self.level.payload

    def process_primitive(self, prim, tracers, params):
        vals = [t.val for t in tracers]
        dims = [t.batch_axis for t in tracers]
        outs, out_dims = prim.rule("vmap")(self.axis, vals, dims, **params)
        return [BatchTracer(self, x, d) for x, d in zip(outs, out_dims)]


# @title Checks: Python `if` on a batched value; how a BatchTracer prints
def _batch_tracer_bool(self: BatchTracer) -> bool:
    self.check_live()
    if self.batch_axis is None:
        return bool(self.val)
    raise _batched_bool_error()


def _batch_tracer_repr(self: BatchTracer) -> str:
    return f"BatchTracer(val={self.val!r}, batch_axis={self.batch_axis})"


BatchTracer.__bool__ = _batch_tracer_bool
BatchTracer.__repr__ = _batch_tracer_repr


def _batched_bool_error() -> ConcretizationError:
    return ConcretizationError(
        "vmap: Python `if`, `while` or bool() on a batched value: each "
        "example of the batch may need a different branch, but Python can "
        "take only one. Compute both branches and choose elementwise "
        "instead (a select primitive, or cond in Part 5)."
    )


def move_batch_axis(axis_size: int, src: BatchAxis, dst: BatchAxis, x: Any) -> Any:
    """Put the batch axis of ``x`` at position ``dst``."""
    if src == dst:
        return x
    if src is None:
        shape = list(get_aval(x).shape)
        shape.insert(dst, axis_size)
        return broadcast(x, shape, (dst,))
    perm = list(range(get_aval(x).ndim))
    perm.remove(src)
    perm.insert(dst, src)
    return transpose(x, perm)


def _unary_vmap(prim: Primitive) -> None:
    @prim.def_rule("vmap")
    def rule(axis, vals, dims):
        (x,), (ax,) = vals, dims
        return [bind(prim, x)], [ax]


def _binary_vmap(prim: Primitive) -> None:
    @prim.def_rule("vmap")
    def rule(axis, vals, dims):
        (x, y), (ax, ay) = vals, dims
        out_axis = ay if ax is None else ax
        x = move_batch_axis(axis.size, ax, out_axis, x)
        y = move_batch_axis(axis.size, ay, out_axis, y)
        return [bind(prim, x, y)], [out_axis]


for _prim in [neg_p, sin_p, cos_p]:
    _unary_vmap(_prim)
for _prim in [add_p, mul_p, gt_p, lt_p]:
    _binary_vmap(_prim)


@reduce_sum_p.def_rule("vmap")
def _reduce_sum_vmap(axis, vals, dims, *, axes):
    (x,), (bdim,) = vals, dims
    full_axes = tuple(a if a < bdim else a + 1 for a in axes)
    out_bdim = bdim - sum(1 for a in axes if a < bdim)
    return [bind(reduce_sum_p, x, axes=full_axes)], [out_bdim]


# @title The batching rules of transpose and broadcast
@transpose_p.def_rule("vmap")
def _transpose_vmap(axis, vals, dims, *, perm):
    (x,), (bdim,) = vals, dims
    front = move_batch_axis(axis.size, bdim, 0, x)
    full_perm = (0,) + tuple(p + 1 for p in perm)
    return [bind(transpose_p, front, perm=full_perm)], [0]


@broadcast_p.def_rule("vmap")
def _broadcast_vmap(axis, vals, dims, *, shape, axes):
    (x,), (bdim,) = vals, dims
    front = move_batch_axis(axis.size, bdim, 0, x)
    full_shape = (axis.size, *shape)
    full_axes = tuple(a + 1 for a in axes)
    return [bind(broadcast_p, front, shape=full_shape, axes=full_axes)], [0]


def vmap_flat(f, axis: Axis, in_axes, args, out_axes=0):
    """Batch ``f`` (flat lists in and out) over ``axis``; ``in_axes`` are checked."""
    with new_level(BatchTrace, axis) as level:
        trace = BatchTrace(level)
        tracers_in = [
            x if ax is None else BatchTracer(trace, x, ax)
            for x, ax in zip(args, in_axes)
        ]
        outs = _check_outputs("vmap", f(*tracers_in))
        tracers_out = [trace.full_raise(out) for out in outs]
    return [
        # _out_axis: output i's entry of out_axes, non-negative (range-checked)
        move_batch_axis(axis.size, t.batch_axis, _out_axis(out_axes, i, t), t.val)
        for i, t in enumerate(tracers_out)
    ]


# @title vmap: pytrees, in_axes and out_axes, keyword arguments, and the checks
def vmap(
    f: Callable, in_axes: Any = 0, out_axes: Any = 0, axis_name: Hashable = None
) -> Callable:
    """Vectorize ``f`` over the batch axes ``in_axes`` of its arguments; the
    batch axis of each output goes to its position in ``out_axes`` (a pytree
    prefix of the output, as ``in_axes`` is of the arguments)."""
    _check_out_axes(out_axes)

    def batched_f(*args: Any, **kwargs: Any) -> Any:
        args_flat, axes_flat, in_tree = _flatten_vmap_args(in_axes, args, kwargs)
        (size,) = {  # all batched inputs share one size: checked above
            get_aval(x).shape[a] for x, a in zip(args_flat, axes_flat) if a is not None
        }
        flat_f = flatten_fun(_kwargs_last(f, kwargs), in_tree)
        out_axes_flat = OutAxes(out_axes, flat_f)  # one per output leaf, once f ran
        outs = vmap_flat(
            flat_f, Axis(size, axis_name), axes_flat, args_flat, out_axes_flat
        )
        return tree_unflatten(flat_f.out_tree, outs)

    return batched_f


def _flatten_vmap_args(
    in_axes: Any, args: tuple, kwargs: dict | None = None
) -> tuple[list, list, PyTreeDef]:
    """Flatten ``args`` and ``in_axes`` to one checked batch axis per leaf.
    Keyword arguments come last, as one dict, batched along axis 0 whatever
    ``in_axes`` says (JAX's rule: ``in_axes`` covers positional arguments)."""
    axes_spec = tuple(in_axes) if isinstance(in_axes, list) else in_axes
    if not (axes_spec is None or _is_axis(axes_spec) or type(axes_spec) is tuple):
        raise TypeError(  # JAX's rule too: a namedtuple or dict is no list of arguments
            "vmap: in_axes must be an int, None, or a tuple with one entry per "
            f"positional argument, got {in_axes!r}"
        )
    if isinstance(axes_spec, tuple) and len(axes_spec) != len(args):
        raise ValueError(
            f"vmap: in_axes has {len(axes_spec)} entries but the function "
            f"was called with {len(args)} positional arguments"
        )
    axes_flat = _broadcast_prefix(axes_spec, args, "")
    if kwargs:
        args = (*args, kwargs)
        axes_flat = [*axes_flat, *[0] * len(tree_flatten(kwargs)[0])]
    args_flat, in_tree = tree_flatten(args)
    args_flat = [
        _unbatched_input(x) if ax is None else _as_input(x, "vmap argument")
        for x, ax in zip(args_flat, axes_flat)
    ]
    return args_flat, _check_batch_axes(args_flat, axes_flat), in_tree


def _kwargs_last(f: Callable, kwargs: dict) -> Callable:
    """``f``, taking its keyword arguments as one last positional dict when
    there are any (as ``_flatten_vmap_args`` passes them)."""
    if not kwargs:
        return f
    return lambda *args: f(*args[:-1], **args[-1])


def _unbatched_input(x: Any) -> Any:
    """An argument with in_axes None: an array if it is one, else untouched."""
    try:
        return _as_input(x, "vmap argument")
    except TypeError:
        return x  # a function, a string, any Python object: f gets it as it is


def _check_out_axes(out_axes: Any) -> None:
    for leaf in tree_flatten(out_axes)[0]:
        if not _is_axis(leaf):
            raise TypeError(
                "vmap: out_axes must be an int, None or a container of those, "
                f"got {out_axes!r}"
            )


class OutAxes:
    """vmap's ``out_axes``, one entry per output leaf, read once ``flat_f``
    has run (the output's structure is known only then)."""

    def __init__(self, out_axes: Any, flat_f: Callable) -> None:
        self.out_axes, self.flat_f, self.flat = out_axes, flat_f, None

    def __getitem__(self, i: int) -> BatchAxis:
        if self.flat is None:
            tree = self.flat_f.out_tree
            outs = tree_unflatten(tree, [0] * tree.num_leaves)
            self.flat = _broadcast_prefix(self.out_axes, outs, "", "out_axes")
        return self.flat[i]


def _out_axis(out_axes: Any, i: int, tracer: BatchTracer) -> BatchAxis:
    """Output ``i``'s entry of ``out_axes`` as a non-negative axis of the
    batched output (None only for an output that is not batched)."""
    out_axis = out_axes[i] if isinstance(out_axes, OutAxes) else out_axes
    if out_axis is None:
        if tracer.batch_axis is not None:
            raise ValueError(
                f"vmap: out_axes is None for output leaf {i}, but that output "
                "depends on the batched inputs; give it an int axis"
            )
        return None
    ndim = get_aval(tracer.val).ndim + (tracer.batch_axis is None)
    if not -ndim <= out_axis < ndim:
        raise ValueError(
            f"vmap: out_axes {out_axis} is out of range for an output of "
            f"rank {ndim} (including the batch axis)"
        )
    return out_axis % ndim


def _broadcast_prefix(
    prefix: Any, tree: Any, where: str, name: str = "in_axes"
) -> list[BatchAxis]:
    """One entry of ``prefix`` per leaf of ``tree``; an int or None covers a
    whole subtree, a container must match the tree's structure."""
    if prefix is None or _is_axis(prefix):
        return [prefix] * tree_flatten(tree)[1].num_leaves
    handler = node_handler(type(prefix))
    if handler is None:
        raise TypeError(
            f"vmap: {name}{where} must be an int, None or a container of those, "
            f"got {type(prefix).__name__} {_short_repr(prefix)}"
        )
    prefix_kids, prefix_aux = handler.to_children(prefix)
    tree_kids, tree_aux = (), None
    if type(tree) is type(prefix):
        tree_kids, tree_aux = handler.to_children(tree)
    if (
        type(prefix) is not type(tree)
        or prefix_aux != tree_aux
        or len(prefix_kids) != len(tree_kids)
    ):
        what = "argument" if name == "in_axes" else "output"
        raise ValueError(
            f"vmap: {name}{where} has structure {tree_flatten(prefix)[1]} but the "
            f"{what} it describes has structure {tree_flatten(tree)[1]}"
        )
    out: list[BatchAxis] = []
    for i, (p, t) in enumerate(zip(prefix_kids, tree_kids)):
        key = repr(prefix_aux[i]) if isinstance(prefix, dict) else str(i)
        out.extend(_broadcast_prefix(p, t, f"{where}[{key}]", name))
    return out


def _is_axis(x: Any) -> bool:
    return isinstance(x, (int, np.integer)) and not isinstance(x, bool)


def _check_batch_axes(args: list, axes: list[BatchAxis]) -> list[BatchAxis]:
    """Normalize negative axes; check ranges and that batch sizes agree."""
    checked: list[BatchAxis] = []
    sizes: dict[int, list[int]] = {}
    for i, (x, ax) in enumerate(zip(args, axes)):
        if ax is None:
            checked.append(None)
            continue
        shape = get_aval(x).shape
        if not -len(shape) <= ax < len(shape):
            raise ValueError(
                f"vmap: in_axes {ax} is out of range for argument leaf {i} of "
                f"shape {shape} (rank {len(shape)})"
            )
        ax = int(ax) % len(shape)
        checked.append(ax)
        sizes.setdefault(shape[ax], []).append(i)
    if not sizes:
        raise ValueError(
            "vmap: every in_axes entry is None, so there is no batch axis to map over"
        )
    if len(sizes) > 1:
        detail = "; ".join(
            f"size {size} for argument leaves {leaves}"
            for size, leaves in sizes.items()
        )
        raise ValueError(f"vmap: inconsistent batch sizes: {detail}")
    return checked


def jacfwd(f: Callable, argnums=0) -> Callable:
    """Curried: ``jacfwd(f)(x)`` has shape ``f(x).shape + x.shape``."""
    return jacobian_per_leaf(jacfwd_at, f, argnums)


def jacfwd_at(f: Callable, x: Any) -> Any:
    x = _check_jacfwd_input(x)
    aval = get_aval(x)

    def column(tangent):
        return _single_output(jvp(f, (x,), (tangent,))[1])

    jac = map_over_basis(column, aval)  # input axes first, then output axes
    n_in, n_out = aval.ndim, get_aval(jac).ndim - aval.ndim
    perm = (*range(n_in, n_in + n_out), *range(n_in))
    return transpose(jac, perm) if perm else jac


def map_over_basis(fn: Callable, aval: ShapedArray) -> Any:
    for _ in range(aval.ndim):
        fn = vmap(fn, 0)
    return fn(np.eye(aval.size, dtype=aval.dtype).reshape(aval.shape * 2))


# @title Checks and pytrees: argnums, one Jacobian per input and output leaf
def _check_argnums(argnums: Any, nargs: int, name: str) -> tuple[int, ...]:
    nums = argnums if isinstance(argnums, tuple) else (argnums,)
    if not nums or not all(
        isinstance(i, int) and not isinstance(i, bool) for i in nums
    ):
        raise TypeError(
            f"{name}: argnums must be an int or a non-empty tuple of ints, "
            f"got {argnums!r}"
        )
    for i in nums:
        if not -nargs <= i < nargs:
            raise ValueError(
                f"{name}: argnums {i} is out of range for a call with "
                f"{nargs} positional argument(s)"
            )
    return tuple(i % nargs for i in nums)


def jacobian_per_leaf(jac_at: Callable, f: Callable, argnums: Any) -> Callable:
    """The Jacobian function in JAX's pytree layout from a one-array Jacobian
    ``jac_at(g, x)``: the output's structure, each leaf holding the chosen
    arguments' structure. Keyword arguments pass through to ``f`` (not
    differentiated), as in JAX."""
    name = jac_at.__name__.removesuffix("_at")
    return lambda *args, **kwargs: _jacobian_per_leaf(
        jac_at, lambda *a: f(*a, **kwargs), args, argnums, name
    )


def _jacobian_per_leaf(jac_at, f, args, argnums, name):
    nums = _check_argnums(argnums, len(args), name)
    for i in nums:
        for leaf in tree_flatten(args[i])[0]:
            if get_aval(_as_input(leaf, name)).dtype.kind != "f":
                raise TypeError(
                    f"{name}: the input must be a float array, got "
                    f"{get_aval(leaf).str_short()}"
                )
    out_leaves, out_tree = tree_flatten(f(*args))

    def jac_of(k, i, j):
        def g(leaf):
            arg_leaves, arg_tree = tree_flatten(args[i])
            arg_leaves[j] = leaf
            new_args = list(args)
            new_args[i] = tree_unflatten(arg_tree, arg_leaves)
            return _single_output(tree_flatten(f(*new_args))[0][k])

        return jac_at(g, tree_flatten(args[i])[0][j])

    def per_output(k):
        jacs = []
        for i in nums:
            leaves, tree = tree_flatten(args[i])
            jacs.append(
                tree_unflatten(tree, [jac_of(k, i, j) for j in range(len(leaves))])
            )
        return tuple(jacs) if isinstance(argnums, tuple) else jacs[0]

    return tree_unflatten(out_tree, [per_output(k) for k in range(len(out_leaves))])


def _check_jacfwd_input(x: Any) -> Any:
    x = _as_input(x, "jacfwd")
    if get_aval(x).dtype.kind != "f":
        raise TypeError(
            f"jacfwd: the input must be a float array, got {get_aval(x).str_short()}"
        )
    return x


def _single_output(out: Any) -> Any:
    if isinstance(out, (tuple, list, dict)):
        raise TypeError("jacfwd: f must return a single array")
    return out


# ==== chapter: part2_jaxprs ====


class Var:
    """A jaxpr variable: a placeholder for an array of type ``aval``."""

    __slots__ = ("aval",)

    def __init__(self, aval: ShapedArray) -> None:
        self.aval = aval


class Lit:
    """A literal: a scalar constant written into an equation."""

    __slots__ = ("val", "aval")

    def __init__(self, val: Any) -> None:
        self.val = as_array(val, "Lit")
        self.aval = get_aval(self.val)


Atom = Var | Lit


class JaxprEqn(NamedTuple):
    """One equation: ``out_binders = primitive[params] inputs``."""

    primitive: Primitive
    inputs: list[Atom]
    params: dict[str, Any]
    out_binders: list[Var]


class Jaxpr:
    """A function in the jaxpr language."""

    def __init__(self, in_binders: list[Var], eqns: list[JaxprEqn], outs: list[Atom]):
        self.in_binders = in_binders
        self.eqns = eqns
        self.outs = outs

    def __str__(self) -> str:
        return pp_jaxpr(self)


class JaxprType(NamedTuple):
    """The type of a jaxpr: the types of its inputs and of its outputs."""

    in_types: list[ShapedArray]
    out_types: list[ShapedArray]


# @title How a jaxpr type prints, (float64[3]) -> (float64[3]); a Jaxpr's repr
def _jaxpr_type_str(self: JaxprType) -> str:
    ins = ", ".join(t.str_short() for t in self.in_types)
    outs = ", ".join(t.str_short() for t in self.out_types)
    return f"({ins}) -> ({outs})"


JaxprType.__str__ = _jaxpr_type_str
Jaxpr.__repr__ = lambda self: f"<Jaxpr with {len(self.eqns)} equations>\n{self}"


# @title The printer: names a, b, ..., binders with types, nested jaxprs indented
class _Names:
    """Hands out printable names for variables, in order of first request."""

    def __init__(self) -> None:
        self.names: dict[Var, str] = {}

    def __call__(self, atom: Atom) -> str:
        if isinstance(atom, Lit):
            return repr(atom.val.item())
        if atom not in self.names:
            self.names[atom] = _letters(len(self.names))  # a, ..., z, aa, ab, ...
        return self.names[atom]

    def binder(self, var: Var) -> str:
        return f"{self(var)}:{var.aval.str_short()}"


def pp_jaxpr(jaxpr: Jaxpr, indent: int = 0, names: _Names | None = None) -> str:
    """Render a jaxpr as text; nested jaxprs in params are indented."""
    names = names or _Names()
    pad = " " * indent
    binders = "".join(names.binder(v) + " " for v in jaxpr.in_binders)
    lines = [f"{pad}{{ lambda {binders}. let"]
    for eqn in jaxpr.eqns:
        outs = " ".join(names.binder(v) for v in eqn.out_binders)
        params, nested = _pp_params(eqn.params, indent + 6, names)
        args = " ".join(names(x) for x in eqn.inputs)
        lines.append(f"{pad}    {outs} = {eqn.primitive.name}{params} {args}".rstrip())
        lines.extend(nested)
    outs = " ".join(names(x) for x in jaxpr.outs)
    lines.append(f"{pad}  in ( {outs} ) }}")
    return "\n".join(lines)


# @title The printer's helpers: names a, ..., z, aa, ...; params; nested jaxprs
def _letters(n: int) -> str:
    """0 -> 'a', 25 -> 'z', 26 -> 'aa', 27 -> 'ab', ..."""
    name = ""
    n += 1
    while n:
        n, rest = divmod(n - 1, 26)
        name = chr(ord("a") + rest) + name
    return name


def _pp_params(params: dict, indent: int, names: _Names) -> tuple[str, list[str]]:
    """Params inline as ``[k=v ...]``; nested jaxprs on lines of their own."""
    inline, nested = [], []
    for key, value in sorted(params.items()):
        if isinstance(value, Jaxpr):
            value = "<jaxpr>"
            nested += [
                " " * indent + f"{key} =",
                pp_jaxpr(params[key], indent + 2, names),
            ]
        inline.append(f"{key}={value}")
    return (f"[{' '.join(inline)}]" if inline else ""), nested


def _unary_abstract_eval(prim, kinds, expected):
    @prim.def_rule("abstract_eval")
    def rule(x):
        _check_aval_kind(prim.name, x, kinds, expected)
        return [ShapedArray(x.shape, x.dtype)]


def _binary_abstract_eval(prim, out_dtype=None):
    @prim.def_rule("abstract_eval")
    def rule(x, y):
        check_binary_operands(prim.name, x, y)
        return [ShapedArray(x.shape, out_dtype or x.dtype)]


_unary_abstract_eval(neg_p, "iuf", "a numeric (not boolean)")
_unary_abstract_eval(sin_p, "f", "a float")
_unary_abstract_eval(cos_p, "f", "a float")
_binary_abstract_eval(add_p)
_binary_abstract_eval(mul_p)
_binary_abstract_eval(gt_p, out_dtype=np.bool_)
_binary_abstract_eval(lt_p, out_dtype=np.bool_)


@reduce_sum_p.def_rule("abstract_eval")
def _reduce_sum_abstract_eval(x, *, axes):
    _check_canonical_axes("reduce_sum", "axes", axes, x.ndim)
    shape = [d for i, d in enumerate(x.shape) if i not in axes]
    return [ShapedArray(shape, x.dtype)]


@transpose_p.def_rule("abstract_eval")
def _transpose_abstract_eval(x, *, perm):
    _check_perm_param(perm, x.ndim)
    return [ShapedArray([x.shape[p] for p in perm], x.dtype)]


@broadcast_p.def_rule("abstract_eval")
def _broadcast_abstract_eval(x, *, shape, axes):
    _check_broadcast_params(x, shape, axes)
    return [ShapedArray(shape, x.dtype)]


# @title Checks: the inputs and params of the abstract evaluation rules
def _check_aval_kind(name: str, x: ShapedArray, kinds: str, expected: str) -> None:
    if x.dtype.kind not in kinds:
        raise TypeError(f"{name}: expected {expected} array, got {x.str_short()}")


def _check_canonical_axes(name: str, param: str, axes: Any, ndim: int) -> None:
    """Params must be in the form the wrappers produce: a tuple of distinct
    non-negative ints below ``ndim``."""
    if not isinstance(axes, tuple):
        raise TypeError(f"{name}: param {param} must be a tuple, got {axes!r}")
    for a in axes:
        if not _is_axis(a):
            raise TypeError(f"{name}: axes must be integers, got {a!r} in {param}")
        if not 0 <= a < ndim:
            raise ValueError(
                f"{name}: axis {a} is out of range for an array of rank {ndim} "
                f"(param {param} must hold axes 0..{ndim - 1})"
            )
    if len(set(axes)) != len(axes):
        raise ValueError(f"{name}: repeated axis in param {param}={axes}")


def _check_perm_param(perm: Any, ndim: int) -> None:
    _check_canonical_axes("transpose", "perm", perm, ndim)
    if sorted(perm) != list(range(ndim)):
        raise ValueError(
            f"transpose: perm must be a permutation of the {ndim} axes of "
            f"the input, got {perm}"
        )


def _check_broadcast_params(x: ShapedArray, shape: Any, axes: Any) -> None:
    if not isinstance(shape, tuple):
        raise TypeError(
            f"broadcast: shape must be a sequence of integers in a tuple, got {shape!r}"
        )
    _check_shape("broadcast", shape)
    _check_canonical_axes("broadcast", "axes", axes, len(shape))
    if list(axes) != sorted(axes):
        raise ValueError(f"broadcast: param axes={axes!r} must be sorted")
    kept = tuple(d for i, d in enumerate(shape) if i not in axes)
    if kept != x.shape:
        raise ValueError(
            f"broadcast: cannot broadcast {x.str_short()} to shape {shape} by "
            f"inserting axes {axes}"
        )


class JaxprTypeError(TypeError):
    """A jaxpr is not well formed or not well typed."""


def typecheck_jaxpr(jaxpr: Jaxpr) -> JaxprType:
    """Check a jaxpr and return its type; raise JaxprTypeError if it is bad."""
    bound: set[Var] = set()
    for v in jaxpr.in_binders:
        _check_fresh(jaxpr, v, bound, "input binders")
        bound.add(v)
    for i, eqn in enumerate(jaxpr.eqns):
        where = f"equation {i} ({eqn.primitive.name})"
        _check_bound(jaxpr, eqn.inputs, bound, where)
        in_types = [x.aval for x in eqn.inputs]
        with _as_jaxpr_type_error(where):
            out_types = eqn.primitive.rule("abstract_eval")(*in_types, **eqn.params)
        _check_declared_types(jaxpr, eqn, out_types, where)
        for v in eqn.out_binders:
            _check_fresh(jaxpr, v, bound, where)
            bound.add(v)
    _check_bound(jaxpr, jaxpr.outs, bound, "outputs")
    return JaxprType([v.aval for v in jaxpr.in_binders], [x.aval for x in jaxpr.outs])


# @title Checks: the type checker's errors, naming variables as the printer does
def _name_of(jaxpr: Jaxpr, v: Var) -> str:
    """The name the printer gives ``v`` in ``jaxpr``."""
    names = _Names()
    for binder in jaxpr.in_binders:
        names(binder)
    for eqn in jaxpr.eqns:
        for binder in eqn.out_binders:
            names(binder)
    return names(v)


def _check_is_binder(v: Any, where: str) -> None:
    if not isinstance(v, Var):
        raise JaxprTypeError(f"{where}: a binder must be a Var, got {v!r}")


def _check_fresh(jaxpr: Jaxpr, v: Any, bound: set[Var], where: str) -> None:
    _check_is_binder(v, where)
    if v in bound:
        raise JaxprTypeError(f"{where}: variable {_name_of(jaxpr, v)} is bound twice")


def _check_bound(jaxpr: Jaxpr, atoms: list, bound: set[Var], where: str) -> None:
    for x in atoms:
        if not isinstance(x, (Var, Lit)):
            raise JaxprTypeError(f"{where}: expected a Var or Lit, got {x!r}")
        if isinstance(x, Var) and x not in bound:
            raise JaxprTypeError(f"{where}: variable {_name_of(jaxpr, x)} is not bound")


@contextmanager
def _as_jaxpr_type_error(where: str) -> Iterator[None]:
    """An abstract evaluation rule's error, reported as a JaxprTypeError."""
    try:
        yield
    except (TypeError, ValueError) as err:
        raise JaxprTypeError(f"{where}: {err}") from err


def _check_declared_types(jaxpr: Jaxpr, eqn: JaxprEqn, out_types: list, where: str):
    if len(out_types) != len(eqn.out_binders):
        raise JaxprTypeError(
            f"{where}: the primitive has {len(out_types)} outputs but the "
            f"equation binds {len(eqn.out_binders)}"
        )
    for v, expected in zip(eqn.out_binders, out_types):
        _check_is_binder(v, where)
        if v.aval != expected:
            raise JaxprTypeError(
                f"{where}: output {_name_of(jaxpr, v)} is declared "
                f"{v.aval.str_short()} but the primitive produces "
                f"{expected.str_short()}"
            )


def eval_jaxpr(jaxpr: Jaxpr, args: Sequence[Any]) -> list[Any]:
    """Run ``jaxpr`` on ``args`` by binding each equation's primitive."""
    _check_jaxpr_args(jaxpr, args)
    env: dict[Var, Any] = dict(zip(jaxpr.in_binders, args))

    def read(atom: Atom) -> Any:
        return atom.val if isinstance(atom, Lit) else env[atom]

    for eqn in jaxpr.eqns:
        outs = bind(eqn.primitive, *[read(x) for x in eqn.inputs], **eqn.params)
        if not eqn.primitive.multiple_results:
            outs = [outs]
        env.update(zip(eqn.out_binders, outs))
    return [read(x) for x in jaxpr.outs]


def jaxpr_as_fun(jaxpr: Jaxpr) -> Callable[..., list[Any]]:
    """The jaxpr as a Python function from arrays to a list of arrays."""
    return lambda *args: eval_jaxpr(jaxpr, args)


# @title Checks: eval_jaxpr's arguments must match the jaxpr's inputs
def _check_jaxpr_args(jaxpr: Jaxpr, args: Sequence[Any]) -> None:
    if len(args) != len(jaxpr.in_binders):
        raise TypeError(
            f"eval_jaxpr: the jaxpr takes {len(jaxpr.in_binders)} inputs, got "
            f"{len(args)}"
        )
    for i, (v, arg) in enumerate(zip(jaxpr.in_binders, args)):
        arg_type = get_aval(_as_input(arg, "eval_jaxpr"))
        if (arg_type.shape, arg_type.dtype) != (v.aval.shape, v.aval.dtype):
            what = "shape" if arg_type.shape != v.aval.shape else "dtype"
            raise TypeError(
                f"eval_jaxpr: input {i} has the wrong {what}: the jaxpr expects "
                f"{v.aval.str_short()}, got {arg_type.str_short()}"
            )


class JaxprTracer(Tracer):
    """A value being recorded into a jaxpr: only its type is known."""

    def __init__(self, trace: JaxprTrace, aval: ShapedArray) -> None:
        self._trace, self._aval = trace, aval

    @property
    def aval(self) -> ShapedArray:
        return self._aval


class JaxprBuilder:
    """Everything one tracing run records, until it becomes a jaxpr."""

    def __init__(self) -> None:
        self.eqns: list[JaxprEqn] = []
        self.tracer_to_atom: dict[int, Atom] = {}  # by id: tracers are unhashable
        self.consts: dict[int, tuple[JaxprTracer, Any]] = {}  # by id of the value

    def new_tracer(self, trace, aval, atom=None):
        tracer = JaxprTracer(trace, aval)
        self.tracer_to_atom[id(tracer)] = atom or Var(aval)
        return tracer

    def const_tracer(self, trace, val):
        """The tracer standing for a constant; one per distinct object."""
        if id(val) not in self.consts:
            literal = Lit(val) if _is_literal(val) else None
            self.consts[id(val)] = (self.new_tracer(trace, get_aval(val), literal), val)
        return self.consts[id(val)][0]

    def atom(self, tracer):
        return self.tracer_to_atom[id(tracer)]

    def add_eqn(self, prim, ins, params, outs):
        atom = self.atom
        eqn = JaxprEqn(prim, [atom(t) for t in ins], params, [atom(t) for t in outs])
        self.eqns.append(eqn)

    def build(self, ins, outs):
        """The jaxpr and its constants, which come first among its inputs."""
        atom = self.atom
        consts = [
            (t, val) for t, val in self.consts.values() if isinstance(atom(t), Var)
        ]
        in_binders = [atom(t) for t, _ in consts] + [atom(t) for t in ins]
        jaxpr = Jaxpr(in_binders, self.eqns, [atom(t) for t in outs])
        typecheck_jaxpr(jaxpr)
        return jaxpr, [val for _, val in consts]


def _is_literal(val: Any) -> bool:
    """Scalars (not tracers of an outer transformation) become literals."""
    return not isinstance(val, Tracer) and np.shape(val) == ()


class JaxprTrace(Trace):
    """The interpreter that records primitives into a jaxpr."""

    @property
    def builder(self) -> JaxprBuilder:
        return self.level.payload

    def new_arg(self, aval):
        return self.builder.new_tracer(self, aval)

    def pure(self, val):
        return self.builder.const_tracer(self, val)

    lift = pure

    def process_primitive(self, prim, tracers, params):
        avals_out = prim.rule("abstract_eval")(*[t.aval for t in tracers], **params)
        outs = [self.builder.new_tracer(self, aval) for aval in avals_out]
        self.builder.add_eqn(prim, tracers, params, outs)
        return outs


def _trace_to_jaxpr_v1(f, avals_in, who="make_jaxpr"):
    """Trace ``f``; ``who`` names the user-facing function in error messages."""
    avals, in_tree = _avals_for_tracing(avals_in, who)
    flat_f = flatten_fun(f, in_tree)
    builder = JaxprBuilder()
    with new_level(JaxprTrace, builder) as level:
        trace = JaxprTrace(level)
        tracers_in = [trace.new_arg(aval) for aval in avals]
        outs = flat_f(*tracers_in)
        outs = [_as_input(out, f"{who}: output of the function") for out in outs]
        jaxpr, consts = builder.build(tracers_in, [trace.full_raise(x) for x in outs])
    return jaxpr, consts, flat_f.out_tree


def make_jaxpr_v1(f: Callable, *avals_in: Any) -> tuple[Jaxpr, list, PyTreeDef]:
    """Trace ``f``, choosing interpreters by data dependence only."""
    return _trace_to_jaxpr_v1(f, avals_in)


# @title Checks: make_jaxpr's arguments are types, or arrays standing for them
def _avals_for_tracing(args: Any, who: str) -> tuple[list[ShapedArray], PyTreeDef]:
    """Flatten make_jaxpr's arguments; arrays stand for their types."""
    leaves, in_tree = tree_flatten(args)
    avals = [
        x if isinstance(x, ShapedArray) else get_aval(_as_input(x, who)) for x in leaves
    ]
    return avals, in_tree


class _InterpreterState(threading.local):
    """The interpreter stack and the dynamic level. Each thread gets its own."""

    def __init__(self) -> None:
        self.stack: list[Level] = [Level(0, EvalTrace, None)]
        self.dynamic: Level = self.stack[0]


_state = _InterpreterState()


@contextmanager
def new_dynamic(level: Level) -> Iterator[None]:
    """Make ``level`` the dynamic level while the block runs."""
    previous, _state.dynamic = _state.dynamic, level
    try:
        yield
    finally:
        _state.dynamic = previous


def _search_start() -> Level:
    """Where the search for the top trace starts: the dynamic level."""
    return _state.dynamic


# @title _trace_to_jaxpr: v1 with the dynamic level set around the call
def _trace_to_jaxpr(f, avals_in, who="make_jaxpr"):
    """Trace ``f``, recording operations on constants too (the dynamic level)."""
    avals, in_tree = _avals_for_tracing(avals_in, who)
    flat_f = flatten_fun(f, in_tree)
    builder = JaxprBuilder()
    with new_level(JaxprTrace, builder) as level:
        trace = JaxprTrace(level)
        tracers_in = [trace.new_arg(aval) for aval in avals]
        with new_dynamic(level):  # new
            outs = flat_f(*tracers_in)
        outs = [_as_input(out, f"{who}: output of the function") for out in outs]
        jaxpr, consts = builder.build(tracers_in, [trace.full_raise(x) for x in outs])
    return jaxpr, consts, flat_f.out_tree


def make_jaxpr(f: Callable, *avals_in: Any) -> tuple[Jaxpr, list, PyTreeDef]:
    """Trace ``f`` at the given types into ``(jaxpr, consts, out_tree)``."""
    return _trace_to_jaxpr(f, avals_in)


# @title JaxprTracer's concretization error, with what to do instead
def _jaxpr_tracer_bool(self: JaxprTracer) -> bool:
    self.check_live()
    raise ConcretizationError(
        f"Python `if`, `while` or bool() on a traced {self.aval.str_short()} "
        "value: while a function is staged out (make_jaxpr, jit) only its "
        "shape and dtype are known, not its value. Use cond (Part 5) to "
        "branch on a traced value, or pass the value as a Python constant."
    )


JaxprTracer.__bool__ = _jaxpr_tracer_bool

# ==== chapter: part3_jit ====

import functools

import jax  # before jaxlib: it quiets XLA's C++ info logs
import jax.extend.backend
from jaxlib.mlir import ir
from jaxlib.mlir.dialects import func as mlir_func
from jaxlib.mlir.dialects import stablehlo as hlo


def ir_element_type(dtype: np.dtype) -> ir.Type:
    dtype = np.dtype(dtype)
    check_xla_dtype(dtype)
    bits = dtype.itemsize * 8
    if dtype.kind == "b":
        return ir.IntegerType.get_signless(1)
    if dtype.kind == "f":
        return {16: ir.F16Type, 32: ir.F32Type, 64: ir.F64Type}[bits].get()
    if dtype.kind == "i":
        return ir.IntegerType.get_signless(bits)
    return ir.IntegerType.get_unsigned(bits)


def ir_type(aval: ShapedArray) -> ir.RankedTensorType:
    return ir.RankedTensorType.get(aval.shape, ir_element_type(aval.dtype))


def ir_constant(value: Any, aval: ShapedArray) -> ir.Value:
    """A StableHLO constant holding the scalar ``value`` at every position."""
    element = ir_element_type(aval.dtype)
    if aval.dtype.kind == "f":
        attr = ir.FloatAttr.get(element, float(value))
    else:
        attr = ir.IntegerAttr.get(element, int_bits(value))
    return hlo.constant(ir.DenseElementsAttr.get_splat(ir_type(aval), attr))


# @title The MLIR context; int_bits; checks: dtypes that XLA has no type for
def int_bits(value: Any) -> int:
    """``value`` as the int64 with the same 64 bits: MLIR's Python binding
    takes an int64, so a uint64 above 2**63 - 1 is passed as a negative one."""
    value = int(value)
    return value - 2**64 if value >= 2**63 else value


@functools.cache
def mlir_context() -> ir.Context:
    """One MLIR context with the dialects we use (func and stablehlo)."""
    from jaxlib.mlir._mlir_libs import _jax_mlir_ext

    registry = ir.DialectRegistry()
    _jax_mlir_ext.register_dialects(registry)
    context = ir.Context()
    context.append_dialect_registry(registry)
    context.load_all_available_dialects()
    hlo.register_dialect(context)
    return context


def check_xla_dtype(dtype: np.dtype, who: str = "jit") -> None:
    """Refuse a dtype that XLA has no type for (NumPy's float128, say)."""
    if dtype.kind not in "biuf" or dtype.itemsize > 8:
        raise TypeError(
            f"{who}: XLA has no type for dtype {dtype.name}; use booleans, "
            "integers of up to 64 bits, or float16/32/64"
        )


def _lower_with(prim: Primitive, make_op: Callable) -> None:
    @prim.def_rule("lower")
    def rule(ctx, avals_in, avals_out, *operands):
        return [make_op(*operands)]


_lower_with(add_p, hlo.add)
_lower_with(mul_p, hlo.multiply)
_lower_with(neg_p, hlo.negate)
_lower_with(sin_p, hlo.sine)
_lower_with(cos_p, hlo.cosine)


@transpose_p.def_rule("lower")
def _transpose_lower(ctx, avals_in, avals_out, x, *, perm):
    return [hlo.transpose(x, ir.DenseI64ArrayAttr.get(perm))]


@broadcast_p.def_rule("lower")
def _broadcast_lower(ctx, avals_in, avals_out, x, *, shape, axes):
    # StableHLO names where the operand's axes go, not where the new ones are.
    kept = [i for i in range(len(shape)) if i not in axes]
    out_type = ir_type(avals_out[0])
    return [hlo.broadcast_in_dim(out_type, x, ir.DenseI64ArrayAttr.get(kept))]


# @title Lowering rules for greater and less
def _lower_comparison(prim: Primitive, direction: str) -> None:
    @prim.def_rule("lower")
    def rule(ctx, avals_in, avals_out, x, y):
        kind = {"f": "FLOAT", "i": "SIGNED"}.get(avals_in[0].dtype.kind, "UNSIGNED")
        direction_attr = hlo.ComparisonDirectionAttr.get(direction)
        kind_attr = hlo.ComparisonTypeAttr.get(kind)
        return [hlo.compare(x, y, direction_attr, compare_type=kind_attr)]


_lower_comparison(gt_p, "GT")
_lower_comparison(lt_p, "LT")


@reduce_sum_p.def_rule("lower")
def _reduce_sum_lower(ctx, avals_in, avals_out, x, *, axes):
    (x_aval,), (out_aval,) = avals_in, avals_out
    scalar = ShapedArray((), x_aval.dtype)
    zero = ir_constant(0, scalar)
    reduce = hlo.ReduceOp(
        [ir_type(out_aval)], [x], [zero], ir.DenseI64ArrayAttr.get(axes)
    )
    body = reduce.regions[0].blocks.append(ir_type(scalar), ir_type(scalar))
    with ir.InsertionPoint(body):
        hlo.ReturnOp([hlo.add(*body.arguments)])
    return [reduce.result]


class LoweringContext:
    """The module being built, and the jaxprs already lowered into it."""

    def __init__(self) -> None:
        self.module = ir.Module.create()
        self.functions: dict[Jaxpr, str] = {}

    def function_for(self, jaxpr: Jaxpr) -> str:
        """The name of a function computing ``jaxpr`` (made once)."""
        if jaxpr not in self.functions:
            name = f"jaxpr_{len(self.functions)}"
            self.functions[jaxpr] = name
            lower_to_function(self, jaxpr, name, public=False)
        return self.functions[jaxpr]


def lower_to_function(
    ctx: LoweringContext, jaxpr: Jaxpr, name: str, public: bool
) -> mlir_func.FuncOp:
    in_types = [ir_type(v.aval) for v in jaxpr.in_binders]
    out_types = [ir_type(x.aval) for x in jaxpr.outs]
    with ir.InsertionPoint(ctx.module.body):
        function = mlir_func.FuncOp(name, ir.FunctionType.get(in_types, out_types))
    if not public:
        function.sym_visibility = ir.StringAttr.get("private")
    block = function.add_entry_block()
    env: dict[Var, ir.Value] = dict(zip(jaxpr.in_binders, block.arguments))

    def read(atom: Atom) -> ir.Value:
        if isinstance(atom, Lit):
            return ir_constant(atom.val, atom.aval)
        return env[atom]

    with ir.InsertionPoint(block):
        for eqn in jaxpr.eqns:
            rule = eqn.primitive.rule("lower")
            avals_in = [x.aval for x in eqn.inputs]
            avals_out = [v.aval for v in eqn.out_binders]
            operands = [read(x) for x in eqn.inputs]
            outs = rule(ctx, avals_in, avals_out, *operands, **eqn.params)
            env.update(zip(eqn.out_binders, outs))
        mlir_func.ReturnOp([read(x) for x in jaxpr.outs])
    return function


def lower_jaxpr(jaxpr: Jaxpr) -> ir.Module:
    """A StableHLO module whose public function ``main`` computes ``jaxpr``."""
    with mlir_context(), ir.Location.unknown():
        ctx = LoweringContext()
        lower_to_function(ctx, jaxpr, "main", public=True)
        ctx.module.operation.verify()
    return ctx.module


# @title XLA's CPU client: runtime, and device_put to copy an array to it
# device_put asks for the copy to be finished before it returns. Left to
# choose, jaxlib on CPU may let the buffer share the NumPy array's memory, and
# an Array would then change whenever the NumPy array is written to.
class _Runtime(NamedTuple):
    client: Any
    device: Any
    sharding: Any


@functools.cache
def runtime() -> _Runtime:
    """XLA's CPU client and its first device (created on first use)."""
    client = jax.extend.backend.get_backend("cpu")
    device = client.local_devices()[0]
    return _Runtime(client, device, jax.sharding.SingleDeviceSharding(device))


# Python functions that compiled programs call back (`debug.print`, in the
# chapter on interpreters that read programs); a module names one by position.
HOST_CALLBACKS: list[Callable] = []


def compile_with_host_callbacks(module_text: str, devices: Any) -> Any:
    """xla_compile for a module that calls back into Python."""
    from jax._src.lib import xla_client

    with mlir_context():  # jaxlib takes host callbacks with a parsed module only
        module = ir.Module.parse(module_text)
    return runtime().client.compile_and_load(
        module, devices, xla_client.CompileOptions(), host_callbacks=HOST_CALLBACKS
    )


def device_put(x: np.ndarray) -> Array:
    """Copy a NumPy array to the device."""
    from jaxlib import _jax

    x = np.asarray(x)
    rt = runtime()
    aval = jax.core.ShapedArray(x.shape, x.dtype)
    # Copy before returning: the buffer never shares the NumPy array's memory.
    copy_now = _jax.HostBufferSemantics.IMMUTABLE_ONLY_DURING_CALL
    buffer = _jax.batched_device_put(
        aval, rt.sharding, [x], [rt.device], True, False, copy_now, True
    )
    return Array(buffer)


def xla_compile(module_text: str) -> Any:
    """XLA's executable for a StableHLO module, on our one device."""
    from jax._src.lib import xla_client

    rt = runtime()
    devices = xla_client.DeviceList((rt.device,))
    if "python_cpu_callback" in module_text:  # debug.print: folded above
        return compile_with_host_callbacks(module_text, devices)
    return rt.client.compile_and_load(module_text, devices, xla_client.CompileOptions())


def xla_execute(executable: Any, buffers: list) -> list:
    """Run ``executable`` on device buffers; the buffers of its outputs."""
    results = executable.execute_sharded(buffers)
    per_output = results.disassemble_into_single_device_arrays()
    return [bufs[0] for bufs in per_output]


class Array(ArrayOperators):
    """An array in device memory: what jitted functions return."""

    def __init__(self, buffer: Any) -> None:
        self._buffer = buffer

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self._buffer.shape)

    @property
    def dtype(self) -> np.dtype:
        return np.dtype(self._buffer.dtype)

    @property
    def aval(self) -> ShapedArray:
        return ShapedArray(self.shape, self.dtype)

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        return np.asarray(self._buffer, dtype=dtype, copy=copy)


# let as_array (Part 1) accept Arrays as they are, without a copy
DEVICE_ARRAY_TYPES = (Array,)


def _as_buffer(x: Any) -> Any:
    """The device buffer for an argument of a compiled call."""
    if isinstance(x, Array):
        return x._buffer
    return device_put(x)._buffer


# @title Array: ndim, len, Python numbers, printing
def _array_len(self: Array) -> int:
    if not self.shape:
        raise TypeError("len() of a 0-d Array")
    return self.shape[0]


def _array_repr(self: Array) -> str:
    body = np.array2string(np.asarray(self), separator=", ", prefix="Array(")
    return f"Array({body}, dtype={self.dtype.name})"


Array.__array_priority__ = 100  # NumPy defers to our operators: np_array * Array
Array.ndim = property(lambda self: len(self.shape))
Array.__len__ = _array_len
Array.__bool__ = lambda self: bool(np.asarray(self))
Array.__float__ = lambda self: float(np.asarray(self))
Array.__int__ = lambda self: int(np.asarray(self))
Array.__str__ = lambda self: str(np.asarray(self))
Array.__repr__ = _array_repr


class CompiledJaxpr:
    """An XLA executable for one jaxpr."""

    def __init__(self, jaxpr: Jaxpr) -> None:
        self.module_text = str(lower_jaxpr(jaxpr))
        self.executable = xla_compile(self.module_text)

    def __call__(self, *args: Any) -> list[Array]:
        buffers = [_as_buffer(x) for x in args]
        return [Array(b) for b in xla_execute(self.executable, buffers)]


_compiled: dict[Jaxpr, CompiledJaxpr] = {}


def compile_jaxpr(jaxpr: Jaxpr) -> CompiledJaxpr:
    """The executable for ``jaxpr``, compiled on first request."""
    if jaxpr not in _compiled:
        _compiled[jaxpr] = CompiledJaxpr(jaxpr)
    return _compiled[jaxpr]


xla_call_p = Primitive("xla_call", multiple_results=True)


@xla_call_p.def_rule("impl")
def _xla_call_impl(*args, jaxpr):
    check_call_types(jaxpr, args)
    return compile_jaxpr(jaxpr)(*args)


Traces = dict[tuple, tuple[Jaxpr, list[Any], PyTreeDef]]


def trace_for_call(f, traces: Traces, args_flat: list, in_tree: PyTreeDef):
    """``f``'s jaxpr, constants and output tree for arguments of these types."""
    avals = tuple(ShapedArray(x.shape, x.dtype) for x in args_flat)
    key = (in_tree, avals)
    if key not in traces:
        args = tree_unflatten(in_tree, avals)
        jaxpr, consts, out_tree = _trace_to_jaxpr(f, args, who="jit")
        if any(isinstance(c, Tracer) for c in consts):  # f closes over a tracer
            return jaxpr, consts, out_tree  # of an outer transformation: no cache
        traces[key] = (jaxpr, [device_put(c) for c in consts], out_tree)
    return traces[key]


def jit(f: Callable, static_argnums=(), static_argnames=()) -> Callable:
    """Compile ``f`` with XLA; trace once per input signature, which includes
    the values of the static arguments; keyword arguments are traced too."""
    traces: Traces = {}
    call_f = StaticArgs(f, static_argnums, static_argnames)  # call_f(args, kwargs)

    @functools.wraps(f)
    def f_jitted(*args: Any, **kwargs: Any) -> Any:
        args_flat, in_tree = tree_flatten(call_f.mark_static(args, kwargs))
        args_flat = [_as_input(x, "jit argument") for x in args_flat]  # arrays
        jaxpr, consts, out_tree = trace_for_call(call_f, traces, args_flat, in_tree)
        outs = bind(xla_call_p, *consts, *args_flat, jaxpr=jaxpr)
        return tree_unflatten(out_tree, outs)

    f_jitted.traces = traces  # for the curious: what has been traced so far
    return f_jitted


# @title Static and keyword arguments: jit's signature is (args, kwargs)
import inspect


class Static:
    """A static argument: a pytree node with no leaves whose structure is
    its value, so the value is part of the signature and is never traced."""

    def __init__(self, value: Any) -> None:
        self.value = value


register_pytree_node(Static, lambda s: ((), s.value), lambda value, _: Static(value))


def _unmark(x: Any) -> Any:
    return x.value if isinstance(x, Static) else x


class StaticArgs:
    """``f`` called as ``call_f(args, kwargs)``, and which of its arguments
    are static (positions and names resolved against ``f``'s signature)."""

    def __init__(self, f: Callable, static_argnums: Any, static_argnames: Any):
        self.f = f
        nums = _int_tuple(static_argnums, "static_argnums")
        names = _str_tuple(static_argnames, "static_argnames")
        self.static = bool(nums or names)
        if self.static:
            nums, names = _resolve_static(f, nums, names)
        self.nums, self.names = frozenset(nums), frozenset(names)

    def __call__(self, args: tuple, kwargs: dict) -> Any:
        if not self.static:
            return self.f(*args, **kwargs)
        kwargs = {k: _unmark(v) for k, v in kwargs.items()}
        return self.f(*map(_unmark, args), **kwargs)

    def mark_static(self, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        """``(args, kwargs)`` with each static value wrapped in ``Static``."""
        if not self.static:
            return args, kwargs
        n = len(args)
        nums = {i % n for i in self.nums if -n <= i < n}  # f(*args): per call
        args = tuple(
            _static(x, f"argument {i}") if i in nums else x for i, x in enumerate(args)
        )
        kwargs = {
            k: _static(v, f"argument {k!r}") if k in self.names else v
            for k, v in kwargs.items()
        }
        return args, kwargs


def _static(value: Any, what: str) -> Static:
    try:
        hash(value)
    except TypeError:
        raise ValueError(
            f"jit: static {what} must be hashable (its value is part of the "
            f"signature), got {type(value).__name__} {_short_repr(value)}; pass "
            "arrays as ordinary (traced) arguments"
        ) from None
    return Static(value)


def _int_tuple(nums: Any, name: str) -> tuple[int, ...]:
    nums = nums if isinstance(nums, (tuple, list)) else (nums,)
    if not all(_is_axis(i) for i in nums):
        raise TypeError(f"jit: {name} must be an int or a tuple of ints, got {nums!r}")
    return tuple(int(i) for i in nums)


def _str_tuple(names: Any, name: str) -> tuple[str, ...]:
    names = (names,) if isinstance(names, str) else names
    if not isinstance(names, (tuple, list)) or not all(
        isinstance(s, str) for s in names
    ):
        raise TypeError(f"jit: {name} must be a str or a tuple of strs, got {names!r}")
    return tuple(names)


def _resolve_static(f: Callable, nums: tuple, names: tuple) -> tuple[tuple, tuple]:
    """As JAX: positions are checked against ``f``'s positional parameters
    (negative ones count from the end of each call's positional arguments); a
    static position also makes its name static, and back."""
    try:
        params = list(inspect.signature(f).parameters.values())
    except (TypeError, ValueError):  # no signature: take the numbers as given
        return nums, names
    kinds = inspect.Parameter
    positional = [
        p.name
        for p in params
        if p.kind in (kinds.POSITIONAL_ONLY, kinds.POSITIONAL_OR_KEYWORD)
    ]
    if not any(p.kind == kinds.VAR_POSITIONAL for p in params):
        n = len(positional)
        for i in nums:
            if not -n <= i < n:
                raise ValueError(
                    f"jit: static_argnums {i} is out of range: "
                    f"{getattr(f, '__name__', 'f')} takes {n} positional argument(s)"
                )
    keyword = [p.name for p in params if p.kind != kinds.POSITIONAL_ONLY]
    unknown = [s for s in names if s not in keyword]
    if unknown and not any(p.kind == kinds.VAR_KEYWORD for p in params):
        raise ValueError(
            f"jit: static_argnames {unknown} are not parameters of "
            f"{getattr(f, '__name__', 'f')}"
        )
    names += tuple(positional[i] for i in nums if 0 <= i < len(positional))
    nums += tuple(positional.index(s) for s in names if s in positional)
    return nums, names


@xla_call_p.def_rule("abstract_eval")
def _xla_call_abstract_eval(*avals_in, jaxpr):
    check_call_types(jaxpr, avals_in)
    return jaxpr_type(jaxpr).out_types


# @title Checks: argument types against the jaxpr; jaxpr_type and its cache
import weakref

_jaxpr_types: weakref.WeakKeyDictionary[Jaxpr, JaxprType] = (
    weakref.WeakKeyDictionary()
)  # weak keys: a jaxpr nobody uses is not kept alive by its type


def jaxpr_type(jaxpr: Jaxpr) -> JaxprType:
    """typecheck_jaxpr, remembered per jaxpr."""
    if jaxpr not in _jaxpr_types:
        _jaxpr_types[jaxpr] = typecheck_jaxpr(jaxpr)
    return _jaxpr_types[jaxpr]


def check_call_types(jaxpr: Jaxpr, args: Sequence[Any]) -> None:
    """Raise a TypeError unless ``args`` (arrays, tracers or avals) have the
    shapes and dtypes of ``jaxpr``'s inputs. Cheap: no avals are built."""
    expected = jaxpr_type(jaxpr)
    if len(args) != len(expected.in_types) or any(
        x.shape != t.shape or x.dtype != t.dtype
        for x, t in zip(args, expected.in_types)
    ):
        got = ", ".join(ShapedArray(x.shape, x.dtype).str_short() for x in args)
        raise TypeError(
            f"xla_call: the jaxpr takes {expected} but was called with ({got})"
        )
    check_xla_dtypes(expected.in_types)


def check_batched_call_types(jaxpr: Jaxpr, vals: list, batched: tuple) -> None:
    """check_call_types for one example of a batch (batch axes at 0)."""
    avals = [get_aval(v) for v in vals]
    per_example = [ShapedArray(a.shape[b:], a.dtype) for a, b in zip(avals, batched)]
    check_call_types(jaxpr, per_example)


def check_xla_dtypes(avals: Sequence[ShapedArray]) -> None:
    for aval in avals:
        check_xla_dtype(aval.dtype)


def jvp_jaxpr_uncached(jaxpr: Jaxpr) -> tuple[Jaxpr, list[Any]]:
    """A jaxpr of (primals, tangents) -> (primal outputs, tangent outputs)."""
    in_types = jaxpr_type(jaxpr).in_types
    n = len(in_types)

    def primals_and_tangents_out(*args):
        primals_out, tangents_out = jvp_flat(jaxpr_as_fun(jaxpr), args[:n], args[n:])
        return [*primals_out, *tangents_out]

    new_jaxpr, consts, _ = make_jaxpr(primals_and_tangents_out, *in_types, *in_types)
    return new_jaxpr, [device_put(c) for c in consts]


jvp_jaxpr = functools.cache(jvp_jaxpr_uncached)


@xla_call_p.def_rule("jvp")
def _xla_call_jvp(primals, tangents, *, jaxpr):
    check_call_types(jaxpr, primals)
    new_jaxpr, consts = jvp_jaxpr(jaxpr)
    outs = bind(xla_call_p, *consts, *primals, *tangents, jaxpr=new_jaxpr)
    n = len(outs) // 2
    return outs[:n], outs[n:]


def vmap_jaxpr_uncached(jaxpr: Jaxpr, axis: Axis, batched: tuple[bool, ...]):
    """A jaxpr computing ``jaxpr`` on a batch (axis 0) of the batched inputs."""
    in_types = jaxpr_type(jaxpr).in_types
    batched_types = [
        ShapedArray((axis.size, *t.shape), t.dtype) if b else t
        for t, b in zip(in_types, batched)
    ]
    in_axes = [0 if b else None for b in batched]

    def batched_fun(*args):
        return vmap_flat(jaxpr_as_fun(jaxpr), axis, in_axes, list(args))

    new_jaxpr, consts, _ = make_jaxpr(batched_fun, *batched_types)
    return new_jaxpr, [device_put(c) for c in consts]


vmap_jaxpr = functools.cache(vmap_jaxpr_uncached)


@xla_call_p.def_rule("vmap")
def _xla_call_vmap(axis, vals, dims, *, jaxpr):
    vals = [
        v if d is None else move_batch_axis(axis.size, d, 0, v)
        for v, d in zip(vals, dims)
    ]
    batched = tuple(d is not None for d in dims)
    check_batched_call_types(jaxpr, vals, batched)
    new_jaxpr, consts = vmap_jaxpr(jaxpr, axis, batched)
    outs = bind(xla_call_p, *consts, *vals, jaxpr=new_jaxpr)
    return outs, [0] * len(outs)


@xla_call_p.def_rule("lower")
def _xla_call_lower(ctx, avals_in, avals_out, *operands, jaxpr):
    callee = ctx.function_for(jaxpr)
    out_types = [ir_type(a) for a in avals_out]
    call = mlir_func.CallOp(out_types, ir.FlatSymbolRefAttr.get(callee), operands)
    return list(call.results)


# ==== chapter: part4_grad ====


class PartialVal(NamedTuple):
    """A value that is known (``const`` is set) or unknown (only ``aval``)."""

    aval: ShapedArray
    const: Any | None

    @classmethod
    def known(cls, val: Any) -> PartialVal:
        return cls(get_aval(val), val)

    @classmethod
    def unknown(cls, aval: ShapedArray) -> PartialVal:
        return cls(aval, None)

    @property
    def is_known(self) -> bool:
        return self.const is not None


class InputRecipe(NamedTuple):
    """The tracer is an input of the staged-out jaxpr."""


class ConstRecipe(NamedTuple):
    """The tracer stands for a known value the staged-out jaxpr needs."""

    val: Any


class EqnRecipe(NamedTuple):
    """The tracers ``tracers_out`` are the outputs of an equation."""

    prim: Primitive
    tracers_in: list[PartialEvalTracer]
    params: dict[str, Any]
    tracers_out: WeakTracers


class PartialEvalTracer(Tracer):
    """A known value, or an unknown one with the recipe that will make it."""

    def __init__(self, trace: PartialEvalTrace, pval: PartialVal, recipe: Any) -> None:
        self._trace = trace
        self.pval = pval
        self.recipe = recipe

    @property
    def aval(self) -> ShapedArray:
        return self.pval.aval

    def full_lower(self) -> Any:
        return full_lower(self.pval.const) if self.pval.is_known else self

    def __bool__(self) -> bool:
        self.check_live()
        if self.pval.is_known:
            return bool(self.pval.const)
        return super().__bool__()


# @title WeakTracers: an equation's outputs, held by weak reference
# Each output points to its recipe; strong references back would make every
# equation a reference cycle that only Python's garbage collector frees.
class _UnusedOutput(NamedTuple):
    """Stands in for an output tracer that nothing refers to any more."""

    aval: ShapedArray


class WeakTracers:
    """Tracers held by weak reference; one that nobody kept any more reads as
    an ``_UnusedOutput`` of its type (the same object each time)."""

    def __init__(self, tracers: Sequence[PartialEvalTracer]) -> None:
        self._refs = [weakref.ref(t) for t in tracers]
        self._unused = [_UnusedOutput(t.aval) for t in tracers]

    def __iter__(self) -> Iterator[PartialEvalTracer | _UnusedOutput]:
        for ref, unused in zip(self._refs, self._unused):
            tracer = ref()
            yield unused if tracer is None else tracer

    def __len__(self) -> int:
        return len(self._refs)


class PartialEvalTrace(Trace):
    """Compute what is known; record what is not."""

    def new_arg(self, pval: PartialVal) -> PartialEvalTracer:
        recipe = None if pval.is_known else InputRecipe()
        return PartialEvalTracer(self, pval, recipe)

    def pure(self, val: Any) -> PartialEvalTracer:
        return PartialEvalTracer(self, PartialVal.known(val), None)

    lift = pure

    def instantiate_const(self, tracer: PartialEvalTracer) -> PartialEvalTracer:
        """An unknown tracer for ``tracer``; a known one becomes a residual."""
        if not tracer.pval.is_known:
            return tracer
        pval = PartialVal.unknown(tracer.aval)
        return PartialEvalTracer(self, pval, ConstRecipe(tracer.pval.const))

    def process_primitive(self, prim, tracers, params):
        if all(t.pval.is_known for t in tracers):
            outs = bind(prim, *[t.pval.const for t in tracers], **params)
            return outs if prim.multiple_results else [outs]
        rule = prim.rules.get("partial_eval")
        if rule is not None:
            return rule(self, tracers, **params)
        return self.stage(prim, tracers, params)

    def stage(self, prim, tracers, params) -> list[PartialEvalTracer]:
        """Record ``prim`` on ``tracers`` as an equation of the unknown part."""
        tracers_in = [self.instantiate_const(t) for t in tracers]
        avals_out = prim.rule("abstract_eval")(*[t.aval for t in tracers_in], **params)
        tracers_out = [
            PartialEvalTracer(self, PartialVal.unknown(aval), None)
            for aval in avals_out
        ]
        recipe = EqnRecipe(prim, tracers_in, params, WeakTracers(tracers_out))
        for t in tracers_out:
            t.recipe = recipe
        return tracers_out


def toposort(roots: Sequence[Any], parents: Callable[[Any], Sequence[Any]]) -> list:
    """Nodes reachable from ``roots``, each after all of its parents."""
    order, seen = [], set()
    # A stack, not recursion: no depth limit.
    stack = [(root, False) for root in reversed(roots)]
    while stack:
        node, parents_done = stack.pop()
        if parents_done:
            order.append(node)
        elif id(node) not in seen:
            seen.add(id(node))
            stack.append((node, True))
            stack.extend((p, False) for p in reversed(parents(node)))
    return order


def tracers_to_jaxpr(
    tracers_in: list[PartialEvalTracer], tracers_out: list[PartialEvalTracer]
) -> tuple[Jaxpr, list[Any]]:
    """The jaxpr from (residuals, ``tracers_in``) to ``tracers_out``, and the
    residuals' values."""
    var_of: dict[int, Var] = {}

    def var(t: PartialEvalTracer) -> Var:
        if id(t) not in var_of:
            var_of[id(t)] = Var(t.aval)
        return var_of[id(t)]

    def eqn_parents(recipe: EqnRecipe) -> list[EqnRecipe]:
        return [t.recipe for t in recipe.tracers_in if isinstance(t.recipe, EqnRecipe)]

    def consts(tracers):  # the residuals among ``tracers``, by id
        return {id(t): t for t in tracers if isinstance(t.recipe, ConstRecipe)}

    roots = [t.recipe for t in tracers_out if isinstance(t.recipe, EqnRecipe)]
    residuals, eqns = {}, []
    for r in toposort(roots, eqn_parents):
        residuals.update(consts(r.tracers_in))
        ins, outs = [var(t) for t in r.tracers_in], [var(t) for t in r.tracers_out]
        eqns.append(JaxprEqn(r.prim, ins, r.params, outs))
    residuals.update(consts(tracers_out))
    in_binders = [var(t) for t in [*residuals.values(), *tracers_in]]
    jaxpr = Jaxpr(in_binders, eqns, [var(t) for t in tracers_out])
    typecheck_jaxpr(jaxpr)
    return jaxpr, [t.recipe.val for t in residuals.values()]


def partial_eval_flat(
    f: Callable,
    pvals_in: list[PartialVal],
    instantiate: Callable[[int], Sequence[bool]],
) -> tuple[Jaxpr, list[PartialVal], list[Any]]:
    """The jaxpr of ``f``'s unknown part, its outputs, and the residuals."""
    with new_level(PartialEvalTrace) as level:
        trace = PartialEvalTrace(level)
        tracers_in = [trace.new_arg(pval) for pval in pvals_in]
        tracers_out = [trace.full_raise(out) for out in f(*tracers_in)]
        tracers_out = [
            trace.instantiate_const(t) if inst else t
            for t, inst in zip(tracers_out, instantiate(len(tracers_out)))
        ]
        pvals_out = [t.pval for t in tracers_out]
        unknown_in = [t for t in tracers_in if not t.pval.is_known]
        unknown_out = [t for t in tracers_out if not t.pval.is_known]
        jaxpr, residuals = tracers_to_jaxpr(unknown_in, unknown_out)
    return jaxpr, pvals_out, residuals


def linearize_flat(
    f: Callable, primals: list[Any]
) -> tuple[list[Any], Jaxpr, list[Any]]:
    """Primal outputs, and the linear jaxpr (residuals first) of ``f`` at
    ``primals``."""
    n = len(primals)
    pvals_in = [PartialVal.known(p) for p in primals] + [
        PartialVal.unknown(get_aval(p)) for p in primals
    ]

    def f_jvp(*primals_and_tangents):
        outs, outs_dot = jvp_flat(f, primals_and_tangents[:n], primals_and_tangents[n:])
        return [*outs, *outs_dot]

    def tangents_unknown(n_outs: int) -> list[bool]:
        return [False] * (n_outs // 2) + [True] * (n_outs // 2)

    jaxpr, pvals_out, residuals = partial_eval_flat(f_jvp, pvals_in, tangents_unknown)
    primal_pvals = pvals_out[: len(pvals_out) // 2]
    _check_primal_outputs_known(primal_pvals)
    return [p.const for p in primal_pvals], jaxpr, residuals


def linearize(f: Callable, *primals: Any) -> tuple[Any, Callable]:
    """``f(*primals)`` and the linear map ``f_lin(*tangents)`` of ``f`` there."""
    primals_flat, in_tree = tree_flatten(primals)
    primals_flat = [_as_input(x, "linearize primal") for x in primals_flat]
    flat_f = flatten_fun(f, in_tree)
    primals_out, jaxpr, residuals = linearize_flat(flat_f, primals_flat)
    out_tree = flat_f.out_tree

    def f_lin(*tangents: Any) -> Any:
        tangents_flat = _flatten_and_check_tangents(tangents, in_tree, primals_flat)
        outs = eval_jaxpr(jaxpr, [*residuals, *tangents_flat])
        return tree_unflatten(out_tree, outs)

    return tree_unflatten(out_tree, primals_out), f_lin


# @title Checks: linearize's primal outputs are known; tangents match the primals
def _check_primal_outputs_known(primal_pvals: list[PartialVal]) -> None:
    if not all(p.is_known for p in primal_pvals):
        raise TypeError("linearize: a primal output depends on the tangents")


def _flatten_and_check_tangents(
    tangents: tuple, in_tree: PyTreeDef, primals_flat: list[Any]
) -> list[Any]:
    """The leaves of ``tangents``, which must match the primals in structure,
    shape and dtype."""
    tangents_flat, tangent_tree = tree_flatten(tangents)
    if tangent_tree != in_tree:
        raise TypeError(
            "linearize: the linear map takes tangents with the structure of "
            f"the primals, {in_tree}, got {tangent_tree}"
        )
    tangents_flat = [_as_input(t, "linearize tangent") for t in tangents_flat]
    _check_tangents("linearize", primals_flat, tangents_flat)
    return tangents_flat


class UndefPrimal(NamedTuple):
    """A linear input whose value we do not have: only its type."""

    aval: ShapedArray


def backward_pass(
    jaxpr: Jaxpr, args: Sequence[Any], cotangents_out: Sequence[Any]
) -> list[Any]:
    """The cotangents of the ``UndefPrimal`` arguments of linear ``jaxpr``."""
    values: dict[Var, Any] = {}
    linear: set[Var] = set()
    for v, arg in zip(jaxpr.in_binders, args):
        if isinstance(arg, UndefPrimal):
            linear.add(v)
        else:
            values[v] = arg

    def read(x: Atom) -> Any:
        return x.val if isinstance(x, Lit) else values[x]

    # Forward: evaluate what does not involve the linear inputs.
    linear_eqns = []
    for eqn in jaxpr.eqns:
        if any(isinstance(x, Var) and x in linear for x in eqn.inputs):
            linear_eqns.append(eqn)
            linear.update(eqn.out_binders)
        else:
            outs = bind(eqn.primitive, *[read(x) for x in eqn.inputs], **eqn.params)
            outs = outs if eqn.primitive.multiple_results else [outs]
            values.update(zip(eqn.out_binders, outs))

    # Backward: accumulate cotangents, from the outputs to the inputs.
    cts: dict[Var, Any] = {}

    def add_ct(v: Atom, ct: Any) -> None:
        if ct is None or not (isinstance(v, Var) and v in linear):
            return
        cts[v] = ct if v not in cts else add(cts[v], ct)

    for x, ct in zip(jaxpr.outs, cotangents_out):
        add_ct(x, ct)
    for eqn in reversed(linear_eqns):
        cts_out = [cts.pop(v, None) for v in eqn.out_binders]
        if all(ct is None for ct in cts_out):
            continue  # nothing flows back through this equation
        cts_out = [
            zeros_like_aval(v.aval) if ct is None else ct
            for v, ct in zip(eqn.out_binders, cts_out)
        ]
        args_in = [
            UndefPrimal(x.aval) if isinstance(x, Var) and x in linear else read(x)
            for x in eqn.inputs
        ]
        cts_in = eqn.primitive.rule("transpose")(cts_out, *args_in, **eqn.params)
        for x, ct in zip(eqn.inputs, cts_in):
            add_ct(x, ct)
    return [
        cts.get(v, zeros_like_aval(arg.aval))
        for v, arg in zip(jaxpr.in_binders, args)
        if isinstance(arg, UndefPrimal)
    ]


def zeros_like_aval(aval: ShapedArray) -> np.ndarray:
    return np.zeros(aval.shape, aval.dtype)


def _is_undef(x: Any) -> bool:
    return isinstance(x, UndefPrimal)


@add_p.def_rule("transpose")
def _add_transpose(cts, x, y):
    (ct,) = cts
    return [ct if _is_undef(x) else None, ct if _is_undef(y) else None]


@neg_p.def_rule("transpose")
def _neg_transpose(cts, x):
    (ct,) = cts
    return [neg(ct)]


@mul_p.def_rule("transpose")
def _mul_transpose(cts, x, y):
    (ct,) = cts
    _check_one_operand_linear(x, y)
    if _is_undef(x):
        return [mul(ct, y), None]
    return [None, mul(x, ct)]


@reduce_sum_p.def_rule("transpose")
def _reduce_sum_transpose(cts, x, *, axes):
    (ct,) = cts
    return [broadcast(ct, x.aval.shape, axes)]


@broadcast_p.def_rule("transpose")
def _broadcast_transpose(cts, x, *, shape, axes):
    (ct,) = cts
    return [reduce_sum(ct, axes)]


@transpose_p.def_rule("transpose")
def _transpose_transpose(cts, x, *, perm):
    (ct,) = cts
    inverse = [0] * len(perm)
    for i, p in enumerate(perm):
        inverse[p] = i
    return [transpose(ct, inverse)]


# @title Check: a mul to transpose has one linear operand
def _check_one_operand_linear(x: Any, y: Any) -> None:
    if _is_undef(x) and _is_undef(y):
        raise TypeError("mul: transposing a product of two linear values")


def vjp(f: Callable, *primals: Any) -> tuple[Any, Callable]:
    """``f(*primals)`` and ``f_vjp(*cotangents) -> tuple of input cotangents``."""
    primals_flat, in_tree = tree_flatten(primals)
    primals_flat = [_as_input(x, "vjp primal") for x in primals_flat]
    flat_f = flatten_fun(f, in_tree)
    primals_out, jaxpr, residuals = linearize_flat(flat_f, primals_flat)
    out_tree = flat_f.out_tree
    out_avals = [get_aval(p) for p in primals_out]
    undefs = [UndefPrimal(get_aval(p)) for p in primals_flat]

    def f_vjp(residuals: list, *cotangents: Any) -> tuple:
        cts_flat = _flatten_and_check_cotangents(cotangents, out_tree, out_avals)
        cts_in = backward_pass(jaxpr, [*residuals, *undefs], cts_flat)
        return tree_unflatten(in_tree, cts_in)

    return tree_unflatten(out_tree, primals_out), Partial(f_vjp, residuals)


def grad(f: Callable, argnums=0, has_aux=False) -> Callable:
    """The gradient of a scalar-output ``f`` with respect to argument(s) ``argnums``."""

    def gradient(*args: Any, **kwargs: Any) -> Any:
        f_x, x = _fix_other_args(f, args, kwargs, argnums, has_aux)
        _check_float_inputs(x)
        y, aux, f_vjp = _vjp_with_aux(f_x, x)
        _check_scalar_float_output(y)
        (x_bar,) = f_vjp(np.ones((), get_aval(y).dtype))
        return (x_bar, aux) if has_aux else x_bar

    return gradient


# @title Checks: cotangents, grad's input and output types; argnums, has_aux; Partial
# Cotangents must match the outputs' structure, shapes and dtypes; grad needs a
# float input and a scalar float output. grad differentiates the argument (or
# tuple of arguments) named by argnums and passes keyword arguments through.
# vjp returns a Partial, f_vjp with its residuals fixed: a pytree whose leaves
# are the residuals, so it can be returned from jit or kept as a residual of a
# custom rule (Part 8). JAX's jax.vjp returns a pytree of residuals too (its own
# class, jax._src.api.VJP, in JAX 0.10.2).
class Partial:
    """``func`` with its first arguments fixed, and a pytree whose leaves are
    theirs (``func`` is its static part), like JAX's ``jax.tree_util.Partial``."""

    def __init__(self, func: Callable, *args: Any) -> None:
        self.func, self.args = func, args

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.func(*self.args, *args, **kwargs)

    def __repr__(self) -> str:
        return f"Partial({getattr(self.func, '__name__', 'function')}, ...)"


register_pytree_node(
    Partial, lambda p: (p.args, p.func), lambda func, args: Partial(func, *args)
)


def _fix_other_args(
    f: Callable, args: tuple, kwargs: dict, argnums: Any, has_aux: bool
):
    """``f`` as a function of the chosen positional argument (or tuple of them)
    only, returning ``(value, aux)``; ``aux`` is None without ``has_aux``. The
    keyword arguments are held fixed, as JAX does: never differentiated."""
    nums = _check_argnums(argnums, len(args), "grad")

    def f_x(x: Any) -> tuple[Any, Any]:
        new_args = list(args)
        for i, xi in zip(nums, x if isinstance(argnums, tuple) else (x,)):
            new_args[i] = xi
        out = f(*new_args, **kwargs)
        if not has_aux:
            return out, None
        if not (isinstance(out, (tuple, list)) and len(out) == 2):
            raise TypeError(
                "grad: with has_aux=True, f must return a pair (value, aux), "
                f"got {type(out).__name__}"
            )
        return tuple(out)

    chosen = tuple(args[i] for i in nums)
    return f_x, chosen if isinstance(argnums, tuple) else chosen[0]


def value_and_grad(f: Callable, argnums=0, has_aux=False) -> Callable:
    """``f``'s value (with ``aux``) and ``grad(f, argnums, has_aux)``'s gradient."""

    def value_and_gradient(*args: Any, **kwargs: Any) -> tuple[Any, Any]:
        f_x, x = _fix_other_args(f, args, kwargs, argnums, has_aux)
        _check_float_inputs(x)
        y, aux, f_vjp = _vjp_with_aux(f_x, x)
        _check_scalar_float_output(y)
        (x_bar,) = f_vjp(np.ones((), get_aval(y).dtype))
        return ((y, aux) if has_aux else y), x_bar

    return value_and_gradient


def _vjp_with_aux(f_x: Callable, x: Any):
    """``vjp`` of ``f_x(x) -> (y, aux)``, with the pullback of ``y`` only."""
    (y, aux), f_vjp = vjp(f_x, x)
    zeros = tree_map(lambda a: np.zeros(get_aval(a).shape, get_aval(a).dtype), aux)
    return y, aux, lambda ct: f_vjp((ct, zeros))


def _flatten_and_check_cotangents(
    cotangents: tuple, out_tree: PyTreeDef, out_avals: list[ShapedArray]
) -> list[Any]:
    """The leaves of the cotangents (one argument, or one per output), which
    must match the outputs in structure, shape and dtype."""
    cts_flat, ct_tree = tree_flatten(
        cotangents[0] if len(cotangents) == 1 else cotangents
    )
    if ct_tree != out_tree:
        raise TypeError(
            f"vjp: cotangents must have the structure of f's output, {out_tree}, "
            f"got {ct_tree}"
        )
    cts_flat = [_as_input(c, "vjp cotangent") for c in cts_flat]
    _check_cotangents(out_avals, cts_flat)
    return cts_flat


def _check_cotangents(out_avals: list[ShapedArray], cts: list[Any]) -> None:
    for i, (aval, ct) in enumerate(zip(out_avals, cts)):
        ct_aval = get_aval(ct)
        if ct_aval.shape != aval.shape or ct_aval.dtype != aval.dtype:
            raise ValueError(
                f"vjp: cotangent {i} should be {aval.str_short()} like the "
                f"output, got {ct_aval.str_short()}"
            )


def _check_float_inputs(x: Any) -> None:
    for leaf in tree_flatten(x)[0]:
        dtype = get_aval(_as_input(leaf, "grad")).dtype
        if dtype.kind != "f":
            raise TypeError(
                f"grad: can only differentiate with respect to float inputs, "
                f"got dtype {dtype.name}"
            )


def _check_scalar_float_output(y: Any) -> None:
    out_tree = tree_flatten(y)[1]
    y_aval = get_aval(y) if out_tree == LEAF else None
    if y_aval is None or y_aval.shape != () or y_aval.dtype.kind != "f":
        what = f"a pytree {out_tree}" if y_aval is None else y_aval.str_short()
        raise TypeError(
            f"grad: f must return a float scalar (shape ()), got {what}; "
            "use vjp or jacfwd for other outputs"
        )


def jacrev(f: Callable, argnums=0) -> Callable:
    """Curried, as ``jacfwd``; one VJP per row."""
    return jacobian_per_leaf(jacrev_at, f, argnums)


def jacrev_at(f: Callable, x: Any) -> Any:
    y, f_vjp = vjp(f, x)
    return map_over_basis(lambda ct: f_vjp(ct)[0], get_aval(y))


def hessian(f: Callable, argnums=0) -> Callable:
    return jacfwd(jacrev(f, argnums), argnums)


jacobian = jacrev  # JAX's other name for it


def partial_eval_jaxpr(
    jaxpr: Jaxpr, in_unknowns: Sequence[bool], instantiate: Sequence[bool] | None = None
) -> tuple[Jaxpr, Jaxpr, list[bool], int]:
    """Split ``jaxpr`` into ``(known, unknown, out_unknowns, num_residuals)``."""
    if instantiate is None:
        instantiate = [False] * len(jaxpr.outs)
    unknown = {v for v, u in zip(jaxpr.in_binders, in_unknowns) if u}
    known_eqns, unknown_eqns = [], []
    residuals: dict[Var, None] = {}  # an ordered set

    def is_unknown(x: Atom) -> bool:
        return isinstance(x, Var) and x in unknown

    for eqn in jaxpr.eqns:
        unks = [is_unknown(x) for x in eqn.inputs]
        rule = eqn.primitive.rules.get("partial_eval_jaxpr")
        if not any(unks):
            known_eqns.append(eqn)
        elif rule is not None:
            eqn_known, eqn_unknown, outs_unknown, res = rule(unks, eqn)
            if eqn_known is not None:  # None: nothing of it can run early
                known_eqns.append(eqn_known)
            unknown_eqns.append(eqn_unknown)
            residuals.update(dict.fromkeys(res))
            unknown.update(v for v, u in zip(eqn.out_binders, outs_unknown) if u)
        else:
            known_ins = [x for x, u in zip(eqn.inputs, unks) if not u]
            residuals.update(dict.fromkeys(x for x in known_ins if isinstance(x, Var)))
            unknown_eqns.append(eqn)
            unknown.update(eqn.out_binders)

    out_unknowns = [is_unknown(x) or inst for x, inst in zip(jaxpr.outs, instantiate)]
    for x, unk in zip(jaxpr.outs, out_unknowns):
        if unk and isinstance(x, Var) and x not in unknown:
            residuals[x] = None  # a known output that must come out unknown
    residual_vars = list(residuals)
    known_in = [v for v, u in zip(jaxpr.in_binders, in_unknowns) if not u]
    unknown_in = [v for v, u in zip(jaxpr.in_binders, in_unknowns) if u]
    known_outs = [x for x, u in zip(jaxpr.outs, out_unknowns) if not u]
    unknown_outs = [x for x, u in zip(jaxpr.outs, out_unknowns) if u]
    jaxpr_known = Jaxpr(known_in, known_eqns, known_outs + residual_vars)
    jaxpr_unknown = Jaxpr(residual_vars + unknown_in, unknown_eqns, unknown_outs)
    typecheck_jaxpr(jaxpr_known)
    typecheck_jaxpr(jaxpr_unknown)
    return jaxpr_known, jaxpr_unknown, out_unknowns, len(residual_vars)


@functools.cache
def split_call_jaxpr(jaxpr: Jaxpr, in_unknowns: tuple[bool, ...]) -> tuple:
    return partial_eval_jaxpr(jaxpr, in_unknowns)


@xla_call_p.def_rule("partial_eval")
def _xla_call_partial_eval(trace, tracers, *, jaxpr):
    in_unknowns = [not t.pval.is_known for t in tracers]
    jaxpr_known, jaxpr_unknown, out_unknowns, num_res = split_call_jaxpr(
        jaxpr, tuple(in_unknowns)
    )
    known_vals = [t.pval.const for t in tracers if t.pval.is_known]
    known_outs_and_res = bind(xla_call_p, *known_vals, jaxpr=jaxpr_known)
    split = len(known_outs_and_res) - num_res
    known_outs, residuals = known_outs_and_res[:split], known_outs_and_res[split:]
    residual_tracers = [trace.instantiate_const(trace.pure(r)) for r in residuals]
    unknown_tracers = [t for t in tracers if not t.pval.is_known]
    unknown_outs = trace.stage(
        xla_call_p, residual_tracers + unknown_tracers, dict(jaxpr=jaxpr_unknown)
    )
    known_iter, unknown_iter = iter(known_outs), iter(unknown_outs)
    return [
        next(unknown_iter) if unk else trace.pure(next(known_iter))
        for unk in out_unknowns
    ]


@xla_call_p.def_rule("partial_eval_jaxpr")
def _xla_call_partial_eval_jaxpr(unks_in, eqn):
    jaxpr = eqn.params["jaxpr"]
    jaxpr_known, jaxpr_unknown, out_unknowns, num_res = split_call_jaxpr(
        jaxpr, tuple(unks_in)
    )
    known_outs = [v for v, u in zip(eqn.out_binders, out_unknowns) if not u]
    unknown_outs = [v for v, u in zip(eqn.out_binders, out_unknowns) if u]
    residuals = [Var(v.aval) for v in jaxpr_known.outs[len(known_outs) :]]
    known_ins = [x for x, u in zip(eqn.inputs, unks_in) if not u]
    unknown_ins = [x for x, u in zip(eqn.inputs, unks_in) if u]
    eqn_known = JaxprEqn(
        xla_call_p, known_ins, dict(jaxpr=jaxpr_known), known_outs + residuals
    )
    eqn_unknown = JaxprEqn(
        xla_call_p, residuals + unknown_ins, dict(jaxpr=jaxpr_unknown), unknown_outs
    )
    return eqn_known, eqn_unknown, out_unknowns, residuals


def transpose_jaxpr_uncached(
    jaxpr: Jaxpr, undefined: tuple[bool, ...]
) -> tuple[Jaxpr, list]:
    """A jaxpr from (defined inputs, output cotangents) to input cotangents."""
    in_types = jaxpr_type(jaxpr).in_types
    out_types = jaxpr_type(jaxpr).out_types
    defined_types = [t for t, u in zip(in_types, undefined) if not u]

    def transposed(*args):
        defined, cts_out = args[: len(defined_types)], args[len(defined_types) :]
        it = iter(defined)
        full_args = [
            UndefPrimal(t) if u else next(it) for t, u in zip(in_types, undefined)
        ]
        return backward_pass(jaxpr, full_args, cts_out)

    new_jaxpr, consts, _ = make_jaxpr(transposed, *defined_types, *out_types)
    return new_jaxpr, [device_put(c) for c in consts]


transpose_jaxpr = functools.cache(transpose_jaxpr_uncached)


@xla_call_p.def_rule("transpose")
def _xla_call_transpose(cts, *args, jaxpr):
    undefined = tuple(_is_undef(x) for x in args)
    new_jaxpr, consts = transpose_jaxpr(jaxpr, undefined)
    defined = [x for x in args if not _is_undef(x)]
    cts = [
        zeros_like_aval(t) if ct is None else ct
        for ct, t in zip(cts, jaxpr_type(jaxpr).out_types)
    ]
    cts_in = iter(bind(xla_call_p, *consts, *defined, *cts, jaxpr=new_jaxpr))
    return [next(cts_in) if u else None for u in undefined]


# ==== chapter: part5_cond ====

cond_p = Primitive("cond", multiple_results=True)


def _with_unused_inputs(jaxpr: Jaxpr, at: int, avals: list) -> Jaxpr:
    """``jaxpr`` with inputs of types ``avals``, which it ignores, at ``at``."""
    binders, new = jaxpr.in_binders, [Var(aval) for aval in avals]
    return Jaxpr(binders[:at] + new + binders[at:], jaxpr.eqns, jaxpr.outs)


def join_consts(
    true_jaxpr: Jaxpr, true_consts: list, false_jaxpr: Jaxpr, false_consts: list
) -> tuple[list, dict]:
    """Both branches' constants, and both branches taking all of them."""
    true_avals = [get_aval(c) for c in true_consts]
    false_avals = [get_aval(c) for c in false_consts]
    branches = dict(
        true_jaxpr=_with_unused_inputs(true_jaxpr, len(true_consts), false_avals),
        false_jaxpr=_with_unused_inputs(false_jaxpr, 0, true_avals),
    )
    return [*true_consts, *false_consts], branches


def cond(pred: Any, true_fn: Callable, false_fn: Callable, *operands: Any) -> Any:
    """``true_fn(*operands)`` if ``pred`` else ``false_fn(*operands)``, staged."""
    pred = check_predicate(pred)
    check_branch_fns(true_fn, false_fn, operands)
    ops_flat, in_tree = tree_flatten(operands)
    ops_flat = [_as_input(x, "cond operand") for x in ops_flat]
    avals = tree_unflatten(in_tree, [get_aval(x) for x in ops_flat])
    true_jaxpr, true_consts, out_tree = _trace_to_jaxpr(
        true_fn, avals, who="cond: true_fn"
    )
    false_jaxpr, false_consts, false_tree = _trace_to_jaxpr(
        false_fn, avals, who="cond: false_fn"
    )
    check_branches_match(out_tree, true_jaxpr, false_tree, false_jaxpr)
    consts, branches = join_consts(true_jaxpr, true_consts, false_jaxpr, false_consts)
    outs = bind(cond_p, pred, *consts, *ops_flat, **branches)
    return tree_unflatten(out_tree, outs)


# @title Checks: the predicate, the branch functions, the branches' types
import inspect


def check_predicate(pred: Any) -> Any:
    """``pred`` as a boolean scalar; a number is true where nonzero, as in JAX."""
    pred = _as_input(pred, "cond predicate")
    aval = get_aval(pred)
    if aval.shape == () and aval.dtype.kind in "iuf":
        return _nonzero(pred, aval)
    check_predicate_type(aval)
    return pred


def _nonzero(x: Any, aval: ShapedArray) -> Any:
    """``x != 0`` with the comparisons we have; NaN is nonzero, as in JAX."""
    zero, one = np.zeros((), aval.dtype), np.ones((), aval.dtype)
    # Below one, x is nonzero if positive or negative; NaN is not below one.
    below_one_nonzero = select(greater(x, zero), np.True_, less(x, zero))
    return select(less(x, one), below_one_nonzero, np.True_)


def check_predicate_type(aval: ShapedArray) -> None:
    if aval.dtype != np.bool_:
        raise TypeError(
            f"cond: the predicate must be a boolean scalar (bool[]), got "
            f"{aval.str_short()}; compare to get a boolean, e.g. greater(x, 0.0)"
        )
    if aval.shape != ():
        raise TypeError(
            f"cond: the predicate must be a boolean scalar (or a number), got "
            f"{aval.str_short()}; to choose elementwise use select, and to "
            "choose per example of a batch apply vmap to a function using cond"
        )


def check_branch_fns(true_fn: Any, false_fn: Any, operands: tuple) -> None:
    for fn, name in [(true_fn, "true_fn"), (false_fn, "false_fn")]:
        if not callable(fn):
            raise TypeError(f"cond: {name} must be a function, got {_short_repr(fn)}")
        try:
            signature = inspect.signature(fn)
        except (TypeError, ValueError):  # e.g. some builtins: let the call decide
            continue
        try:
            signature.bind(*operands)
        except TypeError as err:
            raise TypeError(
                f"cond: {name} cannot be called with the {len(operands)} "
                f"operand(s) given to cond ({err})"
            ) from None


def check_branches_match(
    true_tree: PyTreeDef, true_jaxpr: Jaxpr, false_tree: PyTreeDef, false_jaxpr: Jaxpr
) -> None:
    if true_tree != false_tree:
        raise TypeError(
            "cond: true_fn and false_fn must return the same structure, but "
            f"true_fn returns {true_tree} and false_fn returns {false_tree}"
        )
    for i, (x, y) in enumerate(zip(true_jaxpr.outs, false_jaxpr.outs)):
        if x.aval != y.aval:
            raise TypeError(
                f"cond: true_fn and false_fn must return the same types, but "
                f"output {i} is {x.aval.str_short()} from true_fn and "
                f"{y.aval.str_short()} from false_fn"
            )


def check_branch_types(avals_in: Sequence, true_type: Any, false_type: Any) -> None:
    given = list(avals_in)
    for name, branch_type in [("true", true_type), ("false", false_type)]:
        if branch_type.in_types != given:
            got = ", ".join(a.str_short() for a in given)
            raise TypeError(
                f"cond: the {name} branch takes {branch_type} but the operands "
                f"are ({got})"
            )
    if true_type.out_types != false_type.out_types:
        raise TypeError(
            f"cond: the branches return different types: {true_type} and {false_type}"
        )


def check_predicate_not_linear(who: str, pred: Any) -> None:
    if _is_undef(pred):
        raise TypeError(f"{who}: the predicate cannot be a linear input")


@cond_p.def_rule("impl")
def _cond_impl(pred, *args, true_jaxpr, false_jaxpr):
    check_predicate_type(get_aval(pred))
    return eval_jaxpr(true_jaxpr if pred else false_jaxpr, args)


@cond_p.def_rule("abstract_eval")
def _cond_abstract_eval(pred, *avals_in, true_jaxpr, false_jaxpr):
    check_predicate_type(pred)
    true_type, false_type = typecheck_jaxpr(true_jaxpr), typecheck_jaxpr(false_jaxpr)
    check_branch_types(avals_in, true_type, false_type)
    return true_type.out_types


@cond_p.def_rule("lower")
def _cond_lower(ctx, avals_in, avals_out, pred, *operands, true_jaxpr, false_jaxpr):
    out_types = [ir_type(aval) for aval in avals_out]
    if_op = hlo.IfOp(out_types, pred)
    for region, jaxpr in [
        (if_op.true_branch, true_jaxpr),
        (if_op.false_branch, false_jaxpr),
    ]:
        callee = ir.FlatSymbolRefAttr.get(ctx.function_for(jaxpr))
        with ir.InsertionPoint(region.blocks.append()):
            call = mlir_func.CallOp(out_types, callee, operands)
            hlo.ReturnOp(call.results)
    return list(if_op.results)


def transform_branches(transform: Callable, branches: dict, *args: Any) -> tuple:
    """Apply ``transform`` to both branches and join the constants it makes."""
    true_jaxpr, true_consts = transform(branches["true_jaxpr"], *args)
    false_jaxpr, false_consts = transform(branches["false_jaxpr"], *args)
    return join_consts(true_jaxpr, true_consts, false_jaxpr, false_consts)


@cond_p.def_rule("jvp")
def _cond_jvp(primals, tangents, **branches):
    pred, *operands = primals
    consts, jvp_branches = transform_branches(jvp_jaxpr_uncached, branches)
    outs = bind(cond_p, pred, *consts, *operands, *tangents[1:], **jvp_branches)
    n = len(outs) // 2
    return outs[:n], outs[n:]


select_p = Primitive("select")


def select(pred: ArrayLike, on_true: ArrayLike, on_false: ArrayLike) -> ArrayLike:
    """Elementwise ``on_true if pred else on_false`` (NumPy's ``where``)."""
    args = [_as_input(x, "select") for x in (pred, on_true, on_false)]
    check_select_operands(*[get_aval(x) for x in args])
    return bind(select_p, *args)


# @title select: its check and its rules
def check_select_operands(
    pred: ShapedArray, on_true: ShapedArray, on_false: ShapedArray
):
    check_binary_operands("select", on_true, on_false)
    if pred.dtype != np.bool_ or pred.shape != on_true.shape:
        raise TypeError(
            f"select: the predicate must be a boolean array shaped like the "
            f"operands, bool{list(on_true.shape)}, got {pred.str_short()}"
        )


_impl_from_numpy(select_p, np.where)


@select_p.def_rule("abstract_eval")
def _select_abstract_eval(pred, on_true, on_false):
    check_select_operands(pred, on_true, on_false)
    return [ShapedArray(on_true.shape, on_true.dtype)]


@select_p.def_rule("jvp")
def _select_jvp(primals, tangents):
    pred, on_true, on_false = primals
    _, true_dot, false_dot = tangents
    return [select(pred, on_true, on_false)], [select(pred, true_dot, false_dot)]


@select_p.def_rule("vmap")
def _select_vmap(axis, vals, dims):
    out_axis = next(d for d in dims if d is not None)
    vals = [move_batch_axis(axis.size, d, out_axis, x) for x, d in zip(vals, dims)]
    return [bind(select_p, *vals)], [out_axis]


@select_p.def_rule("lower")
def _select_lower(ctx, avals_in, avals_out, pred, on_true, on_false):
    return [hlo.select(pred, on_true, on_false)]


@select_p.def_rule("transpose")
def _select_transpose(cts, pred, on_true, on_false):
    (ct,) = cts
    check_predicate_not_linear("select", pred)
    zeros = zeros_like(ct)
    return [
        None,
        select(pred, ct, zeros) if _is_undef(on_true) else None,
        select(pred, zeros, ct) if _is_undef(on_false) else None,
    ]


@cond_p.def_rule("vmap")
def _cond_vmap(axis, vals, dims, **branches):
    (pred, *operands), (pred_dim, *operand_dims) = vals, dims
    batched = tuple(d is not None for d in operand_dims)
    operands = [
        x if d is None else move_batch_axis(axis.size, d, 0, x)
        for x, d in zip(operands, operand_dims)
    ]
    if pred_dim is None:  # one branch for the whole batch
        consts, vmapped = transform_branches(
            vmap_jaxpr_uncached, branches, axis, batched
        )
        outs = bind(cond_p, pred, *consts, *operands, **vmapped)
        return outs, [0] * len(outs)
    # A predicate per example: run both branches, then choose per example.
    pred = move_batch_axis(axis.size, pred_dim, 0, pred)
    operands = [move_batch_axis(axis.size, None, 0, x) if not b else x
                for x, b in zip(operands, batched)]  # fmt: skip
    true_outs = _run_batched(branches["true_jaxpr"], axis, pred, operands)
    false_outs = _run_batched(branches["false_jaxpr"], axis, _not(pred), operands)
    outs = [_select_per_example(pred, t, f) for t, f in zip(true_outs, false_outs)]
    return outs, [0] * len(outs)


# @title Both branches for every example, then a select per example
def _run_batched(jaxpr: Jaxpr, axis: Axis, taken: Any, operands: list) -> list:
    """Every output of ``jaxpr`` for every example (all batched along axis 0),
    differentiable only through the examples that ``taken`` says take it."""
    # An example also runs the branch it did not take, on values meant for the
    # other one (say, residuals that partial evaluation filled with zeros), so
    # a division by zero there is expected; select throws that result away.
    # Silence NumPy's warnings about it, as compiled code never warns.
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        operands = [keep_gradient(_per_example(taken, x), x) for x in operands]
        return vmap_flat(jaxpr_as_fun(jaxpr), axis, [0] * len(operands), operands)


def _per_example(pred: Any, x: Any) -> Any:
    """``pred[i]`` for every element of example ``x[i]``: a bool array like ``x``."""
    shape = get_aval(x).shape
    if len(shape) > 1:
        return broadcast(pred, shape, tuple(range(1, len(shape))))
    return pred


def _select_per_example(pred: Any, on_true: Any, on_false: Any) -> Any:
    """Choose ``on_true[i]`` or ``on_false[i]`` by ``pred[i]``, for each example i."""
    return select(_per_example(pred, on_true), on_true, on_false)


def _not(pred: Any) -> Any:
    shape = get_aval(pred).shape
    return select(pred, np.zeros(shape, np.bool_), np.ones(shape, np.bool_))


keep_gradient_p = Primitive("keep_gradient")


def keep_gradient(pred: Any, x: Any) -> Any:
    """``x``, whose derivative is kept where ``pred`` is true and zero elsewhere."""
    return bind(keep_gradient_p, pred, x)


_impl_from_numpy(keep_gradient_p, lambda pred, x: np.asarray(x))
_lower_with(keep_gradient_p, lambda pred, x: x)


@keep_gradient_p.def_rule("abstract_eval")
def _keep_gradient_abstract_eval(pred, x):
    check_select_operands(pred, x, x)
    return [ShapedArray(x.shape, x.dtype)]


@keep_gradient_p.def_rule("jvp")
def _keep_gradient_jvp(primals, tangents):
    (pred, x), (_, x_dot) = primals, tangents
    return [keep_gradient(pred, x)], [select(pred, x_dot, zeros_like(x_dot))]


@keep_gradient_p.def_rule("vmap")
def _keep_gradient_vmap(axis, vals, dims):
    out_axis = next(d for d in dims if d is not None)
    vals = [move_batch_axis(axis.size, d, out_axis, x) for x, d in zip(vals, dims)]
    return [bind(keep_gradient_p, *vals)], [out_axis]


@keep_gradient_p.def_rule("transpose")
def _keep_gradient_transpose(cts, pred, x):  # as a linear map, the identity
    check_predicate_not_linear("keep_gradient", pred)
    return [None, cts[0]]


def split_branches(branches: dict, in_unknowns: list[bool]) -> tuple:
    """Partially evaluate both branches the same way, with joined residuals."""
    jaxprs = branches["true_jaxpr"], branches["false_jaxpr"]
    first = [partial_eval_jaxpr(j, in_unknowns)[2] for j in jaxprs]
    out_unknowns = [t or f for t, f in zip(*first)]
    (true_k, true_u, _, n_true), (false_k, false_u, _, n_false) = [
        partial_eval_jaxpr(j, in_unknowns, out_unknowns) for j in jaxprs
    ]
    true_res = [v.aval for v in true_u.in_binders[:n_true]]
    false_res = [v.aval for v in false_u.in_binders[:n_false]]
    known = dict(
        true_jaxpr=_with_zero_outputs(true_k, len(true_k.outs), false_res),
        false_jaxpr=_with_zero_outputs(false_k, out_unknowns.count(False), true_res),
    )
    unknown = dict(
        true_jaxpr=_with_unused_inputs(true_u, n_true, false_res),
        false_jaxpr=_with_unused_inputs(false_u, 0, true_res),
    )
    return known, unknown, out_unknowns, true_res + false_res


# @title Helpers: outputs of zeros for the other branch's slots; _split_by
def _split_by(flags: list[bool], xs: Sequence) -> tuple[list, list]:
    """The items of ``xs`` whose flag is false, and those whose flag is true."""
    return [x for x, f in zip(xs, flags) if not f], [x for x, f in zip(xs, flags) if f]


def _with_zero_outputs(jaxpr: Jaxpr, at: int, avals: list[ShapedArray]) -> Jaxpr:
    """``jaxpr`` with outputs of zeros of types ``avals`` inserted at ``at``."""
    eqns, zeros = list(jaxpr.eqns), []
    for aval in avals:
        zero = Lit(np.zeros((), aval.dtype))
        if aval.shape == ():
            zeros.append(zero)
            continue
        out = Var(aval)
        params = dict(shape=aval.shape, axes=tuple(range(aval.ndim)))
        eqns.append(JaxprEqn(broadcast_p, [zero], params, [out]))
        zeros.append(out)
    return Jaxpr(jaxpr.in_binders, eqns, jaxpr.outs[:at] + zeros + jaxpr.outs[at:])


@cond_p.def_rule("partial_eval")
def _cond_partial_eval(trace, tracers, **branches):
    pred, *operands = tracers
    if not pred.pval.is_known:
        return trace.stage(cond_p, tracers, branches)
    in_unknowns = [not t.pval.is_known for t in operands]
    known, unknown, out_unknowns, res_avals = split_branches(branches, in_unknowns)
    known_ops, unknown_ops = _split_by(in_unknowns, operands)
    outs = bind(cond_p, pred.pval.const, *[t.pval.const for t in known_ops], **known)
    n = len(outs) - len(res_avals)
    known_outs, residuals = iter(outs[:n]), outs[n:]
    residuals = [trace.instantiate_const(trace.pure(r)) for r in residuals]
    staged_inputs = [trace.instantiate_const(pred), *residuals, *unknown_ops]
    unknown_outs = iter(trace.stage(cond_p, staged_inputs, unknown))
    return [
        next(unknown_outs) if u else trace.pure(next(known_outs)) for u in out_unknowns
    ]


# @title The jaxpr rule: two cond equations joined by residual variables
@cond_p.def_rule("partial_eval_jaxpr")
def _cond_partial_eval_jaxpr(unks_in, eqn):
    (pred_unknown, *in_unknowns), (pred, *operands) = unks_in, eqn.inputs
    if pred_unknown:  # everything waits for the predicate
        known_vars = [
            x for x, u in zip(eqn.inputs, unks_in) if isinstance(x, Var) and not u
        ]
        return None, eqn, [True] * len(eqn.out_binders), known_vars
    known, unknown, out_unknowns, res_avals = split_branches(eqn.params, in_unknowns)
    residuals = [Var(aval) for aval in res_avals]
    outs_known, outs_unknown = _split_by(out_unknowns, eqn.out_binders)
    ins_known, ins_unknown = _split_by(in_unknowns, operands)
    eqn_known = JaxprEqn(cond_p, [pred, *ins_known], known, outs_known + residuals)
    eqn_unknown = JaxprEqn(
        cond_p, [pred, *residuals, *ins_unknown], unknown, outs_unknown
    )
    pred_residual = [pred] if isinstance(pred, Var) else []
    return eqn_known, eqn_unknown, out_unknowns, pred_residual + residuals


@cond_p.def_rule("transpose")
def _cond_transpose(cts, pred, *args, **branches):
    check_predicate_not_linear("cond", pred)
    undefined = tuple(_is_undef(x) for x in args)
    consts, transposed = transform_branches(
        transpose_jaxpr_uncached, branches, undefined
    )
    out_types = [x.aval for x in branches["true_jaxpr"].outs]
    cts = [zeros_like_aval(t) if ct is None else ct for ct, t in zip(cts, out_types)]
    defined = [x for x in args if not _is_undef(x)]
    cts_in = iter(bind(cond_p, pred, *consts, *defined, *cts, **transposed))
    return [None] + [next(cts_in) if u else None for u in undefined]


def switch(index: Any, branches: Sequence[Callable], *operands: Any) -> Any:
    """``branches[index](*operands)``, ``index`` clamped to the list, staged."""
    index, branches = check_switch_args(index, branches)
    return _search_branches(index, branches, 0, operands)


def _search_branches(index, branches, offset: int, operands: tuple) -> Any:
    if len(branches) == 1:  # offset: where branches[0] is in the full list
        return branches[0](*operands)
    middle = len(branches) // 2
    return cond(
        less(index, np.asarray(offset + middle, get_aval(index).dtype)),
        lambda *ops: _search_branches(index, branches[:middle], offset, ops),
        lambda *ops: _search_branches(index, branches[middle:], offset + middle, ops),
        *operands,
    )


# @title Checks: an integer scalar index, a nonempty list of functions
def check_switch_args(index: Any, branches: Any) -> tuple[Any, tuple]:
    index = _as_input(index, "switch index")
    aval = get_aval(index)
    if aval.shape != () or aval.dtype.kind not in "iu":
        raise TypeError(
            f"switch: the index must be an integer scalar, got {aval.str_short()}"
        )
    if not isinstance(branches, (list, tuple)) or not branches:
        raise ValueError(
            f"switch: branches must be a nonempty list of functions, got "
            f"{_short_repr(branches)}"
        )
    for i, fn in enumerate(branches):
        if not callable(fn):
            raise TypeError(f"switch: branches[{i}] must be a function, got "
                            f"{_short_repr(fn)}")  # fmt: skip
    return index, tuple(branches)


# ==== chapter: appendix_primitives ====

sub_p = Primitive("sub")
div_p = Primitive("div")
max_p = Primitive("max")
exp_p = Primitive("exp")
log_p = Primitive("log")
tanh_p = Primitive("tanh")
sqrt_p = Primitive("sqrt")
rsqrt_p = Primitive("rsqrt")
integer_pow_p = Primitive("integer_pow")
convert_element_type_p = Primitive("convert_element_type")
reshape_p = Primitive("reshape")
reduce_max_p = Primitive("reduce_max")
dot_general_p = Primitive("dot_general")

NOT_LINEAR = {
    "sin",
    "cos",
    "gt",
    "lt",
    "exp",
    "log",
    "tanh",
    "sqrt",
    "rsqrt",
    "max",
    "integer_pow",
    "reduce_max",
}


def convert_element_type(x: ArrayLike, dtype: Any) -> ArrayLike:
    """``x`` with its elements converted to ``dtype`` (NumPy's ``astype``)."""
    new_dtype = check_array_dtype("convert_element_type", dtype)
    if get_aval(x).dtype == new_dtype:
        return x
    return bind(convert_element_type_p, x, new_dtype=new_dtype)


@convert_element_type_p.def_rule("jvp")
def _convert_element_type_jvp(primals, tangents, *, new_dtype):
    (x,), (dx,) = primals, tangents
    out = convert_element_type(x, new_dtype)
    if get_aval(x).dtype.kind == "f" and new_dtype.kind == "f":
        return [out], [convert_element_type(dx, new_dtype)]
    return [out], [zeros_like(out)]


@convert_element_type_p.def_rule("transpose")
def _convert_element_type_transpose(cts, x, *, new_dtype):
    (ct,) = cts
    check_float_to_float(x.aval.dtype, new_dtype)
    return [convert_element_type(ct, x.aval.dtype)]


# @title convert_element_type: evaluation, abstract evaluation, batching
import math


@convert_element_type_p.def_rule("impl")
def _convert_element_type_impl(x, *, new_dtype):
    return [np.asarray(x).astype(new_dtype)]


@convert_element_type_p.def_rule("abstract_eval")
def _convert_element_type_abstract_eval(x, *, new_dtype):
    check_new_dtype_param(new_dtype)
    return [ShapedArray(x.shape, new_dtype)]


def _elementwise_vmap_with_params(prim: Primitive) -> None:
    @prim.def_rule("vmap")
    def rule(axis, vals, dims, **params):
        (x,), (ax,) = vals, dims
        return [bind(prim, x, **params)], [ax]


_elementwise_vmap_with_params(convert_element_type_p)


# @title Checks: dtypes that arrays can hold
def check_array_dtype(name: str, dtype: Any) -> np.dtype:
    """``dtype`` as a NumPy dtype of booleans, integers or floats."""
    try:
        new_dtype = None if dtype is None else np.dtype(dtype)
    except TypeError:
        new_dtype = None
    if new_dtype is None:
        raise TypeError(f"{name}: {dtype!r} is not a dtype")
    if new_dtype.kind not in _ARRAY_KINDS or new_dtype.itemsize > 8:
        kinds = {"U": "strings", "S": "bytes", "O": "objects", "c": "complex numbers"}
        what = (
            f" (a dtype of {kinds[new_dtype.kind]})" if new_dtype.kind in kinds else ""
        )
        raise TypeError(
            f"{name}: cannot convert to {new_dtype}{what}; arrays "
            "hold booleans, integers or floats of up to 64 bits"
        )
    return new_dtype


def check_new_dtype_param(new_dtype: Any) -> None:
    if not isinstance(new_dtype, np.dtype) or new_dtype.kind not in _ARRAY_KINDS:
        raise TypeError(
            "convert_element_type: param new_dtype must be a NumPy dtype of "
            f"booleans, integers or floats, got {new_dtype!r}"
        )


def check_float_to_float(old: np.dtype, new: np.dtype) -> None:
    if old.kind != "f" or new.kind != "f":
        raise TypeError(
            "convert_element_type: only float-to-float conversions are linear, "
            f"got {old.name} to {new.name}"
        )


# @title Lowering: a conversion to bool compares with zero
@convert_element_type_p.def_rule("lower")
def _convert_element_type_lower(ctx, avals_in, avals_out, x, *, new_dtype):
    (x_aval,), (out_aval,) = avals_in, avals_out
    if out_aval.dtype == np.bool_ and x_aval.dtype != np.bool_:
        zero = ir_constant(0, x_aval)
        kind = {"f": "FLOAT", "u": "UNSIGNED"}.get(x_aval.dtype.kind, "SIGNED")
        return [
            hlo.compare(
                x,
                zero,
                hlo.ComparisonDirectionAttr.get("NE"),
                compare_type=hlo.ComparisonTypeAttr.get(kind),
            )
        ]
    return [hlo.convert(ir_type(out_aval), x)]


# @title The eight wrappers: bind, after a check for floats where one is needed
def sub(x: ArrayLike, y: ArrayLike) -> ArrayLike:
    """Elementwise ``x - y``."""
    return _bind_binary(sub_p, x, y)


def div(x: ArrayLike, y: ArrayLike) -> ArrayLike:
    """Elementwise ``x / y`` of float arrays."""
    if _is_python_scalar(x) and _is_python_scalar(y):
        x, y = float(x), float(y)
    check_float_arrays("div", x, y)
    return _bind_binary(div_p, x, y)


def maximum(x: ArrayLike, y: ArrayLike) -> ArrayLike:
    """Elementwise larger of ``x`` and ``y``."""
    return _bind_binary(max_p, x, y)


def exp(x: ArrayLike) -> ArrayLike:
    """Elementwise e to the power ``x``, for a float array."""
    _check_kind("exp", x, "f", "a float")
    return bind(exp_p, x)


def log(x: ArrayLike) -> ArrayLike:
    """Elementwise natural logarithm of a float array."""
    _check_kind("log", x, "f", "a float")
    return bind(log_p, x)


def tanh(x: ArrayLike) -> ArrayLike:
    """Elementwise hyperbolic tangent of a float array."""
    _check_kind("tanh", x, "f", "a float")
    return bind(tanh_p, x)


def sqrt(x: ArrayLike) -> ArrayLike:
    """Elementwise square root of a float array."""
    _check_kind("sqrt", x, "f", "a float")
    return bind(sqrt_p, x)


def rsqrt(x: ArrayLike) -> ArrayLike:
    """Elementwise ``1 / sqrt(x)`` of a float array."""
    _check_kind("rsqrt", x, "f", "a float")
    return bind(rsqrt_p, x)


def check_float_arrays(name: str, *operands: ArrayLike) -> None:
    """Operands that are arrays must hold floats (Python numbers adapt)."""
    for operand in operands:
        if not _is_python_scalar(operand):
            _check_kind(name, operand, "f", "a float")


for _prim, _np_fn in [
    (sub_p, np.subtract),
    (div_p, np.divide),
    (max_p, np.maximum),
    (exp_p, np.exp),
    (log_p, np.log),
    (tanh_p, np.tanh),
    (sqrt_p, np.sqrt),
    (rsqrt_p, lambda x: 1 / np.sqrt(x)),
]:
    _impl_from_numpy(_prim, _np_fn)

_binary_abstract_eval(max_p)


@sub_p.def_rule("abstract_eval")
def _sub_abstract_eval(x, y):
    check_binary_operands("sub", x, y)
    if x.dtype == np.bool_:  # as in NumPy and JAX
        raise TypeError("sub: booleans cannot be subtracted; use != for exclusive or")
    return [ShapedArray(x.shape, x.dtype)]


_unary_abstract_eval(exp_p, "f", "a float")
_unary_abstract_eval(log_p, "f", "a float")
_unary_abstract_eval(tanh_p, "f", "a float")
_unary_abstract_eval(sqrt_p, "f", "a float")
_unary_abstract_eval(rsqrt_p, "f", "a float")

for _prim in [sub_p, div_p, max_p]:
    _binary_vmap(_prim)
for _prim in [exp_p, log_p, tanh_p, sqrt_p, rsqrt_p]:
    _unary_vmap(_prim)

_lower_with(sub_p, hlo.subtract)
_lower_with(div_p, hlo.divide)
_lower_with(max_p, hlo.maximum)
_lower_with(exp_p, hlo.exponential)
_lower_with(log_p, hlo.log)
_lower_with(tanh_p, hlo.tanh)
_lower_with(sqrt_p, hlo.sqrt)
_lower_with(rsqrt_p, hlo.rsqrt)


# @title div's abstract evaluation: same shapes, float operands
@div_p.def_rule("abstract_eval")
def _div_abstract_eval(x, y):
    check_binary_operands("div", x, y)
    if x.dtype.kind != "f":
        raise TypeError(f"div: expected float arrays, got {x.str_short()}")
    return [ShapedArray(x.shape, x.dtype)]


eq_p = Primitive("eq")
ne_p = Primitive("ne")
le_p = Primitive("le")
ge_p = Primitive("ge")
NOT_LINEAR.update(["eq", "ne", "le", "ge"])

for _prim, _np_fn, _direction in [
    (eq_p, np.equal, "EQ"),
    (ne_p, np.not_equal, "NE"),
    (le_p, np.less_equal, "LE"),
    (ge_p, np.greater_equal, "GE"),
]:
    _impl_from_numpy(_prim, _np_fn)
    _comparison_jvp(_prim)
    _binary_vmap(_prim)
    _binary_abstract_eval(_prim, out_dtype=np.bool_)
    _lower_comparison(_prim, _direction)


# @title The four wrappers: equal not_equal less_equal greater_equal, strict
def equal(x: ArrayLike, y: ArrayLike) -> ArrayLike:
    """Elementwise ``x == y``, a boolean array (the primitive ``eq``)."""
    return _bind_binary(eq_p, x, y)


def not_equal(x: ArrayLike, y: ArrayLike) -> ArrayLike:
    """Elementwise ``x != y``, a boolean array (the primitive ``ne``)."""
    return _bind_binary(ne_p, x, y)


def less_equal(x: ArrayLike, y: ArrayLike) -> ArrayLike:
    """Elementwise ``x <= y``, a boolean array (the primitive ``le``)."""
    return _bind_binary(le_p, x, y)


def greater_equal(x: ArrayLike, y: ArrayLike) -> ArrayLike:
    """Elementwise ``x >= y``, a boolean array (the primitive ``ge``)."""
    return _bind_binary(ge_p, x, y)


_linear_jvp(sub_p)


@exp_p.def_rule("jvp")
def _exp_jvp(primals, tangents):
    (x,), (dx,) = primals, tangents
    out = exp(x)
    return [out], [mul(dx, out)]


@log_p.def_rule("jvp")
def _log_jvp(primals, tangents):
    (x,), (dx,) = primals, tangents
    return [log(x)], [div(dx, x)]


@tanh_p.def_rule("jvp")
def _tanh_jvp(primals, tangents):
    (x,), (dx,) = primals, tangents
    out = tanh(x)
    return [out], [mul(dx, sub(1.0, mul(out, out)))]


@sqrt_p.def_rule("jvp")
def _sqrt_jvp(primals, tangents):
    (x,), (dx,) = primals, tangents
    out = sqrt(x)
    return [out], [div(dx, mul(out, 2.0))]


@rsqrt_p.def_rule("jvp")
def _rsqrt_jvp(primals, tangents):
    (x,), (dx,) = primals, tangents
    out = rsqrt(x)
    return [out], [mul(dx, mul(div(out, x), -0.5))]


@div_p.def_rule("jvp")
def _div_jvp(primals, tangents):
    (x, y), (dx, dy) = primals, tangents
    out = div(x, y)
    return [out], [div(sub(dx, mul(out, dy)), y)]


@max_p.def_rule("jvp")
def _max_jvp(primals, tangents):
    (x, y), (dx, dy) = primals, tangents
    out = maximum(x, y)
    dtype = get_aval(out).dtype
    if dtype.kind != "f":
        return [out], [zeros_like(out)]
    x_wins = convert_element_type(greater(x, y), dtype)  # 1.0 or 0.0
    y_wins = convert_element_type(less(x, y), dtype)
    half_if_tie = mul(convert_element_type(equal(x, y), dtype), 0.5)
    d_out = add(mul(dx, add(x_wins, half_if_tie)), mul(dy, add(y_wins, half_if_tie)))
    return [out], [d_out]


@sub_p.def_rule("transpose")
def _sub_transpose(cts, x, y):
    (ct,) = cts
    return [ct if _is_undef(x) else None, neg(ct) if _is_undef(y) else None]


@div_p.def_rule("transpose")
def _div_transpose(cts, x, y):
    (ct,) = cts
    if _is_undef(y):
        raise TypeError("div: transposing a division by a linear value")
    return [div(ct, y), None]


stop_gradient_p = Primitive("stop_gradient")


def stop_gradient(x: Any) -> Any:
    """``x`` (any pytree), treated as a constant by differentiation."""
    return tree_map(lambda leaf: bind(stop_gradient_p, leaf), x)


@stop_gradient_p.def_rule("jvp")
def _stop_gradient_jvp(primals, tangents):
    (x,) = primals
    return [stop_gradient(x)], [zeros_like(x)]


NEVER_TRANSPOSED = {"stop_gradient"}  # linear, but never in a linear jaxpr

# @title The other rules of stop_gradient: the identity's
_impl_from_numpy(stop_gradient_p, np.asarray)
_unary_abstract_eval(stop_gradient_p, "biuf", "a numeric")
_unary_vmap(stop_gradient_p)
_lower_with(stop_gradient_p, lambda x: x)


def integer_pow(x: ArrayLike, y: int) -> ArrayLike:
    """Elementwise ``x ** y`` for an integer exponent ``y``."""
    check_integer_power(x, y)
    return bind(integer_pow_p, x, y=int(y))


# @title Checks: an integer exponent, a numeric base; evaluation, abstract evaluation
@integer_pow_p.def_rule("impl")
def _integer_pow_impl(x, *, y):
    return [np.power(x, y)]


@integer_pow_p.def_rule("abstract_eval")
def _integer_pow_abstract_eval(x, *, y):
    check_integer_power_types(x, y)
    return [ShapedArray(x.shape, x.dtype)]


def check_integer_power(x: ArrayLike, y: Any) -> None:
    if not _is_axis(y):  # a Python or NumPy integer, not a bool
        raise TypeError(
            f"integer_pow: the exponent must be an integer, got {_describe(y)}; "
            "for other powers use lax.pow (which ** and jnp.power choose)"
        )
    _check_kind("integer_pow", x, "iuf", "a numeric (not boolean)")
    if y < 0 and get_aval(x).dtype.kind != "f":
        raise ValueError(
            f"integer_pow: integers cannot be raised to the negative power {y}; "
            "convert them to float first"
        )


def check_integer_power_types(x: ShapedArray, y: Any) -> None:
    if not _is_axis(y) or x.dtype.kind not in "iuf" or (y < 0 and x.dtype.kind != "f"):
        raise TypeError(f"integer_pow: cannot raise {x.str_short()} to the power {y!r}")


def _describe(value: Any) -> str:
    """A value for an error message: an array or tracer by its type."""
    if isinstance(value, (Tracer, np.ndarray, *DEVICE_ARRAY_TYPES)):
        return f"an array of type {get_aval(value).str_short()}"
    return _short_repr(value)


@integer_pow_p.def_rule("jvp")
def _integer_pow_jvp(primals, tangents, *, y):
    (x,), (dx,) = primals, tangents
    out = integer_pow(x, y)
    if y == 0 or get_aval(out).dtype.kind != "f":
        return [out], [zeros_like(out)]
    slope = x if y == 2 else integer_pow(x, y - 1)  # x**1 is x: no integer_pow[y=1]
    return [out], [mul(dx, mul(slope, float(y)))]


_elementwise_vmap_with_params(integer_pow_p)


# @title Lowering: square repeatedly, multiply the squares the exponent's bits select
@integer_pow_p.def_rule("lower")
def _integer_pow_lower(ctx, avals_in, avals_out, x, *, y):
    (aval,) = avals_in
    result, square, n = None, x, abs(y)
    while n:
        if n & 1:  # this binary digit of the exponent is set
            result = square if result is None else hlo.multiply(result, square)
        n >>= 1
        if n:
            square = hlo.multiply(square, square)
    if result is None:  # y == 0
        result = ir_constant(1, aval)
    if y < 0:
        result = hlo.divide(ir_constant(1, aval), result)
    return [result]


pow_p = Primitive("pow")
NOT_LINEAR.add("pow")


@pow_p.def_rule("jvp")
def _pow_jvp(primals, tangents):
    (x, y), (dx, dy) = primals, tangents
    out = general_pow(x, y)
    dtype = get_aval(x).dtype
    y_float = convert_element_type(y, dtype)
    ones = np.ones(get_aval(x).shape, dtype)
    if get_aval(y).dtype.kind == "f":
        slope_x = mul(y_float, general_pow(x, sub(y_float, ones)))
        slope_y = mul(log(select(equal(x, zeros_like(x)), ones, x)), out)
        return [out], [add(mul(dx, slope_x), mul(dy, slope_y))]
    y_is_0 = equal(y_float, zeros_like(y_float))
    y_or_1 = select(y_is_0, ones, y_float)  # no 0 * inf in the unused branch
    slope_x = mul(y_or_1, general_pow(x, sub(y_float, ones)))
    return [out], [mul(dx, select(y_is_0, zeros_like(x), slope_x))]


# @title lax.pow: the wrapper and checks, evaluation, typing, batching, lowering
def general_pow(x: ArrayLike, y: ArrayLike) -> ArrayLike:
    """Elementwise ``x ** y``: a float ``x``; ``y`` of ``x``'s dtype or integer."""
    x, y = _pow_operands(x, y)
    return bind(pow_p, x, y)


def _pow_operands(x: ArrayLike, y: ArrayLike) -> tuple[ArrayLike, ArrayLike]:
    """Python numbers become arrays shaped like the other operand: a float
    base as the exponent's float dtype (or float64), an exponent as int64 or
    the base's dtype; then the operands are checked."""
    if _is_python_scalar(x):
        y_dtype = np.float64 if _is_python_scalar(y) else get_aval(y, "pow", 1).dtype
        x = np.asarray(float(x), y_dtype if y_dtype.kind == "f" else np.float64)
    if _is_python_scalar(y) and type(y) is not bool:
        y = np.asarray(y, np.int64 if type(y) is int else get_aval(x, "pow").dtype)
    x_aval, y_aval = get_aval(x, "pow", 0), get_aval(y, "pow", 1)
    if y_aval.ndim == 0 and x_aval.ndim:
        y = broadcast(y, x_aval.shape, tuple(range(x_aval.ndim)))
    elif x_aval.ndim == 0 and y_aval.ndim:
        x = broadcast(x, y_aval.shape, tuple(range(y_aval.ndim)))
    check_pow_types(get_aval(x), get_aval(y))
    return x, y


def check_pow_types(x: ShapedArray, y: ShapedArray) -> None:
    if x.dtype.kind != "f" or not (y.dtype == x.dtype or y.dtype.kind in "iu"):
        raise TypeError(
            f"pow: the base must be a float array and the exponent an integer "
            f"array or a float array of the base's dtype, got {x.str_short()} "
            f"and {y.str_short()}"
        )
    if x.shape != y.shape:
        raise TypeError(
            f"pow: operands must have the same shape, got {x.str_short()} and "
            f"{y.str_short()}"
        )


@pow_p.def_rule("impl")
def _pow_impl(x, y):
    return [np.power(x, np.asarray(y, x.dtype))]


@pow_p.def_rule("abstract_eval")
def _pow_abstract_eval(x, y):
    check_pow_types(x, y)
    return [ShapedArray(x.shape, x.dtype)]


_binary_vmap(pow_p)


@pow_p.def_rule("lower")
def _pow_lower(ctx, avals_in, avals_out, x, y):
    x_aval, y_aval = avals_in
    if y_aval.dtype != x_aval.dtype:
        y = hlo.convert(ir_type(ShapedArray(y_aval.shape, x_aval.dtype)), y)
    return [hlo.power(x, y)]


def reshape(x: ArrayLike, shape: int | Sequence[int]) -> ArrayLike:
    """The elements of ``x``, in row-major order, in an array of ``shape``."""
    aval = get_aval(x)
    shape = check_reshape(aval, shape)  # sizes, at most one -1, that fit x
    if -1 in shape:
        known = math.prod(d for d in shape if d != -1)
        shape = tuple(aval.size // known if d == -1 else d for d in shape)
    if shape == aval.shape:
        return x
    return bind(reshape_p, x, new_sizes=shape)


# @title Checks: a shape that holds all the elements
def check_reshape(aval: ShapedArray, shape: Any) -> tuple:
    """``shape`` as a tuple, checked against the size of ``aval``."""
    if _is_axis(shape):
        shape = (shape,)
    shape = _check_shape_or_hole("reshape", shape)
    if -1 in shape:
        known = math.prod(d for d in shape if d != -1)
        if known == 0 or aval.size % known:
            raise ValueError(
                f"reshape: cannot reshape {aval.str_short()} ({aval.size} "
                f"elements) into shape {shape}"
            )
    elif math.prod(shape) != aval.size:
        raise ValueError(
            f"reshape: cannot reshape {aval.str_short()} ({aval.size} elements) "
            f"into shape {shape} ({math.prod(shape)} elements)"
        )
    return shape


def _check_shape_or_hole(name: str, shape: Any) -> tuple:
    """Like _check_shape, but one entry may be -1."""
    try:
        dims = tuple(shape)
    except TypeError:
        raise TypeError(
            f"{name}: shape must be a sequence of integers, got {shape!r}"
        ) from None
    holes = [i for i, d in enumerate(dims) if _is_axis(d) and d == -1]
    if len(holes) > 1:
        raise ValueError(f"{name}: at most one entry of the shape can be -1: {dims}")
    try:
        checked = _check_shape(
            name, [0 if i in holes else d for i, d in enumerate(dims)]
        )
    except ValueError:
        raise ValueError(
            f"{name}: shape must contain non-negative integers and at most one "
            f"-1, got {dims}"
        ) from None
    return tuple(-1 if i in holes else d for i, d in enumerate(checked))


def check_reshape_param(x: ShapedArray, new_sizes: Any) -> tuple:
    if not isinstance(new_sizes, tuple):
        raise TypeError(f"reshape: param new_sizes must be a tuple, got {new_sizes!r}")
    shape = _check_shape("reshape", new_sizes)
    if math.prod(shape) != x.size:
        raise ValueError(f"reshape: cannot reshape {x.str_short()} into shape {shape}")
    return shape


# @title The rules of reshape: linear; a batch axis kept in front
@reshape_p.def_rule("impl")
def _reshape_impl(x, *, new_sizes):
    return [np.reshape(np.asarray(x), new_sizes)]


@reshape_p.def_rule("abstract_eval")
def _reshape_abstract_eval(x, *, new_sizes):
    return [ShapedArray(check_reshape_param(x, new_sizes), x.dtype)]


_linear_jvp(reshape_p)


@reshape_p.def_rule("vmap")
def _reshape_vmap(axis, vals, dims, *, new_sizes):
    (x,), (bdim,) = vals, dims
    front = move_batch_axis(axis.size, bdim, 0, x)
    return [bind(reshape_p, front, new_sizes=(axis.size, *new_sizes))], [0]


@reshape_p.def_rule("lower")
def _reshape_lower(ctx, avals_in, avals_out, x, *, new_sizes):
    return [hlo.reshape(ir_type(avals_out[0]), x)]


@reshape_p.def_rule("transpose")
def _reshape_transpose(cts, x, *, new_sizes):
    (ct,) = cts
    return [reshape(ct, x.aval.shape)]


def reduce_max(x: ArrayLike, axis: int | Sequence[int] | None = None) -> ArrayLike:
    """The largest element over ``axis`` (an int, ints, or None for all axes)."""
    _check_kind("reduce_max", x, "iuf", "a numeric (not boolean)")
    ndim = get_aval(x).ndim
    axes = range(ndim) if axis is None else axis
    return bind(reduce_max_p, x, axes=_normalize_axes("reduce_max", axes, ndim))


def _max_identity(dtype: np.dtype) -> Any:
    """The identity of max: -inf, or the smallest integer of the dtype."""
    dtype = np.dtype(dtype)
    return -np.inf if dtype.kind == "f" else np.iinfo(dtype).min


# @title reduce_max: evaluation, abstract evaluation, batching, lowering to a reduce
@reduce_max_p.def_rule("impl")
def _reduce_max_impl(x, *, axes):
    return [np.max(np.asarray(x), axis=axes, initial=_max_identity(x.dtype))]


@reduce_max_p.def_rule("abstract_eval")
def _reduce_max_abstract_eval(x, *, axes):
    check_reduce_max_types(x, axes)
    return [ShapedArray([d for i, d in enumerate(x.shape) if i not in axes], x.dtype)]


def check_reduce_max_types(x: ShapedArray, axes: Any) -> None:
    if x.dtype.kind not in "iuf":
        raise TypeError(f"reduce_max: expected a numeric array, got {x.str_short()}")
    _check_canonical_axes("reduce_max", "axes", axes, x.ndim)


@reduce_max_p.def_rule("vmap")
def _reduce_max_vmap(axis, vals, dims, *, axes):
    (x,), (bdim,) = vals, dims
    full_axes = tuple(a if a < bdim else a + 1 for a in axes)
    out_bdim = bdim - sum(1 for a in axes if a < bdim)
    return [bind(reduce_max_p, x, axes=full_axes)], [out_bdim]


@reduce_max_p.def_rule("lower")
def _reduce_max_lower(ctx, avals_in, avals_out, x, *, axes):
    (x_aval,), (out_aval,) = avals_in, avals_out
    scalar = ShapedArray((), x_aval.dtype)
    lowest = ir_constant(_max_identity(x_aval.dtype), scalar)
    reduce = hlo.ReduceOp(
        [ir_type(out_aval)], [x], [lowest], ir.DenseI64ArrayAttr.get(axes)
    )
    body = reduce.regions[0].blocks.append(ir_type(scalar), ir_type(scalar))
    with ir.InsertionPoint(body):
        hlo.ReturnOp([hlo.maximum(*body.arguments)])
    return [reduce.result]


@reduce_max_p.def_rule("jvp")
def _reduce_max_jvp(primals, tangents, *, axes):
    (x,), (dx,) = primals, tangents
    out = reduce_max(x, axes)
    aval = get_aval(x)
    if aval.dtype.kind != "f":
        return [out], [zeros_like(out)]
    spread = broadcast(out, aval.shape, axes)
    is_winner = convert_element_type(equal(x, spread), aval.dtype)
    winners = reduce_sum(is_winner, axes)
    return [out], [div(reduce_sum(mul(dx, is_winner), axes), winners)]


def _free_axes(ndim: int, *used: tuple[int, ...]) -> list[int]:
    """The axes among ``range(ndim)`` in none of the tuples ``used``."""
    taken = {a for axes in used for a in axes}
    return [a for a in range(ndim) if a not in taken]


def dot_general(x: ArrayLike, y: ArrayLike, dimension_numbers: Any) -> ArrayLike:
    """Multiply ``x`` and ``y`` along paired axes, summing the contracted ones."""
    x, y = (_as_input(v, "dot_general") for v in (x, y))
    dims = _check_dot_dims(get_aval(x), get_aval(y), dimension_numbers)
    return bind(dot_general_p, x, y, dimension_numbers=dims)


@dot_general_p.def_rule("abstract_eval")
def _dot_general_abstract_eval(x, y, *, dimension_numbers):
    check_canonical_dot_dims(x, y, dimension_numbers)
    (xc, yc), (xb, yb) = dimension_numbers
    shape = [x.shape[i] for i in xb]
    shape += [x.shape[i] for i in _free_axes(x.ndim, xc, xb)]
    shape += [y.shape[j] for j in _free_axes(y.ndim, yc, yb)]
    return [ShapedArray(shape, x.dtype)]


# @title Checks: dimension numbers that fit the operands
def _check_dot_dims(x: ShapedArray, y: ShapedArray, dims: Any) -> tuple:
    """Check ``((x_contract, y_contract), (x_batch, y_batch))`` against the
    operand types, and return it in canonical form (tuples of ints)."""
    try:
        (xc, yc), (xb, yb) = dims
    except (TypeError, ValueError):
        raise TypeError(
            "dot_general: dimension_numbers must be ((x_contract, y_contract), "
            f"(x_batch, y_batch)), got {dims!r}"
        ) from None
    xc, xb = (_normalize_axes("dot_general", axes, x.ndim) for axes in (xc, xb))
    yc, yb = (_normalize_axes("dot_general", axes, y.ndim) for axes in (yc, yb))
    if len(xc) != len(yc) or len(xb) != len(yb):
        raise ValueError(
            "dot_general: x and y need as many contracting axes as each other, "
            f"and as many batch axes; got {dims}"
        )
    if set(xc) & set(xb) or set(yc) & set(yb):
        raise ValueError(f"dot_general: an axis is both contracting and batch: {dims}")
    for kind, x_axes, y_axes in [("contracting", xc, yc), ("batch", xb, yb)]:
        for i, j in zip(x_axes, y_axes):
            if x.shape[i] != y.shape[j]:
                raise TypeError(
                    f"dot_general: {kind} axis {i} of x {x.str_short()} has size "
                    f"{x.shape[i]}, but {kind} axis {j} of y {y.str_short()} has "
                    f"size {y.shape[j]}"
                )
    if x.dtype != y.dtype:
        raise TypeError(
            f"dot_general: operands must have the same dtype, got {x.str_short()} "
            f"and {y.str_short()} (use convert_element_type to make them match)"
        )
    if x.dtype.kind not in "iuf":
        raise TypeError(f"dot_general: expected numeric arrays, got {x.str_short()}")
    return ((xc, yc), (xb, yb))


def check_canonical_dot_dims(x: ShapedArray, y: ShapedArray, dims: Any) -> None:
    if _check_dot_dims(x, y, dims) != dims:
        raise TypeError(
            f"dot_general: param dimension_numbers={dims!r} is not "
            "in canonical form (tuples of non-negative ints)"
        )


# @title Evaluation with np.einsum; lowering to StableHLO's dot_general
@dot_general_p.def_rule("impl")
def _dot_general_impl(x, y, *, dimension_numbers):
    (xc, yc), (xb, yb) = dimension_numbers
    x_letters = [chr(ord("a") + i) for i in range(np.ndim(x))]
    y_letters = [chr(ord("A") + j) for j in range(np.ndim(y))]
    for i, j in zip(xc + xb, yc + yb):
        y_letters[j] = x_letters[i]  # paired axes share a letter
    out = [x_letters[i] for i in xb]
    out += [x_letters[i] for i in _free_axes(np.ndim(x), xc, xb)]
    out += [y_letters[j] for j in _free_axes(np.ndim(y), yc, yb)]
    spec = f"{''.join(x_letters)},{''.join(y_letters)}->{''.join(out)}"
    return [np.einsum(spec, x, y)]


@dot_general_p.def_rule("lower")
def _dot_general_lower(ctx, avals_in, avals_out, x, y, *, dimension_numbers):
    (xc, yc), (xb, yb) = dimension_numbers
    dims = hlo.DotDimensionNumbers.get(
        lhs_batching_dimensions=list(xb),
        rhs_batching_dimensions=list(yb),
        lhs_contracting_dimensions=list(xc),
        rhs_contracting_dimensions=list(yc),
    )
    return [hlo.dot_general(ir_type(avals_out[0]), x, y, dims)]


@dot_general_p.def_rule("jvp")
def _dot_general_jvp(primals, tangents, *, dimension_numbers):
    (x, y), (dx, dy) = primals, tangents
    params = dict(dimension_numbers=dimension_numbers)
    out = bind(dot_general_p, x, y, **params)
    d_out = add(
        bind(dot_general_p, dx, y, **params), bind(dot_general_p, x, dy, **params)
    )
    return [out], [d_out]


def _shift_axes(axes: tuple[int, ...], bdim: int) -> tuple[int, ...]:
    """Renumber axes after a batch axis has been inserted at ``bdim``."""
    return tuple(a + 1 if a >= bdim else a for a in axes)


@dot_general_p.def_rule("vmap")
def _dot_general_vmap(axis, vals, dims, *, dimension_numbers):
    (x, y), (bx, by) = vals, dims
    (xc, yc), (xb, yb) = dimension_numbers
    if bx is not None and by is not None:
        xc, xb = _shift_axes(xc, bx), (bx, *_shift_axes(xb, bx))
        yc, yb = _shift_axes(yc, by), (by, *_shift_axes(yb, by))
        out_dim = 0
    elif bx is not None:
        xc, xb = _shift_axes(xc, bx), _shift_axes(xb, bx)
        x_free = _free_axes(get_aval(x).ndim, xc, xb)
        out_dim = len(xb) + x_free.index(bx)
    else:
        yc, yb = _shift_axes(yc, by), _shift_axes(yb, by)
        num_x_free = len(_free_axes(get_aval(x).ndim, xc, xb))
        y_free = _free_axes(get_aval(y).ndim, yc, yb)
        out_dim = len(xb) + num_x_free + y_free.index(by)
    out = bind(dot_general_p, x, y, dimension_numbers=((xc, yc), (xb, yb)))
    return [out], [out_dim]


# @title Helpers: _argsort, _transpose_unless_identity, _aval_of
def _argsort(values: Sequence[int]) -> list[int]:
    return sorted(range(len(values)), key=values.__getitem__)


def _transpose_unless_identity(x: Any, perm: list[int]) -> Any:
    return x if perm == sorted(perm) else transpose(x, perm)


def _aval_of(x: Any) -> ShapedArray:
    return x.aval if _is_undef(x) else get_aval(x)


@dot_general_p.def_rule("transpose")
def _dot_general_transpose(cts, x, y, *, dimension_numbers):
    (ct,) = cts
    (xc, yc), (xb, yb) = dimension_numbers
    if _is_undef(x) and _is_undef(y):
        raise TypeError("dot_general: transposing a product of two linear values")
    x_free = _free_axes(_aval_of(x).ndim, xc, xb)
    y_free = _free_axes(_aval_of(y).ndim, yc, yb)
    # The cotangent's axes: batch, then x's free axes, then y's free axes.
    ct_batch = tuple(range(len(xb)))
    ct_x_free = tuple(range(len(xb), len(xb) + len(x_free)))
    ct_y_free = tuple(range(len(xb) + len(x_free), get_aval(ct).ndim))
    if _is_undef(x):
        dims = ((ct_y_free, tuple(y_free)), (ct_batch, yb))
        x_bar = bind(dot_general_p, ct, y, dimension_numbers=dims)
        # Which axis of x each axis of x_bar stands for:
        stands_for = [*xb, *x_free, *(xc[i] for i in _argsort(yc))]
        return [_transpose_unless_identity(x_bar, _argsort(stands_for)), None]
    dims = ((ct_x_free, tuple(x_free)), (ct_batch, xb))
    y_bar = bind(dot_general_p, ct, x, dimension_numbers=dims)
    stands_for = [*yb, *y_free, *(yc[i] for i in _argsort(xc))]
    return [None, _transpose_unless_identity(y_bar, _argsort(stands_for))]


def broadcast_shapes(
    name: str, *shapes: Sequence[int], described: str | None = None
) -> tuple[int, ...]:
    """The shape NumPy's broadcasting gives ``shapes``, or a TypeError."""
    ndim = max(len(s) for s in shapes)
    padded = [(1,) * (ndim - len(s)) + tuple(s) for s in shapes]
    result = []
    for axis, sizes in enumerate(zip(*padded)):
        other_than_one = {d for d in sizes if d != 1}
        if len(other_than_one) > 1:
            raise _not_broadcastable(name, shapes, described, axis - ndim, sizes)
        result.append(other_than_one.pop() if other_than_one else 1)
    return tuple(result)


def broadcast_to(x: ArrayLike, shape: Sequence[int]) -> ArrayLike:
    """``x`` broadcast to ``shape`` by NumPy's rules, as explicit equations."""
    aval = get_aval(x)
    shape = check_broadcast_to(aval, shape)
    lead = len(shape) - aval.ndim
    if aval.shape == shape:
        return x
    growing = [i for i, d in enumerate(aval.shape) if d == 1 and shape[lead + i] != 1]
    x = reshape(x, [d for i, d in enumerate(aval.shape) if i not in growing])
    return broadcast(x, shape, [*range(lead), *(lead + i for i in growing)])


def _broadcast_operands(name: str, *args: ArrayLike) -> list[ArrayLike]:
    """Broadcast the array operands to their common shape; numbers stay numbers."""
    avals = [
        get_aval(a, name, i) for i, a in enumerate(args) if not _is_python_scalar(a)
    ]
    if all(aval.shape == avals[0].shape for aval in avals):
        return list(args)  # the common case: nothing to do
    described = " and ".join(aval.str_short() for aval in avals)
    shape = broadcast_shapes(name, *(a.shape for a in avals), described=described)
    return [a if _is_python_scalar(a) else broadcast_to(a, shape) for a in args]


# @title Checks: shapes that broadcast
def _not_broadcastable(name, shapes, described, axis, sizes) -> TypeError:
    """The error for ``shapes`` whose ``sizes`` clash at ``axis`` (negative).
    ``described`` names the operands in the message (default: the shapes)."""
    described = described or " and ".join(str(tuple(s)) for s in shapes)
    return TypeError(
        f"{name}: operands must have the same shape, or shapes that "
        f"broadcast; got {described}, whose sizes at axis {axis} "
        f"are {' and '.join(map(str, sizes))} (they must be equal, or 1)"
    )


def check_broadcast_to(aval: ShapedArray, shape: Any) -> tuple:
    """``shape`` as a tuple that ``aval`` broadcasts to."""
    shape = _check_shape("broadcast_to", shape)
    lead = len(shape) - aval.ndim
    if lead < 0 or broadcast_shapes("broadcast_to", aval.shape, shape) != shape:
        raise TypeError(
            f"broadcast_to: cannot broadcast {aval.str_short()} to shape {shape}"
        )
    return shape


def _operands_alike(name: str, *args: ArrayLike) -> list[ArrayLike]:
    """Promote and broadcast, then make Python numbers arrays like the other
    operands: what the strict wrappers would accept."""
    args = _broadcast_operands(name, *promote_operands(name, *args))
    arrays = [a for a in args if not _is_python_scalar(a)]
    if not arrays:
        dtype = np.result_type(*(type(a) for a in args))
        return [np.asarray(a, dtype) for a in args]
    args = [
        _scalar_like(name, a, arrays[0]) if _is_python_scalar(a) else a for a in args
    ]
    for other in args[1:]:
        check_binary_operands(name, get_aval(args[0]), get_aval(other))
    return args


import functools

PROMOTION_LATTICE = {  # each dtype -> the dtypes just above it
    "bool": ["int"],  # "int", "float": Python's weakly typed numbers
    "int": ["uint8", "int8"],
    "uint8": ["uint16", "int16"],
    "uint16": ["uint32", "int32"],
    "uint32": ["uint64", "int64"],
    "uint64": ["float"],
    "int8": ["int16"],
    "int16": ["int32"],
    "int32": ["int64"],
    "int64": ["float"],
    "float": ["float16"],
    "float16": ["float32"],
    "float32": ["float64"],
    "float64": [],
}


@functools.cache
def _at_or_above(name: str) -> frozenset:
    return frozenset([name]).union(*map(_at_or_above, PROMOTION_LATTICE[name]))


@functools.cache  # a lookup after the first time: operators call it often
def promote_types(*names: str) -> np.dtype:
    """The lowest dtype at or above all of ``names``; a weak result is 64-bit."""
    common = frozenset.intersection(*map(_at_or_above, names))
    lowest = next(n for n in common if common <= _at_or_above(n))
    return np.dtype({"int": "int64", "float": "float64"}.get(lowest, lowest))


def promote_operands(name: str, *args: ArrayLike) -> list[ArrayLike]:
    """Convert the arrays among ``args`` to their promoted dtype; Python
    numbers stay numbers (the strict wrappers shape them like the arrays)."""
    if all(map(_is_python_scalar, args)):
        return list(args)
    dtype = promote_types(*(_dtype_name(name, a) for a in args))
    return [a if _is_python_scalar(a) else convert_element_type(a, dtype) for a in args]


# @title _dtype_name, as_inexact, _on_inexact: lattice nodes; ints become floats
def _dtype_name(name: str, x: Any) -> str:
    if type(x) in (int, float):  # bool is not weak, as in JAX
        return type(x).__name__
    dtype = np.dtype(bool) if type(x) is bool else get_aval(x, name).dtype
    if dtype.name not in PROMOTION_LATTICE:
        raise TypeError(f"{name}: unsupported dtype {dtype.name}")
    return dtype.name


def inexact_dtype(dtype: np.dtype) -> np.dtype:
    """A float dtype stays; an integer or boolean one becomes a float
    (64-bit integers: float64; narrower ones and booleans: float32), as JAX."""
    if dtype.kind == "f":
        return dtype
    return np.dtype(np.float64 if dtype.itemsize == 8 else np.float32)


def _on_inexact(fn: Callable) -> Callable:
    """``fn`` (a float-only wrapper) applied to ``as_inexact`` of its input."""

    def on_inexact(x: ArrayLike) -> ArrayLike:
        return fn(as_inexact(fn.__name__, x))

    on_inexact.__name__, on_inexact.__doc__ = fn.__name__, fn.__doc__
    return on_inexact


def as_inexact(name: str, x: ArrayLike, position: int = 0) -> ArrayLike:
    """``x`` converted to its inexact dtype (a Python number to a float)."""
    if _is_python_scalar(x):
        return float(x)
    dtype = get_aval(x, name, position).dtype  # a clear error for a non-array
    return convert_element_type(x, inexact_dtype(dtype))


# @title The module autodidax.numpy, and the decorator that fills it
import sys
import types

numpy_namespace = types.ModuleType("autodidax.numpy", "NumPy-style functions.")


Axes = int | Sequence[int] | None  # the axis argument of the reductions


def numpy_function(fn: Callable) -> Callable:
    """Decorator: put ``numpy_<name>`` into the namespace as ``<name>``."""
    setattr(numpy_namespace, fn.__name__.removeprefix("numpy_"), fn)
    return fn


numpy = numpy_namespace  # for `from autodidax import numpy as anp`
if __name__ != "__main__":  # in the module: `import autodidax.numpy as anp`
    sys.modules[f"{__name__}.numpy"] = numpy_namespace


def _broadcasting(name: str, strict: Callable) -> Callable:
    """A NumPy-style binary function: promote, broadcast, call ``strict``."""

    def fn(x: ArrayLike, y: ArrayLike) -> ArrayLike:
        return strict(*_broadcast_operands(name, *promote_operands(name, x, y)))

    fn.__name__ = f"numpy_{name}"
    fn.__doc__ = f"``{strict.__name__}`` with JAX's promotion and broadcasting."
    return numpy_function(fn)


numpy_add = _broadcasting("add", add)
numpy_multiply = _broadcasting("multiply", mul)

# @title The rest of autodidax.numpy
numpy_subtract = _broadcasting("subtract", sub)
numpy_maximum = _broadcasting("maximum", maximum)
numpy_greater = _broadcasting("greater", greater)
numpy_less = _broadcasting("less", less)
for _fn in [reshape, broadcast_to, zeros_like]:
    setattr(numpy_namespace, _fn.__name__, _fn)
for _fn in [sin, cos, exp, log, tanh, sqrt, rsqrt]:  # integers become floats first
    setattr(numpy_namespace, _fn.__name__, _on_inexact(_fn))


@numpy_function
def numpy_mean(x: ArrayLike, axis: Axes = None, keepdims: bool = False) -> ArrayLike:
    """Average over ``axis`` (all axes by default); integers give floats."""
    x = as_inexact("mean", x)
    ndim = get_aval(x).ndim
    axes = range(ndim) if axis is None else _normalize_axes("mean", axis, ndim)
    count = math.prod(get_aval(x).shape[a] for a in axes)
    return _keep_dims(div(reduce_sum(x, axis), float(count)), x, axis, keepdims)


def _keep_dims(out: ArrayLike, x: ArrayLike, axis: Axes, keepdims: bool) -> ArrayLike:
    """With ``keepdims``, ``out`` reshaped so the reduced axes stay, as 1s."""
    if not keepdims:
        return out
    shape = get_aval(x).shape
    axes = range(len(shape)) if axis is None else _normalize_axes("", axis, len(shape))
    return reshape(out, tuple(1 if i in axes else n for i, n in enumerate(shape)))


numpy_namespace.negative = neg
for _name in ["bool_", "int32", "int64", "float32", "float64"]:
    setattr(numpy_namespace, _name, getattr(np, _name))


@numpy_function
def numpy_divide(x: ArrayLike, y: ArrayLike) -> ArrayLike:
    """True division: promote, make integers floats, broadcast."""
    x, y = _broadcast_operands("divide", *promote_operands("divide", x, y))
    return div(as_inexact("divide", x), as_inexact("divide", y, 1))


@numpy_function
def numpy_minimum(x: ArrayLike, y: ArrayLike) -> ArrayLike:
    """Elementwise smaller of ``x`` and ``y``, with NumPy broadcasting."""
    x, y = _operands_alike("minimum", x, y)
    if get_aval(x).dtype.kind == "f":
        # Negation is exact for floats, and this shares max's rule at ties.
        return neg(maximum(neg(x), neg(y)))
    return select(less(x, y), x, y)  # integers: -x could overflow


@numpy_function
def numpy_power(x: ArrayLike, y: ArrayLike) -> ArrayLike:
    """``x ** y``: ``integer_pow`` for a Python or NumPy integer ``y``, as
    JAX; otherwise ``pow``, after broadcasting, with a float base (an integer
    exponent is passed as it is, other operands are promoted first)."""
    if _is_axis(y) or _is_integer_scalar_array(y):  # known now: multiplications
        return integer_pow(x, int(y))
    check_power_exponent(y)
    x_dtype = np.dtype(float) if type(x) is float else get_aval(x, "power").dtype
    y_dtype = None if _is_python_scalar(y) else get_aval(y, "power", 1).dtype
    if not (x_dtype.kind == "f" and y_dtype is not None and y_dtype.kind in "iu"):
        x, y = promote_operands("power", x, y)  # else: a float base, an integer
        check_power_is_float(x, y)  # exponent, passed as they are
    return general_pow(*_broadcast_operands("power", x, y))


def _is_integer_scalar_array(y: Any) -> bool:
    """A NumPy integer array of no axes: a known exponent, as in JAX."""
    return isinstance(y, np.ndarray) and y.ndim == 0 and y.dtype.kind in "iu"


def check_power_exponent(y: Any) -> None:
    if get_aval(_as_input(y, "power"), "power", 1).dtype == np.bool_:
        raise TypeError(f"power: the exponent must be a number, got {_describe(y)}")


def check_power_is_float(x: ArrayLike, y: ArrayLike) -> None:
    if all(_is_python_scalar(v) or get_aval(v).dtype.kind != "f" for v in (x, y)):
        raise TypeError(
            f"power: an integer base with an exponent that is not a Python integer "
            f"is not supported, got {_describe(x)} and {_describe(y)}; convert the "
            "base to a float dtype first"
        )


@numpy_function
def numpy_where(pred: ArrayLike, x: ArrayLike, y: ArrayLike) -> ArrayLike:
    """``x`` where ``pred`` is true, else ``y``, with NumPy broadcasting."""
    pred = np.asarray(pred) if _is_python_scalar(pred) else pred
    if get_aval(pred).dtype != np.bool_:
        raise TypeError(
            f"where: the condition must be a boolean array, got "
            f"{get_aval(pred).str_short()} (compare with > or < to make one)"
        )
    if _is_python_scalar(x) and _is_python_scalar(y):
        x, y = _operands_alike("where", x, y)
    pred, x, y = _broadcast_operands("where", pred, x, y)
    x, y = _operands_alike("where", x, y)
    return select(pred, x, y)


@numpy_function
def numpy_sum(x: ArrayLike, axis: Axes = None, keepdims: bool = False) -> ArrayLike:
    """Sum over ``axis`` (all axes by default). As in NumPy, booleans and
    integers narrower than 64 bits are summed as 64-bit integers."""
    dtype = get_aval(_as_input(x, "sum")).dtype
    if dtype.kind in "bi" and dtype.itemsize < 8:
        x = convert_element_type(x, np.int64)
    elif dtype.kind == "u" and dtype.itemsize < 8:
        x = convert_element_type(x, np.uint64)
    return _keep_dims(reduce_sum(x, axis), x, axis, keepdims)


def check_reduced_axes_not_empty(name: str, x: ArrayLike, axis: Axes) -> None:
    """max and min of no elements have no value: a ValueError, as jax.numpy
    raises (lax.reduce_max itself answers -inf, the identity of max)."""
    shape = get_aval(x).shape
    try:
        axes = _normalize_axes(
            name, range(len(shape)) if axis is None else axis, len(shape)
        )
    except (TypeError, ValueError):
        return  # a bad axis: reduce_max says so in its own words
    if any(shape[a] == 0 for a in axes):
        raise ValueError(
            f"{name}: zero-size array to reduction operation {name} which has "
            f"no identity (an array of shape {shape}, reduced over axes "
            f"{tuple(axes)})"
        )


@numpy_function
def numpy_max(x: ArrayLike, axis: Axes = None, keepdims: bool = False) -> ArrayLike:
    """Largest element over ``axis`` (all axes by default)."""
    x = _as_input(x, "max")
    check_reduced_axes_not_empty("max", x, axis)
    if get_aval(x).dtype == np.bool_:  # any: the largest of 0s and 1s
        as_int = convert_element_type(x, np.int8)
        return convert_element_type(numpy_max(as_int, axis, keepdims), np.bool_)
    return _keep_dims(reduce_max(x, axis), x, axis, keepdims)


@numpy_function
def numpy_min(x: ArrayLike, axis: Axes = None, keepdims: bool = False) -> ArrayLike:
    """Smallest element over ``axis``: the largest of an order-reversed copy
    (-x for floats; top - x for integers, which cannot overflow)."""
    x = _as_input(x, "min")
    check_reduced_axes_not_empty("min", x, axis)
    dtype = get_aval(x).dtype
    if dtype.kind == "b":
        as_int = convert_element_type(x, np.int8)
        return convert_element_type(numpy_min(as_int, axis, keepdims), np.bool_)
    if dtype.kind == "f":
        return neg(numpy_max(neg(x), axis, keepdims))
    top = int(np.iinfo(dtype).max) if dtype.kind == "u" else -1
    return sub(top, numpy_max(sub(top, x), axis, keepdims))


@numpy_function
def numpy_transpose(x: ArrayLike, axes: Sequence[int] | None = None) -> ArrayLike:
    """Permute the axes of ``x``; reverse them if ``axes`` is None."""
    if axes is None:
        axes = tuple(reversed(range(get_aval(x).ndim)))
    return transpose(x, axes)


@numpy_function
def numpy_astype(x: ArrayLike, dtype: Any) -> ArrayLike:
    """``x`` converted to ``dtype``."""
    return convert_element_type(x, dtype)


@numpy_function
def numpy_zeros(shape: int | Sequence[int], dtype: Any = np.float64) -> np.ndarray:
    """An array of zeros: a constant, since it depends on no input."""
    return np.zeros(shape, dtype)


@numpy_function
def numpy_ones(shape: int | Sequence[int], dtype: Any = np.float64) -> np.ndarray:
    """An array of ones (a constant)."""
    return np.ones(shape, dtype)


@numpy_function
def numpy_ones_like(x: ArrayLike) -> np.ndarray:
    """An array of ones with the shape and dtype of ``x``."""
    aval = get_aval(x)
    return np.ones(aval.shape, aval.dtype)


# @title More of autodidax.numpy, from the primitives we have
@numpy_function
def numpy_square(x: ArrayLike) -> ArrayLike:
    return integer_pow(x, 2)


def _sign(x: ArrayLike) -> ArrayLike:
    """-1, 0 or 1 with x's dtype; a constant to differentiation (comparisons)."""
    dtype = get_aval(x).dtype
    one = lambda b: convert_element_type(b, dtype)  # noqa: E731
    return sub(one(greater(x, zeros_like(x))), one(less(x, zeros_like(x))))


@numpy_function
def numpy_sign(x: ArrayLike) -> ArrayLike:
    return _sign(_as_input(x, "sign"))


@numpy_function
def numpy_abs(x: ArrayLike) -> ArrayLike:
    """|x|; its derivative at 0 is 1, as JAX's (and -0.0 becomes 0.0)."""
    x = _as_input(x, "abs")
    return select(less(x, zeros_like(x)), neg(x), add(x, zeros_like(x)))


@numpy_function
def numpy_round(x: ArrayLike, decimals: int = 0) -> ArrayLike:
    """Round half to even, as NumPy and JAX; its derivative is zero."""
    x = _as_input(x, "round")
    if get_aval(x).dtype.kind != "f":
        return x
    scale = 10.0**decimals
    y = mul(x, scale) if decimals else x
    dtype = get_aval(y).dtype
    whole = convert_element_type(convert_element_type(y, np.int64), dtype)
    sign = _sign(y)
    away = mul(sub(y, whole), sign)  # distance from whole, toward y
    odd = numpy_equal(numpy_abs(sub(whole, mul(_trunc_half(whole), 2.0))), 1.0)
    up = _or(greater(away, 0.5), _and(numpy_equal(away, 0.5), odd))
    step = select(up, sign, zeros_like(sign))
    out = stop_gradient(add(whole, step))
    return div(out, scale) if decimals else out


def _and(p: ArrayLike, q: ArrayLike) -> ArrayLike:
    return select(p, q, np.zeros(get_aval(q).shape, np.bool_))


def _or(p: ArrayLike, q: ArrayLike) -> ArrayLike:
    return select(p, np.ones(get_aval(q).shape, np.bool_), q)


def _trunc_half(w: ArrayLike) -> ArrayLike:
    """w / 2 rounded toward zero, for whole numbers w."""
    dtype = get_aval(w).dtype
    return convert_element_type(convert_element_type(div(w, 2.0), np.int64), dtype)


@numpy_function
def numpy_clip(x: ArrayLike, min: Any = None, max: Any = None) -> ArrayLike:
    """``x`` limited to [min, max], as JAX: minimum(max, maximum(min, x))."""
    if min is not None:
        x = numpy_maximum(min, x)
    if max is not None:
        x = numpy_minimum(max, x)
    return x


@numpy_function
def numpy_vdot(x: ArrayLike, y: ArrayLike) -> ArrayLike:
    """The dot product of ``x`` and ``y`` flattened (real arrays)."""
    x, y = _as_input(x, "vdot"), _as_input(y, "vdot")
    if get_aval(x).size != get_aval(y).size:
        raise TypeError(
            f"vdot: the arrays must have the same size, got "
            f"{get_aval(x).str_short()} and {get_aval(y).str_short()}"
        )
    return reduce_sum(mul(*_operands_alike("vdot", reshape(x, -1), reshape(y, -1))))


@numpy_function
def numpy_arange(start, stop=None, step=None, dtype=None) -> np.ndarray:
    """A constant, as NumPy's arange; without ``dtype``, the arguments'
    promoted dtype (Python numbers weak), as JAX: ``arange(np.int32(4))`` is
    int32."""
    if dtype is None:
        given = [a for a in (start, stop, step) if a is not None]
        dtype = promote_types(*(_dtype_name("arange", a) for a in given))
    return np.arange(start, stop, step, dtype)


@numpy_function
def numpy_eye(n: int, m: int | None = None, k: int = 0, dtype=np.float64):
    """A constant identity (or shifted diagonal) matrix."""
    return np.eye(n, m, k, dtype)


@numpy_function
def numpy_concatenate(arrays: Sequence[ArrayLike], axis: int = 0) -> ArrayLike:
    """``arrays`` joined along ``axis``. Without a concatenation primitive,
    each array is broadcast along a new axis and the entries that belong at
    each output position are selected and summed (one nonzero each)."""
    arrays = [_as_input(a, "concatenate") for a in arrays]
    avals = [get_aval(a) for a in arrays]
    _check_concatenate(avals, axis)
    axis = axis % avals[0].ndim
    total = sum(a.shape[axis] for a in avals)
    out, offset = None, 0
    for x, aval in zip(arrays, avals):
        n = aval.shape[axis]
        shape = (*aval.shape[:axis], total, *aval.shape[axis:])
        wide = broadcast(x, shape, [axis])  # axis: output position; axis+1: x's
        eq = np.arange(total)[:, None] == np.arange(n)[None, :] + offset
        mask = np.broadcast_to(
            eq.reshape(eq.shape + (1,) * (aval.ndim - axis - 1)), shape
        )
        part = reduce_sum(select(mask, wide, np.zeros(shape, aval.dtype)), axis + 1)
        out = part if out is None else add(out, part)
        offset += n
    return out


def _check_concatenate(avals: list[ShapedArray], axis: Any) -> None:
    if not avals:
        raise ValueError("concatenate: need at least one array")
    first = avals[0]
    if first.ndim == 0:
        raise ValueError("concatenate: zero-dimensional arrays cannot be joined")
    if not isinstance(axis, int) or not -first.ndim <= axis < first.ndim:
        raise ValueError(
            f"concatenate: axis {axis!r} is out of range for {first.str_short()}"
        )
    ax = axis % first.ndim
    for aval in avals[1:]:
        same = aval.ndim == first.ndim and all(
            d == e for i, (d, e) in enumerate(zip(aval.shape, first.shape)) if i != ax
        )
        if not same or aval.dtype != first.dtype:
            raise TypeError(
                f"concatenate: arrays must have one dtype and equal sizes off axis "
                f"{axis}, got {first.str_short()} and {aval.str_short()}"
            )


@numpy_function
def numpy_stack(arrays: Sequence[ArrayLike], axis: int = 0) -> ArrayLike:
    """``arrays`` (one shape) joined along a new axis."""
    arrays = [_as_input(a, "stack") for a in arrays]
    if not arrays:
        raise ValueError("stack: need at least one array")
    ndim = get_aval(arrays[0]).ndim
    if not isinstance(axis, int) or not -ndim - 1 <= axis <= ndim:
        raise ValueError(f"stack: axis {axis!r} is out of range for {ndim + 1} axes")
    axis = axis % (ndim + 1)
    expanded = []
    for a in arrays:
        shape = get_aval(a).shape
        expanded.append(reshape(a, (*shape[:axis], 1, *shape[axis:])))
    return numpy_concatenate(expanded, axis)


# @title tril, triu, var, std; the namespaces autodidax.tree and autodidax.tree_util
@numpy_function
def numpy_tril(m: ArrayLike, k: int = 0) -> ArrayLike:
    """``m`` with zeros above the ``k``-th diagonal (of the last two axes)."""
    return _keep_triangle("tril", m, k, lower=True)


@numpy_function
def numpy_triu(m: ArrayLike, k: int = 0) -> ArrayLike:
    """``m`` with zeros below the ``k``-th diagonal (of the last two axes)."""
    return _keep_triangle("triu", m, k, lower=False)


def _keep_triangle(name: str, m: ArrayLike, k: int, lower: bool) -> ArrayLike:
    m = _as_input(m, name)
    aval = get_aval(m)
    if aval.ndim < 2:
        raise ValueError(
            f"{name}: the array must have at least 2 axes, got {aval.str_short()}"
        )
    if not _is_axis(k):
        raise TypeError(f"{name}: k must be an integer, got {_describe(k)}")
    rows, cols = aval.shape[-2:]
    below = np.tri(rows, cols, int(k) if lower else int(k) - 1, dtype=bool)
    mask = np.broadcast_to(below if lower else ~below, aval.shape)
    return select(np.ascontiguousarray(mask), m, zeros_like(m))


@numpy_function
def numpy_var(
    x: ArrayLike,
    axis: Axes = None,
    dtype: Any = None,
    ddof: int = 0,
    keepdims: bool = False,
) -> ArrayLike:
    """Mean squared distance from the mean over ``axis``, divided by N - ddof,
    as JAX computes it; integers give float64."""
    x = _as_input(x, "var")
    if get_aval(x).dtype.kind != "f":
        x = convert_element_type(x, np.float64)  # JAX's default float, not as_inexact
    ndim = get_aval(x).ndim
    axes = range(ndim) if axis is None else _normalize_axes("var", axis, ndim)
    count = math.prod(get_aval(x).shape[a] for a in axes)
    centered = numpy_subtract(x, numpy_mean(x, axis, keepdims=True))
    total = numpy_sum(integer_pow(centered, 2), axis, keepdims)
    out = div(total, float(count - ddof))
    return out if dtype is None else convert_element_type(out, dtype)


@numpy_function
def numpy_std(
    x: ArrayLike,
    axis: Axes = None,
    dtype: Any = None,
    ddof: int = 0,
    keepdims: bool = False,
) -> ArrayLike:
    """The square root of ``var``."""
    return sqrt(numpy_var(x, axis, dtype, ddof, keepdims))


tree = types.ModuleType("autodidax.tree", "jax.tree's names for the tree functions.")
tree_util = types.ModuleType("autodidax.tree_util", "jax.tree_util's names.")
if __name__ != "__main__":  # `import autodidax.tree`, as `import jax.tree`
    sys.modules[f"{__name__}.tree"] = tree
    sys.modules[f"{__name__}.tree_util"] = tree_util
tree.map, tree.leaves, tree.structure = tree_map, tree_leaves, tree_structure
tree.flatten, tree.unflatten = tree_flatten, tree_unflatten
for _fn in [tree_map, tree_leaves, tree_structure, tree_flatten, tree_unflatten]:
    setattr(tree_util, _fn.__name__, _fn)
tree_util.register_pytree_node = register_pytree_node


@numpy_function
def numpy_einsum(subscripts: str, *operands: ArrayLike) -> ArrayLike:
    """Einstein summation over one or more operands; two operands make one
    ``dot_general``, more are contracted pairwise, left to right."""
    operands = promote_operands("einsum", *(_as_input(x, "einsum") for x in operands))
    ins, out = parse_einsum(subscripts, [get_aval(x) for x in operands])
    x, sx = _sum_unused_letters(operands[0], ins[0], [out, *ins[1:]])
    for i in range(1, len(operands)):
        x, sx = _einsum_pair(x, sx, operands[i], ins[i], [out, *ins[i + 1 :]])
    return _transpose_unless_identity(x, [sx.index(c) for c in out])


def _einsum_pair(x, sx, y, sy, later):
    """One dot_general. A letter of both operands is a batch dimension if
    ``later`` (the output, the operands still to come) needs it, else it is
    contracted. Returns the product and its letters: batch (in the order
    ``later`` names them), then x's free letters, then y's."""
    y, sy = _sum_unused_letters(y, sy, [sx, *later])
    batch = [c for c in dict.fromkeys("".join(later)) if c in sx and c in sy]
    contract = [c for c in sx if c in sy and c not in batch]
    dims = (
        (tuple(map(sx.index, contract)), tuple(map(sy.index, contract))),
        (tuple(map(sx.index, batch)), tuple(map(sy.index, batch))),
    )
    free_x = [c for c in sx if c not in sy]
    free_y = [c for c in sy if c not in sx]
    return dot_general(x, y, dims), "".join(batch + free_x + free_y)


# @title Summing the letters no one needs; checks: subscripts that fit the operands
def _sum_unused_letters(x, letters, others):
    """Sum away the axes whose letter appears nowhere in ``others``."""
    unused = [i for i, c in enumerate(letters) if not any(c in s for s in others)]
    if not unused:
        return x, letters
    return reduce_sum(x, tuple(unused)), "".join(
        c for i, c in enumerate(letters) if i not in unused
    )


def parse_einsum(subscripts: Any, avals: list[ShapedArray]) -> tuple[list[str], str]:
    """The operands' letters and the output's, checked against the operands."""
    if not isinstance(subscripts, str):
        raise TypeError(
            f"einsum: subscripts must be a string, got {_describe(subscripts)}"
        )
    spec = subscripts.replace(" ", "")
    if "." in spec:
        raise ValueError(
            f"einsum: '...' in {subscripts!r} is not supported; name every axis "
            "with a letter"
        )
    ins_spec, arrow, out = spec.partition("->")
    ins = ins_spec.split(",")
    if len(ins) != len(avals):
        raise ValueError(
            f"einsum: subscripts {subscripts!r} name {len(ins)} operand(s), got "
            f"{len(avals)}"
        )
    if not arrow:  # implicit output: the letters used once, in alphabetical order
        once = [c for c in set(ins_spec) if c.isalpha() and ins_spec.count(c) == 1]
        out = "".join(sorted(once))
    sizes: dict[str, tuple[int, int]] = {}
    for i, (letters, aval) in enumerate(zip(ins, avals)):
        _check_einsum_operand(subscripts, i, letters, aval, sizes)
    for c in out:
        if not c.isalpha() or c not in sizes:
            raise ValueError(
                f"einsum: output subscript {c!r} in {subscripts!r} names no axis "
                "of the operands"
            )
        if out.count(c) > 1:
            raise ValueError(
                f"einsum: output subscript {c!r} repeats in {subscripts!r}"
            )
    return ins, out


def _check_einsum_operand(subscripts, i, letters, aval, sizes) -> None:
    if len(letters) != aval.ndim:
        raise ValueError(
            f"einsum: operand {i} is {aval.str_short()}, with {aval.ndim} axes, but "
            f"its subscripts {letters!r} in {subscripts!r} name {len(letters)}"
        )
    for axis, c in enumerate(letters):
        if not c.isalpha():
            raise ValueError(
                f"einsum: subscript {c!r} in {subscripts!r} is not a letter"
            )
        if letters.count(c) > 1:
            raise ValueError(
                f"einsum: subscript {c!r} repeats within operand {i} ({letters!r}) "
                f"in {subscripts!r}; diagonals are not supported"
            )
        size = aval.shape[axis]
        if c in sizes and sizes[c][0] != size:
            raise ValueError(
                f"einsum: subscript {c!r} in {subscripts!r} has size "
                f"{sizes[c][0]} in operand {sizes[c][1]} and size {size} in "
                f"operand {i}"
            )
        sizes.setdefault(c, (size, i))


def _contract_last_axis(name: str, x: Any, y: Any) -> Any:
    """x's last axis against y's only axis, or y's second-to-last."""
    i, j = check_aligned(name, get_aval(x), get_aval(y))
    return dot_general(x, y, (((i,), (j,)), ((), ())))


@numpy_function
def numpy_matmul(x: ArrayLike, y: ArrayLike) -> ArrayLike:
    """NumPy's ``matmul``, the ``@`` operator: an einsum, so one dot_general."""
    x, y = promote_operands("matmul", *(_as_input(v, "matmul") for v in (x, y)))
    check_matmul_operands(get_aval(x), get_aval(y))  # no scalars, sizes that agree
    x, y, subscripts = matmul_as_einsum(x, y)  # e.g. "amk,kn->amn"
    return numpy_einsum(subscripts, x, y)


# @title Checks: operands of a product that line up; and numpy.dot
@numpy_function
def numpy_dot(x: ArrayLike, y: ArrayLike) -> ArrayLike:
    """NumPy's ``dot``; with a scalar operand, a multiplication."""
    x, y = promote_operands("dot", *(_as_input(v, "dot") for v in (x, y)))
    if get_aval(x).ndim == 0 or get_aval(y).ndim == 0:
        return numpy_multiply(x, y)
    return _contract_last_axis("dot", x, y)


def check_aligned(name: str, x: ShapedArray, y: ShapedArray) -> tuple[int, int]:
    """The axes to contract: x's last, and y's only or second-to-last."""
    i, j = x.ndim - 1, max(y.ndim - 2, 0)
    if x.shape[i] != y.shape[j]:
        raise TypeError(
            f"{name}: shapes {x.str_short()} and {y.str_short()} are not "
            f"aligned: axis {i} of x has size {x.shape[i]}, axis {j} of y "
            f"has size {y.shape[j]}"
        )
    return i, j


def check_matmul_operands(x: ShapedArray, y: ShapedArray) -> None:
    if x.ndim == 0 or y.ndim == 0:
        raise TypeError(
            f"matmul: operands must not be scalars, got {x.str_short()} and "
            f"{y.str_short()} (use * to multiply by a scalar)"
        )
    check_aligned("matmul", x, y)
    _broadcast_stacks(x, y)


def matmul_as_einsum(x: ArrayLike, y: ArrayLike) -> tuple[ArrayLike, ArrayLike, str]:
    """``x @ y`` as einsum subscripts, such as ``"amk,kn->amn"``: a letter per
    stack axis, shared where both stacks have the axis. A size-1 stack axis
    that meets a larger one is reshaped away from its operand."""
    xs, ys = get_aval(x).shape, get_aval(y).shape
    n = max(len(xs), len(ys)) - 2
    pad_x = (None,) * (n - len(xs[:-2])) + xs[:-2]  # None: no such axis
    pad_y = (None,) * (n - len(ys[:-2])) + ys[:-2]
    lx, ly, out, keep_x, keep_y = "", "", "", [], []
    for c, dx, dy in zip("abcdefghijlopqrstuvwxyz", pad_x, pad_y):
        out += c
        if dx is not None and (dx != 1 or dy in (None, 1)):
            lx, keep_x = lx + c, [*keep_x, dx]
        if dy is not None and (dy != 1 or dx in (None, 1)):
            ly, keep_y = ly + c, [*keep_y, dy]
    if len(keep_x) < len(xs[:-2]):
        x = reshape(x, (*keep_x, *xs[-2:]))
    if len(keep_y) < len(ys[:-2]):
        y = reshape(y, (*keep_y, *ys[-2:]))
    lx += "mk" if len(xs) > 1 else "k"
    ly += "kn" if len(ys) > 1 else "k"
    out += "m" * (len(xs) > 1) + "n" * (len(ys) > 1)
    return x, y, f"{lx},{ly}->{out}"


def _broadcast_stacks(x: ShapedArray, y: ShapedArray) -> tuple[int, ...]:
    """The common shape of the stacks of two stacks of matrices."""
    described = f"{x.str_short()} and {y.str_short()} (as stacks of matrices)"
    return broadcast_shapes("matmul", x.shape[:-2], y.shape[:-2], described=described)


# @title `**`: the front end's power, in both directions
def _power(x: ArrayLike, exponent: Any) -> ArrayLike:
    return numpy_power(x, exponent)


def _reflected_power(x: ArrayLike, base: Any) -> ArrayLike:
    return numpy_power(base, x)


OPERATORS.update(add=numpy_add, sub=numpy_subtract, mul=numpy_multiply)
OPERATORS.update(greater=numpy_greater, less=numpy_less)

ArrayOperators.__truediv__ = numpy_divide
ArrayOperators.__rtruediv__ = lambda self, other: numpy_divide(other, self)
ArrayOperators.__matmul__ = numpy_matmul
ArrayOperators.__rmatmul__ = lambda self, other: numpy_matmul(other, self)
ArrayOperators.__pow__ = _power
ArrayOperators.__rpow__ = _reflected_power


# @title Array methods as in jax.numpy: sum mean max min astype dot reshape T size
def _reshape_method(self: ArrayOperators, *shape: Any) -> ArrayLike:
    """``x.reshape(2, 3)`` or ``x.reshape((2, 3))``, as NumPy allows both."""
    if len(shape) == 1 and not isinstance(shape[0], (int, np.integer)):
        shape = shape[0]
    return reshape(self, tuple(shape))


def _transpose_method(self: ArrayOperators, *axes: Any) -> ArrayLike:
    """``x.transpose()``, ``x.transpose(1, 0)`` or ``x.transpose((1, 0))``."""
    if len(axes) == 1 and not isinstance(axes[0], (int, np.integer)):
        axes = axes[0]
    return numpy_transpose(self, tuple(axes) if axes else None)


ArrayOperators.sum = numpy_sum
ArrayOperators.mean = numpy_mean
ArrayOperators.max = numpy_max
ArrayOperators.min = numpy_min
ArrayOperators.astype = numpy_astype
ArrayOperators.dot = numpy_dot
ArrayOperators.reshape = _reshape_method
ArrayOperators.transpose = _transpose_method
ArrayOperators.T = property(numpy_transpose)
ArrayOperators.size = property(lambda self: get_aval(self).size)


# @title compares_with(fn): operands of unknown types are left to Python, as in JAX
def compares_with(fn: Callable) -> Callable:
    """The method ``self <op> other``: ``fn(self, other)`` for an array or a
    number; otherwise NotImplemented, so Python asks ``other`` (``x == None``
    is False, ``x == pytest.approx(...)`` works), as JAX's arrays do."""

    def method(self, other):
        known = (np.ndarray, np.generic, Tracer, *DEVICE_ARRAY_TYPES)
        if not (_is_python_scalar(other) or isinstance(other, known)):
            return NotImplemented
        return fn(self, other)

    return method


numpy_equal = _broadcasting("equal", equal)
numpy_not_equal = _broadcasting("not_equal", not_equal)
numpy_less_equal = _broadcasting("less_equal", less_equal)
numpy_greater_equal = _broadcasting("greater_equal", greater_equal)

ArrayOperators.__eq__ = compares_with(numpy_equal)
ArrayOperators.__ne__ = compares_with(numpy_not_equal)
ArrayOperators.__le__ = compares_with(numpy_less_equal)
ArrayOperators.__ge__ = compares_with(numpy_greater_equal)

# @title The module autodidax.lax: JAX's lax names for our primitives
lax_namespace = types.ModuleType("autodidax.lax", "Primitives under lax's names.")
lax = lax_namespace  # for `from autodidax import lax`
if __name__ != "__main__":  # in the module: `import autodidax.lax as lax`
    sys.modules[f"{__name__}.lax"] = lax_namespace
for _name, _fn in {
    "eq": equal,
    "ne": not_equal,
    "lt": less,
    "le": less_equal,
    "gt": greater,
    "ge": greater_equal,
    "max": maximum,
    **{f.__name__: f for f in [add, sub, mul, div, neg, sin, cos, exp, log, tanh]},
    **{f.__name__: f for f in [sqrt, rsqrt]},
    **{f.__name__: f for f in [integer_pow, convert_element_type, reshape]},
    **{f.__name__: f for f in [transpose, select, dot_general, stop_gradient]},
    **{f.__name__: f for f in [cond, switch]},
}.items():
    setattr(lax_namespace, _name, _fn)


# @title Every other Python protocol on a tracer: as in JAX, or a clear error
def _unhashable(self: ArrayOperators) -> int:
    raise TypeError(
        f"unhashable type: {type(self).__name__} ({_describe(self)}): its == "
        "compares elementwise, so it cannot be a dict key or a set member; "
        "use id(x) as the key"
    )


def _number_conversion_error(kind: str, tracer: Tracer, instead: str) -> TypeError:
    tracer.check_live()
    return ConcretizationError(
        f"{kind} of a traced {tracer.aval.str_short()} value: its value is not "
        f"known while the function is transformed. {instead}"
    )


def _tracer_float(self: Tracer) -> float:
    raise _number_conversion_error(
        "float()", self, "To change its dtype, use x.astype(np.float64)."
    )


def _tracer_int(self: Tracer) -> int:
    raise _number_conversion_error(
        "int()", self, "To change its dtype, use x.astype(np.int64)."
    )


def _tracer_index(self: Tracer) -> int:
    raise _number_conversion_error(
        "Using as a Python index (a list index, a range, a shape)",
        self,
        "Pass a Python int instead, or choose with select/cond.",
    )


def _tracer_len(self: Tracer) -> int:
    self.check_live()
    if not self.aval.shape:
        raise TypeError(f"len() of unsized object: a traced {self.aval.str_short()}")
    return self.aval.shape[0]


def _tracer_iter(self: Tracer):
    self.check_live()
    if not self.aval.shape:
        raise TypeError(f"iteration over a 0-d array: a traced {self.aval.str_short()}")
    raise TypeError(
        f"iterating over a traced {self.aval.str_short()} needs indexing, which "
        "this chapter does not have; use vmap over the leading axis, or scan"
    )


ArrayOperators.__hash__ = _unhashable
Tracer.__float__ = _tracer_float
Tracer.__int__ = _tracer_int
Tracer.__index__ = _tracer_index
Tracer.__complex__ = lambda self: complex(_tracer_float(self))
Tracer.__len__ = _tracer_len
Tracer.__iter__ = _tracer_iter

# @title The module autodidax.nn, and the decorator that fills it
nn_namespace = types.ModuleType("autodidax.nn", "A few of jax.nn's functions.")
nn = nn_namespace  # for `from autodidax import nn`
if __name__ != "__main__":  # `import autodidax.nn`
    sys.modules[f"{__name__}.nn"] = nn_namespace


def nn_function(fn: Callable) -> Callable:
    """Decorator: put ``nn_<name>`` into autodidax.nn as ``<name>``."""
    setattr(nn_namespace, fn.__name__.removeprefix("nn_"), fn)
    return fn


@nn_function
def nn_log_softmax(x: ArrayLike, axis: Axes = -1) -> ArrayLike:
    x = as_inexact("log_softmax", _as_input(x, "log_softmax"))
    shifted = x - stop_gradient(numpy_max(x, axis, keepdims=True))
    return shifted - log(numpy_sum(exp(shifted), axis, keepdims=True))


@nn_function
def nn_softmax(x: ArrayLike, axis: Axes = -1) -> ArrayLike:
    x = as_inexact("softmax", _as_input(x, "softmax"))
    unnormalized = exp(x - stop_gradient(numpy_max(x, axis, keepdims=True)))
    return unnormalized / numpy_sum(unnormalized, axis, keepdims=True)


# @title The primitive erf (evaluated by XLA), for gelu(approximate=False)
from jaxlib.mlir.dialects import chlo

erf_p = Primitive("erf")
NOT_LINEAR.add("erf")


def erf(x: ArrayLike) -> ArrayLike:
    """The error function, elementwise, of a float array."""
    _check_kind("erf", x, "f", "a float")
    return bind(erf_p, x)


@erf_p.def_rule("jvp")
def _erf_jvp(primals, tangents):
    (x,), (dx,) = primals, tangents  # d/dx erf(x) = 2/sqrt(pi) exp(-x^2)
    return [erf(x)], [mul(dx, mul(exp(neg(mul(x, x))), 2 / math.sqrt(math.pi)))]


@erf_p.def_rule("impl")
def _erf_impl(x):
    return [np.asarray(_erf_on_xla(x))]  # NumPy has no erf; XLA's, as under jit


_erf_on_xla = jit(lambda x: bind(erf_p, x))
_unary_abstract_eval(erf_p, "f", "a float")
_unary_vmap(erf_p)


@erf_p.def_rule("lower")
def _erf_lower(ctx, avals_in, avals_out, x):
    with_chlo(ir.Context.current)
    return [chlo.erf(x)]


@functools.cache
def with_chlo(context: ir.Context) -> None:
    """Register CHLO, XLA's dialect of composite operations such as erf."""
    chlo.register_dialect(context)


lax_namespace.erf = erf
lax_namespace.pow = general_pow


# @title gelu, relu, logsumexp, one_hot
@nn_function
def nn_gelu(x: ArrayLike, approximate: bool = True) -> ArrayLike:
    """x times the normal distribution's CDF at x; by default its tanh
    approximation, with JAX's constants and order of operations."""
    x = as_inexact("gelu", _as_input(x, "gelu"))
    dtype = get_aval(x).dtype
    if approximate:
        inner = np.sqrt(2 / np.pi).astype(dtype) * (x + 0.044715 * x**3)
        return x * (0.5 * (1.0 + tanh(inner)))
    return 0.5 * x * (1.0 + erf(x * np.sqrt(0.5).astype(dtype)))


@nn_function
def nn_relu(x: ArrayLike) -> ArrayLike:
    """max(x, 0), with derivative 0 at 0, as JAX's (NaN stays NaN)."""
    x = _as_input(x, "relu")
    return numpy_where(x > 0, x, stop_gradient(numpy_maximum(x, 0)))


@nn_function
def nn_logsumexp(a: ArrayLike, axis: Axes = None, keepdims: bool = False) -> ArrayLike:
    """log(sum(exp(a))) over ``axis``, shifted by the (finite) maximum first."""
    a = as_inexact("logsumexp", _as_input(a, "logsumexp"))
    top = numpy_max(a, axis, keepdims=True)
    top = stop_gradient(numpy_where(numpy_equal(top - top, 0.0), top, 0.0))  # finite
    out = log(numpy_sum(exp(a - top), axis, keepdims=True)) + top
    return out if keepdims else _drop_dims(out, axis)


def _drop_dims(x: ArrayLike, axis: Axes) -> ArrayLike:
    shape = get_aval(x).shape
    axes = range(len(shape)) if axis is None else _normalize_axes("", axis, len(shape))
    return reshape(x, tuple(n for i, n in enumerate(shape) if i not in axes))


@nn_function
def nn_one_hot(
    x: ArrayLike, num_classes: int, *, dtype: Any = np.float64, axis: int = -1
):
    """1 where the new axis's position equals the index in ``x``, else 0."""
    x = _as_input(x, "one_hot")
    aval = get_aval(x)
    check_one_hot(aval, num_classes, axis)
    axis = axis % (aval.ndim + 1)
    shape = (*aval.shape[:axis], 1, *aval.shape[axis:])
    classes = np.arange(num_classes, dtype=aval.dtype)
    classes = classes.reshape(
        [num_classes if i == axis else 1 for i in range(len(shape))]
    )
    return convert_element_type(numpy_equal(reshape(x, shape), classes), dtype)


def check_one_hot(aval: ShapedArray, num_classes: Any, axis: Any) -> None:
    if aval.dtype.kind not in "iu":
        raise TypeError(
            f"one_hot: the indices must be integers, got {aval.str_short()} "
            "(JAX has deprecated other dtypes); convert them with astype"
        )
    if not _is_axis(num_classes) or num_classes < 0:
        raise TypeError(
            f"one_hot: num_classes must be a non-negative Python integer, got "
            f"{_describe(num_classes)}"
        )
    if not _is_axis(axis) or not -aval.ndim - 1 <= axis <= aval.ndim:
        raise ValueError(
            f"one_hot: axis {axis!r} is out of range for the {aval.ndim + 1} axes "
            f"of the result (indices {aval.str_short()})"
        )


# ==== chapter: indexing ====

import operator

slice_p = Primitive("slice")
pad_p = Primitive("pad")


def lax_slice(x: ArrayLike, start_indices, limit_indices, strides=None) -> ArrayLike:
    """``x[start:limit:stride]`` along every axis (``lax.slice``)."""
    x = _as_input(x, "slice")
    params = check_slice(get_aval(x), start_indices, limit_indices, strides)
    return bind(slice_p, x, **params)


def pad(x: ArrayLike, low, high, interior) -> ArrayLike:
    """``x`` with zeros added before, after, and between its elements."""
    x = _as_input(x, "pad")
    return bind(pad_p, x, **check_pad(get_aval(x), low, high, interior))


def past_last(start: int, taken: int, stride: int) -> int:
    """The position after the last of ``taken`` elements read every ``stride``
    from ``start``: start + (taken - 1) * stride + 1 (just start if none)."""
    return start + (taken - 1) * stride + 1 if taken else start


@slice_p.def_rule("transpose")
def _slice_transpose(cts, x, *, start_indices, limit_indices, strides):
    (ct,) = cts
    taken = get_aval(ct).shape
    end = map(past_last, start_indices, taken, strides)
    low = start_indices  # zeros before the first taken element,
    high = [n - e for n, e in zip(x.aval.shape, end)]  # after the last one,
    interior = [s - 1 for s in strides]  # and between two taken ones
    return [pad(ct, low, high, interior)]


@pad_p.def_rule("transpose")
def _pad_transpose(cts, x, *, low, high, interior):
    (ct,) = cts  # read back every (interior + 1)-th element, from low on
    steps = [i + 1 for i in interior]
    limits = map(past_last, low, x.aval.shape, steps)
    return [lax_slice(ct, low, tuple(limits), steps)]


# @title slice and pad: checks, evaluation, abstract evaluation, batching, lowering
def _int_tuple_param(name: str, what: str, values: Any, ndim: int) -> tuple:
    try:
        values = tuple(operator.index(v) for v in values)
    except TypeError:
        raise TypeError(
            f"{name}: {what} must be a sequence of ints, got {values!r}"
        ) from None
    if len(values) != ndim:
        raise TypeError(
            f"{name}: {what} {values} needs one entry per axis of an array "
            f"with {ndim} axes"
        )
    return values


def check_slice(aval: ShapedArray, start, limit, strides) -> dict:
    start = _int_tuple_param("slice", "start_indices", start, aval.ndim)
    limit = _int_tuple_param("slice", "limit_indices", limit, aval.ndim)
    strides = (1,) * aval.ndim if strides is None else strides
    strides = _int_tuple_param("slice", "strides", strides, aval.ndim)
    for lo, hi, s, n in zip(start, limit, strides, aval.shape):
        if not 0 <= lo <= hi <= n or s < 1:
            raise ValueError(
                f"slice: start_indices {start}, limit_indices {limit} and "
                f"strides {strides} do not fit {aval.str_short()} (each axis "
                "needs 0 <= start <= limit <= size and a stride of at least 1)"
            )
    return dict(start_indices=start, limit_indices=limit, strides=strides)


def check_pad(aval: ShapedArray, low, high, interior) -> dict:
    low = _int_tuple_param("pad", "low", low, aval.ndim)
    high = _int_tuple_param("pad", "high", high, aval.ndim)
    interior = _int_tuple_param("pad", "interior", interior, aval.ndim)
    if min((*low, *high, *interior), default=0) < 0:
        raise ValueError(
            f"pad: low {low}, high {high} and interior {interior} must not be "
            f"negative (padding {aval.str_short()})"
        )
    return dict(low=low, high=high, interior=interior)


def _sliced_size(start: int, limit: int, stride: int) -> int:
    return max(0, -(-(limit - start) // stride))


def _padded_size(n: int, lo: int, hi: int, inner: int) -> int:
    return lo + n + max(n - 1, 0) * inner + hi


@slice_p.def_rule("impl")
def _slice_impl(x, *, start_indices, limit_indices, strides):
    index = tuple(map(slice, start_indices, limit_indices, strides))
    return [np.asarray(x)[index].copy()]


@slice_p.def_rule("abstract_eval")
def _slice_abstract_eval(x, *, start_indices, limit_indices, strides):
    check_slice(x, start_indices, limit_indices, strides)
    shape = map(_sliced_size, start_indices, limit_indices, strides)
    return [ShapedArray(tuple(shape), x.dtype)]


@slice_p.def_rule("vmap")
def _slice_vmap(axis, vals, dims, *, start_indices, limit_indices, strides):
    (x,), (b,) = vals, dims

    def widen(params, value):
        return (*params[:b], value, *params[b:])

    start, limit = widen(start_indices, 0), widen(limit_indices, axis.size)
    return [lax_slice(x, start, limit, widen(strides, 1))], [b]


@slice_p.def_rule("lower")
def _slice_lower(ctx, avals_in, avals_out, x, *, start_indices, limit_indices, strides):
    return [hlo.slice(x, start_indices, limit_indices, strides)]


@pad_p.def_rule("impl")
def _pad_impl(x, *, low, high, interior):
    x = np.asarray(x)
    shape = tuple(map(_padded_size, x.shape, low, high, interior))
    out = np.zeros(shape, x.dtype)
    index = tuple(
        slice(lo, lo + (n - 1) * (i + 1) + 1 if n else lo, i + 1)
        for lo, n, i in zip(low, x.shape, interior)
    )
    out[index] = x
    return [out]


@pad_p.def_rule("abstract_eval")
def _pad_abstract_eval(x, *, low, high, interior):
    check_pad(x, low, high, interior)
    shape = map(_padded_size, x.shape, low, high, interior)
    return [ShapedArray(tuple(shape), x.dtype)]


@pad_p.def_rule("vmap")
def _pad_vmap(axis, vals, dims, *, low, high, interior):
    (x,), (b,) = vals, dims

    def widen(params):
        return (*params[:b], 0, *params[b:])

    return [pad(x, widen(low), widen(high), widen(interior))], [b]


@pad_p.def_rule("lower")
def _pad_lower(ctx, avals_in, avals_out, x, *, low, high, interior):
    zero = ir_constant(0, ShapedArray((), avals_in[0].dtype))
    return [hlo.pad(x, zero, low, high, interior)]


_linear_jvp(slice_p)
_linear_jvp(pad_p)

dynamic_slice_p = Primitive("dynamic_slice")
dynamic_update_slice_p = Primitive("dynamic_update_slice")


def dynamic_slice(x: ArrayLike, start_indices, slice_sizes) -> ArrayLike:
    """The block of ``slice_sizes`` at ``start_indices`` (clamped to fit)."""
    x = _as_input(x, "dynamic_slice")
    starts = check_starts("dynamic_slice", get_aval(x), start_indices)
    sizes = check_slice_sizes(get_aval(x), slice_sizes)
    return bind(dynamic_slice_p, x, *starts, slice_sizes=sizes)


def dynamic_update_slice(x: ArrayLike, update: ArrayLike, start_indices) -> ArrayLike:
    """``x`` with ``update`` written at ``start_indices`` (clamped to fit)."""
    x, update = _as_input(x, "dynamic_update_slice"), _as_input(update, "update")
    check_update_block(get_aval(x), get_aval(update))
    starts = check_starts("dynamic_update_slice", get_aval(x), start_indices)
    return bind(dynamic_update_slice_p, x, update, *starts)


@dynamic_slice_p.def_rule("transpose")
def _dynamic_slice_transpose(cts, x, *starts, slice_sizes):
    (ct,) = cts  # the block, written into zeros where it was read
    ct_x = dynamic_update_slice(zeros_of(x.aval), ct, starts)
    return [ct_x] + [None] * len(starts)


@dynamic_update_slice_p.def_rule("transpose")
def _dynamic_update_slice_transpose(cts, x, update, *starts):
    (ct,) = cts
    block = _aval_of(update)
    ct_x = ct_update = None
    if _is_undef(x):  # x's elements under the block were overwritten: zero
        ct_x = dynamic_update_slice(ct, zeros_of(block), starts)
    if _is_undef(update):  # the block's cotangent is read where it was written
        ct_update = dynamic_slice(ct, starts, block.shape)
    return [ct_x, ct_update] + [None] * len(starts)


# @title dynamic_slice, dynamic_update_slice: checks, evaluation, types, jvp, lowering
def zeros_of(aval: ShapedArray) -> ArrayLike:
    """Zeros of type ``aval``: a broadcast of one zero (an equation under jit)."""
    return full_of(aval, 0)


def full_of(aval: ShapedArray, value: Any) -> ArrayLike:
    """An array of type ``aval`` holding ``value``: a broadcast of one number."""
    one = np.asarray(value).astype(aval.dtype)
    return broadcast(one, aval.shape, tuple(range(aval.ndim))) if aval.ndim else one


def _wrap_negative(i: Any, n: int) -> Any:
    """NumPy's negative indices count from the end."""
    if get_aval(i).dtype.kind == "u":
        return i
    if not isinstance(i, Tracer):
        return np.where(np.asarray(i) < 0, np.asarray(i) + n, i).astype(
            get_aval(i).dtype
        )
    return select(i < 0, i + n, i)


def check_starts(name: str, aval: ShapedArray, starts: Any) -> list:
    """One scalar integer per axis of ``aval``; Python ints become int64."""
    try:
        starts = [
            np.asarray(s, np.int64) if type(s) is int else _as_input(s, name)
            for s in starts
        ]
    except TypeError:
        raise TypeError(
            f"{name}: start_indices must be a sequence of scalar integers, got "
            f"{_short_repr(starts)}"
        ) from None
    check_start_types(name, aval, [get_aval(s) for s in starts])
    return starts


def check_start_types(name: str, aval: ShapedArray, starts: list) -> None:
    if len(starts) != aval.ndim:
        raise TypeError(
            f"{name}: {len(starts)} start indices for {aval.str_short()}, "
            f"which has {aval.ndim} axes"
        )
    for s in starts:
        if s.shape or s.dtype.kind not in "iu":
            raise TypeError(
                f"{name}: each start index must be a scalar integer, got "
                f"{s.str_short()}"
            )


def check_slice_sizes(aval: ShapedArray, sizes: Any) -> tuple:
    sizes = _int_tuple_param("dynamic_slice", "slice_sizes", sizes, aval.ndim)
    if any(not 0 <= k <= n for k, n in zip(sizes, aval.shape)):
        raise TypeError(
            f"dynamic_slice: slice_sizes {sizes} do not fit in {aval.str_short()}"
        )
    return sizes


def check_update_block(aval: ShapedArray, block: ShapedArray) -> None:
    if (
        block.ndim != aval.ndim
        or block.dtype != aval.dtype
        or any(k > n for k, n in zip(block.shape, aval.shape))
    ):
        raise TypeError(
            f"dynamic_update_slice: update {block.str_short()} does not fit in "
            f"{aval.str_short()} (same dtype and number of axes, sizes no larger)"
        )


def _clamped_starts(shape, starts, sizes) -> list[int]:
    """Negative starts count from the end, then each is clamped so the block fits."""
    starts = [int(np.asarray(s)) for s in starts]
    starts = [s + n if s < 0 else s for s, n in zip(starts, shape)]
    return [min(max(s, 0), n - k) for s, n, k in zip(starts, shape, sizes)]


def _block(starts: list[int], sizes) -> tuple:
    return tuple(slice(s, s + k) for s, k in zip(starts, sizes))


@dynamic_slice_p.def_rule("impl")
def _dynamic_slice_impl(x, *starts, slice_sizes):
    x = np.asarray(x)
    return [x[_block(_clamped_starts(x.shape, starts, slice_sizes), slice_sizes)]]


@dynamic_update_slice_p.def_rule("impl")
def _dynamic_update_slice_impl(x, update, *starts):
    out, update = np.array(x, copy=True), np.asarray(update)
    out[_block(_clamped_starts(out.shape, starts, update.shape), update.shape)] = update
    return [out]


@dynamic_slice_p.def_rule("abstract_eval")
def _dynamic_slice_abstract_eval(x, *starts, slice_sizes):
    check_start_types("dynamic_slice", x, starts)
    return [ShapedArray(check_slice_sizes(x, slice_sizes), x.dtype)]


@dynamic_update_slice_p.def_rule("abstract_eval")
def _dynamic_update_slice_abstract_eval(x, update, *starts):
    check_update_block(x, update)
    check_start_types("dynamic_update_slice", x, starts)
    return [x]


@dynamic_slice_p.def_rule("jvp")
def _dynamic_slice_jvp(primals, tangents, *, slice_sizes):
    (x, *starts), (dx, *_) = primals, tangents
    params = dict(slice_sizes=slice_sizes)
    return [bind(dynamic_slice_p, x, *starts, **params)], [
        bind(dynamic_slice_p, dx, *starts, **params)
    ]


@dynamic_update_slice_p.def_rule("jvp")
def _dynamic_update_slice_jvp(primals, tangents):
    (x, update, *starts), (dx, dupdate, *_) = primals, tangents
    return [bind(dynamic_update_slice_p, x, update, *starts)], [
        bind(dynamic_update_slice_p, dx, dupdate, *starts)
    ]


def _i64_starts(starts: Sequence[ir.Value], avals: Sequence[ShapedArray], shape):
    """The start indices as i64 scalars (StableHLO wants one integer type),
    negative ones counted from the end; StableHLO then clamps them."""
    i64 = ShapedArray((), np.int64)
    out = []
    for s, a, n in zip(starts, avals, shape):
        s = s if a.dtype == np.int64 else hlo.convert(ir_type(i64), s)
        if a.dtype.kind != "u":
            zero = ir_constant(0, i64)
            negative = hlo.compare(
                s,
                zero,
                hlo.ComparisonDirectionAttr.get("LT"),
                compare_type=hlo.ComparisonTypeAttr.get("SIGNED"),
            )
            s = hlo.select(negative, hlo.add(s, ir_constant(n, i64)), s)
        out.append(s)
    return out


@dynamic_slice_p.def_rule("lower")
def _dynamic_slice_lower(ctx, avals_in, avals_out, x, *starts, slice_sizes):
    starts = _i64_starts(starts, avals_in[1:], avals_in[0].shape)
    return [hlo.dynamic_slice(x, starts, slice_sizes)]


@dynamic_update_slice_p.def_rule("lower")
def _dynamic_update_slice_lower(ctx, avals_in, avals_out, x, update, *starts):
    starts = _i64_starts(starts, avals_in[2:], avals_in[0].shape)
    return [hlo.dynamic_update_slice(x, update, starts)]


gather_p = Primitive("gather")
scatter_add_p = Primitive("scatter-add")
scatter_p = Primitive("scatter")


def gather(x: ArrayLike, *indices: ArrayLike, batch_dims: int = 0) -> ArrayLike:
    """``x[i0, i1, ...]`` on leading axes (after ``batch_dims`` paired axes)."""
    x, indices = check_gather("gather", x, indices, batch_dims)
    return bind(gather_p, x, *indices, batch_dims=batch_dims)


def scatter_add(x, updates, *indices, batch_dims: int = 0) -> ArrayLike:
    """``x`` with ``updates`` added at ``x[i0, i1, ...]`` (repeats accumulate)."""
    x, updates, indices = check_scatter("scatter_add", x, updates, indices, batch_dims)
    return bind(scatter_add_p, x, updates, *indices, batch_dims=batch_dims)


def scatter(x, updates, *indices, batch_dims: int = 0) -> ArrayLike:
    """``x`` with ``updates`` written at ``x[i0, i1, ...]``."""
    x, updates, indices = check_scatter("scatter", x, updates, indices, batch_dims)
    return bind(scatter_p, x, updates, *indices, batch_dims=batch_dims)


# @title gather and the scatters: checks, evaluation, abstract evaluation
def numpy_index(shape, indices, batch_dims: int) -> tuple:
    """NumPy's index tuple for ``x[batch..., i0, i1, ...]``; indices out of
    range are clamped to the nearest position (XLA's gather does the same)."""
    idx_shape = np.shape(indices[0])
    batch = [
        np.arange(idx_shape[d]).reshape(
            [-1 if e == d else 1 for e in range(len(idx_shape))]
        )
        for d in range(batch_dims)
    ]
    sizes = shape[batch_dims:]
    indices = [np.clip(np.asarray(i), 0, n - 1) for i, n in zip(indices, sizes)]
    return (*batch, *indices)


def in_bounds_index(shape, indices, batch_dims: int) -> tuple:
    """Which index positions fall inside the array, and their index tuple (a
    scatter drops the updates outside, as XLA's does)."""
    inside = np.ones(np.shape(indices[0]), bool)
    for i, n in zip(indices, shape[batch_dims:]):
        i = np.asarray(i)
        inside &= (i >= 0) & (i < n)
    index = numpy_index(shape, indices, batch_dims)
    return inside, tuple(np.broadcast_to(a, inside.shape)[inside] for a in index)


@gather_p.def_rule("impl")
def _gather_impl(x, *indices, batch_dims):
    return [np.asarray(x)[numpy_index(np.shape(x), indices, batch_dims)]]


def _scatter_impl_with(combine: Callable | None) -> Callable:
    """Evaluation of a scatter: ``combine.at`` (np.add, ...), or assignment."""

    def rule(x, updates, *indices, batch_dims):
        out = np.array(x, copy=True)
        inside, index = in_bounds_index(out.shape, indices, batch_dims)
        if combine is None:  # a repeated position: the last update wins
            out[index] = np.asarray(updates)[inside]
        else:
            combine.at(out, index, np.asarray(updates)[inside])
        return [out]

    return rule


scatter_add_p.def_rule("impl")(_scatter_impl_with(np.add))
scatter_p.def_rule("impl")(_scatter_impl_with(None))


def _gather_types(name, x, indices, batch_dims) -> tuple:
    """Check the types of a gather; return the index shape and the window."""
    if not isinstance(batch_dims, int) or batch_dims < 0:
        raise TypeError(f"{name}: batch_dims must be an int >= 0, got {batch_dims!r}")
    if not indices:
        raise TypeError(f"{name}: needs at least one index array")
    idx_shape = indices[0].shape
    for i in indices:
        if i.dtype.kind not in "iu" or i.shape != idx_shape:
            raise TypeError(
                f"{name}: index arrays must be integer arrays of one shape, got "
                f"{', '.join(j.str_short() for j in indices)}"
            )
    if (
        len(idx_shape) < batch_dims
        or x.ndim < batch_dims + len(indices)
        or x.shape[:batch_dims] != idx_shape[:batch_dims]
    ):
        raise TypeError(
            f"{name}: {len(indices)} index arrays of shape {idx_shape} with "
            f"batch_dims={batch_dims} do not fit {x.str_short()}"
        )
    return idx_shape, x.shape[batch_dims + len(indices) :]


def check_gather(name, x, indices, batch_dims) -> tuple:
    x = _as_input(x, name)
    indices = [_as_input(i, name) for i in indices]
    _gather_types(name, get_aval(x), [get_aval(i) for i in indices], batch_dims)
    return x, indices


def check_scatter(name, x, updates, indices, batch_dims) -> tuple:
    x, indices = check_gather(name, x, indices, batch_dims)
    updates = _as_input(updates, name)
    idx_avals = [get_aval(i) for i in indices]
    _check_scatter_types(name, get_aval(x), get_aval(updates), idx_avals, batch_dims)
    return x, updates, indices


def _check_scatter_types(name, x, updates, idx_avals, batch_dims) -> None:
    idx_shape, window = _gather_types(name, x, idx_avals, batch_dims)
    expected = ShapedArray((*idx_shape, *window), x.dtype)
    if updates != expected:
        raise TypeError(
            f"{name}: updates must have type {expected.str_short()} to fit "
            f"{x.str_short()} at indices of shape {idx_shape}, got "
            f"{updates.str_short()}"
        )


@gather_p.def_rule("abstract_eval")
def _gather_abstract_eval(x, *indices, batch_dims):
    idx_shape, window = _gather_types("gather", x, indices, batch_dims)
    return [ShapedArray((*idx_shape, *window), x.dtype)]


def _scatter_abstract_eval(name: str, numeric: bool) -> Callable:
    def rule(x, updates, *indices, batch_dims):
        _check_scatter_types(name, x, updates, indices, batch_dims)
        if numeric and x.dtype.kind not in "iuf":
            raise TypeError(f"{name}: expected a numeric array, got {x.str_short()}")
        return [x]

    return rule


for _prim, _name in [(scatter_add_p, "scatter_add"), (scatter_p, "scatter")]:
    _prim.def_rule("abstract_eval")(
        _scatter_abstract_eval(_name, _prim is scatter_add_p)
    )


@gather_p.def_rule("transpose")
def _gather_transpose(cts, x, *indices, batch_dims):
    (ct,) = cts  # add each row's cotangent where the row was read
    ct_x = scatter_add(zeros_of(x.aval), ct, *indices, batch_dims=batch_dims)
    return [ct_x] + [None] * len(indices)


@scatter_add_p.def_rule("transpose")
def _scatter_add_transpose(cts, x, updates, *indices, batch_dims):
    (ct,) = cts
    ct_x = ct if _is_undef(x) else None  # x was added to unchanged
    ct_updates = None
    if _is_undef(updates):  # each update: the cotangent where it was added
        ct_updates = gather(ct, *indices, batch_dims=batch_dims)
    return [ct_x, ct_updates] + [None] * len(indices)


# @title jvp rules; scatter's transpose
@gather_p.def_rule("jvp")
def _gather_jvp(primals, tangents, *, batch_dims):
    (x, *indices), (dx, *_) = primals, tangents
    return [gather(x, *indices, batch_dims=batch_dims)], [
        gather(dx, *indices, batch_dims=batch_dims)
    ]


def _scatter_jvp(prim: Primitive) -> None:
    @prim.def_rule("jvp")
    def rule(primals, tangents, **params):
        (x, updates, *indices), (dx, dupdates, *_) = primals, tangents
        out = bind(prim, x, updates, *indices, **params)
        # the tangent takes the same winner at a repeated position as the
        # primal: evaluation and XLA on CPU apply updates in one fixed order
        return [out], [bind(prim, dx, dupdates, *indices, **params)]


_scatter_jvp(scatter_add_p)
_scatter_jvp(scatter_p)


def _per_window(mask, aval: ShapedArray, idx_ndim: int) -> ArrayLike:
    """A mask over index positions, broadcast over the windows of ``aval``."""
    window = tuple(range(idx_ndim, aval.ndim))
    return broadcast(mask, aval.shape, window) if window else mask


@scatter_p.def_rule("transpose")
def _scatter_transpose(cts, x, updates, *indices, batch_dims):
    (ct,) = cts
    up_aval = _aval_of(updates)
    ct_x = ct_updates = None
    if _is_undef(x):  # overwritten positions had no influence on the output
        ct_x = scatter(ct, zeros_of(up_aval), *indices, batch_dims=batch_dims)
    if _is_undef(updates):  # only the winners (a dropped update never wins)
        ct_updates = gather(ct, *indices, batch_dims=batch_dims)
        won = update_won(get_aval(ct).shape, indices, batch_dims)
        won = _per_window(won, up_aval, get_aval(indices[0]).ndim)
        ct_updates = select(won, ct_updates, zeros_of(up_aval))
    return [ct_x, ct_updates] + [None] * len(indices)


def update_won(shape, indices, batch_dims) -> ArrayLike:
    """Which updates a scatter keeps at a repeated position: scatter their
    ids, read the ids back, and compare."""
    idx_shape = get_aval(indices[0]).shape
    ids = np.arange(math.prod(idx_shape), dtype=np.int64).reshape(idx_shape)
    positions = shape[: batch_dims + len(indices)]
    board = np.full(positions, -1, np.int64)
    written = scatter(board, ids, *indices, batch_dims=batch_dims)
    return equal(gather(written, *indices, batch_dims=batch_dims), ids)


# @title scatter-mul, scatter-min, scatter-max: evaluation, types, jvp, transpose
scatter_mul_p = Primitive("scatter-mul")
scatter_min_p = Primitive("scatter-min")
scatter_max_p = Primitive("scatter-max")


def _scatter_wrapper(prim: Primitive, name: str) -> Callable:
    def fn(x, updates, *indices, batch_dims: int = 0) -> ArrayLike:
        x, updates, indices = check_scatter(name, x, updates, indices, batch_dims)
        return bind(prim, x, updates, *indices, batch_dims=batch_dims)

    fn.__name__ = name
    fn.__doc__ = f"``x`` with ``updates`` combined by {name[8:]} at ``x[i0, ...]``."
    return fn


scatter_mul = _scatter_wrapper(scatter_mul_p, "scatter_mul")
scatter_min = _scatter_wrapper(scatter_min_p, "scatter_min")
scatter_max = _scatter_wrapper(scatter_max_p, "scatter_max")
for _prim, _name, _combine in [
    (scatter_mul_p, "scatter_mul", np.multiply),
    (scatter_min_p, "scatter_min", np.minimum),
    (scatter_max_p, "scatter_max", np.maximum),
]:
    _prim.def_rule("impl")(_scatter_impl_with(_combine))
    _prim.def_rule("abstract_eval")(_scatter_abstract_eval(_name, True))


@scatter_mul_p.def_rule("jvp")
def _scatter_mul_jvp(primals, tangents, *, batch_dims):
    (x, u, *indices), (dx, du, *_) = primals, tangents
    out = scatter_mul(x, u, *indices, batch_dims=batch_dims)
    t_out = scatter_mul(dx, u, *indices, batch_dims=batch_dims)
    if get_aval(x).dtype.kind != "f":
        return [out], [t_out]
    # d(prod of the updates at a position) = sum_k du_k * (prod of the others)
    # computed without dividing by zero: count the zero updates per position
    # and multiply the nonzero ones
    x_aval = get_aval(x)
    is_zero = numpy_equal(u, 0.0)
    nonzero_product = scatter_mul(
        full_of(x_aval, 1.0),
        numpy_where(is_zero, 1.0, u),
        *indices,
        batch_dims=batch_dims,
    )
    zero_count = scatter_add(
        zeros_of(x_aval),
        convert_element_type(is_zero, x_aval.dtype),
        *indices,
        batch_dims=batch_dims,
    )
    product_k = gather(nonzero_product, *indices, batch_dims=batch_dims)
    zeros_k = gather(zero_count, *indices, batch_dims=batch_dims)
    others = numpy_where(
        is_zero,
        numpy_where(numpy_equal(zeros_k, 1.0), product_k, 0.0),
        numpy_where(
            numpy_equal(zeros_k, 0.0),
            numpy_divide(product_k, numpy_where(is_zero, 1.0, u)),
            0.0,
        ),
    )
    d_product = scatter_add(
        zeros_of(x_aval), mul(du, others), *indices, batch_dims=batch_dims
    )
    return [out], [add(t_out, mul(x, d_product))]


@scatter_mul_p.def_rule("transpose")
def _scatter_mul_transpose(cts, x, updates, *indices, batch_dims):
    (ct,) = cts
    if _is_undef(updates):
        raise TypeError("scatter_mul is linear in its operand x only, not in updates")
    ct_x = scatter_mul(ct, updates, *indices, batch_dims=batch_dims)
    return [ct_x, None] + [None] * len(indices)


def _scatter_extremal_jvp(prim: Primitive) -> None:
    """The tangent of the value that won at each position; where several tie
    (updates, and x if it kept its value), their tangents are averaged."""

    @prim.def_rule("jvp")
    def rule(primals, tangents, *, batch_dims):
        (x, u, *indices), (dx, du, *_) = primals, tangents
        out = bind(prim, x, u, *indices, batch_dims=batch_dims)
        x_aval, u_aval = get_aval(x), get_aval(u)
        if x_aval.dtype.kind != "f":
            return [out], [zeros_of(x_aval)]
        p = dict(batch_dims=batch_dims)

        def count_at_positions(which):  # per update: how many share its position
            per_position = scatter_add(zeros_of(x_aval), which, *indices, **p)
            return gather(per_position, *indices, **p)

        target = gather(out, *indices, **p)
        won = numpy_equal(u, target)
        kept = numpy_equal(gather(x, *indices, **p), target)
        winners = count_at_positions(convert_element_type(won, x_aval.dtype))
        refs = count_at_positions(full_of(u_aval, 1.0))
        # (each denominator at least 1: it is 0 only for updates out of range,
        # whose tangents the last scatter-add drops anyway)
        share = numpy_divide(
            1.0, numpy_where(kept, winners + 1.0, numpy_maximum(winners, 1.0))
        )
        u_coef = numpy_where(won, share, 0.0)
        x_share = numpy_where(kept, numpy_divide(1.0, winners + 1.0), 0.0)
        x_coef = numpy_divide(x_share - 1.0, numpy_maximum(refs, 1.0))
        moved = add(mul(gather(dx, *indices, **p), x_coef), mul(du, u_coef))
        return [out], [scatter_add(dx, moved, *indices, **p)]


_scatter_extremal_jvp(scatter_min_p)
_scatter_extremal_jvp(scatter_max_p)
NOT_LINEAR.update({"scatter-min", "scatter-max"})  # no transpose rule


@gather_p.def_rule("vmap")
def _gather_vmap(axis, vals, dims, *, batch_dims):
    (x, *indices), (bx, *b_indices) = vals, dims
    nb, k = batch_dims, len(indices)
    if all(b is None for b in b_indices):  # one index map for every example
        x = move_batch_axis(axis.size, bx, nb + k, x)
        return [gather(x, *indices, batch_dims=nb)], [get_aval(indices[0]).ndim]
    if bx is None:  # one array, an index map per example
        indices = [
            move_batch_axis(axis.size, b, nb, i) for i, b in zip(indices, b_indices)
        ]
        return [gather(x, *indices, batch_dims=nb)], [nb]
    x = move_batch_axis(axis.size, bx, 0, x)  # both: pair the batch axes
    indices = [move_batch_axis(axis.size, b, 0, i) for i, b in zip(indices, b_indices)]
    return [gather(x, *indices, batch_dims=nb + 1)], [0]


# @title Batching the scatters, dynamic_slice and dynamic_update_slice
def _scatter_vmap(prim: Primitive) -> None:
    @prim.def_rule("vmap")
    def rule(axis, vals, dims, *, batch_dims, **params):
        (x, updates, *indices), (bx, bu, *b_indices) = vals, dims
        nb, k = batch_dims, len(indices)
        if all(b is None for b in b_indices):
            x = move_batch_axis(axis.size, bx, nb + k, x)
            updates = move_batch_axis(axis.size, bu, get_aval(indices[0]).ndim, updates)
            out = bind(prim, x, updates, *indices, batch_dims=nb, **params)
            return [out], [nb + k]
        x = move_batch_axis(axis.size, bx, 0, x)
        updates = move_batch_axis(axis.size, bu, 0, updates)
        indices = [
            move_batch_axis(axis.size, b, 0, i) for i, b in zip(indices, b_indices)
        ]
        return [bind(prim, x, updates, *indices, batch_dims=nb + 1, **params)], [0]


for _prim in [scatter_add_p, scatter_p, scatter_mul_p, scatter_min_p, scatter_max_p]:
    _scatter_vmap(_prim)


def block_positions(axis_size, shape, starts, b_starts, sizes) -> list:
    """Per example, the index arrays of a block of ``sizes`` at ``starts``
    (clamped to fit ``shape``): one array of shape (batch, *sizes) per axis."""
    out_shape = (axis_size, *sizes)
    positions = []
    for a, (s, b, n, k) in enumerate(zip(starts, b_starts, shape, sizes)):
        s = move_batch_axis(axis_size, b, 0, s)  # (batch,)
        s = numpy_clip(_wrap_negative(s, n), 0, n - k)
        offsets = np.arange(k, dtype=get_aval(s).dtype)
        others = tuple(d for d in range(len(out_shape)) if d != a + 1)
        s = broadcast(s, out_shape, tuple(range(1, len(out_shape))))
        positions.append(add(s, broadcast(offsets, out_shape, others)))
    return positions


@dynamic_slice_p.def_rule("vmap")
def _dynamic_slice_vmap(axis, vals, dims, *, slice_sizes):
    (x, *starts), (bx, *b_starts) = vals, dims
    if all(b is None for b in b_starts):
        x = move_batch_axis(axis.size, bx, 0, x)
        zero = np.zeros((), np.int64)
        sizes = (axis.size, *slice_sizes)
        return [bind(dynamic_slice_p, x, zero, *starts, slice_sizes=sizes)], [0]
    shape = (
        get_aval(x).shape
        if bx is None
        else get_aval(x).shape[:bx] + get_aval(x).shape[bx + 1 :]
    )
    positions = block_positions(axis.size, shape, starts, b_starts, slice_sizes)
    if bx is None:
        return [gather(x, *positions)], [0]
    x = move_batch_axis(axis.size, bx, 0, x)
    return [gather(x, *positions, batch_dims=1)], [0]


@dynamic_update_slice_p.def_rule("vmap")
def _dynamic_update_slice_vmap(axis, vals, dims):
    (x, update, *starts), (bx, bu, *b_starts) = vals, dims
    x = move_batch_axis(axis.size, bx, 0, x)
    update = move_batch_axis(axis.size, bu, 0, update)
    if all(b is None for b in b_starts):
        zero = np.zeros((), np.int64)
        return [bind(dynamic_update_slice_p, x, update, zero, *starts)], [0]
    shape, sizes = get_aval(x).shape[1:], get_aval(update).shape[1:]
    positions = block_positions(axis.size, shape, starts, b_starts, sizes)
    return [scatter(x, update, *positions, batch_dims=1)], [0]


# @title Lowering to stablehlo.gather and stablehlo.scatter
def _stacked_indices(indices, avals) -> ir.Value:
    """One i64 index array with the index vector as its last axis."""
    shape = avals[0].shape
    column = ir_type(ShapedArray((*shape, 1), np.int64))
    i64 = ShapedArray(shape, np.int64)
    columns = []
    for i, a in zip(indices, avals):
        i = i if a.dtype == np.int64 else hlo.convert(ir_type(i64), i)
        columns.append(hlo.reshape(column, i))
    return columns[0] if len(columns) == 1 else hlo.concatenate(columns, len(shape))


@gather_p.def_rule("lower")
def _gather_lower(ctx, avals_in, avals_out, x, *indices, batch_dims):
    x_aval, idx_avals = avals_in[0], avals_in[1:]
    nb, k, r = batch_dims, len(indices), idx_avals[0].ndim
    dims = hlo.GatherDimensionNumbers.get(
        offset_dims=list(range(r, avals_out[0].ndim)),
        collapsed_slice_dims=list(range(nb, nb + k)),
        operand_batching_dims=list(range(nb)),
        start_indices_batching_dims=list(range(nb)),
        start_index_map=list(range(nb, nb + k)),
        index_vector_dim=r,
    )
    sizes = [1] * (nb + k) + list(x_aval.shape[nb + k :])
    out = hlo.gather(x, _stacked_indices(indices, idx_avals), dims, sizes)
    return [out]


def _lower_scatter(prim: Primitive, combine: Callable | None) -> None:
    @prim.def_rule("lower")
    def rule(ctx, avals_in, avals_out, x, updates, *indices, batch_dims):
        x_aval, up_aval, idx_avals = avals_in[0], avals_in[1], avals_in[2:]
        nb, k, r = batch_dims, len(indices), idx_avals[0].ndim
        dims = hlo.ScatterDimensionNumbers.get(
            update_window_dims=list(range(r, up_aval.ndim)),
            inserted_window_dims=list(range(nb, nb + k)),
            input_batching_dims=list(range(nb)),
            scatter_indices_batching_dims=list(range(nb)),
            scattered_dims_to_operand_dims=list(range(nb, nb + k)),
            index_vector_dim=r,
        )
        stacked = _stacked_indices(indices, idx_avals)
        op = hlo.ScatterOp([ir_type(avals_out[0])], [x], stacked, [updates], dims)
        scalar = ir_type(ShapedArray((), x_aval.dtype))
        body = op.regions[0].blocks.append(scalar, scalar)
        with ir.InsertionPoint(body):
            old, new = body.arguments
            hlo.ReturnOp([new if combine is None else combine(old, new)])
        return [op.results[0]]


_lower_scatter(scatter_add_p, hlo.add)
_lower_scatter(scatter_p, None)
_lower_scatter(scatter_mul_p, hlo.multiply)
_lower_scatter(scatter_min_p, hlo.minimum)
_lower_scatter(scatter_max_p, hlo.maximum)


def getitem(x: ArrayLike, idx: Any) -> ArrayLike:
    """``x[idx]`` with NumPy's indexing rules."""
    plan = index_plan(get_aval(x), idx)
    if plan.kind == "empty":  # nothing to read
        return zeros_of(ShapedArray(plan.shape, get_aval(x).dtype))
    if plan.kind == "dynamic_slice":
        x = dynamic_slice(x, plan.starts, plan.sizes)
    elif plan.starts is not None:  # a static slice (before a gather, if any)
        x = lax_slice(x, plan.starts, plan.limits, plan.strides)
    if plan.kind == "gather":  # indexed axes first, whole axes as the window
        x = gather(permute(x, plan.perm), *plan.positions)
        x = permute(x, plan.out_perm)  # the result's axes in NumPy's order
    return reshape(x, plan.shape)


class IndexUpdateRef(NamedTuple):
    """``x.at[idx]``: what ``get``, ``set``, ``add``, ... act on."""

    x: ArrayLike
    idx: Any

    def get(self, *, mode=None, fill_value=None) -> ArrayLike:
        return read_with_mode(self.x, self.idx, mode, fill_value)

    def set(self, values: ArrayLike, *, mode=None) -> ArrayLike:
        return self._write(scatter, values, mode)

    def add(self, values: ArrayLike, *, mode=None) -> ArrayLike:
        return self._write(scatter_add, values, mode)

    def multiply(self, values: ArrayLike, *, mode=None) -> ArrayLike:
        return self._write(scatter_mul, values, mode)

    def min(self, values: ArrayLike, *, mode=None) -> ArrayLike:
        return self._write(scatter_min, values, mode)

    def max(self, values: ArrayLike, *, mode=None) -> ArrayLike:
        return self._write(scatter_max, values, mode)

    def _write(self, scatter_fn: Callable, values: ArrayLike, mode) -> ArrayLike:
        plan = index_plan(get_aval(self.x), self.idx, for_update=True)
        values = check_update_values(self.x, plan.shape, values)  # broadcast, cast
        if plan.kind == "empty":  # nothing to write
            return self.x
        x = permute(self.x, plan.perm)  # the axes as the gather would read them
        values = permute(values, inverse_perm(plan.out_perm))  # and the update
        x = scatter_fn(x, values, *bounded_positions(plan, mode))
        return permute(x, inverse_perm(plan.perm))


# @title index_plan: NumPy's index language, parsed into a slice or a gather
class IndexingError(IndexError, TypeError):
    """An index that does not fit the array (an IndexError, as in NumPy)."""


class NonConcreteBooleanIndexError(IndexingError):
    """A boolean mask index whose value is not known while tracing."""


class IndexPlan(NamedTuple):
    kind: str  # "slice", "dynamic_slice", "gather", "whole" (x) or "empty"
    shape: tuple  # the shape of x[idx]
    starts: Any = None  # slice, dynamic_slice
    limits: Any = None  # slice
    strides: Any = None  # slice
    sizes: Any = None  # dynamic_slice
    positions: Any = None  # gather: one index array per indexed axis
    perm: Any = None  # gather: x's indexed axes first, then the whole ones
    out_perm: Any = None  # gather: from the gather's axes to the result's
    indexed_shape: Any = None  # gather: the sizes of the indexed axes


def permute(x: ArrayLike, perm: Sequence[int]) -> ArrayLike:
    """``transpose(x, perm)``, or ``x`` itself for the identity."""
    return x if tuple(perm) == tuple(range(len(perm))) else transpose(x, perm)


def inverse_perm(perm: Sequence[int]) -> tuple:
    return tuple(int(i) for i in np.argsort(perm))


def _is_scalar_bool(item: Any) -> bool:
    """``True``, ``False``, a NumPy bool or a 0-d boolean array (not traced)."""
    return isinstance(item, (bool, np.bool_)) or (
        isinstance(item, np.ndarray) and item.shape == () and item.dtype == np.bool_
    )


def _entries(aval: ShapedArray, idx: Any) -> list:
    """The index as a list of (kind, axis, value): ("new",), ("slice", axis,
    (start, step, count)), ("int", axis, i), ("array", axis, array)."""
    if isinstance(idx, list):
        raise TypeError(
            f"indexing {aval.str_short()} with a list {_short_repr(idx)}: use a "
            "tuple for several indices, or an array, x[np.array(seq)], as in JAX"
        )
    items = list(idx) if isinstance(idx, tuple) else [idx]
    if sum(item is Ellipsis for item in items) > 1:
        raise IndexingError(f"indexing {aval.str_short()}: at most one ... is allowed")
    used = sum(_axes_used(aval, item) for item in items if item is not Ellipsis)
    if used > aval.ndim:
        raise IndexingError(
            f"Too many indices: array is {aval.ndim}-dimensional, but {used} were "
            f"indexed (indexing {aval.str_short()} with {_short_repr(idx)})"
        )
    if not any(item is Ellipsis for item in items):
        items.append(Ellipsis)
    at = next(k for k, item in enumerate(items) if item is Ellipsis)
    items[at : at + 1] = [slice(None)] * (aval.ndim - used)
    entries, axis = [], 0
    for item in items:
        if item is None:
            entries.append(("new",))
            continue
        if _is_scalar_bool(item):  # an index array on a new axis of size 1
            entries.append(("array", None, np.zeros(1 if item else 0, np.int64)))
            continue
        n = aval.shape[axis] if axis < aval.ndim else 0
        if isinstance(item, slice):
            start, stop, step = (
                _static_int(aval, v) for v in (item.start, item.stop, item.step)
            )
            if step == 0:
                raise ValueError(
                    f"indexing {aval.str_short()}: slice step cannot be zero"
                )
            start, stop, step = slice(start, stop, step).indices(n)
            entries.append(
                ("slice", axis, (start, step, len(range(start, stop, step))))
            )
            axis += 1
        elif _is_python_scalar(item) or isinstance(item, np.integer):
            entries.append(("int", axis, _static_int(aval, item)))
            axis += 1
        else:
            array = _index_array(aval, item)
            if get_aval(array).dtype == np.bool_:
                mask_shape = get_aval(array).shape
                if mask_shape != aval.shape[axis : axis + len(mask_shape)]:
                    raise IndexingError(
                        f"indexing {aval.str_short()}: boolean index did not match "
                        f"shape of indexed array: a mask of shape {mask_shape} "
                        f"for the axes {aval.shape[axis : axis + len(mask_shape)]}"
                    )
                for a in np.nonzero(array):
                    entries.append(("array", axis, a))
                    axis += 1
            else:
                entries.append(("array", axis, array))
                axis += 1
    return entries


def _axes_used(aval: ShapedArray, item: Any) -> int:
    if item is None or _is_scalar_bool(item):
        return 0
    if isinstance(item, (slice, int, np.integer)) or _is_python_scalar(item):
        return 1
    array = _index_array(aval, item)
    return get_aval(array).ndim if get_aval(array).dtype == np.bool_ else 1


def _static_int(aval: ShapedArray, value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, Tracer):
        value.check_live()
        raise TypeError(
            f"indexing {aval.str_short()}: a slice's start, stop and step must "
            f"be known while tracing, got a traced {value.aval.str_short()}; use "
            "dynamic_slice for a block at a traced position"
        )
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise TypeError(
            f"indexing {aval.str_short()}: Indexer must have integer or boolean "
            f"type, got {_short_repr(value)}"
        )
    return int(value)


def _index_array(aval: ShapedArray, item: Any) -> Any:
    """An index given as an array: NumPy's (kept static), or a tracer."""
    if isinstance(item, Tracer):
        item.check_live()
        if item.aval.dtype == np.bool_:
            raise NonConcreteBooleanIndexError(
                f"indexing {aval.str_short()} with a traced boolean mask "
                f"{item.aval.str_short()}: the shape of the result would depend "
                "on the mask's values, which are not known while tracing. Use "
                "jnp.where(mask, x, 0) (or a sum of the masked values) instead"
            )
    else:
        item = np.asarray(item)  # NumPy arrays, device Arrays, booleans
    dtype = get_aval(item).dtype
    if dtype.kind not in "biu":
        raise TypeError(
            f"indexing {aval.str_short()}: Indexer must have integer or boolean "
            f"type, got an index of type {get_aval(item).str_short()}"
        )
    return item


def index_plan(aval: ShapedArray, idx: Any, for_update: bool = False) -> IndexPlan:
    """How to compute ``x[idx]`` for ``x`` of type ``aval``."""
    entries = _entries(aval, idx)
    arrays = [e for e in entries if e[0] == "array"]
    simple = all(e[0] != "slice" or e[2][1] > 0 for e in entries)
    if for_update:
        return _gather_plan(aval, entries)
    if simple and all(get_aval(e[2]).ndim == 0 for e in arrays):
        return _slicing_plan(aval, entries)
    return _slice_then_gather_plan(aval, entries)


def _slice_then_gather_plan(aval: ShapedArray, entries: list) -> IndexPlan:
    """A read: the slices with a positive step that do not take their whole
    axis are done by a static slice first, so the gather reads them whole, as
    its window, instead of at positions given by a constant."""
    starts, limits, strides = [0] * aval.ndim, list(aval.shape), [1] * aval.ndim
    sliced = []
    for e in entries:
        if e[0] == "slice" and e[2][1] > 0 and e[2] != (0, 1, aval.shape[e[1]]):
            (start, step, count), axis = e[2], e[1]
            starts[axis], strides[axis] = start, step
            limits[axis] = past_last(start, count, step)
            e = ("slice", axis, (0, 1, count))
        sliced.append(e)
    if sliced == entries:
        return _gather_plan(aval, entries)
    shape = tuple(map(_sliced_size, starts, limits, strides))
    plan = _gather_plan(ShapedArray(shape, aval.dtype), sliced)
    return plan._replace(
        starts=tuple(starts), limits=tuple(limits), strides=tuple(strides)
    )


def _slicing_plan(aval: ShapedArray, entries: list) -> IndexPlan:
    """ints, positive-step slices, None, traced scalars: a (dynamic) slice."""
    starts, limits, strides = [0] * aval.ndim, list(aval.shape), [1] * aval.ndim
    shape, dynamic = [], False
    for e in entries:
        if e[0] == "new":
            shape.append(1)
        elif e[0] == "slice":
            axis, (start, step, count) = e[1], e[2]
            starts[axis], strides[axis] = start, step
            limits[axis] = start + (count - 1) * step + 1 if count else start
            shape.append(count)
        elif e[0] == "int" or not isinstance(e[2], Tracer):  # one element
            axis, n = e[1], aval.shape[e[1]]
            i = int(np.asarray(e[2]))
            i = i + n if i < 0 else i
            starts[axis] = min(max(i, 0), n - 1)  # JAX clamps reads
            limits[axis] = starts[axis] + 1
        else:  # a traced scalar: a dynamic start
            starts[e[1]], limits[e[1]], dynamic = e[2], None, True  # wrapped later
    if not dynamic:
        whole = starts == [0] * aval.ndim and limits == list(aval.shape)
        if whole and strides == [1] * aval.ndim:
            return IndexPlan("whole", tuple(shape))
        return IndexPlan(
            "slice", tuple(shape), tuple(starts), tuple(limits), tuple(strides)
        )
    if any(s != 1 for s in strides):
        return _slice_then_gather_plan(aval, entries)
    sizes = tuple(1 if hi is None else hi - lo for lo, hi in zip(starts, limits))
    starts = [s if isinstance(s, Tracer) else np.asarray(s, np.int64) for s in starts]
    return IndexPlan("dynamic_slice", tuple(shape), starts=starts, sizes=sizes)


def _gather_plan(aval: ShapedArray, entries: list) -> IndexPlan:
    """Everything else: the axes taken whole become the gather's window; for
    the others, the position of each element of x[idx] along each of them,
    as index arrays."""
    entries = [
        ("array", e[1], np.asarray(e[2])) if e[0] == "int" else e for e in entries
    ]
    adv = [k for k, e in enumerate(entries) if e[0] == "array"]
    contiguous = adv == list(range(adv[0], adv[0] + len(adv))) if adv else True
    adv_shape = np.broadcast_shapes(*(get_aval(entries[k][2]).shape for k in adv))
    # the result's axes, in order: ("new",), ("slice", axis) or ("array",)
    layout = []
    for k, e in enumerate(entries):
        if e[0] != "array":
            layout.append(e[:2])
        elif k == adv[0] and contiguous:
            layout.append(("array",))
    if not contiguous:
        layout.insert(0, ("array",))

    def entry_of(axis):
        return next(e for e in entries if e[0] != "new" and e[1] == axis)

    # axes taken whole (x[:, ...]) are read as the window; at least one is indexed
    whole = [
        a
        for a in range(aval.ndim)
        if entry_of(a)[0] == "slice" and entry_of(a)[2] == (0, 1, aval.shape[a])
    ]
    if len(whole) == aval.ndim:
        whole = whole[1:]
    indexed = [a for a in range(aval.ndim) if a not in whole]

    def sizes(item):
        if item[0] == "array":
            return list(adv_shape)
        if item[0] == "new":
            return [1]
        return [entry_of(item[1])[2][2]]

    shape = [n for item in layout for n in sizes(item)]
    # the gather's output: the positions' axes (the result's axes that are not
    # whole, in order), then the whole axes in x's order
    at, positions_axes, window_axes = 0, [], {}
    where = {}
    for item in layout:
        k = len(sizes(item))
        if item[0] == "slice" and item[1] in whole:
            window_axes[item[1]] = at
        else:
            where[item] = len(positions_axes)
            positions_axes.extend(range(at, at + k))
        at += k
    gather_axes = positions_axes + [window_axes[a] for a in whole]
    positions_shape = tuple(shape[d] for d in positions_axes)
    positions = []
    for axis in indexed:
        e = entry_of(axis)
        if e[0] == "slice":
            start, step, count = e[2]
            p = np.arange(count, dtype=np.int64) * step + start
            at = where[("slice", axis)]
            p = p.reshape([-1 if d == at else 1 for d in range(len(positions_shape))])
            positions.append(np.broadcast_to(p, positions_shape))
        else:
            p = broadcast_to(_wrap_negative(e[2], aval.shape[axis]), adv_shape)
            at = where[("array",)]
            block = range(at, at + len(adv_shape))
            others = tuple(d for d in range(len(positions_shape)) if d not in block)
            positions.append(broadcast(p, positions_shape, others) if others else p)
    if 0 in shape:  # an empty result: nothing to gather
        return IndexPlan("empty", tuple(shape))
    return IndexPlan(
        "gather",
        tuple(shape),
        positions=positions,
        perm=tuple(indexed + whole),
        out_perm=inverse_perm(gather_axes),
        indexed_shape=tuple(aval.shape[a] for a in indexed),
    )


def check_index_mode(name: str, mode: Any) -> str:
    """JAX's out-of-range modes; None is "promise_in_bounds" ("fill" for take)."""
    if mode is None:
        return "promise_in_bounds"
    mode = getattr(mode, "name", mode)  # a GatherScatterMode-like enum
    mode = {"FILL_OR_DROP": "fill", "CLIP": "clip"}.get(mode, str(mode).lower())
    if mode not in ("promise_in_bounds", "clip", "fill", "drop"):
        raise ValueError(
            f"{name}: mode must be None, 'promise_in_bounds', 'clip', 'fill' or "
            f"'drop', got {mode!r}"
        )
    return mode


def bounded_positions(plan: IndexPlan, mode: Any) -> list:
    """The plan's positions; with mode "clip", clamped into their axes."""
    if check_index_mode("at[]", mode) != "clip":
        return plan.positions
    return [
        numpy_clip(p, 0, max(n - 1, 0))
        for p, n in zip(plan.positions, plan.indexed_shape)
    ]


def in_bounds(shape, indices) -> ArrayLike:
    """A boolean array over the index positions: inside ``shape`` or not."""
    inside = True
    for i, n in zip(indices, shape):
        here = select(i >= 0, i < n, i >= 0)  # i >= 0 and i < n
        inside = here if inside is True else select(here, inside, here)
    return inside


def read_with_mode(x: ArrayLike, idx: Any, mode: Any, fill_value: Any) -> ArrayLike:
    """``x.at[idx].get(mode=..., fill_value=...)``: "clip" clamps the positions
    before the gather, "fill" (or "drop") puts ``fill_value`` where they are
    out of range; by default, the same as ``x[idx]``."""
    mode = check_index_mode("at[].get", mode)
    if mode == "promise_in_bounds":
        return getitem(x, idx)
    plan = index_plan(get_aval(x), idx, for_update=True)
    dtype = get_aval(x).dtype
    if plan.kind == "empty":
        return zeros_of(ShapedArray(plan.shape, dtype))
    out = gather(permute(x, plan.perm), *bounded_positions(plan, mode))
    if mode in ("fill", "drop"):
        inside = in_bounds(plan.indexed_shape, plan.positions)
        inside = _per_window(inside, get_aval(out), get_aval(plan.positions[0]).ndim)
        fill = _fill_value(dtype) if fill_value is None else fill_value
        out = select(inside, out, full_of(get_aval(out), fill))
    return reshape(permute(out, plan.out_perm), plan.shape)


def _fill_value(dtype: np.dtype) -> Any:
    """JAX's fill for out-of-range reads: NaN, the lowest int, or True."""
    if dtype.kind == "f":
        return np.nan
    if dtype.kind == "b":
        return True
    return np.iinfo(dtype).min if dtype.kind == "i" else np.iinfo(dtype).max


def check_update_values(x: ArrayLike, shape: tuple, values: ArrayLike) -> ArrayLike:
    """The update of ``x.at[idx]``, broadcast to ``x[idx]``'s shape, in x's dtype."""
    values = _as_input(values, "at[]")
    aval, x_aval = get_aval(values), get_aval(x)
    if aval.ndim > len(shape) or any(
        d not in (1, n) for d, n in zip(aval.shape[::-1], shape[::-1])
    ):
        raise ValueError(
            f"x.at[idx] of {x_aval.str_short()}: an update of shape {aval.shape} "
            f"does not broadcast to the indexed shape {shape}"
        )
    values = convert_element_type(values, x_aval.dtype)
    return broadcast_to(values, shape)


def _iterate_rows(self: ArrayOperators) -> Iterator[ArrayLike]:
    aval = get_aval(self)
    if not aval.shape:
        raise TypeError(f"iteration over a 0-d array: {aval.str_short()}")
    return iter([getitem(self, i) for i in range(aval.shape[0])])


ArrayOperators.__getitem__ = getitem
ArrayOperators.at = property(lambda self: _IndexUpdateHelper(self))
Tracer.__iter__ = Array.__iter__ = _iterate_rows


class _IndexUpdateHelper(NamedTuple):
    x: ArrayLike

    def __getitem__(self, idx: Any) -> IndexUpdateRef:
        return IndexUpdateRef(self.x, idx)


def zero_dropped_updates(prim: Primitive) -> None:
    """Wrap ``prim``'s transpose rule: zero cotangent for the dropped updates."""
    in_range_rule = prim.rules["transpose"]

    @prim.def_rule("transpose")
    def rule(cts, x, updates, *indices, batch_dims):
        ct_x, ct_u, *rest = in_range_rule(
            cts, x, updates, *indices, batch_dims=batch_dims
        )
        if ct_u is not None:  # keep the cotangents of the updates inside x
            inside = in_bounds(get_aval(cts[0]).shape[batch_dims:], indices)
            inside = _per_window(inside, get_aval(ct_u), get_aval(indices[0]).ndim)
            ct_u = select(inside, ct_u, zeros_of(get_aval(ct_u)))
        return [ct_x, ct_u, *rest]


zero_dropped_updates(scatter_add_p)


# @title take, take_along_axis, split, argmax, argmin; the lax names
def _check_take_mode(name: str, mode: Any, allowed: tuple) -> str:
    """take's modes: None is "fill", as in JAX."""
    if mode not in (None, *allowed):
        raise ValueError(
            f"{name}: mode must be None, {', '.join(map(repr, allowed))}, got {mode!r}"
        )
    return mode or "fill"


@numpy_function
def numpy_take(a, indices, axis=None, mode=None, fill_value=None) -> ArrayLike:
    """Elements (or slices along ``axis``) of ``a`` at ``indices``."""
    mode = _check_take_mode("take", mode, ("fill", "clip"))
    a = _as_input(a, "take")
    if axis is None:
        a, axis = reshape(a, (-1,)), 0
    axis = _normalize_axes("take", axis, get_aval(a).ndim)[0]
    indices = _index_array(get_aval(a), indices)
    if mode == "clip":  # as NumPy's take: clamped before counting from the end
        n = get_aval(a).shape[axis]
        indices, mode = numpy_clip(indices, 0, max(n - 1, 0)), "promise_in_bounds"
    return read_with_mode(a, (slice(None),) * axis + (indices,), mode, fill_value)


@numpy_function
def numpy_take_along_axis(arr, indices, axis=-1, mode=None, fill_value=None):
    """``arr`` read at ``indices`` along ``axis``, the other axes matched."""
    allowed = ("fill", "drop", "clip", "promise_in_bounds")
    mode = _check_take_mode("take_along_axis", mode, allowed)
    arr = _as_input(arr, "take_along_axis")
    aval = get_aval(arr)
    indices = _index_array(aval, indices)
    if axis is None:
        arr, indices, axis = reshape(arr, (-1,)), reshape(indices, (-1,)), 0
        aval = get_aval(arr)
    idx_aval = get_aval(indices)
    axis = _normalize_axes("take_along_axis", axis, aval.ndim)[0]
    if idx_aval.ndim != aval.ndim:
        raise TypeError(
            f"take_along_axis: indices {idx_aval.str_short()} must have as many "
            f"axes as the array {aval.str_short()}"
        )
    others = [
        tuple(1 if d == axis else n for d, n in enumerate(a.shape))
        for a in (aval, idx_aval)
    ]
    shape = list(np.broadcast_shapes(*others))  # the other axes must match
    n, k = aval.shape[axis], idx_aval.shape[axis]
    arr = broadcast_to(arr, tuple(shape[:axis] + [n] + shape[axis + 1 :]))
    indices = broadcast_to(indices, tuple(shape[:axis] + [k] + shape[axis + 1 :]))
    # the other axes first and paired (batch_dims): no positions to build
    perm = [d for d in range(aval.ndim) if d != axis] + [axis]
    arr, indices = permute(arr, perm), permute(_wrap_negative(indices, n), perm)
    positions = numpy_clip(indices, 0, max(n - 1, 0)) if mode == "clip" else indices
    out = gather(arr, positions, batch_dims=aval.ndim - 1)
    if mode in ("fill", "drop"):
        fill = _fill_value(aval.dtype) if fill_value is None else fill_value
        out = select(in_bounds((n,), [indices]), out, full_of(get_aval(out), fill))
    return permute(out, inverse_perm(perm))


@numpy_function
def numpy_split(ary, indices_or_sections, axis: int = 0) -> list:
    """``ary`` cut along ``axis``: into equal sections, or at the given indices."""
    ary = _as_input(ary, "split")
    aval = get_aval(ary)
    axis = _normalize_axes("split", axis, aval.ndim)[0]
    n = aval.shape[axis]
    if isinstance(indices_or_sections, (int, np.integer)):
        sections = int(indices_or_sections)
        if sections <= 0 or n % sections:
            raise ValueError(
                f"split: array split does not result in an equal division: "
                f"{aval.str_short()} has {n} elements along axis {axis}, not a "
                f"multiple of {sections}"
            )
        cuts = [n // sections * k for k in range(1, sections)]
    else:
        cuts = [int(c) for c in indices_or_sections]
    bounds = [0, *(min(max(c if c >= 0 else c + n, 0), n) for c in cuts), n]
    pieces = []
    for lo, hi in zip(bounds[:-1], bounds[1:]):
        start = [0] * aval.ndim
        limit = list(aval.shape)
        start[axis], limit[axis] = lo, max(lo, hi)
        pieces.append(lax_slice(ary, start, limit))
    return pieces


def _arg_extreme(name: str, reduce: Callable) -> Callable:
    def fn(a, axis=None, keepdims=False) -> ArrayLike:
        a = _as_input(a, name)
        if axis is None:
            flat = _arg_extreme(name, reduce)(reshape(a, (-1,)), 0)
            if keepdims:
                return reshape(flat, (1,) * get_aval(a).ndim)
            return flat
        if get_aval(a).dtype == np.bool_:
            a = convert_element_type(a, np.int64)
        aval = get_aval(a)
        axis = _normalize_axes(name, axis, aval.ndim)[0]
        n = aval.shape[axis]
        if n == 0:
            raise ValueError(
                f"{name}: an empty axis {axis} of {aval.str_short()} has no {name}"
            )
        best = broadcast(reduce(a, axis), aval.shape, (axis,))
        hit = equal(a, best)
        if aval.dtype.kind == "f":  # the first NaN wins, as in NumPy and JAX
            hit = select(hit, hit, not_equal(a, a))
        others = tuple(d for d in range(aval.ndim) if d != axis)
        positions = broadcast(np.arange(n, dtype=np.int64), aval.shape, others)
        candidates = select(
            hit, positions, full_of(ShapedArray(aval.shape, np.int64), n)
        )
        out = neg(reduce_max(neg(candidates), axis))
        return _keep_dims(out, a, axis, keepdims)

    fn.__name__ = f"numpy_{name}"
    return fn


def _reduce_min(x, axis):
    if get_aval(x).dtype.kind == "f":
        return neg(reduce_max(neg(x), axis))
    return numpy_min(x, axis)


numpy_argmax = numpy_function(_arg_extreme("argmax", reduce_max))
numpy_argmin = numpy_function(_arg_extreme("argmin", _reduce_min))

for _name, _fn in {
    "slice": lax_slice,
    "pad": pad,
    "dynamic_slice": dynamic_slice,
    "dynamic_update_slice": dynamic_update_slice,
    "gather": gather,
    "scatter_add": scatter_add,
    "scatter": scatter,
    "scatter_mul": scatter_mul,
    "scatter_min": scatter_min,
    "scatter_max": scatter_max,
}.items():
    setattr(lax_namespace, _name, _fn)

# ==== chapter: part6_loops ====

while_p = Primitive("while", multiple_results=True)


def while_loop(cond_fun: Callable, body_fun: Callable, init_val: Any) -> Any:
    """Run ``val = body_fun(val)`` while ``cond_fun(val)``; return ``val``."""
    init_flat, carry_tree = tree_flatten(init_val)
    init_flat = [_as_input(x, "while_loop: init_val") for x in init_flat]
    carry_types = [_type_of(x) for x in init_flat]
    carry_type = tree_unflatten(carry_tree, carry_types)
    cond_jaxpr, cond_consts, cond_tree = _trace_to_jaxpr(
        cond_fun, (carry_type,), who="while_loop: cond_fun"
    )
    check_loop_condition(cond_tree, cond_jaxpr)
    body_jaxpr, body_consts, body_tree = _trace_to_jaxpr(
        body_fun, (carry_type,), who="while_loop: body_fun"
    )
    check_carry_type_kept(carry_tree, carry_types, body_tree, body_jaxpr)
    outs = bind(
        while_p,
        *cond_consts,
        *body_consts,
        *init_flat,
        cond_jaxpr=cond_jaxpr,
        cond_nconsts=len(cond_consts),
        body_jaxpr=body_jaxpr,
        body_nconsts=len(body_consts),
    )
    return tree_unflatten(carry_tree, outs)


# @title Checks: a boolean scalar condition, a body that keeps the carry's type
def _type_of(x: Any) -> ShapedArray:
    """The shape and dtype of an array or tracer, as a ShapedArray."""
    aval = get_aval(x)
    return ShapedArray(aval.shape, aval.dtype)


def _types_str(tree: PyTreeDef, avals: list[ShapedArray]) -> str:
    """A pytree of types, printed like ``(float64[], int64[])``."""
    text = str(tree_unflatten(tree, [a.str_short() for a in avals]))
    return text.replace("'", "")


def check_loop_condition(cond_tree: PyTreeDef, cond_jaxpr: Jaxpr) -> None:
    """Raise a TypeError unless cond_fun returned one boolean scalar."""
    returned = [x.aval for x in cond_jaxpr.outs]
    if cond_tree != LEAF or returned[0] != ShapedArray((), np.bool_):
        raise TypeError(
            "while_loop: cond_fun must return a boolean scalar (bool[]), but it "
            f"returned {_types_str(cond_tree, returned)}; compare to get one, "
            "e.g. less(i, 10)"
        )


def check_carry_type_kept(
    carry_tree: PyTreeDef,
    carry_types: list[ShapedArray],
    body_tree: PyTreeDef,
    body_jaxpr: Jaxpr,
) -> None:
    """Raise a TypeError unless body_fun returns the carry type it was given."""
    returned = [x.aval for x in body_jaxpr.outs]
    if body_tree != carry_tree or returned != carry_types:
        raise TypeError(
            "while_loop: body_fun must return a carry of the type it is given, "
            f"{_types_str(carry_tree, carry_types)}, but it returned "
            f"{_types_str(body_tree, returned)}"
        )


@while_p.def_rule("impl")
def _while_impl(*args, cond_jaxpr, cond_nconsts, body_jaxpr, body_nconsts):
    cond_consts, body_consts, carry = _split(args, cond_nconsts, body_nconsts)
    while eval_jaxpr(cond_jaxpr, [*cond_consts, *carry])[0]:
        carry = eval_jaxpr(body_jaxpr, [*body_consts, *carry])
    return carry


@while_p.def_rule("abstract_eval")
def _while_abstract_eval(*avals, cond_jaxpr, cond_nconsts, body_jaxpr, body_nconsts):
    cond_consts, body_consts, carry = _split(avals, cond_nconsts, body_nconsts)
    check_loop_jaxprs(cond_jaxpr, cond_consts, body_jaxpr, body_consts, carry)
    return [_type_of_aval(a) for a in carry]


# @title Helpers: cutting the operands into groups; checking the loop's jaxprs
def _split(items: Sequence, *counts: int) -> list[list]:
    """``items`` cut into pieces of the given lengths, then the rest."""
    pieces, start = [], 0
    for n in counts:
        pieces.append(list(items[start : start + n]))
        start += n
    return [*pieces, list(items[start:])]


def _type_of_aval(aval: ShapedArray) -> ShapedArray:
    return ShapedArray(aval.shape, aval.dtype)


def check_loop_jaxprs(
    cond_jaxpr: Jaxpr,
    cond_consts: list,
    body_jaxpr: Jaxpr,
    body_consts: list,
    carry: list,
) -> None:
    """Raise a TypeError unless the condition takes (its constants, the carry)
    to bool[] and the body takes (its constants, the carry) to the carry."""
    cond_consts, body_consts, carry = [
        [_type_of_aval(a) for a in group] for group in (cond_consts, body_consts, carry)
    ]
    expected = {
        "cond_jaxpr": (cond_jaxpr, cond_consts + carry, [ShapedArray((), np.bool_)]),
        "body_jaxpr": (body_jaxpr, body_consts + carry, carry),
    }
    for name, (jaxpr, in_types, out_types) in expected.items():
        found = typecheck_jaxpr(jaxpr)
        if found.in_types != in_types or found.out_types != out_types:
            raise TypeError(
                f"while: {name} has type {found}, but the loop's operands need "
                f"{JaxprType(in_types, out_types)}"
            )


@while_p.def_rule("lower")
def _while_lower(
    ctx,
    avals_in,
    avals_out,
    *operands,
    cond_jaxpr,
    cond_nconsts,
    body_jaxpr,
    body_nconsts,
):
    types = [ir_type(a) for a in avals_in]
    loop = hlo.WhileOp(types, operands)  # the state: every operand
    with ir.InsertionPoint(loop.cond.blocks.append(*types)) as where:
        cond_consts, _, carry = _split(
            where.block.arguments, cond_nconsts, body_nconsts
        )
        hlo.ReturnOp(_call_jaxpr(ctx, cond_jaxpr, [*cond_consts, *carry]))
    with ir.InsertionPoint(loop.body.blocks.append(*types)) as where:
        state = list(where.block.arguments)
        _, body_consts, carry = _split(state, cond_nconsts, body_nconsts)
        new_carry = _call_jaxpr(ctx, body_jaxpr, [*body_consts, *carry])
        hlo.ReturnOp(state[: len(state) - len(carry)] + new_carry)
    return list(loop.results)[len(avals_in) - len(avals_out) :]


# @title Helper: a call of a jaxpr lowered once to a private function
def _call_jaxpr(ctx: LoweringContext, jaxpr: Jaxpr, args: list) -> list:
    """Emit a call of ``jaxpr``, lowered once to a private function."""
    callee = ir.FlatSymbolRefAttr.get(ctx.function_for(jaxpr))
    out_types = [ir_type(x.aval) for x in jaxpr.outs]
    return list(mlir_func.CallOp(out_types, callee, args).results)


def reached_from(jaxpr: Jaxpr, marked: list[bool]) -> list[bool]:
    """Which outputs of ``jaxpr`` depend on the marked inputs."""
    reached = {v for v, m in zip(jaxpr.in_binders, marked) if m}
    for eqn in jaxpr.eqns:
        if any(isinstance(x, Var) and x in reached for x in eqn.inputs):
            reached.update(eqn.out_binders)
    return [isinstance(x, Var) and x in reached for x in jaxpr.outs]


def carry_fixed_point(
    body_jaxpr: Jaxpr, consts: list[bool], carry: list[bool], allowed: list[bool]
) -> list[bool]:
    """The carries that some number of trips through the body reaches from
    the marked constants and carries (only those ``allowed``)."""
    while True:
        reached = reached_from(body_jaxpr, consts + carry)
        new = [c or (r and a) for c, r, a in zip(carry, reached, allowed)]
        if new == carry:
            return carry
        carry = new


@while_p.def_rule("jvp")
def _while_jvp(primals, tangents, **params):
    cond_jaxpr, body_jaxpr = params["cond_jaxpr"], params["body_jaxpr"]
    counts = (params["cond_nconsts"], params["body_nconsts"])
    cond_consts, body_consts, init = _split(primals, *counts)
    _, const_dots, init_dots = _split(tangents, *counts)
    _, const_nz, init_nz = _split([_maybe_nonzero(t) for t in tangents], *counts)
    is_float = [_type_of(x).dtype.kind == "f" for x in init]
    nonzero = carry_fixed_point(body_jaxpr, const_nz, init_nz, is_float)
    if not any(nonzero):  # no tangent gets into the carry: the loop as it was
        outs = bind(while_p, *primals, **params)
        return outs, [zeros_like(x) for x in outs]

    def cond_fun(carry):
        x, _ = carry
        return eval_jaxpr(cond_jaxpr, [*cond_consts, *x])[0]

    def body_fun(carry):
        x, x_dot = carry
        x_dots = _fill_zeros(x_dot, nonzero, x)
        c_dots = [d if nz else zeros_like(d) for d, nz in zip(const_dots, const_nz)]
        out, out_dot = jvp_flat(
            jaxpr_as_fun(body_jaxpr), [*body_consts, *x], [*c_dots, *x_dots]
        )
        return out, [d for d, nz in zip(out_dot, nonzero) if nz]

    init_dot = [d for d, nz in zip(init_dots, nonzero) if nz]
    out, out_dot = while_loop(cond_fun, body_fun, (init, init_dot))
    return out, _fill_zeros(out_dot, nonzero, out)


# @title Helpers: tangents known to be zero
def _maybe_nonzero(tangent: Any) -> bool:
    """False for a tangent known to be zero: a concrete float array of zeros,
    or any integer or boolean tangent. True for a tracer."""
    if get_aval(tangent).dtype.kind != "f":
        return False
    return isinstance(tangent, Tracer) or bool(np.any(np.asarray(tangent)))


def _fill_zeros(tangents: list, marked: list[bool], like: list) -> list:
    """One tangent per value of ``like``: the next of ``tangents`` where
    marked, a zero array elsewhere."""
    given = iter(tangents)
    return [next(given) if m else zeros_like(x) for m, x in zip(marked, like)]


@while_p.def_rule("vmap")
def _while_vmap(axis, vals, dims, **params):
    cond_jaxpr, body_jaxpr = params["cond_jaxpr"], params["body_jaxpr"]
    counts = (params["cond_nconsts"], params["body_nconsts"])
    vals = [
        x if d is None else move_batch_axis(axis.size, d, 0, x)
        for x, d in zip(vals, dims)
    ]
    cond_consts, body_consts, init = _split(vals, *counts)
    cond_b, body_b, init_b = _split([d is not None for d in dims], *counts)
    carry_b = carry_fixed_point(body_jaxpr, body_b, init_b, [True] * len(init))
    (pred_b,) = reached_from(cond_jaxpr, cond_b + carry_b)
    if pred_b:  # examples stop after different trips: each needs its own carry
        carry_b = [True] * len(init)
    init = [
        move_batch_axis(axis.size, None, 0, x) if b and not b0 else x
        for x, b, b0 in zip(init, carry_b, init_b)
    ]

    def running(carry):  # one predicate, or one per example
        args, batched = [*cond_consts, *carry], cond_b + carry_b
        return run_batched(cond_jaxpr, axis, args, batched, [pred_b])[0]

    def cond_fun(carry):
        return any_true(running(carry)) if pred_b else running(carry)

    def body_fun(carry):
        args, batched = [*body_consts, *carry], body_b + carry_b
        new = run_batched(body_jaxpr, axis, args, batched, carry_b)
        if not pred_b:
            return new
        still = running(carry)  # finished examples keep their old carry
        return [select(per_example(still, x), n, x) for n, x in zip(new, carry)]

    outs = while_loop(cond_fun, body_fun, init)
    return outs, [0 if b else None for b in carry_b]


# @title Helpers: a jaxpr on a batch; "any" of a boolean vector; a predicate per example
def run_batched(
    jaxpr: Jaxpr,
    axis: Axis,
    args: list,
    batched: list[bool],
    out_batched: list[bool],
) -> list:
    """``jaxpr`` on ``args`` (batched along axis 0 where ``batched``); the
    outputs batched along axis 0 where ``out_batched``, else unbatched."""
    with new_level(BatchTrace, axis) as level:
        trace = BatchTrace(level)
        ins = [BatchTracer(trace, x, 0) if b else x for x, b in zip(args, batched)]
        outs = [trace.full_raise(x) for x in eval_jaxpr(jaxpr, ins)]
        return [
            move_batch_axis(axis.size, t.batch_axis, 0, t.val) if b else t.val
            for t, b in zip(outs, out_batched)
        ]


def any_true(preds: Any) -> Any:
    """Whether any element of the boolean vector ``preds`` is true."""
    return reduce_max(convert_element_type(preds, np.int32), 0) > 0


def per_example(pred: Any, x: Any) -> Any:
    """The boolean vector ``pred`` broadcast along the axes of ``x`` after 0."""
    shape = get_aval(x).shape
    if len(shape) == 1:
        return pred
    return broadcast(pred, shape, tuple(range(1, len(shape))))


class WhileLoopReverseModeError(TypeError):
    """Reverse-mode differentiation through a while loop, which has none."""


def no_reverse_mode() -> WhileLoopReverseModeError:
    return WhileLoopReverseModeError(
        "linearize, vjp and grad do not work through while_loop: reverse mode "
        "needs every trip's primal values, and the trip count is known only "
        "when the loop ends, so the loop cannot save them (linearize alone "
        "could recompute them; this book refuses the mix of known and unknown "
        "carries for all three). Use scan, or fori_loop with Python int bounds "
        "(Part 7); jvp works here."
    )


@while_p.def_rule("partial_eval")
def _while_partial_eval(trace, tracers, **params):
    if any(t.pval.is_known for t in tracers):
        raise no_reverse_mode()
    return trace.stage(while_p, tracers, params)


@while_p.def_rule("partial_eval_jaxpr")
def _while_partial_eval_jaxpr(unks_in, eqn):
    if not all(unks_in):
        raise no_reverse_mode()
    return None, eqn, [True] * len(eqn.out_binders), []


NOT_LINEAR.update({"while"})  # no transpose rule: see above


def fori_loop(lower: Any, upper: Any, body_fun: Callable, init_val: Any) -> Any:
    """``val = body_fun(i, val)`` for ``i`` from ``lower`` up to ``upper``."""
    lower, upper = check_loop_bounds(lower, upper)

    def step(carry):
        i, val = carry
        return i + 1, body_fun(i, val)

    return while_loop(lambda carry: carry[0] < upper, step, (lower, init_val))[1]


# @title Checks: integer scalar bounds
def check_loop_bounds(lower: Any, upper: Any) -> list[Any]:
    """The bounds as integer scalars of one dtype (a Python int takes the
    other bound's); a TypeError otherwise."""
    dtypes = set()
    for name, bound in [("lower", lower), ("upper", upper)]:
        if isinstance(bound, int) and not isinstance(bound, bool):
            continue
        aval = _type_of(_as_input(bound, f"fori_loop: {name}"))
        if aval.dtype.kind not in "iu" or aval.shape != ():
            raise TypeError(
                f"fori_loop: {name} must be an integer scalar, got "
                f"{aval.str_short()} ({_short_repr(bound)})"
            )
        dtypes.add(aval.dtype)
    if len(dtypes) > 1:
        raise TypeError(
            "fori_loop: lower and upper must have the same dtype, got "
            f"{_type_of(lower).str_short()} and {_type_of(upper).str_short()}"
        )
    dtype = dtypes.pop() if dtypes else np.dtype(np.int64)
    return [np.asarray(b, dtype) if isinstance(b, int) else b for b in (lower, upper)]


# ==== chapter: part7_scan ====

scan_p = Primitive("scan", multiple_results=True)


def scan(
    f: Callable,
    init: Any,
    xs: Any = None,
    length: int | None = None,
    reverse: bool = False,
) -> tuple[Any, Any]:
    """Loop ``carry, y = f(carry, x)`` over the rows of ``xs``; stack the ys."""
    init_flat, carry_tree = tree_flatten(init)
    xs_flat, xs_tree = tree_flatten(xs)
    init_flat, xs_flat, length = check_scan_inputs(init_flat, xs_flat, length)
    carry_types = [_type_of(x) for x in init_flat]
    carry_type = tree_unflatten(carry_tree, carry_types)
    row_type = tree_unflatten(xs_tree, [_row_type(_type_of(x)) for x in xs_flat])
    jaxpr, consts, out_tree = _trace_to_jaxpr(f, (carry_type, row_type), who="scan: f")
    ys_tree = check_scan_body(carry_tree, carry_types, out_tree, jaxpr)
    outs = bind(
        scan_p,
        *consts,
        *init_flat,
        *xs_flat,
        jaxpr=jaxpr,
        num_consts=len(consts),
        num_carry=len(init_flat),
        length=length,
        reverse=bool(reverse),
    )
    carry, ys = _split(outs, len(init_flat))
    return tree_unflatten(carry_tree, carry), tree_unflatten(ys_tree, ys)


# @title Checks: one leading length for xs; a body returning (carry, y)
def _row_type(aval: ShapedArray) -> ShapedArray:
    """The type of one row: the leading axis dropped."""
    return ShapedArray(aval.shape[1:], aval.dtype)


def _stacked_type(aval: ShapedArray, length: int) -> ShapedArray:
    """The type of ``length`` rows of type ``aval``."""
    return ShapedArray((length, *aval.shape), aval.dtype)


def check_scan_inputs(init_flat: list, xs_flat: list, length: Any) -> tuple:
    """(init_flat, xs_flat, the trip count) with the leaves as arrays; the trip
    count is the leading length that xs share, or ``length``."""
    init_flat = [_as_input(x, "scan: init") for x in init_flat]
    xs_flat = [_as_input(x, "scan: xs") for x in xs_flat]
    if length is not None and (
        not isinstance(length, (int, np.integer))
        or isinstance(length, bool)
        or length < 0
    ):
        raise TypeError(
            f"scan: length must be a non-negative Python int, got {_short_repr(length)}"
        )
    types = [_type_of(x) for x in xs_flat]
    for t in types:
        if t.shape == ():
            raise ValueError(
                "scan: every leaf of xs needs a leading axis to scan over, got "
                f"a scalar {t.str_short()}"
            )
    lengths = sorted({t.shape[0] for t in types})
    if len(lengths) > 1:
        shapes = ", ".join(t.str_short() for t in types)
        raise ValueError(
            f"scan: the leaves of xs must share one leading length, got {shapes}"
        )
    if not lengths and length is None:
        raise ValueError(
            "scan: with no xs, give the number of trips as length=..., e.g. "
            "scan(f, init, None, length=10)"
        )
    if lengths and length is not None and lengths[0] != length:
        raise ValueError(
            f"scan: length={length} disagrees with the leading length of xs, "
            f"{lengths[0]}"
        )
    return init_flat, xs_flat, int(length) if length is not None else lengths[0]


def check_scan_body(
    carry_tree: PyTreeDef, carry_types: list, out_tree: PyTreeDef, jaxpr: Jaxpr
) -> PyTreeDef:
    """The tree of y; a TypeError unless f returned (a carry of the type it
    was given, y)."""
    returned = [x.aval for x in jaxpr.outs]
    if out_tree.node_type not in (tuple, list) or len(out_tree.children) != 2:
        raise TypeError(
            "scan: f must return a pair (carry, y), but it returned "
            f"{_types_str(out_tree, returned)}"
        )
    new_tree, ys_tree = out_tree.children
    new_types = returned[: new_tree.num_leaves]
    if new_tree != carry_tree or new_types != carry_types:
        raise TypeError(
            "scan: f must return a carry of the type it is given, "
            f"{_types_str(carry_tree, carry_types)}, but it returned "
            f"{_types_str(new_tree, new_types)}"
        )
    return ys_tree


def check_scan_jaxpr(
    jaxpr: Jaxpr, consts: list, carry: list, xs: list, length: int
) -> None:
    """A TypeError unless ``jaxpr`` takes (consts, carry, rows of xs) to
    (carry, y) and xs have ``length`` rows."""
    consts = [_type_of_aval(a) for a in consts]
    carry = [_type_of_aval(a) for a in carry]
    if any(a.shape[:1] != (length,) for a in xs):
        got = ", ".join(a.str_short() for a in xs)
        raise TypeError(f"scan: xs must have {length} rows, got ({got})")
    in_types = consts + carry + [_row_type(a) for a in xs]
    found = typecheck_jaxpr(jaxpr)
    if found.in_types != in_types or found.out_types[: len(carry)] != carry:
        ins = ", ".join(t.str_short() for t in in_types)
        outs = ", ".join(t.str_short() for t in carry)
        raise TypeError(
            f"scan: the body has type {found}, but the operands need "
            f"({ins}) -> ({outs}, ...)"
        )


@scan_p.def_rule("impl")
def _scan_impl(*args, jaxpr, num_consts, num_carry, length, reverse):
    consts, carry, xs = _split(args, num_consts, num_carry)
    xs = [np.asarray(x) for x in xs]
    ys = [
        np.empty((length, *y.aval.shape), y.aval.dtype) for y in jaxpr.outs[num_carry:]
    ]
    for i in reversed(range(length)) if reverse else range(length):
        outs = eval_jaxpr(jaxpr, [*consts, *carry, *[x[i] for x in xs]])
        carry = outs[:num_carry]
        for stack, y in zip(ys, outs[num_carry:]):
            stack[i] = y
    return [*carry, *ys]


@scan_p.def_rule("abstract_eval")
def _scan_abstract_eval(*avals, jaxpr, num_consts, num_carry, length, reverse):
    consts, carry, xs = _split(avals, num_consts, num_carry)
    check_scan_jaxpr(jaxpr, consts, carry, xs, length)
    ys = [_stacked_type(y.aval, length) for y in jaxpr.outs[num_carry:]]
    return [_type_of_aval(a) for a in carry] + ys


# @title The lowering rule: a stablehlo.while with a counter and row buffers
@scan_p.def_rule("lower")
def _scan_lower(
    ctx, avals_in, avals_out, *operands, jaxpr, num_consts, num_carry, length, reverse
):
    index = ShapedArray((), np.int64)
    ys_avals = avals_out[num_carry:]
    if length == 0:  # no trips, and no row to read
        return [
            *operands[num_consts : num_consts + num_carry],
            *[ir_constant(0, a) for a in ys_avals],
        ]
    state = [ir_constant(0, index), *operands, *[ir_constant(0, a) for a in ys_avals]]
    types = [v.type for v in state]
    loop = hlo.WhileOp(types, state)
    with ir.InsertionPoint(loop.cond.blocks.append(*types)) as where:
        i = where.block.arguments[0]
        hlo.ReturnOp([_lower_less(i, ir_constant(length, index))])
    with ir.InsertionPoint(loop.body.blocks.append(*types)) as where:
        i, *state = where.block.arguments
        num_xs = len(operands) - num_consts - num_carry
        consts, carry, xs, ys = _split(state, num_consts, num_carry, num_xs)
        row = hlo.subtract(ir_constant(length - 1, index), i) if reverse else i
        xs_avals = avals_in[num_consts + num_carry :]
        rows = [_read_row(x, row, aval) for x, aval in zip(xs, xs_avals)]
        outs = _call_jaxpr(ctx, jaxpr, [*consts, *carry, *rows])
        ys = [_write_row(stack, y, row) for stack, y in zip(ys, outs[num_carry:])]
        i = hlo.add(i, ir_constant(1, index))
        hlo.ReturnOp([i, *consts, *outs[:num_carry], *xs, *ys])
    results = list(loop.results)
    carry_at = 1 + num_consts
    return results[carry_at : carry_at + num_carry] + results[len(results) - len(ys) :]


# @title Helpers: comparing indices; reading and writing one row of an array
def _lower_less(x: ir.Value, y: ir.Value) -> ir.Value:
    direction = hlo.ComparisonDirectionAttr.get("LT")
    signed = hlo.ComparisonTypeAttr.get("SIGNED")
    return hlo.compare(x, y, direction, compare_type=signed)


def _row_start(row: ir.Value, ndim: int) -> list[ir.Value]:
    """The index of the first element of ``row``: (row, 0, 0, ...)."""
    return [row] + [ir_constant(0, ShapedArray((), np.int64)) for _ in range(ndim - 1)]


def _read_row(x: ir.Value, row: ir.Value, aval: ShapedArray) -> ir.Value:
    """``x[row]``, with ``row`` known only when the program runs."""
    block = hlo.dynamic_slice(x, _row_start(row, aval.ndim), [1, *aval.shape[1:]])
    return hlo.reshape(ir_type(_row_type(aval)), block)


def _write_row(stack: ir.Value, y: ir.Value, row: ir.Value) -> ir.Value:
    """``stack`` with row ``row`` replaced by ``y``."""
    shape = ir.RankedTensorType(stack.type).shape
    element = ir.RankedTensorType(y.type).element_type
    y = hlo.reshape(ir.RankedTensorType.get([1, *shape[1:]], element), y)
    return hlo.dynamic_update_slice(stack, y, _row_start(row, len(shape)))


def scan_fixed_point(
    jaxpr: Jaxpr, num_consts: int, num_carry: int, marked: list, allowed: list
) -> list[bool]:
    """The carries that some number of trips reaches from the marked inputs."""
    consts, carry, xs = _split(jaxpr.in_binders, num_consts, num_carry)
    body = Jaxpr(consts + xs + carry, jaxpr.eqns, jaxpr.outs)  # rows first
    consts, carry, xs = _split(marked, num_consts, num_carry)
    return carry_fixed_point(body, consts + xs, carry, allowed)


@scan_p.def_rule("jvp")
def _scan_jvp(primals, tangents, *, jaxpr, num_consts, num_carry, length, reverse):
    nonzero = [_maybe_nonzero(t) for t in tangents]
    consts, init, xs = _split(primals, num_consts, num_carry)
    const_dots, init_dots, xs_dots = _split(tangents, num_consts, num_carry)
    const_nz, _, xs_nz = _split(nonzero, num_consts, num_carry)
    is_float = [_type_of(x).dtype.kind == "f" for x in init]
    carry_nz = scan_fixed_point(jaxpr, num_consts, num_carry, nonzero, is_float)
    const_dots = [d if nz else zeros_like(d) for d, nz in zip(const_dots, const_nz)]

    def body(carry, row):
        (c, c_dot), (x, x_dot) = carry, row
        c_dot, x_dot = _fill_zeros(c_dot, carry_nz, c), _fill_zeros(x_dot, xs_nz, x)
        outs, out_dots = jvp_flat(
            jaxpr_as_fun(jaxpr), [*consts, *c, *x], [*const_dots, *c_dot, *x_dot]
        )
        new_dots = [d for d, nz in zip(out_dots, carry_nz) if nz]
        return (outs[:num_carry], new_dots), (outs[num_carry:], out_dots[num_carry:])

    init_dots = [d for d, nz in zip(init_dots, carry_nz) if nz]
    xs_dots = [d for d, nz in zip(xs_dots, xs_nz) if nz]
    (carry, carry_dots), (ys, ys_dots) = scan(
        body, (init, init_dots), (xs, xs_dots), length=length, reverse=reverse
    )
    return [*carry, *ys], [*_fill_zeros(carry_dots, carry_nz, carry), *ys_dots]


# @title The vmap rule: batch the body; xs and ys batched at axis 1
@scan_p.def_rule("vmap")
def _scan_vmap(axis, vals, dims, *, jaxpr, num_consts, num_carry, length, reverse):
    batched = [d is not None for d in dims]
    consts_b, init_b, xs_b = _split(batched, num_consts, num_carry)
    carry_b = scan_fixed_point(
        jaxpr, num_consts, num_carry, batched, [True] * num_carry
    )
    ys_b = reached_from(jaxpr, consts_b + carry_b + xs_b)[num_carry:]
    vals = [
        x if d is None else move_batch_axis(axis.size, d, 0, x)
        for x, d in zip(vals, dims)
    ]
    consts, init, xs = _split(vals, num_consts, num_carry)
    init = [
        move_batch_axis(axis.size, None, 0, x) if b and not b0 else x
        for x, b, b0 in zip(init, carry_b, init_b)
    ]
    xs = [move_batch_axis(axis.size, 0, 1, x) if b else x for x, b in zip(xs, xs_b)]

    def body(carry, row):
        args, args_b = [*consts, *carry, *row], consts_b + carry_b + xs_b
        outs = run_batched(jaxpr, axis, args, args_b, carry_b + ys_b)
        return outs[:num_carry], outs[num_carry:]

    carry, ys = scan(body, init, xs, length=length, reverse=reverse)
    return [*carry, *ys], [0 if b else None for b in carry_b] + [
        1 if b else None for b in ys_b
    ]


class ScanSplit(NamedTuple):
    """A scan body split by partial evaluation (see split_scan)."""

    carry_unknown: list[bool]
    out_unknown: list[bool]  # of the scan's outputs: carries, then ys
    known_body: Jaxpr  # (consts; carries; rows) -> (carries, ys, residuals)
    unknown_body: Jaxpr  # (consts; carries; rows, residuals) -> (carries, ys)
    num_res_consts: int = 0  # residuals read as constants, first: see hoisting


def split_scan(
    jaxpr: Jaxpr, num_consts: int, num_carry: int, unknown: list[bool]
) -> ScanSplit:
    """Split a scan body into a known loop, whose ys end with one row of
    residuals per trip, and an unknown loop, which reads them as its last xs."""
    consts_u, carry_u, xs_u = _split(unknown, num_consts, num_carry)
    # 1: fixed point on unknown carries
    while True:
        out_u = partial_eval_jaxpr(jaxpr, consts_u + carry_u + xs_u)[2]
        new = [c or o for c, o in zip(carry_u, out_u)]
        if new == carry_u:
            break
        carry_u = new
    # 2: split known/unknown; the known body returns the residuals last
    num_ys = len(jaxpr.outs) - num_carry
    known_body, unknown_body, out_u, num_res = partial_eval_jaxpr(
        jaxpr, consts_u + carry_u + xs_u, carry_u + [False] * num_ys
    )
    # 3: the unknown body reads the residuals as its last rows
    residuals, rest = _split(unknown_body.in_binders, num_res)
    unknown_body = Jaxpr(rest + residuals, unknown_body.eqns, unknown_body.outs)
    return ScanSplit(carry_u, out_u, known_body, unknown_body)


@scan_p.def_rule("partial_eval")
def _scan_partial_eval(
    trace, tracers, *, jaxpr, num_consts, num_carry, length, reverse
):
    unknown = [not t.pval.is_known for t in tracers]
    s = split_scan(jaxpr, num_consts, num_carry, unknown)
    consts, init, xs = _split(tracers, num_consts, num_carry)
    known_consts, unknown_consts = _split_by(unknown[:num_consts], consts)
    known_xs, unknown_xs = _split_by(unknown[num_consts + num_carry :], xs)
    known_init, unknown_init = _split_by(s.carry_unknown, init)
    known_consts = [t.pval.const for t in known_consts]
    # optional: residuals that are the same on every trip, computed once
    res_consts, known_consts, s = hoist_invariant_residuals(s, known_consts)
    # the known loop runs now; its ys end with the residual rows
    known_outs = bind(
        scan_p,
        *known_consts,
        *[t.pval.const for t in known_init + known_xs],
        jaxpr=s.known_body,
        num_consts=len(known_consts),
        num_carry=len(known_init),
        length=length,
        reverse=reverse,
    )
    known_outs, res_rows = _split(known_outs, s.out_unknown.count(False))
    # the unknown loop is staged; it reads the residual rows as its last xs
    residuals = [trace.instantiate_const(trace.pure(r)) for r in res_consts + res_rows]
    res_consts, res_rows = _split(residuals, len(res_consts))
    unknown_init = [trace.instantiate_const(t) for t in unknown_init]
    unknown_params = dict(
        jaxpr=s.unknown_body,
        num_consts=len(res_consts) + len(unknown_consts),
        num_carry=len(unknown_init),
        length=length,
        reverse=reverse,
    )
    staged = [*res_consts, *unknown_consts, *unknown_init, *unknown_xs, *res_rows]
    unknown_outs = iter(trace.stage(scan_p, staged, unknown_params))
    known_outs = iter(known_outs)
    return [
        next(unknown_outs) if u else trace.pure(next(known_outs)) for u in s.out_unknown
    ]


# @title Hoisting: residuals that are the same on every trip, computed once
def hoist_residuals(s: ScanSplit, num_known_consts: int) -> tuple[Jaxpr, ScanSplit]:
    """(before, split): ``before`` takes the known loop's constants to (the
    residuals that are the same on every trip, the new known loop's
    constants); the new unknown body reads those residuals as constants."""
    num_known_outs = s.out_unknown.count(False)
    num_res = len(s.known_body.outs) - num_known_outs
    varies = [i >= num_known_consts for i in range(len(s.known_body.in_binders))]
    before, known_body, outs_vary, _ = partial_eval_jaxpr(
        s.known_body, varies, [True] * num_known_outs + [False] * num_res
    )
    binders = s.unknown_body.in_binders
    rest, residuals = _split(binders, len(binders) - num_res)
    invariant, per_trip = _split_by(outs_vary[num_known_outs:], residuals)
    unknown_body = Jaxpr(
        invariant + rest + per_trip, s.unknown_body.eqns, s.unknown_body.outs
    )
    return before, s._replace(
        known_body=known_body, unknown_body=unknown_body, num_res_consts=len(invariant)
    )


def hoist_invariant_residuals(s: ScanSplit, known_consts: list) -> tuple:
    """Run ``before`` now: (the residuals that are the same on every trip,
    the known loop's new constants, the new split)."""
    before, s = hoist_residuals(s, len(known_consts))
    res_consts, known_consts = _split(
        eval_jaxpr(before, known_consts), s.num_res_consts
    )
    return res_consts, known_consts, s


# @title The partial_eval_jaxpr rule: the same split, as equations
def _inline_jaxpr(jaxpr: Jaxpr, inputs: list) -> tuple[list[JaxprEqn], list]:
    """The equations of ``jaxpr`` applied to ``inputs`` (with fresh
    variables), and its outputs."""
    env: dict[Var, Any] = dict(zip(jaxpr.in_binders, inputs))

    def read(x: Atom) -> Any:
        return env[x] if isinstance(x, Var) else x

    eqns = []
    for eqn in jaxpr.eqns:
        outs = [Var(v.aval) for v in eqn.out_binders]
        inputs = [read(x) for x in eqn.inputs]
        eqns.append(JaxprEqn(eqn.primitive, inputs, eqn.params, outs))
        env.update(zip(eqn.out_binders, outs))
    return eqns, [read(x) for x in jaxpr.outs]


@scan_p.def_rule("partial_eval_jaxpr")
def _scan_partial_eval_jaxpr(unks_in, eqn):
    params = eqn.params
    num_consts, num_carry = params["num_consts"], params["num_carry"]
    s = split_scan(params["jaxpr"], num_consts, num_carry, unks_in)
    consts, init, xs = _split(eqn.inputs, num_consts, num_carry)
    known_consts, unknown_consts = _split_by(unks_in[:num_consts], consts)
    known_xs, unknown_xs = _split_by(unks_in[num_consts + num_carry :], xs)
    known_init, unknown_init = _split_by(s.carry_unknown, init)
    known_outs, unknown_outs = _split_by(s.out_unknown, eqn.out_binders)
    before, s = hoist_residuals(s, len(known_consts))
    # The known side, in one xla_call: the equations of before, then the loop.
    ins = [Var(x.aval) for x in known_consts + known_init + known_xs]
    ins_consts, ins_loop = _split(ins, len(known_consts))
    before_eqns, before_outs = _inline_jaxpr(before, ins_consts)
    res_consts_in, loop_consts = _split(before_outs, s.num_res_consts)
    row_avals = [x.aval for x in s.known_body.outs[len(known_outs) :]]
    loop_outs = [Var(x.aval) for x in known_outs]
    loop_outs += [Var(_stacked_type(a, params["length"])) for a in row_avals]
    known_params = dict(
        params,
        jaxpr=s.known_body,
        num_consts=len(loop_consts),
        num_carry=len(known_init),
    )
    loop = JaxprEqn(scan_p, [*loop_consts, *ins_loop], known_params, loop_outs)
    inner = Jaxpr(ins, [*before_eqns, loop], [*loop_outs, *res_consts_in])
    res_consts = [Var(x.aval) for x in res_consts_in]
    res_rows = [Var(x.aval) for x in loop_outs[len(known_outs) :]]
    eqn_known = JaxprEqn(
        xla_call_p,
        known_consts + known_init + known_xs,
        dict(jaxpr=inner),
        [*known_outs, *res_rows, *res_consts],
    )
    unknown_params = dict(
        params,
        jaxpr=s.unknown_body,
        num_consts=len(res_consts) + len(unknown_consts),
        num_carry=len(unknown_init),
    )
    staged = [*res_consts, *unknown_consts, *unknown_init, *unknown_xs, *res_rows]
    eqn_unknown = JaxprEqn(scan_p, staged, unknown_params, unknown_outs)
    init_unknown = unks_in[num_consts : num_consts + num_carry]
    instantiated = [  # known initial values of unknown carries that are variables
        x
        for x, u, carry_u in zip(init, init_unknown, s.carry_unknown)
        if carry_u and not u and isinstance(x, Var)
    ]
    return eqn_known, eqn_unknown, s.out_unknown, res_consts + res_rows + instantiated


@scan_p.def_rule("transpose")
def _scan_transpose(cts, *args, jaxpr, num_consts, num_carry, length, reverse):
    consts, init, xs = _split(args, num_consts, num_carry)
    linear = [_is_undef(x) for x in consts] + [True] * num_carry
    linear += [_is_undef(x) for x in xs]
    body_t, body_t_consts = transpose_jaxpr_uncached(jaxpr, tuple(linear))
    res_consts = [x for x in consts if not _is_undef(x)]
    res_xs = [x for x in xs if not _is_undef(x)]
    out_types = [x.aval for x in jaxpr.outs[:num_carry]]
    out_types += [_stacked_type(x.aval, length) for x in jaxpr.outs[num_carry:]]
    cts = [zeros_like_aval(t) if ct is None else ct for ct, t in zip(cts, out_types)]
    ct_carry, ct_ys = _split(cts, num_carry)
    ct_consts = [zeros_like_aval(x.aval) for x in consts if _is_undef(x)]

    def body(carry, row):  # one trip, backwards
        (ct_consts, ct_carry), (res_row, ct_y) = carry, row
        args = [*body_t_consts, *res_consts, *res_row, *ct_carry, *ct_y]
        outs = eval_jaxpr(body_t, args)
        d_consts, ct_carry, ct_row = _split(outs, len(ct_consts), num_carry)
        return ([add(a, d) for a, d in zip(ct_consts, d_consts)], ct_carry), ct_row

    (ct_consts, ct_init), ct_xs = scan(
        body, (ct_consts, ct_carry), (res_xs, ct_ys), length=length, reverse=not reverse
    )
    ct_consts, ct_xs = iter(ct_consts), iter(ct_xs)
    return [
        *[next(ct_consts) if _is_undef(x) else None for x in consts],
        *[ct if _is_undef(x) else None for x, ct in zip(init, ct_init)],
        *[next(ct_xs) if _is_undef(x) else None for x in xs],
    ]


def fori_loop(lower: Any, upper: Any, body_fun: Callable, init_val: Any) -> Any:
    """``val = body_fun(i, val)`` for ``i`` from ``lower`` up to ``upper``."""
    static = all(type(b) is int for b in (lower, upper))  # Python ints
    lower, upper = check_loop_bounds(lower, upper)

    def step(carry):
        i, val = carry
        return i + 1, body_fun(i, val)

    if static:  # the trip count is known now: a scan, which has reverse mode
        trips = max(int(upper) - int(lower), 0)
        carry, _ = scan(lambda c, _: (step(c), None), (lower, init_val), None, trips)
        return carry[1]
    return while_loop(lambda carry: carry[0] < upper, step, (lower, init_val))[1]


# ==== chapter: part8_custom_rules ====

custom_jvp_call_p = Primitive("custom_jvp_call", multiple_results=True)


class custom_jvp:
    """``fun`` with a forward-mode derivative rule of its own."""

    def __init__(self, fun: Callable, nondiff_argnums: Sequence[int] = ()) -> None:
        functools.update_wrapper(self, fun)
        self.fun, self.nondiff_argnums, self.rule = fun, tuple(nondiff_argnums), None

    def defjvp(self, rule: Callable) -> Callable:
        """Use ``rule(*nondiff_args, primals, tangents) -> (out, tangent_out)``."""
        self.rule = rule
        return rule

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        check_rule_defined(self, self.rule, "defjvp")
        args = resolve_kwargs(self, args, kwargs)
        if _outside_transformations(args):
            return run_outside_transformations(self, args)
        try:
            call = trace_custom(self, args)
        except ConcretizationError:  # fun needs values: maybe jvp can give them
            return jvp_of_concrete_call(self, args)

        def flat_rule(primals: list, tangents: list) -> tuple[list, list]:
            primals, tangents = call.unflatten(primals), call.unflatten(tangents)
            result = self.rule(*call.nondiff, primals, tangents)
            return check_jvp_rule_result(call, result)

        outs = bind(
            custom_jvp_call_p, *call.consts, *call.args, **call.params,
            jvp=Named(flat_rule, self.rule, call.traced_consts),
        )  # fmt: skip
        return tree_unflatten(call.out_tree, outs)


# @title trace_custom, Named, and the checks of calls and rules
class TracedCall(NamedTuple):
    """A custom function's call, traced at its arguments' types."""

    name: str
    nondiff: list  # the values of the nondiff_argnums arguments
    all_args: Callable  # differentiable args -> all args, nondiff ones in place
    args: list  # the flat differentiable arguments
    in_tree: PyTreeDef  # their structure: a tuple, one entry per argument
    consts: list
    out_tree: PyTreeDef
    params: dict  # name, call_jaxpr, num_consts

    def unflatten(self, flat: Sequence) -> tuple:
        return tree_unflatten(self.in_tree, flat)

    @property
    def in_types(self) -> list[ShapedArray]:
        return [get_aval(x) for x in self.args]

    @property
    def out_types(self) -> list[ShapedArray]:
        return [x.aval for x in self.params["call_jaxpr"].outs]

    @property
    def traced_consts(self) -> tuple[bool, ...]:
        return tuple(isinstance(c, Tracer) for c in self.consts)


def trace_custom(f: Any, args: tuple) -> TracedCall:
    """Trace ``f.fun`` at the types of ``args``, the nondiff ones held fixed."""
    name = getattr(f, "__name__", "custom function")
    fixed = check_nondiff_argnums(name, f.nondiff_argnums, args)

    def all_args(diff_args: Sequence) -> list:
        rest = iter(diff_args)
        return [args[i] if i in fixed else next(rest) for i in range(len(args))]

    diff = tuple(a for i, a in enumerate(args) if i not in fixed)
    flat, in_tree = tree_flatten(diff)
    flat = [_as_input(x, f"{name}: argument") for x in flat]
    avals = tree_unflatten(in_tree, [get_aval(x) for x in flat])
    jaxpr, consts, out_tree = _trace_to_jaxpr(
        lambda *d: f.fun(*all_args(d)), avals, who=name
    )
    nondiff = [args[i] for i in sorted(fixed)]
    check_no_traced_closure(name, tree_leaves(nondiff))
    params = dict(name=name, call_jaxpr=jaxpr, num_consts=len(consts))
    return TracedCall(name, nondiff, all_args, flat, in_tree, consts, out_tree, params)


def resolve_kwargs(f: Any, args: tuple, kwargs: dict) -> tuple:
    """``args`` and ``kwargs`` as positional arguments of ``f.fun``, as JAX does."""
    try:
        signature = inspect.signature(f.fun)
    except (TypeError, ValueError):  # no signature: only positional arguments
        signature = None
    if signature is None or isinstance(f.fun, functools.partial):
        if kwargs:
            raise TypeError(f"{_fn_name(f)}: takes no keyword arguments here")
        return args
    try:
        bound = signature.bind(*args, **kwargs)
    except TypeError as err:
        raise TypeError(f"{_fn_name(f)}: cannot take these arguments ({err})") from None
    bound.apply_defaults()
    if bound.kwargs:
        raise TypeError(
            f"{_fn_name(f)}: keyword-only arguments {sorted(bound.kwargs)} cannot "
            "be passed to a custom function: they have no position"
        )
    return bound.args


def _outside_transformations(args: tuple) -> bool:
    """No tracer in ``args`` and nothing being staged: plain evaluation."""
    no_tracers = not any(isinstance(x, Tracer) for x in tree_leaves(args))
    forced = getattr(_state, "trace_custom_calls", False)
    return no_tracers and _state.dynamic is _state.stack[0] and not forced


def run_outside_transformations(f: Any, args: tuple) -> Any:
    """``f.fun(*args)``; if its result is traced (``fun`` closes over a tracer
    of an enclosing transformation), the call is traced after all, as JAX
    does (so ``fun`` runs twice then)."""
    check_nondiff_argnums(_fn_name(f), f.nondiff_argnums, args)
    out = f.fun(*args)
    if not any(isinstance(x, Tracer) for x in tree_leaves(out)):
        return out
    _state.trace_custom_calls = True
    try:
        return f(*args)
    finally:
        _state.trace_custom_calls = False


class Named:
    """A Python function that prints as ``name`` (a rule in a jaxpr's params);
    ``traced_consts`` says which of the call's constants were tracers."""

    def __init__(self, fn: Callable, like: Any, traced_consts: tuple = ()) -> None:
        self.fn, self.name = fn, like if isinstance(like, str) else _fn_name(like)
        self.traced_consts = traced_consts

    def __call__(self, *args: Any) -> Any:
        return self.fn(*args)

    def __repr__(self) -> str:
        return self.name


def _fn_name(fn: Any) -> str:
    return getattr(fn, "__name__", type(fn).__name__)


def check_rule_defined(f: Any, rule: Any, how: str) -> None:
    if rule is None:
        raise TypeError(
            f"{_fn_name(f)} is a custom function without a rule: define one "
            f"with {_fn_name(f)}.{how}(...) before calling it"
        )


def check_nondiff_argnums(name: str, argnums: tuple, args: tuple) -> set[int]:
    for i in argnums:
        if not _is_axis(i) or not -len(args) <= i < len(args):
            raise ValueError(
                f"{name}: nondiff_argnums {argnums} is out of range for a call "
                f"with {len(args)} positional arguments"
            )
    return {int(i) % len(args) for i in argnums}


def check_no_traced_closure(name: str, nondiff: list) -> None:
    traced = [c for c in nondiff if isinstance(c, Tracer)]
    if traced:
        raise TypeError(
            f"{name}: a nondiff_argnums argument is a traced value "
            f"({traced[0].aval.str_short()}); its rule would treat it as a "
            "constant. Pass it as an ordinary (differentiable) argument instead."
        )


def jvp_of_concrete_call(f: Any, args: tuple) -> Any:
    """``f(*args)`` when ``f.fun`` branches on its values, so it cannot be
    traced: under jvp or grad of concrete (or known) values JAX never traces
    ``fun``; it calls the rule, which calls ``f`` on the primals. We do the
    same; anywhere else the ConcretizationError stands."""
    leaves, tree = tree_flatten(args)
    trace = find_top_trace(leaves)
    if isinstance(trace, PartialEvalTrace):
        known = [trace.full_raise(x).pval for x in leaves]
        if all(pval.is_known for pval in known):
            return f(*tree_unflatten(tree, [pval.const for pval in known]))
    fixed = check_nondiff_argnums(_fn_name(f), f.nondiff_argnums, args)
    nondiff = [args[i] for i in sorted(fixed)]
    if not isinstance(trace, JVPTrace) or any(
        isinstance(x, Tracer) for x in tree_leaves(nondiff)
    ):
        return trace_custom(f, args)  # raises the ConcretizationError again
    diff = tree_map(trace.full_raise, [a for i, a in enumerate(args) if i not in fixed])
    primals = tuple(tree_map(lambda t: t.primal, diff))
    tangents = tuple(tree_map(lambda t: t.tangent, diff))
    result = f.rule(*nondiff, primals, tangents)
    out, out_dot = _pair(f"{_fn_name(f)}: the custom_jvp rule", result, "out, tangent")
    return tree_map(lambda p, t: JVPTracer(trace, p, t), out, out_dot)


class ClosureDifferentiatedError(TypeError):
    """A custom function closes over a value that is being differentiated."""


def check_closure_not_differentiated(name: str, rule: Named, tangents: list) -> None:
    """The rule does not see ``fun``'s closed-over values, so their tangents
    must be zero (JAX refuses this case too). Values that were not traced
    when ``f`` was called are constants: their tangents are zero even when
    a jit made them inputs of its jaxpr."""
    traced = getattr(rule, "traced_consts", (True,) * len(tangents))
    for t, was_traced in zip(tangents, traced):
        if was_traced and (isinstance(t, Tracer) or np.any(np.asarray(t) != 0)):
            raise ClosureDifferentiatedError(
                f"{name}: the custom function closes over a value "
                f"({get_aval(t).str_short()}) that is being differentiated, "
                "but its rule only says how the output depends on its "
                "arguments. Pass that value to the custom function as an "
                "argument and let the rule handle it (JAX's "
                "jax.closure_convert does this conversion)."
            )


class Types(tuple):
    """A tuple of types that prints briefly, e.g. ``(float64[], float64[3])``."""

    def __repr__(self) -> str:
        return "(" + ", ".join(a.str_short() for a in self) + ")"


def _types(tree: PyTreeDef, avals: Sequence[ShapedArray]) -> str:
    return str(tree_unflatten(tree, [a.str_short() for a in avals])).replace("'", "")


def check_result(who: str, value: Any, tree: PyTreeDef, avals: list) -> list:
    """The leaves of ``value``, which must have structure ``tree``, types ``avals``."""
    leaves, got_tree = tree_flatten(value)
    leaves = [_as_input(x, who) for x in leaves]
    got = [get_aval(x) for x in leaves]
    if got_tree != tree or got != list(avals):
        raise TypeError(
            f"{who} must be {_types(tree, avals)}, but it is {_types(got_tree, got)}"
        )
    return leaves


def _pair(who: str, result: Any, what: str) -> tuple:
    if not isinstance(result, (tuple, list)) or len(result) != 2:
        raise TypeError(f"{who} must return a pair ({what}), got {_short_repr(result)}")
    return tuple(result)


def check_jvp_rule_result(call: TracedCall, result: Any) -> tuple[list, list]:
    who = f"{call.name}: the custom_jvp rule"
    out, out_dot = _pair(who, result, "primal_out, tangent_out")
    outs = check_result(f"{who}'s primal output", out, call.out_tree, call.out_types)
    out_dots = check_result(
        f"{who}'s tangent output", out_dot, call.out_tree, call.out_types
    )
    return outs, out_dots


@custom_jvp_call_p.def_rule("jvp")
def _custom_jvp_call_jvp(primals, tangents, *, name, call_jaxpr, num_consts, jvp):
    check_closure_not_differentiated(name, jvp, tangents[:num_consts])
    return jvp(primals[num_consts:], tangents[num_consts:])


custom_vjp_call_p = Primitive("custom_vjp_call", multiple_results=True)


def _custom_call_impl(*args, call_jaxpr, **params):
    return eval_jaxpr(call_jaxpr, args)


def _custom_call_lower(ctx, avals_in, avals_out, *args, call_jaxpr, **params):
    return _call_jaxpr(ctx, call_jaxpr, list(args))


for _prim in [custom_jvp_call_p, custom_vjp_call_p]:
    _prim.def_rule("impl")(_custom_call_impl)
    _prim.def_rule("lower")(_custom_call_lower)


# @title Abstract evaluation: the call's types are its jaxpr's
def check_custom_call_types(name: str, call_jaxpr: Jaxpr, avals: Sequence) -> None:
    expected = jaxpr_type(call_jaxpr)
    if list(avals) != expected.in_types:
        got = ", ".join(a.str_short() for a in avals)
        raise TypeError(f"{name}: the call's jaxpr takes {expected}, got ({got})")


def _custom_call_abstract_eval(*avals, name, call_jaxpr, **params):
    check_custom_call_types(name, call_jaxpr, avals)
    return jaxpr_type(call_jaxpr).out_types


for _prim in [custom_jvp_call_p, custom_vjp_call_p]:
    _prim.def_rule("abstract_eval")(_custom_call_abstract_eval)


@custom_jvp_call_p.def_rule("vmap")
def _custom_jvp_call_vmap(axis, vals, dims, *, call_jaxpr, num_consts, jvp, name):
    batched = tuple(d is not None for d in dims)
    vals = [
        x if d is None else move_batch_axis(axis.size, d, 0, x)
        for x, d in zip(vals, dims)
    ]
    new_jaxpr, new_consts = vmap_jaxpr(call_jaxpr, axis, batched)
    outs = bind(
        custom_jvp_call_p, *new_consts, *vals, name=name, call_jaxpr=new_jaxpr,
        num_consts=len(new_consts) + num_consts,
        jvp=batch_rule(jvp, axis, batched[num_consts:], len(new_consts)),
    )  # fmt: skip
    return outs, [0] * len(outs)


# @title batch_rule: the rule under vmap, each tangent batched like its primal
def batch_rule(rule: Named, axis: Axis, batched: tuple, n_new: int) -> Named:
    """``rule(primals, tangents)`` on a batch (axis 0) of the batched operands."""

    def batched_rule(primals: list, tangents: list) -> tuple[list, list]:
        n_out = []

        def flat(*args):
            outs, out_dots = rule(args[: len(primals)], args[len(primals) :])
            n_out.append(len(outs))
            return [*outs, *out_dots]

        in_axes = [0 if b else None for b in batched] * 2
        both = vmap_in_rule(flat, axis, in_axes, [*primals, *tangents])
        return both[: n_out[0]], both[n_out[0] :]

    traced = (False,) * n_new + rule.traced_consts  # the new constants: arrays
    return Named(batched_rule, f"vmap({rule})", traced)


def vmap_in_rule(f: Callable, axis: Axis, in_axes: list, args: list) -> list:
    """``vmap_flat``, but on the vmap of ``axis`` itself while it still runs,
    so that a rule closing over that vmap's tracers sees them batched along
    the same axis (a fresh vmap would treat them as another axis); outputs
    at axis 0."""
    stack = _state.stack
    level = next((lv for lv in stack[::-1] if lv.payload is axis), None)
    if level is None or level.trace_type is not BatchTrace:
        return vmap_flat(f, axis, in_axes, args)
    trace = BatchTrace(level)
    outs = f(
        *[x if a is None else BatchTracer(trace, x, a) for x, a in zip(args, in_axes)]
    )
    outs = [trace.full_raise(x) for x in _check_outputs("vmap", outs)]
    return [move_batch_axis(axis.size, t.batch_axis, 0, t.val) for t in outs]


class custom_vjp:
    """``fun`` with a reverse-mode derivative rule of its own."""

    def __init__(self, fun: Callable, nondiff_argnums: Sequence[int] = ()) -> None:
        functools.update_wrapper(self, fun)
        self.fun, self.nondiff_argnums = fun, tuple(nondiff_argnums)
        self.fwd = self.bwd = None

    def defvjp(self, fwd: Callable, bwd: Callable) -> None:
        """``fwd(*args) -> (out, residuals)``; ``bwd(*nondiff, residuals, ct)``."""
        self.fwd, self.bwd = fwd, bwd

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        check_rule_defined(self, self.fwd, "defvjp")
        args = resolve_kwargs(self, args, kwargs)
        if _outside_transformations(args):
            return run_outside_transformations(self, args)
        call, res_tree = trace_custom(self, args), []

        def flat_fwd(*primals: Any) -> tuple[list, list]:
            result = self.fwd(*call.all_args(call.unflatten(primals)))
            outs, res = check_fwd_result(call, result)
            res_flat, tree = tree_flatten(res)
            res_tree.append(tree)
            return outs, res_flat

        def flat_bwd(res: list, cts: list) -> list:
            res, cts = (
                tree_unflatten(res_tree[0], res),
                tree_unflatten(call.out_tree, cts),
            )
            return check_bwd_result(call, self.bwd(*call.nondiff, res, cts))

        outs = bind(
            custom_vjp_call_p, *call.consts, *call.args, **call.params,
            fwd=Named(flat_fwd, self.fwd, call.traced_consts),
            bwd=Named(flat_bwd, self.bwd),
        )  # fmt: skip
        return tree_unflatten(call.out_tree, outs)


# @title Checks: fwd returns the function's output type, bwd one cotangent per input
def check_fwd_result(call: TracedCall, result: Any) -> tuple[list, Any]:
    who = f"{call.name}: the custom_vjp fwd"
    out, res = _pair(who, result, "output, residuals")
    outs = check_result(f"{who}'s output", out, call.out_tree, call.out_types)
    return outs, res


def check_bwd_result(call: TracedCall, cts_in: Any) -> list:
    who = (
        f"{call.name}: the custom_vjp bwd's result (a tuple with one cotangent "
        "per differentiable argument)"
    )
    if isinstance(cts_in, list):
        cts_in = tuple(cts_in)
    expected = tree_unflatten(call.in_tree, call.in_types)
    cts_in = _zeros_for_none(cts_in, expected)
    return check_result(who, cts_in, call.in_tree, call.in_types)


def _zeros_for_none(ct: Any, expected: Any) -> Any:
    """``ct`` with zeros for each ``None`` standing for a part of ``expected``
    (a tree of types), as JAX's ``bwd`` may return."""
    if ct is None and expected is not None:
        return tree_map(zeros_like_aval, expected)
    same_kind = type(ct) is type(expected)
    if same_kind and isinstance(ct, (tuple, list)) and len(ct) == len(expected):
        parts = [_zeros_for_none(c, e) for c, e in zip(ct, expected)]
        return type(ct)(*parts) if hasattr(ct, "_fields") else type(ct)(parts)
    if same_kind and isinstance(ct, dict) and ct.keys() == expected.keys():
        return {k: _zeros_for_none(ct[k], expected[k]) for k in ct}
    return ct


custom_lin_p = Primitive("custom_lin", multiple_results=True)


@custom_vjp_call_p.def_rule("jvp")
def _custom_vjp_call_jvp(primals, tangents, *, call_jaxpr, num_consts, fwd, bwd, name):
    check_closure_not_differentiated(name, fwd, tangents[:num_consts])
    outs, res = fwd(*primals[num_consts:])
    out_types = Types(x.aval for x in call_jaxpr.outs)
    params = dict(name=name, num_res=len(res), bwd=bwd, out_types=out_types)
    return outs, bind(custom_lin_p, *res, *tangents[num_consts:], **params)


@custom_lin_p.def_rule("abstract_eval")
def _custom_lin_abstract_eval(*avals, name, num_res, bwd, out_types):
    return list(out_types)


@custom_lin_p.def_rule("transpose")
def _custom_lin_transpose(cts, *args, name, num_res, bwd, out_types):
    return [None] * num_res + bwd(list(args[:num_res]), list(cts))


# @title custom_lin's forward rules: each says why it cannot run
class CustomVJPForwardModeError(TypeError):
    """Forward-mode differentiation of a function that has only a custom_vjp rule."""


def forward_mode_error(*args: Any, name: str, **params: Any) -> None:
    raise CustomVJPForwardModeError(
        f"jvp of {name}, a custom_vjp function: it has only a reverse-mode rule "
        "(fwd and bwd), and bwd maps output cotangents back to inputs, which "
        "cannot give the output tangents that forward mode (jvp, or running "
        "the linear map of linearize) needs. Use grad or vjp, or give "
        f"{name} a custom_jvp rule instead."
    )


for _kind in ["impl", "jvp", "lower"]:
    custom_lin_p.def_rule(_kind)(forward_mode_error)


# @title Batching custom_vjp_call and custom_lin: fwd and bwd wrapped in vmap
def batch_fwd(fwd: Named, axis: Axis, n_out: int, n_new: int) -> Named:
    """``fwd`` on a batch (axis 0) of every operand; outputs and residuals at 0."""

    def batched_fwd(*primals: Any) -> tuple[list, list]:
        def flat(*p):
            outs, res = fwd(*p)
            return [*outs, *res]

        both = vmap_in_rule(flat, axis, [0] * len(primals), list(primals))
        return both[:n_out], both[n_out:]

    traced = (False,) * n_new + fwd.traced_consts  # the new constants: arrays
    return Named(batched_fwd, f"vmap({fwd})", traced)


def batch_bwd(bwd: Callable, axis: Axis) -> Named:
    """``bwd(residuals, cts)`` on a batch (axis 0) of all of them."""

    def batched_bwd(res: list, cts: list) -> list:
        k = len(res)
        return vmap_in_rule(
            lambda *a: bwd(a[:k], a[k:]), axis, [0] * (k + len(cts)), [*res, *cts]
        )

    return Named(batched_bwd, f"vmap({bwd})")


@custom_vjp_call_p.def_rule("vmap")
def _custom_vjp_call_vmap(axis, vals, dims, *, call_jaxpr, num_consts, fwd, bwd, name):
    consts, operands = vals[:num_consts], vals[num_consts:]
    consts = [x if d is None else move_batch_axis(axis.size, d, 0, x)
              for x, d in zip(consts, dims)]  # fmt: skip
    operands = [
        move_batch_axis(axis.size, d, 0, x) for x, d in zip(operands, dims[num_consts:])
    ]
    batched = tuple(d is not None for d in dims[:num_consts]) + (True,) * len(operands)
    new_jaxpr, new_consts = vmap_jaxpr(call_jaxpr, axis, batched)
    outs = bind(
        custom_vjp_call_p, *new_consts, *consts, *operands, name=name,
        call_jaxpr=new_jaxpr, num_consts=len(new_consts) + num_consts,
        fwd=batch_fwd(fwd, axis, len(call_jaxpr.outs), len(new_consts)),
        bwd=batch_bwd(bwd, axis),
    )  # fmt: skip
    return outs, [0] * len(outs)


@custom_lin_p.def_rule("vmap")
def _custom_lin_vmap(axis, vals, dims, *, name, num_res, bwd, out_types):
    vals = [move_batch_axis(axis.size, d, 0, x) for x, d in zip(vals, dims)]
    out_types = Types(ShapedArray((axis.size, *t.shape), t.dtype) for t in out_types)
    params = dict(
        name=name, num_res=num_res, bwd=batch_bwd(bwd, axis), out_types=out_types
    )
    outs = bind(custom_lin_p, *vals, **params)
    return outs, [0] * len(outs)


# @title Transposing calls: custom_jvp_call's jaxpr; custom_vjp_call never
# When does a call meet transposition? When a JVP rule applies a custom
# function to a tangent (JAX allows that too). Partial evaluation stages that
# call into the linear jaxpr, where transposition finds it. The function had
# better be linear.
@custom_jvp_call_p.def_rule("transpose")
def _custom_jvp_call_transpose(cts, *args, call_jaxpr, **params):
    return _xla_call_transpose(cts, *args, jaxpr=call_jaxpr)


NOT_LINEAR.update({"custom_vjp_call"})

# ==== chapter: part9_named_axes ====


class UnboundAxisError(NameError, ValueError):
    """A collective names an axis that no enclosing vmap or pmap binds."""


class AxisFrame(NamedTuple):
    name: Hashable  # what collectives call the axis
    size: int
    level: Level  # the interpreter that handles collectives over it


def axis_frames() -> list[AxisFrame]:
    """Every bound axis name, sorted by level: the innermost last."""
    vmaps = [
        AxisFrame(level.payload.name, level.payload.size, level)
        for level in _state.stack
        if level.trace_type is BatchTrace and level.payload.name is not None
    ]
    return sorted(vmaps + _pmap_frames.frames, key=lambda f: f.level.number)


def lookup_axis(name: Hashable, who: str = "collective") -> AxisFrame:
    for frame in reversed(axis_frames()):
        if frame.name == name:
            return frame
    raise unbound_axis_error(name, who)


# @title pmap's frames (bind_axis); checks: the unbound-axis error
class _PmapFrames(threading.local):
    def __init__(self) -> None:
        self.frames: list[AxisFrame] = []  # innermost last


_pmap_frames = _PmapFrames()


@contextmanager
def bind_axis(name: Hashable, size: int, level: Level) -> Iterator[None]:
    """Make ``name`` refer to an axis of ``size`` handled by ``level``."""
    if name is None:
        yield
        return
    _pmap_frames.frames.append(AxisFrame(name, size, level))
    try:
        yield
    finally:
        _pmap_frames.frames.pop()


def check_replicas(ctx: LoweringContext, name: Hashable) -> int:
    if ctx.replicas is None:
        raise UnboundAxisError(
            f"a collective over axis {name!r} reached XLA outside pmap: only "
            "pmap compiles for several replicas (under vmap, a collective "
            "becomes an operation on the batch axis before compilation)"
        )
    return ctx.replicas


def unbound_axis_error(name: Hashable, who: str) -> UnboundAxisError:
    bound = [frame.name for frame in axis_frames()]
    where = f"the names bound here are {bound}" if bound else "no axis is bound here"
    return UnboundAxisError(
        f"{who}: unbound axis name {name!r}: no enclosing vmap(..., "
        f"axis_name=...) or pmap(..., axis_name=...) binds it ({where})"
    )


AXIS_USERS: dict[Primitive, Callable[[dict], Any]] = {}  # prim -> names it uses


def bind(prim: Primitive, *args: Any, **params: Any) -> Any:
    """Apply a primitive: the single entry point of every operation."""
    args = [x if isinstance(x, Tracer) else as_array(x, prim.name) for x in args]
    trace = find_top_trace(args)
    if prim in AXIS_USERS:  # new: reach the interpreters that bound its axes
        trace = reach_axes(trace, AXIS_USERS[prim](params), prim.name)
    tracers = [trace.full_raise(x) for x in args]
    outs = trace.process_primitive(prim, tracers, params)
    outs = [full_lower(out) for out in outs]
    return outs if prim.multiple_results else outs[0]


def reach_axes(trace: Trace, names: Any, who: str) -> Trace:
    """The higher of ``trace`` and the levels that bound ``names``."""
    for name in names:
        level = lookup_axis(name, who).level
        if level.number > trace.level.number:
            trace = level.trace_type(level)
    return trace


psum_p = Primitive("psum")
pmax_p = Primitive("pmax")
all_gather_p = Primitive("all_gather")
axis_index_p = Primitive("axis_index")
COLLECTIVES = (psum_p, pmax_p, all_gather_p, axis_index_p)
for _prim in COLLECTIVES:
    AXIS_USERS[_prim] = lambda params: (params["axis_name"],)


def psum(x: Any, axis_name: Any) -> Any:
    """Sum every leaf of ``x`` over the axis ``axis_name`` (or over each axis
    of a tuple of names): every member gets the total."""
    return on_leaves_and_names(psum_p, x, axis_name)


def pmax(x: Any, axis_name: Any) -> Any:
    return on_leaves_and_names(pmax_p, x, axis_name)


def pmean(x: Any, axis_name: Any) -> Any:
    size = np.prod([axis_size(name, "pmean") for name in names_of(axis_name)])
    return tree_map(lambda total: total / int(size), psum(x, axis_name))


def all_gather(x: Any, axis_name: Hashable) -> Any:
    """Every member's ``x`` (each leaf), stacked along a new leading axis."""
    size = axis_size(axis_name, "all_gather")

    def gather(leaf):
        return bind(all_gather_p, leaf, axis_name=axis_name, axis_size=size)

    return tree_map(gather, x)


def axis_index(axis_name: Hashable) -> ArrayLike:
    """This member's position along ``axis_name`` (an int32 scalar)."""
    return bind(axis_index_p, axis_name=axis_name)


@psum_p.def_rule("vmap")
def _psum_vmap(axis, vals, dims, *, axis_name):
    (x,), (d,) = vals, dims
    if axis.name != axis_name:  # another axis: the batch rides along
        return [psum(x, axis_name)], [d]
    if d is None:  # the same value in every member: the sum is N times it
        aval = get_aval(x)
        return [mul(x, np.full(aval.shape, axis.size, aval.dtype))], [None]
    return [reduce_sum(x, d)], [None]


@axis_index_p.def_rule("vmap")
def _axis_index_vmap(axis, vals, dims, *, axis_name):
    return [np.arange(axis.size, dtype=np.int32)], [0]


# @title The batching rules of pmax and all_gather; pytrees and tuples of names
@pmax_p.def_rule("vmap")
def _pmax_vmap(axis, vals, dims, *, axis_name):
    (x,), (d,) = vals, dims
    if axis.name != axis_name:
        return [pmax(x, axis_name)], [d]
    if d is None:
        return [x], [None]
    return [reduce_max(x, d)], [None]


@all_gather_p.def_rule("vmap")
def _all_gather_vmap(axis, vals, dims, *, axis_name, axis_size):
    (x,), (d,) = vals, dims
    if axis.name != axis_name:
        out_dim = None if d is None else d + 1
        return [all_gather(x, axis_name)], [out_dim]
    return [move_batch_axis(axis_size, d, 0, x)], [None]


def axis_size(axis_name: Hashable, who: str = "pmean") -> int:
    return lookup_axis(axis_name, who).size


def names_of(axis_name: Any) -> tuple:
    return axis_name if isinstance(axis_name, tuple) else (axis_name,)


def on_leaves_and_names(prim: Primitive, x: Any, axis_name: Any) -> Any:
    """``prim`` on every leaf of ``x``, over each axis that ``axis_name`` names."""

    def on_leaf(leaf):
        for name in names_of(axis_name):
            leaf = bind(prim, leaf, axis_name=name)
        return leaf

    return tree_map(on_leaf, x)


# @title The collectives' other rules: types, derivatives, transposes
for _prim in (psum_p, pmax_p):
    _prim.def_rule("abstract_eval")(lambda x, *, axis_name: [x])


@all_gather_p.def_rule("abstract_eval")
def _all_gather_abstract_eval(x, *, axis_name, axis_size):
    return [ShapedArray((axis_size, *x.shape), x.dtype)]


@axis_index_p.def_rule("abstract_eval")
def _axis_index_abstract_eval(*, axis_name):
    return [ShapedArray((), np.dtype(np.int32))]


def _unreachable_impl(prim: Primitive) -> None:
    @prim.def_rule("impl")
    def rule(*args, axis_name, **params):
        # bind always raises a collective to the level that bound its axis,
        # so plain evaluation never sees one; if it does, the axis is unbound
        raise unbound_axis_error(axis_name, prim.name)

    rule.only_raises = True  # the rule table says so


for _prim in COLLECTIVES:
    _unreachable_impl(_prim)


@psum_p.def_rule("jvp")
def _psum_jvp(primals, tangents, *, axis_name):
    return [psum(primals[0], axis_name)], [psum(tangents[0], axis_name)]


@all_gather_p.def_rule("jvp")
def _all_gather_jvp(primals, tangents, **params):
    return [bind(all_gather_p, primals[0], **params)], [
        bind(all_gather_p, tangents[0], **params)
    ]


@pmax_p.def_rule("jvp")
def _pmax_jvp(primals, tangents, *, axis_name):
    (x,), (t,) = primals, tangents
    out = pmax(x, axis_name)
    at_max = convert_element_type(numpy_equal(x, out), get_aval(x).dtype)
    return [out], [psum(t * at_max, axis_name) / psum(at_max, axis_name)]


@axis_index_p.def_rule("jvp")
def _axis_index_jvp(primals, tangents, *, axis_name):
    out = axis_index(axis_name)
    return [out], [zeros_like(out)]


@psum_p.def_rule("transpose")
def _psum_transpose(cts, x, *, axis_name):
    (ct,) = cts
    return [None if ct is None else psum(ct, axis_name)]


@all_gather_p.def_rule("transpose")
def _all_gather_transpose(cts, x, *, axis_name, axis_size):
    (ct,) = cts
    if ct is None:
        return [None]
    total = psum(ct, axis_name)  # my row of the gathered sum is my cotangent
    mine = numpy_equal(np.arange(axis_size, dtype=np.int32), axis_index(axis_name))
    zeros = np.zeros(get_aval(total).shape, get_aval(total).dtype)
    return [reduce_sum(select(per_example(mine, total), total, zeros), 0)]


NOT_LINEAR.update({"pmax", "axis_index"})

for _fn in [while_loop, fori_loop, scan, psum, pmean, pmax, all_gather, axis_index]:
    setattr(lax_namespace, _fn.__name__, _fn)


# @title devices(): the CPU client's devices
def devices() -> list:
    """The devices XLA's CPU client offers (8 with the book's XLA_FLAGS)."""
    return runtime().client.local_devices()


# @title Lowering psum, pmax and axis_index: all_reduce and replica_id
LoweringContext.replicas = None  # pmap's lowering sets the number of replicas


def replica_groups(ctx: LoweringContext, name: Hashable) -> ir.Attribute:
    """All replicas in one group: the collective spans every device."""
    n = check_replicas(ctx, name)
    groups = np.arange(n, dtype=np.int64).reshape(1, n)
    return ir.DenseIntElementsAttr.get(groups)


def _all_reduce_lower(combine: Callable) -> Callable:
    def rule(ctx, avals_in, avals_out, x, *, axis_name):
        op = hlo.AllReduceOp([x.type], [x], replica_groups(ctx, axis_name))
        scalar = ir_type(ShapedArray((), avals_in[0].dtype))
        body = op.regions[0].blocks.append(scalar, scalar)
        with ir.InsertionPoint(body):
            hlo.ReturnOp([combine(*body.arguments)])
        return [op.result]

    return rule


psum_p.def_rule("lower")(_all_reduce_lower(hlo.add))
pmax_p.def_rule("lower")(_all_reduce_lower(hlo.maximum))


@axis_index_p.def_rule("lower")
def _axis_index_lower(ctx, avals_in, avals_out, *, axis_name):
    replica_groups(ctx, axis_name)  # refuses a collective outside pmap
    index = hlo.ReplicaIdOp().result  # a 32-bit unsigned integer
    return [hlo.convert(ir_type(avals_out[0]), index)]


# @title Lowering all_gather: each replica's row, gathered along a new axis 0
@all_gather_p.def_rule("lower")
def _all_gather_lower(ctx, avals_in, avals_out, x, *, axis_name, axis_size):
    (x_aval,), (out_aval,) = avals_in, avals_out
    row = hlo.reshape(ir_type(ShapedArray((1, *x_aval.shape), x_aval.dtype)), x)
    groups = replica_groups(ctx, axis_name)
    return [hlo.AllGatherOp([ir_type(out_aval)], [row], 0, groups).result]


# @title The module for one replica (lower_pmap) and its executable (CompiledPmap)
def lower_pmap(jaxpr: Jaxpr, n: int) -> ir.Module:
    """A module for one replica: ``main`` takes and returns one row per input
    and output (shape ``(1, ...)``) and calls the lowered ``jaxpr`` on them."""
    with mlir_context(), ir.Location.unknown():
        ctx = LoweringContext()
        ctx.replicas = n  # new: collectives span n replicas
        body = ctx.function_for(jaxpr)
        row = lambda aval: ir_type(ShapedArray((1, *aval.shape), aval.dtype))  # noqa: E731
        ins = [row(v.aval) for v in jaxpr.in_binders]
        outs = [row(x.aval) for x in jaxpr.outs]
        with ir.InsertionPoint(ctx.module.body):
            main = mlir_func.FuncOp("main", ir.FunctionType.get(ins, outs))
        block = main.add_entry_block()
        with ir.InsertionPoint(block):
            args = [
                hlo.reshape(ir_type(v.aval), a)
                for v, a in zip(jaxpr.in_binders, block.arguments)
            ]
            out_types = [ir_type(x.aval) for x in jaxpr.outs]
            call = mlir_func.CallOp(out_types, ir.FlatSymbolRefAttr.get(body), args)
            mlir_func.ReturnOp([hlo.reshape(t, r) for t, r in zip(outs, call.results)])
        ctx.module.operation.verify()
    return ctx.module


class CompiledPmap:
    """One XLA executable for ``n`` replicas, one per device."""

    def __init__(self, jaxpr: Jaxpr, n: int, chosen: tuple = ()) -> None:
        from jax._src.lib import xla_client

        self.devices = chosen or tuple(devices()[:n])
        self.module_text = str(lower_pmap(jaxpr, n))
        options = xla_client.CompileOptions()
        options.num_replicas = n
        ids = np.array([[d.id] for d in self.devices])  # replica i on device i
        options.device_assignment = xla_client.DeviceAssignment.create(ids)
        self.executable = runtime().client.compile_and_load(
            self.module_text, xla_client.DeviceList(tuple(self.devices)), options
        )
        out_avals = _pmap_abstract_eval(jaxpr=jaxpr, axis_name=None, axis_size=n)
        self.handlers = row_result_handlers(out_avals, self.devices)

    def __call__(self, *args: Any) -> list[ShardedArray]:
        arrays = [shard_rows(x, self.devices) for x in args]
        results = self.executable.execute_sharded(arrays)
        outs = results.consume_with_handlers(self.handlers)  # n pieces -> 1 array
        wait_until_ready(outs)
        return [ShardedArray(out) for out in outs]


# @title Result handlers; waiting for each run; one executable per (jaxpr, rows)
def row_result_handlers(avals: list, devices: tuple) -> list:
    """Per output, jaxlib's handler that joins its pieces into one array."""
    from jaxlib import _jax

    sharding = rows_sharding(devices)
    return [
        _jax.array_result_handler(
            jax.core.ShapedArray(aval.shape, aval.dtype),
            sharding,
            committed=True,
            _skip_checks=True,
        )
        for aval in avals
    ]


def wait_until_ready(outs: list) -> None:
    # On XLA's CPU devices, a collective waits until every replica of its run
    # has arrived. With many runs in flight on few cores, one run's replicas can
    # wait behind another's until XLA gives up and aborts the process (real JAX's
    # pmap does, on the 2-core machine that builds this book), so we let each
    # run finish before starting the next.
    for out in outs:
        out.block_until_ready()


_compiled_pmaps: dict[tuple[Jaxpr, tuple], CompiledPmap] = {}


def compile_pmap(jaxpr: Jaxpr, n: int) -> CompiledPmap:
    """The executable for ``n`` replicas on the first ``n`` devices of the
    enclosing pmap's ``devices=`` (of ``devices()`` without one)."""
    chosen = tuple((getattr(_state, "pmap_devices", None) or devices())[:n])
    if (jaxpr, chosen) not in _compiled_pmaps:
        _compiled_pmaps[jaxpr, chosen] = CompiledPmap(jaxpr, n, chosen)
    return _compiled_pmaps[jaxpr, chosen]


@contextmanager
def running_on(chosen: Sequence | None) -> Iterator[None]:
    """Run the pmaps of the block on ``chosen`` devices (``pmap(devices=)``)."""
    previous = getattr(_state, "pmap_devices", None)
    _state.pmap_devices = previous if chosen is None else list(chosen)
    try:
        yield
    finally:
        _state.pmap_devices = previous


# @title ShardedArray: rows on their devices; shard_rows puts an input there
class ShardedArray(Array):
    """An array whose rows live on different devices: row ``i`` on device ``i``."""

    def __init__(self, rows: Any) -> None:
        self._rows = rows

    @functools.cached_property
    def _buffer(self) -> Any:  # for one-device calls: gathered, on device 0
        return device_put(np.asarray(self._rows))._buffer


def shard_rows(x: Any, devices: tuple) -> Any:
    """``x`` as one array of ``len(devices)`` shards, row ``i`` on device ``i``."""
    sharding = rows_sharding(devices)
    if isinstance(x, ShardedArray) and x._rows.sharding == sharding:
        return x._rows  # already in place: no copy
    from jaxlib import _jax

    x = np.asarray(x)
    aval = jax.core.ShapedArray(x.shape, x.dtype)
    # Fresh rows: a buffer may share a row's memory, and nothing else can write it.
    rows = [x[i : i + 1].copy() for i in range(len(devices))]
    return _jax.batched_device_put(aval, sharding, rows, devices, True, enable_x64=True)


# @title A ShardedArray's shape and host copy; where an array lives; a sharding by rows
ShardedArray.shape = property(lambda self: tuple(self._rows.shape))
ShardedArray.dtype = property(lambda self: np.dtype(self._rows.dtype))
ShardedArray.__array__ = lambda self, dtype=None, copy=None: np.asarray(
    self._rows, dtype=dtype, copy=copy
)

# Where an array lives, as JAX says it: the set of its devices, and its pieces
Array.devices = lambda self: self._buffer.devices()
Array.addressable_shards = property(lambda self: self._buffer.addressable_shards)
ShardedArray.devices = lambda self: self._rows.devices()
ShardedArray.addressable_shards = property(lambda self: self._rows.addressable_shards)


@functools.cache
def rows_sharding(devices: tuple) -> jax.sharding.Sharding:
    """Axis 0 split across ``devices``, one row on each."""
    mesh = jax.sharding.Mesh(np.array(devices), ("rows",))
    return jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("rows"))


pmap_p = Primitive("pmap", multiple_results=True)


def pmap(
    f: Callable,
    axis_name: Hashable = None,
    in_axes: Any = 0,
    out_axes: int = 0,
    devices: Sequence | None = None,
):
    """Run ``f`` on every row of the mapped inputs, one row per device (the
    first ones of ``devices``, if given), with collectives over ``axis_name``
    communicating between the devices."""
    traces: dict[tuple, tuple] = {}

    def pmapped(*args: Any) -> Any:
        args_flat, axes_flat, in_tree = _flatten_pmap_args(in_axes, args)
        n = check_pmap_rows(args_flat, axes_flat, devices)
        rows = [move_batch_axis(n, ax, 0, x) for x, ax in zip(args_flat, axes_flat)]
        one_row = [ShapedArray(get_aval(x).shape[1:], get_aval(x).dtype) for x in rows]
        body = with_axis(f, axis_name, n)
        jaxpr, consts, out_tree = trace_for_pmap(body, traces, n, one_row, in_tree)
        consts = [move_batch_axis(n, None, 0, c) for c in consts]  # a copy per row
        with running_on(devices):
            outs = bind(
                pmap_p, *consts, *rows, jaxpr=jaxpr, axis_name=axis_name, axis_size=n
            )
        outs = [move_batch_axis(n, 0, pmap_out_axis(out_axes, x), x) for x in outs]
        return tree_unflatten(out_tree, outs)

    return pmapped


def with_axis(f: Callable, axis_name: Hashable, size: int) -> Callable:
    """``f``, with ``axis_name`` bound to the interpreter that traces it."""

    def f_with_axis(*args):
        with bind_axis(axis_name, size, _state.dynamic):
            return f(*args)

    return f_with_axis


@pmap_p.def_rule("impl")
def _pmap_impl(*args, jaxpr, axis_name, axis_size):
    return compile_pmap(jaxpr, axis_size)(*args)


# @title The axis names a call uses and does not bind; pmap's output types
def free_axis_names(jaxpr: Jaxpr) -> frozenset:
    if jaxpr not in _free_names:
        names = set()
        for eqn in jaxpr.eqns:
            if eqn.primitive in AXIS_USERS:
                names |= set(AXIS_USERS[eqn.primitive](eqn.params))
        _free_names[jaxpr] = frozenset(names)
    return _free_names[jaxpr]


_free_names: weakref.WeakKeyDictionary[Jaxpr, frozenset] = weakref.WeakKeyDictionary()


def _names_in_jaxpr_params(params: dict) -> frozenset:
    jaxprs = [v for v in params.values() if isinstance(v, Jaxpr)]
    return frozenset().union(*map(free_axis_names, jaxprs))


for _prim in PRIMITIVES.values():
    if _prim.name in (
        "xla_call",
        "cond",
        "while",
        "scan",
        "custom_jvp_call",
        "custom_vjp_call",
    ):
        AXIS_USERS[_prim] = _names_in_jaxpr_params


AXIS_USERS[pmap_p] = lambda params: (
    free_axis_names(params["jaxpr"]) - {params["axis_name"]}
)


@pmap_p.def_rule("abstract_eval")
def _pmap_abstract_eval(*avals_in, jaxpr, axis_name, axis_size):
    return [
        ShapedArray((axis_size, *t.shape), t.dtype) for t in jaxpr_type(jaxpr).out_types
    ]


# @title Checks: pmap's in_axes, row counts and device count
def _flatten_pmap_args(in_axes: Any, args: tuple) -> tuple[list, list, PyTreeDef]:
    try:
        return _flatten_vmap_args(in_axes, args)
    except (TypeError, ValueError) as e:  # vmap's checks, in pmap's name
        raise type(e)(str(e).replace("vmap", "pmap")) from None


def pmap_out_axis(out_axes: Any, out: Any) -> int:
    ndim = get_aval(out).ndim
    if not _is_axis(out_axes) or not -ndim <= out_axes < ndim:
        raise ValueError(
            f"pmap: out_axes must be an int in [{-ndim}, {ndim}) for an output "
            f"of shape {get_aval(out).shape} (including the device axis), "
            f"got {out_axes!r}"
        )
    return out_axes % ndim


def trace_for_pmap(f, traces: dict, n: int, one_row: list, in_tree: PyTreeDef):
    """As jit's trace_for_call: one jaxpr per row type (and number of rows)."""
    key = (n, in_tree, tuple(one_row))
    if key not in traces:
        for aval in one_row:
            check_xla_dtype(aval.dtype, "pmap")
        args = tree_unflatten(in_tree, one_row)
        traced = _trace_to_jaxpr(f, args, who="pmap")
        jaxpr, consts, out_tree = traced
        if any(isinstance(c, Tracer) for c in consts):
            return traced  # valid for this call only
        traces[key] = (jaxpr, [device_put(c) for c in consts], out_tree)
    return traces[key]


def check_pmap_rows(args: list, axes: list, given: Sequence | None = None) -> int:
    """The number of rows (one per device), checked against the devices."""
    (n,) = {get_aval(x).shape[ax] for x, ax in zip(args, axes) if ax is not None}
    available = len(devices())
    if n == 0:
        raise ValueError("pmap: the mapped axis has 0 rows: nothing to run")
    if given is not None:
        check_given_devices(n, given)
    if n > available:
        raise ValueError(
            f"pmap: the mapped axis has {n} rows but there are only {available} "
            f"devices; map over at most {available} rows (e.g. reshape to "
            f"({available}, -1, ...) and vmap inside each device)"
        )
    return n


def check_given_devices(n: int, given: Sequence) -> None:
    known = devices()
    for d in given:
        if d not in known:
            raise TypeError(
                f"pmap: devices= must hold devices from devices(), got {d!r}"
            )
    if len(set(given)) != len(given):
        raise ValueError(f"pmap: devices= names a device twice: {list(given)}")
    if n > len(given):
        raise ValueError(
            f"pmap: the mapped axis has {n} rows but devices= gives only "
            f"{len(given)} devices; give at least {n}"
        )


def rows_of(n: int, consts: list) -> list:
    """Constants of a new body, one copy per device (pmap maps every input)."""
    return [move_batch_axis(n, None, 0, c) for c in consts]


@pmap_p.def_rule("jvp")
def _pmap_jvp(primals, tangents, *, jaxpr, axis_name, axis_size):
    with bind_axis(axis_name, axis_size, _state.dynamic):
        new_jaxpr, consts = jvp_jaxpr(jaxpr)
    params = dict(axis_name=axis_name, axis_size=axis_size)
    outs = bind(
        pmap_p,
        *rows_of(axis_size, consts),
        *primals,
        *tangents,
        jaxpr=new_jaxpr,
        **params,
    )
    n = len(outs) // 2
    return outs[:n], outs[n:]


# @title pmap's batching and transpose rules
@pmap_p.def_rule("vmap")
def _pmap_vmap(axis, vals, dims, *, jaxpr, axis_name, axis_size):
    # Axis 0 is the devices' axis, so each row's batch goes to axis 1.
    vals = [
        v if d is None else move_batch_axis(axis.size, d, 1, v)
        for v, d in zip(vals, dims)
    ]
    batched = tuple(d is not None for d in dims)
    with bind_axis(axis_name, axis_size, _state.dynamic):
        new_jaxpr, consts = vmap_jaxpr(jaxpr, axis, batched)
    params = dict(axis_name=axis_name, axis_size=axis_size)
    outs = bind(pmap_p, *rows_of(axis_size, consts), *vals, jaxpr=new_jaxpr, **params)
    return outs, [1] * len(outs)


@pmap_p.def_rule("transpose")
def _pmap_transpose(cts, *args, jaxpr, axis_name, axis_size):
    undefined = tuple(_is_undef(x) for x in args)
    with bind_axis(axis_name, axis_size, _state.dynamic):
        new_jaxpr, consts = transpose_jaxpr(jaxpr, undefined)
    defined = [x for x in args if not _is_undef(x)]
    out_types = _pmap_abstract_eval(
        jaxpr=jaxpr, axis_name=axis_name, axis_size=axis_size
    )
    cts = [zeros_like_aval(t) if ct is None else ct for ct, t in zip(cts, out_types)]
    params = dict(axis_name=axis_name, axis_size=axis_size)
    cts_in = iter(
        bind(
            pmap_p,
            *rows_of(axis_size, consts),
            *defined,
            *cts,
            jaxpr=new_jaxpr,
            **params,
        )
    )
    return [next(cts_in) if u else None for u in undefined]


# @title pmap's partial evaluation: known rows now, unknown rows staged (as xla_call's)
@pmap_p.def_rule("partial_eval")
def _pmap_partial_eval(trace, tracers, *, jaxpr, **params):
    in_unknowns = [not t.pval.is_known for t in tracers]
    jaxpr_known, jaxpr_unknown, out_unknowns, num_res = split_call_jaxpr(
        jaxpr, tuple(in_unknowns)
    )
    known_vals = [t.pval.const for t in tracers if t.pval.is_known]
    known_outs_and_res = bind(pmap_p, *known_vals, jaxpr=jaxpr_known, **params)
    split = len(known_outs_and_res) - num_res
    known_outs, residuals = known_outs_and_res[:split], known_outs_and_res[split:]
    residual_tracers = [trace.instantiate_const(trace.pure(r)) for r in residuals]
    unknown_tracers = [t for t in tracers if not t.pval.is_known]
    unknown_outs = trace.stage(
        pmap_p, residual_tracers + unknown_tracers, dict(jaxpr=jaxpr_unknown, **params)
    )
    known_iter, unknown_iter = iter(known_outs), iter(unknown_outs)
    return [
        next(unknown_iter) if unk else trace.pure(next(known_iter))
        for unk in out_unknowns
    ]


@pmap_p.def_rule("partial_eval_jaxpr")
def _pmap_partial_eval_jaxpr(unks_in, eqn):
    params = {k: v for k, v in eqn.params.items() if k != "jaxpr"}
    jaxpr_known, jaxpr_unknown, out_unknowns, num_res = split_call_jaxpr(
        eqn.params["jaxpr"], tuple(unks_in)
    )
    known_outs = [v for v, u in zip(eqn.out_binders, out_unknowns) if not u]
    unknown_outs = [v for v, u in zip(eqn.out_binders, out_unknowns) if u]
    n = params["axis_size"]
    residuals = [
        Var(ShapedArray((n, *v.aval.shape), v.aval.dtype))
        for v in jaxpr_known.outs[len(known_outs) :]
    ]
    known_ins = [x for x, u in zip(eqn.inputs, unks_in) if not u]
    unknown_ins = [x for x, u in zip(eqn.inputs, unks_in) if u]
    eqn_known = JaxprEqn(
        pmap_p, known_ins, dict(jaxpr=jaxpr_known, **params), known_outs + residuals
    )
    eqn_unknown = JaxprEqn(
        pmap_p,
        residuals + unknown_ins,
        dict(jaxpr=jaxpr_unknown, **params),
        unknown_outs,
    )
    return eqn_known, eqn_unknown, out_unknowns, residuals


# @title Lowering pmap inside jit: its rows as a batch on jit's device
class PmapInsideJitError(TypeError):
    """pmap was staged into a program that already runs one row per device."""


@pmap_p.def_rule("lower")
def _pmap_lower(ctx, avals_in, avals_out, *args, jaxpr, axis_name, axis_size):
    if ctx.replicas is not None:
        raise PmapInsideJitError(
            "pmap inside another pmap is not supported: the enclosing program "
            "already runs one row per device; use vmap for the inner mapped "
            "axis (jit inside pmap, and pmap inside jit, are fine)"
        )
    # The same values as pmap: the body batched over the rows, collectives
    # and all (vmap with the same axis name), called on jit's one device.
    batched, consts = vmap_jaxpr(jaxpr, Axis(axis_size, axis_name), (True,) * len(args))
    operands = [*(dense_constant(c) for c in consts), *args]
    callee = ctx.function_for(batched)
    out_types = [ir_type(a) for a in avals_out]
    call = mlir_func.CallOp(out_types, ir.FlatSymbolRefAttr.get(callee), operands)
    return list(call.results)


def dense_constant(value: Any) -> ir.Value:
    """A StableHLO constant holding the array ``value``."""
    x = np.ascontiguousarray(np.asarray(value))
    if x.dtype == np.bool_:  # MLIR packs booleans; build them from int8
        as_int = hlo.constant(ir.DenseElementsAttr.get(x.astype(np.int8)))
        return hlo.convert(ir_type(ShapedArray(x.shape, x.dtype)), as_int)
    return hlo.constant(ir.DenseElementsAttr.get(x))


# ==== chapter: analysis ====


@dataclass(frozen=True)
class Cost:
    """What running some code costs, in the units of XLA's cost analysis."""

    flops: int = 0  # arithmetic operations (a multiply-add counts 2)
    transcendentals: int = 0  # sin, exp, log, tanh, ... (one per element)
    bytes_accessed: int = 0  # bytes read and written by the operations

    def __add__(self, other: Cost) -> Cost:
        return Cost(*(a + b for a, b in zip(astuple(self), astuple(other))))

    def __mul__(self, times: int) -> Cost:  # a loop body run `times` times
        return Cost(*(a * times for a in astuple(self)))

    __rmul__ = __mul__

    def as_dict(self) -> dict[str, float]:
        """XLA's key names and number type."""
        keys = ("flops", "transcendentals", "bytes accessed")
        return {key: float(n) for key, n in zip(keys, astuple(self))}


def jaxpr_cost(jaxpr: Jaxpr, inputs: list[Callable], axis_sizes=None) -> Cost:
    """What running ``jaxpr`` costs. ``inputs[i]()`` is input i's value, or
    None when only its type is known."""
    known = KnownValues(jaxpr, inputs)
    total = Cost()
    for eqn in jaxpr.eqns:
        ctx = CostContext(
            [functools.partial(known, x) for x in eqn.inputs], axis_sizes or {}
        )
        avals_in = [x.aval for x in eqn.inputs]
        avals_out = [v.aval for v in eqn.out_binders]
        total += eqn.primitive.rule("cost")(ctx, avals_in, avals_out, **eqn.params)
    return total


def cost_analysis(f: Callable, *args: Any) -> dict[str, float]:
    """What ``f(*args)`` costs; each argument an array or a ShapedArray."""
    jaxpr, consts, _ = make_jaxpr(f, *args)
    inputs = [given(c) for c in consts] + [given(x) for x in tree_leaves(args)]
    return jaxpr_cost(jaxpr, inputs).as_dict()


def given(x: Any) -> Callable[[], Any]:
    """An input's value on demand: None for a ShapedArray (a type, no value)."""
    return lambda: None if isinstance(x, ShapedArray) else x


# @title CostContext, and KnownValues: values computed only when a rule asks
from dataclasses import astuple


class CostContext(NamedTuple):
    inputs: list[Callable[[], Any]]  # each input's value on demand, or None
    axis_sizes: dict  # the named axes of an enclosing pmap: name -> size

    def known(self, i: int) -> Any:
        """Input ``i``'s value if it follows from known inputs, else None."""
        return self.inputs[i]()

    def cost(self, jaxpr: Jaxpr, inputs: list[Callable], more_axes=None) -> Cost:
        return jaxpr_cost(jaxpr, inputs, {**self.axis_sizes, **(more_axes or {})})


UNKNOWN = given(ShapedArray((), np.float64))  # an input known by its type only


class KnownValues:
    """The values of a jaxpr's variables that follow from its known inputs,
    each computed (with ``bind``) the first time it is asked for."""

    def __init__(self, jaxpr: Jaxpr, inputs: list[Callable]) -> None:
        self.inputs = dict(zip(jaxpr.in_binders, inputs))
        self.made_by = {v: eqn for eqn in jaxpr.eqns for v in eqn.out_binders}
        self.values: dict[Var, Any] = {}

    def __call__(self, atom: Atom) -> Any:
        if isinstance(atom, Lit):
            return atom.val
        if atom not in self.values:
            for var in toposort([atom], self._parents):  # parents first, no recursion
                if var not in self.values:
                    self._compute(var)
        return self.values[atom]

    def _parents(self, var: Var) -> list[Var]:
        eqn = None if var in self.values else self.made_by.get(var)
        return [x for x in eqn.inputs if isinstance(x, Var)] if eqn else []

    def _compute(self, var: Var) -> None:
        if var in self.inputs:
            self.values[var] = self.inputs[var]()
            return
        eqn = self.made_by[var]
        ins = [self(x) for x in eqn.inputs]
        if any(v is None for v in ins):
            outs = [None] * len(eqn.out_binders)
        else:
            outs = bind(eqn.primitive, *ins, **eqn.params)
            outs = outs if eqn.primitive.multiple_results else [outs]
        self.values.update(zip(eqn.out_binders, outs))


def io_bytes(avals_in: list[ShapedArray], avals_out: list[ShapedArray]) -> int:
    return sum(a.size * a.dtype.itemsize for a in [*avals_in, *avals_out])


def per_element_cost(prim: Primitive, flops=1, transcendentals=0) -> None:
    @prim.def_rule("cost")
    def rule(ctx, avals_in, avals_out, **params):
        n = avals_out[0].size
        return Cost(flops * n, transcendentals * n, io_bytes(avals_in, avals_out))


for prim in [add_p, sub_p, mul_p, div_p, neg_p, max_p, select_p]:
    per_element_cost(prim)
for prim in [sin_p, cos_p, exp_p, log_p, tanh_p, sqrt_p, rsqrt_p, erf_p]:
    per_element_cost(prim, flops=0, transcendentals=1)
for prim in [transpose_p, broadcast_p, reshape_p]:
    per_element_cost(prim, flops=0)


@dot_general_p.def_rule("cost")
def _dot_general_cost(ctx, avals_in, avals_out, *, dimension_numbers):
    (x, _), (out,) = avals_in, avals_out
    (x_contract, _), _ = dimension_numbers
    length = math.prod(x.shape[i] for i in x_contract)  # of each dot product
    return Cost(2 * out.size * length, 0, io_bytes(avals_in, avals_out))


# @title Cost rules: comparisons, convert, powers, reductions, collectives, indexing
for prim in [gt_p, lt_p, eq_p, ne_p, le_p, ge_p, convert_element_type_p]:
    per_element_cost(prim)


@integer_pow_p.def_rule("cost")
def _integer_pow_cost(ctx, avals_in, avals_out, *, y):
    # the lowering squares once per binary digit after the first, multiplies
    # once per further digit that is set, and divides once for y < 0
    n = abs(y)
    per_element = max(n.bit_length() - 1, 0) + max(n.bit_count() - 1, 0) + (y < 0)
    return Cost(per_element * avals_out[0].size, 0, io_bytes(avals_in, avals_out))


@pow_p.def_rule("cost")
def _pow_cost(ctx, avals_in, avals_out):
    # one transcendental per element, and one conversion if the exponent is
    # an integer array (the lowering converts it to the base's dtype)
    (x, y), (out,) = avals_in, avals_out
    flops = out.size if y.dtype != x.dtype else 0
    return Cost(flops, out.size, io_bytes(avals_in, avals_out))


def reduction_cost(prim: Primitive) -> None:
    @prim.def_rule("cost")
    def rule(ctx, avals_in, avals_out, *, axes):
        (x,), (out,) = avals_in, avals_out
        init = x.dtype.itemsize  # the lowering's starting value is read too
        return Cost(max(x.size - out.size, 0), 0, io_bytes(avals_in, avals_out) + init)


reduction_cost(reduce_sum_p)
reduction_cost(reduce_max_p)


def free_cost(prim: Primitive) -> None:
    """A primitive that compiles to nothing (an identity) costs nothing."""
    prim.def_rule("cost")(lambda ctx, avals_in, avals_out, **params: Cost())


free_cost(stop_gradient_p)
free_cost(keep_gradient_p)
free_cost(axis_index_p)

# The indexing chapter's primitives move data: they cost the bytes they read
# and write, and scatter-add (-mul, -min, -max) one operation per element of
# its updates.
for prim in [slice_p, pad_p, dynamic_slice_p, dynamic_update_slice_p]:
    per_element_cost(prim, flops=0)
for prim in [gather_p, scatter_p]:
    per_element_cost(prim, flops=0)


def _scatter_combine_cost(ctx, avals_in, avals_out, **params):
    updates = avals_in[1]
    return Cost(updates.size, 0, io_bytes(avals_in, avals_out))


for prim in [scatter_add_p, scatter_mul_p, scatter_min_p, scatter_max_p]:
    prim.def_rule("cost")(_scatter_combine_cost)


def all_reduce_cost(prim: Primitive) -> None:
    """Each member combines the values of all n members: n - 1 operations
    per element, on every member."""

    @prim.def_rule("cost")
    def rule(ctx, avals_in, avals_out, *, axis_name):
        if axis_name not in ctx.axis_sizes:
            raise unbound_axis_error(axis_name, f"cost_analysis of {prim.name}")
        n = ctx.axis_sizes[axis_name]
        return Cost((n - 1) * avals_out[0].size, 0, io_bytes(avals_in, avals_out))


all_reduce_cost(psum_p)
all_reduce_cost(pmax_p)
per_element_cost(all_gather_p, flops=0)

# custom_lin cannot run forwards (Part 8), so it has no cost to count either
_ = custom_lin_p.def_rule("cost")(forward_mode_error)


@xla_call_p.def_rule("cost")
def _xla_call_cost(ctx, avals_in, avals_out, *, jaxpr):
    return ctx.cost(jaxpr, ctx.inputs)


@scan_p.def_rule("cost")
def _scan_cost(ctx, avals_in, avals_out, *, jaxpr, num_consts, length, **params):
    changing = [UNKNOWN] * (len(avals_in) - num_consts)  # carry and rows
    return length * ctx.cost(jaxpr, ctx.inputs[:num_consts] + changing)


@cond_p.def_rule("cost")
def _cond_cost(ctx, avals_in, avals_out, *, true_jaxpr, false_jaxpr):
    pred, operands = ctx.known(0), ctx.inputs[1:]
    if pred is None:  # decided at run time: count the dearer branch
        return most(ctx.cost(true_jaxpr, operands), ctx.cost(false_jaxpr, operands))
    return ctx.cost(true_jaxpr if pred else false_jaxpr, operands)


@while_p.def_rule("cost")
def _while_cost(ctx, avals_in, avals_out, **params):
    cond_jaxpr, body_jaxpr = params["cond_jaxpr"], params["body_jaxpr"]
    cond_consts, body_consts, carry = _split(
        ctx.inputs, params["cond_nconsts"], params["body_nconsts"]
    )
    total = Cost()
    while True:  # run the loop, as much of it as the condition needs
        total += ctx.cost(cond_jaxpr, cond_consts + carry)
        if not known_condition(cond_jaxpr, cond_consts + carry, avals_in):
            return total
        total += ctx.cost(body_jaxpr, body_consts + carry)
        carry = values_on_demand(body_jaxpr, body_consts + carry)


# @title Cost rules: custom calls, pmap; helpers: most, running a loop's condition
def _custom_call_cost(ctx, avals_in, avals_out, *, call_jaxpr, **params):
    return ctx.cost(call_jaxpr, ctx.inputs)


custom_jvp_call_p.def_rule("cost")(_custom_call_cost)
custom_vjp_call_p.def_rule("cost")(_custom_call_cost)


@pmap_p.def_rule("cost")
def _pmap_cost(ctx, avals_in, avals_out, *, jaxpr, axis_name, axis_size):
    # every device runs the body on its own row: counted at types, n times
    rows = [UNKNOWN] * len(avals_in)
    return axis_size * ctx.cost(jaxpr, rows, {axis_name: axis_size})


def most(a: Cost, b: Cost) -> Cost:
    """The larger of two costs, key by key."""
    return Cost(*(max(x, y) for x, y in zip(astuple(a), astuple(b))))


class UnknownTripCountError(ValueError):
    """cost_analysis met a while_loop whose trip count depends on values it
    does not know (arguments given as ShapedArrays)."""


def values_on_demand(jaxpr: Jaxpr, inputs: list[Callable]) -> list[Callable]:
    """The outputs of ``jaxpr``, each computed when first asked for."""
    known = KnownValues(jaxpr, inputs)
    return [functools.partial(known, out) for out in jaxpr.outs]


def known_condition(cond_jaxpr: Jaxpr, inputs: list[Callable], avals: list) -> bool:
    """The loop condition's value on this trip; an error if it is unknown."""
    (pred,) = values_on_demand(cond_jaxpr, inputs)
    if pred() is not None:
        return bool(pred())
    raise UnknownTripCountError(
        "cost_analysis: cannot count a while_loop whose trip count depends on "
        "values known only by their types (the loop's inputs are "
        f"{', '.join(a.str_short() for a in avals)}): pass arrays instead of "
        "ShapedArrays for the arguments the condition depends on, or write the "
        "loop as fori_loop with Python int bounds or as scan, whose trip count "
        "is in the program"
    )


debug_print_p = Primitive("debug_print", multiple_results=True)


def debug_print(fmt: str, *args: Any, ordered: bool = False, **kwargs: Any) -> None:
    """Print ``fmt.format(*args, **kwargs)`` with the values the program
    computes, also under jit, vmap and differentiation."""
    check_format(fmt, args, kwargs)
    leaves, tree = tree_flatten((args, kwargs))
    leaves = [_as_input(x, "debug.print") for x in leaves]
    bind(debug_print_p, *leaves, fmt=fmt, tree=tree, batch_dims=0)


def print_formatted(fmt: str, tree: PyTreeDef, leaves: list, batch_dims: int) -> None:
    """One line per example: ``batch_dims`` leading axes are vmap's."""
    leaves = [np.asarray(x) for x in leaves]
    for index in np.ndindex(*(leaves[0].shape[:batch_dims] if leaves else ())):
        args, kwargs = tree_unflatten(tree, [x[index] for x in leaves])
        print(fmt.format(*args, **kwargs))


@debug_print_p.def_rule("impl")
def _debug_print_impl(*leaves, fmt, tree, batch_dims):
    print_formatted(fmt, tree, leaves, batch_dims)
    return []


@debug_print_p.def_rule("abstract_eval")
def _debug_print_abstract_eval(*avals, **params):
    return []


@debug_print_p.def_rule("jvp")
def _debug_print_jvp(primals, tangents, **params):
    bind(debug_print_p, *primals, **params)
    return [], []


@debug_print_p.def_rule("vmap")
def _debug_print_vmap(axis, vals, dims, *, fmt, tree, batch_dims):
    # this axis joins the leading ones as the last (it varies fastest, as in JAX)
    vals = [move_batch_axis(axis.size, d, batch_dims, x) for x, d in zip(vals, dims)]
    bind(debug_print_p, *vals, fmt=fmt, tree=tree, batch_dims=batch_dims + 1)
    return [], []


@debug_print_p.def_rule("lower")
def _debug_print_lower(ctx, avals_in, avals_out, *leaves, fmt, tree, batch_dims):
    def callback(*arrays):  # called by the compiled program, on the host
        print_formatted(fmt, tree, arrays, batch_dims)
        return ()

    check_one_replica(ctx)
    HOST_CALLBACKS.append(callback)
    index = ir.IntegerAttr.get(ir.IntegerType.get_unsigned(64), len(HOST_CALLBACKS) - 1)
    hlo.CustomCallOp(
        [],
        list(leaves),
        call_target_name="xla_ffi_python_cpu_callback",
        has_side_effect=True,
        backend_config=ir.DictAttr.get({"index": index}),
        api_version=ir.IntegerAttr.get(ir.IntegerType.get_signless(32), 4),  # typed FFI
    )
    return []


# @title The debug namespace; a cost rule; checks: the format, no pmap
@debug_print_p.def_rule("cost")
def _debug_print_cost(ctx, avals_in, avals_out, **params):
    return Cost()  # a host callback does no arithmetic XLA counts


# No transpose rule: the jvp rule prints primals only, and a print of tangents
# (in a custom_jvp rule, say) leaves no equation in a linear jaxpr, since no
# output depends on it; so, like sin, it is "not linear" in the rule table.
NOT_LINEAR.update({"debug_print"})


debug = types.ModuleType(
    "autodidax.debug", "Printing from transformed and compiled code."
)
debug.print = debug_print
if __name__ != "__main__":  # in the module: `from autodidax import debug`
    sys.modules[f"{__name__}.debug"] = debug


class DebugPrintInPmapError(TypeError):
    """debug.print inside pmap, whose programs this book compiles without
    host callbacks."""


def check_one_replica(ctx: LoweringContext) -> None:
    if ctx.replicas is not None:
        raise DebugPrintInPmapError(
            "debug.print inside pmap: this book compiles pmap's program for "
            f"{ctx.replicas} replicas without host callbacks, so it cannot print; "
            "print under vmap (same values, one line per example) or outside pmap"
        )


class DebugPrintFormatError(ValueError, LookupError):
    """A debug.print format that does not fit its arguments (a LookupError as
    well, like the IndexError or KeyError that JAX raises)."""


class _Probe:
    """Stands for an argument while the format is tried; records its use."""

    def __init__(self) -> None:
        self.used = False

    def __format__(self, spec: str) -> str:
        self.used = True
        return ""

    def __getattr__(self, name: str) -> _Probe:
        self.used = True
        return self

    def __getitem__(self, key: Any) -> _Probe:
        self.used = True
        return self


def check_format(fmt: Any, args: tuple, kwargs: dict) -> None:
    if not isinstance(fmt, str):
        raise TypeError(
            f"debug.print: the format must be a str, got {_short_repr(fmt)}"
        )
    probes = [_Probe() for _ in args]
    given = f"{len(args)} positional argument(s) and keywords {sorted(kwargs)}"
    try:
        fmt.format(*probes, **{k: _Probe() for k in kwargs})
    except IndexError:
        raise DebugPrintFormatError(
            f"debug.print: the format {fmt!r} asks for more positional arguments "
            f"than it was given ({given})"
        ) from None
    except KeyError as e:
        raise DebugPrintFormatError(
            f"debug.print: the format {fmt!r} asks for {e} but it was given {given}"
        ) from None
    except ValueError as e:
        raise DebugPrintFormatError(f"debug.print: bad format {fmt!r}: {e}") from None
    unused = [i for i, p in enumerate(probes) if not p.used]
    if unused:
        raise DebugPrintFormatError(
            f"debug.print: the format {fmt!r} does not use the positional "
            f"argument(s) at position {unused} ({given})"
        )


# ==== chapter: random ====


# @title numpy_shift: logical shifts, 0 past the bit width, as in XLA; wrappers
def numpy_shift(shift: Callable) -> Callable:
    def shifted(x, y):
        x, y = np.asarray(x), np.asarray(y)
        unsigned = np.dtype(f"uint{8 * x.dtype.itemsize}")
        ux, uy = x.view(unsigned), y.view(unsigned)  # a negative shift is huge
        width = 8 * x.dtype.itemsize
        out = np.where(uy < width, shift(ux, np.minimum(uy, width - 1)), 0)
        return np.asarray(out, unsigned).view(x.dtype)

    return shifted


def _integer_kinds(prim: Primitive) -> tuple[str, str]:
    if "shift" in prim.name or prim.name == "rem":
        return "iu", "an integer"
    return "biu", "an integer or boolean"


def _integer_abstract_eval(prim: Primitive) -> None:
    @prim.def_rule("abstract_eval")
    def rule(x, y):
        check_binary_operands(prim.name, x, y)
        _check_aval_kind(prim.name, x, *_integer_kinds(prim))
        return [ShapedArray(x.shape, x.dtype)]


def _bind_integer(prim: Primitive, x: ArrayLike, y: ArrayLike) -> ArrayLike:
    x, y = _binary_operands(prim.name, x, y)
    _check_kind(prim.name, x, *_integer_kinds(prim))
    return bind(prim, x, y)


def bitwise_xor(x: ArrayLike, y: ArrayLike) -> ArrayLike:
    """Elementwise exclusive or of integer (or boolean) arrays."""
    return _bind_integer(xor_p, x, y)


def bitwise_or(x: ArrayLike, y: ArrayLike) -> ArrayLike:
    """Elementwise or of integer (or boolean) arrays."""
    return _bind_integer(or_p, x, y)


def bitwise_and(x: ArrayLike, y: ArrayLike) -> ArrayLike:
    """Elementwise and of integer (or boolean) arrays."""
    return _bind_integer(and_p, x, y)


def shift_left(x: ArrayLike, y: ArrayLike) -> ArrayLike:
    """``x << y`` elementwise; a shift by the bit width or more gives 0."""
    return _bind_integer(shift_left_p, x, y)


def shift_right_logical(x: ArrayLike, y: ArrayLike) -> ArrayLike:
    """``x >> y`` elementwise, filling with zeros (also for signed integers)."""
    return _bind_integer(shift_right_logical_p, x, y)


def rem(x: ArrayLike, y: ArrayLike) -> ArrayLike:
    """The remainder of integer division, with the sign of ``x`` (C's ``%``)."""
    return _bind_integer(rem_p, x, y)


xor_p = Primitive("xor")
or_p = Primitive("or")
and_p = Primitive("and")
shift_left_p = Primitive("shift_left")
shift_right_logical_p = Primitive("shift_right_logical")
rem_p = Primitive("rem")
BIT_OPS = {
    xor_p: (np.bitwise_xor, hlo.xor),
    or_p: (np.bitwise_or, hlo.or_),
    and_p: (np.bitwise_and, hlo.and_),
    shift_left_p: (numpy_shift(np.left_shift), hlo.shift_left),
    shift_right_logical_p: (numpy_shift(np.right_shift), hlo.shift_right_logical),
    rem_p: (np.fmod, hlo.remainder),  # the sign of x, as C's % and XLA's rem
}
for _prim, (_np_fn, _hlo_fn) in BIT_OPS.items():
    NOT_LINEAR.add(_prim.name)
    _impl_from_numpy(_prim, _np_fn)
    _comparison_jvp(_prim)  # integers out: a zero tangent
    _binary_vmap(_prim)
    _integer_abstract_eval(_prim)
    _lower_with(_prim, _hlo_fn)
    per_element_cost(_prim)  # one operation per element, as XLA counts

bitcast_convert_type_p = Primitive("bitcast_convert_type")
iota_p = Primitive("iota")
NOT_LINEAR.update(["bitcast_convert_type", "iota"])


def bitcast_convert_type(x: ArrayLike, new_dtype: Any) -> ArrayLike:
    """The bits of ``x`` read as ``new_dtype`` of the same width."""
    new_dtype = check_array_dtype("bitcast_convert_type", new_dtype)
    check_same_width(get_aval(x, "bitcast_convert_type"), new_dtype)
    return bind(bitcast_convert_type_p, x, new_dtype=new_dtype)


def iota(dtype: Any, size: int) -> ArrayLike:
    """0, 1, ..., size - 1, computed where the program runs."""
    dtype = check_array_dtype("iota", dtype)
    return bind(iota_p, dtype=dtype, shape=(check_size("iota", size),), dimension=0)


# @title The rules of bitcast_convert_type and iota; their checks
@bitcast_convert_type_p.def_rule("impl")
def _bitcast_convert_type_impl(x, *, new_dtype):
    return [np.asarray(x).view(new_dtype)]


@bitcast_convert_type_p.def_rule("abstract_eval")
def _bitcast_convert_type_abstract_eval(x, *, new_dtype):
    check_same_width(x, new_dtype)
    return [ShapedArray(x.shape, new_dtype)]


@bitcast_convert_type_p.def_rule("jvp")
def _bitcast_convert_type_jvp(primals, tangents, *, new_dtype):
    out = bitcast_convert_type(primals[0], new_dtype)
    return [out], [zeros_like(out)]


@bitcast_convert_type_p.def_rule("lower")
def _bitcast_convert_type_lower(ctx, avals_in, avals_out, x, *, new_dtype):
    return [hlo.bitcast_convert(ir_type(avals_out[0]), x)]


_elementwise_vmap_with_params(bitcast_convert_type_p)
per_element_cost(bitcast_convert_type_p)  # XLA counts one flop per element


def check_same_width(x: ShapedArray, new_dtype: np.dtype) -> None:
    if x.dtype.itemsize != new_dtype.itemsize or np.bool_ in (x.dtype, new_dtype):
        raise TypeError(
            f"bitcast_convert_type: cannot read the bits of {x.str_short()} as "
            f"{new_dtype.name}: the widths differ"
        )


def check_size(name: str, size: Any) -> int:
    if not _is_axis(size) or size < 0:
        raise TypeError(f"{name}: size must be a non-negative integer, got {size!r}")
    return int(size)


@iota_p.def_rule("impl")
def _iota_impl(*, dtype, shape, dimension):
    line = np.arange(shape[dimension], dtype=dtype)
    line = line.reshape(-1, *[1] * (len(shape) - dimension - 1))
    return [np.broadcast_to(line, shape)]


@iota_p.def_rule("abstract_eval")
def _iota_abstract_eval(*, dtype, shape, dimension):
    return [ShapedArray(shape, dtype)]


@iota_p.def_rule("jvp")
def _iota_jvp(primals, tangents, **params):
    out = bind(iota_p, **params)
    return [out], [zeros_like(out)]


@iota_p.def_rule("vmap")
def _iota_vmap(axis, vals, dims, **params):  # no operands: never batched
    return [bind(iota_p, **params)], [None]


@iota_p.def_rule("lower")
def _iota_lower(ctx, avals_in, avals_out, *, dtype, shape, dimension):
    return [hlo.iota(ir_type(avals_out[0]), dimension)]


per_element_cost(iota_p, flops=0)  # it writes its output, as XLA counts


def rotate_left(x: ArrayLike, r: int) -> ArrayLike:
    return bitwise_or(shift_left(x, r), shift_right_logical(x, 32 - r))


def threefry2x32(key1, key2, x1, x2):
    """Hash the counter words x1, x2 under the key words key1, key2
    (uint32 arrays of one shape)."""
    rotations = [(13, 15, 26, 6), (17, 29, 16, 24)]
    ks = [key1, key2, bitwise_xor(bitwise_xor(key1, key2), 0x1BD11BDA)]
    x1, x2 = add(x1, ks[0]), add(x2, ks[1])
    for block in range(5):
        for r in rotations[block % 2]:
            x1 = add(x1, x2)
            x2 = bitwise_xor(x1, rotate_left(x2, r))
        x1 = add(x1, ks[(block + 1) % 3])
        x2 = add(add(x2, ks[(block + 2) % 3]), block + 1)
    return x1, x2


def hash_counters(key, shape):
    """Threefry of the counters 0, 1, 2, ... laid out in ``shape``: two
    uint32 arrays of that shape."""
    counter_lo = reshape(iota(np.uint32, math.prod(shape)), shape)
    counter_hi = full_of(ShapedArray(shape, np.uint32), 0)
    key1, key2 = (broadcast_to(k, shape) for k in (key[0], key[1]))
    return threefry2x32(key1, key2, counter_hi, counter_lo)


# @title The module autodidax.random; checks of keys, shapes, seeds and dtypes
import functools
import math
import sys
import types

from jaxlib.mlir.dialects import chlo

random_namespace = types.ModuleType("autodidax.random", "Random numbers from keys.")
random = random_namespace  # for `from autodidax import random`
if __name__ != "__main__":  # in the module: `import autodidax.random as random`
    sys.modules[f"{__name__}.random"] = random_namespace


for _fn in [bitwise_xor, bitwise_or, bitwise_and, shift_left, shift_right_logical]:
    setattr(lax_namespace, _fn.__name__, _fn)  # JAX's lax names
for _fn in [rem, bitcast_convert_type, iota]:
    setattr(lax_namespace, _fn.__name__, _fn)


def random_function(fn: Callable) -> Callable:
    """Decorator: put ``random_<name>`` into the namespace as ``<name>``."""
    setattr(random_namespace, fn.__name__.removeprefix("random_"), fn)
    return fn


def check_key(name, key):
    aval = get_aval(_as_input(key, name))
    if aval.dtype != np.uint32:
        raise TypeError(
            f"{name}: a key is a uint32 array of shape (2,) (from random.PRNGKey "
            f"or random.split), got {aval.str_short()}"
        )
    if aval.shape != (2,):
        batched = aval.ndim > 1 and aval.shape[-1] == 2
        hint = " (a batch of keys? use vmap)" if batched else ""
        raise (ValueError if batched else TypeError)(  # as JAX
            f"{name}: a key is a uint32 array of shape (2,), got "
            f"{aval.str_short()}{hint}"
        )


def check_shape_arg(name, shape, what="shape"):
    dims = (shape,) if _is_axis(shape) else shape
    if not isinstance(dims, (tuple, list)) or not all(_is_axis(d) for d in dims):
        raise TypeError(
            f"{name}: {what} must be a tuple of non-negative integers, got {shape!r}"
        )
    if any(d < 0 for d in dims):
        raise ValueError(f"{name}: {what} {tuple(dims)} has a negative dimension")
    if math.prod(dims) >= 2**32:
        raise ValueError(f"{name}: {what} {tuple(dims)} has 2**32 elements or more")
    return tuple(int(d) for d in dims)


def check_key_and_shape(name, key, shape):
    check_key(name, key)
    return check_shape_arg(name, shape, "num" if name == "split" else "shape")


def check_seed(seed):
    if type(seed) is int:
        if not -(2**63) <= seed < 2**64:
            raise ValueError(f"PRNGKey: the seed {seed} does not fit in 64 bits")
        return np.asarray(seed, np.uint64 if seed >= 2**63 else np.int64)
    aval = get_aval(_as_input(seed, "PRNGKey"))
    if aval.shape != () or aval.dtype.kind not in "iu":
        raise TypeError(
            f"PRNGKey: the seed must be an integer scalar, got {aval.str_short()}"
            " (for a batch of seeds, use vmap)"
        )
    return seed


def check_key_and_data(key, data):
    """The key checked; ``data`` as a uint32 scalar."""
    check_key("fold_in", key)
    if type(data) is int:
        if not 0 <= data < 2**32:
            raise ValueError(f"fold_in: data {data} does not fit in uint32")
        return np.uint32(data)
    aval = get_aval(_as_input(data, "fold_in"))
    if aval.shape != () or aval.dtype.kind not in "iu":
        raise TypeError(
            f"fold_in: data must be an integer scalar, got {aval.str_short()}"
        )
    return convert_element_type(data, np.uint32)


def check_bits_dtype(dtype):
    dtype = check_array_dtype("bits", dtype)
    if dtype.kind != "u":
        raise ValueError(
            f"bits: dtype must be an unsigned integer dtype, got {dtype.name}"
        )
    return dtype


def check_float_dtype(name, dtype):
    dtype = check_array_dtype(name, dtype)
    if dtype.kind != "f":
        raise ValueError(f"{name}: dtype must be a float dtype, got {dtype.name}")
    return dtype


def bounds_like(name, shape, dtype, *bounds):
    """Each bound as an array of ``dtype`` with as many axes as ``shape``
    (leading axes of size 1), checked to broadcast to ``shape``."""
    out = []
    for bound in bounds:
        if _is_python_scalar(bound):
            bound = np.asarray(bound, dtype)
        bound = convert_element_type(_as_input(bound, name), dtype)
        b_shape = get_aval(bound).shape
        try:
            fits = np.broadcast_shapes(b_shape, shape) == shape
        except ValueError:
            fits = False
        if len(b_shape) > len(shape) or not fits:
            raise ValueError(
                f"{name}: minval and maxval must broadcast to shape {shape}, got "
                f"one of shape {b_shape}"
            )
        out.append(reshape(bound, (1,) * (len(shape) - len(b_shape)) + b_shape))
    return out


@functools.cache
def compiled(core, *static):
    """``core`` with its static arguments, as one jitted function."""
    return jit(functools.partial(core, *static))


@random_function
def random_PRNGKey(seed):
    """A key, uint32[2], from an integer seed: its high and low 32 bits."""
    seed = check_seed(seed)
    high = convert_element_type(shift_right_logical(seed, 32), np.uint32)
    return numpy_stack([high, convert_element_type(seed, np.uint32)])


random.key = random_PRNGKey  # JAX's key(seed) differs: see the end


@random_function
def random_split(key, num=2):
    """``num`` new keys (a number or a shape): uint32[*num, 2]."""
    bits1, bits2 = hash_counters(key, check_key_and_shape("split", key, num))
    return numpy_stack([bits1, bits2], axis=-1)


@random_function
def random_fold_in(key, data):
    """A new key from a key and an integer."""
    data = check_key_and_data(key, data)
    bits1, bits2 = threefry2x32(key[0], key[1], np.uint32(0), data)
    return numpy_stack([bits1, bits2])


@random_function
def random_bits(key, shape=(), dtype=np.uint64):
    """Random unsigned integers of ``dtype`` in ``shape``."""
    shape, dtype = check_key_and_shape("bits", key, shape), check_bits_dtype(dtype)
    bits1, bits2 = hash_counters(key, shape)
    if dtype.itemsize == 8:  # the two words side by side
        high = shift_left(convert_element_type(bits1, dtype), 32)
        return bitwise_or(high, convert_element_type(bits2, dtype))
    return convert_element_type(bitwise_xor(bits1, bits2), dtype)


@random_function
def random_uniform(key, shape=(), dtype=np.float64, minval=0.0, maxval=1.0):
    """Floats in [minval, maxval)."""
    shape = check_key_and_shape("uniform", key, shape)
    dtype = check_float_dtype("uniform", dtype)
    minval, maxval = bounds_like("uniform", shape, dtype, minval, maxval)
    return compiled(uniform_core, shape, dtype)(key, minval, maxval)


def uniform_core(shape, dtype, key, minval, maxval):
    nbits, nmant = np.finfo(dtype).bits, np.finfo(dtype).nmant
    uint = np.dtype(f"uint{nbits}")
    mantissa = shift_right_logical(random_bits(key, shape, uint), nbits - nmant)
    one = int(np.array(1.0, dtype).view(uint))  # the bits of 1.0
    floats = bitcast_convert_type(bitwise_or(mantissa, one), dtype)  # [1, 2)
    floats = numpy_subtract(floats, 1.0)
    scaled = numpy_add(numpy_multiply(floats, numpy_subtract(maxval, minval)), minval)
    return numpy_maximum(minval, scaled)


@random_function
def random_normal(key, shape=(), dtype=np.float64):
    """Standard normal floats."""
    shape = check_key_and_shape("normal", key, shape)
    dtype = check_float_dtype("normal", dtype)
    return compiled(normal_core, shape, dtype)(key)


def normal_core(shape, dtype, key):
    lo = np.nextafter(np.array(-1.0, dtype), np.array(0.0, dtype))  # > -1
    u = uniform_core(shape, dtype, key, *bounds_like("normal", shape, dtype, lo, 1.0))
    return numpy_multiply(np.array(np.sqrt(2), dtype), erf_inv(u))


@random_function
def random_bernoulli(key, p=0.5, shape=None):
    """Booleans, True with probability ``p``."""
    p = check_probability(p)
    shape = check_key_and_shape("bernoulli", key, p.shape if shape is None else shape)
    (p,) = bounds_like("bernoulli", shape, p.dtype, p)
    return compiled(bernoulli_core, shape)(key, p)


def bernoulli_core(shape, key, p):
    bounds = bounds_like("bernoulli", shape, get_aval(p).dtype, 0.0, 1.0)
    return numpy_less(uniform_core(shape, get_aval(p).dtype, key, *bounds), p)


@random_function
def random_categorical(key, logits, axis=-1, shape=None):
    """Indices along ``axis``, drawn with probabilities softmax(logits)."""
    logits, axis, shape = check_categorical(key, logits, axis, shape)
    return compiled(categorical_core, shape, axis)(key, logits)


def categorical_core(shape, axis, key, logits):
    aval = get_aval(logits)
    prefix = shape[: len(shape) - (aval.ndim - 1)]  # samples per distribution
    noise_shape, tiny = (*prefix, *aval.shape), np.finfo(aval.dtype).tiny
    bounds = bounds_like("categorical", noise_shape, aval.dtype, tiny, 1.0)
    gumbel = neg(log(neg(log(uniform_core(noise_shape, aval.dtype, key, *bounds)))))
    logits = reshape(logits, (1,) * len(prefix) + aval.shape)
    return numpy_argmax(numpy_add(gumbel, logits), axis=len(prefix) + axis)


# @title The primitive erf_inv (evaluated by XLA), randint, and the checks
erf_inv_p = Primitive("erf_inv")
NOT_LINEAR.add("erf_inv")


def erf_inv(x: ArrayLike) -> ArrayLike:
    """The inverse of the error function, elementwise, for floats in (-1, 1)."""
    _check_kind("erf_inv", x, "f", "a float")
    return bind(erf_inv_p, x)


@erf_inv_p.def_rule("jvp")
def _erf_inv_jvp(primals, tangents):
    (x,), (dx,) = primals, tangents
    out = erf_inv(x)  # d/dx erfinv(x) = sqrt(pi)/2 * exp(erfinv(x)^2)
    return [out], [mul(dx, mul(exp(mul(out, out)), math.sqrt(math.pi) / 2))]


@erf_inv_p.def_rule("impl")
def _erf_inv_impl(x):
    return [np.asarray(_erf_inv_on_xla(x))]  # XLA's polynomial, bit for bit


_erf_inv_on_xla = jit(lambda x: bind(erf_inv_p, x))
lax_namespace.erf_inv = erf_inv
_unary_abstract_eval(erf_inv_p, "f", "a float")
_unary_vmap(erf_inv_p)


@erf_inv_p.def_rule("lower")
def _erf_inv_lower(ctx, avals_in, avals_out, x):
    with_chlo(ir.Context.current)
    return [chlo.erf_inv(x)]


@erf_inv_p.def_rule("cost")
def _erf_inv_cost(ctx, avals_in, avals_out):
    n, (out,) = avals_out[0].size, avals_out  # XLA's expansion, counted by XLA
    flops = {4: 37, 8: 100}[out.dtype.itemsize]
    return Cost(flops * n, 2 * n, io_bytes(avals_in, avals_out))


@random_function
def random_randint(key, shape, minval, maxval, dtype=np.int64):
    """Integers in [minval, maxval)."""
    shape = check_key_and_shape("randint", key, shape)
    dtype = check_int_dtype(dtype)
    sampling = dtype if dtype.itemsize >= 4 else np.dtype(np.int32)  # less bias
    minval, maxval = integer_bounds(minval, maxval, dtype)
    out = compiled(randint_core, shape, sampling)(key, minval, maxval)
    return convert_element_type(out, dtype)


def randint_core(shape, dtype, key, minval, maxval):
    nbits = 8 * dtype.itemsize
    uint = np.dtype(f"uint{nbits}")
    top = min(np.iinfo(dtype).max, np.iinfo(get_aval(maxval).dtype).max)
    maxval_out_of_range = numpy_greater(maxval, top)
    minval, maxval = clip_to(minval, dtype), clip_to(maxval, dtype)
    minval, maxval = bounds_like("randint", shape, dtype, minval, maxval)
    (out_of_range,) = bounds_like("randint", shape, np.bool_, maxval_out_of_range)
    minval, maxval, out_of_range = [
        broadcast_to(v, shape) for v in (minval, maxval, out_of_range)
    ]
    keys = random_split(key)
    higher, lower = random_bits(keys[0], shape, uint), random_bits(keys[1], shape, uint)
    span = convert_element_type(numpy_subtract(maxval, minval), uint)
    span = numpy_where(numpy_less_equal(maxval, minval), np.ones((), uint), span)
    wider = bitwise_and(out_of_range, greater(maxval, minval))
    span = numpy_where(wider, numpy_add(span, 1), span)
    # (higher * 2**nbits + lower) % span, without overflow
    multiplier = rem(full_of(ShapedArray(shape, uint), 2 ** (nbits // 2)), span)
    multiplier = rem(mul(multiplier, multiplier), span)
    offset = add(mul(rem(higher, span), multiplier), rem(lower, span))
    return numpy_add(minval, convert_element_type(rem(offset, span), dtype))


def clip_to(v, dtype):
    """``v`` (an integer array) converted to ``dtype``, clipped, not wrapped."""
    own = np.iinfo(get_aval(v).dtype)
    lo, hi = max(np.iinfo(dtype).min, own.min), min(np.iinfo(dtype).max, own.max)
    return convert_element_type(numpy_clip(v, lo, hi), dtype)


def integer_bounds(minval, maxval, dtype):
    out = []
    for bound in (minval, maxval):
        if type(bound) is int:
            if not -(2**63) <= bound < 2**63:
                raise ValueError(f"randint: the bound {bound} does not fit in int64")
            bound = np.asarray(bound, np.int64)
        if get_aval(_as_input(bound, "randint")).dtype.kind not in "iu":
            bound = convert_element_type(bound, np.int64)
        out.append(bound)
    if dtype.itemsize < 4:  # sampled as int32, as in JAX
        info = np.iinfo(dtype)
        low, high = (clip_to(convert_element_type(b, np.int32), np.int32) for b in out)
        out = [
            numpy_clip(low, info.min, info.max),
            numpy_clip(high, info.min, info.max + 1),
        ]
    return out


def check_int_dtype(dtype):
    dtype = check_array_dtype("randint", dtype)
    if dtype.kind not in "iu":
        raise TypeError(f"randint: dtype must be an integer dtype, got {dtype.name}")
    return dtype


def check_probability(p):
    if _is_python_scalar(p):
        p = np.asarray(p, np.float64)
    dtype = get_aval(_as_input(p, "bernoulli")).dtype
    if dtype.kind != "f":
        raise TypeError(
            f"bernoulli: the probability p must be a float, got {dtype.name}"
        )
    return p


def check_categorical(key, logits, axis, shape):
    check_key("categorical", key)
    aval = get_aval(_as_input(logits, "categorical"))
    if aval.dtype.kind != "f" or aval.ndim == 0:
        raise TypeError(
            "categorical: logits must be floats with an axis of categories, "
            f"got {aval.str_short()}"
        )
    axis = _normalize_axes("categorical", axis, aval.ndim)[0]
    batch_shape = tuple(d for i, d in enumerate(aval.shape) if i != axis)
    shape = batch_shape if shape is None else check_shape_arg("categorical", shape)
    if shape[len(shape) - len(batch_shape) :] != batch_shape:
        raise ValueError(
            f"categorical: shape {shape} must end with the batch shape "
            f"{batch_shape} of logits {aval.str_short()} without axis {axis}"
        )
    return logits, axis, shape


@random_function
def random_permutation(key, x, axis=0, independent=False):
    """``x`` shuffled along ``axis`` (an int ``x``: a shuffled ``arange(x)``)."""
    x, axis = check_permutation(key, x, axis)
    if independent or get_aval(x).ndim == 1:
        return compiled(shuffle_core, axis)(key, x)
    order = compiled(shuffle_core, 0)(key, np.arange(get_aval(x).shape[axis]))
    return numpy_take(x, order, axis=axis)


def shuffle_core(axis, key, x):
    n = get_aval(x).size
    for _ in range(int(np.ceil(3 * np.log(max(1, n)) / np.log(2**32 - 1)))):
        key, subkey = random_split(key)
        sort_keys = random_bits(subkey, get_aval(x).shape, np.uint32)
        _, x = sort_key_val(sort_keys, x, axis)
    return x


# @title The primitive sort: sort_key_val, its rules and checks; permutation's checks
sort_p = Primitive("sort", multiple_results=True)
NOT_LINEAR.add("sort")


def sort_key_val(keys: ArrayLike, values: ArrayLike, dimension: int = -1):
    """``keys`` sorted (stably) along ``dimension``, and ``values`` moved alike."""
    keys, values = _as_input(keys, "sort_key_val"), _as_input(values, "sort_key_val")
    dimension = check_sort(get_aval(keys), get_aval(values), dimension)
    outs = bind(sort_p, keys, values, dimension=dimension, is_stable=True, num_keys=1)
    return tuple(outs)


@sort_p.def_rule("impl")
def _sort_impl(*operands, dimension, is_stable, num_keys):
    order = np.argsort(operands[0], axis=dimension, kind="stable")
    return [np.take_along_axis(np.asarray(x), order, dimension) for x in operands]


@sort_p.def_rule("abstract_eval")
def _sort_abstract_eval(*avals, dimension, is_stable, num_keys):
    check_sort(*avals[:2], dimension)
    return [ShapedArray(a.shape, a.dtype) for a in avals]


@sort_p.def_rule("jvp")
def _sort_jvp(primals, tangents, *, dimension, **params):
    shape = get_aval(primals[0]).shape
    positions = bind(iota_p, dtype=np.dtype(np.int64), shape=shape, dimension=dimension)
    *outs, order = bind(sort_p, *primals, positions, dimension=dimension, **params)
    moved = [numpy_take_along_axis(t, order, axis=dimension) for t in tangents]
    return outs, moved


@sort_p.def_rule("vmap")
def _sort_vmap(axis, vals, dims, *, dimension, **params):
    vals = [move_batch_axis(axis.size, d, 0, v) for v, d in zip(vals, dims)]
    outs = bind(sort_p, *vals, dimension=dimension + 1, **params)
    return outs, [0] * len(outs)


@sort_p.def_rule("lower")
def _sort_lower(ctx, avals_in, avals_out, *operands, dimension, is_stable, num_keys):
    i64 = ir.IntegerType.get_signless(64)
    sort = hlo.SortOp(
        [ir_type(a) for a in avals_out],
        list(operands),
        dimension=ir.IntegerAttr.get(i64, dimension),
        is_stable=ir.BoolAttr.get(is_stable),
    )
    scalars = [ir_type(ShapedArray((), a.dtype)) for a in avals_in]
    block = sort.comparator.blocks.append(*[t for t in scalars for _ in (0, 1)])
    kind = "SIGNED" if avals_in[0].dtype.kind == "i" else "UNSIGNED"
    with ir.InsertionPoint(block):
        less_than = hlo.compare(
            block.arguments[0],
            block.arguments[1],
            hlo.ComparisonDirectionAttr.get("LT"),
            compare_type=hlo.ComparisonTypeAttr.get(kind),
        )
        hlo.ReturnOp([less_than])
    return list(sort.results)


@sort_p.def_rule("cost")
def _sort_cost(ctx, avals_in, avals_out, **params):
    n = avals_in[0].size  # XLA counts n * ceil(log2 n) comparisons
    flops = n * math.ceil(math.log2(n)) if n > 1 else 0
    return Cost(flops, 0, io_bytes(avals_in, avals_out))


def check_sort(keys: ShapedArray, values: ShapedArray, dimension: Any) -> int:
    if keys.dtype.kind not in "biu":
        raise TypeError(
            f"sort_key_val: keys must be integers or booleans (this book's sort "
            f"compares no floats), got {keys.str_short()}"
        )
    if keys.shape != values.shape:
        raise TypeError(
            f"sort_key_val: keys {keys.str_short()} and values "
            f"{values.str_short()} must have one shape"
        )
    return _normalize_axes("sort_key_val", dimension, keys.ndim)[0]


def check_permutation(key, x, axis):
    check_key("permutation", key)
    if type(x) is int or (get_aval(_as_input(x, "permutation")).ndim == 0):
        if get_aval(x).dtype.kind not in "iu":
            raise TypeError(
                "permutation: x must be an integer or an array of at least one "
                f"axis, got {get_aval(x).str_short()}"
            )
        return np.arange(int(x)), 0
    return x, _normalize_axes("permutation", axis, get_aval(x).ndim)[0]


lax_namespace.sort_key_val = sort_key_val

# ==== chapter: part10_stackless ====

# Cells tagged 'export-stackless': the body of _stackless_namespace(),
# whose names make up the module autodidax.stackless; this module's own
# names stay as they were (build_tools/tangle.py explains).
import sys
import types


def _stackless_namespace() -> dict:
    """The names defined by the cells tagged export-stackless."""
    import functools
    import threading
    from contextlib import contextmanager

    import numpy as np

    import autodidax as ad  # the main module: Parts 1-9, with the stack

    class Trace:
        """An interpreter. ``parent``: the trace that was current when it began."""

        def __init__(self, parent: Trace | None) -> None:
            self.parent, self.finished = parent, False

        def owns(self, x) -> bool:
            return isinstance(x, Tracer) and x._trace is self

    class Tracer:
        """A value that a transformation is looking at; ``_trace`` is its tag."""

        _trace: Trace

    class EvalTrace(Trace):
        def process_primitive(self, prim, args, params):
            refuse_tracers(args)  # a tracer here reached the wrong trace (folded)
            return prim.rule("impl")(*args, **params)

    eval_trace = EvalTrace(parent=None)  # the bottom of every chain of parents

    class _Context(threading.local):  # each thread has its own current trace
        def __init__(self) -> None:
            self.trace: Trace = eval_trace

    _context = _Context()

    def current_trace() -> Trace:
        return _context.trace

    @contextmanager
    def set_current_trace(trace: Trace):
        previous, _context.trace = _context.trace, trace
        try:
            yield trace
        finally:
            _context.trace = previous

    @contextmanager
    def transformation(trace: Trace):
        """Run a transformation with ``trace`` current; its tracers die with it."""
        with set_current_trace(trace):
            try:
                yield trace
            finally:
                trace.finished = True

    def bind(prim: ad.Primitive, *args, **params):
        args = checked_args(prim, args, params)  # arrays or live tracers, well typed
        trace = current_trace()
        with set_current_trace(eval_trace):  # the trace says where its work goes
            outs = trace.process_primitive(prim, args, params)
        return outs if prim.multiple_results else outs[0]

    # @title Checks: well-typed arrays or live tracers; eval trace refuses tracers
    UnexpectedTracerError = ad.UnexpectedTracerError
    ConcretizationError = ad.ConcretizationError

    def get_aval(x) -> ad.ShapedArray:
        return x.aval if isinstance(x, Tracer) else ad.get_aval(x)

    def zeros_like(x) -> np.ndarray:
        aval = get_aval(x)
        return np.zeros(aval.shape, aval.dtype)

    def refuse_tracers(args) -> None:
        for x in args:
            if isinstance(x, Tracer):
                raise UnexpectedTracerError(
                    f"the evaluation trace was given a {type(x).__name__} of type "
                    f"{x.aval.str_short()}: its transformation is not current here "
                    "(it runs in another thread, or a trace ran a rule without "
                    "making its parent current)"
                )

    def check_live(x) -> None:
        if isinstance(x, Tracer) and x._trace.finished:
            raise UnexpectedTracerError(
                f"a {type(x).__name__} of type {x.aval.str_short()} was used after "
                f"its transformation ({type(x._trace).__name__}) had finished: a "
                "traced value escaped, for example into a global or a list. "
                "Return values from the transformed function instead."
            )

    def checked_args(prim, args, params) -> list:
        args = [x if isinstance(x, Tracer) else ad.as_array(x, prim.name) for x in args]
        for x in args:
            check_live(x)
        prim.rule("abstract_eval")(*[get_aval(x) for x in args], **params)
        return args

    def add(x, y):
        return bind(ad.add_p, *_operands(x, y))

    def mul(x, y):
        return bind(ad.mul_p, *_operands(x, y))

    def neg(x):
        return bind(ad.neg_p, x)

    def sin(x):
        return bind(ad.sin_p, x)

    def cos(x):
        return bind(ad.cos_p, x)

    # @title More wrappers (greater, less, reduce_sum, ...); Python numbers
    def greater(x, y):
        return bind(ad.gt_p, *_operands(x, y))

    def less(x, y):
        return bind(ad.lt_p, *_operands(x, y))

    def reduce_sum(x, axis=None):
        ndim = get_aval(x).ndim
        axis = tuple(range(ndim)) if axis is None else axis
        return bind(
            ad.reduce_sum_p, x, axes=ad._normalize_axes("reduce_sum", axis, ndim)
        )

    def transpose(x, perm):
        perm, aval = tuple(int(p) for p in perm), get_aval(x)
        if sorted(perm) != list(range(aval.ndim)):
            raise ValueError(
                f"transpose: perm {perm} is not a permutation of the axes of "
                f"{aval.str_short()}"
            )
        return bind(ad.transpose_p, x, perm=perm)

    def broadcast(x, shape, axes):
        shape, axes = tuple(int(d) for d in shape), tuple(sorted(int(a) for a in axes))
        return bind(ad.broadcast_p, x, shape=shape, axes=axes)

    def _is_number(x) -> bool:
        return type(x) in (bool, int, float)

    def _like(c, other):
        """The Python number ``c`` as an array shaped like ``other``."""
        aval = get_aval(other)
        const = np.asarray(c, aval.dtype)
        if aval.ndim == 0:
            return const
        return broadcast(const, aval.shape, tuple(range(aval.ndim)))

    def _operands(x, y):
        if _is_number(x) and _is_number(y):
            dtype = np.result_type(type(x), type(y))
            return np.asarray(x, dtype), np.asarray(y, dtype)
        return (_like(x, y) if _is_number(x) else x), (
            _like(y, x) if _is_number(y) else y
        )

    # @title Tracers: Python's operators and shapes; no bool() or NumPy array
    def _subtract(x, y):
        return add(x, -y if _is_number(y) else neg(y))

    def _tracer_bool(self) -> bool:
        check_live(self)
        raise ConcretizationError(
            f"the truth value of a traced {self.aval.str_short()} value is not known "
            "while tracing, so Python `if`/`while`/`bool()` cannot use it"
        )

    def _tracer_array(self, dtype=None, copy=None):
        raise TypeError(
            f"a {type(self).__name__} cannot be turned into a NumPy array; use the "
            "stackless core's operations (add, mul, sin, ...) on traced values"
        )

    Tracer.__add__ = lambda self, other: add(self, other)
    Tracer.__radd__ = lambda self, other: add(other, self)
    Tracer.__mul__ = lambda self, other: mul(self, other)
    Tracer.__rmul__ = lambda self, other: mul(other, self)
    Tracer.__sub__ = lambda self, other: _subtract(self, other)
    Tracer.__rsub__ = lambda self, other: _subtract(other, self)
    Tracer.__neg__ = lambda self: neg(self)
    Tracer.__gt__ = lambda self, other: greater(self, other)
    Tracer.__lt__ = lambda self, other: less(self, other)
    Tracer.__bool__ = _tracer_bool
    Tracer.__array__ = _tracer_array
    Tracer.__array_ufunc__ = None  # `np.ones(3) * tracer` asks the tracer
    Tracer.shape = property(lambda self: self.aval.shape)
    Tracer.dtype = property(lambda self: self.aval.dtype)
    Tracer.ndim = property(lambda self: self.aval.ndim)
    Tracer.__repr__ = lambda self: f"{type(self).__name__}<{self.aval.str_short()}>"

    class JVPTracer(Tracer):
        def __init__(self, trace, primal, tangent) -> None:
            self._trace, self.primal, self.tangent = trace, primal, tangent

        @property
        def aval(self) -> ad.ShapedArray:
            return get_aval(self.primal)

    class JVPTrace(Trace):
        def primal_tangent(self, x):
            return (x.primal, x.tangent) if self.owns(x) else (x, zeros_like(x))

        def process_primitive(self, prim, args, params):
            if not any(self.owns(x) for x in args):  # all constants to us
                return self.parent.process_primitive(prim, args, params)
            primals, tangents = zip(*map(self.primal_tangent, args))
            with set_current_trace(self.parent):
                primals_out, tangents_out = jvp_rules[prim](primals, tangents, **params)
            return [JVPTracer(self, p, t) for p, t in zip(primals_out, tangents_out)]

    def jvp_flat(f, primals, tangents):
        trace = JVPTrace(parent=current_trace())
        with transformation(trace):
            outs = f(*[JVPTracer(trace, p, t) for p, t in zip(primals, tangents)])
        pairs = [trace.primal_tangent(out) for out in outs]
        return [p for p, _ in pairs], [t for _, t in pairs]

    jvp_rules = {}

    def _linear_jvp(primals, tangents, *, prim, **params):
        return [bind(prim, *primals, **params)], [bind(prim, *tangents, **params)]

    for _prim in [ad.add_p, ad.neg_p, ad.reduce_sum_p, ad.transpose_p, ad.broadcast_p]:
        jvp_rules[_prim] = functools.partial(_linear_jvp, prim=_prim)

    def _mul_jvp(primals, tangents):
        (x, y), (dx, dy) = primals, tangents
        return [mul(x, y)], [add(mul(dx, y), mul(x, dy))]

    jvp_rules[ad.mul_p] = _mul_jvp
    jvp_rules[ad.sin_p] = lambda p, t: ([sin(p[0])], [mul(t[0], cos(p[0]))])
    jvp_rules[ad.cos_p] = lambda p, t: ([cos(p[0])], [neg(mul(t[0], sin(p[0])))])

    def _comparison_jvp(primals, tangents, *, prim):
        out = bind(prim, *primals)
        return [out], [zeros_like(out)]  # booleans do not vary

    for _prim in [ad.gt_p, ad.lt_p]:
        jvp_rules[_prim] = functools.partial(_comparison_jvp, prim=_prim)

    # @title jvp: pytrees in and out; checks: tangents must match primals
    def jvp(f, primals: tuple, tangents: tuple):
        primals_flat, in_tree = ad.tree_flatten(tuple(primals))
        tangents_flat, tangent_tree = ad.tree_flatten(tuple(tangents))
        _check_tangents(in_tree, tangent_tree, primals_flat, tangents_flat)
        flat_f = ad.flatten_fun(f, in_tree)
        primals_out, tangents_out = jvp_flat(flat_f, primals_flat, tangents_flat)
        out_tree = flat_f.out_tree
        return (
            ad.tree_unflatten(out_tree, primals_out),
            ad.tree_unflatten(out_tree, tangents_out),
        )

    def _check_tangents(in_tree, tangent_tree, primals, tangents) -> None:
        if in_tree != tangent_tree:
            raise TypeError(
                "jvp: primals and tangents must have the same structure, got "
                f"{in_tree} and {tangent_tree}"
            )
        for i, (p, t) in enumerate(zip(primals, tangents)):
            p_aval, t_aval = get_aval(p), get_aval(t)
            if (p_aval.shape, p_aval.dtype) != (t_aval.shape, t_aval.dtype):
                raise ValueError(
                    f"jvp: tangent {i} is {t_aval.str_short()} but its primal is "
                    f"{p_aval.str_short()}; each tangent must match its primal"
                )

    class BatchTracer(Tracer):
        def __init__(self, trace, val, batch_axis: int) -> None:
            self._trace, self.val, self.batch_axis = trace, val, batch_axis

        @property
        def aval(self) -> ad.ShapedArray:  # the aval of one example
            shape = list(get_aval(self.val).shape)
            del shape[self.batch_axis]
            return ad.ShapedArray(shape, get_aval(self.val).dtype)

    class BatchTrace(Trace):
        def __init__(self, parent, axis_size: int) -> None:
            super().__init__(parent)
            self.axis_size = axis_size

        def val_axis(self, x):
            return (x.val, x.batch_axis) if self.owns(x) else (x, None)

        def process_primitive(self, prim, args, params):
            if not any(self.owns(x) for x in args):  # nothing batched
                return self.parent.process_primitive(prim, args, params)
            vals, dims = zip(*map(self.val_axis, args))  # dims: the batch axes
            with set_current_trace(self.parent):
                outs, dims_out = vmap_rules[prim](self.axis_size, vals, dims, **params)
            return [BatchTracer(self, x, d) for x, d in zip(outs, dims_out)]

    def vmap_flat(f, axis_size, in_axes, args):
        trace = BatchTrace(current_trace(), axis_size)
        tracers = [
            x if a is None else BatchTracer(trace, x, a) for x, a in zip(args, in_axes)
        ]
        with transformation(trace):
            outs = f(*tracers)
        return [
            move_batch_axis(axis_size, a, 0, x) for x, a in map(trace.val_axis, outs)
        ]

    # @title Batching rules and move_batch_axis as in Part 1; vmap and in_axes
    def move_batch_axis(axis_size, src, dst, x):
        if src == dst:
            return x
        if src is None:
            shape = list(get_aval(x).shape)
            shape.insert(dst, axis_size)
            return broadcast(x, shape, (dst,))
        perm = list(range(get_aval(x).ndim))
        perm.remove(src)
        perm.insert(dst, src)
        return transpose(x, perm)

    vmap_rules = {}

    def _unary_vmap(axis_size, vals, dims, *, prim):
        return [bind(prim, vals[0])], [dims[0]]

    def _binary_vmap(axis_size, vals, dims, *, prim):
        (x, y), (dx, dy) = vals, dims
        out = dy if dx is None else dx
        x, y = (
            move_batch_axis(axis_size, dx, out, x),
            move_batch_axis(axis_size, dy, out, y),
        )
        return [bind(prim, x, y)], [out]

    for _prim in [ad.neg_p, ad.sin_p, ad.cos_p]:
        vmap_rules[_prim] = functools.partial(_unary_vmap, prim=_prim)
    for _prim in [ad.add_p, ad.mul_p, ad.gt_p, ad.lt_p]:
        vmap_rules[_prim] = functools.partial(_binary_vmap, prim=_prim)

    def _reduce_sum_vmap(axis_size, vals, dims, *, axes):
        (x,), (b,) = vals, dims
        full = tuple(a if a < b else a + 1 for a in axes)
        return [bind(ad.reduce_sum_p, x, axes=full)], [b - sum(a < b for a in axes)]

    def _transpose_vmap(axis_size, vals, dims, *, perm):
        x = move_batch_axis(axis_size, dims[0], 0, vals[0])
        return [bind(ad.transpose_p, x, perm=(0, *(p + 1 for p in perm)))], [0]

    def _broadcast_vmap(axis_size, vals, dims, *, shape, axes):
        x = move_batch_axis(axis_size, dims[0], 0, vals[0])
        new_axes = tuple(a + 1 for a in axes)
        return [bind(ad.broadcast_p, x, shape=(axis_size, *shape), axes=new_axes)], [0]

    vmap_rules[ad.reduce_sum_p] = _reduce_sum_vmap
    vmap_rules[ad.transpose_p] = _transpose_vmap
    vmap_rules[ad.broadcast_p] = _broadcast_vmap

    def vmap(f, in_axes=0):
        """Batch ``f`` over ``in_axes`` (an int, None, or one entry per argument,
        each an int, None or a pytree of those); every output gets axis 0."""

        def batched_f(*args):
            args_flat, in_tree = ad.tree_flatten(args)
            spec = tuple(in_axes) if isinstance(in_axes, list) else in_axes
            _check_in_axes(spec, args)
            axes = ad._broadcast_prefix(spec, args, "")
            axes, size = _checked_batch_axes(args_flat, axes)
            flat_f = ad.flatten_fun(f, in_tree)
            outs = vmap_flat(flat_f, size, axes, args_flat)
            return ad.tree_unflatten(flat_f.out_tree, outs)

        return batched_f

    def _check_in_axes(spec, args) -> None:
        if isinstance(spec, tuple) and len(spec) != len(args):
            raise ValueError(
                f"vmap: in_axes has {len(spec)} entries but the function was called "
                f"with {len(args)} positional arguments"
            )

    def _checked_batch_axes(args_flat, axes):
        """Axes made non-negative and checked; the one batch size they agree on."""
        out, sizes = [], set()
        for i, (x, a) in enumerate(zip(args_flat, axes)):
            if a is None:
                out.append(None)
                continue
            aval = get_aval(x)
            if not -aval.ndim <= a < aval.ndim:
                raise ValueError(
                    f"vmap: in_axes {a} is out of range for argument {i} of type "
                    f"{aval.str_short()}"
                )
            out.append(a % aval.ndim)
            sizes.add(aval.shape[a])
        if len(sizes) != 1:
            raise ValueError(
                "vmap: the batched arguments must have one batch size, got "
                f"{sorted(sizes) or 'no batched argument'}"
            )
        return out, sizes.pop()

    def _batch_tracer_bool(self) -> bool:
        check_live(self)
        raise ad._batched_bool_error()

    def _jvp_tracer_bool(self) -> bool:  # Python control flow reads the primal
        check_live(self)
        return bool(self.primal)

    BatchTracer.__bool__ = _batch_tracer_bool
    JVPTracer.__bool__ = _jvp_tracer_bool

    class StagingTracer(Tracer):
        def __init__(self, trace, aval) -> None:
            self._trace, self.aval, self.var = trace, aval, ad.Var(aval)

    class StagingTrace(Trace):
        def __init__(self, parent) -> None:
            super().__init__(parent)
            self.eqns, self.consts = [], {}  # consts: id(value) -> (Var, value)

        def atom(self, x):
            if self.owns(x):
                return x.var
            if isinstance(x, (np.ndarray, np.generic)) and x.shape == ():
                return ad.Lit(x)
            if id(x) not in self.consts:  # a constant, or another trace's tracer
                self.consts[id(x)] = (ad.Var(get_aval(x)), x)
            return self.consts[id(x)][0]

        def process_primitive(self, prim, args, params):
            avals = prim.rule("abstract_eval")(*[get_aval(x) for x in args], **params)
            outs = [StagingTracer(self, aval) for aval in avals]
            ins = [self.atom(x) for x in args]
            self.eqns.append(ad.JaxprEqn(prim, ins, params, [t.var for t in outs]))
            return outs

        def to_jaxpr(self, tracers_in, outs):
            """The jaxpr recorded and its constants (its first inputs)."""
            out_atoms = [self.atom(x) for x in outs]
            const_vars, consts = zip(*self.consts.values()) if self.consts else ((), ())
            jaxpr = ad.Jaxpr(
                [*const_vars, *(t.var for t in tracers_in)], self.eqns, out_atoms
            )
            ad.typecheck_jaxpr(jaxpr)
            self.finished = True
            return jaxpr, list(consts)

    def make_jaxpr_flat(f, avals):
        trace = StagingTrace(current_trace())
        tracers_in = [StagingTracer(trace, aval) for aval in avals]
        with transformation(trace):
            outs = f(*tracers_in)
        return trace.to_jaxpr(tracers_in, outs)

    # @title make_jaxpr(f, *avals) -> (jaxpr, consts, out_tree), with pytrees
    def make_jaxpr(f, *avals_in):
        """Trace ``f`` at the types ``avals_in`` (arrays stand for their types)."""
        leaves, in_tree = ad.tree_flatten(avals_in)
        avals = [x if isinstance(x, ad.ShapedArray) else get_aval(x) for x in leaves]
        flat_f = ad.flatten_fun(f, in_tree)
        jaxpr, consts = make_jaxpr_flat(flat_f, avals)
        return jaxpr, consts, flat_f.out_tree

    def _staging_tracer_bool(self) -> bool:
        check_live(self)
        raise ConcretizationError(
            f"Python `if`, `while` or bool() on a traced {self.aval.str_short()} "
            "value: while a function is staged out (make_jaxpr, jit) only its type "
            "is known, not its value"
        )

    StagingTracer.__bool__ = _staging_tracer_bool

    def eval_jaxpr(jaxpr: ad.Jaxpr, args) -> list:
        env = dict(zip(jaxpr.in_binders, args))

        def read(atom):
            return atom.val if isinstance(atom, ad.Lit) else env[atom]

        for eqn in jaxpr.eqns:
            outs = bind(eqn.primitive, *map(read, eqn.inputs), **eqn.params)
            env.update(
                zip(eqn.out_binders, outs if eqn.primitive.multiple_results else [outs])
            )
        return [read(x) for x in jaxpr.outs]

    def jaxpr_as_fun(jaxpr: ad.Jaxpr):
        return lambda *args: eval_jaxpr(jaxpr, args)

    def jit(f):
        cache = {}

        def f_jitted(*args):
            args_flat, in_tree = ad.tree_flatten(args)
            key = (in_tree, tuple(get_aval(x) for x in args_flat))
            if key not in cache:
                traced = make_jaxpr(f, *ad.tree_unflatten(in_tree, key[1]))
                if any(isinstance(c, Tracer) for c in traced[1]):
                    return _call(*traced, args_flat)  # used once, not cached
                cache[key] = traced
            return _call(*cache[key], args_flat)

        return f_jitted

    def _call(jaxpr, consts, out_tree, args_flat):
        outs = bind(ad.xla_call_p, *consts, *args_flat, jaxpr=jaxpr)
        return ad.tree_unflatten(out_tree, outs)

    # @title xla_call's JVP and batching rules: transform the jaxpr, call the result

    @functools.cache
    def jvp_jaxpr(jaxpr):
        n, types = len(jaxpr.in_binders), [v.aval for v in jaxpr.in_binders]

        def primals_and_tangents(*args):
            return sum(jvp_flat(jaxpr_as_fun(jaxpr), args[:n], args[n:]), [])

        return make_jaxpr_flat(primals_and_tangents, types + types)

    def _xla_call_jvp(primals, tangents, *, jaxpr):
        new_jaxpr, consts = jvp_jaxpr(jaxpr)
        outs = bind(ad.xla_call_p, *consts, *primals, *tangents, jaxpr=new_jaxpr)
        return outs[: len(outs) // 2], outs[len(outs) // 2 :]

    jvp_rules[ad.xla_call_p] = _xla_call_jvp

    @functools.cache
    def vmap_jaxpr(jaxpr, axis_size, batched):
        types = [
            ad.ShapedArray((axis_size, *v.aval.shape), v.aval.dtype) if b else v.aval
            for v, b in zip(jaxpr.in_binders, batched)
        ]
        in_axes = [0 if b else None for b in batched]

        def batched_fun(*args):
            return vmap_flat(jaxpr_as_fun(jaxpr), axis_size, in_axes, args)

        return make_jaxpr_flat(batched_fun, types)

    def _xla_call_vmap(axis_size, vals, dims, *, jaxpr):
        vals = [
            v if d is None else move_batch_axis(axis_size, d, 0, v)
            for v, d in zip(vals, dims)
        ]
        new_jaxpr, consts = vmap_jaxpr(
            jaxpr, axis_size, tuple(d is not None for d in dims)
        )
        outs = bind(ad.xla_call_p, *consts, *vals, jaxpr=new_jaxpr)
        return outs, [0] * len(outs)

    vmap_rules[ad.xla_call_p] = _xla_call_vmap

    class PartialTrace(Trace):
        """Record the operations on tangents; pass all others to the parent."""

        def __init__(self, parent) -> None:
            super().__init__(parent)
            self.tangents = StagingTrace(parent)

        def process_primitive(self, prim, args, params):
            if not any(self.tangents.owns(x) for x in args):
                return self.parent.process_primitive(prim, args, params)
            if prim in partial_eval_rules:  # a jitted call: split its jaxpr (folded)
                return partial_eval_rules[prim](self, args, params)
            return self.tangents.process_primitive(prim, args, params)

    def linearize_flat(f, primals):
        """The primal outputs, and the linear map as a jaxpr with its residuals."""
        trace = PartialTrace(current_trace())
        tangents_in = [StagingTracer(trace.tangents, get_aval(p)) for p in primals]
        with transformation(trace):
            primals_out, tangents_out = jvp_flat(f, primals, tangents_in)
        linear, residuals = trace.tangents.to_jaxpr(tangents_in, tangents_out)
        return primals_out, linear, residuals

    def vjp_flat(f, primals):
        primals_out, linear, residuals = linearize_flat(f, primals)
        undefined = (False,) * len(residuals) + (True,) * len(primals)  # linear inputs
        transposed, consts = ad.transpose_jaxpr_uncached(linear, undefined)

        def f_vjp(*cotangents):
            return eval_jaxpr(transposed, [*consts, *residuals, *cotangents])

        return primals_out, f_vjp

    def grad(f):
        def gradient(x):
            (y,), f_vjp = vjp_flat(lambda x: [f(x)], [check_float_input(x)])
            check_scalar_float_output(y)
            return f_vjp(np.ones((), get_aval(y).dtype))[0]

        return gradient

    # @title xla_call under PartialTrace; linearize; checks: grad's input and output
    def _xla_call_partial_eval(trace, args, params):
        unknowns = tuple(trace.tangents.owns(x) for x in args)
        known, unknown, out_unknowns, num_res = ad.split_call_jaxpr(
            params["jaxpr"], unknowns
        )
        known_args = [x for x, u in zip(args, unknowns) if not u]
        outs = trace.parent.process_primitive(
            ad.xla_call_p, known_args, dict(jaxpr=known)
        )
        known_outs, residuals = outs[: len(outs) - num_res], outs[len(outs) - num_res :]
        unknown_args = [*residuals, *(x for x, u in zip(args, unknowns) if u)]
        unknown_outs = trace.tangents.process_primitive(
            ad.xla_call_p, unknown_args, dict(jaxpr=unknown)
        )
        known_it, unknown_it = iter(known_outs), iter(unknown_outs)
        return [next(unknown_it) if u else next(known_it) for u in out_unknowns]

    partial_eval_rules = {ad.xla_call_p: _xla_call_partial_eval}

    def linearize(f, *primals):
        """``(f(*primals), f_lin)``, as jax.linearize."""
        primals_flat, in_tree = ad.tree_flatten(primals)
        flat_f = ad.flatten_fun(f, in_tree)
        primals_out, linear, residuals = linearize_flat(flat_f, primals_flat)
        out_tree = flat_f.out_tree

        def f_lin(*tangents):
            tangents_flat, tangent_tree = ad.tree_flatten(tangents)
            _check_tangents(in_tree, tangent_tree, primals_flat, tangents_flat)
            outs = eval_jaxpr(linear, [*residuals, *tangents_flat])
            return ad.tree_unflatten(out_tree, outs)

        return ad.tree_unflatten(out_tree, primals_out), f_lin

    def check_float_input(x):
        x = x if isinstance(x, Tracer) else ad.as_array(x, "grad")
        if get_aval(x).dtype.kind != "f":
            raise TypeError(
                "grad: can only differentiate with respect to float inputs, got "
                f"dtype {get_aval(x).dtype.name}"
            )
        return x

    def check_scalar_float_output(y) -> None:
        aval = get_aval(y)
        if aval.shape != () or aval.dtype.kind != "f":
            raise TypeError(
                f"grad: f must return a float scalar (shape ()), got "
                f"{aval.str_short()}; use vjp or jacfwd for other outputs"
            )

    return locals()


stackless = types.ModuleType(f"{__name__}.stackless")
stackless.__dict__.update(_stackless_namespace())
if __name__ != "__main__":  # in the module: `from autodidax import stackless`
    sys.modules[stackless.__name__] = stackless

# ==== chapter: part11_checkpoint ====


def saved_residuals(f: Callable, *args: Any, **kwargs: Any) -> list[tuple]:
    """What ``vjp(f, *args)`` keeps for the backward pass: a list of
    (type, where it comes from), as JAX's ``saved_residuals``."""
    leaves, in_tree = tree_flatten((args, kwargs))
    leaves = [_as_input(x, "saved_residuals argument") for x in leaves]

    def residuals_of(*leaves):
        def f_flat(*leaves):
            a, k = tree_unflatten(in_tree, leaves)
            return tree_flatten(f(*a, **k))[0]

        return linearize_flat(f_flat, list(leaves))[2]  # the residuals

    jaxpr, consts, _ = make_jaxpr(residuals_of, *leaves)
    return describe_residuals(jaxpr, len(consts), argument_names(f, args, kwargs))


# @title describe_residuals: where each output of the jaxpr comes from
import math
import types


def describe_residuals(jaxpr: Jaxpr, num_consts: int, arg_names: list[str]):
    """(type, source) for each output of ``jaxpr``, in JAX's order: literals,
    constants, arguments, then equation outputs in program order."""
    made_by = {v: (i, e) for i, e in enumerate(jaxpr.eqns) for v in e.out_binders}
    consts, inputs = _split(jaxpr.in_binders, num_consts)
    found = []
    for x in jaxpr.outs:
        if isinstance(x, Lit):
            found.append(((0, 0), x.aval, "from a literal"))
        elif x in consts:
            found.append(((1, consts.index(x)), x.aval, "from a constant"))
        elif x in inputs:
            i = inputs.index(x)
            found.append(((2, i), x.aval, f"from the argument {arg_names[i]}"))
        else:
            i, eqn = made_by[x]
            what = f"output of {eqn.primitive.name}"
            if eqn.primitive.name == "name":  # checkpoint_name, below
                what = f"named '{eqn.params['name']}'"
            found.append(((3, i), x.aval, what))
    return [(aval, what) for _, aval, what in sorted(found, key=lambda f: f[0])]


def argument_names(f: Callable, args: tuple, kwargs: dict) -> list[str]:
    """A name for each leaf of (args, kwargs): the parameter's, with the
    leaf's position inside it when the argument is a pytree."""
    try:
        params = list(inspect.signature(f).parameters)
    except (TypeError, ValueError):
        params = []
    names = []
    for i, a in enumerate(args):
        base = params[i] if i < len(params) else f"args[{i}]"
        leaves, tree = tree_flatten(a)
        names += (
            [base] if tree == LEAF else [f"{base}[{j}]" for j in range(len(leaves))]
        )
    for k, v in kwargs.items():
        leaves, tree = tree_flatten(v)
        names += [k] if tree == LEAF else [f"{k}[{j}]" for j in range(len(leaves))]
    return names


def residual_bytes(residuals: list[tuple], arguments: bool = False) -> int:
    """The bytes of the residuals; those that are arguments only if asked
    (they are alive anyway)."""
    return sum(
        math.prod(aval.shape) * np.dtype(aval.dtype).itemsize
        for aval, where in residuals
        if arguments or not where.startswith("from the argument")
    )


checkpoint_p = Primitive("checkpoint", multiple_results=True)


def checkpoint(
    fun: Callable, *, prevent_cse: bool = True, policy=None, static_argnums=()
) -> Callable:
    """``fun``, whose reverse mode saves only its inputs (and what ``policy``
    allows) and computes the rest again in the backward pass."""
    static_argnums = check_checkpoint_args(fun, policy, static_argnums)
    policy = None if policy is None else Policy(policy)
    traces: dict = {}  # one jaxpr per signature, as for jit

    @functools.wraps(fun)
    def fun_remat(*args: Any, **kwargs: Any) -> Any:
        args = mark_static_args(args, static_argnums)
        args_flat, in_tree = tree_flatten((args, kwargs))
        args_flat = [_as_input(x, "checkpoint argument") for x in args_flat]
        jaxpr, consts, out_tree = trace_checkpointed(fun, traces, args_flat, in_tree)
        outs = bind(
            checkpoint_p, *consts, *args_flat, jaxpr=jaxpr,
            prevent_cse=prevent_cse, differentiated=False, policy=policy,
        )  # fmt: skip
        return tree_unflatten(out_tree, outs)

    return fun_remat


remat = checkpoint  # JAX's other name for it


# @title Tracing once per signature; static arguments; policies' names; checks
def trace_checkpointed(fun: Callable, traces: dict, args_flat: list, in_tree):
    """``fun``'s jaxpr, constants and output tree at these argument types."""
    avals = tuple(ShapedArray(x.shape, x.dtype) for x in args_flat)
    key = (in_tree, avals)
    if key in traces:
        return traces[key]

    def call(args, kwargs):
        return fun(*map(_unmark, args), **kwargs)

    traced = _trace_to_jaxpr(call, tree_unflatten(in_tree, avals), who="checkpoint")
    if not any(isinstance(c, Tracer) for c in traced[1]):  # closes over no tracer
        traces[key] = traced
    return traced


def mark_static_args(args: tuple, static_argnums: tuple) -> tuple:
    """``args`` with the static ones wrapped in ``Static`` (a pytree node with
    no leaves: its value is part of the signature, never traced)."""
    if not static_argnums:
        return args
    n = len(args)
    for i in static_argnums:
        if not -n <= i < n:
            raise ValueError(
                f"checkpoint: static_argnums {i} is out of range: the function "
                f"was called with {n} positional argument(s)"
            )
    nums = {i % n for i in static_argnums}
    return tuple(
        _static(x, f"argument {i}") if i in nums else x for i, x in enumerate(args)
    )


class Policy:
    """A policy function, named by its ``__name__`` in printed jaxprs."""

    def __init__(self, fn: Callable) -> None:
        self.fn = fn.fn if isinstance(fn, Policy) else fn

    def __call__(self, prim: Primitive, *avals: ShapedArray, **params: Any) -> bool:
        return bool(self.fn(prim, *avals, **params))

    def __repr__(self) -> str:
        return getattr(self.fn, "__name__", None) or repr(self.fn)

    def __eq__(self, other: Any) -> bool:
        return isinstance(other, Policy) and other.fn == self.fn

    def __hash__(self) -> int:
        return hash(self.fn)


def check_checkpoint_args(fun: Any, policy: Any, static_argnums: Any) -> tuple:
    if not callable(fun):
        raise TypeError(
            f"checkpoint: fun must be a function, got {type(fun).__name__} "
            f"{_short_repr(fun)}"
        )
    if policy is not None and not callable(policy):
        hint = ""
        if isinstance(policy, str) and policy in _POLICY_NAMES:
            hint = f"; did you mean checkpoint_policies.{policy}?"
        raise TypeError(
            "checkpoint: policy must be None or a function "
            "policy(prim, *avals, **params) -> bool, such as "
            f"checkpoint_policies.dots_saveable; got {type(policy).__name__} "
            f"{_short_repr(policy)}{hint}"
        )
    nums = static_argnums
    nums = tuple(nums) if isinstance(nums, (tuple, list)) else (nums,)
    if not all(_is_axis(i) for i in nums):
        raise TypeError(
            "checkpoint: static_argnums must be an int or a tuple of ints, got "
            f"{static_argnums!r}"
        )
    return tuple(int(i) for i in nums)


_POLICY_NAMES = (
    "everything_saveable nothing_saveable dots_saveable "
    "dots_with_no_batch_dims_saveable save_only_these_names"
).split()


# @title The rules of a call: impl, abstract eval, jvp, vmap, transpose, lower, cost
@checkpoint_p.def_rule("impl")
def _checkpoint_impl(*args, jaxpr, **params):
    return eval_jaxpr(jaxpr, args)


@checkpoint_p.def_rule("abstract_eval")
def _checkpoint_abstract_eval(*avals, jaxpr, **params):
    check_custom_call_types("checkpoint", jaxpr, avals)
    return jaxpr_type(jaxpr).out_types


@checkpoint_p.def_rule("jvp")
def _checkpoint_jvp(primals, tangents, *, jaxpr, **params):
    new_jaxpr, consts = jvp_jaxpr(jaxpr)
    outs = bind(checkpoint_p, *consts, *primals, *tangents, jaxpr=new_jaxpr, **params)
    n = len(outs) // 2
    return outs[:n], outs[n:]


@checkpoint_p.def_rule("vmap")
def _checkpoint_vmap(axis, vals, dims, *, jaxpr, **params):
    vals = [
        v if d is None else move_batch_axis(axis.size, d, 0, v)
        for v, d in zip(vals, dims)
    ]
    batched = tuple(d is not None for d in dims)
    new_jaxpr, consts = vmap_jaxpr(jaxpr, axis, batched)
    outs = bind(checkpoint_p, *consts, *vals, jaxpr=new_jaxpr, **params)
    return outs, [0] * len(outs)


@checkpoint_p.def_rule("transpose")
def _checkpoint_transpose(cts, *args, jaxpr, **params):
    undefined = tuple(_is_undef(x) for x in args)
    new_jaxpr, consts = transpose_jaxpr(jaxpr, undefined)
    defined = [x for x in args if not _is_undef(x)]
    cts = [
        zeros_like_aval(t) if ct is None else ct
        for ct, t in zip(cts, jaxpr_type(jaxpr).out_types)
    ]
    cts_in = iter(
        bind(checkpoint_p, *consts, *defined, *cts, jaxpr=new_jaxpr, **params)
    )
    return [next(cts_in) if u else None for u in undefined]


@checkpoint_p.def_rule("lower")
def _checkpoint_lower(ctx, avals_in, avals_out, *args, jaxpr, **params):
    args = list(args)
    if params["prevent_cse"] and params["differentiated"] and args:
        args = list(hlo.OptimizationBarrierOp(args).results)
    return _call_jaxpr(ctx, jaxpr, args)


@checkpoint_p.def_rule("cost")
def _checkpoint_cost(ctx, avals_in, avals_out, *, jaxpr, **params):
    return ctx.cost(jaxpr, ctx.inputs)


class RematSplit(NamedTuple):
    known: Jaxpr  # known inputs -> (known outputs, saved residuals)
    unknown: Jaxpr  # (saved residuals, the inputs it reads) -> unknown outputs
    out_unknowns: list[bool]
    num_res: int
    used_inputs: list[bool]  # the jaxpr's inputs that the unknown half reads


def partial_eval_jaxpr_policy(jaxpr: Jaxpr, in_unknowns, policy) -> RematSplit:
    unknown = {v for v, u in zip(jaxpr.in_binders, in_unknowns) if u}
    available = set(jaxpr.in_binders)  # in the unknown half without saving
    known_eqns, unknown_eqns, saved = [], [], {}

    def to_unknown_half(eqn: JaxprEqn) -> None:
        for x in eqn.inputs:
            if isinstance(x, Var) and x not in available and x not in unknown:
                saved[x] = None  # computed by the known half, saved for this one
        unknown_eqns.append(eqn)

    def to_known_half(eqn: JaxprEqn) -> None:
        known_eqns.append(eqn)
        avals = [x.aval for x in eqn.inputs]
        if policy is None or not policy(eqn.primitive, *avals, **eqn.params):
            to_unknown_half(eqn)  # not saveable: computed again
            available.update(eqn.out_binders)

    for eqn in jaxpr.eqns:
        unks = [isinstance(x, Var) and x in unknown for x in eqn.inputs]
        rule = eqn.primitive.rules.get("partial_eval_jaxpr")
        if not any(unks):
            to_known_half(eqn)
            continue
        if rule is not None:  # a jaxpr inside: split it by its own rule first
            eqn_known, eqn_unknown, _, _ = rule(unks, eqn)
            if eqn_known is not None:
                to_known_half(eqn_known)
            eqn = eqn_unknown
        to_unknown_half(eqn)
        unknown.update(eqn.out_binders)

    out_unknowns = [isinstance(x, Var) and x in unknown for x in jaxpr.outs]
    known_outs, unknown_outs = _split_by(out_unknowns, jaxpr.outs)
    saved = list(saved)
    unknown_half = Jaxpr(saved + jaxpr.in_binders, unknown_eqns, unknown_outs)
    unknown_half, used = dce_jaxpr(unknown_half, [True] * len(unknown_outs))
    used_saved, used_inputs = _split(used, len(saved))
    saved = _keep(used_saved, saved)
    known_in = [v for v, u in zip(jaxpr.in_binders, in_unknowns) if not u]
    known_half = Jaxpr(known_in, known_eqns, known_outs + saved)
    known_half, _ = dce_jaxpr(known_half, [True] * len(known_half.outs), True)
    return RematSplit(known_half, unknown_half, out_unknowns, len(saved), used_inputs)


def _keep(flags: Sequence[bool], xs: Sequence) -> list:
    return [x for x, f in zip(xs, flags) if f]


dce_rules: dict[Primitive, Callable] = {}  # the others: dce_whole
effectful_primitives: set[Primitive] = {debug_print_p}  # never removed


def dce_jaxpr(
    jaxpr: Jaxpr, used_outputs: Sequence[bool], instantiate: Any = False
) -> tuple[Jaxpr, list[bool]]:
    """``jaxpr`` without what its used outputs do not need, and which of its
    inputs it still reads (``instantiate``: inputs kept even if unread)."""
    needed = {x for x, u in zip(jaxpr.outs, used_outputs) if u and isinstance(x, Var)}
    kept = []
    for eqn in reversed(jaxpr.eqns):
        used_outs = [v in needed for v in eqn.out_binders]
        rule = dce_rules.get(eqn.primitive, dce_whole)
        used_ins, new_eqn = rule(used_outs, eqn)
        if new_eqn is not None:
            kept.append(new_eqn)
            needed.update(x for x, u in zip(eqn.inputs, used_ins) if u)
    if isinstance(instantiate, bool):
        instantiate = [instantiate] * len(jaxpr.in_binders)
    used_inputs = [v in needed or i for v, i in zip(jaxpr.in_binders, instantiate)]
    new_jaxpr = Jaxpr(
        _keep(used_inputs, jaxpr.in_binders),
        kept[::-1],
        _keep(used_outputs, jaxpr.outs),
    )
    return new_jaxpr, used_inputs


def dce_whole(used_outputs: list[bool], eqn: JaxprEqn):
    """Keep the equation whole if an output is used or it has effects."""
    if any(used_outputs) or has_effects(eqn):
        return [True] * len(eqn.inputs), eqn
    return [False] * len(eqn.inputs), None


def has_effects(eqn: JaxprEqn) -> bool:
    """Does the equation (or a jaxpr inside it) do more than compute outputs?"""
    inner = [p for p in eqn.params.values() if isinstance(p, Jaxpr)]
    return eqn.primitive in effectful_primitives or any(
        has_effects(e) for jaxpr in inner for e in jaxpr.eqns
    )


# @title The rules for primitives that carry jaxprs: calls, cond, scan, while
def _dce_call(used_outputs, eqn):
    """A call (xla_call, checkpoint): remove the dead code inside it."""
    if not any(used_outputs) and not has_effects(eqn):
        return [False] * len(eqn.inputs), None
    new_jaxpr, used_inputs = dce_jaxpr(eqn.params["jaxpr"], used_outputs)
    new_eqn = JaxprEqn(
        eqn.primitive,
        _keep(used_inputs, eqn.inputs),
        dict(eqn.params, jaxpr=new_jaxpr),
        _keep(used_outputs, eqn.out_binders),
    )
    return used_inputs, new_eqn


def _dce_cond(used_outputs, eqn):
    """Both branches keep the inputs either branch reads."""
    if not any(used_outputs) and not has_effects(eqn):
        return [False] * len(eqn.inputs), None
    branches = [eqn.params["true_jaxpr"], eqn.params["false_jaxpr"]]
    reads = [dce_jaxpr(b, used_outputs)[1] for b in branches]
    used = [a or b for a, b in zip(*reads)]
    new_t, new_f = [dce_jaxpr(b, used_outputs, instantiate=used)[0] for b in branches]
    pred, operands = eqn.inputs[0], eqn.inputs[1:]
    new_eqn = JaxprEqn(
        eqn.primitive,
        [pred, *_keep(used, operands)],
        dict(eqn.params, true_jaxpr=new_t, false_jaxpr=new_f),
        _keep(used_outputs, eqn.out_binders),
    )
    return [True, *used], new_eqn


def _used_carries(body: Jaxpr, used_carry: list, used_rest: list, num_before: int):
    """Fixed point: a carry is used if a used output needs it on a later trip."""
    while True:
        used_in = dce_jaxpr(body, used_carry + used_rest)[1]
        carry_in = used_in[num_before : num_before + len(used_carry)]
        new = [a or b for a, b in zip(used_carry, carry_in)]
        if new == used_carry:
            return used_carry
        used_carry = new


def _dce_scan(used_outputs, eqn):
    if not any(used_outputs) and not has_effects(eqn):
        return [False] * len(eqn.inputs), None
    p = eqn.params
    nc, ncar, body = p["num_consts"], p["num_carry"], p["jaxpr"]
    used_carry, used_ys = _split(used_outputs, ncar)
    used_carry = _used_carries(body, used_carry, used_ys, nc)
    num_xs = len(body.in_binders) - nc - ncar
    new_body, used_in = dce_jaxpr(
        body, used_carry + used_ys, [False] * nc + used_carry + [False] * num_xs
    )
    new_params = dict(
        p, jaxpr=new_body, num_consts=sum(used_in[:nc]), num_carry=sum(used_carry)
    )
    new_outs = _keep(used_carry + used_ys, eqn.out_binders)
    return used_in, JaxprEqn(
        eqn.primitive, _keep(used_in, eqn.inputs), new_params, new_outs
    )


def _dce_while(used_outputs, eqn):
    if not any(used_outputs) and not has_effects(eqn):
        return [False] * len(eqn.inputs), None
    p = eqn.params
    cn, bn = p["cond_nconsts"], p["body_nconsts"]
    cond_reads = dce_jaxpr(p["cond_jaxpr"], [True])[1][cn:]
    used_carry = [a or b for a, b in zip(used_outputs, cond_reads)]
    used_carry = _used_carries(p["body_jaxpr"], used_carry, [], bn)
    new_cond, cond_used = dce_jaxpr(p["cond_jaxpr"], [True], [False] * cn + used_carry)
    new_body, body_used = dce_jaxpr(
        p["body_jaxpr"], used_carry, [False] * bn + used_carry
    )
    used_in = cond_used[:cn] + body_used[:bn] + used_carry
    new_params = dict(
        p,
        cond_jaxpr=new_cond,
        body_jaxpr=new_body,
        cond_nconsts=sum(cond_used[:cn]),
        body_nconsts=sum(body_used[:bn]),
    )
    new_outs = _keep(used_carry, eqn.out_binders)
    return used_in, JaxprEqn(
        eqn.primitive, _keep(used_in, eqn.inputs), new_params, new_outs
    )


dce_rules[xla_call_p] = _dce_call
dce_rules[checkpoint_p] = _dce_call
dce_rules[cond_p] = _dce_cond
dce_rules[scan_p] = _dce_scan
dce_rules[while_p] = _dce_while
# A custom rule computes every output of its call: the call is kept whole.
dce_rules[custom_jvp_call_p] = dce_whole
dce_rules[custom_vjp_call_p] = dce_whole


@functools.cache
def split_checkpoint(jaxpr: Jaxpr, in_unknowns: tuple, policy) -> RematSplit:
    return partial_eval_jaxpr_policy(jaxpr, in_unknowns, policy)


@checkpoint_p.def_rule("partial_eval")
def _checkpoint_partial_eval(trace, tracers, *, jaxpr, policy, **params):
    in_unknowns = tuple(not t.pval.is_known for t in tracers)
    s = split_checkpoint(jaxpr, in_unknowns, policy)
    known_outs = eval_jaxpr(s.known, [t.pval.const for t in tracers if t.pval.is_known])
    known_outs, saved = _split(known_outs, len(known_outs) - s.num_res)
    saved = [trace.instantiate_const(trace.pure(r)) for r in saved]
    inputs = [trace.instantiate_const(t) for t in _keep(s.used_inputs, tracers)]
    staged = dict(params, jaxpr=s.unknown, policy=policy, differentiated=True)
    unknown_outs = iter(trace.stage(checkpoint_p, saved + inputs, staged))
    known_outs = iter(known_outs)
    return [
        next(unknown_outs) if u else trace.pure(next(known_outs))
        for u in s.out_unknowns
    ]


# @title The partial_eval_jaxpr rule: the same split, as two equations
@checkpoint_p.def_rule("partial_eval_jaxpr")
def _checkpoint_partial_eval_jaxpr(unks_in, eqn):
    params = eqn.params
    s = split_checkpoint(params["jaxpr"], tuple(unks_in), params["policy"])
    known_outs, unknown_outs = _split_by(s.out_unknowns, eqn.out_binders)
    saved = [Var(x.aval) for x in s.known.outs[len(known_outs) :]]
    known_ins = [x for x, u in zip(eqn.inputs, unks_in) if not u]
    eqn_known = JaxprEqn(
        checkpoint_p, known_ins, dict(params, jaxpr=s.known), known_outs + saved
    )
    inputs = _keep(s.used_inputs, eqn.inputs)
    staged = dict(params, jaxpr=s.unknown, differentiated=True)
    eqn_unknown = JaxprEqn(checkpoint_p, saved + inputs, staged, unknown_outs)
    known_inputs = [  # the outer split must keep these as residuals
        x
        for x, u in zip(inputs, _keep(s.used_inputs, unks_in))
        if not u and isinstance(x, Var)
    ]
    return eqn_known, eqn_unknown, s.out_unknowns, saved + known_inputs


def everything_saveable(prim: Primitive, *avals: ShapedArray, **params: Any) -> bool:
    return True  # the split of Part 4: a checkpoint that changes nothing


def nothing_saveable(prim: Primitive, *avals: ShapedArray, **params: Any) -> bool:
    return False  # save the inputs only (the default, policy=None)


def dots_saveable(prim: Primitive, *avals: ShapedArray, **params: Any) -> bool:
    return prim is dot_general_p  # save matrix products, recompute the rest


def dots_with_no_batch_dims_saveable(prim, *avals, **params) -> bool:
    if prim is not dot_general_p:
        return False
    _, (lhs_batch, rhs_batch) = params["dimension_numbers"]
    return not lhs_batch and not rhs_batch


class save_only_these_names:
    """Save the values tagged by ``checkpoint_name`` with one of these names."""

    def __init__(self, *names: str) -> None:
        self.names = frozenset(names)

    def __call__(self, prim: Primitive, *avals: ShapedArray, **params: Any) -> bool:
        return prim is name_p and params["name"] in self.names

    def __repr__(self) -> str:
        return f"save_only_these_names({', '.join(map(repr, sorted(self.names)))})"


checkpoint_policies = types.SimpleNamespace(
    everything_saveable=everything_saveable,
    nothing_saveable=nothing_saveable,
    dots_saveable=dots_saveable,
    dots_with_no_batch_dims_saveable=dots_with_no_batch_dims_saveable,
    save_only_these_names=save_only_these_names,
)

name_p = Primitive("name")


def checkpoint_name(x: Any, name: str) -> Any:
    """``x`` unchanged, tagged with ``name`` for ``save_only_these_names``."""
    check_checkpoint_name(x, name)
    return tree_map(lambda leaf: bind(name_p, leaf, name=name), x)


# @title The rules of name: the identity everywhere; the check of its arguments
def check_checkpoint_name(x: Any, name: Any) -> None:
    if not isinstance(name, str):
        raise TypeError(
            f"checkpoint_name: name must be a str, got {type(name).__name__} "
            f"{_short_repr(name)}"
        )
    for leaf in tree_flatten(x)[0]:
        _as_input(leaf, f"checkpoint_name {name!r}")


@name_p.def_rule("impl")
def _name_impl(x, *, name):
    return [x]


@name_p.def_rule("abstract_eval")
def _name_abstract_eval(x, *, name):
    return [ShapedArray(x.shape, x.dtype)]


@name_p.def_rule("jvp")
def _name_jvp(primals, tangents, *, name):
    return [bind(name_p, primals[0], name=name)], [tangents[0]]


@name_p.def_rule("vmap")
def _name_vmap(axis, vals, dims, *, name):
    return [bind(name_p, vals[0], name=name)], dims


@name_p.def_rule("lower")
def _name_lower(ctx, avals_in, avals_out, x, *, name):
    return [x]


free_cost(name_p)
NEVER_TRANSPOSED.add("name")  # linear, but its tangent is never named

# ==== chapter: part12_capstone ====

# ==== chapter: performance ====


def host_copiers(avals: Sequence[ShapedArray]) -> list[Callable[[Any], Any]]:
    """Per input aval: a function copying a host value of that type to the
    device, returning a jaxlib array."""
    from jaxlib import _jax

    rt = runtime()
    copy_now = _jax.HostBufferSemantics.IMMUTABLE_ONLY_DURING_CALL  # as device_put

    def copier(aval: ShapedArray) -> Callable[[Any], Any]:
        jax_aval = jax.core.ShapedArray(aval.shape, aval.dtype)  # built once
        # (aval, sharding, values, devices, committed, force_copy, semantics, x64)
        return lambda x: _jax.batched_device_put(
            jax_aval, rt.sharding, [x], [rt.device], True, False, copy_now, True
        )

    return [copier(aval) for aval in avals]


def result_handlers(jaxpr: Jaxpr) -> list[Any]:
    """Per output of ``jaxpr``: a jaxlib handler that makes the output's
    jaxlib array and wraps it in our ``Array``."""
    from jaxlib import _jax

    handlers = []
    for out in jaxpr.outs:
        jax_aval = jax.core.ShapedArray(out.aval.shape, out.aval.dtype)
        # _skip_checks skips JAX's Python check that the buffer's device, shape
        # and dtype match the sharding and aval (ArrayImpl._check_and_rearrange);
        # safe: this jaxpr's executable, on this one device, made the buffer.
        handler = _jax.array_result_handler(
            jax_aval, runtime().sharding, committed=True, _skip_checks=True
        )
        handlers.append(handler.wrap(Array))
    return handlers


# @title Checks: the keys of numbers, and which calls may have an entry
# The key of a number, by its type: the shape and dtype that np.asarray (the
# full path's conversion) gives it. Python's numbers, and NumPy's scalars of
# booleans, integers and floats of up to 64 bits.
NUMBER_TYPES = (bool, int, float, *(np.dtype(c).type for c in "?bhilqBHILQefd"))
SCALAR_KEYS = {kind: ((), np.asarray(kind()).dtype) for kind in NUMBER_TYPES}
INT64_MIN, INT64_MAX = int(np.iinfo(np.int64).min), int(np.iinfo(np.int64).max)


def stands_alone(jaxpr: Jaxpr, consts: list) -> bool:
    """Whether a call needs nothing but its arguments: no tracer among its
    constants, no collective over an axis an enclosing vmap binds (Part 9)."""
    closed = not any(isinstance(c, Tracer) for c in consts)
    return closed and not free_axis_names(jaxpr)


class FastCall:
    """What a call with a known signature needs, and nothing more."""

    def __init__(self, jaxpr: Jaxpr, consts: list[Array], out_tree: PyTreeDef):
        self.execute = compile_jaxpr(jaxpr).executable.execute_sharded
        self.const_buffers = [c._buffer for c in consts]
        inputs = jaxpr.in_binders[len(consts) :]
        self.copiers = host_copiers([v.aval for v in inputs])
        self.handlers = result_handlers(jaxpr)
        self.out_tree = out_tree

    def __call__(self, args: tuple) -> Any:
        buffers = list(self.const_buffers)
        for x, to_device in zip(args, self.copiers):
            buffers.append(x._buffer if type(x) is Array else to_device(x))
        outs = self.execute(buffers).consume_with_handlers(self.handlers)
        if self.out_tree is LEAF:
            return outs[0]
        return tree_unflatten(self.out_tree, outs)


def input_signature(args: tuple) -> tuple | None:
    """The (shape, dtype) of every argument, or None for the full path."""
    if _state.dynamic is not _state.stack[0]:
        return None  # make_jaxpr or an outer jit is recording: bind must see it
    signature = []
    for x in args:
        kind = type(x)
        if kind is Array:
            x = x._buffer  # the jaxlib array inside: its shape and dtype
        elif kind is not np.ndarray:
            key = SCALAR_KEYS.get(kind)
            if key is None:
                return None  # not a number (a Tracer, a list): the full path
            if kind is int and not INT64_MIN <= x <= INT64_MAX:
                return None  # NumPy makes it no int64: the full path
            signature.append(key)
            continue
        signature.append((x.shape, x.dtype))
    return tuple(signature)


full_path_jit = jit  # Part 3's jit, kept under this name before jit is replaced


def jit(f: Callable, static_argnums=(), static_argnames=()) -> Callable:
    """Compile ``f`` with XLA; trace once per input signature; repeated calls
    on arrays and numbers skip the interpreters (the fast path)."""
    traces: Traces = {}
    fast_calls: dict[tuple, FastCall] = {}  # new
    call_f = StaticArgs(f, static_argnums, static_argnames)

    @functools.wraps(f)
    def f_jitted(*args: Any, **kwargs: Any) -> Any:
        # new: the fast path, on a hit; flat positional arguments need no flattening
        flat = not kwargs and not call_f.static  # new
        signature = input_signature(args) if flat else None  # new
        fast_call = None if signature is None else fast_calls.get(signature)  # new
        if fast_call is not None:  # new
            return fast_call(args)  # new
        leaves, in_tree = tree_flatten(call_f.mark_static(args, kwargs))
        if signature is None:  # new: a pytree, keywords or static values
            leaf_signature = input_signature(leaves)  # new: None for the full path
            if leaf_signature is not None:  # new
                signature = (in_tree, leaf_signature)  # new
                fast_call = fast_calls.get(signature)  # new
                if fast_call is not None:  # new
                    return fast_call(leaves)  # new
        args_flat = [_as_input(x, "jit argument") for x in leaves]
        jaxpr, consts, out_tree = trace_for_call(call_f, traces, args_flat, in_tree)
        outs = bind(xla_call_p, *consts, *args_flat, jaxpr=jaxpr)
        if signature is not None and stands_alone(jaxpr, consts):  # new
            fast_calls[signature] = FastCall(jaxpr, consts, out_tree)  # new
        return tree_unflatten(out_tree, outs)

    f_jitted.traces = traces  # for the curious: what has been traced so far
    f_jitted.fast_calls = fast_calls  # new: which signatures take the fast path
    return f_jitted


# ==== chapter: rule_table ====

# ==== book support (generated by build_tools/tangle.py) ====


def load_chapters(namespace: dict, *, before: str) -> None:
    """Run the library code of the chapters before ``before`` in ``namespace``.

    A chapter notebook calls ``load_chapters(globals(), before="<its name>")``
    first. Tracebacks point into this file, at the right lines.
    """
    import re

    with open(__file__, encoding="utf-8") as source_file:
        lines = source_file.read().splitlines(keepends=True)
    marker = re.compile(r"# ==== chapter: (\S+) ====$")
    starts = {}
    for number, line in enumerate(lines):
        found = marker.match(line.rstrip("\n"))
        if found:
            starts[found.group(1)] = number
    if before not in starts:
        raise ValueError(
            f"load_chapters: no chapter {before!r} in {__file__}; "
            f"the chapters are {list(starts)}"
        )
    first, end = min(starts.values()), starts[before]
    # Pad with blank lines so line numbers in tracebacks match this file.
    code = "\n" * first + "".join(lines[first:end])
    namespace.setdefault("__name__", "__main__")
    exec(compile(code, __file__, "exec"), namespace)
