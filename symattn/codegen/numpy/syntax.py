"""NumPy syntax: the tables and the printed-code value the NumPy printers share.

Contract: `UNARY` (read live from `symattn.ir.functions`), `BINARY`, `INPLACE`,
`REDUCE`, `CONSTANT` map operations to NumPy spellings; `PYTHON_PRECEDENCE` is
the shared precedence table (`symattn.ir.printer`) as Python binds it; `Code`
is printed code (a `Printed`) with its precedence and whether it makes a
fresh array of the computation's dtype; `einsum_letters` names einsum indices;
`RESERVED` lists the names the generated module uses for itself.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...ir.functions import table
from ...ir.printer import ATOM, PRECEDENCE, Printed
from ..program import CodegenError
from .runtime import HELPERS

__all__ = ["Code", "einsum_letters", "UNARY", "SCALAR_UNARY", "BINARY", "INPLACE", "REDUCE", "SCAN", "CONSTANT",
           "RESERVED",
           "PYTHON_PRECEDENCE"]

# Python binds attribute access and subscripts (`x.swapaxes(-1, -2)`, `x[..., 0:n]`) like names.
PYTHON_PRECEDENCE = {**PRECEDENCE, "transpose": ATOM, "slice": ATOM}

# fn -> (template over the operand, helper it needs), read live from the function table
UNARY = table("numpy_code", {"neg": ("-{x}", None)})
SCALAR_UNARY = {"sqrt": "{x} ** 0.5", "neg": "-{x}"}  # on Python numbers; others: float(np.fn(x))
BINARY = {"add": "+", "sub": "-", "mul": "*", "div": "/", "pow": "**"}
INPLACE = {"add": "+=", "sub": "-=", "mul": "*=", "div": "/="}
REDUCE = {"sum": "np.sum({x}, axis={axis}, keepdims=True)", "mean": "np.mean({x}, axis={axis}, keepdims=True)",
          "logsumexp": "_logsumexp({x}, axis={axis})", "max": "np.max({x}, axis={axis}, keepdims=True)",
          "min": "np.min({x}, axis={axis}, keepdims=True)"}
# cumsum forward and reversed (the suffix sum, cumsum's adjoint)
SCAN = {False: "np.cumsum({x}, axis={axis})", True: "_reverse_cumsum({x}, axis={axis})"}
CONSTANT = {
    "sinusoidal": ("_sinusoidal({args}, dtype)", "_sinusoidal"),
    "causal_mask": ("_causal_mask({args}, dtype)", "_causal_mask"),
    "eye": ("np.eye({args}, dtype=dtype)", None),
    "ones": ("np.ones(({args},), dtype=dtype)", None),
}

RESERVED = {"np", "dtype", "outputs", "gradients", "forward", "backward", "forward_backward",
            "_forward_backward", "_", "float", "dict", "tuple", "list", "len", "range", "ValueError",
            "batch", "max", "min", "int", "TILED_ABOVE", "BLOCK_Q", "BLOCK_K", "THREADS",
            "_forward_backward_tiled"} | set(HELPERS)


@dataclass(frozen=True)
class Code(Printed):
    """Printed code: its text, Python precedence, whether it makes a new array, whether it has the dtype."""

    text: str
    prec: int = ATOM
    fresh: bool = True
    carrying: bool = True  # an array of the computation's dtype (not a Python number, not float64 by accident)


def einsum_letters(names) -> dict[str, str]:
    pool = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
    out: dict[str, str] = {}
    for n in names:
        if n not in out:
            if len(out) == len(pool):
                raise CodegenError("more than 52 distinct indices in one contraction")
            out[n] = pool[len(out)]
    return out
