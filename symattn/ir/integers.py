"""Integer expressions: which values are integers, and whether a computed subscript stays in range.

Contract:
- `integer_valued(node, tensors)`: the value is an integer at every point: an integer number, a
  dim, an index, an entry of an integer buffer (`buffer doc[N] in 0:D`), `floor`/`ceil` of
  anything, `a // b` and `a % b`, and `+ - * neg abs min max clamp where` of integers. The
  operands of `//` and `%` must be (the validator says so, naming the one that is not).
- A computed subscript that is not affine in the indices (`table[j // S]`, `j % S`,
  `clamp(j - i, -R, R) + R`, `offsets[doc[i]]`) is kept as an integer node of shape (). For it:
  `names(s)` are the indices it reads (inside buffer subscripts too), `substituted(s, mapping)`
  replaces indices by subscripts, and `at_most(s, bound, ranges, tensors)` /
  `at_least(...)` decide `s <= bound` / `s >= bound` for every index value in its range
  (`ranges`: index -> size) and every size of the dims, as an `affine.SizeDecision` whose
  `holds` is True only with a proof. The rules are exact where they can be: `a // d <= B`
  iff `a <= d * (B + 1) - 1` for a divisor d > 0, `a % d` lies in 0 .. d - 1, an entry of a
  buffer (or, in matrix notation, the whole buffer) in its declared range, `min`/`max`/`clamp`
  by cases, a sum by the bounds of its terms (a floor division inside a sum is bounded by the
  real quotient). A divisor that is not a constant (`j // w[i]`, `j % (i + 1)`) is bounded
  first, and the same rules hold at both ends of its range. A subscript none of them bounds
  (the floor of a real, unclamped) is not shown in range: the validator refuses it.
- `divisor_sign(d)`: +1 or -1 when a dim expression is nonzero with that sign at every size,
  with the sizes where it is 0 otherwise. `divisor_interval(d, ranges, tensors)`: for any
  integer divisor, (+1, lo, hi) with lo >= 1 shown for every index value and size, (-1, lo, hi)
  with hi <= -1 shown, else (None, None, None); lo or hi may be None where no bound is found.
"""

from __future__ import annotations

import itertools
from dataclasses import replace
from typing import Mapping

import sympy

from . import typed as t
from .affine import (Affine, SizeDecision, affine, extremes, nonnegative, pieces, renamed as affine_renamed,
                     substituted as affine_substituted)

__all__ = ["integer_valued", "as_affine", "names", "renamed", "substituted", "subscript_node", "substitute_indices",
           "at_most", "at_least", "divisor_sign", "divisor_interval", "bound", "INTEGER_FUNCTIONS"]

INTEGER_FUNCTIONS = ("floor", "ceil")  # integer-valued for every argument

_TRUE = SizeDecision(True)
_UNKNOWN = SizeDecision(None)


def integer_valued(node: t.Node, tensors: Mapping[str, t.TensorInfo]) -> bool:
    """Whether `node`'s value is an integer at every point (see the module docstring)."""
    if isinstance(node, t.Scalar):
        return bool(node.value.is_integer)
    if isinstance(node, (t.DimValue, t.IndexVar)):
        return True
    if isinstance(node, (t.Tensor, t.Entry)):
        name = node.name if isinstance(node, t.Tensor) else node.tensor
        info = tensors.get(name)
        return info is not None and info.integer and not (isinstance(node, t.Entry) and node.grad)
    if isinstance(node, t.Unary):
        if node.fn in INTEGER_FUNCTIONS:
            return True
        return node.fn in ("neg", "abs") and integer_valued(node.x, tensors)
    if isinstance(node, t.Binary):
        return node.op in ("add", "sub", "mul") and integer_valued(node.a, tensors) and integer_valued(node.b, tensors)
    if isinstance(node, t.Apply):
        return node.fn in ("floordiv", "mod") or all(integer_valued(a, tensors) for a in node.args)
    if isinstance(node, t.Where):
        return integer_valued(node.a, tensors) and integer_valued(node.b, tensors)
    return False


# --- affine parts -------------------------------------------------------------------------


def as_affine(node: t.Node) -> "str | Affine | None":
    """`node` as an affine subscript (indices with integer coefficients, an integer dim offset),
    or None when it is not one."""
    linear = _linear(node)
    if linear is None:
        return None
    terms, offset = linear
    return affine(terms, offset)


def _linear(node: t.Node) -> tuple[dict[str, int], sympy.Expr] | None:
    if isinstance(node, t.IndexVar):
        return {node.name: 1}, sympy.Integer(0)
    if isinstance(node, t.Scalar):
        return ({}, node.value) if node.value.is_integer else None
    if isinstance(node, t.DimValue):
        return {}, sympy.sympify(node.dim)
    if isinstance(node, t.Unary) and node.fn == "neg":
        inner = _linear(node.x)
        return None if inner is None else ({k: -c for k, c in inner[0].items()}, -inner[1])
    if isinstance(node, t.Binary) and node.op in ("add", "sub", "mul"):
        a, b = _linear(node.a), _linear(node.b)
        if a is None or b is None:
            return None
        if node.op == "mul":
            if a[0] and b[0]:
                return None
            (factor, scaled) = (a, b) if not a[0] else (b, a)
            if not sympy.sympify(factor[1]).is_Integer:
                return None
            k = int(factor[1])
            return {n: k * c for n, c in scaled[0].items()}, sympy.expand(k * scaled[1])
        sign = 1 if node.op == "add" else -1
        terms = dict(a[0])
        for n, c in b[0].items():
            terms[n] = terms.get(n, 0) + sign * c
        return terms, sympy.expand(a[1] + sign * b[1])
    return None


# --- indices read, substitution --------------------------------------------------------------


def names(s) -> tuple[str, ...]:
    """The indices a subscript of any kind reads, each once, in order (inside buffer subscripts too)."""
    return t.subscript_names(s)


def renamed(s, mapping: Mapping[str, str]):
    """A subscript of any kind with its index names replaced through `mapping` (index -> index)."""
    if isinstance(s, (str, Affine)):
        return affine_renamed(s, mapping)
    return substituted(s, mapping)


def substituted(s, mapping: Mapping[str, object]):
    """A subscript of any kind with indices replaced by subscripts (index -> name, Affine or integer node);
    affine again when the result is."""
    if isinstance(s, (str, Affine)) and not any(isinstance(mapping.get(n), t.Node) for n in t.subscript_names(s)):
        return affine_substituted(s, mapping)
    node = s if isinstance(s, t.Node) else subscript_node(s)
    out = substitute_indices(node, mapping)
    simple = as_affine(out)
    return simple if simple is not None else out


def subscript_node(s) -> t.Node:
    """A subscript (index name or Affine) as an index-notation value: `j - i + N - 1`."""
    if isinstance(s, str):
        return t.IndexVar(s)
    if isinstance(s, t.Node):  # an integer subscript that is not affine is a node already
        return s
    out = None
    for p in pieces(s):
        if p.index is None:
            magnitude = t.Scalar(p.dims) if p.dims.is_Number else t.DimValue(p.dims)
        elif p.coefficient == 1:
            magnitude = t.IndexVar(p.index)
        else:
            magnitude = t.Binary("mul", t.Scalar(sympy.Integer(p.coefficient)), t.IndexVar(p.index), ())
        if out is None:
            out = t.Unary("neg", magnitude, ()) if p.negative else magnitude
        else:
            out = t.Binary("sub" if p.negative else "add", out, magnitude, ())
    return out if out is not None else t.Scalar(sympy.Integer(0))


def substitute_indices(node: t.Node, mapping: Mapping[str, object]) -> t.Node:
    """`node` with free index names replaced by subscripts (index -> name, Affine or integer node)."""
    if not mapping:
        return node
    if isinstance(node, t.Entry):
        return replace(node, indices=tuple(substituted(s, mapping) for s in node.indices))
    if isinstance(node, t.IndexVar):
        return subscript_node(mapping[node.name]) if node.name in mapping else node
    if isinstance(node, t.IndexSum):
        inner = {k: v for k, v in mapping.items() if k != node.index.name}
        return replace(node, body=substitute_indices(node.body, inner))
    return t.map_children(node, lambda child: substitute_indices(child, mapping))



# --- range decisions ---------------------------------------------------------------------------


def divisor_sign(d: sympy.Expr) -> tuple[int | None, SizeDecision]:
    """(+1 or -1, the proof) when the dim expression `d` has that sign at every size; (None, the
    decision that found a size where it is 0, or could not show it) otherwise."""
    positive = nonnegative(sympy.expand(d - 1))
    if positive.holds:
        return 1, positive
    negative = nonnegative(sympy.expand(-d - 1))
    if negative.holds:
        return -1, negative
    zero = _zero_at(d)
    return None, zero if zero is not None else positive


def divisor_interval(d, ranges: Mapping[str, sympy.Expr], tensors: Mapping[str, t.TensorInfo]) \
        -> tuple[int | None, sympy.Expr | None, sympy.Expr | None]:
    """(sign, lo, hi) of an integer divisor over the index box: +1 with lo >= 1 shown for every index value
    and size (hi an upper bound, or None), -1 with hi <= -1 shown (lo a lower bound, or None), or
    (None, None, None) when neither is shown."""
    lows = list(itertools.islice(_bounds(d, ranges, tensors, False), 8))
    highs = list(itertools.islice(_bounds(d, ranges, tensors, True), 8))
    low = next((b for b in lows if nonnegative(sympy.expand(b - 1)).holds), None)
    if low is not None:
        return 1, low, highs[0] if highs else None
    high = next((b for b in highs if nonnegative(sympy.expand(-b - 1)).holds), None)
    if high is not None:
        return -1, lows[0] if lows else None, high
    return None, None, None


def _zero_at(d: sympy.Expr) -> SizeDecision | None:
    symbols = sorted(sympy.sympify(d).free_symbols, key=str)
    for combo in itertools.islice(itertools.product(range(0, 9), repeat=len(symbols)), 4096):
        if any(v == 0 and s.is_positive for s, v in zip(symbols, combo)):
            continue
        if sympy.sympify(d).xreplace({s: sympy.Integer(v) for s, v in zip(symbols, combo)}) == 0:
            return SizeDecision(False, {s.name: v for s, v in zip(symbols, combo)}, sympy.Integer(0))
    return None


def _constant(node: t.Node) -> sympy.Expr | None:
    """The value of an index-free affine node (a dim expression or an integer), else None."""
    form = _linear(node)
    if form is None or any(form[0].values()):
        return None
    return form[1]


def _all(*decisions: SizeDecision) -> SizeDecision:
    for d in decisions:
        if not d.holds:
            return d if d.holds is False else _UNKNOWN
    return _TRUE


def _any(*decisions: SizeDecision) -> SizeDecision:
    for d in decisions:
        if d.holds:
            return d
    return _UNKNOWN


def at_most(s, bound: sympy.Expr, ranges: Mapping[str, sympy.Expr], tensors: Mapping[str, t.TensorInfo]) \
        -> SizeDecision:
    """Decide `s <= bound` for every index value (k in 0 .. ranges[k] - 1) and every size."""
    return _decide(s, sympy.sympify(bound), ranges, tensors, upper=True)


def at_least(s, bound: sympy.Expr, ranges: Mapping[str, sympy.Expr], tensors: Mapping[str, t.TensorInfo]) \
        -> SizeDecision:
    """Decide `s >= bound` for every index value and every size."""
    return _decide(s, sympy.sympify(bound), ranges, tensors, upper=False)


def _decide(s, bound, ranges, tensors, upper: bool) -> SizeDecision:
    if isinstance(s, (str, Affine)):
        low, high = extremes(s, ranges)
        return nonnegative(sympy.expand(bound - high)) if upper else nonnegative(sympy.expand(low - bound))
    simple = as_affine(s)
    if simple is not None:
        return _decide(simple, bound, ranges, tensors, upper)
    if isinstance(s, t.Unary) and s.fn == "neg":
        return _decide(s.x, -bound, ranges, tensors, not upper)
    if isinstance(s, t.Apply):
        rule = _APPLY_RULES.get(s.fn)
        if rule is not None:
            return rule(s, bound, ranges, tensors, upper)
    # A sum or product of terms: bound each term, then the whole.
    for candidate in itertools.islice(_bounds(s, ranges, tensors, upper), 64):
        decision = nonnegative(sympy.expand(bound - candidate)) if upper else nonnegative(sympy.expand(candidate - bound))
        if decision.holds:
            return decision
    return _UNKNOWN


def _mod_rule(s, bound, ranges, tensors, upper):
    a, divisor = s.args
    d = _constant(divisor)
    if d is None:
        return _mod_by_values(a, divisor, bound, ranges, tensors, upper)
    sign = divisor_sign(d)[0]
    if sign is None:
        return _UNKNOWN
    low, high = (sympy.Integer(0), d - 1) if sign > 0 else (d + 1, sympy.Integer(0))
    return nonnegative(sympy.expand(bound - high)) if upper else nonnegative(sympy.expand(low - bound))


def _mod_by_values(a, divisor, bound, ranges, tensors, upper):
    """`a % d` for a divisor that is not a constant: in 0 .. d - 1 where d >= 1 (and at most a where a >= 0),
    in d + 1 .. 0 where d <= -1 (and at least a where a <= 0)."""
    sign, low, high = divisor_interval(divisor, ranges, tensors)
    if sign is None:
        return _UNKNOWN
    if (sign > 0) == upper:  # the side the divisor bounds: d - 1 above (d > 0), d + 1 below (d < 0)
        edge = high if sign > 0 else low
        by_divisor = _UNKNOWN if edge is None else (
            nonnegative(sympy.expand(bound - edge + 1)) if upper else nonnegative(sympy.expand(edge + 1 - bound)))
        by_operand = _all(_decide(a, 0, ranges, tensors, not upper), _decide(a, bound, ranges, tensors, upper))
        return _any(by_divisor, by_operand)
    return nonnegative(sympy.expand(bound)) if upper else nonnegative(sympy.expand(-bound))


def _floordiv_rule(s, bound, ranges, tensors, upper):
    a, divisor = s.args
    d = _constant(divisor)
    if d is None:
        return _floordiv_by_values(a, divisor, bound, ranges, tensors, upper)
    sign = divisor_sign(d)[0]
    if sign is None:
        return _UNKNOWN
    if sign < 0:  # a // d = (-a) // (-d)
        a, d = t.Unary("neg", a, a.shape), -d
    # For d > 0 and integers a, B: a // d <= B iff a <= d * (B + 1) - 1, and a // d >= B iff a >= d * B.
    if upper:
        return _decide(a, sympy.expand(d * (bound + 1) - 1), ranges, tensors, True)
    return _decide(a, sympy.expand(d * bound), ranges, tensors, False)


def _floordiv_by_values(a, divisor, bound, ranges, tensors, upper):
    """`a // d` for a divisor that is not a constant, by the exact rule above at both ends of d's range:
    `a <= d * (B + 1) - 1` (or `a >= d * B`) is linear in d, so it holds for every d in lo .. hi when it
    holds at lo and hi; where `B + 1 >= 0` (or `B <= 0`) lo alone decides it."""
    sign, low, high = divisor_interval(divisor, ranges, tensors)
    if sign is None:
        return _UNKNOWN
    if sign < 0:  # a // d = (-a) // (-d)
        a, (low, high) = t.Unary("neg", a, a.shape), (-high, None if low is None else -low)
    factor = sympy.expand(bound + 1) if upper else sympy.sympify(bound)
    ends = [low]
    if not (nonnegative(factor) if upper else nonnegative(-factor)).holds:
        if high is None:
            return _UNKNOWN
        ends.append(high)
    return _all(*(_decide(a, sympy.expand(factor * d - 1 if upper else factor * d), ranges, tensors, upper)
                  for d in ends))


def _min_rule(s, bound, ranges, tensors, upper):
    parts = [_decide(a, bound, ranges, tensors, upper) for a in s.args]
    return _any(*parts) if upper else _all(*parts)


def _max_rule(s, bound, ranges, tensors, upper):
    parts = [_decide(a, bound, ranges, tensors, upper) for a in s.args]
    return _all(*parts) if upper else _any(*parts)


def _clamp_rule(s, bound, ranges, tensors, upper):
    # clamp(x, lo, hi) = min(max(x, lo), hi), torch's order (hi wins when lo > hi)
    x, lo, hi = s.args
    inner = t.Apply("max", (x, lo), ())
    return _min_rule(t.Apply("min", (inner, hi), ()), bound, ranges, tensors, upper)


_APPLY_RULES = {"mod": _mod_rule, "floordiv": _floordiv_rule, "min": _min_rule, "max": _max_rule,
                "clamp": _clamp_rule}


def bound(s, ranges: Mapping[str, sympy.Expr], tensors: Mapping[str, t.TensorInfo], upper: bool) \
        -> sympy.Expr | None:
    """The first bound the rules find for an integer subscript or value over the index box (an upper one when
    `upper`), or None: for messages, which name what was shown."""
    return next(iter(_bounds(s, ranges, tensors, upper)), None)


def _bounds(s, ranges, tensors, upper: bool):
    """Candidate bounds (polynomials in the dims) of `s` over the index box: upper ones when
    `upper`, else lower ones; each candidate is a valid bound, none may exist."""
    simple = as_affine(s) if isinstance(s, t.Node) else s
    if simple is not None:
        low, high = extremes(simple, ranges)
        yield high if upper else low
        return
    if isinstance(s, (t.Entry, t.Tensor)):  # an integer buffer's entry, or the whole buffer in matrix notation
        info = tensors.get(s.tensor if isinstance(s, t.Entry) else s.name)
        if info is not None and info.integer and not (isinstance(s, t.Entry) and s.grad):
            lo, hi = info.values
            yield sympy.expand(hi - 1) if upper else sympy.sympify(lo)
        return
    if isinstance(s, t.Unary) and s.fn == "neg":
        for b in _bounds(s.x, ranges, tensors, not upper):
            yield -b
        return
    if isinstance(s, t.Unary) and s.fn == "abs":
        yield from _abs_bounds(s.x, ranges, tensors, upper)
        return
    if isinstance(s, t.Binary) and s.op in ("add", "sub"):
        right_upper = upper if s.op == "add" else not upper
        lefts = list(itertools.islice(_bounds(s.a, ranges, tensors, upper), 8))
        rights = list(itertools.islice(_bounds(s.b, ranges, tensors, right_upper), 8))
        for x, y in itertools.product(lefts, rights):
            yield sympy.expand(x + y if s.op == "add" else x - y)
        return
    if isinstance(s, t.Binary) and s.op == "mul":
        for factor, other in ((s.a, s.b), (s.b, s.a)):
            k = _constant(factor)
            if k is not None and k.is_Integer:
                for b in _bounds(other, ranges, tensors, upper if k >= 0 else not upper):
                    yield sympy.expand(k * b)
                return
        return
    if isinstance(s, t.Apply) and s.fn == "mod":
        d = _constant(s.args[1])
        if d is None:
            sign, low, high = divisor_interval(s.args[1], ranges, tensors)
            edge = high if sign == 1 else low
            if sign is not None and (sign > 0) != upper:
                yield sympy.Integer(0)  # a % d >= 0 where d > 0, <= 0 where d < 0
            elif edge is not None:
                yield sympy.expand(edge - 1 if sign > 0 else edge + 1)
            return
        sign = divisor_sign(d)[0]
        if sign is not None:
            yield (d - 1 if upper else sympy.Integer(0)) if sign > 0 else (sympy.Integer(0) if upper else d + 1)
        return
    if isinstance(s, t.Apply) and s.fn == "floordiv":
        d = _constant(s.args[1])
        if d is None:
            yield from _quotient_bounds(s.args[0], s.args[1], ranges, tensors, upper)
            return
        sign = divisor_sign(d)[0]
        if sign is not None and sign > 0:
            # floor(a / d) <= a / d and >= (a - d + 1) / d for integers a and d > 0
            for b in _bounds(s.args[0], ranges, tensors, upper):
                yield b / d if upper else (b - d + 1) / d
        return
    if isinstance(s, t.Apply) and s.fn in ("min", "max", "clamp"):
        args = s.args
        if s.fn == "clamp":
            x, lo, hi = s.args
            if upper:  # min(max(x, lo), hi) <= hi always
                yield from _bounds(hi, ranges, tensors, True)
                return
            low, high = _constant(lo), _constant(hi)
            if low is not None and high is not None and nonnegative(sympy.expand(high - low)).holds:
                yield low  # >= lo where lo <= hi (where lo > hi the value is hi)
            return
        # min: any operand's upper bound bounds it above; max: any operand's lower bound below
        if (s.fn == "min") == upper:
            for a in args:
                yield from _bounds(a, ranges, tensors, upper)
        return
    return


def _quotient_bounds(a, divisor, ranges, tensors, upper: bool):
    """Bounds of `a // d` for a divisor d in lo .. hi that is not a constant. For d > 0 and integers:
    floor(a / d) <= a / d, which is at most A / lo for an upper bound A >= 0 of a, and at most A / hi (or 0)
    for A <= 0; floor(a / d) >= (a + 1) / d - 1, at least (L + 1) / hi - 1 (or -1) for a lower bound L >= -1
    of a and (L + 1) / lo - 1 for L <= -1; as integers, at most -1 where A <= -1 and at least 0 where L >= 0.
    A negative divisor is (-a) // (-d)."""
    sign, low, high = divisor_interval(divisor, ranges, tensors)
    if sign is None:
        return
    if sign < 0:
        a, (low, high) = t.Unary("neg", a, a.shape), (-high, None if low is None else -low)
    for b in itertools.islice(_bounds(a, ranges, tensors, upper), 8):
        shifted = b if upper else sympy.expand(b + 1)
        if nonnegative(shifted).holds:
            near, far = low, high  # a nonnegative numerator: largest over the least divisor
        elif nonnegative(-shifted).holds:
            near, far = high, low
        else:
            continue
        d = near if upper else far
        if upper and nonnegative(-b - 1).holds:
            yield sympy.Integer(-1)  # a <= -1: a negative quotient, so its floor is at most -1
        if not upper and nonnegative(b).holds:
            yield sympy.Integer(0)  # a >= 0: its floor is at least 0
        if d is None:
            yield sympy.Integer(0) if upper else sympy.Integer(-1)
        else:
            yield sympy.expand(b / d) if upper else sympy.expand(shifted / d - 1)


def _abs_bounds(x, ranges, tensors, upper: bool):
    """Bounds of `abs(x)` from x's: x's own where x >= 0, -x's where x <= 0; above, the larger of hi and -lo
    where that is shown; below, 0 always."""
    lows = list(itertools.islice(_bounds(x, ranges, tensors, False), 4))
    highs = list(itertools.islice(_bounds(x, ranges, tensors, True), 4))
    for low, high in itertools.product(lows, highs):
        if nonnegative(low).holds:
            yield high if upper else low
        elif nonnegative(-high).holds:
            yield -low if upper else -high
        elif upper and nonnegative(sympy.expand(high + low)).holds:
            yield high
        elif upper and nonnegative(sympy.expand(-high - low)).holds:
            yield -low
    if not upper:
        yield sympy.Integer(0)
