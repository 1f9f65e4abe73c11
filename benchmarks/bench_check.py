"""How long `symattn check` takes on every spec in derivations/ and on adversarial stacks.

    python benchmarks/bench_check.py

Goal (issue 10): every claim answered within its time budget (5 s by default),
and `check` on any derivations/ spec and on a 4-layer softmax stack in under
30 s. Each spec is checked in a fresh interpreter (`python -m symattn check`),
as a user runs it, so imports and parsing are included; the verdict counts are
printed beside the time. A baseline in the same run: `python -c "import
symattn"` (the interpreter and import cost every command pays).
"""

from __future__ import annotations

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


def timed(args: list[str]) -> tuple[float, str]:
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, *args], capture_output=True, text=True, cwd=REPO)
    return time.perf_counter() - start, proc.stdout


def main() -> None:
    base, _ = timed(["-c", "import symattn.cli"])
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        stack = Path(tmp) / "stack4.attn"
        stack.write_text(STACK)
        for spec in [*sorted((REPO / "derivations").glob("*.attn")), stack]:
            seconds, out = timed(["-m", "symattn", "check", str(spec)])
            counts = Counter(line.split(": ")[1] for line in out.splitlines()
                             if not line.startswith(" ") and ": " in line and line.split(": ")[1]
                             in ("proved", "refuted", "unknown"))
            rows.append((spec.stem, seconds, counts))
    from machine import describe

    print(describe())
    print(f"\nbaseline `import symattn.cli` in a fresh interpreter: {base:.2f} s\n")
    print("| spec | `symattn check` wall s | x baseline | verdicts |")
    print("| --- | ---: | ---: | --- |")
    for name, seconds, counts in rows:
        verdicts = ", ".join(f"{n} {k}" for k, n in sorted(counts.items()))
        print(f"| {name} | {seconds:.2f} | {seconds / base:.1f} | {verdicts} |")


if __name__ == "__main__":
    main()
