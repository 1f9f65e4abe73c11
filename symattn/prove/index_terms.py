"""Index terms in canonical form: the normal form both sides of a claim are compared in.

Contract: an index form is a list of terms `(coef, factors, sums)`: a coefficient
(SymPy numbers and dims) times factors `(key, indices, risk, meta)` (what it is,
`'X'`, `'grad(X)'`, `'$exp(...)'`; its index tokens; FINITE / MINUS_INF / ANY from
`symattn.symbolic.finiteness`; the SymPy parameters of index maps) summed over
contracted `(token, range)` pairs. `collect(form, names, ranges)` relabels the
contracted indices of each term canonically (every labelling that respects an
invariant of each index; the least serialisation wins), applies the index-map and
delta rules, and sums like terms into `{canonical text: [coefficient, risky]}`,
never cancelling terms that may be non-finite (`Unsupported` says so);
`form_key` is the text of a whole form (how opaque factors are keyed by their
arguments), `display` its readable rendering.
"""

from __future__ import annotations

import itertools
import math

import sympy

from ..ir.shapes import same_dim
from ..symbolic.finiteness import FINITE

__all__ = ["Unsupported", "TooBig", "ONE", "ZERO_INDEX", "DELTA", "EYE", "IVAR", "MAX_TERMS", "MAX_LABELLINGS",
           "risky", "collect", "form_key", "display", "is_zero"]

MAX_TERMS = 20000      # a larger expansion is given up (not proved)
MAX_LABELLINGS = 2000  # relabellings tried per term before settling for one

ONE = sympy.Integer(1)
ZERO_INDEX = "_"       # the only index of a size-1 axis: always 0


DELTA = "$delta"       # from index maps: selects entries, no arithmetic
EYE = "$eye"           # eye(N): selects by multiplying with 0 and 1
IVAR = "$index"


class Unsupported(Exception):
    """The expansion cannot be used soundly; the comparison is not proved."""


class TooBig(Unsupported):
    """The expansion grew past MAX_TERMS."""


# --- terms and factors ----------------------------------------------------------
#
# factor: (key, indices, risk, meta)   key says what it is ('X', 'grad(X)',
#   '$exp(...)'); indices are tokens; risk is FINITE/MINUS_INF/ANY; meta holds
#   the sympy parameters of index-map factors (None otherwise).
# term: (coef, factors, sums)          sums: ((token, range), ...) contracted.




def risky(term) -> bool:
    return any(f[2] != FINITE for f in term[1])


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
                raise Unsupported(f"index {x} is free but not named")

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


def collect(form: list, names, ranges) -> dict[str, list]:
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
                same_sign(out[key][0], c)
            out[key][0] = out[key][0] + c
            out[key][1] = out[key][1] or risky
        else:
            out[key] = [c, risky]
    for key in list(out):
        c, risky = out[key]
        if is_zero(c):
            if risky:
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


def _coef_text(c) -> str:
    c = sympy.expand(c) if c.has(sympy.Add) else c
    return str(c)


def form_key(form: list, names, ranges) -> str:
    collected = collect(form, names, ranges)
    if not collected:
        return "0"
    return " + ".join(f"({_coef_text(c)})*{key}" for key, (c, _) in sorted(collected.items()))


def display(collected: dict) -> str:
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
