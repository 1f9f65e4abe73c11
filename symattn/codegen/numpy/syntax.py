"""NumPy syntax: the tables and the printed-code value the NumPy printers share.

Contract: `UNARY` (read live from `symattn.ir.functions`), `BINARY`, `INPLACE`,
`REDUCE`, `CONSTANT` map operations to NumPy spellings with their Python
precedence; `Code` is printed code with its precedence and whether it makes a
fresh array of the computation's dtype; `wrap` brackets code that binds too
loosely; `einsum_letters` names einsum indices; `RESERVED` lists the names the
generated module uses for itself.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...ir.functions import table
from ..program import CodegenError
from .runtime import HELPERS

__all__ = ["Code", "wrap", "einsum_letters", "UNARY", "SCALAR_UNARY", "BINARY", "INPLACE", "REDUCE", "CONSTANT", "RESERVED",
           "CMP", "ADD", "MUL", "UNARY_PREC", "POW", "ATOM"]

# Python precedence, loosest to tightest.
CMP, ADD, MUL, UNARY_PREC, POW, ATOM = 3, 5, 6, 7, 8, 10

# fn -> (template over the operand, helper it needs), read live from the function table
UNARY = table("numpy_code", {"neg": ("-{x}", None)})
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

RESERVED = {"np", "dtype", "outputs", "gradients", "forward", "backward", "forward_backward",
            "_forward_backward", "_", "float", "dict", "tuple", "list", "len", "range", "ValueError"} | set(HELPERS)


@dataclass
class Code:
    """Printed code: its text, Python precedence, whether it makes a new array, whether it has the dtype."""

    text: str
    prec: int = ATOM
    fresh: bool = True
    carrying: bool = True  # an array of the computation's dtype (not a Python number, not float64 by accident)


def wrap(code: Code, need: int) -> str:
    return code.text if code.prec >= need else f"({code.text})"


def einsum_letters(names) -> dict[str, str]:
    pool = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
    out: dict[str, str] = {}
    for n in names:
        if n not in out:
            if len(out) == len(pool):
                raise CodegenError("more than 52 distinct indices in one contraction")
            out[n] = pool[len(out)]
    return out
