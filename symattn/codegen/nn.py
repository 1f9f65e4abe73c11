"""`spec.torch()`: a spec as a `torch.nn.Module` whose parameters are the spec's params.

Contract: `AttentionModule(spec, generated, backend, triton)` holds every param of the
spec as an `nn.Parameter` of the spec's shape at its sizes (drawn from a normal
distribution with standard deviation 1 / sqrt(fan in), the size of the
param's second-to-last axis, or its only one), and is called with the inputs
and buffers as keywords (`module(X=x, keep=k)`, any leading batch axes, size
keywords too) returning the outputs as a dict. A spec with `dropout` takes
`seed=` too; in training mode without one, each call draws a fresh seed from
torch's default generator (so `torch.manual_seed` makes runs repeatable); in
eval mode a seed must be given, since dropout is part of the spec's
mathematics and `eval()` cannot take it out (write the spec without it for
inference). `.double()`, `.to(device)`,
state dicts, DDP and FSDP see ordinary parameters. The computation is the
generated torch module's differentiable `forward` (the derived backward) for
the "eager" backend; "triton" runs the Triton target's module, which
`triton()` loads when first called (None: there is none; a `SymAttnError`
says so then, or when the tensors are on the CPU and `TRITON_INTERPRET=1` is
not set); "auto" takes Triton for CUDA tensors where there is one, eager
otherwise.
"""

from __future__ import annotations

import math
import os
from typing import Callable

import torch

from ..errors import SymAttnError, UsageError
from ..ir import typed as t

__all__ = ["AttentionModule", "BACKENDS"]

BACKENDS = ("auto", "triton", "eager")


class AttentionModule(torch.nn.Module):
    """The spec's forward pass as an nn.Module: params are parameters, inputs and buffers are keywords."""

    def __init__(self, spec: t.TypedSpec, generated, backend: str = "auto",
                 triton: Callable | None = None) -> None:
        super().__init__()
        if backend not in BACKENDS:
            raise UsageError(f"torch: unknown backend {backend!r}; expected one of {', '.join(BACKENDS)}")
        self.spec = spec
        self.generated = generated
        self.backend = backend
        self._triton = None
        self._load_triton = triton
        for name in spec.params:
            shape = spec.concrete_shape(spec.tensors[name].shape)
            fan_in = shape[-2] if len(shape) >= 2 else (shape[-1] if shape else 1)
            value = torch.randn(shape) / math.sqrt(max(fan_in, 1))
            self.register_parameter(name, torch.nn.Parameter(value))

    def extra_repr(self) -> str:
        inputs = ", ".join(list(self.spec.inputs) + [b for b in self.spec.buffers if b in self.spec.arguments]
                           + ([self.spec.seed_keyword] if self.spec.dropouts else []))
        return f"spec={self.spec.name}, inputs=({inputs}), outputs=({', '.join(self.spec.outputs)}), " \
               f"backend={self.backend}"

    def forward(self, **inputs) -> dict:
        wanted = set(self.spec.arguments) - set(self.spec.params)
        seed = self.spec.seed_keyword
        if seed is not None and seed not in inputs:
            if not self.training:
                masks = ", ".join(self.spec.tensors[m].dropout.of for m in self.spec.dropouts)
                raise TypeError(f"{self.spec.name}: eval mode, and the spec applies dropout ({masks}); pass {seed}= "
                                "to apply it, or load a spec without dropout for inference")
            inputs[seed] = int(torch.randint(0, 2 ** 62, (), dtype=torch.int64)) * 4 + \
                int(torch.randint(0, 4, (), dtype=torch.int64))
        if seed is not None:
            wanted.add(seed)
        unknown = sorted(set(inputs) - wanted - set(self.spec.dims))
        if unknown:
            raise TypeError(f"{self.spec.name}: unexpected keywords {unknown}; expected {sorted(wanted)}")
        missing = sorted(wanted - set(inputs))
        if missing:
            raise TypeError(f"{self.spec.name}: missing inputs {missing}")
        params = {name: getattr(self, name) for name in self.spec.params}
        return self._target(inputs).forward(**inputs, **params)

    def _target(self, inputs: dict):
        device = next((v.device for v in inputs.values() if isinstance(v, torch.Tensor)), torch.device("cpu"))
        if self.backend == "eager":
            return self.generated
        if self.backend == "auto" and (device.type != "cuda" or self._load_triton is None):
            return self.generated
        return self._triton_module(device)

    def _triton_module(self, device: torch.device):
        if self._load_triton is None:
            raise SymAttnError("torch(backend='triton'): this installation has no Triton target "
                               "(symattn.codegen.triton, with the triton package); use backend='eager' or 'auto'")
        if device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
            raise SymAttnError(f"torch(backend='triton'): the tensors are on {device.type}, and Triton kernels run "
                               "on CUDA devices; set TRITON_INTERPRET=1 to run them in Triton's interpreter on the "
                               "CPU, or use backend='eager'")
        if self._triton is None:
            self._triton = self._load_triton()
        return self._triton
