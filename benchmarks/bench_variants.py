"""Attention variants the plan now fuses: the fused path against the spec computed as written, time and memory.

    python benchmarks/bench_variants.py [--sizes 4096] [--heads 4] [--dim 64] [--repeat 3]
                                        [--variants relative_bias t5_bias gqa mqa alibi key_padding]
                                        [--markdown]

For each reference spec of derivations/ named, at N = --sizes (every width
--dim, head axes --heads; batch 1), float32: one forward and backward
(`forward_backward`, the upstream gradients given) of the generated NumPy
module with its tiled pass (the fused core: TILED_ABOVE = 0) and with its
plain pass (TILED_ABOVE above the size: the [N, N] scores, weights and their
gradients as arrays), and of the generated torch module fused and built with
`torch_source(fused=False)` (the program as written). Both sides of a pair
run alternately in one child process per variant and side (peak memory is
per process); the results of each pair are compared before timing. Times:
median of --repeat runs after a warm-up; peak: the child's peak resident
memory above what it held before the run (the inputs made first). The
learned bias table (T5, relative bias) and GQA/MQA were computed unfused by
NumPy and torch before the attention plan (100-400 MiB at N = 4096).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def _child(args) -> None:
    import resource
    import statistics
    import time

    import numpy as np

    sys.path.insert(0, str(REPO / "tests" / "codegen" / "all_targets"))
    sys.path.insert(0, str(REPO / "tests"))
    import symattn
    from symattn.codegen.arrays.module import load_module
    from test_fused_memory import _leaves

    spec = symattn.load(REPO / "derivations" / f"{args.variant}.attn")
    spec = symattn.load(spec.typed.source, dims={d: args.heads for d in ("h", "g", "r") if d in spec.typed.dims},
                        filename=spec.typed.filename)
    leaves, upstream, keywords = _leaves(spec, args.size, width=args.dim)
    if args.target == "numpy":
        module = load_module(spec.emit("numpy"), "variant")
        module.TILED_ABOVE = 0 if args.side == "fused" else 1 << 62
        run = lambda: module.forward_backward(**leaves, **upstream, **keywords)  # noqa: E731
    else:
        import torch

        from symattn.codegen.torch import load_torch_module, torch_source

        torch.set_num_threads(args.threads)
        module = load_torch_module(torch_source(spec.typed, fused=args.side == "fused"), "variant")
        tensors = {k: torch.from_numpy(v) for k, v in {**leaves, **upstream}.items()}
        run = lambda: module.forward_backward(**tensors, **keywords)  # noqa: E731
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    outs, grads = run()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
    times = []
    for _ in range(args.repeat):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    value = next(iter(outs.values()))
    print(json.dumps({"time": statistics.median(times), "peak_kib": peak,
                      "check": float(np.asarray(value, dtype=np.float64).sum())}))


def _measure(variant, target, side, args) -> dict:
    cmd = [sys.executable, __file__, "--child", "--variant", variant, "--target", target, "--side", side,
           "--size", str(args.sizes[0]), "--heads", str(args.heads), "--dim", str(args.dim),
           "--repeat", str(args.repeat), "--threads", str(args.threads)]
    env = {**os.environ, "OPENBLAS_NUM_THREADS": str(args.threads), "OMP_NUM_THREADS": str(args.threads)}
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=REPO)
    if done.returncode != 0:
        raise RuntimeError(done.stderr[-2000:])
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[4096])
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--variants", nargs="+",
                        default=["relative_bias", "t5_bias", "gqa", "mqa", "alibi", "key_padding"])
    parser.add_argument("--targets", nargs="+", default=["numpy", "torch"])
    parser.add_argument("--markdown", action="store_true", help="print the table for BENCHMARKS.md")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--variant", help=argparse.SUPPRESS)
    parser.add_argument("--target", help=argparse.SUPPRESS)
    parser.add_argument("--side", help=argparse.SUPPRESS)
    parser.add_argument("--size", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return _child(args)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from machine import describe

    rows = []
    for variant in args.variants:
        for target in args.targets:
            fused, plain = _measure(variant, target, "fused", args), _measure(variant, target, "plain", args)
            same = abs(fused["check"] - plain["check"]) <= 1e-3 * max(1.0, abs(plain["check"]))
            rows.append((variant, target, fused, plain, same))
    print(describe())
    print(f"N = {args.sizes[0]}, width {args.dim}, {args.heads} heads, batch 1, float32, {args.threads} thread(s); "
          f"median of {args.repeat}")
    print("| variant | target | fused s | as written s | time ratio | fused peak MiB | as written peak MiB | "
          "same result |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | --- |")
    for variant, target, fused, plain, same in rows:
        print(f"| {variant} | {target} | {fused['time']:.2f} | {plain['time']:.2f} | "
              f"{fused['time'] / plain['time']:.2f} | {fused['peak_kib'] / 1024:.0f} | {plain['peak_kib'] / 1024:.0f} | "
              f"{'yes' if same else 'NO'} |")


if __name__ == "__main__":
    main()
