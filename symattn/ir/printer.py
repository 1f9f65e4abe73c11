"""One printer base for every target: `_print_<Node>` dispatch and one precedence table.

Contract: `Printer.doprint(node, *context)` calls `_print_<Class>(node, *context)`
for the first class in `type(node).__mro__` that the printer has a method for
(SymPy's `Printer._print`), so a rule written for a base class covers its
subclasses and a target overrides a method, not a chain of `if`s; `context`
passes through unchanged (the CUDA printer passes coordinates, the entry-form
typesetter indices). `dispatch(prefix, node, ...)` is the same walk for a
second family of rules (`_label_<Node>`). A node that no method covers goes to
`unknown`, which raises the printer's `error` naming the node's type (a target
may first look elsewhere: the CUDA printer reads values other kernels stored).

Every rule returns a `Printed`: the output (text, or a typeset box) and the
precedence level it binds at. `PRECEDENCE` is the one table from operation to
level, loosest to tightest; a target overrides entries where its syntax differs
(C's `pow` is a call, a typeset quotient is a fraction), through its class
attribute `precedence`. `parenthesize(item, level)` brackets an item (a node,
printed on the way, or something already printed) that binds looser than
`level`; `fence` says how a target brackets; `infix` prints a left-associative
binary operator.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Mapping

__all__ = ["Printer", "Printed", "PRECEDENCE", "TERNARY", "COMPARE", "ADD", "MUL", "NEG", "POW", "POSTFIX", "ATOM",
           "BINARY", "COMPARISON", "LOGICAL"]

# Binding levels, loosest to tightest. Every target orders its operators the same way; one
# that lacks a level (Python has no ternary in our output, C no `**` or postfix `.T`) never
# produces it.
TERNARY, COMPARE, ADD, MUL, NEG, POW, POSTFIX, ATOM = range(8)

# The one precedence table: operation -> level. A binary operation is its IR name (`add`);
# other keys name a syntactic form that several node types print as.
PRECEDENCE: Mapping[str, int] = {
    "where": TERNARY,  # C's `c ? a : b`
    "compare": COMPARE,
    "index_def": COMPARE,  # `[i, j] -> body`: the loosest form of the spec language
    "add": ADD,
    "sub": ADD,
    "mul": MUL,
    "div": MUL,
    "floordiv": MUL,
    "mod": MUL,
    "matmul": MUL,
    "sum": MUL,  # a typeset `sum_k x_k`: its body reaches as far as a product's factors
    "neg": NEG,
    "cast": NEG,  # C's `(float)x`
    "pow": POW,
    "transpose": POSTFIX,
    "slice": POSTFIX,
    "call": ATOM,
    "name": ATOM,
}


# The one table of operators: an IR operation -> its symbol in the spec language. A target overrides the
# entries its syntax spells otherwise (Python's power is `**`; C and Triton have none: `pow` is a call there;
# C's logical operators are `&&`, `||`, `!`), never the whole table.
BINARY: Mapping[str, str] = {"add": "+", "sub": "-", "mul": "*", "div": "/", "pow": "^"}
COMPARISON: Mapping[str, str] = {"<": "<", "<=": "<=", ">": ">", ">=": ">=", "==": "==", "!=": "!="}
LOGICAL: Mapping[str, str] = {"and": "&", "or": "|", "not": "~"}


@dataclass(frozen=True)
class Printed:
    """What a rule prints: the output (text, or a typeset box) and the level it binds at."""

    text: Any
    prec: int = ATOM


# (printer class, method prefix, node type) -> the rule's function, or None where there is none
_RULES: dict[tuple[type, str, type], Callable | None] = {}


class Printer:
    """The base of every printer: dispatch on the node's class, one precedence table, brackets."""

    precedence: ClassVar[Mapping[str, int]] = PRECEDENCE
    error: ClassVar[type[Exception]] = TypeError
    rules: ClassVar[str] = "printing"  # the word in "no printing rule for X"

    def doprint(self, node: Any, *context: Any) -> Printed:
        """`node` printed by the rule for its class (or the nearest base class that has one)."""
        return self.dispatch("_print_", node, *context)

    def dispatch(self, prefix: str, node: Any, *context: Any) -> Any:
        """`node` handled by this printer's rule `<prefix><Class>` for its class or the nearest base class."""
        rule = self.rule(prefix, type(node))
        if rule is None:
            return self.unknown(node, *context)
        return rule(self, node, *context)

    @classmethod
    def rule(cls, prefix: str, node_type: type) -> Callable | None:
        """The function `<prefix><Class>` of this printer for the first class in `node_type`'s MRO that has one."""
        key = (cls, prefix, node_type)
        if key not in _RULES:
            _RULES[key] = next((getattr(cls, prefix + klass.__name__) for klass in node_type.__mro__
                                if hasattr(cls, prefix + klass.__name__)), None)
        return _RULES[key]

    def unknown(self, node: Any, *context: Any) -> Printed:
        raise self.error(f"no {self.rules} rule for {type(node).__name__}")

    # --- precedence -------------------------------------------------------------------------

    def prec(self, operation: str) -> int:
        """The level `operation` binds at in this target."""
        return self.precedence[operation]

    def fence(self, text: Any) -> Any:
        """`text` in brackets."""
        return f"({text})"

    def parenthesize(self, item: Any, level: int, *context: Any) -> Any:
        """`item` (a node, or something already printed), bracketed when it binds looser than `level`."""
        printed = item if isinstance(item, Printed) else self.doprint(item, *context)
        return printed.text if printed.prec >= level else self.fence(printed.text)

    def infix(self, a: Any, symbol: str, b: Any, level: int, *context: Any) -> str:
        """`a symbol b` for a left-associative operator at `level`: `a - (b - c)`, `a - b - c`."""
        return f"{self.parenthesize(a, level, *context)} {symbol} {self.parenthesize(b, level + 1, *context)}"
