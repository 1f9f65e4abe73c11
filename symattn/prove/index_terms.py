"""Index terms in canonical form: the normal form both sides of a claim are compared in.

Contract: an index form is a list of `Term`s: a coefficient (SymPy numbers and
dims) times `Factor`s summed over contracted `(token, range)` pairs. A factor is
one of a few small types (`symattn.prove.index_factors`: a tensor or gradient
entry, a function application, a Kronecker delta, an index map or equation, a
constant); each carries its index tokens, its
`risk` (FINITE / MINUS_INF / ANY from `symattn.symbolic.finiteness`) and its
`key`, the canonical text of what it is (`X`, `grad(X)`, `$exp(...)`).
`collect(form, names, ranges)` relabels the contracted indices of each term
canonically (every labelling that respects an invariant of each index; the
least serialisation wins), applies the index-map and delta rules and those of
index equations (`symattn.prove.index_equations`), and sums like
terms into `{canonical text: Collected(coefficient, risky)}`, never cancelling
terms that may be non-finite (`Unsupported` says so); `form_key` is the text of
a whole form (how function applications are keyed by their arguments),
`display` its readable rendering.

Keys of opaque factors: `keyed(op, forms, idx, local, ranges)` names a factor
`op(arguments)` at index tokens `idx`: each argument (an index form, or a typed
node keyed by its expression) written with the factor's tokens named by
position (`p0`, `p1`, ...), its reduced tokens `local` as `r0`, ..., and tokens
of the arguments' own that are neither appended as extra indices, in the order
whose key is least; it returns `(arguments, indices)`. Two factors with one key
and the same indices are the same value. `instantiated(form, origin, indices)`
is a form written in the tokens `origin` moved to `indices`, position by
position (all at once, so a permutation is safe), as the rules inside opaque
functions read a factor's stored arguments; `mentions(term, token)` and
`free_tokens(form)` say which tokens a term or form reads.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math
from dataclasses import dataclass
from typing import Mapping, Sequence

import sympy

from ..ir import typed as t
from ..ir.affine import nonnegative
from ..ir.shapes import same_dim
from ..symbolic.finiteness import FINITE
from .index_equations import equation_rule, equation_text
from .index_factors import (MAX_LABELLINGS, MAX_TERMS, ONE, ZERO_INDEX, Application, Constant, Delta, Embed,
                            Equation, Eye, Factor, IndexValue, Infinity, Mix, Reference, SoftmaxApplication, TooBig,
                            Unsupported)

__all__ = ["Unsupported", "TooBig", "ONE", "ZERO_INDEX", "MAX_TERMS", "MAX_LABELLINGS",
           "Factor", "Reference", "Application", "SoftmaxApplication", "Delta", "Eye", "IndexValue",
           "Infinity", "Constant", "Mix", "Embed", "Equation", "Term", "Collected",
           "collect", "form_key", "display", "is_zero", "keyed", "instantiated", "mentions", "free_tokens"]

MAX_RULE_ROUNDS = 10000  # rules applied to one term

# --- terms ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Term:
    """`coef * factors`, summed over the contracted `(token, range)` pairs of `sums`."""

    coef: sympy.Expr
    factors: tuple[Factor, ...] = ()
    sums: tuple[tuple[str, sympy.Expr], ...] = ()

    @property
    def risky(self) -> bool:
        """Whether a factor may be non-finite."""
        return any(f.risk != FINITE for f in self.factors)

    def times(self, other: "Term") -> "Term":
        return Term(self.coef * other.coef, self.factors + other.factors, self.sums + other.sums)

    def scaled(self, c) -> "Term":
        return Term(c * self.coef, self.factors, self.sums)

    def summed(self, sums: tuple[tuple[str, sympy.Expr], ...]) -> "Term":
        """The term summed also over `sums`."""
        return Term(self.coef, self.factors, self.sums + sums) if sums else self


@dataclass(slots=True)
class Collected:
    """Like terms summed: their coefficient, and whether one of them may be non-finite."""

    coef: sympy.Expr
    risky: bool


# --- canonical terms ----------------------------------------------------------------


def _occurrences(factors, token) -> int:
    return sum(f.indices.count(token) for f in factors)


def _normalize(term: Term, ranges):
    """Eliminate deltas and index-map pairs, fold unused sums: (coef, factors, sums), or None
    when the term is zero."""
    coef = term.coef
    factors = list(term.factors)
    sums = dict(term.sums)
    # eye(N) @ Y multiplies entries of Y by 0: only a finite Y is selected exactly
    finite = not term.risky

    def rng(token):
        return sums.get(token, ranges.get(token))

    changed = True
    rounds = 0
    while changed:
        changed = False
        rounds += 1
        if rounds > MAX_RULE_ROUNDS:  # every rule shrinks the term; this is a guard, never reached
            raise Unsupported("the index rules do not settle")
        for n, f in enumerate(factors):
            if isinstance(f, Delta) or (isinstance(f, Eye) and finite):
                x, y = f.indices
                if x == y:
                    del factors[n]
                    changed = True
                    break
                for keep, drop in ((x, y), (y, x)):
                    if drop in sums and (keep == ZERO_INDEX or (rng(keep) is not None
                                                                and same_dim(rng(keep), sums[drop]))):
                        del factors[n]
                        factors = [g.renamed(drop, keep) for g in factors]
                        del sums[drop]
                        changed = True
                        break
                if changed:
                    break
            elif isinstance(f, SoftmaxApplication):
                # sum over its axis of the softmax of an argument whose rows hold a finite entry is 1; so
                # is it beside another weight of the same row, which is 0 where the row is empty (and
                # NaN where it holds NaN), making the term 0 (NaN) with the sum or without it
                token = f.indices[f.axis]
                if token in sums and _occurrences(factors, token) == 1 and same_dim(sums[token], f.size) and (
                        f.finite_argument or _same_row_weight(factors, n)):
                    del factors[n]
                    del sums[token]
                    changed = True
                    break
            elif isinstance(f, Embed) and f.indices[0] in sums and _occurrences(factors, f.indices[0]) == 1:
                # sum over m of [m == c + offset] is 1 where c + offset stays in m's range for every c
                m, c = f.indices
                if rng(c) is not None and nonnegative(f.offset).holds is True and \
                        nonnegative(sums[m] - f.offset - rng(c)).holds is True:
                    del factors[n]
                    del sums[m]
                    changed = True
                    break
            elif isinstance(f, Embed) and f.offset == 0:
                m, c = f.indices
                if rng(m) is not None and rng(c) is not None and same_dim(rng(m), rng(c)):
                    factors[n] = Delta((m, c))
                    changed = True
                    break
        if changed:
            continue
        pair = _pair_rule(factors, sums, rng)
        if pair is None:
            pair = equation_rule(factors, sums, rng)
        if pair is False:
            return None
        if pair is not None:
            factors, sums = pair
            changed = True
    used = {x for f in factors for x in f.indices}
    for token in [tok for tok in sums if tok not in used]:
        coef = coef * sums.pop(token)
    return coef, factors, sums


def _same_row_weight(factors, n) -> bool:
    """Whether another factor is a weight of the same softmax row as factors[n]."""
    f = factors[n]
    return any(k != n and isinstance(g, SoftmaxApplication) and g.key == f.key and len(g.indices) == len(f.indices)
               and all(a == b for j, (a, b) in enumerate(zip(g.indices, f.indices)) if j != f.axis)
               for k, g in enumerate(factors))


def _pair_rule(factors, sums, rng):
    """Sum out a contracted index shared by two index maps. New (factors, sums), False
    when the term is zero, None when no rule applies."""
    for n1, n2 in itertools.combinations(range(len(factors)), 2):
        f1, f2 = factors[n1], factors[n2]
        is_mix = isinstance(f1, Mix) and isinstance(f2, Mix) and f1.key == f2.key  # the same block
        if not (is_mix or (isinstance(f1, Embed) and isinstance(f2, Embed))):
            continue
        i1, i2 = f1.indices, f2.indices
        rest = [f for k, f in enumerate(factors) if k not in (n1, n2)]
        m = i1[0]
        if m == i2[0] and m in sums and _occurrences(factors, m) == 2:
            if is_mix:
                # sum_m [m = a k + b][m = a' k + b'] = [a = a'][b = b'] when a < h, b, b' < k
                k = f1.block
                ok = all(same_dim(rng(b), k) for b in (i1[2], i2[2]) if b != ZERO_INDEX) and all(
                    rng(a) is not None and same_dim(rng(a) * k, sums[m]) for a in (i1[1], i2[1]) if a != ZERO_INDEX)
                if ok and all(rng(x) is not None for x in i1[1:] + i2[1:]):
                    new = rest + [Delta((i1[1], i2[1])), Delta((i1[2], i2[2]))]
                    return new, {tok: r for tok, r in sums.items() if tok != m}
            else:
                # sum_m [m = c + o1][m = c' + o2]
                o1, o2 = f1.offset, f2.offset
                c1, c2 = i1[1], i2[1]
                r1, r2 = rng(c1), rng(c2)
                if r1 is None or r2 is None:
                    continue
                if same_dim(o1, o2) and (sums[m] - o1 - r1).is_nonnegative:
                    new = rest + [Delta((c1, c2))]
                    return new, {tok: r for tok, r in sums.items() if tok != m}
                if (o2 - o1 - r1).is_nonnegative or (o1 - o2 - r2).is_nonnegative:
                    return False
        if is_mix:
            # sum_{a, b} [m = a k + b][m' = a k + b] = [m = m'] when m, m' < h k
            a, b = i1[1], i1[2]
            if (a == i2[1] and b == i2[2] and a in sums and b in sums and a != b
                    and _occurrences(factors, a) == 2 and _occurrences(factors, b) == 2
                    and same_dim(sums[b], f1.block)):
                total = sums[a] * f1.block
                if all(x == ZERO_INDEX or (rng(x) is not None and same_dim(rng(x), total)) for x in (i1[0], i2[0])):
                    new = rest + [Delta((i1[0], i2[0]))]
                    return new, {tok: r for tok, r in sums.items() if tok not in (a, b)}
    return None


def _canon_term(term: Term, names, ranges):
    """(coef, canonical text) of a term whose free tokens are renamed by `names`; None if zero."""
    normal = _normalize(term, ranges)
    if normal is None:
        return None
    coef, factors, sums = normal
    bound = list(sums)
    for f in factors:
        for x in f.indices:
            if x not in sums and x not in names:
                raise Unsupported(f"index {x} is free but not named")

    keyed = [(f.key, f.indices) for f in factors]

    def text(label):
        def name(x):
            return label.get(x) or names[x]

        parts = sorted(equation_text(f, name) if isinstance(f, Equation)
                       else f"{f.key}[{','.join(map(name, f.indices))}]" for f in factors)
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
        for f, (key, idx) in zip(factors, keyed):
            if isinstance(f, Equation):  # its order of tokens is no invariant: the coefficient and the size are
                occ += [(key, abs(c), ("=", str(len(idx)))) for x, c in zip(idx, f.coefficients) if x == tok]
                continue
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


def collect(form: list[Term], names, ranges) -> dict[str, Collected]:
    """canonical text -> Collected(coefficient, possibly non-finite), like terms summed."""
    out: dict[str, Collected] = {}
    for term in form:
        risky = term.risky
        canon = _canon_term(term, names, ranges)
        if canon is None:
            continue  # an index map selects nothing here: no arithmetic, even on infinite entries
        c, key = canon
        if key in out:
            like = out[key]
            if risky or like.risky:
                same_sign(like.coef, c)
            like.coef = like.coef + c
            like.risky = like.risky or risky
        else:
            out[key] = Collected(c, risky)
    for key in list(out):
        if is_zero(out[key].coef):
            if out[key].risky:
                raise Unsupported("possibly non-finite terms would cancel")
            del out[key]
    return out


def same_sign(a, b) -> None:
    """Like terms that may be infinite are only merged when they cannot cancel (inf - inf)."""
    if not ((a.is_positive and b.is_positive) or (a.is_negative and b.is_negative)):
        raise Unsupported("possibly non-finite terms with coefficients of both signs")


def is_zero(c) -> bool:
    if c == 0:
        return True
    if not c.free_symbols:
        return False if c.is_zero is False else sympy.simplify(c) == 0
    return sympy.expand(c) == 0


@functools.lru_cache(maxsize=4096)
def _coef_text(c) -> str:
    c = sympy.expand(c) if c.has(sympy.Add) else c
    return str(c)


def form_key(form: list, names, ranges) -> str:
    collected = collect(form, names, ranges)
    if not collected:
        return "0"
    return " + ".join(f"({_coef_text(like.coef)})*{key}" for key, like in sorted(collected.items()))


def display(collected: dict) -> str:
    if not collected:
        return "0"
    text = ""
    for key, like in sorted(collected.items()):
        c = like.coef
        negative = c.could_extract_minus_sign()
        size = -c if negative else c
        term = key if size == 1 else f"{size} * {key}" if not size.is_Add else f"({size}) * {key}"
        if not text:
            text = f"-{term}" if negative else term
        else:
            text += f" - {term}" if negative else f" + {term}"
    return text


# --- keys of opaque factors ----------------------------------------------------------

MAX_EXTRA_ORDERS = 4  # extra indices up to this many are tried in every order, more in one


def free_tokens(form: Sequence[Term]) -> list[str]:
    """Tokens the terms of a form read and do not sum over, in order of first appearance."""
    found: list[str] = []
    for term in form:
        bound = {tok for tok, _ in term.sums}
        for f in term.factors:
            for token in f.indices:
                if token != ZERO_INDEX and token not in bound and token not in found:
                    found.append(token)
    return found


def keyed(op: str, forms: Sequence, idx: Sequence[str], local: Sequence[str],
          ranges: Mapping) -> tuple[str, tuple[str, ...]]:
    """(arguments text, indices) of a factor `op(forms)` at tokens `idx` (see the module docstring)."""
    names: dict[str, str] = {ZERO_INDEX: ZERO_INDEX}
    for k, token in enumerate(idx):
        names.setdefault(token, f"p{k}")
    for k, token in enumerate(local):
        names[token] = f"r{k}"
    extras: list[str] = []
    for form in forms:
        if not isinstance(form, t.Node):
            extras += [tok for tok in free_tokens(form) if tok not in names and tok not in extras]
    best = None
    orders = itertools.permutations(extras) if len(extras) <= MAX_EXTRA_ORDERS else [tuple(extras)]
    for order in orders:
        mapping = dict(names)
        for k, token in enumerate(order):
            mapping[token] = f"p{len(idx) + k}"
        keys = ["node:" + repr(form) if isinstance(form, t.Node) else form_key(list(form), mapping, ranges)
                for form in forms]
        arguments = "; ".join(keys)
        if best is None or arguments < best[0]:
            best = (arguments, order)
    arguments, order = best
    return arguments, tuple(idx) + tuple(order)


def _moved(term: Term, mapping: Mapping[str, str]) -> Term:
    factors = tuple(dataclasses.replace(f, indices=tuple(mapping.get(x, x) for x in f.indices))
                    if any(x in mapping for x in f.indices) else f for f in term.factors)
    return Term(term.coef, factors, term.sums)


def instantiated(form: Sequence[Term], origin: Sequence[str], indices: Sequence[str]) -> list[Term]:
    """`form`, written in the tokens `origin`, in the tokens `indices` (position by position)."""
    mapping = {a: b for a, b in zip(origin, indices) if a != b and a != ZERO_INDEX}
    if not mapping:
        return list(form)
    return [_moved(term, mapping) for term in form]


def mentions(term: Term, token: str) -> bool:
    """Whether a factor of `term` reads `token`."""
    return any(token in f.indices for f in term.factors)
