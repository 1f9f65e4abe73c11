"""How long the equivariance / invariance claims of the example specs take.

    python benchmarks/bench_equivariance.py [--repeat 200] [--dim N=8] [--markdown] [SPEC ...]

For every `equivariant(...)` / `invariant(...)` check in each spec (the claim
itself, without `not`), one row:

- proof ms: the general-N matrix-level proof, `prove_symmetry` (median of
  `--repeat` calls, after one warm-up). Goal: < 0.5 s per spec.
- witness s: the fixed-size element witness at the spec's sizes,
  `element_witness` (exact identity for a transposition and an n-cycle).
  "cold" is the first call in a fresh interpreter (imports and parsing
  excluded, SymPy's caches empty), the number a user of `symattn check` sees;
  "warm" is the median of 3 further calls in that interpreter. Goal: < 2 s.
  For a refuted claim the witness is timed too (it answers "not an identity").
- counterexample ms: `find_counterexample` for claims whose proof fails.
- check s: `check_symmetry` end to end (proof, then witness or counterexample),
  cold, in another fresh interpreter.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import symattn  # noqa: E402
from symattn.prove.equivariance import check_symmetry, prove_symmetry  # noqa: E402
from symattn.prove.symmetry_evidence import element_witness, find_counterexample  # noqa: E402


def claims(spec):
    return [c for c in spec.typed.checks if c.kind in ("equivariant", "invariant")]


def one(path: str, index: int, dims: dict, what: str, repeat: int) -> dict:
    """Time one claim in this (fresh) interpreter; `what` is 'witness' or 'check'."""
    spec = symattn.load(path, dims=dims or None)
    typed = spec.typed
    c = claims(spec)[index]
    args = (typed, c.output, c.sources, c.dim, c.kind == "invariant")
    if what == "check":
        start = time.perf_counter()
        verdict = check_symmetry(typed, c)
        return {"check_s": time.perf_counter() - start, "verdict": verdict.verdict}
    start = time.perf_counter()
    witness, how = element_witness(*args)
    cold = time.perf_counter() - start
    warm = []
    for _ in range(3):
        start = time.perf_counter()
        element_witness(*args)
        warm.append(time.perf_counter() - start)
    proof = prove_symmetry(*args)
    prove_symmetry(*args)  # warm-up
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        prove_symmetry(*args)
        times.append(time.perf_counter() - start)
    counter_ms = None
    if not proof.holds:
        start = time.perf_counter()
        find_counterexample(*args)
        counter_ms = (time.perf_counter() - start) * 1000
    return {"proof_ms": statistics.median(times) * 1000, "steps": len(proof.steps), "holds": proof.holds,
            "witness": witness, "witness_cold_s": cold, "witness_warm_s": statistics.median(warm),
            "counter_ms": counter_ms}


def fresh(path: str, index: int, dims: dict, what: str, repeat: int) -> dict:
    cmd = [sys.executable, __file__, "--one", path, str(index), what, "--repeat", str(repeat)]
    for k, v in dims.items():
        cmd += ["--dim", f"{k}={v}"]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("specs", nargs="*", help="spec files (default: derivations/*.attn)")
    parser.add_argument("--repeat", type=int, default=200, help="timed repeats of the proof (default 200)")
    parser.add_argument("--dim", action="append", default=[], help="override a size, e.g. N=8")
    parser.add_argument("--markdown", action="store_true", help="print the table of BENCHMARKS.md")
    parser.add_argument("--one", nargs=3, metavar=("SPEC", "INDEX", "WHAT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    dims = {k: int(v) for k, v in (d.split("=", 1) for d in args.dim)}
    if args.one:
        path, index, what = args.one
        print(json.dumps(one(path, int(index), dims, what, args.repeat)))
        return

    paths = args.specs or [str(p.relative_to(REPO)) for p in sorted((REPO / "derivations").glob("*.attn"))]
    head = (f"{'spec':<22} {'claim':<24} {'sizes':<22} {'verdict':<8} {'steps':>5} {'proof ms':>9} "
            f"{'witness cold s':>14} {'warm s':>7} {'cex ms':>7} {'check s':>8}")
    rows = []
    if not args.markdown:
        print(head)
    worst_proof = worst_witness = 0.0
    for path in paths:
        spec = symattn.load(REPO / path if not Path(path).is_absolute() else path, dims=dims or None)
        sizes = ",".join(f"{k}={v}" for k, v in spec.dims.items())
        for index, c in enumerate(claims(spec)):
            full = str(REPO / path) if not Path(path).is_absolute() else path
            w = fresh(full, index, dims, "witness", args.repeat)
            k = fresh(full, index, dims, "check", args.repeat)
            group = c.sources[0] if len(c.sources) == 1 else f"({', '.join(c.sources)})"
            claim = f"{c.kind}({c.output}, {group})"
            witness = {True: "", False: " (no)", None: " (skip)"}[w["witness"]]
            cex = f"{w['counter_ms']:.1f}" if w["counter_ms"] is not None else "-"
            rows.append([Path(path).stem, f"`{claim}`", k["verdict"], f"{w['proof_ms']:.2f}",
                         f"{w['witness_cold_s']:.2f}{witness}", cex, f"{k['check_s']:.2f}"])
            if not args.markdown:
                print(f"{Path(path).stem:<22} {claim:<24} {sizes:<22} {k['verdict']:<8} {w['steps']:>5} "
                      f"{w['proof_ms']:>9.3f} {w['witness_cold_s']:>9.2f}{witness:<5} {w['witness_warm_s']:>7.2f} "
                      f"{cex:>7} {k['check_s']:>8.2f}")
            worst_proof = max(worst_proof, w["proof_ms"])
            if w["witness"]:
                worst_witness = max(worst_witness, w["witness_cold_s"])
    if args.markdown:
        from machine import describe, table

        print(describe())
        print()
        print(table(["spec", "claim", "verdict", "proof ms", "witness s (cold)", "counterexample ms", "check s (cold)"],
                    rows, right={3, 4, 5, 6}))
        print(f"\nSlowest proof {worst_proof:.2f} ms ({worst_proof / 500:.4f} of the 500 ms goal); slowest witness "
              f"of a proved claim {worst_witness:.2f} s ({worst_witness / 2:.2f} of the 2 s goal). Proof: median of "
              f"{args.repeat} after a warm-up; witness and check: the first call in a fresh interpreter; "
              "(no): the witness is not an identity, (skip): not run.")
        return
    print(f"\nslowest proof {worst_proof:.3f} ms (goal < 500 ms); slowest witness of a proved claim, cold, "
          f"{worst_witness:.2f} s (goal < 2 s)")
    print(f"proof: median of {args.repeat} after a warm-up; witness cold: first call in a fresh interpreter; "
          "warm: median of 3 more; check: check_symmetry end to end, cold")


if __name__ == "__main__":
    main()
