"""Check the tensor-core attention kernels without a GPU, through cuda_warp.h's CPU emulation.

Contract: `verify_tensor_cores(code, library, sizes, batch)` runs, for each
fused core of `code` (a `CudaCode` whose `plan.tensor_cores` is not empty),
each dtype (`bf16`, `f16`) and each head dim of `head_dims`, the host
function `<core>_forward_<dtype>` of the CPU build `library` on random
inputs rounded to that dtype, and compares O and lse with a float64
reference of the rounded inputs: the spec's reference evaluator computes the
core's score from Q @ K.T (`core.score`, with the tensors of constants it
reads), then softmax and @ V in NumPy (a fully masked row: O = 0, lse = -inf,
the kernels' convention). At head dims up to 128 the backward
`<core>_backward_<dtype>` runs too, on the forward's O and lse and a random
grad(O) in the same type, against dQ, dK, dV in float64 (the softmax backward
times the score's derivative `core.score_grad`, evaluated by the reference
evaluator). It returns one `TensorCoreCase` per run. Sizes:
`sizes` (the fp32 check's), with the core's head dim solved to each of
`head_dims`; a head dim the spec cannot take (no dim to solve, or d_v not a
multiple of 8) is skipped and says so.

Tolerances (max |got - want| / max |want|, per tensor), `TC_TOLERANCE`: the
kernels round P to the input type before P @ V and O to it on the way out,
two roundings of relative size u (bf16: u = 2^-9 ~ 2e-3, f16: 2^-12 ~ 2.4e-4
for values in range); Q K^T and the softmax statistics are fp32 sums of exact
products (error ~ d * 2^-24). So O's error is a few u: bf16 2e-2 and f16
5e-3 leave about a factor 5-10 over what is seen, and lse, computed in fp32
from fp32 scores, keeps the fp32 check's 1e-4. The gradients see the same
roundings (P and dS to the input type before their products, delta from the
rounded O) and get O's tolerance; they come out at 1-4e-3 (bf16) and 2-4e-4 (f16).
"""

from __future__ import annotations

import ctypes
import importlib.util
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Mapping, Sequence

import numpy as np
import sympy

from ..codegen.plan import ProductEntry
from ..ir import typed as t
from ..ir.functions import FUNCTIONS, OPERATIONS
from ..ir.sizes import repair, valid_sizes
from ..codegen.cuda import CudaCode
from ..codegen.cuda.tensor_core import TC_DTYPES, TC_HEAD_DIMS, TensorCoreForward, shared_bytes
from ..codegen.cuda.tensor_core_backward import BACKWARD_HEAD_DIMS, backward_shared_bytes
from .numpy import relative_error as _relative_error

__all__ = ["TC_TOLERANCE", "LSE_TOLERANCE", "TensorCoreCase", "TensorCoreResources", "round_to", "decode",
           "core_reference", "core_gradients", "head_dim_sizes", "case_shapes", "case_inputs", "score_case",
           "say_cases",
           "run_forward", "run_backward",
           "verify_tensor_cores", "tensor_core_resources", "blocks_per_sm", "find_cuobjdump"]

TC_TOLERANCE = {"bf16": 2e-2, "f16": 5e-3}
LSE_TOLERANCE = 1e-4
HEAD_DIMS = (32, 64, 128)


@dataclass
class TensorCoreCase:
    core: str
    dtype: str
    head_dim: int
    sizes: dict[str, int]
    errors: dict[str, float] = field(default_factory=dict)   # "O", "lse" -> max relative error
    problems: list[str] = field(default_factory=list)
    skipped: str | None = None

    @property
    def ok(self) -> bool:
        return not self.problems


def round_to(x: np.ndarray, dtype: str) -> tuple[np.ndarray, np.ndarray]:
    """(the 16-bit patterns, their float64 values) of `x` rounded to nearest even in `dtype`."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    if dtype == "f16":
        bits = x.astype(np.float16).view(np.uint16)
        return bits, bits.view(np.float16).astype(np.float64)
    if dtype != "bf16":
        raise ValueError(f"unknown tensor-core dtype {dtype!r} (bf16 or f16)")
    u = x.view(np.uint32).astype(np.uint64)
    bits = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    return bits, decode(bits, dtype)


def decode(bits: np.ndarray, dtype: str) -> np.ndarray:
    if dtype == "f16":
        return bits.view(np.float16).astype(np.float64)
    return (bits.astype(np.uint32) << 16).view(np.float32).astype(np.float64)


_BINARY = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.divide, "pow": np.power}
_COMPARE = {"<": np.less, "<=": np.less_equal, ">": np.greater, ">=": np.greater_equal, "==": np.equal,
            "!=": np.not_equal}


def _entry_values(node: t.Node, spec: t.TypedSpec, core, sizes: Mapping[str, int], s: np.ndarray) -> np.ndarray:
    """An entry expression of the core (its score, or its derivative) at every (heads, i, j) in float64, the
    product's entries given (`s`, [batch, heads..., n_q, n_k]): numbers, dims, coordinates and arithmetic."""
    n_q, n_k = s.shape[-2], s.shape[-1]
    lead = len(core.lead)
    coords = {"i": np.arange(n_q)[:, None], "j": np.arange(n_k)[None, :]}
    for k in range(lead):
        coords[f"z{k}"] = np.arange(s.shape[s.ndim - 2 - lead + k]).reshape((-1,) + (1,) * (lead - k + 1))

    def value(n: t.Node):
        if isinstance(n, ProductEntry):
            return s
        if isinstance(n, t.Scalar):
            return float(n.value)
        if isinstance(n, t.DimValue):
            return float(sympy.sympify(n.dim).subs({spec.dims[k].symbol: v for k, v in sizes.items()}))
        if isinstance(n, t.IndexVar):
            return coords[n.name]
        if isinstance(n, t.Unary):
            x = value(n.x)
            return -x if n.fn == "neg" else FUNCTIONS[n.fn].float64(np.asarray(x, dtype=np.float64))
        if isinstance(n, t.Binary):
            with np.errstate(all="ignore"):
                return _BINARY[n.op](value(n.a), value(n.b))
        if isinstance(n, t.Compare):
            return _COMPARE[n.op](value(n.a), value(n.b))
        if isinstance(n, t.Logical):
            parts = [value(x) for x in n.args]
            return np.logical_not(parts[0]) if n.op == "not" else (
                np.logical_and(*parts) if n.op == "and" else np.logical_or(*parts))
        if isinstance(n, t.Where):
            return np.where(value(n.cond), value(n.a), value(n.b))
        if isinstance(n, t.Apply):  # // % min max clamp, by the operation records' float64 values
            with np.errstate(all="ignore"):
                return OPERATIONS[n.fn].float64(*(np.asarray(value(a)) for a in n.args))
        raise TypeError(f"the tensor-core check evaluates no {type(n).__name__}")

    return np.broadcast_to(value(node), s.shape)


def _evaluate(spec: t.TypedSpec, core, sizes: Mapping[str, int], node: t.Node, q, k, v) -> np.ndarray:
    """An entry expression of the core at every (i, j), in float64, from Q, K, V."""
    return _entry_values(node, spec, core, sizes, q @ np.swapaxes(k, -1, -2))


def _probabilities(score: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """softmax over the last axis and the row logsumexp; a fully masked row gives P = 0, lse = -inf."""
    top = score.max(axis=-1, keepdims=True)
    masked = top == -np.inf
    with np.errstate(invalid="ignore"):
        p = np.where(masked, 0.0, np.exp(score - np.where(masked, 0.0, top)))
    total = p.sum(axis=-1, keepdims=True)
    with np.errstate(divide="ignore"):
        lse = np.where(total > 0, top + np.log(np.where(total > 0, total, 1.0)), -np.inf)[..., 0]
    return np.where(total > 0, p / np.where(total > 0, total, 1.0), 0.0), lse


def core_reference(spec: t.TypedSpec, core, sizes: Mapping[str, int], q: np.ndarray, k: np.ndarray,
                   v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """O and lse in float64 for Q, K, V of shape [batch, heads..., rows, dim]."""
    p, lse = _probabilities(_evaluate(spec, core, sizes, core.score, q, k, v))
    return p @ v, lse


def core_gradients(spec: t.TypedSpec, core, sizes: Mapping[str, int], q: np.ndarray, k: np.ndarray, v: np.ndarray,
                   d_out: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """dQ, dK, dV in float64 given grad(O): the softmax backward times d score / d (Q K^T)."""
    p, _ = _probabilities(_evaluate(spec, core, sizes, core.score, q, k, v))
    slope = _evaluate(spec, core, sizes, core.d_product, q, k, v)
    dp = d_out @ np.swapaxes(v, -1, -2)
    ds = p * (dp - (dp * p).sum(axis=-1, keepdims=True))
    with np.errstate(invalid="ignore"):
        dz = np.where(p > 0, ds * slope, 0.0)  # a masked entry contributes nothing (its slope may be inf)
    return dz @ k, np.swapaxes(dz, -1, -2) @ q, np.swapaxes(p, -1, -2) @ d_out


def head_dim_sizes(spec: t.TypedSpec, core, sizes: Mapping[str, int], head_dim: int) -> dict[str, int] | str:
    """`sizes` with the core's Q/K head dim set to `head_dim`, or why that is not possible."""
    d_qk = sympy.sympify(core.d_qk)
    rows = {s for d in (core.n_q, core.n_k) for s in sympy.sympify(d).free_symbols}
    symbols = sorted(d_qk.free_symbols - rows, key=str) or sorted(d_qk.free_symbols, key=str)
    if not symbols:
        return f"the head dim is the constant {d_qk}"
    symbol = symbols[0]
    other = {s: sizes[str(s)] for s in d_qk.free_symbols if s != symbol}
    solutions = [s for s in sympy.solve(sympy.Eq(d_qk.subs(other), head_dim), symbol)
                 if s.is_integer and s > 0]
    if not solutions:
        return f"no whole {symbol} gives head dim {head_dim}"
    out = dict(sizes)
    out[str(symbol)] = int(solutions[0])
    if not valid_sizes(spec, out):  # (d = 32 with h = 3 heads of split_heads: the other dims move)
        out = repair(spec, out, movable=[n for n in spec.dims if n != str(symbol)])
        if out is None or sympy.sympify(d_qk).subs({sympy.Symbol(n, positive=True, integer=True): v
                                                   for n, v in out.items()}) != head_dim:
            return f"no valid sizes give head dim {head_dim}"
    subs = {sympy.Symbol(n, positive=True, integer=True): v for n, v in out.items()}
    d_v = sympy.sympify(core.d_v).subs(subs)
    if not d_v.is_integer or int(d_v) % 8 or int(d_v) > 256:
        return f"d_v = {d_v} at head dim {head_dim} is not a multiple of 8 up to 256"
    return out


def _shape(dims: Sequence, sizes: Mapping[str, int]) -> tuple[int, ...]:
    subs = {sympy.Symbol(n, positive=True, integer=True): v for n, v in sizes.items()}
    return tuple(int(sympy.sympify(d).subs(subs)) for d in dims)


def run_forward(library: ctypes.CDLL, forward: TensorCoreForward, dtype: str, dim_values: Sequence[int],
                batch: int, q: np.ndarray, k: np.ndarray, v: np.ndarray,
                out_shape: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray, int]:
    """Call `<core>_forward_<dtype>` on 16-bit patterns; returns (O's patterns, lse, status)."""
    function = getattr(library, f"{forward.prefix}_forward_{dtype}")
    function.restype = ctypes.c_int
    function.argtypes = [ctypes.c_void_p] * 5 + [ctypes.c_int] * (len(dim_values) + 1) + [ctypes.c_void_p]
    out = np.zeros(out_shape, dtype=np.uint16)
    lse = np.full(out_shape[:-1], np.nan, dtype=np.float32)
    arrays = [np.ascontiguousarray(a) for a in (q, k, v)]
    status = function(*[a.ctypes.data for a in arrays], out.ctypes.data, lse.ctypes.data, *dim_values, batch, None)
    return out, lse, status


def run_backward(library: ctypes.CDLL, forward: TensorCoreForward, dtype: str, dim_values: Sequence[int],
                 batch: int, arrays: Mapping[str, np.ndarray]) -> tuple[dict[str, np.ndarray], int]:
    """Call `<core>_backward_<dtype>` with the 16-bit patterns of q, k, v, o, do and the fp32 lse;
    returns ({"dQ", "dK", "dV"}: fp32 arrays, status)."""
    function = getattr(library, f"{forward.prefix}_backward_{dtype}")
    function.restype = ctypes.c_int
    function.argtypes = [ctypes.c_void_p] * 10 + [ctypes.c_int] * (len(dim_values) + 1) + [ctypes.c_void_p]
    given = {name: np.ascontiguousarray(arrays[name]) for name in ("q", "k", "v", "o", "do", "lse")}
    grads = {"dQ": np.full(given["q"].shape, np.nan, np.float32), "dK": np.full(given["k"].shape, np.nan, np.float32),
             "dV": np.full(given["v"].shape, np.nan, np.float32)}
    delta = np.zeros(given["lse"].shape, np.float32)
    status = function(*[given[n].ctypes.data for n in ("q", "k", "v", "o", "do", "lse")],
                      *[g.ctypes.data for g in grads.values()], delta.ctypes.data, *dim_values, batch, None)
    return grads, status


def case_shapes(core, sizes: Mapping[str, int], batch: int) -> dict[str, tuple[int, ...]]:
    """The shapes of q, k, v and o (also grad(O)'s) of a core at `sizes`: [batch, heads..., rows, dim]."""
    lead = _shape(core.lead, sizes)
    n_q, n_k, d_qk, d_v = _shape((core.n_q, core.n_k, core.d_qk, core.d_v), sizes)
    return {"q": (batch, *lead, n_q, d_qk), "k": (batch, *lead, n_k, d_qk), "v": (batch, *lead, n_k, d_v),
            "o": (batch, *lead, n_q, d_v)}


def case_inputs(core, shapes: Mapping[str, tuple[int, ...]], dtype: str,
                rng: np.random.Generator) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """(bits, values) of q, k and v for one case: standard normal, rounded to `dtype`. Roles that one tensor
    plays (R = softmax(O @ O.T / sqrt(d)) @ O) get one array, as the kernels and the reference read them;
    when q and k are one tensor, scaled by d^-1/4: the diagonal q . q / sqrt(d) is about sqrt(d) at unit
    scale, every row's softmax one-hot, and dS = P (dP - delta) a difference of nearly equal terms that no
    16-bit product resolves (up to 20% of max |dQ| at d = 128 in bf16)."""
    scale = shapes["q"][-1] ** -0.25 if core.q == core.k else 1.0
    bits, values = {}, {}
    for index, role in enumerate("qkv"):
        same = [r for r in "qkv"[:index] if getattr(core, r) == getattr(core, role)]
        bits[role], values[role] = ((bits[same[0]], values[same[0]]) if same
                                    else round_to(scale * rng.standard_normal(shapes[role]), dtype))
    return bits, values


def score_case(case: TensorCoreCase, spec: t.TypedSpec, core, values: Mapping[str, np.ndarray], o: np.ndarray,
               lse: np.ndarray, grads: Mapping[str, np.ndarray] | None) -> None:
    """Fill `case.errors` and `case.problems` from a run's O (decoded), lse and, when the backward ran,
    {"dQ", "dK", "dV"}, against the float64 reference of the rounded `values` (q, k, v and do)."""
    dtype, head_dim = case.dtype, case.head_dim
    want_o, want_lse = core_reference(spec, core, case.sizes, values["q"], values["k"], values["v"])
    case.errors["O"] = _relative_error(o, want_o, floor=0.0)
    case.errors["lse"] = _relative_error(lse, want_lse, floor=0.0)
    tolerances = [("O", TC_TOLERANCE[dtype]), ("lse", LSE_TOLERANCE)]
    if grads is not None:
        want = core_gradients(spec, core, case.sizes, values["q"], values["k"], values["v"], values["do"])
        for label, value in zip(("dQ", "dK", "dV"), want):
            case.errors[label] = _relative_error(grads[label], value, floor=0.0)
            tolerances.append((label, TC_TOLERANCE[dtype]))
    for label, tolerance in tolerances:
        if not case.errors[label] <= tolerance:
            case.problems.append(f"{core.output} on tensor cores ({dtype}, head dim {head_dim}): {label} "
                                 f"max relative error {case.errors[label]:.2e} > {tolerance:g}")


def say_cases(cases: Sequence[TensorCoreCase], say: Callable[[str], None]) -> None:
    for case in cases:
        where = f"  {case.core} {case.dtype:<5} d={case.head_dim:<4}"
        if case.skipped:
            say(f"{where} skipped: {case.skipped}")
        else:
            errors = "  ".join(f"{k} {v:.2e}" for k, v in case.errors.items())
            say(f"{where} {errors}  {'ok' if case.ok else 'FAIL'}")


def verify_tensor_cores(code: CudaCode, library: str | Path | ctypes.CDLL, sizes: Mapping[str, int], batch: int,
                        head_dims: Sequence[int] = HEAD_DIMS, dtypes: Sequence[str] = ("bf16", "f16"),
                        seed: int = 0, out: Callable[[str], None] | None = None) -> list[TensorCoreCase]:
    say = out or (lambda line: None)
    lib = library if isinstance(library, ctypes.CDLL) else ctypes.CDLL(str(library))
    spec = code.plan.spec
    rng = np.random.default_rng(seed)
    cases = []
    for forward in code.plan.tensor_cores:
        core = forward.core
        for head_dim in head_dims:
            chosen = head_dim_sizes(spec, core, sizes, head_dim)
            for dtype in dtypes:
                case = TensorCoreCase(core.output, dtype, head_dim, chosen if isinstance(chosen, dict) else {})
                cases.append(case)
                if isinstance(chosen, str):
                    case.skipped = chosen
                    continue
                shapes = case_shapes(core, chosen, batch)
                bits, values = case_inputs(core, shapes, dtype, rng)
                dim_values = [chosen[d] for d in spec.dims]
                got, lse, status = run_forward(lib, forward, dtype, dim_values, batch,
                                               bits["q"], bits["k"], bits["v"], shapes["o"])
                if status != 0:
                    case.problems.append(f"{forward.prefix}_forward_{dtype} returned {status}")
                    continue
                grads = None
                if head_dim <= BACKWARD_HEAD_DIMS[-1]:
                    bits["do"], values["do"] = round_to(rng.standard_normal(got.shape), dtype)
                    grads, status = run_backward(lib, forward, dtype, dim_values, batch,
                                                 dict(bits, o=got, lse=lse))
                    if status != 0:
                        case.problems.append(f"{forward.prefix}_backward_{dtype} returned {status}")
                        continue
                score_case(case, spec, core, values, decode(got, dtype), lse, grads)
    say_cases(cases, say)
    return cases


# --- resources and occupancy (sm_90) ---------------------------------------------------------

SM90 = dict(registers=65536, warps=64, blocks=32, shared=233472, reserved=1024, granule=256)


@dataclass
class TensorCoreResources:
    kernel: str
    head_dim: int
    registers: int
    shared_bytes: int        # dynamic, per block (ptxas does not see it)
    spill_bytes: int
    blocks_per_sm: int
    occupancy: float         # resident warps / 64


def blocks_per_sm(registers: int, shared: int, threads: int, limits: Mapping[str, int] = SM90) -> int:
    """Resident blocks per SM: the least of the register, shared-memory, warp and block limits."""
    warps = -(-threads // 32)
    per_warp = -(-registers * 32 // limits["granule"]) * limits["granule"]
    by_registers = limits["registers"] // (per_warp * warps)
    by_shared = limits["shared"] // (shared + limits["reserved"]) if shared else limits["blocks"]
    return min(by_registers, by_shared, limits["warps"] // warps, limits["blocks"])


def tensor_core_resources(kernels: Sequence, code: CudaCode) -> list[TensorCoreResources]:
    """Registers, dynamic shared memory and theoretical occupancy of each tensor-core kernel of `code`,
    from the `KernelResources` that ptxas reported (`compile_gate(...).kernels`)."""
    found = {k.name: k for k in kernels}
    rows = []
    for forward in code.plan.tensor_cores:
        for dtype in TC_DTYPES:
            for head_dim in TC_HEAD_DIMS:
                k = found.get(forward.kernel(dtype, head_dim))
                if k is None:
                    continue
                rows.append(_resources(k, head_dim, shared_bytes(head_dim)))
            for head_dim in BACKWARD_HEAD_DIMS:
                k = found.get(f"{forward.prefix}_tc_bwd_{dtype}_d{head_dim}")
                if k is not None:
                    rows.append(_resources(k, head_dim, backward_shared_bytes(head_dim)))
    return rows


def _resources(kernel, head_dim: int, shared: int) -> TensorCoreResources:
    blocks = blocks_per_sm(kernel.registers, shared, 128)
    return TensorCoreResources(kernel.name, head_dim, kernel.registers, shared,
                               kernel.spill_stores + kernel.spill_loads, blocks, blocks * 4 / 64)


def find_cuobjdump() -> str | None:
    """cuobjdump from PATH, beside nvcc, or the copy Triton ships."""
    found = shutil.which("cuobjdump")
    if found:
        return found
    for candidate in ("/usr/local/cuda/bin/cuobjdump",):
        if os.access(candidate, os.X_OK):
            return candidate
    triton = importlib.util.find_spec("triton")
    if triton and triton.origin:
        candidate = Path(triton.origin).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
        if os.access(candidate, os.X_OK):
            return str(candidate)
    return None
