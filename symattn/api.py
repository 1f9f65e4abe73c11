"""The Python API: `load` a spec, get a `Spec` whose methods mirror the CLI.

Contract: `load(path_or_text, dims=None)` reads a file or spec text, parses and
validates it, and returns a `Spec` holding the typed IR; a bad spec raises a
`SpecError` whose `str()` is the located report. A `Path`, or a string of one
line that looks like a path (it ends in `.attn`, or has no blank in it, or names
something that exists) is a file, `.attn` added when only that name exists
(`spec_file`, which the CLI uses too); a missing file or a directory is a
`UsageError` that says so. Other strings are spec text: a spec has at least two
statements, one a line, so one line with blanks is never a spec. `read_spec_file` turns bytes that are not UTF-8 into such an
error too. A `Spec` method given a tensor name the spec does not declare
raises `UnknownTensorError` (a `UsageError` and a `KeyError`).
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Callable, Mapping, TypeVar

from . import budget, cache, progress
from .ir import typed as t
from .docs.display import spec_html, spec_latex
from .ir.position import NOWHERE
from .errors import SpecSyntaxError, UnknownTensorError, UsageError
from .front.parse import parse
from .ir.printing import to_spec
from .ir.shapes import format_dim, format_shape
from .front.validate import validate

__all__ = ["load", "Spec", "read_spec_file", "spec_file", "example_path", "example_text"]

T = TypeVar("T")


def example_text() -> str:
    """The built-in example: single-head scaled dot-product self-attention."""
    return resources.files("symattn").joinpath("examples/self_attention.attn").read_text("utf-8")


def example_path() -> str:
    return "self_attention.attn"


def read_spec_file(path: str | Path) -> str:
    """The file's text; a file that is not UTF-8 is a located SpecSyntaxError."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        tried = f" (nor {path}.attn)" if not path.suffix else ""
        raise UsageError(f"{path}: no such file{tried}") from None
    except IsADirectoryError:
        raise UsageError(f"{path}: is a directory, not a spec file") from None
    except OSError as exc:
        raise UsageError(f"{path}: cannot read: {exc.strerror}") from None
    except ValueError:  # a NUL in the name
        raise UsageError(f"{str(path)!r}: no file can have this name") from None
    if data.startswith(b"\xef\xbb\xbf"):
        data = data[3:]
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        before = data[: exc.start]
        line = before.count(b"\n") + 1
        column = len(before[before.rfind(b"\n") + 1:].decode("utf-8")) + 1  # in characters, as the parser counts
        shown = data.decode("utf-8", errors="replace")
        raise SpecSyntaxError(
            f"not UTF-8 text: byte 0x{data[exc.start]:02x} cannot start or continue a UTF-8 character",
            line=line, column=column, hint="save the spec as UTF-8 text",
        ).located(str(path), shown) from None


def spec_file(path: str | Path) -> Path:
    """The file a spec path names: the path itself when it exists (or has a suffix), else the path
    with `.attn` added when that exists (`derivations/causal` names `derivations/causal.attn`),
    else the path as given, for `read_spec_file` to report as missing."""
    path = Path(path)
    try:
        if path.suffix or path.exists():
            return path
        with_suffix = path.with_name(path.name + ".attn")
        return with_suffix if with_suffix.is_file() else path
    except (OSError, ValueError):  # no possible file name (too long, NUL): reported when read
        return path


def _looks_like_path(value: str) -> bool:
    """Whether a string given to `load` names a file rather than holding spec text: one line that
    ends in `.attn`, has no blank in it (`nope`, `derivations/`), or names something that exists, and
    could be a file name at all."""
    if "\n" in value or not value.strip() or "\0" in value or any(len(part) > 255 for part in value.split("/")):
        return False  # no file could have this name (NUL, or a part longer than file systems allow)
    if value.endswith(".attn") or not any(c.isspace() for c in value):
        return True
    try:
        return Path(value).exists() or Path(value + ".attn").is_file()
    except (OSError, ValueError):  # spec text that is no possible file name (too long, NUL)
        return False


class Spec:
    """A validated spec: its typed IR plus the operations symattn offers on it."""

    def __init__(self, typed: t.TypedSpec) -> None:
        self.typed = typed
        self._derivation = None
        # Element-level results, computed once per Spec (its source text and sizes are fixed):
        # the claims session per `force`, verdicts per (force, budget), gradient checks per force.
        self._sessions: dict = {}
        self._verdicts: dict = {}
        self._gradient_checks: dict = {}
        self._torch_generated = None  # the generated torch module, loaded once for spec.torch()
        self._runs_out = budget.runs_out()  # time budgets run out before this Spec existed (see `cached`)
        self._passes: dict = {}  # "backward" / "tangent" -> what _torch_pass returns
        self.written = None  # for a pass written as a spec (`backward_spec`, `tangent_spec`): its WrittenSpec

    # --- what the spec declares ------------------------------------------------------
    @property
    def name(self) -> str:
        return self.typed.name

    @property
    def filename(self) -> str:
        return self.typed.filename

    @property
    def dims(self) -> dict[str, int]:
        """Each dim's size (defaults, with overrides applied)."""
        return dict(self.typed.sizes)

    @property
    def tensors(self) -> Mapping[str, t.TensorInfo]:
        return self.typed.tensors

    @property
    def outputs(self) -> tuple[str, ...]:
        return self.typed.outputs

    @property
    def checks(self) -> tuple[t.CheckInfo, ...]:
        return self.typed.checks

    def _tensor(self, name: str) -> t.TensorInfo:
        try:
            return self.typed.tensors[name]
        except KeyError:
            raise UnknownTensorError(name, self.name, self.typed.tensors) from None

    def shape(self, name: str) -> str:
        """The symbolic shape of a tensor as text, e.g. `[N, d_k]`."""
        return format_shape(self._tensor(name).shape, list(self.typed.dims))

    def concrete_shape(self, name: str) -> tuple[int, ...]:
        """The shape of a tensor at the spec's sizes, e.g. `(4, 2)`."""
        return self.typed.concrete_shape(self._tensor(name).shape)

    def with_dims(self, **sizes: int) -> "Spec":
        """The same spec at other sizes (`spec.with_dims(N=8)`)."""
        merged = {**{k: v for k, v in self.typed.sizes.items()}, **sizes}
        return load(self.typed.source, dims=merged, filename=self.typed.filename)

    def cached(self, kind: str, parts: tuple, compute: Callable[[], T]) -> T:
        """compute(), through the cache on disk (`symattn.cache`), keyed by `kind`, this spec's text,
        file name and sizes, and `parts`. Stored only when no time budget has run out since this
        Spec was made: whatever it remembers (sessions, verdicts) was computed since then, and a
        result that depended on the clock is not reproducible."""
        key = (self.typed.source, self.typed.filename, tuple(self.typed.sizes.items())) + tuple(parts)
        return cache.remembered(kind, key, compute, keep=lambda: budget.runs_out() == self._runs_out)

    def derive(self):
        """Every grad(T) in matrix form, dims symbolic, with the steps that produced it."""
        from .symbolic.derive import derive

        if self._derivation is None:
            self._derivation = derive(self.typed)
        return self._derivation

    def backward_spec(self) -> "Spec":
        """The backward pass as a spec (`symattn derive SPEC --backward`): inputs `grad_O` per output, outputs
        `grad_X` per input and param (`symattn.symbolic.passes`). Deriving it is the double backward.
        `.written` holds its text and the notes on the names chosen."""
        from .symbolic.passes import backward_spec

        written = backward_spec(self.typed, self.derive())
        out = load(written.text, filename=f"{self.name}_backward.attn")
        out.written = written
        return out

    def tangent_spec(self) -> "Spec":
        """The forward-mode pass as a spec (`symattn derive SPEC --tangent`): inputs `tangent_X` per input and
        param, outputs O and `tangent_O` per output (`symattn.symbolic.passes`). The tangent spec of the
        backward spec is the Hessian-vector product. `.written` holds its text and the notes."""
        from .symbolic.passes import tangent_spec

        written = tangent_spec(self.typed)
        out = load(written.text, filename=f"{self.name}_tangent.attn")
        out.written = written
        return out

    def session(self, force: bool = False):
        """The element-level pass (`symattn.prove.claims.open_session`: the element model, its exact
        gradients, the finiteness analysis) that this spec's documents, gradient checks and
        checks share; built on first use."""
        from .prove.claims import open_session

        key = bool(force)
        if key not in self._sessions:
            self._sessions[key] = open_session(self.typed, force=key, derivation=self.derive())
        return self._sessions[key]

    def check(self, force: bool = False, budget: float | None = None):
        """One `Verdict` per `check` statement: proved, refuted (with a counterexample) or unknown.

        Each claim gets `budget` seconds (default `symattn.budget.DEFAULT_SECONDS`; 0 means no
        limit); a claim over it is unknown, "gave up after ... s". Computed once per Spec and
        (force, budget), and kept on disk for the next run (`cached`); later calls return the same
        verdicts."""
        from .budget import DEFAULT_SECONDS
        from .prove.claims import check_spec

        seconds = DEFAULT_SECONDS if budget is None else (budget or None)
        key = (bool(force), seconds)
        if key not in self._verdicts:
            # Share the element model when a document or gradient check has built it already; a
            # model built here would be built under a claim's time budget, and one that ran out of
            # time must not stand in for the unbudgeted model documents need.
            shared = self._sessions.get(bool(force))
            session = shared if shared is not None and shared.model_built else None
            with progress.task(f"check {self.name}"):
                self._verdicts[key] = self.cached("verdicts", key, lambda: check_spec(
                    self.typed, force=force, budget=seconds, session=session))
        return list(self._verdicts[key])

    def equivariance(self, output: str, source: str | tuple[str, ...] | list[str], dim: str | None = None,
                     invariant: bool = False, force: bool = False):
        """Is `output` equivariant (or invariant) under permuting `source` along `dim`? A Verdict with steps.

        `source` is a given tensor's name, or several (`("X", "keep")`) permuted together, each along
        its first axis of `dim`; `dim` defaults to the dim of the first axis of the first of them."""
        from .prove.equivariance import check_symmetry
        from .ir.shapes import same_dim

        self._tensor(output)
        sources = (source,) if isinstance(source, str) else tuple(source)
        if not sources:
            raise UsageError("name at least one tensor to permute")
        for name in sources:
            if self._tensor(name).expr is not None:
                raise UsageError(f"{name} is computed, not declared; permute an input, param or buffer")
        if len(set(sources)) != len(sources):
            raise UsageError(f"a tensor is named twice in {sources}")
        shape = self._tensor(sources[0]).shape
        if dim is None:
            if not shape or not shape[0].is_Symbol:
                raise UsageError(f"name the dim to permute: the first axis of {sources[0]} is not a single dim")
            dim = str(shape[0])
        for name in sources:
            shape = self._tensor(name).shape
            if dim not in self.typed.dims or not any(same_dim(d, self.typed.dims[dim].symbol) for d in shape):
                raise UsageError(f"{name} has no axis of dim {dim!r}")
        kind = "invariant" if invariant else "equivariant"
        shown = sources[0] if len(sources) == 1 else "(" + ", ".join(sources) + ")"
        claim = t.CheckInfo(0, f"{kind}({output}, {shown}, {dim})", False, kind, NOWHERE,
                            output=output, sources=sources, dim=dim)
        return check_symmetry(self.typed, claim, force=force)

    def verify_gradients(self, force: bool = False):
        """Every matrix-level gradient against the element-level chain rule, exactly, at the current sizes.
        Computed once per Spec and `force`, in the shared `session`, and kept on disk (`cached`)."""
        from .prove.claims import verify_gradients

        key = bool(force)
        if key not in self._gradient_checks:
            with progress.task(f"verify gradients of {self.name}"):
                self._gradient_checks[key] = self.cached("gradient-checks", (key,), lambda: verify_gradients(
                    self.typed, force=key, session=self.session(key)))
        return list(self._gradient_checks[key])

    def numpy(self, jvp: bool = False):
        """The generated NumPy code as a ready module: `spec.numpy().forward(X=...)`, `.backward(..., grad_O=...)`;
        with `jvp`, also `.jvp(..., tangent_X=...)` and `.hvp(..., grad_O=..., tangent_X=...)`.

        The same text `symattn emit numpy` writes (`spec.emit("numpy")`), executed in memory.
        """
        from .codegen.numpy.emit import load_module

        return load_module(self.emit("numpy", jvp=jvp), f"symattn_{self.name}" if self.name.isidentifier() else "symattn_spec")

    def torch(self, backend: str = "auto"):
        """The spec as a `torch.nn.Module`: its params are `nn.Parameter`s of the spec's shapes, its inputs and
        buffers keywords, `module(X=x)` returns the outputs as a dict, differentiable through the derived
        backward (`symattn.codegen.nn`). backend: "eager" (the generated torch code), "triton"
        (the Triton kernels), or "auto" (Triton for CUDA tensors, eager elsewhere)."""
        try:
            import torch  # noqa: F401
        except ImportError:
            raise UsageError("spec.torch() needs PyTorch: pip install 'symattn[torch]'") from None
        from .codegen.nn import AttentionModule, derive_higher_orders
        from .codegen.torch.emit import load_torch_module

        if self._torch_generated is None:
            name = f"symattn_torch_{self.name}" if self.name.isidentifier() else "symattn_torch_spec"
            self._torch_generated = load_torch_module(self.emit("torch"), name)
            derive_higher_orders(self._torch_generated, self.typed, lambda: self._torch_pass("backward"),
                                 lambda: self._torch_pass("tangent"))
        return AttentionModule(self.typed, self._torch_generated, backend, _triton_loader(self))

    def _torch_pass(self, kind: str):
        """(the generated torch module of the backward or tangent pass written as a spec, its names, its typed
        spec), built once:
        what spec.torch() runs for double backward and forward-mode AD. The pass's own module derives its
        higher orders the same way, so every order is derived formulas."""
        if kind not in self._passes:
            written = self.backward_spec() if kind == "backward" else self.tangent_spec()
            written.torch()  # loads its generated module, with its own higher orders
            self._passes[kind] = (written._torch_generated, written.written.names, written.typed)
        return self._passes[kind]

    def plan(self):
        """The attention plan (`symattn.codegen.plan.AttentionPlan`): the cores every target computes fused, each
        with its score, mask and backward in entry form, and `notes`, why each other softmax is not fused."""
        from .codegen.plan import attention_plan

        return attention_plan(self.typed, derivation=self.derive())

    def emit(self, target: str = "numpy", jvp: bool = False):
        """The generated code: the NumPy module's text for "numpy", the PyTorch module's for "torch"; for "cuda"
        a `symattn.codegen.cuda.CudaCode`
        whose `files` maps each file name (.cu, .h, cuda_host.h, README.md) to its text and whose
        `write(directory)` writes them; for "triton" a `symattn.codegen.triton.TritonCode` whose `text` is the
        module of the fused attention kernels. With `jvp`, the NumPy module also has `jvp` and `hvp`
        (`symattn.codegen.numpy.higher`)."""
        if target == "numpy":
            from .codegen.numpy.emit import numpy_source

            text = numpy_source(self.typed, derivation=self.derive())
            if not jvp:
                return text
            if self.typed.dropouts:
                raise UsageError(f"{self.name}: jvp and hvp of a spec with dropout are not generated yet (the "
                                 "written passes read the drawn mask as a buffer)")
            from .codegen.numpy.higher import higher_order_lines

            lines = higher_order_lines(self.typed, lambda source: load(source).typed,
                                       lambda typed: numpy_source(typed))
            return text + "\n".join(lines) + "\n"
        if jvp:
            raise UsageError("jvp=True is for the NumPy target; spec.torch() has forward mode through torch.func")
        if target == "torch":
            from .codegen.torch.emit import torch_source

            return torch_source(self.typed, derivation=self.derive())
        if target == "cuda":
            from .codegen.cuda import emit_cuda

            return emit_cuda(self.typed)
        if target == "triton":
            from .codegen.triton import emit_triton

            return emit_triton(self.typed)
        raise UsageError(f"emit: unknown target {target!r}; expected 'numpy', 'torch', 'cuda' or 'triton'")

    def document(self, fmt: str = "md", force: bool = False) -> str:
        """The derivation document as Markdown, HTML or LaTeX text (figures: `document_with_figures`)."""
        return self.document_with_figures(fmt, force)[0]

    def document_with_figures(self, fmt: str = "md", force: bool = False) -> tuple[str, dict[str, bytes]]:
        """(document text, {figure file name: PNG bytes}); HTML embeds its figures."""
        from .docs.document import FORMATS, build, render

        if fmt not in FORMATS:
            raise UsageError(f"unknown document format {fmt!r}; choose one of {', '.join(FORMATS)}")
        with progress.task(f"document {self.name}"):
            doc = build(self, force=force)
            return render(doc, fmt), {f.name: f.png for f in doc.figures}

    def show(self) -> str:
        """The typed IR as text: dims, every tensor with kind and shape, every check."""
        return format_typed(self.typed)

    def __repr__(self) -> str:
        return f"<Spec {self.name}: {len(self.tensors)} tensors, outputs {', '.join(self.outputs)}>"

    def _repr_html_(self) -> str:
        """In a notebook: every tensor with its role and shape, and its definition typeset (MathML)."""
        return spec_html(self.typed)

    def _repr_latex_(self) -> str:
        return spec_latex(self.typed)


def definition_text(spec: t.TypedSpec, name: str) -> str:
    """A defined tensor's definition in spec syntax (`Q = X @ W_q`, `M[i:N, j:N] = ...`); "" for a leaf."""
    info = spec.tensors[name]
    order = list(spec.dims)
    if info.expr is None:
        return ""
    if isinstance(info.expr, t.IndexDef):
        body = to_spec(info.expr.body, order)
        idx = ", ".join(f"{i.name}:{format_shape((i.range,), order)[1:-1]}" for i in info.expr.indices)
        return f"{name}[{idx}] = {body}"
    mask = next((m for m in spec.dropouts if spec.tensors[m].dropout.of == name), None)
    if mask is not None:  # x * mask / (1 - p), as written
        return f"{name} = dropout({to_spec(t.dropped(spec, mask), order)}, {spec.tensors[mask].dropout.p_text})"
    return f"{name} = {to_spec(info.expr, order)}"


def format_typed(spec: t.TypedSpec) -> str:
    order = list(spec.dims)
    lines = [f"attention {spec.name}  ({spec.filename})", "", "dims"]
    width = max((len(f"{n} = {s}") for n, s in spec.sizes.items()), default=0)
    for name, info in spec.dims.items():
        size = spec.sizes[name]
        note = "" if size == info.default else f"  (default {info.default})"
        lines.append(f"  {f'{name} = {size}'.ljust(width)}  line {info.pos.line}{note}")
    lines += ["", "tensors"]
    rows = []
    for name, info in spec.tensors.items():
        shape = format_shape(info.shape, order)
        sizes = "[" + ", ".join(map(str, spec.concrete_shape(info.shape))) + "]"
        definition = definition_text(spec, name)
        if info.dropout is not None:
            definition = f"0/1, drawn from the seed: {info.dropout.of} = dropout(..., {info.dropout.p_text})"
        elif info.integer:  # an integer buffer: its range, as declared, and at these sizes
            low, high = (format_dim(v, order) for v in info.values)
            definition = f"integers in {low}:{high} ({':'.join(map(str, spec.integer_range(name)))} here)"
        rows.append((name, info.role, shape, sizes, f"line {info.pos.line}", definition))
    widths = [max(len(r[k]) for r in rows) for k in range(5)] if rows else [0] * 5
    for row in rows:
        cells = [row[k].ljust(widths[k]) for k in range(5)]
        lines.append(("  " + "  ".join(cells) + ("  " + row[5] if row[5] else "")).rstrip())
    lines += ["", f"outputs  {', '.join(spec.outputs)}"]
    if spec.checks:
        lines += ["", "checks"]
        for check in spec.checks:
            neg = "not " if check.negated else ""
            if check.kind == "relative":
                lines.append(f"  line {check.line}: {neg}{check.text}    "
                             f"{format_shape(check.lhs.shape, order)} windows, shifted by one row and column")
            elif check.kind == "equal":
                shapes = f"{format_shape(check.lhs.shape, order)} == {format_shape(check.rhs.shape, order)}"
                lines.append(f"  line {check.line}: {neg}{check.text}    {shapes}")
            else:
                permuted = check.sources[0] if len(check.sources) == 1 else "(" + ", ".join(check.sources) + ")"
                lines.append(f"  line {check.line}: {neg}{check.kind}({check.output}, {permuted}) "
                             f"permuting dim {check.dim}")
    return "\n".join(lines) + "\n"


def load(path_or_text: str | Path, dims: Mapping[str, int] | None = None, *, filename: str | None = None) -> Spec:
    """Parse and validate a spec file (the `.attn` suffix may be left off) or spec text; `dims` overrides
    default sizes. A string that looks like a path but names no file is a `UsageError` ("no such file"),
    not spec text."""
    path = spec_file(path_or_text) if isinstance(path_or_text, Path) or \
        isinstance(path_or_text, str) and _looks_like_path(path_or_text) else None
    if path is not None:
        source = read_spec_file(path)
        name = filename or str(path)
    elif isinstance(path_or_text, str):
        source = path_or_text
        name = filename or "<spec>"
    else:
        raise UsageError(f"load() takes a path or spec text, not {type(path_or_text).__name__}")
    for key, value in (dims or {}).items():
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:  # 0: a dim used only as a number
            raise UsageError(f"dim {key}={value!r}: sizes are positive integers (0 only for a dim no shape uses)")
    program = parse(source, name)
    return Spec(validate(program, name, source, dims))


def _triton_loader(spec: Spec):
    """What loads the Triton target's module of a spec (the `torch(backend="triton")` path), or None when this
    installation has no triton. Its double backward and forward mode are the eager module's: the passes
    written as specs (`symattn.codegen.nn.derive_higher_orders`)."""
    try:
        import triton  # noqa: F401
    except ImportError:
        return None

    def load():
        from .codegen.nn import derive_higher_orders
        from .codegen.triton import triton_module

        module = triton_module(spec.typed)
        derive_higher_orders(module, spec.typed, lambda: spec._torch_pass("backward"),
                             lambda: spec._torch_pass("tangent"))
        return module
    return load
