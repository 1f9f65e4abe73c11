"""The attention plan's variants on a GPU: each one's Triton module against the same attention written densely.

`variant_rows(names, n, d, batch, heads, repeat, torch)` measures, for each reference spec of derivations/
named (`VARIANTS` of tests/codegen/all_targets/test_peer_variants.py: its dense torch reference, written
from the peer's definition), at N = n, widths d, `heads` heads where the spec has a head dim, batch
`batch`, bf16: the generated Triton module's `forward_backward` (the fused core: reads, table gradients
and masks inside the kernels) and the dense reference forward + autograd backward (the [N, N] scores
materialised: what torch runs for a bias it cannot fuse), time (CUDA events, median of `repeat` after a
warm-up) and peak memory (`torch.cuda.max_memory_allocated` above what the inputs take), after checking
the Triton outputs against the dense attention of the same bf16 inputs computed in fp32 (relative 4e-2,
bf16's rounding): a wrong one is not timed. Markdown rows.
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DEFAULT = ("t5_bias", "relative_bias", "gqa", "mqa", "alibi_learned", "padding_qk", "mla", "causal_bottom_right")


def _tensors(name, n, d, batch, heads, torch, device):
    """The spec's given tensors at these sizes (inputs and buffers with a batch axis), and upstream gradients."""
    import symattn

    spec = symattn.load(REPO / "derivations" / f"{name}.attn")
    typed = spec.typed
    sizes = {k: n if k in ("N", "M", "T") else d if k.startswith("d") else heads if k in ("h", "g", "r")
             else typed.sizes[k] for k in typed.dims}
    typed = symattn.load(typed.source, dims=sizes, filename=typed.filename).typed
    gen = torch.Generator(device="cpu").manual_seed(0)
    leaves = {}
    for leaf in typed.given:
        info = typed.tensors[leaf]
        shape = ((batch,) if info.kind != "param" else ()) + typed.concrete_shape(info.shape)
        value = torch.randn(shape, generator=gen)
        if info.kind == "buffer":
            value = value.abs()
        leaves[leaf] = value.to(device)
    return spec, typed, leaves


def _timed(fn, torch, repeat):
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeat):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return statistics.median(times)


def _peak(fn, torch):
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    fn()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - before) / 2 ** 20


def variant_rows(names, n, d, batch, heads, repeat, torch) -> list[str]:
    sys.path[:0] = [str(REPO / "tests" / "codegen" / "all_targets"), str(REPO / "tests")]
    from test_peer_variants import VARIANTS

    from symattn.check.triton import load_module

    rows = ["| variant | N | d | fused Triton s | dense torch s | ratio | fused peak MiB | dense peak MiB | rel err |",
            "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for name in names:
        spec, typed, leaves = _tensors(name, n, d, batch, heads, torch, "cuda")
        module = load_module(spec.emit("triton").text, interpret=False)
        dtype = torch.bfloat16
        tensors = {k: v.to(dtype) for k, v in leaves.items()}
        reference = VARIANTS[name][1]
        learned = [k for k in tensors if typed.tensors[k].kind != "buffer"]

        def dense(tensors=tensors):
            ts = {k: (v.detach().requires_grad_() if k in learned else v) for k, v in tensors.items()}
            outs = reference(ts)
            loss = sum(o.float().sum() for o in outs.values())
            loss.backward()
            return outs, {k: ts[k].grad for k in learned}

        outs = dense()[0]
        upstream = {f"grad_{o}": torch.ones_like(x) for o, x in outs.items()}
        keywords = {k: typed.sizes[k] for k in typed.dims if k == "L"}

        def fused():
            return module.forward_backward(**tensors, **upstream, **keywords)

        got, _ = fused()
        with torch.no_grad():  # the same bf16 inputs, computed in fp32
            want = {k: v.float() for k, v in reference({k: v.float() for k, v in tensors.items()}).items()}
        error = max(((got[o].float() - want[o]).abs().max() / want[o].abs().max().clamp_min(1e-3)).item()
                    for o in want)
        if error > 4e-2:
            rows.append(f"| {name} | {n} | {d} | WRONG (rel err {error:.1e}): not timed | | | | | |")
            continue
        t_fused, t_dense = _timed(fused, torch, repeat), _timed(dense, torch, repeat)
        m_fused, m_dense = _peak(fused, torch), _peak(dense, torch)
        rows.append(f"| {name} | {n} | {d} | {t_fused:.4f} | {t_dense:.4f} | {t_fused / t_dense:.2f} | "
                    f"{m_fused:.0f} | {m_dense:.0f} | {error:.1e} |")
    return rows
