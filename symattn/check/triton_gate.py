"""The Triton compile gate without a GPU: every kernel compiled ahead of time for sm_90.

Contract: `compile_gate(code, head_dim=64, dtype="bf16")` loads the generated
module (compiled mode: TRITON_INTERPRET unset, so run it in a process that
never interprets) and compiles each core's kernels with `triton.compile` for
`GPUTarget("cuda", 90, 32)` at the first tile config the generated module's
`_config` keeps for the head dim (what autotuning would try first). It
returns one `KernelStats` per kernel: spill bytes (the
wheel's `ptxas -v` on the kernel's PTX), stack, the shared
memory (`metadata.shared`, Triton's dynamic allocation, plus the static part
`cuobjdump -res-usage` reports), registers from the same, and whether `cuobjdump -sass`
of the cubin shows tensor-core instructions (HGMMA or HMMA). `main` prints
`table(specs)` runs it over typed specs at head dims 64 and 128 and returns
(Markdown table, ok); `benchmarks/triton_gate.py SPEC...` prints it.
"""

from __future__ import annotations

import re
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from ..codegen.triton import TritonCode, emit_triton
from .cuda import parse_ptxas

__all__ = ["KernelStats", "compile_gate", "table"]


@dataclass
class KernelStats:
    name: str
    config: str
    registers: int
    shared_bytes: int
    spills: int
    stack_bytes: int
    tensor_cores: bool
    mma: str


def _tools() -> Path:
    import triton

    return Path(triton.__file__).parent / "backends" / "nvidia" / "bin"


def _signature(fn, dtype: str, learned: set[str]) -> dict[str, str]:
    pointers = {"Q", "K", "V", "O", "DO", "DQ", "DK", "DV"}
    sig = {}
    for name in fn.arg_names:
        if name in pointers:
            sig[name] = f"*{dtype}"
        elif name in ("LSE", "DELTA") or (name.startswith(("T_", "G_")) and not re.search(r"_(bs|s\d+)$", name)):
            sig[name] = "*fp32"
        elif name in ("BLOCK_M", "BLOCK_N", "BLOCK_DQK", "BLOCK_DV", "PRECISION", "UPCAST"):
            sig[name] = "constexpr"
        else:
            sig[name] = "i32"
    return sig


def compile_gate(code: TritonCode, head_dim: int = 64, dtype: str = "bf16") -> list[KernelStats]:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from .triton import load_module

    module = load_module(code.text, interpret=False)
    target = GPUTarget("cuda", 90, 32)
    out = []
    for made in code.kernels:
        for which in ("fwd", "delta", "dkdv", "dq"):
            fn = getattr(module, f"{made.prefix}_{which}")
            if which == "delta":
                block_m, block_n, warps, stages = 64, 0, 4, 1
                constants = {"BLOCK_M": block_m, "BLOCK_DV": head_dim}
            else:
                block_m, block_n, warps, stages = module._config(which, head_dim)
                constants = {"BLOCK_M": block_m, "BLOCK_N": block_n, "BLOCK_DQK": head_dim, "BLOCK_DV": head_dim,
                             "PRECISION": "tf32", "UPCAST": False}
            source = ASTSource(fn, _signature(fn, dtype, set(made.learned)), constants)
            compiled = triton.compile(source, target=target, options={"num_warps": warps, "num_stages": stages})
            out.append(_stats(compiled, fn.__name__, f"{block_m}x{block_n}, {warps} warps, {stages} stages"))
    return out


def _ptxas(ptx: Path, arch: str) -> str:
    """`ptxas -v` output for the PTX: the wheel's newer ptxas first (its PTX version may be too new for the other)."""
    for exe in ("ptxas-blackwell", "ptxas"):
        done = subprocess.run([str(_tools() / exe), f"-arch={arch}", "-v", str(ptx), "-o", str(ptx.with_suffix(".o"))],
                              capture_output=True, text=True)
        if done.returncode == 0:
            return done.stdout + done.stderr
    return ""


def _stats(compiled, name: str, config: str) -> KernelStats:
    tools = _tools()
    with tempfile.TemporaryDirectory(prefix="symattn-triton-gate-") as tmp:
        ptx = Path(tmp) / "k.ptx"
        ptx.write_text(compiled.asm["ptx"], encoding="utf-8")
        arch = re.search(r"\.target\s+(sm_\w+)", compiled.asm["ptx"]).group(1)
        ptxas = _ptxas(ptx, arch)
        cubin = Path(tmp) / "k.cubin"
        cubin.write_bytes(compiled.asm["cubin"])
        sass = subprocess.run([str(tools / "cuobjdump"), "-sass", str(cubin)], capture_output=True, text=True).stdout
        usage = subprocess.run([str(tools / "cuobjdump"), "-res-usage", str(cubin)], capture_output=True,
                               text=True).stdout
    found = re.search(r"REG:(\d+) STACK:(\d+) SHARED:(\d+) LOCAL:(\d+)", usage)
    registers, stack, static_shared, local = map(int, found.groups()) if found else (-1, -1, 0, -1)
    kernels = parse_ptxas(ptxas)
    spills = kernels[0].spill_stores + kernels[0].spill_loads if kernels else local
    mma = sorted({m for m in re.findall(r"\b(HGMMA|HMMA)\b", sass)})
    return KernelStats(name, config, registers, int(compiled.metadata.shared) + static_shared, spills, stack,
                       bool(mma), "/".join(mma) or "none")


def table(specs, head_dims=(64, 128)) -> tuple[str, bool]:
    """The gate over typed specs as a Markdown table, and whether every kernel passed."""
    lines = ["| spec | kernel | head dim | config | registers | shared memory (bytes) | spills (bytes) | tensor cores |",
             "|---|---|---|---|---|---|---|---|"]
    ok = True
    for spec in specs:
        code = emit_triton(spec)
        for head_dim in head_dims:
            for s in compile_gate(code, head_dim):
                ok &= s.spills == 0 and (s.tensor_cores or s.name.endswith("_delta"))
                lines.append(f"| {spec.name} | {s.name} | {head_dim} | {s.config} | {s.registers} | {s.shared_bytes} | "
                             f"{s.spills} | {s.mma} |")
    return "\n".join(lines), ok
