"""Derivation documents: every step shown, every step checked.

Contract: `build(spec)` assembles a `Document` (a list of blocks) from the
very objects symattn checked: the typed IR, the derivation's recorded steps,
the element-level cross-check, the verdicts of every `check`, the
permutation proof, and the cost polynomials; `render(doc, fmt)` (from
`symattn.docs.render`, the document model and its renderings) writes it as
Markdown, standalone HTML or LaTeX. The same inputs give the same bytes. Figures come from `symattn.docs.figures` when matplotlib is installed and
are left out, with a note, when it is not. They are drawn in a child process
(`symattn.docs.figure_job`) while the element-level work goes on, where the
'fork' start method exists, else in this process: the same PNG bytes either way.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable

import numpy as np
import sympy

from .. import progress
from ..version import __version__
from ..ir import typed as t
from ..prove.verdicts import GradientCheck, Verdict
from ..symbolic.cost import Cost, spec_cost
from ..symbolic.derive import Derivation
from .display import counterexample_lines
from ..symbolic.element import ElementModel, example_assignment, guard
from ..prove.equivariance import LEMMAS
from ..errors import SizeGuardError
from .figure_job import FigureJob
from ..symbolic.evaluate import NUMERIC, Evaluator
from .mathbox import Box, Ident, Op, row
from .render import FORMATS, Code, Display, Document, Heading, Inline, Items, Math, Para, Table, render
from .mathprint import Names, definition_box, dim_box, entry_box, grad_box, gradient_box, loss_box, matrix_box
from ..ir.shapes import format_dim, format_shape

__all__ = ["Document", "build", "render", "FORMATS"]


# --- building ------------------------------------------------------------------------------

def _eq(left: Box, right: Box) -> Math:
    return Math.of(row(left, Op("=", "="), right))


def _textbook_names(spec: t.TypedSpec) -> dict[str, Box]:
    """Names of the textbook walk-through: a_i, q, k, v, alpha, alpha', b_i (when the pattern is there)."""
    names: dict[str, Box] = {}
    inputs = spec.inputs
    if not inputs:
        return names
    softmax = [n for n, i in spec.tensors.items() if isinstance(i.expr, t.Softmax)]
    if not softmax:
        return names
    weights = softmax[0]
    names[weights] = Ident("α′", "\\alpha'")
    arg = spec.tensors[weights].expr.x
    if isinstance(arg, t.Tensor) and arg.name in spec.tensors:
        names[arg.name] = Ident("α", "\\alpha")
    if len(inputs) == 1:
        names[inputs[0]] = Ident("a")
    for n, info in spec.tensors.items():
        if isinstance(info.expr, t.MatMul) and isinstance(info.expr.a, t.Tensor) and info.expr.a.name in inputs \
                and isinstance(info.expr.b, t.Tensor) and len(n) == 1 and n.lower() not in ("a", "b"):
            names[n] = Ident(n.lower())
    for out in spec.outputs:
        if len(spec.outputs) == 1 and out not in names:
            names[out] = Ident("b")
    return names


def _index_names(shape, tokens=()) -> list[str]:
    """Index names for the axes of a tensor: i, j for token axes (as the textbooks write), c, e, ... else."""
    token_names = iter(["i", "j"])
    other_names = iter(["c", "e", "f", "g", "u"])
    out = []
    for dim in shape:
        name = next(token_names, None) if dim in tokens else None
        out.append(name or next(other_names, f"i{len(out)}"))
    return out


def _token_dims(spec: t.TypedSpec) -> tuple:
    return tuple({spec.tensors[n].shape[0] for n in spec.inputs if spec.tensors[n].shape})


def _forward(doc: Document, spec: t.TypedSpec) -> None:
    dims = list(spec.dims)
    doc.add(Heading(2, "Forward pass"), Para(["In matrix form, dims symbolic (valid for every size):"]))
    for name, info in spec.tensors.items():
        if info.expr is not None:
            doc.add(Display(Math.of(definition_box(name, info, dims))))
    names = _textbook_names(spec)
    if names:
        doc.add(Para(["Entry by entry, in the textbook's names (", *_legend(names), "):"]))
    else:
        doc.add(Para(["Entry by entry:"]))
    for name, info in spec.tensors.items():
        if info.expr is None or isinstance(info.expr, t.IndexDef):
            continue
        idx = _index_names(info.shape, _token_dims(spec))
        nm = Names(names, used=idx + list(spec.dims) + list(spec.tensors) + _letters(names),
                   tokens=_token_dims(spec))
        doc.add(Display(_eq(nm.entry(name, idx), entry_box(info.expr, idx, nm))))
    out = spec.outputs[0]
    info = spec.tensors[out]
    if info.shape:
        idx = ["1"] + _index_names(info.shape, _token_dims(spec))[1:]
        nm = Names(names, used=idx + list(spec.dims) + list(spec.tensors) + ["i"] + _letters(names),
                   tokens=_token_dims(spec))
        doc.add(Para([f"The first row of the output {out}:"]),
                Display(_eq(nm.entry(out, idx), entry_box(info.expr, idx, nm))))


def _letters(names: dict[str, Box]) -> list[str]:
    """Letters the textbook names take (q, k, v, a, b), so no summation index reuses them."""
    return [b.text for b in names.values() if isinstance(b, Ident)]


def _legend(names: dict[str, Box]) -> list[Inline]:
    parts: list[Inline] = []
    for k, (tensor, box) in enumerate(names.items()):
        if k:
            parts.append(", ")
        parts += [f"{tensor} is written ", Math.of(box)]
    return parts


@dataclass
class _Slot:
    """Where a figure goes, filled by `_place_figures` when the figure job has answered."""

    name: str   # the figure job's thunk: "heatmap" or "cost"


_HEATMAP_NOTE = ("(The heatmap of these weights is left out: matplotlib is not installed; "
                 "`pip install 'symattn[plots]'` adds it.)")
_FIGURES_NOTE = "Figures are left out: matplotlib is not installed (`pip install 'symattn[plots]'`)."


@dataclass
class _Inputs:
    """What the sections and the figures both need, computed once before the figure job starts."""

    cost: Cost
    weights: str | None = None          # the attention weights tensor, if any
    table: np.ndarray | None = None     # its values in the small example, when the example is written


def _inputs(typed: t.TypedSpec, derivation: Derivation, force: bool) -> _Inputs:
    inputs = _Inputs(spec_cost(typed, derivation), _weights_tensor(typed))
    if inputs.weights is not None:
        try:
            guard(typed, force)   # the element model's own test: without a model there is no example
        except SizeGuardError:
            return inputs
        inputs.table = _weight_table(typed, inputs.weights)
    return inputs


def _figure_job(typed: t.TypedSpec, inputs: _Inputs, wanted: bool) -> FigureJob:
    """Whether matplotlib is there and, when the figures are wanted, the figures themselves, from
    numbers already computed: a child can draw them while the element level runs. No child when
    the figures are not wanted or matplotlib is not installed."""
    from importlib.util import find_spec

    from . import figures

    thunks = {"available": figures.available}
    if not wanted:
        return FigureJob(thunks, fork=False)
    if inputs.table is not None:
        thunks["heatmap"] = lambda: figures.heatmap(typed.name, *_which_matrix(typed, inputs.weights), inputs.table)
    thunks["cost"] = lambda: figures.cost_curve(typed, inputs.cost)
    return FigureJob(thunks, fork=None if find_spec("matplotlib") is not None else False)


def _place_figures(doc: Document, job: FigureJob, wanted: bool) -> None:
    """Each slot becomes its figure (none when the figure is None), or the heatmap's note when
    matplotlib is missing; then the note on missing figures, when they are. When figures are not
    wanted the slots go, and nothing is said about matplotlib: such a document is the same
    whether it is installed or not."""
    available = wanted and job.result("available")
    blocks = []
    for block in doc.blocks:
        if not isinstance(block, _Slot):
            blocks.append(block)
        elif not wanted:
            continue
        elif not available:
            if block.name == "heatmap":
                blocks.append(Para([_HEATMAP_NOTE]))
        else:
            figure = job.result(block.name)
            if figure is not None:
                blocks.append(figure)
    doc.blocks = blocks
    if wanted and not available:
        doc.add(Para([_FIGURES_NOTE]))


def _weights_tensor(spec: t.TypedSpec) -> str | None:
    """The attention weights: the first softmax, if any."""
    return next((n for n, i in spec.tensors.items() if isinstance(i.expr, t.Softmax)), None)


def _weight_table(spec: t.TypedSpec, weights: str) -> np.ndarray:
    """The weights of the small example (the first matrix of them when there are more axes)."""
    values = _example_values(spec)[weights]
    while values.ndim > 2:
        values = values[0]
    return values


def _which_matrix(spec: t.TypedSpec, weights: str) -> tuple[str, str]:
    """Which matrix of the weights the table and the heatmap show, when they have more axes than
    two: (`P[0, :, :]`, `the first of h = 2`); (`P`, "") for a matrix."""
    leading = spec.tensors[weights].shape[:-2]
    if not leading:
        return weights, ""
    order = list(spec.dims)
    of = " and of ".join(f"{format_dim(d, order)} = {n}" for d, n in zip(leading, spec.concrete_shape(leading)))
    return f"{weights}[{', '.join(['0'] * len(leading) + [':', ':'])}]", f"the first of {of}"


def _example(doc: Document, spec: t.TypedSpec, model: ElementModel | None, inputs: _Inputs) -> None:
    doc.add(Heading(2, "A small example"))
    sizes = ", ".join(f"{k} = {v}" for k, v in spec.sizes.items())
    if model is None:
        doc.add(Para([f"The element-level example at {sizes} is too large to write out."]))
        return
    out = spec.outputs[0]
    first = (0,) * len(spec.tensors[out].shape)
    doc.add(Para([f"At the default sizes ({sizes}) every entry is an explicit formula. The first entry of {out}, "
                  "in the entries of the tensors its definition reads:"]))
    sym = model.slot[out][first] if spec.tensors[out].shape else model.slot[out]
    doc.add(Display(Math.of_sympy(sympy.Eq(sym, model.local[out][first] if spec.tensors[out].shape
                                           else model.local[out], evaluate=False))))
    w = inputs.weights
    if w is not None:
        entry = (0,) * len(spec.tensors[w].shape)
        doc.add(Para([f"and the first attention weight {w}, a softmax written with exp:"]),
                Display(Math.of_sympy(sympy.Eq(model.slot[w][entry], model.local[w][entry], evaluate=False))))
        values = inputs.table if inputs.table is not None else _weight_table(spec, w)
        matrix, which = _which_matrix(spec, w)
        doc.add(Para([f"With the inputs drawn from the multiples of 1/2 in [-1, 1] (seed 0), the weights {matrix}"
                      + (f" ({which})" if which else "") + " are:"]))
        header = [""] + [str(j + 1) for j in range(values.shape[-1])]
        doc.add(Table(header, [[str(i + 1)] + [f"{v:.3f}" for v in r] for i, r in enumerate(values)]))
        doc.add(_Slot("heatmap"))


def _example_values(spec: t.TypedSpec) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    leaves = {n: rng.integers(-2, 3, size=spec.concrete_shape(spec.tensors[n].shape)) / 2.0 for n in spec.given}
    return Evaluator(spec, NUMERIC).run(leaves)


def _backward(doc: Document, spec: t.TypedSpec, derivation: Derivation, verified: dict) -> None:
    dims = list(spec.dims)
    doc.add(Heading(2, "Backward pass"),
            Para(["The loss is ", Math.of(loss_box(spec)), ". Each gradient below is the result of the rules "
                  "listed under it, applied from the outputs back to the inputs, with dims symbolic. Each was then "
                  "compared with the exact element-level chain rule (every entry written out in SymPy and "
                  "differentiated with sympy.diff)."]))
    given = [n for n in spec.buffers if spec.tensors[n].dropout is None]
    if given:
        listed = ", ".join(f"`{n}`" for n in given)
        which = "is a buffer" if len(given) == 1 else "are buffers"
        doc.add(Para([f"{listed} {which}: given, never differentiated, so there is no gradient of "
                      f"{'it' if len(given) == 1 else 'them'}; the backward pass reads "
                      f"{'it' if len(given) == 1 else 'them'} as a constant."]))
    for name in spec.dropouts:
        drop = spec.tensors[name].dropout
        doc.add(Para([f"`{name}` is the 0/1 mask of `{drop.of} = dropout(..., {drop.p_text})`: every claim and "
                      "step here holds for each value it can take; generated code draws it from a seed "
                      f"(Philox-4x32-10 at each entry's position, stream {drop.stream}), and the backward pass "
                      "draws the same mask again and reads it as a constant."]))
    for name, grad in derivation.gradients.items():
        if grad.expr is None:
            doc.add(Para([Math.of(grad_box(name)), f" = 0: L does not depend on {name}."]))
            continue
        if isinstance(grad.expr, t.Grad) and name in spec.outputs:
            doc.add(Para([Math.of(grad_box(name)), f" is the upstream gradient of the output {name}."]))
            continue
        doc.add(Heading(3, f"grad({name})"))
        doc.add(Display(Math.of(gradient_box(name, grad.expr, spec))))
        steps: list[list[Inline]] = []
        for step in grad.steps:
            steps.append([f"{step.rule}: through ", Math.of(matrix_box(step.before, dims)),
                          " the gradient becomes ", Math.of(matrix_box(step.after, dims))])
        if steps:
            doc.add(Items(steps))
        if name in verified:
            doc.add(Para([verified[name]]))


def _learn_more(spec: t.TypedSpec) -> str:
    """The commands a reader can run to see more than a document shows about a verdict."""
    name = spec.filename.split("/")[-1]
    return (f"To learn more: `symattn check {name} --explain` (the steps of every check, and every gradient "
            f"against the chain rule) and `symattn verify {name} --target numpy` (the generated code against "
            "central finite differences).")


def _gradient_note(spec: t.TypedSpec, check: GradientCheck, verdicts: list[Verdict]) -> str:
    """What the element-level comparison of one derived gradient found, in words a reader can act on:
    confirmed, or which rung ran, what it found, what else the spec's checks say, and what to run."""
    if check.ok:
        return f"Checked: {check.method}."
    if check.method.startswith("not checked"):
        found = f"Not checked at the element level: {check.method[len('not checked: '):]}."
    else:
        sizes = check.method[len("not shown equal at "):] if check.method.startswith("not shown equal at ") \
            else check.method
        found = (f"Not confirmed at the element level: at {sizes} the exact comparison of every entry with the "
                 "element-level chain rule did not reduce to an identity. No entry was shown to differ, so this "
                 "is neither a proof nor a refutation of the formula.")
    claim = re.compile(rf"grad\({re.escape(check.tensor)}\)\s*==")
    stated = [v for v in verdicts if claim.match(v.claim)]
    also = "".join(f" The spec's check at line {v.line} (`{v.claim}`), which compares the derived formula with "
                   f"the one it states, is {v.verdict}: {v.method}." for v in stated)
    return f"{found}{also} {_learn_more(spec)}"


def _checks(doc: Document, spec: t.TypedSpec, verdicts: list[Verdict]) -> None:
    doc.add(Heading(2, "Checks"))
    if not verdicts:
        doc.add(Para(["The spec states no `check`."]))
        return
    rows = [[str(v.line), f"`{v.claim}`", v.verdict, v.method] for v in verdicts]
    doc.add(Table(["line", "claim", "verdict", "how it was settled"], rows))
    unknown = [str(v.line) for v in verdicts if v.verdict == "unknown"]
    if unknown:
        doc.add(Para([f"Unknown (line{'s' if len(unknown) > 1 else ''} {', '.join(unknown)}) means neither proved "
                      "nor refuted: the row says where the last rung (matrix level, element level, counterexample "
                      f"search) stopped and why. {_learn_more(spec)}"]))
    for v in verdicts:
        if v.counterexample is not None:
            doc.add(Code("\n".join(counterexample_lines(v))))


def _symmetry(doc: Document, spec: t.TypedSpec, verdicts: list[Verdict], symmetry_of: Callable) -> None:
    doc.add(Heading(2, "Permutation symmetry"))
    stated = [(c, v) for c, v in zip(spec.checks, verdicts) if c.kind in ("equivariant", "invariant")]
    if not stated and spec.inputs:
        source = spec.inputs[0]
        first = spec.tensors[source].shape[0] if spec.tensors[source].shape else None
        if first is not None and first.is_Symbol:
            verdict = symmetry_of(spec.outputs[0], source, str(first))
            stated = [(None, verdict)]
            doc.add(Para([f"The spec states no symmetry claim; symattn asks whether {spec.outputs[0]} is "
                          f"equivariant under permuting the rows of {source}."]))
    for check, verdict in stated:
        method = verdict.method[:1].upper() + verdict.method[1:]
        doc.add(Heading(3, verdict.claim), Para([f"Verdict: {verdict.verdict}. {method}."]))
        items = []
        for lemma, tensor, statement in verdict.steps:
            law = LEMMAS[lemma].statement if lemma in LEMMAS else ""
            items.append([f"{statement}" + (f" (lemma: {law})" if law else "")])
        if items:
            doc.add(Items(items))


def _cost(doc: Document, spec: t.TypedSpec, cost: Cost) -> None:
    doc.add(Heading(2, "Cost"),
            Para(["FLOPs count a multiply-add as 2 and one elementwise operation as 1; memory counts floats. "
                  "Every formula is a polynomial in the dims."]))
    fused = cost.quadratic != 0

    def m(expr) -> Math:
        return Math.of(dim_box(expr))

    # One formula a row: formulas do not wrap, so two or three side by side made the table several
    # times as wide as the page for specs with many dims.
    numpy = "the mathematics, generated NumPy"
    cuda = "generated CUDA, fused (recomputes the weights)"
    if fused:
        rows = [["forward FLOPs", "every implementation", m(cost.forward_flops)],
                ["backward FLOPs", numpy, m(cost.backward_flops)],
                ["", cuda, m(sympy.expand(cost.backward_flops + cost.recompute))],
                ["floats held by the forward", numpy, m(cost.activations)],
                ["", cuda, m(sympy.expand(cost.activations - cost.quadratic))]]
    else:
        rows = [["forward FLOPs", numpy, m(cost.forward_flops)],
                ["backward FLOPs", numpy, m(cost.backward_flops)],
                ["floats held by the forward", numpy, m(cost.activations)]]
    doc.add(Table(["", "computed by", "as a polynomial in the dims"], rows))
    doc.add(Para([f"Sequential depth: the longest chain of dependent operations has {cost.depth} steps whatever "
                  "the sequence length, so attention is O(1) in sequential steps; an RNN over the same sequence "
                  "needs O(N) steps one after another. The price is the memory of the N x N weights: ",
                  m(cost.quadratic) if fused else "none here", "."]))
    doc.add(_Slot("cost"))


def build(spec, force: bool = False, figures: bool = True) -> Document:
    """The derivation document of a `symattn.Spec`. With `figures=False` it has no Figure blocks
    (and no note about them): the document `build` gives, less its figures, for a caller that
    has nowhere to put them. Kept on disk (`Spec.cached`): the next run on the same spec, by the
    same code, reads it back instead of building it again."""
    return spec.cached("document", (bool(force), bool(figures)), lambda: _build(spec, force, figures))


def _build(spec, force: bool, figures: bool) -> Document:
    typed = spec.typed
    progress.step("deriving")
    derivation = spec.derive()
    inputs = _inputs(typed, derivation, force)
    with _figure_job(typed, inputs, figures) as job:
        doc = _sections(spec, typed, derivation, inputs, force)
        _place_figures(doc, job, figures)
    return doc


def _sections(spec, typed: t.TypedSpec, derivation: Derivation, inputs: _Inputs, force: bool) -> Document:
    """The document, with a `_Slot` where each figure (or the note on a missing one) goes."""
    doc = Document(typed.name, f"Derivation of {typed.name}")
    doc.add(Heading(1, doc.title),
            Para([f"Generated by symattn {__version__} from `{typed.filename.split('/')[-1]}`. Every formula "
                  "below was produced by the steps symattn recorded and checked; nothing is typed by hand."]))
    doc.add(Heading(2, "The spec"), Code(typed.source.rstrip("\n")))
    order = list(typed.dims)
    rows = [[f"`{n}`", i.role, f"`{format_shape(i.shape, order)}`",
             f"`{list(typed.concrete_shape(i.shape))}`"] for n, i in typed.tensors.items()]
    doc.add(Table(["tensor", "role", "shape", "at the default sizes"], rows))
    _forward(doc, typed)
    # One element-level pass serves the example, the gradient checks and the claims (the spec
    # keeps it, and the results, for later documents and calls).
    progress.step("building the element model")
    try:
        sessions = spec.session(force).assignments()  # with integer buffers: one per assignment of them
        model = (sessions[0].model if sessions else
                 ElementModel(typed, force=force, integers=example_assignment(typed)))
    except SizeGuardError:
        model = None
    progress.step("the small example")
    _example(doc, typed, model, inputs)
    verdicts = spec.check(force=force)
    verified = {}
    if model is not None:
        for check in spec.verify_gradients(force=force):
            verified[check.tensor] = _gradient_note(typed, check, verdicts)
    _backward(doc, typed, derivation, verified)
    _checks(doc, typed, verdicts)
    progress.step("permutation symmetry")
    _symmetry(doc, typed, verdicts, lambda o, s, d: spec.equivariance(o, s, d, force=force))
    progress.step("cost")
    _cost(doc, typed, inputs.cost)
    return doc
