"""The module every torch-host target writes: the torch module template around a program's statements.

Contract: `module_source(spec, program, printer, runtime)` returns the text of
a Python module that imports only torch and `math` (and whatever `prelude`
brings: the Triton target's kernels) and has the NumPy module's calling
convention (`symattn.codegen.numpy.emit`): `forward(**tensors) -> {output:
tensor}`, `backward(**tensors, grad_O=...) -> {input or param: gradient}` (a
buffer is an argument of both, with no gradient) and `forward_backward`,
with the same shape checks (`ValueError` naming the tensor), batch axes and
sizes. Tensors keep their dtype (float16, bfloat16, float32, float64) and
device. The statements are `program`'s, printed by `printer` (an
`ArrayPrinter` in torch's spelling whose fused statements are its target's),
the helpers `runtime`'s.

`forward` is differentiable: it calls `op`, a `torch.library.custom_op`
(opaque to `torch.compile`; its fake implementation is the same code run on
fake tensors) whose autograd formula (`register_autograd`) is the derived
matrix-level backward, never autograd of the forward; `Function` is the same
pair as a `torch.autograd.Function`. The forward saves what the backward
reads: the tensors of the forward pass that the backward section of the
program reads, except that a softmax whose scores are computed from smaller
tensors saves its row log-sum-exp instead of its weights, and the backward
recomputes scores and weights from it (FlashAttention's convention;
`SoftmaxRecompute`), and a fused core saves its row log-sum-exp.
`load_torch_module(source)` loads such text as a module registered in
`sys.modules`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import sys
import types
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ...errors import CodegenError
from ...ir import typed as t
from ..program_ir import DropoutMask, FusedAttention, SoftmaxGrad, Var, walk_labelled
from .module import (bind_dims, cast_line, comment_lines, header_lines, helper_sources, load_module, one_batch_check,
                     size_keywords, upstream_lines)

if TYPE_CHECKING:
    from ..program import Program
    from .printer import ArrayPrinter

__all__ = ["module_source", "load_torch_module", "SoftmaxRecompute", "recompute_plan"]

@dataclass(frozen=True)
class SoftmaxRecompute:
    """A softmax `weights = softmax(scores)` whose row log-sum-exp `lse` is saved instead of `weights`:
    the backward recomputes `statements` (the scores and the score-shaped tensors they read) and then
    the weights as exp(scores - lse)."""

    index: int  # of the softmax statement
    weights: str
    scores: str
    lse: str
    statements: tuple[int, ...]  # forward statements to recompute, in order


def _backward_reads(program: Program) -> set[str]:
    return {var for stmt in program.backward for var in stmt.reads}


def recompute_plan(program: Program) -> list[SoftmaxRecompute]:
    """The softmaxes whose weights the backward recomputes from their row log-sum-exp."""
    forward = {stmt.var: k for k, stmt in enumerate(program.forward)}
    needed = _backward_reads(program)
    plans = []
    for k, stmt in enumerate(program.forward):
        node = stmt.node
        if not isinstance(node, t.Softmax) or not isinstance(node.x, Var) or stmt.var not in needed:
            continue
        scores = node.x.name
        if scores not in forward or scores in needed or program.info[scores].last_use != k:
            continue
        big = tuple(stmt.shape[-2:])
        chosen: set[int] = set()
        stack = [forward[scores]]
        ok = True
        while stack and ok:
            j = stack.pop()
            if j in chosen:
                continue
            chosen.add(j)
            inner = program.stmts[j]
            if any(isinstance(n, (t.Softmax, SoftmaxGrad)) for n in walk_labelled(inner.node)):
                ok = False
            for var in inner.reads:
                if var in forward and len(program.info[var].shape) >= 2 and \
                        tuple(program.info[var].shape[-2:]) == big:
                    stack.append(forward[var])
        if not ok:
            continue
        lse = program.names.numbered(f"{stmt.var}_lse" if stmt.var.isidentifier() else "lse")
        plans.append(SoftmaxRecompute(k, stmt.var, scores, lse, tuple(sorted(chosen))))
    return plans


@dataclass(frozen=True)
class _Layout:
    """The names the generated functions pass between them."""

    leaves: list[str]  # variables of the given tensors, in the spec's order (dropout masks aside)
    outputs: list[str]
    saved: list[str]  # forward values the backward reads (outputs and leaves aside)
    upstream: list[str]  # grad_O keywords
    sizes: list[str]  # size keywords (dims no input has alone on an axis), then the dropout seed, if any
    differentiable: list[str]  # variables of the inputs and params, in the spec's order
    masks: tuple[int, ...] = ()  # forward statements of dropout masks that the backward draws again


def _layout(program: Program, plans: list[SoftmaxRecompute]) -> _Layout:
    spec = program.spec
    leaves = [program.tensor_vars[n] for n in spec.arguments]
    outputs = [program.tensor_vars[o] for o in spec.outputs]
    forward = [s.var for s in program.forward]
    recomputed = {program.stmts[j].var for p in plans for j in p.statements} | {p.weights for p in plans}
    wanted = set(_backward_reads(program)) - recomputed
    for p in plans:
        wanted |= {v for j in p.statements for v in program.stmts[j].reads} - recomputed
        wanted.add(p.lse)
    masks = tuple(k for k, stmt in enumerate(program.forward) if isinstance(stmt.node, DropoutMask)
                  and stmt.var in wanted)
    for k in masks:  # drawn again from the seed, not saved; what they take their shape from is
        wanted.discard(program.stmts[k].var)
        wanted |= set(program.stmts[k].reads) - recomputed
    lses = {p.lse for p in plans}
    saved = [v for v in forward if v in wanted and v not in outputs and v not in leaves]
    saved += [p.lse for p in plans if p.lse in lses]
    # outputs are passed to the backward as themselves; duplicates (two outputs, one variable) once
    return _Layout(leaves, list(dict.fromkeys(outputs)), saved, [program.upstream[o] for o in spec.outputs],
                   [program.dim_vars[n] for n in size_keywords(spec)] + ([program.seed] if program.seed else []),
                   [program.tensor_vars[n] for n in spec.differentiable], masks)


def _op_name(spec: t.TypedSpec, source_hint: str) -> str:
    base = spec.name if spec.name.isidentifier() else "attention"
    return f"{base}_{hashlib.sha256(source_hint.encode()).hexdigest()[:8]}"


def module_source(spec: t.TypedSpec, program: Program, printer: ArrayPrinter, runtime, constants=(), prelude=(),
                  title: str = "in PyTorch", target: str = "torch") -> str:
    """The module's text (see the module docstring); `constants` are lines of module constants (the tiled pass's
    blocks), `prelude` lines before the module's functions (the Triton kernels), `title` what the first line of
    its docstring says it is."""
    for out, keyword in program.upstream.items():
        if keyword in spec.tensors:
            raise CodegenError(f"tensor {keyword} has the name of the keyword that passes grad({out}) to "
                               f"backward(); rename it")
    for name in size_keywords(spec):
        if name in program.upstream.values():
            raise CodegenError(f"dim {name} has the name of the keyword that passes an upstream gradient; rename it")
    plans = recompute_plan(program)
    layout = _layout(program, plans)
    cores = [stmt.node.core for stmt in program.forward if isinstance(stmt.node, FusedAttention)]
    lses = [printer.lse_name(core) for core in cores]
    layout = dataclasses.replace(layout, saved=layout.saved + [n for n in dict.fromkeys(lses)
                                                               if n not in layout.saved and n not in layout.outputs])
    printer.helpers.update({"_as_float", "_bind", "_batch_axes", "_upstream", "_own", "_tangents_in"})

    forward_body = _forward_body(program, printer, plans, layout)
    printer.defined.clear()  # the backward is a function of its own: it defines the score closures again
    backward_body = _backward_body(program, printer, plans, layout)
    lines = _header(spec, program, layout, title, target)
    lines += ["", "import math", "", "import torch", "", *prelude,
              '__all__ = ["forward", "backward", "forward_backward", "Function", "op", "op_backward"]', "",
              *(list(constants) + [""] if cores and constants else []),
              f"LEAVES = {_tuple(spec.arguments)}", f"DIFFERENTIABLE = {_tuple(spec.differentiable)}",
              f"OUTPUTS = {_tuple(spec.outputs)}", f"SIZES = {_tuple(size_keywords(spec))}", "",
              "# Set by spec.torch() (symattn.codegen.nn) from the backward and tangent passes written as specs: the",
              "# double backward and forward-mode AD. Left None (this file on its own), both raise instead of giving 0.",
              "DOUBLE_BACKWARD = None", "TANGENTS = None", "", ""]
    lines += _public(spec, program, layout, printer)
    lines += _autograd(spec, layout, _op_name(spec, "\n".join(forward_body + backward_body)))
    inner = ", ".join(layout.leaves + layout.sizes)
    lines.append(f"def _forward({inner}):")
    lines.append('    """(outputs, saved): the forward pass and what the backward pass reads."""')
    lines += [("    " + line) if line else "" for line in forward_body]
    lines += ["", ""]
    args = ", ".join(layout.leaves + layout.outputs + layout.saved + layout.upstream + layout.sizes)
    lines.append(f"def _backward({args}):")
    lines.append('    """dL/dT for every input and param (spec order), from the forward pass\'s saved values."""')
    lines += [("    " + line) if line else "" for line in backward_body]
    lines += helper_sources(printer.helpers, runtime)
    return "\n".join(lines).rstrip() + "\n"


def _tuple(names) -> str:
    items = [f'"{n}"' for n in names]
    return "(" + ", ".join(items) + ("," if len(items) == 1 else "") + ")"


def _prologue(program: Program, printer: ArrayPrinter, layout: _Layout) -> list[str]:
    leaves = layout.leaves
    body = [cast_line(program.spec, program), f"device = {leaves[0]}.device"]
    return body + bind_dims(program.spec, program, printer, checked_seed=True)  # the public functions checked it


def _forward_body(program: Program, printer: ArrayPrinter, plans, layout: _Layout) -> list[str]:
    body = _prologue(program, printer, layout)
    body += ["", "# forward pass"]
    by_index = {p.index: p for p in plans}
    defined = set(layout.leaves)
    for k, stmt in enumerate(program.forward):
        printer.consumed = None
        if k in by_index:
            lines = printer.softmax_with_lse(k, stmt, by_index[k].lse)
            body += [f"# {stmt.title}"] if stmt.title else []
            body += ["#   and its row log-sum-exp, which the backward pass recomputes the weights from"]
            body += lines
            defined |= {stmt.var, by_index[k].lse}
        else:
            body += comment_lines(stmt, printer.statement(k, stmt), _consumed(program, printer))
            defined.add(stmt.var)
        body += _release(printer, k, defined, keep=set(layout.saved) | set(layout.outputs))
    outs = ", ".join(layout.outputs)
    saved = ", ".join(layout.saved)
    body.append(f"return [{outs}], [{saved}]")
    return body


def _backward_body(program: Program, printer: ArrayPrinter, plans, layout: _Layout) -> list[str]:
    spec = program.spec
    body = _prologue(program, printer, layout)
    for var in layout.saved + layout.outputs:  # the forward's tensors are read, never overwritten
        printer.owned[var] = False
    defined = set(layout.leaves) | set(layout.outputs) | set(layout.saved)
    if plans:
        body += ["", "# the weights again, from the scores and the saved row log-sum-exp"]
    for plan in plans:
        for j in plan.statements:
            stmt = program.stmts[j]
            printer.consumed = None
            body += comment_lines(stmt, printer.statement(j, stmt), _consumed(program, printer))
            defined.add(stmt.var)
        body += printer.softmax_from_lse(program.stmts[plan.index], plan.lse)
        defined.add(plan.weights)
    if layout.masks:
        body += ["", "# the dropout masks again, from the seed (drawn, not saved)"]
    for k in layout.masks:
        stmt = program.stmts[k]
        body += comment_lines(stmt, printer.statement(k, stmt), None)
        defined.add(stmt.var)
    body += ["", "# backward pass: L = " + " + ".join(f"sum({o} * grad({o}))" for o in spec.outputs)
             + "; dT is grad(T) = dL/dT"]
    body += upstream_lines(spec, program, printer)
    defined.update(program.grad_vars[out] for out in spec.outputs)
    body += one_batch_check(spec, program, printer)
    for k, stmt in enumerate(program.backward, start=program.forward_count):
        printer.consumed = None
        body += comment_lines(stmt, printer.statement(k, stmt), _consumed(program, printer))
        defined.add(stmt.var)
        body += _release(printer, k, defined, keep=set())
    grads = []
    for leaf in spec.differentiable:
        var = program.leaf_grads[leaf]
        leaf_var = program.tensor_vars[leaf]
        if var is None:
            grads.append(f"torch.zeros_like({leaf_var})")
        else:
            printer.helpers.add("_sum_to")
            grads.append(f"_sum_to({var}, {leaf_var}.shape)")
    body.append("return [")
    body += [f"    {g}," for g in grads]
    body.append("]")
    return body


def _consumed(program: Program, printer: ArrayPrinter) -> str | None:
    named = set(program.tensor_vars.values()) | set(program.grad_vars.values())
    return printer.consumed if printer.consumed in named else None


def _release(printer: ArrayPrinter, k: int, defined: set[str], keep: set[str]) -> list[str]:
    """`del` the score-sized buffers nothing reads after statement k (of those this function defined)."""
    dead = [v for v in printer.released(k) if v in defined and v not in keep]
    return [f"del {', '.join(dead)}"] if dead else []


def _header(spec: t.TypedSpec, program: Program, layout: _Layout, title: str, target: str) -> list[str]:
    name = spec.name if spec.name.isidentifier() else "attention"
    saved = ", ".join(layout.saved) if layout.saved else "nothing but the inputs and outputs"
    lines = header_lines(spec, program, f"The attention spec `{name}` {title}: forward and derived backward", target,
                         "   (differentiable: torch autograd runs the derived backward)")
    lines += [
        "",
        "Tensors keep their device and floating dtype (mixed ones promote as torch does; integer",
        "tensors take the floating one). `op` is a torch.library custom op (torch.compile keeps",
        "it whole) whose autograd formula is the derived backward; `Function` is the same as a",
        f"torch.autograd.Function. The forward pass saves for the backward: {saved}.",
        '"""',
    ]
    return lines


def _public(spec: t.TypedSpec, program: Program, layout: _Layout, printer: ArrayPrinter) -> list[str]:
    leaves, keywords = layout.leaves, layout.upstream
    sizes = size_keywords(spec)
    seed = [program.seed] if program.seed else []
    unsafe = [n for n in list(spec.arguments) + sizes if program.tensor_vars.get(n, program.dim_vars.get(n)) != n]
    if unsafe:
        printer.helpers.add("_take")
        names = ", ".join(f'"{n}"' for n in list(spec.arguments) + seed)
        both = ", ".join(f'"{n}"' for n in list(spec.arguments) + seed + keywords)
        pops = [f'    {program.dim_vars[n]} = tensors.pop("{n}", {spec.sizes[n]})' for n in sizes]
        sig_f = sig_b = "**tensors"
        pre_f = pops + [f"    {', '.join(leaves + seed)}, = _take(tensors, ({names},))"]
        pre_b = pops + [f"    {', '.join(leaves + seed + keywords)}, = _take(tensors, ({both},))"]
    else:
        defaults = [f"{program.dim_vars[n]}={spec.sizes[n]}" for n in sizes]
        sig_f = "*, " + ", ".join(leaves + seed + defaults)
        sig_b = "*, " + ", ".join(leaves + seed + keywords + defaults)
        pre_f, pre_b = [], []
    if seed:  # an int64 for the custom op (a seed of 2**63 or more as its bit pattern)
        printer.helpers.add("_seed")
        pre_f = pre_f + [f"    {seed[0]} = _seed({seed[0]})"]
        pre_b = pre_b + [f"    {seed[0]} = _seed({seed[0]})"]
    args = ", ".join(leaves)
    dims = ", ".join(layout.sizes)
    tail = f", {dims}" if dims else ""
    n_out = len(layout.outputs)
    outs = ", ".join(spec.outputs)
    upstream = ", ".join(keywords)
    return [
        f"def forward({sig_f}):",
        f'    """The outputs {outs}, by name; differentiable through `op` (the derived backward)."""', *pre_f,
        f"    if _tangents_in(\"{spec.name}\", ({args}{',' if len(leaves) == 1 else ''}), TANGENTS is not None):",
        f"        return _outputs(_Tangents.apply(*_tensors({args}){tail})[:{n_out}])",
        f"    return _outputs(op(*_tensors({args}){tail})[:{n_out}])", "", "",
        f"def backward({sig_b}):",
        '    """dL/dT for every input and param T, by name (no autograd graph is built)."""', *pre_b,
        f"    return forward_backward_values({args}, {upstream}{tail})[1]", "", "",
        f"def forward_backward({sig_b}):",
        '    """(outputs, gradients) from one forward pass."""', *pre_b,
        f"    return forward_backward_values({args}, {upstream}{tail})", "", "",
        f"def forward_backward_values({', '.join(leaves + keywords + layout.sizes)}):",
        "    with torch.no_grad():",
        f"        outputs, saved = _forward({args}{tail})",
        f"        gradients = _backward({args}, *outputs, *saved, {upstream}{tail})",
        "    return _outputs(outputs), dict(zip(DIFFERENTIABLE, gradients))", "", "",
        "def _outputs(values):",
        f"    return dict(zip(OUTPUTS, [values[k] for k in {_output_positions(spec, program, layout)}]))", "", "",
        "def _tensors(*values):",
        '    """Arrays and numbers as tensors (the custom op takes tensors only)."""',
        "    return [v if isinstance(v, torch.Tensor) else torch.as_tensor(v) for v in values]", "", "",
    ]


def _output_positions(spec: t.TypedSpec, program: Program, layout: _Layout) -> str:
    return "(" + ", ".join(str(layout.outputs.index(program.tensor_vars[o])) for o in spec.outputs) + \
        ("," if len(spec.outputs) == 1 else "") + ")"


def _autograd(spec: t.TypedSpec, layout: _Layout, op_name: str) -> list[str]:
    leaves = layout.leaves
    n_leaves, n_out, n_saved = len(leaves), len(layout.outputs), len(layout.saved)
    params = ", ".join([f"{v}: torch.Tensor" for v in leaves] + [f"{v}: int" for v in layout.sizes])
    bparams = ", ".join([f"{v}: torch.Tensor" for v in leaves + layout.outputs + layout.saved + layout.upstream]
                        + [f"{v}: int" for v in layout.sizes])
    args = ", ".join(leaves + layout.sizes)
    bargs = ", ".join(leaves + layout.outputs + layout.saved + layout.upstream + layout.sizes)
    differentiable = [k for k, name in enumerate(spec.arguments) if name in spec.differentiable]
    sizes = ", ".join(layout.sizes)
    grads_tuple = ("(" + ", ".join(f"_cast(gradients[{differentiable.index(k)}], inputs[{k}])"
                                   if k in differentiable else "None" for k in range(n_leaves))
                   + ", None" * len(layout.sizes) + ("," if n_leaves + len(layout.sizes) == 1 else "") + ")")
    lines = [
        "def _cast(gradient, leaf):",
        "    return gradient if gradient.dtype == leaf.dtype else gradient.to(leaf.dtype)", "", "",
        "def _unique_op_name(name):",
        '    """`name`, or name_2, name_3, ...: one custom op per loaded module (a module loaded twice gets two)."""',
        '    namespace, base = name.split("::")',
        "    candidate, k = base, 1",
        "    while hasattr(getattr(torch.ops, namespace), candidate):",
        "        k += 1",
        '        candidate = f"{base}_{k}"',
        '    return f"{namespace}::{candidate}"', "", "",
        f"def _op({params}) -> list[torch.Tensor]:",
        f'    """The outputs ({n_out}), then the {n_saved} values the backward pass reads."""',
        f"    outputs, saved = _forward({args})",
        f"    return _own(outputs + saved, ({', '.join(leaves)},))", "", "",
        f"def _op_backward_impl({bparams}) -> list[torch.Tensor]:",
        '    """The gradient of every input and param, in the spec\'s order."""',
        f"    return _own(_backward({bargs}), ({', '.join(leaves + layout.outputs + layout.saved + layout.upstream)},))",
        "", "",
        "# Custom ops: torch.compile keeps them whole; the same torch code run on fake tensors gives the shapes.",
        f'op = torch.library.custom_op(_unique_op_name("symattn::{op_name}"), _op, mutates_args=())',
        "op.register_fake(_op)",
        f'op_backward = torch.library.custom_op(_unique_op_name("symattn::{op_name}_backward"), _op_backward_impl,',
        "                                      mutates_args=())",
        "op_backward.register_fake(_op_backward_impl)", "", "",
        "def _setup_context(ctx, inputs, output):",
        f"    ctx.save_for_backward(*inputs[:{n_leaves}], *output)",
        f"    ctx.sizes = inputs[{n_leaves}:]",
        "", "",
        "def _op_backward(ctx, grads):",
        "    saved = ctx.saved_tensors",
        f"    inputs, values = saved[:{n_leaves}], saved[{n_leaves}:]",
        f"    upstream = [g if g is not None else torch.zeros_like(v) for g, v in zip(grads[:{n_out}], values)]",
        "    gradients = op_backward(*inputs, *values, *upstream, *ctx.sizes)",
        f"    return {grads_tuple}",
        "", "",
        "op.register_autograd(_op_backward, setup_context=_setup_context)", "", "",
        "def _double_backward_context(ctx, inputs, output):",
        f"    ctx.save_for_backward(*inputs[:{n_leaves}], *inputs[{n_leaves + n_out + n_saved}:{n_leaves + 2 * n_out + n_saved}])",
        f"    ctx.sizes = inputs[{n_leaves + 2 * n_out + n_saved}:]", "", "",
        "def _double_backward(ctx, grads):",
        '    """The gradient of the derived backward: the backward pass of the backward pass, derived (DOUBLE_BACKWARD)."""',
        "    if DOUBLE_BACKWARD is None:",
        f'        raise NotImplementedError("{spec.name}: the double backward (create_graph=True) is derived by "',
        '                                  "spec.torch(), not by this file on its own; it is not zero, so this module "',
        '                                  "does not pretend it is")',
        "    saved = ctx.saved_tensors",
        f"    leaves, upstream = saved[:{n_leaves}], saved[{n_leaves}:]",
        "    d_leaves, d_upstream = DOUBLE_BACKWARD(leaves, upstream, grads, ctx.sizes)",
        f"    return (*d_leaves, *[None] * {n_out + n_saved}, *d_upstream, *[None] * len(ctx.sizes))", "", "",
        "op_backward.register_autograd(_double_backward, setup_context=_double_backward_context)", "", "",
        "class _Tangents(torch.autograd.Function):",
        '    """`op` with forward-mode AD: its jvp is the tangent pass written as a spec, derived (TANGENTS)."""',
        "",
        "    @staticmethod",
        "    def forward(*inputs):",
        "        return tuple(op(*inputs))",
        "",
        "    @staticmethod",
        "    def setup_context(ctx, inputs, output):",
        f"        ctx.primal, ctx.values = inputs[:{n_leaves}], output  # what jvp reads (forward mode saves no graph)",
        f"        ctx.save_for_backward(*inputs[:{n_leaves}], *output)",
        f"        ctx.sizes = inputs[{n_leaves}:]",
        "",
        "    @staticmethod",
        "    def jvp(ctx, *tangents):",
        f"        out = list(TANGENTS(ctx.primal, tangents[:{n_leaves}], ctx.sizes))  # of the outputs",
        "        return tuple(out + [torch.zeros_like(v) if v.is_floating_point() else None  # saved values: unused",
        "                            for v in ctx.values[len(out):]])",
        "",
        "    @staticmethod",
        "    def backward(ctx, *grads):",
        "        saved = ctx.saved_tensors",
        f"        inputs, values = saved[:{n_leaves}], saved[{n_leaves}:{n_leaves + n_out}]",
        f"        upstream = [g if g is not None else torch.zeros_like(v) for g, v in zip(grads[:{n_out}], values)]",
        f"        gradients = op_backward(*inputs, *saved[{n_leaves}:], *upstream, *ctx.sizes)",
        f"        return {grads_tuple}",
        "", "",
        "class Function(torch.autograd.Function):",
        '    """The same forward and derived backward as a torch.autograd.Function: Function.apply(' +
        ", ".join(leaves + layout.sizes) + ') -> outputs."""',
        "",
        "    @staticmethod",
        f"    def forward(ctx, {args}):",
        f"        outputs, saved = _forward({args})",
        f"        ctx.save_for_backward({', '.join(leaves)}, *outputs, *saved)",
        f"        ctx.sizes = ({sizes}{',' if len(layout.sizes) == 1 else ''})",
        f"        return {'outputs[0]' if n_out == 1 else 'tuple(outputs)'}",
        "",
        "    @staticmethod",
        "    def backward(ctx, *grads):",
        "        saved = ctx.saved_tensors",
        f"        inputs, values = saved[:{n_leaves}], saved[{n_leaves}:]",
        "        upstream = [g if g is not None else torch.zeros_like(v) for g, v in zip(grads, values)]",
        "        gradients = _backward(*inputs, *values, *upstream, *ctx.sizes)",
        f"        return {grads_tuple}",
        "", "",
    ]
    return lines


def load_torch_module(source: str, name: str = "symattn_generated_torch") -> types.ModuleType:
    """Generated torch source as a module, registered in `sys.modules` (torch.compile looks a traced
    function's module up by name); a name taken already gets a numbered suffix."""
    base, k = name, 1
    while name in sys.modules:
        k += 1
        name = f"{base}_{k}"
    module = load_module(source, name)
    sys.modules[name] = module
    return module
