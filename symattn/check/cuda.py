"""Check emitted CUDA without a GPU: the nvcc compile gate, and runs on the CPU.

Contract:
- `compile_gate(source)` runs `nvcc -arch=sm_90 -cubin -Xptxas -v` on one
  emitted `.cu` and returns a `GateResult`: registers, shared memory, stack
  and spills per kernel (parsed from ptxas), and the problems that fail it
  (a compiler error, any spill, shared memory over the 48 KiB static limit).
  It is skipped, with the reason, when nvcc is absent.
- `verify_cuda(spec)` emits the spec's CUDA, builds the very same source for
  the CPU (g++ -O1 -std=c++20 -shared -fPIC -pthread, with
  `runtime/cuda_host.h` emulating blocks and threads), loads it with ctypes,
  runs forward and backward on random float32 inputs at sizes that are not
  multiples of the tile sizes, with a batch axis, and compares every output
  and every input and param gradient (a buffer has none) with the float64 reference evaluator
  (forward op by op; gradients from the derivation, evaluated op by op),
  equal meaning `verify.relative_error`'s: within tolerance, or non-finite in
  the same way. Sizes come from `guarded_sizes`: `verify_sizes`, made
  smaller by the size guard (`sizes.fit_sizes`) when their work exceeds
  `budget` entries (default `BUDGET`), which the output then says. A fused
  path is run again at `head_dim_sizes`, one set per head-dim instantiation
  (`HEAD_DIMS`) the main sizes leave out, so that every instantiated kernel
  runs (and under TSan too).
  With `tsan=True` it also builds a small driver with -fsanitize=thread and
  runs it in a subprocess (so TSan's runtime owns the process): TSan must
  report no race and the results must match too. With `tensor_cores=True`
  (default) each fused core's bf16 and f16 tensor-core forward and backward run too, from
  the same CPU build, at head dims 32, 64 and 128
  (`check.cuda_tensor_core.verify_tensor_cores`); with TSan as well, each
  core's bf16 forward and backward then run under TSan at head dim 64
  (`check.cuda_tensor_core_tsan`). Returns a `VerifyReport`;
  `report.ok` is what `symattn verify --target cuda` turns into its exit status.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Mapping

import numpy as np
import sympy

from .. import progress
from ..ir import typed as t
from ..codegen.cuda import CudaCode, emit_cuda
from ..codegen.cuda.kernels import Buffer
from ..symbolic.derive import derive
from ..symbolic.evaluate import NUMERIC, Evaluator
from .cuda_sizes import BUDGET, guarded_sizes, head_dim_sizes, instantiation, verify_sizes
from .numpy import draw_dropout, relative_error as _relative_error
from .cuda_tensor_core import TensorCoreCase, say_cases, verify_tensor_cores
from .cuda_tensor_core_tsan import TSAN_DTYPE, TSAN_HEAD_DIM, tsan_driver, tsan_tensor_cores

__all__ = ["KernelResources", "GateResult", "VerifyReport", "HeadDimRun", "compile_gate", "gate_cached",
           "parse_ptxas", "build_cpu", "build_directory", "verify_cuda", "verify_sizes", "guarded_sizes",
           "head_dim_sizes", "reference", "find_nvcc", "find_cxx", "TOLERANCE", "SHARED_LIMIT", "BUDGET"]

TOLERANCE = 1e-4              # max |got - want| / max |want|, per tensor (float32 against float64)
SHARED_LIMIT = 48 * 1024      # static shared memory per block
CXX_FLAGS = ["-O1", "-std=c++20", "-pthread", "-Wno-unknown-pragmas"]


def find_nvcc() -> str | None:
    found = shutil.which("nvcc")
    if found:
        return found
    for candidate in ("/usr/local/cuda/bin/nvcc", "/usr/local/bin/nvcc"):
        if os.access(candidate, os.X_OK):
            return candidate
    return None


def find_cxx() -> str | None:
    return shutil.which(os.environ.get("CXX", "g++")) or shutil.which("g++")


# --- the compile gate ------------------------------------------------------------------


@dataclass
class KernelResources:
    name: str
    registers: int = 0
    shared_bytes: int = 0
    stack_bytes: int = 0
    spill_stores: int = 0
    spill_loads: int = 0


@dataclass
class GateResult:
    ok: bool
    kernels: list[KernelResources] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    skipped: str | None = None
    log: str = ""


_ENTRY = re.compile(r"Compiling entry function '([^']+)'")
_SPILLS = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_USED = re.compile(r"Used (\d+) registers")
_SMEM = re.compile(r"(\d+) bytes smem")


def parse_ptxas(text: str) -> list[KernelResources]:
    """Per-kernel resources from `ptxas -v` output."""
    kernels: list[KernelResources] = []
    current = None
    for line in text.splitlines():
        entry = _ENTRY.search(line)
        if entry:
            current = KernelResources(entry.group(1))
            kernels.append(current)
            continue
        if current is None:
            continue
        spills = _SPILLS.search(line)
        if spills:
            current.stack_bytes, current.spill_stores, current.spill_loads = map(int, spills.groups())
        used = _USED.search(line)
        if used:
            current.registers = int(used.group(1))
            smem = _SMEM.search(line)
            current.shared_bytes = int(smem.group(1)) if smem else 0
    return kernels


def compile_gate(source: str | Path, arch: str = "sm_90", nvcc: str | None = None,
                 shared_limit: int = SHARED_LIMIT, timeout: float = 900) -> GateResult:
    nvcc = nvcc or find_nvcc()
    if nvcc is None:
        return GateResult(True, skipped="nvcc not found (install the CUDA toolkit or put nvcc on PATH)")
    source = Path(source)
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [nvcc, f"-arch={arch}", "-cubin", "-Xptxas", "-v", "-o", str(Path(tmp) / "gate.cubin"), str(source)]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    log = done.stdout + done.stderr
    kernels = parse_ptxas(log)
    problems = []
    if done.returncode != 0:
        errors = [line for line in log.splitlines() if "error" in line] or log.splitlines()[-5:]
        problems.append(f"nvcc failed (exit {done.returncode}): " + " | ".join(errors[:5]))
    for k in kernels:
        if k.spill_stores or k.spill_loads:
            problems.append(f"{k.name}: register spills ({k.spill_stores} bytes stored, {k.spill_loads} loaded)")
        if k.shared_bytes > shared_limit:
            problems.append(f"{k.name}: {k.shared_bytes} bytes of shared memory, over the {shared_limit} limit")
    return GateResult(not problems, kernels, problems, None, log)


# --- building and running on the CPU ----------------------------------------------------


def _run(cmd: list[str], timeout: float = 900) -> None:
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{done.stdout}{done.stderr}")


def build_directory(code: CudaCode, root: str | Path) -> Path:
    """`root/<spec>-<hash of the emitted files>`, with the files written: builds of the same code share it."""
    digest = hashlib.sha256("".join(code.files.values()).encode()).hexdigest()[:16]
    directory = Path(root) / f"{code.prefix}-{digest}"
    if not (directory / code.source_name).exists():
        code.write(directory)
    return directory


def gate_cached(code: CudaCode, root: str | Path) -> GateResult:
    """`compile_gate` on the emitted source, remembered in its build directory."""
    directory = build_directory(code, root)
    cache = directory / "gate.json"
    if cache.exists():
        saved = json.loads(cache.read_text(encoding="utf-8"))
        return GateResult(saved["ok"], parse_ptxas(saved["log"]), saved["problems"], saved["skipped"], saved["log"])
    gate = compile_gate(directory / code.source_name)
    if not gate.skipped:
        cache.write_text(json.dumps({"ok": gate.ok, "problems": gate.problems, "skipped": gate.skipped,
                                     "log": gate.log}), encoding="utf-8")
    return gate


def build_cpu(code: CudaCode, directory: str | Path, tsan: bool = False, cxx: str | None = None) -> Path:
    """Write the emitted files to `directory` and build them for the CPU (reused when unchanged).

    Without TSan: a shared library for ctypes. With TSan: an executable that runs the driver.
    """
    cxx = cxx or find_cxx()
    if cxx is None:
        raise RuntimeError("no C++ compiler (g++) found")
    directory = build_directory(code, directory)
    source = directory / code.source_name
    if not tsan:
        target = directory / f"lib{code.prefix}_cpu.so"
        if not target.exists():
            _run([cxx, *CXX_FLAGS, "-shared", "-fPIC", "-x", "c++", str(source), "-o", str(target)])
        return target
    driver = directory / "tsan_driver.cpp"
    target = directory / f"{code.prefix}_tsan"
    text = _driver(code)
    if not driver.exists() or driver.read_text(encoding="utf-8") != text:  # a driver of an older symattn
        driver.write_text(text, encoding="utf-8")
        target.unlink(missing_ok=True)
    if not target.exists():
        _run([cxx, *CXX_FLAGS, "-g", "-fsanitize=thread", "-x", "c++", str(source), "-x", "c++", str(driver),
              "-o", str(target)])
    return target


def _driver(code: CudaCode) -> str:
    """A main() that reads the arrays, runs forward then backward, and writes outputs and gradients."""
    p = code.plan
    arrays = [*p.inputs, *p.outputs, *p.upstream, *p.gradients]
    given = {id(b) for b in (*p.inputs, *p.upstream)}
    lines = ['#include <cstdio>', '#include <cstdlib>', '#include <cstring>', '#include <vector>',
             f'#include "{p.prefix}.h"', "", tsan_driver(code),
             "static std::vector<float> take(FILE* f, long n) {",
             "    std::vector<float> v(n > 0 ? n : 1);",
             "    if (n > 0 && fread(v.data(), sizeof(float), n, f) != (size_t)n) exit(3);",
             "    return v;", "}", "",
             "int main(int argc, char** argv) {",
             '    if (argc > 1 && strcmp(argv[1], "tc") == 0) return run_tensor_cores(argc, argv);',
             f"    if (argc != {3 + len(p.dims) + 1 + bool(p.seed) + len(arrays)}) return 2;",
             '    FILE* in = fopen(argv[1], "rb");', "    if (!in) return 4;",
             "    int a = 3;",
             "    int dims[] = {" + ", ".join("atoi(argv[a++])" for _ in (*p.dims, p.batch)) + "};",
             *(["    const unsigned long long seed = strtoull(argv[a++], nullptr, 10);"] if p.seed else []),
             f"    long count[{len(arrays)}];",
             f"    for (int k = 0; k < {len(arrays)}; ++k) count[k] = atol(argv[a++]);"]
    for k, b in enumerate(arrays):
        lines.append(f"    std::vector<float> a{k} = " + (f"take(in, count[{k}]);" if id(b) in given
                                                           else f"std::vector<float>(count[{k}] > 0 ? count[{k}] : 1);"))
    dims = ", ".join(f"dims[{k}]" for k in range(len(p.dims) + 1))
    sizes = dims
    dims += ", seed" if p.seed else ""
    index = {id(b): k for k, b in enumerate(arrays)}
    fwd = [f"a{index[id(b)]}.data()" for b in (*p.inputs, *p.outputs)]
    bwd = [f"a{index[id(b)]}.data()" for b in (*p.inputs, *p.outputs, *p.upstream, *p.gradients)]
    lines += ["    fclose(in);",
              f"    std::vector<float> ws({p.prefix}_workspace_bytes({sizes}) / sizeof(float) + 1);",
              f"    if ({p.prefix}_forward({', '.join(fwd)}, ws.data(), {dims}, nullptr) != 0) return 5;",
              f"    if ({p.prefix}_backward({', '.join(bwd)}, ws.data(), {dims}, nullptr) != 0) return 6;",
              '    FILE* out = fopen(argv[2], "wb");', "    if (!out) return 7;"]
    for b in (*p.outputs, *p.gradients):
        k = index[id(b)]
        lines.append(f"    fwrite(a{k}.data(), sizeof(float), count[{k}], out);")
    lines += ["    fclose(out);", "    return 0;", "}", ""]
    return "\n".join(lines)


def _concrete(buffer: Buffer, sizes: Mapping[str, int], batch: int) -> tuple[int, ...]:
    subs = {sympy.Symbol(n, positive=True, integer=True): v for n, v in sizes.items()}
    shape = tuple(int(sympy.sympify(d).subs(subs)) for d in buffer.shape)
    return ((batch,) if buffer.batched else ()) + shape


def _dim_values(code: CudaCode, sizes: Mapping[str, int]) -> list[int]:
    return [sizes[name] for name in code.plan.spec.dims]


class _Runner:
    """Run the emitted forward and backward through a ctypes-loaded CPU build."""

    def __init__(self, library: Path, code: CudaCode) -> None:
        self.code = code
        self.lib = ctypes.CDLL(str(library))
        p = code.plan
        ints = [ctypes.c_int] * (len(p.dims) + 1)
        self.workspace_bytes = getattr(self.lib, f"{p.prefix}_workspace_bytes")
        self.workspace_bytes.restype = ctypes.c_size_t
        self.workspace_bytes.argtypes = ints
        self.forward = getattr(self.lib, f"{p.prefix}_forward")
        self.forward.restype = ctypes.c_int
        seed = [ctypes.c_uint64] if p.seed else []  # dropout's seed, after the batch
        self.forward.argtypes = [ctypes.c_void_p] * (len(p.inputs) + len(p.outputs) + 1) + ints + seed + [ctypes.c_void_p]
        self.backward = getattr(self.lib, f"{p.prefix}_backward")
        self.backward.restype = ctypes.c_int
        n = len(p.inputs) + len(p.outputs) + len(p.upstream) + len(p.gradients) + 1
        self.backward.argtypes = [ctypes.c_void_p] * n + ints + seed + [ctypes.c_void_p]

    def __call__(self, arrays: dict[int, np.ndarray], dims: list[int], seed: int | None = None) -> None:
        p = self.code.plan
        ws = np.zeros(self.workspace_bytes(*dims) // 4 + 1, dtype=np.float32)
        ptr = lambda b: arrays[id(b)].ctypes.data  # noqa: E731
        if p.seed:
            dims = [*dims, seed]
        status = self.forward(*[ptr(b) for b in (*p.inputs, *p.outputs)], ws.ctypes.data, *dims, None)
        if status != 0:
            raise RuntimeError(f"{p.prefix}_forward returned {status}")
        status = self.backward(*[ptr(b) for b in (*p.inputs, *p.outputs, *p.upstream, *p.gradients)],
                               ws.ctypes.data, *dims, None)
        if status != 0:
            raise RuntimeError(f"{p.prefix}_backward returned {status}")


def _tsan_run(executable: Path, code: CudaCode, arrays: dict[int, np.ndarray], dims: list[int],
              timeout: float, seed: int | None = None) -> tuple[str, dict[int, np.ndarray]]:
    """Run the TSan driver in a subprocess; returns (TSan's report or '', the results)."""
    p = code.plan
    order = [*p.inputs, *p.outputs, *p.upstream, *p.gradients]
    with tempfile.TemporaryDirectory() as tmp:
        inp, out = Path(tmp) / "in.bin", Path(tmp) / "out.bin"
        with open(inp, "wb") as f:
            for b in (*p.inputs, *p.upstream):
                f.write(np.ascontiguousarray(arrays[id(b)], dtype=np.float32).tobytes())
        env = dict(os.environ, TSAN_OPTIONS="halt_on_error=0 exitcode=66 report_signal_unsafe=0")
        cmd = [str(executable), str(inp), str(out), *map(str, dims), *([str(seed)] if p.seed else []),
               *[str(arrays[id(b)].size) for b in order]]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
        report = done.stderr if "ThreadSanitizer" in done.stderr else ""
        if done.returncode not in (0, 66) or (done.returncode == 66 and not report):
            raise RuntimeError(f"the TSan driver failed (exit {done.returncode}):\n{done.stderr[-2000:]}")
        results = {}
        data = np.fromfile(out, dtype=np.float32) if out.exists() else np.zeros(0, np.float32)
        offset = 0
        for b in (*p.outputs, *p.gradients):
            size = arrays[id(b)].size
            results[id(b)] = data[offset: offset + size].reshape(arrays[id(b)].shape)
            offset += size
    return report, results


# --- the reference ------------------------------------------------------------------------


def reference(spec: t.TypedSpec, sizes: Mapping[str, int], leaves: Mapping[str, np.ndarray],
              upstream: Mapping[str, np.ndarray], batch: int) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Outputs and input and param gradients in float64, one batch entry at a time (params shared,
    their gradients summed; inputs and buffers batched)."""
    derivation = derive(spec)
    outputs = {o: [] for o in spec.outputs}
    grads = {x: [] for x in spec.differentiable}
    for b in range(batch):
        entry = {x: leaves[x][b] if np.ndim(leaves[x]) > len(spec.tensors[x].shape) else leaves[x]
                 for x in spec.given}  # (a dropout mask of params alone has no batch axis, as they have none)
        ev = Evaluator(spec, NUMERIC, sizes)
        values = ev.run(entry)
        ev.grads = {o: upstream[o][b] for o in spec.outputs}
        for o in spec.outputs:
            outputs[o].append(np.asarray(values[o], dtype=np.float64))
        for name, gradient in derivation.gradients.items():
            if name in spec.outputs:
                continue
            shape = tuple(ev.size(d) for d in spec.tensors[name].shape)
            value = np.zeros(shape) if gradient.expr is None else ev.evaluate(gradient.expr)
            ev.grads[name] = np.broadcast_to(np.asarray(value, dtype=np.float64), shape)
        for x in spec.differentiable:
            grads[x].append(ev.grads[x])
    out = {o: np.stack(v) for o, v in outputs.items()}
    grad = {x: np.stack(v) if spec.tensors[x].kind == "input" else np.sum(v, axis=0) for x, v in grads.items()}
    return out, grad


def relative_error(got: np.ndarray, want: np.ndarray) -> float:
    """`verify.relative_error` with no floor on the scale: one definition of equal for every target."""
    return _relative_error(got, want, floor=0.0)


# --- the whole check ----------------------------------------------------------------------


@dataclass
class HeadDimRun:
    """A run at sizes that select another head-dim instantiation of the fused kernels."""

    sizes: dict[str, int]
    head_dim: int                                                 # the HEAD_DIMS bound its kernels have
    errors: dict[str, float] = field(default_factory=dict)
    tsan_errors: dict[str, float] = field(default_factory=dict)


@dataclass
class VerifyReport:
    spec: str
    path: str
    sizes: dict[str, int]
    batch: int
    errors: dict[str, float] = field(default_factory=dict)        # tensor label -> max relative error
    tsan_errors: dict[str, float] = field(default_factory=dict)
    tsan_report: str | None = None                                # None: not run; '': no race
    gate: GateResult | None = None
    problems: list[str] = field(default_factory=list)
    tolerance: float = TOLERANCE
    notes: list[str] = field(default_factory=list)                # e.g. that the size guard chose smaller sizes
    tensor_core: list[TensorCoreCase] = field(default_factory=list)  # the bf16 / f16 forwards of the fused cores
    head_dim_runs: list[HeadDimRun] = field(default_factory=list)  # the other instantiations' runs
    tsan_tensor_core: list[TensorCoreCase] = field(default_factory=list)  # their bf16 runs under TSan

    @property
    def ok(self) -> bool:
        return not self.problems


@dataclass
class _Run:
    """One run's arrays (by buffer id), the float64 results they are held to, and their labels."""

    arrays: dict[int, np.ndarray]
    want: dict[int, np.ndarray]
    labels: dict[int, str]
    dims: list[int]
    seed: int | None = None  # dropout's seed (None: the spec has no dropout)


def _prepare(typed: t.TypedSpec, code: CudaCode, sizes: Mapping[str, int], batch: int, seed: int) -> _Run:
    rng = np.random.default_rng(seed)
    p = code.plan
    arrays: dict[int, np.ndarray] = {}
    for b in (*p.inputs, *p.upstream):
        shape = _concrete(b, sizes, batch)
        # A weight matrix is drawn as it is initialised (LeCun: std 1/sqrt(fan-in)), so that scores stay
        # O(sqrt(d)) rather than O(d^1.5) and a float32 kernel is not held to an ill-conditioned softmax.
        scale = 1.0 / np.sqrt(shape[-2]) if b.kind == "param" and len(shape) >= 2 else 1.0
        arrays[id(b)] = np.asarray(scale * rng.standard_normal(shape), dtype=np.float32)
    given = dict(zip(typed.arguments, p.inputs))
    for name, b in given.items():  # an integer buffer: integers in its range (as float32, the C API's type)
        if typed.tensors[name].integer:
            low, high = (int(sympy.sympify(v).subs({typed.dims[n].symbol: k for n, k in sizes.items()}))
                         for v in typed.tensors[name].values)
            arrays[id(b)] = rng.integers(low, high, size=arrays[id(b)].shape).astype(np.float32)
    for b in (*p.outputs, *p.gradients):
        arrays[id(b)] = np.full(_concrete(b, sizes, batch), np.nan, dtype=np.float32)
    leaves = {x: arrays[id(b)].astype(np.float64) for x, b in zip(typed.arguments, p.inputs)}
    leaves, arguments = draw_dropout(typed, leaves, rng, dict(sizes))  # the masks the kernels draw, and the seed
    upstream = {o: arrays[id(b)].astype(np.float64) for o, b in zip(typed.outputs, p.upstream)}
    labels = {id(b): o for o, b in zip(typed.outputs, p.outputs)}
    labels.update({id(b): f"grad({x})" for x, b in zip(typed.differentiable, p.gradients)})
    progress.step("the float64 reference")
    want_out, want_grad = reference(typed, sizes, leaves, upstream, batch)
    want = {id(b): want_out[o] for o, b in zip(typed.outputs, p.outputs)}
    want.update({id(b): want_grad[x] for x, b in zip(typed.differentiable, p.gradients)})
    return _Run(arrays, want, labels, _dim_values(code, sizes) + [batch], arguments.get(typed.seed_keyword))


def _compare(run: _Run, results: Mapping[int, np.ndarray], tolerance: float, where: str,
             problems: list[str]) -> dict[str, float]:
    errors = {}
    for key, label in run.labels.items():
        errors[label] = relative_error(results[key], run.want[key])
        if errors[label] > tolerance:
            problems.append(f"{where}{label}: max relative error {errors[label]:.2e} > {tolerance:g}")
    return errors


def verify_cuda(spec, *, batch: int = 2, sizes: Mapping[str, int] | None = None, tsan: bool = True,
                gate: bool = True, fused: bool = True, workdir: str | Path | None = None, seed: int = 0,
                tolerance: float = TOLERANCE, out: Callable[[str], None] | None = None,
                code: CudaCode | None = None, budget: int = BUDGET, tensor_cores: bool = True,
                head_dims: bool = True) -> VerifyReport:
    typed: t.TypedSpec = getattr(spec, "typed", spec)
    say = out or (lambda line: None)
    code = code or emit_cuda(typed, fused=fused)
    guard_note = ""
    if sizes is None:
        choice = guarded_sizes(typed, budget)
        sizes, guard_note = choice.sizes, choice.note("verify")
    sizes = dict(sizes)
    report = VerifyReport(typed.name, code.path, sizes, batch, tolerance=tolerance)
    cores = ", ".join(c.output for c in code.plan.cores)
    say(f"{typed.name}: {code.path} path" + (f" (fused attention core: {cores})" if cores else ""))
    for note in code.plan.notes:
        say(f"  note: {note}")
    if guard_note:
        say(guard_note)
        report.notes.append(guard_note)
    say("sizes: " + ", ".join(f"{k}={v}" for k, v in sizes.items()) + f", batch={batch}")

    workdir = Path(workdir) if workdir else Path(tempfile.mkdtemp(prefix="symattn-cuda-"))
    if gate:
        progress.step("the nvcc compile gate")
        report.gate = gate_cached(code, workdir)
        _say_gate(report.gate, say)
        report.problems += report.gate.problems

    run = _prepare(typed, code, sizes, batch, seed)
    progress.step("building the kernels for the CPU")
    library = build_cpu(code, workdir, tsan=False)
    progress.step("running the kernels on the CPU")
    runner = _Runner(library, code)
    fresh = {k: v.copy() for k, v in run.arrays.items()}
    runner(fresh, run.dims, run.seed)
    report.errors = _compare(run, fresh, tolerance, "", report.problems)
    say(f"{'tensor':<16}{'max rel error':>14}")
    for label, error in report.errors.items():
        verdict = "ok" if error <= tolerance else f"FAIL (tolerance {tolerance:g})"
        say(f"  {label:<14}{error:>14.2e}  {verdict}")
    if tensor_cores and code.plan.tensor_cores:
        progress.step("running the tensor-core kernels on the CPU (emulated mma)")
        say("tensor-core forward and backward (inputs rounded to bf16 / f16, against float64 of the rounded inputs):")
        report.tensor_core = verify_tensor_cores(code, library, sizes, batch, seed=seed, out=say)
        report.problems += [problem for case in report.tensor_core for problem in case.problems]

    executable = None
    if tsan:
        progress.step("building the kernels under ThreadSanitizer")
        executable = build_cpu(code, workdir, tsan=True)
        progress.step("running the kernels under ThreadSanitizer")
        race, results = _tsan_run(executable, code, {k: v.copy() for k, v in run.arrays.items()}, run.dims,
                                  timeout=900, seed=run.seed)
        report.tsan_report = race
        report.tsan_errors = _compare(run, results, tolerance, "under TSan, ", report.problems)
        what = "forward and backward"
        if tensor_cores and code.plan.tensor_cores:
            progress.step(f"running the {TSAN_DTYPE} tensor-core kernels under ThreadSanitizer")
            tc_race, cases = tsan_tensor_cores(executable, code, sizes, batch, seed=seed)
            race += tc_race
            report.tsan_report = race
            report.tsan_tensor_core = cases
            report.problems += [f"under TSan, {problem}" for case in cases for problem in case.problems]
            say_cases(cases, say)
            what += f", and the {TSAN_DTYPE} tensor-core forward and backward at head dim {TSAN_HEAD_DIM}"
        if race:
            report.problems.append("ThreadSanitizer reported a data race")
            say("ThreadSanitizer: DATA RACE\n" + "\n".join("  " + line for line in _race_summary(race)))
        else:
            say(f"ThreadSanitizer: no race ({what}); "
                f"max rel error of the fp32 kernels {max(report.tsan_errors.values(), default=0.0):.2e}")

    for other in head_dim_sizes(typed, code, sizes) if head_dims else []:
        _other_head_dim(typed, code, report, other, runner, executable, seed, say)
    say("result: " + ("ok" if report.ok else "FAILED: " + "; ".join(report.problems)))
    return report


def _other_head_dim(typed, code, report: VerifyReport, sizes: dict[str, int], runner: _Runner,
                    executable: Path | None, seed: int, say: Callable[[str], None]) -> None:
    """Run (and under TSan, when `executable`) at sizes that select another head-dim instantiation."""
    changed = ", ".join(f"{k}={v}" for k, v in sizes.items() if v != report.sizes[k])
    bound = max(instantiation(max(int(sympy.sympify(d).subs({typed.dims[n].symbol: v for n, v in sizes.items()}))
                                   for d in (c.d_qk, c.d_v))) for c in code.plan.cores)
    progress.step(f"the head dim {bound} kernels")
    run = _prepare(typed, code, sizes, report.batch, seed)
    entry = HeadDimRun(sizes, bound)
    fresh = {k: v.copy() for k, v in run.arrays.items()}
    runner(fresh, run.dims, run.seed)
    entry.errors = _compare(run, fresh, report.tolerance, f"at {changed}, ", report.problems)
    line = f"head dim {bound} kernels at {changed}: max rel error {max(entry.errors.values(), default=0.0):.2e}"
    if executable is not None:
        race, results = _tsan_run(executable, code, {k: v.copy() for k, v in run.arrays.items()}, run.dims,
                                  timeout=900, seed=run.seed)
        entry.tsan_errors = _compare(run, results, report.tolerance, f"under TSan at {changed}, ", report.problems)
        if race:
            report.tsan_report = (report.tsan_report or "") + race
            report.problems.append(f"ThreadSanitizer reported a data race at {changed}")
            say("ThreadSanitizer: DATA RACE\n" + "\n".join("  " + line for line in _race_summary(race)))
        line += ", under TSan " + ("a DATA RACE" if race else "no race")
    ok = not any(e > report.tolerance for e in (*entry.errors.values(), *entry.tsan_errors.values()))
    say(line + ("  ok" if ok else "  FAIL"))
    report.head_dim_runs.append(entry)


def _race_summary(report: str, limit: int = 12) -> list[str]:
    """The lines of a TSan report a person reads: the warning, the accesses, their top frames."""
    keep = re.compile(r"WARNING: ThreadSanitizer|(Read|Write|Atomic \w+) of size|Previous (read|write)|#[01] |SUMMARY")
    lines = [line.strip() for line in report.splitlines() if keep.search(line)]
    return [line if len(line) <= 160 else line[:157] + "..." for line in lines[:limit]]


def _say_gate(gate: GateResult, say: Callable[[str], None]) -> None:
    if gate.skipped:
        say(f"compile gate: skipped: {gate.skipped}")
        return
    say(f"compile gate (nvcc -arch=sm_90 -cubin -Xptxas -v): {'ok' if gate.ok else 'FAILED'}, "
        f"{len(gate.kernels)} kernels")
    say(f"  {'kernel':<44}{'registers':>10}{'smem B':>9}{'spill B':>9}")
    for k in gate.kernels:
        say(f"  {k.name:<44}{k.registers:>10}{k.shared_bytes:>9}{k.spill_stores + k.spill_loads:>9}")
    for problem in gate.problems:
        say(f"  problem: {problem}")
