"""How long `symattn check` takes on every spec in derivations/ and on adversarial stacks.

    python benchmarks/bench_check.py [--repeat K]

Goals: every claim answered within its time budget (5 s by default, issue 10);
`check` of every derivations/ spec within 2 s including start-up (issue 26),
the cache on disk off (`SYMATTN_NO_CACHE=1`: cold, as a first run); a 4-layer
softmax stack in under 30 s. Each spec is checked in a fresh interpreter
(`python -m symattn check`), as a user runs it, so imports and parsing are
included; each row is the median of K runs (default 3) of the wall time and of
the child's CPU time (user + sys, which a shared machine's load inflates less
than the wall time), with the verdict counts. A baseline in the same run:
`python -c "import symattn.cli"` (the interpreter and import cost every command
pays); the load average is printed before and after.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

STACK = """\
attention stack4
dim N = 4, d = 4
input X[N, d]
param W1[d, d], W2[d, d], W3[d, d], W4[d, d]
P1 = softmax(X @ W1 @ X.T, axis=-1)
H1 = P1 @ X
P2 = softmax(H1 @ W2 @ H1.T, axis=-1)
H2 = P2 @ H1
P3 = softmax(H2 @ W3 @ H2.T, axis=-1)
H3 = P3 @ H2
P4 = softmax(H3 @ W4 @ H3.T, axis=-1)
O = P4 @ H3
output O
check grad(W1) == X.T @ grad(P1) @ X
check grad(W1) == X.T @ (P1 * (grad(P1) - sum(grad(P1) * P1, axis=-1))) @ X
check sum(P4, axis=-1) == ones(N, 1)
check grad(X) == grad(X) + 0 * X
check grad(H1) @ H1.T == (grad(H1) @ H1.T) * 1
"""


def timed(args: list[str]) -> tuple[float, float, str]:
    """(wall s, child CPU s, stdout) of `python ARGS` with the cache on disk off."""
    env = {**os.environ, "SYMATTN_NO_CACHE": "1"}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, *args], capture_output=True, text=True, cwd=REPO, env=env)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, proc.stdout


def median_of(runs: int, args: list[str]) -> tuple[float, float, str]:
    results = [timed(args) for _ in range(runs)]
    return (statistics.median(r[0] for r in results), statistics.median(r[1] for r in results), results[-1][2])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3, help="runs per spec; the median is reported")
    runs = parser.parse_args().repeat
    load_before = os.getloadavg()[0]
    base, base_cpu, _ = median_of(runs, ["-c", "import symattn.cli"])
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        stack = Path(tmp) / "stack4.attn"
        stack.write_text(STACK)
        for spec in [*sorted((REPO / "derivations").glob("*.attn")), stack]:
            wall, cpu, out = median_of(runs, ["-m", "symattn", "check", str(spec)])
            counts = Counter(line.split(": ")[1] for line in out.splitlines()
                             if not line.startswith(" ") and ": " in line and line.split(": ")[1]
                             in ("proved", "refuted", "unknown"))
            rows.append((spec.stem, wall, cpu, counts))
    from machine import describe

    print(describe())
    print(f"load average {load_before:.1f} before, {os.getloadavg()[0]:.1f} after; median of {runs} cold runs")
    print(f"baseline `import symattn.cli` in a fresh interpreter: {base:.2f} s wall, {base_cpu:.2f} s CPU\n")
    print("| spec | `symattn check` wall s | CPU s | x baseline (wall) | verdicts |")
    print("| --- | ---: | ---: | ---: | --- |")
    for name, wall, cpu, counts in rows:
        verdicts = ", ".join(f"{n} {k}" for k, n in sorted(counts.items()))
        print(f"| {name} | {wall:.2f} | {cpu:.2f} | {wall / base:.1f} | {verdicts} |")


if __name__ == "__main__":
    main()
