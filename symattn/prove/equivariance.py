"""Permutation equivariance and invariance: a proof for every size, or a counterexample.

Contract: `check_symmetry(spec, check)` answers `equivariant(O, X[, D])` and
`invariant(O, Y[, D])` with a `verdicts.Verdict`; X may be a group of given
tensors, `(X, keep)`, permuted together by the same Pi (which axes:
`symmetry_evidence.permuted_axes`, shared by every level). Every given tensor
the claim does not name stays fixed: `equivariant(O, X)` leaves a mask buffer
where it is.

- the general proof, at the matrix level with D symbolic: every tensor gets a
  transformation type under a permutation matrix Pi acting on D, the set of
  axis patterns (which axes of size D are permuted) it is consistent with.
  Each operation has a rule naming the lemma it rests on (`LEMMAS`); the
  chain of rule applications is the proof, ending in `O(Pi X) = Pi O(X)` or
  `O(Pi Y) = O(Y)`. Where no rule applies the proof stops and says why;
- a second, independent witness at the spec's sizes: the exact element-level
  identity for the two generators of the symmetric group (a transposition and
  an n-cycle), which together give every permutation at that size;
- when the proof fails, a counterexample: a permutation and exact small
  inputs at which the two sides differ by a clearly separated amount, with
  both values, re-runnable with NumPy. The search runs at the spec's sizes,
  or at smaller ones the size guard picks (`sizes.fit_sizes`) when those
  are too large to build arrays at, and the verdict says which. Only a
  counterexample refutes; a failed proof without one is `unknown`.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from functools import singledispatch

import sympy

from ..ir import typed as t
from .verdicts import Verdict
from ..ir.index_scope import scope_sum_indices
from ..ir.printing import to_spec
from ..ir.shapes import ONE, same_dim
from ..ir.sizes import reads_sizes
from .symmetry_evidence import element_witness, find_counterexample, permuted_axes, search_sizes

__all__ = ["Lemma", "LEMMAS", "Blocks", "ProofStep", "prove_symmetry", "check_symmetry", "element_witness",
           "find_counterexample", "search_sizes"]

Pattern = tuple  # per axis: False (unchanged), True (permuted by Pi) or Blocks (concat along the axis)


@dataclass(frozen=True)
class Blocks:
    """An axis joined by concat from parts, each of `width` entries, permuted by Pi or not: the
    block-diagonal permutation diag(Pi, I, ...) of the whole axis. Equal Blocks are the same
    permutation matrix (the same widths and flags), so they cancel in a contraction as Pi does;
    any rule that asks whether an axis is permuted (truthiness) sees a Blocks as permuted."""

    parts: tuple[tuple[sympy.Expr, bool], ...]

    def __str__(self) -> str:
        return "diag(" + ", ".join("Pi" if moved else f"I_{width}" for width, moved in self.parts) + ")"

    def __lt__(self, other) -> bool:  # patterns are sorted for display: bools first, then Blocks by text
        return isinstance(other, Blocks) and str(self) < str(other)

    def __gt__(self, other) -> bool:
        return not isinstance(other, Blocks) or str(self) > str(other)


@dataclass(frozen=True)
class Lemma:
    name: str
    statement: str


LEMMAS = {
    "leaf": Lemma("leaf", "the claim permutes X along D; every other input and param is unchanged"),
    "group": Lemma("group", "the claim permutes every axis of size D of every tensor of its group by the same "
                            "Pi (a mask M [D, D] becomes Pi M Pi^T); every other input, param and buffer is "
                            "unchanged"),
    "matmul": Lemma("matmul", "(Pi A) @ B = Pi (A @ B),  A @ (B Pi^T) = (A @ B) Pi^T,  "
                              "(A Pi^T) @ (Pi B) = A @ B since Pi^T Pi = I"),
    "transpose": Lemma("transpose", "(Pi A Sigma^T)^T = Sigma A^T Pi^T"),
    "elementwise": Lemma("elementwise", "an elementwise function commutes with a permutation: "
                                         "f(Pi A, Pi B) = Pi f(A, B), broadcasting included"),
    "softmax": Lemma("softmax", "softmax(Pi S Sigma^T) = Pi softmax(S) Sigma^T along either axis"),
    "reduce": Lemma("reduce", "a sum (mean, logsumexp, max, min) over a permuted axis is unchanged: "
                              "sum(A Pi^T, axis=-1) = sum(A, axis=-1)"),
    "scan": Lemma("scan", "cumsum along an axis that is not permuted commutes with permuting the others: "
                          "cumsum(Pi A, axis=-1) = Pi cumsum(A, axis=-1)"),
    "heads": Lemma("heads", "merge_heads and split_heads move whole rows: they commute with permuting N"),
    "concat": Lemma("concat", "concat(Pi A, Pi B) = Pi concat(A, B) along an axis that is not permuted"),
    "blocks": Lemma("blocks", "along the joined axis, concat(Pi A, B) = diag(Pi, I) concat(A, B): a permutation of "
                              "that axis, block by block, which cancels against the same diag(Pi, I) in a "
                              "contraction and commutes with softmax and sums along it, as Pi does; a slice of whole "
                              "blocks is permuted as those blocks are"),
    "slice": Lemma("slice", "a slice along an axis that is not permuted commutes with the permutation: "
                            "(Pi A)[:, a:b] = Pi (A[:, a:b])"),
    "constant": Lemma("constant", "ones(...) is unchanged by any permutation; Pi eye Pi^T = eye"),
    "index": Lemma("index", "index notation commutes with relabeling a permuted index "
                            "when the entry formula does not use the index values themselves"),
}


@dataclass(frozen=True)
class ProofStep:
    """One rule application: tensor, its transformation, the lemma used."""

    tensor: str
    lemma: str
    statement: str


class _Broken(Exception):
    """No rule applies; `reason` says why, in the spec's terms."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class _Types:
    """Transformation types of the tensors: sets of axis patterns."""

    def __init__(self, spec: t.TypedSpec, symbol: sympy.Symbol) -> None:
        self.spec = spec
        self.symbol = symbol
        self.types: dict[str, frozenset[Pattern]] = {}
        self.fixed_because: dict[str, str] = {}  # why a tensor with a D axis cannot move
        self.sources: tuple[str, ...] = ()  # the given tensors the claim permutes
        self.dims = list(spec.dims)

    def can_permute(self, dim) -> bool:
        return same_dim(dim, self.symbol)

    def every(self, shape) -> frozenset[Pattern]:
        """All patterns: for tensors that any permutation leaves unchanged."""
        choices = [(False, True) if self.can_permute(d) else (False,) for d in shape]
        return frozenset(itertools.product(*choices))

    def text(self, node: t.Node) -> str:
        return to_spec(node, self.dims)


def _none(shape) -> Pattern:
    return (False,) * len(shape)


def _broadcast(operands: list[tuple[tuple, Pattern]], rank: int) -> Pattern | None:
    """The result pattern of a broadcasting elementwise op, or None if the operands disagree."""
    out = []
    for k in range(1, rank + 1):
        flag = None
        for shape, pattern in operands:
            if k > len(shape) or shape[-k] == ONE:
                continue
            if flag is None:
                flag = pattern[-k]
            elif flag != pattern[-k]:
                return None
        out.append(False if flag is None else flag)  # a Blocks stays a Blocks
    return tuple(reversed(out))


@singledispatch
def _rule(node, ty: _Types) -> tuple[frozenset[Pattern], str]:
    raise _Broken(f"no permutation rule for {type(node).__name__}")


@_rule.register(t.Scalar)
@_rule.register(t.DimValue)
def _(node, ty):
    return frozenset({()}), "constant"


@_rule.register
def _(node: t.Tensor, ty):
    return ty.types[node.name], "leaf"


@_rule.register
def _(node: t.Constant, ty):
    if node.kind == "ones":
        return ty.every(node.shape), "constant"
    if node.kind == "eye":
        both = (True, True) if ty.can_permute(node.shape[0]) else (False, False)
        return frozenset({(False, False), both}), "constant"
    return frozenset({_none(node.shape)}), "constant"


def _elementwise(node: t.Node, parts: list[t.Node], ty: _Types):
    sets = [_rule(p, ty)[0] for p in parts]
    out = set()
    for combo in itertools.product(*sets):
        pattern = _broadcast([(p.shape, c) for p, c in zip(parts, combo)], len(node.shape))
        if pattern is not None:
            out.add(pattern)
    if not out:
        raise _Broken(_disagreement(node, parts, sets, ty))
    return frozenset(out), "elementwise"


def _disagreement(node: t.Node, parts: list[t.Node], sets, ty: _Types) -> str:
    moved = [p for p, s in zip(parts, sets) if all(any(c) for c in s)]
    fixed = [p for p, s in zip(parts, sets) if not any(any(c) for c in s)]
    if moved and fixed:
        why = ty.fixed_because.get(fixed[0].name, "") if isinstance(fixed[0], t.Tensor) else ""
        return (f"{ty.text(fixed[0])} is not permuted with {ty.text(moved[0])} in {ty.text(node)}"
                + (f": {why}" if why else ""))
    return f"the operands of {ty.text(node)} are permuted along different axes"


@_rule.register(t.Unary)
def _(node, ty):
    return _rule(node.x, ty)[0], "elementwise"


@_rule.register(t.Binary)
@_rule.register(t.Compare)
def _(node, ty):
    return _elementwise(node, [node.a, node.b], ty)


@_rule.register
def _(node: t.Where, ty):
    return _elementwise(node, [node.cond.a, node.cond.b, node.a, node.b], ty)


@_rule.register
def _(node: t.MatMul, ty):
    # numpy.matmul: a 1-D left operand is a row [1, k], a 1-D right operand a column [k, 1],
    # and the added axis is dropped from the result.
    a, b = node.a, node.b
    a_vec, b_vec = len(a.shape) == 1, len(b.shape) == 1
    a_shape = (ONE, *a.shape) if a_vec else tuple(a.shape)
    b_shape = (*b.shape, ONE) if b_vec else tuple(b.shape)
    rank = max(len(a_shape), len(b_shape)) - 2
    out = set()
    reasons = []
    for pa, pb in itertools.product(_rule(a, ty)[0], _rule(b, ty)[0]):
        pa = (False, *pa) if a_vec else pa
        pb = (*pb, False) if b_vec else pb
        if pa[-1] != pb[-2]:
            reasons.append(f"the contracted axis of {ty.text(node)} is permuted in "
                           f"{ty.text(a if pa[-1] else b)} but not in {ty.text(b if pa[-1] else a)}")
            continue
        batch = _broadcast([(a_shape[:-2], pa[:-2]), (b_shape[:-2], pb[:-2])], rank)
        if batch is None:
            reasons.append(f"the batch axes of {ty.text(node)} are permuted differently")
            continue
        full = [*batch, pa[-2], pb[-1]]
        if b_vec:
            full.pop(-1)
        if a_vec:
            full.pop(-1 if b_vec else -2)
        out.add(tuple(full))
    if not out:
        raise _Broken(reasons[0])
    return frozenset(out), "matmul"


@_rule.register
def _(node: t.Transpose, ty):
    return frozenset((*p[:-2], p[-1], p[-2]) for p in _rule(node.x, ty)[0]), "transpose"


def _reduced(patterns, axes: set[int]) -> frozenset[Pattern]:
    return frozenset(tuple(False if k in axes else f for k, f in enumerate(p)) for p in patterns)


@_rule.register
def _(node: t.Reduce, ty):
    axes = set(range(len(node.x.shape))) if node.axis is None else {node.axis}
    return _reduced(_rule(node.x, ty)[0], axes), "reduce"


@_rule.register
def _(node: t.Scan, ty):
    patterns = frozenset(p for p in _rule(node.x, ty)[0] if not p[node.axis])
    if not patterns:
        raise _Broken(f"{ty.text(node)}: the scanned axis is permuted, and a prefix sum depends on the order")
    return patterns, "scan"


@_rule.register
def _(node: t.SumTo, ty):
    patterns = _rule(node.x, ty)[0]
    lead = len(node.x.shape) - len(node.shape)
    kept = _reduced(patterns, set(node.axes))
    return frozenset(p[lead:] for p in kept), "reduce"


@_rule.register
def _(node: t.Softmax, ty):
    return _rule(node.x, ty)[0], "softmax"


@_rule.register
def _(node: t.MergeHeads, ty):
    out = set()
    for p in _rule(node.x, ty)[0]:
        if p[-3] or p[-1]:
            continue
        out.add((*p[:-3], p[-2], False))
    if not out:
        raise _Broken(f"{ty.text(node)}: the head or width axis is permuted, so merging heads mixes it")
    return frozenset(out), "heads"


@_rule.register
def _(node: t.SplitHeads, ty):
    out = set()
    for p in _rule(node.x, ty)[0]:
        if p[-1]:
            continue
        out.add((*p[:-2], False, p[-2], False))
    if not out:
        raise _Broken(f"{ty.text(node)}: the axis being split is permuted")
    return frozenset(out), "heads"


@_rule.register
def _(node: t.Concat, ty):
    out, lemma, axis = set(), "concat", node.axis
    for combo in itertools.product(*[_rule(p, ty)[0] for p in node.parts]):
        if len({p[:axis] + p[axis + 1:] for p in combo}) != 1:
            continue  # the other axes must move alike
        if not any(p[axis] for p in combo):
            out.add(combo[0])
            continue
        blocks = []  # the joined axis: each part's block, permuted as that part is
        for part, p in zip(node.parts, combo):
            blocks.extend(p[axis].parts if isinstance(p[axis], Blocks) else [(part.shape[axis], bool(p[axis]))])
        out.add(combo[0][:axis] + (Blocks(tuple(blocks)),) + combo[0][axis + 1:])
        lemma = "blocks"
    if not out:
        raise _Broken(f"{ty.text(node)}: the parts are permuted along different axes")
    return frozenset(out), lemma


def _sliced_blocks(flag: Blocks, start, stop):
    """The blocks of a joined axis between `start` and `stop` when those are block boundaries
    (one block: its own flag), else None."""
    offset, first, kept = sympy.Integer(0), None, []
    for width, moved in flag.parts:
        if same_dim(offset, start):
            first = len(kept)
        kept.append((width, moved))
        offset = offset + width
        if first is not None and same_dim(offset, stop):
            chosen = tuple(kept[first:])
            return chosen[0][1] if len(chosen) == 1 else Blocks(chosen)
    return None


@_rule.register
def _(node: t.Slice, ty):
    out, lemma = set(), "slice"
    for p in _rule(node.x, ty)[0]:
        flag = p[node.axis]
        if isinstance(flag, Blocks):  # whole blocks of a joined axis: their own permutation
            flag, lemma = _sliced_blocks(flag, node.start, node.stop), "blocks"
            if flag is not None:
                out.add(p[:node.axis] + (flag,) + p[node.axis + 1:])
        elif not flag:
            out.add(p)
    if not out:
        raise _Broken(f"{ty.text(node)}: the sliced axis is permuted")
    return frozenset(out), lemma


@_rule.register
def _(node: t.IndexDef, ty):
    return _index_rule(node, ty), "index"


def _index_uses(node: t.Node):
    """(entries, names whose values are used) in an index-notation body."""
    nodes, stack = [], [node]
    while stack:  # every node, and those inside computed subscripts (`offsets[doc[i]]` reads doc too)
        for n in t.walk(stack.pop()):
            nodes.append(n)
            if isinstance(n, t.Entry):
                stack.extend(s for s in n.indices if isinstance(s, t.Node))
    values = {n.name for n in nodes if isinstance(n, t.IndexVar)}
    values |= {i for n in nodes if isinstance(n, t.Entry) for s in n.indices if not isinstance(s, str)
               for i in t.subscript_names(s)}  # a computed subscript uses its indices' values
    return [n for n in nodes if isinstance(n, t.Entry)], values


def _index_rule(node: t.IndexDef, ty: _Types) -> frozenset[Pattern]:
    node = scope_sum_indices(node)  # sibling sums may reuse a name for different axes
    entries, values = _index_uses(node.body)
    tensors = sorted({e.tensor for e in entries})
    lhs = [i.name for i in node.indices]
    out = set()
    reason = None
    for combo in itertools.product(*[ty.types[n] for n in tensors]):
        chosen = dict(zip(tensors, combo))
        flags: dict[str, bool] = {}
        ok = True
        for entry in entries:
            for axis, index in enumerate(entry.indices):
                flag = chosen[entry.tensor][axis]
                if not isinstance(index, str):  # an Affine or integer-node subscript: a computed position
                    if flag:
                        ok = False
                        reason = (f"axis {axis} of {entry.tensor} is permuted but read at the position "
                                  f"{to_spec(index, ty.dims) if isinstance(index, t.Node) else index}")
                    continue
                if flags.setdefault(index, flag) != flag:
                    ok = False
                    reason = (f"index {index} is used along a permuted axis of {entry.tensor} in one place "
                              "and an unpermuted axis in another")
        if not ok:
            continue
        used = [i for i in values if flags.get(i)]
        if used:
            reason = (f"the entry formula of this tensor uses the value of index {used[0]}, "
                      "so it does not commute with permuting it")
            continue
        free = [i for i in lhs if i not in flags and i not in values
                and ty.can_permute(node.indices[lhs.index(i)].range)]
        for extra in itertools.product((False, True), repeat=len(free)):
            merged = {**flags, **dict(zip(free, extra))}
            out.add(tuple(merged.get(i, False) for i in lhs))
    if not out:
        raise _Broken(reason or "no consistent permutation of the indices")
    return frozenset(out)


def _describe(name: str, pattern: Pattern, shape) -> str:
    """`Pi Q`, `Q Pi^T`, `Pi P Pi^T`, `Q` or `Q permuted along axis 1`."""
    if not any(pattern):
        return name
    if any(isinstance(f, Blocks) for f in pattern):
        axes = ", ".join(f"axis {k} by {f if isinstance(f, Blocks) else 'Pi'}" for k, f in enumerate(pattern) if f)
        return f"{name} permuted along {axes}"
    if len(shape) >= 2 and not any(pattern[:-2]):
        left = "Pi " if pattern[-2] else ""
        right = " Pi^T" if pattern[-1] else ""
        return f"{left}{name}{right}"
    if len(shape) == 1:
        return f"Pi {name}"
    axes = ", ".join(str(k) for k, f in enumerate(pattern) if f)
    return f"{name} permuted along ax{'es' if ',' in axes else 'is'} {axes}"


def _definition(name: str, expr: t.Node, ty: _Types) -> str:
    if isinstance(expr, t.IndexDef):
        return f"{name}[{', '.join(i.name for i in expr.indices)}] = {to_spec(expr.body, ty.dims)}"
    return f"{name} = {to_spec(expr, ty.dims)}"


def _fixed_reason(name: str, expr: t.Node, ty: _Types) -> str:
    """Why a tensor that has an axis of size D stays put under the permutation."""
    if isinstance(expr, t.IndexDef):
        _, values = _index_uses(expr.body)
        if values:
            used = ", ".join(sorted(values))
            return (f"{name}[{', '.join(i.name for i in expr.indices)}] = {to_spec(expr.body, ty.dims)} "
                    f"uses the values of its indices ({used}), i.e. positions")
    if isinstance(expr, t.Constant) and expr.kind in ("sinusoidal", "causal_mask"):
        return f"{name} = {to_spec(expr, ty.dims)} depends on the position itself, not on the permuted data"
    held = [r for r in sorted(_reads(expr)) if r in ty.fixed_because and ty.spec.tensors[r].kind == "buffer"
            and any(ty.can_permute(d) for d in ty.spec.tensors[r].shape)]
    if held:
        return (f"{name} is computed from {held[0]}, a buffer the claim does not permute; name it with the "
                f"permuted tensors to move it too, as in ({', '.join([*ty.sources, held[0]])})")
    return f"{name} does not depend on the permuted input"


@dataclass
class SymmetryProof:
    holds: bool
    steps: list[ProofStep]
    reason: str | None = None
    broken_at: str | None = None


def _reads(expr: t.Node) -> set[str]:
    """The tensors an expression reads (by name or by entry)."""
    names, stack = set(), [expr]
    while stack:
        n = stack.pop()
        if isinstance(n, t.Tensor):
            names.add(n.name)
        elif isinstance(n, t.Entry):
            names.add(n.tensor)
            stack.extend(s for s in n.indices if isinstance(s, t.Node))  # offsets[doc[i]] reads doc too
        stack.extend(n.children)
    return names


def _needed(spec: t.TypedSpec, output: str) -> set[str]:
    """The output and every tensor it depends on: only these take part in the proof."""
    needed, todo = set(), [output]
    while todo:
        name = todo.pop()
        if name in needed:
            continue
        needed.add(name)
        expr = spec.tensors[name].expr
        if expr is not None:
            todo.extend(_reads(expr))
    return needed


def _sources(sources: str | tuple[str, ...] | list[str]) -> tuple[str, ...]:
    return (sources,) if isinstance(sources, str) else tuple(sources)


def _applied(output: str, sources: tuple[str, ...], permuted: bool) -> str:
    """`O(Pi X)`, `O(X)`, `O(Pi X, Pi keep)`, `O(X, keep)`."""
    return f"{output}({', '.join(('Pi ' if permuted else '') + s for s in sources)})"


def prove_symmetry(spec: t.TypedSpec, output: str, sources: str | tuple[str, ...], dim: str,
                   invariant: bool) -> SymmetryProof:
    """The matrix-level proof for every size of D, or where and why it stops. `sources` is one
    given tensor or several, permuted together along the axes `permuted_axes` names."""
    sources = _sources(sources)
    symbol = spec.dims[dim].symbol
    ty = _Types(spec, symbol)
    ty.sources = sources
    moved = permuted_axes(spec, sources, dim)
    steps: list[ProofStep] = []
    needed = _needed(spec, output) | set(sources)
    for name, info in spec.tensors.items():
        if name not in needed:  # a tensor the output does not read cannot break (or make) the proof
            continue
        if info.expr is None:
            if name in sources:
                pattern = tuple(k in moved[name] for k in range(len(info.shape)))
                ty.types[name] = frozenset({pattern})
                steps.append(ProofStep(name, "leaf" if len(sources) == 1 else "group",
                                       f"{name} -> {_describe(name, pattern, info.shape)}"))
            else:
                ty.types[name] = frozenset({_none(info.shape)})
                ty.fixed_because[name] = f"{name} is a {info.kind}, which the claim does not permute"
            continue
        try:
            patterns, lemma = _rule(info.expr, ty)
        except _Broken as broken:
            steps.append(ProofStep(name, "none", f"no rule applies to {_definition(name, info.expr, ty)}: "
                                                 f"{broken.reason}"))
            return SymmetryProof(False, steps, broken.reason, name)
        ty.types[name] = patterns
        if patterns == {_none(info.shape)} and any(ty.can_permute(d) for d in info.shape):
            ty.fixed_because[name] = _fixed_reason(name, info.expr, ty)
        # A tensor consistent with several patterns (ones(N, N), eye(N), a tensor constant along a
        # permuted axis) satisfies all of them at once: T(Pi X) = Pi T(X) = T(X) ...
        shown = " = ".join(_describe(name, p, info.shape) for p in sorted(patterns))
        steps.append(ProofStep(name, lemma, f"{_definition(name, info.expr, ty)} -> {shown}"))
    info = spec.tensors[output]
    goal = tuple(False for _ in info.shape) if invariant else tuple(ty.can_permute(d) for d in info.shape)
    if goal in ty.types[output]:
        unmoved = _describe(_applied(output, sources, False), goal, info.shape)
        arrow = f"{_applied(output, sources, True)} = {unmoved}"
        steps.append(ProofStep(output, "conclusion", arrow))
        return SymmetryProof(True, steps)
    got = sorted(ty.types[output])[0]
    reason = (f"{output} transforms as {_describe(output, got, info.shape)}, not as "
              f"{_describe(output, goal, info.shape)}")
    return SymmetryProof(False, steps, reason, output)


def check_symmetry(spec: t.TypedSpec, check: t.CheckInfo, force: bool = False) -> Verdict:
    """The verdict for `equivariant(O, X[, D])` or `invariant(O, Y[, D])` (not negated)."""
    invariant = check.kind == "invariant"
    output, sources, dim = check.output, check.sources, check.dim
    proof = prove_symmetry(spec, output, sources, dim, invariant)
    steps = tuple((s.lemma, s.tensor, s.statement) for s in proof.steps)
    if proof.holds:
        witness, how = element_witness(spec, output, sources, dim, invariant, force)
        if witness is False:  # the two levels disagree: a bug, never a proof
            return Verdict(check.line, check.text, "unknown",
                           f"the matrix-level permutation rules hold but the element level says {how}; this is a "
                           "bug in symattn, please report it", steps=steps)
        extra = f"; element-level witness: {how}" if witness else f"; element-level witness skipped: {how}"
        return Verdict(check.line, check.text, "proved",
                       f"for every {dim}: matrix-level permutation rules ({len(proof.steps)} steps){extra}",
                       steps=steps)
    counter = find_counterexample(spec, output, sources, dim, invariant)
    choice = search_sizes(spec, dim)
    where = choice.where()  # "at N=4, d=3", or "at N=59 instead of N=1000000000 (size guard)"
    if counter is not None:
        return Verdict(check.line, check.text, "refuted",
                       f"the proof stops at {proof.broken_at}: {proof.reason}; counterexample {where}",
                       counter, steps)
    if choice.shrunk and reads_sizes(spec, [t.Tensor(output, spec.tensors[output].shape)]):
        return Verdict(check.line, check.text, "unknown",
                       f"the proof stops at {proof.broken_at}: {proof.reason}; the spec's sizes are too large to "
                       f"search for a counterexample, and {output} reads sizes as values (a dim, a mean, index "
                       "values or sinusoidal(...)), so smaller sizes would test another claim", steps=steps)
    return Verdict(check.line, check.text, "unknown",
                   f"the proof stops at {proof.broken_at}: {proof.reason}; no counterexample found {where} "
                   "in 6 tries", steps=steps)
