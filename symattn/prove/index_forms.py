"""Index forms: typed nodes written as sums of products of indexed factors.

Contract: `Converter(spec, definitions, unfold, finiteness).conv(node, idx, env)`
returns the index form (see `symattn.prove.index_terms`) of a node at index
tokens `idx`. `@` contracts an index, `.T` swaps two, reductions contract axes,
`+ - *` distribute, a constant divisor goes into the coefficient, broadcasting
drops an index, `ones` is 1, `eye` a Kronecker delta, `cumsum` a sum against
the lower-triangular 0/1 factor `$tril`, `merge_heads`,
`split_heads`, `concat` and slices are index maps, a read at computed subscripts
(`b[j - i + N - 1]`) and a `Scatter` are sums against an index `Equation`
(`symattn.prove.index_equations`), a `where` comparing an index of at most
MAX_CASES values with an integer is split by that index's value, and everything nonlinear is an
opaque factor keyed by the canonical forms of its arguments, after the identities
of `symattn.prove.opaque_forms` (elementwise functions, divisions, `where`) and
`symattn.prove.softmax_forms` (softmax, logsumexp, max and min along an axis). A
form that cannot be used soundly raises `Unsupported` (a possibly non-finite term
multiplied by zero or distributed over a sum), one that grows past MAX_TERMS terms
`TooBig`. A divisor whose zeros may be -0 is keyed by its expression
(`symattn.prove.opaque_forms.plus_zero`).
"""

from __future__ import annotations

import itertools
import operator
from typing import Mapping

import sympy

from ..ir import affine
from ..ir import typed as t
from ..ir.shapes import same_dim
from ..symbolic.finiteness import FINITE, MINUS_INF, Finiteness, const_value, finite_real
from .index_terms import (MAX_TERMS, ONE, ZERO_INDEX, Constant, Embed, Equation, Eye, IndexValue, Infinity, Mix,
                          Reference, Term, TooBig, Unsupported)
from .opaque_forms import OpaqueForms, bcast as _bcast, mul_forms as _mul_forms, scale as _scale
from .softmax_forms import SoftmaxForms

__all__ = ["Converter"]


# --- index forms ------------------------------------------------------------------

MAX_CASES = 8  # a `where` on an index with at most this many values is split by the index's value
_COMPARE = {"<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge, "==": operator.eq,
            "!=": operator.ne}
_MIRRORED = {"<": ">", "<=": ">=", ">": "<", ">=": "<=", "==": "==", "!=": "!="}


class Converter(SoftmaxForms, OpaqueForms):
    """Typed nodes -> index forms, with a fixed set of unfolded references."""

    def __init__(self, spec: t.TypedSpec, definitions: Mapping[str, t.Node | None],
                 unfold: frozenset[str], risk: Finiteness) -> None:
        self.spec = spec
        self.defs = definitions
        self.unfold = unfold
        self.risk = risk
        self.ranges: dict[str, sympy.Expr] = {ZERO_INDEX: ONE}
        self.count = itertools.count()
        self.seen: set[str] = set()  # references met and not unfolded: 'X' or 'grad(X)'
        self.depth = 0
        # divisors taken as finite and > 0 (`symattn.prove.norm_rows`), and where their reciprocals were
        # read: (tokens, whether inside the argument of a function)
        self.assumed_positive: frozenset[t.Node] = frozenset()
        self.assumed_reads: list[tuple[tuple[str, ...], bool]] = []
        self.in_argument = 0

    def fresh(self, size) -> str:
        if size == 1:
            return ZERO_INDEX
        token = f"#{next(self.count)}"
        self.ranges[token] = sympy.sympify(size)
        return token

    # entry point: the node's value at index tokens `idx` (one per axis)
    def conv(self, node: t.Node, idx: tuple, env: Mapping[str, str]) -> list[Term]:
        if len(idx) != len(node.shape):
            raise Unsupported(f"rank mismatch at {type(node).__name__}")
        if node.shape == () and isinstance(node, (t.Unary, t.Binary)):
            value = const_value(node)
            if value is not None and finite_real(value):
                return [] if value == 0 else [Term(value)]
        method = getattr(self, "_" + type(node).__name__, None)
        if method is None:
            raise Unsupported(f"no index form for {type(node).__name__}")
        self.depth += 1
        if self.depth > 400:
            raise Unsupported("expression too deep")
        try:
            form = method(node, idx, env)
        finally:
            self.depth -= 1
        if len(form) > MAX_TERMS:
            raise TooBig("the expansion is too large")
        return form

    # references ----------------------------------------------------------------
    def _reference(self, key: str, name: str, shape, idx, grad: bool) -> list[Term]:
        idx = tuple(ZERO_INDEX if d == 1 else x for d, x in zip(shape, idx))
        if key in self.unfold:
            definition = self.defs[key]
            if definition is None:
                return []  # L does not depend on the tensor: its gradient is zero
            extra = len(definition.shape) - len(shape)
            if extra < 0 or any(d != 1 for d in definition.shape[:extra]) or not all(
                    same_dim(a, b) for a, b in zip(definition.shape[extra:], shape)):
                raise Unsupported(f"the definition of {key} has another shape")
            return self.conv(definition, (ZERO_INDEX,) * extra + idx, {})
        self.seen.add(key)
        risk = self.risk.grad(name) if grad else self.risk.tensor(name)
        return [Term(ONE, (Reference(name, grad, idx, risk),))]

    def _Tensor(self, node, idx, env):
        return self._reference(node.name, node.name, node.shape, idx, False)

    def _Grad(self, node, idx, env):
        return self._reference(f"grad({node.name})", node.name, node.shape, idx, True)

    def _Entry(self, node, idx, env):
        info = self.spec.tensors.get(node.tensor)
        if info is None or len(info.shape) != len(node.indices):
            raise Unsupported(f"unknown tensor {node.tensor}")
        key = f"grad({node.tensor})" if node.grad else node.tensor
        if not all(isinstance(i, str) for i in node.indices):
            return self._gather(node, info.shape, env, key)
        try:
            tokens = tuple(env[i] for i in node.indices)
        except KeyError:
            raise Unsupported("an index is not bound") from None
        return self._reference(key, node.tensor, info.shape, tokens, node.grad)

    def _gather(self, node, shape, env, key):
        """X[s(i, j)] at computed subscripts: sum over m of [m == s(i, j)] X[m], one m per computed
        subscript; each must stay in its axis for every point (the spec's rule, checked again)."""
        if any(isinstance(s, t.Node) for s in node.indices):
            raise Unsupported("a subscript that is not affine in the indices (an index equation cannot hold it)")
        tokens, equations, sums = [], [], []
        for subscript, size in zip(node.indices, shape):
            if isinstance(subscript, str):
                tokens.append(self._bound(subscript, env))
                continue
            m = self.fresh(size)
            equations.append(self._equation(m, subscript, {n: self._bound(n, env) for n in t.subscript_names(subscript)},
                                            size))
            tokens.append(m)
            if m != ZERO_INDEX:
                sums.append((m, self.ranges[m]))
        form = _mul_forms([Term(ONE, tuple(equations))], self._reference(key, node.tensor, shape, tuple(tokens),
                                                                         node.grad))
        return [term.summed(tuple(sums)) for term in form]

    def _Scatter(self, node, idx, env):
        """Zeros with each value of the index box added at its subscripts: sum over the box of
        [idx == s(box)] x[box]. The subscripts stay in the axes (the spec's rule, checked again)."""
        box = node.x
        if any(isinstance(s, t.Node) for s in node.targets):
            raise Unsupported("a scatter to subscripts that are not affine in the indices")
        tokens = tuple(self.fresh(index.range) for index in box.indices)
        named = {index.name: token for index, token in zip(box.indices, tokens)}
        equations = tuple(self._equation(out, subscript, named, size)
                          for out, subscript, size in zip(idx, node.targets, node.shape))
        form = _mul_forms([Term(ONE, equations)], self.conv(box, tokens, {}))
        sums = tuple((tok, self.ranges[tok]) for tok in tokens if tok != ZERO_INDEX)
        return [term.summed(sums) for term in form]

    @staticmethod
    def _bound(name: str, env: Mapping[str, str]) -> str:
        if name not in env:
            raise Unsupported("an index is not bound")
        return env[name]

    def _equation(self, token: str, subscript, named: Mapping[str, str], size) -> Equation:
        """[token == subscript], the subscript's indices read as `named` tokens; Unsupported unless the
        subscript stays in 0 .. size - 1 for every point and every size."""
        ranges = {n: self.ranges[tok] for n, tok in named.items()}
        low, high = affine.extremes(subscript, ranges)
        if affine.nonnegative(low).holds is not True or affine.nonnegative(size - 1 - high).holds is not True:
            raise Unsupported("a computed subscript may leave its axis")
        pairs = affine.terms(subscript)
        return Equation((1, *[-c for _, c in pairs]), -affine.offset(subscript), (token, *[named[n] for n, _ in pairs]))

    # numbers -------------------------------------------------------------------
    def _Scalar(self, node, idx, env):
        value = sympy.sympify(node.value)
        if value == 0:
            return []
        if finite_real(value):
            return [Term(value)]
        if value == sympy.oo:
            return [Term(ONE, (Infinity(),))]
        if value == -sympy.oo:
            return [Term(-ONE, (Infinity(),))]
        raise Unsupported(f"the number {value}")

    def _DimValue(self, node, idx, env):
        return [Term(sympy.sympify(node.dim))]

    def _IndexVar(self, node, idx, env):
        token = env.get(node.name)
        if token is None:
            raise Unsupported("an index is not bound")
        if token == ZERO_INDEX:
            return []
        return [Term(ONE, (IndexValue((token,)),))]

    def _Constant(self, node, idx, env):
        if node.kind == "ones":
            return [Term(ONE)]
        if node.kind == "eye":
            return [Term(ONE, (Eye(tuple(idx)),))]
        risk = MINUS_INF if node.kind == "causal_mask" else FINITE
        return [Term(ONE, (Constant(node.kind, tuple(node.args), tuple(idx), risk),))]

    # elementwise (the nonlinear ones, opaque factors: `symattn.prove.opaque_forms`) ----
    def _Binary(self, node, idx, env):
        a, b, op = node.a, node.b, node.op
        ia, ib = _bcast(a.shape, node.shape, idx), _bcast(b.shape, node.shape, idx)
        if op == "add":
            return self.conv(a, ia, env) + self.conv(b, ib, env)
        if op == "sub":
            return self.conv(a, ia, env) + _scale(self.conv(b, ib, env), -ONE)
        if op == "mul":
            return _mul_forms(self.conv(a, ia, env), self.conv(b, ib, env))
        if op == "div":
            return self._divide(node, idx, env)
        if op == "pow":
            return self._power(node, idx, env)
        raise Unsupported(f"elementwise {op}")

    def _Where(self, node, idx, env):
        c = node.cond
        cases = self._index_cases(c, env)
        if cases is not None:
            # where(p == 0, A, B) over an index p of a few values: the sum over u of [p == u] times the
            # branch the condition picks at u, a selection (each p meets one u) and no arithmetic
            token, picks = cases
            branches = [self.conv(node.a, _bcast(node.a.shape, node.shape, idx), env),
                        self.conv(node.b, _bcast(node.b.shape, node.shape, idx), env)]
            out = []
            for u, pick in picks:
                case = Term(ONE, (Equation((1,), -sympy.Integer(u), (token,)),))
                out += _mul_forms([case], branches[0 if pick else 1])
            return out
        return self._opaque_where(node, idx, env)

    def _Apply(self, node, idx, env):
        # min, max, clamp, // and %: one factor of its operands' forms (a deterministic function)
        args = [(a, _bcast(a.shape, node.shape, idx)) for a in node.args]
        return self._opaque(f"${node.fn}", node, args, idx, env)

    def _Logical(self, node, idx, env):
        args = [(a, _bcast(a.shape, node.shape, idx)) for a in node.args]
        return self._opaque(f"$logic{node.op}", node, args, idx, env)

    def _index_cases(self, cond, env):
        """(token, [(u, condition at u)]) when `cond` compares one index variable of index notation
        with an integer and the index takes at most MAX_CASES values; None otherwise."""
        if isinstance(cond, t.Logical):
            return None
        a, b, op = cond.a, cond.b, cond.op
        if isinstance(b, t.IndexVar) and isinstance(a, t.Scalar):
            a, b, op = b, a, _MIRRORED[op]
        if not (isinstance(a, t.IndexVar) and isinstance(b, t.Scalar) and a.name in env):
            return None
        value = sympy.sympify(b.value)
        size = self.ranges.get(env[a.name])
        if not (value.is_Integer and size is not None and size.is_Integer and size <= MAX_CASES):
            return None
        return env[a.name], [(u, _COMPARE[op](u, int(value))) for u in range(int(size))]

    # linear structure ----------------------------------------------------------
    def _MatMul(self, node, idx, env):
        a, b = node.a, node.b
        ra, rb = len(a.shape), len(b.shape)
        batch = len(node.shape) - (ra >= 2) - (rb >= 2)
        bidx = idx[:batch]
        c = self.fresh(a.shape[-1])
        if ra >= 2:
            ia = _bcast(a.shape[:-2], node.shape[:batch], bidx) + (idx[batch], c)
        else:
            ia = (c,)
        if rb >= 2:
            ib = _bcast(b.shape[:-2], node.shape[:batch], bidx) + (c, idx[-1])
        else:
            ib = (c,)
        if ra >= 2 and a.shape[-2] == 1:
            ia = ia[:-2] + (ZERO_INDEX, c)
        if rb >= 2 and b.shape[-1] == 1:
            ib = ib[:-1] + (ZERO_INDEX,)
        form = _mul_forms(self.conv(a, ia, env), self.conv(b, ib, env))
        if c == ZERO_INDEX:
            return form
        return [term.summed(((c, self.ranges[c]),)) for term in form]

    def _Transpose(self, node, idx, env):
        return self.conv(node.x, idx[:-2] + (idx[-1], idx[-2]), env)

    def _reduced(self, x_shape, axes, idx):
        """Tokens for x with fresh ones on the reduced axes, and those fresh tokens."""
        inner, fresh = list(idx), []
        for k in axes:
            token = self.fresh(x_shape[k])
            inner[k] = token
            if token != ZERO_INDEX:
                fresh.append(token)
        return tuple(inner), fresh

    def _Reduce(self, node, idx, env):
        x = node.x
        axes = list(range(len(x.shape))) if node.axis is None else [node.axis]
        inner, fresh = self._reduced(x.shape, axes, idx)
        if node.kind in ("logsumexp", "max", "min"):
            return self.extreme(node, idx, env)  # `symattn.prove.softmax_forms`
        if node.kind == "sum":
            logspace = self.sum_of_exps(node, idx, env)  # `symattn.prove.opaque_forms`
            if logspace is not None:
                return logspace
        form = self.conv(x, inner, env)
        sums = tuple((tok, self.ranges[tok]) for tok in fresh)
        form = [term.summed(sums) for term in form]
        if node.kind == "mean":
            form = _scale(form, 1 / sympy.Mul(*[x.shape[k] for k in axes]))
        elif node.kind != "sum":
            raise Unsupported(f"reduction {node.kind}")
        return form

    def _Scan(self, node, idx, env):
        """cumsum(X)[.., i, ..] = sum over k of tril[i, k] X[.., k, ..] (tril: 1 where k <= i, else 0,
        a selection, so -inf entries of X stay as they are); reversed, tril[k, i]."""
        x, axis = node.x, node.axis
        size = x.shape[axis]
        if size == 1:
            return self.conv(x, idx, env)
        k = self.fresh(size)
        inner = list(idx)
        inner[axis] = k
        pair = (k, idx[axis]) if node.reverse else (idx[axis], k)
        tril = Term(ONE, (Constant("tril", (size,), pair, FINITE),))
        form = _mul_forms([tril], self.conv(x, tuple(inner), env))
        return [term.summed(((k, self.ranges[k]),)) for term in form]

    def _SumTo(self, node, idx, env):
        x = node.x
        lead = len(x.shape) - len(node.shape)
        if lead < 0:
            raise Unsupported("SumTo to a larger rank")
        axes = set(node.axes)
        inner, sums = [], []
        for k, d in enumerate(x.shape):
            if k in axes:
                token = self.fresh(d)
                if token != ZERO_INDEX:
                    sums.append((token, self.ranges[token]))
                inner.append(token)
            elif k < lead:
                if d != 1:
                    raise Unsupported("SumTo keeps a leading axis")
                inner.append(ZERO_INDEX)
            else:
                inner.append(ZERO_INDEX if d == 1 else idx[k - lead])
        form = self.conv(x, tuple(inner), env)
        return [term.summed(tuple(sums)) for term in form]

    # index maps ------------------------------------------------------------------
    def _MergeHeads(self, node, idx, env):
        x = node.x  # [..., h, n, k] -> [..., n, h * k]: m = a * k + b
        h, k = x.shape[-3], x.shape[-1]
        a, b = self.fresh(h), self.fresh(k)
        inner = _bcast(x.shape[:-3], node.shape[:-2], idx[:-2]) + (a, idx[-2], b)
        mix = Term(ONE, (Mix(k, (idx[-1], a, b)),))
        form = _mul_forms([mix], self.conv(x, inner, env))
        sums = tuple((tok, self.ranges[tok]) for tok in (a, b) if tok != ZERO_INDEX)
        return [term.summed(sums) for term in form]

    def _SplitHeads(self, node, idx, env):
        x = node.x  # [..., n, h * k] -> [..., h, n, k]
        k = node.shape[-1]
        m = self.fresh(x.shape[-1])
        inner = _bcast(x.shape[:-2], node.shape[:-3], idx[:-3]) + (idx[-2], m)
        mix = Term(ONE, (Mix(k, (m, idx[-3], idx[-1])),))
        form = _mul_forms([mix], self.conv(x, inner, env))
        sums = ((m, self.ranges[m]),) if m != ZERO_INDEX else ()
        return [term.summed(sums) for term in form]

    def _Concat(self, node, idx, env):
        axis, out, offset = node.axis, [], sympy.Integer(0)
        for part in node.parts:
            if len(part.shape) != len(node.shape):
                raise Unsupported("concat of parts with other ranks")
            width = part.shape[axis]
            c = self.fresh(width)
            inner = list(_bcast(part.shape, node.shape, idx))
            inner[axis] = c
            embed = Term(ONE, (Embed(offset, (idx[axis], c)),))
            form = _mul_forms([embed], self.conv(part, tuple(inner), env))
            sums = ((c, self.ranges[c]),) if c != ZERO_INDEX else ()
            out += [term.summed(sums) for term in form]
            offset = offset + width
        return out

    def _Slice(self, node, idx, env):
        x, axis = node.x, node.axis
        if isinstance(x, t.Concat) and x.axis == axis:  # a slice that is one part of a concat
            offset = sympy.Integer(0)
            for part in x.parts:
                stop = offset + part.shape[axis]
                if same_dim(offset, node.start) and same_dim(stop, node.stop):
                    return self.conv(part, idx, env)
                offset = stop
        m = self.fresh(x.shape[axis])
        inner = list(idx)
        inner[axis] = m
        embed = Term(ONE, (Embed(sympy.sympify(node.start), (m, idx[axis])),))
        form = _mul_forms([embed], self.conv(x, tuple(inner), env))
        sums = ((m, self.ranges[m]),) if m != ZERO_INDEX else ()
        return [term.summed(sums) for term in form]

    # index notation --------------------------------------------------------------
    def _IndexDef(self, node, idx, env):
        inner = {}
        for index, token, d in zip(node.indices, idx, node.shape):
            inner[index.name] = ZERO_INDEX if d == 1 else token
        return self.conv(node.body, (), inner)

    def _IndexSum(self, node, idx, env):
        token = self.fresh(node.index.range)
        form = self.conv(node.body, (), {**env, node.index.name: token})
        if token == ZERO_INDEX:
            return form
        return [term.summed(((token, self.ranges[token]),)) for term in form]
