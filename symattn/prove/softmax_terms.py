"""Term rules of the softmax family: exps in log space, and softmax weights written with exp.

Contract: `exp_factors(form, base, ranges)` is what `exp(form)` at tokens
`base` becomes; each rule maps one term of an index form to the terms that
replace it, or None when it does not apply (`symattn.prove.index_rules.rewrite`
runs them with the other rules). What they produce equals the term at every
point and every size under IEEE float64 semantics, rounding and overflow
aside. Arguments of exp here are never NaN nor +inf (an argument that may be
is keyed by its expression, `symattn.prove.opaque_forms`, and has no form).

- `exp_factors`: `exp(x[.., j] - logsumexp(x) + v) = softmax(x)[.., j] *
  exp(v)` where the logsumexp is finite (every row of x holds a finite entry;
  on a fully masked row the left side is NaN and the weight 0): each term
  `-k * logsumexp(x)` of the argument gives up to k weights, one per entry of
  x that the argument holds whole, so a product of two weights stays two
  weights. What is left is one exp factor (none for exp(0) = 1).
- `merge_exps`: a product of exps is the exp of the sum of their arguments,
  `exp(a) * exp(b) = exp(a + b)` (exp(-inf) * exp(b) = 0 = exp(-inf + b));
  the merged argument is collected (finite terms cancel, `exp(m1 - m) *
  exp(S1 - m1) = exp(S1 - m)`) and then read by `exp_factors`. So
  `E / sum(E, axis=-1)` with `E = exp(S - max(S))` (the reciprocal of a sum
  of exps is an exp, `symattn.prove.opaque_forms`) is softmax(S)'s weight.
- `unnormalize`: `softmax(x)[.., j] * exp(logsumexp(x) + v) = exp(x[.., j] +
  v)`: on a row where x is all -inf both sides are 0 (the weight 0,
  exp(-inf) = 0), elsewhere the weight is exp(x_j - logsumexp(x)); so a
  block's weights rescaled by exp(l_i - L) meet the weights over all blocks.
- `expand_log`: `exp(log(F) + v) = F * exp(v)` where F is finite and >= 0
  (the log is never NaN; at F = 0, exp(-inf + v) = 0 = 0 * exp(v)). It runs
  after `merge_exps`, so a log that another exp cancels
  (`exp(log(F) - L) * exp(l - log(F))`) is cancelled first.

A merged or rebuilt exp's indices line up, axis by axis, with those of the
factors it comes from (the exp with the most indices first), then the other
tokens its argument reads, so it meets the same exp written directly; an axis
whose token its argument does not read is at index 0 (the exp is constant
along it), as the exp of an operand broadcast along that axis is.
"""

from __future__ import annotations

from typing import Mapping, Sequence

import sympy

from ..ir import typed as t
from ..ir.shapes import same_dim
from ..symbolic.finiteness import ANY, FINITE
from .index_terms import (ONE, ZERO_INDEX, Application, SoftmaxApplication, Term, Unsupported, collect, form_key,
                          free_tokens, instantiated, is_zero, keyed)

__all__ = ["exp_factors", "merge_exps", "unnormalize", "expand_log", "like_terms_summed", "content", "without"]


def _mergeable(f) -> bool:
    return (isinstance(f, Application) and f.op == "$exp" and len(f.parts) == 1
            and not isinstance(f.parts[0], t.Node) and len(f.origin) == len(f.indices))


def _term_keys(form: Sequence[Term], ranges: Mapping) -> list[str] | None:
    """The canonical text of each term alone, its free tokens named as themselves."""
    names = {ZERO_INDEX: ZERO_INDEX, **{tok: tok for tok in free_tokens(form)}}
    try:
        return [form_key([term], names, ranges) for term in form]
    except Unsupported:
        return None


def without(form: list[Term], entry: list[Term], ranges: Mapping) -> list[Term] | None:
    """`form` with one term equal to each term of `entry` taken out, or None when one is missing."""
    keys = _term_keys(form + entry, ranges)
    if keys is None or not entry:
        return None
    mine, wanted = keys[:len(form)], keys[len(form):]
    left = list(range(len(form)))
    for key in wanted:
        hit = next((k for k in left if mine[k] == key), None)
        if hit is None:
            return None
        left.remove(hit)
    return [form[k] for k in left]


def _weights(form: list[Term], ranges: Mapping) -> tuple[list[SoftmaxApplication], list[Term]]:
    """Softmax weights taken out of an exp's argument (see `exp_factors`), and what is left."""
    weights: list[SoftmaxApplication] = []
    if not any(len(term.factors) == 1 and term.factors[0].key.startswith("$logsumexp[") and term.coef.is_negative
               for term in form):
        return weights, form
    progress = True
    while progress:
        progress = False
        for n, term in enumerate(form):
            f = term.factors[0] if len(term.factors) == 1 else None
            if not (isinstance(f, Application) and f.op.startswith("$logsumexp[") and f.risk == FINITE
                    and not term.sums and term.coef.is_integer and term.coef < 0 and len(f.local) == 1
                    and len(f.parts) == 1 and not isinstance(f.parts[0], t.Node)):
                continue
            axes = f.op[len("$logsumexp["):-1].split(",")
            axis = int(axes[0]) if len(axes) == 1 else -1
            if not 0 <= axis < len(f.indices) or f.indices[axis] != ZERO_INDEX:
                continue
            size = ranges.get(f.local[0])
            rest = form[:n] + form[n + 1:]
            for token in free_tokens(rest):
                if token == ZERO_INDEX or size is None or ranges.get(token) is None or \
                        not same_dim(ranges[token], size):
                    continue
                where = tuple(token if k == axis else x for k, x in enumerate(f.indices))
                entry = instantiated(f.parts[0], tuple(f.origin) + tuple(f.local), where + (token,))
                left = without(rest, entry, ranges)
                if left is None:
                    continue
                lse = [] if term.coef == -1 else [Term(term.coef + 1, term.factors, term.sums)]
                form = left + lse
                weights.append(SoftmaxApplication(axis, size, True, f.arguments, where, FINITE, parts=f.parts,
                                                  origin=tuple(f.origin), local=tuple(f.local)))
                progress = True
                break
            if progress:
                break
    return weights, form


def _positions(bases: Sequence[Sequence[str]]) -> list[str]:
    """Position by position, the first token that is not ZERO_INDEX among index tuples (the factors a
    rule combines came from one broadcast shape: their axes line up)."""
    width = max((len(b) for b in bases), default=0)
    out = []
    for k in range(width):
        found = next((b[k] for b in bases if k < len(b) and b[k] != ZERO_INDEX and b[k] not in out), ZERO_INDEX)
        out.append(found)
    return out


def like_terms_summed(form: Sequence[Term], ranges: Mapping) -> list[Term]:
    """The form with like terms summed into one (the first of them, rescaled) and those that cancel
    dropped, so a rule reads `a - a` as nothing; Unsupported where terms that may be non-finite would
    cancel or meet with both signs (as `collect` says)."""
    # only terms with the same factors (up to their tokens) can be like terms: key just those
    shapes: dict[tuple, int] = {}
    for term in form:
        shape = (tuple(sorted(f.key for f in term.factors)), len(term.sums))
        shapes[shape] = shapes.get(shape, 0) + 1
    if all(count == 1 for count in shapes.values()):
        return [term for term in form if not is_zero(term.coef)]
    names = {ZERO_INDEX: ZERO_INDEX, **{tok: tok for tok in free_tokens(form)}}
    groups: dict[str, list[Term]] = {}
    for n, term in enumerate(form):
        shape = (tuple(sorted(f.key for f in term.factors)), len(term.sums))
        key = form_key([Term(ONE, term.factors, term.sums)], names, ranges) if shapes[shape] > 1 else f"#{n}"
        groups.setdefault(key, []).append(term)
    out = []
    for like in groups.values():
        total = sympy.Add(*[term.coef for term in like])
        if len(like) > 1 and like[0].risky and not (all(term.coef.is_positive for term in like) or
                                                    all(term.coef.is_negative for term in like)):
            raise Unsupported("possibly non-finite terms with coefficients of both signs")
        if not is_zero(total):
            out.append(Term(total, like[0].factors, like[0].sums))
    return out


def content(form: Sequence[Term], ranges: Mapping) -> tuple[sympy.Expr, list[Term]] | None:
    """(c, form / c) for the positive number c that makes the coefficient of the form's first term
    (in canonical order) +-1, when that is not 1 already; None otherwise. Used where f(c * F) is a
    known multiple of f(F) for c > 0: sqrt(c * F) = sqrt(c) * sqrt(F), 1 / (c * F) = (1 / c) / F
    (exact under IEEE semantics for c > 0, zeros and their signs included)."""
    try:
        terms = like_terms_summed(form, ranges)
    except Unsupported:
        return None
    names = {ZERO_INDEX: ZERO_INDEX, **{tok: tok for tok in free_tokens(terms)}}
    try:
        keyed_terms = sorted((form_key([Term(ONE, term.factors, term.sums)], names, ranges), n)
                             for n, term in enumerate(terms))
    except Unsupported:
        return None
    if not keyed_terms:
        return None
    c = abs(terms[keyed_terms[0][1]].coef)
    if c == 1 or c.is_positive is not True:
        return None
    return c, [term.scaled(1 / c) for term in terms]


def exp_factors(form: list[Term], bases: Sequence[Sequence[str]], ranges: Mapping, risk: int = FINITE) -> list:
    """The factors exp(form) is, its indices lined up with those of `bases` (the index tuples of the
    factors it comes from), then the other tokens it reads (see the module docstring)."""
    weights, rest = _weights(like_terms_summed(form, ranges), ranges)
    read = free_tokens(rest)
    # a position whose token the argument does not read is constant along that axis: it reads index 0,
    # as the same exp of a broadcast operand does (exp(log(Z * Z) + s) * ... meets exp(s) of s [N, 1])
    idx = [token if token in read else ZERO_INDEX for token in _positions(bases)]
    for token in read:
        if token not in idx:
            idx.append(token)
    arguments, indices = keyed("$exp", [rest], tuple(idx), (), ranges)
    if arguments == "0":
        return list(weights)  # exp(0) = 1
    return list(weights) + [Application("$exp", arguments, indices, risk, parts=(tuple(rest),), origin=indices)]


def merge_exps(term: Term, ranges: Mapping | None = None) -> list[Term] | None:
    """exp(a) * exp(b) * rest -> exp(a + b) * rest (see the module docstring)."""
    if ranges is None:
        return None
    exps = [f for f in term.factors if _mergeable(f)]
    if len(exps) < 2:
        return None
    merged: list[Term] = []
    for f in exps:
        merged += instantiated(f.parts[0], f.origin, f.indices)
    bases = [f.indices for f in sorted(exps, key=lambda f: (-len(f.indices), f.key))]
    try:
        collect(merged, {ZERO_INDEX: ZERO_INDEX, **{tok: tok for tok in free_tokens(merged)}}, ranges)
        factors = exp_factors(merged, bases, ranges, max(f.risk for f in exps))
    except Unsupported:
        return None  # terms that may be -inf would cancel: not merged
    rest = list(term.factors)
    for f in exps:
        rest.remove(f)
    return [Term(term.coef, tuple(rest) + tuple(factors), term.sums)]


def _lse_of(g: Application, weight: SoftmaxApplication) -> tuple[list[Term], int] | None:
    """(g's argument in the term's tokens, the position of a term `+ k * logsumexp(x)[row]`, k >= 1)
    where x is the softmax argument of `weight` and the row is the weight's; None when it holds none."""
    argument = instantiated(g.parts[0], g.origin, g.indices)
    row = tuple(ZERO_INDEX if k == weight.axis else x for k, x in enumerate(weight.indices))
    for n, term in enumerate(argument):
        f = term.factors[0] if len(term.factors) == 1 else None
        if (term.coef.is_integer and term.coef >= 1 and not term.sums and isinstance(f, Application)
                and f.op == f"$logsumexp[{weight.axis}]" and f.arguments == weight.arguments
                and tuple(f.indices) == row):
            return argument, n
    return None


def unnormalize(term: Term, ranges: Mapping | None = None) -> list[Term] | None:
    """softmax(x)[.., j] * exp(logsumexp(x) + v) -> exp(x[.., j] + v) (see the module docstring)."""
    if ranges is None:
        return None
    factors = list(term.factors)
    for a, weight in enumerate(factors):
        if not (isinstance(weight, SoftmaxApplication) and len(weight.parts) == 1 and len(weight.local) == 1
                and not isinstance(weight.parts[0], t.Node) and weight.indices[weight.axis] != ZERO_INDEX):
            continue
        for b, g in enumerate(factors):
            found = _lse_of(g, weight) if _mergeable(g) else None
            if found is None:
                continue
            argument, n = found
            lse = argument[n]
            entry = instantiated(weight.parts[0], tuple(weight.origin) + tuple(weight.local),
                                 tuple(weight.indices) + (weight.indices[weight.axis],))
            kept = [] if lse.coef == 1 else [Term(lse.coef - 1, lse.factors, lse.sums)]
            merged = argument[:n] + kept + argument[n + 1:] + entry
            rest = tuple(f for k, f in enumerate(factors) if k not in (a, b))
            try:
                new = exp_factors(merged, [weight.indices, g.indices], ranges)
            except Unsupported:
                continue
            return [Term(term.coef, rest + tuple(new), term.sums)]
    return None


def expand_log(term: Term, ranges: Mapping | None = None) -> list[Term] | None:
    """exp(log(F) + v) * rest -> F * exp(v) * rest (see the module docstring)."""
    if ranges is None:
        return None
    for k, g in enumerate(term.factors):
        if not _mergeable(g):
            continue
        argument = instantiated(g.parts[0], g.origin, g.indices)
        for n, piece in enumerate(argument):
            f = piece.factors[0] if len(piece.factors) == 1 else None
            if not (piece.coef == 1 and not piece.sums and isinstance(f, Application) and f.op == "$log"
                    and f.risk != ANY and len(f.parts) == 1 and not isinstance(f.parts[0], t.Node)):
                continue
            rest = argument[:n] + argument[n + 1:]
            if any(r.risky and not r.coef.is_positive for r in rest):
                continue
            try:
                tail = tuple(exp_factors(rest, [g.indices], ranges)) if rest else ()
            except Unsupported:
                continue
            inside = instantiated(f.parts[0], f.origin, f.indices)
            others = term.factors[:k] + term.factors[k + 1:]
            return [Term(term.coef * part.coef, others + part.factors + tail, term.sums + part.sums)
                    for part in inside]
    return None
