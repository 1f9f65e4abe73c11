"""Matrix-level equality proofs for all sizes: canonical index forms.

Contract: `prove_equal(lhs, rhs, spec, definitions)` returns a `Proof` when the
two typed nodes are equal for every value of the inputs, params and upstream
gradients and for every size of the dims, and None when it cannot show that
(None is "not proved", never "false"). It never returns a Proof for a false
claim; it is incomplete by design.

Method. Each side is written as an *index form*: a sum of terms, each term a
coefficient (a SymPy expression of numbers and dim symbols, such as
`1/sqrt(d_k)`) times a product of factors carrying index variables, summed
over contracted indices whose ranges are dims. The linear structure of the
matrix language is expanded: `@` contracts an index, `.T` swaps two, `sum`
and `SumTo` contract axes, `mean` also divides by the dim, `+ - *` distribute,
a scalar divisor goes into the coefficient, broadcasting drops an index,
`ones` is 1, `eye` is a Kronecker delta, `merge_heads`/`split_heads` and
`concat`/slices are index maps (`m = a * k + b`, `m = c + offset`) with the
rules that make them cancel against each other. Everything nonlinear (`exp`,
`softmax`, `logsumexp`, division by a tensor, `where`, powers other than small
natural ones, constants other than `ones` and `eye`) is an opaque factor keyed
by the canonical forms of its arguments, with its free indices named by
position, so that equal arguments give equal factors. A term is put in
canonical form by relabelling its contracted indices (all labellings that
respect an invariant of each index, the least serialisation wins), and two
sides are equal when their collected terms and coefficients agree.

`definitions` maps tensor names to their forward definitions and `"grad(T)"`
to derived matrix-level gradients; `Tensor(T)` and `Grad(T)` references are
unfolded when the direct comparison fails: gradients first (earliest tensor
first), then forward intermediates (latest first), comparing again after each.

Non-finite values. `-inf` masks, `log`, `sqrt` and division by a tensor can
make entries infinite or NaN, and then `x - x == 0` or `0 * x == 0` fail in
floating point. A static analysis classifies every node as finite, "maybe
-inf but never NaN or +inf", or "maybe anything"; a term that may be
non-finite is never dropped by cancellation or multiplication by zero, never
merged with a like term of the other sign, and never selected through
`eye(N) @` (which multiplies by 0); the argument of an opaque function that
may be NaN is compared structurally rather than by its expansion, and the
row-sum rule `sum(softmax(x), axis) = 1` needs a finite `x` (a fully masked
row has softmax 0), and a factor that may be non-finite is never distributed
over a sum (`(A + B) * M` is -inf where `A * M + B * M` is NaN). So a Proof
means: at every point, with float64 semantics aside from rounding and
overflow, both sides are equal, or the same non-finite value (see
`symattn.finiteness`).

Incomplete by design: no algebra inside opaque functions (`exp(a + b)` is
not `exp(a) * exp(b)`, `P = softmax(S)` is not expanded into `exp`), no
cancellation of `x * (1 / x)`, no index arithmetic beyond the index-map
rules, and an expansion larger than MAX_TERMS terms is given up.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Mapping

import sympy

from . import typed as t
from .printing import to_spec
from .finiteness import ANY, FINITE, MINUS_INF, Finiteness, const_value, finite_real
from .shapes import same_dim

__all__ = ["Proof", "prove_equal", "definitions_for", "index_form_text"]

METHOD = "matrix level: canonical index forms agree for all sizes"
MAX_ROUNDS = 16        # unfoldings tried after the direct comparison
MAX_TERMS = 20000      # a larger expansion is given up (not proved)
MAX_LABELLINGS = 2000  # relabellings tried per term before settling for one

ONE = sympy.Integer(1)
ZERO_INDEX = "_"       # the only index of a size-1 axis: always 0


DELTA = "$delta"       # from index maps: selects entries, no arithmetic
EYE = "$eye"           # eye(N): selects by multiplying with 0 and 1
IVAR = "$index"


@dataclass(frozen=True)
class Proof:
    """How a claim was proved: the method and the (rule, before, after) steps."""

    method: str
    steps: tuple[tuple[str, str, str], ...]


class _Unsupported(Exception):
    """The expansion cannot be used soundly; the comparison is not proved."""


class _TooBig(_Unsupported):
    """The expansion grew past MAX_TERMS."""


# --- terms and factors ----------------------------------------------------------
#
# factor: (key, indices, risk, meta)   key says what it is ('X', 'grad(X)',
#   '$exp(...)'); indices are tokens; risk is FINITE/MINUS_INF/ANY; meta holds
#   the sympy parameters of index-map factors (None otherwise).
# term: (coef, factors, sums)          sums: ((token, range), ...) contracted.


def definitions_for(spec: t.TypedSpec, derivation=None) -> dict[str, t.Node | None]:
    """The `definitions` argument for a spec: forward definitions by name and,
    given a `symattn.derive.Derivation`, every derived gradient as `grad(NAME)`."""
    defs: dict[str, t.Node | None] = {name: info.expr for name, info in spec.tensors.items()
                                      if info.expr is not None}
    if derivation is not None:
        for name, gradient in derivation.gradients.items():
            defs[f"grad({name})"] = gradient.expr
    return defs


# --- index forms ------------------------------------------------------------------


def _bcast(sub_shape, shape, idx):
    """The tokens of an operand broadcast into `shape` (right-aligned, size 1 -> ZERO_INDEX)."""
    offset = len(shape) - len(sub_shape)
    if offset < 0:
        raise _Unsupported("an operand has more axes than the result")
    return tuple(ZERO_INDEX if d == 1 else idx[offset + k] for k, d in enumerate(sub_shape))


def _risky(term) -> bool:
    return any(f[2] != FINITE for f in term[1])


def _mul_forms(a: list, b: list) -> list:
    if not a or not b:
        if any(_risky(term) for term in a + b):
            raise _Unsupported("a possibly non-finite term would be multiplied by zero")
        return []
    if (len(a) > 1 and any(_risky(term) for term in b)) or (len(b) > 1 and any(_risky(term) for term in a)) \
            or any(ta[2] and _risky(tb) or tb[2] and _risky(ta) for ta in a for tb in b):
        # (A + B) * M is not A * M + B * M where M is -inf or 1/0: (1 + 0) * inf is inf while
        # 1 * inf + 0 * inf is NaN; likewise a contracted sum, sum(X) / w vs sum(X / w).
        raise _Unsupported("a possibly non-finite factor would be distributed over a sum")
    if len(a) * len(b) > MAX_TERMS:
        raise _TooBig("the expansion is too large")
    return [(ca * cb, fa + fb, sa + sb) for ca, fa, sa in a for cb, fb, sb in b]


def _scale(form: list, c) -> list:
    return [(c * coef, f, s) for coef, f, s in form]


class _Converter:
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

    def fresh(self, size) -> str:
        if size == 1:
            return ZERO_INDEX
        token = f"#{next(self.count)}"
        self.ranges[token] = sympy.sympify(size)
        return token

    # entry point: the node's value at index tokens `idx` (one per axis)
    def conv(self, node: t.Node, idx: tuple, env: Mapping[str, str]) -> list:
        if len(idx) != len(node.shape):
            raise _Unsupported(f"rank mismatch at {type(node).__name__}")
        if node.shape == () and isinstance(node, (t.Unary, t.Binary)):
            value = const_value(node)
            if value is not None and finite_real(value):
                return [] if value == 0 else [(value, (), ())]
        method = getattr(self, "_" + type(node).__name__, None)
        if method is None:
            raise _Unsupported(f"no index form for {type(node).__name__}")
        self.depth += 1
        if self.depth > 400:
            raise _Unsupported("expression too deep")
        try:
            form = method(node, idx, env)
        finally:
            self.depth -= 1
        if len(form) > MAX_TERMS:
            raise _TooBig("the expansion is too large")
        return form

    # references ----------------------------------------------------------------
    def _reference(self, key: str, name: str, shape, idx, grad: bool) -> list:
        idx = tuple(ZERO_INDEX if d == 1 else x for d, x in zip(shape, idx))
        if key in self.unfold:
            definition = self.defs[key]
            if definition is None:
                return []  # L does not depend on the tensor: its gradient is zero
            extra = len(definition.shape) - len(shape)
            if extra < 0 or any(d != 1 for d in definition.shape[:extra]) or not all(
                    same_dim(a, b) for a, b in zip(definition.shape[extra:], shape)):
                raise _Unsupported(f"the definition of {key} has another shape")
            return self.conv(definition, (ZERO_INDEX,) * extra + idx, {})
        self.seen.add(key)
        risk = self.risk.grad(name) if grad else self.risk.tensor(name)
        return [(ONE, ((key, idx, risk, None),), ())]

    def _Tensor(self, node, idx, env):
        return self._reference(node.name, node.name, node.shape, idx, False)

    def _Grad(self, node, idx, env):
        return self._reference(f"grad({node.name})", node.name, node.shape, idx, True)

    def _Entry(self, node, idx, env):
        info = self.spec.tensors.get(node.tensor)
        if info is None or len(info.shape) != len(node.indices):
            raise _Unsupported(f"unknown tensor {node.tensor}")
        try:
            tokens = tuple(env[i] for i in node.indices)
        except KeyError:
            raise _Unsupported("an index is not bound") from None
        key = f"grad({node.tensor})" if node.grad else node.tensor
        return self._reference(key, node.tensor, info.shape, tokens, node.grad)

    # numbers -------------------------------------------------------------------
    def _Scalar(self, node, idx, env):
        value = sympy.sympify(node.value)
        if value == 0:
            return []
        if finite_real(value):
            return [(value, (), ())]
        if value == sympy.oo:
            return [(ONE, (("$inf", (), ANY, None),), ())]
        if value == -sympy.oo:
            return [(-ONE, (("$inf", (), ANY, None),), ())]
        raise _Unsupported(f"the number {value}")

    def _DimValue(self, node, idx, env):
        return [(sympy.sympify(node.dim), (), ())]

    def _IndexVar(self, node, idx, env):
        token = env.get(node.name)
        if token is None:
            raise _Unsupported("an index is not bound")
        if token == ZERO_INDEX:
            return []
        return [(ONE, ((IVAR, (token,), FINITE, None),), ())]

    def _Constant(self, node, idx, env):
        if node.kind == "ones":
            return [(ONE, (), ())]
        if node.kind == "eye":
            return [(ONE, ((EYE, idx, FINITE, None),), ())]
        args = ",".join(str(a) for a in node.args)
        risk = MINUS_INF if node.kind == "causal_mask" else FINITE
        return [(ONE, ((f"${node.kind}({args})", idx, risk, None),), ())]

    # elementwise ---------------------------------------------------------------
    def _Unary(self, node, idx, env):
        if node.fn == "neg":
            return _scale(self.conv(node.x, idx, env), -ONE)
        return self._opaque(f"${node.fn}", node, [(node.x, idx)], idx, env)

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
            value = const_value(b)
            if value is not None and finite_real(value) and value.is_zero is False:
                return _scale(self.conv(a, ia, env), 1 / value)
            recip = self._opaque("$recip", b, [(b, ib)], ib, env, risk=ANY)  # 1/0 is inf
            return _mul_forms(self.conv(a, ia, env), recip)
        if op == "pow":
            value = const_value(b)
            if value is not None and value.is_Integer and 0 <= value <= 6:
                form = [(ONE, (), ())]
                for _ in range(int(value)):
                    form = _mul_forms(form, self.conv(a, ia, env))
                return form
            return self._opaque("$pow", node, [(a, ia), (b, ib)], idx, env)
        raise _Unsupported(f"elementwise {op}")

    def _Compare(self, node, idx, env):
        a, b = node.a, node.b
        return self._opaque(f"$cmp{node.op}", node,
                            [(a, _bcast(a.shape, node.shape, idx)), (b, _bcast(b.shape, node.shape, idx))], idx, env)

    def _Where(self, node, idx, env):
        c = node.cond
        args = [(c.a, _bcast(c.a.shape, node.shape, idx)), (c.b, _bcast(c.b.shape, node.shape, idx)),
                (node.a, _bcast(node.a.shape, node.shape, idx)), (node.b, _bcast(node.b.shape, node.shape, idx))]
        return self._opaque(f"$where{c.op}", node, args, idx, env)

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
        return [(coef, f, s + ((c, self.ranges[c]),)) for coef, f, s in form]

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
        if node.kind == "logsumexp":
            return self._opaque(f"$logsumexp{axes}", node, [(x, inner)], idx, env, local=fresh)
        form = self.conv(x, inner, env)
        sums = tuple((tok, self.ranges[tok]) for tok in fresh)
        form = [(coef, f, s + sums) for coef, f, s in form]
        if node.kind == "mean":
            form = _scale(form, 1 / sympy.Mul(*[x.shape[k] for k in axes]))
        elif node.kind != "sum":
            raise _Unsupported(f"reduction {node.kind}")
        return form

    def _SumTo(self, node, idx, env):
        x = node.x
        lead = len(x.shape) - len(node.shape)
        if lead < 0:
            raise _Unsupported("SumTo to a larger rank")
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
                    raise _Unsupported("SumTo keeps a leading axis")
                inner.append(ZERO_INDEX)
            else:
                inner.append(ZERO_INDEX if d == 1 else idx[k - lead])
        form = self.conv(x, tuple(inner), env)
        return [(coef, f, s + tuple(sums)) for coef, f, s in form]

    def _Softmax(self, node, idx, env):
        inner, fresh = self._reduced(node.x.shape, [node.axis], idx)
        return self._opaque(f"$softmax[{node.axis}]", node, [(node.x, inner)], idx, env, local=fresh)

    # index maps ------------------------------------------------------------------
    def _MergeHeads(self, node, idx, env):
        x = node.x  # [..., h, n, k] -> [..., n, h * k]: m = a * k + b
        h, k = x.shape[-3], x.shape[-1]
        a, b = self.fresh(h), self.fresh(k)
        inner = _bcast(x.shape[:-3], node.shape[:-2], idx[:-2]) + (a, idx[-2], b)
        mix = (ONE, ((f"$mix({k})", (idx[-1], a, b), FINITE, k),), ())
        form = _mul_forms([mix], self.conv(x, inner, env))
        sums = tuple((tok, self.ranges[tok]) for tok in (a, b) if tok != ZERO_INDEX)
        return [(coef, f, s + sums) for coef, f, s in form]

    def _SplitHeads(self, node, idx, env):
        x = node.x  # [..., n, h * k] -> [..., h, n, k]
        k = node.shape[-1]
        m = self.fresh(x.shape[-1])
        inner = _bcast(x.shape[:-2], node.shape[:-3], idx[:-3]) + (idx[-2], m)
        mix = (ONE, ((f"$mix({k})", (m, idx[-3], idx[-1]), FINITE, k),), ())
        form = _mul_forms([mix], self.conv(x, inner, env))
        sums = ((m, self.ranges[m]),) if m != ZERO_INDEX else ()
        return [(coef, f, s + sums) for coef, f, s in form]

    def _Concat(self, node, idx, env):
        axis, out, offset = node.axis, [], sympy.Integer(0)
        for part in node.parts:
            if len(part.shape) != len(node.shape):
                raise _Unsupported("concat of parts with other ranks")
            width = part.shape[axis]
            c = self.fresh(width)
            inner = list(_bcast(part.shape, node.shape, idx))
            inner[axis] = c
            embed = (ONE, ((f"$embed({offset})", (idx[axis], c), FINITE, offset),), ())
            form = _mul_forms([embed], self.conv(part, tuple(inner), env))
            sums = ((c, self.ranges[c]),) if c != ZERO_INDEX else ()
            out += [(coef, f, s + sums) for coef, f, s in form]
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
        embed = (ONE, ((f"$embed({node.start})", (m, idx[axis]), FINITE, sympy.sympify(node.start)),), ())
        form = _mul_forms([embed], self.conv(x, tuple(inner), env))
        sums = ((m, self.ranges[m]),) if m != ZERO_INDEX else ()
        return [(coef, f, s + sums) for coef, f, s in form]

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
        return [(coef, f, s + ((token, self.ranges[token]),)) for coef, f, s in form]

    # opaque factors --------------------------------------------------------------
    def _opaque(self, op: str, node: t.Node, args, idx, env, local=(), risk: int | None = None) -> list:
        """One factor `op(args)` at tokens `idx`; each argument is keyed by its canonical
        form with the factor's tokens named by position (`local` tokens: the reduced axes)."""
        names: dict[str, str] = {ZERO_INDEX: ZERO_INDEX}
        for k, token in enumerate(idx):
            names.setdefault(token, f"p{k}")
        for k, token in enumerate(local):
            names[token] = f"r{k}"
        forms, risks = [], []
        for arg, arg_idx in args:
            arg_risk = self.risk.node(arg)
            risks.append(arg_risk)
            if arg_risk == ANY:
                if env:
                    raise _Unsupported("a possibly non-finite argument inside index notation")
                forms.append(("struct", arg))  # NaN and inf differ: only the same node is the same
            else:
                forms.append(("form", self.conv(arg, arg_idx, env)))
        extras: list[str] = []
        for kind, form in forms:
            if kind == "form":
                for term in form:
                    bound = {tok for tok, _ in term[2]}
                    for f in term[1]:
                        for token in f[1]:
                            if token not in names and token not in bound and token not in extras:
                                extras.append(token)
        best = None
        orders = itertools.permutations(extras) if len(extras) <= 4 else [tuple(extras)]
        for order in orders:
            mapping = dict(names)
            for k, token in enumerate(order):
                mapping[token] = f"p{len(idx) + k}"
            keys = []
            for kind, form in forms:
                if kind == "struct":
                    keys.append("node:" + repr(form))
                else:
                    keys.append(_form_key(form, mapping, self.ranges))
            key = f"{op}(" + "; ".join(keys) + ")"
            if best is None or key < best[0]:
                best = (key, order)
        key, order = best
        if risk is None:
            risk = self.risk.node(node)
        meta = None
        if isinstance(node, t.Softmax):  # what the row-sum rule needs: axis, its size, a finite argument
            meta = (node.axis, node.shape[node.axis], risks[0] == FINITE)
        return [(ONE, ((key, tuple(idx) + tuple(order), risk, meta),), ())]


# --- canonical terms ----------------------------------------------------------------


def _occurrences(factors, token) -> int:
    return sum(f[1].count(token) for f in factors)


def _substitute(factors, old, new):
    return [(k, tuple(new if x == old else x for x in idx), r, m) for k, idx, r, m in factors]


def _normalize(coef, factors, sums, ranges):
    """Eliminate deltas and index-map pairs, fold unused sums. None: the term is zero."""
    factors = list(factors)
    sums = dict(sums)
    # eye(N) @ Y multiplies entries of Y by 0: only a finite Y is selected exactly
    finite = all(f[2] == FINITE for f in factors)

    def rng(token):
        return sums.get(token, ranges.get(token))

    changed = True
    while changed:
        changed = False
        for n, (key, idx, _, meta) in enumerate(factors):
            if key == DELTA or (key == EYE and finite):
                x, y = idx
                if x == y:
                    del factors[n]
                    changed = True
                    break
                for keep, drop in ((x, y), (y, x)):
                    if drop in sums and (keep == ZERO_INDEX or (rng(keep) is not None
                                                                and same_dim(rng(keep), sums[drop]))):
                        del factors[n]
                        factors = _substitute(factors, drop, keep)
                        del sums[drop]
                        changed = True
                        break
                if changed:
                    break
            elif key.startswith("$softmax[") and meta is not None and meta[2]:
                # sum over its axis of the softmax of a finite argument is 1
                token = idx[meta[0]]
                if token in sums and _occurrences(factors, token) == 1 and same_dim(sums[token], meta[1]):
                    del factors[n]
                    del sums[token]
                    changed = True
                    break
            elif key.startswith("$embed(") and meta == 0:
                m, c = idx
                if rng(m) is not None and rng(c) is not None and same_dim(rng(m), rng(c)):
                    factors[n] = (DELTA, (m, c), FINITE, None)
                    changed = True
                    break
        if changed:
            continue
        pair = _pair_rule(factors, sums, rng)
        if pair is False:
            return None
        if pair is not None:
            factors, sums = pair
            changed = True
    used = {x for f in factors for x in f[1]}
    for token in [tok for tok in sums if tok not in used]:
        coef = coef * sums.pop(token)
    return coef, factors, sums


def _pair_rule(factors, sums, rng):
    """Sum out a contracted index shared by two index maps. New (factors, sums), False
    when the term is zero, None when no rule applies."""
    for n1, n2 in itertools.combinations(range(len(factors)), 2):
        k1, i1, _, m1 = factors[n1]
        k2, i2, _, m2 = factors[n2]
        is_mix = k1 == k2 and k1.startswith("$mix(")
        if not (is_mix or (k1.startswith("$embed(") and k2.startswith("$embed("))):
            continue
        rest = [f for k, f in enumerate(factors) if k not in (n1, n2)]
        m = i1[0]
        if m == i2[0] and m in sums and _occurrences(factors, m) == 2:
            if is_mix:
                # sum_m [m = a k + b][m = a' k + b'] = [a = a'][b = b'] when a < h, b, b' < k
                ok = all(same_dim(rng(b), m1) for b in (i1[2], i2[2]) if b != ZERO_INDEX) and all(
                    rng(a) is not None and same_dim(rng(a) * m1, sums[m]) for a in (i1[1], i2[1]) if a != ZERO_INDEX)
                if ok and all(rng(x) is not None for x in i1[1:] + i2[1:]):
                    new = rest + [(DELTA, (i1[1], i2[1]), FINITE, None), (DELTA, (i1[2], i2[2]), FINITE, None)]
                    return new, {tok: r for tok, r in sums.items() if tok != m}
            elif k2.startswith("$embed("):
                # sum_m [m = c + o1][m = c' + o2]
                c1, c2 = i1[1], i2[1]
                r1, r2 = rng(c1), rng(c2)
                if r1 is None or r2 is None:
                    continue
                if same_dim(m1, m2) and (sums[m] - m1 - r1).is_nonnegative:
                    new = rest + [(DELTA, (c1, c2), FINITE, None)]
                    return new, {tok: r for tok, r in sums.items() if tok != m}
                if (m2 - m1 - r1).is_nonnegative or (m1 - m2 - r2).is_nonnegative:
                    return False
        if is_mix:
            # sum_{a, b} [m = a k + b][m' = a k + b] = [m = m'] when m, m' < h k
            a, b = i1[1], i1[2]
            if (a == i2[1] and b == i2[2] and a in sums and b in sums and a != b
                    and _occurrences(factors, a) == 2 and _occurrences(factors, b) == 2
                    and same_dim(sums[b], m1)):
                total = sums[a] * m1
                if all(x == ZERO_INDEX or (rng(x) is not None and same_dim(rng(x), total)) for x in (i1[0], i2[0])):
                    new = rest + [(DELTA, (i1[0], i2[0]), FINITE, None)]
                    return new, {tok: r for tok, r in sums.items() if tok not in (a, b)}
    return None


def _canon_term(coef, factors, sums, names, ranges):
    """(coef, canonical text) of a term whose free tokens are renamed by `names`; None if zero."""
    normal = _normalize(coef, factors, sums, ranges)
    if normal is None:
        return None
    coef, factors, sums = normal
    bound = list(sums)
    for f in factors:
        for x in f[1]:
            if x not in sums and x not in names:
                raise _Unsupported(f"index {x} is free but not named")

    def text(label):
        parts = sorted(f"{key}[{','.join(label.get(x) or names[x] for x in idx)}]" for key, idx, _, _ in factors)
        head = ""
        if bound:
            order = sorted(bound, key=lambda tok: label[tok])
            head = "sum(" + ", ".join(f"{label[tok]}<{sums[tok]}" for tok in order) + ") "
        return head + (" * ".join(parts) if parts else "1")

    if not bound:
        return coef, text({})
    # An invariant of each contracted index; only labellings that sort by it are tried.
    signature = {}
    for tok in bound:
        occ = []
        for key, idx, _, _ in factors:
            for pos, x in enumerate(idx):
                if x == tok:
                    pattern = tuple("=" if y == tok else ("?" if y in sums else names[y]) for y in idx)
                    occ.append((key, pos, pattern))
        signature[tok] = (str(sums[tok]), tuple(sorted(occ)))
    groups: dict = {}
    for tok in bound:
        groups.setdefault(signature[tok], []).append(tok)
    ordered = [groups[s] for s in sorted(groups)]
    total = math.prod(math.factorial(len(g)) for g in ordered)
    if total > MAX_LABELLINGS:
        choices = [ordered]
    else:
        choices = itertools.product(*[list(itertools.permutations(g)) for g in ordered])
    best = None
    for choice in choices:
        sequence = [tok for group in choice for tok in group]
        label = {tok: f"b{k}" for k, tok in enumerate(sequence)}
        candidate = text(label)
        if best is None or candidate < best:
            best = candidate
    return coef, best


def _collect(form: list, names, ranges) -> dict[str, list]:
    """canonical text -> [coefficient, possibly non-finite], like terms summed."""
    out: dict[str, list] = {}
    for coef, factors, sums in form:
        risky = any(f[2] != FINITE for f in factors)
        canon = _canon_term(coef, factors, sums, names, ranges)
        if canon is None:
            continue  # an index map selects nothing here: no arithmetic, even on infinite entries
        c, key = canon
        if key in out:
            if risky or out[key][1]:
                _same_sign(out[key][0], c)
            out[key][0] = out[key][0] + c
            out[key][1] = out[key][1] or risky
        else:
            out[key] = [c, risky]
    for key in list(out):
        c, risky = out[key]
        if _is_zero(c):
            if risky:
                raise _Unsupported("possibly non-finite terms would cancel")
            del out[key]
    return out


def _same_sign(a, b) -> None:
    """Like terms that may be infinite are only merged when they cannot cancel (inf - inf)."""
    if not ((a.is_positive and b.is_positive) or (a.is_negative and b.is_negative)):
        raise _Unsupported("possibly non-finite terms with coefficients of both signs")


def _is_zero(c) -> bool:
    if c == 0:
        return True
    if not c.free_symbols:
        return False if c.is_zero is False else sympy.simplify(c) == 0
    return sympy.expand(c) == 0


def _coef_text(c) -> str:
    c = sympy.expand(c) if c.has(sympy.Add) else c
    return str(c)


def _form_key(form: list, names, ranges) -> str:
    collected = _collect(form, names, ranges)
    if not collected:
        return "0"
    return " + ".join(f"({_coef_text(c)})*{key}" for key, (c, _) in sorted(collected.items()))


def _display(collected: dict) -> str:
    if not collected:
        return "0"
    text = ""
    for key, (c, _) in sorted(collected.items()):
        negative = c.could_extract_minus_sign()
        size = -c if negative else c
        term = key if size == 1 else f"{size} * {key}" if not size.is_Add else f"({size}) * {key}"
        if not text:
            text = f"-{term}" if negative else term
        else:
            text += f" - {term}" if negative else f" + {term}"
    return text


# --- the prover -----------------------------------------------------------------------


def _aligned(shape_a, shape_b):
    """The common shape without leading 1s, or None when the shapes differ."""
    def strip(shape):
        shape = list(shape)
        while shape and shape[0] == 1:
            shape.pop(0)
        return shape

    a, b = strip(shape_a), strip(shape_b)
    if len(a) != len(b) or not all((x == 1) == (y == 1) and same_dim(x, y) for x, y in zip(a, b)):
        return None
    return tuple(a)


def _top_tokens(node_shape, shape):
    lead = len(node_shape) - len(shape)
    return (ZERO_INDEX,) * lead + tuple(ZERO_INDEX if d == 1 else f"p{k}" for k, d in enumerate(shape))


def _forms(lhs, rhs, shape, spec, definitions, unfold, risk):
    cv = _Converter(spec, definitions, frozenset(unfold), risk)
    names = {ZERO_INDEX: ZERO_INDEX}
    for k, d in enumerate(shape):
        if d != 1:
            cv.ranges[f"p{k}"] = sympy.sympify(d)
            names[f"p{k}"] = f"p{k}"
    try:
        left = _collect(cv.conv(lhs, _top_tokens(lhs.shape, shape), {}), names, cv.ranges)
        right = _collect(cv.conv(rhs, _top_tokens(rhs.shape, shape), {}), names, cv.ranges)
    except _TooBig:
        raise
    except _Unsupported:
        return None, None, cv.seen
    return left, right, cv.seen


def _agree(left: dict, right: dict) -> bool:
    for key in set(left) | set(right):
        a, ra = left.get(key, (sympy.Integer(0), False))
        b, rb = right.get(key, (sympy.Integer(0), False))
        if a == b:
            continue
        if not _zero_for_all_sizes(a - b):
            return False
        if (key not in left or key not in right) and (ra or rb):
            return False  # a possibly non-finite term would vanish
    return True


def _zero_for_all_sizes(c) -> bool:
    """Whether a coefficient is 0 for every size: a cheap refutation at a few sizes first."""
    if c == 0:
        return True
    if c.is_zero is False:
        return False
    symbols = sorted(c.free_symbols, key=str)
    for point in ((7, 11, 13, 17, 19, 23, 29), (2, 3, 5, 4, 6, 8, 9)):
        values = {x: point[k % len(point)] + k // len(point) for k, x in enumerate(symbols)}
        try:
            value = complex(c.subs(values).evalf(30))
        except (TypeError, ValueError):
            continue
        if abs(value) > 1e-12:
            return False
    return sympy.expand(c) == 0 or sympy.simplify(c) == 0


def _unfoldable(definitions, key, name) -> bool:
    if key not in definitions:
        return False
    value = definitions[key]
    return not (isinstance(value, t.Grad) and value.name == name)


def _next_unfold(seen, unfolded, definitions, order):
    grads = [key[5:-1] for key in seen if key.startswith("grad(") and key not in unfolded]
    grads = [name for name in grads if _unfoldable(definitions, f"grad({name})", name)]
    if grads:
        name = min(grads, key=lambda n: (order.get(n, len(order)), n))
        return f"grad({name})"
    forward = [key for key in seen if not key.startswith("grad(") and key not in unfolded
               and definitions.get(key) is not None]
    if forward:
        return max(forward, key=lambda n: (order.get(n, -1), n))
    return None


def prove_equal(lhs: t.Node, rhs: t.Node, spec: t.TypedSpec,
                definitions: Mapping[str, t.Node | None]) -> Proof | None:
    """A Proof that `lhs == rhs` for all values and all dim sizes, or None (not shown).

    `definitions`: tensor name -> forward definition, `"grad(T)"` -> derived
    gradient (None: L does not depend on T, so grad(T) is zero); see
    `definitions_for`. References are unfolded only when needed.
    """
    shape = _aligned(lhs.shape, rhs.shape)
    if shape is None:
        return None
    dims = list(spec.dims)
    order = {name: k for k, name in enumerate(spec.tensors)}
    risk = Finiteness(spec, definitions)
    unfolded: list[str] = []
    steps: list[tuple[str, str, str]] = []
    try:
        for _ in range(MAX_ROUNDS + 1):
            left, right, seen = _forms(lhs, rhs, shape, spec, definitions, unfolded, risk)
            if left is not None and _agree(left, right):
                steps.append(("left side in canonical index form", to_spec(lhs, dims), _display(left)))
                steps.append(("right side in canonical index form", to_spec(rhs, dims), _display(right)))
                steps.append(("like terms collected: the forms agree term by term, dims symbolic",
                              _display(left), _display(right)))
                return Proof(METHOD, tuple(steps))
            key = _next_unfold(seen, unfolded, definitions, order)
            if key is None:
                return None
            unfolded.append(key)
            definition = definitions[key]
            after = "0 (L does not depend on it)" if definition is None else to_spec(definition, dims)
            rule = "substitute the derived gradient" if key.startswith("grad(") else "substitute the definition"
            steps.append((f"{rule} of {key}", key, after))
    except (_Unsupported, RecursionError):
        return None
    except Exception:  # noqa: BLE001 - an internal failure is "not proved", never a crash of the check
        return None
    return None


def index_form_text(node: t.Node, spec: t.TypedSpec, definitions: Mapping[str, t.Node | None] | None = None,
                    unfold: tuple[str, ...] = ()) -> str | None:
    """The canonical index form of one node as text (free indices p0, p1, ... by axis);
    None when it cannot be formed. For documents and debugging."""
    definitions = definitions or {}
    shape = _aligned(node.shape, node.shape)
    left, _, _ = _forms(node, node, shape, spec, definitions, list(unfold), Finiteness(spec, definitions))
    return None if left is None else _display(left)
