"""Higher orders: deriving the Hessian-vector product, and double backward on the torch target.

    python benchmarks/bench_higher_orders.py [--sizes 256 512 1024] [--dim 64] [--repeat 5] [--threads 1]

1. Derivation. symattn writes the backward pass of self-attention as a spec, then its tangent pass (the
   HVP along tangents of X and every param, matrix form, all sizes) and parses both back; the baseline is
   naive SymPy at the smallest sizes (N=4, d=3, d_k=2): L = sum(O * G) over entry symbols, its gradient by
   `sympy.diff`, then the directional derivative of that gradient. Both in this process.
2. Double backward of the attention core `O = softmax(Q @ K.T / sqrt(d)) @ V` ([H, N, d], float32) through
   `spec.torch()`: forward, the gradient with create_graph=True, then the gradient of <grad, v> (an HVP)
   by the derived second-order formulas; the baseline is the same three steps through torch autograd on
   plain torch ops (the math path, the only SDPA path with a double backward). The results are compared
   (float64 at the same inputs) before timing; median of `--repeat` rounds after a warm-up.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time

import sympy
import torch

import symattn
from symattn.api import example_text
from symattn.symbolic.passes import backward_spec, tangent_spec

CORE = """
attention core
dim H = 1, N = 8, d = 4
input Q[H, N, d], K[H, N, d], V[H, N, d]
O = softmax(Q @ K.T / sqrt(d), axis=-1) @ V
output O
"""


def _symattn_hvp() -> float:
    start = time.perf_counter()
    spec = symattn.load(example_text())
    back = symattn.load(backward_spec(spec.typed, spec.derive()).text)
    symattn.load(tangent_spec(back.typed, fixed={"grad_O"}).text)
    return time.perf_counter() - start


def _sympy_hvp(n=4, d=3, dk=2) -> float:
    start = time.perf_counter()
    x = sympy.Matrix(n, d, lambda i, j: sympy.Symbol(f"x{i}_{j}"))
    ws = [sympy.Matrix(d, dk, lambda i, j, k=k: sympy.Symbol(f"w{k}_{i}_{j}")) for k in range(3)]
    g = sympy.Matrix(n, dk, lambda i, j: sympy.Symbol(f"g{i}_{j}"))
    q, k, v = (x * w for w in ws)
    s = q * k.T / sympy.sqrt(dk)
    p = sympy.Matrix(n, n, lambda i, j: sympy.exp(s[i, j]) / sum(sympy.exp(s[i, c]) for c in range(n)))
    loss = sum((p * v)[i, j] * g[i, j] for i in range(n) for j in range(dk))
    leaves = list(x) + [e for w in ws for e in w]
    tangent = {e: sympy.Symbol(f"t_{e}") for e in leaves}
    grads = [sympy.diff(loss, e) for e in leaves]
    [sum(sympy.diff(gr, e) * tangent[e] for e in leaves) for gr in grads]
    return time.perf_counter() - start


def _double_backward(fn, q, k, v, g, vs):
    q, k, v = (x.detach().requires_grad_() for x in (q, k, v))
    grads = torch.autograd.grad(fn(q, k, v), (q, k, v), g, create_graph=True)
    return grads, torch.autograd.grad(sum((a * b).sum() for a, b in zip(grads, vs)), (q, k, v))


def _plain(q, k, v):
    return torch.softmax(q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5, dim=-1) @ v


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[256, 512, 1024])
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"# {platform.processor() or platform.machine()}, torch {torch.__version__}, {args.threads} thread(s)")

    ours = statistics.median(_symattn_hvp() for _ in range(5))
    naive = _sympy_hvp()
    print(f"HVP of self-attention derived: symattn {ours * 1e3:.0f} ms (all sizes, matrix form), "
          f"naive SymPy {naive:.1f} s (N=4, d=3, d_k=2): {naive / ours:.0f}x")

    module = symattn.load(CORE).torch()

    def generated(q, k, v):
        return module(Q=q, K=k, V=v)["O"]

    print("| N | symattn double backward | torch math path | ratio |")
    print("| --- | --- | --- | --- |")
    for n in args.sizes:
        gen = torch.Generator().manual_seed(n)
        q, k, v, g = (torch.randn(args.heads, n, args.dim, generator=gen) for _ in range(4))
        vs = [torch.randn(args.heads, n, args.dim, generator=gen) for _ in range(3)]
        got = _double_backward(generated, *(x.double() for x in (q, k, v, g)), [x.double() for x in vs])
        want = _double_backward(_plain, *(x.double() for x in (q, k, v, g)), [x.double() for x in vs])
        worst = max(float((a - b).abs().max() / b.abs().max()) for a, b in zip(got[1], want[1]))
        if worst > 1e-8:
            print(f"| {n} | wrong: relative error {worst:.1e} | | |")
            continue
        times = {"symattn": [], "torch": []}
        for fn in (generated, _plain):
            _double_backward(fn, q, k, v, g, vs)  # warm-up
        for _ in range(args.repeat):
            for name, fn in (("symattn", generated), ("torch", _plain)):
                start = time.perf_counter()
                _double_backward(fn, q, k, v, g, vs)
                times[name].append(time.perf_counter() - start)
        a, b = statistics.median(times["symattn"]), statistics.median(times["torch"])
        print(f"| {n} | {a * 1e3:.0f} ms | {b * 1e3:.0f} ms | {a / b:.2f}x |")


if __name__ == "__main__":
    main()
