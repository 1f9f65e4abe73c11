"""The element level: explicit SymPy entries at concrete sizes, exact gradients.

Contract: `ElementModel(spec)` holds, at the spec's sizes,

- `leaf[X]`: a real symbol per entry of every input, param and buffer (`X_{1,2}`,
  `W^{q}_{2,1}`, 1-based as people write them), except an integer buffer's, which are
  the integers of one assignment (`integers`; `integer_assignments(spec)` lists them
  all when there are at most MAX_ASSIGNMENTS, and a claim is shown in each). A
  dropout mask is an integer buffer (0 or 1) that only multiplies (`D = x * Z / (1 - p)`:
  no subscript, condition or integer operation can read it), so it keeps real symbols:
  what holds for every real entry holds for 0 and 1, and its 2^entries assignments
  are not enumerated (the element level never claims a difference, and every
  counterexample is a point with the mask's entries drawn from {0, 1});
- `slot[T]`: a symbol per entry of every defined tensor, and `local[T]`: its
  entries written in the slots of the tensors its definition reads (softmax
  with exp, masks with -oo giving exactly 0 weight);
- `upstream[T]`: a symbol per entry of grad(T) (`\\bar{O}_{1,1}`), for every tensor but a buffer;
- `ground_truth(T)`: dL/dT entry by entry, by the chain rule node by node:
  grad(T)[t] = sum over consumers C, entries c of grad(C)[c] * d local[C][c] / d slot[T][t],
  each derivative taken by `sympy.diff` on the small local formula.

`identical(a, b)` decides exact equality of two arrays of entries: it tries
the slots as they are, then unfolds gradients and definitions one tensor at
a time, and at each stage compares entries with `symattn.symbolic.exact`
(every function application replaced by an independent symbol, the rational
function tested for zero), so "identical" is an exact proof at these sizes.
It never claims a difference;
`evaluate_at` supplies concrete values for counterexamples.

What "equal" means (the same everywhere in symattn, see `symattn.symbolic.finiteness`):
equal at every point of the domain (finite real values of every input, param,
buffer and upstream gradient) under IEEE float64 semantics, NaN and infinities
included, two entries being the same non-finite value counting as equal;
rounding and overflow are not modelled. The element level honours it so:

- a slot symbol stands for a finite real, so only tensors that the shared
  static analysis classifies FINITE get slots that may stay symbols; a tensor
  that may be -inf (a mask, scores plus a mask) is always replaced by its
  exact entries (`forward`: -inf as SymPy's -oo, a fully masked softmax row
  as 0, the generated code's convention) before two entries are compared;
- an entry that still holds an infinity or NaN inside an expression after
  that is not settled: it is never cancelled (SymPy would say -oo*x - -oo*x
  is 0), and the identity is not proved;
- values that may be NaN or +-inf for finite inputs (`log`, `sqrt`, division
  by a tensor, and what reads them) are never compared here at all: SymPy
  already rewrote exp(log(x)) to x and x/x to 1 when it built them. The
  caller (`symattn.prove.claims`) asks `Finiteness.deep` first and compares
  such values region by region instead (`symattn.symbolic.guarded`).

An output that other tensors read has two gradients: `upstream[O]` is its
upstream gradient grad(O) (what a claim's `grad(O)` means), and the chain
rule into its definition uses the sum of that and every other path (`adjoint`).
"""

from __future__ import annotations

import itertools
import math
from typing import Mapping

import mpmath
import numpy as np
import sympy

from .. import progress
from ..ir import typed as t
from ..budget import checkpoint
from ..errors import SizeGuardError
from .evaluate import SYMBOLIC, Evaluator
from .finiteness import FINITE, Finiteness
from .exact import (entry_diff, extreme_diff, free_symbols, mp_value, same_entry, settled, shared_xreplace,
                    zero_test)
from .relations import radicals_as_roots

__all__ = ["ElementModel", "symbol_name", "guard", "zero_test", "same_entry", "settled", "shared_xreplace",
           "ELEMENT_BUDGET", "MAX_ASSIGNMENTS", "integer_assignments", "count_assignments", "example_assignment",
           "exact_integers"]

def symbol_name(tensor: str, index: tuple[int, ...], grad: bool = False) -> str:
    """`X_{1,2}`, `W^{q}_{2,1}`, `\\bar{O}_{1,1}`: 1-based, LaTeX-friendly."""
    base, _, sup = tensor.partition("_")
    head = f"{base}^{{{sup}}}" if sup and base else tensor
    if grad:
        head = f"\\bar{{{head}}}"
    return f"{head}_{{{','.join(str(i + 1) for i in index)}}}" if index else head


def _symbols(tensor: str, shape: tuple[int, ...], grad: bool = False) -> np.ndarray:
    out = np.empty(shape, dtype=object)
    for index in np.ndindex(*shape) if shape else [()]:
        out[index] = sympy.Symbol(symbol_name(tensor, index, grad), real=True)
    return out


def exact_integers(values) -> np.ndarray:
    """An integer buffer's values as an object array of SymPy Integers (its entries in exact arithmetic)."""
    values = np.asarray(values)
    out = np.empty(values.shape, dtype=object)
    for index in np.ndindex(*out.shape) if out.shape else [()]:
        out[index] = sympy.Integer(int(values[index]))
    return out


MAX_ASSIGNMENTS = 128  # integer-buffer assignments the element level enumerates, one element model each


def integer_assignments(spec: t.TypedSpec) -> list[dict[str, np.ndarray]] | None:
    """Every assignment of values in range to the entries of the spec's integer buffers at its sizes
    ([{}] when it has none), or None when there are more than MAX_ASSIGNMENTS of them."""
    names = _enumerated(spec)
    if not names:
        return [{}]
    shapes = {n: spec.concrete_shape(spec.tensors[n].shape) for n in names}
    slots = [(n, index) for n in names for index in (np.ndindex(*shapes[n]) if shapes[n] else [()])]
    ranges = [range(*spec.integer_range(n)) for n, _ in slots]
    count = 1
    for r in ranges:
        count *= len(r)
        if count > MAX_ASSIGNMENTS:
            return None
    out = []
    for values in itertools.product(*ranges):
        arrays = {n: np.zeros(shapes[n], dtype=np.int64) for n in names}
        for (n, index), v in zip(slots, values):
            arrays[n][index] = v
        out.append(arrays)
    return out


def _enumerated(spec: t.TypedSpec) -> list[str]:
    """The integer buffers whose values the element level enumerates: all but dropout's masks (real symbols)."""
    return [n for n in spec.given if spec.tensors[n].integer and spec.tensors[n].dropout is None]


def example_assignment(spec: t.TypedSpec) -> dict[str, np.ndarray]:
    """One assignment of the integer buffers, their entries spread over the range in order (document ids
    0 0 1 1 2 2, offsets 0 2 4): an example when there are too many to enumerate."""
    out = {}
    for n in _enumerated(spec):
        low, high = spec.integer_range(n)
        shape = spec.concrete_shape(spec.tensors[n].shape)
        count = int(np.prod(shape, dtype=int))
        out[n] = np.array([low + k * (high - low) // max(count, 1) for k in range(count)],
                          dtype=np.int64).reshape(shape)
    return out


def count_assignments(spec: t.TypedSpec) -> int:
    """How many assignments the integer buffers have at the spec's sizes (1 when there are none)."""
    count = 1
    for n in _enumerated(spec):
        low, high = spec.integer_range(n)
        count *= max(high - low, 0) ** int(np.prod(spec.concrete_shape(spec.tensors[n].shape), dtype=int))
    return count


# Element-level work grows like (entries of every tensor) x (the largest dim):
# about 5,000 for self_attention at N = d = d_k = 8 (seconds); above the budget
# it takes minutes and is refused unless forced.
ELEMENT_BUDGET = 12_000


def cost(spec: t.TypedSpec) -> int:
    """A rough measure of element-level work: total entries times the largest dim."""
    entries = sum(math.prod(spec.concrete_shape(info.shape)) for info in spec.tensors.values())
    return entries * max(spec.sizes.values(), default=1)


def guard(spec: t.TypedSpec, force: bool = False) -> None:
    """Refuse element-level work that would take minutes, naming a size that works."""
    work = cost(spec)
    if force or work <= ELEMENT_BUDGET:
        return
    sizes = dict(spec.sizes)
    smaller = dict(sizes)
    while True:
        biggest = max(smaller, key=smaller.get)
        if smaller[biggest] <= 1:
            break
        smaller[biggest] = max(1, smaller[biggest] // 2)
        trial = t.TypedSpec(spec.name, spec.filename, spec.source, spec.dims, smaller, spec.tensors,
                            spec.outputs, spec.checks)
        try:
            if cost(trial) <= ELEMENT_BUDGET:
                break
        except (TypeError, ValueError):
            break
    shown = " ".join(f"--dim {k}={v}" for k, v in smaller.items() if v != sizes[k])
    now = ", ".join(f"{k}={v}" for k, v in sizes.items())
    raise SizeGuardError(f"element-level work at {now} would take minutes (size measure {work:,}, budget "
                         f"{ELEMENT_BUDGET:,}); try {shown}, or pass --force to run it anyway")



class ElementModel:
    """Explicit entries of every tensor of a spec at its concrete sizes."""

    def __init__(self, spec: t.TypedSpec, force: bool = False, progress: bool | None = None,
                 case: Mapping | None = None, integers: Mapping[str, np.ndarray] | None = None) -> None:
        guard(spec, force)
        self.spec = spec
        # An integer buffer's entries are given integers (one assignment of `integer_assignments`):
        # subscripts through it are then concrete, and a claim is shown for each assignment in turn.
        self.integers = dict(integers or {})
        # A mask case (`symattn.symbolic.element_cases`): each comparison of buffers that masks an entry
        # decided, so masks are exact 0 or -oo; entries that are -oo are then read as -oo, constants, by
        # the local formulas too (a fully masked softmax row is the constant 0, with no derivative).
        self.case = dict(case or {})
        self.progress = progress is not False  # report steps to symattn.progress (silent outside a task)
        self.leaf = {n: _symbols(n, spec.concrete_shape(spec.tensors[n].shape)) if n not in self.integers
                     else exact_integers(self.integers[n]) for n in spec.given}
        self.slot = {n: _symbols(n, spec.concrete_shape(i.shape)) for n, i in spec.tensors.items()
                     if i.expr is not None}
        self.upstream = {n: _symbols(n, spec.concrete_shape(i.shape), grad=True) for n, i in spec.tensors.items()
                         if i.has_gradient}
        # Tensors that may be -inf or NaN never stand as finite slot symbols in a comparison.
        finiteness = Finiteness(spec, {n: i.expr for n, i in spec.tensors.items() if i.expr is not None})
        self.risky = tuple(n for n in self.slot if finiteness.tensor(n) != FINITE)
        # local: entries in the slots of the tensors a definition reads (for the chain rule);
        # forward: the same with every risky tensor replaced by its exact entries (for values).
        self.local: dict[str, np.ndarray] = {}
        self.forward: dict[str, np.ndarray] = {}
        slotted = Evaluator(spec, SYMBOLIC)
        slotted.values = {**self.leaf, **self.slot}
        exact = Evaluator(spec, SYMBOLIC)
        exact.values = dict(slotted.values)
        for name, info in spec.tensors.items():
            if info.expr is None:
                continue
            shape = spec.concrete_shape(info.shape)
            checkpoint()
            self.local[name] = self._decided(np.asarray(slotted.evaluate(info.expr), dtype=object).reshape(shape))
            reads_risky = any(r in self.risky for r in t.tensors_read(info.expr))
            self.forward[name] = (self._decided(np.asarray(exact.evaluate(info.expr), dtype=object).reshape(shape))
                                  if reads_risky else self.local[name])
            if name in self.risky:
                exact.values[name] = self.forward[name]
                if self.case or self.integers:  # masks decided (a case, or the integer buffers given)
                    masked = np.vectorize(lambda v: v == -sympy.oo, otypes=[bool])(self.forward[name])
                    slotted.values[name] = np.where(masked, -sympy.oo, self.slot[name])
        self.exact_values = {s: v for n in self.risky for s, v in zip(self.slot[n].flat, self.forward[n].flat)}
        # Each definition's symbols once (not once per tensor it might read): the same consumers.
        reads = {c: set().union(*(free_symbols(e) for e in entries.flat if isinstance(e, sympy.Basic)))
                 for c, entries in self.local.items()}
        self.consumers = {n: [c for c in self.local if not reads[c].isdisjoint(self.values_of(n).flat)]
                          for n in spec.tensors}
        self.live = set(spec.outputs)  # tensors with a path to an output
        for name in reversed(list(spec.tensors)):
            if any(c in self.live for c in self.consumers[name]):
                self.live.add(name)
        self._truth: dict[str, np.ndarray] = {}
        self._adjoint: dict[str, np.ndarray] = {}

    def undecided_masks(self, nodes) -> bool:
        """Whether a value `nodes` read may be -inf at an entry this model does not settle: a mask
        whose comparison it does not decide (`where(X > 0, 0, -inf)` of inputs; of buffers outside a
        case), a Piecewise holding an infinity. SymPy's algebra on such entries is not float64's
        (exp(m) / exp(m) is 1 even where m is -oo), so exact identity of them is not a proof."""
        names = {n.name if isinstance(n, t.Tensor) else n.tensor
                 for n in t.depends_on(self.spec, list(nodes)) if isinstance(n, (t.Tensor, t.Entry))}
        infinities = (sympy.oo, -sympy.oo, sympy.zoo, sympy.nan)
        for name in names:
            if name not in self.risky:
                continue
            for v in self.forward[name].flat:
                if isinstance(v, sympy.Basic) and v.has(sympy.Piecewise) and any(v.has(x) for x in infinities):
                    return True
        return False

    def _decided(self, entries: np.ndarray) -> np.ndarray:
        """Entries with the case's comparisons decided (no case: as they are)."""
        if not self.case:
            return entries
        return np.vectorize(lambda v: v.xreplace(self.case) if isinstance(v, sympy.Basic) else v,
                            otypes=[object])(entries)

    def values_of(self, name: str) -> np.ndarray:
        """The symbols standing for a tensor's entries (leaf symbols or slots)."""
        return self.leaf[name] if name in self.leaf else self.slot[name]

    def _tick(self, what: str) -> None:
        checkpoint()
        if self.progress:
            progress.detail(f"element level: {what}")

    # --- exact gradients ----------------------------------------------------------------

    def ground_truth(self, name: str) -> np.ndarray:
        """grad(T) entry by entry, in the gradient symbols of T's consumers and forward slots.

        For an output this is its upstream gradient grad(O), as claims write it; see `adjoint`.
        """
        if name in self.spec.outputs:
            return self.upstream[name]
        if name not in self._truth:
            self._truth[name] = self._paths(name)
        return self._truth[name]

    def adjoint(self, name: str) -> np.ndarray:
        """dL/dT: what the chain rule carries into T's definition. For an output that other
        tensors read, its upstream gradient plus every path through them."""
        if name not in self.spec.outputs:
            if name not in self.live:  # no path to an output: L does not depend on it
                return np.zeros(self.upstream[name].shape, dtype=object) + sympy.Integer(0)
            return self.upstream[name]
        if name not in self._adjoint:
            paths = self._paths(name) if self.consumers[name] else None
            self._adjoint[name] = self.upstream[name] if paths is None else self.upstream[name] + paths
        return self._adjoint[name]

    def _paths(self, name: str) -> np.ndarray:
        """Sum over consumers C of T, entries c: grad(C)[c] * d local[C][c] / d slot[T]."""
        shape = self.spec.concrete_shape(self.spec.tensors[name].shape)
        result = np.zeros(shape, dtype=object) if shape else np.array(sympy.Integer(0), dtype=object)
        own = self.values_of(name)
        position = {s: idx for idx, s in np.ndenumerate(own)}
        # every entry's terms, summed once at the end: `+=` would rebuild the growing sum per term
        terms: dict[tuple, list] = {}
        for consumer in self.consumers[name]:
            self._tick(f"d{consumer}/d{name}")
            definition = self.spec.tensors[consumer].expr
            # max or min of one tensor's entries along an axis: each line is Max of distinct slots, and its
            # gradient is shared among ties (the language's convention), not SymPy's Heaviside
            derivative = extreme_diff if (isinstance(definition, t.Reduce) and definition.kind in ("max", "min")
                                          and isinstance(definition.x, t.Tensor)) else entry_diff
            bars = np.broadcast_to(np.asarray(self.adjoint(consumer), dtype=object), self.local[consumer].shape)
            for c_index, entry in np.ndenumerate(self.local[consumer]):
                if not isinstance(entry, sympy.Basic):
                    continue
                for sym in free_symbols(entry) & position.keys():
                    terms.setdefault(position[sym], []).append(bars[c_index] * derivative(entry, sym))
        for index, parts in terms.items():
            result[index] = sympy.Add(*parts)
        return np.asarray(result, dtype=object)

    # --- exact comparison ------------------------------------------------------------------

    def _grad_unfolding(self) -> list[tuple[dict, str]]:
        """Substitutions grad(T) -> ground truth, earliest tensor first (outputs stay symbols)."""
        out = []
        for name in self.upstream:
            if name in self.spec.outputs:
                continue
            truth = self.ground_truth(name)
            out.append(({s: v for s, v in zip(self.upstream[name].flat, truth.flat)}, f"grad({name})"))
        return out

    def _forward_unfolding(self) -> list[tuple[dict, str]]:
        """Substitutions slot -> local formula, latest tensor first (risky tensors are always
        substituted by their exact entries, so they are not a stage of their own)."""
        return [({s: v for s, v in zip(self.slot[n].flat, self.forward[n].flat)}, n)
                for n in reversed(list(self.local)) if n not in self.risky]

    def _exact(self, entry):
        """An entry with every risky slot replaced by its exact value (-oo where masked)."""
        entry = sympy.sympify(entry)
        if self.exact_values and free_symbols(entry) & self.exact_values.keys():
            return entry.xreplace(self.exact_values)
        return entry

    def identical(self, a: np.ndarray, b: np.ndarray, unfold_grads: bool = True,
                  as_rational_functions: bool = False) -> tuple[bool, list[str]]:
        """(True, unfolded) if a == b entry by entry, exactly, under float64 semantics
        (see the module docstring); (False, ...) if not shown. With `as_rational_functions`, a
        weaker comparison that the caller must state: radicals are positive roots
        (`relations.radicals_as_roots`), so points where a value is NaN or infinite are not compared."""
        a, b = np.broadcast_arrays(np.asarray(a, dtype=object), np.asarray(b, dtype=object))
        unfolded: list[str] = []
        stages = (self._grad_unfolding() if unfold_grads else []) + self._forward_unfolding()
        exact = (lambda x: radicals_as_roots(self._exact(x))) if as_rational_functions else self._exact
        pending = [(exact(x), exact(y)) for x, y in zip(a.flat, b.flat)]
        pending = [(x, y) for x, y in pending if not same_entry(x, y)]
        for mapping, label in stages:
            if not pending:
                break
            keys = set(mapping)
            if not any(keys & (free_symbols(x) | free_symbols(y)) for x, y in pending):
                continue
            self._tick(f"unfolding {label}")
            unfolded.append(label)
            replace = shared_xreplace(mapping)
            pending = [(exact(replace(x)), exact(replace(y))) for x, y in pending]
            pending = [(x, y) for x, y in pending if not same_entry(x, y)]
        return (not pending), unfolded

    # --- concrete values -------------------------------------------------------------------

    def point(self, values: Mapping[str, np.ndarray], upstream: Mapping[str, np.ndarray],
              digits: int = 30) -> dict:
        """Every slot and gradient symbol at concrete inputs, in mpmath at `digits` digits,
        with float64's answers for -inf, NaN and division by zero.

        Forward slots are computed in definition order from the exact formulas,
        then gradient symbols in reverse order from the exact chain rule.
        """
        with mpmath.workdps(digits + 10):
            subs: dict = {}
            for name, array in values.items():
                for sym, v in zip(self.leaf[name].flat, np.asarray(array, dtype=object).flat):
                    subs[sym] = mpmath.mpf(sympy.Rational(v).p) / sympy.Rational(v).q
            for name, array in upstream.items():
                for sym, v in zip(self.upstream[name].flat, np.asarray(array, dtype=object).flat):
                    subs[sym] = mpmath.mpf(sympy.Rational(v).p) / sympy.Rational(v).q
            for name, entries in self.forward.items():
                memo: dict = {}
                for sym, entry in zip(self.slot[name].flat, entries.flat):
                    subs[sym] = mp_value(sympy.sympify(entry), subs, memo)
            for name in reversed(list(self.upstream)):
                if name in self.spec.outputs:
                    continue
                memo = {}
                for sym, entry in zip(self.upstream[name].flat, self.ground_truth(name).flat):
                    subs[sym] = mp_value(sympy.sympify(entry), subs, memo)
        return subs

    def evaluate_at(self, entries: np.ndarray, subs: Mapping, digits: int = 30) -> np.ndarray:
        """Entries (written in any slots and gradient symbols) at a point from `point`."""
        out = np.asarray(entries, dtype=object)
        with mpmath.workdps(digits + 10):
            memo: dict = {}
            values = [mp_value(sympy.sympify(e), dict(subs), memo) for e in out.flat]
        return np.array(values, dtype=object).reshape(out.shape)
