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
# (part10)=
# # Part 10: The core without a stack
#
# :::{admonition} Where we are
# :class: note
# {ref}`Part 1 <part1>` built an interpreter *stack*: numbered levels, a `bind`
# that searches its inputs for the highest level, `full_raise` and `full_lower`
# to move values between levels. {ref}`Part 2 <part2>` built jaxprs and
# bolted a {ref}`dynamic level <part2-dynamic>` onto the stack so that staging
# sees every operation; Part 3 compiled jaxprs, and Part 4 added partial
# evaluation of jaxprs and transposition.
# :::
#
# JAX itself stopped working that way in version 0.4.36 (December 2024, see its
# [changelog](https://docs.jax.dev/en/latest/changelog.html)). Its
# core is now *stackless*: the trace of the running transformation sits in a
# context, `bind` hands every operation to that
# *{term}`current trace <current trace>`*, and a transformation applies its
# rules with the trace it was started under, its
# *{term}`parent <parent trace>`*, made current. No levels, no search over the
# inputs. This chapter
# builds that design from zero, next to the stack rather than in its place, in
# a namespace of its own, `autodidax.stackless`, and then runs the same programs
# on both cores.
#
# The idea fits in four sentences, and the first code cells of
# {ref}`The new core <part10-core>` are those sentences:
#
# 1. A context holds the current trace; at the bottom is the evaluation trace.
# 2. `bind` hands the primitive to the current trace, with the evaluation trace
#    made current while that trace processes it. Nothing else.
# 3. So each trace must say where its rules' operations go: it remembers its
#    parent (the trace that was current when it started) and runs its rules
#    with the parent current, so they go one step outwards.
# 4. A trace recognizes its own tracers by their *tag* (the trace they belong
#    to); any other value, including another trace's tracer, is a constant to it.

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

book_setup.load_book(globals(), before="part10_stackless")

# %% [markdown]
# This chapter's code reaches the main module, the stack of Parts 1–9, by one
# name, `ad`:

# %% tags=["export-stackless"]
import functools
import threading
from contextlib import contextmanager

import numpy as np

import autodidax as ad  # the main module: Parts 1-9, with the stack


# %% [markdown]
# (part10-why)=
# ## Why change
#
# The stack works; every chapter so far runs on it. What it costs is spread
# thin. Every `bind` walks its inputs to find the highest level
# (`find_top_trace`), boxes every input into that level (`full_raise`, `pure`,
# `lift`) and unboxes every output (`full_lower`). A tracer's level is a
# number, so a leaked tracer must be caught by comparing it with whatever now
# sits at that number. And data dependence alone let operations on constants
# slip past a staging trace, so Part 2 added a second piece of state, the
# dynamic level, to start the search from.
#
# What the stack gets right is keeping nested derivatives apart, and that is
# worth seeing fail. Take $\frac{d}{dx}\left[x \cdot \frac{d}{dy}(x + y)\Big|_{y=1}\right]$
# at $x = 1$. The inner derivative is 1 (the $x$ inside it is a constant to
# $\frac{d}{dy}$), so the outer function is $x$ and the answer is 1. A toy
# forward mode whose dual numbers do not record *whose* tangent they carry
# adds the outer tangent of $x$ into the inner derivative and answers 2. This
# mistake has a name, **{term}`perturbation confusion`**:


# %%
class Dual:  # a dual number that does not know which derivative it belongs to
    def __init__(self, primal, tangent):
        self.primal, self.tangent = primal, tangent

    def __add__(self, other):
        other = other if isinstance(other, Dual) else Dual(other, 0.0)
        return Dual(self.primal + other.primal, self.tangent + other.tangent)

    def __mul__(self, other):
        other = other if isinstance(other, Dual) else Dual(other, 0.0)
        t = self.tangent * other.primal + self.primal * other.tangent
        return Dual(self.primal * other.primal, t)


def confusion_test(derivative):
    return derivative(lambda x: x * derivative(lambda y: x + y)(1.0))(1.0)


print(confusion_test(lambda f: lambda x: f(Dual(x, 1.0)).tangent))  # confused
print(confusion_test(lambda f: lambda x: ad.jvp(f, (x,), (1.0,))[1]))  # Part 1


# %% [markdown]
# `ad.jvp` is Part 1's `jvp`. Its inner `jvp`
# runs at level 2, and `x`, a level-1 tracer, is lifted into level 2 with a zero
# tangent: levels are what keep the two derivatives apart. The stackless core
# keeps them apart with less: a tracer points at the trace that made it, and a
# trace unpacks only its own.
#
# (part10-core)=
# ## The new core
#
# The primitives, their `impl` and abstract evaluation rules, `ShapedArray`,
# pytrees and the jaxpr types are the main module's, used as they are. The JVP
# and batching rules are written again: Part 1's call the main module's `bind`
# (every `mul` inside them is the stack's), so here they are rewritten with this
# core's wrappers.
#
# A trace knows its parent and whether its transformation has finished. A
# tracer knows its trace: that reference is its tag. The evaluation trace, at the
# bottom, applies `impl` rules to arrays and has no parent.


# %% tags=["export-stackless"]
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


# %% [markdown]
# The context is one thread-local variable, the current trace, which starts
# as the one evaluation trace. `set_current_trace` changes it for the length of
# a `with` block, and `transformation` does the same for a whole run of a
# transformation, marking the trace finished at the end so that its tracers
# cannot be used afterwards. `bind` takes the current trace and lets it process
# the primitive with the evaluation trace current; that is all it does (besides
# checking its arguments, in the folded cell).

# %% tags=["export-stackless"]
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


# %% [markdown]
# Compare Part 1's `bind`: no `find_top_trace`, no `full_raise` of the inputs,
# no `full_lower` of the outputs. Why reset the context to the bottom? If the
# trace processing a primitive stayed current, every operation its rule
# performs would come straight back to that same trace, to be sorted out
# again. With the evaluation trace current instead, nothing a trace does goes
# anywhere unless the trace sends it there.
#
# The checks are Part 2's abstract evaluation rules, run on the arguments'
# types, so every interpreter reports a bad operand the same way; a finished
# trace's tracer is refused with `UnexpectedTracerError`, and so is any tracer
# that reaches the evaluation trace:

# %% tags=["export-stackless", "hide-input"]
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


# %% [markdown]
# The wrappers users call are Part 1's without their own argument checks (this
# core's `bind` runs the abstract evaluation rules instead): each binds one of
# the main module's primitives, and `_operands` (folded) turns a Python number
# next to an array into an array of the same dtype and shape, with an explicit
# `broadcast`, as Part 1's wrappers do.


# %% tags=["export-stackless"]
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


# %% tags=["export-stackless", "hide-input"]
# @title More wrappers (greater, less, reduce_sum, ...); Python numbers
def greater(x, y):
    return bind(ad.gt_p, *_operands(x, y))


def less(x, y):
    return bind(ad.lt_p, *_operands(x, y))


def reduce_sum(x, axis=None):
    ndim = get_aval(x).ndim
    axis = tuple(range(ndim)) if axis is None else axis
    return bind(ad.reduce_sum_p, x, axes=ad._normalize_axes("reduce_sum", axis, ndim))


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
    return (_like(x, y) if _is_number(x) else x), (_like(y, x) if _is_number(y) else y)


# %% tags=["export-stackless", "hide-input"]
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


# %% [markdown]
# With only the evaluation trace current, this is NumPy. Here is the running
# example of Part 1, $f(x) = -2\sin x + x$:


# %%
def f(x):
    return add(mul(-2.0, sin(x)), x)


print(f(3.0))


# %% [markdown]
# (part10-jvp)=
# ## Forward mode, tagged
#
# A JVP trace unpacks its own tracers into primal and tangent; anything else
# gets a zero tangent, `zeros_like(x)`: a NumPy array of zeros of `x`'s shape
# and dtype, even when `x` is another trace's tracer, so the zero is a
# constant to every trace. If *no* input is its own, the operation is not its
# business: it passes it to its parent unchanged (JAX does the same when every
# tangent is zero). Otherwise it runs the primitive's rule **with its parent
# as the current trace**, so the operations inside the rule (the `mul` and
# `cos` of `sin`'s rule, say) go one step outwards, and wraps the results with
# its tag.


# %% tags=["export-stackless"]
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


# %% [markdown]
# That is the whole idea; the rest of the chapter is rules and plumbing. The
# rules, in the table `jvp_rules`, are the chain rule as in Part 1, written
# with this core's wrappers; each of the five linear primitives applies itself
# to the tangents.

# %% tags=["export-stackless"]
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


# %% [markdown]
# `jvp` itself takes pytrees, with the main module's `tree_flatten` and
# `flatten_fun` (folded), and checks that tangents match primals:


# %% tags=["export-stackless", "hide-input"]
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


# %% [markdown]
# The running example, and the fourth derivative of `sin` by nesting `jvp`
# four times:


# %%
def derivative(fun):
    return lambda x: jvp(fun, (x,), (1.0,))[1]


print(jvp(f, (3.0,), (1.0,)))
print(derivative(derivative(derivative(derivative(sin))))(3.0), np.sin(3.0))


# %% [markdown]
# How does nesting work without levels? When the second `derivative` calls
# `jvp`, the current trace is the first `jvp`'s trace, so that becomes the new
# trace's parent. The innermost trace runs `sin`'s rule with its parent current;
# the rule's `sin` and `cos` of the primal (a tracer of the parent) land on the
# parent, which runs *its* rule with *its* parent current, and so on down to the
# evaluation trace. The chain of parents is the stack, but nobody searches it:
# each trace knows the one step it needs.
#
# The `with set_current_trace(self.parent)` line is what makes this work. Here
# is a JVP trace without it; one derivative still comes out right, because the
# evaluation trace that then runs the rule's `sin` and `cos` happens to be the
# parent. Nest two, and the inner rule's `sin` of its primal, a tracer of the
# outer derivative, lands on the evaluation trace, which refuses it:


# %%
class CarelessJVPTrace(JVPTrace):  # JVPTrace without its `with` line
    def process_primitive(self, prim, args, params):
        if not any(self.owns(x) for x in args):  # all constants to us
            return self.parent.process_primitive(prim, args, params)
        primals, tangents = zip(*map(self.primal_tangent, args))
        primals_out, tangents_out = jvp_rules[prim](primals, tangents, **params)
        return [JVPTracer(self, p, t) for p, t in zip(primals_out, tangents_out)]


def careless_derivative(fun, x):
    with transformation(CarelessJVPTrace(current_trace())) as trace:
        return trace.primal_tangent(fun(JVPTracer(trace, x, 1.0)))[1]


print(careless_derivative(sin, 3.0), np.cos(3.0))
show_error(lambda: careless_derivative(lambda x: careless_derivative(sin, x), 3.0))

# %% [markdown]
# And perturbation confusion? `x + y` inside the inner derivative reaches the
# inner trace, which owns `y` but not `x`: `x` is a constant to it, with a zero
# tangent, exactly as the math says. Its rule then adds the primals with the
# outer trace current, and there `x` *is* owned and carries its own tangent.

# %%
print(confusion_test(derivative))

# %% [markdown]
# A tracer that escapes its transformation is refused when it is used again,
# because its trace is marked finished (`show_error`, from the setup cell, prints
# an error instead of stopping):

# %%
leaked = []
jvp(lambda x: leaked.append(x) or sin(x), (1.0,), (1.0,))
show_error(lambda: sin(leaked[0]))


# %% [markdown]
# (part10-vmap)=
# ## Batching
#
# The batching trace follows the same pattern: unpack its own tracers into a
# value and a batch axis, treat everything else as unbatched, pass an operation
# with no batched input to the parent, and run the rule with the parent
# current.


# %% tags=["export-stackless"]
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
    return [move_batch_axis(axis_size, a, 0, x) for x, a in map(trace.val_axis, outs)]


# %% [markdown]
# `move_batch_axis` is Part 1's, calling this core's `broadcast` and
# `transpose`; the rules are Part 1's rules too (unary ones keep the axis,
# binary ones line their operands up, the three that work on axes renumber their
# axes), all folded here:


# %% tags=["export-stackless", "hide-input"]
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

# %%
xs = np.array([0.0, 1.0, 2.0])
print(vmap(f)(xs), f(xs))
mats = np.arange(6.0).reshape(2, 3)
print(vmap(lambda m, v: reduce_sum(m * v), in_axes=(1, None))(mats, 2.0))
print(jvp(vmap(f), (xs,), (np.ones(3),)))


# %% [markdown]
# The last line is `jvp` of `vmap`: the batching trace's parent is the JVP
# trace, so each batched `sin` becomes a `sin` on JVP tracers, which the JVP
# trace differentiates, running `sin`'s rule with its own parent, the
# evaluation trace, current.
#
# (part10-staging)=
# ## Staging: omnistaging for free
#
# The staging trace records instead of computing. Its tracers carry a type and
# the jaxpr variable that stands for them. A value that is not its own tracer —
# a NumPy array, or the tracer of an outer transformation the function closed
# over — becomes a constant of the jaxpr (a literal if it is a NumPy scalar),
# exactly as foreign tracers are constants to the other traces. The jaxpr
# types, the type checker and the printer are Part 2's.


# %% tags=["export-stackless"]
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


# %% [markdown]
# There is no dynamic level. While `make_jaxpr` runs the function, the staging
# trace is current, so `bind` gives it *every* operation, whether or not a
# tracer is among the inputs. What Part 2 had to add is what this design does
# by default:


# %% tags=["export-stackless", "hide-input"]
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

# %%
print(make_jaxpr(lambda: mul(2.0, 2.0))[0])
scalar = ad.ShapedArray((), np.float64)
print(make_jaxpr(lambda x: jvp(sin, (x,), (1.0,)), scalar)[0])


# %% [markdown]
# The second jaxpr stages a `jvp`: the JVP trace's parent is the staging trace,
# so the rule's `sin`, `cos` and `mul` are recorded. An evaluator for jaxprs is
# Part 2's loop with this core's `bind`, so a jaxpr can be transformed again:


# %% tags=["export-stackless"]
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


# %% [markdown]
# (part10-jit)=
# ## `jit`: Part 3's compiler, this core's tracing
#
# `jit` traces with this core's `make_jaxpr` once per input signature and binds
# Part 3's `xla_call` primitive, whose `impl` rule compiles the jaxpr with XLA.
# Its abstract evaluation and lowering rules are reused too; it needs only a JVP
# rule and a batching rule of this core (folded), which transform the jaxpr
# with this core's `jvp` and `vmap` and call the result, each cached per jaxpr
# so that a derivative compiles once. A jaxpr whose constants include a tracer
# (the function read a value of a transformation still running) is used once
# and not cached, since that tracer dies with its transformation.


# %% tags=["export-stackless"]
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


# %% tags=["export-stackless", "hide-input"]
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
    new_jaxpr, consts = vmap_jaxpr(jaxpr, axis_size, tuple(d is not None for d in dims))
    outs = bind(ad.xla_call_p, *consts, *vals, jaxpr=new_jaxpr)
    return outs, [0] * len(outs)


vmap_rules[ad.xla_call_p] = _xla_call_vmap


# %%
@jit
def wave(x):
    print("tracing!")
    return sin(x) * 2.0 + x


print(wave(np.array([0.0, 1.0])), wave(np.array([2.0, 3.0])))
print(jvp(wave, (1.0,), (1.0,)), vmap(wave)(np.array([0.5, 1.5])))
print(make_jaxpr(wave, scalar)[0])


# %% [markdown]
# `tracing!` appears once per signature: the two vector calls share one
# trace; `jvp` traces the scalar signature, and `vmap` (whose tracer stands for
# one scalar example) and `make_jaxpr` reuse it. The results are Part 3's
# `Array`s, the buffers XLA computed; inside a tuple Python prints their
# `repr`, `Array(...)`.
#
# (part10-grad)=
# ## `grad`: linearize, then Part 4's transposition
#
# Part 4 got reverse mode from forward mode in two steps. Partial evaluation
# splits a JVP into what can be computed now (the primal values, and the
# *residuals* the tangent computation needs) and a linear map of the tangents,
# recorded as a jaxpr; transposition runs that jaxpr backwards. In this design
# the split is one small trace. Run `jvp` with tangents that are tracers of a
# staging trace. Why not simply make that staging trace the JVP trace's
# parent? Because a current staging trace records *every* operation, as the
# previous section showed: the primal computation would be recorded too,
# instead of computed now. So a `PartialTrace` sits in between as the JVP
# trace's parent: it hands every operation touching a tangent to the staging
# trace, and passes every other operation to its own parent, to be computed
# (or handled by whatever transformation is outside). The primal values stay
# concrete, so Python control flow works as under `jvp`. The residuals are the
# primal values the recorded tangent operations read: they become the
# constants of the recorded jaxpr, except NumPy scalars, which the staging
# trace writes into it as literals (`cos(1.0)` in `grad(sin)(1.0)`, say).


# %% tags=["export-stackless"]
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


# %% [markdown]
# Transposition is Part 4's `transpose_jaxpr_uncached`, unchanged, and it is
# the one piece that still runs on the stack, for one reason: the transpose
# rules stored on the primitives build cotangents with the main module's `mul`,
# `neg` and so on, whose `bind` is the stack's, so `transpose_jaxpr_uncached`
# traces Part 4's `backward_pass` with the main module's `make_jaxpr` (porting
# it would mean rewriting those rules with this core's wrappers, as this chapter
# did for the JVP rules). That is safe because it traces on types alone: its
# inputs are `ShapedArray`s and the linear jaxpr holds no tracer of this core,
# so the stack starts and ends inside that one call.
#
# The linear jaxpr takes the residuals first, then the tangents; the mask `undefined` tells transposition which inputs are the
# linear ones whose cotangents we want. The transposed jaxpr takes its own
# constants, the residuals and the output cotangents, and is evaluated with
# this core's `eval_jaxpr`, so whatever transformation is current sees its
# operations:


# %% tags=["export-stackless"]
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


# %% [markdown]
# A jitted call is one equation that takes primals and tangents at once, so the
# partial trace splits its jaxpr into a known and an unknown half with Part 4's
# `split_call_jaxpr` (partial evaluation of jaxprs), calls the known half now
# and records a call of the unknown half. That rule, `linearize` with pytrees
# and `grad`'s checks are folded:


# %% tags=["export-stackless", "hide-input"]
# @title xla_call under PartialTrace; linearize; checks: grad's input and output
def _xla_call_partial_eval(trace, args, params):
    unknowns = tuple(trace.tangents.owns(x) for x in args)
    known, unknown, out_unknowns, num_res = ad.split_call_jaxpr(
        params["jaxpr"], unknowns
    )
    known_args = [x for x, u in zip(args, unknowns) if not u]
    outs = trace.parent.process_primitive(ad.xla_call_p, known_args, dict(jaxpr=known))
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


# %% [markdown]
# Everything composes, because every piece either is a trace or is a jaxpr
# evaluated with `bind`. Under `vmap(grad(sin))` or `grad(grad(sin))`, the
# primal values inside `grad` are tracers of the outer transformation, so the
# residuals are too: they become constants of the linear jaxpr, and when
# `eval_jaxpr` runs the transposed jaxpr they go back through `bind` to the
# outer trace, which is current and handles them as any of its operations:

# %%
g = lambda x: reduce_sum(sin(x) * x)
x0 = np.array([0.5, 1.0])
print(grad(g)(x0), np.cos(x0) * x0 + np.sin(x0))
print(jit(grad(g))(x0), grad(jit(g))(x0))
print(grad(lambda x: grad(sin)(x))(1.0), -np.sin(1.0))
print(vmap(grad(sin))(x0), np.cos(x0))


# %% [markdown]
# Python control flow on values works under `grad` too, since the primal
# values are concrete; here is Part 1's `soft_abs`, whose slope is $-1$, $x$
# and $1$ on its three pieces:


# %%
def soft_abs(x):
    if x < -1.0:
        return neg(x)
    if x < 1.0:
        return mul(x, x) * 0.5 + 0.5
    return x


print([float(grad(soft_abs)(x)) for x in (-2.0, 0.5, 3.0)])

# %% [markdown]
# ## The same programs on both cores
#
# Each core has its own `sin`, `jvp`, `vmap` and `make_jaxpr`, so a program
# that should run on both takes the core as an argument, `m`: the main module
# `ad`, or `autodidax.stackless`, the module this chapter's code is tangled into.

# %%
from autodidax import stackless  # this chapter's library cells, as a module


def programs(m):  # Part 1's and Part 2's examples, written against a core m
    d = lambda fun: lambda x: m.jvp(fun, (x,), (1.0,))[1]
    print(m.jvp(lambda x: -2.0 * m.sin(x) + x, (3.0,), (1.0,)), d(d(m.sin))(3.0))
    print(m.jvp(m.vmap(m.sin), (np.arange(3.0),), (np.ones(3),)))
    print(m.make_jaxpr(lambda: m.mul(2.0, 2.0))[0])


for name, core in [("the stack", ad), ("stackless", stackless)]:
    print(f"--- {name}")
    programs(core)


# %% [markdown]
# What got simpler, and what did not:
#
# | | The stack (Parts 1–2) | Stackless (this chapter) |
# |---|---|---|
# | Who handles an operation | `find_top_trace`: the highest level among the inputs, starting from the dynamic level | the current trace |
# | Values a trace does not own | boxed on the way in (`full_raise`, `pure`, `lift`), unboxed on the way out (`full_lower`) | unpacked if tagged as its own, constants otherwise |
# | Operations on constants while staging | missed, until Part 2's dynamic level | recorded: the staging trace is current |
# | Nested derivatives kept apart by | level numbers | tags (the tracer's trace) and parents |
# | Leaked tracers detected by | comparing a level with the stack entry at its number | a `finished` flag on the trace |
# | A rule's own operations | found their level by searching again | go to the parent, made current explicitly (`bind` leaves the evaluation trace current) |
#
# What got harder: every trace must now decide, for *each* operation it is
# given, whether the operation is its business, and hand it to its parent if
# not (Part 1's search made that decision once, in `bind`), and every trace
# must say under which trace its rules run. The saving is in `bind` and in
# the state around it: no levels, no dynamic level, no boxing and unboxing.
#
# The jaxpr-level machinery (types, type checking, lowering, compilation,
# partial evaluation of jaxprs with `split_call_jaxpr`, transposition) did not
# change at all: it works on jaxprs, not on tracers. That is why only the
# tracing half of this book needed a second version.
#
# How the book keeps the two cores apart: this chapter's library cells are
# tagged `export-stackless` instead of `export`, and the tangler makes them the
# body of a function whose names become the module `autodidax.stackless`, so
# the new `bind`, `Trace` and `jvp` replace nothing in `autodidax`. The new
# rules live in this core's own tables (`jvp_rules`, `vmap_rules`), not on the
# primitives, so the {ref}`rule table <rule-table>`, read off the main module,
# does not list them.
#
# (part10-jax-differs)=
# ## Where real JAX differs
#
# - JAX's context is `jax._src.core.trace_ctx`; `set_current_trace(trace)` and
#   `take_current_trace()` are its context managers. `Primitive.bind` works as
#   ours: it takes the current trace and makes the evaluation trace
#   (`core.eval_trace`) current while `bind_with_trace` hands the primitive to
#   that trace's `process_primitive` (a hand-inlined
#   `with take_current_trace()`). `JVPTrace.process_primitive` runs the JVP rule
#   inside `with core.set_current_trace(self.parent_trace)`, and the evaluation
#   trace refuses tracers (`check_eval_args`), so a rule run without it fails
#   as `CarelessJVPTrace` did above, with an `UnexpectedTracerError`.
# - A JVP trace is `JVPTrace(parent_trace, tag)`, and it recognizes its tracers
#   by `tracer._trace.tag is self.tag` rather than by the trace object itself:
#   the tag is a `TraceTag`, and a transformation that creates several trace
#   objects (for instance one per call it differentiates) gives them all one
#   tag. Batching is `BatchTrace(parent_trace, tag, axis_data)`. See
#   `jax/_src/interpreters/ad.py` and `batching.py` in the installed JAX.
# - JAX's tangents for constants are symbolic zeros (`Zero`), so "is this
#   operation mine" is "does any input have a non-zero tangent"; ours is
#   "does any input carry my tag".
# - `find_top_trace` survives as a one-line function that ignores its
#   argument and returns the current trace; it is public in `jax.extend.core`,
#   and only its old `jax.core` alias is deprecated (its warning points to
#   `jax.extend.core`). Levels,
#   sublevels and `MainTrace` are gone; JAX's 0.4.36
#   [changelog](https://docs.jax.dev/en/latest/changelog.html) describes the
#   change as making dispatch "purely a function of context rather than a
#   function of both context and data".
# - JAX 0.10.2 also records tangents in a staging trace (its `tangent_trace`),
#   but with one trace, `LinearizeTrace`, where this chapter stacks a
#   `JVPTrace` on a `PartialTrace`. For each primitive it runs a linearization
#   rule with its parent current (from `primitive_linearizations`, or derived
#   from the JVP rule when the primitive has none), which computes the primal
#   outputs and residuals, then applies the linear function it returns to the
#   tangents with the tangent trace current. See Part 4's
#   {ref}`Where real JAX differs <part4>`.
# - JAX detects a leaked tracer when it reaches `bind` with an invalidated
#   trace (`trace.is_valid()`), or when the evaluation trace meets any tracer at
#   all, and raises `UnexpectedTracerError`. Not every transformation
#   invalidates its trace, though: a tracer leaked from `jax.vmap` is refused
#   later, but one leaked from `jax.jvp` stays valid, and `jax.make_jaxpr` of a
#   function that closes over it records it as a constant without complaint.
#   This core is stricter: every transformation marks its trace finished.
#
# ## Summary
#
# - One context variable, the current trace, replaces the stack of levels and the
#   dynamic level; `bind` hands each primitive to it, with the evaluation trace
#   current while it is processed.
# - So each trace records its parent and runs its rules with the parent
#   current, and a rule's operations go one step outwards: the chain of parents
#   is the stack, and nobody searches it.
# - Tracers are tagged with their trace; a trace unpacks its own and treats
#   every other value as a constant, which prevents perturbation confusion.
# - Staging records every operation because its trace is current: omnistaging
#   needs no extra machinery.
# - Everything that works on jaxprs — type checking, compilation, partial
#   evaluation, transposition — is reused unchanged from Parts 2–4.
#
# ## Exercises
#
# **1. The stack is still there.** Write `trace_chain()`, which lists the types
# of the current trace and its ancestors, and print it from inside a function
# transformed by `jvp(vmap(...))`. Compare with the stack Part 1 printed for
# the same nesting.


# %% tags=["hide-input"]
# @title Solution 1: walking the parents
def trace_chain():
    chain, trace = [], current_trace()
    while trace is not None:
        chain.append(type(trace).__name__)
        trace = trace.parent
    return chain


def spy(x):
    print(trace_chain())
    return sin(x)


_ = jvp(vmap(spy), (xs,), (np.ones(3),))

# %% [markdown]
# **2. `jacfwd` in the new core.** Build `jacfwd(f)(x)` for a vector `x` as
# `vmap` of `jvp` over the rows of an identity matrix, and check it against
# `jax.jacfwd` on $x \mapsto \sin(x)\,x$.

# %% tags=["hide-input"]
# @title Solution 2: jacfwd = vmap of jvp
import jax


def jacfwd(fun):
    def jac(x):
        column = lambda v: jvp(fun, (x,), (v,))[1]
        return vmap(column)(np.eye(x.shape[0]))

    return jac


h = lambda x: sin(x) * x
with jax.enable_x64(True):
    print(np.allclose(jacfwd(h)(x0), jax.jacfwd(lambda x: jax.numpy.sin(x) * x)(x0)))


# %% [markdown]
# **3. A new primitive.** The appendix gave the main module `exp_p` with all its
# rules. Teach this core `exp` with a wrapper and a JVP rule only, and check
# `grad` of `exp(sin(x))`: the `impl`, abstract evaluation, lowering and
# transpose rules come from the main module.


# %% tags=["hide-input"]
# @title Solution 3: exp in the stackless core
def exp(x):
    return bind(ad.exp_p, x)


jvp_rules[ad.exp_p] = lambda p, t: ([y := exp(p[0])], [mul(t[0], y)])
print(grad(lambda x: exp(sin(x)))(0.7), np.exp(np.sin(0.7)) * np.cos(0.7))
print(jit(grad(lambda x: exp(sin(x))))(0.7))
