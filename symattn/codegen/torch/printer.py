"""The PyTorch printer: the NumPy printer with torch's spellings.

Contract: `TorchPrinter(program)` prints the same program IR as
`symattn.codegen.numpy.printer.NumPyPrinter`, with the same decisions (which
statements run in place, which buffers are freed, how batch axes line up), as
torch code: the rules below override the NumPy printer's where the spelling
differs (`np.exp` -> `torch.exp`, `axis=`/`keepdims=` -> `dim=`/`keepdim=`,
`np.einsum` -> `torch.einsum`, `.astype(dtype)` -> `.to(dtype)`, new tensors
made with `device=device`). `UNARY` is a live view of the function table
(`symattn.ir.functions`): a function's torch spelling is its NumPy one with
`np.` read as `torch.` unless the record has a `torch` spelling. A statement whose
printed code still calls NumPy (an operation this target has no rule for yet)
is a `CodegenError`, never a module that fails when it runs.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from ...ir import typed as t
from ...ir.functions import table
from ...ir.printer import ATOM, MUL, NEG, POW
from ..index import IndexArray, LContract, LEntry, LNode, LOp, LSum
from ..numpy.printer import NumPyPrinter
from ..numpy.syntax import RESERVED as NUMPY_RESERVED, SCALAR_UNARY, Code, einsum_letters
from ..program_ir import Arange, CodegenError, Program, Stmt
from .runtime import HELPERS

__all__ = ["TorchPrinter", "UNARY", "REDUCE", "SCAN", "CONSTANT", "RESERVED"]

# fn -> Python `math` spelling for a constant scalar (d_k ** 0.5 and such stay Python numbers)
SCALAR_FUNCTIONS = {"abs": "abs({x})", "relu": "max({x}, 0.0)", "sigmoid": "1 / (1 + math.exp(-{x}))"}


class _TorchUnary(Mapping):
    """fn -> torch template, live over the function records: the record's `torch` spelling, else its
    NumPy one with `np.` read as `torch.`."""

    numpy = table("numpy_code", {"neg": ("-{x}", None)})
    torch = table("torch", {"neg": "-{x}"})

    def __getitem__(self, name: str) -> str:
        if self.torch[name]:  # the record's own torch spelling
            return self.torch[name]
        template, helper = self.numpy[name]
        if helper or not template.startswith("np."):
            raise CodegenError(f"the torch target has no spelling for {name}(); give its record a `torch` template")
        return "torch." + template[len("np."):]

    def __iter__(self) -> Iterator[str]:
        return iter(self.numpy)

    def __len__(self) -> int:
        return len(self.numpy)


UNARY: Mapping[str, str] = _TorchUnary()
REDUCE = {"sum": "torch.sum({x}, dim={axis}, keepdim=True)", "mean": "torch.mean({x}, dim={axis}, keepdim=True)",
          "logsumexp": "_logsumexp({x}, {axis})",
          "max": "torch.amax({x}, dim={axis}, keepdim=True)", "min": "torch.amin({x}, dim={axis}, keepdim=True)"}
SCAN = {False: "torch.cumsum({x}, dim={axis})", True: "_reverse_cumsum({x}, dim={axis})"}
CONSTANT = {
    "sinusoidal": ("_sinusoidal({args}, dtype, device)", "_sinusoidal"),
    "causal_mask": ("_causal_mask({args}, dtype, device)", "_causal_mask"),
    "eye": ("torch.eye({args}, dtype=dtype, device=device)", None),
    "ones": ("torch.ones(({args},), dtype=dtype, device=device)", None),
}
RESERVED = (NUMPY_RESERVED - {"np"}) | {"torch", "math", "device", "op", "op_backward", "Function", "_forward",
                                        "_backward", "_outputs", "_gradients", "_tensors", "LEAVES", "OUTPUTS",
                                        "DIFFERENTIABLE", "isinstance", "BLOCK_Q", "BLOCK_K"} | set(HELPERS)


class TorchPrinter(NumPyPrinter):
    """Print one `Program` as torch code (see the module docstring)."""

    rules = "torch printing"

    def __init__(self, program: Program) -> None:
        super().__init__(program)

    # --- numbers and scalars ------------------------------------------------------------

    @staticmethod
    def number(value) -> Code:
        code = NumPyPrinter.number(value)
        if code.text in ("np.inf", "-np.inf", "np.pi"):
            return Code(code.text.replace("np.", "math."), code.prec, code.fresh, code.carrying)
        return code

    block_syntax = {"where": "torch.where", "inf": "math.inf", "arange": "torch.arange({n}, device=device)",
                    "cast": "{x}.to(dtype)"}
    flash_settings = "BLOCK_Q, BLOCK_K"  # (torch runs each block on its own threads)

    def unary_template(self, fn: str) -> str:
        return UNARY[fn]

    def _print_Unary(self, node: t.Unary) -> Code:
        x = self.doprint(node.x)
        if self._constant_scalar(node):  # Python arithmetic keeps the scalar "weak": no upcast of float32
            if node.fn in SCALAR_UNARY:
                need = POW + 1 if node.fn == "sqrt" else NEG
                return Code(SCALAR_UNARY[node.fn].format(x=self.parenthesize(x, need)),
                            POW if node.fn == "sqrt" else NEG, carrying=False)
            template = SCALAR_FUNCTIONS.get(node.fn, f"math.{node.fn}({{x}})")
            return Code(template.format(x=x.text), MUL, carrying=False)
        if node.fn == "neg":
            return Code(f"-{self.parenthesize(x, NEG)}", self.prec("neg"), True, x.carrying)
        return Code(UNARY[node.fn].format(x=x.text), ATOM, True, x.carrying)

    # --- tensors ------------------------------------------------------------------------

    def _print_Transpose(self, node: t.Transpose) -> Code:
        x = self.doprint(node.x)
        return Code(f"{self.parenthesize(x, ATOM)}.transpose(-1, -2)", self.prec("transpose"), False, x.carrying)

    def _print_Reduce(self, node: t.Reduce) -> Code:
        rank = len(node.x.shape)
        inner = node.x
        if node.kind == "sum" and node.axis == rank - 1 and isinstance(inner, t.Binary) and inner.op == "mul" \
                and inner.a.shape == inner.b.shape == inner.shape and rank >= 1:
            self.helpers.add("_rowdot")  # no tensor of the products
            a, b = self.doprint(inner.a), self.doprint(inner.b)
            return Code(f"_rowdot({a.text}, {b.text})", ATOM, True, a.carrying or b.carrying)
        if node.kind not in REDUCE:
            raise CodegenError(f"the torch target has no rule for the reduction {node.kind}")
        x = self.doprint(inner)
        if node.kind == "logsumexp":
            self.helpers.add("_logsumexp")
        return Code(REDUCE[node.kind].format(x=x.text, axis=self._axis(node.axis, rank)), ATOM, True, x.carrying)

    def _print_Scan(self, node: t.Scan) -> Code:
        x = self.doprint(node.x)
        if node.reverse:
            self.helpers.add("_reverse_cumsum")
        return Code(SCAN[node.reverse].format(x=x.text, axis=node.axis - len(node.x.shape)), ATOM, True, x.carrying)

    def _print_Constant(self, node: t.Constant) -> Code:
        template, helper = CONSTANT[node.kind]
        if helper:
            self.helpers.add(helper)
        args = ", ".join(self.dim(a).text for a in node.args)
        return Code(template.format(args=args), ATOM, True)

    def _print_SumTo(self, node: t.SumTo) -> Code:
        x = self.doprint(node.x)
        rank = len(node.x.shape)
        lead = rank - len(node.shape)
        kept = tuple(a - rank for a in node.axes if a >= lead)
        text = x.text
        if kept:
            text = f"torch.sum({text}, dim={kept[0] if len(kept) == 1 else kept}, keepdim=True)"
        if lead:
            axes = tuple(range(-rank, -rank + lead))
            text = f"torch.sum({text}, dim={axes[0] if len(axes) == 1 else axes})"
        return Code(text, ATOM, True, x.carrying)

    def _print_IndexArray(self, node: IndexArray) -> Code:
        root = node.root
        target = node.indices
        if not root.labels and not self.batched(root):
            value = self.label(root)
            return Code(f"torch.full({self.shape_tuple(node.ranges)}, {value.text}, dtype=dtype, device=device)",
                        ATOM, True)
        present = tuple(n for n in target if n in root.labels)
        code = self.label_aligned(root, target, keep_missing=True)
        if len(present) < len(target):
            self.helpers.add("_expand")
            code = Code(f"_expand({code.text}, {self.shape_tuple(node.ranges)})", ATOM, False, code.carrying)
        if not code.carrying:
            code = self.cast(code)
        return code

    def cast(self, code: Code) -> Code:
        """`code` (a tensor: a comparison's bools, say) as a tensor of the computation's dtype."""
        return Code(f"{self.parenthesize(code, ATOM)}.to(dtype)", ATOM, True)

    # --- index notation -------------------------------------------------------------------

    def arange(self, size: str) -> str:
        return f"torch.arange({size}, device=device)"

    def _label_LEntry(self, node: LEntry) -> Code:
        if len(set(node.indices)) == len(node.indices):
            return Code(node.var, ATOM, False)
        letters = einsum_letters(node.indices)
        sub = "".join(letters[i] for i in node.indices)
        out = "".join(letters[i] for i in node.labels)
        dots = "..." if self.batched(node) else ""
        return Code(f'torch.einsum("{dots}{sub}->{dots}{out}", {node.var})', ATOM, False)

    def _label_LSum(self, node: LSum) -> Code:
        x = self.label(node.x)
        axis = node.x.labels.index(node.index) - len(node.x.labels)
        return Code(f"torch.sum({x.text}, dim={axis})", ATOM, True, x.carrying)

    def label_aligned(self, node: LNode, target: tuple[str, ...], keep_missing: bool = False) -> Code:
        labels = node.labels
        present = tuple(n for n in target if n in labels)
        if labels == present or len(labels) == 2:  # no move, or one the NumPy rule spells as .swapaxes
            return super().label_aligned(node, target, keep_missing)
        # several axes move: torch.movedim, then the NumPy rule inserts the missing axes on the moved code
        code = self.label(node)
        src = [labels.index(n) - len(labels) for n in present]
        dst = list(range(-len(labels), 0))
        moved = Code(f"torch.movedim({code.text}, {src}, {dst})", ATOM, False, code.carrying)
        return self._insert_axes(moved, node, target)

    def _insert_axes(self, code: Code, node: LNode, target: tuple[str, ...]) -> Code:
        labels = node.labels
        present = tuple(n for n in target if n in labels)
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
        return Code(f"{self.parenthesize(code, ATOM)}[{', '.join(index)}]", self.prec("slice"), False, code.carrying)

    def _label_LOp(self, node: LOp) -> Code:
        if node.kind != "unary":
            return super()._label_LOp(node)
        (x,) = [self.label_aligned(a, node.labels) for a in node.args]
        if not node.labels and not self.batched(node):  # a scalar: Python arithmetic
            if node.op in SCALAR_UNARY:
                return Code(SCALAR_UNARY[node.op].format(x=self.parenthesize(x, POW + 1)), POW, carrying=False)
            return Code(SCALAR_FUNCTIONS.get(node.op, f"math.{node.op}({{x}})").format(x=x.text), MUL,
                        carrying=False)
        if node.op == "neg":
            return Code(f"-{self.parenthesize(x, NEG)}", self.prec("neg"), True, x.carrying)
        return Code(UNARY[node.op].format(x=x.text), ATOM, True, x.carrying)

    def where(self, c: Code, a: Code, b: Code) -> Code:
        text = f"torch.where({c.text}, {a.text}, {b.text})"
        if not (a.carrying or b.carrying):  # both branches Python numbers: torch's default dtype
            return Code(f"{text}.to(dtype)", ATOM, True)
        return Code(text, ATOM, True)

    def _einsum(self, operands, node: LContract) -> Code:
        names = [n for _, idx, _ in operands for n in idx] + list(node.labels)
        letters = einsum_letters(names)
        any_batch = any(batched for _, _, batched in operands)
        subs = ",".join(("..." if batched else "") + "".join(letters[n] for n in idx)
                        for _, idx, batched in operands)
        out = ("..." if any_batch else "") + "".join(letters[n] for n in node.labels)
        args = ", ".join(code.text for code, _, _ in operands)
        return Code(f'torch.einsum("{subs}->{out}", {args})', ATOM, True)

    # --- statements ------------------------------------------------------------------------

    def statement(self, k: int, stmt: Stmt) -> list[str]:
        lines = self._statement(k, stmt)
        for line in lines:
            if "np." in line:
                raise CodegenError(f"the torch target cannot print `{stmt.title or stmt.var}` yet: {line.strip()}")
        return lines

    def _statement(self, k: int, stmt: Stmt) -> list[str]:
        if isinstance(stmt.node, Arange):
            self.k = k
            self.consumed = None
            self.owned[stmt.var] = True
            return [f"{stmt.var} = torch.arange({self.dim(stmt.node.size).text}, dtype=dtype, device=device)"]
        if stmt.labels is not None:
            self.k = k
            self.consumed = None
            code = self.label(stmt.node)
            self._record(stmt.var, stmt, code.fresh)
            if not code.carrying:
                return [f"{stmt.var} = {self.cast(code).text}"]
            return [f"{stmt.var} = {code.text}"]
        return super().statement(k, stmt)

    def softmax_with_lse(self, k: int, stmt: Stmt, lse: str) -> list[str]:
        """`P, lse = _softmax_lse_(S, axis)`: the weights in S's buffer (S is not read again) and the row
        log-sum-exp that the backward pass recomputes them from."""
        self.k = k
        self.consumed = None
        node = stmt.node
        axis = node.axis - len(node.x.shape)
        x = self.doprint(node.x)
        self.helpers.add("_softmax_lse_")
        self.owned[stmt.var] = True
        self.owned[lse] = True
        if self._dead(node.x):
            self._union(stmt.var, node.x.name)
            return [f"{stmt.var}, {lse} = _softmax_lse_({x.text}, axis={axis})"]
        return [f"{stmt.var}, {lse} = _softmax_lse_({self.parenthesize(x, ATOM)}.clone(), axis={axis})"]

    def softmax_from_lse(self, stmt: Stmt, lse: str) -> list[str]:
        """`P = exp(S - lse)` in S's buffer: the weights again, from the saved row log-sum-exp."""
        self.helpers.add("_softmax_from_lse_")
        scores = stmt.node.x.name
        self.owned[stmt.var] = True
        self._union(stmt.var, scores)
        return [f"{stmt.var} = _softmax_from_lse_({scores}, {lse})"]
