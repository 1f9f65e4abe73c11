"""Check the emitted Triton kernels: run them (under the interpreter without a GPU) against the reference.

Contract:
- `load_module(text, interpret=None)` writes a generated Triton module to a
  file named by its hash in the temporary directory (triton.jit reads source
  through inspect), imports it and returns it; with `interpret` (default: when torch sees no CUDA device) its
  kernels run on CPU tensors under `TRITON_INTERPRET=1`. Triton fixes that
  mode when it is first imported, so the variable is set then (and left set);
  asking for the other mode after the import is an error saying so.
- `verify_triton(spec)` emits the spec's Triton module and, for each fused
  core, runs forward and backward on random float32 inputs at the spec's sizes
  with a batch axis of 2 (tiles of 16 under the interpreter: partial tiles),
  and compares O, dQ, dK, dV and the gradient of each learned score tensor
  with the float64 reference evaluator run on the core alone (O =
  softmax(score) @ V, forward op by op, gradients by central differences),
  equal meaning `relative_error`'s within `TOLERANCE`; then the full module's
  outputs and the gradient of every input and param, against the reference
  evaluator on the whole spec. Returns a `Report`.
- `compile_sm90(code)` compiles every kernel for sm_90 ahead of time
  (`triton.compile`, bf16, the first autotune config the head dim keeps) and
  returns per-kernel `KernelStats` (registers, shared memory, spills, whether
  the SASS has tensor-core instructions), read from the compiled metadata and
  `cuobjdump -sass` shipped with triton.
"""

from __future__ import annotations

import dataclasses
import os
import types
from dataclasses import dataclass, field

import numpy as np

from ..ir import typed as t
from ..codegen.plan import attention_plan
from ..codegen.triton import TritonCode, emit_triton, load_source
from .numpy import draw_dropout, finite_difference_gradients, reference_forward, relative_error

__all__ = ["TOLERANCE", "Report", "load_module", "core_spec", "verify_triton"]

TOLERANCE = 1e-4


def interpreting() -> bool:
    """Whether triton was imported (or will be) with TRITON_INTERPRET=1: the mode is fixed at import."""
    import sys

    if "triton.language.standard" not in sys.modules:
        return os.environ.get("TRITON_INTERPRET", "0") == "1"
    from triton.runtime.interpreter import InterpretedFunction

    return isinstance(sys.modules["triton.language.standard"].cdiv, InterpretedFunction)


def load_module(text: str, interpret: bool | None = None, name: str = "symattn_triton") -> types.ModuleType:
    import sys

    if interpret is None:
        import torch

        interpret = not torch.cuda.is_available()
    if interpret and "triton" not in sys.modules:
        os.environ["TRITON_INTERPRET"] = "1"  # triton's library is compiled or interpreted from its import on
    if interpret != interpreting():
        raise RuntimeError("triton was imported with TRITON_INTERPRET=" + ("1" if interpreting() else "0")
                           + "; set it " + ("to 1" if interpret else "to 0") + " before triton is first imported")
    return load_source(text, name)


@dataclass
class Row:
    what: str
    error: float

    @property
    def ok(self) -> bool:
        return self.error <= TOLERANCE


@dataclass
class Report:
    spec: str
    rows: list[Row] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return bool(self.rows) and all(r.ok for r in self.rows)

    def lines(self) -> list[str]:
        out = [*self.notes]
        out += [f"  {'ok  ' if r.ok else 'FAIL'} {r.what}: relative error {r.error:.2e}" for r in self.rows]
        failed = sum(not r.ok for r in self.rows)
        out.append(f"{self.spec}: {len(self.rows) - failed} of {len(self.rows)} tensors within tolerance"
                   + ("" if not failed else f", {failed} failed"))
        return out


def core_spec(spec: t.TypedSpec, core) -> t.TypedSpec:
    """The spec of the core alone: its Q, K, V as inputs, the tensors its score reads, and the definitions between
    them and O (the core's intermediates, and what the score recomputes), O its output. `spec` is the plan's
    (every core operand named)."""
    keep = {core.q, core.k, core.v}
    tensors = {}
    needed, stack = set(), [core.output]
    while stack:
        name = stack.pop()
        if name in needed:
            continue
        needed.add(name)
        info = spec.tensors[name]
        if info.expr is not None and name not in keep:
            stack.extend(t.tensors_read(info.expr))
    for name, info in spec.tensors.items():
        if name not in needed:
            continue
        if name in keep:
            tensors[name] = t.TensorInfo(name, "input", info.shape, info.pos)
        else:
            tensors[name] = dataclasses.replace(info, is_output=name == core.output)
    return dataclasses.replace(spec, tensors=tensors, outputs=(core.output,), checks=())


def verify_triton(spec: t.TypedSpec, seed: int = 0, code: TritonCode | None = None) -> Report:
    import torch

    code = code or emit_triton(spec)
    named = attention_plan(spec).spec
    interpret = not torch.cuda.is_available()
    module = load_module(code.text, interpret)
    device = "cpu" if interpret else "cuda"
    report = Report(spec.name)
    report.notes.append("running the kernels under TRITON_INTERPRET=1 on the CPU" if interpret
                        else f"running the kernels on {torch.cuda.get_device_name()}")
    rng = np.random.default_rng(seed)
    sizes = dict(spec.sizes)
    for name, core in zip(code.names, code.cores):
        drawn = sorted(core.drawn)
        if drawn:  # its launchers take the mask's (offset, seed) per batch entry: checked in the full module
            report.notes.append(f"{core.output}: draws the dropout mask {', '.join(drawn)} in its kernels; checked "
                                "through the full module")
            continue
        small = core_spec(named, core)
        leaves = {leaf: _draw(small, leaf, rng, sizes) for leaf in small.given}
        want = reference_forward(small, leaves, sizes)[core.output]
        upstream = {core.output: rng.standard_normal(want.shape)}
        grads = finite_difference_gradients(small, leaves, upstream, sizes)
        tensor = {n: torch.tensor(a, dtype=torch.float32, device=device) for n, a in leaves.items()}
        operands = [tensor[n] for n in core.read_tensors]
        o, lse = getattr(module, f"{name}_forward")(tensor[core.q], tensor[core.k], tensor[core.v], *operands)
        report.rows.append(Row(f"{core.output} (forward)", relative_error(o.cpu().double().numpy(), want)))
        back = getattr(module, f"{name}_backward")(tensor[core.q], tensor[core.k], tensor[core.v], o, lse,
                                                   torch.tensor(upstream[core.output], dtype=torch.float32,
                                                                device=device), *operands)
        parts: dict[str, np.ndarray] = {}  # a tensor that plays several roles (q = k = v = O): their sum
        for role, got in zip((core.q, core.k, core.v, *core.read_tensors), back):
            if got is not None:
                parts[role] = parts.get(role, 0) + got.cpu().double().numpy()
        for role, got in parts.items():
            report.rows.append(Row(f"grad({role}) through {core.output}", relative_error(got, grads[role])))
    _verify_full(spec, module, rng, sizes, device, report)
    return report


def _draw(spec: t.TypedSpec, leaf: str, rng: np.random.Generator, sizes) -> np.ndarray:
    """Random values of a given tensor, with a batch axis of 2 unless it is a param: standard normal, or for an
    integer buffer integers drawn from its range (as float64 holding integers: the modules take them as such, and
    a divisor read from one is never 0)."""
    from ..symbolic.evaluate import Evaluator

    info = spec.tensors[leaf]
    shape = ((2,) if info.kind != "param" else ()) + spec.concrete_shape(info.shape)
    if info.integer:
        low, high = (Evaluator(spec, sizes=sizes).size(v) for v in info.values)
        return rng.integers(low, high, size=shape).astype(np.float64)
    return rng.standard_normal(shape)


def _verify_full(spec, module, rng, sizes, device, report) -> None:
    """The full module (the program in torch around the cores): outputs and the gradient of every input and param
    against the reference evaluator on the whole spec (forward op by op, gradients by central differences)."""
    import torch

    leaves = {}
    for leaf in spec.given:
        info = spec.tensors[leaf]
        value = _draw(spec, leaf, rng, sizes)
        if info.kind == "buffer" and not info.integer and value.ndim:
            value[..., 0] = np.abs(value[..., 0])  # a mask keeps its first key: no row is fully masked
        leaves[leaf] = value
    leaves, arguments = draw_dropout(spec, leaves, rng)
    want = reference_forward(spec, leaves, sizes)
    upstream = {o: rng.standard_normal(np.shape(want[o])) for o in spec.outputs}
    grads = finite_difference_gradients(spec, leaves, upstream, sizes)
    tensor = {n: torch.tensor(a, dtype=torch.float32, device=device) if n in spec.arguments else a
              for n, a in arguments.items()}
    outs, got = module.forward_backward(**tensor, **{f"grad_{o}": torch.tensor(u, dtype=torch.float32, device=device)
                                                     for o, u in upstream.items()})
    for o in spec.outputs:
        report.rows.append(Row(f"{o} (full module)", relative_error(outs[o].cpu().double().numpy(), want[o])))
    for leaf in spec.differentiable:
        report.rows.append(Row(f"grad({leaf}) (full module)",
                               relative_error(got[leaf].cpu().double().numpy(), grads[leaf])))
