"""The emitted fused attention kernels against torch SDPA on a GPU: forward and backward, float32.

    python benchmarks/gpu.py [--sizes 1024 4096 16384] [--head-dim 64] [--batch 8] [--repeat 20]
    python benchmarks/gpu.py --dry-run     # emit and compile only (no GPU needed)
    python benchmarks/gpu.py --ptxas       # registers / shared memory / spills of every derivations/ spec

The spec is the attention core alone, O = softmax(Q @ K.T / sqrt(d), axis=-1) @ V
with Q, K, V inputs of shape [batch, N, d], so the fused path computes all of it.
symattn emits it (`symattn emit cuda`), nvcc builds it as a shared library
(-O3 -arch=sm_XY of the device), and ctypes calls its `_forward` and `_backward`
on torch CUDA tensors (data_ptr) on torch's current stream. Torch's reference is
`torch.nn.functional.scaled_dot_product_attention` on the same float32 tensors
(torch picks its backend; TF32 matmuls are left off), backward through autograd.

For each N: the emitted results are checked against SDPA first (max abs error of
O, dQ, dK, dV), then each of the four timings is the median over `--repeat`
CUDA-event-timed runs after warm-up; the backward timings exclude the forward.
TFLOP/s counts 4 B N^2 d for the forward and 10 B N^2 d for the backward
(FlashAttention's convention: the backward recomputes Q K^T).

Without torch, a CUDA device or nvcc the script says which is missing and exits 0
(nothing to measure here), after doing as much as it can: `--dry-run` emits and
compiles (nvcc -cubin with ptxas resource usage) without touching a GPU.
"""

from __future__ import annotations

import argparse
import ctypes
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

SPEC = """\
# The attention core alone: what the fused kernels compute.
attention bench_attention
dim N = 1024, d = 64
input Q[N, d], K[N, d], V[N, d]
O = softmax(Q @ K.T / sqrt(d), axis=-1) @ V
output O
"""


@dataclass(frozen=True)
class Run:
    """One row of the table: sizes, FLOPs, and the bytes the four [batch, N, d] tensors take."""

    n: int
    d: int
    batch: int

    @property
    def forward_flops(self) -> float:
        return 4.0 * self.batch * self.n * self.n * self.d

    @property
    def backward_flops(self) -> float:
        return 10.0 * self.batch * self.n * self.n * self.d

    @property
    def shape(self) -> tuple[int, int, int]:
        return (self.batch, self.n, self.d)


def plan_runs(sizes, head_dim: int, batch: int) -> list[Run]:
    return [Run(n, head_dim, batch) for n in sizes]


def emit(directory: Path):
    """Emit the benchmark spec's CUDA into `directory`; returns the CudaCode (fused path expected)."""
    import symattn
    from symattn.codegen.cuda import emit_cuda

    code = emit_cuda(symattn.load(SPEC, filename="bench_attention.attn"))
    if code.path != "fused":
        raise SystemExit(f"expected the fused path, got {code.path}: {code.plan.notes}")
    code.write(directory)
    return code


def find_nvcc() -> str | None:
    from symattn.check.cuda import find_nvcc as find

    return find()


def build(code, directory: Path, nvcc: str, arch: str) -> Path:
    library = directory / f"lib{code.prefix}.so"
    cmd = [nvcc, "-O3", f"-arch={arch}", "-shared", "-Xcompiler", "-fPIC", "-o", str(library),
           str(directory / code.source_name)]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"nvcc failed:\n{done.stdout}{done.stderr}")
    return library


class Emitted:
    """The emitted launch functions, called through ctypes on torch CUDA tensors."""

    def __init__(self, library: Path, prefix: str) -> None:
        lib = ctypes.CDLL(str(library))
        pointer, integer = ctypes.c_void_p, ctypes.c_int
        self.workspace_bytes = getattr(lib, f"{prefix}_workspace_bytes")
        self.workspace_bytes.restype = ctypes.c_size_t
        self.workspace_bytes.argtypes = [integer] * 3
        self.forward_fn = getattr(lib, f"{prefix}_forward")
        self.forward_fn.restype = integer
        self.forward_fn.argtypes = [pointer] * 5 + [integer] * 3 + [pointer]
        self.backward_fn = getattr(lib, f"{prefix}_backward")
        self.backward_fn.restype = integer
        self.backward_fn.argtypes = [pointer] * 9 + [integer] * 3 + [pointer]

    def arguments(self, run: Run, torch, device: str = "cuda"):
        """Every tensor the two launch functions take (on the GPU; `device="cpu"` for a CPU build)."""
        g = torch.Generator(device=device).manual_seed(0)
        make = lambda: torch.randn(run.shape, device=device, dtype=torch.float32, generator=g)  # noqa: E731
        q, k, v, d_o = make(), make(), make(), make()
        out = torch.empty_like(q)
        grads = [torch.empty_like(q) for _ in range(3)]
        workspace = torch.empty(self.workspace_bytes(run.n, run.d, run.batch) // 4 + 1, device=device,
                                dtype=torch.float32)
        return q, k, v, d_o, out, grads, workspace

    def forward(self, run, q, k, v, out, workspace, stream) -> None:
        status = self.forward_fn(q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(), workspace.data_ptr(),
                                 run.n, run.d, run.batch, stream)
        if status != 0:
            raise RuntimeError(f"forward returned {status}")

    def backward(self, run, q, k, v, out, d_o, grads, workspace, stream) -> None:
        status = self.backward_fn(q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(), d_o.data_ptr(),
                                  *[g.data_ptr() for g in grads], workspace.data_ptr(), run.n, run.d, run.batch,
                                  stream)
        if status != 0:
            raise RuntimeError(f"backward returned {status}")


def _time(fn, torch, repeat: int, warmup: int = 3) -> float:
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


def measure(emitted: Emitted, run: Run, torch, repeat: int) -> dict:
    import torch.nn.functional as F

    q, k, v, d_o, out, grads, workspace = emitted.arguments(run, torch)
    stream = torch.cuda.current_stream().cuda_stream
    emitted.forward(run, q, k, v, out, workspace, stream)
    emitted.backward(run, q, k, v, out, d_o, grads, workspace, stream)

    qt, kt, vt = (x.detach().clone().requires_grad_(True) for x in (q, k, v))
    reference = F.scaled_dot_product_attention(qt, kt, vt)
    reference.backward(d_o)
    torch.cuda.synchronize()
    errors = {"O": (out - reference).abs().max().item()}
    for name, ours, theirs in zip(("dQ", "dK", "dV"), grads, (qt.grad, kt.grad, vt.grad)):
        errors[name] = (ours - theirs).abs().max().item()

    ours_fwd = _time(lambda: emitted.forward(run, q, k, v, out, workspace, stream), torch, repeat)
    ours_bwd = _time(lambda: emitted.backward(run, q, k, v, out, d_o, grads, workspace, stream), torch, repeat)

    def sdpa_forward():
        with torch.no_grad():
            F.scaled_dot_product_attention(q, k, v)

    graph_out = F.scaled_dot_product_attention(qt, kt, vt)

    def sdpa_backward():
        for x in (qt, kt, vt):
            x.grad = None
        graph_out.backward(d_o, retain_graph=True)

    return dict(errors=errors, ours_fwd=ours_fwd, ours_bwd=ours_bwd,
                sdpa_fwd=_time(sdpa_forward, torch, repeat), sdpa_bwd=_time(sdpa_backward, torch, repeat))


def table(runs: list[Run], results: list[dict]) -> str:
    lines = ["| N | d | batch | emitted fwd ms | SDPA fwd ms | emitted bwd ms | SDPA bwd ms | emitted fwd TFLOP/s "
             "| emitted bwd TFLOP/s | max abs error (O, dQ, dK, dV) |",
             "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    for run, r in zip(runs, results):
        errors = ", ".join(f"{e:.1e}" for e in r["errors"].values())
        lines.append(f"| {run.n} | {run.d} | {run.batch} | {r['ours_fwd']:.3f} | {r['sdpa_fwd']:.3f} | "
                     f"{r['ours_bwd']:.3f} | {r['sdpa_bwd']:.3f} | {run.forward_flops / r['ours_fwd'] / 1e9:.2f} | "
                     f"{run.backward_flops / r['ours_bwd'] / 1e9:.2f} | {errors} |")
    return "\n".join(lines)


def ptxas_table(specs) -> tuple[str, bool]:
    """A Markdown table of ptxas resources per kernel of each spec's emitted CUDA (auto path)."""
    import symattn
    from symattn.codegen.cuda import emit_cuda
    from symattn.check.cuda import compile_gate

    lines = ["| spec | path | kernel | registers | shared memory (B) | stack (B) | spills (B) |",
             "| --- | --- | --- | ---: | ---: | ---: | ---: |"]
    ok = True
    with tempfile.TemporaryDirectory(prefix="symattn-ptxas-") as tmp:
        for path in specs:
            code = emit_cuda(symattn.load(path))
            code.write(Path(tmp) / code.prefix)
            gate = compile_gate(Path(tmp) / code.prefix / code.source_name)
            if gate.skipped:
                return f"skipped: {gate.skipped}", True
            ok = ok and gate.ok
            order = {name: k for k, name in enumerate(code.kernel_names())}
            for k in sorted(gate.kernels, key=lambda k: order.get(k.name, len(order))):
                lines.append(f"| {code.prefix} | {code.path} | `{k.name}` | {k.registers} | {k.shared_bytes} | "
                             f"{k.stack_bytes} | {k.spill_stores + k.spill_loads} |")
    return "\n".join(lines), ok


def missing() -> str | None:
    """Why the GPU measurement cannot run here, or None."""
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    if not torch.cuda.is_available():
        return "no CUDA device (torch.cuda.is_available() is False)"
    if find_nvcc() is None:
        return "nvcc not found"
    return None


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1024, 4096, 16384], help="sequence lengths N")
    parser.add_argument("--head-dim", type=int, default=64, help="d (at most 64 for the fused kernels)")
    parser.add_argument("--batch", type=int, default=8, help="batch entries (or batch x heads)")
    parser.add_argument("--repeat", type=int, default=20, help="timed runs per measurement (median)")
    parser.add_argument("--arch", default=None, help="nvcc -arch (default: the device's, e.g. sm_90)")
    parser.add_argument("--keep", metavar="DIR", help="emit and build here instead of a temporary directory")
    parser.add_argument("--dry-run", action="store_true", help="emit and compile only; no GPU needed")
    parser.add_argument("--ptxas", nargs="*", metavar="SPEC", default=None,
                        help="print ptxas resources per kernel for these specs (default: derivations/*.attn)")
    args = parser.parse_args(argv)
    if args.ptxas is not None:
        text, ok = ptxas_table(args.ptxas or sorted((REPO / "derivations").glob("*.attn")))
        print(text)
        return 0 if ok else 1
    runs = plan_runs(args.sizes, args.head_dim, args.batch)

    with tempfile.TemporaryDirectory(prefix="symattn-gpu-") as tmp:
        directory = Path(args.keep or tmp)
        code = emit(directory)
        print(f"emitted {code.source_name} ({code.path} path) into {directory}")
        if args.dry_run:
            from symattn.check.cuda import compile_gate

            gate = compile_gate(directory / code.source_name, arch=args.arch or "sm_90")
            if gate.skipped:
                print(f"compile: skipped: {gate.skipped}")
            else:
                for k in gate.kernels:
                    print(f"  {k.name}: {k.registers} registers, {k.shared_bytes} B smem, "
                          f"{k.spill_stores + k.spill_loads} B spills")
                print("compile: " + ("ok" if gate.ok else "FAILED: " + "; ".join(gate.problems)))
            print("planned runs: " + ", ".join(f"N={r.n} d={r.d} batch={r.batch}" for r in runs))
            return 0 if gate.ok else 1
        reason = missing()
        if reason:
            print(f"skipped: {reason}; nothing to measure on this machine (try --dry-run)")
            return 0
        import torch

        torch.backends.cuda.matmul.allow_tf32 = False
        major, minor = torch.cuda.get_device_capability()
        arch = args.arch or f"sm_{major}{minor}"
        library = build(code, directory, find_nvcc(), arch)
        emitted = Emitted(library, code.prefix)
        print(f"device: {torch.cuda.get_device_name()} ({arch}), torch {torch.__version__}, float32, "
              f"median of {args.repeat}")
        results = []
        for run in runs:
            results.append(measure(emitted, run, torch, args.repeat))
            print(f"  N={run.n}: done", flush=True)
        print(table(runs, results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
