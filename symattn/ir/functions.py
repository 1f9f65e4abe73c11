"""The builtin elementwise functions: one record each, read by every stage.

Contract: `FUNCTIONS` maps a name (`exp`, `tanh`, ...) to a `Function` that
says everything symattn knows about it: its exact SymPy value (element level,
constants, SymPy forms), its float64 value (the reference evaluator) and, where
the exact value is a SymPy function of its own (`exp(u)`, not arithmetic like
sigmoid's), its mpmath value (30-digit evaluation), all with float64's answers
at the edges; its local derivative (one rule used by
the matrix level, index notation and the CUDA target's forward mode); how the
static finiteness analysis treats it; its NumPy, torch, Triton and CUDA spellings; whether it
is typeset as a named function. Adding a function is adding one record with
`register` (tensorgrad's FunctionSignature, tinygrad's op tables): the parser,
validation, derive, check, the NumPy and CUDA targets and the documents all
read this table when they run. `table(field, extra)` is a live read-only view
of one field over every registered function (plus `neg` and the like);
`mpmath_table()` maps the SymPy function class of each exact value to its mpmath
evaluation.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Callable

import mpmath
import numpy as np
import sympy

from . import build as b

__all__ = ["Function", "FUNCTIONS", "register", "table", "mpmath_table", "Operation", "OPERATIONS"]


@dataclass(frozen=True)
class Function:
    """Everything about one elementwise function `name(A)`."""

    name: str
    exact: Callable[[Any], Any]                  # SymPy value of one entry (exact; float64 at the edges)
    float64: Callable[[np.ndarray], np.ndarray]  # float64 value of an array (NumPy, IEEE semantics)
    rule: str                                    # the derivative rule as documents print it
    derivative: Callable                         # (A, f(A) as a node, G, recorder) -> the adjoint of A
    total: bool = True                           # finite for every finite argument (log, sqrt: no)
    absorbs_minus_inf: bool = False              # f(-inf) is finite (exp, tanh, sigmoid, relu)
    numpy: str = ""                              # template over the operand "{x}"
    numpy_helper: str | None = None              # a runtime helper the template calls
    cuda: str = ""                               # template over the operand "{x}", float32
    triton: str = ""                             # template over a float32 tile "{x}" (Triton kernels)
    torch: str = ""                              # template over a torch tensor "{x}" (empty: the NumPy template,
                                                 # where it calls neither NumPy nor a helper)
    named: bool = False                          # typeset upright as a named function (exp, log, ...)
    steps: bool = False                          # piecewise constant (floor, ceil): its derivative is 0 where
                                                 # it has one, so no gradient flows through it (torch's too)
    mpmath: Callable[[Any], Any] | None = None   # mpmath value of one entry (float64 at the edges), needed
                                                 # where `exact` writes a SymPy function (exp(u), log(u))

    @property
    def adjoint(self) -> tuple[str, Callable]:
        """(rule, derivative): what derive records and applies."""
        return self.rule, self.derivative

    @property
    def numpy_code(self) -> tuple[str, str | None]:
        """(template, helper): what the NumPy printer writes."""
        return self.numpy, self.numpy_helper

    @functools.cached_property
    def sympy_function(self) -> type | None:
        """The SymPy function class `exact` writes (sympy.exp for exp); None where it writes
        arithmetic or cases (sigmoid, sqrt, relu), which need no evaluation of their own."""
        form = self.exact(sympy.Dummy("u"))
        return form.func if isinstance(form, sympy.Function) and not isinstance(form, sympy.Piecewise) else None


FUNCTIONS: dict[str, Function] = {}


def register(function: Function) -> Function:
    """Add (or replace) a builtin function; every stage sees it from then on."""
    FUNCTIONS[function.name] = function
    return function


class _Table(Mapping):
    """name -> one field of its record, live, with `extra` entries (such as `neg`) in front."""

    def __init__(self, field: str, extra: Mapping[str, Any]) -> None:
        self.field = field
        self.extra = dict(extra)

    def __getitem__(self, name: str) -> Any:
        if name in self.extra:
            return self.extra[name]
        return getattr(FUNCTIONS[name], self.field)

    def __iter__(self) -> Iterator[str]:
        yield from self.extra
        yield from (n for n in FUNCTIONS if n not in self.extra)

    def __len__(self) -> int:
        return len(set(self.extra) | set(FUNCTIONS))


def table(field: str, extra: Mapping[str, Any] | None = None) -> Mapping[str, Any]:
    """A live view of `field` over every registered function, plus `extra`."""
    return _Table(field, extra or {})


def mpmath_table() -> dict[type, Callable[[Any], Any]]:
    """SymPy function class -> its mpmath evaluation, over every registered function that has one."""
    return {f.sympy_function: f.mpmath for f in FUNCTIONS.values()
            if f.mpmath is not None and f.sympy_function is not None}


def _log(u):
    return -sympy.oo if sympy.sympify(u).is_zero else sympy.log(u)  # log(0) is -inf, not zoo


def _mp_log(x):
    """log with float64's answers at the edges: -inf at 0, NaN below (not a complex number)."""
    if mpmath.isnan(x) or x < 0:
        return mpmath.nan
    return -mpmath.inf if x == 0 else mpmath.log(x)


def _relu(u):
    return sympy.nan if u is sympy.nan else sympy.Piecewise((u, u > 0), (0, True))


def _sigmoid64(x):
    e = np.exp(-np.abs(x))  # never overflows; the where keeps float64's precision on both sides
    return np.where(x >= 0, 1 / (1 + e), e / (1 + e))


for _function in (
    Function("exp", sympy.exp, np.exp, "d exp(A) = exp(A) dA",
             lambda x, n, g, r: b.mul(g, n, r), absorbs_minus_inf=True,
             numpy="np.exp({x})", torch="torch.exp({x})", cuda="expf({x})", triton="tl.exp({x})", named=True, mpmath=mpmath.exp),
    Function("log", _log, np.log, "d log(A) = dA / A",
             lambda x, n, g, r: b.div(g, x, r), total=False,
             numpy="np.log({x})", torch="torch.log({x})", cuda="logf({x})", triton="tl.log({x})", named=True, mpmath=_mp_log),
    Function("sqrt", sympy.sqrt, np.sqrt, "d sqrt(A) = dA / (2 sqrt(A))",
             lambda x, n, g, r: b.div(g, b.mul(b.scalar(2), n, r), r), total=False,
             numpy="np.sqrt({x})", torch="torch.sqrt({x})", cuda="sqrtf({x})", triton="tl.sqrt({x})"),
    Function("abs", sympy.Abs, np.abs, "d abs(A) = sign(A) dA",
             lambda x, n, g, r: b.where(b.compare(">", x, b.scalar(0)), g,
                                        b.where(b.compare("<", x, b.scalar(0)), b.neg(g, r), b.scalar(0))),
             numpy="np.abs({x})", torch="torch.abs({x})", cuda="fabsf({x})", triton="tl.abs({x})", mpmath=abs),
    Function("tanh", sympy.tanh, np.tanh, "d tanh(A) = (1 - tanh(A)^2) dA",
             lambda x, n, g, r: b.mul(g, b.sub(b.scalar(1), b.power(n, b.scalar(2), r), r), r),
             absorbs_minus_inf=True, numpy="np.tanh({x})", torch="torch.tanh({x})", cuda="tanhf({x})",
             triton="_tanh({x})", named=True, mpmath=mpmath.tanh),
    Function("sigmoid", lambda u: 1 / (1 + sympy.exp(-u)), _sigmoid64,
             "d sigmoid(A) = sigmoid(A) (1 - sigmoid(A)) dA",
             lambda x, n, g, r: b.mul(g, b.mul(n, b.sub(b.scalar(1), n, r), r), r), absorbs_minus_inf=True,
             numpy="_sigmoid({x})", numpy_helper="_sigmoid", cuda="sa_sigmoid({x})", triton="tl.sigmoid({x})",
             torch="torch.sigmoid({x})"),
    Function("relu", _relu, lambda x: np.maximum(x, 0.0), "d relu(A) = [A > 0] dA",
             lambda x, n, g, r: b.where(b.compare(">", x, b.scalar(0)), g, b.scalar(0)), absorbs_minus_inf=True,
             numpy="np.maximum({x}, 0)", cuda="fmaxf({x}, 0.0f)", triton="tl.maximum({x}, 0.0)",
             torch="torch.relu({x})"),
    Function("sin", sympy.sin, np.sin, "d sin(A) = cos(A) dA",
             lambda x, n, g, r: b.mul(g, b.unary("cos", x), r),
             numpy="np.sin({x})", torch="torch.sin({x})", cuda="sinf({x})", triton="tl.sin({x})", named=True, mpmath=mpmath.sin),
    Function("cos", sympy.cos, np.cos, "d cos(A) = -sin(A) dA",
             lambda x, n, g, r: b.neg(b.mul(g, b.unary("sin", x), r), r),
             numpy="np.cos({x})", torch="torch.cos({x})", cuda="cosf({x})", triton="tl.cos({x})", named=True, mpmath=mpmath.cos),
    Function("tan", sympy.tan, np.tan, "d tan(A) = (1 + tan(A)^2) dA",
             lambda x, n, g, r: b.mul(g, b.add(b.scalar(1), b.power(n, b.scalar(2), r), r), r), total=False,
             numpy="np.tan({x})", torch="torch.tan({x})", cuda="tanf({x})", triton="(tl.sin({x}) / tl.cos({x}))",
             named=True, mpmath=mpmath.tan),
    Function("exp2", lambda u: sympy.Integer(2) ** u, np.exp2, "d exp2(A) = exp2(A) log(2) dA",
             lambda x, n, g, r: b.mul(g, b.mul(n, b.unary("log", b.scalar(2)), r), r), absorbs_minus_inf=True,
             numpy="np.exp2({x})", torch="torch.exp2({x})", cuda="exp2f({x})", triton="tl.exp2({x})", named=True),
    Function("log2", lambda u: _log(u) / sympy.log(2), np.log2, "d log2(A) = dA / (A log(2))",
             lambda x, n, g, r: b.div(g, b.mul(x, b.unary("log", b.scalar(2)), r), r), total=False,
             numpy="np.log2({x})", torch="torch.log2({x})", cuda="log2f({x})", triton="tl.log2({x})", named=True),
    Function("floor", sympy.floor, np.floor, "d floor(A) = 0",
             lambda x, n, g, r: b.zeros(x.shape),
             numpy="np.floor({x})", torch="torch.floor({x})", cuda="floorf({x})", triton="tl.floor({x})",
             mpmath=mpmath.floor, steps=True),
    Function("ceil", sympy.ceiling, np.ceil, "d ceil(A) = 0",
             lambda x, n, g, r: b.zeros(x.shape),
             numpy="np.ceil({x})", torch="torch.ceil({x})", cuda="ceilf({x})", triton="tl.ceil({x})",
             mpmath=mpmath.ceil, steps=True),
):
    register(_function)
del _function


# --- operations of several operands ---------------------------------------------------------


@dataclass(frozen=True)
class Operation:
    """Everything about one elementwise operation of several operands, a `typed.Apply`:
    `min(a, b)`, `max(a, b)`, `clamp(x, lo, hi)`, `a // b`, `a % b` (NumPy broadcasting)."""

    name: str
    arity: int
    exact: Callable[..., Any]                   # SymPy value of one entry (float64's answers at the edges)
    float64: Callable[..., np.ndarray]          # float64 value of arrays (NumPy, IEEE semantics)
    rules: tuple[str, ...]                      # the derivative rule as documents print it, one line each
    partials: Callable[..., tuple]              # (operands, the result as a node, G, recorder) -> the adjoint
                                                # of each operand (before summing over broadcast axes), or None
    integer: bool = False                       # integer operands only (// and %): no gradient flows
    constant_bounds: bool = False               # operands after the first may read no input or param (clamp)
    infix: str | None = None                    # the spec language's operator (`//`), else a call `name(...)`
    numpy: str = ""                             # template over the operands "{0}", "{1}", ...
    torch: str = ""
    torch_helper: str | None = None             # a runtime helper the torch template calls
    cuda: str = ""
    triton: str = ""


OPERATIONS: dict[str, Operation] = {}


def _nan_or(*args):
    return any(a is sympy.nan for a in args)


def _min(a, b):
    return sympy.nan if _nan_or(a, b) else sympy.Min(a, b)


def _max(a, b):
    return sympy.nan if _nan_or(a, b) else sympy.Max(a, b)


def _floordiv(a, b):
    return sympy.nan if _nan_or(a, b) else sympy.floor(a / b)


def _mod(a, b):
    return sympy.nan if _nan_or(a, b) else sympy.Mod(a, b)


def _shared(loses: str):
    """torch.minimum / maximum's gradient: an operand gets G where it wins, G / 2 at a tie (and G where a
    NaN makes neither compare), 0 where it loses (`loses` is the comparison of it against the other)."""
    def partial(me, other, g):
        half = b.div(g, b.scalar(2))
        return b.where(b.compare(loses, me, other), b.scalar(0), b.where(b.compare("==", me, other), half, g))
    return partial


def _min_partials(args, node, g, rec):
    a, c = args
    share = _shared(">")
    return share(a, c, g), share(c, a, g)


def _max_partials(args, node, g, rec):
    a, c = args
    share = _shared("<")
    return share(a, c, g), share(c, a, g)


def _clamp_partials(args, node, g, rec):
    x, lo, hi = args
    inside = b.logical("and", b.compare(">=", x, lo), b.compare("<=", x, hi))
    return b.where(inside, g, b.scalar(0)), None, None


for _operation in (
    Operation("min", 2, _min, np.minimum,
              ("min(A, B): A gets G where A < B, G / 2 where A == B, 0 where A > B (torch.minimum's convention)",),
              _min_partials, numpy="np.minimum({0}, {1})", torch="_minimum({0}, {1})", torch_helper="_minimum",
              cuda="sa_min({0}, {1})",
              triton="tl.minimum({0}, {1}, propagate_nan=tl.PropagateNan.ALL)"),
    Operation("max", 2, _max, np.maximum,
              ("max(A, B): A gets G where A > B, G / 2 where A == B, 0 where A < B (torch.maximum's convention)",),
              _max_partials, numpy="np.maximum({0}, {1})", torch="_maximum({0}, {1})", torch_helper="_maximum",
              cuda="sa_max({0}, {1})",
              triton="tl.maximum({0}, {1}, propagate_nan=tl.PropagateNan.ALL)"),
    Operation("clamp", 3, lambda x, lo, hi: _min(_max(x, lo), hi), lambda x, lo, hi: np.minimum(np.maximum(x, lo), hi),
              ("clamp(A, lo, hi): A gets G where lo <= A <= hi, 0 elsewhere (torch.clamp's convention)",),
              _clamp_partials, constant_bounds=True, numpy="np.minimum(np.maximum({0}, {1}), {2})",
              torch="_minimum(_maximum({0}, {1}), {2})", torch_helper="_minimum", cuda="sa_min(sa_max({0}, {1}), {2})",
              triton="tl.minimum(tl.maximum({0}, {1}, propagate_nan=tl.PropagateNan.ALL), {2}, "
                     "propagate_nan=tl.PropagateNan.ALL)"),
    Operation("floordiv", 2, _floordiv, np.floor_divide, ("a // b: integers, no gradient",),
              lambda args, node, g, rec: (None, None), integer=True, infix="//",
              numpy="np.floor_divide({0}, {1})", torch="_floordiv({0}, {1})", torch_helper="_floordiv",
              cuda="sa_floordiv({0}, {1})", triton="_floordiv({0}, {1})"),
    Operation("mod", 2, _mod, np.mod, ("a % b: integers, no gradient",),
              lambda args, node, g, rec: (None, None), integer=True, infix="%",
              numpy="np.mod({0}, {1})", torch="_mod({0}, {1})", torch_helper="_mod", cuda="sa_mod({0}, {1})",
              triton="_mod({0}, {1})"),
):
    OPERATIONS[_operation.name] = _operation
del _operation
