"""Matrix-level reverse-mode derivation: `grad(T)` of every tensor, with steps.

Contract: `derive(spec)` returns a `Derivation` whose `gradients[name]` holds,
for every tensor of the spec, a closed form for dL/dT (L = sum over outputs
of <O, grad(O)>) written with the spec's own names: forward tensors and the
`grad(C)` of the tensors C that consume T, e.g. `grad(V) = P.T @ grad(O)`,
`grad(X) = grad(Q) @ W_q.T + grad(K) @ W_k.T + grad(V) @ W_v.T`; a buffer has
no gradient (it is a constant of the backward pass). Dims stay
symbolic, so each formula holds for all sizes. Every adjoint rule applied and
every simplification made is recorded as a `Step(rule, tensor, before, after)`.

The adjoint rules form one table (`_adjoint`, dispatched on node type); a
node without a rule is an error that names it. A rule returns one `Part` per
operand, whose contribution the driver builds with a fresh `Recorder`: the
simplifications recorded for a contribution are exactly those made while
building it (and those of summing a tensor's paths, exactly those made by
that sum), attributed when made, never recovered afterwards.

A `Derivation` is also a read-only mapping from `"grad(T)"` (or `"T"`) to a
`Formula` (spec text, LaTeX, MathML, SymPy); an unknown name
raises `UnknownGradientError`, which lists the known ones.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from functools import cached_property, singledispatch

import sympy

from ..ir import build as b
from ..ir import typed as t
from ..ir.functions import FUNCTIONS, OPERATIONS, table
from ..ir.gather import entry_form
from ..present import render
from ..errors import SymbolicError, UnknownGradientError
from .index_adjoint import Part, index_adjoint
from .gradient_text import GradientText, gradient_texts
from ..ir.printing import to_spec

__all__ = ["Step", "Gradient", "Derivation", "Formula", "derive", "UNARY_RULES"]


@dataclass(frozen=True)
class Step:
    """One recorded step: a rule applied while building grad(tensor)."""

    rule: str
    tensor: str
    before: t.Node
    after: t.Node


@dataclass(frozen=True)
class Gradient:
    """dL/dT for one tensor: `expr` is None when L does not depend on T."""

    tensor: str
    expr: t.Node | None
    paths: tuple[tuple[str, t.Node], ...]  # (consumer or 'upstream', contribution)
    steps: tuple[Step, ...]


@dataclass(frozen=True)
class Formula:
    """One derived gradient, in every form symattn writes it.

    `name` is `grad(T)`; `text` what `derive --gradients` prints for it (the check-only
    definitions of its index-notation parts, then `grad(T) = ...`); `node` the
    typed-IR right-hand side (None when L does not depend on T); `latex` and
    `mathml` the equation as the documents typeset it (no `$` around the LaTeX;
    drawn by the docs stage, see `symattn.present`); `sympy` the right-hand side
    as a SymPy matrix expression (`symattn.symbolic.sympy_form`).
    """

    name: str
    text: str
    node: t.Node | None = field(repr=False)
    spec: t.TypedSpec = field(repr=False, compare=False, hash=False)

    @property
    def tensor(self) -> str:
        return self.name[len("grad("):-1]

    @property
    def latex(self) -> str:
        return render("latex", self)[2:-2]

    @property
    def mathml(self) -> str:
        return render("mathml", self)

    @cached_property
    def sympy(self) -> sympy.Basic:
        """The right-hand side as a SymPy expression, dims symbolic.

        Matrix symbols stand for the spec's tensors (`P`) and upstream gradients
        (`grad(O)`); see `symattn.symbolic.sympy_form` for every rule. A gradient of rank 3 or
        more has no such form: a `SymbolicError` says so.
        """
        from .sympy_form import tensor_symbol, to_sympy

        shape = self.spec.tensors[self.tensor].shape
        if self.node is None:
            symbol = tensor_symbol(self.tensor, shape)
            return sympy.ZeroMatrix(*symbol.shape) if isinstance(symbol, sympy.MatrixSymbol) else sympy.Integer(0)
        try:
            return to_sympy(self.node, self.spec)
        except SymbolicError as err:
            raise SymbolicError(f"{self.name}: {err}; .text, .latex and .mathml still show it") from None

    def __str__(self) -> str:
        return self.text

    def _repr_latex_(self) -> str | None:
        return render("latex", self)

    def _repr_html_(self) -> str | None:
        return render("html", self)


@dataclass(repr=False)
class Derivation(Mapping):
    """Every gradient of a spec; also a read-only mapping from `"grad(T)"` to its `Formula`.

    `derivation["grad(Q)"]` (or `derivation["Q"]`) is a `Formula` with
    `.text`, `.latex`, `.mathml` and `.sympy`; an unknown name raises
    `UnknownGradientError` (a KeyError) that lists the known ones. In a notebook a
    derivation displays every formula typeset; `repr` is one line.
    """

    spec: t.TypedSpec
    gradients: dict[str, Gradient] = field(default_factory=dict)  # in the order derived: outputs first

    def _tensor(self, key: object) -> str | None:
        """The tensor a key names: `"grad(Q)"` or `"Q"`."""
        if not isinstance(key, str):
            return None
        name = key[len("grad("):-1].strip() if key.startswith("grad(") and key.endswith(")") else key
        return name if name in self.gradients else None

    def __getitem__(self, key: str) -> Formula:
        name = self._tensor(key)
        if name is None:
            known = ", ".join(f"grad({n})" for n in self.gradients)
            raise UnknownGradientError(f"no gradient {key!r} in {self.spec.name}; the known gradients are {known}")
        return Formula(f"grad({name})", self.formula(name), self.gradients[name].expr, self.spec)

    def __iter__(self) -> Iterator[str]:
        return (f"grad({name})" for name in self.gradients)

    def __len__(self) -> int:
        return len(self.gradients)

    def __contains__(self, key: object) -> bool:
        return self._tensor(key) is not None

    def __repr__(self) -> str:
        return f"<Derivation {self.spec.name}: {len(self.gradients)} gradients>"

    def _repr_html_(self) -> str | None:
        return render("html", self)

    def _repr_latex_(self) -> str | None:
        return render("latex", self)

    @cached_property
    def texts(self) -> dict[str, GradientText]:
        """Every gradient as spec text, its fresh names chosen once for the whole derivation
        (`symattn.symbolic.gradient_text`)."""
        return gradient_texts(self.spec, {name: g.expr for name, g in self.gradients.items()})

    def formula(self, name: str) -> str:
        """`grad(T) = ...` in spec syntax, after the check-only definitions it names, if any
        (`dX_1[l:N, m:d] = ...` for an index-notation part); `# grad(O): ...` for an output."""
        return str(self.texts[name])

    def one_line(self, name: str) -> str:
        """The gradient on one line, an index-notation part written in place as `[l, m] -> ...`:
        a caption (the comments of generated code), not spec text; `formula` is spec text."""
        expr = self.gradients[name].expr
        dims = list(self.spec.dims)
        if expr is None:
            return f"grad({name}) = 0    (L does not depend on {name})"
        if isinstance(expr, t.Grad) and name in self.spec.outputs:
            return f"grad({name})        (the upstream gradient of output {name})"
        if any(isinstance(n, t.Scatter) for n in t.walk(expr)):  # entry by entry: what reaches each entry
            expr = entry_form(expr) or expr
        if isinstance(expr, t.IndexDef):
            idx = ", ".join(i.name for i in expr.indices)
            head = f"grad({name})[{idx}]" if idx else f"grad({name})"
            return f"{head} = {to_spec(expr.body, dims)}"
        return f"grad({name}) = {to_spec(expr, dims)}"

    def __str__(self) -> str:
        return "\n".join(self.formula(n) for n in self.gradients)


class _Context:
    """What the rules need: the spec and the names of known subexpressions."""

    def __init__(self, spec: t.TypedSpec) -> None:
        self.spec = spec
        self.names = {info.expr: t.Tensor(name, info.shape) for name, info in spec.tensors.items()
                      if info.expr is not None and not isinstance(info.expr, t.IndexDef)}
        self.reserved = set(spec.dims) | set(spec.tensors)

    def ref(self, node: t.Node) -> t.Node:
        """A node, or the name of the tensor it defines (so P is written P, not softmax(S))."""
        return self.names.get(node, node)


# --- the adjoint rules: node, upstream G -> [Part(child, rule, build)] -----------------


@singledispatch
def _adjoint(node, g: t.Node, cx: _Context) -> list[Part]:
    raise SymbolicError(f"no adjoint rule for {type(node).__name__}")


@_adjoint.register(t.Tensor)
@_adjoint.register(t.Scalar)
@_adjoint.register(t.DimValue)
@_adjoint.register(t.Constant)
def _(node, g, cx):
    return []


# The local derivative of each elementwise function (rule text, adjoint builder), read live from
# the function table; `neg` is an operator, not a function.
UNARY_RULES = table("adjoint", {"neg": ("-A", lambda x, n, g, r: b.neg(g, r))})


@_adjoint.register
def _(node: t.Unary, g, cx):
    if node.fn in FUNCTIONS and FUNCTIONS[node.fn].steps:  # floor, ceil: no gradient flows through
        return []
    rule, make = UNARY_RULES[node.fn]
    return [Part(node.x, rule, lambda r: make(node.x, cx.ref(node), g, r))]


@_adjoint.register
def _(node: t.Binary, g, cx):
    x, y = node.a, node.b
    if node.op == "add":
        rule = "A + B: both get G, summed over broadcast axes"
        return [Part(x, rule, lambda r: b.sum_to(g, x.shape)),
                Part(y, rule, lambda r: b.sum_to(g, y.shape))]
    if node.op == "sub":
        return [Part(x, "A - B: A gets G", lambda r: b.sum_to(g, x.shape)),
                Part(y, "A - B: B gets -G", lambda r: b.sum_to(b.neg(g, r), y.shape))]
    if node.op == "mul":
        return [Part(x, "A * B: A gets G * B", lambda r: b.sum_to(b.mul(g, y, r), x.shape)),
                Part(y, "A * B: B gets A * G", lambda r: b.sum_to(b.mul(x, g, r), y.shape))]
    if node.op == "div":
        return [Part(x, "A / B: A gets G / B", lambda r: b.sum_to(b.div(g, y, r), x.shape)),
                Part(y, "A / B: B gets -(G * (A / B)) / B",
                     lambda r: b.sum_to(b.neg(b.div(b.mul(g, cx.ref(node), r), y, r), r), y.shape))]
    if node.op == "pow":
        if isinstance(y, t.Scalar) and y.value == 0:  # A^0 = 1 for every A, 0 and inf included
            return []
        if isinstance(y, t.Scalar):
            exponent = b.scalar(y.value - 1)

            def grad_x(r):
                return b.mul(g, b.mul(y, b.power(x, exponent, r), r), r)
        else:
            def grad_x(r):
                return b.mul(g, b.mul(y, b.power(x, b.sub(y, b.scalar(1), r), r), r), r)
        out = [Part(x, "A^B: A gets G * B * A^(B - 1)", lambda r: b.sum_to(grad_x(r), x.shape))]
        if not b.is_scalar_constant(y):
            out.append(Part(y, "A^B: B gets G * A^B * log(A)",
                            lambda r: b.sum_to(b.mul(g, b.mul(cx.ref(node), b.unary("log", x), r), r), y.shape)))
        return out
    raise SymbolicError(f"no adjoint rule for the elementwise operation {node.op}")


@_adjoint.register
def _(node: t.Apply, g, cx):
    record = OPERATIONS[node.fn]
    if record.integer:
        return []
    parts = []
    for k, arg in enumerate(node.args):
        rule = record.rules[min(k, len(record.rules) - 1)]

        def build(r, k=k, arg=arg):
            partial = record.partials(node.args, cx.ref(node), g, r)[k]
            return None if partial is None else b.sum_to(partial, arg.shape)
        if k == 0 or record.partials(node.args, node, g, None)[k] is not None:
            parts.append(Part(arg, rule, build))
    return parts


@_adjoint.register
def _(node: t.MatMul, g, cx):
    x, y = node.a, node.b
    if len(x.shape) == 1 and len(y.shape) == 1:  # a dot product: G is a scalar
        return [Part(x, "c = a @ b (vectors): grad(a) = grad(c) * b", lambda r: b.mul(g, y, r)),
                Part(y, "c = a @ b (vectors): grad(b) = a * grad(c)", lambda r: b.mul(x, g, r))]
    if len(x.shape) == 1 or len(y.shape) == 1:
        # A matrix times a vector: one gradient is a matrix product, the other an outer product,
        # which the matrix language cannot write without reshaping.
        raise SymbolicError("the gradient of @ between a matrix and a 1-D vector needs an outer product; "
                            "write the vector as a [1, n] or [n, 1] matrix")
    return [Part(x, "C = A @ B: grad(A) = grad(C) @ B.T",
                 lambda r: b.sum_to(b.matmul(g, b.transpose(y, r), r), x.shape)),
            Part(y, "C = A @ B: grad(B) = A.T @ grad(C)",
                 lambda r: b.sum_to(b.matmul(b.transpose(x, r), g, r), y.shape))]


@_adjoint.register
def _(node: t.Transpose, g, cx):
    return [Part(node.x, "C = A.T: grad(A) = grad(C).T", lambda r: b.transpose(g, r))]


@_adjoint.register
def _(node: t.Reduce, g, cx):
    x = node.x
    if node.kind == "sum":
        return [Part(x, "C = sum(A): every entry of A gets G", lambda r: b.expand_to(g, x.shape, r))]
    if node.kind == "mean":
        axes = range(len(x.shape)) if node.axis is None else [node.axis]
        count = t.DimValue(sympy.Mul(*[x.shape[k] for k in axes]))
        return [Part(x, "C = mean(A): every entry gets G / n", lambda r: b.expand_to(b.div(g, count, r), x.shape, r))]

    if node.kind in ("max", "min"):
        return [Part(x, f"C = {node.kind}(A): grad(A) = G / (the number of ties) where A == C, 0 elsewhere "
                        "(torch.amax's convention)", lambda r: _tie_share(x, cx.ref(node), g, node.axis))]

    def weights(r):
        if node.axis is None:
            return b.unary("exp", b.sub(x, cx.ref(node), r))
        return b.softmax(x, node.axis)
    return [Part(x, "C = logsumexp(A): grad(A) = G * softmax(A)", lambda r: b.mul(g, cx.ref(weights(r)), r))]


def _tie_share(x: t.Node, extreme: t.Node, g: t.Node, axis: int | None) -> t.Node:
    """where(A == C, G / sum(where(A == C, 1, 0)), 0): the gradient of C = max(A) or min(A),
    shared equally among the entries that attain it."""
    hit = b.compare("==", x, extreme)
    ties = b.reduce_sum(b.where(hit, b.scalar(1), b.scalar(0)), axis)
    return b.where(hit, b.div(g, ties), b.scalar(0))


@_adjoint.register
def _(node: t.Scan, g, cx):
    name = "reverse cumsum" if not node.reverse else "cumsum"
    back = t.Scan(g, node.axis, not node.reverse, g.shape)
    return [Part(node.x, f"C = {'cumsum' if not node.reverse else 'reverse cumsum'}(A): grad(A) = "
                         f"{name}(G), the scan the other way", lambda r: back)]


@_adjoint.register
def _(node: t.Softmax, g, cx):
    p = cx.ref(node)
    return [Part(node.x, "P = softmax(S): grad(S) = P * (grad(P) - sum(grad(P) * P))",
                 lambda r: b.mul(p, b.sub(g, b.reduce_sum(b.mul(g, p, r), node.axis), r), r))]


@_adjoint.register
def _(node: t.Where, g, cx):
    zero = b.scalar(0)
    return [Part(node.a, "where(c, A, B): A gets G where c",
                 lambda r: b.sum_to(b.where(node.cond, g, zero), node.a.shape)),
            Part(node.b, "where(c, A, B): B gets G elsewhere",
                 lambda r: b.sum_to(b.where(node.cond, zero, g), node.b.shape))]


@_adjoint.register
def _(node: t.MergeHeads, g, cx):
    heads = node.x.shape[-3]
    per_head = node.x.shape[-1]
    *batch, n, _ = g.shape
    split = t.SplitHeads(g, heads, (*batch, heads, n, per_head))
    return [Part(node.x, "C = merge_heads(A): grad(A) = split_heads(grad(C), h)", lambda r: split)]


@_adjoint.register
def _(node: t.SplitHeads, g, cx):
    *batch, h, n, k = g.shape
    merged = t.MergeHeads(g, (*batch, n, h * k))
    return [Part(node.x, "C = split_heads(A): grad(A) = merge_heads(grad(C))", lambda r: merged)]


@_adjoint.register
def _(node: t.Concat, g, cx):
    out, start = [], sympy.Integer(0)
    for part in node.parts:
        stop = start + part.shape[node.axis]
        piece = t.Slice(g, node.axis, start, stop, part.shape)
        out.append(Part(part, "concat: each part gets its slice of G", lambda r, piece=piece: piece))
        start = stop
    return out


@_adjoint.register
def _(node: t.Slice, g, cx):
    # grad(C) in the slice and zeros on either side, written as the spec language writes it:
    # concat(0 * ones(...), grad(C), 0 * ones(...)), each zero block present where it has entries
    x, axis = node.x, node.axis

    def zeros(size) -> t.Node:
        shape = tuple(size if k == axis else d for k, d in enumerate(x.shape))
        return t.Binary("mul", b.scalar(0), t.Constant("ones", shape, shape), shape)

    after = sympy.expand(x.shape[axis] - node.stop)
    parts = ([zeros(node.start)] if node.start != 0 else []) + [g] + ([zeros(after)] if after != 0 else [])
    grad = t.Concat(tuple(parts), axis, tuple(x.shape)) if len(parts) > 1 else g
    return [Part(x, "C = A[start:stop]: grad(A) is grad(C) in the slice, 0 elsewhere", lambda r: grad)]


@_adjoint.register
def _(node: t.IndexDef, g, cx):
    return index_adjoint(node, g, cx.spec, cx.reserved, UNARY_RULES)


# --- the driver --------------------------------------------------------------------


def derive(spec: t.TypedSpec) -> Derivation:
    """Reverse-mode derivation of every grad(T), in matrix form, with steps."""
    cx = _Context(spec)
    paths: dict[str, list[tuple[str, t.Node]]] = defaultdict(list)
    steps: dict[str, list[Step]] = defaultdict(list)
    for out in spec.outputs:
        paths[out].append(("upstream", t.Grad(out, spec.tensors[out].shape)))
    result = Derivation(spec)
    for name in reversed(list(spec.tensors)):
        info = spec.tensors[name]
        if not info.has_gradient:  # a buffer: a constant of the backward pass
            continue
        order = {n: k for k, n in enumerate(spec.tensors)}
        paths[name].sort(key=lambda path: order.get(path[0], -1))
        total, rec = None, b.Recorder()
        for _, part in paths[name]:
            total = b.add(total, part, rec)
        if len(paths[name]) > 1:
            steps[name].append(Step(f"sum over the {len(paths[name])} paths from {name} to the outputs",
                                    name, t.Grad(name, info.shape), total))
        steps[name].extend(Step(f"simplify: {s.rule}", name, s.before, s.after) for s in rec.steps)
        adjoint = t.Grad(name, info.shape)
        if name in spec.outputs and len(paths[name]) > 1:
            # An output that other tensors read: grad(O) names its upstream gradient (the
            # language's convention), and what flows into its definition is the sum of
            # that and every other path, written out.
            adjoint, total = total, adjoint
        result.gradients[name] = Gradient(name, total, tuple(paths[name]), tuple(steps[name]))
        if info.expr is None or total is None:
            continue
        _backprop(name, info.expr, adjoint, cx, paths, steps)
    return result


def _backprop(owner: str, node: t.Node, g: t.Node, cx: _Context, paths, steps) -> None:
    """Push upstream `g` through the definition of `owner` down to the tensors it references.

    Each contribution is built with a recorder of its own, so the simplifications recorded
    with it are exactly those made while building it. The steps taken inside the definition
    travel with each branch (`trail`) and are recorded for the tensor the branch reaches, so
    grad(T)'s steps start at the definition of each consumer of T.
    """
    if isinstance(node, t.Tensor):  # an alias, `O = A`: A gets grad(O) unchanged
        paths[node.name].append((owner, g))
        steps[node.name].append(Step("C = A: grad(A) = grad(C)", node.name, node, g))
        return
    work: list[tuple[t.Node, t.Node, tuple[Step, ...]]] = [(node, g, ())]
    while work:
        current, upstream, trail = work.pop()
        for part in _adjoint(current, upstream, cx):
            if isinstance(part.child, (t.Scalar, t.DimValue, t.Constant, t.Compare)):
                continue
            rec = b.Recorder()
            contribution = part.build(rec)
            if contribution is None:
                continue
            made = (Step(part.rule, owner, current, contribution),
                    *(Step(f"simplify: {s.rule}", owner, s.before, s.after) for s in rec.steps))
            if isinstance(part.child, t.Tensor):
                target = part.child.name
                steps[target].extend(replace(s, tensor=target) for s in trail + made)
                paths[target].append((owner, contribution))
            elif isinstance(part.child, t.IndexDef) or not isinstance(part.child, t.Node):
                raise SymbolicError(f"unexpected operand {type(part.child).__name__}")
            else:
                work.append((part.child, contribution, trail + made))
