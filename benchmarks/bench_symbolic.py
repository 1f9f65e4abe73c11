"""Benchmark the symbolic engine against a naive SymPy baseline, in one run.

    python benchmarks/bench_symbolic.py            # the table in BENCHMARKS.md
    python benchmarks/bench_symbolic.py --quick    # fewer repeats, smaller caps

(a) `derive`: every matrix-level gradient of each spec in derivations/, dims
    symbolic. Goal: < 0.2 s per spec.
(b) `verify_gradients` of self_attention at N = d = d_k = 4: every gradient
    checked exactly against the element-level chain rule. Goal: < 2 s.
(c) the same at N = d = d_k = 8, with force. Goal: < 10 s.

The naive baseline, on the same spec and sizes: every output entry written in
the inputs and params (SymPy entries composed op by op, no intermediate
symbols), L = sum(O * grad(O)), then `sympy.diff(L, x)` for each entry x of
X. That computes grad(X) alone and checks nothing; it runs in a child
process with a time cap, and a capped run is reported as "> cap".

Timings are wall-clock seconds from a fresh `symattn.load` (parsing
included, imports not), median of the repeats where there are several.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import platform
import resource
import statistics
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402
import sympy  # noqa: E402

import symattn  # noqa: E402
from symattn.symbolic.derive import derive  # noqa: E402
from symattn.symbolic.element import symbol_name  # noqa: E402
from symattn.symbolic.evaluate import SYMBOLIC, Evaluator  # noqa: E402

DERIVATIONS = REPO / "derivations"
SELF_ATTENTION = DERIVATIONS / "self_attention.attn"


# --- the naive baseline ------------------------------------------------------------------


def naive_grad(path: str, dims: dict | None, tensor: str, cap: int, queue) -> None:
    """Child process: expand L to the leaves, then sympy.diff per entry of `tensor`.

    The cap is on CPU time (RLIMIT_CPU: the kernel stops the child), so a busy
    machine does not shrink it.
    """
    resource.setrlimit(resource.RLIMIT_CPU, (cap, cap + 5))
    start = time.perf_counter()
    cpu = time.process_time()
    spec = symattn.load(path, dims=dims).typed
    leaves = {}
    for name in spec.leaves:
        shape = spec.concrete_shape(spec.tensors[name].shape)
        arr = np.empty(shape, dtype=object)
        for index in np.ndindex(*shape):
            arr[index] = sympy.Symbol(symbol_name(name, index), real=True)
        leaves[name] = arr
    ev = Evaluator(spec, SYMBOLIC)
    values = ev.run(leaves)
    loss = sympy.Integer(0)
    for out in spec.outputs:
        entries = np.asarray(values[out], dtype=object)
        for index in np.ndindex(*entries.shape):
            bar = sympy.Symbol(symbol_name(out, index, grad=True), real=True)
            loss += entries[index] * bar
    built = time.process_time() - cpu
    targets = spec.leaves if tensor == "*" else (tensor,)
    count = 0
    for name in targets:
        for sym in leaves[name].flat:
            sympy.diff(loss, sym)
            count += 1
    queue.put((built, time.process_time() - cpu, time.perf_counter() - start, count))


def run_naive(path: Path, dims: dict | None, tensor: str, cap: int) -> str:
    """'CPU s (wall s)' of the naive baseline, or '> cap' when the CPU cap stopped it."""
    ctx = mp.get_context("fork")
    queue = ctx.Queue()
    child = ctx.Process(target=naive_grad, args=(str(path), dims, tensor, cap, queue))
    child.start()
    child.join(20 * cap)  # a wall-clock backstop only; the CPU limit normally ends it
    if child.is_alive():
        child.terminate()
        child.join()
    if queue.empty():
        return f"> {cap} cpu (capped)"
    built, cpu, wall, count = queue.get()
    return f"{cpu:.2f} cpu ({wall:.2f} wall; {count} entries, building L {built:.2f})"


# --- symattn -------------------------------------------------------------------------------


def timed(work):
    """(result, wall s, cpu s) of one call."""
    wall, cpu = time.perf_counter(), time.process_time()
    result = work()
    return result, time.perf_counter() - wall, time.process_time() - cpu


def time_derive(path: Path, repeats: int):
    """first (wall, cpu), median of the rest (wall, cpu), number of gradients."""
    runs = [timed(lambda: derive(symattn.load(path).typed)) for _ in range(repeats + 1)]
    rest = runs[1:]
    median = (statistics.median(r[1] for r in rest), statistics.median(r[2] for r in rest))
    return runs[0][1:], median, len(runs[0][0].gradients)


def time_verify(path: Path, dims: dict, force: bool, repeats: int):
    """median (wall, cpu), every (wall, cpu), the checks."""
    runs = [timed(lambda: symattn.load(path, dims=dims).verify_gradients(force=force)) for _ in range(repeats)]
    median = (statistics.median(r[1] for r in runs), statistics.median(r[2] for r in runs))
    return median, [r[1:] for r in runs], runs[-1][0]


def _load() -> str:
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "unknown"


def _pair(wall_cpu) -> str:
    wall, cpu = wall_cpu
    return f"{wall:.3f} | {cpu:.3f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repeats and smaller caps")
    args = parser.parse_args()
    repeats = 2 if args.quick else 5
    cap_small, cap_big = (20, 20) if args.quick else (120, 60)

    print("# symattn symbolic engine benchmark")
    print(f"date: {datetime.now(timezone.utc).strftime('%a %b %d %H:%M:%S UTC %Y')}")
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, {platform.platform()}")
    print(f"python {platform.python_version()}, sympy {sympy.__version__}, numpy {np.__version__}")
    print(f"command: python benchmarks/bench_symbolic.py{' --quick' if args.quick else ''}")
    print(f"load average at start: {_load()}")
    print()

    print("## (a) derive: every matrix-level gradient, dims symbolic (goal < 0.2 s per spec)")
    print()
    symattn.load(SELF_ATTENTION)  # build the parser once, so 'first' times the derivation, not lark
    print("| spec | gradients | first wall s | first cpu s | median wall s | median cpu s "
          "| naive SymPy: grad of the first input alone, default sizes |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | --- |")
    for path in sorted(DERIVATIONS.glob("*.attn")):
        first, median, count = time_derive(path, repeats)
        first_input = symattn.load(path).typed.inputs[0]
        naive = run_naive(path, None, first_input, cap_big)
        print(f"| {path.stem} | {count} | {_pair(first)} | {_pair(median)} | grad({first_input}): {naive} |",
              flush=True)
    print()

    print("## (b) exact verification of every gradient of self_attention at N = d = d_k = 4 (goal < 2 s)")
    print()
    sizes4 = {"N": 4, "d": 4, "d_k": 4}
    median4, runs4, checks4 = time_verify(SELF_ATTENTION, sizes4, False, max(1, repeats // 2 + 1))
    naive4 = run_naive(SELF_ATTENTION, sizes4, "X", cap_small)
    print("| what | wall s | cpu s |")
    print("| --- | ---: | ---: |")
    print(f"| symattn verify_gradients, all {len(checks4)} gradients, median of {len(runs4)} "
          f"(wall {', '.join(f'{w:.2f}' for w, _ in runs4)}) | {median4[0]:.2f} | {median4[1]:.2f} |")
    print(f"| naive SymPy, grad(X) alone (16 entries), nothing checked | {naive4} | |")
    print(f"all ok: {all(c.ok for c in checks4)}")
    print()

    print("## (c) self_attention at N = d = d_k = 8, settled exactly (goal < 10 s)")
    print()
    sizes8 = {"N": 8, "d": 8, "d_k": 8}
    median8, _, checks8 = time_verify(SELF_ATTENTION, sizes8, True, 1)
    naive8 = run_naive(SELF_ATTENTION, sizes8, "X", cap_big)
    print("| what | wall s | cpu s |")
    print("| --- | ---: | ---: |")
    print(f"| symattn verify_gradients(force=True), all {len(checks8)} gradients | {median8[0]:.2f} "
          f"| {median8[1]:.2f} |")
    print(f"| naive SymPy, grad(X) alone (64 entries), nothing checked | {naive8} | |")
    print(f"all ok: {all(c.ok for c in checks8)}")
    print("how each was settled:")
    for c in checks8:
        print(f"  grad({c.tensor}): {c.method}")
    print()
    print(f"load average at end: {_load()}")


if __name__ == "__main__":
    main()
