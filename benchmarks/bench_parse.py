"""How long parsing and validating the example specs takes.

    python benchmarks/bench_parse.py [--repeat 50] [--markdown] [SPEC ...]

Prints one row per spec (median over repeats, after one warm-up) and a row for
all specs together; then the cold time of the very first parse in a fresh
interpreter, which includes building the LALR parser from the grammar. Reading
the files is not timed. The goal is well under 100 ms for all specs together.
With --markdown, the table of BENCHMARKS.md ("Parsing"), with where and when it was measured.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from symattn.api import read_spec_file  # noqa: E402
from symattn.front.parse import parse  # noqa: E402
from symattn.front.validate import validate  # noqa: E402

COLD = """
import time, sys
sys.path.insert(0, {repo!r})
from symattn.front.parse import parse
from symattn.front.validate import validate
texts = {texts!r}
start = time.perf_counter()
for name, text in texts:
    validate(parse(text, name), name, text)
print(time.perf_counter() - start)
"""


def load_all(texts: list[tuple[str, str]]) -> None:
    for name, text in texts:
        validate(parse(text, name), name, text)


def median_ms(fn, repeat: int) -> tuple[float, float]:
    """Median wall-clock and CPU milliseconds (CPU time is steadier on a busy machine)."""
    fn()  # warm-up: builds the parser, fills caches
    wall, cpu = [], []
    for _ in range(repeat):
        start, start_cpu = time.perf_counter(), time.process_time()
        fn()
        wall.append(time.perf_counter() - start)
        cpu.append(time.process_time() - start_cpu)
    return statistics.median(wall) * 1000, statistics.median(cpu) * 1000


def cold_ms(texts: list[tuple[str, str]], runs: int) -> float:
    """First parse in a fresh interpreter (imports excluded, grammar construction included)."""
    times = []
    for _ in range(runs):
        out = subprocess.run([sys.executable, "-c", COLD.format(repo=str(REPO), texts=texts)],
                             capture_output=True, text=True, check=True)
        times.append(float(out.stdout))
    return statistics.median(times) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("specs", nargs="*", type=Path, help="spec files (default: derivations/*.attn)")
    parser.add_argument("--repeat", type=int, default=50, help="timed repeats per row (default 50)")
    parser.add_argument("--cold-runs", type=int, default=5, help="fresh interpreters for the cold row (default 5)")
    parser.add_argument("--markdown", action="store_true", help="print the table of BENCHMARKS.md")
    args = parser.parse_args()
    paths = args.specs or sorted((REPO / "derivations").glob("*.attn"))
    texts = [(str(p.relative_to(REPO) if p.is_relative_to(REPO) else p), read_spec_file(p)) for p in paths]

    rows = []
    for name, text in texts:
        lines = text.count("\n")
        rows.append((Path(name).name, lines, median_ms(lambda: load_all([(name, text)]), args.repeat)))
    total_lines = sum(r[1] for r in rows)
    together = median_ms(lambda: load_all(texts), args.repeat)
    cold = cold_ms(texts, args.cold_runs)

    if args.markdown:
        from machine import describe, table

        print(describe())
        print()
        print(table(["specs", "lines", "warm: wall ms", "warm: CPU ms", "warm CPU / goal (100 ms)", "cold: wall ms"],
                    [[f"all {len(rows)} together", total_lines, f"{together[0]:.1f}", f"{together[1]:.1f}",
                      f"{together[1] / 100:.2f}", f"{cold:.1f}"],
                     *[[name, lines, f"{wall:.2f}", f"{cpu:.2f}", "", ""] for name, lines, (wall, cpu) in
                       sorted(rows, key=lambda r: -r[2][1])[:3]]], right={1, 2, 3, 4, 5}))
        print(f"\n(The three slowest specs below the total. Warm: median of {args.repeat} after a warm-up; cold: "
              f"median of {args.cold_runs} fresh interpreters, the LALR parser built from the grammar included, "
              "imports not.)")
        return
    print(f"{'spec':<24} {'lines':>5} {'wall ms':>9} {'cpu ms':>9}")
    for name, lines, (wall, cpu) in rows:
        print(f"{name:<24} {lines:>5} {wall:>9.2f} {cpu:>9.2f}")
    print(f"{'all together (warm)':<24} {total_lines:>5} {together[0]:>9.2f} {together[1]:>9.2f}")
    print(f"{'all together (cold)':<24} {total_lines:>5} {cold:>9.2f} {'':>9}")
    print(f"\nmedian of {args.repeat} repeats after one warm-up; cold: median of {args.cold_runs} fresh "
          "interpreters, first parse including grammar construction, imports excluded")


if __name__ == "__main__":
    main()
