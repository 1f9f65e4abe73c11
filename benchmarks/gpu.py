"""The emitted fused attention kernels, the generated Triton module and torch SDPA on a GPU, side by side.

    python benchmarks/gpu.py [--sizes 4096] [--head-dims 64 128] [--batch 4] [--heads 16]
                             [--dtypes bf16 fp32] [--causal] [--alibi] [--sdpa-backend flash efficient cudnn]
    python benchmarks/gpu.py --dry-run     # emit and compile only (no GPU needed)
    python benchmarks/gpu.py --ptxas       # registers / shared memory / spills of every derivations/ spec

Inputs are [B, H, N, d] (4-D, so SDPA takes its fused kernels, not the math path a 3-D input gets).
Kernels, per case:
- emitted CUDA: the spec O = softmax(Q @ K.T / sqrt(d) [+ M], axis=-1) @ V, `symattn emit cuda`,
  built by nvcc (-O3, the device's sm_XY), called through ctypes on the tensors seen as B x H
  entries of [N, d]. fp32 only and head dim <= 128: other columns say "n/a", nothing is faked;
- SDPA <backend>: `torch.nn.functional.scaled_dot_product_attention` pinned with
  `torch.nn.attention.sdpa_kernel` to each `--sdpa-backend` (default flash), `is_causal=True`
  for the causal case; a backend that refuses the dtype or shape is reported "refused", not timed;
- emitted CUDA tensor cores: the same spec's fused core on tensor cores (mma.sync, FA2-style),
  `<core>_forward_bf16` / `<core>_backward_bf16` on the bf16 tensors (lse and dQ, dK, dV in fp32),
  sm_80 or later; bf16 only and the backward's head dims (32, 64, 96, 128), else "n/a";
- Triton module: the same spec emitted as a Triton module (`symattn.load(spec).emit("triton")`),
  its `attention_forward` / `attention_backward`;
- with `--alibi`: derivations/alibi.attn's Triton module against torch FlexAttention (compiled,
  ALiBi slopes 2^(-8(h+1)/H) as a score_mod, the causal mask as a block mask).
`--causal` adds the causal spec (derivations/causal.attn's core: M = where(j <= i, 0, -inf)).

Fairness: every kernel's O, dQ, dK, dV are first compared with an fp64 reference computed from the
same (cast) inputs; over the dtype's tolerance (relative max error, gpu_cases.TOLERANCE: bf16 4e-2,
fp32 1e-3) the kernel is reported "wrong" and never timed. Timings are the median of `--repeat`
CUDA-event-timed runs after warm-up; the backward is timed alone (one saved forward). TF32 is off.
TFLOP/s counts 4 B H N^2 d for the forward and 10 B H N^2 d for the backward (FlashAttention's
convention: the backward recomputes Q K^T), both halved for a causal mask (the work a causal
kernel can skip), whatever a kernel actually skips.

Without torch, a CUDA device or nvcc the script says which is missing and exits 0
(nothing to measure here), after doing as much as it can: `--dry-run` emits and
compiles (nvcc -cubin with ptxas resource usage) without touching a GPU.

TODO: never run on a GPU yet (written without one); the ALiBi row's FlexAttention call is the
least tested part.
"""

from __future__ import annotations

import argparse
import ctypes
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

import gpu_cases as gc  # noqa: E402

SPEC = """\
# The attention core alone: what the fused kernels compute.
attention bench_attention
dim N = 1024, d = 64
input Q[N, d], K[N, d], V[N, d]
O = softmax(Q @ K.T / sqrt(d), axis=-1) @ V
output O
"""
# derivations/causal.attn's core, on given Q, K, V.
CAUSAL_SPEC = """\
attention bench_causal
dim N = 1024, d = 64
input Q[N, d], K[N, d], V[N, d]
M[i:N, j:N] = where(j <= i, 0, -inf)
O = softmax(Q @ K.T / sqrt(d) + M, axis=-1) @ V
output O
"""
SPECS = {"full": (SPEC, "bench_attention.attn"), "causal": (CAUSAL_SPEC, "bench_causal.attn")}


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


def emit(directory: Path, mask: str = "full"):
    """Emit a benchmark spec's CUDA into `directory`; returns the CudaCode (fused path expected)."""
    import symattn
    from symattn.codegen.cuda import emit_cuda

    text, filename = SPECS[mask]
    code = emit_cuda(symattn.load(text, filename=filename))
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


def emitted_kernel(emitted: Emitted, case, q, k, v, d_o, torch) -> gc.Kernel:
    """The emitted fp32 kernels on [B, H, N, d] tensors, seen as batch B x H of [N, d] (contiguous views)."""
    run = Run(case.n, case.d, case.batch * case.heads)
    q, k, v, d_o = (x.reshape(run.shape) for x in (q, k, v, d_o))
    out = torch.empty_like(q)
    grads = [torch.empty_like(q) for _ in range(3)]
    workspace = torch.empty(emitted.workspace_bytes(run.n, run.d, run.batch) // 4 + 1, device=q.device)
    stream = torch.cuda.current_stream().cuda_stream

    def forward():
        emitted.forward(run, q, k, v, out, workspace, stream)
        return out.view(case.shape)

    def backward():
        emitted.backward(run, q, k, v, out, d_o, grads, workspace, stream)
        return [g.view(case.shape) for g in grads]

    forward()
    return gc.Kernel(forward, backward)


class TensorCores:
    """The emitted tensor-core entry points of a spec's fused core, `<core>_forward_bf16` and
    `<core>_backward_bf16`, called through ctypes on contiguous bf16 tensors (fp32 lse and gradients)."""

    DTYPE = "bf16"
    BACKWARD_HEAD_DIMS = (32, 64, 96, 128)  # codegen.cuda.tensor_core_backward.BACKWARD_HEAD_DIMS

    def __init__(self, library: Path, code) -> None:
        (core,) = code.plan.tensor_cores
        lib = ctypes.CDLL(str(library))
        pointer, integer = ctypes.c_void_p, ctypes.c_int
        self.forward_fn = getattr(lib, f"{core.prefix}_forward_{self.DTYPE}")
        self.forward_fn.restype = integer
        self.forward_fn.argtypes = [pointer] * 5 + [integer] * 3 + [pointer]
        self.backward_fn = getattr(lib, f"{core.prefix}_backward_{self.DTYPE}")
        self.backward_fn.restype = integer
        self.backward_fn.argtypes = [pointer] * 10 + [integer] * 3 + [pointer]


def tensor_core_kernel(tc: TensorCores, case, q, k, v, d_o, torch) -> gc.Kernel:
    """The bf16 tensor-core forward and backward on [B, H, N, d] tensors, seen as batch B x H of [N, d].

    The forward writes O (bf16) and lse (fp32); the backward reads them and writes dQ, dK, dV (fp32) and
    its delta = rowsum(dO * O) (fp32). On CPU tensors it runs a CPU build (the emulation), stream None.
    """
    if q.dtype != torch.bfloat16:
        raise NotAvailable("bf16 kernels")
    if case.d not in TensorCores.BACKWARD_HEAD_DIMS:
        raise NotAvailable(f"the backward takes head dims {TensorCores.BACKWARD_HEAD_DIMS}")
    run = Run(case.n, case.d, case.batch * case.heads)
    q, k, v, d_o = (x.reshape(run.shape).contiguous() for x in (q, k, v, d_o))
    out = torch.empty_like(q)
    lse = torch.empty(run.shape[:-1], device=q.device, dtype=torch.float32)
    delta = torch.empty_like(lse)
    grads = [torch.empty(run.shape, device=q.device, dtype=torch.float32) for _ in range(3)]
    stream = torch.cuda.current_stream().cuda_stream if q.is_cuda else None

    def forward():
        status = tc.forward_fn(q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(), lse.data_ptr(),
                               run.n, run.d, run.batch, stream)
        if status != 0:
            raise RuntimeError(f"tensor-core forward returned {status}")
        return out.view(case.shape)

    def backward():
        status = tc.backward_fn(q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(), d_o.data_ptr(),
                                lse.data_ptr(), *[g.data_ptr() for g in grads], delta.data_ptr(),
                                run.n, run.d, run.batch, stream)
        if status != 0:
            raise RuntimeError(f"tensor-core backward returned {status}")
        return [g.view(case.shape) for g in grads]

    forward()
    return gc.Kernel(forward, backward)


def measure_case(case, kernels: dict, torch, repeat: int) -> list[str]:
    """Table rows of one case: every kernel in every dtype, each checked before it is timed."""
    g = torch.Generator(device="cuda").manual_seed(0)
    base = [torch.randn(case.shape, device="cuda", generator=g) for _ in range(4)]
    slopes = gc.alibi_slopes(case.heads, torch) if case.alibi else None
    cells: dict[str, dict[str, gc.Cell]] = {name: {} for name in kernels}
    for dtype in gc.DTYPES:
        q, k, v, d_o = (x.to(DTYPE[dtype](torch)) for x in base)
        want = gc.reference(case, q, k, v, d_o, torch, slopes)
        for name, make in kernels.items():
            try:
                kernel = make(case, dtype, q, k, v, d_o, slopes)
            except NotAvailable as why:
                cells[name][dtype] = gc.Cell(note=f"n/a: {why}")
                continue
            except RuntimeError as error:  # SDPA: "No available kernel"; a kernel that cannot launch
                cells[name][dtype] = gc.Cell(note="refused: " + (str(error).strip().splitlines() or ["?"])[0][:80])
                continue
            cells[name][dtype] = gc.measure(kernel, want, dtype, torch, repeat)
            del kernel
        del want
        torch.cuda.empty_cache()
    return ["| " + " | ".join([str(x) for x in (*case.shape, case.label, name)] + gc.cells_row(case, row)) + " |"
            for name, row in cells.items()]


class NotAvailable(Exception):
    """A kernel that does not exist for this dtype or shape (the emitted CUDA in bf16, d > 128)."""


DTYPE = {"bf16": lambda torch: torch.bfloat16, "fp32": lambda torch: torch.float32}


def kernels_for(case, emitted: dict, triton: dict, backends, torch, tensor_cores: dict | None = None) -> dict:
    """name -> make(case, dtype, q, k, v, dO, slopes) -> gc.Kernel, for one case."""
    mask = case.label
    out = {}
    if not case.alibi:
        def cuda(case, dtype, q, k, v, d_o, slopes):
            if dtype != "fp32":
                raise NotAvailable("fp32-only kernels")
            from symattn.codegen.cuda.flash import HEAD_DIMS
            if case.d > HEAD_DIMS[-1]:
                raise NotAvailable(f"head dim > {HEAD_DIMS[-1]}")
            return emitted_kernel(emitted[mask], case, q, k, v, d_o, torch)
        out["emitted CUDA"] = cuda
        if tensor_cores:
            out["emitted CUDA tensor cores"] = lambda case, dtype, q, k, v, d_o, slopes: tensor_core_kernel(
                tensor_cores[mask], case, q, k, v, d_o, torch)
        for backend in backends:
            out[f"SDPA {backend}"] = (lambda b: lambda case, dtype, q, k, v, d_o, slopes:
                                      gc.sdpa_kernel(b, case, q, k, v, d_o, torch))(backend)
    if triton:
        out["Triton module"] = lambda case, dtype, q, k, v, d_o, slopes: gc.triton_kernel(
            triton[mask], q, k, v, d_o, () if slopes is None else (slopes,))
    if case.alibi:
        out["FlexAttention"] = lambda case, dtype, q, k, v, d_o, slopes: gc.flex_kernel(case, q, k, v, d_o, slopes,
                                                                                       torch)
    return out


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


def load_triton(masks) -> dict:
    """mask -> the generated Triton module of that case's spec (alibi: derivations/alibi.attn), compiled."""
    import symattn
    from symattn.check.triton import load_module

    texts = {mask: symattn.load(*SPECS[mask][:1], filename=SPECS[mask][1]) for mask in masks if mask in SPECS}
    if "alibi" in masks:
        texts["alibi"] = symattn.load(REPO / "derivations" / "alibi.attn")
    return {mask: load_module(spec.emit("triton").text, interpret=False, name=f"bench_triton_{mask}")
            for mask, spec in texts.items()}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[4096], help="sequence lengths N")
    parser.add_argument("--head-dims", type=int, nargs="+", default=[64, 128],
                        help="d (the emitted CUDA kernels take at most 128)")
    parser.add_argument("--batch", type=int, default=4, help="B")
    parser.add_argument("--heads", type=int, default=16, help="H")
    parser.add_argument("--dtypes", nargs="+", choices=gc.DTYPES, default=list(gc.DTYPES))
    parser.add_argument("--causal", action="store_true", help="also the causal spec (is_causal=True for SDPA)")
    parser.add_argument("--alibi", action="store_true",
                        help="also derivations/alibi.attn's Triton module against FlexAttention")
    parser.add_argument("--sdpa-backend", nargs="+", choices=sorted(gc.SDPA_BACKENDS), default=["flash"],
                        help="SDPA backends to pin, one row each (default flash)")
    parser.add_argument("--no-triton", action="store_true", help="skip the generated Triton module")
    parser.add_argument("--variants", nargs="*", metavar="SPEC", default=None,
                        help="also the attention plan's variants (derivations/ specs; default with no names: "
                             "T5 bias, relative bias, GQA, MQA, learned ALiBi, padding, MLA, bottom-right causal): "
                             "each one's Triton module against the same attention written densely in torch")
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
    gc.DTYPES = tuple(d for d in gc.DTYPES if d in args.dtypes)
    cases = gc.plan_cases(args.sizes, args.head_dims, args.batch, args.heads, args.causal, args.alibi)
    masks = ["full", "causal"] if args.causal else ["full"]

    with tempfile.TemporaryDirectory(prefix="symattn-gpu-") as tmp:
        directory = Path(args.keep or tmp)
        codes = {mask: emit(directory / mask, mask) for mask in masks}
        for mask, code in codes.items():
            print(f"emitted {code.source_name} ({code.path} path) into {directory / mask}")
        if args.dry_run:
            from symattn.check.cuda import compile_gate

            ok = True
            for mask, code in codes.items():
                gate = compile_gate(directory / mask / code.source_name, arch=args.arch or "sm_90")
                if gate.skipped:
                    print(f"compile {mask}: skipped: {gate.skipped}")
                    continue
                for k in gate.kernels:
                    print(f"  {k.name}: {k.registers} registers, {k.shared_bytes} B smem, "
                          f"{k.spill_stores + k.spill_loads} B spills")
                print(f"compile {mask}: " + ("ok" if gate.ok else "FAILED: " + "; ".join(gate.problems)))
                ok = ok and gate.ok
            print("planned cases: " + ", ".join(f"B={c.batch} H={c.heads} N={c.n} d={c.d} {c.label}"
                                                for c in cases))
            if args.variants is not None:
                from gpu_variants import DEFAULT

                print("planned variants: " + ", ".join(args.variants or DEFAULT))
            return 0 if ok else 1
        reason = missing()
        if reason:
            print(f"skipped: {reason}; nothing to measure on this machine (try --dry-run)")
            return 0
        import torch

        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        major, minor = torch.cuda.get_device_capability()
        arch = args.arch or f"sm_{major}{minor}"
        libraries = {mask: build(code, directory / mask, find_nvcc(), arch) for mask, code in codes.items()}
        emitted = {mask: Emitted(libraries[mask], code.prefix) for mask, code in codes.items()}
        tensor_cores = {} if major < 8 else {mask: TensorCores(libraries[mask], code) for mask, code in codes.items()}
        if major < 8:
            print(f"the emitted tensor-core kernels need sm_80 or later (mma.sync bf16); {arch}: not run")
        triton = {} if args.no_triton else load_triton(masks + (["alibi"] if args.alibi else []))
        print(f"device: {torch.cuda.get_device_name()} ({arch}), torch {torch.__version__}, "
              f"median of {args.repeat}; TFLOP/s: 4 B H N^2 d forward, 10 B H N^2 d backward, halved when causal; "
              f"checked against fp64 first (rel tolerance {gc.TOLERANCE})")
        lines = gc.header()
        for case in cases:
            lines += measure_case(case, kernels_for(case, emitted, triton, args.sdpa_backend, torch, tensor_cores),
                                  torch, args.repeat)
            print(f"  {case}: done", flush=True)
        if args.variants is not None:
            from gpu_variants import DEFAULT, variant_rows

            lines += ["", "The attention plan's variants, bf16 (Triton module against the dense torch attention):"]
            for n in args.sizes:
                lines += variant_rows(args.variants or DEFAULT, n, args.head_dims[0], args.batch, args.heads,
                                      args.repeat, torch)
        print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
