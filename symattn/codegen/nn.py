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


def derive_higher_orders(generated, spec: t.TypedSpec, backward_pass: Callable, tangent_pass: Callable) -> None:
    """Fill the generated torch module's DOUBLE_BACKWARD and TANGENTS hooks from the backward and tangent passes
    written as specs (`symattn.symbolic.passes`), so that double backward (create_graph=True, gradgradcheck) and
    forward-mode AD (torch.func.jvp, torch.autograd.forward_ad) run derived formulas. `backward_pass()` and
    `tangent_pass()` return (the pass's generated torch module, its names: "grad(T)"/"tangent(T)" -> tensor,
    its typed spec),
    built on first use. A spec with dropout keeps both raising: its written passes read the drawn mask as a
    buffer, which the module never returns."""
    if spec.dropouts:
        def refuse(*args):
            raise NotImplementedError(f"{spec.name}: double backward and forward-mode AD of a spec with dropout are "
                                      "not derived yet (the written passes read the drawn mask as a buffer)")
        generated.DOUBLE_BACKWARD = generated.TANGENTS = refuse
        return
    leaves, sizes = generated.LEAVES, generated.SIZES

    def double_backward(values, upstream, grads, size_values):
        module, names, typed = backward_pass()
        given = dict(zip(leaves, values))
        given.update({names[f"grad({o})"]: u for o, u in zip(spec.outputs, upstream)})
        dims = dict(zip(sizes, size_values))
        written = [names[f"grad({x})"] for x in spec.differentiable]
        # grad_X in the written pass may keep a reduced axis of size 1 where X is a scalar ([1, 1] for ()):
        # its cotangent takes the written shape
        shapes = {w: tuple(typed.concrete_shape(typed.tensors[w].shape)) for w in written}
        cotangents = [torch.zeros(shapes[w], dtype=given[x].dtype, device=given[x].device) if g is None else
                      g.reshape(shapes[w]) if tuple(g.shape) != shapes[w] and g.numel() == math.prod(shapes[w]) else g
                      for g, x, w in zip(grads, spec.differentiable, written)]
        if torch.is_grad_enabled():  # a third order asked for: through the backward pass's own derived backward
            # each argument through a view of its own, so that the gradient taken is the partial one along that
            # argument alone (the upstream gradient may be a function of the leaves too), still on the graph
            given = {n: v.view_as(v) if isinstance(v, torch.Tensor) and v.requires_grad else v for n, v in given.items()}
            outputs = module.forward(**given, **dims)
            wrt = [n for n, v in given.items() if isinstance(v, torch.Tensor) and v.requires_grad]
            found = torch.autograd.grad([outputs[w] for w in written], [given[n] for n in wrt], cotangents,
                                        create_graph=True, allow_unused=True)
            gradients = dict(zip(wrt, found))
        else:
            gradients = module.backward(**given, **dims, **{f"grad_{w}": c for w, c in zip(written, cotangents)})
        return ([gradients.get(x) if x in spec.differentiable else None for x in leaves],
                [gradients.get(names[f"grad({o})"]) for o in spec.outputs])

    def tangents(values, tangent_values, size_values):
        module, names, _ = tangent_pass()
        given = dict(zip(leaves, values))
        for x, v, tv in zip(leaves, values, tangent_values):
            if x in spec.differentiable:
                given[names[f"tangent({x})"]] = tv if tv is not None else torch.zeros_like(v)
        outputs = module.forward(**given, **dict(zip(sizes, size_values)))
        return [outputs[names[f"tangent({o})"]] for o in spec.outputs]

    generated.DOUBLE_BACKWARD = double_backward
    generated.TANGENTS = tangents
