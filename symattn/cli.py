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

from . import __version__, progress
from .api import Spec, example_path, example_text, load
from .budget import DEFAULT_SECONDS
from .codegen_numpy import emit_command
from .verify import verify_command
from .errors import SpecError, SymAttnError, UsageError

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
    # Always a path: a SPEC that names no file must say so, not be parsed as spec text.
    return load(Path(args.spec) if args.spec != "-" else sys.stdin.read(), dims=dims,
                filename=None if args.spec != "-" else "<stdin>")


def _cmd_show(args: argparse.Namespace) -> int:
    sys.stdout.write(_load(args).show())
    return 0


def _compact(value) -> str:
    text = json.dumps(value)
    return text if len(text) <= 400 else text[:397] + "..."


def _cmd_check(args: argparse.Namespace) -> int:
    spec = _load(args)
    verdicts = spec.check(force=args.force, budget=args.budget)
    if args.json:  # strict JSON: non-finite numbers are written as strings by to_json
        print(json.dumps([v.to_json() for v in verdicts], indent=2, allow_nan=False))
    else:
        for v in verdicts:
            print(f"{spec.filename}:{v.line}: {v.verdict}: {v.claim}")
            print(f"    {v.method}")
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
    return 0 if all(v.holds for v in verdicts) else 1


def _cmd_derive(args: argparse.Namespace) -> int:
    spec = _load(args, default_example=True)
    if args.gradients:
        derivation = spec.derive()
        lines = [f"# Backward pass of {spec.name} (matrix form, valid for all sizes)", ""]
        text = "\n".join(lines + [derivation.formula(name) for name in derivation.gradients]) + "\n"
        figures: dict[str, bytes] = {}
    else:
        from .document import build, render

        doc = build(spec, force=args.force)
        if not args.output:  # nowhere to put figure files: leave them out of the text
            doc.blocks = [b for b in doc.blocks if b not in doc.figures]
        text = render(doc, args.format)
        figures = {f.name: f.png for f in doc.figures} if args.format != "html" else {}
    if args.output:
        target = Path(args.output)
        target.write_text(text, encoding="utf-8")
        for name, png in figures.items():
            (target.parent / name).write_bytes(png)
    else:
        sys.stdout.write(text)
    return 0


def _cmd_emit(args: argparse.Namespace) -> int:
    if args.target == "cuda":
        from .cuda import emit_command as emit_cuda_command

        return emit_cuda_command(args)
    return emit_command(args)


def _cmd_verify(args: argparse.Namespace) -> int:
    if args.target == "cuda":
        from .verify_cuda import verify_command as verify_cuda_command

        return verify_cuda_command(args)
    return verify_command(args)


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
                        help="override a dim's default size (repeatable), e.g. --dim N=8")

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
    derive.add_argument("-o", "--output", metavar="FILE", help="write the document here (default: stdout)")
    derive.add_argument("--format", choices=("md", "html", "tex"), default="md", help="document format")
    derive.add_argument("--gradients", action="store_true",
                        help="print only the gradient formulas in spec syntax, not the whole document")
    derive.add_argument("--force", action="store_true",
                        help="run element-level work even when the size guard says it would take minutes")
    check = add("check", "Prove or refute every `check` in the spec, one verdict a line.")
    check.add_argument("--json", action="store_true", help="print the verdicts as a JSON list")
    check.add_argument("--force", action="store_true",
                       help="run element-level work even when the size guard says it would take minutes")
    check.add_argument("--budget", type=_seconds, default=DEFAULT_SECONDS, metavar="SECONDS",
                       help=f"time allowed per claim; a claim over it is unknown (default {DEFAULT_SECONDS:g}; "
                            "0 means no limit)")
    emit = sub.add_parser("emit", parents=[common], help="Generate NumPy or CUDA code from the spec.",
                          description="Generate NumPy or CUDA code from the spec.")
    emit.add_argument("target", choices=("numpy", "cuda"), help="what to generate")
    emit.add_argument("spec", metavar="SPEC", help="the .attn file")
    emit.add_argument("-o", "--output", metavar="PATH", required=True,
                      help="FILE.py for numpy ('-': standard output), a directory for cuda")
    emit.add_argument("--cuda-path", choices=("auto", "generic"), default="auto",
                      help="cuda: fuse softmax(score(Q @ K.T)) @ V cores when the spec has them (auto), or never")
    verify = add("verify", "Run generated code against the reference evaluator and finite differences.")
    verify.add_argument("--target", choices=("numpy", "cuda"), default="numpy")
    verify.add_argument("--seed", type=int, default=0, help="seed of the random inputs (default 0)")
    verify.add_argument("--cuda-path", choices=("auto", "generic"), default="auto",
                        help="cuda: fuse softmax(score(Q @ K.T)) @ V cores when the spec has them (auto), or never")
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
    except Exception as err:  # a bug in symattn, not the user's mistake: say so without a traceback
        if os.environ.get("SYMATTN_DEBUG"):
            raise
        print(f"symattn {args.command}: internal error: {type(err).__name__}: {err}\n"
              "this is a bug in symattn; rerun with SYMATTN_DEBUG=1 for the traceback and report it",
              file=sys.stderr)
        return 3
