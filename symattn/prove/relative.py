"""`relative(B)` for all sizes: B's entry written at symbolic positions (i, j), shifted by one.

Contract: `prove_relative(node, spec, finiteness)` returns a `RelativeProof` when
`B[..., i, j] == B[..., i + 1, j + 1]` holds for every valid (i, j), every value of
the inputs, params and buffers under float64 semantics (NaN and infinities
included, rounding aside), and every size of the dims it names (all of them, or
the dims of B's last two axes with the others at the spec's sizes); None means
"not shown", never "false".

Method. `Entries` writes B's entry at index symbols (a0, ..., i, j) as one SymPy
expression, dims symbolic: an input, param or buffer entry is an uninterpreted
function of its subscripts (`b(j - i + N - 1)`), index notation binds its
indices to those symbols (computed subscripts are affine: `symattn.ir.affine`),
a contraction over a dim is a `Sum` over a fresh integer dummy, or, over a dim
at a number, the explicit sum of its terms (then a concat or a slice along the
contracted axis picks its part). Arithmetic is SymPy's only where the node and
its operands are FINITE (`symattn.symbolic.finiteness`): there every identity of
the reals holds. Every other operation (on values that may be -inf or NaN: a
mask, a log, a division by a tensor) and every nonlinear reduction (max,
softmax) is an uninterpreted function of its arguments, which SymPy never
simplifies; a comparison of finite operands is written `a - b` against 0, so
`j + 1 <= i + 1` and `j <= i` are the same condition. The expression is then
shifted (i -> i + 1, j -> j + 1; SymPy's integer arithmetic is exact) and

1. both are expanded and compared as trees: the same tree computes the same
   float64 value at every point, NaN included (opaque functions are
   deterministic functions of equal arguments); or, when B is FINITE and no
   `Sum` is left,
2. their difference passes `symattn.symbolic.exact.zero_test` (sin and cos of
   `theta * (i + 1)` expanded by angle addition at symbolic i, so a rotation
   product `cos(i t) cos(j t) + sin(i t) sin(j t)` meets `cos((j - i) t)`); or,
   when B is FINITE and what is left are sums over dims, `Sum(f(k), (k, 0, U))`
   with no sum inside,
3. the sums over one range are added into one (sum_k f(k) + sum_k g(k) =
   sum_k (f(k) + g(k))) and each summand difference, k a symbol, passes the
   zero test, as does the rest: so the rotation product summed over c < h,
   t_c = 10000^(-c / h) symbolic, is relative for every h.

The expression represents B[..., i, j] at every position of B's box, never
assuming a range: a concat or a merge along an axis read at a symbolic index is
`Unsupported` (the part it picks would depend on the position), except for a
contraction over a concat's axis whose block widths are symbolic (RoPE's two
halves of width h, contracted over 2 h): it is written as one sum per block,
`Sum(term(o + k), (k, 0, w - 1))`, and a concat read at o + k for that k
(0 <= k < w) reads the part at offset o, when its width is w.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Mapping

import sympy

from ..errors import SymAttnError
from ..ir import typed as t
from ..ir.affine import as_sympy
from ..ir.functions import table
from ..symbolic.exact import zero_test
from ..symbolic.finiteness import FINITE, Finiteness, const_value

__all__ = ["RelativeProof", "Entries", "Unsupported", "prove_relative"]

_EXACT_FN = table("exact", {"neg": lambda x: -x})
_REAL_OP = {
    "add": lambda a, b: a + b,
    "sub": lambda a, b: a - b,
    "mul": lambda a, b: a * b,
    "div": lambda a, b: a / b,
    "pow": lambda a, b: a ** b,
}
MAX_EXPANDED = 256  # terms of contractions at fixed sizes written out per entry, at most


class Unsupported(SymAttnError):
    """B's entry cannot be written at symbolic positions here; the claim is not proved this way."""


@dataclass(frozen=True)
class RelativeProof:
    """A proof of relative(B): the method text and the (rule, before, after) steps."""

    method: str
    steps: tuple[tuple[str, str, str], ...]


def _opaque(name: str, *args) -> sympy.Expr:
    """An uninterpreted operation: SymPy never simplifies it, equal arguments give it equal values.
    Its name starts with @, which no tensor's name does (tensors are leaves of their own name)."""
    return sympy.Function("@" + name)(*args)


class Entries:
    """Entries of typed nodes at SymPy index expressions; `fixed` maps dim symbols to numbers."""

    def __init__(self, spec: t.TypedSpec, risk: Finiteness, fixed: Mapping[sympy.Symbol, int]) -> None:
        self.spec = spec
        self.risk = risk
        self.fixed = dict(fixed)
        self.count = itertools.count()
        self.read: set[str] = set()  # the fixed dims whose values were used
        self.expanded = 0  # terms of contractions over dims at a number written out so far
        self.block_of: dict[sympy.Dummy, sympy.Expr] = {}  # a contraction's dummy over one block: its width

    def dim(self, expr) -> sympy.Expr:
        expr = sympy.sympify(expr)
        for symbol in expr.free_symbols:
            if symbol in self.fixed:
                self.read.add(str(symbol))
        return sympy.expand(expr.xreplace(self.fixed))

    def finite(self, *nodes: t.Node) -> bool:
        return all(self.risk.node(n) == FINITE for n in nodes)

    def value(self, node: t.Node, idx: tuple, env: Mapping[str, sympy.Expr]) -> sympy.Expr:
        if len(idx) != len(node.shape):
            raise Unsupported(f"rank mismatch at {type(node).__name__}")
        idx = tuple(sympy.Integer(0) if d == 1 else x for d, x in zip(node.shape, idx))
        if node.shape == () and isinstance(node, (t.Unary, t.Binary)):
            const = const_value(node)
            if const is not None:
                return self.dim(const)
        method = getattr(self, "_" + type(node).__name__, None)
        if method is None:
            raise Unsupported(f"no entry rule for {type(node).__name__}")
        return method(node, idx, env)

    # references ----------------------------------------------------------------------
    def _named(self, name: str, idx: tuple) -> sympy.Expr:
        info = self.spec.tensors.get(name)
        if info is None:
            raise Unsupported(f"unknown tensor {name}")
        idx = tuple(sympy.Integer(0) if d == 1 else x for d, x in zip(info.shape, idx))
        if info.expr is None:
            return sympy.Function(name)(*idx)
        extra = len(info.expr.shape) - len(info.shape)
        if extra < 0:
            raise Unsupported(f"the definition of {name} has another rank")
        return self.value(info.expr, (sympy.Integer(0),) * extra + idx, {})

    def _Tensor(self, node, idx, env):
        return self._named(node.name, idx)

    def _Entry(self, node, idx, env):
        if node.grad:
            raise Unsupported("a gradient entry")
        try:
            subscripts = tuple(self.value(s, (), env) if isinstance(s, t.Node) else self.dim(as_sympy(s, env))
                               for s in node.indices)
        except KeyError:
            raise Unsupported("an index is not bound") from None
        return self._named(node.tensor, subscripts)

    def _IndexDef(self, node, idx, env):
        return self.value(node.body, (), {index.name: x for index, x in zip(node.indices, idx)})

    def _IndexVar(self, node, idx, env):
        if node.name not in env:
            raise Unsupported("an index is not bound")
        return env[node.name]

    def _IndexSum(self, node, idx, env):
        return self._contract(node, node.index.range, lambda k: self.value(node.body, (), {**env, node.index.name: k}))

    # numbers -------------------------------------------------------------------------
    def _Scalar(self, node, idx, env):
        return sympy.sympify(node.value)

    def _DimValue(self, node, idx, env):
        return self.dim(node.dim)

    def _Constant(self, node, idx, env):
        if node.kind == "ones":
            return sympy.Integer(1)
        if node.kind == "eye":
            return _opaque("eye", sympy.expand(idx[0] - idx[1]))
        if node.kind == "causal_mask":  # where(j <= i, 0, -inf)
            return _opaque("where<=", sympy.expand(idx[1] - idx[0]), sympy.Integer(0), sympy.Integer(0), -sympy.oo)
        if node.kind == "sinusoidal":
            position, column = idx
            width = self.dim(node.shape[1])
            if not column.is_Integer:
                raise Unsupported("a sinusoidal column at a symbolic index")
            angle = position / sympy.Integer(10000) ** (sympy.Integer(2 * (int(column) // 2)) / width)
            return sympy.sin(angle) if int(column) % 2 == 0 else sympy.cos(angle)
        raise Unsupported(f"the constant {node.kind}")

    # elementwise ---------------------------------------------------------------------
    @staticmethod
    def _bcast(sub_shape, shape, idx):
        offset = len(shape) - len(sub_shape)
        return tuple(sympy.Integer(0) if d == 1 else idx[offset + k] for k, d in enumerate(sub_shape))

    def _Unary(self, node, idx, env):
        x = self.value(node.x, idx, env)
        exact = _EXACT_FN.get(node.fn) if self.finite(node, node.x) else None
        return _opaque(node.fn, x) if exact is None else exact(x)

    def _Binary(self, node, idx, env):
        a = self.value(node.a, self._bcast(node.a.shape, node.shape, idx), env)
        b = self.value(node.b, self._bcast(node.b.shape, node.shape, idx), env)
        if self.finite(node, node.a, node.b):
            return _REAL_OP[node.op](a, b)
        return _opaque(node.op, a, b)

    def _condition(self, cond: t.Compare, shape, idx, env) -> tuple[sympy.Expr, sympy.Expr]:
        a = self.value(cond.a, self._bcast(cond.a.shape, shape, idx), env)
        b = self.value(cond.b, self._bcast(cond.b.shape, shape, idx), env)
        if self.finite(cond.a, cond.b):  # a <= b iff a - b <= 0 for finite a, b (IEEE too)
            return sympy.expand(a - b), sympy.Integer(0)
        return a, b

    def _truth(self, cond, shape, idx, env) -> sympy.Expr:
        """A condition as an opaque value of its operands (a comparison of finite operands by their difference)."""
        if isinstance(cond, t.Logical):
            return _opaque(cond.op, *(self._truth(a, shape, idx, env) for a in cond.args))
        left, right = self._condition(cond, shape, idx, env)
        return _opaque(f"cmp{cond.op}", left, right)

    def _Where(self, node, idx, env):
        a = self.value(node.a, self._bcast(node.a.shape, node.shape, idx), env)
        b = self.value(node.b, self._bcast(node.b.shape, node.shape, idx), env)
        if isinstance(node.cond, t.Logical):
            return _opaque("where", self._truth(node.cond, node.shape, idx, env), a, b)
        left, right = self._condition(node.cond, node.shape, idx, env)
        return _opaque(f"where{node.cond.op}", left, right, a, b)

    def _Apply(self, node, idx, env):
        # min, max, clamp, // and %: deterministic functions of their operands, never simplified
        args = [self.value(a, self._bcast(a.shape, node.shape, idx), env) for a in node.args]
        return _opaque(node.fn, *args)

    # sums ----------------------------------------------------------------------------
    def _contract(self, node: t.Node, size, term, kind: str = "sum") -> sympy.Expr:
        """sum (or another reduction) of term(k) over k in [0, size): explicit at a number, else a Sum."""
        size = self.dim(size)
        finite = kind == "sum" and self.finite(node)
        if size.is_Integer:
            self.expanded += int(size)
            if self.expanded > MAX_EXPANDED:  # large fixed dims: the claim is left to the other levels
                raise Unsupported(f"more than {MAX_EXPANDED} terms of contractions to write out")
            terms = [term(sympy.Integer(k)) for k in range(int(size))]
            return sympy.Add(*terms) if finite else _opaque(kind, *terms)
        k = sympy.Dummy(f"k{next(self.count)}", integer=True, nonnegative=True)
        if finite:
            return sympy.Sum(term(k), (k, 0, size - 1))
        return _opaque(kind, term(k), k, size)

    def _blocked(self, node: t.Node, size, term, contracted) -> sympy.Expr | None:
        """The sum of term(k) over k in [0, size) written block by block, `Sum(term(o + k), (k, 0, w - 1))` for
        each block (offset o, width w) of a concat along the contracted axis, when a width is symbolic (a
        concat read at o + k, 0 <= k < w, reads that block); None where there is no such concat or the node
        is not FINITE (the rotation halves of RoPE contracted over 2 * h, for every h)."""
        widths = None
        for operand, axis in contracted:
            widths = self._widths(operand, axis)
            if widths is not None:
                break
        if widths is None or all(w.is_Integer for w in widths) or not self.finite(node):
            return None
        if sympy.expand(sum(widths) - self.dim(size)) != 0:
            return None
        total, offset = sympy.Integer(0), sympy.Integer(0)
        for width in widths:
            k = sympy.Dummy(f"k{next(self.count)}", integer=True, nonnegative=True)
            self.block_of[k] = width
            total += sympy.Sum(term(offset + k), (k, 0, width - 1))
            offset = sympy.expand(offset + width)
        return total

    def _widths(self, node: t.Node, axis: int) -> list[sympy.Expr] | None:
        """The widths of the blocks of a concat along `axis` that `node` is (under definitions and
        transposes), or None."""
        for _ in range(64):
            if isinstance(node, t.Tensor):
                info = self.spec.tensors.get(node.name)
                if info is None or info.expr is None or len(info.expr.shape) != len(node.shape):
                    return None
                node = info.expr
            elif isinstance(node, t.Transpose):
                rank = len(node.shape)
                axis = {rank - 1: rank - 2, rank - 2: rank - 1}.get(axis, axis)
                node = node.x
            elif isinstance(node, t.Concat) and node.axis == axis and len(node.parts) > 1 and \
                    all(len(p.shape) == len(node.shape) for p in node.parts):
                return [self.dim(p.shape[axis]) for p in node.parts]
            else:
                return None
        return None

    def _MatMul(self, node, idx, env):
        a, b = node.a, node.b
        ra, rb = len(a.shape), len(b.shape)
        batch = len(node.shape) - (ra >= 2) - (rb >= 2)

        def term(k):
            ia = self._bcast(a.shape[:-2], node.shape[:batch], idx[:batch]) + (idx[batch], k) if ra >= 2 else (k,)
            ib = self._bcast(b.shape[:-2], node.shape[:batch], idx[:batch]) + (k, idx[-1]) if rb >= 2 else (k,)
            x, y = self.value(a, ia, env), self.value(b, ib, env)
            return x * y if self.finite(a, b) else _opaque("mul", x, y)
        blocked = self._blocked(node, a.shape[-1], term, ((a, ra - 1), (b, rb - 2 if rb >= 2 else 0)))
        if blocked is not None:
            return blocked
        return self._contract(node, a.shape[-1], term)

    def _Transpose(self, node, idx, env):
        return self.value(node.x, idx[:-2] + (idx[-1], idx[-2]), env)

    def _Reduce(self, node, idx, env):
        x = node.x
        axes = list(range(len(x.shape))) if node.axis is None else [node.axis]
        if len(axes) != 1:
            raise Unsupported("a reduction over several axes")
        axis = axes[0]

        def term(k):
            inner = list(idx)
            inner[axis] = k
            return self.value(x, tuple(inner), env)
        kind = "sum" if node.kind == "mean" else node.kind
        total = self._contract(node, x.shape[axis], term, kind)
        if node.kind == "mean":
            size = self.dim(x.shape[axis])
            return total / size if self.finite(node) else _opaque("div", total, size)
        return total

    def _Softmax(self, node, idx, env):
        axis = node.axis

        def term(k):
            inner = list(idx)
            inner[axis] = k
            return self.value(node.x, tuple(inner), env)
        return _opaque("softmax", self.value(node.x, idx, env), self._contract(node, node.x.shape[axis], term, "row"))

    # index maps ----------------------------------------------------------------------
    def _Slice(self, node, idx, env):
        inner = list(idx)
        inner[node.axis] = sympy.expand(idx[node.axis] + self.dim(node.start))
        return self.value(node.x, tuple(inner), env)

    def _Concat(self, node, idx, env):
        axis, position = node.axis, idx[node.axis]
        if not position.is_Integer:
            return self._block_entry(node, idx, env)
        offset = sympy.Integer(0)
        for part in node.parts:
            width = self.dim(part.shape[axis])
            if not width.is_Integer:
                raise Unsupported("a concat part of symbolic width")
            if position < offset + width:
                inner = list(self._bcast(part.shape, node.shape, idx))
                inner[axis] = position - offset
                return self.value(part, tuple(inner), env)
            offset += width
        raise Unsupported("a concat read past its end")

    def _block_entry(self, node: t.Concat, idx, env) -> sympy.Expr:
        """A concat read at o + k for a contraction's dummy k over a block of width w (`_blocked`): the
        part at offset o, when its width is w (so 0 <= k < w lies inside it)."""
        axis, position = node.axis, idx[node.axis]
        offset = sympy.Integer(0)
        for part in node.parts:
            width = self.dim(part.shape[axis])
            inside = sympy.expand(position - offset)
            if inside in self.block_of and sympy.expand(self.block_of[inside] - width) == 0:
                inner = list(self._bcast(part.shape, node.shape, idx))
                inner[axis] = inside
                return self.value(part, tuple(inner), env)
            offset = sympy.expand(offset + width)
        raise Unsupported("a concat read at a symbolic position along its axis")

    def _MergeHeads(self, node, idx, env):
        x = node.x  # [..., h, n, k] -> [..., n, h * k]: column m = a * k + b
        block, m = self.dim(x.shape[-1]), idx[-1]
        if not (block.is_Integer and m.is_Integer):
            raise Unsupported("merge_heads read at a symbolic column")
        inner = self._bcast(x.shape[:-3], node.shape[:-2], idx[:-2]) + (m // block, idx[-2], m % block)
        return self.value(x, inner, env)


def _expanded(expr: sympy.Expr) -> sympy.Expr:
    return sympy.expand(expr)


def prove_relative(node: t.Node, spec: t.TypedSpec, risk: Finiteness) -> RelativeProof | None:
    """A proof that node[..., i, j] == node[..., i + 1, j + 1] for all valid i, j, all values and
    all sizes (of every dim, or of the dims of its last two axes), or None (not shown)."""
    rank = len(node.shape)
    i, j = sympy.Dummy("i", integer=True), sympy.Dummy("j", integer=True)  # never a dim's symbol
    idx = tuple(sympy.Dummy(f"a{k}", integer=True) for k in range(rank - 2)) + (i, j)
    symbols = {info.symbol: name for name, info in spec.dims.items()}
    positions = {s for d in node.shape[-2:] for s in sympy.sympify(d).free_symbols if s in symbols}
    others = {s: spec.sizes[symbols[s]] for s in symbols if s not in positions}
    for fixed in ({}, others):
        if fixed is others and not others:
            break
        entries = Entries(spec, risk, fixed)
        try:
            entry = _expanded(entries.value(node, idx, {}))
        except (Unsupported, RecursionError):
            continue
        shifted = _expanded(entry.xreplace({i: i + 1, j: j + 1}))
        how = _same(entry, shifted, risk.deep(node) == FINITE)
        if how is None:
            continue
        where = _where(spec, positions, entries.read)
        steps = (("B[..., i, j] at symbolic positions", "B[..., i, j]", str(entry)),
                 ("shifted by one row and one column", "B[..., i + 1, j + 1]", str(shifted)),
                 (how, str(shifted), str(entry)))
        return RelativeProof(f"{where}: at symbolic positions, entry [..., i + 1, j + 1] and entry [..., i, j] "
                             f"are {how}", steps)
    return None


def _same(entry: sympy.Expr, shifted: sympy.Expr, finite: bool) -> str | None:
    """How the two entries were shown equal, or None."""
    if entry == shifted:
        return "the same expression"
    if finite and not entry.has(sympy.Sum) and not shifted.has(sympy.Sum) and zero_test(shifted - entry):
        return "equal by exact algebra (sin and cos by angle addition)"
    if finite and _same_sums(entry, shifted):
        return ("equal by exact algebra, summand by summand of the sums over each block of the contraction "
                "(sin and cos by angle addition)")
    return None


def _sums(expr: sympy.Expr, common: sympy.Dummy) -> tuple[dict, sympy.Expr] | None:
    """(upper limit -> the summands of the Sums over [0, limit], written in the dummy `common`; what is not a
    Sum), or None when a Sum is nested or has another form: sum_k f(k) + sum_k g(k) = sum_k (f(k) + g(k))."""
    bodies: dict = {}
    rest = sympy.Integer(0)
    for part in sympy.Add.make_args(sympy.expand(expr)):
        if not part.has(sympy.Sum):
            rest += part
            continue
        coef, sums = part.as_independent(sympy.Sum, as_Add=False)
        if not isinstance(sums, sympy.Sum) or len(sums.limits) != 1 or coef.has(sympy.Sum):
            return None
        k, low, high = sums.limits[0]
        if low != 0 or sums.function.has(sympy.Sum):
            return None
        key = sympy.expand(high)
        bodies[key] = bodies.get(key, sympy.Integer(0)) + coef * sums.function.xreplace({k: common})
    return (bodies, rest) if bodies else None


def _same_sums(entry: sympy.Expr, shifted: sympy.Expr) -> bool:
    """Both entries are sums over the same ranges of summands that agree at every k, and the rest agrees
    (exact algebra of finite values: a zero test of each difference)."""
    common = sympy.Dummy("k", integer=True, nonnegative=True)
    a, b = _sums(entry, common), _sums(shifted, common)
    if a is None or b is None or set(a[0]) != set(b[0]):
        return False
    if not zero_test(b[1] - a[1]):
        return False
    return all(zero_test(sympy.expand(b[0][key] - a[0][key])) for key in a[0])


def _where(spec: t.TypedSpec, positions: set, read: set[str]) -> str:
    """For which sizes: all, or the position dims for all sizes and the others at the spec's."""
    if not read:
        return "for all sizes"
    names = sorted(str(s) for s in positions)
    at = ", ".join(f"{n}={spec.sizes[n]}" for n in spec.dims if n in read)
    return f"for all {', '.join(names) or 'sizes'}, at {at} (the spec's sizes of the other dims)"
