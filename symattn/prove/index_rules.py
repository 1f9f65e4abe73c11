"""Rewrite rules on index forms that hold for every size: identities of opaque functions.

Contract: `rewrite(form, ranges)` returns an index form (see `symattn.prove.index_terms`)
equal to `form` at every point and every size, with every rule of `RULES`
applied until none applies (`ranges`, token -> range, is what rules that key
new factors need; without it they do not apply). `symattn.prove.canonical` rewrites each side of a
claim, `symattn.prove.index_forms` the argument of every opaque factor before
keying it, so that `exp(cos(X)^2 + sin(X)^2)` and `exp(ones(N, d))` are one
factor. A rule maps one term to the terms that replace it,
or None when it does not apply to that term. Rules only rewrite terms all of
whose factors are finite (an infinite factor times cos^2 is not inf - inf *
sin^2), so they never touch what the finiteness analysis keeps whole.

- `cos^2 = 1 - sin^2`: two equal factors `$cos(a)[i...]` (the same argument and
  indices, so the same entry) become `1 - $sin(a)[i...]^2`. Every term reaches a
  normal form of degree < 2 in each cos factor, so both sides of a claim agree
  modulo sin^2 + cos^2 = 1 (`cos(X)^2 + sin(X)^2 == ones(N, d)` for all sizes).
- `exp(causal_mask(N)) = tril(N)`: exp(0) is 1 and exp(-inf) is 0 exactly, so on
  a finite term the factor is the 0/1 lower triangle that `cumsum` sums
  against (a prefix sum is the causal quadratic form, as in causal linear
  attention). On a term that may be -inf it is not: 0 * -inf is NaN where
  the prefix sum leaves the entry out.

- The softmax family's term rule (`symattn.prove.softmax_terms`): a product
  of exps is the exp of the sum of their arguments (and `exp(x -
  logsumexp(x))` is softmax(x)'s weight where the logsumexp is finite).

What the matrix level does not do (the element level does, at concrete sizes):
angle addition (`sin(X + Y)`), roots (`sqrt(s)^2 = s` needs s >= 0 and the
NaN cases).
"""

from __future__ import annotations

import dataclasses
import re
from collections import Counter
from typing import Callable, Mapping

from ..symbolic.finiteness import FINITE
from .index_terms import MAX_TERMS, Application, Constant, Term, TooBig
from .softmax_terms import expand_log, merge_exps, unnormalize

__all__ = ["rewrite", "RULES"]

def _finite_term(term: Term) -> bool:
    return not term.risky


def _as_sine(factor: Application) -> Application:
    return dataclasses.replace(factor, op="$sin")


def _cos_squared(term: Term, ranges: Mapping | None = None) -> list[Term] | None:
    """c * cos(a)^2 * rest -> c * rest - c * sin(a)^2 * rest."""
    if not _finite_term(term):
        return None
    counts = Counter(f for f in term.factors if isinstance(f, Application) and f.op == "$cos")
    twice = next((f for f, n in counts.items() if n >= 2), None)
    if twice is None:
        return None
    rest = list(term.factors)
    rest.remove(twice)
    rest.remove(twice)
    sine = _as_sine(twice)
    return [Term(term.coef, tuple(rest), term.sums), Term(-term.coef, tuple(rest) + (sine, sine), term.sums)]


_CAUSAL_MASK = re.compile(r"\(1\)\*\$causal_mask\((?P<size>[^()]+)\)\[p0,p1\]")


def _exp_causal_mask(term: Term, ranges: Mapping | None = None) -> list[Term] | None:
    """c * exp(causal_mask(N))[i, k] * rest -> c * tril(N)[i, k] * rest: exp(0) is 1 and exp(-inf) is 0
    exactly, and on a finite rest multiplying by 0 and 1 is the selection cumsum's tril makes."""
    if not _finite_term(term):
        return None
    for n, f in enumerate(term.factors):
        if isinstance(f, Application) and f.op == "$exp" and len(f.indices) == 2:
            match = _CAUSAL_MASK.fullmatch(f.arguments)
            if match is not None:
                tril = Constant("tril", (match["size"],), f.indices, FINITE)
                return [Term(term.coef, term.factors[:n] + (tril,) + term.factors[n + 1:], term.sums)]
    return None


# in this order: exp(causal_mask) becomes the 0/1 triangle before exps are merged
RULES: tuple[Callable, ...] = (_cos_squared, _exp_causal_mask, merge_exps, unnormalize, expand_log)


def rewrite(form: list, ranges: Mapping | None = None) -> list:
    """`form` with every rule applied to every term until none applies."""
    pending, out = list(form), []
    while pending:
        term = pending.pop()
        for rule in RULES:
            replaced = rule(term, ranges)
            if replaced is not None:
                pending.extend(replaced)
                if len(pending) + len(out) > MAX_TERMS:
                    raise TooBig("the expansion is too large")
                break
        else:
            out.append(term)
    out.reverse()
    return out
