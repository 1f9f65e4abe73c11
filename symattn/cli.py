"""The `symattn` command line.

Contract (DESIGN.md): exit 0 on success, 1 when a check fails, 2 for a bad
spec or bad usage. A bad spec prints `FILE:LINE:COL: error: ...` with the
source line and a caret on stderr, never a traceback. `--dim NAME=SIZE`
overrides a default size on every command.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Callable, Sequence

from . import progress
from .version import __version__
from .api import Spec, definition_text, example_path, example_text, load, spec_file
from .budget import DEFAULT_SECONDS
from .errors import SpecError, SymAttnError, UsageError
from .ir.shapes import format_shape

__all__ = ["main"]


def _dim_override(text: str) -> tuple[str, int]:
    name, sep, value = text.partition("=")
    if not sep or not name.isidentifier():
        raise argparse.ArgumentTypeError(f"expected NAME=SIZE, got {text!r}")
    try:
        size = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{name}: size {value!r} is not an integer") from None
    if size <= 0:
        raise argparse.ArgumentTypeError(f"{name}: size {size} is not positive")
    return name, size


def _seconds(text: str) -> float | None:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a finite number of seconds >= 0, got {text!r}")
    return value or None


def _load(args: argparse.Namespace, default_example: bool = False) -> Spec:
    dims = dict(args.dim or [])
    if args.spec is None:
        if not default_example:
            raise UsageError("a SPEC file is required")
        return load(example_text(), dims=dims, filename=example_path())
    if args.spec == "-":
        spec = load(sys.stdin.read(), dims=dims, filename="<stdin>")
    else:  # always a path (`.attn` optional, as for `load`): a SPEC that names no file must say so
        spec = load(spec_file(args.spec), dims=dims)
    _notes(spec)
    return spec


def _notes(spec: Spec) -> None:
    """What the spec says that is valid but likely not meant, as `FILE:LINE:COL: note: ...` on stderr."""
    typed = spec.typed
    lines = typed.source.split("\n")
    for pos, message in typed.notes:
        sys.stderr.write(f"{typed.filename}:{pos.line}:{pos.column}: note: {message}\n")
        if 0 < pos.line <= len(lines):
            sys.stderr.write(f"    {lines[pos.line - 1]}\n    {' ' * (pos.column - 1)}^\n")


_FORMATS = {".md": "md", ".markdown": "md", ".html": "html", ".htm": "html", ".tex": "tex"}


def _document_format(args: argparse.Namespace) -> str:
    """`--format`, else what `-o`'s extension says (`.md`, `.html`, `.tex`), else Markdown."""
    if args.format is not None:
        return args.format
    return _FORMATS.get(Path(args.output).suffix.lower(), "md") if args.output else "md"


def _output_file(value: str, what: str) -> Path:
    """Where `-o` says a file goes; a usage error when it is a directory or its directory does not exist."""
    path = Path(value)
    if path.is_dir():
        raise UsageError(f"{path}: is a directory; name the {what} to write in it")
    if not path.parent.is_dir():
        raise UsageError(f"{path.parent}: no such directory")
    return path


def _write(path: Path, data: str | bytes) -> None:
    """Write a file the user named; a place that cannot be written is a usage error, not a traceback."""
    try:
        if isinstance(data, bytes):
            path.write_bytes(data)
        else:
            path.write_text(data, encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"{path}: cannot write: {exc.strerror or exc}") from None


def _cmd_show(args: argparse.Namespace) -> int:
    sys.stdout.write(_load(args).show())
    return 0


def _compact(value) -> str:
    text = json.dumps(value)
    return text if len(text) <= 400 else text[:397] + "..."


LADDER = ("How a claim is settled, cheapest first: (1) matrix level: canonical index forms with the dims "
          "symbolic (proved for all sizes); (2) element level: every entry written out exactly at the stated "
          "sizes (proved at those sizes); (3) a counterexample searched at exact small inputs and re-run in "
          "float64 (refuted); otherwise unknown, saying where the last rung stopped.")


def _steps_text(steps) -> list[str]:
    """A proof's recorded steps (rule, subject, result) as lines of `check --explain`; a rule that is
    a lemma of the equivariance prover is stated where it is first used."""
    from .prove.equivariance import LEMMAS

    lines, stated = [], set()
    for rule, subject, result in steps:
        law = f" (lemma: {LEMMAS[rule].statement})" if rule in LEMMAS and rule not in stated else ""
        stated.add(rule)
        if rule == "none" or str(result).startswith(str(subject)):
            lines.append(f"{rule}: {result}{law}")
        else:
            lines.append(f"{rule}: {subject} -> {result}{law}")
    return lines


def _explain_gradients(spec: Spec, force: bool) -> list[str]:
    """`check --explain`'s second part: each derived gradient against the exact element-level chain rule."""
    from .errors import SizeGuardError

    lines = ["", "Derived gradients against the element-level chain rule (every entry written out exactly "
             "and differentiated with sympy.diff):"]
    try:
        checks = spec.verify_gradients(force=force)
    except SizeGuardError as err:
        return lines + [f"  skipped: {err}"]
    for check in checks:
        lines.append(f"  grad({check.tensor}): {'confirmed' if check.ok else 'not confirmed'}: {check.method}")
        if not check.ok and not check.method.startswith("not checked"):
            lines.append("      the two sides did not reduce to the same expression at these sizes; no entry was "
                         f"shown to differ, so this is neither a proof nor a refutation; `symattn verify "
                         f"{spec.filename} --target numpy` compares the generated code with central finite "
                         "differences")
    return lines


def _cmd_check(args: argparse.Namespace) -> int:
    spec = _load(args)
    verdicts = spec.check(force=args.force, budget=args.budget)
    if args.json:  # strict JSON: non-finite numbers are written as strings by to_json
        entries = [v.to_json() for v in verdicts]
        if args.explain:
            for entry, v in zip(entries, verdicts):
                entry["steps"] = [[str(part) for part in step] for step in v.steps]
        print(json.dumps(entries, indent=2, allow_nan=False))
    else:
        if args.explain:
            print(LADDER)
            print()
        for v in verdicts:
            print(f"{spec.filename}:{v.line}: {v.verdict}: {v.claim}")
            print(f"    {v.method}")
            if args.explain:
                for line in _steps_text(v.steps):
                    print(f"      {line}")
            ce = v.counterexample
            if ce is not None:
                print(f"    {ce.note}")
                for name, value in ce.inputs.items():
                    print(f"      {name} = {_compact(value)}")
                if ce.lhs is not None:
                    print(f"      left side  = {_compact(ce.lhs)}")
                    print(f"      right side = {_compact(ce.rhs)}")
        if not verdicts:
            print(f"{spec.filename}: no check statements")
        if args.explain:
            print("\n".join(_explain_gradients(spec, args.force)))
    return 0 if all(v.holds for v in verdicts) else 1


def _wants_summary(args: argparse.Namespace) -> bool:
    """The summary when asked for, or when nothing says where a document should go and a person
    is reading standard output; the document (as always before) when piped or written to a file."""
    if args.summary or args.document:
        return args.summary
    if args.output or args.format is not None:
        return False
    isatty = getattr(sys.stdout, "isatty", None)
    return bool(isatty and isatty())


def _summary(spec: Spec, force: bool = False) -> str:
    """What `symattn derive` shows a person at a terminal: the forward pass in spec syntax, the
    gradients in matrix form, one line per check, and how to get the full document."""
    typed = spec.typed
    order = list(typed.dims)
    sizes = ", ".join(f"{k}={v}" for k, v in typed.sizes.items())
    what = "the built-in example" if spec.filename == example_path() else spec.filename
    lines = [f"Derivation of {spec.name} ({what}), in short", "",
             f"Forward pass (dims symbolic; default sizes {sizes})"]
    for role in ("input", "param", "buffer"):
        names = [n for n, i in typed.tensors.items() if i.role == role]
        if names:
            declared = ", ".join(n + (format_shape(typed.tensors[n].shape, order) if typed.tensors[n].shape else "")
                                 for n in names)
            lines.append(f"  {role} {declared}")
    lines += [f"  {definition_text(typed, n)}" for n, i in typed.tensors.items() if i.expr is not None]
    lines += [f"  output {', '.join(typed.outputs)}", "", "Backward pass (matrix form, valid for all sizes)"]
    derivation = spec.derive()
    lines += [f"  {line}" for name in derivation.gradients for line in derivation.formula(name).splitlines()]
    verdicts = spec.check(force=force)
    if verdicts:
        counts = ", ".join(f"{sum(v.verdict == kind for v in verdicts)} {kind}"
                           for kind in ("proved", "refuted", "unknown"))
        lines += ["", f"Checks ({counts}; `symattn check` says how each was settled)"]
        lines += [f"  line {v.line:<4} {v.verdict:<8} {v.claim}" for v in verdicts]
    else:
        lines += ["", "Checks: the spec states no `check`."]
    stem = Path(spec.filename).stem if spec.filename not in ("<stdin>", "<spec>") else spec.name
    source = {example_path(): "", "<stdin>": " -"}.get(spec.filename, f" {spec.filename}")
    markdown, html = f"symattn derive{source} -o {stem}.md", f"symattn derive{source} -o {stem}.html"
    width = len(html) + 4
    lines += ["", "The full document shows every rule applied, a worked example, each check's proof or",
              "counterexample, and the cost:",
              f"  {markdown:<{width}}Markdown, figures beside it",
              f"  {html:<{width}}one HTML page (or -o {stem}.tex for LaTeX)"]
    return "\n".join(lines) + "\n"


def _written_notes(filename: str, written: Spec) -> None:
    """The notes of a pass written as a spec (a generated name that had to differ), on stderr."""
    for note in written.written.notes:
        print(f"{filename}: note: {note}", file=sys.stderr)


def _cmd_derive(args: argparse.Namespace) -> int:
    target = _output_file(args.output, "document") if args.output else None
    spec = _load(args, default_example=True)
    if args.order < 1:
        raise UsageError(f"--order {args.order}: the order of a derivative is 1 or more")
    for _ in range(args.order - 1):  # order k: the backward pass written as a spec, derived, k - 1 times
        progress.step(f"writing the backward pass of {spec.name} as a spec")
        spec = spec.backward_spec()
        _written_notes(spec.filename, spec)
    fmt = _document_format(args)
    figures: dict[str, bytes] = {}
    if args.backward or args.tangent:
        if args.format is not None:
            raise UsageError("--backward and --tangent write a spec; --format applies to the document")
        progress.step(f"deriving the {'backward' if args.backward else 'tangent'} pass of {spec.name}")
        written = spec.backward_spec() if args.backward else spec.tangent_spec()
        _written_notes(spec.filename, written)
        text = written.written.text
    elif args.gradients:
        derivation = spec.derive()
        lines = [f"# Backward pass of {spec.name} (matrix form, valid for all sizes)", ""]
        text = "\n".join(lines + [derivation.formula(name) for name in derivation.gradients]) + "\n"
    elif _wants_summary(args):
        if args.format is not None:
            raise UsageError("--summary is plain text; --format applies to the document (--document or -o)")
        text = _summary(spec, force=args.force)
    else:
        from .docs.document import build, render

        # Without -o there is nowhere to put figure files: leave them out (and skip drawing them).
        doc = build(spec, force=args.force, figures=bool(args.output))
        text = render(doc, fmt)
        figures = {f.name: f.png for f in doc.figures} if fmt != "html" else {}
    if target is not None:
        _write(target, text)
        for name, png in figures.items():
            _write(target.parent / name, png)
    else:
        sys.stdout.write(text)
    return 0


def _cmd_emit(args: argparse.Namespace) -> int:
    if args.jvp and args.target != "numpy":
        raise UsageError("--jvp is for `emit numpy`; spec.torch() has forward mode through torch.func")
    spec = _load(args)
    if args.target == "cuda":
        return _emit_cuda(spec, args)
    path = None if args.output == "-" else _output_file(args.output, ".py file")  # before the work
    if args.target == "triton":
        return _emit_triton(spec, path)
    progress.step(f"deriving and generating the {'PyTorch' if args.target == 'torch' else 'NumPy'} module")
    source = spec.emit(args.target, jvp=args.jvp)
    if path is None:
        print(source, end="")
        return 0
    _write(path, source)
    print(f"wrote {path}: forward, backward{', forward_backward, jvp and hvp' if args.jvp else ' and forward_backward'} "
          f"for {spec.name}")
    return 0


def _emit_cuda(spec: Spec, args: argparse.Namespace) -> int:
    """`symattn emit cuda SPEC -o DIR`: the .cu, .h, cuda_host.h and README.md in DIR."""
    from .codegen.cuda import emit_cuda

    directory = Path(args.output)
    if directory.exists() and not directory.is_dir():
        raise UsageError(f"{directory} is a file; emit cuda writes a directory")
    progress.step("deriving and generating the kernels")
    code = emit_cuda(spec, fused=args.cuda_path != "generic")
    try:
        written = code.write(directory)
    except OSError as exc:
        raise UsageError(f"{exc.filename or directory}: cannot write: {exc.strerror or exc}") from None
    cores = ", ".join(c.output for c in code.plan.cores)
    print(f"wrote {directory}: {', '.join(p.name for p in written)} ({code.path} path"
          + (f", fused attention core {cores}" if cores else "") + ")")
    for note in code.plan.notes:
        print(f"note: {note}")
    return 0


def _emit_triton(spec: Spec, path: Path | None) -> int:
    """`symattn emit triton SPEC -o FILE.py` (None: `-o -`, standard output): the fused attention cores'
    Triton kernels and launchers."""
    code = spec.emit("triton")
    if path is None:
        print(code.text, end="")
        return 0
    _write(path, code.text)
    print(f"wrote {path}: " + ", ".join(f"{name}_forward/_backward ({core.output})"
                                        for name, core in zip(code.names, code.cores)))
    return 0


def _verify_triton(spec: Spec, args: argparse.Namespace) -> int:
    """`symattn verify SPEC --target triton`: the kernels (interpreted on the CPU without a GPU) against the reference."""
    import importlib.util

    missing = [m for m in ("torch", "triton") if importlib.util.find_spec(m) is None]
    if missing:  # (not imported here: triton fixes its interpreter mode at import)
        print(f"verify --target triton needs torch and triton ({', '.join(missing)} missing); install symattn[torch]")
        return 1
    from .check.triton import verify_triton

    report = verify_triton(spec.typed, seed=args.seed)
    print(f"verify {spec.name} ({spec.filename}), Triton kernels of the fused attention cores against the "
          "float64 reference evaluator (forward) and central finite differences of it (backward)")
    print("\n".join(report.lines()))
    return 0 if report.ok else 1


def _cmd_verify(args: argparse.Namespace) -> int:
    spec = _load(args)
    from .check.fusion import fusion_lines

    print("\n".join(fusion_lines(spec.typed)))
    if args.target == "cuda":
        return _verify_cuda(spec, args)
    if args.target == "torch":
        return _verify_torch(spec, args)
    if args.target == "triton":
        return _verify_triton(spec, args)
    from .check.numpy import verify_numpy

    report = verify_numpy(spec.typed, seed=args.seed)
    print(f"verify {spec.name} ({spec.filename}), generated NumPy code against the reference evaluator "
          "(forward) and central finite differences of it (backward), float64")
    print("\n".join(report.lines()))
    return 0 if report.ok else 1


def _verify_torch(spec: Spec, args: argparse.Namespace) -> int:
    """`symattn verify SPEC --target torch`: exit 0 when everything passes, 1 otherwise."""
    from .check.torch import verify_torch

    try:
        import torch  # noqa: F401
    except ImportError:
        raise UsageError("verify --target torch needs PyTorch: pip install 'symattn[torch]'") from None
    report = verify_torch(spec.typed, seed=args.seed)
    print(f"verify {spec.name} ({spec.filename}), generated PyTorch module (forward, and autograd through its "
          "derived backward) against the reference evaluator and central finite differences of it, float64")
    print("\n".join(report.lines()))
    return 0 if report.ok else 1


def _verify_cuda(spec: Spec, args: argparse.Namespace) -> int:
    """`symattn verify SPEC --target cuda`: exit 0 when everything passes, 1 otherwise."""
    import tempfile

    from .check.cuda import find_cxx, verify_cuda

    if find_cxx() is None:
        print("verify --target cuda needs a C++20 compiler (g++) to run the kernels on the CPU; none found")
        return 1
    cache = os.environ.get("SYMATTN_CUDA_BUILD_DIR")  # reuse builds across runs (tests set it)
    with tempfile.TemporaryDirectory(prefix="symattn-cuda-") as work:
        report = verify_cuda(spec, seed=args.seed, workdir=cache or work, out=print,
                             fused=args.cuda_path != "generic")
    return 0 if report.ok else 1


COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "show": _cmd_show,
    "derive": _cmd_derive,
    "check": _cmd_check,
    "emit": _cmd_emit,
    "verify": _cmd_verify,
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="symattn",
        description="Derive, check and compile attention from a .attn spec.",
        epilog="Exit status: 0 success, 1 a check failed, 2 a bad spec or bad usage.",
    )
    parser.add_argument("--version", action="version", version=f"symattn {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--dim", action="append", type=_dim_override, metavar="NAME=SIZE",
                        help="override a dim's default size (repeatable), e.g. --dim N=8 (default: the sizes "
                             "of the spec's dim lines)")

    def add(name: str, help_text: str, spec_optional: bool = False) -> argparse.ArgumentParser:
        p = sub.add_parser(name, parents=[common], help=help_text, description=help_text)
        if spec_optional:
            p.add_argument("spec", nargs="?", metavar="SPEC",
                           help="the .attn file (default: the built-in self-attention example)")
        else:
            p.add_argument("spec", metavar="SPEC", help="the .attn file ('-' reads standard input)")
        return p

    add("show", "Print the typed IR: every dim, every tensor with its kind and shape, every check.")
    derive = add("derive", "Derive the backward pass and write the derivation document.", spec_optional=True)
    derive.add_argument("-o", "--output", metavar="FILE",
                        help="write the document here, figures beside it (default: standard output)")
    derive.add_argument("--format", choices=("md", "html", "tex"), default=None,
                        help="document format (default: from -o's extension, .md, .html or .tex; else md); "
                             "implies --document")
    what = derive.add_mutually_exclusive_group()
    what.add_argument("--summary", action="store_true",
                      help="print a short summary: forward pass, gradients, verdicts (the default on a terminal "
                           "without -o)")
    what.add_argument("--document", action="store_true",
                      help="write the full derivation document (the default with -o, or when output is piped)")
    what.add_argument("--gradients", action="store_true",
                      help="print only the gradient formulas in spec syntax, not the whole document")
    what.add_argument("--backward", action="store_true",
                      help="write the backward pass as a spec (inputs grad_O, outputs grad_X); deriving that "
                           "spec gives the double backward")
    what.add_argument("--tangent", action="store_true",
                      help="write the forward-mode (JVP) pass as a spec (inputs tangent_X, outputs O and "
                           "tangent_O); the tangent spec of a backward spec is the Hessian-vector product")
    derive.add_argument("--order", type=int, default=1, metavar="K",
                        help="derive to order K: the backward pass written as a spec (--backward), K - 1 times, "
                             "then derived (2: the double backward, every step checked as for the first order; default: 1)")
    derive.add_argument("--force", action="store_true",
                        help="run element-level work even when the size guard says it would take minutes")
    check = add("check", "Prove or refute every `check` in the spec, one verdict a line.")
    check.add_argument("--json", action="store_true", help="print the verdicts as a JSON list (default: text)")
    check.add_argument("--explain", action="store_true",
                       help="also print each proof's recorded steps, and each derived gradient against the exact "
                            "element-level chain rule (default: one verdict and its method per check)")
    check.add_argument("--force", action="store_true",
                       help="run element-level work even when the size guard says it would take minutes")
    check.add_argument("--budget", type=_seconds, default=DEFAULT_SECONDS, metavar="SECONDS",
                       help=f"time allowed per claim; a claim over it is unknown (default {DEFAULT_SECONDS:g}; "
                            "0 means no limit)")
    emit = sub.add_parser("emit", parents=[common], help="Generate NumPy, PyTorch, CUDA or Triton code from the spec.",
                          description="Generate NumPy, PyTorch, CUDA or Triton code from the spec.")
    emit.add_argument("target", choices=("numpy", "torch", "cuda", "triton"), help="what to generate")
    emit.add_argument("spec", metavar="SPEC", help="the .attn file")
    emit.add_argument("-o", "--output", metavar="PATH", required=True,
                      help="FILE.py for numpy, torch and triton ('-': standard output), a directory for cuda")
    emit.add_argument("--jvp", action="store_true",
                      help="numpy: also jvp(..., tangent_X=...) and hvp(..., grad_O=..., tangent_X=...), forward "
                           "mode and Hessian-vector products from the passes written as specs")
    emit.add_argument("--cuda-path", choices=("auto", "generic"), default="auto",
                      help="cuda: fuse softmax(score(Q @ K.T)) @ V cores when the spec has them (auto), or never "
                           "(generic) (default auto)")
    verify = add("verify", "Run generated code against the reference evaluator and finite differences.")
    verify.add_argument("--target", choices=("numpy", "torch", "cuda", "triton"), default="numpy",
                        help="which generated code to run: the NumPy module, the PyTorch module, the CUDA kernels "
                             "(on the CPU, and the nvcc gate where nvcc is installed) or the Triton kernels "
                             "(default numpy)")
    verify.add_argument("--seed", type=int, default=0, help="seed of the random inputs (default 0)")
    verify.add_argument("--cuda-path", choices=("auto", "generic"), default="auto",
                        help="cuda: fuse softmax(score(Q @ K.T)) @ V cores when the spec has them (auto), or never "
                             "(generic) (default auto)")
    return parser


def _title(args: argparse.Namespace) -> str:
    """`derive causal`, `emit cuda causal`: the command and the spec, for the progress line."""
    spec = getattr(args, "spec", None)
    stem = "self_attention" if spec is None else ("stdin" if spec == "-" else Path(spec).stem)
    target = f" {args.target}" if args.command == "emit" else ""
    return f"{args.command}{target} {stem}"


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        with progress.task(_title(args)):  # a progress line on stderr when it is a terminal
            return COMMANDS[args.command](args)
    except SpecError as err:
        print(err, file=sys.stderr)
        return 2
    except UsageError as err:
        print(f"symattn {args.command}: error: {err}", file=sys.stderr)
        return 2
    except SymAttnError as err:
        print(f"symattn {args.command}: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("symattn: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `symattn check ... | head`: the reader left; say nothing more
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 141
    except Exception as err:  # a bug in symattn, not the user's mistake: say so without a traceback
        if os.environ.get("SYMATTN_DEBUG"):
            raise
        print(f"symattn {args.command}: internal error: {type(err).__name__}: {err}\n"
              "this is a bug in symattn; rerun with SYMATTN_DEBUG=1 for the traceback and report it",
              file=sys.stderr)
        return 3


def run() -> None:
    """The `symattn` command: `main`, then the process ends without tearing the interpreter down.

    A document leaves hundreds of thousands of SymPy objects in SymPy's caches and ours; freeing
    them one by one at exit is a noticeable share of a short command and does nothing a user can
    see. So the exit handlers run (logging's flush, multiprocessing's reaping of children, those
    of torch or triton when a target loaded them), the standard streams are flushed, and the
    process leaves with `os._exit`. Where CPython's exit handler runner is missing, it ends
    the ordinary way."""
    import atexit

    code = main()
    run_handlers = getattr(atexit, "_run_exitfuncs", None)
    if run_handlers is None:
        raise SystemExit(code)
    try:
        sys.stdout.flush()
    except BrokenPipeError:  # the reader left: as in `main`, say nothing more
        code = 141
    run_handlers()
    try:
        sys.stderr.flush()
    except OSError:
        pass
    os._exit(code)
