"""The full Triton module of a spec: the non-fused parts as generated torch code around the fused cores.

Contract: `segments(named, cores)` cuts the spec (with its cores named, see
`find_cores`) at its attention cores into `Step`s, in the spec's order: a
`Segment` is the tensors computed between two cores, made a spec of its own
(`segment.spec`: what it reads from the given tensors, from earlier segments
or from core outputs are its inputs, params or buffers; what later steps or the
outputs read are its outputs), a `CoreStep` is one fused core. `module_text`
is the Python source appended to the kernels module (see `emit`): each
segment's generated torch module (`symattn.codegen.torch`) as embedded source,
loaded into a namespace of its own, and `forward(**tensors) -> {output}`,
`backward(**tensors, grad_O=...) -> {input or param: gradient}` and
`forward_backward` with the NumPy module's calling convention.

The backward is the derived one, chained by torch autograd: each segment runs
as its module's `Function` (backward: that segment's derived backward), each
core as the kernels' autograd function (backward: the fused backward kernels,
dQ, dK, dV and d of each learned score tensor). So the contributions through
a core are what the fused backward writes, and the paths around it (a
residual, a projection read twice) are the derived backward of the segments
-- the same split as the CUDA target's `lower`, made by cutting the spec
rather than by rewriting one program. Intermediates a segment hands on are
stored between the steps (they are the segment's outputs).
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import os
import tempfile
import types
from dataclasses import dataclass
from pathlib import Path

import sympy

from ...ir import typed as t
from ..cuda.core import AttentionCore

__all__ = ["Segment", "CoreStep", "segments", "module_text", "load_source"]


@dataclass(frozen=True)
class Segment:
    spec: t.TypedSpec
    given: tuple[str, ...]    # the segment's arguments, in its spec's order
    outputs: tuple[str, ...]  # what it hands on, in its spec's order


@dataclass(frozen=True)
class CoreStep:
    core: AttentionCore
    name: str                 # the public name of its functions in the kernels module


def _needed(named: t.TypedSpec, cores: dict[str, AttentionCore]) -> set[str]:
    need = set(named.outputs)
    for name in reversed(list(named.tensors)):
        info = named.tensors[name]
        if name not in need or info.expr is None:
            continue
        core = cores.get(name)
        need.update((core.q, core.k, core.v, *core.reads) if core else t.tensors_read(info.expr))
    return need


def segments(named: t.TypedSpec, cores, names) -> list[Segment | CoreStep]:
    by_output = {core.output: (core, name) for core, name in zip(cores, names)}
    need = _needed(named, {c.output: c for c in cores})
    groups: list[list[str] | CoreStep] = [[]]
    for name, info in named.tensors.items():
        if info.expr is None or name not in need:
            continue
        if name in by_output:
            groups.append(CoreStep(by_output[name][0], by_output[name][1]))
            groups.append([])
        else:
            groups[-1].append(name)
    steps: list[Segment | CoreStep] = []
    for k, group in enumerate(groups):
        if isinstance(group, CoreStep):
            steps.append(group)
        elif group:
            later = set(named.outputs)
            for rest in groups[k + 1:]:
                if isinstance(rest, CoreStep):
                    later.update((rest.core.q, rest.core.k, rest.core.v, *rest.core.reads))
                else:
                    later.update(r for n in rest for r in t.tensors_read(named.tensors[n].expr))
            steps.append(_segment(named, group, later))
    return steps


def _segment(named: t.TypedSpec, members: list[str], later: set[str]) -> Segment:
    reads = {r for n in members for r in t.tensors_read(named.tensors[n].expr)} - set(members)
    outputs = [n for n in members if n in later]
    tensors = {}
    for name, info in named.tensors.items():
        if name in reads:
            kind = info.kind if info.expr is None else "input"
            tensors[name] = dataclasses.replace(info, kind=kind, expr=None, is_output=False)
        elif name in members:
            tensors[name] = dataclasses.replace(info, kind="intermediate", is_output=name in outputs)
    spec = dataclasses.replace(named, name=f"{named.name}_part", tensors=tensors, outputs=tuple(outputs),
                               checks=())
    return Segment(spec, spec.given, tuple(outputs))


def _shapes(spec: t.TypedSpec) -> dict[str, tuple]:
    """tensor -> the dim name of each axis (None where the size is not one dim), for binding sizes."""
    return {name: tuple(d.name if isinstance(sympy.sympify(d), sympy.Symbol) else None
                        for d in spec.tensors[name].shape) for name in spec.given}


_RUNTIME = '''\


# --- the full module: generated torch code around the fused cores -------------------------------

import types as _types

SPEC_GIVEN = {given!r}
SPEC_DIFFERENTIABLE = {differentiable!r}
SPEC_OUTPUTS = {outputs!r}
SPEC_SHAPES = {shapes!r}     # tensor -> the dim of each axis (None: not one dim)
SPEC_SIZES = {sizes!r}
UPSTREAM = {upstream!r}      # output -> the keyword of its upstream gradient


def _load_segment(source, name):
    """A segment's generated torch module, in a namespace of its own."""
    module = _types.ModuleType(name)
    exec(compile(source, f"<symattn segment {{name}}>", "exec"), module.__dict__)
    return module


def _bind(tensors, sizes):
    dims = dict(SPEC_SIZES)
    for name, axes in SPEC_SHAPES.items():
        value = tensors[name]
        shape = tuple(value.shape) if hasattr(value, "shape") else ()
        for axis, dim in enumerate(axes):
            if dim is not None and len(shape) >= len(axes):
                dims[dim] = int(shape[len(shape) - len(axes) + axis])
    dims.update(sizes)
    return dims


def _run_segment(module, given, outputs, sizes, env, dims):
    values = module.Function.apply(*(env[n] for n in given), *(dims[n] for n in sizes))
    values = values if isinstance(values, tuple) else (values,)
    env.update(zip(outputs, values))


def _take(tensors):
    missing = [n for n in SPEC_GIVEN if n not in tensors]
    if missing:
        raise TypeError(f"missing tensors {{missing}}")
    env = {{}}
    for name in SPEC_GIVEN:
        value = tensors.pop(name)
        env[name] = value if isinstance(value, torch.Tensor) else torch.as_tensor(value)
    return env


def forward(**tensors):
    """The outputs by name; differentiable (autograd chains the segments' derived backward and the
    fused backward kernels)."""
    env = _take(tensors)
    dims = _bind(env, {{n: tensors.pop(n) for n in list(tensors) if n in SPEC_SIZES}})
    if tensors:
        raise TypeError(f"unexpected keywords {{sorted(tensors)}}")
    _steps(env, dims)
    return {{name: env[name] for name in SPEC_OUTPUTS}}


def forward_backward(**tensors):
    """(outputs, gradients): the gradient of every input and param, given grad_<output> keywords."""
    upstream = {{out: tensors.pop(key) for out, key in UPSTREAM.items()}}
    env = _take(tensors)
    dims = _bind(env, {{n: tensors.pop(n) for n in list(tensors) if n in SPEC_SIZES}})
    if tensors:
        raise TypeError(f"unexpected keywords {{sorted(tensors)}}")
    dtype = torch.promote_types(torch.float32, env[SPEC_GIVEN[0]].dtype) \\
        if not env[SPEC_GIVEN[0]].is_floating_point() else env[SPEC_GIVEN[0]].dtype
    leaves = {{}}
    for name in SPEC_DIFFERENTIABLE:
        value = env[name]
        value = (value if value.is_floating_point() else value.to(dtype)).detach().requires_grad_()
        env[name] = leaves[name] = value
    with torch.enable_grad():
        _steps(env, dims)
        outs = [env[o] for o in SPEC_OUTPUTS]
        grads = [torch.as_tensor(upstream[o], dtype=env[o].dtype, device=env[o].device) for o in SPEC_OUTPUTS]
        got = torch.autograd.grad(outs, list(leaves.values()), grads, allow_unused=True)
    gradients = {{name: (torch.zeros_like(leaves[name]) if g is None else g) for name, g in zip(leaves, got)}}
    return {{o: env[o].detach() for o in SPEC_OUTPUTS}}, gradients


def backward(**tensors):
    """dL/dT for every input and param T, by name."""
    return forward_backward(**tensors)[1]
'''


def module_text(spec: t.TypedSpec, named: t.TypedSpec, steps: list[Segment | CoreStep]) -> str:
    from ..torch.emit import torch_source
    from ..arrays.module import size_keywords

    upstream = {o: f"grad_{o}" for o in spec.outputs}
    text = _RUNTIME.format(given=tuple(spec.given), differentiable=tuple(spec.differentiable),
                           outputs=tuple(spec.outputs), shapes=_shapes(spec), sizes=dict(spec.sizes),
                           upstream=upstream)
    body = []
    for k, step in enumerate(steps):
        if isinstance(step, CoreStep):
            core = step.core
            reads = "".join(f", env[{n!r}]" for n in core.reads)
            body.append(f"    env[{core.output!r}] = {step.name}(env[{core.q!r}], env[{core.k!r}], "
                        f"env[{core.v!r}]{reads}, **dims)")
            continue
        source = torch_source(step.spec)
        sizes = tuple(size_keywords(step.spec))
        text += f"\n\n_SEGMENT_{k} = _load_segment({source!r}, {f'{spec.name}_segment_{k}'!r})\n"
        text += f"_SEGMENT_{k}_ARGS = ({step.given!r}, {step.outputs!r}, {sizes!r})\n"
        outs = ", ".join(step.outputs)
        body.append(f"    # {outs} = the segment's torch code (backward: its derived backward)")
        body.append(f"    _run_segment(_SEGMENT_{k}, *_SEGMENT_{k}_ARGS, env, dims)")
    text += "\n\ndef _steps(env, dims):\n    \"\"\"Every step in order: torch segments and fused cores.\"\"\"\n"
    text += "\n".join(body or ["    pass"]) + "\n"
    return text


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

