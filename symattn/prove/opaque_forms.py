"""Index forms of nonlinear elementwise operations: opaque factors and the rules inside them.

Contract: `OpaqueForms` is the part of `symattn.prove.index_forms.Converter`
that writes an elementwise function, a division, a power, a comparison or a
`where` of values as an opaque `Application` factor, keyed by the canonical
forms of its arguments (`symattn.prove.index_terms.keyed`; an argument that
may be NaN or +-inf is keyed by its expression). It relies on the
Converter's `conv`, `fresh`, `ranges`, `seen`, `defs`, `risk` (a
`Finiteness`, whose `rows` are `symattn.symbolic.row_facts.RowFacts`) and
`spec`. Before a factor is made, identities that hold for every size and
every value under IEEE float64 semantics (rounding and overflow aside)
rewrite the node; each one names what it needs:

- an elementwise operation of a `concat` is the concat of the operation on
  the blocks, `exp(concat(A, B) - m) = concat(exp(A - m), exp(B - m))` (the
  other operands split at the same widths, or constant along the axis), in
  the comparison that splits concats (`split_concat`, see
  `symattn.prove.softmax_forms`);
- `exp(log(y)) = y` where y is finite and >= 0 (exp(-inf) = 0 at y = 0), and
  `log(exp(v)) = v` where v is never NaN nor +inf;
- positive values live in log space: `sum(exp(y), axis) =
  exp(logsumexp(y))` where y is never NaN nor +inf (0 = exp(-inf) on a fully
  masked row), `1 / F = exp(-log(F))` where F is finite, > 0 and a sum of
  exps, `exp(log(F) + v) = F * exp(v)` where F >= 0, and `log(exp(u) * Y) =
  u + log(Y)` for a finite u that every term's exp holds (any Y: NaN, 0 and
  negative values included), and for a u that may be -inf (a masked row's
  logsumexp) where Y is a sum of positive multiples of exps (finite, >= 0), so
  that -inf + log(Y) is -inf = log(0); with the product rule of
  `symattn.prove.softmax_terms` (exp(a) * exp(b) = exp(a + b)) a rescaled
  running sum, `exp(m1 - m) * sum(exp(S1 - m1))`, meets `sum(exp(S1 - m))`;
- `exp(x - logsumexp(x)) = softmax(x)` where logsumexp(x) is finite (every
  line holds a finite entry: on a fully masked row the left side is NaN), and
  `E / sum(E) = softmax(y)` for `E = exp(y)` likewise (the stable softmax
  written out, whose blocks then merge as softmax's do);
- `where(c, a, b) = a` when a and b have one canonical form (the tie share of
  a max whose gradient is 0);
- `1 / x` is finite where x is shown finite and > 0 (it may then be
  distributed and cancelled like any finite factor);
- norms: `sqrt(c * F) = sqrt(c) * sqrt(F)` and `1 / (c * F) = (1 / c) / F` for a
  number c > 0 (exact under IEEE semantics, NaN, infinities and the signs of
  zeros included), so a row normalised after a scaling by a positive (or
  negative) constant meets the row normalised as it is:
  `(2 * Q) / sqrt(sum((2 * Q) * (2 * Q)))` is `Q / sqrt(sum(Q * Q))`, zero rows
  (0 / 0, NaN) included.

Signs of zeros: `plus_zero(node, definitions)` is True when every entry of
`node` is >= 0 (or NaN) and a zero is always +0, shown from the node's
structure (exp, abs, squares, sums and products of such, softmax weights):
then two nodes with one canonical form have zeros of one sign, and 1 / x is
the same infinity for both, so a divisor may be keyed by its canonical form.
False means not shown (`X * 0` is -0 where X < 0 while `X - X` is +0: one form,
two signs). `untransposed(node, idx)` is the node under a chain of transposes,
at the tokens that address the same entries (a transpose moves entries
without changing one bit, so a divisor keyed by its expression is keyed by the
tensor it moves).
"""

from __future__ import annotations

import dataclasses

from typing import Mapping

import sympy

from ..ir import typed as t
from ..symbolic.finiteness import ANY, FINITE, MINUS_INF, const_value, finite_real
from .index_rules import rewrite
from .index_terms import (MAX_TERMS, ONE, ZERO_INDEX, Application, Term, TooBig, Unsupported, form_key, instantiated,
                          keyed)
from .softmax_terms import content, exp_factors, without

__all__ = ["OpaqueForms", "bcast", "mul_forms", "scale", "plus_zero", "untransposed"]

def bcast(sub_shape, shape, idx):
    """The tokens of an operand broadcast into `shape` (right-aligned, size 1 -> ZERO_INDEX)."""
    offset = len(shape) - len(sub_shape)
    if offset < 0:
        raise Unsupported("an operand has more axes than the result")
    return tuple(ZERO_INDEX if d == 1 else idx[offset + k] for k, d in enumerate(sub_shape))


def mul_forms(a: list[Term], b: list[Term]) -> list[Term]:
    """The product of two forms, distributed where that is exact under IEEE semantics."""
    if not a or not b:
        if any(term.risky for term in a + b):
            raise Unsupported("a possibly non-finite term would be multiplied by zero")
        return []
    if (len(a) > 1 and any(term.risky for term in b)) or (len(b) > 1 and any(term.risky for term in a)) \
            or any(ta.sums and tb.risky or tb.sums and ta.risky for ta in a for tb in b):
        # (A + B) * M is not A * M + B * M where M is -inf or 1/0: (1 + 0) * inf is inf while
        # 1 * inf + 0 * inf is NaN; likewise a contracted sum, sum(X) / w vs sum(X / w).
        raise Unsupported("a possibly non-finite factor would be distributed over a sum")
    if len(a) * len(b) > MAX_TERMS:
        raise TooBig("the expansion is too large")
    return [ta.times(tb) for ta in a for tb in b]


def scale(form: list[Term], c) -> list[Term]:
    return [term.scaled(c) for term in form]


def _minus_inf_piece(piece: Term) -> bool:
    """A positive multiple of one factor that is finite or -inf (never NaN nor +inf), summed over nothing."""
    return (piece.coef.is_positive is True and not piece.sums and len(piece.factors) == 1
            and piece.factors[0].risk == MINUS_INF)


# --- signs of zeros: a divisor is keyed by its canonical form only where its zeros are all +0 -------

_PLUS_ZERO_FUNCTIONS = {"exp", "sigmoid", "abs"}  # f(x) >= 0, and f(x) == 0 only as +0


def untransposed(node: t.Node, idx: tuple[str, ...]) -> tuple[t.Node, tuple[str, ...]]:
    """The node under any chain of transposes, at the tokens that address the same entries."""
    while isinstance(node, t.Transpose):
        node, idx = node.x, idx[:-2] + (idx[-1], idx[-2])
    return node, idx


def plus_zero(node: t.Node, defs: Mapping[str, t.Node | None], seen: frozenset = frozenset()) -> bool:
    """Entries >= 0 (or NaN), zeros +0, shown from the node's structure (see the module docstring)."""
    if isinstance(node, (t.Scalar, t.DimValue)) or (node.shape == () and isinstance(node, (t.Unary, t.Binary))):
        value = const_value(node)
        if value is None or value.has(sympy.zoo, sympy.nan):
            return False
        # a literal 0 is +0; a computed one may be -0 (-0, 0 * -1)
        return value.is_positive is True or (isinstance(node, t.Scalar) and value.is_zero is True)
    if isinstance(node, t.Tensor):
        definition = defs.get(node.name)
        if definition is None or node.name in seen:
            return False
        return plus_zero(definition, defs, seen | {node.name})
    if isinstance(node, t.Unary):
        return node.fn in _PLUS_ZERO_FUNCTIONS or (node.fn == "sqrt" and plus_zero(node.x, defs, seen))
    if isinstance(node, t.Binary):
        if node.op == "pow":
            exponent = const_value(node.b)
            if exponent is not None and exponent.is_integer and exponent.is_even and exponent.is_positive:
                return True  # (-0) ^ 2 is +0
            return plus_zero(node.a, defs, seen) and plus_zero(node.b, defs, seen)
        if node.op == "mul" and node.a == node.b:
            return True  # x * x: (-0) * (-0) is +0
        return node.op in ("add", "mul", "div") and plus_zero(node.a, defs, seen) and plus_zero(node.b, defs, seen)
    if isinstance(node, t.Softmax):
        return True
    if isinstance(node, t.Constant):
        return node.kind in ("ones", "eye")
    if isinstance(node, t.Reduce):
        return node.kind in ("sum", "mean", "max", "min") and plus_zero(node.x, defs, seen)
    if isinstance(node, t.MatMul):
        return plus_zero(node.a, defs, seen) and plus_zero(node.b, defs, seen)
    if isinstance(node, t.Where):
        return plus_zero(node.a, defs, seen) and plus_zero(node.b, defs, seen)
    if isinstance(node, (t.Transpose, t.Slice, t.SumTo, t.MergeHeads, t.SplitHeads, t.Scan)):
        return plus_zero(node.children[0], defs, seen)
    if isinstance(node, t.Concat):
        return all(plus_zero(p, defs, seen) for p in node.parts)
    return False


_ELEMENTWISE = (t.Unary, t.Binary, t.Where, t.Compare)


class OpaqueForms:
    """Opaque factors of elementwise operations (see the module docstring); a mixin of Converter."""

    split_concat = False  # the comparison that writes operations on concats block by block
    concat_met = False    # a rule on a concat would apply (then that comparison is worth trying)

    # --- what the rules look through -------------------------------------------------------
    @property
    def rows(self):
        return self.risk.rows

    def klass(self, node: t.Node) -> int:
        return self.risk.node(node)

    def expanded(self, node: t.Node) -> t.Node:
        """The node under the definitions of the tensors it names (rules read what a tensor is)."""
        for _ in range(64):
            if not isinstance(node, t.Tensor):
                return node
            definition = self.risk.definition(node.name)
            if definition is None or len(definition.shape) != len(node.shape):
                return node
            node = definition
        return node

    def plus_zero(self, node: t.Node) -> bool:
        """Whether every entry of `node` is >= 0 or NaN, a zero always being +0 (`plus_zero`)."""
        return plus_zero(node, self.defs)

    # --- blocks of a concat ----------------------------------------------------------------
    def concat_parts(self, node: t.Node, axis: int) -> list[t.Node] | None:
        """Nodes whose concat along `axis` is `node` (nested concats flattened, elementwise
        operations pushed into the blocks), or None when it is not shown to be one."""
        n = self.expanded(node)
        rank = len(node.shape)
        if len(n.shape) != rank or not 0 <= axis < rank:
            return None
        if isinstance(n, t.Concat) and n.axis == axis:
            out: list[t.Node] = []
            for part in n.parts:
                if len(part.shape) != rank:
                    return None  # a broadcast block
                inner = self.concat_parts(part, axis)
                out += inner if inner is not None else [part]
            return out
        if isinstance(n, t.Transpose) and axis >= rank - 2:
            inner = self.concat_parts(n.x, 2 * rank - 3 - axis)
            if inner is None:
                return None
            return [t.Transpose(p, p.shape[:-2] + (p.shape[-1], p.shape[-2])) for p in inner]
        if isinstance(n, _ELEMENTWISE):
            return self._elementwise_parts(n, axis)
        return None

    def _elementwise_parts(self, n: t.Node, axis: int) -> list[t.Node] | None:
        rank = len(n.shape)
        operands = list(n.children)
        split: list[list[t.Node] | None] = []
        widths = None
        for operand in operands:
            k = axis - (rank - len(operand.shape))
            if k < 0 or operand.shape[k] == 1:
                split.append(None)  # constant along the axis: every block reads it whole
                continue
            parts = self.concat_parts(operand, k)
            if parts is None:
                return None
            mine = [p.shape[k] for p in parts]
            if widths is None:
                widths = mine
            elif len(widths) != len(mine) or any(a != b and (a - b).expand() != 0 for a, b in zip(widths, mine)):
                return None
            split.append(parts)
        if widths is None:
            return None
        blocks = []
        for number, width in enumerate(widths):
            shape = n.shape[:axis] + (width,) + n.shape[axis + 1:]
            new = [o if s is None else s[number] for o, s in zip(operands, split)]
            if isinstance(n, t.Unary):
                blocks.append(dataclasses.replace(n, x=new[0], shape=shape))
            elif isinstance(n, (t.Binary, t.Compare)):
                blocks.append(dataclasses.replace(n, a=new[0], b=new[1], shape=shape))
            else:
                blocks.append(dataclasses.replace(n, cond=new[0], a=new[1], b=new[2], shape=shape))
        return blocks

    def _through_concat(self, node: t.Node) -> t.Node | None:
        """`node` as a concat of itself on blocks, when one of its operands is a concat and the
        comparison is the one that splits concats (`split_concat`)."""
        rank = len(node.shape)
        for operand in node.children:
            n = self.expanded(operand)
            if isinstance(n, t.Concat) and len(n.shape) == len(operand.shape):
                axis = n.axis + rank - len(operand.shape)
                if operand.shape[n.axis] != 1:
                    parts = self.concat_parts(node, axis)
                    if parts is not None and len(parts) > 1:
                        self.concat_met = True
                        return t.Concat(tuple(parts), axis, node.shape) if self.split_concat else None
        return None

    # --- elementwise functions ---------------------------------------------------------------
    def _Unary(self, node, idx, env):
        if node.fn == "neg":
            return scale(self.conv(node.x, idx, env), -ONE)
        pushed = self._through_concat(node)
        if pushed is not None:
            return self.conv(pushed, idx, env)
        x = self.expanded(node.x)
        if node.fn == "exp" and isinstance(x, t.Unary) and x.fn == "log" and self.rows.nonnegative(x.x):
            return self.conv(x.x, idx, env)  # exp(log(y)) = y for finite y >= 0
        if node.fn == "log" and isinstance(x, t.Unary) and x.fn == "exp" and self.klass(x.x) <= MINUS_INF:
            return self.conv(x.x, idx, env)  # log(exp(v)) = v, -inf included
        forms, _ = self.argument_forms([(node.x, idx)], env)
        if node.fn == "exp" and not isinstance(forms[0], t.Node):
            return self.exp_form(forms[0], idx, self.klass(node))
        if node.fn == "log" and not isinstance(forms[0], t.Node):
            return self.log_form(forms[0], idx, self.klass(node), masked=True)
        if node.fn == "sqrt" and not isinstance(forms[0], t.Node):
            split = content(forms[0], self.ranges)
            if split is not None:  # sqrt(c * F) = sqrt(c) * sqrt(F) for a number c > 0
                c, rest = split
                return [Term(sympy.sqrt(c), (self.factor("$sqrt", [rest], idx, self.klass(node)),))]
        return [Term(ONE, (self.factor(f"${node.fn}", forms, idx, self.klass(node)),))]

    def exp_form(self, form: list[Term], idx, risk: int) -> list[Term]:
        """exp of an argument form that is never NaN nor +inf, at tokens `idx`: softmax's weight for
        exp(x - logsumexp(x)), else a factor (whose log terms `symattn.prove.softmax_terms` expands)."""
        return [Term(ONE, tuple(exp_factors(form, [idx], self.ranges, risk)))]

    def log_form(self, form: list[Term], idx, risk: int, masked: bool = False) -> list[Term]:
        """log of an argument form at tokens `idx`: a finite term u that every term's exp holds in its
        argument comes out, log(exp(u) * Y) = u + log(Y) (for every Y: NaN, -inf and 0 included).
        With `masked`, so may a term u that may be -inf, where Y is a sum of positive multiples of exps
        (finite and >= 0): at u = -inf both sides are -inf, log(0) on the left and -inf + log(Y) on the
        right (log(Y) is never NaN nor +inf), so logsumexp(concat(A, A)) meets logsumexp(A) + log(2)
        on a fully masked row as well."""
        common, rest = self._common_exponent(form, idx, masked)
        if common:
            if len(rest) == 1 and not rest[0].factors and not rest[0].sums and rest[0].coef == 1:
                return common  # log(1) = 0
            return common + [Term(ONE, (self.factor("$log", [rest], idx, risk),))]
        return [Term(ONE, (self.factor("$log", [form], idx, risk),))]

    def _common_exponent(self, form: list[Term], idx, masked: bool = False) -> tuple[list[Term], list[Term]]:
        """(u, form / exp(u)) for the finite terms u, reading only the tokens `idx`, that the argument
        of each term's one exp factor holds; ([], form) when there are none. With `masked`, and every
        term a positive multiple of its exp alone (so form / exp(u) is finite and >= 0), u may hold terms
        that may be -inf (a positive multiple of one such factor, as a masked row's logsumexp): those are
        taken out of each argument as they are, never cancelled against their negation (-inf - -inf is
        NaN)."""
        if not form:
            return [], form
        masked = masked and all(term.coef.is_positive is True and len(term.factors) == 1 for term in form)
        names = {ZERO_INDEX: ZERO_INDEX, **{tok: f"p{k}" for k, tok in enumerate(idx) if tok != ZERO_INDEX}}
        shared: dict | None = None
        pieces = []
        for term in form:
            exps = [k for k, f in enumerate(term.factors) if isinstance(f, Application) and f.op == "$exp"
                    and len(f.parts) == 1 and not isinstance(f.parts[0], t.Node)]
            if len(exps) != 1:
                return [], form
            g = term.factors[exps[0]]
            argument = instantiated(g.parts[0], g.origin, g.indices)
            mine: dict = {}
            for piece in argument:
                inner = {tok for tok, _ in piece.sums}
                if piece.risky and not (masked and _minus_inf_piece(piece)):
                    continue
                if any(x not in names for f in piece.factors for x in f.indices if x not in inner):
                    continue
                try:
                    key = form_key([piece], names, self.ranges)
                except Unsupported:
                    continue
                mine[key] = (piece, mine[key][1] + 1 if key in mine else 1)
            shared = mine if shared is None else {k: v for k, v in shared.items() if k in mine and mine[k][1] == v[1]}
            pieces.append((term, exps[0], g, argument))
            if not shared:
                return [], form
        common = [piece for piece, count in shared.values() for _ in range(count)]
        finite = [piece for piece in common if not piece.risky]
        minus_inf = [piece for piece in common if piece.risky]
        rest: list[Term] = []
        for term, k, g, argument in pieces:
            factors = list(term.factors)
            del factors[k]
            if minus_inf:
                argument = without(argument, minus_inf, self.ranges)
                if argument is None:
                    return [], form
            exp_part = self.exp_form(argument + scale(finite, -ONE), tuple(g.indices), g.risk)
            rest += mul_forms([Term(term.coef, tuple(factors), term.sums)], exp_part)
        return common, rest

    # --- division and powers ---------------------------------------------------------------
    def _divide(self, node, idx, env):
        a, b = node.a, node.b
        ia, ib = bcast(a.shape, node.shape, idx), bcast(b.shape, node.shape, idx)
        value = const_value(b)
        if value is not None and finite_real(value) and value.is_zero is False:
            return scale(self.conv(a, ia, env), 1 / value)
        weights = self._normalised(a, b)
        if weights is not None:
            return self.conv(weights, idx, env)
        positive = self.rows.positive(b)
        if not positive and (b in self.assumed_positive or self.expanded(b) in self.assumed_positive):
            positive = True  # a row norm taken as > 0: where it is 0 both sides must be NaN (`norm_rows`)
            self.assumed_reads.append((tuple(ib), self.in_argument > 0))
        # 1/0 is inf; 1/(+0) and 1/(-0) are inf and -inf, so the divisor is keyed by its expression
        # unless its zeros are all +0 (0 * X and 0 * Y, X - X and 0 * X have one form, not one sign)
        structural = not (positive or self.plus_zero(b))
        if structural:  # a transpose moves entries without changing one bit: key the tensor it moves
            b, ib = untransposed(b, ib)
        forms, _ = self.argument_forms([(b, ib)], env, structural=structural)
        if positive and not isinstance(forms[0], t.Node) and self._of_exps(forms[0]):
            # 1 / F = exp(-log(F)) for a finite F > 0: a sum of exps meets the exps of the numerator
            recip = self.exp_form(scale(self.log_form(forms[0], ib, FINITE), -ONE), ib, FINITE)
            return mul_forms(self.conv(a, ia, env), recip)
        scale_by = ONE
        if not isinstance(forms[0], t.Node):
            split = content(forms[0], self.ranges)
            if split is not None:  # 1 / (c * F) = (1 / c) / F for a number c > 0, signed zeros included
                scale_by, forms = 1 / split[0], [split[1]]
        recip = self.factor("$recip", forms, ib, FINITE if positive else ANY)
        return mul_forms(self.conv(a, ia, env), [Term(scale_by, (recip,))])

    def _normalised(self, a: t.Node, b: t.Node) -> t.Softmax | None:
        """`E / sum(E, axis)` with `E = exp(y)` as softmax(y, axis), where y is never NaN nor +inf and
        every line of y along the axis holds a finite entry (so the sum is finite and > 0; a fully
        masked row would be 0 / 0 here and 0 in softmax): the stable softmax written out by hand."""
        total = self.expanded(b)
        if not (isinstance(total, t.Reduce) and total.kind == "sum" and total.axis is not None
                and len(total.shape) == len(a.shape)):
            return None
        numerator = self.expanded(a)
        if not (isinstance(numerator, t.Unary) and numerator.fn == "exp" and self.expanded(total.x) == numerator):
            return None
        y, axis = numerator.x, total.axis
        if self.klass(y) > MINUS_INF or not self.rows.nonempty(y, axis):
            return None
        return t.Softmax(y, axis, a.shape)

    @staticmethod
    def _of_exps(form: list[Term]) -> bool:
        """Every term a positive number times one exp, and nothing that may be non-finite."""
        return bool(form) and all(term.coef.is_positive and not term.risky and len(term.factors) == 1
                                  and isinstance(term.factors[0], Application) and term.factors[0].op == "$exp"
                                  for term in form)

    def _power(self, node, idx, env):
        a, b = node.a, node.b
        ia, ib = bcast(a.shape, node.shape, idx), bcast(b.shape, node.shape, idx)
        value = const_value(b)
        if value is not None and value.is_Integer and 0 <= value <= 6:
            form = [Term(ONE)]
            for _ in range(int(value)):
                form = mul_forms(form, self.conv(a, ia, env))
            return form
        # (-0) ^ -1 is -inf, (+0) ^ -1 inf: the base is keyed by its expression, as a divisor is
        signless = self.plus_zero(a) or (value is not None and value.is_positive is True)
        return self._opaque("$pow", node, [(a, ia), (b, ib)], idx, env, structural=not signless)

    def _Compare(self, node, idx, env):
        a, b = node.a, node.b
        return self._opaque(f"$cmp{node.op}", node,
                            [(a, bcast(a.shape, node.shape, idx)), (b, bcast(b.shape, node.shape, idx))], idx, env)

    def sum_of_exps(self, node: t.Reduce, idx, env) -> list[Term] | None:
        """sum(exp(y), axis) = exp(logsumexp(y, axis)) where y is never NaN nor +inf (0 = exp(-inf)
        on a fully masked row), so a sum of exps is in the same log space as the exps it meets."""
        summand = self.expanded(node.x)
        if node.axis is None or not (isinstance(summand, t.Unary) and summand.fn == "exp"):
            return None
        y = summand.x
        if len(y.shape) != len(node.x.shape) or self.klass(y) > MINUS_INF:
            return None
        return self.conv(t.Unary("exp", t.Reduce("logsumexp", y, node.axis, node.shape), node.shape), idx, env)

    def _opaque_where(self, node, idx, env):
        """where(c, a, b) of values: `a` when both branches have one canonical form, else a factor."""
        pushed = self._through_concat(node)
        if pushed is not None:
            return self.conv(pushed, idx, env)
        c = node.cond
        ia, ib = bcast(node.a.shape, node.shape, idx), bcast(node.b.shape, node.shape, idx)
        if self.klass(node.a) != ANY and self.klass(node.b) != ANY:
            left = rewrite(self.conv(node.a, ia, env), self.ranges)
            right = rewrite(self.conv(node.b, ib, env), self.ranges)
            names = {ZERO_INDEX: ZERO_INDEX, **{tok: f"p{k}" for k, tok in enumerate(idx) if tok != ZERO_INDEX}}
            try:
                if form_key(left, names, self.ranges) == form_key(right, names, self.ranges):
                    return left
            except Unsupported:
                pass
        if isinstance(c, t.Logical):  # conditions joined: the condition is one factor of its own
            return self._opaque("$where", node, [(c, bcast(c.shape, node.shape, idx)), (node.a, ia), (node.b, ib)],
                                idx, env)
        args = [(c.a, bcast(c.a.shape, node.shape, idx)), (c.b, bcast(c.b.shape, node.shape, idx)),
                (node.a, ia), (node.b, ib)]
        return self._opaque(f"$where{c.op}", node, args, idx, env)

    # --- opaque factors ----------------------------------------------------------------------
    def _opaque(self, op: str, node: t.Node, args, idx, env, local=(), risk: int | None = None,
                structural: bool = False) -> list[Term]:
        """One factor `op(args)` at tokens `idx`; its risk is the node's unless given.
        `structural`: the first argument is keyed by its expression, not its canonical form."""
        forms, _ = self.argument_forms(args, env, structural)
        risk = self.klass(node) if risk is None else risk
        return [Term(ONE, (self.factor(op, forms, idx, risk, local),))]

    def factor(self, op: str, forms, idx, risk: int, local=()) -> Application:
        """The factor `op(forms)` at tokens `idx`, with its arguments kept for the rules."""
        arguments, indices = keyed(op, forms, idx, local, self.ranges)
        return Application(op, arguments, indices, risk, parts=tuple(
            f if isinstance(f, t.Node) else tuple(f) for f in forms), origin=indices, local=tuple(local))

    def argument_forms(self, args, env, structural: bool = False) -> tuple[list, list[int]]:
        """Each argument `(node, tokens)` as its index form modulo the identities, or as the node
        itself when it may be NaN or inf (then only the same node is the same argument), and the
        risk of each."""
        forms: list = []
        risks = []
        for number, (arg, arg_idx) in enumerate(args):
            arg_risk = self.klass(arg)
            risks.append(arg_risk)
            if arg_risk == ANY or (structural and number == 0):
                if env:
                    raise Unsupported("a possibly non-finite argument inside index notation")
                forms.append(arg)
                # references it reads can still be unfolded, for the same-expression comparison
                self.seen.update(f"grad({n.name})" if isinstance(n, t.Grad) else n.name
                                 for n in t.walk(arg) if isinstance(n, (t.Tensor, t.Grad)))
            else:
                self.in_argument += 1
                try:
                    forms.append(rewrite(self.conv(arg, arg_idx, env), self.ranges))
                finally:
                    self.in_argument -= 1
        return forms, risks
