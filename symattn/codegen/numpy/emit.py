"""Generate a standalone NumPy module from a spec: `symattn emit numpy SPEC -o FILE.py`.

Contract: `numpy_source(spec)` returns the text of a Python module that imports
only NumPy and follows DESIGN.md's "Generated NumPy module" contract:
`forward(**tensors) -> {output: array}`, `backward(**tensors, grad_O=...) ->
{input or param: gradient}` (a buffer is an argument of both, with no
gradient), plus `forward_backward(...) -> (outputs, gradients)` from one
forward pass. Sizes are read from the arrays (a dim that
no input's shape has keeps the spec's default); extra leading batch axes
broadcast; a shape that disagrees with the spec is a `ValueError` naming the
tensor, the expected and the given shape; float32 stays float32 and float64
stays float64; softmax is the stable one and a fully masked row gives zeros,
never NaN. The module's header names the spec and the symattn version and
embeds nothing the user wrote but validated names. `load_module(source)` runs
such text as a module object.

This module is the template: signatures, shape checks, the forward section,
the backward section, the returned dictionaries. The statements come from
`symattn.codegen.program`, their code from `symattn.codegen.numpy.printer`, and the small
runtime helpers they call from `symattn.codegen.numpy.runtime`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ...errors import CodegenError
from ...ir import typed as t
from ..arrays.module import (bind_dims, cast_line, comment_lines, header_lines, helper_sources, load_module, one_batch_check,
                             size_keywords, upstream_lines)

# The printer, the program builder and the runtime helpers (which import NumPy) are imported where they
# are used: the command line imports this module to dispatch `symattn emit`, and every other command
# should not pay for them.
if TYPE_CHECKING:
    from .printer import NumPyPrinter
    from ..program import OnePass, Program

__all__ = ["numpy_source", "load_module"]


# --- the module -------------------------------------------------------------------------------


def _module_name(spec: t.TypedSpec) -> str:
    return spec.name if spec.name.isidentifier() else "attention"


# The tiled path's defaults (module constants of a generated module that has one; a caller may change them)
TILED_ABOVE = 1 << 22  # score entries (batch x heads x queries x keys) of a core above which it is tiled
BLOCK_Q = 256          # query rows per block
BLOCK_K = 512          # keys per block


def numpy_source(spec: t.TypedSpec, derivation=None, tiled: bool = True) -> str:
    """The text of the generated NumPy module for `spec` (see the module docstring).

    With `tiled` (the default), a spec with a fused attention core (`symattn.codegen.fused`)
    gets a second pass, `_forward_backward_tiled`, that evaluates each core block by block
    (FlashAttention); `_forward_backward` calls it when a core's scores have more than
    `TILED_ABOVE` entries. Without it, or when a score has no block form, the module is the
    plain one.
    """
    from .printer import RESERVED, NumPyPrinter
    from ..program import build_program

    program = build_program(spec, derivation, reserved=RESERVED)
    for out, keyword in program.upstream.items():
        if keyword in spec.tensors:  # backward() takes grad(O) as the keyword grad_O
            raise CodegenError(f"tensor {keyword} has the name of the keyword that passes grad({out}) to "
                               f"backward(); rename it")
    printer = NumPyPrinter(program)
    leaves = program.arguments
    keywords = [program.upstream[o] for o in spec.outputs]
    sizes = size_keywords(spec)
    for name in sizes:
        if name in keywords:
            raise CodegenError(f"dim {name} has the name of the keyword that passes an upstream gradient; rename it")
    unsafe = [n for n in list(spec.arguments) + sizes if program.tensor_vars.get(n, program.dim_vars.get(n)) != n]
    signature = ", ".join(leaves + [f"{kw}=None" for kw in keywords]
                          + [f"{program.dim_vars[n]}={spec.sizes[n]}" for n in sizes])

    tiled_lines = _tiled_pass(spec, signature) if tiled else None
    dispatch = None
    if tiled_lines is not None:
        tiled_lines, tiled_printer, cores = tiled_lines
        printer.helpers |= tiled_printer.helpers
        call = ", ".join(leaves + keywords + [program.dim_vars[n] for n in sizes])
        entries = [" * ".join(["int(np.prod(batch))"] + [printer.dim(d).text for d in (*c.lead, c.n_q, c.n_k)])
                   for c in cores]
        size = entries[0] if len(entries) == 1 else f"max({', '.join(entries)})"
        dispatch = [f"if {size} > TILED_ABOVE:  # the attention scores are large: tiled, O(N * block) memory",
                    f"    return _forward_backward_tiled({call})"]
    body = _body(spec, program, printer, dispatch)

    lines = _header(spec, program, tiled_lines is not None)
    lines += ["", "import numpy as np", "", '__all__ = ["forward", "backward", "forward_backward"]', "", ""]
    if tiled_lines is not None:
        lines[-2:-2] = [f"TILED_ABOVE = {TILED_ABOVE:_}  # score entries (batch x heads x queries x keys) above "
                        "which attention is tiled",
                        f"BLOCK_Q = {BLOCK_Q}  # query rows per block of the tiled pass",
                        f"BLOCK_K = {BLOCK_K}  # keys per block of the tiled pass",
                        "THREADS = None  # threads of the tiled pass; None: OPENBLAS_NUM_THREADS, OMP_NUM_THREADS or "
                        "the CPU count", ""]
    lines += _public(spec, program, leaves, keywords, unsafe, printer, sizes)
    lines.append(f"def _forward_backward({signature}):")
    lines += [("    " + line) if line else "" for line in body]
    if tiled_lines is not None:
        lines += ["", ""] + tiled_lines
    from .runtime import RUNTIME

    lines += helper_sources(printer.helpers, RUNTIME)
    return "\n".join(lines).rstrip() + "\n"


def _tiled_pass(spec: t.TypedSpec, signature: str):
    """(lines, printer, cores) of `_forward_backward_tiled`, or None when the attention plan fuses no core."""
    from .printer import RESERVED, NumPyPrinter
    from ..plan import attention_plan
    from ..program import one_pass

    plan = attention_plan(spec)
    if not plan.cores:
        return None
    program = plan.program(RESERVED)
    paired = one_pass(program)  # before anything is printed: its copy of the names is the program's own
    printer = NumPyPrinter(program)
    try:
        body = _body(plan.spec, program, printer, None, paired)
    except CodegenError as why:
        raise CodegenError(f"the NumPy target cannot print the fused core the attention plan chose: {why}") from why
    lines = [f"def _forward_backward_tiled({signature}):",
             '    """_forward_backward with every attention core tiled (FlashAttention: blocks of BLOCK_Q queries x',
             '    BLOCK_K keys through BLAS, online softmax; the weights recomputed in the backward pass, or, for',
             "    a core whose output's gradient is known before the core runs, forward and backward in one pass",
             '    over each block of queries)."""']
    lines += [("    " + line) if line else "" for line in body]
    return lines, printer, list(plan.cores.values())


def _body(spec: t.TypedSpec, program: Program, printer: NumPyPrinter, dispatch: list[str] | None,
          paired: OnePass | None = None) -> list[str]:
    """The statements of one pass: bind the sizes, the forward pass, the backward pass, the results. With
    `paired` (`symattn.codegen.program.one_pass`), the forward pass alone is the branch for no upstream
    gradient, and with one, `paired`'s order is printed: forward and backward together."""
    keywords = [program.upstream[o] for o in spec.outputs]
    body: list[str] = []
    body.append(cast_line(spec, program))
    printer.helpers.update({"_as_float", "_bind", "_batch_axes", "_upstream"})
    body += bind_dims(spec, program, printer, batch="batch" if dispatch else None)
    body += dispatch or []
    body.append("")
    forward = ["# forward pass"] + _statements(program, printer, enumerate(program.forward))
    outputs = ", ".join(f'"{o}": {program.tensor_vars[o]}' for o in spec.outputs)
    loss = " + ".join(f"sum({o} * grad({o}))" for o in spec.outputs) + "; dT is grad(T) = dL/dT"
    if paired is not None:
        body.append(f"if {keywords[0]} is None:")
        body += [("    " + line) if line else "" for line in forward + [f"return {{{outputs}}}, None"]]
        cores = ", ".join(sorted(paired.cores))
        body += ["", f"# forward and backward pass ({cores}: both at once, one pass over the scores): L = {loss}"]
        body += upstream_lines(spec, program, printer)
        together = type(printer)(paired.program)
        together.one_pass = paired.cores
        body += _statements(paired.program, together, enumerate(paired.program.stmts))
        printer.helpers |= together.helpers
        body.append(f"outputs = {{{outputs}}}")
        return body + _gradients(spec, program, printer)
    body += forward
    body.append(f"outputs = {{{outputs}}}")
    body.append(f"if {keywords[0]} is None:")
    body.append("    return outputs, None")
    body.append("")
    body.append(f"# backward pass: L = {loss}")
    body += upstream_lines(spec, program, printer)
    body += _statements(program, printer, enumerate(program.backward, start=program.forward_count))
    return body + _gradients(spec, program, printer)


def _statements(program: Program, printer: NumPyPrinter, numbered) -> list[str]:
    """The code of the (index, statement) pairs `numbered`, each with its comment, and a `del` for each
    [N, N] buffer nothing reads after it."""
    named = set(program.tensor_vars.values()) | set(program.grad_vars.values())
    lines = []
    for k, stmt in numbered:
        code = printer.statement(k, stmt)
        lines += comment_lines(stmt, code, printer.consumed if printer.consumed in named else None)
        dead = printer.released(k)
        lines += [f"del {', '.join(dead)}"] if dead else []
    return lines


def _gradients(spec: t.TypedSpec, program: Program, printer: NumPyPrinter) -> list[str]:
    """The dictionary of gradients, returned with the outputs (after `one_batch_check`)."""
    check = one_batch_check(spec, program, printer)
    grads = []
    for leaf in spec.differentiable:
        var = program.leaf_grads[leaf]
        leaf_var = program.tensor_vars[leaf]
        if var is None:
            grads.append(f'"{leaf}": np.zeros_like({leaf_var})')
        else:
            printer.helpers.add("_sum_to")
            grads.append(f'"{leaf}": _sum_to({var}, {leaf_var}.shape)')
    return check + ["gradients = {"] + [f"    {g}," for g in grads] + ["}", "return outputs, gradients"]


def _header(spec: t.TypedSpec, program: Program, tiled: bool = False) -> list[str]:
    name = _module_name(spec)
    lines = header_lines(spec, program, f"The attention spec `{name}`: forward and backward pass", "numpy")
    lines += [
        "",
        "Sizes are read from the arrays. float32 arrays give float32 results, float64",
        "arrays float64 (mixed ones promote as NumPy does; float16 is computed in float32,",
        "integers in float64). backward() returns dL/dT for L = "
        + " + ".join(f"sum({o} * grad_{o})" for o in spec.outputs) + ".",
    ]
    if tiled:
        lines += [
            "",
            "Attention whose scores have more than TILED_ABOVE entries (batch x heads x queries",
            "x keys) is computed tiled, as FlashAttention does: blocks of BLOCK_Q queries x BLOCK_K",
            "keys through BLAS, an online softmax, the weights recomputed from the saved row",
            "log-sum-exp in the backward pass, fully masked blocks skipped; memory O(N * block)",
            "instead of O(N^2). Given the upstream gradients, a core whose output's gradient",
            "does not depend on that output runs forward and backward in one pass instead: each",
            "block of BLOCK_Q queries against all the keys it sees, its weights computed once.",
            "Smaller attention is computed plainly. The blocks of a pass",
            "run on THREADS threads at once (None: OPENBLAS_NUM_THREADS, OMP_NUM_THREADS or",
            "the CPU count) where threadpoolctl is installed to hold BLAS to one thread",
            "meanwhile, one after another otherwise; the results do not depend on it beyond",
            "the order of sums. The four are module constants: set them to choose.",
        ]
    lines.append('"""')
    return lines


def _public(spec: t.TypedSpec, program: Program, leaves, keywords, unsafe, printer, sizes) -> list[str]:
    lines = []
    outs = ", ".join(spec.outputs)
    dims = [program.dim_vars[n] for n in sizes]
    if unsafe:  # a spec name that Python cannot take as a parameter: take keywords as a dict
        printer.helpers.add("_take")
        given = list(spec.arguments) + ([program.seed] if program.seed else [])
        names = ", ".join(f'"{n}"' for n in given)
        both = ", ".join(f'"{n}"' for n in given + keywords)
        pops = [f'    {program.dim_vars[n]} = tensors.pop("{n}", {spec.sizes[n]})' for n in sizes]
        sig_f, sig_b = "**tensors", "**tensors"
        pre_f = pops + [f"    {', '.join(leaves)}, = _take(tensors, ({names},))"]
        pre_b = pops + [f"    {', '.join(leaves + keywords)}, = _take(tensors, ({both},))"]
    else:
        defaults = [f"{program.dim_vars[n]}={spec.sizes[n]}" for n in sizes]
        sig_f = "*, " + ", ".join(leaves + defaults)
        sig_b = "*, " + ", ".join(leaves + keywords + defaults)
        pre_f, pre_b = [], []
    args = ", ".join(leaves)
    grads = ", ".join(keywords)
    if dims:
        passed = ", " + ", ".join(f"{d}={d}" for d in dims)
        args_f, grads = args + passed, grads + passed
    else:
        args_f = args
    lines += [f"def forward({sig_f}):", f'    """The outputs {outs}, by name."""', *pre_f,
              f"    return _forward_backward({args_f})[0]", "", ""]
    lines += [f"def backward({sig_b}):",
              '    """dL/dT for every input and param T, by name."""', *pre_b,
              f"    return _forward_backward({args}, {grads})[1]", "", ""]
    lines += [f"def forward_backward({sig_b}):",
              '    """(outputs, gradients) from one forward pass."""', *pre_b,
              f"    return _forward_backward({args}, {grads})", "", ""]
    return lines
