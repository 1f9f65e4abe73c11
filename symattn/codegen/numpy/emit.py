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

import types
from typing import TYPE_CHECKING

import sympy

from ...version import __version__
from ...ir import typed as t
from ...ir.shapes import format_dim, format_shape

# The printer, the program builder and the runtime helpers (which import NumPy) are imported where they
# are used: the command line imports this module to dispatch `symattn emit`, and every other command
# should not pay for them.
if TYPE_CHECKING:
    from .printer import NumPyPrinter
    from ..program import OnePass, Program, Stmt

__all__ = ["numpy_source", "load_module", "size_keywords", "bind_dims", "comment_lines", "upstream_lines",
           "one_batch_check"]


def size_keywords(spec: t.TypedSpec) -> list[str]:
    """Dims that no given tensor's shape has alone on an axis: the module takes them as keywords.

    (`split_heads(X, h)` with no tensor of shape [h, ...]: `forward(X=..., h=4)`, default the spec's size.)
    """
    alone = {d for name in spec.given for d in spec.tensors[name].shape if getattr(d, "is_Symbol", False)}
    return [name for name, info in spec.dims.items() if info.symbol not in alone]


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
    from ..program import CodegenError, build_program

    program = build_program(spec, derivation, reserved=RESERVED)
    for out, keyword in program.upstream.items():
        if keyword in spec.tensors:  # backward() takes grad(O) as the keyword grad_O
            raise CodegenError(f"tensor {keyword} has the name of the keyword that passes grad({out}) to "
                               f"backward(); rename it")
    printer = NumPyPrinter(program)
    leaves = [program.tensor_vars[n] for n in spec.given]
    keywords = [program.upstream[o] for o in spec.outputs]
    sizes = size_keywords(spec)
    for name in sizes:
        if name in keywords:
            raise CodegenError(f"dim {name} has the name of the keyword that passes an upstream gradient; rename it")
    unsafe = [n for n in list(spec.given) + sizes if program.tensor_vars.get(n, program.dim_vars.get(n)) != n]
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
    lines += _helper_sources(printer.helpers)
    return "\n".join(lines).rstrip() + "\n"


def _tiled_pass(spec: t.TypedSpec, signature: str):
    """(lines, printer, cores) of `_forward_backward_tiled`, or None when the spec has no core to tile."""
    from .printer import RESERVED, NumPyPrinter
    from ..fused import fused_plan
    from ..program import CodegenError, build_program, one_pass

    plan = fused_plan(spec)
    if plan is None:
        return None
    program = build_program(plan.spec, plan.derivation, reserved=RESERVED, fused=plan)
    paired = one_pass(program)  # before anything is printed: its copy of the names is the program's own
    printer = NumPyPrinter(program)
    try:
        body = _body(plan.spec, program, printer, None, paired)
    except CodegenError:  # a score with no block form: the plain pass only
        return None
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
    leaves = [program.tensor_vars[n] for n in spec.given]
    keywords = [program.upstream[o] for o in spec.outputs]
    body: list[str] = []
    body.append(f"dtype, ({', '.join(leaves)}{',' if len(leaves) == 1 else ''}) = _as_float({', '.join(leaves)})")
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


def upstream_lines(spec: t.TypedSpec, program: Program, printer: NumPyPrinter) -> list[str]:
    """Each output's upstream gradient, checked and in the forward pass's dtype."""
    order = list(spec.dims)
    lines = []
    for out in spec.outputs:
        shape = spec.tensors[out].shape
        lines.append(f"{program.grad_vars[out]} = _upstream(\"{program.upstream[out]}\", {program.upstream[out]}, "
                     f"\"{format_shape(shape, order)}\", {printer.shape_tuple(shape)}, dtype)")
    return lines


def one_batch_check(spec: t.TypedSpec, program: Program, printer) -> list[str]:
    """With several outputs, the check that they and their upstream gradients share their batch axes
    (`_one_batch`); nothing for one output, whose paths all carry its gradient's batch axes."""
    if len(spec.outputs) < 2:
        return []
    printer.helpers.add("_one_batch")
    ranks = {o: len(spec.tensors[o].shape) for o in spec.outputs}
    pairs = [f'("{o}", {program.tensor_vars[o]}, {ranks[o]}), ("grad_{o}", {program.grad_vars[o]}, {ranks[o]})'
             for o in spec.outputs]
    return [f"_one_batch([{', '.join(pairs)}])"]


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


def comment_lines(stmt: Stmt, lines: list[str], consumed: str | None) -> list[str]:
    """The formula a statement computes, where its code does not read as that formula already."""
    from ..index import IndexArray

    plain = len(lines) == 1 and not stmt.rewritten and stmt.labels is None and not isinstance(stmt.node, IndexArray)
    out = []
    if stmt.title and not plain:
        out.append(f"# {stmt.title}")
    if stmt.note:
        out.append(f"#   using {stmt.note}")
    if consumed is not None and len(lines) == 1:
        out.append(f"# (in {consumed}'s buffer: {consumed} is not read again)")
    return out + lines


def bind_dims(spec: t.TypedSpec, program: Program, printer: NumPyPrinter, batch: str | None = None) -> list[str]:
    """Read each dim's size from the first array that has it alone on an axis; check every array against them
    (and keep the broadcast batch axes as `batch`, when named)."""
    order = list(spec.dims)
    bound: set[sympy.Symbol] = set()
    lines: list[str] = []
    later: list[str] = []  # arrays with an axis that could not be checked when they were read

    def call(leaf: str, expected: list[str]) -> str:
        shape = format_shape(spec.tensors[leaf].shape, order)
        tail = "," if len(expected) == 1 else ""
        return f'_bind("{leaf}", {program.tensor_vars[leaf]}, "{shape}", ({", ".join(expected)}{tail}))'

    for leaf in spec.given:
        targets, expected, new = [], [], set()
        for d in map(sympy.sympify, spec.tensors[leaf].shape):
            if d.is_Symbol and d not in bound:
                targets.append(printer.dims[d])
                expected.append("None")
                bound.add(d)
                new.add(d)
            elif d.free_symbols <= bound and not d.free_symbols & new:
                targets.append("_")
                expected.append(printer.dim(d).text)
            else:
                targets.append("_")
                expected.append("None")
                if leaf not in later:
                    later.append(leaf)
        if any(name != "_" for name in targets):
            lines.append(f"{', '.join(targets)}{',' if len(targets) == 1 else ''} = {call(leaf, expected)}")
        else:
            lines.append(call(leaf, expected))
    for name in size_keywords(spec):
        var = program.dim_vars[name]
        lines.append(f'{var} = _size("{name}", {var})  # no array has an axis of size {name} alone: a keyword')
        printer.helpers.add("_size")
        bound.add(spec.dims[name].symbol)
    lines += _exact_dims(spec, printer)
    for leaf in later:
        lines.append(call(leaf, [printer.dim(d).text for d in spec.tensors[leaf].shape]))
    ranks = ", ".join(f'("{leaf}", {program.tensor_vars[leaf]}, {len(spec.tensors[leaf].shape)})'
                      for leaf in spec.given)
    lines.append(f"{batch + ' = ' if batch else ''}_batch_axes({ranks})")
    return lines


def _exact_dims(spec: t.TypedSpec, printer: NumPyPrinter) -> list[str]:
    """A check for each quotient of sizes the spec relies on (`d / h`, `(N + 1) / 2`): it must divide.

    Everywhere else such a dim is printed with `//`; this makes a size at which it
    does not divide a ValueError, as the reference evaluator refuses it too.
    """
    from ...ir.sizes import constraints

    # split_heads checks its own width ("not a multiple of 3 heads"), unless an input's shape has it too
    in_leaves = {d for name in spec.given for d in spec.tensors[name].shape}
    seen = {n.shape[-1] for info in spec.tensors.values() if info.expr is not None for n in t.walk(info.expr)
            if isinstance(n, t.SplitHeads)} - in_leaves
    lines = []
    for constraint in constraints(spec):
        num, den = sympy.fraction(sympy.together(constraint.dim))
        if den == 1 or constraint.dim in seen:
            continue
        seen.add(constraint.dim)
        printer.helpers.add("_exact")
        shown = format_dim(constraint.dim, list(spec.dims))
        lines.append(f'_exact("{shown}", {printer.dim(num).text}, {printer.dim(den).text})')
    return lines


def _header(spec: t.TypedSpec, program: Program, tiled: bool = False) -> list[str]:
    order = list(spec.dims)
    name = _module_name(spec)
    rows = []
    for tensor in list(spec.given) + list(spec.outputs):
        info = spec.tensors[tensor]
        rows.append((info.kind if tensor not in spec.outputs else "output", tensor, format_shape(info.shape, order)))
    width = max(len(r[1]) for r in rows)
    leaves = ", ".join(spec.given)
    grads = ", ".join(program.upstream[o] for o in spec.outputs)
    outs = ", ".join(f'"{o}": ...' for o in spec.outputs)
    lines = [
        f'"""The attention spec `{name}`: forward and backward pass, generated by symattn {__version__}.',
        "",
        "Do not edit: regenerate with `symattn emit numpy SPEC -o FILE.py`.",
        "",
        f"    forward({leaves}) -> {{{outs}}}",
        f"    backward({leaves}, {grads}) -> the gradient of every input and param",
        f"    forward_backward({leaves}, {grads}) -> (outputs, gradients)",
        "",
        "All arguments are keywords. Shapes (extra leading batch axes broadcast):",
        "",
    ]
    lines += [f"    {kind:<6} {tensor:<{width}}  {shape}" for kind, tensor, shape in rows]
    sizes = size_keywords(spec)
    if sizes:
        lines += ["", "Sizes that no input's shape gives are keywords too: "
                  + ", ".join(f"{n}={spec.sizes[n]}" for n in sizes) + " by default."]
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
        names = ", ".join(f'"{n}"' for n in spec.given)
        both = ", ".join(f'"{n}"' for n in list(spec.given) + keywords)
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


def _helper_sources(used: set[str]) -> list[str]:
    from .runtime import CALLS, HELPERS, helper_source

    needed: set[str] = set()
    stack = sorted(used)
    while stack:
        name = stack.pop()
        if name not in needed:
            needed.add(name)
            stack.extend(CALLS.get(name, ()))
    lines: list[str] = []
    for name in HELPERS:
        if name in needed:
            lines += ["", ""] + helper_source(name).split("\n")
    return lines


def load_module(source: str, name: str = "symattn_generated") -> types.ModuleType:
    """Execute generated source as a new module object (nothing is written to disk)."""
    module = types.ModuleType(name)
    module.__file__ = f"<symattn generated {name}>"
    exec(compile(source, module.__file__, "exec"), module.__dict__)
    return module
