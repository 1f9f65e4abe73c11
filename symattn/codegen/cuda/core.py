"""Find the attention cores that the fused (FlashAttention-2 style) kernels compute.

Contract: `find_cores(spec)` returns `(spec', cores, notes)`. A core is a
matrix product `softmax(score) @ V` whose softmax runs over the last axis and
whose `score` is a per-entry function of one product `Q @ K.T`, of the entry's
indices and of constants: a scale, a `where` mask, `causal_mask(N)`, a tensor
defined in index notation from its indices alone (FlexAttention's score_mod
and mask_mod). With `operands=True` (the Triton target) the score may also read
given tensors (inputs, params, buffers: ALiBi slopes, a learned bias, a
key-padding mask), which the kernel loads by index; `AttentionCore.reads`
names them. Intermediates on the way (`S = Q @ K.T / sqrt(d_k)`,
`P = softmax(S)`) belong to the core when nothing else reads them; they are
never stored. Q, K and V share their leading (head) axes. `spec'` is `spec`
with a name given to every core operand and core result that had none, so the
rest of the pipeline (derivation, generic kernels) sees named tensors. `notes`
says, for each softmax that is not fused, why not.

`score_grad(core)` is d score / d (Q @ K.T)[i, j], by forward-mode rules on
the entry formula; the fused backward multiplies dS by it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ...ir import build as b
from ...ir import typed as t
from ...symbolic.derive import UNARY_RULES
from ...front.syntax import NOWHERE
from ...ir.shapes import same_dim

__all__ = ["AttentionCore", "find_cores", "score_grad", "score_derivative", "substitute", "accumulators",
           "summed_product", "read_again", "written_sum", "whole_gradient"]

_ELEMENTWISE = (t.Unary, t.Binary, t.Where, t.Compare, t.Scalar, t.DimValue, t.Constant)


@dataclass(frozen=True)
class AttentionCore:
    """O = softmax(score(Q @ K.T), axis=-1) @ V over the leading axes `lead`."""

    output: str
    q: str
    k: str
    v: str
    product: t.MatMul                 # the Q @ K.T node, as it appears in `score`
    score: t.Node                     # the softmax argument, intermediates substituted
    chain: tuple[str, ...]            # intermediates that exist only inside the core
    pure: tuple[tuple[str, t.Node], ...]  # tensors of constants the score reads: name, definition
    lead: tuple                       # leading (head) dims
    n_q: object
    n_k: object
    d_qk: object
    d_v: object
    reads: tuple[str, ...] = ()      # given tensors the score loads (only with operands=True)


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


class _NotFusable(Exception):
    pass


class _Matcher:
    def __init__(self, spec: t.TypedSpec, operands: bool = False) -> None:
        self.spec = spec
        self.operands = operands
        self.reads: list[str] = []

    def pure(self, node: t.Node) -> bool:
        """A value of constants and indices only: it can be recomputed inside the kernel."""
        if isinstance(node, t.Tensor):
            info = self.spec.tensors[node.name]
            return info.expr is not None and not info.is_output and self.pure(info.expr)
        if isinstance(node, t.IndexDef):
            return self.pure(node.body)
        if isinstance(node, (*_ELEMENTWISE, t.IndexVar, t.Transpose)):
            return all(self.pure(c) for c in node.children)
        return False

    def intermediate(self, name: str) -> bool:
        info = self.spec.tensors.get(name)
        return bool(info and info.expr is not None and not info.is_output)

    def follow(self, node: t.Node, chain: list[str]) -> t.Node:
        while isinstance(node, t.Tensor) and self.intermediate(node.name) and not self.pure(node):
            if node.name not in chain:
                chain.append(node.name)
            node = self.spec.tensors[node.name].expr
        return node

    def check_private(self, chain: list[str], owner: str, core: t.Node) -> None:
        """Every read of an intermediate on the way to the score happens inside the core."""
        for name in chain:
            for user, info in self.spec.tensors.items():
                if info.expr is None or name not in t.tensors_read(info.expr):
                    continue
                if user == owner:
                    if _count(info.expr, name) != _count(core, name):
                        raise _NotFusable(f"{owner} reads {name} outside softmax(...) @ V")
                elif user not in chain:
                    raise _NotFusable(f"{name} is also read by {user}, so it must be stored")

    def score(self, node: t.Node, chain: list[str], pure: dict[str, t.Node], products: list) -> t.Node:
        """The score expression with private intermediates substituted; records the product Q @ K.T."""
        if isinstance(node, t.Tensor):
            if self.pure(node):
                pure[node.name] = self.spec.tensors[node.name].expr
                return node
            if self.operands and self.spec.tensors[node.name].expr is None:
                if node.name not in self.reads:
                    self.reads.append(node.name)  # a given tensor the kernel loads
                return node
            inner = self.follow(node, chain)
            if inner is node:
                raise _NotFusable(f"the score reads {node.name}, which is not a constant of the indices")
            return self.score(inner, chain, pure, products)
        if isinstance(node, t.MatMul):
            if not isinstance(node.b, t.Transpose) or len(node.a.shape) < 2 or len(node.b.x.shape) < 2:
                raise _NotFusable("the score's product is not of the form Q @ K.T")
            if node not in products:
                products.append(node)
            return node
        if isinstance(node, _ELEMENTWISE):
            kids = [self.score(c, chain, pure, products) for c in node.children]
            changes = {f.name: k for f, k in zip([f for f in dataclasses.fields(node)
                                                  if isinstance(getattr(node, f.name), t.Node)], kids)}
            return dataclasses.replace(node, **changes) if changes else node
        if isinstance(node, t.IndexDef):
            raise _NotFusable(f"the score is index notation reading {', '.join(t.tensors_read(node))}, not a "
                              "per-entry function of one product Q @ K.T")
        raise _NotFusable(f"the score contains {type(node).__name__}, which is not a per-entry operation")

    def match(self, owner: str, node: t.MatMul) -> tuple[dict, str | None]:
        chain: list[str] = []
        self.reads = []
        probs = self.follow(node.a, chain)
        if not isinstance(probs, t.Softmax) or probs.axis != len(probs.shape) - 1:
            raise _NotFusable("")
        pure: dict[str, t.Node] = {}
        products: list[t.MatMul] = []
        score = self.score(probs.x, chain, pure, products)
        if len(products) != 1:
            raise _NotFusable(f"the score has {len(products)} matrix products, not exactly one Q @ K.T")
        product = products[0]
        q, k, v = product.a, product.b.x, node.b
        lead = tuple(product.shape[:-2])
        if len(v.shape) < 2 or not all(len(x.shape) == len(lead) + 2 for x in (q, k, v)):
            raise _NotFusable("Q, K and V do not have the same leading (head) axes")
        if not all(same_dim(a, c) for x in (q, k, v, node) for a, c in zip(x.shape[:-2], lead)):
            raise _NotFusable("Q, K and V do not have the same leading (head) axes")
        if tuple(score.shape) != tuple(product.shape):
            raise _NotFusable("the score broadcasts Q @ K.T to a larger shape")
        self.check_private(chain, owner, node)
        _forward(score, product)  # the score must be differentiable in s (raises otherwise)
        return dict(product=product, score=score, chain=tuple(chain), pure=tuple(pure.items()), lead=lead,
                    n_q=q.shape[-2], n_k=k.shape[-2], d_qk=q.shape[-1], d_v=v.shape[-1],
                    operands=(q, k, v), reads=tuple(self.reads)), None


def _count(node: t.Node, name: str) -> int:
    return sum(isinstance(n, t.Tensor) and n.name == name for n in t.walk(node))


def _matmuls(node: t.Node):
    """The products in `node`, right to left (not `t.walk`'s order: the first core found is named first)."""
    stack = [node]
    while stack:
        n = stack.pop()
        if isinstance(n, t.MatMul):
            yield n
        stack.extend(n.children)


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


def find_cores(spec: t.TypedSpec, operands: bool = False) -> tuple[t.TypedSpec, list[AttentionCore], list[str]]:
    cores: list[AttentionCore] = []
    notes: list[str] = []
    done: set[str] = set()
    taken: set[str] = set()
    while True:
        matcher = _Matcher(spec, operands)
        found = None
        for owner, info in spec.tensors.items():
            if info.expr is None or owner in done:
                continue
            for node in _matmuls(info.expr):
                try:
                    parts, _ = matcher.match(owner, node)
                except _NotFusable as why:
                    if str(why):
                        notes.append(f"{owner}: softmax(...) @ V not fused: {why}")
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


def _name_core(spec, owner, node, parts, taken) -> tuple[t.TypedSpec, AttentionCore]:
    """Give names to the core's operands and result where the spec wrote them inline."""
    tensors = dict(spec.tensors)
    chain = parts["chain"]
    first = next((n for n in tensors if n in chain or n == owner), owner)
    mapping: dict[t.Node, t.Node] = {}
    added = {}
    names = []
    for role, operand in zip("qkv", parts["operands"]):
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
    product = substitute(parts["product"], mapping)
    score = substitute(parts["score"], mapping)
    core_node = substitute(node, mapping)
    output = owner
    if tensors[owner].expr != core_node:
        output = _fresh(spec, "attn", taken)
        tensors = _insert(tensors, owner, {output: t.TensorInfo(output, "intermediate", core_node.shape,
                                                                 NOWHERE, core_node)})
        info = tensors[owner]
        tensors[owner] = dataclasses.replace(info, expr=substitute(info.expr, {core_node: t.Tensor(output,
                                                                                                 core_node.shape)}))
    spec = dataclasses.replace(spec, tensors=tensors)
    return spec, AttentionCore(output, *names, product=product, score=score, chain=chain, pure=parts["pure"],
                               lead=parts["lead"], n_q=parts["n_q"], n_k=parts["n_k"], d_qk=parts["d_qk"],
                               d_v=parts["d_v"], reads=parts["reads"])


def score_grad(core: AttentionCore) -> t.Node:
    """d score / d s for s = (Q @ K.T)[i, j], as an entry expression (may contain the product node)."""
    d = _forward(core.score, core.product)
    return d if d is not None else b.scalar(0)


def score_derivative(core: AttentionCore, wrt: t.Node) -> t.Node | None:
    """d score / d `wrt` (a tensor the score reads), as an entry expression; None where it does not depend on it."""
    return _forward(core.score, wrt)


def _forward(node: t.Node, wrt: t.Node) -> t.Node | None:
    if node == wrt:
        return b.scalar(1)
    if isinstance(node, t.Unary):
        dx = _forward(node.x, wrt)
        return None if dx is None else UNARY_RULES[node.fn][1](node.x, node, dx, None)
    if isinstance(node, t.Binary):
        u, v = node.a, node.b
        du, dv = _forward(u, wrt), _forward(v, wrt)
        if du is None and dv is None:
            return None
        zero = b.scalar(0)
        if node.op == "add":
            return b.add(du, dv)
        if node.op == "sub":
            return b.sub(du or zero, dv or zero)
        if node.op == "mul":
            return b.add(b.mul(du, v) if du is not None else None, b.mul(u, dv) if dv is not None else None)
        if node.op == "div":
            left = b.div(du, v) if du is not None else None
            right = b.neg(b.div(b.mul(u, dv), b.power(v, b.scalar(2)))) if dv is not None else None
            return b.add(left, right)
        if node.op == "pow":
            if dv is not None:
                raise _NotFusable("a power whose exponent depends on Q @ K.T")
            return b.mul(b.mul(v, b.power(u, b.sub(v, b.scalar(1)))), du)
    if isinstance(node, t.Where):
        da, db = _forward(node.a, wrt), _forward(node.b, wrt)
        if da is None and db is None:
            return None
        zero = b.scalar(0)
        return b.where(node.cond, da or zero, db or zero)
    return None


def summed_product(n: t.Node) -> bool:
    """sum(A @ B) over leading axes only (the heads of grad(X) in multi-head attention)."""
    if not isinstance(n, t.SumTo) or not isinstance(n.x, t.MatMul):
        return False
    lead = len(n.x.shape) - len(n.shape)
    return n.axes == tuple(range(lead)) and lead <= len(n.x.shape) - 2 and lead > 0


def accumulators(expr: t.Node) -> list[t.Node]:
    """Matrix products of the root's own shape reachable through elementwise operations only,
    each a MatMul or a SumTo of one over its leading axes (then the kernel loops over those too)."""
    found: list[t.Node] = []

    def walk(n: t.Node) -> None:
        if tuple(n.shape) != tuple(expr.shape):
            return
        if isinstance(n, t.MatMul) or summed_product(n):
            if n not in found:
                found.append(n)
        elif isinstance(n, (t.Unary, t.Binary)):
            for c in n.children:
                walk(c)
        elif isinstance(n, t.Where):
            walk(n.a)
            walk(n.b)

    walk(expr)
    return found


# --- gradients through fused cores (the fused plan and the CUDA planner) -----------------------------------


def read_again(derivation, name: str) -> bool:
    """Whether `name` is an output that other tensors read too: then what flows back into its definition is
    more than its upstream gradient, which is all that grad(name) is for an output (`whole_gradient`)."""
    gradient = derivation.gradients.get(name)
    return (name in derivation.spec.outputs and gradient is not None
            and any(owner != "upstream" for owner, _ in gradient.paths))


def written_sum(paths) -> t.Node:
    """The sum of an output's paths as `derive` writes it out inside its readers' gradients."""
    total = None
    for _, part in paths:
        total = b.add(total, part)
    return total


def whole_gradient(name: str, paths, core_of: dict, cores, core_part, wholes: dict, prepare=None) -> t.Node | None:
    """grad(name), every path summed: a path through a fused core (`core_of`: its chain and output -> the core)
    as `core_part(core, index)` for each role (0 q, 1 k, 2 v) name plays in it, every other path
    `prepare(part)` (None: as it is) after each written-out sum in it is replaced by its fused form
    (`wholes`: `written_sum` -> `whole_gradient`)."""
    total = None
    for owner, part in paths:
        if owner not in core_of:
            part = substitute(part, wholes) if wholes else part
            total = b.add(total, prepare(part) if prepare else part)
    for core in cores:
        if any(core_of.get(owner) is core for owner, _ in paths):
            for index, role in enumerate((core.q, core.k, core.v)):
                if role == name:
                    total = b.add(total, core_part(core, index))
    return total
