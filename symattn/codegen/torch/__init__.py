"""The PyTorch target: `torch_source(spec)`, a module with the NumPy module's calling convention whose
`forward` is differentiable through the derived backward (see `symattn.codegen.torch.emit`)."""

from .emit import load_torch_module, torch_source

__all__ = ["torch_source", "load_torch_module"]
