"""Random identities of the softmax family (issue 26): built by applying the new rules, and perturbed.

Each seed draws claims from templates that apply one of the rules (a shift by
a random finite row statistic, the merge of randomly ordered key blocks, the
running-max rescaling, the recompute from the row logsumexp, sums and products
of exps, the written-out stable softmax, scale invariance of a normalised row)
to random operands (plain, causally masked and split-K scores), and a false
twin of each by a random perturbation (a statistic that is not constant along
the row or may be -inf, a block left out or weighted by the wrong logsumexp, a
scale on one side only, padding that empties rows). Every claim is also
written in NumPy; its truth is what NumPy sampling says (zeros, negatives, ties
and empty rows included), never the generator's label. The bar: no false claim
proved, and at least 90% of the true claims built by the rules proved for all
sizes; each seed prints its counts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
import pytest

from numpy_claims import NEG_INF, Claim, Program, amax, first_difference, logsumexp, rsum, softmax

import symattn

HEAD = """\
dim N = 3, M1 = 2, M2 = 2, M3 = 1, d = 2
input Q[N, d], K1[M1, d], K2[M2, d], K3[M3, d], V1[M1, d], V2[M2, d], V3[M3, d], Y[N, d]
buffer keep[N], b[N, 1]
S1 = Q @ K1.T
S2 = Q @ K2.T
S3 = Q @ K3.T
S = Q @ Y.T
Cm[i:N, j:N] = where(j <= i, 0, -inf)
C = S + Cm
Mk = where(keep > 0, 0, -inf)
A = S + Mk
O = Q
output O
"""


def _forward(v):
    for k in (1, 2, 3):
        v[f"S{k}"] = v.Q @ v[f"K{k}"].T
    v["S"] = v.Q @ v.Y.T
    n = v.Q.shape[0]
    i, j = np.meshgrid(np.arange(n), np.arange(n), indexing="ij")
    v["C"] = v.S + np.where(j <= i, 0.0, NEG_INF)
    v["A"] = v.S + np.where(v.keep > 0, 0.0, NEG_INF)


@dataclass(frozen=True)
class E:
    """An expression as spec text and as a NumPy function of the values."""

    text: str
    fn: Callable

    def __call__(self, v):
        return self.fn(v)


def leaf(name: str) -> E:
    return E(name, lambda v: v[name])


def op(text: str, fn: Callable, *args: E) -> E:
    return E(text.format(*[a.text for a in args]), lambda v: fn(*[a(v) for a in args]))


def sm(x): return op("softmax({}, axis=-1)", softmax, x)
def lse(x): return op("logsumexp({}, axis=-1)", logsumexp, x)
def mx(x): return op("max({}, axis=-1)", amax, x)
def colmax(x): return op("max({}, axis=0)", lambda a: amax(a, 0), x)
def rs(x): return op("sum({}, axis=-1)", rsum, x)
def ex(x): return op("exp({})", np.exp, x)
def lg(x): return op("log({})", np.log, x)
def add(x, y): return op("({} + {})", np.add, x, y)
def sub(x, y): return op("({} - {})", np.subtract, x, y)
def mul(x, y): return op("({} * {})", np.multiply, x, y)
def div(x, y): return op("({} / {})", np.divide, x, y)
def num(c): return E(repr(c), lambda v: c)
def mm(x, y): return op("({} @ {})", np.matmul, x, y)


def cat(parts, axis=-1):
    text = "concat(" + ", ".join(p.text for p in parts) + f", axis={axis})"
    return E(text, lambda v: np.concatenate([p(v) for p in parts], axis=axis))


BLOCKS = [(leaf("S1"), leaf("V1")), (leaf("S2"), leaf("V2")), (leaf("S3"), leaf("V3"))]
SCORES = [leaf("S"), leaf("C"), leaf("S1"), cat([leaf("S1"), leaf("S2")]), add(leaf("S"), leaf("C"))]
SQUARE = {"S", "C", "(S + C)"}  # scores with N columns, which an [N, N] or [1, N] operand may meet


def _statistic(rng, x):
    """A finite row statistic of the same rows as x (N rows), at random."""
    rows = [leaf("S"), leaf("C"), leaf("S2"), cat([leaf("S3"), leaf("S1")])]
    other = rows[rng.integers(len(rows))]
    kind = rng.integers(5)
    return [mx(other), lse(other), leaf("b"), mul(num(0.5), rs(other)), num(2.5)][kind]


def shift(rng):
    x, c = SCORES[rng.integers(len(SCORES))], None
    c = _statistic(rng, x)
    sign = [add, sub][rng.integers(2)]
    true = [Claim(f"{sm(sign(x, c)).text} == {sm(x).text}", lambda v, a=sm(sign(x, c)), b=sm(x): (a(v), b(v)), True),
            Claim(f"{lse(sign(x, c)).text} == {sign(lse(x), c).text}",
                  lambda v, a=lse(sign(x, c)), b=sign(lse(x), c): (a(v), b(v)), True),
            Claim(f"{mx(sign(x, c)).text} == {sign(mx(x), c).text}",
                  lambda v, a=mx(sign(x, c)), b=sign(mx(x), c): (a(v), b(v)), True)][rng.integers(3)]
    bad = [mx(leaf("A")), colmax(leaf("S")), lg(mul(leaf("b"), leaf("b")))][rng.integers(3)]
    if bad.text.startswith("max(S, axis=0)") and x.text not in SQUARE:
        bad = mx(leaf("A"))
    a, b = sm(sign(x, bad)), sm(x)
    return true, Claim(f"{a.text} == {b.text}", lambda v: (a(v), b(v)), False)


def merge(rng):
    k = rng.integers(2, 4)
    chosen = [BLOCKS[i] for i in rng.permutation(3)[:k]]
    scores = cat([s for s, _ in chosen])
    total = lse(scores)
    order = rng.permutation(k)
    rhs = lg(E(" + ".join(ex(lse(chosen[i][0])).text for i in order),
               lambda v: sum(np.exp(logsumexp(chosen[i][0](v))) for i in order)))
    true_l = Claim(f"{total.text} == {rhs.text}", lambda v: (total(v), rhs(v)), True)
    out = mm(sm(scores), cat([w for _, w in chosen], axis=0))
    pieces = [mul(ex(sub(lse(s), total)), mm(sm(s), w)) for s, w in chosen]
    merged = pieces[0]
    for piece in pieces[1:]:
        merged = add(merged, piece)
    true_o = Claim(f"{out.text} == {merged.text}", lambda v: (out(v), merged(v)), True)
    wrong = [mul(ex(sub(lse(chosen[0][0]), lse(chosen[1][0]))), mm(sm(chosen[0][0]), chosen[0][1]))] + pieces[1:]
    bad = wrong[0]
    for piece in wrong[1:]:
        bad = add(bad, piece)
    if rng.integers(2):
        short = lg(E(" + ".join(ex(lse(chosen[i][0])).text for i in order[:-1]),
                     lambda v: sum(np.exp(logsumexp(chosen[i][0](v))) for i in order[:-1])))
        false = Claim(f"{total.text} == {short.text}", lambda v: (total(v), short(v)), False)
    else:
        false = Claim(f"{out.text} == {bad.text}", lambda v: (out(v), bad(v)), False)
    return [true_l, true_o][rng.integers(2)], false


def rescale(rng):
    (a, _), (b, _) = [BLOCKS[i] for i in rng.permutation(3)[:2]]
    ma, mb = mx(a), mx(b)
    m = mx(cat([ma, mb]))
    lhs = add(mul(ex(sub(ma, m)), rs(ex(sub(a, ma)))), mul(ex(sub(mb, m)), rs(ex(sub(b, mb)))))
    rhs = rs(ex(sub(cat([a, b]), m)))
    true = [Claim(f"{lhs.text} == {rhs.text}", lambda v: (lhs(v), rhs(v)), True),
            Claim(f"{add(m, lg(lhs)).text} == {lse(cat([b, a])).text}",
                  lambda v, x=add(m, lg(lhs)), y=lse(cat([b, a])): (x(v), y(v)), True),
            Claim(f"{m.text} == {mx(cat([b, a])).text}", lambda v, y=mx(cat([b, a])): (m(v), y(v)), True)][rng.integers(3)]
    bad = add(rs(ex(sub(a, ma))), mul(ex(sub(mb, m)), rs(ex(sub(b, mb)))))
    return true, Claim(f"{bad.text} == {rhs.text}", lambda v: (bad(v), rhs(v)), False)


def recompute(rng):
    x = SCORES[rng.integers(len(SCORES))]
    true = [Claim(f"{ex(sub(x, lse(x))).text} == {sm(x).text}", lambda v, a=ex(sub(x, lse(x))), b=sm(x): (a(v), b(v)), True),
            Claim(f"{rs(ex(x)).text} == {ex(lse(x)).text}", lambda v, a=rs(ex(x)), b=ex(lse(x)): (a(v), b(v)), True),
            Claim(f"{div(ex(sub(x, mx(x))), rs(ex(sub(x, mx(x))))).text} == {sm(x).text}",
                  lambda v, a=div(ex(sub(x, mx(x))), rs(ex(sub(x, mx(x))))), b=sm(x): (a(v), b(v)), True)][rng.integers(3)]
    y = add(x, leaf("A")) if x.text in SQUARE and rng.integers(2) else leaf("A")  # rows that may be empty
    bad = [Claim(f"{ex(sub(y, lse(y))).text} == {sm(y).text}", lambda v, a=ex(sub(y, lse(y))), b=sm(y): (a(v), b(v)), False),
           Claim(f"{ex(sub(x, lse(mul(num(2), x)))).text} == {sm(x).text}",
                 lambda v, a=ex(sub(x, lse(mul(num(2), x)))), b=sm(x): (a(v), b(v)), False)][rng.integers(2)]
    return true, bad


def products(rng):
    x, y = SCORES[rng.integers(2)], [leaf("S"), leaf("b"), mx(leaf("C"))][rng.integers(3)]
    true = Claim(f"{mul(ex(x), ex(y)).text} == {ex(add(x, y)).text}", lambda v, a=mul(ex(x), ex(y)), b=ex(add(x, y)):
                 (a(v), b(v)), True)
    bad = Claim(f"{mul(ex(x), ex(y)).text} == {ex(mul(x, y)).text}", lambda v, a=mul(ex(x), ex(y)), b=ex(mul(x, y)):
                (a(v), b(v)), False)
    return true, bad


def norms(rng):
    c = [2.0, 0.5, -3.0, 4.0][rng.integers(4)]
    q = [leaf("Q"), leaf("Y")][rng.integers(2)]
    scaled = mul(num(c), q)
    lhs = div(scaled, op("sqrt({})", np.sqrt, rs(mul(scaled, scaled))))
    qn = div(q, op("sqrt({})", np.sqrt, rs(mul(q, q))))
    rhs = qn if c > 0 else mul(num(-1.0), qn)
    true = Claim(f"{lhs.text} == {rhs.text}", lambda v: (lhs(v), rhs(v)), True)
    other = div(scaled, op("sqrt({})", np.sqrt, rs(mul(q, q))))
    return true, Claim(f"{other.text} == {rhs.text}", lambda v: (other(v), rhs(v)), False)


TEMPLATES = [shift, merge, rescale, recompute, products, norms]


def _claims(seed: int, count: int):
    rng = np.random.default_rng(seed)
    out = []
    for k in range(count):
        true, false = TEMPLATES[k % len(TEMPLATES)](rng)
        out += [true, false]
    return out


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_random_identities_of_the_new_rules(seed):
    claims = _claims(seed, 18)
    program = Program(f"random-{seed}", HEAD, _forward, tuple(claims), masks=("keep",))
    spec = symattn.load(HEAD + "".join(f"check {c.text}\n" for c in claims))
    verdicts = spec.check(budget=60)
    false_proved, true_built, true_proved, problems = 0, 0, 0, []
    for claim, verdict in zip(claims, verdicts):
        difference = first_difference(program, claim, spec)
        holds = difference is None
        if claim.holds and not holds:
            problems.append(f"generator: {claim.text} is false in NumPy ({difference})")
            continue
        if verdict.verdict == "proved" and not holds:
            false_proved += 1
            problems.append(f"FALSE PROOF: {claim.text}: {verdict.method[:160]} (NumPy: {difference})")
        if verdict.verdict == "refuted" and holds:
            problems.append(f"refuted but true in NumPy: {claim.text}")
        if claim.holds:
            true_built += 1
            true_proved += verdict.verdict == "proved" and "for all sizes" in verdict.method
    rate = true_proved / true_built
    print(f"seed {seed}: {len(claims)} claims, {true_built} true ones built by the rules, "
          f"{true_proved} proved for all sizes ({rate:.0%}), {false_proved} false proved")
    assert not problems, "\n".join(problems)
    assert false_proved == 0
    assert rate >= 0.9, [(c.text, v.method[:120]) for c, v in zip(claims, verdicts)
                         if c.holds and not (v.verdict == "proved" and "for all sizes" in v.method)]
