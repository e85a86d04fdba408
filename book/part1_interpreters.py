# ---
# jupyter:
#   jupytext:
#     default_lexer: ipython3
#     formats: ipynb,md:myst,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.6
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# (part1)=
# # Part 1: Transformations as interpreters
#
# JAX lets you write an ordinary numerical Python function and then ask for
# *another* function: its derivative (`jax.jvp`, `jax.grad`), a version that works
# on a whole batch at once (`jax.vmap`), or a compiled version (`jax.jit`). None of
# these look at your source code. They all work by **running your function with
# special arguments** that record, or reinterpret, every numerical operation it
# performs.
#
# This chapter builds that mechanism from nothing, in plain Python and NumPy:
#
# 1. a small vocabulary of **{term}`primitives <primitive>`** (`add`, `mul`, `sin`, ...) through which
#    every operation flows, via a single function `bind`;
# 2. an **{term}`interpreter stack <level>`**: one numbered level per running
#    transformation, each interpreted by a `Trace`, which hands `Tracer` objects
#    to your function, each tracer described by an
#    **{term}`abstract value <abstract value>`** (a shape and a dtype); and the rule
#    that decides which interpreter handles an operation;
# 3. three interpreters: plain evaluation, {term}`forward-mode <forward mode>` differentiation (`jvp`) and
#    automatic batching (`vmap`), plus `jacfwd`, which is just the two combined;
# 4. **{term}`pytrees <pytree>`**, so that transformed functions can take and return tuples, dicts
#    and your own containers.
#
# We build the machinery in the smallest form that can differentiate
# $-2\sin x + x$ and reach `jvp` as early as we can. After that, the machinery
# grows by extension: comparisons, three primitives that work on axes,
# Python numbers next to arrays, and pytrees. `vmap` comes last.
#
# By the end you will have a module that can compute derivatives of any order of
# Python functions that use `if` statements and loops, batch them (batching a
# data-dependent `if` needs Part 5's `cond`), and nest the two in any order. Later chapters put a compiler underneath the same machinery.
#
# :::{admonition} How to run this chapter
# :class: tip
# Everything below runs top to bottom in a fresh kernel, and every output on this
# page was produced by running it. Part 1's own code needs only NumPy; the
# folded first cell is the setup every chapter shares (in Colab it installs the
# pinned JAX and fetches the book's helpers, such as the drawing code of the
# figures and `show_error`). The code cells marked as *library code*
# are collected into the module `autodidax`, which the later chapters import.
# :::

# %% tags=["hide-input"]
# @title Setup: the pinned JAX, the module `autodidax`, the earlier chapters
from __future__ import annotations

try:
    import book_setup  # book/book_setup.py, next to this notebook
except ImportError:  # Colab opens a notebook on its own: fetch the helper first
    from urllib.request import urlretrieve

    urlretrieve(
        "https://raw.githubusercontent.com/autodidax-book/autodidax/main/book/"
        "book_setup.py",
        "book_setup.py",
    )
    import book_setup

book_setup.load_book(globals(), before="part1_interpreters")

# %% tags=["export", "hide-input"]
# @title Imports: NumPy and a few helpers from the standard library
from __future__ import annotations

import threading
from collections.abc import Callable, Hashable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

# %% [markdown]
# ## Primitives: the operations every interpreter understands
#
# A program we want to transform is, for our purposes, a sequence of calls to a
# fixed set of operations whose meaning we know. JAX calls them **primitives**.
# Everything else — Python functions, loops, classes, closures — is scaffolding
# that runs normally and that the transformations never see.
#
# A primitive here is just a named object that carries its *{term}`rules <rule>`*: one function
# per interpreter that says how that interpreter handles the primitive. We store
# the rules on the primitive itself, under a short key such as `"impl"` or `"jvp"`.
# This part writes three kinds (`impl`, `jvp` and `vmap`); later parts add
# theirs just by registering rules (two folded registries record every primitive
# and rule kind, for the book's rule table). An interpreter looks a rule up
# with `prim.rule(kind)`, which raises a clear error when the primitive has no
# such rule (in the folded cell after the class).

# %% tags=["export", "hide-input"]
# @title Registries the book's rule table reads: PRIMITIVES, RULE_KINDS
PRIMITIVES: dict[str, Primitive] = {}  # every primitive, by name
RULE_KINDS: list[str] = []  # every kind of rule, in the order first registered


# %% tags=["export"]
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


# %% tags=["export", "hide-input"]
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

# %% [markdown]
# We start with five primitives that work elementwise. Comparisons and three
# primitives that work on axes (summing over them, permuting them, inserting
# new ones) join them after `jvp` works, each with the same few lines.

# %% tags=["export"]
add_p = Primitive("add")
mul_p = Primitive("mul")
neg_p = Primitive("neg")
sin_p = Primitive("sin")
cos_p = Primitive("cos")


# %% [markdown]
# Users never touch these objects. They call small wrapper functions, and every
# wrapper ends in the same place: `bind(primitive, *inputs, **params)`. Inputs are
# the arrays the operation consumes; {term}`params` are static, hashable settings
# (the primitives that work on axes have some, such as which axes to sum over). Before
# calling `bind`, a wrapper checks its arguments, each with one call to a helper
# whose name says what it checks: that `sin` gets a float array, or that the two
# operands of `add` can be combined, which `_binary_operands` returns as arrays of
# one shape and dtype. It also lets a Python number stand next to an array, as in
# `mul(x, 2.0)`; we come back to that {ref}`after jvp <part1-python-numbers>`.


# %% tags=["export"]
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


# %% tags=["export", "hide-input"]
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


# %% [markdown]
# (part1-stack)=
# ## The interpreter stack
#
# Now the central idea. A transformation like `jvp` needs to run the user's
# function in a different way: each time the function multiplies two numbers,
# `jvp` must multiply them *and* work out how that product changes. It achieves
# this by handing the function **{term}`tracers <tracer>`** instead of arrays. A tracer stands in
# for an array, and the primitives route every operation that touches a tracer to
# the **{term}`trace`** (the interpreter) that owns it.
#
# Transformations nest: `jvp(vmap(f))` differentiates a batched function, and
# `vmap(jvp(f))` batches a derivative. So at any moment there is a **stack** of
# active interpreters, and it grows upward. Each entry is a `Level` with a
# number: the evaluation interpreter sits at the bottom, level 0, permanently;
# every transformation that starts pushes a new level on top, with the next
# number, while it runs the user's function, and pops it afterwards. The top of
# the stack is always the innermost transformation, the one entered last.


# %% tags=["export"]
class Level:
    """One entry on the interpreter stack; ``payload`` is the transformation's
    own data, such as a batch size."""

    def __init__(self, number: int, trace_type: type[Trace], payload: Any) -> None:
        self.number, self.trace_type, self.payload = number, trace_type, payload


# %% tags=["export", "hide-input"]
# @title How a level prints: Level(1, JVPTrace)
Level.__repr__ = lambda self: f"Level({self.number}, {self.trace_type.__name__})"


# %% [markdown]
# A `Trace` is the interpreter for one level. It is a lightweight object:
# `bind` makes a new one each time; what identifies a transformation is its
# `Level` object, which is why `full_raise` below, and the check for leaked
# tracers, compare levels. Each kind of interpreter defines three methods:
#
# - `pure(x)` wraps a plain array in one of its tracers — for a constant that the
#   function uses, such as the `2.0` in `2.0 * x`;
# - `lift(t)` wraps a tracer that belongs to a *lower* level, for a value that
#   this transformation does not own but that meets one of its own tracers (we
#   will meet one after nesting `jvp`). In every interpreter in this book, `lift`
#   is `pure`: to an interpreter, a lower-level tracer is just a constant it does
#   not own. We keep the two names because they name two different sources of a
#   value (a plain constant, or a tracer from a lower level), and the original
#   Autodidax kept both;
# - `process_primitive(prim, tracers, params)` applies a primitive to its own
#   tracers, usually by unpacking them, calling `bind` again on what is inside,
#   and wrapping the results.
#
# `full_raise` combines the first two: it turns any input into a tracer of this
# trace, whatever it was before ({term}`boxing` it).


# %% tags=["export"]
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


# %% [markdown]
# (part1-avals)=
# ### Abstract values
#
# A tracer stands for an array whose numbers an interpreter may not know — when
# compiling, for instance, the numbers arrive only later — but it always knows
# *what kind* of array it is. We call that description an **abstract value** (or
# *aval*). `ShapedArray` records a shape and a dtype, and it is the only abstract
# value this book needs: an interpreter that has the numbers simply holds the
# array.


# %% tags=["export"]
class ShapedArray:
    """The abstract value of an array: its shape and dtype, not its contents."""

    __slots__ = ("shape", "dtype")

    def __init__(self, shape: Sequence[int], dtype: Any) -> None:
        self.shape = tuple(int(d) for d in shape)
        self.dtype = np.dtype(dtype)


# %% [markdown]
# `get_aval` finds the abstract value of anything a user may pass. A tracer
# knows its own aval (the `Tracer` class comes next); anything else goes through
# `as_array`, the single place where a string, a list or some other object gets
# rejected, with a message that names what was passed.


# %% tags=["export"]
def get_aval(x: Any, context: str = "autodidax", position: int | None = None):
    """The abstract value of a tracer, array or number."""
    if isinstance(x, Tracer):
        return x.aval
    x = as_array(x, context, position)
    return ShapedArray(x.shape, x.dtype)


# %% [markdown]
# Two avals are equal when shape and dtype are. An aval also knows its `ndim`
# and `size` and prints itself in two forms, a full one and the compact
# `float64[3,4]` of error messages (`str_short`); that code, and `as_array`, are
# in the folded cell.


# %% tags=["export", "hide-input"]
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


# %% [markdown]
# ### Tracers
#
# A `Tracer` is the object the user's function actually sees. It knows which trace
# it belongs to and its abstract value. `full_lower` is the opposite of
# `full_raise`: a tracer that carries no information for its transformation can
# unwrap itself (the batching tracer uses this when a value turns out not to be
# batched).
#
# Tracers have Python's operators, `+ - *` and unary `-` (and `> <`, for the
# comparisons that arrive with control flow), from a small mixin,
# `ArrayOperators`, whose methods call our wrappers (`x * y` is `mul(x, y)`), so
# the same checks apply.

# %% tags=["export", "hide-input"]
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


# %% tags=["export"]
class Tracer(ArrayOperators):
    """A stand-in for an array while a transformation runs a function."""

    _trace: Trace

    @property
    def aval(self) -> ShapedArray: ...

    def full_lower(self) -> Any:
        return self


def full_lower(x: Any) -> Any:
    return x.full_lower() if isinstance(x, Tracer) else x


# %% [markdown]
# A tracer refuses to become a Python boolean (`if x > 0:` needs a value it does
# not have) or a NumPy array, with an error that says why, instead of producing
# something silently wrong; NumPy is told (`__array_ufunc__ = None`) to leave
# `np.ones(3) * tracer` to our operators. `check_live` refuses a tracer whose
# transformation has already finished; the section on `bind` explains how it
# knows. The folded cell holds these methods, how a tracer prints, and the
# `shape`, `dtype` and `ndim` it reports, which are those of its aval.


# %% tags=["export", "hide-input"]
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


# %% [markdown]
# ### The evaluation interpreter
#
# The bottom of the stack is the only interpreter that computes anything by
# itself. It never creates tracers: its "tracers" are plain NumPy arrays, so `pure`
# and `lift` do nothing, and processing a primitive means calling its `impl` rule.


# %% tags=["export"]
class EvalTrace(Trace):
    """The interpreter at level 0: apply each primitive to concrete arrays."""

    def pure(self, val: Any) -> Any:
        return val

    lift = pure

    def process_primitive(self, prim, tracers, params):
        return prim.rule("impl")(*tracers, **params)


# %% [markdown]
# The `impl` rules call NumPy. They receive arrays and the primitive's params, and
# return a list of outputs.


# %% tags=["export"]
def _impl_from_numpy(prim, np_fn):
    prim.def_rule("impl")(lambda *args: [np_fn(*args)])


for _prim, _np_fn in [(add_p, np.add), (mul_p, np.multiply), (neg_p, np.negative),
                      (sin_p, np.sin), (cos_p, np.cos)]:  # fmt: skip
    _impl_from_numpy(_prim, _np_fn)


# %% [markdown]
# (part1-bind)=
# ### Choosing an interpreter: `bind`
#
# Here is the piece that ties everything together. When a primitive is applied,
# which interpreter should handle it? The answer: **the highest level among the
# inputs' tracers**, that is, the innermost transformation that any input belongs
# to. An input that is a plain array belongs to no transformation, so it does not
# count; if no input is a tracer, the evaluation interpreter at the bottom,
# level 0, runs the operation right away.
#
# Why look at the inputs rather than simply take the top of the stack? We will
# see why this is right once we can nest `jvp` (under *Derivatives of
# derivatives* below).
#
# Once the top trace is known, `bind` raises every input to it, lets it process the
# primitive, and lowers the outputs again. Rules return a list of outputs; every
# primitive of this part has one, which `bind` returns on its own. (Later parts
# create primitives with several outputs, such as `jit`'s, with
# `multiple_results=True`; for those `bind` returns the list.)


# %% tags=["export"]
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


# %% [markdown]
# The search also catches a classic mistake. A tracer that escaped from a
# transformation that has finished (say, stashed in a global variable) still
# carries a level whose number may now belong to another, live transformation.
# `check_live` compares the tracer's level with the entry of the stack at that
# number: if they are not the same object, the tracer has leaked.


# %% tags=["export", "hide-input"]
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


# %% [markdown]
# With only the evaluation interpreter on the stack, our functions behave like
# NumPy code. Here is the running example of this chapter,
# $f(x) = -2\sin x + x$:


# %%
def f(x):
    y = mul(-2.0, sin(x))
    return add(y, x)


print(f(3.0))


# %% [markdown]
# (part1-jvp)=
# ## Forward-mode differentiation: `jvp`
#
# The **{term}`Jacobian-vector product`** of a function $f$ at a point $x$ in a direction
# $v$ is $\partial f(x)\,v$: how fast $f$'s output moves when its input moves
# along $v$. Forward-mode automatic differentiation computes it alongside $f(x)$
# itself: carry a pair *({term}`primal`, {term}`tangent`)* through the program, and at each
# primitive apply the chain rule locally. If $y = \sin x$ and $x$ moves at speed
# $\dot x$, then $y$ moves at speed $\cos(x)\,\dot x$.
#
# The JVP interpreter's tracer is exactly that pair.


# %% tags=["export"]
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


# %% [markdown]
# (part1-jvp-rules)=
# The rules are the chain rule for each primitive, written with our own wrappers
# so that they can themselves be transformed again (that is what makes higher
# derivatives work). `add` and `neg` are *{term}`linear`*: for a linear
# operation the tangent is simply the same operation applied to the tangents,
# which one helper expresses for every linear primitive (three more come later).


# %% tags=["export"]
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


# %% [markdown]
# To run a function under the JVP interpreter we push a level, wrap the inputs in
# tracers of that level, call the function, and unpack what comes out. Outputs go
# through `full_raise` first, because a function may return something that never
# touched its inputs (a constant, or an input returned unchanged from an outer
# transformation); such an output simply has a zero tangent. `_check_outputs`
# checks that each output is an array or a live tracer (not, say, a string).


# %% tags=["export"]
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


# %% tags=["export", "hide-input"]
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


# %% [markdown]
# A first `jvp` handles a function of arrays that returns one array; the pytree
# section below replaces it with one that takes and returns containers.


# %%
def jvp(f, primals, tangents):
    primals_out, tangents_out = jvp_flat(lambda *xs: [f(*xs)], primals, tangents)
    return primals_out[0], tangents_out[0]


# %% [markdown]
# Let us check it on the running example. The derivative of
# $f(x) = -2\sin x + x$ is $f'(x) = -2\cos x + 1$.

# %%
y, y_dot = jvp(f, (3.0,), (1.0,))
print(y)
print(y_dot, -2 * np.cos(3.0) + 1)


# %% [markdown]
# ### Derivatives of derivatives
#
# Because the JVP rules call `bind` on whatever they are given, a derivative can be
# differentiated again. Each call to `jvp` pushes its own level, and the primitives
# find the right interpreter by looking at levels. Let us define the derivative of
# a function of one variable and apply it repeatedly to `sin`: the derivatives
# cycle through $\cos$, $-\sin$, $-\cos$ and back to $\sin$.


# %%
def derivative(fun):
    return lambda x: jvp(fun, (x,), (1.0,))[1]


d1 = derivative(sin)
d4 = derivative(derivative(derivative(derivative(sin))))
print(d1(3.0), np.cos(3.0))
print(d4(3.0), np.sin(3.0))

# %% [markdown]
# How does this work when we compute `derivative(derivative(sin))`? The outer `jvp`
# pushes level 1 and calls the inner function with a level-1 tracer `x`. The inner
# `jvp` pushes level 2 on top and wraps `x` as the primal of a level-2 tracer.
# When `sin` is applied to that tracer, `bind` picks level 2, the highest, whose
# rule calls `sin` and `cos` on the primal `x` — a level-1 tracer — so level 1
# differentiates those in turn, and its rule finally calls `sin` and `cos` on
# plain numbers at level 0, the bottom.
#
# Why does `bind` look at the inputs instead of simply taking the top of the
# stack? Because a rule runs while its own level is still pushed. When level 2's
# rule for `sin` calls `sin` and `cos` on its primal, level 2 is still the top;
# had `bind` taken the top, those calls would go back to the same rule, which
# would call `sin` again, without end, and even `d1` would never finish.
# Choosing by the inputs sends them to the level of the primal, one level down.
#
# The same choice keeps two derivatives apart when the inner function closes
# over the outer variable. Below, the inner derivative of $x y$ with respect to
# $y$ is $x$, so the outer function is $x^2$, whose derivative at 3 is 6:

# %%
print(derivative(lambda x: mul(x, derivative(lambda y: mul(x, y))(1.0)))(3.0))

# %% [markdown]
# Inside the inner `jvp`, `x` is a level-1 tracer meeting level-2 tracers. Level
# 2 boxes it with `lift`, with a zero tangent: to the inner derivative, `x` is a
# constant. Level 1 still sees `x` change, because the inner rule's `mul` on its
# primals (the level-1 tracer `x` and the number `1.0`) has no level-2 input and
# goes to level 1. Each level sees only the operations on its own values. (Real
# JAX reaches the same result another way, by running a rule's operations under
# the parent of its trace; see {ref}`Where real JAX differs <part1-jax-differs>`.)
#
# ### Python control flow is free
#
# The function being differentiated is ordinary Python, run once per call. A
# branch or a loop just decides which primitives get applied this time, and the
# JVP interpreter differentiates the ones that were. To branch, a function
# compares numbers, so comparisons join our primitives: they are added exactly
# as `add` was, with a wrapper and an `impl` rule. Their outputs are booleans,
# which do not vary smoothly, so their tangent is zero. (Real JAX gives such
# outputs a special tangent dtype called `float0`; we use a zero array of the
# output's dtype.) The primitives get JAX's names, `gt` and `lt`; the wrappers
# keep NumPy's, `greater` and `less`.

# %% tags=["export"]
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


# %% [markdown]
# `if x < 0.0` then works because the comparison returns a JVP tracer whose
# primal is an actual boolean. A tracer in general refuses to be a Python
# boolean, but a JVP tracer has the primal value at hand, and a branch needs
# nothing else:


# %% tags=["export"]
def _jvp_tracer_bool(self: JVPTracer) -> bool:
    self.check_live()
    return bool(self.primal)


JVPTracer.__bool__ = _jvp_tracer_bool


# %%
def soft_abs(x):
    if x < -1.0:
        return neg(x)
    if x < 1.0:
        return mul(x, x) * 0.5 + 0.5
    return x


for x0 in [-2.0, 0.5, 3.0]:
    value, slope = jvp(soft_abs, (x0,), (1.0,))
    print(f"x = {x0:4}: value {value}, slope {slope}")


# %% [markdown]
# `soft_abs` is $-x$ below $-1$, $(x^2 + 1)/2$ on $[-1, 1)$ and $x$ from 1 on
# (the pieces meet with equal values and slopes), and the derivative is that of
# the branch taken: $-1$, $x$ and $1$. Loops are no
# different. This function sums the Taylor series of $e^x$ until the terms become
# negligible, so how many terms it adds depends on `x`. The JVP interpreter
# differentiates whatever was added, and since the derivative of $e^x$ is $e^x$,
# the slope should match the value:


# %%
def exp_by_series(x):
    total, term, k = 1.0, 1.0, 1
    while True:
        term = term * x * (1.0 / k)  # x**k / k!
        total = total + term
        # `term` is a tracer; `if` asks its __bool__, which reads the primal
        if term * term < 1e-34:
            return total
        k += 1


value, slope = jvp(exp_by_series, (1.5,), (1.0,))
print(value, slope, np.exp(1.5))

# %% [markdown]
# (part1-moving-data)=
# ## Primitives that work on axes
#
# Everything so far works elementwise. Code that handles whole arrays also sums
# over axes, reorders them and repeats data along new ones, and batching, below,
# is made of exactly such moves. Three primitives cover them: `reduce_sum` sums
# over some axes, `transpose` permutes axes (not to be confused with the
# `transpose` *rule* of reverse mode in Part 4), and `broadcast` inserts new
# axes and repeats the data along them. `broadcast(x, shape, axes)` inserts the
# new axes at the positions `axes` of the result; the other axes of the result
# are those of `x`, in order. Adding them touches no existing code: each gets a
# `Primitive`, a wrapper, an `impl` rule and a `jvp` rule.
#
# The wrappers put what the user passed into one canonical form: negative axes
# become positive and `axis=None` becomes "all axes", so each rule has only one
# form of its params to handle. Their checks (an axis in range, a permutation
# of the axes, a broadcast that keeps the input's axes) are in the folded cell
# after them.

# %% tags=["export"]
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


# %% tags=["export", "hide-input"]
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


# %% [markdown]
# The `impl` rules call NumPy, and all three primitives are linear, so the
# helper `_linear_jvp` gives each its `jvp` rule:


# %% tags=["export"]
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

# %% [markdown]
# (part1-python-numbers)=
# ### Python numbers next to arrays
#
# With `broadcast` in hand, we can say what `mul(x, 2.0)` means when `x` is a
# vector. The primitives themselves are strict: both operands of a binary
# primitive must have the same shape and dtype. (JAX's `lax` layer is nearly as
# strict: it wants one dtype and one rank, but lets a rank-0 operand meet an
# array of any rank and stretches axes of size 1.) Being strict keeps every rule
# simple and makes shape mistakes loud. But writing `x * 2.0` is too natural to
# forbid, so the binary wrappers' helper `_binary_operands` (in the folded cell
# after the wrappers) turns a Python number into an array before `bind` sees
# it: the array takes the other operand's dtype, and if the other operand is
# not a scalar, the helper inserts an explicit `broadcast`. The number must keep
# its value in that dtype (no `2.5` into an integer array), and the two operands
# must then have the same shape and dtype; both checks need only abstract
# values, so they work the same on arrays and on tracers.
#
# Because this happens *before* `bind`, every interpreter — evaluation,
# differentiation, batching, and the compiler of later chapters — sees exactly
# the same, explicit program. The running example now works on a vector, and
# so does `x * 2.0 + 1.0`, evaluated (next to NumPy's answer) and
# differentiated (its slope is 2 everywhere):

# %%
print(f(np.array([0.0, 1.0, 2.0])))
v = np.array([1.0, 2.0, 3.0])
scale = lambda x: x * 2.0 + 1.0
print(scale(v), v * 2.0 + 1.0)
print(jvp(scale, (v,), (np.ones(3),)))


# %% [markdown]
# (part1-pytrees)=
# ## Pytrees: functions of structured data
#
# So far `jvp` takes a function of arrays that returns one array. Real functions
# take a tuple of parameters, return a dict of statistics, or use a class of their
# own. JAX handles all of these with **pytrees**: nested containers whose leaves
# are arrays. A transformation flattens the inputs into a list of leaves plus a
# description of the structure, works on the flat list, and rebuilds the output
# structure at the end.
#
# The structure description, `PyTreeDef`, records for each container node its
# type, any *auxiliary data* needed to rebuild it (such as a dict's keys), and its
# children. Leaves are marked by a node type of `None`.


# %% tags=["export"]
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


# %% [markdown]
# Lists, dicts and `None` are registered like tuples in the folded cell below: a
# dict's children are its values in sorted key order, and its keys are the
# auxiliary data. `node_handler` looks a type up, and registers each namedtuple
# class the first time it meets one, so namedtuples are containers as in JAX. A structure prints in Python's own notation, with `*` for each
# leaf; the printing code, and the check that `tree_unflatten` gets as many leaves
# as the structure has (`num_leaves`), are in the same cell.


# %% tags=["export", "hide-input"]
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


# %% tags=["export", "hide-input"]
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


# %%
leaves, treedef = tree_flatten((1.0, {"w": np.ones(2), "b": 0.0}, [None, 2.0]))
print(leaves)
print(treedef)
print(tree_unflatten(treedef, [10.0, 20.0, 30.0, 40.0]))


# %% [markdown]
# Note that the dict's leaves come out in sorted key order (`b` before `w`), so two
# dicts with the same keys always flatten the same way, and that `None` is an
# empty container rather than a leaf, as in JAX.
#
# A transformation that works on flat lists needs the user's function in flat form
# too: a function from a list of leaves to a list of leaves. `flatten_fun` wraps
# it, and because the output structure is known only once the function has run,
# the wrapper remembers it in an attribute for the transformation to read
# afterwards.


# %% tags=["export"]
class flatten_fun:
    """``f(*args)`` as a function of the leaves of ``args``; sets ``out_tree``."""

    def __init__(self, f: Callable, in_tree: PyTreeDef) -> None:
        self.f, self.in_tree = f, in_tree
        self.out_tree: PyTreeDef | None = None

    def __call__(self, *leaves: Any) -> list[Any]:
        args = tree_unflatten(self.in_tree, leaves)
        out_leaves, self.out_tree = tree_flatten(self.f(*args))
        return out_leaves


# %% [markdown]
# With these pieces, the final `jvp` accepts any pytrees. Before tracing anything,
# `_flatten_jvp_args` flattens primals and tangents and checks what the user
# passed: two tuples of the same structure, each tangent of the same shape and
# dtype as its primal, every leaf an array or a number.


# %% tags=["export"]
def jvp(f: Callable, primals: tuple, tangents: tuple) -> tuple[Any, Any]:
    """Evaluate ``f(*primals)`` and its derivative in the direction ``tangents``."""
    primals_flat, tangents_flat, in_tree = _flatten_jvp_args(primals, tangents)
    flat_f = flatten_fun(f, in_tree)
    primals_out, tangents_out = jvp_flat(flat_f, primals_flat, tangents_flat)
    out_tree = flat_f.out_tree
    return tree_unflatten(out_tree, primals_out), tree_unflatten(out_tree, tangents_out)


# %% tags=["export", "hide-input"]
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


# %% [markdown]
# Registering a container of our own is one call. Here a small dataclass holds the
# parameters of a line, and the tangent, a value of the same type, says in
# which direction of the parameters to differentiate (here: along the slope only). Under `jvp`, `line.slope` arrives
# as a rank-0 tracer, not a Python number, and our strict primitives refuse to
# combine it with a vector, so the loss first spreads both scalars to the shape
# of `xs` with `broadcast`:


# %%
@dataclass
class Line:
    slope: Any
    offset: Any


register_pytree_node(Line, lambda a: ((a.slope, a.offset), None), lambda _, k: Line(*k))
xs, ys = np.array([0.0, 1.0, 2.0]), np.array([1.0, 3.0, 5.0])


def squared_error(line, xs, ys):
    # only Python numbers broadcast by themselves: spread the scalars explicitly
    slope, offset = (broadcast(p, xs.shape, (0,)) for p in (line.slope, line.offset))
    residual = slope * xs + offset - ys
    return {"loss": reduce_sum(residual * residual), "first": residual}


tangents = (Line(1.0, 0.0), np.zeros(3), np.zeros(3))
out, out_dot = jvp(squared_error, (Line(1.5, 0.5), xs, ys), tangents)
print("loss", float(out["loss"]), "residuals", out["first"])
print(
    "d loss / d slope",
    float(out_dot["loss"]),
    "by hand:",
    np.sum(2 * out["first"] * xs),
)

# %% [markdown]
# The tangent output `out_dot` has the structure of the result: a dict with the
# keys `loss` and `first`. The tangent of the loss is its derivative with respect to the slope (the tangent we chose
# moves only the slope), which by hand is $\sum_i 2 r_i x_i$ for residuals $r_i$.
#
# (part1-vmap)=
# ## Batching: `vmap`
#
# Our second transformation is **vectorizing map**. `vmap(f)` turns a function
# written for one example into a function that takes a whole batch, with the batch
# stacked along some axis of each input. It is *as if* we looped over the examples
# and stacked the results, but without the loop: each primitive is applied once,
# to whole batches.
#
# The batching tracer holds the batched array and the position of its {term}`batch axis`.
# Its abstract value is that of *one* example: the function being batched was
# written for one example, so that is what shape-dependent code inside it must
# see. The batch axis may also be `None`, meaning the value is the same for every
# example; such a tracer lowers itself back to the plain value. The interpreter's
# level carries the `Axis` it maps over: the batch size, and an optional name
# (`vmap(f, axis_name="i")`) by which Part 9's collectives will find it.

# %% tags=["export"]
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


# %% [markdown]
# An unbatched tracer can answer a Python `if` with its value. A batched one
# cannot, since each example may need a different branch, and its `__bool__` (in
# the folded cell) raises an error that says so.


# %% tags=["export", "hide-input"]
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


# %% [markdown]
# A {term}`batching rule` receives the trace's `Axis` (the batch size, `axis.size`,
# and a name that only Part 9's collectives read), the unpacked values, their batch axes
# (`dims` in the code) and the params, and returns the outputs with *their* batch axes. Many rules need
# to line up batch axes first; `move_batch_axis` moves a batch axis to a new
# position with a `transpose`, or, for an unbatched value, creates a batch axis
# there with a `broadcast`. Both are primitives, so batching composes with every
# other interpreter.


# %% tags=["export"]
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


# %% [markdown]
# Elementwise rules are the easy ones. A unary operation does not care where the
# batch axis is. A binary operation needs both operands batched along the same
# axis: if only one is batched, we broadcast the other along that axis; if both
# are batched at different positions, we move one to match the other.


# %% tags=["export"]
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


# %% [markdown]
# The three primitives that work on axes refer to axes in their params, and those axis
# numbers were written for one example. The rules translate them into axis numbers
# of the batched array.
#
# - `reduce_sum` over per-example axis `a` sums over batched axis `a` or `a + 1`,
#   depending on whether `a` comes before the batch axis; the batch axis then moves
#   left by the number of summed axes before it.
# - `transpose` keeps the batch axis in front and shifts the permutation by one.
# - `broadcast` does the same: batch axis in front, new axes shifted by one.
#
# The first rule is below; the other two do what their bullets say and are in
# the folded cell after it.


# %% tags=["export"]
@reduce_sum_p.def_rule("vmap")
def _reduce_sum_vmap(axis, vals, dims, *, axes):
    (x,), (bdim,) = vals, dims
    full_axes = tuple(a if a < bdim else a + 1 for a in axes)
    out_bdim = bdim - sum(1 for a in axes if a < bdim)
    return [bind(reduce_sum_p, x, axes=full_axes)], [out_bdim]


# %% tags=["export", "hide-input"]
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


# %% [markdown]
# Running a function under the batching interpreter mirrors `jvp_flat`: push a
# level whose payload is the `Axis`, wrap the batched inputs, run, and move
# every output's batch axis to where the caller wants it. Outputs that turn out not
# to depend on the batch are broadcast, so every output has the batch axis.
#
# The user-facing `vmap` (folded below) adds pytrees around `vmap_flat`, as
# `jvp` did around `jvp_flat`: it flattens the arguments and `in_axes` into one
# batch axis per leaf, runs `vmap_flat`, and rebuilds the output's structure.


# %% tags=["export"]
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


# %% [markdown]
# As in JAX, `in_axes` may be one int or `None` for all arguments, or a tuple
# with one entry per argument, each an int, `None` or a pytree of those; a
# leaf whose axis is `None` (a function, a string, any Python object) reaches
# `f` untouched. `out_axes` is a pytree prefix of the output in the same way.
# Keyword arguments are batched along axis 0. The checks: `in_axes` must match
# the arguments' structure, every axis must be in range, all batched inputs
# must agree on the batch size, and `out_axes` must be in range for every
# output.


# %% tags=["export", "hide-input"]
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


# %% [markdown]
# Let us batch the running example over a vector of inputs, and then something
# with more structure: a per-example dot product, where one argument is batched
# along its last axis (`in_axes=-1`) and the other is shared by all examples
# (`None`).

# %%
print(vmap(f, (0,))(np.array([0.0, 1.0, 2.0, 3.0])))


def dot(u, v):
    return reduce_sum(mul(u, v))


columns = np.arange(6.0).reshape(3, 2)  # two examples, stored as columns
shared = np.array([1.0, 10.0, 100.0])
print(vmap(dot, (-1, None))(columns, shared))
print(columns.T @ shared)

# %% [markdown]
# Batching the transpose of a matrix, with the examples along axis 1 of the input
# and the batch axis of the result put last via `out_axes`:

# %%
mats = np.arange(24.0).reshape(2, 3, 4)  # example k is mats[:, k, :]
out = vmap(lambda m: transpose(m, (1, 0)), (1,), out_axes=-1)(mats)
print(out.shape, np.array_equal(out, np.transpose(mats, (2, 0, 1))))

# %% [markdown]
# Python numbers work under `vmap` as well. Inside the batched function, `x`
# has the shape of one example, so `_binary_operands` broadcasts `2.0` to that
# shape; `mul`'s batching rule then treats the result as a value shared by all
# examples, whichever axis holds the batch:

# %%
batch = np.arange(6.0).reshape(2, 3)
print(vmap(scale, (0,))(batch))
print(np.array_equal(vmap(scale, (1,))(batch.T), batch * 2.0 + 1.0))


# %% [markdown]
# ### `jacfwd`: batching meets differentiation
#
# A JVP gives one column of the Jacobian per call: push the basis vector $e_j$
# through and you get $\partial f / \partial x_j$. Batching those calls over all
# basis vectors gives the whole Jacobian in one go. That is `jacfwd`: `vmap` of
# `jvp`. For an input of any shape, we batch once per input axis over an identity
# tensor, then move the input axes behind the output axes, the layout JAX uses.
# Everything inside uses our primitives, so `jacfwd` can itself be transformed;
# `jacfwd` of `jacfwd` is the Hessian. As in JAX, `jacfwd(f)` returns a function;
# a folded cell picks the arguments named by `argnums` and handles pytrees one
# leaf at a time.


# %% tags=["export"]
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


# %% tags=["export", "hide-input"]
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


# %%
def g(x):
    return sin(x) * x


x0 = np.array([0.5, 1.0, 2.0])
print(jacfwd(g)(x0))
print(np.diag(np.cos(x0) * x0 + np.sin(x0)))

energy = lambda x: reduce_sum(sin(x) * x)
hessian = jacfwd(jacfwd(energy))(x0)
print(np.allclose(hessian, np.diag(2 * np.cos(x0) - x0 * np.sin(x0))))

# %% [markdown]
# (part1-stack-at-work)=
# ## A look at the stack at work
#
# What does the interpreter stack look like in the middle of a nested
# transformation? We can just look. The function below records the stack and the
# tracer it was given while it runs under `jvp` of `vmap`.

# %%
snapshot = {}


def spy(x):
    snapshot["stack"] = list(_state.stack)
    snapshot["x"] = x
    return sin(x)


jvp(vmap(spy, (0,)), (np.array([1.0, 2.0]),), (np.array([1.0, 0.0]),))
print(snapshot["stack"])
x = snapshot["x"]
for t in (x, x.val):
    print(f"{type(t).__name__} at level {t._trace.level.number}, aval {get_aval(t)}")
print("primal", x.val.primal, "and tangent", x.val.tangent)

# %% [markdown]
# The outer transformation, `jvp`, started first and pushed level 1, just above
# evaluation; the inner `vmap` pushed level 2, on top. The function received a
# batching tracer whose value is a JVP tracer, whose primal and tangent are plain
# arrays. When `spy` calls `sin`, `bind` picks level 2, the highest; the batching
# rule applies `sin` to the JVP tracer inside, which `bind` sends down to level 1;
# the JVP rule applies `sin`, `cos` and `mul` to plain arrays, which level 0, at
# the bottom, evaluates. `get_aval` shows what each tracer stands for: the batching
# tracer reports the abstract value of one example, a scalar, while the JVP
# tracer it holds carries the whole batch, of shape `(2,)`.
# Drawn from the snapshot above:

# %% mystnb={"image": {"alt": "The interpreter stack during jvp(vmap(spy)), drawn with the bottom at the bottom: level 0 (EvalTrace), above it level 1 (JVPTrace), and on top level 2 (BatchTrace). Next to it, the argument spy receives: a BatchTracer at level 2 holding a JVPTracer at level 1 holding a primal array and a tangent array. A call to sin enters at the top, level 2, and is passed down one level at a time to level 0."}} tags=["hide-input"]
# @title Drawing the stack (the code is in figures.py)
from figures import draw_interpreter_stack

draw_interpreter_stack(snapshot["stack"], snapshot["x"])

# %% [markdown]
# Two things in this picture are worth remembering. First, the order of the
# levels follows the order of the *calls*: the outermost transformation, entered
# first, is the first level above evaluation, and the innermost one is on top.
# The tracers nest the opposite way: the innermost transformation (`vmap`, top)
# owns the wrapper `spy` sees, and the outermost (`jvp`, level 1) owns the tracer
# inside it. Second, nothing in the machinery knows which transformations exist:
# `bind` compares level numbers, and each trace only knows its own rules. That is why any new transformation
# composes with all the others.
#
# ## When things go wrong
#
# A learner will hand these functions all sorts of things. Each mistake should
# produce an error that says what was wrong in the user's terms. A few examples,
# each printed by `show_error` (from the setup cell), which calls a function and
# prints the error it raises; the folded cell makes six mistakes, and their
# messages are below it:

# %% tags=["hide-input"]
# @title Six mistakes: a string, mismatched shapes, a tangent, batch sizes, if, perm
show_error(lambda: sin("three"))
show_error(lambda: add(np.ones(3), np.ones(4)))
show_error(lambda: jvp(sin, (1.0,), (np.ones(2),)))
show_error(lambda: vmap(add, (0, 0))(np.ones(3), np.ones(4)))
show_error(lambda: vmap(lambda x: x if x > 0 else -x, (0,))(np.ones(3)))
show_error(lambda: transpose(np.ones((2, 3)), (0, 0)))

# %% [markdown]
# And a tracer that escapes its transformation is caught when it is used again,
# instead of silently computing with a stale value — by a primitive, and also by
# Python's `if` (each tracer's `__bool__` starts with `check_live`):

# %%
leaked = []
jvp(lambda x: leaked.append(x) or x, (1.0,), (1.0,))
show_error(lambda: sin(leaked[0]))
show_error(lambda: 1 if leaked[0] else 0)

# %% [markdown]
# (part1-jax-differs)=
# ## Where real JAX differs
#
# - JAX's primitives live in [`jax.lax`](https://docs.jax.dev/en/latest/jax.lax.html);
#   the primitive behind our `broadcast` is JAX's `broadcast_in_dim` (`jax.lax.broadcast`
#   also exists: it prepends axes), which names the axes that are *kept* rather
#   than the ones inserted.
# - JAX does not convert zero tangents to arrays eagerly: a value that is not
#   being differentiated (a constant, or an input outside `grad`'s `argnums`) has
#   a symbolic zero tangent, which costs nothing. A zero passed to `jax.jvp` as a
#   tangent is an ordinary array, though, and is computed with.
# - Python numbers in JAX are *weakly typed*: `x * 2.0` keeps the dtype of a
#   `float32` array `x`, and an integer `x` is promoted to a float by JAX's
#   [type promotion rules](https://docs.jax.dev/en/latest/type_promotion.html).
#   Our wrappers refuse to mix a float number with an integer array, as
#   `lax.add` refuses; the operators and `autodidax.numpy` follow JAX's rules
#   from the {ref}`appendix <appendix-dtypes>` on.
# - JAX's `jax.vmap` supports `in_axes` and `out_axes` given as pytree prefixes,
#   as ours does, as well as `spmd_axis_name`; see the
#   [`vmap` docs](https://docs.jax.dev/en/latest/_autosummary/jax.vmap.html).
# - JAX no longer keeps a stack of numbered levels (the JAX installed here,
#   0.10.2, is "stackless"): the trace of the running transformation is held in a
#   context (`trace_ctx` in `jax._src.core`) and handles every operation, treating
#   values it does not own as constants, and it runs the operations of its rules
#   under its parent, the trace it was started under. The idea of one interpreter
#   per transformation is the same. See
#   [Autodidax and JAX internals](https://docs.jax.dev/en/latest/autodidax.html)
#   for the official version of this story.
#
# ## Summary
#
# - Every operation goes through `bind(primitive, *inputs, **params)`; the
#   wrappers users call only check and tidy up their arguments (a Python number
#   next to an array becomes an explicit `broadcast`).
# - A primitive carries one rule per interpreter, so new primitives extend the
#   module without touching what exists: the comparisons and the three
#   primitives that work on axes arrived after `jvp` worked.
# - Abstract values (`ShapedArray`) describe arrays by shape and
#   dtype, so rules can reason about values they do not have.
# - Each transformation is an interpreter: a `Trace` subclass with `pure`, `lift`
#   and `process_primitive`, and a `Tracer` subclass. Transformations in progress
#   form a stack of levels, and `bind` hands each operation to the highest live
#   level among its inputs.
# - `jvp` carries (primal, tangent) pairs and applies the chain rule one
#   primitive at a time; because rules call `bind`, derivatives nest to any order and Python
#   control flow works unchanged.
# - `vmap` carries a batch and the position of its batch axis, with one rule per
#   primitive that rewrites axis numbers; `jacfwd` is `vmap` of `jvp`.
# - Pytrees let every transformation accept and return nested containers,
#   including user-registered ones.
#
# Next, {ref}`Part 2 <part2>` stops running the function *during* the
# transformation and starts recording it as a program of its own: a jaxpr.
#
# ## Exercises
#
# **1. A new primitive.** Add `exp` with `impl`, `jvp` and `vmap` rules, without
# touching any existing code, and check `jvp` of `exp(sin(x))` against the
# derivative you work out by hand.

# %% tags=["hide-input"]
# @title Solution 1: an exp primitive
exp_p = Primitive("exp")
exp_p.def_rule("impl")(lambda x: [np.exp(x)])


def exp(x):
    return bind(exp_p, x)


@exp_p.def_rule("jvp")
def _exp_jvp(primals, tangents):
    (x,), (dx,) = primals, tangents
    y = exp(x)
    return [y], [mul(dx, y)]


_unary_vmap(exp_p)

x0 = np.array([0.1, 0.7])
_, slope = jvp(lambda x: exp(sin(x)), (x0,), (np.ones(2),))
print(np.allclose(slope, np.exp(np.sin(x0)) * np.cos(x0)))
print(np.allclose(vmap(exp, (0,))(x0), np.exp(x0)))


# %% [markdown]
# **2. Hessian-vector products.** For $h(x) = \sum_i \sin(x_i)\,x_i$, compute the
# product of the Hessian with a vector $v$ *without* building the Hessian, by
# taking a JVP of a gradient. (We have no `grad` yet; for a scalar function of a
# vector, `jacfwd` gives the gradient.) Compare with the full Hessian.


# %% tags=["hide-input"]
# @title Solution 2: gradient and Hessian from jacfwd
def gradient(fun):
    return jacfwd(fun)


def hvp(fun, x, v):
    return jvp(gradient(fun), (x,), (v,))[1]


h = lambda x: reduce_sum(sin(x) * x)
x0 = np.array([0.3, 1.1, -2.0])
v0 = np.array([1.0, -1.0, 0.5])
full = jacfwd(gradient(h))(x0)
print(np.allclose(hvp(h, x0, v0), full @ v0))


# %% [markdown]
# **3. Per-example gradients.** For a linear model with the squared error
# $\ell(w; x, y) = (w \cdot x - y)^2$ on one example, compute the gradient with
# respect to $w$ for *every* example of a batch in one call, by batching `jacfwd`
# with `vmap`. Compare with the formula $2(w \cdot x - y)\,x$.


# %% tags=["hide-input"]
# @title Solution 3: per-example gradients with vmap
def example_loss(w, x, y):
    residual = reduce_sum(w * x) - y
    return residual * residual


w0 = np.array([0.5, -1.0, 2.0])
inputs = np.arange(12.0).reshape(4, 3) / 10
targets = np.array([1.0, 0.0, -1.0, 2.0])


def example_grad(x, y):
    return jacfwd(example_loss)(w0, x, y)


per_example = vmap(example_grad, (0, 0))(inputs, targets)
expected = 2 * (inputs @ w0 - targets)[:, None] * inputs
print(per_example.shape, np.allclose(per_example, expected))
