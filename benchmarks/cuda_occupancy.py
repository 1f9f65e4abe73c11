"""Registers, shared memory, spills and theoretical occupancy of the emitted CUDA kernels on sm_90.

    python benchmarks/cuda_occupancy.py [SPEC.attn ...]

Default specs: self_attention, causal, alibi, cosine, gqa from derivations/. Each is emitted (its
default path), compiled by the nvcc compile gate (`symattn.check.cuda.compile_gate`: ptxas -v, no GPU
needed) and every kernel gets a row of a Markdown table: the head dim it is instantiated for (fused
kernels; "any" for the generic ones, whose sizes are runtime arguments), threads per block, registers,
static shared memory, spills, and the theoretical occupancy from the sm_90 limits below. Exit status 1
when a kernel spills or the gate fails otherwise; 2 without nvcc.

Occupancy (the CUDA occupancy calculator's rules for compute capability 9.0):
- registers are allocated per warp in units of 256: ceil(registers x 32 / 256) x 256 per warp, and
  65,536 per SM: at most floor(65536 / that) warps, in whole blocks;
- shared memory: 228 KiB per SM, each block taking its static shared memory plus 1 KiB the runtime
  reserves per block, in units of 128 bytes;
- at most 64 warps (2,048 threads) and 32 blocks per SM.
Blocks per SM is the smallest of the four; warps per SM = blocks x warps per block.
"""

from __future__ import annotations

import re
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import symattn  # noqa: E402
from symattn.check.cuda import compile_gate, find_nvcc  # noqa: E402
from symattn.codegen.cuda import emit_cuda  # noqa: E402

SPECS = ["self_attention", "causal", "alibi", "cosine", "gqa"]

REGISTERS_PER_SM = 65536
REGISTER_UNIT = 256            # registers are allocated per warp in units of this many
SHARED_PER_SM = 228 * 1024
SHARED_RESERVED = 1024         # per block, by the CUDA runtime (compute capability 8.0 and later)
SHARED_UNIT = 128
WARPS_PER_SM = 64
BLOCKS_PER_SM = 32


@dataclass
class Occupancy:
    blocks: int                # resident blocks per SM
    warps: int                 # resident warps per SM
    limiter: str               # what bounds `blocks`: registers, shared memory, warps or blocks

    @property
    def fraction(self) -> float:
        return self.warps / WARPS_PER_SM


def occupancy(registers: int, shared_bytes: int, threads: int) -> Occupancy:
    """Theoretical occupancy of one kernel on an sm_90 SM (see the module docstring)."""
    warps_per_block = -(-threads // 32)
    per_warp = -(-registers * 32 // REGISTER_UNIT) * REGISTER_UNIT
    by_registers = (REGISTERS_PER_SM // per_warp) // warps_per_block if per_warp else BLOCKS_PER_SM
    per_block = -(-(shared_bytes + SHARED_RESERVED) // SHARED_UNIT) * SHARED_UNIT
    # In a tie the SM's own maximum is named (blocks, then warps), not the kernel's resources.
    limits = {"blocks": BLOCKS_PER_SM, "warps": WARPS_PER_SM // warps_per_block, "registers": by_registers,
              "shared memory": SHARED_PER_SM // per_block}
    limiter = min(limits, key=limits.__getitem__)
    blocks = limits[limiter]
    return Occupancy(blocks, blocks * warps_per_block, limiter)


def _evaluate(text: str, values: dict[str, int]) -> int | None:
    """An integer expression of SA_ macros (`SA_TILE_THREADS * SA_TILE_THREADS`), or None."""
    expr = re.sub(r"\bSA_\w+\b", lambda m: str(values.get(m.group(0), m.group(0))), text.split("//")[0].strip())
    if not re.fullmatch(r"[\d\s()*/+-]+", expr):
        return None
    return int(eval(expr.replace("/", "//")))  # noqa: S307 - digits and operators only


def _macros(source: str) -> dict[str, int]:
    """The numeric #defines of the emitted source (SA_ATTN_ROWS 64, ...), resolved in order."""
    values: dict[str, int] = {}
    for name, text in re.findall(r"^#define (SA_\w+) (.+)$", source, flags=re.M):
        value = _evaluate(text, values)
        if value is not None:
            values[name] = value
    return values


def rows(stem_or_path: str) -> list[dict]:
    path = Path(stem_or_path)
    spec = symattn.load(path if path.suffix == ".attn" else REPO / "derivations" / f"{stem_or_path}.attn")
    code = emit_cuda(spec)
    source = code.files[code.source_name]
    macros = _macros(source)
    # Threads per block: every emitted kernel launches exactly its __launch_bounds__ maximum.
    threads = {name: _evaluate(bound, macros)
               for bound, name in re.findall(r"__launch_bounds__\(([^,)]+)(?:, \d+)?\) (\w+)\(", source)}
    head_dims = {variant: variant.rsplit("_d", 1)[1]
                 for kernel in (*code.plan.forward, *code.plan.backward) for _, variant in kernel.variants}
    with tempfile.TemporaryDirectory() as tmp:
        code.write(tmp)
        gate = compile_gate(Path(tmp) / code.source_name)
    if gate.skipped:
        raise SystemExit(f"skipped: {gate.skipped}")
    out = []
    for k in gate.kernels:
        occ = occupancy(k.registers, k.shared_bytes, threads[k.name])
        out.append(dict(spec=code.prefix, path=code.path, kernel=k.name, head_dim=head_dims.get(k.name, "any"),
                        threads=threads[k.name], registers=k.registers, shared=k.shared_bytes,
                        spills=k.spill_stores + k.spill_loads, occupancy=occ, problems=gate.problems))
    order = {name: n for n, name in enumerate(code.kernel_names())}
    return sorted(out, key=lambda r: (r["head_dim"] == "any", int(r["head_dim"]) if r["head_dim"] != "any" else 0,
                                      order.get(r["kernel"], 0)))


def table(specs: list[str]) -> tuple[str, bool]:
    lines = ["| spec | kernel | head dim | threads | registers | shared (B) | spills (B) | blocks / SM | "
             "warps / SM | occupancy | limited by |",
             "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    ok = True
    for spec in specs:
        found = rows(spec)
        for r in found:
            occ = r["occupancy"]
            lines.append(f"| {r['spec']} | `{r['kernel']}` | {r['head_dim']} | {r['threads']} | {r['registers']} | "
                         f"{r['shared']} | {r['spills']} | {occ.blocks} | {occ.warps} | {occ.fraction:.0%} | "
                         f"{occ.limiter} |")
        ok = ok and not (found and found[0]["problems"])
    return "\n".join(lines), ok


if __name__ == "__main__":
    if find_nvcc() is None:
        print("skipped: nvcc not found")
        sys.exit(2)
    text, ok = table(sys.argv[1:] or SPECS)
    print(text)
    sys.exit(0 if ok else 1)
