"""Claims checked against plain NumPy: the harness of the proof-rule tests (issue 26).

A `Program` is a spec head (no checks), the same computation written in
NumPy, and `Claim`s about it, each a NumPy function of both sides (gradients
written out by hand from the chain rule and the documented conventions: a
fully masked softmax row is 0 with gradient 0, its logsumexp is -inf). Every
expectation is computed here, independently of symattn, at sample points
that include zeros, negatives, ties, values above 1, masks that empty whole
rows and the value 0.25, which the counterexample search never draws.

`check(program)` asserts, for every claim:
- the table and the NumPy sampling agree (a claim marked true shows no
  difference anywhere, one marked false shows one);
- a "proved" claim holds in NumPy (0 false proofs), and one proved "for all
  sizes" holds at the program's other sizes too;
- a "refuted" claim carries a counterexample that reproduces in NumPy, with
  the sides symattn reports;
- a claim marked `proof="all sizes"` is proved for all sizes (the rule it
  exercises fired), `proof="proved"` at least at the default sizes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

import symattn

NEG_INF = -np.inf


def softmax(s, axis=-1):
    s = np.asarray(s, dtype=np.float64)
    m = np.max(s, axis=axis, keepdims=True)
    full = m == NEG_INF
    with np.errstate(all="ignore"):
        e = np.exp(s - np.where(full, 0.0, m))
        return np.where(full, 0.0, e / np.where(full, 1.0, np.sum(e, axis=axis, keepdims=True)))


def logsumexp(s, axis=-1):
    s = np.asarray(s, dtype=np.float64)
    m = np.max(s, axis=axis, keepdims=True)
    shift = np.where(m == NEG_INF, 0.0, m)
    with np.errstate(all="ignore"):
        return np.log(np.sum(np.exp(s - shift), axis=axis, keepdims=True)) + shift


def rsum(x, axis=-1):
    return np.sum(x, axis=axis, keepdims=True)


def amax(x, axis=-1):
    return np.max(x, axis=axis, keepdims=True)


def softmax_backward(p, g):
    """grad(S) of P = softmax(S) given grad(P): P * (g - sum(g * P)); 0 on a fully masked row."""
    return p * (g - rsum(g * p))


def differs(a, b, rtol=1e-9) -> np.ndarray:
    """Entrywise difference under float64 semantics: NaN vs a number differs, both NaN agree."""
    a, b = np.broadcast_arrays(np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64))
    nan_a, nan_b = np.isnan(a), np.isnan(b)
    both_finite = np.isfinite(a) & np.isfinite(b)
    with np.errstate(all="ignore"):
        gap = both_finite & (np.abs(a - b) > rtol * np.maximum(1.0, np.maximum(np.abs(a), np.abs(b))))
    return (nan_a != nan_b) | (~nan_a & ~nan_b & ~both_finite & (a != b)) | gap


class Values(dict):
    """Leaves and NumPy intermediates by name (`v.X`); `v.g("O")` is O's upstream gradient."""

    def __getattr__(self, name):
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None

    def g(self, name):
        return self[f"grad({name})"]


@dataclass(frozen=True)
class Claim:
    text: str
    sides: Callable[[Values], tuple]
    holds: bool
    proof: str = ""  # "all sizes": must be proved for all sizes; "proved": at least at the default sizes


@dataclass(frozen=True)
class Program:
    """A spec head (no checks), its forward pass in NumPy, and claims about it."""

    name: str
    head: str
    forward: Callable[[Values], None]
    claims: tuple[Claim, ...]
    other_sizes: tuple[dict, ...] = ()     # where a proof "for all sizes" is evaluated as well
    masks: tuple[str, ...] = ()            # buffers whose entries > 0 keep a key: sampled to empty rows too


KINDS = ("halves", "zeros", "negative", "positive", "mixed", "normal", "big", "ties", "halves", "mixed", "normal")


def _sample(shape, kind, rng):
    if kind == "zeros":
        return np.zeros(shape)
    if kind == "halves":
        return rng.integers(-2, 3, size=shape) / 2.0
    if kind == "negative":
        return -np.abs(rng.standard_normal(shape)) - 0.25
    if kind == "positive":
        return np.abs(rng.standard_normal(shape)) + 0.25
    if kind == "mixed":
        return rng.choice([0.0, -1.0, -0.5, 0.25, 0.5, 2.0, -2.0, 3.0], size=shape)
    if kind == "big":
        return rng.choice([1.5, 2.0, 3.0, -1.5, -3.0], size=shape)
    if kind == "ties":
        return np.full(shape, 0.5)
    return rng.standard_normal(shape) * 1.5


def leaves(spec, kind, rng, masks, shift=None) -> Values:
    v = Values()
    given = [name for name, info in spec.tensors.items() if info.kind in ("input", "param", "buffer")]
    for k, name in enumerate(given):
        mine = kind if shift is None else KINDS[(shift + k) % len(KINDS)]
        v[name] = _sample(spec.concrete_shape(name), mine, rng)
        if name in masks and shift is not None and shift % 3 == 0:
            v[name] = np.where(np.arange(v[name].size).reshape(v[name].shape) % 2 == 0, -1.0, v[name])
    for name in spec.outputs:
        v[f"grad({name})"] = _sample(spec.concrete_shape(name), "halves" if kind == "zeros" else "normal", rng)
    return v


def sides(program: Program, claim: Claim, v: Values):
    v = Values(v)
    with np.errstate(all="ignore"):
        program.forward(v)
        lhs, rhs = claim.sides(v)
    return np.asarray(lhs, dtype=np.float64), np.asarray(rhs, dtype=np.float64)


def first_difference(program: Program, claim: Claim, spec, seed=0):
    """A sampled point at which the NumPy sides differ, or None."""
    rng = np.random.default_rng(seed)
    points = [(kind, None) for kind in KINDS] + [("mixed kinds", shift) for shift in range(2 * len(KINDS))]
    for kind, shift in points:
        v = leaves(spec, kind, rng, program.masks, shift)
        lhs, rhs = sides(program, claim, v)
        bad = differs(lhs, rhs)
        if bad.any():
            k = tuple(np.argwhere(bad)[0])
            return f"{kind} inputs: {np.broadcast_to(lhs, bad.shape)[k]!r} vs {np.broadcast_to(rhs, bad.shape)[k]!r}"
    return None


def reproduces(program: Program, claim: Claim, spec, ce) -> str | None:
    """Why a counterexample does not reproduce in NumPy, or None when it does."""
    at = spec.with_dims(**ce.sizes) if ce.sizes != spec.dims else spec
    v = Values()
    for name, value in ce.inputs.items():
        shape = at.concrete_shape(name[5:-1] if name.startswith("grad(") else name)
        v[name] = np.asarray(value, dtype=np.float64).reshape(shape)
    lhs, rhs = sides(program, claim, v)
    if not differs(lhs, rhs).any():
        return "NumPy finds the two sides equal at the counterexample"
    for shown, mine in ((ce.lhs, lhs), (ce.rhs, rhs)):
        if shown is not None and differs(np.asarray(shown, dtype=np.float64), mine, 1e-7).any():
            return f"the reported side {shown} is not NumPy's {mine.tolist()}"
    return None


def check(program: Program, budget: float | None = None) -> list:
    """Every claim's verdict against NumPy (see the module docstring); returns the verdicts."""
    text = program.head + "".join(f"check {c.text}\n" for c in program.claims)
    spec = symattn.load(text)
    verdicts = spec.check(budget=budget)
    assert len(verdicts) == len(program.claims)
    problems = []
    for claim, verdict in zip(program.claims, verdicts):
        shown = f"[{program.name}] check {claim.text}: {verdict.verdict} ({verdict.method[:200]})"
        difference = first_difference(program, claim, spec)
        if (difference is None) != claim.holds:
            problems.append(f"{shown}: the table says holds={claim.holds}, NumPy sampling says "
                            f"{'no difference' if difference is None else difference}")
            continue
        if verdict.verdict == "proved":
            if not claim.holds:
                problems.append(f"{shown}: FALSE PROOF, NumPy gives {difference}")
                continue
            if verdict.method.startswith("matrix level"):
                for sizes in program.other_sizes:
                    other = first_difference(program, claim, spec.with_dims(**sizes))
                    if other is not None:
                        problems.append(f"{shown}: proved for all sizes, but at {sizes} NumPy gives {other}")
        elif verdict.verdict == "refuted":
            if verdict.counterexample is None:
                problems.append(f"{shown}: refuted without a counterexample")
            else:
                why = reproduces(program, claim, spec, verdict.counterexample)
                if why is not None:
                    problems.append(f"{shown}: {why}")
        if claim.proof == "all sizes" and not (verdict.verdict == "proved" and "for all sizes" in verdict.method):
            problems.append(f"{shown}: expected a proof for all sizes")
        if claim.proof == "proved" and verdict.verdict != "proved":
            problems.append(f"{shown}: expected a proof")
    assert not problems, "\n".join(problems)
    return verdicts


def matrix_level_proofs(program: Program) -> list[str]:
    """The claims the matrix level alone proves for all sizes (no counterexample search first: a false
    claim must fail there on its own, not only because a counterexample is found before it is tried)."""
    from symattn.prove.canonical import definitions_for, prove_equal
    from symattn.symbolic.derive import derive

    spec = symattn.load(program.head + "".join(f"check {c.text}\n" for c in program.claims)).typed
    definitions = definitions_for(spec, derive(spec))
    return [claim.text for claim, check_ in zip(program.claims, spec.checks)
            if prove_equal(check_.lhs, check_.rhs, spec, definitions) is not None]
