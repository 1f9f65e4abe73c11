"""The generated Triton module of a spec: the attention plan's cores as Triton kernels, the rest in torch.

Contract: `emit_triton(spec)` returns a `TritonCode`: `text`, the Python
source of a standalone module (torch and triton its only imports), and
`cores`, the `AttentionCore`s of the attention plan (`symattn.codegen.plan`)
it computes with its kernels; a spec whose plan fuses no core is a
`CodegenError` giving the plan's reasons. Per core `<name>` (`attention` for
the first, `<output>_attention` for any further one) the module defines:

- `<name>_forward(q, k, v, *score_tensors, **dims) -> (o, lse)`: O and the row
  log-sum-exp ([..., N, 1], fp32; -inf on a fully masked row, whose O is 0);
- `<name>_backward(q, k, v, o, lse, do, *score_tensors, dlse=None, **dims) ->
  (dq, dk, dv, *d_score_tensors)`: the gradients, with d of each learned
  score tensor (an input or param the score reads) and None for a buffer;
  `dlse` is the gradient of the row log-sum-exp where the spec has it;
- `<name>(q, k, v, *score_tensors, **dims) -> o`: differentiable through a
  `torch.autograd.Function` whose backward is the fused backward.

q, k, v are [*batch, *heads, N, d] (a head axis of size 1 in k and v is
broadcast: GQA, MQA); score tensors have their spec shapes, with batch axes
where the data has them. Dims no shape determines (a window width) are
keywords, defaulting to the spec's sizes. Around the cores, the module is
the torch module of the plan's program (`symattn.codegen.arrays.torch_module`:
`forward`, `backward`, `forward_backward`, the custom op and its derived
backward), whose fused statements call these functions.
`load_source(text)` loads such a module (triton.jit reads the source of its
functions, so it is written to a file first); `triton_module(spec)` does both.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import tempfile
import types
from dataclasses import dataclass
from pathlib import Path

import sympy

from ...errors import CodegenError
from ...ir import typed as t
from ..arrays.tiled import TiledPrinter
from ..arrays.syntax import TORCH
from ..arrays.torch_module import module_source
from ..arrays.torch_runtime import runtime
from ..plan import AttentionCore, attention_plan
from ..program_ir import FusedAttention
from .kernels import CoreKernels, core_kernels
from .runtime import PHILOX, PRELUDE, RUNTIME

__all__ = ["TritonCode", "emit_triton", "core_names", "triton_module", "load_source"]

HOST = runtime()  # the torch host's helpers: the Triton target adds none of its own (its launchers are text)


@dataclass(frozen=True)
class TritonCode:
    text: str
    cores: tuple[AttentionCore, ...]
    names: tuple[str, ...]          # the public name of each core's functions
    kernels: tuple[CoreKernels, ...]


def core_names(cores) -> list[str]:
    return ["attention" if k == 0 else f"{core.output}_attention" for k, core in enumerate(cores)]


def _binds(core: AttentionCore, spec: t.TypedSpec) -> dict[str, tuple[int, int]]:
    """dim -> (argument index, axis from the end) of a shape that gives its size directly."""
    shapes = [tuple(spec.tensors[n].shape) for n in (core.q, core.k, core.v, *core.read_tensors)]
    out: dict[str, tuple[int, int]] = {}
    for index, shape in enumerate(shapes):
        for axis, dim in enumerate(shape):
            dim = sympy.sympify(dim)
            if isinstance(dim, sympy.Symbol) and dim.name not in out:
                out[dim.name] = (index, axis - len(shape))
    return out


_LAUNCHERS = '''\
{prefix}_core = _Core(({prefix}_fwd, {prefix}_delta, {prefix}_dkdv, {prefix}_dq), lead={lead},
                  reads={reads!r},
                  dims={dims!r},
                  binds={binds!r},
                  defaults={defaults!r})


def {name}_forward(q, k, v, {ops}**dims):
    """{output} = {formula}: returns (o, lse)."""
    return {prefix}_core.forward(q, k, v, ({ops_tuple}), dims)


def {name}_backward(q, k, v, o, lse, do, {ops}dlse=None, **dims):
    """Gradients (dq, dk, dv{d_ops}) of {output} = {formula}, given do = grad({output})."""
    return {prefix}_core.backward(q, k, v, o, lse, do, ({ops_tuple}), dims, dlse)


class {cls}(torch.autograd.Function):
    """{output} = {formula}, differentiable: the backward is the fused backward kernels."""

    @staticmethod
    def forward(ctx, q, k, v, dims, *operands):
        o, lse = {prefix}_core.forward(q, k, v, operands, dims)
        ctx.save_for_backward(q, k, v, o, lse, *operands)
        ctx.dims = dims
        return o

    @staticmethod
    def backward(ctx, do):
        q, k, v, o, lse, *operands = ctx.saved_tensors
        grads = {prefix}_core.backward(q, k, v, o, lse, do.contiguous(), tuple(operands), ctx.dims)
        return (*grads[:3], None, *grads[3:])


def {name}(q, k, v, {ops}**dims):
    """{output} = {formula}, differentiable in q, k, v{learned_text}."""
    return {cls}.apply(q, k, v, dims{ops_call})
'''


class TritonPrinter(TiledPrinter):
    """The host statements in torch; a fused core is a call of its kernels' launchers."""

    rules = "Triton host printing"

    def __init__(self, program, names: dict[str, str]) -> None:
        super().__init__(program, TORCH)
        self.core_names = names  # core output -> the public name of its functions

    def fused_statement(self, var: str, node) -> list[str]:
        core = self.p.cores[node.core]
        name = self.core_names[node.core]
        lse = self.lse_name(node.core)
        spec = self.spec.tensors
        ranks = [len(spec[n].shape) for n in (core.q, core.k, core.v)]
        q, k, v = (self._operand(x, r, core) for x, r in zip((node.q, node.k, node.v), ranks))
        reads = "".join(f"{self.doprint(x).text}, " for x in node.operands)
        dims = ", ".join(f"{d}={self.p.dim_vars[d]}" for d in self.spec.dims)
        if isinstance(node, FusedAttention):
            return [f"{var}, {lse} = {name}_forward({q}, {k}, {v}, {reads}{dims})"]
        roles = [getattr(core, r) for r in ("q", "k", "v")] + list(core.learned)
        grads = [self.p.names.numbered(f"d{role}_via_{node.core}") for role in roles]
        self.fused[var] = tuple(grads)
        self.squeeze[var] = tuple(max(0, len(core.lead) - (r - 2)) for r in ranks) + (0,) * len(core.learned)
        learned = iter(grads[3:])
        targets = grads[:3] + [next(learned) if n in core.learned else "_" for n in core.read_tensors]
        o, do = self.doprint(node.o).text, self.doprint(node.do).text
        dlse = self.doprint(node.dlse).text if node.dlse is not None else "None"
        return [f"{', '.join(targets)}, = {name}_backward({q}, {k}, {v}, {o}, {lse}, {do}, {reads}dlse={dlse}, "
                f"{dims})"]


def emit_triton(spec: t.TypedSpec) -> TritonCode:
    plan = attention_plan(spec)
    if not plan.cores:
        why = "; ".join(plan.notes) or "the spec has no softmax(score) @ V"
        raise CodegenError(f"{spec.name}: no attention core to fuse ({why})")
    named = plan.spec
    cores = list(plan.cores.values())
    names = core_names(cores)
    head = ["# --- the fused attention kernels (Triton), one set per core of the attention plan ---------------",
            "# Per core: <name>_forward(q, k, v, *score_tensors, **dims) -> (o, lse),",
            "# <name>_backward(q, k, v, o, lse, do, *score_tensors, dlse=None, **dims) -> (dq, dk, dv, *d_score_tensors),",
            "# <name>(q, k, v, *score_tensors, **dims) -> o (a torch.autograd.Function)."]
    kernels, texts = [], []
    for name, core in zip(names, cores):
        made = core_kernels(core, named, f"_{core.output}")
        kernels.append(made)
        head.append(f"# {name}: {core.text}; score tensors: {', '.join(core.read_tensors) or 'none'}")
        ops = "".join(f"{n}, " for n in core.read_tensors)
        reads = tuple((n, len(named.tensors[n].shape), n in made.learned) for n in core.read_tensors)
        texts.append(made.source + "\n\n\n" + _LAUNCHERS.format(
            prefix=made.prefix, name=name, lead=len(core.lead), reads=reads, dims=made.dims,
            binds=_binds(core, named), defaults={d: int(named.sizes[d]) for d in made.dims if d in named.sizes},
            ops=ops, ops_tuple=ops, output=core.output, formula=made.formula,
            d_ops="".join(f", d{n}" for n in core.read_tensors), cls=f"{made.prefix[1:].capitalize()}AttentionFunction",
            learned_text="".join(f", {n}" for n in made.learned), ops_call="".join(f", {n}" for n in core.read_tensors)))
    drawn = any(c.drawn for c in cores)
    prelude = "\n".join(head) + "\n\n" + PRELUDE + "\n\n" + (PHILOX + "\n\n" if drawn else "") + RUNTIME + "\n\n" \
        + "\n\n\n".join(texts)
    program = plan.program(TORCH.reserved | set(HOST.HELPERS) | _kernel_names(named, cores, names))
    printer = TritonPrinter(program, dict(zip(plan.cores, names)))
    try:
        text = module_source(named, program, printer, HOST, prelude=prelude.split("\n") + ["", ""],
                             title="in PyTorch with fused Triton kernels", target="triton")
    except CodegenError as why:
        raise CodegenError(f"the Triton target cannot print the fused core the attention plan chose: {why}") from why
    return TritonCode(text, tuple(cores), tuple(names), tuple(kernels))


def _kernel_names(spec: t.TypedSpec, cores, names) -> set[str]:
    """The names the kernels' part of the module defines at its top level (no spec name may take them)."""
    out = {"triton", "tl", "os", "INTERPRET", "libdevice", "_tanh", "_pow", "_mma", "_floordiv", "_mod", "CONFIGS",
           "SHARED_BUDGET", "_dropout_keep_block",
           "ACCUMULATORS", "_fits", "_config", "_tuned", "_fixed", "_fake", "_pow2", "_Core"}
    for name, core in zip(names, cores):
        prefix = f"_{core.output}"
        out |= {name, f"{name}_forward", f"{name}_backward", f"{prefix}_core",
                f"{prefix[1:].capitalize()}AttentionFunction"}
        out |= {f"{prefix}_{k}" for k in ("fwd", "delta", "dkdv", "dq", "score", "score_grad", "weights", "live")}
        out |= {f"{prefix}_score_d{k}" for k in range(len(core.reads))}
    return out


def triton_module(spec: t.TypedSpec):
    """The spec's full Triton module, loaded (`spec.torch(backend="triton")` calls its `forward`)."""
    return load_source(emit_triton(spec).text)


def load_source(text: str, name: str = "symattn_triton") -> types.ModuleType:
    """Generated Triton source as a module: written to a file named by its hash in the temporary directory
    (triton.jit reads its functions' source through inspect), then imported."""
    directory = Path(tempfile.gettempdir()) / "symattn-triton"
    directory.mkdir(exist_ok=True)
    path = directory / f"{name}_{hashlib.sha256(text.encode()).hexdigest()[:16]}.py"
    if not path.exists():
        partial = path.with_suffix(f".{os.getpid()}.tmp")
        partial.write_text(text, encoding="utf-8")
        partial.replace(path)
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
