"""Matrix-level equality proofs for all sizes: canonical index forms.

Contract: `prove_equal(lhs, rhs, spec, definitions)` returns a `Proof` when the
two typed nodes are equal for every value of the inputs, params and upstream
gradients and for every size of the dims, and None when it cannot show that
(None is "not proved", never "false"). It never returns a Proof for a false
claim; it is incomplete by design.

Method (the forms are built by `symattn.prove.index_forms` and put in canonical
form by `symattn.prove.index_terms`). Each side is written as an *index form*: a sum of terms, each term a
coefficient (a SymPy expression of numbers and dim symbols, such as
`1/sqrt(d_k)`) times a product of factors carrying index variables, summed
over contracted indices whose ranges are dims. The linear structure of the
matrix language is expanded: `@` contracts an index, `.T` swaps two, `sum`
and `SumTo` contract axes, `mean` also divides by the dim, `+ - *` distribute,
a scalar divisor goes into the coefficient, broadcasting drops an index,
`ones` is 1, `eye` is a Kronecker delta, `merge_heads`/`split_heads` and
`concat`/slices are index maps (`m = a * k + b`, `m = c + offset`) with the
rules that make them cancel against each other, and a computed subscript
(`b[j - i + N - 1]` read, or its gradient scattered back) is an index
equation `[m == j - i + N - 1]` that selects entries
(`symattn.prove.index_equations`: solved for a contracted index that stays in
range, pinned to a corner of the index box, or zero where no point of the box
satisfies it; each range decided for all sizes), and `where(p == 0, A, B)` on
an index p of a few values is the sum over u of [p == u] times the branch it
picks at u. Everything nonlinear (`exp`,
`softmax`, `logsumexp`, division by a tensor, `where`, powers other than small
natural ones, constants other than `ones` and `eye`) is an opaque factor keyed
by the canonical forms of its arguments, with its free indices named by
position, so that equal arguments give equal factors. A term is put in
canonical form by relabelling its contracted indices (all labellings that
respect an invariant of each index, the least serialisation wins), and two
sides are equal when their collected terms and coefficients agree.

`definitions` maps tensor names to their forward definitions and `"grad(T)"`
to derived matrix-level gradients; `Tensor(T)` and `Grad(T)` references are
unfolded when the direct comparison fails: gradients first (earliest tensor
first), then forward intermediates (latest first), comparing again after each.

Non-finite values. `-inf` masks, `log`, `sqrt` and division by a tensor can
make entries infinite or NaN, and then `x - x == 0` or `0 * x == 0` fail in
floating point. A static analysis classifies every node as finite, "maybe
-inf but never NaN or +inf", or "maybe anything"; a term that may be
non-finite is never dropped by cancellation or multiplication by zero, never
merged with a like term of the other sign, and never selected through
`eye(N) @` (which multiplies by 0); the argument of an opaque function that
may be NaN is compared structurally rather than by its expansion, and the
row-sum rule `sum(softmax(x), axis) = 1` needs a finite `x` (a fully masked
row has softmax 0), and a factor that may be non-finite is never distributed
over a sum (`(A + B) * M` is -inf where `A * M + B * M` is NaN). A divisor (and
the base of a power) is keyed by its expression, not its canonical form, unless
its zeros are all +0: `0 * X` and `X - X` have one form, but 1 / (-0) is -inf
where 1 / (+0) is inf. So a Proof
means: at every point, with float64 semantics aside from rounding and
overflow, both sides are equal, or the same non-finite value (see
`symattn.symbolic.finiteness`).

Identities of opaque functions that hold for every size are rewrite rules
(`symattn.prove.index_rules`: cos^2 = 1 - sin^2 and exp(causal_mask(N)) =
the 0/1 lower triangle cumsum sums with, on finite terms; products of exps),
applied to each side's expansion before like terms are collected, and to the
arguments of opaque factors before they are keyed. The softmax family has
rules of its own, each under the finiteness side condition it needs
(`symattn.prove.softmax_forms`, `symattn.prove.opaque_forms`,
`symattn.prove.softmax_terms`): shifts by a finite row statistic, positive
values in log space (a row sum of exps is exp(logsumexp), 1 / F = exp(-log F)),
exp(x - logsumexp(x)) as softmax's weight where every row holds a finite entry,
and, in a second comparison tried when the first fails, operations on a
`concat` along the reduced axis block by block (the merge of key blocks).
A claim's sides are compared broadcast to their common shape, as NumPy does
(`sum(grad(S), axis=-1) == 0`).

A row norm as a divisor, `sqrt(sum(Q * Q, axis=-1))` of a finite Q, is 0
exactly on Q's zero rows, where `Q / norm` is 0 / 0: when the comparison
fails, it is tried again with that norm taken as > 0 (its reciprocal a finite
factor), and the claim is proved if the forms then agree with every reciprocal
of the norm read at the entry's own row (at the top level of a term, never at
a contracted index nor inside a function's argument) and both sides are NaN
on every zero row (`symattn.prove.norm_rows`): the QK-norm backward written
out, for all sizes.

When the forms do not agree, each round also asks whether the two sides are
the same expression once the references unfolded so far are substituted: an
expression equals itself at every point, NaN included (both sides NaN count
as equal), which settles claims whose forms cannot be built because a
possibly non-finite factor stops the expansion (`grad(Q) == <the derived
formula, written out>` for cosine attention's division by a row norm).

Incomplete by design: no other algebra inside opaque functions (`sin(a + b)` is
not expanded, a softmax whose rows may be empty is not written with exp), no
cancellation of `x * (1 / x)` beyond positive sums of exps, no index arithmetic beyond the index-map and
index-equation rules (a computed subscript inside index notation whose
tensor is read again elsewhere stays a sum over an equation), and an
expansion larger than MAX_TERMS terms is given up.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, fields, replace
from typing import Mapping

import sympy

from ..ir import typed as t
from ..ir.printing import to_spec
from ..ir.shapes import ShapeMismatch, broadcast, same_dim
from ..symbolic.finiteness import Finiteness
from .index_forms import Converter
from .index_rules import rewrite
from .index_terms import ZERO_INDEX, Collected, TooBig, Unsupported, collect, display
from .norm_rows import nan_on_zero_rows, norm_divisors

__all__ = ["Proof", "prove_equal", "definitions_for", "index_form_text"]

METHOD = "matrix level: canonical index forms agree for all sizes"
SAME = "matrix level: the two sides are the same expression, for all sizes"
MAX_ROUNDS = 16        # unfoldings tried after the direct comparison
_FUNCTION_OF_EMBED = re.compile(r"\$(?!embed|delta|eq|mix)[a-z]+[^ (]*\(.*\$embed")  # a concat inside a function

@dataclass(frozen=True)
class Proof:
    """How a claim was proved: the method and the (rule, before, after) steps."""

    method: str
    steps: tuple[tuple[str, str, str], ...]


def definitions_for(spec: t.TypedSpec, derivation=None) -> dict[str, t.Node | None]:
    """The `definitions` argument for a spec: forward definitions by name and,
    given a `symattn.symbolic.derive.Derivation`, every derived gradient as `grad(NAME)`."""
    defs: dict[str, t.Node | None] = {name: info.expr for name, info in spec.tensors.items()
                                      if info.expr is not None}
    if derivation is not None:
        for name, gradient in derivation.gradients.items():
            defs[f"grad({name})"] = gradient.expr
    return defs


# --- the prover -----------------------------------------------------------------------


def _aligned(shape_a, shape_b):
    """The shape the two sides broadcast to, without leading 1s (a claim compares its sides
    broadcast, as NumPy does: `sum(grad(S), axis=-1) == 0`), or None when they do not broadcast."""
    def strip(shape):
        shape = list(shape)
        while shape and shape[0] == 1:
            shape.pop(0)
        return tuple(shape)

    try:
        return strip(broadcast(strip(shape_a), strip(shape_b)))
    except ShapeMismatch:
        return None


def _top_tokens(node_shape, shape):
    """The tokens of a side broadcast into `shape` (right-aligned; an axis of size 1 reads index 0)."""
    lead = len(node_shape) - len(shape)
    return tuple(ZERO_INDEX if k < lead or d == 1 or shape[k - lead] == 1 else f"p{k - lead}"
                 for k, d in enumerate(node_shape))


def _forms(lhs, rhs, shape, spec, definitions, unfold, risk, split_concat=False, positive=frozenset(), reads=None):
    """Both sides' collected forms (None, None when a side has none), the references met, and whether
    a rule on a concat was met; with `split_concat`, operations on concats are written block by block
    (`symattn.prove.softmax_forms`). `positive`: divisors taken as finite and > 0, where their
    reciprocals were read appended to `reads` (`symattn.prove.norm_rows`)."""
    cv = Converter(spec, definitions, frozenset(unfold), risk)
    cv.split_concat = split_concat
    cv.assumed_positive = positive
    if reads is not None:
        cv.assumed_reads = reads
    names = {ZERO_INDEX: ZERO_INDEX}
    for k, d in enumerate(shape):
        if d != 1:
            cv.ranges[f"p{k}"] = sympy.sympify(d)
            names[f"p{k}"] = f"p{k}"
    try:
        left = collect(rewrite(cv.conv(lhs, _top_tokens(lhs.shape, shape), {}), cv.ranges), names, cv.ranges)
        right = collect(rewrite(cv.conv(rhs, _top_tokens(rhs.shape, shape), {}), cv.ranges), names, cv.ranges)
    except TooBig:
        raise
    except Unsupported:
        return None, None, cv.seen, cv.concat_met
    return left, right, cv.seen, cv.concat_met


def _agree(left: dict[str, Collected], right: dict[str, Collected]) -> bool:
    absent = Collected(sympy.Integer(0), False)
    for key in set(left) | set(right):
        a, b = left.get(key, absent), right.get(key, absent)
        if a.coef == b.coef:
            continue
        if not _zero_for_all_sizes(a.coef - b.coef):
            return False
        if (key not in left or key not in right) and (a.risky or b.risky):
            return False  # a possibly non-finite term would vanish
    return True


def _concat_inside(left: dict[str, Collected], right: dict[str, Collected]) -> bool:
    """Whether a term the sides do not share holds a concat (an `$embed`) inside a function: only
    there can writing operations on concats block by block make the forms agree."""
    differ = set(left) ^ set(right) | {k for k in set(left) & set(right) if left[k].coef != right[k].coef}
    return any(_FUNCTION_OF_EMBED.search(key) for key in differ)


def _zero_for_all_sizes(c) -> bool:
    """Whether a coefficient is 0 for every size: a cheap refutation at a few sizes first."""
    if c == 0:
        return True
    if c.is_zero is False:
        return False
    symbols = sorted(c.free_symbols, key=str)
    for point in ((7, 11, 13, 17, 19, 23, 29), (2, 3, 5, 4, 6, 8, 9)):
        values = {x: point[k % len(point)] + k // len(point) for k, x in enumerate(symbols)}
        try:
            value = complex(c.subs(values).evalf(30))
        except (TypeError, ValueError):
            continue
        if abs(value) > 1e-12:
            return False
    return sympy.expand(c) == 0 or sympy.simplify(c) == 0


def _unfoldable(definitions, key, name) -> bool:
    if key not in definitions:
        return False
    value = definitions[key]
    return not (isinstance(value, t.Grad) and value.name == name)


def _next_unfold(seen, unfolded, definitions, order, first=()):
    early = [key for key in first if key in seen and key not in unfolded and definitions.get(key) is not None]
    if early:
        return early[0]
    grads = [key[5:-1] for key in seen if key.startswith("grad(") and key not in unfolded]
    grads = [name for name in grads if _unfoldable(definitions, f"grad({name})", name)]
    if grads:
        name = min(grads, key=lambda n: (order.get(n, len(order)), n))
        return f"grad({name})"
    forward = [key for key in seen if not key.startswith("grad(") and key not in unfolded
               and definitions.get(key) is not None]
    if forward:
        return max(forward, key=lambda n: (order.get(n, -1), n))
    return None


def prove_equal(lhs: t.Node, rhs: t.Node, spec: t.TypedSpec,
                definitions: Mapping[str, t.Node | None]) -> Proof | None:
    """A Proof that `lhs == rhs` for all values and all dim sizes, or None (not shown).

    `definitions`: tensor name -> forward definition, `"grad(T)"` -> derived
    gradient (None: L does not depend on T, so grad(T) is zero); see
    `definitions_for`. References are unfolded only when needed.
    """
    shape = _aligned(lhs.shape, rhs.shape)
    if shape is None:
        return None
    risk = Finiteness(spec, definitions)
    proof = _search(lhs, rhs, shape, spec, definitions, risk)
    if proof is not None:
        return proof
    return _norm_rows_proof(lhs, rhs, shape, spec, definitions, risk)


def _search(lhs, rhs, shape, spec, definitions, risk, positive=frozenset(), reads=None, first=()) -> Proof | None:
    """The forms compared, unfolding references one by one until they agree (see `prove_equal`); with
    `positive` (divisors taken as > 0), where their reciprocals were read is appended to `reads`, and the
    references in `first` are unfolded before any other once met."""
    dims = list(spec.dims)
    order = {name: k for k, name in enumerate(spec.tensors)}
    unfolded: list[str] = []
    steps: list[tuple[str, str, str]] = []
    try:
        for _ in range(MAX_ROUNDS + 1):
            if reads is not None:
                del reads[:]  # only the reads of the comparison that succeeds count
            left, right, seen, blocks = _forms(lhs, rhs, shape, spec, definitions, unfolded, risk,
                                               positive=positive, reads=reads)
            if blocks and (left is None or (not _agree(left, right) and _concat_inside(left, right))):
                # the comparison that writes operations on concats block by block
                if reads is not None:
                    del reads[:]
                left, right, more, _ = _forms(lhs, rhs, shape, spec, definitions, unfolded, risk, split_concat=True,
                                              positive=positive, reads=reads)
                seen = seen | more
            if left is not None and _agree(left, right):
                steps.append(("left side in canonical index form", to_spec(lhs, dims), display(left)))
                steps.append(("right side in canonical index form", to_spec(rhs, dims), display(right)))
                steps.append(("like terms collected: the forms agree term by term, dims symbolic",
                              display(left), display(right)))
                return Proof(METHOD, tuple(steps))
            same = [_substituted(side, definitions, unfolded) for side in (lhs, rhs)]
            # A side that is a SumTo dropping leading axes is its sums, up to those axes of size 1.
            same = [_as_sums(side) if isinstance(side, t.SumTo) else side for side in same]
            if None not in same and same[0] == same[1]:
                steps.append(("the two sides are the same expression", to_spec(same[0], dims), to_spec(same[1], dims)))
                return Proof(SAME, tuple(steps))
            key = _next_unfold(seen, unfolded, definitions, order, first)
            if key is None:
                return None
            unfolded.append(key)
            definition = definitions[key]
            after = "0 (L does not depend on it)" if definition is None else to_spec(definition, dims)
            rule = "substitute the derived gradient" if key.startswith("grad(") else "substitute the definition"
            steps.append((f"{rule} of {key}", key, after))
    except (Unsupported, RecursionError):
        return None
    return None


def _norm_rows_proof(lhs, rhs, shape, spec, definitions, risk) -> Proof | None:
    """The claim proved with a row norm D taken as > 0, every reciprocal of D read at the entry's own row,
    and both sides NaN on every zero row (`symattn.prove.norm_rows`), or None."""
    def resolve(node: t.Node) -> t.Node | None:  # a tensor's definition, a gradient's derived formula
        if isinstance(node, t.Grad):
            value = definitions.get(f"grad({node.name})")
            if isinstance(value, t.Grad) and value.name == node.name:
                return None
        else:
            value = risk.definition(node.name)
        return value if isinstance(value, t.Node) else None

    dims = list(spec.dims)
    for norm in norm_divisors(_read_by(lhs, rhs, definitions), risk):
        rows = len(norm.q.shape) - 1
        if len(shape) != rows + 1 or not all(
                len(side.shape) == rows + 1 and all(same_dim(a, b) and a != 1 for a, b in
                                                    zip(side.shape[:rows], norm.q.shape[:rows]))
                for side in (lhs, rhs)):
            continue
        row_tokens = tuple(f"p{k}" for k in range(rows)) + (ZERO_INDEX,)
        reads: list = []
        # the tensors normalised by D first (Qn = Q / D): unfolded, their reciprocals of D meet the others
        first = tuple(name for name, info in spec.tensors.items() if info.expr is not None and any(
            isinstance(n, t.Binary) and n.op == "div" and n.b == norm.divisor for n in t.walk(info.expr)))
        proof = _search(lhs, rhs, shape, spec, definitions, risk, positive=frozenset({norm.divisor}), reads=reads,
                        first=first)
        if proof is not None and proof.method == SAME:
            return proof  # the same expression: equal without the assumption
        if proof is None or not reads or any(inside or tuple(tokens) != row_tokens for tokens, inside in reads):
            continue
        if not (nan_on_zero_rows(lhs, norm, resolve) and nan_on_zero_rows(rhs, norm, resolve)):
            continue
        text = to_spec(norm.divisor, dims)
        steps = proof.steps + ((f"where {text} is 0 (a zero row of {to_spec(norm.q, dims)}), both sides are NaN: "
                                "0 / 0 reaches every entry of the row", to_spec(lhs, dims), to_spec(rhs, dims)),)
        return Proof(f"{METHOD} where {text} is > 0 (its reciprocal read at the entry's own row only), and on a row "
                     f"where it is 0 both sides are NaN", steps)
    return None


def _read_by(lhs: t.Node, rhs: t.Node, definitions: Mapping[str, t.Node | None]) -> list[t.Node]:
    """The two sides and every definition and derived gradient they read, directly or not, each once."""
    out, todo, seen = [], [lhs, rhs], set()
    while todo:
        node = todo.pop()
        out.append(node)
        for n in t.walk(node):
            key = f"grad({n.name})" if isinstance(n, t.Grad) else n.name if isinstance(n, t.Tensor) else None
            if key is not None and key not in seen:
                seen.add(key)
                if isinstance(definitions.get(key), t.Node):
                    todo.append(definitions[key])
    return out


def _substituted(node: t.Node, definitions: Mapping[str, t.Node | None], unfolded: list[str]) -> t.Node | None:
    """`node` with every reference in `unfolded` replaced by its definition (a gradient that is
    zero has none to substitute: None), and each SumTo that keeps its rank written as sums."""
    keys = set(unfolded)
    memo: dict[int, t.Node | None] = {}

    def sub(n: t.Node) -> t.Node | None:
        if id(n) in memo:
            return memo[id(n)]
        key = f"grad({n.name})" if isinstance(n, t.Grad) else n.name if isinstance(n, t.Tensor) else None
        if key is not None and key in keys:
            definition = definitions[key]
            out = None if definition is None else sub(definition)
        else:
            changes = {}
            for f in fields(n):
                value = getattr(n, f.name)
                if isinstance(value, t.Node):
                    changes[f.name] = sub(value)
                elif isinstance(value, tuple) and value and all(isinstance(v, t.Node) for v in value):
                    changes[f.name] = tuple(sub(v) for v in value)
            flat = [c for v in changes.values() for c in (v if isinstance(v, tuple) else (v,))]
            out = None if None in flat else replace(n, **changes) if changes else n
            if isinstance(out, t.SumTo) and len(out.shape) == len(out.x.shape):
                out = _as_sums(out)
        memo[id(n)] = out
        return out

    return sub(node)


def _as_sums(node: t.SumTo) -> t.Node:
    """The nested sums a SumTo prints as, `sum(sum(x, axis=-1), axis=-2)`: the same entries,
    summed in another order (rounding is not modelled), each summed axis kept with size 1, so
    equal to the SumTo when it keeps its rank, and up to leading axes of size 1 otherwise."""
    out = node.x
    for axis in sorted(node.axes, reverse=True):
        shape = tuple(sympy.Integer(1) if k == axis else d for k, d in enumerate(out.shape))
        out = t.Reduce("sum", out, axis, shape)
    return out


def index_form_text(node: t.Node, spec: t.TypedSpec, definitions: Mapping[str, t.Node | None] | None = None,
                    unfold: tuple[str, ...] = ()) -> str | None:
    """The canonical index form of one node as text (free indices p0, p1, ... by axis);
    None when it cannot be formed. For documents and debugging."""
    definitions = definitions or {}
    shape = _aligned(node.shape, node.shape)
    left, _, _, _ = _forms(node, node, shape, spec, definitions, list(unfold), Finiteness(spec, definitions))
    return None if left is None else display(left)
