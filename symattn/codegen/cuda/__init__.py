"""CUDA code generation: a spec's forward and backward as CUDA kernels.

Contract: `emit_cuda(spec, fused=True)` returns a `CudaCode`: the kernel
plan (`symattn.codegen.cuda.plan`, lowered from the spec's program IR) and
the files of `symattn emit cuda` (`.cu`, `.h`, `cuda_host.h`, `README.md`; see
`symattn.codegen.cuda.emit`). `write(dir)` puts the files in a directory.
The cores of the attention plan (`symattn.codegen.plan`) are fused
(FlashAttention-2 style) unless `fused=False`; everything else takes the
generic path. A spec the generator cannot translate raises `CodegenError`
(or the derivation's `SymbolicError`) naming what is missing.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ...ir import typed as t
from .emit import render, signatures
from .plan import KernelPlan, plan

__all__ = ["CudaCode", "emit_cuda"]


@dataclass
class CudaCode:
    plan: KernelPlan  # the kernels and buffers, lowered from the spec's program
    files: dict[str, str]

    @property
    def prefix(self) -> str:
        return self.plan.prefix

    @property
    def source_name(self) -> str:
        return f"{self.plan.prefix}.cu"

    @property
    def path(self) -> str:
        """'fused' when an attention core is computed by the fused kernels, else 'generic'."""
        return self.plan.path

    def signatures(self) -> dict[str, str]:
        return signatures(self.plan)

    def kernel_names(self) -> list[str]:
        """Every `extern "C"` kernel in the source (each head-dim instantiation of the fused ones)."""
        out = []
        for kernel in (*self.plan.forward, *self.plan.backward):
            out += [name for _, name in kernel.variants] or [kernel.name]
        return out

    def write(self, directory: str | Path) -> list[Path]:
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        written = []
        for name, text in self.files.items():
            path = directory / name
            path.write_text(text, encoding="utf-8")
            written.append(path)
        return written


def emit_cuda(spec, fused: bool = True) -> CudaCode:
    """CUDA for a `Spec` or a `TypedSpec`."""
    typed: t.TypedSpec = getattr(spec, "typed", spec)
    kernels = plan(typed, fused=fused)
    return CudaCode(kernels, render(kernels))
