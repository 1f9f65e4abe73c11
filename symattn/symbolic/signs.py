"""Signs and zeros of finite entries, read from their structure.

Contract, for a SymPy expression whose symbols are finite reals (an input's
entries, upstream gradients; a symbol declared positive, such as a root atom of
`symattn.symbolic.relations`, is positive):

- `positive(e)` / `nonnegative(e)`: True only if e > 0 / e >= 0 at every point,
  shown from its structure (positive numbers and symbols, exp, even powers,
  sums and products of such); False means "not shown";
- `zero_events(e)`: the points where e == 0 (among those where e is finite, a
  power 1 / b^n counting as nonzero), as a list of *events*, each a set of
  symbols: e == 0 exactly when, for some event, every symbol in it is 0; and
  setting those symbols to 0 makes e's terms vanish one by one. `[]` means e is
  never 0, `[frozenset()]` that it is always 0, and None that its zeros are not
  of this form (x - y, x * y + 1, sin(x)) or are not known.

For a sum of nonnegative terms such as sum(Q * Q, axis=-1) the one event is
"every entry of the row is 0"; a product is 0 when one of its factors is, so its
events are its factors' events together. The guarded evaluator
(`symattn.symbolic.guarded`) splits its cases on these events.
"""

from __future__ import annotations

import sympy

__all__ = ["positive", "nonnegative", "zero_events"]


def positive(e: sympy.Expr) -> bool:
    """e > 0 everywhere, shown from its structure."""
    if e.is_Number:
        return bool(e > 0)
    if e.is_Symbol:
        return e.is_positive is True
    if isinstance(e, sympy.exp):
        return True
    if e.is_Add:
        return all(nonnegative(a) for a in e.args) and any(positive(a) for a in e.args)
    if e.is_Mul:
        return all(positive(a) for a in e.args)
    if e.is_Pow:
        return positive(e.base) and e.exp.is_real is True
    return False


def nonnegative(e: sympy.Expr) -> bool:
    """e >= 0 everywhere, shown from its structure."""
    if e.is_Number:
        return bool(e >= 0)
    if positive(e):
        return True
    if e.is_Symbol:
        return e.is_nonnegative is True
    if isinstance(e, sympy.Abs):
        return True
    if e.is_Add or e.is_Mul:
        return all(nonnegative(a) for a in e.args)
    if e.is_Pow:
        if e.exp.is_Integer and e.exp.is_even and e.exp > 0:
            return e.base.is_real is True
        return e.exp.is_Integer and e.exp > 0 and nonnegative(e.base)
    return False


def _single(events):
    """The one event of a term, or None when it has several (x * y is 0 when x is or y is)."""
    if events is None or len(events) > 1:
        return None
    return events[0] if events else None


def zero_events(e: sympy.Expr) -> list[frozenset] | None:
    """Where e == 0, as events (see the module docstring)."""
    if e.is_Number:
        return [frozenset()] if e == 0 else []
    if positive(e):
        return []
    if e.is_Symbol:
        return [frozenset((e,))] if e.is_real else None
    if isinstance(e, sympy.Abs):
        return zero_events(e.args[0])
    if e.is_Pow:
        if e.exp.is_Integer and e.exp > 0:
            return zero_events(e.base)
        if e.exp.is_Integer:
            # 1 / b^n is never 0 where it is finite; where b is 0 the division that made it is
            # guarded (`symattn.symbolic.guarded`), so those points are another region's
            return []
        return None
    if e.is_Mul:
        out: list[frozenset] = []
        for factor in e.args:
            events = zero_events(factor)
            if events is None:
                return None
            out += [x for x in events if x not in out]
        return out
    if e.is_Add:
        if not (nonnegative(e) or nonnegative(-e)):
            return None  # x - y is 0 on a line, not where some symbols are 0
        # a sum of terms of one sign is 0 when every term is: each term must be 0 on one event
        together: set = set()
        for term in e.args:
            events = zero_events(term)
            if events is None:
                return None
            if not events:
                return []  # a term that is never 0 (and the others of its sign): never 0
            one = _single(events)
            if one is None:
                return None
            together |= one
        return [frozenset(together)]
    return None
