"""Golden copies of generated code: `python -m symattn.golden` rewrites them, `--check` compares.

Contract: `GOLDEN` names the specs whose generated NumPy module is kept in
`tests/golden/` (self-attention, the benchmarked case, and additive attention,
whose index notation exercises the vectoriser), so that every change to
generated code shows up in review. `main([])` writes every golden file that
is out of date; `main(["--check"])` writes nothing and exits 1 listing them.
`python -m symattn.regenerate` runs this too, after the documents.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .api import load

__all__ = ["GOLDEN", "golden_files", "main"]

GOLDEN = ("self_attention", "additive")  # derivations/NAME.attn -> tests/golden/NAME.py
COMMAND = "python -m symattn.golden"


def golden_files(root: Path) -> dict[Path, str]:
    """Each golden file's path and the text it should have now."""
    out = {}
    for name in GOLDEN:
        spec = load(root / "derivations" / f"{name}.attn", filename=f"derivations/{name}.attn")
        out[root / "tests" / "golden" / f"{name}.py"] = spec.emit("numpy")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=COMMAND, description=__doc__.splitlines()[0])
    parser.add_argument("--root", default=None, help="the repository root (default: the one holding this package)")
    parser.add_argument("--check", action="store_true", help="only report golden files that are out of date")
    args = parser.parse_args(argv)
    root = Path(args.root) if args.root else Path(__file__).resolve().parent.parent
    if not (root / "derivations").is_dir():
        print(f"{COMMAND}: {root} has no derivations/ folder; pass --root REPO", file=sys.stderr)
        return 2
    stale = []
    for path, text in golden_files(root).items():
        if path.exists() and path.read_text(encoding="utf-8") == text:
            continue
        stale.append(path)
        if not args.check:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
    for path in stale:
        shown = path.relative_to(root) if path.is_relative_to(root) else path
        print(f"{'out of date' if args.check else 'wrote'}: {shown}")
    return 1 if (args.check and stale) else 0


if __name__ == "__main__":
    sys.exit(main())
