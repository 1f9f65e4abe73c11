"""The generated PyTorch module against torch SDPA on the CPU: attention forward+backward with autograd.

    python benchmarks/bench_torch.py [--batch 1] [--heads 4] [--sizes 2048] [--dim 64] [--repeat 7] [--threads 1]
                                     [--causal]

The spec is the attention core `O = softmax(Q @ K.T / sqrt(d)) @ V` with Q, K,
V as inputs of shape [B, H, N, d] (4-D: with 3-D inputs SDPA takes its slow
math path). Both sides run forward, then `backward` of `sum(O * G)` through
torch autograd: the generated module's custom op (its derived backward,
softmax weights recomputed from the saved row log-sum-exp) and
`torch.nn.functional.scaled_dot_product_attention` (its CPU flash kernel).
Before timing, the outputs and gradients are compared (float64 reference at
the same inputs): a wrong result is reported, never timed. Runs alternate,
median wall time of `--repeat` rounds after one warm-up. Goal: generated
within 1.2x of SDPA at N=2048, d=64. With --causal the spec adds `causal_mask(N)`
to the scores and SDPA runs with `is_causal=True`.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time

import torch

import symattn
from symattn.codegen.torch import load_torch_module

CORE = """
attention core
dim N = 8, d = 4
input Q[N, d], K[N, d], V[N, d]
O = softmax(Q @ K.T / sqrt(d){mask}, axis=-1) @ V
output O
"""


def _run(fn, q, k, v, g):
    q, k, v = (x.detach().requires_grad_() for x in (q, k, v))
    out = fn(q, k, v)
    out.backward(g)
    return out, (q.grad, k.grad, v.grad)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--sizes", type=int, nargs="+", default=[2048])
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--dtypes", nargs="+", default=["float32"])
    parser.add_argument("--block-q", type=int, default=None,
                        help="the tiled attention's query block (default: the module's)")
    parser.add_argument("--block-k", type=int, default=None, help="its key block")
    parser.add_argument("--causal", action="store_true", help="causal_mask(N) in the scores, is_causal in SDPA")
    parser.add_argument("--products", action="store_true",
                        help="also time FlashAttention's seven products alone at the module's blocks (no mask; N a "
                             "multiple of both)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    spec = CORE.format(mask=" + causal_mask(N)" if args.causal else "")
    module = load_torch_module(symattn.load(spec).emit("torch"), "bench_core")
    module.BLOCK_Q = args.block_q or getattr(module, "BLOCK_Q", None)
    module.BLOCK_K = args.block_k or getattr(module, "BLOCK_K", None)

    def generated(q, k, v):
        return module.forward(Q=q, K=k, V=v)["O"]

    def sdpa(q, k, v):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=args.causal)

    def products(q, k, v, g):
        """The seven products of the module's tiled forward and backward alone (torch.bmm over batch and
        heads into buffers made once; no softmax, no mask): queries in blocks of BLOCK_Q against all keys,
        then keys in blocks of BLOCK_K against all queries, as the module's strips go at N <= 16 blocks."""
        q, k, v, g = (x.reshape(-1, *x.shape[-2:]) for x in (q, k, v, g))
        (b, n, d), bq, bk = q.shape, module.BLOCK_Q, module.BLOCK_K
        s, o = q.new_empty(b, bq, n), q.new_empty(b, bq, d)
        st, ds, dv, dq, dk = q.new_empty(b, n, bk), q.new_empty(b, n, bk), q.new_empty(b, bk, d), \
            q.new_empty(b, n, d), q.new_empty(b, bk, d)
        for i0 in range(0, n, bq):
            torch.bmm(q[:, i0:i0 + bq], k.transpose(1, 2), out=s)
            torch.bmm(s, v, out=o)
        for j0 in range(0, n, bk):
            kj, vj = k[:, j0:j0 + bk], v[:, j0:j0 + bk]
            torch.bmm(q, kj.transpose(1, 2), out=st)
            torch.bmm(st.transpose(1, 2), g, out=dv)
            torch.bmm(g, vj.transpose(1, 2), out=ds)
            dq.baddbmm_(ds, kj)
            torch.bmm(ds.transpose(1, 2), q, out=dk)

    print(f"torch {torch.__version__}, {platform.processor() or platform.machine()}, threads {args.threads}")
    print(f"blocks {module.BLOCK_Q} x {module.BLOCK_K}" if hasattr(module, "BLOCK_Q") else "not tiled",
          "(causal)" if args.causal else "")
    print("| B, H | N | d | dtype | generated ms | SDPA ms | generated / SDPA | by CPU time |"
          + (" products ms | products / SDPA |" if args.products else "") + " load |")
    print("| --- | ---: | ---: | --- | ---: | ---: | ---: | ---: |" + (" ---: | ---: |" if args.products else "")
          + " ---: |")
    for n in args.sizes:
        for name in args.dtypes:
            dtype = getattr(torch, name)
            gen = torch.Generator().manual_seed(0)
            shape = (args.batch, args.heads, n, args.dim)
            q, k, v, g = (torch.randn(*shape, generator=gen, dtype=dtype) for _ in range(4))
            out, grads = _run(sdpa, *(x.double() for x in (q, k, v, g)))
            want = (out.detach(), grads)
            tolerance = 1e-3 if dtype == torch.float32 else 5e-2
            for label, fn in (("generated", generated), ("SDPA", sdpa)):
                out, grads = _run(fn, q, k, v, g)
                for a, b in zip((out, *grads), (want[0], *want[1])):
                    err = float((a.detach().double() - b).abs().max() / b.abs().max())
                    if not err <= tolerance:
                        raise SystemExit(f"{label} is wrong at N={n} {name}: relative error {err:.2e}")
            times = {"generated": [], "SDPA": []}
            cpu = {"generated": [], "SDPA": []}
            for round_ in range(args.repeat + 1):
                order = [("generated", generated), ("SDPA", sdpa)][:: 1 if round_ % 2 else -1]
                for label, fn in order:
                    start, start_cpu = time.perf_counter(), time.process_time()
                    _run(fn, q, k, v, g)
                    if round_:
                        times[label].append(time.perf_counter() - start)
                        cpu[label].append(time.process_time() - start_cpu)
            a, b = statistics.median(times["generated"]) * 1e3, statistics.median(times["SDPA"]) * 1e3
            by_cpu = statistics.median(cpu["generated"]) / statistics.median(cpu["SDPA"])
            extra = ""
            if args.products:
                alone = []
                for _ in range(args.repeat + 1):
                    start = time.perf_counter()
                    products(q, k, v, g)
                    alone.append(time.perf_counter() - start)
                c = statistics.median(alone[1:]) * 1e3
                extra = f" {c:.1f} | {c / b:.2f}x |"
            print(f"| {args.batch}, {args.heads} | {n} | {args.dim} | {name} | {a:.1f} | {b:.1f} | {a / b:.2f}x "
                  f"| {by_cpu:.2f}x |{extra} {os.getloadavg()[0]:.1f} |", flush=True)


if __name__ == "__main__":
    main()
