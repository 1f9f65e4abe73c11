"""Index forms of the softmax family: softmax, logsumexp, max and min along an axis.

Contract: `SoftmaxForms` is the part of `symattn.prove.index_forms.Converter`
that writes `softmax(x, axis)` as a `SoftmaxApplication` and `logsumexp`,
`max` and `min` along an axis as `Application` factors, after the rules
below, each valid for every size and every value under IEEE float64
semantics (rounding and overflow aside), each with the side condition it
needs from the finiteness analysis and its row facts
(`symattn.symbolic.row_facts`). "Row" is a line along the reduced axis.

- Shift by a row statistic: a term of the argument that does not depend on
  the reduced index and is finite (a row max or logsumexp whose rows hold a
  finite entry, a buffer row vector, a mean of finite values) is dropped
  from softmax's argument and taken out of logsumexp, max and min:
  `softmax(x + c) = softmax(x)`, `logsumexp(x + c) = logsumexp(x) + c`. A
  term that may be -inf is kept (on a fully masked row `S - max(S)` is NaN).
- A reduction over an axis of size 1 is its one entry: always for max and
  min, for logsumexp only where the entry is never NaN nor +inf (the stable
  formula makes `logsumexp([inf])` NaN: inf - inf).
- A `concat` along the reduced axis (blocks of keys, as in split-K and ring
  attention, any number of them, nested concats flattened):
  `logsumexp(concat(A, B)) = log(exp(logsumexp(A)) + exp(logsumexp(B)))`,
  `max(concat(A, B)) = ` the max of the blocks' maxima, one factor whatever
  the order and the nesting of the blocks (so a running max,
  `max(concat(m1, m2), axis=-1)`, meets the max over all keys), and, where the
  concat's rows hold a finite entry (so its logsumexp L is finite),
  `softmax(concat(A, B)) = concat(exp(logsumexp(A) - L) * softmax(A),
  exp(logsumexp(B) - L) * softmax(B))` (a block whose row is empty has weight
  0 both ways). These rules, and the elementwise ones on concats of
  `symattn.prove.opaque_forms`, are applied only in the comparison that
  splits concats (`split_concat`), tried when the one without them fails: a
  softmax written block by block hides softmax's row-sum rule and
  `exp(x - logsumexp(x))`.
- The row sum of softmax is 1 where the argument's rows hold a finite entry
  (`finite_argument`).
"""

from __future__ import annotations

from ..ir import typed as t
from ..symbolic.finiteness import FINITE, MINUS_INF
from .index_terms import ONE, Application, SoftmaxApplication, Term, keyed, mentions

__all__ = ["SoftmaxForms"]


def _with_one(shape, axis):
    return shape[:axis] + (1,) + shape[axis + 1:]


class SoftmaxForms:
    """Softmax, logsumexp, max and min along an axis (see the module docstring); a mixin of Converter."""

    def _Softmax(self, node, idx, env):
        x, axis = node.x, node.axis
        parts = self.blocks(x, axis)
        if parts is not None and self.klass(x) <= MINUS_INF and self.rows.nonempty(x, axis):
            return self.conv(self._softmax_blocks(node, parts), idx, env)
        return [Term(ONE, (self.softmax_factor(x, axis, idx, env, self.klass(node)),))]

    def blocks(self, x: t.Node, axis: int) -> list[t.Node] | None:
        """The blocks of `x` along `axis` when it is a concat there and the comparison is the one that
        splits concats (`split_concat`); otherwise None, noting that a concat was met."""
        if x.shape[axis] == 1:
            return None
        parts = self.concat_parts(x, axis)
        if parts is None or len(parts) < 2:
            return None
        self.concat_met = True
        return parts if self.split_concat else None

    def softmax_factor(self, x: t.Node, axis: int, idx, env, risk: int) -> SoftmaxApplication:
        """softmax(x, axis) at tokens `idx`, its argument without finite row constants."""
        inner, fresh = self._reduced(x.shape, [axis], idx)
        forms, risks = self.argument_forms([(x, inner)], env)
        form = forms[0]
        if not isinstance(form, t.Node) and fresh:
            form = [term for term in form if mentions(term, fresh[0]) or term.risky]
        arguments, indices = keyed(f"$softmax[{axis}]", [form], idx, fresh, self.ranges)
        finite = risks[0] == FINITE or (risks[0] == MINUS_INF and self.rows.nonempty(x, axis))
        parts = () if isinstance(form, t.Node) else (tuple(form),)
        return SoftmaxApplication(axis, x.shape[axis], finite, arguments, indices, risk, parts=parts,
                                  origin=indices, local=tuple(fresh))

    def _softmax_blocks(self, node: t.Softmax, parts: list[t.Node]) -> t.Node:
        """softmax(concat(A_1, ..., A_k)) as concat(exp(logsumexp(A_i) - L) * softmax(A_i))."""
        x, axis = node.x, node.axis
        row = _with_one(x.shape, axis)
        total = t.Reduce("logsumexp", x, axis, row)
        pieces = []
        for part in parts:
            own = t.Reduce("logsumexp", part, axis, row)
            weight = t.Unary("exp", t.Binary("sub", own, total, row), row)
            pieces.append(t.Binary("mul", weight, t.Softmax(part, axis, part.shape), part.shape))
        return t.Concat(tuple(pieces), axis, node.shape)

    def extreme(self, node: t.Reduce, idx, env) -> list[Term]:
        """logsumexp, max or min of `node.x` along its axis (see the module docstring)."""
        kind, x, axis = node.kind, node.x, node.axis
        if axis is None:
            inner, fresh = self._reduced(x.shape, list(range(len(x.shape))), idx)
            axes = list(range(len(x.shape)))
            return self._opaque(f"${kind}{axes}", node, [(x, inner)], idx, env, local=fresh)
        if x.shape[axis] == 1 and (kind != "logsumexp" or self.klass(x) <= MINUS_INF):
            # one entry: max(v) = v for every v; logsumexp(v) = v only where v is never +inf (the stable
            # formula's inf - inf makes logsumexp([inf]) NaN), so not for a v that may be NaN or inf
            return self.conv(x, idx, env)
        parts = self.blocks(x, axis)
        if parts is not None and self.klass(x) <= MINUS_INF:
            row = _with_one(x.shape, axis)
            reps = [p if p.shape[axis] == 1 else t.Reduce(kind, p, axis, row) for p in parts]
            if kind == "logsumexp":
                total = t.Unary("exp", reps[0], row)
                for rep in reps[1:]:
                    total = t.Binary("add", total, t.Unary("exp", rep, row), row)
                return self.conv(t.Unary("log", total, row), idx, env)
            return self._extreme_of_blocks(node, reps, idx, env)
        inner, fresh = self._reduced(x.shape, [axis], idx)
        forms, _ = self.argument_forms([(x, inner)], env)
        form, taken = forms[0], []
        if not isinstance(form, t.Node) and fresh:
            taken = [term for term in form if not mentions(term, fresh[0]) and not term.risky]
            form = [term for term in form if mentions(term, fresh[0]) or term.risky]
        factor = self.factor(f"${kind}[{axis}]", [form], idx, self.klass(node), fresh)
        return [Term(ONE, (factor,))] + taken

    def _extreme_of_blocks(self, node: t.Reduce, reps: list[t.Node], idx, env) -> list[Term]:
        """The max (or min) of the blocks' maxima (minima): one factor, the blocks in canonical order and
        each once, a block that is itself the max of a concat along the axis replaced by its blocks."""
        kind, axis = node.kind, node.axis
        flat: list[t.Node] = []
        pending = list(reps)
        while pending:
            rep = pending.pop(0)
            inner = self.expanded(rep)
            if isinstance(inner, t.Reduce) and inner.kind == kind and inner.axis == axis:
                parts = self.concat_parts(inner.x, axis)
                if parts is not None and len(parts) > 1:
                    row = rep.shape
                    pending = [p if p.shape[axis] == 1 else t.Reduce(kind, p, axis, row) for p in parts] + pending
                    continue
            flat.append(rep)
        forms, _ = self.argument_forms([(rep, idx) for rep in flat], env)
        keys = [keyed("", [form], idx, (), self.ranges)[0] for form in forms]
        distinct = sorted(set(keys))  # max(a, a) = a: a block met twice counts once
        if len(distinct) == 1 and not isinstance(forms[0], t.Node):
            return forms[0]
        return [Term(ONE, (Application(f"${kind}of[{axis}]", "; ".join(distinct), tuple(idx), self.klass(node)),))]
