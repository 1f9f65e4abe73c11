"""How long the matrix-level prover takes on the `A == B` claims of the example specs.

    python benchmarks/bench_canonical.py [--repeat 5] [--markdown] [SPEC ...]

For each spec (default: derivations/self_attention.attn) prints the number of
`check A == B` claims, how many `prove_equal` proves, the time of the first
pass over them (cold: the prover's caches empty) and the median time of a
further pass (warm). Deriving the gradients and collecting the definitions is
done once per spec before the clock starts. With --markdown, the table of BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import symattn  # noqa: E402
from symattn.prove.canonical import definitions_for, prove_equal  # noqa: E402
from symattn.symbolic.derive import derive  # noqa: E402


def timed_pass(checks, spec, defs) -> tuple[float, list]:
    start = time.perf_counter()
    proofs = [prove_equal(c.lhs, c.rhs, spec, defs) for c in checks]
    return time.perf_counter() - start, proofs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("specs", nargs="*", type=Path, help="spec files (default: derivations/self_attention.attn)")
    parser.add_argument("--repeat", type=int, default=5, help="warm passes per spec (default 5)")
    parser.add_argument("--markdown", action="store_true", help="print the table of BENCHMARKS.md")
    args = parser.parse_args()
    paths = args.specs or [REPO / "derivations" / "self_attention.attn"]

    if args.markdown:
        from machine import describe, table

        rows = []
        for path in paths:
            spec = symattn.load(path).typed
            defs = definitions_for(spec, derive(spec))
            checks = [c for c in spec.checks if c.kind == "equal"]
            cold, proofs = timed_pass(checks, spec, defs)
            warm = statistics.median(timed_pass(checks, spec, defs)[0] for _ in range(args.repeat))
            rows.append([path.stem, len(checks), sum(p is not None for p in proofs), f"{cold * 1000:.1f}",
                         f"{warm * 1000:.1f}"])
        print(describe())
        print()
        print(table(["spec", "`A == B` claims", "proved", "first pass ms", "warm pass ms"], rows,
                    right={1, 2, 3, 4}))
        print(f"\n(First pass: the prover's caches empty; warm: median of {args.repeat} further passes.)")
        return
    print(f"{'spec':<24} {'claims':>6} {'proved':>6} {'cold ms':>9} {'warm ms':>9}")
    for path in paths:
        spec = symattn.load(path).typed
        defs = definitions_for(spec, derive(spec))
        checks = [c for c in spec.checks if c.kind == "equal"]
        cold, proofs = timed_pass(checks, spec, defs)
        warm = statistics.median(timed_pass(checks, spec, defs)[0] for _ in range(args.repeat))
        proved = sum(p is not None for p in proofs)
        print(f"{path.name:<24} {len(checks):>6} {proved:>6} {cold * 1000:>9.1f} {warm * 1000:>9.1f}")
    print(f"\ncold: the first pass over a spec's claims; warm: median of {args.repeat} further passes")


if __name__ == "__main__":
    main()
