"""Generated NumPy code against careful hand-written NumPy and torch CPU SDPA: self-attention forward+backward.

    python benchmarks/bench_numpy.py [--threads 1] [--sizes 256 1024 2048] [--repeat 7]

One row per (N, dtype) with d = d_k = 64: median wall time of forward+backward
for the module `symattn emit numpy derivations/self_attention.attn` generates
(its `forward_backward`), for `handwritten` below, and for torch's
`scaled_dot_product_attention` with autograd (when torch is installed), and
the peak memory that NumPy allocates during one forward+backward (tracemalloc;
torch's allocator is not traced). Runs are interleaved round by round, in a rotating
order, so that a busy machine and cold caches slow all three alike. Every implementation is pinned to the
same number of threads: the measuring process is a child started with
OMP/OpenBLAS/MKL thread variables set before NumPy is imported, plus
threadpoolctl when installed and torch.set_num_threads. Goal: generated <=
1.05x hand-written in time and peak memory, <= 2x torch.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
THREAD_VARIABLES = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "BLIS_NUM_THREADS",
                    "VECLIB_MAXIMUM_THREADS", "NUMEXPR_NUM_THREADS")


def handwritten(X, W_q, W_k, W_v, dO):
    """Self-attention forward and backward as a careful person writes it in NumPy.

    Scale the small operand (Q), softmax in place with the row max subtracted,
    the FlashAttention row sum D = rowsum(dO * O) instead of rowsum(dP * P),
    dS computed in dP's buffer, scales applied to [N, d] results, dX accumulated
    in place. Two [N, N] buffers at most: P and dP/dS.
    """
    import numpy as np

    scale = 1.0 / W_q.shape[-1] ** 0.5
    Q = X @ W_q
    K = X @ W_k
    V = X @ W_v
    P = (Q * scale) @ K.T
    P -= P.max(axis=-1, keepdims=True)
    np.exp(P, out=P)
    P /= P.sum(axis=-1, keepdims=True)
    O = P @ V

    dP = dO @ V.T
    dV = P.T @ dO
    dP -= np.einsum("ij,ij->i", dO, O)[:, None]
    dP *= P  # now dS
    dQ = dP @ K
    dQ *= scale
    dK = dP.T @ Q
    dK *= scale
    dW_q = X.T @ dQ
    dW_k = X.T @ dK
    dW_v = X.T @ dV
    dX = dQ @ W_q.T
    dX += dK @ W_k.T
    dX += dV @ W_v.T
    return O, {"X": dX, "W_q": dW_q, "W_k": dW_k, "W_v": dW_v}


def _child(args) -> None:
    """Measure in this process (thread variables already set by the parent)."""
    import tracemalloc

    import numpy as np

    sys.path.insert(0, str(REPO))
    from symattn import load

    try:
        from threadpoolctl import threadpool_limits
        threadpool_limits(limits=args.threads)
        pinned = "threadpoolctl + environment variables"
    except ImportError:
        pinned = "environment variables"
    try:
        import torch
        torch.set_num_threads(args.threads)
        torch_version = torch.__version__
    except ImportError:
        torch = None
        torch_version = None

    generated = load(REPO / "derivations" / "self_attention.attn").numpy()
    rng = np.random.default_rng(0)
    rows = []
    for n in args.sizes:
        for dtype in (np.float32, np.float64):
            d = d_k = 64
            X = rng.standard_normal((n, d)).astype(dtype)
            W = [(rng.standard_normal((d, d_k)) / d ** 0.5).astype(dtype) for _ in range(3)]
            dO = rng.standard_normal((n, d_k)).astype(dtype)

            def run_generated():
                return generated.forward_backward(X=X, W_q=W[0], W_k=W[1], W_v=W[2], grad_O=dO)

            def run_handwritten():
                return handwritten(X, W[0], W[1], W[2], dO)

            impls = {"generated": run_generated, "handwritten": run_handwritten}
            if torch is not None:
                tX, tW, tdO = torch.from_numpy(X), [torch.from_numpy(w) for w in W], torch.from_numpy(dO)

                def run_torch():
                    leaves = [tX.clone().requires_grad_(), *[w.clone().requires_grad_() for w in tW]]
                    x, wq, wk, wv = leaves
                    out = torch.nn.functional.scaled_dot_product_attention(x @ wq, x @ wk, x @ wv)
                    out.backward(tdO)
                    return out, [leaf.grad for leaf in leaves]

                impls["torch"] = run_torch

            # the three compute the same thing
            (o_gen, g_gen), (o_hand, g_hand) = run_generated(), run_handwritten()
            agree = max(float(np.max(np.abs(o_gen["O"] - o_hand)) / np.max(np.abs(o_hand))),
                        *(float(np.max(np.abs(g_gen[k] - g_hand[k])) / np.max(np.abs(g_hand[k]))) for k in g_hand))
            assert g_gen["X"].dtype == dtype and o_gen["O"].dtype == dtype

            times = {name: [] for name in impls}
            cpu = {name: [] for name in impls}
            start = time.perf_counter()
            for fn in impls.values():
                fn()  # warm-up
            once = time.perf_counter() - start
            names = list(impls)
            for r in range(max(args.repeat, int(args.budget / once))):  # small N: more runs, same noise budget
                # rotate the order: whoever runs right after another implementation finds the caches cold
                for name in names[r % len(names):] + names[:r % len(names)]:
                    fn = impls[name]
                    start, start_cpu = time.perf_counter(), time.process_time()
                    fn()
                    times[name].append(time.perf_counter() - start)
                    cpu[name].append(time.process_time() - start_cpu)
            peaks = {}
            for name in ("generated", "handwritten"):
                tracemalloc.start()
                tracemalloc.reset_peak()
                base = tracemalloc.get_traced_memory()[0]
                result = impls[name]()
                peaks[name] = tracemalloc.get_traced_memory()[1] - base
                del result
                tracemalloc.stop()
            rows.append({
                "N": n, "dtype": np.dtype(dtype).name,
                "ms": {k: statistics.median(v) * 1000 for k, v in times.items()},
                "min_ms": {k: min(v) * 1000 for k, v in times.items()},
                "cpu_ms": {k: statistics.median(v) * 1000 for k, v in cpu.items()},
                "peak_mib": {k: v / 2**20 for k, v in peaks.items()},
                "agree": agree,
            })
    print(json.dumps({"rows": rows, "numpy": np.__version__, "torch": torch_version, "pinned": pinned,
                      "blas": _blas(np)}))


def _blas(np) -> str:
    try:
        config = np.show_config(mode="dicts")
        blas = config["Build Dependencies"]["blas"]
        return f"{blas.get('name')} {blas.get('version', '')}".strip()
    except Exception:  # an older NumPy: not worth failing a benchmark over
        return "unknown"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--sizes", type=int, nargs="+", default=[256, 1024, 2048])
    parser.add_argument("--repeat", type=int, default=7, help="at least this many runs per row")
    parser.add_argument("--budget", type=float, default=1.0, help="seconds of runs per row (more runs at small N)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        _child(args)
        return
    env = dict(os.environ, **{name: str(args.threads) for name in THREAD_VARIABLES})
    command = [sys.executable, __file__, "--child", "--threads", str(args.threads), "--repeat", str(args.repeat),
               "--budget", str(args.budget),
               "--sizes", *map(str, args.sizes)]
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        sys.exit(f"the measuring process failed:\n{done.stderr}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
          f"Python {platform.python_version()}, NumPy {result['numpy']} ({result['blas']}), "
          f"torch {result['torch'] or 'not installed'}; {args.threads} thread(s), pinned by {result['pinned']}; "
          f"load average {os.getloadavg()[0]:.1f}")
    print(f"median of at least {args.repeat} interleaved runs (about {args.budget:g} s of runs per row); "
          "d = d_k = 64; forward+backward of self_attention; gen / hand (min): the ratio of the fastest runs; "
          "(cpu): of the median process CPU times, which a busy machine disturbs less")
    print()
    has_torch = result["torch"] is not None
    head = "| N | dtype | generated ms | hand-written ms | gen / hand | gen / hand (min) | gen / hand (cpu) | "
    head += "torch ms | gen / torch | " if has_torch else ""
    head += "generated peak MiB | hand-written peak MiB | gen / hand |"
    print(head)
    print("|" + " --- |" * (head.count("|") - 1))
    for row in result["rows"]:
        ms, peak = row["ms"], row["peak_mib"]
        cells = [str(row["N"]), row["dtype"], f"{ms['generated']:.2f}", f"{ms['handwritten']:.2f}",
                 f"{ms['generated'] / ms['handwritten']:.2f}x",
                 f"{row['min_ms']['generated'] / row['min_ms']['handwritten']:.2f}x",
                 f"{row['cpu_ms']['generated'] / row['cpu_ms']['handwritten']:.2f}x"]
        if has_torch:
            cells += [f"{ms['torch']:.2f}", f"{ms['generated'] / ms['torch']:.2f}x"]
        cells += [f"{peak['generated']:.2f}", f"{peak['handwritten']:.2f}",
                  f"{peak['generated'] / peak['handwritten']:.3f}x"]
        print("| " + " | ".join(cells) + " |")
    worst = max(row["agree"] for row in result["rows"])
    print(f"\ngenerated and hand-written results agree to a max relative difference of {worst:.1e}")


if __name__ == "__main__":
    main()
