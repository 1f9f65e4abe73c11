"""CUDA code generation: a spec's forward and backward as CUDA kernels.

Contract: `emit_cuda(spec, fused=True)` returns a `CudaCode`: the planned
program (`symattn.codegen.cuda.plan`) and the files of `symattn emit cuda` (`.cu`,
`.h`, `cuda_host.h`, `README.md`; see `symattn.codegen.cuda.emit`). `write(dir)` puts
the files in a directory. Attention cores of the form
softmax(score(Q @ K.T)) @ V are fused (FlashAttention-2 style) unless
`fused=False`; everything else takes the generic path. A spec the generator
cannot translate raises `CudaCodegenError` (or the derivation's
`SymbolicError`) naming what is missing.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ...ir import typed as t
from .emit import render, signatures
from .plan import KernelPlan, plan
from .syntax import CudaCodegenError

__all__ = ["CudaCode", "CudaCodegenError", "emit_cuda"]


@dataclass
class CudaCode:
    program: KernelPlan
    files: dict[str, str]

    @property
    def prefix(self) -> str:
        return self.program.prefix

    @property
    def source_name(self) -> str:
        return f"{self.program.prefix}.cu"

    @property
    def path(self) -> str:
        """'fused' when an attention core is computed by the fused kernels, else 'generic'."""
        return self.program.path

    def signatures(self) -> dict[str, str]:
        return signatures(self.program)

    def kernel_names(self) -> list[str]:
        """Every `extern "C"` kernel in the source (each head-dim instantiation of the fused ones)."""
        out = []
        for kernel in (*self.program.forward, *self.program.backward):
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
    program = plan(typed, fused=fused)
    return CudaCode(program, render(program))
