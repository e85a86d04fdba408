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
# (part2)=
# # Part 2: Jaxprs, a language for staged programs
#
# :::{admonition} Where we are
# :class: note
# {ref}`Part 1 <part1>` gave us primitives that all go through
# [`bind`](#part1-bind), the {ref}`interpreter stack <part1-stack>` of traces
# and tracers, {ref}`pytrees <part1-pytrees>`, and two transformations that
# nest in any order: [`jvp`](#part1-jvp) and [`vmap`](#part1-vmap).
# :::
#
# The interpreters of {ref}`Part 1 <part1>` work *on the fly*: `jvp` and `vmap`
# compute while your function runs, one primitive at a time, and forget each
# operation as soon as it is done. That is enough for differentiation and
# batching, but not for compilation. A compiler such as XLA wants the *whole*
# program up front, so it can fuse loops, plan memory and pick kernels. To hand it
# one, we need a way to run a Python function once and **record** what it does,
# as a program in a small language of our own.
#
# JAX calls that language **{term}`jaxpr`** (short for JAX expression). This chapter
# builds it:
#
# 1. the data structures of the language — variables, {term}`literals <literal>`,
#    {term}`equations <equation>` — and a
#    printer that shows them the way JAX does;
# 2. **{term}`abstract evaluation`** rules that compute each primitive's output type from
#    its input types, and a **type checker** built on them;
# 3. an evaluator that runs a jaxpr by calling `bind`, which means a jaxpr can be
#    differentiated or batched like any Python function;
# 4. `make_jaxpr`, which produces a jaxpr by {term}`tracing`: running the function on
#    tracers that write down every primitive they meet;
# 5. a flaw in choosing interpreters by data dependence, and its fix: a
#    *{term}`dynamic level`*, the level where the search for an interpreter
#    starts, which is the recording level while we record.
#
# (part2-setup)=
# ## Picking up where Part 1 left off
#
# The folded cell loads Part 1's library code into this notebook (not as an
# import), so that this chapter's replacements are seen by Part 1's code too, as
# if both chapters ran in one kernel.

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

book_setup.load_book(globals(), before="part2_jaxprs")


# %% [markdown]
# (part2-language)=
# ## The language
#
# A jaxpr is a function written in a tiny first-order language. It takes some
# arrays, applies a sequence of primitives, and returns some of the results:
#
# ```text
# jaxpr    ::= { lambda binder* . let equation* in ( atom* ) }
# binder   ::= var:type
# equation ::= binder* = primitive[param*] atom*
# atom     ::= var | literal
# type     ::= dtype[dim, ...]            e.g. float64[3,4], bool[]
# ```
#
# Every variable is bound exactly once, either as an input of the jaxpr or as the
# output of one equation, and is only used after it is bound. The place where it
# is bound is its {term}`binder`; an {term}`atom`, the operand of an equation, is a
# variable or a literal. There are no
# loops, no branches (until later parts add primitives that hold jaxprs of their
# own), no mutation and no Python: just primitives applied to variables. That
# restriction is what makes the language easy to compile, type-check and
# transform.
#
# In code, a variable is an object whose only attribute is its type; its printed
# name is assigned only when the jaxpr is printed, so building jaxprs never
# worries about names. A literal is a scalar constant written directly into an
# equation, such as the `2.0` in `mul a 2.0`.


# %% tags=["export"]
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


# %% tags=["export", "hide-input"]
# @title How a jaxpr type prints, (float64[3]) -> (float64[3]); a Jaxpr's repr
def _jaxpr_type_str(self: JaxprType) -> str:
    ins = ", ".join(t.str_short() for t in self.in_types)
    outs = ", ".join(t.str_short() for t in self.out_types)
    return f"({ins}) -> ({outs})"


JaxprType.__str__ = _jaxpr_type_str
Jaxpr.__repr__ = lambda self: f"<Jaxpr with {len(self.eqns)} equations>\n{self}"


# %% [markdown]
# (part2-printing)=
# ### Printing
#
# The printer names variables `a`, `b`, ..., `z`, `aa`, `ab`, ... in the order
# they are bound, writes each binder with its type, and writes params in square
# brackets after the primitive's name. A param that is itself a jaxpr (later
# parts have those) is printed on its own lines, indented, so nested programs read
# like nested blocks.


# %% tags=["export", "hide-input"]
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


# %% [markdown]
# `_letters` turns a count into a name, and `_pp_params` writes the params and
# returns the lines of any nested jaxpr; unfold to see them.


# %% tags=["export", "hide-input"]
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


# %% [markdown]
# To see the printer at work, let us build the jaxpr of
# $x \mapsto \sin(x) \cdot 3 + x$ by hand, for a vector of three floats:

# %%
x, y, z, three, out = (Var(ShapedArray((3,), np.float64)) for _ in range(5))
hand_made = Jaxpr(
    in_binders=[x],
    eqns=[
        JaxprEqn(sin_p, [x], {}, [y]),
        JaxprEqn(broadcast_p, [Lit(3.0)], {"shape": (3,), "axes": (0,)}, [three]),
        JaxprEqn(mul_p, [y, three], {}, [z]),
        JaxprEqn(add_p, [z, x], {}, [out]),
    ],
    outs=[out],
)
print(hand_made)


# %% [markdown]
# Soon we will never build jaxprs by hand again: tracing will do it. But
# hand-made jaxprs are useful for one more thing, testing the type checker.
#
# (part2-abstract-eval)=
# ## Abstract evaluation and type checking
#
# Part 1's wrappers already checked their arguments' shapes and dtypes before
# calling `bind`. A jaxpr, though, can be built without the wrappers, and later
# transformations will produce jaxprs of their own; so the language needs its own
# notion of which equations make sense. We get it from one more rule per
# primitive: **abstract evaluation**, which maps the types of the inputs (and
# the params) to the types of the outputs, or raises an error explaining why the
# inputs do not fit. The same rules will do a second job in a moment: when we
# trace a function, they tell us the type of each new variable without computing
# anything.
#
# Each rule below computes the output's shape and dtype, after one call that
# checks the inputs and the params and says what is wrong in terms of types
# (`sin: expected a float array, got int64[2]`), since a jaxpr built by hand
# never passed through a wrapper. The checks are folded below the rules; a
# string such as `"iuf"` lists the NumPy dtype kinds an operation accepts
# (signed and unsigned integers, floats).


# %% tags=["export"]
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


# %% tags=["export", "hide-input"]
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


# %% [markdown]
# The type checker walks the equations in order, keeping the set of variables
# bound so far. For each equation it checks that every input is already bound,
# asks the primitive's abstract evaluation rule for the output types, compares
# them with the types the equation declares, and binds the outputs, refusing any
# variable that is bound twice.


# %% tags=["export"]
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


# %% [markdown]
# The checks raise `JaxprTypeError`s that name variables the way the printer
# does, so an error can be read next to the printed jaxpr:


# %% tags=["export", "hide-input"]
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


# %%
print(typecheck_jaxpr(hand_made))

# %% [markdown]
# Now some broken jaxprs, each printed above its error. Each is rejected with an
# error that points at the offending equation and at the variable by its printed
# name (`stray`, used but never bound, prints as `c`). (`show_error`, from the setup cell, prints an
# exception's type and message instead of a traceback.)

# %%
x, y, z, stray = (Var(ShapedArray((), np.float64)) for _ in range(4))
vec = Var(ShapedArray((3,), np.float64))
unbound = Jaxpr([x], [JaxprEqn(mul_p, [x, stray], {}, [y])], [y])
rebound = Jaxpr([x], [JaxprEqn(sin_p, [x], {}, [x])], [x])
bool_as_float = Jaxpr([x], [JaxprEqn(gt_p, [x, x], {}, [y])], [y])
mismatch = Jaxpr([x, vec], [JaxprEqn(add_p, [x, vec], {}, [z])], [z])

for bad in [unbound, rebound, bool_as_float, mismatch]:
    print(bad)
    show_error(typecheck_jaxpr, bad)
    print()


# %% [markdown]
# ## Evaluating a jaxpr
#
# Running a jaxpr is a loop over its equations with an environment that maps
# variables to values. The one design decision that matters: each equation is
# applied with **`bind`**, not with the primitive's `impl` rule directly. So when
# the inputs of `eval_jaxpr` are plain arrays, the evaluation interpreter runs
# each equation; but when they are tracers, the equations go to whichever
# interpreter owns them. A jaxpr is therefore a function like any other, and can
# be differentiated, batched, or traced into another jaxpr.


# %% tags=["export"]
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


# %% [markdown]
# Before it runs anything, `eval_jaxpr` checks that the arguments match the
# jaxpr's inputs in number, shape and dtype:


# %% tags=["export", "hide-input"]
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


# %%
v = np.array([0.0, 1.0, 2.0])
print(eval_jaxpr(hand_made, [v]), np.sin(v) * 3 + v)
print(jvp(jaxpr_as_fun(hand_made), (v,), (np.ones(3),)))
print(vmap(jaxpr_as_fun(hand_made), (0,))(np.stack([v, 2 * v])))


# %% [markdown]
# (part2-tracing)=
# ## Building jaxprs by tracing
#
# Writing jaxprs by hand does not scale. Instead we let the function write its own
# jaxpr: run it on tracers that do not compute anything, but *record* every
# primitive applied to them. This is one more interpreter on the stack, the
# `JaxprTrace`.
#
# Its tracers carry nothing but an abstract value: while recording we do not
# know the values, only the types (that is the point: the jaxpr must work for any
# values of those types). Each primitive applied to them produces new tracers
# whose types come from the abstract evaluation rules, and an equation that
# connects the inputs to the outputs.
#
# The recording itself lives in a **builder** object, which the trace's level
# carries as its payload. It maps each tracer to the atom that stands for it in
# the jaxpr: a new variable, or, for a scalar constant, a literal written
# straight into the equations. It records the equations in terms of those atoms
# and keeps the constants the function used. At the end, the constants that did
# not become literals turn into the jaxpr's first inputs.


# %% tags=["export"]
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


# %% [markdown]
# The trace itself is short. `new_arg` makes a tracer for an input of the function.
# `pure` and `lift` turn a constant, or a tracer of an outer transformation that
# the function closed over, into a *{term}`constant`* of the jaxpr: the builder records
# its value, and the jaxpr gets an input for it (a scalar constant becomes a
# literal instead, as above). `process_primitive` asks the
# abstract evaluation rule for the output types, makes the output tracers and
# records the equation.


# %% tags=["export"]
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


# %% [markdown]
# A first `make_jaxpr` follows the pattern of `jvp_flat` and `vmap_flat`: flatten
# the inputs, push a level, run the function on tracers, and collect. The inputs
# are abstract values (we trace for *types*, not values), given as a pytree
# like the function's arguments; for convenience an example array also works and
# stands for its type (the folded `_avals_for_tracing` below does that
# flattening, and refuses anything else).


# %% tags=["export"]
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


# %% tags=["export", "hide-input"]
# @title Checks: make_jaxpr's arguments are types, or arrays standing for them
def _avals_for_tracing(args: Any, who: str) -> tuple[list[ShapedArray], PyTreeDef]:
    """Flatten make_jaxpr's arguments; arrays stand for their types."""
    leaves, in_tree = tree_flatten(args)
    avals = [
        x if isinstance(x, ShapedArray) else get_aval(_as_input(x, who)) for x in leaves
    ]
    return avals, in_tree


# %% [markdown]
# Two details. The function may return a constant, or an input unchanged;
# `full_raise` turns every output into a tracer of this trace, so a constant
# output goes through the builder like any other constant and becomes a literal
# or a constant input. And the builder keys constants by `id`: NumPy arrays are
# not hashable, and keying by object means that one array used ten times becomes
# one input of the jaxpr, not ten. Let us trace something:


# %%
def f(x, y):
    z = sin(x) * y
    return reduce_sum(z, axis=0) + 1.0, greater(z, y)


vec3 = ShapedArray((3,), np.float64)
jaxpr, consts, out_tree = make_jaxpr_v1(f, vec3, vec3)
print(jaxpr)
print(typecheck_jaxpr(jaxpr), out_tree)

# %% [markdown]
# The `1.0` became a literal, and the output structure, a pair, is kept in
# `out_tree`. Evaluating the jaxpr gives the same numbers as calling `f`:

# %%
x0, y0 = np.array([0.5, 1.0, 2.0]), np.array([1.0, -1.0, 3.0])
print(*eval_jaxpr(jaxpr, [*consts, x0, y0]))
print(*f(x0, y0))


# %% [markdown]
# Tracing sees only primitives, so everything else about the Python function
# disappears: helper functions are inlined, loops with a fixed trip count are
# unrolled, and pytrees become flat lists of variables. Here a loop runs three
# times, so the jaxpr holds three copies of its body:


# %%
def horner(coefficients, x):  # highest coefficient first
    acc = coefficients[0]
    for c in coefficients[1:]:
        acc = acc * x + c
    return acc


scalar = ShapedArray((), np.float64)
print(make_jaxpr_v1(horner, [scalar] * 4, scalar)[0])

# %% [markdown]
# (part2-dynamic)=
# ## When data dependence is not enough
#
# Try tracing a function whose arithmetic does not touch its inputs:

# %%
print(make_jaxpr_v1(lambda: mul(2.0, 2.0))[0])
print(make_jaxpr_v1(lambda x: x * 2.0, vec3)[0])


# %% [markdown]
# In the first jaxpr the multiplication is gone: the function returns a constant
# 4.0. In the second, the scalar `2.0` was broadcast to a vector *while tracing*,
# and the jaxpr received the result, a whole `float64[3]` array, as a constant
# input: `a`, the first input, is the broadcast constant `[2., 2., 2.]`, and `b`
# is `x`. Both jaxprs follow from
# {ref}`Part 1's rule for choosing an interpreter <part1-bind>`: `bind` looks
# only at the *inputs* of an operation. `mul(2.0, 2.0)` involves no tracer, so the
# evaluation interpreter runs it on the spot, and the recording interpreter never
# hears of it.
#
# For `jvp` and `vmap` that was exactly right: an operation on constants has
# zero tangent and no batch axis, so computing it eagerly is the efficient
# choice. For {term}`staging` it is wrong. A program that builds a large constant array
# (say, an identity matrix, or random weights from a seed) would compute it in
# Python, transfer it as data, and never let the compiler see or fuse that work.
# And a transformation that wants to see *every* operation, such as a profiler or
# a program printer, would silently miss some.
#
# Here is the search, in {ref}`Part 1's <part1-bind>` `find_top_trace`:
#
# ```python
# top = _search_start()  # in Part 1: level 0, the evaluation level
# for x in args:
#     if isinstance(x, Tracer):
#         x.check_live()
#         if x._trace.level.number > top.number:
#             top = x._trace.level
# ```
#
# The fix, which JAX adopted under the name *{term}`omnistaging`*, changes only
# the starting value of this search. We add a second piece of interpreter
# state, the **dynamic level**, and start the search there instead of at level
# 0. Normally the dynamic level is level 0, and nothing changes. While
# `make_jaxpr` runs the function, it is the recording level. Then an operation
# whose inputs are all constants, or tracers of lower levels (a `make_jaxpr`
# inside a `jvp`, say), lands on the recorder, which lifts those tracers into
# constants of the jaxpr; an operation on a tracer of a higher level (a
# transformation started inside the traced function) still goes to that
# transformation, the highest level among its inputs.
#
# The cell below replaces Part 1's interpreter state (`_InterpreterState` and
# `_state`) with one that also holds the dynamic level, adds `new_dynamic` to
# set it for a block, and redefines `_search_start` to return it. Because
# `find_top_trace` calls `_search_start()` by name, `bind` and the whole of
# Part 1's machinery pick up the new rule.


# %% tags=["export"]
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


# %% [markdown]
# Tracing sets the dynamic level around the call of the function. The folded
# cell defines `_trace_to_jaxpr`: `_trace_to_jaxpr_v1` with one new line:
#
# ```python
#         with new_dynamic(level):
#             outs = flat_f(*tracers_in)
# ```


# %% tags=["export", "hide-input"]
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


# %% [markdown]
# `make_jaxpr` is that function, `make_jaxpr_v1` with the one new line:


# %% tags=["export"]
def make_jaxpr(f: Callable, *avals_in: Any) -> tuple[Jaxpr, list, PyTreeDef]:
    """Trace ``f`` at the given types into ``(jaxpr, consts, out_tree)``."""
    return _trace_to_jaxpr(f, avals_in)


# %% [markdown]
# A probe shows where the search starts, outside and inside a traced function:

# %%
print(find_top_trace([]).level)
_ = make_jaxpr(lambda: print(find_top_trace([]).level))

# %% [markdown]
# With the dynamic level in place, both examples keep their arithmetic:

# %%
print(make_jaxpr(lambda: mul(2.0, 2.0))[0])
print(make_jaxpr(lambda x: x * 2.0, vec3)[0])


# %% [markdown]
# Nothing else is affected: outside `make_jaxpr` the dynamic level is the
# evaluation level, and transformations inside a traced function still receive
# their own operations. Tracing a `jvp` shows both:


# %%
def tangent_of_sin_cos(x):
    return jvp(lambda t: sin(t) * cos(2.0), (x,), (1.0,))[1]


print(make_jaxpr(tangent_of_sin_cos, scalar)[0])


# %% [markdown]
# Reading this jaxpr is a good test of Part 1. The input `a` is `x`: `sin a`
# and its derivative rule's `cos a` come first, then the tangent `d`. Next,
# `e = cos 2.0` is the operation on a constant that `make_jaxpr_v1` would have
# folded to the literal −0.416; `f = mul b e` is the primal output, which
# nothing uses (Exercise 2 removes such equations); the rest is the product
# rule for the tangent. The jaxpr is what JAX would call the
# *forward-mode derivative, staged out*: later parts compile it, and Part 4 learns
# to split it into the part that depends on the tangent and the part that does
# not.
#
# ## A jaxpr next to its function
#
# With tracing complete, here is a function's source next to its jaxpr, each
# line of Python in the color of the equations it produced. One line can
# produce several equations: the scalar `0.5` needs a `broadcast` to meet a
# vector, and `-` becomes a `neg` and an `add`. Both come from Part 1's
# operators, which broadcast a Python number to the other operand's shape
# (the primitives themselves demand equal shapes) and spell `-` as `neg` then
# `add`. (The
# appendix's NumPy-style operators record one `sub`.)


# %%
def soft_clip(x, limit):
    scaled = x * 0.5
    bent = sin(scaled)  # smooth and bounded
    shifted = bent - limit
    return shifted * limit


# %% mystnb={"image": {"alt": "The source code of soft_clip on the left and its jaxpr on the right. Each line of the function and the equations it produced share a color: the line x * 0.5 produced a broadcast and a mul, sin(scaled) produced a sin, bent - limit produced a neg and an add, and shifted * limit produced a mul."}} tags=["hide-input"]
# @title Draw the figure: the source of soft_clip next to its jaxpr
from figures import source_and_jaxpr_figure

source_and_jaxpr_figure(soft_clip, (vec3, vec3), make_jaxpr, JaxprTrace)


# %% [markdown]
# ## Python control flow under tracing
#
# A recording tracer has no value, so Python cannot decide a branch that depends
# on one. Asking for its truth value raises an error (a
# {term}`concretization error`); a `JaxprTracer` gives it a message of its own
# (folded) that explains why and what to do instead:


# %% tags=["export", "hide-input"]
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


# %%
def relu_with_if(x):
    return x if x > 0.0 else 0.0 * x


show_error(lambda: make_jaxpr(relu_with_if, scalar))


# %% [markdown]
# Branches that depend only on *static* information — shapes, dtypes, Python
# values that are not traced — are fine, because they are decided while tracing
# and leave no trace in the jaxpr. Here the function's behaviour depends on the
# rank of its input, which is part of the type:


# %%
def total(x):
    while x.ndim > 0:  # static: the rank is known while tracing
        x = reduce_sum(x, axis=0)
    return x


print(make_jaxpr(total, ShapedArray((2, 3, 4), np.float64))[0])

# %% [markdown]
# ## Errors while tracing
#
# A shape or dtype mistake is raised *during tracing*, from the line that made
# it (a traceback would show it), before any data exists. Part 1's wrappers
# catch most mistakes before `bind` runs, as `add` does in the first line below;
# calling `bind` directly skips them, and then the abstract evaluation rule
# catches the mistake as the equation is recorded:

# %%
show_error(lambda: make_jaxpr(lambda x, y: add(x, y), vec3, scalar))
show_error(lambda: make_jaxpr(lambda x: bind(sin_p, x), ShapedArray((2,), np.int64)))
show_error(lambda: make_jaxpr(lambda x: bind(transpose_p, x, perm=(0, 0)), vec3))


# %% [markdown]
# ## Where real JAX differs
#
# - `jax.make_jaxpr(f)(*example_args)` takes example *values* (or
#   `jax.ShapeDtypeStruct`s) and returns a `ClosedJaxpr`, a jaxpr packaged with its
#   constants; ours returns the constants separately and puts them first among
#   the inputs. JAX's printer separates the two kinds of input with a `;`: for
#   `lambda x: x + c`, with `c` a NumPy array of three floats, it prints
#   `{ lambda a:f32[3]; b:f32[3]. let c:f32[3] = add b a in (c,) }`, with short
#   dtype names (`f32`). See
#   [Understanding jaxprs](https://docs.jax.dev/en/latest/jaxpr.html).
# - JAX's equations carry more: source information (a traceback and a stack of
#   names, which is how JAX errors point at your line), effects, and a context
#   of compilation settings. Its variables print with their type only when they
#   are bound, as ours do.
# - JAX marks Python scalars as *weakly typed*, so `x * 2.0` on a vector records
#   `mul a 2.0:f32[]`: a literal, printed with its type, and no `broadcast`. Our
#   primitives insist on equal shapes, so our jaxprs contain the explicit
#   broadcast.
# - Omnistaging became JAX's default in version 0.2.0 (2020), and its only mode
#   from 0.2.12 on (see those releases in JAX's
#   [changelog](https://docs.jax.dev/en/latest/changelog.html)); the
#   [design note](https://docs.jax.dev/en/latest/jep/4410-omnistaging.html)
#   explains the motivation in detail. Today's JAX keeps no stack to search:
#   `bind` hands every operation to the *current trace*, held in a thread-local
#   context, and a transformation makes the trace it was started in current
#   while it applies its rules.
#
# ## Summary
#
# - A jaxpr is a first-order program: typed binders, equations that apply
#   primitives with params to atoms (variables or literals), and outputs. It has
#   no Python left in it.
# - Abstract evaluation rules compute each primitive's output types from its
#   input types; the type checker and the tracer both use them, so type errors
#   surface while tracing.
# - `eval_jaxpr` applies equations with `bind`, so jaxprs compose with every
#   transformation.
# - `make_jaxpr` traces with an interpreter that records instead of computing. A
#   builder owns the equations, the constants and the tracer-to-variable map; scalar
#   constants become literals.
# - Choosing interpreters by data dependence would let operations on constants
#   escape the recording. A dynamic level where the search for the top trace
#   starts, the recording level while `make_jaxpr` runs, makes staging see
#   everything.
#
# Next, {ref}`Part 3 <part3>` hands jaxprs to the XLA compiler: `jit`.
#
# ## Exercises
#
# **1. Count the work.** Write `count_primitives(jaxpr)`, returning a dict from
# primitive name to the number of equations that use it, and check it on the
# jaxpr of `horner` with five coefficients against the number you expect.


# %% tags=["hide-input"]
# @title Solution 1: counting primitives
def count_primitives(jaxpr):
    counts = {}
    for eqn in jaxpr.eqns:
        counts[eqn.primitive.name] = counts.get(eqn.primitive.name, 0) + 1
    return counts


counts = count_primitives(make_jaxpr(horner, [scalar] * 5, scalar)[0])
print(counts, counts == {"mul": 4, "add": 4})


# %% [markdown]
# **2. Dead code.** Tracing records every primitive, including ones whose
# results are never used. Write `eliminate_dead_code(jaxpr)`, which returns a
# jaxpr without the equations that do not contribute to the outputs (walk the
# equations backwards, keeping a set of variables that are needed). Check that
# the result type-checks and computes the same outputs.


# %% tags=["hide-input"]
# @title Solution 2: dead-code elimination
def eliminate_dead_code(jaxpr):
    needed = {x for x in jaxpr.outs if isinstance(x, Var)}
    kept = []
    for eqn in reversed(jaxpr.eqns):
        if any(v in needed for v in eqn.out_binders):
            kept.append(eqn)
            needed.update(x for x in eqn.inputs if isinstance(x, Var))
    return Jaxpr(jaxpr.in_binders, kept[::-1], jaxpr.outs)


def wasteful(x):
    unused = cos(x) * x  # noqa: F841 (never returned: dead code on purpose)
    return sin(x)


before = make_jaxpr(wasteful, vec3)[0]
after = eliminate_dead_code(before)
print(len(before.eqns), "->", len(after.eqns))
print(typecheck_jaxpr(after))
print(np.allclose(eval_jaxpr(after, [v])[0], eval_jaxpr(before, [v])[0]))


# %% [markdown]
# **3. A jaxpr of a jaxpr.** Because `eval_jaxpr` uses `bind`, tracing it with
# `make_jaxpr` gives back an equivalent jaxpr. Use that to write
# `batch_jaxpr(jaxpr, batch_size)`: a jaxpr that computes the original on a batch
# of inputs, stacked along axis 0, by tracing `vmap` of the jaxpr's function.
# Check it on the jaxpr of `f` from above (which has no constants, so every
# input is batched).


# %% tags=["hide-input"]
# @title Solution 3: batching a jaxpr
def batch_jaxpr(jaxpr, batch_size):
    in_types = typecheck_jaxpr(jaxpr).in_types
    batched = [ShapedArray((batch_size, *t.shape), t.dtype) for t in in_types]
    batched_fun = vmap(jaxpr_as_fun(jaxpr), 0)
    return make_jaxpr(batched_fun, *batched)


f_jaxpr, f_consts, _ = make_jaxpr(f, vec3, vec3)
batched, batched_consts, _ = batch_jaxpr(f_jaxpr, batch_size=2)
print(typecheck_jaxpr(batched))
xs, ys = np.stack([x0, 2 * x0]), np.stack([y0, -y0])
got = eval_jaxpr(batched, [*batched_consts, xs, ys])
want = [f(xs[i], ys[i]) for i in range(2)]
print(np.allclose(got[0], [w[0] for w in want]))
print(np.array_equal(got[1], np.stack([w[1] for w in want])))
