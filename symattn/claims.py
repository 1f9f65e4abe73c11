"""Answer `check` statements: proved, refuted (with a counterexample) or unknown.

Contract: `check_spec(spec)` returns one `Verdict` per `check`, in order.
An equality `A == B` climbs the verification ladder, cheapest first, and the
verdict names the rung that settled it:

1. matrix level, dims symbolic: canonical index forms agree -> proved for all sizes;
2. element level, at the spec's sizes: exact identity of every entry -> proved at those sizes;
3. concrete integer inputs at which the two sides differ (evaluated exactly,
   then to 30 digits) -> refuted, with the inputs and both values;
4. otherwise unknown, saying how far the search went (agreement at random
   points is reported as such, never as a proof).

`check not CLAIM` inverts proved and refuted. Equivariance claims are
delegated to `symattn.equivariance`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import mpmath
import numpy as np
import sympy

from . import typed as t
from .derive import Derivation, derive
from .element import ElementModel
from .errors import SizeGuardError, SymAttnError
from .evaluate import NUMERIC, SYMBOLIC, Evaluator

__all__ = ["Verdict", "Counterexample", "check_spec", "verify_gradients", "GradientCheck"]

POINTS = 4          # random integer points tried for a counterexample
DIGITS = 30         # precision of the values compared at a point
SEPARATION = 1e-12  # relative gap that counts as a difference at 30 digits


@dataclass
class Counterexample:
    """Concrete inputs at which a claim fails, reproducible with NumPy."""

    sizes: dict[str, int]
    inputs: dict[str, list]            # inputs, params, and upstream gradients grad(O)
    lhs: list | float | None = None
    rhs: list | float | None = None
    note: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict:
        return {"sizes": self.sizes, "inputs": self.inputs, "lhs": self.lhs, "rhs": self.rhs, "note": self.note,
                **self.extra}


@dataclass
class Verdict:
    line: int
    claim: str
    verdict: str                       # proved | refuted | unknown
    method: str
    counterexample: Counterexample | None = None
    steps: tuple = ()

    @property
    def holds(self) -> bool:
        return self.verdict == "proved"

    def __bool__(self) -> bool:
        """True only when proved: `if verdict:` must not pass a refuted or unknown claim."""
        return self.holds

    def to_json(self) -> dict:
        return {"line": self.line, "claim": self.claim, "verdict": self.verdict, "method": self.method,
                "counterexample": self.counterexample.to_json() if self.counterexample else None}


@dataclass
class GradientCheck:
    tensor: str
    ok: bool
    method: str


def _sizes_text(spec: t.TypedSpec) -> str:
    return ", ".join(f"{k}={v}" for k, v in spec.sizes.items())


def _tolist(array) -> Any:
    array = np.asarray(array, dtype=object)
    if array.shape == ():
        return _number(array.item())
    return [_tolist(a) for a in array]


def _number(value):
    if isinstance(value, (mpmath.mpf, mpmath.mpc)):
        return float(value.real) if isinstance(value, mpmath.mpc) else float(value)
    value = sympy.sympify(value)
    if value.is_Integer:
        return int(value)
    return float(value)


class _Session:
    """Shared work for all checks of one spec: derivation, element model, evaluator."""

    def __init__(self, spec: t.TypedSpec, force: bool = False) -> None:
        self.spec = spec
        self.force = force
        self.compared = 0     # entries evaluated at concrete points for the current claim
        self.uncompared = 0   # entries that could not be (a function mpmath is not given)
        self._derivation: Derivation | None = None
        self._model: ElementModel | None = None

    @property
    def derivation(self) -> Derivation:
        if self._derivation is None:
            self._derivation = derive(self.spec)
        return self._derivation

    @property
    def model(self) -> ElementModel:
        if self._model is None:
            self._model = ElementModel(self.spec, force=self.force)
        return self._model

    def symbolic(self, node: t.Node) -> np.ndarray:
        """A node's entries in the element model's slots and gradient symbols."""
        model = self.model
        ev = Evaluator(self.spec, SYMBOLIC)
        ev.values = {**model.leaf, **model.slot}
        ev.grads = model.upstream
        shape = self.spec.concrete_shape(node.shape)
        value = np.asarray(ev.evaluate(node), dtype=object)
        return value.reshape(shape) if value.size == int(np.prod(shape, dtype=int)) else value

    def definitions(self) -> dict[str, t.Node]:
        defs = {n: i.expr for n, i in self.spec.tensors.items() if i.expr is not None}
        for name, grad in self.derivation.gradients.items():
            if grad.expr is not None and name not in self.spec.outputs:
                defs[f"grad({name})"] = grad.expr
        return defs


def _matrix_proof(session: _Session, lhs: t.Node, rhs: t.Node):
    try:
        from .canonical import prove_equal
    except ImportError:  # pragma: no cover - the matrix-level prover is optional
        return None
    try:
        return prove_equal(lhs, rhs, session.spec, session.definitions())
    except SymAttnError:
        return None


def _rational_point(session: _Session, rng: np.random.Generator) -> tuple[dict, dict]:
    """Small exact inputs: multiples of 1/2 in [-1, 1], so softmax stays far from saturation."""
    spec = session.spec
    halves = np.array([sympy.Rational(k, 2) for k in range(-2, 3)], dtype=object)
    values = {n: rng.choice(halves, size=spec.concrete_shape(spec.tensors[n].shape)) for n in spec.leaves}
    nonzero = np.array([sympy.Rational(k, 2) for k in (-2, -1, 1, 2)], dtype=object)
    upstream = {n: rng.choice(nonzero, size=spec.concrete_shape(spec.tensors[n].shape)) for n in spec.outputs}
    return values, upstream


def _differs(a, b) -> bool:
    if a is None or b is None:
        return False
    a, b = complex(a), complex(b)
    if not (np.isfinite(a) and np.isfinite(b)):
        return a != b and not (np.isnan(a) or np.isnan(b))
    return abs(a - b) > SEPARATION * max(1.0, abs(a), abs(b))


def _search_counterexample(session: _Session, lhs: np.ndarray, rhs: np.ndarray,
                           points: int = POINTS) -> Counterexample | None:
    model = session.model
    rng = np.random.default_rng(20261129)
    lhs, rhs = np.broadcast_arrays(np.asarray(lhs, dtype=object), np.asarray(rhs, dtype=object))
    for _ in range(points):
        values, upstream = _rational_point(session, rng)
        subs = model.point(values, upstream, DIGITS)
        left = model.evaluate_at(lhs, subs, DIGITS)
        right = model.evaluate_at(rhs, subs, DIGITS)
        indices = list(np.ndindex(*left.shape) if left.shape else [()])
        comparable = [i for i in indices if left[i] is not None and right[i] is not None]
        session.compared += len(comparable)
        session.uncompared += len(indices) - len(comparable)
        gaps = {index: abs(complex(left[index]) - complex(right[index]))
                for index in comparable if _differs(left[index], right[index])}
        if gaps:
            index = max(gaps, key=gaps.get)
            inputs = {n: _tolist(v) for n, v in values.items()}
            inputs.update({f"grad({n})": _tolist(v) for n, v in upstream.items()})
            where = "[" + ", ".join(str(i) for i in index) + "]"
            return Counterexample(
                sizes=dict(session.spec.sizes), inputs=inputs, lhs=_tolist(left), rhs=_tolist(right),
                note=f"largest gap at entry {where} (0-based): left side {float(complex(left[index]).real):.6g}, "
                     f"right side {float(complex(right[index]).real):.6g}",
            )
    return None


def _refuted(check: t.CheckInfo, spec: t.TypedSpec, counter: Counterexample) -> Verdict:
    return Verdict(check.line, check.text, "refuted",
                   f"counterexample at {_sizes_text(spec)}: exact inputs (multiples of 1/2), both sides "
                   f"evaluated to {DIGITS} digits", counter)


def _check_equal(session: _Session, check: t.CheckInfo) -> Verdict:
    spec = session.spec
    proof = _matrix_proof(session, check.lhs, check.rhs)
    if proof is not None:
        return Verdict(check.line, check.text, "proved", proof.method, steps=tuple(proof.steps))
    try:
        lhs, rhs = session.symbolic(check.lhs), session.symbolic(check.rhs)
    except SizeGuardError as err:
        return Verdict(check.line, check.text, "unknown", f"no matrix-level proof, and {err}")
    session.compared = session.uncompared = 0
    # A difference at a concrete point settles it quickly; the exact test is for claims that hold.
    counter = _search_counterexample(session, lhs, rhs, points=1)
    if counter is not None:
        return _refuted(check, spec, counter)
    same, unfolded = session.model.identical(lhs, rhs)
    if same:
        how = f" after unfolding {', '.join(unfolded)}" if unfolded else ""
        return Verdict(check.line, check.text, "proved",
                       f"element level: exact identity of every entry at {_sizes_text(spec)}{how} "
                       "(not shown for all sizes)")
    counter = _search_counterexample(session, lhs, rhs)
    if counter is not None:
        return _refuted(check, spec, counter)
    if session.uncompared:
        return Verdict(check.line, check.text, "unknown",
                       f"no exact proof at {_sizes_text(spec)}, and {session.uncompared} entries could not be "
                       "evaluated at concrete points, so no counterexample could be looked for there")
    return Verdict(check.line, check.text, "unknown",
                   f"no exact proof at {_sizes_text(spec)}, and the two sides agree at {POINTS} random rational "
                   f"points to {DIGITS} digits (agreement at points is not a proof)")


def _negate(verdict: Verdict) -> Verdict:
    text = f"not {verdict.claim}"
    if verdict.verdict == "refuted":
        return Verdict(verdict.line, text, "proved", f"the claim it negates is refuted: {verdict.method}",
                       verdict.counterexample, verdict.steps)
    if verdict.verdict == "proved":
        return Verdict(verdict.line, text, "refuted", f"the claim it negates is proved: {verdict.method}",
                       None, verdict.steps)
    return Verdict(verdict.line, text, "unknown", verdict.method, verdict.counterexample, verdict.steps)


def check_spec(spec: t.TypedSpec, force: bool = False) -> list[Verdict]:
    """One verdict per `check` statement of the spec."""
    session = _Session(spec, force)
    verdicts = []
    for check in spec.checks:
        if check.kind == "equal":
            verdict = _check_equal(session, check)
        else:
            verdict = _check_symmetry(session, check)
        verdicts.append(_negate(verdict) if check.negated else verdict)
    return verdicts


def _check_symmetry(session: _Session, check: t.CheckInfo) -> Verdict:
    try:
        from .equivariance import check_symmetry
    except ImportError:
        return Verdict(check.line, check.text, "unknown", "equivariance checks are not available yet")
    return check_symmetry(session.spec, check, force=session.force)


def verify_gradients(spec: t.TypedSpec, force: bool = False,
                     derivation: Derivation | None = None) -> list[GradientCheck]:
    """Every matrix-level grad(T) against the element-level chain rule, exactly, at the spec's sizes."""
    session = _Session(spec, force)
    if derivation is not None:
        session._derivation = derivation
    model = session.model
    out = []
    for name, grad in session.derivation.gradients.items():
        shape = spec.concrete_shape(spec.tensors[name].shape)
        if grad.expr is None:
            matrix = np.zeros(shape, dtype=object) if shape else np.array(sympy.Integer(0), dtype=object)
        else:
            matrix = session.symbolic(grad.expr)
        truth = model.ground_truth(name)
        ok, unfolded = model.identical(matrix, truth, unfold_grads=False)
        how = f" after unfolding {', '.join(unfolded)}" if unfolded else ""
        out.append(GradientCheck(name, ok, f"exact identity of every entry at {_sizes_text(spec)}{how}" if ok
                                 else f"NOT shown equal at {_sizes_text(spec)}"))
    return out


def numeric_values(spec: t.TypedSpec, node: t.Node, leaves: dict, grads: dict) -> np.ndarray:
    """float64 value of a node (used by tests and counterexample re-checks)."""
    ev = Evaluator(spec, NUMERIC)
    ev.run(leaves, grads)
    return ev.evaluate(node)
