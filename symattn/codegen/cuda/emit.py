"""Assemble the emitted files from a `KernelPlan`: .cu, .h, cuda_host.h, README.md.

Contract: `render(plan)` returns {file name: text}. `<spec>.cu` holds the
kernels (forward first, then backward, each with a comment giving the formula
it computes) and the host code: a workspace layout and the `extern "C"`
launch functions declared in `<spec>.h`:

    size_t <spec>_workspace_bytes(dims..., int batch);
    int <spec>_forward(given..., outputs..., float* workspace, dims..., int batch, cudaStream_t stream);
    int <spec>_backward(given..., outputs..., grad_outputs..., grad_inputs_and_params...,
                        float* workspace, dims..., int batch, cudaStream_t stream);

`given` is every input, param and buffer in declaration order; a buffer has no
gradient. Pointers are device pointers (host pointers under the CPU emulation),
float32, row-major, with a leading batch axis on inputs, buffers, outputs and
their gradients (params and their gradients have none). The backward reads the workspace the
forward filled with the same arguments. The launch functions check sizes and
grid limits before launching anything, clear a stale CUDA error on entry, and
check every launch (`SA_CHECK_LAUNCH`), returning the first failure's status;
kernels run asynchronously on `stream` (the CPU emulation ignores it). A spec
with a fused attention core also gets, per core, `<core>_forward_{bf16,f16}`
and `<core>_backward_{bf16,f16}` (the core alone on tensor cores:
`tensor_core`, `tensor_core_backward`) and the file `cuda_warp.h` they
include. The only user text in any file is the spec's validated identifiers
and formulas printed from the typed IR.
"""

from __future__ import annotations

from importlib import resources

from ...version import __version__
from ...ir.shapes import format_dim, format_shape
from ...ir.sizes import constraints
from .flash import FLASH_PRELUDE, HEAD_DIMS, Sizes
from .kernels import PRELUDE, Buffer, Kernel, helpers_for
from .plan import KernelPlan
from .tensor_core import TC_DTYPES, TC_PRELUDE
from .tensor_core_backward import BACKWARD_PRELUDE, backward
from .syntax import dim_c, numel_c, quotients

__all__ = ["render", "runtime_header"]

STATUS = """\
#ifndef SYMATTN_STATUS_CODES
#define SYMATTN_STATUS_CODES
/* Return values of the launch functions; a positive value is a cudaError_t. */
enum {
    SYMATTN_OK = 0,
    SYMATTN_BAD_SIZE = -1,              /* a dim or the batch is not positive, or a quotient of dims is not whole */
    SYMATTN_HEAD_DIM_TOO_LARGE = -2,    /* a fused attention core's head dim exceeds the largest instantiated */
    SYMATTN_GRID_TOO_LARGE = -3,        /* a launch would need more blocks than a grid axis holds */
    SYMATTN_UNSUPPORTED = -4            /* a tensor-core entry: head dim not a multiple of 8 or over 256, a
                                           pointer not 16-byte aligned, or a folded score scale that is not
                                           positive and finite (use the fp32 <spec>_forward) */
};
#endif

/* The CUDA runtime's own definition (driver_types.h), repeated so that C callers need no CUDA header. */
#ifndef __DRIVER_TYPES_H__
typedef struct CUstream_st* cudaStream_t;
#endif"""

HOST_PRELUDE = """\
// Host side: grid limits of sm_90 (blocks along grid.x, and along grid.y or grid.z), and the check
// after every launch (a cudaError_t, as the function's status; always 0 under the CPU emulation).
#define SA_GRID_X_MAX 2147483647LL
#define SA_GRID_YZ_MAX 65535
#define SA_CHECK_LAUNCH() do { const int status_ = SA_LAST_ERROR(); if (status_ != 0) return status_; } while (0)
"""


def runtime_header(name: str = "cuda_host.h") -> str:
    return resources.files("symattn").joinpath(f"runtime/{name}").read_text("utf-8")


def _shape(plan: KernelPlan, buffer: Buffer) -> str:
    shape = format_shape(buffer.shape, list(plan.spec.dims)) if buffer.shape else "[]"
    return ("[batch, " + shape[1:] if shape != "[]" else "[batch]") if buffer.batched else shape


def _dims_params(plan: KernelPlan) -> str:
    return ", ".join([f"int {d}" for d in plan.dims] + [f"int {plan.batch}"])


def _dims_args(plan: KernelPlan) -> str:
    return ", ".join([*plan.dims, plan.batch])


def signatures(plan: KernelPlan) -> dict[str, str]:
    p = plan
    forward = ([f"const float* {b.name}" for b in p.inputs] + [f"float* {b.name}" for b in p.outputs]
               + [f"float* {p.workspace_arg}"])
    backward = ([f"const float* {b.name}" for b in (*p.inputs, *p.outputs, *p.upstream)]
                + [f"float* {b.name}" for b in p.gradients] + [f"float* {p.workspace_arg}"])
    tail = _dims_params(p) + (f", unsigned long long {p.seed}" if p.seed else "") + f", cudaStream_t {p.stream_arg}"
    return {
        "workspace": f"size_t {p.prefix}_workspace_bytes({_dims_params(p)})",
        "forward": f"int {p.prefix}_forward({', '.join(forward)}, {tail})",
        "backward": f"int {p.prefix}_backward({', '.join(backward)}, {tail})",
    }


def _header(p: KernelPlan) -> str:
    sig = signatures(p)
    return "\n".join([
        f"/* {p.prefix}.h: launch functions for the spec {p.prefix}, generated by symattn {__version__}.",
        "   See README.md beside this file for every argument. */",
        "#pragma once",
        "#include <stddef.h>",
        "",
        STATUS,
        "",
        "#ifdef __cplusplus",
        'extern "C" {',
        "#endif",
        "",
        "/* Bytes of device memory the forward and backward need as `workspace`. */",
        sig["workspace"] + ";",
        "/* Outputs from inputs and params; fills `workspace` for the backward. */",
        sig["forward"] + ";",
        "/* Gradients of every input and param, given grad(output); reads the forward's `workspace`. */",
        sig["backward"] + ";",
        "",
        *_tensor_core_declarations(p),
        "#ifdef __cplusplus",
        "}",
        "#endif",
        "",
    ])


def _layout(p: KernelPlan) -> str:
    struct = f"{p.prefix}_workspace_layout"
    fields = [f"    float* {b.name};  // {_shape(p, b)}: {b.note}" for b in p.workspace]
    lines = ["// The workspace: every intermediate the forward keeps for the backward, then the backward's own.",
             f"struct {struct} {{", *fields, "};", "",
             "// Carves `workspace` into the buffers above; returns the number of floats needed.",
             f"static size_t {p.prefix}_layout(float* workspace, {_dims_params(p)}, {struct}* ws_) {{",
             "    size_t used_ = 0;"]
    for b in p.workspace:
        lines += [f"    ws_->{b.name} = workspace ? workspace + used_ : nullptr;",
                  f"    used_ += sa_round_up((size_t){p.batch} * ({numel_c(b.shape, p.names)}));"]
    lines += ["    return used_;", "}", "",
              f'extern "C" {signatures(p)["workspace"]} {{',
              f"    {struct} ws_;",
              f"    return {p.prefix}_layout(nullptr, {_dims_args(p)}, &ws_) * sizeof(float);",
              "}"]
    return "\n".join(lines)


def _arguments(p: KernelPlan, kernel: Kernel, sliced: bool) -> str:
    """The launch's arguments; `sliced`: batched pointers advanced to the batch entry b0_."""
    def pointer(b: Buffer) -> str:
        return f"{b.host} + b0_ * ({numel_c(b.shape, p.names)})" if sliced and b.batched else b.host
    args = [pointer(b) for b in (*kernel.writes, *kernel.reads)] + [expr for _, expr in kernel.extra]
    if kernel.takes_dims:
        args += p.dims + p.kernel_ints(sliced)
    return ", ".join(args)


def _dispatch(kernel: Kernel, grid: str, args: str, stream: str, indent: str) -> list[str]:
    """SA_LAUNCH of the kernel, or of the variant (head dim) that fits."""
    block = f"dim3({', '.join(kernel.block)})"
    if not kernel.variants:
        return [f"{indent}SA_LAUNCH({kernel.name}, {grid}, {block}, {stream}, {args});"]
    extra = dict(kernel.extra)
    larger = (extra["d_qk_"] if extra["d_qk_"] == extra["d_v_"]
              else f"{extra['d_qk_']} > {extra['d_v_']} ? {extra['d_qk_']} : {extra['d_v_']}")
    lines = [f"{indent}{{", f"{indent}    const int head_dim_ = {larger};"]
    for k, (condition, name) in enumerate(kernel.variants):
        launch = f"SA_LAUNCH({name}, {grid}, {block}, {stream}, {args});"
        if k == len(kernel.variants) - 1:
            lines.append(f"{indent}    else {launch}  // checked above")
        else:
            lines.append(f"{indent}    {'if' if k == 0 else 'else if'} ({condition}) {launch}")
    return lines + [f"{indent}}}"]


def _launch(p: KernelPlan, kernel: Kernel) -> list[str]:
    lines = [f"    // {kernel.comment[0]}"]
    if kernel.batch_axis is None:
        grid = f"dim3({', '.join(kernel.grid)})"
        return [*lines, *_dispatch(kernel, grid, _arguments(p, kernel, False), p.stream_arg, "    "),
                "    SA_CHECK_LAUNCH();"]
    assert not kernel.variants, kernel.name
    per = kernel.per_entry
    most = "SA_GRID_YZ_MAX" if per == "1" else f"SA_GRID_YZ_MAX / ({per})"
    axes = list(kernel.grid)
    axes[kernel.batch_axis] = "slice_" if per == "1" else f"slice_ * ({per})"
    lines += [f"    for (long long b0_ = 0; b0_ < {p.batch}; b0_ += {most}) {{  // entries b0_ ... b0_ + slice_ - 1",
              f"        const int slice_ = (int)({p.batch} - b0_ < {most} ? {p.batch} - b0_ : {most});",
              *_dispatch(kernel, f"dim3({', '.join(axes)})", _arguments(p, kernel, True), p.stream_arg, "        "),
              "        SA_CHECK_LAUNCH();",
              "    }"]
    return lines


def _size_checks(p: KernelPlan) -> list[str]:
    # a dim used only as a number (a window side) may be 0; every other size is at least 1
    least = {d: 0 if d in p.spec.dims and not p.spec.dims[d].symbol.is_positive else 1 for d in p.dims}
    sizes = " || ".join(f"{d} {'<=' if least.get(d, 1) else '<'} 0" for d in [*p.dims, p.batch])
    lines = [f"    if ({sizes}) return SYMATTN_BAD_SIZE;"]
    for dim, num, den in quotients(c.dim for c in constraints(p.spec)):
        lines.append(f"    if ({dim_c(num, p.names)} % {dim_c(den, p.names)} != 0) return SYMATTN_BAD_SIZE;"
                     f"  // {format_dim(dim, list(p.spec.dims))} must be a whole number")
    return lines


def _checks(p: KernelPlan, kernels: list[Kernel]) -> list[str]:
    lines = _size_checks(p)
    for core in p.cores:
        s = Sizes(core, p.names)
        dims = dict.fromkeys((s.d_qk, s.d_v))  # once each: d_qk and d_v are often the same dim
        lines.append(f"    if ({' || '.join(f'{d} > {HEAD_DIMS[-1]}' for d in dims)}) "
                     f"return SYMATTN_HEAD_DIM_TOO_LARGE;  // {core.output}: fused kernels up to {HEAD_DIMS[-1]}")
    for limit in dict.fromkeys(limit for kernel in kernels for limit in kernel.limits):
        wide = limit.blocks if limit.blocks.startswith("(long long)") else f"(long long)({limit.blocks})"
        lines.append(f"    if ({wide} > {limit.most}) return SYMATTN_GRID_TOO_LARGE;  // blocks along one grid axis")
    return lines


def _host(p: KernelPlan, which: str, kernels: list[Kernel]) -> str:
    lines = [f'extern "C" {signatures(p)[which]} {{', *_checks(p, kernels),
             f"    {p.prefix}_workspace_layout ws_;",
             f"    {p.prefix}_layout({p.workspace_arg}, {_dims_args(p)}, &ws_);",
             "    (void)SA_LAST_ERROR();  // clear an error left by earlier work: a failure below is this call's"]
    for kernel in kernels:
        lines += _launch(p, kernel)
    lines += ["    return SYMATTN_OK;", "}"]
    return "\n".join(lines)


def _tensor_core_declarations(p: KernelPlan) -> list[str]:
    lines = []
    for forward in p.tensor_cores:
        lines += [f"/* {forward.core.output} alone on tensor cores: Q, K, V and O in bf16 (or f16), lse in fp32. */",
                  *[forward.signature(dtype) + ";" for dtype in TC_DTYPES],
                  "/* Its gradients (fp32) given grad(O) in the same type, O and lse from the forward above. */",
                  *[backward(forward).signature(dtype) + ";" for dtype in TC_DTYPES], ""]
    return lines


def _tensor_core_section(p: KernelPlan) -> list[str]:
    if not p.tensor_cores:
        return []
    lines = ["// ======================== attention cores on tensor cores ========================", ""]
    for forward in p.tensor_cores:
        grads = backward(forward)
        lines += [forward.text, "", grads.text, ""]
        lines += [forward.host(dtype, _size_checks(p)) + "\n" for dtype in TC_DTYPES]
        lines += [grads.host(dtype, _size_checks(p)) + "\n" for dtype in TC_DTYPES]
    return lines


def _source(p: KernelPlan) -> str:
    path = ("fused: the attention core" + ("s " if len(p.cores) > 1 else " ")
            + ", ".join(c.output for c in p.cores) + " by FlashAttention-2 style kernels, the rest generic"
            if p.cores else "generic (no softmax(score(Q @ K.T)) @ V core to fuse)")
    parts = [
        f"// {p.prefix}.cu: CUDA forward and backward of the spec {p.prefix}, generated by symattn {__version__}.",
        "// Do not edit: regenerate with `symattn emit cuda SPEC -o DIR`. README.md lists every argument.",
        f"// Path: {path}.",
        "//",
        "// The same text builds for a GPU with nvcc and for the CPU with a C++20 compiler",
        "// (cuda_host.h emulates blocks, threads, __shared__ and __syncthreads).",
        "#include <cstddef>",
        '#include "cuda_host.h"',
        *(['#include "philox.h"  // dropout\'s masks: Philox-4x32-10, drawn in the kernels'] if p.seed else []),
        f'#include "{p.prefix}.h"',
        "",
        PRELUDE,
        HOST_PRELUDE,
    ]
    body = ["// ======================== forward kernels ========================", ""]
    body += [k.text + "\n" for k in p.forward]
    body += ["// ======================== backward kernels ========================", ""]
    body += [k.text + "\n" for k in p.backward]
    body += ["// ======================== host code ========================", "", _layout(p), "",
             _host(p, "forward", p.forward), "", _host(p, "backward", p.backward), ""]
    helpers = helpers_for("\n".join([*p.helpers, *body]))
    if helpers:
        parts += [helpers, ""]
    if p.cores:
        parts += [FLASH_PRELUDE, *[h + "\n" for h in p.helpers]]
    if p.tensor_cores:
        parts += [TC_PRELUDE, BACKWARD_PRELUDE]
    return "\n".join(parts + body + _tensor_core_section(p))


def _tensor_core_readme(p: KernelPlan) -> list[str]:
    if not p.tensor_cores:
        return []
    lines = ["## Tensor cores: the attention cores alone, bf16 or f16", "```c"]
    lines += [f.signature(dtype) + ";" for f in p.tensor_cores for dtype in TC_DTYPES]
    lines += [backward(f).signature(dtype) + ";" for f in p.tensor_cores for dtype in TC_DTYPES]
    lines += ["```"]
    for f in p.tensor_cores:
        c, order = f.core, list(p.spec.dims)
        lead = "".join(format_dim(d, order) + ", " for d in c.lead)
        lines.append(f"- `{f.prefix}_forward_<dtype>`: `{c.output}` = softmax(score(`{c.q}` @ `{c.k}`.T)) @ `{c.v}` "
                     f"with `Q` = `{c.q}` `[batch, {lead}{format_dim(c.n_q, order)}, {format_dim(c.d_qk, order)}]`, "
                     f"`K` = `{c.k}` `[batch, {lead}{format_dim(c.n_k, order)}, {format_dim(c.d_qk, order)}]`, "
                     f"`V` = `{c.v}` `[batch, {lead}{format_dim(c.n_k, order)}, {format_dim(c.d_v, order)}]`, "
                     f"`O` `[batch, {lead}{format_dim(c.n_q, order)}, {format_dim(c.d_v, order)}]` in the input "
                     f"type, `lse` `[batch, {lead}{format_dim(c.n_q, order)}]` float32 (row logsumexp; -inf and "
                     "O = 0 on a fully masked row).")
    lines += ["",
              "FlashAttention-2 style: mma.sync m16n8k16 with fp32 accumulation; the forward has 128 query rows per",
              "block of 4 warps up to head dim 128 (64 at 256), tiles of 64 keys (32 at head dims 96 and 128) of K and",
              "V double-buffered with cp.async, and a softmax in exp2 by ex2.approx (one FFMA per score when the",
              "score is c * (Q @ K.T) + b, c > 0); key tiles that the score's mask hides entirely are skipped. The",
              "backward has 64 keys per block and 64-row query tiles. `_backward_<dtype>` takes `Q`, `K`, `V`, `O`, `dO` = grad(O) in the input type and the",
              "forward's `lse`, writes `dQ`, `dK`, `dV` in float32 (same shapes as Q, K, V) and uses `delta` (float32,",
              "the shape of `lse`) as scratch: dQ zeroed, delta = rowsum(dO * O), then one pass per key block: dK/dV",
              "in registers, dQ added with float32 atomics (so dQ's low bits may differ from run to run).",
              "Head dims (of Q/K and of V) must be multiples of 8, up to 256 (forward) or 128 (backward), and every",
              "16-bit pointer 16-byte aligned; otherwise they return `SYMATTN_UNSUPPORTED` (-4) and the float32",
              "functions above are the fallback.",
              "Build for sm_80 or newer (`-arch=sm_90`); `cuda_warp.h` holds the instructions and their CPU emulation.",
              ""]
    return lines


def _readme(p: KernelPlan) -> str:
    spec = p.spec
    sig = signatures(p)
    rows = []

    def row(name, shape, role, code=True):
        rows.append(f"| `{name}` | {f'`{shape}`' if code else shape} | {role} |")

    for b, given in zip(p.inputs, spec.arguments):
        info = spec.tensors[given]
        if info.integer:  # its integers as float32 (exact below 2^24): every argument is a float pointer
            low, high = (format_dim(v, list(spec.dims)) for v in info.values)
            row(b.name, _shape(p, b), f"integer buffer: integers {low} to {high} - 1, passed as float32 (exact "
                "below 2^24; a subscript reads it as an int)")
        else:
            row(b.name, _shape(p, b), f"{b.kind} (forward and backward)")
    for b in p.outputs:
        row(b.name, _shape(p, b), "output: written by the forward, read by the backward")
    for b in p.upstream:
        row(b.name, _shape(p, b), f"upstream gradient {b.note} (backward)")
    for b in p.gradients:
        summed = ", summed over the batch" if not b.batched else ""
        row(b.name, _shape(p, b), f"result {b.note} = dL/d{b.note[5:-1]} (backward{summed})")
    row(p.workspace_arg, f"`{p.prefix}_workspace_bytes(...)` bytes", "device scratch: the forward fills it, the "
        "backward reads it (pass the same one, with the same sizes)", code=False)
    for d in spec.dims:
        row(p.names.spec("dim", d), "int", f"dim {d} (the spec's default is {spec.sizes[d]})")
    row(p.batch, "int", "number of batch entries: a leading axis of inputs, outputs and their gradients")
    if p.seed:
        masks = ", ".join(f"`{spec.tensors[m].dropout.of}` (stream {spec.tensors[m].dropout.stream}, p = "
                          f"{spec.tensors[m].dropout.p_text})" for m in spec.dropouts)
        row(p.seed, "unsigned long long", f"dropout's seed: the masks of {masks} are drawn in the kernels, entry n "
            "(flat, row-major, batch axis included) kept iff Philox-4x32-10 word 0 at counter (n low, n high, "
            "stream, 0) under key (seed low, seed high) is at least floor(p * 2^32), as on every symattn target; "
            "pass the same seed to the backward, which draws them again")
    row(p.stream_arg, "cudaStream_t", "the stream every kernel is launched on (0 or NULL: the default stream; "
        "the CPU emulation ignores it)")
    kernels = [f"| `{k.name}` | {k.phase} | {k.comment[0]} |" for k in (*p.forward, *p.backward)]
    fused = "\n".join(f"- `{c.output}` = softmax(score(`{c.q}` @ `{c.k}`.T)) @ `{c.v}`: fused; "
                      f"{', '.join(c.chain) or 'no intermediate'} never stored" for c in p.cores)
    return "\n".join([
        f"# CUDA kernels for `{p.prefix}`",
        "",
        f"Generated by symattn {__version__}; do not edit, regenerate with `symattn emit cuda SPEC -o DIR`.",
        "",
        "## Files",
        f"- `{p.prefix}.cu`: the kernels and the host launch functions",
        f"- `{p.prefix}.h`: the C declarations below",
        "- `cuda_host.h`: lets the same `.cu` compile with nvcc, or with g++ for the CPU (emulation, for tests)",
        *(["- `philox.h`: dropout's generator, Philox-4x32-10, on the device and the host"] if p.seed else []),
        "",
        "## Build",
        "```sh",
        f"nvcc -O3 -arch=sm_90 -shared -Xcompiler -fPIC {p.prefix}.cu -o lib{p.prefix}.so",
        f"g++ -O1 -std=c++20 -shared -fPIC -pthread -x c++ {p.prefix}.cu -o lib{p.prefix}_cpu.so   # CPU emulation",
        "```",
        "",
        "## Functions",
        "```c",
        sig["workspace"] + ";",
        sig["forward"] + ";",
        sig["backward"] + ";",
        "```",
        "Pointers are device pointers to float32, row-major and contiguous. Each returns 0 on success,",
        "`SYMATTN_BAD_SIZE` (-1) for a non-positive size or a quotient of sizes (`d / h`) that does not",
        "divide, `SYMATTN_HEAD_DIM_TOO_LARGE` (-2) when a fused core's head dim exceeds "
        f"{HEAD_DIMS[-1]} (regenerate",
        "with the generic path), `SYMATTN_GRID_TOO_LARGE` (-3) when a launch would need more blocks than",
        "a grid axis holds (see Limits), or the `cudaError_t` of the first launch that failed. The sizes",
        "and grid limits are checked before anything is launched. On entry the function clears an error",
        "left by earlier work (`cudaGetLastError`), and it checks every launch.",
        "Kernels are launched asynchronously on `stream` (a `cudaStream_t`; 0 is the default stream):",
        "synchronize that stream before reading the results on the host. The header declares",
        "`cudaStream_t` itself when `<cuda_runtime.h>` was not included first.",
        "",
        "## Arguments",
        "| name | shape | role |",
        "| --- | --- | --- |",
        *rows,
        "",
        "The backward computes the gradients of L = sum over outputs of <O, grad(O)>.",
        "",
        "## Limits",
        "- float32 (the tensor-core functions: bf16 or f16); every tensor contiguous and row-major, with the shapes above.",
        "- Grid: a fused core counts (query or key row blocks of 64 rows, 32 above head dim 64) x heads",
        "  x batch on grid.x: at most 2^31 - 1 blocks. Generic kernels put the batch on grid.y or grid.z",
        "  (times the leading axes of a matrix product): a batch beyond 65535 is split into several",
        "  launches; a product's leading axes (without the batch) and its row tiles (rows / 32) are at",
        "  most 65535. Beyond a limit: status -3.",
        f"- Fused attention cores: head dims (of Q/K and of V) up to {HEAD_DIMS[-1]}.",
        "- Generic path: a softmax over N keys stores its N x N weights in the workspace.",
        "",
        *_tensor_core_readme(p),
        "## Path",
        fused or "Generic: per-stage kernels (tiled matmul, fused elementwise, row softmax and reductions).",
        *[f"- {note}" for note in p.notes],
        "",
        "## Kernels",
        "| kernel | pass | computes |",
        "| --- | --- | --- |",
        *kernels,
        "",
    ])


def render(plan: KernelPlan) -> dict[str, str]:
    files = {
        f"{plan.prefix}.cu": _source(plan),
        f"{plan.prefix}.h": _header(plan),
        "cuda_host.h": runtime_header(),
        "README.md": _readme(plan),
    }
    if plan.tensor_cores:
        files["cuda_warp.h"] = runtime_header("cuda_warp.h")
    if plan.seed:
        files["philox.h"] = runtime_header("philox.h")
    return files
