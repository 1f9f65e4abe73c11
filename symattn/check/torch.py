"""Check the generated PyTorch module: `symattn verify SPEC --target torch`.

Contract: `verify_torch(spec)` generates the torch module and runs it through
`symattn.check.numpy.verify_numpy`'s configurations, reference evaluator and
finite differences (nothing is copied), in float64 on the CPU: the forward
outputs of `forward`, and the gradients that torch autograd computes through
the module's custom op (so the derived backward, the values the forward saves
and the autograd wiring are all checked). The torch module is seen through
`AutogradView`, which has the NumPy module's calling convention on NumPy arrays.
"""

from __future__ import annotations

from ..ir import typed as t
from .numpy import Report, verify_numpy

__all__ = ["verify_torch", "AutogradView"]


class AutogradView:
    """A generated torch module as a NumPy-style module: arrays in, arrays out, gradients by autograd."""

    def __init__(self, module, spec: t.TypedSpec) -> None:
        self.module = module
        self.spec = spec

    def _tensors(self, arrays: dict, grad: bool) -> dict:
        import torch

        return {name: torch.tensor(value, dtype=torch.float64,
                                   requires_grad=grad and name in self.spec.differentiable)
                if name in self.spec.arguments else value for name, value in arrays.items()}

    def forward(self, **arrays):
        outputs = self.module.forward(**self._tensors(arrays, grad=False))
        return {name: value.detach().numpy() for name, value in outputs.items()}

    def backward(self, **arrays):
        import torch

        upstream = {o: arrays.pop(f"grad_{o}") for o in self.spec.outputs}
        tensors = self._tensors(arrays, grad=True)
        outputs = self.module.forward(**tensors)
        loss = sum((outputs[o] * torch.as_tensor(upstream[o], dtype=torch.float64)).sum() for o in self.spec.outputs)
        wanted = [tensors[n] for n in self.spec.differentiable]
        grads = torch.autograd.grad(loss, wanted, allow_unused=True)
        return {n: (g if g is not None else torch.zeros_like(w)).numpy()
                for n, g, w in zip(self.spec.differentiable, grads, wanted)}


def verify_torch(spec: t.TypedSpec, seed: int = 0, budget: int | None = None) -> Report:
    """The torch module against the reference evaluator and finite differences (see the module docstring)."""
    from ..codegen.torch.emit import load_torch_module, torch_source

    module = load_torch_module(torch_source(spec), f"symattn_verify_torch_{spec.name}")
    return verify_numpy(spec, seed=seed, module=AutogradView(module, spec), budget=budget)
