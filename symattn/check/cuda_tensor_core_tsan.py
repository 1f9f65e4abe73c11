"""The tensor-core entry points under ThreadSanitizer (cuda_warp.h's emulation, one std::thread per CUDA thread).

Contract: `tsan_driver(code)` is the C++ text of a function
`run_tensor_cores(argc, argv)` that the TSan driver of `check.cuda` calls
when its first argument is `tc`: it reads the 16-bit patterns of Q, K, V and
grad(O) of one fused core (chosen by index), runs `<core>_forward_<dtype>`
then `<core>_backward_<dtype>`, and writes O's patterns, lse, dQ, dK and dV.
`tsan_tensor_cores(executable, code, sizes, batch)` runs it once per fused
core at one head dim (64 by default; the sequence dims stay those of the
fp32 check, 67 and such, not a multiple of any tile) and returns TSan's
report ('' when no race) and one `TensorCoreCase` per core, scored against
the float64 reference of `check.cuda_tensor_core` with its tolerances.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
from pathlib import Path
from typing import Mapping

import numpy as np

from ..codegen.cuda import CudaCode
from .cuda_tensor_core import (TensorCoreCase, case_inputs, case_shapes, decode, head_dim_sizes, round_to,
                               score_case)

__all__ = ["TSAN_DTYPE", "TSAN_HEAD_DIM", "tsan_driver", "tsan_tensor_cores"]

TSAN_DTYPE = "bf16"
TSAN_HEAD_DIM = 64
COUNTS = ("q", "k", "v", "o", "lse")  # element counts the driver takes after the dims, in this order


def tsan_driver(code: CudaCode, dtype: str = TSAN_DTYPE) -> str:
    """`static int run_tensor_cores(int argc, char** argv)`: argv = tc CORE IN OUT dims... batch counts..."""
    p = code.plan
    n_dims = len(p.dims) + 1
    dims = ", ".join(f"dims[{k}]" for k in range(n_dims))
    lines = ["static std::vector<unsigned short> take16(FILE* f, long n) {",
             "    std::vector<unsigned short> v(n > 0 ? n : 1);",
             "    if (n > 0 && fread(v.data(), 2, n, f) != (size_t)n) exit(3);",
             "    return v;", "}", "",
             "static int run_tensor_cores(int argc, char** argv) {",
             f"    if (argc != {5 + n_dims + len(COUNTS)}) return 2;",
             "    int core = atoi(argv[2]);",
             '    FILE* in = fopen(argv[3], "rb");', "    if (!in) return 4;",
             "    int a = 5;",
             "    int dims[] = {" + ", ".join("atoi(argv[a++])" for _ in range(n_dims)) + "};",
             f"    long n[{len(COUNTS)}];",
             f"    for (int k = 0; k < {len(COUNTS)}; ++k) n[k] = atol(argv[a++]);",
             "    std::vector<unsigned short> q = take16(in, n[0]), k = take16(in, n[1]), v = take16(in, n[2]),",
             "                                do_ = take16(in, n[3]), o(n[3] > 0 ? n[3] : 1);",
             "    fclose(in);",
             "    std::vector<float> lse(n[4] > 0 ? n[4] : 1), delta(lse.size()), dq(q.size()), dk(k.size()),",
             "                       dv(v.size());",
             "    int status = -100;",
             "    switch (core) {"]
    for index, forward in enumerate(p.tensor_cores):
        lines += [f"    case {index}:",
                  f"        status = {forward.prefix}_forward_{dtype}(q.data(), k.data(), v.data(), o.data(), "
                  f"lse.data(), {dims}, nullptr);",
                  "        if (status != 0) return 10;",
                  f"        status = {forward.prefix}_backward_{dtype}(q.data(), k.data(), v.data(), o.data(), "
                  f"do_.data(), lse.data(), dq.data(), dk.data(), dv.data(), delta.data(), {dims}, nullptr);",
                  "        if (status != 0) return 11;",
                  "        break;"]
    lines += ["    default: return 12;", "    }",
              '    FILE* out = fopen(argv[4], "wb");', "    if (!out) return 7;",
              "    fwrite(o.data(), 2, n[3], out);", "    fwrite(lse.data(), 4, n[4], out);",
              "    fwrite(dq.data(), 4, n[0], out);", "    fwrite(dk.data(), 4, n[1], out);",
              "    fwrite(dv.data(), 4, n[2], out);",
              "    fclose(out);", "    return 0;", "}", ""]
    return "\n".join(lines)


def tsan_tensor_cores(executable: Path, code: CudaCode, sizes: Mapping[str, int], batch: int,
                      head_dim: int = TSAN_HEAD_DIM, dtype: str = TSAN_DTYPE, seed: int = 0,
                      timeout: float = 900) -> tuple[str, list[TensorCoreCase]]:
    """Run each fused core's `dtype` forward and backward under TSan; (the reports joined, the cases)."""
    spec = code.plan.spec
    rng = np.random.default_rng(seed)
    reports, cases = [], []
    for index, forward in enumerate(code.plan.tensor_cores):
        core = forward.core
        chosen = head_dim_sizes(spec, core, sizes, head_dim)
        case = TensorCoreCase(core.output, dtype, head_dim, chosen if isinstance(chosen, dict) else {})
        cases.append(case)
        if isinstance(chosen, str):
            case.skipped = chosen
            continue
        shapes = case_shapes(core, chosen, batch)
        bits, values = case_inputs(core, shapes, dtype, rng)
        bits["do"], values["do"] = round_to(rng.standard_normal(shapes["o"]), dtype)
        counts = [int(np.prod(shapes[r])) for r in ("q", "k", "v", "o")] + [int(np.prod(shapes["o"][:-1]))]
        dims = [chosen[d] for d in spec.dims] + [batch]
        with tempfile.TemporaryDirectory() as tmp:
            inp, out = Path(tmp) / "in.bin", Path(tmp) / "out.bin"
            inp.write_bytes(b"".join(bits[r].tobytes() for r in ("q", "k", "v", "do")))
            env = dict(os.environ, TSAN_OPTIONS="halt_on_error=0 exitcode=66 report_signal_unsafe=0")
            cmd = [str(executable), "tc", str(index), str(inp), str(out), *map(str, dims), *map(str, counts)]
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
            report = done.stderr if "ThreadSanitizer" in done.stderr else ""
            if done.returncode not in (0, 66) or (done.returncode == 66 and not report):
                raise RuntimeError(f"the TSan driver's tensor-core run of {forward.prefix} failed "
                                   f"(exit {done.returncode}):\n{done.stderr[-2000:]}")
            data = out.read_bytes()
        reports.append(report)
        o_bytes = 2 * counts[3]
        o = decode(np.frombuffer(data[:o_bytes], dtype=np.uint16).reshape(shapes["o"]), dtype)
        floats = np.frombuffer(data[o_bytes:], dtype=np.float32)
        pieces, offset = {}, 0
        for label, shape in (("lse", shapes["o"][:-1]), ("dQ", shapes["q"]), ("dK", shapes["k"]),
                             ("dV", shapes["v"])):
            size = int(np.prod(shape))
            pieces[label] = floats[offset: offset + size].reshape(shape)
            offset += size
        score_case(case, spec, core, values, o, pieces.pop("lse"), pieces)
    return "".join(reports), cases
