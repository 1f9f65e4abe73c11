"""The generated NumPy module's tiled attention against torch SDPA on the CPU, side by side (issue 14).

    python benchmarks/bench_tiled.py [--batch 1] [--heads 4] [--sizes 4096] [--dim 64] [--threads 1 2]
                                     [--repeat 5] [--block-q 256] [--block-k 512] [--plain] [--products]

The spec is the attention core `O = softmax(Q @ K.T / sqrt(d) + mask) @ V`
with Q, K, V inputs of shape [B, H, N, d] (batch axes B, H in front of the
spec's [N, d]), without a mask and with the causal one. Per thread count, one
child process (the BLAS thread variables must be set before NumPy is
imported) times, alternating, the generated module's `forward_backward` (its
tiled pass at these sizes) and `torch.nn.functional.scaled_dot_product_attention`
forward + `backward` on [B, H, N, d] tensors (its CPU flash kernel), both
float32, `torch.set_num_threads(threads)` (the module's THREADS is left at its
default, which reads the BLAS thread variables); with `--plain`, also the module's
plain pass (TILED_ABOVE set above the size). Before timing, every result is
compared with a float64 SDPA at the same inputs. Times: median of `--repeat`
runs after one warm-up. Peak memory: what NumPy allocates during one
forward_backward above what was allocated before (tracemalloc); torch's
allocator is not traced. With `--products`, also the six block products of the generated one pass
alone at its shapes (serial; BLAS on `threads` threads): the part of the generated time that is BLAS.
Goal: generated <= 1.2x SDPA at N = 4096, d = 64.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys

CORE = """
attention core
dim N = 8, d = 4
input Q[N, d], K[N, d], V[N, d]
O = softmax(Q @ K.T / sqrt(d), axis=-1) @ V
output O
"""

CAUSAL = """
attention causal_core
dim N = 8, d = 4
input Q[N, d], K[N, d], V[N, d]
M[i:N, j:N] = where(j <= i, 0, -inf)
O = softmax(Q @ K.T / sqrt(d) + M, axis=-1) @ V
output O
"""


def _child(args) -> None:
    import statistics
    import time
    import tracemalloc

    import numpy as np
    import torch

    import symattn
    from symattn.codegen.numpy.emit import load_module

    threads = args.threads[0]
    torch.set_num_threads(threads)
    rows = []
    for causal in (False, True):
        module = load_module(symattn.load(CAUSAL if causal else CORE).emit("numpy"), "bench_tiled")
        module.BLOCK_Q, module.BLOCK_K = args.block_q, args.block_k
        for n in args.sizes:
            rng = np.random.default_rng(0)
            shape = (args.batch, args.heads, n, args.dim)
            q, k, v, g = (rng.standard_normal(shape, dtype=np.float32) for _ in range(4))

            def generated(tiled=True):
                module.TILED_ABOVE = 0 if tiled else 1 << 62
                outs, grads = module.forward_backward(Q=q, K=k, V=v, grad_O=g)
                return outs["O"], grads["Q"], grads["K"], grads["V"]

            def sdpa(dtype=torch.float32):
                tq, tk, tv = (torch.from_numpy(x).to(dtype).requires_grad_() for x in (q, k, v))
                out = torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, is_causal=causal)
                out.backward(torch.from_numpy(g).to(dtype))
                return out.detach(), tq.grad, tk.grad, tv.grad

            def products():
                """The six block products of the generated one pass alone, at its shapes (no softmax, no
                masks): what BLAS takes of it, against SDPA's whole pass."""
                v1 = np.concatenate([v, np.ones(v.shape[:-1] + (1,), v.dtype)], axis=-1)
                do1 = np.concatenate([g, np.ones(g.shape[:-1] + (1,), g.dtype)], axis=-1)
                for b in np.ndindex(*shape[:-2]):
                    for i0 in range(0, n, args.block_q):
                        i1 = min(i0 + args.block_q, n)
                        hi = i1 if causal else n
                        qi, gi, kb, v1b = q[b][i0:i1], g[b][i0:i1], k[b][:hi], v1[b][:hi]
                        s = qi @ kb.T
                        s @ v1b
                        ds = do1[b][i0:i1] @ v1b.T
                        s.T @ gi
                        ds @ kb
                        ds.T @ qi

            reference = [x.numpy() for x in sdpa(torch.float64)]
            runs = {"generated": generated, "sdpa": sdpa}
            if args.plain:
                runs["plain"] = lambda: generated(tiled=False)
            errors = {}
            for name, fn in runs.items():
                got = fn()
                got = [x.numpy() if hasattr(x, "numpy") else x for x in got]
                errors[name] = max(float(np.max(np.abs(a - r)) / np.max(np.abs(r))) for a, r in zip(got, reference))
                if errors[name] > 1e-3:
                    raise SystemExit(f"{name} is wrong at N={n}, causal={causal}: relative error {errors[name]:.2e}")
            if args.products:  # (after the checks: it computes nothing to check)
                runs["products"] = products
            memory = {}
            for name in [x for x in runs if x not in ("sdpa", "products")]:
                tracemalloc.start()
                base = tracemalloc.get_traced_memory()[0]
                runs[name]()
                memory[name] = (tracemalloc.get_traced_memory()[1] - base) / 2**20
                tracemalloc.stop()
            times = {name: [] for name in runs}
            cpu = {name: [] for name in runs}
            for r in range(args.repeat):
                order = list(runs)[r % len(runs):] + list(runs)[:r % len(runs)]
                for name in order:
                    start, start_cpu = time.perf_counter(), time.process_time()
                    runs[name]()
                    times[name].append(time.perf_counter() - start)
                    cpu[name].append(time.process_time() - start_cpu)
            medians = {name: statistics.median(ts) * 1e3 for name, ts in times.items()}
            cpu_medians = {name: statistics.median(ts) * 1e3 for name, ts in cpu.items()}
            rows.append(dict(causal=causal, n=n, threads=threads, ms=medians, cpu=cpu_medians, errors=errors,
                             mib=memory,
                             inputs_mib=4 * q.nbytes / 2**20, load=os.getloadavg()[0]))
    print(json.dumps(rows))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--sizes", type=int, nargs="+", default=[4096])
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--block-q", type=int, default=256)
    parser.add_argument("--block-k", type=int, default=512)
    parser.add_argument("--plain", action="store_true", help="also time the module's plain (untiled) pass")
    parser.add_argument("--products", action="store_true",
                        help="also time the one pass's six block products alone (BLAS, serial)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        _child(args)
        return
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}")
    print(f"B = {args.batch}, H = {args.heads}, d = {args.dim}, float32, blocks {args.block_q} x {args.block_k}")
    try:  # the generated module runs its blocks on THREADS threads only where threadpoolctl can hold BLAS to one
        import threadpoolctl
        print(f"threadpoolctl {threadpoolctl.__version__}: the blocks run on `threads` threads, BLAS on one each")
    except ImportError:
        print("threadpoolctl not installed: the blocks run one after another, BLAS on `threads` threads")
    print()
    print("| mask | N | threads | generated ms | SDPA ms | generated / SDPA | by CPU time |"
          + (" plain ms | plain / SDPA |" if args.plain else "")
          + (" products ms | products / SDPA |" if args.products else "")
          + " generated peak MiB | inputs MiB |" + (" plain peak MiB |" if args.plain else "") + " load |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |" + (" ---: | ---: |" if args.plain else "")
          + (" ---: | ---: |" if args.products else "")
          + " ---: | ---: |" + (" ---: |" if args.plain else "") + " ---: |")
    for threads in args.threads:
        env = dict(os.environ)
        for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
            env[var] = str(threads)
        command = [sys.executable, __file__, "--child", "--threads", str(threads), "--batch", str(args.batch),
                   "--heads", str(args.heads), "--dim", str(args.dim), "--repeat", str(args.repeat),
                   "--block-q", str(args.block_q), "--block-k", str(args.block_k), "--sizes",
                   *map(str, args.sizes)] + (["--plain"] if args.plain else []) + (
                   ["--products"] if args.products else [])
        result = subprocess.run(command, env=env, capture_output=True, text=True)
        if result.returncode:
            raise SystemExit(result.stderr)
        for row in json.loads(result.stdout.strip().splitlines()[-1]):
            ms = row["ms"]
            cells = ["causal" if row["causal"] else "none", str(row["n"]), str(row["threads"]),
                     f"{ms['generated']:.0f}", f"{ms['sdpa']:.0f}", f"{ms['generated'] / ms['sdpa']:.2f}x",
                     f"{row['cpu']['generated'] / row['cpu']['sdpa']:.2f}x"]
            if args.plain:
                cells += [f"{ms['plain']:.0f}", f"{ms['plain'] / ms['sdpa']:.2f}x"]
            if args.products:
                cells += [f"{ms['products']:.0f}", f"{ms['products'] / ms['sdpa']:.2f}x"]
            cells += [f"{row['mib']['generated']:.1f}", f"{row['inputs_mib']:.1f}"]
            if args.plain:
                cells += [f"{row['mib']['plain']:.1f}"]
            cells += [f"{row['load']:.1f}"]
            print("| " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
