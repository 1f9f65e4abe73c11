"""Print a program as a standalone NumPy module.

Contract: `numpy_source(spec)` returns the text of a Python module that imports
only NumPy and follows DESIGN.md's "Generated NumPy module" contract:
`forward(**tensors) -> {output: array}`, `backward(**tensors, grad_O=...) ->
{input or param: gradient}`, plus `forward_backward(...) -> (outputs,
gradients)` from one forward pass. Sizes are read from the arrays; extra
leading batch axes broadcast; a shape that disagrees with the spec is a
`ValueError` naming the tensor, the expected and the given shape; float32
stays float32 and float64 stays float64 (constants are Python scalars or
arrays of the input dtype); softmax is the stable one and a fully masked row
gives zeros, never NaN. `load_module(source)` executes such text as a module.

The printer is a table from operation to NumPy syntax (`UNARY`, `BINARY`,
`REDUCE`, `CONSTANT`, and one `_print` method per node type) plus the module
template and a few small runtime helpers, copied into a module only when it
uses them. Elementwise chains are computed in place (`S = Q @ K.T` then
`S += M`) when the buffer is fresh or dead, and the softmax and its backward
overwrite their input when nothing reads it afterwards; `Program` supplies the
liveness that makes those decisions safe.
"""

from __future__ import annotations

import types
from dataclasses import dataclass
from functools import singledispatchmethod

import sympy

from . import __version__
from . import typed as t
from .shapes import format_shape
from .codegen_index import IndexArray, LConst, LContract, LEntry, LNode, LOp, LScalarTensor, LSum, LVar
from .codegen_program import RETURNED, Arange, CodegenError, Program, SoftmaxGrad, Stmt, Var, build_program

__all__ = ["numpy_source", "load_module", "NumPyPrinter", "UNARY", "BINARY", "REDUCE", "CONSTANT"]

# Python precedence, loosest to tightest.
CMP, ADD, MUL, UNARY_PREC, POW, ATOM = 3, 5, 6, 7, 8, 10

UNARY = {  # fn -> (template over the operand, helper it needs)
    "neg": ("-{x}", None),
    "exp": ("np.exp({x})", None),
    "log": ("np.log({x})", None),
    "sqrt": ("np.sqrt({x})", None),
    "abs": ("np.abs({x})", None),
    "tanh": ("np.tanh({x})", None),
    "sin": ("np.sin({x})", None),
    "cos": ("np.cos({x})", None),
    "relu": ("np.maximum({x}, 0)", None),
    "sigmoid": ("_sigmoid({x})", "_sigmoid"),
}
SCALAR_UNARY = {"sqrt": "{x} ** 0.5", "neg": "-{x}"}  # on Python numbers; others: float(np.fn(x))
BINARY = {"add": ("+", ADD), "sub": ("-", ADD), "mul": ("*", MUL), "div": ("/", MUL), "pow": ("**", POW)}
INPLACE = {"add": "+=", "sub": "-=", "mul": "*=", "div": "/="}
REDUCE = {"sum": "np.sum({x}, axis={axis}, keepdims=True)", "mean": "np.mean({x}, axis={axis}, keepdims=True)",
          "logsumexp": "_logsumexp({x}, axis={axis})"}
CONSTANT = {
    "sinusoidal": ("_sinusoidal({args}, dtype)", "_sinusoidal"),
    "causal_mask": ("_causal_mask({args}, dtype)", "_causal_mask"),
    "eye": ("np.eye({args}, dtype=dtype)", None),
    "ones": ("np.ones(({args},), dtype=dtype)", None),
}

# Runtime helpers: name -> (source, helpers it calls). Copied into a module only when used.
HELPERS = {
    "_as_float": ('''
def _as_float(*arrays):
    """The arrays in their common floating dtype (integers become float64); no copy when already so."""
    arrays = [a if type(a) is np.ndarray else np.asarray(a) for a in arrays]
    dtype = np.result_type(np.float32, *arrays)
    if dtype.kind != "f":
        raise ValueError(f"expected real floating-point arrays, got dtype {dtype}")
    return dtype, [a if a.dtype == dtype else a.astype(dtype) for a in arrays]
''', ()),
    "_bind": ('''
def _bind(name, array, shape, expected):
    """The sizes of the last len(expected) axes of `array`; ValueError unless they are `expected` (None: any)."""
    rank = len(expected)
    sizes = array.shape[array.ndim - rank:]
    fits = array.ndim >= rank
    for want, size in zip(expected, sizes):
        if want is not None and want != size:
            fits = False
    if not fits:
        want = ", ".join("?" if e is None else str(e) for e in expected)
        raise ValueError(f"{name}: expected shape {shape} = [{want}] after any leading batch axes, "
                         f"got {list(array.shape)}")
    return sizes
''', ()),
    "_batch_axes": ('''
def _batch_axes(*arrays):
    """The broadcast shape of the leading batch axes of (name, array, rank) triples; ValueError if none."""
    leading = {name: array.shape[:array.ndim - rank] for name, array, rank in arrays}
    if not any(leading.values()):
        return ()
    try:
        return np.broadcast_shapes(*leading.values())
    except ValueError:
        shown = ", ".join(f"{name} {list(array.shape)}" for name, array, _ in arrays)
        raise ValueError(f"the leading batch axes do not broadcast: {shown}") from None
''', ()),
    "_take": ('''
def _take(tensors, names):
    """The arrays passed as these keywords, in order; TypeError for a missing or unexpected one."""
    missing = [n for n in names if n not in tensors]
    unexpected = sorted(set(tensors) - set(names))
    if missing or unexpected:
        raise TypeError(f"missing tensors {missing}, unexpected keywords {unexpected}; expected {list(names)}")
    return [tensors[n] for n in names]
''', ()),
    "_upstream": ('''
def _upstream(name, array, shape, expected, dtype):
    """An upstream gradient: the shape of its output (batch axes broadcast), in the forward pass's dtype."""
    array = np.asarray(array)
    _bind(name, array, shape, expected)
    return array.astype(dtype, copy=False)
''', ("_bind",)),
    "_sum_to": ('''
def _sum_to(grad, shape):
    """`grad` summed over the batch axes that broadcasting added, so that it has exactly `shape`."""
    if grad.shape == shape:
        return grad
    lead = grad.ndim - len(shape)
    if lead > 0:
        grad = grad.sum(axis=tuple(range(lead)))
    axes = tuple(k for k, n in enumerate(shape) if n == 1 and k >= len(shape) - grad.ndim
                 and grad.shape[k - len(shape) + grad.ndim] != 1)
    if axes:
        grad = grad.sum(axis=tuple(k - len(shape) for k in axes), keepdims=True)
    return np.broadcast_to(grad, shape).copy() if grad.shape != shape else grad
''', ()),
    "_softmax_": ('''
def _softmax_(x, axis):
    """softmax(x) along `axis`, stably (the row max is subtracted), computed in x's own buffer.

    A fully masked row (all -inf) gets weights 0, not NaN.
    """
    finfo = np.finfo(x.dtype)
    top = x.max(axis=axis, keepdims=True)
    x -= np.maximum(top, finfo.min, out=top)  # a row of -inf stays -inf ...
    np.exp(x, out=x)
    total = x.sum(axis=axis, keepdims=True)
    x /= np.maximum(total, finfo.tiny, out=total)  # ... and gets weights 0 / tiny = 0
    return x
''', ()),
    "_softmax": ('''
def _softmax(x, axis):
    """softmax(x) along `axis` in a new array (x is read again later)."""
    return _softmax_(np.array(x), axis)
''', ("_softmax_",)),
    "_softmax_backward_": ('''
def _softmax_backward_(P, dP, rowdot):
    """grad(S) = P * (dP - rowdot) for P = softmax(S), rowdot = sum(dP * P) along the softmax axis.

    Computed in dP's buffer (dP is not read again) when the shapes allow it.
    """
    fits = dP.shape == P.shape and dP.ndim >= rowdot.ndim and dP.flags.writeable
    for r, s in zip(rowdot.shape[::-1], dP.shape[::-1]):
        if r != 1 and r != s:
            fits = False
    if not fits:
        return P * (dP - rowdot)
    dP -= rowdot
    dP *= P
    return dP
''', ()),
    "_softmax_backward": ('''
def _softmax_backward(P, dP, rowdot):
    """grad(S) = P * (dP - rowdot) for P = softmax(S), in a new array."""
    return P * (dP - rowdot)
''', ()),
    "_rowdot": ('''
def _rowdot(a, b):
    """sum(a * b, axis=-1), keeping the axis, without an array of the products."""
    return np.einsum("...j,...j->...", a, b)[..., None]
''', ()),
    "_logsumexp": ('''
def _logsumexp(x, axis):
    """log(sum(exp(x))) along `axis`, stably; -inf for a fully masked row."""
    top = x.max(axis=axis, keepdims=True)
    np.maximum(top, np.finfo(x.dtype).min, out=top)  # a row of -inf: exp(-inf - min) = 0, log(0) = -inf
    with np.errstate(divide="ignore"):
        return np.log(np.exp(x - top).sum(axis=axis, keepdims=True)) + top
''', ()),
    "_sigmoid": ('''
def _sigmoid(x):
    """1 / (1 + exp(-x)), written with tanh so that it never overflows."""
    return 0.5 * np.tanh(0.5 * x) + 0.5
''', ()),
    "_merge_heads": ('''
def _merge_heads(x):
    """[..., h, N, k] -> [..., N, h * k], head-major."""
    x = x.swapaxes(-3, -2)
    return x.reshape(*x.shape[:-2], x.shape[-2] * x.shape[-1])
''', ()),
    "_split_heads": ('''
def _split_heads(x, heads):
    """[..., N, h * k] -> [..., h, N, k], the inverse of _merge_heads."""
    return x.reshape(*x.shape[:-1], heads, x.shape[-1] // heads).swapaxes(-3, -2)
''', ()),
    "_concat": ('''
def _concat(parts, axis):
    """np.concatenate along `axis` (negative), after broadcasting the leading batch axes."""
    rank = -axis
    batch = np.broadcast_shapes(*(p.shape[:p.ndim - rank] for p in parts))
    return np.concatenate([np.broadcast_to(p, batch + p.shape[p.ndim - rank:]) for p in parts], axis=axis)
''', ()),
    "_expand": ('''
def _expand(x, shape):
    """`x` broadcast over the trailing `shape` (its leading batch axes kept); a read-only view."""
    return np.broadcast_to(x, x.shape[:x.ndim - len(shape)] + shape)
''', ()),
    "_sinusoidal": ('''
def _sinusoidal(n, width, dtype):
    """E[i, 2c] = sin(i / 10000^(2c/width)), E[i, 2c+1] = cos(i / 10000^(2c/width)), i from 0."""
    column = np.arange(width)
    angle = np.arange(n)[:, None] / 10000.0 ** (2 * (column // 2) / width)
    return np.where(column % 2 == 0, np.sin(angle), np.cos(angle)).astype(dtype)
''', ()),
    "_causal_mask": ('''
def _causal_mask(n, dtype):
    """0 on and below the diagonal, -inf above it."""
    return np.triu(np.full((n, n), -np.inf, dtype=dtype), k=1)
''', ()),
}

RESERVED = {"np", "dtype", "outputs", "gradients", "forward", "backward", "forward_backward",
            "_forward_backward", "_", "float", "dict", "tuple", "list", "len", "range", "ValueError"} | set(HELPERS)


@dataclass
class Code:
    """Printed code: its text, Python precedence, whether it makes a new array, whether it has the dtype."""

    text: str
    prec: int = ATOM
    fresh: bool = True
    carrying: bool = True  # an array of the computation's dtype (not a Python number, not float64 by accident)


def _wrap(code: Code, need: int) -> str:
    return code.text if code.prec >= need else f"({code.text})"


class NumPyPrinter:
    """Print one `Program` as a module."""

    def __init__(self, program: Program) -> None:
        self.p = program
        self.spec = program.spec
        self.helpers: set[str] = set()
        self.k = 0  # the statement being printed
        self.owned: dict[str, bool] = {}
        self.parent: dict[str, str] = {}
        self.dims = {self.spec.dims[n].symbol: v for n, v in program.dim_vars.items()}

    # --- dims and scalars -----------------------------------------------------------------

    def dim(self, expr, integer: bool = True) -> Code:
        """A dim expression as Python arithmetic on the size variables."""
        expr = sympy.sympify(expr)
        if expr.is_Integer:
            return Code(str(int(expr)), ATOM if expr >= 0 else UNARY_PREC, carrying=False)
        if expr.is_Rational:
            return Code(f"{expr.p} / {expr.q}", MUL, carrying=False)
        if expr.is_Symbol:
            if expr not in self.dims:
                raise CodegenError(f"unknown dim {expr}")
            return Code(self.dims[expr], carrying=False)
        if expr.is_Add:
            terms = [self.dim(a, integer) for a in expr.as_ordered_terms()]
            text = terms[0].text
            for term in terms[1:]:
                text += f" - {term.text[1:]}" if term.text.startswith("-") else f" + {_wrap(term, ADD + 1)}"
            return Code(text, ADD, carrying=False)
        if expr.is_Mul:
            coeff, rest = expr.as_coeff_Mul()
            num, den = sympy.fraction(coeff)
            factors = ([str(num)] if num != 1 else []) + [_wrap(self.dim(f, integer), MUL + 1)
                                                       for f in sympy.Mul.make_args(rest)]
            text = " * ".join(factors) if factors else "1"
            if den != 1:
                text = f"{text} {'//' if integer else '/'} {den}"
            return Code(text, MUL, carrying=False)
        if expr.is_Pow:
            base, exp = expr.as_base_exp()
            if exp == sympy.Rational(1, 2):
                return Code(f"{_wrap(self.dim(base, integer), ATOM)} ** 0.5", POW, carrying=False)
            return Code(f"{_wrap(self.dim(base, integer), ATOM)} ** {_wrap(self.dim(exp), UNARY_PREC)}", POW,
                        carrying=False)
        raise CodegenError(f"cannot print the dim expression {expr}")

    def shape_tuple(self, shape) -> str:
        parts = [self.dim(d).text for d in shape]
        return "(" + ", ".join(parts) + ("," if len(parts) == 1 else "") + ")"

    @staticmethod
    def number(value) -> Code:
        value = sympy.sympify(value)
        if value == sympy.oo:
            return Code("np.inf", carrying=False)
        if value == -sympy.oo:
            return Code("-np.inf", UNARY_PREC, carrying=False)
        if value == sympy.pi:
            return Code("np.pi", carrying=False)
        if value.is_Integer:
            return Code(str(int(value)), ATOM if value >= 0 else UNARY_PREC, carrying=False)
        if value.is_Rational:
            as_float = float(value)
            if sympy.Rational(repr(as_float)) == value:
                return Code(repr(as_float), ATOM if as_float >= 0 else UNARY_PREC, carrying=False)
            return Code(f"{value.p} / {value.q}", MUL, carrying=False)
        return Code(repr(float(value)), ATOM, carrying=False)

    # --- values ----------------------------------------------------------------------------

    def sources(self, node) -> frozenset:
        found: set[str] = set()
        stack = [node]
        while stack:
            n = stack.pop()
            var = n.name if isinstance(n, Var) else n.var if isinstance(n, (LVar, LEntry, LScalarTensor)) else None
            if var is not None:
                found |= self.p.info[var].sources
            elif isinstance(n, IndexArray):
                stack.append(n.root)
            elif isinstance(n, LOp):
                stack.extend(n.args)
            elif isinstance(n, LContract):
                stack.extend(n.factors)
            elif isinstance(n, LSum):
                stack.append(n.x)
            elif isinstance(n, t.Node):
                stack.extend(n.children)
        return frozenset(found)

    def batched(self, node) -> bool:
        return bool(self.sources(node))

    def aligned(self, node: t.Node, rank: int) -> Code:
        """`node` printed, with axes inserted before its own so that its batch axes line up at `rank`."""
        code = self.print(node)
        own = len(node.shape)
        if own >= rank or not self.batched(node):
            return code
        index = ", ".join(["..."] + ["None"] * (rank - own) + [":"] * own)
        return Code(f"{_wrap(code, ATOM)}[{index}]", ATOM, False, code.carrying)

    def print(self, node) -> Code:
        return self._print(node)

    @singledispatchmethod
    def _print(self, node) -> Code:
        raise CodegenError(f"no NumPy printing rule for {type(node).__name__}")

    @_print.register
    def _(self, node: Var) -> Code:
        return Code(node.name, ATOM, fresh=False)

    @_print.register
    def _(self, node: t.Scalar) -> Code:
        return self.number(node.value)

    @_print.register
    def _(self, node: t.DimValue) -> Code:
        return self.dim(node.dim, integer=False)

    def reciprocal(self, node: t.Node) -> Code:
        """1 / node for a constant scalar, as Python arithmetic: `d_k ** -0.5` for sqrt(d_k)."""
        if isinstance(node, t.Unary) and node.fn == "sqrt":
            return Code(f"{_wrap(self.print(node.x), POW + 1)} ** -0.5", POW, carrying=False)
        if isinstance(node, t.Scalar) and node.value != 0:
            return self.number(1 / node.value)
        return Code(f"1 / {_wrap(self.print(node), MUL + 1)}", MUL, carrying=False)

    def _constant_scalar(self, node: t.Node) -> bool:
        return node.shape == () and not self.batched(node) and not any(
            isinstance(n, (Var, t.Constant, IndexArray)) for n in _nodes(node))

    @_print.register
    def _(self, node: t.Unary) -> Code:
        x = self.print(node.x)
        if self._constant_scalar(node):  # Python arithmetic keeps the scalar "weak": no upcast of float32
            if node.fn in SCALAR_UNARY:
                need = POW + 1 if node.fn == "sqrt" else UNARY_PREC
                return Code(SCALAR_UNARY[node.fn].format(x=_wrap(x, need)),
                            POW if node.fn == "sqrt" else UNARY_PREC, carrying=False)
            return Code(f"float({UNARY[node.fn][0].format(x=x.text)})", carrying=False)
        template, helper = UNARY[node.fn]
        if helper:
            self.helpers.add(helper)
        if node.fn == "neg":
            return Code(f"-{_wrap(x, UNARY_PREC)}", UNARY_PREC, True, x.carrying)
        return Code(template.format(x=x.text), ATOM, True, x.carrying)

    @_print.register
    def _(self, node: t.Binary) -> Code:
        rank = len(node.shape)
        if node.op == "div" and node.a.shape and self._constant_scalar(node.b):
            # an array divided by a constant is multiplied by its reciprocal: a multiplication is cheaper
            a = self.aligned(node.a, rank)
            return Code(f"{_wrap(a, MUL)} * {_wrap(self.reciprocal(node.b), MUL + 1)}", MUL, True, a.carrying)
        a, b = self.aligned(node.a, rank), self.aligned(node.b, rank)
        symbol, prec = BINARY[node.op]
        if node.op == "pow":
            text = f"{_wrap(a, ATOM)} ** {_wrap(b, UNARY_PREC)}"
        else:
            text = f"{_wrap(a, prec)} {symbol} {_wrap(b, prec + 1)}"
        return Code(text, prec, True, a.carrying or b.carrying)

    @_print.register
    def _(self, node: t.MatMul) -> Code:
        a_node, b_node = node.a, node.b
        a, b = self.print(a_node), self.print(b_node)
        ra, rb = len(a_node.shape), len(b_node.shape)
        squeeze = ""
        if ra == 1 and self.batched(a_node):  # a batched vector: make it a row, take the row back after
            a, ra, squeeze = Code(f"{_wrap(a, ATOM)}[..., None, :]", ATOM, False), 2, "[..., 0, :]"
        if rb == 1 and self.batched(b_node):
            b, rb = Code(f"{_wrap(b, ATOM)}[..., :, None]", ATOM, False), 2
            squeeze = "[..., 0, 0]" if squeeze else "[..., 0]"
        rank = max(ra, rb)
        if ra < rank and self.batched(a_node):
            a = Code(f"{_wrap(a, ATOM)}[{', '.join(['...'] + ['None'] * (rank - ra) + [':'] * ra)}]", ATOM, False)
        if rb < rank and self.batched(b_node):
            b = Code(f"{_wrap(b, ATOM)}[{', '.join(['...'] + ['None'] * (rank - rb) + [':'] * rb)}]", ATOM, False)
        left = f"({a.text})" if a.prec == MUL else _wrap(a, MUL)  # `(Q / c) @ K`, not `Q / c @ K`
        text = f"{left} @ {_wrap(b, MUL + 1)}"
        if squeeze:
            return Code(f"({text}){squeeze}", ATOM, False)
        return Code(text, MUL, True)

    @_print.register
    def _(self, node: t.Transpose) -> Code:
        x = self.print(node.x)
        return Code(f"{_wrap(x, ATOM)}.swapaxes(-1, -2)", ATOM, False, x.carrying)

    def _axis(self, axis, rank) -> str:
        if axis is None:
            return "(" + ", ".join(str(k) for k in range(-rank, 0)) + ("," if rank == 1 else "") + ")"
        return str(axis - rank)

    @_print.register
    def _(self, node: t.Reduce) -> Code:
        rank = len(node.x.shape)
        inner = node.x
        if node.kind == "sum" and node.axis == rank - 1 and isinstance(inner, t.Binary) and inner.op == "mul" \
                and inner.a.shape == inner.b.shape == inner.shape and rank >= 1:
            self.helpers.add("_rowdot")  # no array of the products
            a, b = self.print(inner.a), self.print(inner.b)
            return Code(f"_rowdot({a.text}, {b.text})", ATOM, True, a.carrying or b.carrying)
        x = self.print(inner)
        if node.kind == "logsumexp":
            self.helpers.add("_logsumexp")
        return Code(REDUCE[node.kind].format(x=x.text, axis=self._axis(node.axis, rank)), ATOM, True, x.carrying)

    @_print.register
    def _(self, node: t.Softmax) -> Code:
        axis = node.axis - len(node.x.shape)
        x = self.print(node.x)
        if x.fresh or self._dead(node.x):
            self.helpers.add("_softmax_")
            self.consumed = getattr(node.x, "name", None)
            return Code(f"_softmax_({x.text}, axis={axis})", ATOM, True, x.carrying)
        self.helpers.update({"_softmax", "_softmax_"})
        return Code(f"_softmax({x.text}, axis={axis})", ATOM, True, x.carrying)

    @_print.register
    def _(self, node: SoftmaxGrad) -> Code:
        p, rowdot = self.print(node.p), self.print(node.rowdot)
        g = self.print(node.g)
        if g.fresh or self._dead(node.g):
            self.helpers.add("_softmax_backward_")
            self.consumed = getattr(node.g, "name", None)
            return Code(f"_softmax_backward_({p.text}, {g.text}, {rowdot.text})", ATOM, True)
        self.helpers.add("_softmax_backward")
        return Code(f"_softmax_backward({p.text}, {g.text}, {rowdot.text})", ATOM, True)

    @_print.register
    def _(self, node: t.Compare) -> Code:
        rank = len(node.shape)
        a, b = self.aligned(node.a, rank), self.aligned(node.b, rank)
        return Code(f"{_wrap(a, ADD)} {node.op} {_wrap(b, ADD)}", CMP, True, False)

    @_print.register
    def _(self, node: t.Where) -> Code:
        rank = len(node.shape)
        c, a, b = (self.aligned(n, rank) for n in (node.cond, node.a, node.b))
        text = f"np.where({c.text}, {a.text}, {b.text})"
        if not (a.carrying or b.carrying):
            return Code(f"{text}.astype(dtype)", ATOM, True)
        return Code(text, ATOM, True)

    @_print.register
    def _(self, node: t.MergeHeads) -> Code:
        self.helpers.add("_merge_heads")
        return Code(f"_merge_heads({self.print(node.x).text})", ATOM, False)

    @_print.register
    def _(self, node: t.SplitHeads) -> Code:
        self.helpers.add("_split_heads")
        return Code(f"_split_heads({self.print(node.x).text}, {self.dim(node.heads).text})", ATOM, False)

    @_print.register
    def _(self, node: t.Concat) -> Code:
        self.helpers.add("_concat")
        parts = ", ".join(self.print(p).text for p in node.parts)
        return Code(f"_concat([{parts}], axis={node.axis - len(node.shape)})", ATOM, True)

    @_print.register
    def _(self, node: t.Constant) -> Code:
        template, helper = CONSTANT[node.kind]
        if helper:
            self.helpers.add(helper)
        args = ", ".join(self.dim(a).text for a in node.args)
        return Code(template.format(args=args), ATOM, True)

    @_print.register
    def _(self, node: t.SumTo) -> Code:
        x = self.print(node.x)
        rank = len(node.x.shape)
        lead = rank - len(node.shape)
        kept = tuple(a - rank for a in node.axes if a >= lead)
        text = x.text
        if kept:
            text = f"np.sum({text}, axis={kept[0] if len(kept) == 1 else kept}, keepdims=True)"
        if lead:
            axes = tuple(range(-rank, -rank + lead))
            text = f"np.sum({text}, axis={axes[0] if len(axes) == 1 else axes})"
        return Code(text, ATOM, True, x.carrying)

    @_print.register
    def _(self, node: t.Slice) -> Code:
        x = self.print(node.x)
        cut = f"{self.dim(node.start).text}:{self.dim(node.stop).text}"
        after = len(node.x.shape) - 1 - node.axis
        return Code(f"{_wrap(x, ATOM)}[{', '.join(['...', cut] + [':'] * after)}]", ATOM, False, x.carrying)

    @_print.register
    def _(self, node: IndexArray) -> Code:
        root = node.root
        target = node.indices
        if not root.labels and not self.batched(root):
            value = self.label(root)
            return Code(f"np.full({self.shape_tuple(node.ranges)}, {value.text}, dtype=dtype)", ATOM, True)
        present = tuple(n for n in target if n in root.labels)
        code = self.label_aligned(root, target, keep_missing=True)
        if len(present) < len(target):
            self.helpers.add("_expand")
            code = Code(f"_expand({code.text}, {self.shape_tuple(node.ranges)})", ATOM, False, code.carrying)
        if not code.carrying:
            code = Code(f"{_wrap(code, ATOM)}.astype(dtype)", ATOM, True)
        return code

    # --- index notation: labelled arrays ----------------------------------------------------

    def label(self, node: LNode) -> Code:
        """A labelled node printed with its own labels, in their order."""
        if isinstance(node, LEntry):
            if len(set(node.indices)) == len(node.indices):
                return Code(node.var, ATOM, False)
            letters = _letters(node.indices)
            sub = "".join(letters[i] for i in node.indices)
            out = "".join(letters[i] for i in node.labels)
            dots = "..." if self.batched(node) else ""
            return Code(f'np.einsum("{dots}{sub}->{dots}{out}", {node.var})', ATOM, False)
        if isinstance(node, (LVar, LScalarTensor)):
            return Code(node.var, ATOM, False)
        if isinstance(node, LConst):
            return self.print(node.node)
        if isinstance(node, LOp):
            return self._label_op(node)
        if isinstance(node, LContract):
            return self._contract(node)
        if isinstance(node, LSum):
            x = self.label(node.x)
            axis = node.x.labels.index(node.index) - len(node.x.labels)
            return Code(f"np.sum({x.text}, axis={axis})", ATOM, True, x.carrying)
        raise CodegenError(f"no NumPy printing rule for {type(node).__name__}")

    def label_aligned(self, node: LNode, target: tuple[str, ...], keep_missing: bool = False) -> Code:
        """`node` with its axes permuted and new axes inserted so that its labels line up with `target`."""
        code = self.label(node)
        labels = node.labels
        present = tuple(n for n in target if n in labels)
        if labels != present:  # same labels, other order: move the axes
            src = [labels.index(n) - len(labels) for n in present]
            if len(labels) == 2:
                code = Code(f"{_wrap(code, ATOM)}.swapaxes(-1, -2)", ATOM, False, code.carrying)
            else:
                dst = list(range(-len(labels), 0))
                code = Code(f"np.moveaxis({code.text}, {src}, {dst})", ATOM, False, code.carrying)
        if len(present) == len(target) or (not labels and not self.batched(node)):
            return code
        batched = self.batched(node)
        index = [":" if n in labels else "None" for n in target]
        if not batched:
            while index and index[0] == "None":
                index.pop(0)
        if batched:
            index.insert(0, "...")
        if all(i == ":" for i in index):
            return code
        return Code(f"{_wrap(code, ATOM)}[{', '.join(index)}]", ATOM, False, code.carrying)

    def _label_op(self, node: LOp) -> Code:
        args = [self.label_aligned(a, node.labels) for a in node.args]
        carrying = any(a.carrying for a in args)
        if node.kind == "unary":
            fake = t.Unary(node.op, t.Scalar(sympy.Integer(0)), ())
            template, helper = UNARY[node.op]
            if helper:
                self.helpers.add(helper)
            if not node.labels and not self.batched(node):  # a scalar: Python arithmetic
                del fake
                if node.op in SCALAR_UNARY:
                    return Code(SCALAR_UNARY[node.op].format(x=_wrap(args[0], POW + 1)), POW, carrying=False)
                return Code(f"float({template.format(x=args[0].text)})", carrying=False)
            if node.op == "neg":
                return Code(f"-{_wrap(args[0], UNARY_PREC)}", UNARY_PREC, True, carrying)
            return Code(template.format(x=args[0].text), ATOM, True, carrying)
        if node.kind == "binary":
            symbol, prec = BINARY[node.op]
            a, b = args
            if node.op == "pow":
                return Code(f"{_wrap(a, ATOM)} ** {_wrap(b, UNARY_PREC)}", POW, True, carrying)
            return Code(f"{_wrap(a, prec)} {symbol} {_wrap(b, prec + 1)}", prec, True, carrying)
        if node.kind == "compare":
            a, b = args
            return Code(f"{_wrap(a, ADD)} {node.op} {_wrap(b, ADD)}", CMP, True, False)
        c, a, b = args
        text = f"np.where({c.text}, {a.text}, {b.text})"
        if not (a.carrying or b.carrying):
            return Code(f"{text}.astype(dtype)", ATOM, True)
        return Code(text, ATOM, True)

    def _contract(self, node: LContract) -> Code:
        operands = []
        for f in node.factors:
            if isinstance(f, LEntry):
                operands.append((Code(f.var, ATOM, False), f.indices, self.batched(f)))
            else:
                operands.append((self.label(f), f.labels, self.batched(f)))
        code = self._matmul_form(operands, node) or self._einsum(operands, node)
        if node.coeff is not None:
            c = self.print(node.coeff)
            code = Code(f"{_wrap(c, MUL)} * {_wrap(code, MUL + 1)}", MUL, True, code.carrying)
        return code

    def _matmul_form(self, operands, node: LContract) -> Code | None:
        if len(operands) != 2 or len(node.summed) != 1 or len(node.labels) != 2:
            return None
        (a, ia, _), (b, ib, _) = operands
        k = node.summed[0]
        if len(ia) != 2 or len(ib) != 2 or len(set(ia)) != 2 or len(set(ib)) != 2 or k not in ia or k not in ib:
            return None
        fa = ia[0] if ia[1] == k else ia[1]
        fb = ib[0] if ib[1] == k else ib[1]
        if fa == fb or {fa, fb} != set(node.labels):
            return None

        def oriented(code: Code, have, want) -> str:
            return code.text if tuple(have) == want else f"{_wrap(code, ATOM)}.swapaxes(-1, -2)"

        if node.labels == (fa, fb):
            return Code(f"{oriented(a, ia, (fa, k))} @ {oriented(b, ib, (k, fb))}", MUL, True)
        return Code(f"{oriented(b, ib, (fb, k))} @ {oriented(a, ia, (k, fa))}", MUL, True)

    def _einsum(self, operands, node: LContract) -> Code:
        names = [n for _, idx, _ in operands for n in idx] + list(node.labels)
        letters = _letters(names)
        any_batch = any(batched for _, _, batched in operands)
        subs = ",".join(("..." if batched else "") + "".join(letters[n] for n in idx)
                        for _, idx, batched in operands)
        out = ("..." if any_batch else "") + "".join(letters[n] for n in node.labels)
        args = ", ".join(code.text for code, _, _ in operands)
        optimize = ", optimize=True" if len(operands) > 2 else ""
        return Code(f'np.einsum("{subs}->{out}", {args}{optimize})', ATOM, True)

    # --- buffers: which arrays a statement may overwrite --------------------------------

    def _find(self, var: str) -> str:
        while self.parent.get(var, var) != var:
            var = self.parent[var]
        return var

    def _union(self, a: str, b: str) -> None:
        ra, rb = self._find(a), self._find(b)
        if ra != rb:
            self.parent[ra] = rb

    def _dead(self, node) -> bool:
        """Whether `node` is a variable this code owns and that nothing reads after the current statement."""
        if not isinstance(node, Var):
            return False
        var = node.name
        if not self.owned.get(var):
            return False
        root = self._find(var)
        group = [v for v in self.owned if self._find(v) == root] + [v for v in self.p.info if
                                                                     self._find(v) == root]
        return all(self.p.info[v].last_use <= self.k for v in group if v in self.p.info)

    # --- statements ------------------------------------------------------------------------

    def statement(self, k: int, stmt: Stmt) -> list[str]:
        self.k = k
        self.consumed = None
        var = stmt.var
        if isinstance(stmt.node, Arange):
            self.owned[var] = True
            return [f"{var} = np.arange({self.dim(stmt.node.size).text}, dtype=dtype)"]
        if stmt.labels is not None:
            code = self.label(stmt.node)
            self._record(var, stmt, code.fresh)
            if not code.carrying:
                return [f"{var} = {_wrap(code, ATOM)}.astype(dtype)"]
            return [f"{var} = {code.text}"]
        lines = self._in_place(var, stmt)
        if lines is None:
            code = self.print(stmt.node)
            lines = [f"{var} = {code.text}"]
            self._record(var, stmt, code.fresh)
        return lines

    def _record(self, var: str, stmt: Stmt, fresh: bool) -> None:
        self.owned[var] = fresh or self.consumed is not None
        if self.consumed is not None:
            self._union(var, self.consumed)
        elif not fresh:
            for read in stmt.reads:
                self._union(var, read)

    def _in_place(self, var: str, stmt: Stmt) -> list[str] | None:
        """`var = base; var op= operand ...` when the elementwise chain can reuse one buffer."""
        node, ops = stmt.node, []
        while isinstance(node, t.Binary) and node.op in INPLACE:
            if self._fits(node, node.a, node.b):
                ops.append((node.op, node.b))
                node = node.a
            elif node.op in ("add", "mul") and self._fits(node, node.b, node.a):
                ops.append((node.op, node.a))
                node = node.b
            else:
                break
        if not ops:
            return None
        base = self.print(node)
        if not base.carrying:
            return None
        if not base.fresh:
            if not self._dead(node) or any(_mentions(operand, node.name) for _, operand in ops):
                return None
            self.consumed = node.name
        elif self.consumed is not None and any(_mentions(operand, self.consumed) for _, operand in ops):
            return None
        lines = [f"{var} = {base.text}"]
        for op, operand in reversed(ops):
            if op == "div" and self._constant_scalar(operand):
                lines.append(f"{var} *= {self.reciprocal(operand).text}")
            else:
                lines.append(f"{var} {INPLACE[op]} {self.aligned(operand, len(stmt.shape)).text}")
        self._record(var, stmt, True)
        return lines

    def _fits(self, node: t.Binary, base: t.Node, operand: t.Node) -> bool:
        """`base op= operand` gives `node`: same shape, and the operand's batch axes fit into the base's."""
        return (len(base.shape) > 0 and tuple(base.shape) == tuple(node.shape)
                and self.sources(operand) <= self.sources(base))


def _letters(names) -> dict[str, str]:
    pool = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
    out: dict[str, str] = {}
    for n in names:
        if n not in out:
            if len(out) == len(pool):
                raise CodegenError("more than 52 distinct indices in one contraction")
            out[n] = pool[len(out)]
    return out


def _nodes(node):
    stack = [node]
    while stack:
        n = stack.pop()
        yield n
        if isinstance(n, t.Node) and not isinstance(n, IndexArray):
            stack.extend(n.children)


def _mentions(node, var: str) -> bool:
    for n in _nodes(node):
        if isinstance(n, Var) and n.name == var:
            return True
        if isinstance(n, IndexArray):
            return True  # conservative
    return False


# --- the module -------------------------------------------------------------------------------


def _module_name(spec: t.TypedSpec) -> str:
    return spec.name if spec.name.isidentifier() else "attention"


def numpy_source(spec: t.TypedSpec, derivation=None) -> str:
    """The text of the generated NumPy module for `spec` (see the module docstring)."""
    program = build_program(spec, derivation, reserved=RESERVED)
    printer = NumPyPrinter(program)
    order = list(spec.dims)
    leaves = [program.tensor_vars[n] for n in spec.leaves]
    keywords = [program.upstream[o] for o in spec.outputs]
    unsafe = [n for n in list(spec.leaves) if program.tensor_vars[n] != n]

    body: list[str] = []
    body.append(f"dtype, ({', '.join(leaves)}{',' if len(leaves) == 1 else ''}) = _as_float({', '.join(leaves)})")
    printer.helpers.update({"_as_float", "_bind", "_batch_axes", "_upstream"})
    body += _bind_dims(spec, program, printer)
    body.append("")
    body.append("# forward pass")
    named = set(program.tensor_vars.values()) | set(program.grad_vars.values())

    def consumed() -> str | None:
        return printer.consumed if printer.consumed in named else None

    for k, stmt in enumerate(program.forward):
        body += _comment(stmt, printer.statement(k, stmt), consumed())
    outputs = ", ".join(f'"{o}": {program.tensor_vars[o]}' for o in spec.outputs)
    body.append(f"outputs = {{{outputs}}}")
    body.append(f"if {keywords[0]} is None:")
    body.append("    return outputs, None")
    body.append("")
    body.append("# backward pass: L = " + " + ".join(f"sum({o} * grad({o}))" for o in spec.outputs)
                + "; dT is grad(T) = dL/dT")
    for out in spec.outputs:
        shape = spec.tensors[out].shape
        body.append(f"{program.grad_vars[out]} = _upstream(\"{program.upstream[out]}\", {program.upstream[out]}, "
                    f"\"{format_shape(shape, order)}\", {printer.shape_tuple(shape)}, dtype)")
    for k, stmt in enumerate(program.backward, start=program.forward_count):
        body += _comment(stmt, printer.statement(k, stmt), consumed())
    grads = []
    for leaf in spec.leaves:
        var = program.leaf_grads[leaf]
        leaf_var = program.tensor_vars[leaf]
        if var is None:
            grads.append(f'"{leaf}": np.zeros_like({leaf_var})')
        else:
            printer.helpers.add("_sum_to")
            grads.append(f'"{leaf}": _sum_to({var}, {leaf_var}.shape)')
    body.append("gradients = {")
    body += [f"    {g}," for g in grads]
    body.append("}")
    body.append("return outputs, gradients")

    lines = _header(spec, program)
    lines += ["", "import numpy as np", "", '__all__ = ["forward", "backward", "forward_backward"]', "", ""]
    lines += _public(spec, program, leaves, keywords, unsafe, printer)
    signature = ", ".join(leaves + [f"{kw}=None" for kw in keywords])
    lines.append(f"def _forward_backward({signature}):")
    lines += [("    " + line) if line else "" for line in body]
    lines += _helper_sources(printer.helpers)
    return "\n".join(lines).rstrip() + "\n"


def _comment(stmt: Stmt, lines: list[str], consumed: str | None) -> list[str]:
    """The formula a statement computes, where its code does not read as that formula already."""
    plain = len(lines) == 1 and not stmt.rewritten and stmt.labels is None and not isinstance(stmt.node, IndexArray)
    out = []
    if stmt.title and not plain:
        out.append(f"# {stmt.title}")
    if stmt.note:
        out.append(f"#   using {stmt.note}")
    if consumed is not None and len(lines) == 1:
        out.append(f"# (in {consumed}'s buffer: {consumed} is not read again)")
    return out + lines


def _bind_dims(spec: t.TypedSpec, program: Program, printer: NumPyPrinter) -> list[str]:
    """Read each dim's size from the first array that has it alone on an axis; check every array against them."""
    order = list(spec.dims)
    bound: set[sympy.Symbol] = set()
    lines: list[str] = []
    later: list[str] = []  # arrays with an axis that could not be checked when they were read

    def call(leaf: str, expected: list[str]) -> str:
        shape = format_shape(spec.tensors[leaf].shape, order)
        tail = "," if len(expected) == 1 else ""
        return f'_bind("{leaf}", {program.tensor_vars[leaf]}, "{shape}", ({", ".join(expected)}{tail}))'

    for leaf in spec.leaves:
        targets, expected, new = [], [], set()
        for d in map(sympy.sympify, spec.tensors[leaf].shape):
            if d.is_Symbol and d not in bound:
                targets.append(printer.dims[d])
                expected.append("None")
                bound.add(d)
                new.add(d)
            elif d.free_symbols <= bound and not d.free_symbols & new:
                targets.append("_")
                expected.append(printer.dim(d).text)
            else:
                targets.append("_")
                expected.append("None")
                if leaf not in later:
                    later.append(leaf)
        if any(name != "_" for name in targets):
            lines.append(f"{', '.join(targets)}{',' if len(targets) == 1 else ''} = {call(leaf, expected)}")
        else:
            lines.append(call(leaf, expected))
    for name, info in spec.dims.items():
        if info.symbol not in bound:
            lines.append(f"{program.dim_vars[name]} = {spec.sizes[name]}  # no array has an axis of size {name} "
                         "alone: the spec's default")
            bound.add(info.symbol)
    for leaf in later:
        lines.append(call(leaf, [printer.dim(d).text for d in spec.tensors[leaf].shape]))
    ranks = ", ".join(f'("{leaf}", {program.tensor_vars[leaf]}, {len(spec.tensors[leaf].shape)})'
                      for leaf in spec.leaves)
    lines.append(f"_batch_axes({ranks})")
    return lines


def _header(spec: t.TypedSpec, program: Program) -> list[str]:
    order = list(spec.dims)
    name = _module_name(spec)
    rows = []
    for tensor in list(spec.leaves) + list(spec.outputs):
        info = spec.tensors[tensor]
        rows.append((info.kind if tensor not in spec.outputs else "output", tensor, format_shape(info.shape, order)))
    width = max(len(r[1]) for r in rows)
    leaves = ", ".join(spec.leaves)
    grads = ", ".join(program.upstream[o] for o in spec.outputs)
    outs = ", ".join(f'"{o}": ...' for o in spec.outputs)
    lines = [
        f'"""The attention spec `{name}`: forward and backward pass, generated by symattn {__version__}.',
        "",
        "Do not edit: regenerate with `symattn emit numpy SPEC -o FILE.py`.",
        "",
        f"    forward({leaves}) -> {{{outs}}}",
        f"    backward({leaves}, {grads}) -> the gradient of every input and param",
        f"    forward_backward({leaves}, {grads}) -> (outputs, gradients)",
        "",
        "All arguments are keywords. Shapes (extra leading batch axes broadcast):",
        "",
    ]
    lines += [f"    {kind:<6} {tensor:<{width}}  {shape}" for kind, tensor, shape in rows]
    lines += [
        "",
        "Sizes are read from the arrays. float32 arrays give float32 results, float64",
        "arrays float64. backward() returns dL/dT for L = "
        + " + ".join(f"sum({o} * grad_{o})" for o in spec.outputs) + ".",
        '"""',
    ]
    return lines


def _public(spec: t.TypedSpec, program: Program, leaves, keywords, unsafe, printer) -> list[str]:
    lines = []
    if unsafe:
        printer.helpers.add("_take")
    outs = ", ".join(spec.outputs)
    if unsafe:  # a spec name that Python cannot take as a parameter: take keywords as a dict
        names = ", ".join(f'"{n}"' for n in spec.leaves)
        both = ", ".join(f'"{n}"' for n in list(spec.leaves) + keywords)
        sig_f, sig_b = "**tensors", "**tensors"
        pre_f = [f"    {', '.join(leaves)}, = _take(tensors, ({names},))"]
        pre_b = [f"    {', '.join(leaves + keywords)}, = _take(tensors, ({both},))"]
    else:
        sig_f = "*, " + ", ".join(leaves)
        sig_b = "*, " + ", ".join(leaves + keywords)
        pre_f, pre_b = [], []
    args = ", ".join(leaves)
    grads = ", ".join(keywords)
    lines += [f"def forward({sig_f}):", f'    """The outputs {outs}, by name."""', *pre_f,
              f"    return _forward_backward({args})[0]", "", ""]
    lines += [f"def backward({sig_b}):",
              '    """dL/dT for every input and param T, by name."""', *pre_b,
              f"    return _forward_backward({args}, {grads})[1]", "", ""]
    lines += [f"def forward_backward({sig_b}):",
              '    """(outputs, gradients) from one forward pass."""', *pre_b,
              f"    return _forward_backward({args}, {grads})", "", ""]
    return lines


def _helper_sources(used: set[str]) -> list[str]:
    needed: list[str] = []
    stack = sorted(used)
    while stack:
        name = stack.pop()
        if name in needed:
            continue
        needed.append(name)
        stack.extend(HELPERS[name][1])
    order = [name for name in HELPERS if name in needed]
    lines: list[str] = []
    for name in order:
        lines += ["", ""] + HELPERS[name][0].strip("\n").split("\n")
    return lines


def load_module(source: str, name: str = "symattn_generated") -> types.ModuleType:
    """Execute generated source as a new module object (nothing is written to disk)."""
    module = types.ModuleType(name)
    module.__file__ = f"<symattn generated {name}>"
    exec(compile(source, module.__file__, "exec"), module.__dict__)
    return module


def emit_command(args) -> int:
    """`symattn emit numpy SPEC -o FILE.py` (`-o -` writes to standard output)."""
    from pathlib import Path

    from .cli import _load  # the command line's own loading rules (--dim, '-' for stdin)
    from .errors import SymAttnError, UsageError

    spec = _load(args)
    if args.target != "numpy":
        raise SymAttnError(f"emit {args.target}: CUDA code generation is not implemented yet")
    source = spec.emit("numpy")
    if args.output == "-":
        print(source, end="")
        return 0
    path = Path(args.output)
    if path.is_dir():
        raise UsageError(f"{path} is a directory; name the .py file to write")
    if not path.parent.exists():
        raise UsageError(f"{path.parent}: no such directory")
    path.write_text(source, encoding="utf-8")
    print(f"wrote {path}: forward, backward and forward_backward for {spec.name}")
    return 0
