"""Find a spec's attention cores: every `softmax(score) @ V` the plan fuses, and why not the others.

Contract: `find_cores(spec)` returns `(spec', cores, notes)`. A core is a
matrix product `softmax(score, axis=-1) @ V`, optionally `(softmax(score) *
W) @ V` or `/ W` (W a factor of buffers and constants: a dropout mask), whose
score is a per-entry function of one score product `Q @ K.T` (or index
notation `sum(c, Q[.., i, c] * K[.., j, c])`), of the entry's coordinates,
and of entries of given tensors (inputs, params, buffers, through computed
subscripts too: ALiBi slopes, a learned bias table, a padding mask) and of
tensors computed from those elementwise or in index notation (FlexAttention's
score_mod and mask_mod). Several products whose score is linear in them with
constant coefficients (MLA's `Q @ K.T + Qr @ Kr.T`) are one product of the
operands joined along their last axis. Q, K and V may broadcast their head
axes against each other (GQA, MQA: `K[g, 1, N, d]` against `Q[g, r, N, d]`).

Intermediates on the way (`S`, `P`) and tensors that feed a learned value
into the score belong to the core when nothing outside it reads them: they
are never stored. Tensors computed from buffers, constants and indices alone
are recomputed where the score reads them, whoever else reads them. A tensor
defined as `logsumexp(score, axis=-1)` of the same score is the core's row
log-sum-exp (`AttentionCore.lse`), which the core computes alongside O.

`spec'` is `spec` with a name given to every core operand and result that
had none (`attn_q`, `attn`, ...), so that the rest of the pipeline sees named
tensors. `notes` has one line per softmax that is not fused, saying why.
"""

from __future__ import annotations

import dataclasses

import sympy

from ...errors import Unfusable
from ...front.syntax import NOWHERE
from ...ir import typed as t
from ...ir.affine import Affine, affine
from ...ir.integers import substituted
from ...ir.printing import to_spec
from ...ir.shapes import same_dim
from .core import KEY, ROW, AttentionCore, DropoutEntry, Product, ProductEntry, Read, coordinate_node, head
from .entry import derivative, linear, split_mask

__all__ = ["find_cores", "substitute"]

_ELEMENTWISE = (t.Unary, t.Binary, t.Where, t.Compare, t.Logical, t.Apply, t.Scalar, t.DimValue, t.Constant, t.Transpose,
                t.IndexVar)
_ZERO = affine({}, 0)


def substitute(node: t.Node, mapping: dict[t.Node, t.Node]) -> t.Node:
    """`node` with every subexpression found in `mapping` replaced (structural equality)."""
    if node in mapping:
        return mapping[node]
    changes = {}
    for f in dataclasses.fields(node):
        value = getattr(node, f.name)
        if isinstance(value, t.Node):
            new = substitute(value, mapping)
            if new is not value:
                changes[f.name] = new
        elif isinstance(value, tuple) and value and all(isinstance(v, t.Node) for v in value):
            new = tuple(substitute(v, mapping) for v in value)
            if any(n is not v for n, v in zip(new, value)):
                changes[f.name] = new
    return dataclasses.replace(node, **changes) if changes else node


@dataclasses.dataclass(frozen=True, slots=True)
class _Term(t.Node):
    """Score product number `index` while a core is matched (one `ProductEntry` once they are joined)."""

    index: int
    shape: tuple = ()


def _align(child_shape, parent_shape, coords) -> tuple:
    """A broadcast operand's subscripts: trailing axes line up, size-1 axes read entry 0."""
    lead = len(parent_shape) - len(child_shape)
    return tuple(_ZERO if dim == 1 and parent_shape[lead + k] != 1 else coords[lead + k]
                 for k, dim in enumerate(child_shape))


class _Matcher:
    """Matches one softmax(...) @ V and writes its score in entry form."""

    def __init__(self, spec: t.TypedSpec) -> None:
        self.spec = spec
        self.learned = {n for n, info in spec.tensors.items() if info.expr is None and info.has_gradient}
        self.chain: list[str] = []
        self.products: list[tuple[t.Node, t.Node]] = []
        self.product_nodes: list[t.MatMul | None] = []
        self.reads: list[t.Entry] = []

    # --- what a tensor is --------------------------------------------------------------------

    def recomputed(self, name: str) -> bool:
        """An intermediate of buffers, constants and indices only, elementwise or in index notation: recomputed
        where the score reads it (no gradient flows through it to a leaf)."""
        info = self.spec.tensors[name]
        if info.expr is None or name in self.spec.outputs:
            return False
        for n in t.walk(info.expr):
            if isinstance(n, (t.Tensor, t.Entry)) and not (isinstance(n, t.Entry) and n.grad):
                other = n.name if isinstance(n, t.Tensor) else n.tensor
                other_info = self.spec.tensors[other]
                if other_info.expr is None:
                    if other_info.has_gradient:
                        return False
                elif not self.recomputed(other):
                    return False
            elif not isinstance(n, (*_ELEMENTWISE, t.IndexDef)):
                return False
        return True

    def intermediate(self, name: str) -> bool:
        info = self.spec.tensors.get(name)
        return bool(info and info.expr is not None and not info.is_output)

    def follow(self, node: t.Node) -> t.Node:
        """The definition behind private intermediates (each recorded in the chain)."""
        while isinstance(node, t.Tensor) and self.intermediate(node.name) and not self.recomputed(node.name):
            if node.name not in self.chain:
                self.chain.append(node.name)
            node = self.spec.tensors[node.name].expr
        return node

    # --- entry form --------------------------------------------------------------------------

    def entry(self, node: t.Node, coords: tuple) -> t.Node:
        """`node` (of some shape) at the subscripts `coords` (one per axis), as an entry expression."""
        if isinstance(node, t.MatMul):
            return self.product(node, coords)
        if isinstance(node, t.Tensor):
            info = self.spec.tensors[node.name]
            if info.dropout is not None:
                return self.drawn(node.name, coords)
            if info.expr is None:
                return self.read(node.name, coords)
            if not self.recomputed(node.name):
                if not self.intermediate(node.name):
                    raise Unfusable(f"the score reads {node.name}, an output of the spec")
                if node.name not in self.chain:
                    self.chain.append(node.name)
            return self.definition(info.expr, coords)
        if isinstance(node, t.Transpose):
            return self.entry(node.x, (*coords[:-2], coords[-1], coords[-2]))
        if isinstance(node, (t.Scalar, t.DimValue)):
            return node
        if isinstance(node, t.Constant):
            return self.constant(node, coords)
        if isinstance(node, (t.Unary, t.Binary, t.Where, t.Compare, t.Logical, t.Apply)):
            kids = [self.entry(c, _align(c.shape, node.shape, coords)) for c in node.children]
            fields = [f.name for f in dataclasses.fields(node) if isinstance(getattr(node, f.name), t.Node)]
            if isinstance(node, t.Logical):
                return t.Logical(node.op, tuple(kids), ())
            if isinstance(node, t.Apply):
                return t.Apply(node.fn, tuple(kids), ())
            return dataclasses.replace(node, shape=(), **dict(zip(fields, kids)))
        raise Unfusable(f"the score contains {type(node).__name__}, which is not a per-entry operation")

    def definition(self, expr: t.Node, coords: tuple) -> t.Node:
        if isinstance(expr, t.IndexDef):
            return self.body(expr.body, {i.name: c for i, c in zip(expr.indices, coords)})
        return self.entry(expr, coords)

    def body(self, node: t.Node, at: dict) -> t.Node:
        """An index-notation body with its indices at the subscripts `at`."""
        if isinstance(node, t.IndexVar):
            return coordinate_node(at[node.name])
        if isinstance(node, t.Entry):
            if node.grad:
                raise Unfusable("the score reads a gradient")
            # an integer-node subscript is an entry expression too (its reads of integer buffers are reads)
            subscripts = tuple(at[s] if isinstance(s, str) else self.body(s, at) if isinstance(s, t.Node)
                               else substituted(s, at) for s in node.indices)
            return self.entry(t.Tensor(node.tensor, self.spec.tensors[node.tensor].shape), subscripts)
        if isinstance(node, t.IndexSum):
            return self.index_product(node, at)
        if isinstance(node, t.Tensor) and node.shape == ():  # a scalar read whole (a learned slope)
            return self.entry(node, ())
        if isinstance(node, (t.Scalar, t.DimValue)):
            return node
        if isinstance(node, (t.Unary, t.Binary, t.Where, t.Compare, t.Logical, t.Apply)):
            kids = [self.body(c, at) for c in node.children]
            if isinstance(node, t.Logical):
                return t.Logical(node.op, tuple(kids), ())
            if isinstance(node, t.Apply):
                return t.Apply(node.fn, tuple(kids), ())
            fields = [f.name for f in dataclasses.fields(node) if isinstance(getattr(node, f.name), t.Node)]
            return dataclasses.replace(node, shape=(), **dict(zip(fields, kids)))
        raise Unfusable(f"the score contains {type(node).__name__}, which is not a per-entry operation")

    def index_product(self, node: t.IndexSum, at: dict) -> t.Node:
        """`sum(c, Q[.., i, c] * K[.., j, c])`: a score product written in index notation."""
        c = node.index.name
        body = node.body
        if not (isinstance(body, t.Binary) and body.op == "mul" and all(
                isinstance(x, t.Entry) and not x.grad and x.indices and x.indices[-1] == c
                and not any(c in getattr(s, "indices", (s,)) for s in x.indices[:-1]) for x in (body.a, body.b))):
            raise Unfusable("a sum in the score that is not a product Q[i, c] * K[j, c] over c")
        rows = {x: tuple(at[s] if isinstance(s, str) else substituted(s, at) for s in x.indices[:-1])
                for x in (body.a, body.b)}
        canonical = tuple(head(n) for n in range(len(self.score_shape) - 2)) + (ROW, KEY)
        for qa, ka in ((body.a, body.b), (body.b, body.a)):
            q, k = (t.Tensor(x.tensor, self.spec.tensors[x.tensor].shape) for x in (qa, ka))
            want_q = _align(q.shape[:-1], self.score_shape[:-1], canonical[:-1])
            want_k = _align(k.shape[:-1], (*self.score_shape[:-2], self.score_shape[-1]), (*canonical[:-2], KEY))
            if rows[qa] == want_q and rows[ka] == want_k:
                return self.term(q, k, None)
        raise Unfusable("the score's product in index notation reads Q and K at other rows than i and j")

    def product(self, node: t.MatMul, coords: tuple) -> t.Node:
        if not isinstance(node.b, t.Transpose) or len(node.a.shape) < 2 or len(node.b.x.shape) < 2:
            raise Unfusable("the score's product is not of the form Q @ K.T")
        canonical = tuple(head(n) for n in range(len(self.score_shape) - 2)) + (ROW, KEY)
        if tuple(coords) != _align(node.shape, self.score_shape, canonical):
            raise Unfusable("the score reads its product Q @ K.T transposed or at other coordinates")
        return self.term(node.a, node.b.x, node)

    def term(self, q: t.Node, k: t.Node, node: t.MatMul | None) -> t.Node:
        """Product number n of the score (`node`: the matrix-level product, None in index notation)."""
        pair = (q, k)
        if pair not in self.products:
            self.products.append(pair)
            self.product_nodes.append(node)
        return _Term(self.products.index(pair))

    def read(self, name: str, coords: tuple) -> t.Node:
        entry = t.Entry(name, tuple(coords))
        if entry not in self.reads:
            self.reads.append(entry)
        return entry

    def drawn(self, name: str, coords: tuple) -> t.Node:
        """A dropout mask's entry, drawn from its flat position where the entry is computed (`DropoutEntry`)."""
        info = self.spec.tensors[name]
        index = None
        for axis, c in enumerate(coords):
            if isinstance(c, Affine) and not c.indices and c.offset == 0:
                continue  # entry 0 of an axis of size 1
            term = coordinate_node(c)
            stride = sympy.Mul(*info.shape[axis + 1:])
            if stride != 1:
                term = t.Binary("mul", term, t.DimValue(stride), ())
            index = term if index is None else t.Binary("add", index, term, ())
        return DropoutEntry(self.read(name, (_ZERO,)), self.read(name, (affine({}, 1),)),
                            index if index is not None else t.Scalar(sympy.Integer(0)), info.dropout.stream,
                            info.dropout.threshold)

    def constant(self, node: t.Constant, coords: tuple) -> t.Node:
        zero, one = t.Scalar(sympy.Integer(0)), t.Scalar(sympy.Integer(1))
        if node.kind == "ones":
            return one
        rows, cols = (coordinate_node(c) for c in coords[-2:])
        if node.kind == "eye":
            return t.Where(t.Compare("==", rows, cols, ()), one, zero, ())
        if node.kind == "causal_mask":
            return t.Where(t.Compare("<=", cols, rows, ()), zero, t.Scalar(-sympy.oo), ())
        raise Unfusable(f"the score reads the constant {node.kind}, which the kernels do not recompute")

    # --- one core ----------------------------------------------------------------------------

    def softmax_of(self, node: t.Node) -> tuple[t.Softmax, list]:
        """The softmax behind `node` and the factors (op, factor) it is multiplied or divided by after it."""
        node = self.follow(node)
        if isinstance(node, t.Softmax) and node.axis == len(node.shape) - 1:
            return node, []
        if isinstance(node, t.Binary) and node.op in ("mul", "div"):
            sides = [(node.a, node.b)] + ([(node.b, node.a)] if node.op == "mul" else [])
            for inner, factor in sides:
                length = len(self.chain)
                try:
                    softmax, factors = self.softmax_of(inner)
                except _NoCore:
                    del self.chain[length:]
                    continue
                return softmax, factors + [(node.op, factor)]
        raise _NoCore()

    def match(self, owner: str, node: t.MatMul) -> dict:
        """The parts of the core `node` (a product in `owner`'s definition), or Unfusable with the reason."""
        probs, factors = self.softmax_of(node.a)
        score = probs.x
        self.score_shape = tuple(score.shape)
        canonical = tuple(head(n) for n in range(len(score.shape) - 2)) + (ROW, KEY)
        entry = self.entry(score, canonical)
        weights = None
        for op, factor in factors:
            if len(factor.shape) > len(score.shape) or not all(
                    d == 1 or same_dim(d, e) for d, e in zip(factor.shape[::-1], score.shape[::-1])):
                raise Unfusable("the weights are multiplied by a factor larger than the scores")
            products, reads = len(self.products), len(self.reads)
            w = self.entry(factor, _align(factor.shape, score.shape, canonical))
            if len(self.products) != products or any(r.tensor in self.learned for r in self.reads[reads:]) or any(
                    isinstance(n, _Term) for n in t.walk(w)):
                raise Unfusable("the weights are multiplied by a factor that reads the scores or a learned tensor")
            one = t.Scalar(sympy.Integer(1))
            weights = t.Binary(op, weights if weights is not None else one, w, ())
        if not self.products:
            raise Unfusable("the score has no product Q @ K.T")
        entry, joined, notes = self.join(entry)
        q, k = joined
        v = node.b
        lead = tuple(node.shape[:-2])
        for x, role in ((q, "Q"), (k, "K"), (v, "V")):
            if len(x.shape) < 2 or len(x.shape) - 2 > len(lead) or not all(
                    d == 1 or same_dim(d, a) for d, a in zip(x.shape[:-2], lead[len(lead) - len(x.shape) + 2:])):
                raise Unfusable(f"{role}'s leading (head) axes do not broadcast to the output's")
        if tuple(score.shape[:-2]) != lead:
            raise Unfusable("the score's head axes are not the output's")
        return dict(score=entry, source=score, product=(q, k), v=v, lead=lead, weights=weights,
                    chain=tuple(self.chain), reads=tuple(self.reads), notes=notes,
                    joined=tuple(self.product_nodes) if len(self.products) > 1 else ())

    def join(self, entry: t.Node):
        """One product: several that the score reads linearly with constant coefficients become one product of
        their operands joined along the last axis (coefficients that differ scale the query parts)."""
        if len(self.products) == 1:
            return substitute(entry, {_Term(0): ProductEntry()}), self.products[0], ()
        rest, scales = entry, []
        for index in range(len(self.products)):
            found = linear(rest, _Term(index))
            if found is None:
                raise Unfusable(f"the score reads its {len(self.products)} products other than as a sum of them "
                                "with constant coefficients")
            scales.append(found.scale)
            rest = found.bias
        qs, ks = zip(*self.products)
        for x in (*qs, *ks):
            if tuple(x.shape[:-1]) != tuple((qs if x in qs else ks)[0].shape[:-1]):
                raise Unfusable("the score's products have operands of different shapes")
        if not all(s == scales[0] for s in scales):
            raise Unfusable("the score's products have different coefficients")
        if any(node is None for node in self.product_nodes):
            raise Unfusable("the score has several products written in index notation")
        width = sum((sympy.sympify(q.shape[-1]) for q in qs), sympy.Integer(0))
        q = t.Concat(tuple(qs), len(qs[0].shape) - 1, (*qs[0].shape[:-1], width))
        k = t.Concat(tuple(ks), len(ks[0].shape) - 1, (*ks[0].shape[:-1], width))
        s = ProductEntry()
        if scales[0] is not None:
            s = t.Binary("mul", scales[0], s, ())
        joined = s if rest is None else t.Binary("add", s, rest, ())
        note = f"{len(qs)} score products joined into one: Q and K concatenated along their last axis"
        return joined, (q, k), (note,)


class _NoCore(Exception):
    """Not a softmax(...) @ V at all (nothing to say about it)."""


def _count(node: t.Node, name: str) -> int:
    return sum(isinstance(n, t.Tensor) and n.name == name for n in t.walk(node))


def _matmuls(node: t.Node):
    """The products in `node`, right to left (the first core found is named first)."""
    stack = [node]
    while stack:
        n = stack.pop()
        if isinstance(n, t.MatMul):
            yield n
        stack.extend(n.children)


def _private(spec: t.TypedSpec, chain, owner: str, core: t.Node, lse: str | None) -> None:
    """Every read of an intermediate on the way to the score happens inside the core (or its lse)."""
    for name in chain:
        for user, info in spec.tensors.items():
            if info.expr is None or name not in t.tensors_read(info.expr) or user == lse:
                continue
            if user == owner:
                if _count(info.expr, name) != _count(core, name):
                    raise Unfusable(f"{owner} reads {name} outside softmax(...) @ V")
            elif user not in chain:
                raise Unfusable(f"{name} is also read by {user}, so it must be stored")


def _lse_of(spec: t.TypedSpec, parts: dict, owner: str) -> str | None:
    """A tensor defined as logsumexp(score, axis=-1) of this core's score: its row log-sum-exp."""
    for name, info in spec.tensors.items():
        x = info.expr
        if name == owner or not (isinstance(x, t.Reduce) and x.kind == "logsumexp"
                                 and x.axis == len(x.x.shape) - 1 and tuple(x.x.shape) == tuple(parts["source"].shape)):
            continue
        other = _Matcher(spec)
        other.score_shape = tuple(x.x.shape)
        try:
            canonical = tuple(head(n) for n in range(len(x.x.shape) - 2)) + (ROW, KEY)
            entry = other.entry(x.x, canonical)
            entry, joined, _ = other.join(entry) if other.products else (entry, None, ())
        except Unfusable:
            continue
        if entry == parts["score"] and joined == parts["product"]:
            return name
    return None


def find_cores(spec: t.TypedSpec) -> tuple[t.TypedSpec, list[AttentionCore], list[str]]:
    cores: list[AttentionCore] = []
    notes: list[str] = []
    done: set[str] = set()
    taken: set[str] = set()
    while True:
        found = None
        for owner, info in spec.tensors.items():
            if info.expr is None or owner in done:
                continue
            for node in _matmuls(info.expr):
                matcher = _Matcher(spec)
                try:
                    parts = matcher.match(owner, node)
                    parts["lse"] = _lse_of(spec, parts, owner)
                    _private(spec, parts["chain"], owner, node, parts["lse"])
                    _derivatives(parts, matcher.learned)
                except _NoCore:
                    continue
                except Unfusable as why:
                    note = f"{owner}: softmax(...) @ V not fused: {why}"
                    if note not in notes:
                        notes.append(note)
                    continue
                found = (owner, node, parts)
                break
            if found:
                break
        if found is None:
            return spec, cores, notes
        owner, node, parts = found
        spec, core = _name_core(spec, owner, node, parts, taken)
        cores.append(core)
        done.add(core.output)


def _derivatives(parts: dict, learned: set[str]) -> None:
    keep, value = split_mask(parts["score"])
    d_product = derivative(value, ProductEntry())
    if d_product is None:
        raise Unfusable("the score does not depend on Q @ K.T")
    reads = []
    for entry in parts["reads"]:
        d = derivative(value, entry) if entry.tensor in learned else None
        reads.append(Read(entry.tensor, entry.indices, d))
    parts.update(keep=keep, value=value, d_product=d_product, reads=tuple(reads))


def _fresh(spec: t.TypedSpec, base: str, taken: set[str]) -> str:
    name, k = base, 2
    while name in spec.tensors or name in spec.dims or name in taken:
        name = f"{base}{k}"
        k += 1
    taken.add(name)
    return name


def _insert(tensors: dict, before: str, new: dict) -> dict:
    out = {}
    for name, info in tensors.items():
        if name == before:
            out.update(new)
        out[name] = info
    return out


def _inlined(spec: t.TypedSpec, node: t.Node, chain) -> t.Node:
    """`node` with the core's intermediates written out (their matrix-level definitions), for the core's text."""
    mapping = {}
    for name in reversed(chain):
        expr = spec.tensors[name].expr
        if not isinstance(expr, t.IndexDef):
            mapping[t.Tensor(name, spec.tensors[name].shape)] = substitute(expr, mapping)
    return substitute(node, mapping)


def _name_core(spec, owner, node, parts, taken) -> tuple[t.TypedSpec, AttentionCore]:
    """Give names to the core's operands and result where the spec wrote them inline."""
    tensors = dict(spec.tensors)
    chain = parts["chain"]
    first = next((n for n in tensors if n in chain or n == owner), owner)
    mapping: dict[t.Node, t.Node] = {}
    added = {}
    names = []
    for role, operand in zip("qkv", (*parts["product"], parts["v"])):
        if isinstance(operand, t.Tensor):
            names.append(operand.name)
            continue
        name = _fresh(spec, f"attn_{role}", taken)
        added[name] = t.TensorInfo(name, "intermediate", operand.shape, NOWHERE, operand)
        mapping[operand] = t.Tensor(name, operand.shape)
        names.append(name)
    if added:
        tensors = _insert(tensors, first, added)
        for name in list(tensors):
            info = tensors[name]
            if info.expr is not None and name not in added:
                tensors[name] = dataclasses.replace(info, expr=substitute(info.expr, mapping))
    source = substitute(_inlined(spec, parts["source"], chain), mapping)  # (the spec's own products, for text)
    if parts["joined"]:  # the products, equal coefficients: the first is the joined one, the others 0
        first, *others = parts["joined"]
        q_node, k_node = (mapping.get(x, x) for x in parts["product"])
        mapping[first] = t.MatMul(q_node, t.Transpose(k_node, (*k_node.shape[:-2], k_node.shape[-1],
                                                               k_node.shape[-2])), first.shape)
        mapping.update({other: t.Scalar(sympy.Integer(0)) for other in others})
        for name in list(tensors):
            info = tensors[name]
            if info.expr is not None and name not in added:
                tensors[name] = dataclasses.replace(info, expr=substitute(info.expr, mapping))
    core_node = substitute(node, mapping)
    output = owner
    if tensors[owner].expr != core_node:
        output = _fresh(spec, "attn", taken)
        tensors = _insert(tensors, owner, {output: t.TensorInfo(output, "intermediate", core_node.shape,
                                                                 NOWHERE, core_node)})
        info = tensors[owner]
        tensors[owner] = dataclasses.replace(info, expr=substitute(info.expr, {core_node: t.Tensor(
            output, core_node.shape)}))
    spec = dataclasses.replace(spec, tensors=tensors)
    q, k, v = (tensors[n] for n in names)
    dims = list(spec.dims)
    weights = "" if parts["weights"] is None else " * W"
    text = f"{output} = softmax({to_spec(source, dims)}, axis=-1){weights} @ {names[2]}"
    lead = parts["lead"]
    core = AttentionCore(
        output, Product(names[0], names[1], sympy.sympify(q.shape[-1])), names[2], parts["score"], parts["keep"],
        parts["value"], parts["d_product"], lead, tuple(q.shape[:-2]), tuple(k.shape[:-2]), tuple(v.shape[:-2]),
        sympy.sympify(q.shape[-2]), sympy.sympify(k.shape[-2]), sympy.sympify(v.shape[-1]), chain, parts["reads"],
        parts["weights"], parts["lse"], text, parts["notes"],
        frozenset(r.tensor for r in parts["reads"] if spec.tensors[r.tensor].integer))
    return spec, core
