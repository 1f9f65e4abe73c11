"""Regenerate every generated file in the repository: `python -m symattn.regenerate`.

Contract: for each spec in `derivations/`, writes its derivation document in
Markdown, HTML and LaTeX beside it (with figure PNGs when matplotlib is
installed), then runs the golden-code generator when it is present. With
`--check`, writes nothing and exits 1 listing the files that are out of date.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from . import golden
from .api import load
from .docs.document import build, render

__all__ = ["generated_files", "main"]

FORMATS = ("md", "html", "tex")


def generated_files(root: Path) -> dict[Path, bytes]:
    """Every document and figure, keyed by the path it belongs at."""
    out: dict[Path, bytes] = {}
    for spec_path in sorted((root / "derivations").glob("*.attn")):
        spec = load(spec_path, filename=f"derivations/{spec_path.name}")
        doc = build(spec)
        for fmt in FORMATS:
            out[spec_path.with_suffix(f".{fmt}")] = render(doc, fmt).encode("utf-8")
        for figure in doc.figures:
            out[spec_path.parent / figure.name] = figure.png
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m symattn.regenerate", description=__doc__.splitlines()[0])
    parser.add_argument("--root", default=".", help="the repository root (default: the current directory)")
    parser.add_argument("--check", action="store_true", help="only report files that are out of date")
    args = parser.parse_args(argv)
    root = Path(args.root)
    stale = []
    for path, data in generated_files(root).items():
        if path.exists() and path.read_bytes() == data:
            continue
        stale.append(path)
        if not args.check:
            path.write_bytes(data)
    code = golden.main((["--check"] if args.check else []) + ["--root", str(root)])
    if code:
        return code
    for path in stale:
        print(f"{'out of date' if args.check else 'wrote'}: {path}")
    return 1 if (args.check and stale) else 0


if __name__ == "__main__":
    sys.exit(main())
