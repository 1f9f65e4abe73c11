"""Answer `check` statements: proved, refuted (with a counterexample) or unknown.

Contract: `check_spec(spec)` returns one `Verdict` per `check`, in order.
"Equal" means equal at every point under IEEE float64 semantics, NaN and
infinities included (see `symattn.symbolic.finiteness`). An equality `A == B` climbs
the verification ladder, cheapest first, and the verdict names the rung that
settled it:

1. matrix level, dims symbolic: canonical index forms agree -> proved for all sizes;
2. element level, at the spec's sizes: exact identity of every entry -> proved at
   those sizes. Sides whose values cannot be NaN or +-inf for finite inputs
   (`Finiteness.deep`) are compared in the element model (SymPy rewrites
   exp(log(x)) to x and x/x to 1, true only where x > 0 or x != 0); the others
   region by region under float64 semantics (`symattn.symbolic.guarded`: where
   every divisor and sqrt/log argument is nonzero, then where one is 0);
3. concrete inputs (multiples of 1/2 in [-1, 1], zeros and negatives included) at
   which the two sides differ at 30 digits *and* in plain float64, re-evaluated by
   the float64 evaluator (independent of SymPy, with gradients from the matrix-level
   derivation) -> refuted, with the inputs and both float64 values;
4. otherwise unknown, saying why (agreement at random points is reported as such,
   never as a proof).

Every claim runs under a time budget (`budget` seconds, default
`symattn.budget.DEFAULT_SECONDS`); a claim over it is unknown, "gave up after
5.0 s". A derivation that fails costs only the claims that need gradients.
`check not CLAIM` inverts proved and refuted. Equivariance claims are
delegated to `symattn.prove.equivariance`.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import sympy

from .. import progress
from ..ir import typed as t
from ..budget import DEFAULT_SECONDS, OutOfTime, time_budget
from ..symbolic.derive import Derivation, derive
from ..symbolic.element import ElementModel, guard
from ..symbolic.element import MAX_ASSIGNMENTS, count_assignments, exact_integers, integer_assignments
from ..symbolic.element_cases import generalized, identical_in_every_case
from ..symbolic.guarded import CaseProof, compare_by_cases
from ..errors import SizeGuardError, SymAttnError
from ..symbolic.evaluate import NUMERIC, SYMBOLIC, Evaluator
from ..symbolic.finiteness import ANY, MINUS_INF, Finiteness
from ..ir.shapes import broadcast
from ..ir.sizes import SEARCH_BUDGET, fit_sizes, reads_sizes, user_sizes
from .missing_rules import missing_rule
from .pass_claims import on_written_passes, reads_tangents
from .counterexamples import DIGITS, POINTS, float64_contradicts, number, reads_grads, refuted, search_counterexample
from .verdicts import GradientCheck, Verdict

__all__ = ["check_spec", "verify_gradients", "open_session"]

MATRIX_SHARE = 0.5  # of a claim's time budget, the most the matrix-level prover may take
# Array entries (every tensor and subexpression, `symattn.ir.sizes.entries`) above which a claim's
# counterexample search moves to smaller sizes: it evaluates the spec at 30 digits in SymPy floats.
# Sizes given with --dim stand up to the numeric search's budget.
CLAIM_SEARCH_ENTRIES = 3_000


def _sizes_text(spec: t.TypedSpec) -> str:
    return ", ".join(f"{k}={v}" for k, v in spec.sizes.items())


class _Session:
    """Shared work for all checks of one spec: derivation, element model, evaluators."""

    def __init__(self, spec: t.TypedSpec, force: bool = False, budget: float | None = None,
                 integers: dict | None = None) -> None:
        self.spec = spec
        self.force = force
        self.integers = integers  # one assignment of the integer buffers (a session per assignment)
        self._assignments: list[_Session] | None = None
        self.matrix_seconds = None if budget is None else budget * MATRIX_SHARE
        self.matrix_gave_up = ""
        self.unreproduced = ""  # a 30-digit difference that float64 did not reproduce
        self._derivation: Derivation | None = None
        self.derive_error: str | None = None
        self._model: ElementModel | None = None
        self.model_error: str | None = None
        self._finiteness: Finiteness | None = None
        self._searcher: _Session | None = None
        self.size_note = ""  # set on a searcher at sizes the size guard picked

    def searcher(self) -> "_Session":
        """The session the counterexample search runs in: this one, or, when the spec's sizes would
        make its float64 and 30-digit evaluations too large, one at sizes the size guard picks."""
        if self._searcher is None:
            choice = fit_sizes(self.spec, CLAIM_SEARCH_ENTRIES, fixed=user_sizes(self.spec),
                               fixed_budget=SEARCH_BUDGET)
            if choice.shrunk:
                self._searcher = _Session(dataclasses.replace(self.spec, sizes=choice.sizes), self.force)
                self._searcher.size_note = choice.where()
            else:
                self._searcher = self
        return self._searcher

    @property
    def derivation(self) -> Derivation | None:
        """The matrix-level derivation, or None when it fails (derive_error says why)."""
        if self._derivation is None and self.derive_error is None:
            try:
                self._derivation = derive(self.spec)
            except SymAttnError as err:
                self.derive_error = str(err)
        return self._derivation

    @property
    def model(self) -> ElementModel:
        """The element model; raises SizeGuardError, or OutOfTime the first time building it runs
        out of time (then every later claim is told so at once instead of trying again)."""
        if self.model_error is not None:
            raise SizeGuardError(self.model_error)
        if self._model is None:
            try:
                self._model = ElementModel(self.spec, force=self.force, integers=self.integers)
            except SizeGuardError as err:
                self.model_error = str(err)
                raise
            except OutOfTime as err:
                self.model_error = f"building the element model {err}"
                raise
        return self._model

    def assignments(self) -> list["_Session"] | None:
        """The sessions the element level proves a claim in: this one, or, with integer buffers, one per
        assignment of their values (sharing the derivation); None when there are too many to enumerate."""
        if self.integers is not None or not any(self.spec.tensors[n].integer for n in self.spec.given):
            return [self]
        if self._assignments is None:
            found = integer_assignments(self.spec)
            if found is None:
                return None
            self._assignments = []
            for values in found:
                session = _Session(self.spec, self.force, integers=values)
                session._derivation, session.derive_error = self.derivation, self.derive_error
                self._assignments.append(session)
        return self._assignments

    def too_many(self) -> str:
        return (f"its integer buffers take {count_assignments(self.spec):,} values at {_sizes_text(self.spec)}, "
                f"more than the {MAX_ASSIGNMENTS} the element level enumerates (smaller sizes with --dim prove "
                "it at those)")

    @property
    def model_built(self) -> bool:
        """Whether the element model exists already (reading `model` would build it)."""
        return self._model is not None

    @property
    def finiteness(self) -> Finiteness:
        if self._finiteness is None:
            self._finiteness = Finiteness(self.spec, self.definitions())
        return self._finiteness

    def symbolic(self, node: t.Node, model: ElementModel | None = None) -> np.ndarray:
        """A node's entries in the element model's slots and gradient symbols (of `model`, one of its
        mask cases, or the session's); tensors that may be -inf enter with their exact entries, never
        as finite symbols."""
        model = self.model if model is None else model
        ev = Evaluator(self.spec, SYMBOLIC)
        ev.values = {**model.leaf, **model.slot, **{n: model.forward[n] for n in model.risky}}
        ev.grads = model.upstream
        shape = self.spec.concrete_shape(node.shape)
        value = np.asarray(ev.evaluate(node), dtype=object)
        return value.reshape(shape) if value.size == int(np.prod(shape, dtype=int)) else value

    def definitions(self) -> dict[str, t.Node | None]:
        defs = {n: i.expr for n, i in self.spec.tensors.items() if i.expr is not None}
        if self.derivation is not None:
            for name, grad in self.derivation.gradients.items():
                if name not in self.spec.outputs:  # None: L does not depend on it, grad is 0
                    defs[f"grad({name})"] = grad.expr
        return defs

    def at_point(self, values: dict, upstream: dict, digits: int | None = None,
                 subs: dict | None = None, grads: bool = True) -> Evaluator | None:
        """An evaluator holding every tensor and gradient at a point: in float64 (digits None, the
        NUMERIC backend) or in SymPy floats of `digits` digits (the same rules, to rule out rounding).
        Gradients come from the derived matrix-level formulas, or, without a derivation, from the
        element level's values at the point (`subs`); None when neither is available."""
        spec = self.spec
        if digits is None:
            ev = Evaluator(spec, NUMERIC)

            def convert(array):
                return np.asarray(np.asarray(array, dtype=object).astype(float), dtype=np.float64)
        else:
            ev = Evaluator(spec, SYMBOLIC)

            def convert(array):
                return np.vectorize(lambda v: sympy.Float(v, digits + 10), otypes=[object])(
                    np.asarray(array, dtype=object))

            def settle(array):  # every entry a number: exact constants such as cos(1/100) do not pile up
                return np.vectorize(lambda v: sympy.sympify(v).evalf(digits + 10), otypes=[object])(
                    np.asarray(array, dtype=object))
            ev.settle = settle
        ev.run({n: exact_integers(v) if digits is not None and spec.tensors[n].integer else convert(v)
                for n, v in values.items()})
        ev.grads = {n: convert(v) for n, v in upstream.items()}
        if not grads:  # a claim that reads no gradient needs none (and no derivation)
            return ev
        derivation = self.derivation
        for name in reversed(list(spec.tensors)):
            if name in spec.outputs or not spec.tensors[name].has_gradient:
                continue
            shape = spec.concrete_shape(spec.tensors[name].shape)
            if derivation is not None and name in derivation.gradients:
                expr = derivation.gradients[name].expr
                value = np.zeros(shape, dtype=object) if expr is None else ev.evaluate(expr)
                if ev.settle is not None:
                    value = ev.settle(value)
            elif subs is not None:
                value = np.array([number(subs[s]) for s in self.model.upstream[name].flat]).reshape(shape)
            else:
                return None
            value = np.broadcast_to(np.asarray(value, dtype=object), shape)
            ev.grads[name] = value.astype(np.float64) if digits is None else value
        return ev


def open_session(spec: t.TypedSpec, force: bool = False, derivation: Derivation | None = None) -> _Session:
    """One element-level pass for a spec, to share: pass it as `session=` to `check_spec` and
    `verify_gradients` (and read its `model`, `derivation`) so that the element model, its
    exact gradients and the finiteness analysis are built once. `derivation`, when given, is
    the spec's matrix-level derivation (otherwise derived on first use)."""
    session = _Session(spec, force)
    if derivation is not None:
        session._derivation = derivation
    return session


def _matrix_proof(session: _Session, lhs: t.Node, rhs: t.Node):
    """The canonical-form proof, or None; it gets a share of the claim's budget so that the
    element level still has time when the index forms grow large."""
    from .canonical import prove_equal

    mine = None  # an outer budget may run out while this one is being set up
    try:
        with time_budget(session.matrix_seconds) as mine:
            return prove_equal(lhs, rhs, session.spec, session.definitions())
    except SymAttnError:
        return None
    except OutOfTime as err:
        if mine is None or err.budget is not mine:
            raise
        session.matrix_gave_up = f"the matrix level gave up after {err.seconds:.1f} s"
        return None


def _check_equal(session: _Session, check: t.CheckInfo) -> Verdict:
    spec = session.spec
    finiteness = session.finiteness
    worst = max(finiteness.deep(check.lhs), finiteness.deep(check.rhs))
    if worst == MINUS_INF and (finiteness.data_minus_inf(check.lhs) or finiteness.data_minus_inf(check.rhs)):
        worst = ANY  # a log of a value that may be 0: -inf where the data say, compared region by region
    may_be_nan, masked = worst == ANY, worst == MINUS_INF
    search = session.searcher()  # the spec itself, or at sizes the size guard picked
    if search is not session and reads_sizes(spec, [check.lhs, check.rhs]):
        search = None  # at other sizes the claim says something else: N - 1000000000 is not 0 at N = 59
    else:
        search.unreproduced = ""
    session.matrix_gave_up = ""
    # A difference at a concrete point settles it in milliseconds; the proofs are for claims that hold.
    if search is not None:
        counter = search_counterexample(search, check, points=1, special=may_be_nan, masked=masked)
        if counter is not None:
            return refuted(check, search, counter)
    proof = _matrix_proof(session, check.lhs, check.rhs)
    if proof is not None:
        return Verdict(check.line, check.text, "proved", proof.method, steps=tuple(proof.steps))
    why = session.matrix_gave_up or "no matrix-level proof"
    if reads_grads(check) and session.derivation is None:
        why = f"the derivation failed ({session.derive_error}), so no matrix-level proof"
    sessions = session.assignments()
    if sessions is None:
        why += f", and no exact proof at {_sizes_text(spec)}: {session.too_many()}"
    else:
        try:
            proved = _element_proof(session, sessions, check, may_be_nan)
        except SizeGuardError as err:
            return Verdict(check.line, check.text, "unknown", f"{why}, and {err}")
        if isinstance(proved, Verdict):
            return proved
        if proved:
            return Verdict(check.line, check.text, "proved", proved)
        why += (f", no exact proof at {_sizes_text(spec)}" if not may_be_nan else
                f", and the element level's case analysis at {_sizes_text(spec)} did not settle it")
    if search is None:
        return Verdict(check.line, check.text, "unknown",
                       f"{why}; the spec's sizes are too large to search for a counterexample, and the claim reads "
                       "sizes as values (a dim, a mean, index values or sinusoidal(...)), so smaller sizes would "
                       "test another claim")
    counter = search_counterexample(search, check, special=may_be_nan, masked=masked)
    if counter is not None:
        return refuted(check, search, counter)
    if search.unreproduced:
        return Verdict(check.line, check.text, "unknown", f"{why}; {search.unreproduced}")
    where = search.size_note or f"at {_sizes_text(spec)}"
    return Verdict(check.line, check.text, "unknown",
                   f"{why}; the two sides agree {where} at {POINTS + 1} random rational points in float64 and "
                   f"to {DIGITS} digits (agreement at points is not a proof)")


def _element_proof(session: _Session, sessions: list[_Session], check: t.CheckInfo, may_be_nan: bool):
    """The element level's method when the claim is an exact identity in every session (each assignment of
    the integer buffers), "" when not shown, or an "unknown" Verdict when float64 contradicts a proof."""
    spec = session.spec
    method = ""
    for each in sessions:
        if not may_be_nan:
            lhs, rhs = each.symbolic(check.lhs), each.symbolic(check.rhs)
            # a mask whose comparison the model does not decide (of inputs, or of buffers not split into
            # cases) is a Piecewise that SymPy's algebra does not follow as float64 does: exp(m) / exp(m)
            # is 1 even where m is -oo, so a softmax row it empties would sum to 1
            sides = (check.lhs, check.rhs)
            same, unfolded = ((False, []) if each.model.undecided_masks(sides) else each.model.identical(lhs, rhs))
            cases = 0 if same else identical_in_every_case(
                each.model, lambda m: (each.symbolic(check.lhs, m), each.symbolic(check.rhs, m)), sides)
            if not (same or cases):
                return ""
            how = f" after unfolding {', '.join(unfolded)}" if unfolded and same else ""
            if cases:
                how = f" in each of the {cases} cases of the masks (each masking comparison of buffers true or false)"
            method = (f"element level: exact identity of every entry at {_sizes_text(spec)}{how} "
                      f"(not shown for all sizes: {_missing(session, check)})")
        else:
            cases = _by_cases(each, check)
            if not cases.proved:
                return ""
            method = _cases_method(spec, cases, reads_grads(check), _missing(session, check))
    contradiction = float64_contradicts(session, check)
    if contradiction is not None:  # a bug in the element level: never a proof
        return Verdict(check.line, check.text, "unknown",
                       f"the exact identity at {_sizes_text(spec)} is contradicted by float64: "
                       f"{contradiction}; this is a bug in symattn, please report it")
    if len(sessions) > 1:
        method += f", for each of the {len(sessions)} assignments of the integer buffers"
    return method


def _gradient_identity(session: _Session, name: str, grad, shape, rational: bool):
    """(identical, tensors unfolded, mask cases) for one derived grad(T) against the chain rule."""
    model = session.model
    if grad.expr is None:
        matrix = np.zeros(shape, dtype=object) if shape else np.array(sympy.Integer(0), dtype=object)
    else:
        matrix = session.symbolic(grad.expr)
    truth = model.ground_truth(name)
    ok, unfolded = model.identical(matrix, truth, unfold_grads=False, as_rational_functions=rational)
    if not ok and session.integers:
        # With the integer buffers given, a masked score is the constant -inf, so the chain rule has no path
        # through it, while the derived formula still reads its gradient (0 there): compared with every
        # gradient written out in the upstream gradients, the two are the same functions.
        ok, unfolded = model.identical(matrix, truth, unfold_grads=True, as_rational_functions=rational)
    cases = 0 if ok or rational or grad.expr is None else identical_in_every_case(
        model, lambda m: (session.symbolic(grad.expr, m), m.ground_truth(name)), unfold_grads=False)
    return ok, unfolded, cases


def _missing(session: _Session, check: t.CheckInfo) -> str:
    """Why the matrix level did not prove the claim for all sizes (`symattn.prove.missing_rules`)."""
    if session.matrix_gave_up:
        return session.matrix_gave_up
    return missing_rule(session.spec, session.definitions(), session.finiteness, check.lhs, check.rhs)


def _by_cases(session: _Session, check: t.CheckInfo) -> CaseProof:
    """The element level for a claim whose values may be NaN or infinite: exact, region by region
    (`symattn.symbolic.guarded`); raises SizeGuardError at sizes that would take minutes."""
    spec = session.spec
    guard(spec, session.force)
    gradients: dict[str, t.Node | None] = {}
    if reads_grads(check):
        if session.derivation is None:
            return CaseProof(False, 0, f"the derivation failed: {session.derive_error}")
        gradients = {n: g.expr for n, g in session.derivation.gradients.items() if n not in spec.outputs}
    shape = spec.concrete_shape(broadcast(check.lhs.shape, check.rhs.shape))
    try:
        proof = compare_by_cases(spec, check.lhs, check.rhs, shape, gradients, session.integers)
    except SymAttnError as err:
        return CaseProof(False, 0, f"the sides could not be evaluated: {err}")
    free = generalized(spec) if not proof.proved and "cannot be told" in proof.reason else None
    if free is not None:  # where a sum of squares of X @ W_q is 0 cannot be told; of a free Q it can
        try:
            stronger = compare_by_cases(free[0], check.lhs, check.rhs, shape, gradients, session.integers)
        except SymAttnError:
            return proof
        if stronger.proved:
            return dataclasses.replace(stronger, freed=free[1])
    return proof


def _cases_method(spec: t.TypedSpec, cases: CaseProof, grads: bool, missing: str) -> str:
    """How a case-by-case proof was made, for the verdict."""
    text = (f"element level: exact identity of every entry at {_sizes_text(spec)} under float64 semantics "
            "(NaN and infinities included)")
    if not cases.guarded:
        text += ", no divisor or argument of sqrt, log or a power being 0 anywhere"
    else:
        text += ", where every divisor and every argument of sqrt, log and powers is nonzero"
    if cases.zero_sets:
        example = " = ".join(sorted(str(s) for s in min(cases.zero_sets, key=lambda z: sorted(map(str, z)))))
        count = len(cases.zero_sets)
        text += (f", and in the {count} region{'s' if count > 1 else ''} where one is 0 "
                 f"(such as {example} = 0), re-evaluated there")
    if cases.freed:
        text += (f", with {', '.join(cases.freed)} as free tensors (shown for every value of them, so for the "
                 "values their definitions give)")
    if grads:
        text += "; gradients as the derived formulas compute them"
    return text + f" (not shown for all sizes: {missing})"


def _negate(verdict: Verdict) -> Verdict:
    text = f"not {verdict.claim}"
    if verdict.verdict == "refuted":
        return Verdict(verdict.line, text, "proved", f"the claim it negates is refuted: {verdict.method}",
                       verdict.counterexample, verdict.steps)
    if verdict.verdict == "proved":
        return Verdict(verdict.line, text, "refuted", f"the claim it negates is proved: {verdict.method}",
                       None, verdict.steps)
    return Verdict(verdict.line, text, "unknown", verdict.method, verdict.counterexample, verdict.steps)


def check_spec(spec: t.TypedSpec, force: bool = False, budget: float | None = DEFAULT_SECONDS,
               session: _Session | None = None) -> list[Verdict]:
    """One verdict per `check` statement of the spec, each within `budget` seconds (None: no limit).
    `session` (from `open_session`, with the same spec and force) shares its element model."""
    if session is None:
        session = _Session(spec, force, budget)
    else:
        session.matrix_seconds = None if budget is None else budget * MATRIX_SHARE
    verdicts = []
    tangent_checks = [c for c in spec.checks if reads_tangents(c)]
    on_passes = iter(_check_on_written_passes(session, tangent_checks, budget))
    for k, check in enumerate(spec.checks):
        progress.step(f"check, line {check.line}", k, len(spec.checks))
        if reads_tangents(check):
            verdicts.append(next(on_passes))
            continue
        try:
            with time_budget(budget):
                if check.kind == "equal":
                    verdict = _check_equal(session, check)
                elif check.kind == "relative":
                    verdict = _relative_all_sizes(session, check) or _relative_note(_check_equal(session, check))
                else:
                    verdict = _check_symmetry(session, check)
        except OutOfTime as err:
            verdict = Verdict(check.line, check.text, "unknown", f"{err} (the time budget per claim; "
                              "raise it with --budget)")
        verdicts.append(_negate(verdict) if check.negated else verdict)
    return verdicts


def _check_on_written_passes(session: _Session, checks: list[t.CheckInfo], budget: float | None) -> list[Verdict]:
    """The checks that read tangent(...), in order, answered on the tangent passes written as specs, each pass
    written and checked once (`symattn.prove.pass_claims`); each verdict says which pass."""
    if not checks:
        return []
    try:
        passes = on_written_passes(session.spec, checks, session.derivation)
    except SymAttnError as err:
        return [Verdict(c.line, c.text, "unknown", f"the tangent pass could not be written: {err}") for c in checks]
    out: list[Verdict | None] = [None] * len(checks)
    for written, positions, what in passes:
        for k, verdict in zip(positions, check_spec(written, session.force, budget)):  # negated there already
            out[k] = dataclasses.replace(verdict, line=checks[k].line, method=f"{verdict.method}, on {what}")
    return out


def _relative_all_sizes(session: _Session, check: t.CheckInfo) -> Verdict | None:
    """relative(B) proved at symbolic positions and sizes (`symattn.prove.relative`), or None."""
    from .relative import prove_relative

    proof = prove_relative(check.lhs.x.x, session.spec, session.finiteness)  # lhs: B[..., 0:R-1, 0:C-1]
    if proof is None:
        return None
    contradiction = float64_contradicts(session, check)
    if contradiction is not None:  # a bug in the prover: never a proof
        return Verdict(check.line, check.text, "unknown", f"the proof at symbolic positions is contradicted "
                       f"by float64: {contradiction}; this is a bug in symattn, please report it")
    return Verdict(check.line, check.text, "proved", proof.method, steps=proof.steps)


def _relative_note(verdict: Verdict) -> Verdict:
    """`relative(B)` is checked as B[..., :-1, :-1] == B[..., 1:, 1:]: say which pair of entries differs."""
    counter = verdict.counterexample
    if counter is None or not counter.note.startswith("largest gap at entry ["):
        return verdict
    index = [int(k) for k in counter.note[len("largest gap at entry ["):].split("]")[0].split(", ")]
    left, right = counter.lhs, counter.rhs
    for k in index:
        left, right = left[k], right[k]
    head, (i, j) = index[:-2], index[-2:]
    at = ", ".join(map(str, head + [i, j]))
    shifted = ", ".join(map(str, head + [i + 1, j + 1]))
    note = (f"entry [{at}] is {left:.6g} but entry [{shifted}] is {right:.6g} in float64 (0-based): "
            "not a function of j - i")
    return dataclasses.replace(verdict, counterexample=dataclasses.replace(
        counter, note=note, lhs=None, rhs=None, extra={**counter.extra, "pair": [head + [i, j], head + [i + 1, j + 1]]}))


def _check_symmetry(session: _Session, check: t.CheckInfo) -> Verdict:
    from .equivariance import check_symmetry

    return check_symmetry(session.spec, check, force=session.force)


def verify_gradients(spec: t.TypedSpec, force: bool = False, derivation: Derivation | None = None,
                     budget: float | None = None, session: _Session | None = None) -> list[GradientCheck]:
    """Every matrix-level grad(T) against the element-level chain rule, exactly, at the spec's sizes,
    each within `budget` seconds (None, the default: no limit, so documents do not depend on the
    machine's load). A gradient that reads values that may be NaN or infinite is compared as
    rational functions (the method says so). `session` (from `open_session`) shares its element
    model and exact gradients with other checks of the same spec."""
    if session is None:
        session = open_session(spec, force, derivation)
    if session.derivation is None:
        raise SymAttnError(f"cannot verify gradients: {session.derive_error}")
    finiteness = session.finiteness
    sessions = session.assignments()
    out = []
    for k, (name, grad) in enumerate(session.derivation.gradients.items()):
        progress.step(f"checking grad({name})", k, len(session.derivation.gradients))
        if sessions is None:
            out.append(GradientCheck(name, False, f"not checked: {session.too_many()}"))
            continue
        shape = spec.concrete_shape(spec.tensors[name].shape)
        rational = grad.expr is not None and finiteness.deep(grad.expr) == ANY
        try:
            with time_budget(budget):
                for each in sessions:
                    ok, unfolded, cases = _gradient_identity(each, name, grad, shape, rational)
                    if not (ok or cases):
                        break
        except OutOfTime as err:
            out.append(GradientCheck(name, False, f"not checked: {err}"))
            continue
        how = f" after unfolding {', '.join(unfolded)}" if unfolded else ""
        if cases:
            ok, how = True, f" in each of the {cases} cases of the masks (each masking comparison of buffers true or false)"
        caveat = ""
        if rational:
            caveat = " (as rational functions: where an entry is NaN or infinite the formulas are not compared)"
        if ok and len(sessions) > 1:
            how += f", for each of the {len(sessions)} assignments of the integer buffers"
        out.append(GradientCheck(name, ok, f"exact identity of every entry at {_sizes_text(spec)}{how}{caveat}"
                                 if ok else f"not shown equal at {_sizes_text(spec)}"))
    return out
