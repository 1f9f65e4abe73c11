"""The printer base (`symattn.ir.printer`): dispatch along the MRO, one precedence table, errors naming the type.

Every printer in the package (spec text, NumPy, CUDA, typesetting, LaTeX and
MathML) subclasses `Printer`; a node that a printer has no rule for is an
error that names its type; and no module keeps a precedence ladder of its own
(the level names are defined in `symattn/ir/printer.py` only).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass

import pytest
import sympy

from symattn.codegen.cuda.names import CNames
from symattn.codegen.cuda.syntax import CDimPrinter, CPrinter
from symattn.errors import CodegenError as CudaCodegenError
from symattn.codegen.arrays.index_printer import IndexNotationPrinter
from symattn.codegen.numpy.printer import NumPyPrinter
from symattn.codegen.program import CodegenError
from symattn.docs.mathbox import LatexPrinter, MathMLPrinter, to_latex, to_mathml
from symattn.docs.mathprint import EntryTypesetter, MatrixTypesetter, matrix_box
from symattn.ir import printer as base
from symattn.ir.printer import ADD, ATOM, MUL, PRECEDENCE, Printed, Printer
from symattn.ir.printing import SpecPrinter, to_spec
from conftest import REPO

PACKAGE = REPO / "symattn"
LEVELS = {"TERNARY", "COMPARE", "ADD", "MUL", "NEG", "POW", "POSTFIX", "ATOM"}


@dataclass(frozen=True)
class Leaf:
    name: str


@dataclass(frozen=True)
class Marked(Leaf):
    """A subclass with no rule of its own in `Toy`: it is printed by the rule for `Leaf`."""


@dataclass(frozen=True)
class Sum:
    a: object
    b: object


@dataclass(frozen=True)
class Product:
    a: object
    b: object


class Toy(Printer):
    def _print_Leaf(self, node: Leaf) -> Printed:
        return Printed(node.name, ATOM)

    def _print_Sum(self, node: Sum) -> Printed:
        return Printed(self.infix(node.a, "+", node.b, self.prec("add")), self.prec("add"))

    def _print_Product(self, node: Product) -> Printed:
        return Printed(self.infix(node.a, "*", node.b, self.prec("mul")), self.prec("mul"))


class LoudToy(Toy):
    """Overrides one rule; everything else is inherited."""

    def _print_Marked(self, node: Marked) -> Printed:
        return Printed(node.name.upper(), ATOM)


def test_a_rule_for_a_base_class_covers_its_subclasses():
    assert Toy().doprint(Marked("x")).text == "x"
    assert LoudToy().doprint(Marked("x")).text == "X"
    assert Toy().doprint(Marked("x")).text == "x"  # the rule found for LoudToy is not reused for Toy
    assert LoudToy().doprint(Leaf("y")).text == "y"


@pytest.mark.parametrize("tree,text", [
    (Product(Sum(Leaf("a"), Leaf("b")), Leaf("c")), "(a + b) * c"),
    (Sum(Product(Leaf("a"), Leaf("b")), Leaf("c")), "a * b + c"),
    (Sum(Leaf("a"), Sum(Leaf("b"), Leaf("c"))), "a + (b + c)"),
    (Sum(Sum(Leaf("a"), Leaf("b")), Leaf("c")), "a + b + c"),
    (Product(Leaf("a"), Product(Leaf("b"), Leaf("c"))), "a * (b * c)"),
])
def test_parenthesize_brackets_what_binds_looser(tree, text):
    assert Toy().doprint(tree).text == text


def test_parenthesize_takes_printed_items_and_levels_are_ordered():
    toy = Toy()
    assert toy.parenthesize(Printed("a + b", ADD), MUL) == "(a + b)"
    assert toy.parenthesize(Printed("a * b", MUL), MUL) == "a * b"
    assert [PRECEDENCE[k] for k in ("where", "compare", "add", "mul", "neg", "pow", "transpose", "call")] == \
        sorted(PRECEDENCE[k] for k in ("where", "compare", "add", "mul", "neg", "pow", "transpose", "call"))


class _NoMemory:
    def read(self, node, coords):
        return None


@pytest.mark.parametrize("print_it,error,message", [
    (lambda x: Toy().doprint(x), TypeError, "no printing rule for float"),
    (lambda x: to_spec(x), TypeError, "no printing rule for float"),
    (lambda x: matrix_box(x), TypeError, "no typesetting rule for float"),
    (lambda x: to_latex(x), TypeError, "no LaTeX rule for float"),
    (lambda x: to_mathml(x), TypeError, "no MathML rule for float"),
    (lambda x: IndexNotationPrinter().label(x), CodegenError, "no array printing rule for float"),
    (lambda x: CPrinter(CNames(), _NoMemory()).entry(x), CudaCodegenError, "no CUDA rule for float"),
])
def test_an_unknown_node_is_an_error_naming_its_type(print_it, error, message):
    with pytest.raises(error, match=message):
        print_it(1.5)


def test_a_dim_that_is_not_integer_arithmetic_is_refused_by_the_cuda_printer():
    with pytest.raises(CudaCodegenError, match="not integer arithmetic"):
        CDimPrinter(CNames()).doprint(sympy.sqrt(sympy.Symbol("d")))


@pytest.mark.parametrize("printer", [SpecPrinter, NumPyPrinter, IndexNotationPrinter, CPrinter, CDimPrinter,
                                     MatrixTypesetter, EntryTypesetter, LatexPrinter, MathMLPrinter])
def test_every_printer_is_a_printer_on_the_one_table(printer):
    assert issubclass(printer, Printer)
    table = printer.precedence
    assert set(table) == set(PRECEDENCE)  # overrides change levels, they add no private operations
    assert set(table.values()) <= {getattr(base, level) for level in LEVELS}


def test_no_module_keeps_its_own_precedence_ladder():
    """The level names are assigned in symattn/ir/printer.py and nowhere else (imports are fine)."""
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path == PACKAGE / "ir" / "printer.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Assign):
                names = {n.id for target in node.targets for n in ast.walk(target) if isinstance(n, ast.Name)}
                if names & (LEVELS | {"PREC", "UNARY_PREC", "CMP", "COMPARE_PREC"}):
                    offenders.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno}")
    assert not offenders, offenders
