"""The array languages the Python targets print: NumPy's and torch's spellings, as tables.

Contract: a `Spelling` is one array library's syntax as data: the templates
of every operation the array printer writes (reductions, scans, constants,
transposes, casts, new arrays, `where`, `einsum`, index arrays), its
functions' spellings read live from the function records
(`symattn.ir.functions`: `numpy`, `torch`), the keyword names of axes, and the
names a generated module uses for itself. `NUMPY` and `TORCH` are the two; a
printer reads the one it is given and never edits printed text. `Code` is
printed code (a `Printed`) with its precedence, whether it makes a fresh
array and whether it has the computation's dtype; `PYTHON_PRECEDENCE` is the
shared precedence table (`symattn.ir.printer`) as Python binds it;
`einsum_letters` names einsum indices.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

from ...errors import CodegenError
from ...ir.functions import FUNCTIONS, OPERATIONS
from ...ir import printer as base
from ...ir.printer import ATOM, MUL, PRECEDENCE, Printed

__all__ = ["Code", "einsum_letters", "Spelling", "NUMPY", "TORCH", "BINARY", "INPLACE", "SCALAR_UNARY",
           "PYTHON_PRECEDENCE", "COMPARISON", "LOGICAL", "CLOSURE_NAMES"]

# Python binds attribute access and subscripts (`x.swapaxes(-1, -2)`, `x[..., 0:n]`) like names.
PYTHON_PRECEDENCE = {**PRECEDENCE, "transpose": ATOM, "slice": ATOM}

BINARY = {**base.BINARY, "pow": "**"}  # Python's power
INPLACE = {op: f"{BINARY[op]}=" for op in ("add", "sub", "mul", "div")}
COMPARISON = base.COMPARISON
LOGICAL = base.LOGICAL  # NumPy's and torch's operators on booleans
SCALAR_UNARY = {"sqrt": "{x} ** 0.5", "neg": "-{x}"}  # on Python numbers, in both languages
# the parameters of the tiled pass's closures (`symattn.codegen.arrays.block`): no spec name may take them
CLOSURE_NAMES = ("s", "i", "j", "e", "g", "dT", "i0", "i1", "j0", "j1", "first", "last")


@dataclass(frozen=True)
class Code(Printed):
    """Printed code: its text, Python precedence, whether it makes a new array, whether it has the dtype."""

    text: str
    prec: int = ATOM
    fresh: bool = True
    carrying: bool = True  # an array of the computation's dtype (not a Python number, not float64 by accident)
    integer: bool = False  # an array of integers (positions, exact at any size): cast where it meets a value

    @property
    def integral(self) -> bool:
        """An integer array or an integer literal: + - * of such stay exact integers."""
        return self.integer or (not self.carrying and self.text.lstrip("-").isdigit())


def einsum_letters(names) -> dict[str, str]:
    pool = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
    out: dict[str, str] = {}
    for n in names:
        if n not in out:
            if len(out) == len(pool):
                raise CodegenError("more than 52 distinct indices in one contraction")
            out[n] = pool[len(out)]
    return out


class _Functions(Mapping):
    """fn -> (template over the operand, helper it needs), live over the function records."""

    def __init__(self, language: str) -> None:
        self.language = language

    def __getitem__(self, name: str) -> tuple[str, str | None]:
        if name == "neg":
            return "-{x}", None
        record = FUNCTIONS[name]
        if self.language == "numpy":
            return record.numpy, record.numpy_helper
        if record.torch:
            return record.torch, None
        if record.numpy_helper or "np." in record.numpy:
            raise CodegenError(f"the torch target has no spelling for {name}(); give its record a `torch` template")
        return record.numpy, None

    def __iter__(self) -> Iterator[str]:
        yield "neg"
        yield from FUNCTIONS

    def __len__(self) -> int:
        return len(FUNCTIONS) + 1


class _Operations(Mapping):
    """fn -> (template over the operands "{0}", "{1}", ..., helper it needs), live over the operation records."""

    def __init__(self, language: str) -> None:
        self.language = language

    def __getitem__(self, name: str) -> tuple[str, str | None]:
        record = OPERATIONS[name]
        if self.language == "numpy":
            return record.numpy, None
        return record.torch, record.torch_helper

    def __iter__(self) -> Iterator[str]:
        yield from OPERATIONS

    def __len__(self) -> int:
        return len(OPERATIONS)


@dataclass(frozen=True)
class Spelling:
    """One array library's syntax (see the module docstring); templates read `{x}`, `{axis}`, `{n}`, ..."""

    name: str                     # "numpy" or "torch": the function records' field
    module: str                   # what its functions are called through: `np.exp`, `torch.exp`
    numbers: Mapping[str, str]    # inf and pi as Python expressions
    transpose: str                # the last two axes swapped
    reduce: Mapping[str, str]     # kind -> template over {x}, {axis} (kept)
    scan: Mapping[bool, str]      # reverse -> template over {x}, {axis}
    constant: Mapping[str, tuple[str, str | None]]  # kind -> (template over {args}, helper)
    sum_kept: str                 # {x} summed over {axes}, keeping them
    sum_dropped: str              # {x} summed over {axes}, dropping them
    full: str                     # a new array of {shape} filled with {value}, in the dtype
    cast: str                     # {x} in the computation's dtype
    cast_to: str                  # {x} in the dtype {dtype}
    arange: str                   # the integers 0 .. {n} - 1 (an index array)
    to_index: str                 # {x} (integers held as numbers: floor(...)) as an index array
    any: str                      # whether an array of booleans {x} holds a True, as a Python bool
    arange_values: str            # an index's values 0 .. {n} - 1 as numbers: kept integer (exact) or in the dtype
    integer_positions: bool       # whether `arange_values` is an integer array (cast where it meets a value)
    moveaxis: str                 # {x} with axes {src} moved to {dst}
    where: str                    # the function `where`
    einsum: str                   # the function `einsum`
    einsum_optimize: str          # what an einsum of three or more operands adds (NumPy: its path search)
    scalar_function: Mapping[str, str] = field(default_factory=dict)  # fn -> on a Python number (else the
    # function's own template wrapped in `float(...)`, or `math.<fn>`)
    reserved: frozenset = frozenset()  # names a generated module uses for itself

    @property
    def functions(self) -> Mapping[str, tuple[str, str | None]]:
        return _Functions(self.name)

    @property
    def operations(self) -> Mapping[str, tuple[str, str | None]]:
        return _Operations(self.name)

    def scalar(self, fn: str, x: str) -> Code:
        """`fn` applied to a Python number, as a Python number (keeps a scalar "weak": no upcast of float32)."""
        if fn in self.scalar_function:
            template = self.scalar_function[fn]
            return Code(template.format(x=x), MUL if " / " in template else ATOM, carrying=False)
        template, _ = self.functions[fn]
        return Code(f"float({template.format(x=x)})", ATOM, carrying=False)


NUMPY = Spelling(
    name="numpy", module="np", numbers={"inf": "np.inf", "pi": "np.pi"},
    transpose="{x}.swapaxes(-1, -2)",
    reduce={"sum": "np.sum({x}, axis={axis}, keepdims=True)", "mean": "np.mean({x}, axis={axis}, keepdims=True)",
            "logsumexp": "_logsumexp({x}, axis={axis})", "max": "np.max({x}, axis={axis}, keepdims=True)",
            "min": "np.min({x}, axis={axis}, keepdims=True)"},
    scan={False: "np.cumsum({x}, axis={axis})", True: "_reverse_cumsum({x}, axis={axis})"},
    constant={"sinusoidal": ("_sinusoidal({args}, dtype)", "_sinusoidal"),
              "causal_mask": ("_causal_mask({args}, dtype)", "_causal_mask"),
              "eye": ("np.eye({args}, dtype=dtype)", None), "ones": ("np.ones(({args},), dtype=dtype)", None)},
    sum_kept="np.sum({x}, axis={axes}, keepdims=True)", sum_dropped="np.sum({x}, axis={axes})",
    full="np.full({shape}, {value}, dtype=dtype)", cast="{x}.astype(dtype)", cast_to="{x}.astype({dtype})",
    arange="np.arange({n})", to_index="{x}.astype(np.int64)", any="bool(np.any({x}))", arange_values="np.arange({n}, dtype=dtype)",
    integer_positions=False,
    moveaxis="np.moveaxis({x}, {src}, {dst})", where="np.where", einsum="np.einsum", einsum_optimize=", optimize=True",
    reserved=frozenset({"np", "dtype", "outputs", "gradients", "forward", "backward", "forward_backward",
                        "_forward_backward", "_", "float", "dict", "tuple", "list", "len", "range", "ValueError",
                        "batch", "max", "min", "int", "TILED_ABOVE", "BLOCK_Q", "BLOCK_K", "THREADS",
                        "_forward_backward_tiled"}) | frozenset(CLOSURE_NAMES),
)

# fn -> on a Python number in a torch module (`math` has no sigmoid or relu)
_MATH = {"abs": "abs({x})", "relu": "max({x}, 0.0)", "sigmoid": "1 / (1 + math.exp(-{x}))",
         "exp2": "math.pow(2.0, {x})", "floor": "float(math.floor({x}))", "ceil": "float(math.ceil({x}))",
         **{fn: f"math.{fn}({{x}})" for fn in ("exp", "log", "sqrt", "tanh", "sin", "cos", "tan", "log2")}}

TORCH = Spelling(
    name="torch", module="torch", numbers={"inf": "math.inf", "pi": "math.pi"},
    transpose="{x}.transpose(-1, -2)",
    reduce={"sum": "torch.sum({x}, dim={axis}, keepdim=True)", "mean": "torch.mean({x}, dim={axis}, keepdim=True)",
            "logsumexp": "_logsumexp({x}, {axis})", "max": "torch.amax({x}, dim={axis}, keepdim=True)",
            "min": "torch.amin({x}, dim={axis}, keepdim=True)"},
    scan={False: "torch.cumsum({x}, dim={axis})", True: "_reverse_cumsum({x}, dim={axis})"},
    constant={"sinusoidal": ("_sinusoidal({args}, dtype, device)", "_sinusoidal"),
              "causal_mask": ("_causal_mask({args}, dtype, device)", "_causal_mask"),
              "eye": ("torch.eye({args}, dtype=dtype, device=device)", None),
              "ones": ("torch.ones(({args},), dtype=dtype, device=device)", None)},
    sum_kept="torch.sum({x}, dim={axes}, keepdim=True)", sum_dropped="torch.sum({x}, dim={axes})",
    full="torch.full({shape}, {value}, dtype=dtype, device=device)", cast="{x}.to(dtype)",
    cast_to="{x}.to({dtype})", arange="torch.arange({n}, device=device)", to_index="{x}.long()", any="bool(torch.any({x}))",
    # positions stay integers (exact at any size: a bfloat16 arange rounds above 256) until they meet a value
    arange_values="torch.arange({n}, device=device)", integer_positions=True,
    moveaxis="torch.movedim({x}, {src}, {dst})", where="torch.where", einsum="torch.einsum", einsum_optimize="",
    scalar_function=_MATH,
    reserved=frozenset({"torch", "math", "device", "dtype", "outputs", "gradients", "forward", "backward",
                        "forward_backward", "_", "float", "dict", "tuple", "list", "len", "range", "ValueError",
                        "batch", "max", "min", "int", "isinstance", "op", "op_backward", "Function", "_forward",
                        "_backward", "_outputs", "_gradients", "_tensors", "LEAVES", "OUTPUTS", "DIFFERENTIABLE",
                        "BLOCK_Q", "BLOCK_K"}) | frozenset(CLOSURE_NAMES),
)
