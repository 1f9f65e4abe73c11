"""Sizes that keep a spec valid and fit a budget: the size guard of numeric work.

Dims are symbols at the matrix level, but anything that builds arrays (the
reference evaluator behind `verify`, the counterexample searches, the element
level) works at concrete sizes, and a spec's default size may be huge
(`dim N = 1000000000`). This module picks smaller sizes for such work.

Contract:
- `constraints(spec)` lists every dim expression the spec relies on: the shape
  of every tensor and of every subexpression (claims included), the range of
  every index, the bounds of slices, the head count of `split_heads` and the
  arguments of constants, each with the least value it may take (1, or 0 for
  a slice's start). Division of dims is exact: `d / h` needs h to divide d,
  and `(N + 1) / 2` an odd N. Validation checks them at the spec's sizes;
  sizes chosen here keep every one of them.
- `valid_sizes(spec, sizes)` is True when every constraint holds at `sizes`.
- `entries(spec, sizes)` is the number of array entries the spec's tensors
  and their subexpressions hold at `sizes`, each once (index notation counted
  over its indices and the indices it sums over): a rough measure of the
  memory and time of evaluating the spec once.
- `fit_sizes(spec, budget, sizes=None, fixed=(), at_least=None,
  fixed_budget=None)` returns a `SizeChoice`: `sizes` (default the spec's)
  unchanged when they are valid and `entries` is within `budget`; otherwise
  smaller ones, found the way the element level's guard does it, by halving
  the largest dim until the work fits, each step moved to the nearest valid
  sizes (so split_heads stays divisible). Dims in `fixed` (sizes the user
  gave with `--dim`) stand while the work is within `fixed_budget` (default
  `budget`), and beyond it give way only when shrinking the other dims is not
  enough; no dim goes below `at_least[name]` (default 1).
  `SizeChoice.note(what)` is the line that says what was chosen:
  `verify at N=64 instead of N=1000000000 (size guard)`.
- `user_sizes(spec)` names the dims whose size is not the spec's default
  (given with `--dim`): what callers pass as `fixed`.
- `repair(spec, sizes, movable)` returns the valid sizes nearest to `sizes`
  that change only dims in `movable`, or None when none is near.
Nothing here allocates an array: sizes are evaluated in exact integer
arithmetic.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from fractions import Fraction
from typing import Callable, Iterable, Mapping

import sympy

from . import typed as t

__all__ = ["Constraint", "SizeChoice", "constraints", "valid_sizes", "entries", "fit_sizes", "repair",
           "user_sizes", "reads_sizes", "VERIFY_BUDGET", "SEARCH_BUDGET"]

# Entries of every array at once. verify's finite differences run the reference forward pass twice per
# leaf entry, so its budget is small; a counterexample search evaluates a few forward passes only.
VERIFY_BUDGET = 20_000
SEARCH_BUDGET = 1_000_000

_REPAIR_TRIES = 4_000  # candidate sizes a repair looks at before giving up


@dataclass(frozen=True)
class Constraint:
    """A dim expression the spec relies on, and the least value it may take."""

    dim: sympy.Expr
    least: int
    where: str  # what it sizes, for messages: "the shape of S", "the range of index i"


@dataclass(frozen=True)
class SizeChoice:
    sizes: dict[str, int]       # the sizes to work at
    requested: dict[str, int]   # the sizes asked for
    entries: int                # entries(spec, sizes)
    budget: int

    @property
    def shrunk(self) -> bool:
        return self.sizes != self.requested

    def where(self) -> str:
        """`at N=64 instead of N=1000000000 (size guard)`, or `at N=4, d=3` when nothing changed."""
        if not self.shrunk:
            return "at " + ", ".join(f"{k}={v}" for k, v in self.sizes.items())
        changed = [k for k in self.sizes if self.sizes[k] != self.requested[k]]
        now = ", ".join(f"{k}={self.sizes[k]}" for k in changed)
        before = ", ".join(f"{k}={self.requested[k]}" for k in changed)
        return f"at {now} instead of {before} (size guard)"

    def note(self, what: str) -> str:
        """`verify at N=64 instead of N=1000000000 (size guard)`, or '' when nothing changed."""
        return f"{what} {self.where()}" if self.shrunk else ""


# --- exact evaluation of dim expressions ----------------------------------------------------


def _compile(expr) -> Callable[[Mapping[str, int]], Fraction]:
    """A dim expression as a function of the sizes, in exact rational arithmetic."""
    expr = sympy.sympify(expr)
    if expr.is_Integer:
        value = Fraction(int(expr))
        return lambda sizes: value
    if expr.is_Rational:
        value = Fraction(int(expr.p), int(expr.q))
        return lambda sizes: value
    if expr.is_Symbol:
        name = expr.name
        return lambda sizes: Fraction(sizes[name])
    if expr.is_Add or expr.is_Mul:
        parts = [_compile(a) for a in expr.args]
        if expr.is_Add:
            return lambda sizes: sum((p(sizes) for p in parts), Fraction(0))

        def product(sizes):
            out = Fraction(1)
            for p in parts:
                out *= p(sizes)
            return out
        return product
    if expr.is_Pow and expr.exp.is_Integer:
        base, exp = _compile(expr.base), int(expr.exp)

        def power(sizes):
            b = base(sizes)
            return b**exp if b != 0 or exp >= 0 else Fraction(0)  # 0 ** -1: no valid size anyway
        return power
    symbols = sorted(expr.free_symbols, key=str)

    def general(sizes):  # anything else (not made by validation today): SymPy, exactly
        value = expr.xreplace({s: sympy.Integer(sizes[s.name]) for s in symbols})
        return Fraction(int(value.p), int(value.q)) if value.is_Rational else Fraction(-1)
    return general


def _nodes(spec: t.TypedSpec) -> list[t.Node]:
    roots = [info.expr for info in spec.tensors.values() if info.expr is not None]
    roots += [side for check in spec.checks for side in (check.lhs, check.rhs) if side is not None]
    seen: dict[t.Node, None] = {}
    for root in roots:
        for node in t.walk(root):
            seen.setdefault(node)
    return list(seen)


def constraints(spec: t.TypedSpec) -> list[Constraint]:
    """Every dim expression the spec relies on (see the module docstring), each once."""
    found: dict[tuple, Constraint] = {}

    def add(dim, least: int, where: str) -> None:
        dim = sympy.sympify(dim)
        if dim.is_Integer and dim >= least:
            return
        found.setdefault((dim, least), Constraint(dim, least, where))

    for name, info in spec.tensors.items():
        for d in info.shape:
            add(d, 1, f"the shape of {name}")
    for node in _nodes(spec):
        for d in getattr(node, "shape", ()):
            add(d, 1, f"a {type(node).__name__} shape")
        if isinstance(node, t.IndexDef):
            for index in node.indices:
                add(index.range, 1, f"the range of index {index.name}")
        elif isinstance(node, t.IndexSum):
            add(node.index.range, 1, f"the range of index {node.index.name}")
        elif isinstance(node, t.Slice):
            add(node.start, 0, "the start of a slice")
            add(node.stop, 1, "the end of a slice")
        elif isinstance(node, t.SplitHeads):
            add(node.heads, 1, "the head count of split_heads")
        elif isinstance(node, t.Constant):
            for a in node.args:
                add(a, 1, f"an argument of {node.kind}")
    return list(found.values())


class _Model:
    """A spec's constraints and array shapes, compiled once for many size trials."""

    def __init__(self, spec: t.TypedSpec) -> None:
        self.names = list(spec.dims)
        found = constraints(spec)
        self.checks = [(_compile(c.dim), c.least) for c in found]
        self.reads = [{s.name for s in c.dim.free_symbols} for c in found]  # the dims each one reads
        shapes: list[tuple] = [info.shape for info in spec.tensors.values()]
        named = {info.expr for info in spec.tensors.values() if info.expr is not None}  # counted just above
        for node in _nodes(spec):
            if node in named or isinstance(node, (t.Tensor, t.Grad)):
                continue
            if isinstance(node, t.IndexDef):
                summed = [n.index.range for n in t.walk(node.body) if isinstance(n, t.IndexSum)]
                shapes.append(tuple(i.range for i in node.indices) + tuple(summed))
            elif not isinstance(node, (t.Entry, t.IndexVar, t.IndexSum)) and getattr(node, "shape", ()):
                shapes.append(tuple(node.shape))
        self.shapes = [[_compile(d) for d in shape] for shape in shapes]

    @staticmethod
    def _holds(check, sizes: Mapping[str, int]) -> bool:
        value, least = check
        v = value(sizes)
        return v.denominator == 1 and v >= least

    def broken(self, sizes: Mapping[str, int]) -> list[int]:
        """The constraints that do not hold at `sizes`, by position."""
        return [k for k, check in enumerate(self.checks) if not self._holds(check, sizes)]

    def valid(self, sizes: Mapping[str, int]) -> bool:
        return all(self._holds(check, sizes) for check in self.checks)

    def entries(self, sizes: Mapping[str, int]) -> int:
        total = 0
        for shape in self.shapes:
            count = 1
            for d in shape:
                count *= max(int(d(sizes)), 0)
            total += count
        return total

    def repair(self, sizes: Mapping[str, int], movable: Iterable[str],
               at_least: Mapping[str, int]) -> dict[str, int] | None:
        sizes = dict(sizes)
        broken = self.broken(sizes)
        if not broken:
            return sizes
        movable = [n for n in self.names if n in set(movable)]
        involved = [n for n in movable if any(n in self.reads[k] for k in broken)]
        for group in (involved, movable) if involved != movable else (movable,):
            found = self._nearest(sizes, group, at_least)
            if found is not None:
                return found
        return None

    def _nearest(self, sizes: dict[str, int], movable: list[str],
                 at_least: Mapping[str, int]) -> dict[str, int] | None:
        """The valid sizes nearest to `sizes` (L1 distance, smaller sizes first) moving only `movable`."""
        if not movable:
            return None
        tries = 0
        for distance in itertools.count(1):
            for offsets in _offsets(len(movable), distance):
                trial = dict(sizes)
                for name, delta in zip(movable, offsets):
                    trial[name] = sizes[name] + delta
                if any(trial[n] < at_least.get(n, 1) for n in movable):
                    continue
                tries += 1
                if self.valid(trial):
                    return trial
                if tries >= _REPAIR_TRIES:  # each distance has a candidate (all offsets up): this ends it
                    return None
        return None


def _offsets(count: int, distance: int):
    """Integer vectors of `count` entries with sum |x| == distance, those with a smaller sum first."""
    vectors = []

    def split(left: int, remaining: int, prefix: tuple):
        if left == 1:
            for sign in ((-1, 1) if remaining else (1,)):
                vectors.append(prefix + (sign * remaining,))
            return
        for k in range(remaining + 1):
            for sign in ((-1, 1) if k else (1,)):
                split(left - 1, remaining - k, prefix + (sign * k,))

    split(count, distance, ())
    vectors.sort(key=sum)
    return vectors


# --- the public functions -------------------------------------------------------------------


def user_sizes(spec: t.TypedSpec) -> list[str]:
    """The dims whose size is not the spec's default: given with --dim."""
    return [name for name, info in spec.dims.items() if spec.sizes[name] != info.default]


def valid_sizes(spec: t.TypedSpec, sizes: Mapping[str, int]) -> bool:
    return _Model(spec).valid(sizes)


def entries(spec: t.TypedSpec, sizes: Mapping[str, int] | None = None) -> int:
    return _Model(spec).entries(dict(sizes or spec.sizes))


def repair(spec: t.TypedSpec, sizes: Mapping[str, int], movable: Iterable[str] | None = None,
           at_least: Mapping[str, int] | None = None) -> dict[str, int] | None:
    """The valid sizes nearest to `sizes` changing only `movable` dims (default all), or None."""
    return _Model(spec).repair(sizes, spec.dims if movable is None else movable, at_least or {})


def fit_sizes(spec: t.TypedSpec, budget: int, sizes: Mapping[str, int] | None = None,
              fixed: Iterable[str] = (), at_least: Mapping[str, int] | None = None,
              fixed_budget: int | None = None) -> SizeChoice:
    """Sizes whose work fits `budget` entries (see the module docstring).

    With dims in `fixed` (sizes the user asked for), the requested sizes are kept
    as they are while their work is within `fixed_budget` (default `budget`):
    the user's sizes win unless they are huge too.
    """
    model = _Model(spec)
    requested = {name: int((sizes or spec.sizes)[name]) for name in spec.dims}
    at_least = {name: max((at_least or {}).get(name, 1), 1) for name in spec.dims}
    fixed = [n for n in spec.dims if n in set(fixed)]
    movable = [n for n in spec.dims if n not in fixed]
    current = model.repair(requested, movable, at_least) or requested
    work = model.entries(current)
    if work <= budget or (fixed and work <= (fixed_budget or budget)):
        return SizeChoice(current, requested, work, budget)
    # The user's sizes give way only when the rest is not enough; and when it is not, every dim shrinks
    # from the largest down (not the others to 1 first).
    floor = model.repair({n: (at_least[n] if n in movable else current[n]) for n in spec.dims}, movable, at_least)
    enough = floor is not None and model.entries(floor) <= budget
    for phase in ((movable, list(spec.dims)) if enough else (list(spec.dims),)):
        stuck: set[str] = set()
        while work > budget:
            candidates = [n for n in phase if n not in stuck and current[n] > at_least[n]]
            if not candidates:
                break
            biggest = max(candidates, key=lambda n: current[n])
            trial = dict(current)
            trial[biggest] = max(at_least[biggest], current[biggest] // 2)
            trial = model.repair(trial, phase, at_least)
            if trial is None or model.entries(trial) >= work:
                stuck.add(biggest)
                continue
            current, work = trial, model.entries(trial)
        if work <= budget:
            break
    return SizeChoice(current, requested, work, budget)


def reads_sizes(spec: t.TypedSpec, nodes: Iterable[t.Node]) -> bool:
    """Whether values computed from `nodes` depend on the sizes themselves, not only on which
    entries exist: a dim used as a value, a mean, an index value, a sinusoidal table, in the
    nodes or any definition they read (every definition, when they read a gradient), a subscript
    or a slice bound with a dim term (which entry `b[j - i + N - 1]` or `X[N - 1:N]` reads moves
    with N). Work on such values at sizes `fit_sizes` picked answers another question than at
    the spec's."""
    return any(isinstance(n, (t.DimValue, t.IndexVar)) or (isinstance(n, t.Reduce) and n.kind == "mean")
               or (isinstance(n, t.Constant) and n.kind == "sinusoidal") or _sized_subscripts(n)
               for n in t.depends_on(spec, nodes))


def _sized_subscripts(node: t.Node) -> bool:
    if isinstance(node, t.Slice):
        return bool(sympy.sympify(node.start).free_symbols or sympy.sympify(node.stop - node.x.shape[node.axis])
                    .free_symbols)
    subscripts = node.indices if isinstance(node, t.Entry) else node.targets if isinstance(node, t.Scatter) else ()
    return any(isinstance(s, t.Affine) and s.offset.free_symbols for s in subscripts)
