"""The records of the attention plan: one `AttentionCore` per fused `softmax(score) @ V`.

Contract: an `AttentionCore` says everything a target needs to compute one
core, FlexAttention's model made exact by the derivation:

- its operands: the score's `Product` (named tensors q and k, `q @ k.T`;
  several products whose score is linear in them are one product of
  concatenated operands, see `symattn.codegen.plan.find`) and v, each with its
  own head axes (`q_lead`, `k_lead`, `v_lead`: 1 where a head is broadcast,
  GQA and MQA), and the head axes of the output (`lead`);
- the score in entry form (`score`): a scalar expression at the coordinates
  `z0, z1, ...` (heads), `i` (query row) and `j` (key), whose leaves are
  numbers, dims, the coordinates (`t.IndexVar`), the product's entry
  (`ProductEntry`) and entries of given tensors (`t.Entry`, each a `Read`):
  score_mod. It splits into `keep`, the condition under which an entry is not
  -inf whatever the product is (mask_mod; None: every entry is kept), and
  `value`, the score where `keep` holds: score = where(keep, value, -inf);
- `weights`: a factor of the weights after the softmax (a dropout mask read
  from a buffer, or drawn per entry: `DropoutEntry`), in entry form, or None;
- what leaves it: O, and the row log-sum-exp when the spec has a tensor that
  is it (`lse`);
- its backward in entry form: `d_product` = d value / d product, and for each
  read of a tensor with a gradient, d value / d that entry (`Read.derivative`):
  each such gradient is a scatter-add of dS * derivative over the entries.

Every expression here is exact for all sizes; `text` is the core in spec
syntax, for comments and reports.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import sympy

from ...ir import typed as t
from ...ir.affine import Affine, pieces
from ...ir.typed import subscript_names
from ...ir.printer import ATOM, Printed
from ...ir.printing import SpecPrinter

__all__ = ["ProductEntry", "DropoutEntry", "Product", "Read", "AttentionCore", "ROW", "KEY", "head", "coordinate_node",
           "entry_text", "leaves"]

ROW, KEY = "i", "j"  # the coordinates of a score entry: query row i, key j (heads: z0, z1, ...)


def head(k: int) -> str:
    """The coordinate of head axis k."""
    return f"z{k}"


@dataclass(frozen=True, slots=True)
class ProductEntry(t.Node):
    """The core's score product at the entry's coordinates: (q @ k.T)[..., i, j]."""

    shape: tuple = ()


@dataclass(frozen=True, slots=True)
class DropoutEntry(t.Node):
    """A dropout mask at the entry's coordinates, drawn where the entry is computed: 1 (True) iff Philox keeps
    flat position `base` + `index` under the module's seed (`symattn.ir.philox`). `index` is the entry's flat
    position in the mask's spec shape (an integer expression of the coordinates and dims); `base` and `seed`
    are entries 0 and 1 of the mask tensor, which a fused program holds per batch entry as (the flat position
    of its first mask entry, the seed's 64 bits as an int64) (`symattn.codegen.program_ir.DropoutBase`): a
    target reads them as it reads any score tensor, and no [N, N] mask exists."""

    base: t.Entry
    seed: t.Entry
    index: t.Node
    stream: int
    threshold: int
    shape: tuple = ()

    @property
    def children(self):
        return (self.base, self.seed, self.index)


@dataclass(frozen=True)
class Product:
    """q @ k.T for named tensors q [*q_lead, n_q, width] and k [*k_lead, n_k, width]."""

    q: str
    k: str
    width: sympy.Expr


@dataclass(frozen=True)
class Read:
    """Entry `subscripts` of the given tensor `tensor` (one subscript per axis of its spec shape, over the
    core's coordinates; 0 on a broadcast axis), read by the score. `derivative` is d value / d that entry
    for a tensor with a gradient (None for a buffer)."""

    tensor: str
    subscripts: tuple
    derivative: t.Node | None = None

    @property
    def node(self) -> t.Entry:
        return t.Entry(self.tensor, self.subscripts)

    @property
    def plain(self) -> bool:
        """Every subscript is a coordinate itself or 0 (a sum over the other axes gives the gradient);
        else the gradient is a scatter-add at computed positions (a learned table `Bt[j - i + N - 1]`)."""
        return all(isinstance(s, str) or (isinstance(s, Affine) and not s.indices and s.offset == 0)
                   for s in self.subscripts)


@dataclass(frozen=True)
class AttentionCore:
    """O = softmax(score, axis=-1) [* weights] @ V over the head axes `lead` (see the module docstring)."""

    output: str
    product: Product
    v: str
    score: t.Node
    keep: t.Node | None
    value: t.Node
    d_product: t.Node
    lead: tuple
    q_lead: tuple
    k_lead: tuple
    v_lead: tuple
    n_q: sympy.Expr
    n_k: sympy.Expr
    d_v: sympy.Expr
    chain: tuple[str, ...] = ()
    reads: tuple[Read, ...] = ()
    weights: t.Node | None = None
    lse: str | None = None
    text: str = ""
    notes: tuple[str, ...] = field(default=(), compare=False)  # how the plan rewrote the core (operands joined)
    integers: frozenset = frozenset()  # the read tensors that are integer buffers (`doc[N] in 0:D`)

    @property
    def q(self) -> str:
        return self.product.q

    @property
    def k(self) -> str:
        return self.product.k

    @property
    def d_qk(self) -> sympy.Expr:
        return self.product.width

    @property
    def read_tensors(self) -> tuple[str, ...]:
        """The given tensors the score (and weights) read, each once, in order of first read."""
        return tuple(dict.fromkeys(r.tensor for r in self.reads))

    @property
    def masked_at_run_time(self) -> bool:
        """Whether `keep` reads buffers (document ids) or // % min max, which no static bound sees: targets test it
        per block as they go and skip a block it hides whole (FlexAttention's block mask). Index-only masks
        bound the loops statically instead (`plan.tile_bounds`)."""
        return self.keep is not None and any(isinstance(n, (t.Entry, t.Apply)) for n in t.walk(self.keep))

    @property
    def drawn(self) -> frozenset:
        """The dropout masks the core draws per entry (`DropoutEntry`): read tensors that hold no values."""
        return frozenset(n.base.tensor for e in (self.score, self.weights) if e is not None for n in t.walk(e)
                         if isinstance(n, DropoutEntry))

    @property
    def learned(self) -> tuple[str, ...]:
        """Those of them that get a gradient (inputs and params)."""
        return tuple(dict.fromkeys(r.tensor for r in self.reads if r.derivative is not None))

    @property
    def coordinates(self) -> tuple[str, ...]:
        """The entry's coordinates: the heads, then i and j."""
        return tuple(head(k) for k in range(len(self.lead))) + (ROW, KEY)

    @property
    def score_shape(self) -> tuple:
        return (*self.lead, self.n_q, self.n_k)


def coordinate_node(s) -> t.Node:
    """A subscript (a coordinate's name or an `Affine`) as an integer-valued entry expression."""
    if isinstance(s, str):
        return t.IndexVar(s)
    total = None
    for piece in pieces(s):
        term = t.IndexVar(piece.index) if piece.index is not None else t.DimValue(sympy.sympify(piece.dims))
        if piece.index is not None and piece.coefficient != 1:
            term = t.Binary("mul", t.Scalar(sympy.Integer(piece.coefficient)), term, ())
        if total is None:
            total = t.Unary("neg", term, ()) if piece.negative else term
        else:
            total = t.Binary("sub" if piece.negative else "add", total, term, ())
    return total if total is not None else t.Scalar(sympy.Integer(0))


def leaves(node: t.Node):
    """The coordinates (`IndexVar` names) and tensors (`Entry`) an entry expression reads."""
    out = set()
    for n in t.walk(node):
        if isinstance(n, t.IndexVar):
            out.add(n.name)
        elif isinstance(n, t.Entry):
            out.add(n.tensor)
            for s in n.indices:
                out.update(subscript_names(s))
    return out


class _EntryText(SpecPrinter):
    def __init__(self, dims, product: str) -> None:
        super().__init__(dims)
        self.product = product

    def _print_ProductEntry(self, node: ProductEntry) -> Printed:
        return Printed(self.product, ATOM)

    def _print_DropoutEntry(self, node: DropoutEntry) -> Printed:
        return Printed(f"{node.base.tensor}[{self.doprint(node.index).text}]", ATOM)


def entry_text(node: t.Node, dims, core: AttentionCore | None = None) -> str:
    """An entry expression in spec syntax, the product as `(q @ k.T)[i, j]`."""
    product = f"({core.q} @ {core.k}.T)[{', '.join(core.coordinates)}]" if core is not None else "s"
    return _EntryText(dims, product).doprint(node).text


def _is_affine_zero(s) -> bool:
    return isinstance(s, Affine) and not s.indices and s.offset == 0
