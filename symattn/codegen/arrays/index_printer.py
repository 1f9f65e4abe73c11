"""Index notation as array code: labelled arrays printed as broadcasts, matrix products and einsum.

Contract: `IndexNotationPrinter` is the part of `ArrayPrinter` that prints the
labelled-array nodes of `symattn.codegen.index` (`LEntry`, `LOp`, `LContract`,
...): `label(node)` gives code whose axes are the node's index labels in
order, `label_aligned` aligns it to a target order, and a contraction becomes
`@` when it is one, an einsum otherwise, in the printer's `Spelling` (NumPy or
torch). It is a `Printer` whose second family of rules, `_label_<Node>`,
prints a labelled node; it relies on the array printer's `doprint`, `dim`,
`batched`, `spell` and `helpers`.
"""

from __future__ import annotations

import sympy

from ...ir.affine import Affine, pieces, signed_sum
from ...ir.printer import ADD, ATOM, MUL, NEG, POW, Printer
from ...errors import CodegenError
from ..index import LConst, LContract, LEntry, LGather, LNode, LOp, LScalarTensor, LSum, LVar
from .syntax import BINARY, LOGICAL, PYTHON_PRECEDENCE, SCALAR_UNARY, Code, Spelling, einsum_letters

__all__ = ["IndexNotationPrinter"]


class IndexNotationPrinter(Printer):

    precedence = PYTHON_PRECEDENCE
    error = CodegenError
    rules = "array printing"
    spell: Spelling

    def label(self, node: LNode) -> Code:
        """A labelled node printed with its own labels, in their order."""
        return self.dispatch("_label_", node)

    def _label_LGather(self, node: LGather) -> Code:
        """Integer index arrays over the labels: a gather, O(entries read)."""
        at = [self.index_array(s, node.labels, node.ranges) for s in node.indices]
        integer = node.var in self.integers
        if any(isinstance(s, LNode) and self.batched(s) for s in node.indices):
            # a subscript read through an array that may carry batch axes (`offsets[doc[i]]`): each
            # batch entry gathers with its own positions
            self.helpers.add("_gather")
            return Code(f"_gather({node.var}, ({', '.join(at)},), {len(node.labels)})", ATOM, False, not integer,
                        integer)
        dots = ["..."] if self.batched(node) else []
        return Code(f"{node.var}[{', '.join(dots + at)}]", ATOM, False, not integer, integer)

    def _label_LEntry(self, node: LEntry) -> Code:
        if len(set(node.indices)) == len(node.indices):
            integer = node.var in self.integers  # an integer buffer
            return Code(node.var, ATOM, False, not integer, integer)
        letters = einsum_letters(node.indices)
        sub = "".join(letters[i] for i in node.indices)
        out = "".join(letters[i] for i in node.labels)
        dots = "..." if self.batched(node) else ""
        return Code(f'{self.spell.einsum}("{dots}{sub}->{dots}{out}", {node.var})', ATOM, False)

    def _label_LVar(self, node: LVar | LScalarTensor) -> Code:
        integer = node.var in self.integers
        return Code(node.var, ATOM, False, not integer, integer)

    _label_LScalarTensor = _label_LVar

    def _label_LConst(self, node: LConst) -> Code:
        return self.doprint(node.node)

    def _label_LSum(self, node: LSum) -> Code:
        x = self.label(node.x)
        axis = node.x.labels.index(node.index) - len(node.x.labels)
        return Code(self.spell.sum_dropped.format(x=x.text, axes=axis), ATOM, True, x.carrying)

    def arange(self, size: str) -> str:
        """The integers 0 .. size - 1 as an index array."""
        return self.spell.arange.format(n=size)

    def index_array(self, s, labels: tuple[str, ...], ranges) -> str:
        """A subscript (index name or Affine) as integer arithmetic on `arange`s, one axis per label:
        `np.arange(N)[None, :] - np.arange(N)[:, None] + N - 1`; a lowered integer value (an `LNode`:
        `table[j // S]`) as that value's array, aligned to the labels, as integers."""
        if isinstance(s, LNode):
            code = self.label_aligned(s, labels)
            return code.text if code.integer else self.spell.to_index.format(x=self.parenthesize(code, ATOM))
        parts = []
        for p in pieces(s if isinstance(s, Affine) else Affine((s,), (1,), sympy.Integer(0))):
            if p.index is None:
                parts.append((p.negative, self.parenthesize(self.dim(p.dims), MUL)))
                continue
            k = labels.index(p.index)
            arange = self.arange(self.dim(ranges[k]).text)
            if len(labels) > 1:
                arange += "[" + ", ".join(":" if j == k else "None" for j in range(len(labels))) + "]"
            parts.append((p.negative, arange if p.coefficient == 1 else f"{p.coefficient} * {arange}"))
        return signed_sum(parts) or "0"

    def label_aligned(self, node: LNode, target: tuple[str, ...], keep_missing: bool = False) -> Code:
        """`node` with its axes permuted and new axes inserted so that its labels line up with `target`."""
        code = self.label(node)
        labels = node.labels
        present = tuple(n for n in target if n in labels)
        if labels != present:  # same labels, other order: move the axes
            src = [labels.index(n) - len(labels) for n in present]
            if len(labels) == 2:
                code = Code(self.spell.transpose.format(x=self.parenthesize(code, ATOM)), self.prec("transpose"),
                            False, code.carrying, code.integer)
            else:
                dst = list(range(-len(labels), 0))
                code = Code(self.spell.moveaxis.format(x=code.text, src=src, dst=dst), ATOM, False, code.carrying,
                            code.integer)
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
        return Code(f"{self.parenthesize(code, ATOM)}[{', '.join(index)}]", self.prec("slice"), False, code.carrying,
                    code.integer)

    def real(self, code: Code) -> Code:
        """An integer array as an array of the computation's dtype (a number, a value: as it is)."""
        return Code(self.spell.cast.format(x=self.parenthesize(code, ATOM)), ATOM, True) if code.integer else code

    def _label_LOp(self, node: LOp) -> Code:
        args = [self.label_aligned(a, node.labels) for a in node.args]
        if node.kind == "logical":
            return self.logical(node.op, args)
        if node.kind == "apply" and any(a.integer for a in args) and all(a.integral for a in args):
            code = self.operation(node.op, args)  # of integers only: an exact integer
            return Code(code.text, code.prec, True, False, True)
        if node.kind == "apply":
            if any(a.integer for a in args):
                args = [self.real(a) for a in args]
            return self.operation(node.op, args)
        if any(a.integer for a in args):
            exact = node.kind == "compare" or (node.kind == "binary" and node.op in ("add", "sub", "mul")
                                               and all(a.integral for a in args))
            if node.kind == "where":
                exact = all(a.integral for a in args[1:])
            if exact and node.kind == "binary":
                code = self.binary(node.op, *args, False)
                return Code(code.text, code.prec, True, False, True)
            if exact and node.kind == "where":
                return Code(f"{self.spell.where}({', '.join(a.text for a in args)})", ATOM, True, False, True)
            if not exact:
                args = [args[0]] + [self.real(a) for a in args[1:]] if node.kind == "where" else \
                    [self.real(a) for a in args]
        carrying = any(a.carrying for a in args)
        if node.kind == "unary":
            template, helper = self.spell.functions[node.op]
            if helper:
                self.helpers.add(helper)
            if not node.labels and not self.batched(node):  # a scalar: Python arithmetic
                if node.op in SCALAR_UNARY:
                    return Code(SCALAR_UNARY[node.op].format(x=self.parenthesize(args[0], POW + 1)), POW,
                                carrying=False)
                return self.spell.scalar(node.op, args[0].text)
            if node.op == "neg":
                return Code(f"-{self.parenthesize(args[0], NEG)}", self.prec("neg"), True, carrying)
            return Code(template.format(x=args[0].text), ATOM, True, carrying)
        if node.kind == "binary":
            return self.binary(node.op, *args, carrying)
        if node.kind == "compare":
            return self.compare(node.op, *args)
        return self.where(*args)

    def operation(self, fn: str, args: list[Code]) -> Code:
        """An operation record's template over aligned operands (`np.minimum(a, b)`, `np.floor_divide(a, b)`)."""
        template, helper = self.spell.operations[fn]
        if helper:
            self.helpers.add(helper)
        return Code(template.format(*(a.text for a in args)), ATOM, True, any(a.carrying for a in args),
                    all(a.integer or a.integral for a in args) and any(a.integer for a in args))

    def logical(self, op: str, args: list[Code]) -> Code:
        """`(a) & (b)`, `(a) | (b)`, `~(a)` on arrays of booleans: each operand bracketed (& binds tighter than a
        comparison in Python)."""
        parts = [a.text if a.prec >= ATOM else self.fence(a.text) for a in args]
        if op == "not":
            return Code(f"{LOGICAL['not']}{parts[0]}", self.prec("neg"), True, False)
        return Code(f" {LOGICAL[op]} ".join(parts), self.prec("compare"), True, False)

    def binary(self, op: str, a: Code, b: Code, carrying: bool) -> Code:
        """`a op b` for aligned operands; `**` binds tighter than a unary minus on its left, looser on its right."""
        level = self.prec(op)
        if op == "pow":
            return Code(f"{self.parenthesize(a, ATOM)} ** {self.parenthesize(b, NEG)}", level, True, carrying)
        return Code(self.infix(a, BINARY[op], b, level), level, True, carrying)

    def compare(self, op: str, a: Code, b: Code) -> Code:
        return Code(f"{self.parenthesize(a, ADD)} {op} {self.parenthesize(b, ADD)}", self.prec("compare"), True, False)

    def where(self, c: Code, a: Code, b: Code) -> Code:
        text = f"{self.spell.where}({c.text}, {a.text}, {b.text})"
        if not (a.carrying or b.carrying):  # both branches numbers or integers: not the dtype yet
            return Code(self.spell.cast.format(x=text), ATOM, True)
        return Code(text, ATOM, True)

    def _label_LContract(self, node: LContract) -> Code:
        operands = []
        for f in node.factors:
            if isinstance(f, LEntry) and not isinstance(f, LGather):
                operands.append((Code(f.var, ATOM, False), f.indices, self.batched(f)))
            else:
                operands.append((self.real(self.label(f)), f.labels, self.batched(f)))
        code = self._matmul_form(operands, node) or self._einsum(operands, node)
        if node.coeff is not None:
            c = self.doprint(node.coeff)
            code = Code(self.infix(c, "*", code, MUL), MUL, True, code.carrying)
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
            return code.text if tuple(have) == want else f"{self.parenthesize(code, ATOM)}.swapaxes(-1, -2)"

        if node.labels == (fa, fb):
            return Code(f"{oriented(a, ia, (fa, k))} @ {oriented(b, ib, (k, fb))}", self.prec("matmul"), True)
        return Code(f"{oriented(b, ib, (fb, k))} @ {oriented(a, ia, (k, fa))}", self.prec("matmul"), True)

    def _einsum(self, operands, node: LContract) -> Code:
        names = [n for _, idx, _ in operands for n in idx] + list(node.labels)
        letters = einsum_letters(names)
        any_batch = any(batched for _, _, batched in operands)
        subs = ",".join(("..." if batched else "") + "".join(letters[n] for n in idx)
                        for _, idx, batched in operands)
        out = ("..." if any_batch else "") + "".join(letters[n] for n in node.labels)
        args = ", ".join(code.text for code, _, _ in operands)
        optimize = self.spell.einsum_optimize if len(operands) > 2 else ""
        return Code(f'{self.spell.einsum}("{subs}->{out}", {args}{optimize})', ATOM, True)
