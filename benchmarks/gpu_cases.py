"""What benchmarks/gpu.py measures, kernel by kernel: cases, FLOPs, the fp64 reference and the error gate.

Every kernel of a case runs on the same [B, H, N, d] inputs (drawn in fp32, cast to the column's
dtype); its O, dQ, dK, dV are compared with an fp64 reference computed from those cast inputs
(softmax written out, autograd, in chunks of the B x H axis so N = 16384 fits), and only a kernel
within `TOLERANCE[dtype]` is timed. The error is relative: max |got - want| / max |want| per tensor,
the worst of the four.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Callable

DTYPES = ("bf16", "fp32")
# Relative max error allowed before a kernel is called wrong (and not timed). bf16 keeps 8 bits of
# mantissa (eps 7.8e-3): O and the gradients are rounded to it and dQ, dK sum N terms; fp32 kernels
# that accumulate in fp32 land near 1e-6, so 1e-3 only catches a real mistake (or TF32).
TOLERANCE = {"bf16": 4e-2, "fp32": 1e-3}
SDPA_BACKENDS = {"flash": "FLASH_ATTENTION", "efficient": "EFFICIENT_ATTENTION", "cudnn": "CUDNN_ATTENTION",
                 "math": "MATH"}


@dataclass(frozen=True)
class Case:
    """One shape: q, k, v, dO are [batch, heads, n, d]; `causal` masks j > i; `alibi` adds m_h (j - i)."""

    batch: int
    heads: int
    n: int
    d: int
    causal: bool = False
    alibi: bool = False

    @property
    def shape(self) -> tuple[int, int, int, int]:
        return (self.batch, self.heads, self.n, self.d)

    @property
    def forward_flops(self) -> float:
        """4 B H N^2 d (Q K^T and P V, 2 flops a multiply-add), halved for a causal mask."""
        return 4.0 * self.batch * self.heads * self.n * self.n * self.d * (0.5 if self.causal else 1.0)

    @property
    def backward_flops(self) -> float:
        """10 B H N^2 d (the backward recomputes Q K^T: 5 matmuls), halved for a causal mask."""
        return 10.0 * self.batch * self.heads * self.n * self.n * self.d * (0.5 if self.causal else 1.0)

    @property
    def label(self) -> str:
        return "alibi" if self.alibi else ("causal" if self.causal else "full")


def plan_cases(sizes, head_dims, batch: int, heads: int, causal: bool, alibi: bool = False) -> list[Case]:
    cases = [Case(batch, heads, n, d, c) for d in head_dims for c in ((False, True) if causal else (False,))
             for n in sizes]
    return cases + ([Case(batch, heads, n, d, True, True) for d in head_dims for n in sizes] if alibi else [])


@dataclass(frozen=True)
class Cell:
    """One kernel in one dtype: timed (ms), or `note` says why not (n/a, refused, wrong)."""

    note: str = ""
    error: float | None = None
    fwd_ms: float | None = None
    bwd_ms: float | None = None


def relative_error(got, want) -> float:
    """max |got - want| / max |want| (tensors of any float dtype; compared in fp64)."""
    got, want = got.double(), want.double()
    return ((got - want).abs().max() / want.abs().max().clamp_min(1e-30)).item()


def gate(errors: dict[str, float], dtype: str) -> str | None:
    """None when every error is within the dtype's tolerance; else the note for a wrong kernel."""
    worst = max(errors, key=errors.get)
    if not math.isfinite(errors[worst]) or errors[worst] > TOLERANCE[dtype]:
        return f"wrong: {worst} rel err {errors[worst]:.1e} > {TOLERANCE[dtype]:.0e}"
    return None


def alibi_slopes(heads: int, torch, device: str = "cuda"):
    """ALiBi's geometric slopes 2^(-8 (h + 1) / H), as the spec's param m[h, 1, 1] (fp32)."""
    return torch.tensor([2.0 ** (-8.0 * (h + 1) / heads) for h in range(heads)], device=device).view(heads, 1, 1)


def reference(case: Case, q, k, v, d_o, torch, slopes=None, budget: float = 2e9):
    """fp64 O, dQ, dK, dV of softmax(Q K^T / sqrt(d) [+ m_h (j - i)] [+ causal mask]) V, in chunks of B x H."""
    b, h, n, d = case.shape
    flat = [x.reshape(b * h, n, d).double() for x in (q, k, v, d_o)]
    i = torch.arange(n, device=q.device)
    distance = (i[None, :] - i[:, None]).double()
    outs = [torch.empty(b * h, n, d, dtype=torch.float64, device=q.device) for _ in range(4)]
    step = max(1, int(budget // (n * n * 8)))
    for start in range(0, b * h, step):
        rows = slice(start, min(start + step, b * h))
        qc, kc, vc = (x[rows].clone().requires_grad_(True) for x in flat[:3])
        s = qc @ kc.transpose(-1, -2) / math.sqrt(d)
        if slopes is not None:
            heads = torch.arange(rows.start, rows.stop, device=q.device) % h
            s = s + slopes.double().view(-1)[heads].view(-1, 1, 1) * distance
        if case.causal:
            s = s.masked_fill(distance > 0, -math.inf)
        o = torch.softmax(s, dim=-1) @ vc
        o.backward(flat[3][rows])
        for out, x in zip(outs, (o.detach(), qc.grad, kc.grad, vc.grad)):
            out[rows] = x
        del s, o, qc, kc, vc
    return [x.view(b, h, n, d) for x in outs]


def time_ms(fn, torch, repeat: int, warmup: int = 3) -> float:
    """Median milliseconds of `fn` over `repeat` runs, each between two CUDA events."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeat):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop))
    return statistics.median(times)


@dataclass(frozen=True)
class Kernel:
    """A prepared kernel on fixed inputs: `forward()` -> O; `backward()` -> (dQ, dK, dV), timed alone."""

    forward: Callable[[], object]
    backward: Callable[[], tuple]


def measure(kernel: Kernel, want, dtype: str, torch, repeat: int) -> Cell:
    """Check, then (only if within tolerance) time. `want` is the fp64 (O, dQ, dK, dV)."""
    got = (kernel.forward(), *kernel.backward()[:3])
    torch.cuda.synchronize()
    errors = {name: relative_error(g, w) for name, g, w in zip(("O", "dQ", "dK", "dV"), got, want)}
    worst = max(errors.values())
    wrong = gate(errors, dtype)
    if wrong:
        return Cell(note=wrong, error=worst)
    return Cell(error=worst, fwd_ms=time_ms(kernel.forward, torch, repeat),
                bwd_ms=time_ms(kernel.backward, torch, repeat))


def sdpa_kernel(backend: str, case: Case, q, k, v, d_o, torch) -> Kernel:
    """torch SDPA pinned to one backend (is_causal for a causal case); the backward replays one graph."""
    from torch.nn.attention import SDPBackend, sdpa_kernel as pinned
    from torch.nn.functional import scaled_dot_product_attention as sdpa

    chosen = getattr(SDPBackend, SDPA_BACKENDS[backend])
    qt, kt, vt = (x.detach().clone().requires_grad_(True) for x in (q, k, v))
    with pinned(chosen):
        graph_out = sdpa(qt, kt, vt, is_causal=case.causal)  # RuntimeError here: the backend refuses

    def forward():
        with pinned(chosen), torch.no_grad():
            return sdpa(q, k, v, is_causal=case.causal)

    def backward():
        for x in (qt, kt, vt):
            x.grad = None
        with pinned(chosen):
            graph_out.backward(d_o, retain_graph=True)
        return qt.grad, kt.grad, vt.grad

    return Kernel(forward, backward)


def triton_kernel(module, q, k, v, d_o, score_tensors=()) -> Kernel:
    """The generated Triton module's core: attention_forward -> (o, lse), attention_backward -> grads."""
    saved = {}

    def forward():
        saved["o"], saved["lse"] = module.attention_forward(q, k, v, *score_tensors)
        return saved["o"]

    forward()
    return Kernel(forward, lambda: module.attention_backward(q, k, v, saved["o"], saved["lse"], d_o,
                                                             *score_tensors)[:3])


def flex_kernel(case: Case, q, k, v, d_o, slopes, torch) -> Kernel:
    """torch FlexAttention (compiled) with ALiBi as a score_mod and the causal mask as a block mask."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    flex = torch.compile(flex_attention)
    m = slopes.view(-1)
    mask = create_block_mask(lambda b, h, i, j: j <= i, None, None, case.n, case.n, device=str(q.device))

    def score_mod(score, b, h, i, j):
        return score + m[h] * (j - i)

    qt, kt, vt = (x.detach().clone().requires_grad_(True) for x in (q, k, v))
    graph_out = flex(qt, kt, vt, score_mod=score_mod, block_mask=mask)

    def forward():
        with torch.no_grad():
            return flex(q, k, v, score_mod=score_mod, block_mask=mask)

    def backward():
        for x in (qt, kt, vt):
            x.grad = None
        graph_out.backward(d_o, retain_graph=True)
        return qt.grad, kt.grad, vt.grad

    return Kernel(forward, backward)


def cells_row(case: Case, cells: dict[str, Cell]) -> list[str]:
    """Per dtype: fwd ms, fwd TFLOP/s, bwd ms, bwd TFLOP/s, rel err (or the cell's note across them)."""
    out = []
    for dtype in DTYPES:
        cell = cells.get(dtype, Cell(note="not run"))
        err = "" if cell.error is None else f"{cell.error:.1e}"
        if cell.fwd_ms is None:
            out += [cell.note, "", "", "", err]
            continue
        out += [f"{cell.fwd_ms:.3f}", f"{case.forward_flops / cell.fwd_ms / 1e9:.1f}", f"{cell.bwd_ms:.3f}",
                f"{case.backward_flops / cell.bwd_ms / 1e9:.1f}", err]
    return out


def header() -> list[str]:
    columns = ["B", "H", "N", "d", "mask", "kernel"]
    for dtype in DTYPES:
        columns += [f"{dtype} fwd ms", f"{dtype} fwd TFLOP/s", f"{dtype} bwd ms", f"{dtype} bwd TFLOP/s",
                    f"{dtype} rel err"]
    return ["| " + " | ".join(columns) + " |", "|" + " ---: |" * 4 + " --- | --- |" + " ---: |" * 10]
