"""The static part of every generated Triton module: helpers, tile configs and the launcher class.

Contract: `PRELUDE` (imports, `_tanh`/`_pow` helpers: libdevice on a GPU,
plain arithmetic under `TRITON_INTERPRET=1`) and `RUNTIME` (the tile configs
with their pruning by head dim, and `_Core`, whose `forward` and `backward`
broadcast the batch axes, view Q, K, V as [B, H, N, d] with strides, launch
the kernels on a (tiles, B * H) grid and sum gradients back to each
argument's shape) are Python source copied into the module verbatim. Under
the interpreter the kernels run with one fixed small config (16 x 16 tiles,
so that small tests cross tile borders); on a GPU they are autotuned over
`FWD_CONFIGS`, `DKDV_CONFIGS`, `DQ_CONFIGS` (keyed on the sizes, pruned
by the shared memory and accumulator registers a config needs at the head dim).

`PHILOX` is the source of the `@triton.jit` device function
`_dropout_keep_block(seed, stream, index, threshold)` that a module whose
kernels apply `dropout` adds after the prelude: whether dropout keeps the
entries of a block at the flat positions `index` (an integer block computed
from the program's block indices, as int64 where positions reach 2**31),
under the contract of `symattn.ir.philox` (Philox-4x32-10, key (seed low,
seed high), counter (index low, index high, stream, 0), kept iff word 0 >=
threshold). It calls `tl.philox`, which is Random123's Philox-4x32-10 with
that key for 32-bit counter words (tests/codegen/all_targets/test_philox_targets.py
checks it bit for bit); `tl.randint4x(seed, offset)` is the same generator at
counter (offset low, offset high, 0, 0), stream 0 only. The kernel is handed
`seed`, `stream` and `threshold` as integers (never p); the seed may reach
2**64 - 1 (Triton passes it as uint64).
"""

from __future__ import annotations

__all__ = ["PRELUDE", "RUNTIME", "CONFIGS", "PHILOX"]

# (BLOCK_M, BLOCK_N, num_warps, num_stages) per kernel, best first; the compile gate builds the first
# one that the head dim keeps.
CONFIGS = {
    "fwd": [(128, 64, 8, 3), (64, 64, 4, 3), (64, 32, 4, 2), (64, 32, 8, 2)],
    "dkdv": [(32, 128, 8, 2), (64, 64, 4, 2), (32, 64, 8, 2), (16, 32, 8, 1)],
    "dq": [(128, 32, 8, 2), (64, 64, 4, 2), (64, 32, 8, 2), (32, 32, 8, 1)],
}

PRELUDE = '''\
import math
import os

import torch
import triton
import triton.language as tl

INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"

if INTERPRET:
    @triton.jit
    def _tanh(x):
        return 2.0 * tl.sigmoid(2.0 * x) - 1.0

    @triton.jit
    def _pow(a, b):
        return tl.exp(b * tl.log(a))
else:
    from triton.language.extra.cuda import libdevice

    @triton.jit
    def _tanh(x):
        return libdevice.tanh(x)

    @triton.jit
    def _pow(a, b):
        return libdevice.pow(a, b)


@triton.jit
def _floordiv(a, b):
    """Python's a // b on integer tiles, whichever way the backend's // rounds (the remainder fixes it). A
    divisor is 0 only on lanes past a tensor's end (a masked load's 0, `N - i` past N: the validator shows
    it nonzero everywhere inside), whose results are never stored: they divide by 1 instead."""
    b = tl.where(b == 0, 1, b)
    q = a // b
    r = a - q * b
    return tl.where((r != 0) & ((r < 0) != (b < 0)), q - 1, q)


@triton.jit
def _mod(a, b):
    """Python's a % b on integer tiles: the sign of b (a lane past the end divides by 1, as in _floordiv)."""
    b = tl.where(b == 0, 1, b)
    return a - _floordiv(a, b) * b


@triton.jit
def _mma(x, UPCAST: tl.constexpr):
    """A tile loaded for tl.dot: as loaded, or as float32 where the interpreter needs it (bfloat16)."""
    if UPCAST:
        x = x.to(tl.float32)
    return x
'''

PHILOX = '''\
@triton.jit
def _dropout_keep_block(seed, stream, index, threshold):
    """Whether dropout keeps the entries at the flat positions `index` (a block): Philox-4x32-10 word 0 at
    counter (index low, index high, stream, 0) under key (seed low, seed high) is at least `threshold`."""
    position = index.to(tl.int64)
    lo = (position & 0xFFFFFFFF).to(tl.uint32)
    hi = ((position >> 32) & 0xFFFFFFFF).to(tl.uint32)
    zero = lo * 0
    word, _, _, _ = tl.philox(seed, lo, hi, zero + tl.to_tensor(stream).to(tl.uint32), zero)
    return word >= tl.to_tensor(threshold).to(tl.uint32)
'''

RUNTIME = '''\
CONFIGS = %(configs)r
SHARED_BUDGET = 160 * 1024  # bytes of shared memory a config may plan for (H100/H200: 227 KiB)


# fp32 accumulator entries per thread a config may hold (more spills at 255 registers)
ACCUMULATORS = {"fwd": 64, "dkdv": 64, "dq": 32}


def _fits(which, config, head_dim):
    """Whether a config's tiles fit the shared memory budget and its accumulators the registers."""
    block_m, block_n, warps, stages = config
    rows = {"fwd": block_m, "dkdv": 2 * block_n, "dq": block_m}[which]
    return ((block_m * head_dim + stages * 2 * block_n * head_dim) * 2 <= SHARED_BUDGET
            and rows * head_dim <= ACCUMULATORS[which] * warps * 32)


def _config(which, head_dim):
    """The first config of `which` that fits the head dim (the last one if none does)."""
    return next((c for c in CONFIGS[which] if _fits(which, c, head_dim)), CONFIGS[which][-1])


def _tuned(kernel, which, reset=()):
    if INTERPRET:
        return kernel

    def prune(configs, named_args, **kwargs):
        head_dim = max(kwargs.get("BLOCK_DQK", 16), kwargs.get("BLOCK_DV", 16))
        kept = [c for c in configs if _fits(which, (c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"], c.num_warps,
                                                    c.num_stages), head_dim)]
        return kept or configs[-1:]

    configs = [triton.Config({"BLOCK_M": m, "BLOCK_N": n}, num_warps=w, num_stages=s) for m, n, w, s in CONFIGS[which]]
    return triton.autotune(configs, key=["n_q_", "n_k_", "d_qk_", "d_v_"], reset_to_zero=list(reset) or None,
                           prune_configs_by={"early_config_prune": prune})(kernel)


def _fixed():
    return dict(BLOCK_M=16, BLOCK_N=16) if INTERPRET else {}


def _fake(x):
    """Whether x is a fake tensor (torch.compile's tracing, a custom op's fake implementation): no kernel runs."""
    return isinstance(x, torch._subclasses.FakeTensor) or x.device.type == "meta"


def _pow2(n):
    return max(16, triton.next_power_of_2(int(n)))


def _sum_to(x, shape):
    """`x` summed over the axes it was broadcast along to get from `shape`."""
    lead = x.ndim - len(shape)
    if lead:
        x = x.sum(dim=tuple(range(lead)))
    axes = tuple(k for k, n in enumerate(shape) if n == 1 and x.shape[k] != 1)
    return x.sum(dim=axes, keepdim=True) if axes else x


class _Core:
    """Launches one attention core's kernels on torch tensors (CUDA, or CPU under the interpreter)."""

    def __init__(self, kernels, lead, reads, dims, binds, defaults):
        self.fwd, self.delta, self.dkdv, self.dq = kernels
        self.lead = lead          # number of head axes
        self.reads = reads        # (name, rank, learned) of each tensor the score loads
        self.dims = dims          # the spec's dims, in kernel argument order
        self.binds = binds        # dim -> (argument index: 0 q, 1 k, 2 v, 3+ reads; axis from the end)
        self.defaults = defaults  # dim -> the spec's size, for dims no shape gives
        learned = [name for name, rank, grad in reads if grad]
        self.fwd_run = _tuned(self.fwd, "fwd")
        self.dkdv_run = _tuned(self.dkdv, "dkdv", reset=["G_" + n for n in learned])
        self.dq_run = _tuned(self.dq, "dq")

    def _prepare(self, q, k, v, operands, sizes):
        if len(operands) != len(self.reads):
            raise TypeError(f"expected {len(self.reads)} score tensors ({', '.join(r[0] for r in self.reads)}), "
                            f"got {len(operands)}")
        core = 2 + self.lead
        operands = [x if torch.is_tensor(x) else torch.as_tensor(x, device=q.device) for x in operands]
        batch = torch.broadcast_shapes(*(x.shape[:x.ndim - core] for x in (q, k, v)),
                                       *(x.shape[:x.ndim - rank] for x, (_, rank, _) in zip(operands, self.reads)))
        # the heads of all three: a head axis of size 1 in K and V is broadcast (GQA, MQA)
        lead_shape = tuple(torch.broadcast_shapes(*(x.shape[x.ndim - core:x.ndim - 2] for x in (q, k, v))))
        B, H = math.prod(batch), math.prod(lead_shape)

        def view(x):
            x = x.expand(*batch, *lead_shape, *x.shape[x.ndim - 2:])
            return x.reshape(B, H, x.shape[-2], x.shape[-1])

        dims = dict(self.defaults)
        args = (q, k, v, *operands)
        for name, (index, axis) in self.binds.items():
            dims[name] = int(args[index].shape[axis])
        dims.update(sizes)
        loads = []
        for x, (name, rank, _) in zip(operands, self.reads):
            if x.ndim > rank:
                x = x.expand(*batch, *x.shape[x.ndim - rank:]).reshape(B, *x.shape[x.ndim - rank:])
                loads.append((x, x.stride(0)))
            else:
                x = x.reshape(1, *x.shape)
                loads.append((x, 0))
        return batch, lead_shape, view(q), view(k), view(v), loads, dims

    def _common(self, q4, k4, v4, loads, dims, lead_shape):
        B, H, n_q, d_qk = q4.shape
        n_k, d_v = k4.shape[2], v4.shape[3]
        operands = [a for x, bs in loads for a in (x, bs, *x.stride()[1:])]
        sizes = [n_q, n_k, d_qk, d_v, H, *lead_shape, *(dims[d] for d in self.dims)]
        precision = "tf32" if q4.dtype == torch.float32 and not INTERPRET else "ieee"
        upcast = INTERPRET and q4.dtype == torch.bfloat16
        meta = dict(BLOCK_DQK=_pow2(d_qk), BLOCK_DV=_pow2(d_v), PRECISION=precision, UPCAST=upcast, **_fixed())
        return operands, sizes, meta

    def forward(self, q, k, v, operands, sizes):
        if _fake(q):  # a fake tensor (torch.compile, the custom op's fake implementation): the shapes alone
            return self._fake_forward(q, k, v, operands)
        batch, lead_shape, q4, k4, v4, loads, dims = self._prepare(q, k, v, operands, sizes)
        B, H, n_q, _ = q4.shape
        d_v = v4.shape[3]
        o4 = torch.empty(B, H, n_q, d_v, dtype=q.dtype, device=q.device)
        lse = torch.empty(B * H, n_q, dtype=torch.float32, device=q.device)
        args, sizes_, meta = self._common(q4, k4, v4, loads, dims, lead_shape)
        grid = lambda m: (triton.cdiv(n_q, m["BLOCK_M"]), B * H)
        self.fwd_run[grid](q4, k4, v4, o4, lse, *args, *q4.stride(), *k4.stride(), *v4.stride(), *o4.stride(),
                           *sizes_, **meta)
        o = o4.reshape(*batch, *lead_shape, n_q, d_v)
        return o, lse.reshape(*batch, *lead_shape, n_q, 1)  # (float32: the backward recomputes P from it)

    def _fake_forward(self, q, k, v, operands):
        core = 2 + self.lead
        batch = torch.broadcast_shapes(*(x.shape[:x.ndim - core] for x in (q, k, v)),
                                       *(x.shape[:x.ndim - rank] for x, (_, rank, _) in zip(operands, self.reads)))
        lead_shape = tuple(torch.broadcast_shapes(*(x.shape[x.ndim - core:x.ndim - 2] for x in (q, k, v))))
        n_q, d_v = q.shape[-2], v.shape[-1]
        return (q.new_empty(*batch, *lead_shape, n_q, d_v), q.new_empty(*batch, *lead_shape, n_q, 1))

    def backward(self, q, k, v, o, lse, do, operands, sizes, dlse=None):
        """(dq, dk, dv, d of each score tensor: None for a buffer); `dlse` the gradient of the row log-sum-exp."""
        if _fake(q):
            return (torch.empty_like(q), torch.empty_like(k), torch.empty_like(v),
                    *(torch.empty_like(x) if grad else None for x, (_, _, grad) in zip(operands, self.reads)))
        batch, lead_shape, q4, k4, v4, loads, dims = self._prepare(q, k, v, operands, sizes)
        B, H, n_q, d_qk = q4.shape
        n_k, d_v = k4.shape[2], v4.shape[3]
        core = 2 + self.lead
        o4 = o.expand(*batch, *lead_shape, n_q, d_v).reshape(B, H, n_q, d_v)
        do4 = do.expand(*batch, *lead_shape, n_q, d_v).reshape(B, H, n_q, d_v)
        lse = lse.expand(*batch, *lead_shape, n_q, 1).reshape(B * H, n_q).float().contiguous()
        args, sizes_, meta = self._common(q4, k4, v4, loads, dims, lead_shape)
        delta = torch.empty(B * H, n_q, dtype=torch.float32, device=q.device)
        block = 16 if INTERPRET else 64
        self.delta[(triton.cdiv(n_q, block), B * H)](o4, do4, delta, *o4.stride(), *do4.stride(), n_q, d_v, H,
                                                     BLOCK_M=block, BLOCK_DV=meta["BLOCK_DV"])
        if dlse is not None:  # d lse / d score = P: the row statistic takes it (delta - dlse)
            delta -= dlse.expand(*batch, *lead_shape, n_q, 1).reshape(B * H, n_q).float()
        grads, gargs = [], []
        for (x, bs), (name, rank, learned) in zip(loads, self.reads):
            if learned:
                g = torch.zeros(x.shape, dtype=torch.float32, device=q.device)
                grads.append(g)
                gargs += [g, g.stride(0) if bs else 0, *g.stride()[1:]]
        dq4 = torch.empty(B, H, n_q, d_qk, dtype=q.dtype, device=q.device)
        dk4 = torch.empty(B, H, n_k, d_qk, dtype=k.dtype, device=q.device)
        dv4 = torch.empty(B, H, n_k, d_v, dtype=v.dtype, device=q.device)
        strides = [*q4.stride(), *k4.stride(), *v4.stride(), *do4.stride()]
        grid_k = lambda m: (triton.cdiv(n_k, m["BLOCK_N"]), B * H)
        self.dkdv_run[grid_k](dk4, dv4, *gargs, q4, k4, v4, do4, lse, delta, *args, *strides, *sizes_,
                              *dk4.stride(), *dv4.stride(), **meta)
        grid_q = lambda m: (triton.cdiv(n_q, m["BLOCK_M"]), B * H)
        self.dq_run[grid_q](dq4, q4, k4, v4, do4, lse, delta, *args, *strides, *sizes_, *dq4.stride(), **meta)
        out = [_sum_to(g4.reshape(*batch, *lead_shape, *g4.shape[2:]), x.shape)
               for g4, x in ((dq4, q), (dk4, k), (dv4, v))]
        learned = iter(grads)
        for x, (name, rank, grad) in zip(operands, self.reads):
            if not grad:
                out.append(None)
                continue
            g = next(learned)
            g = g.reshape(*batch, *g.shape[1:]) if x.ndim > rank else g[0]
            out.append(_sum_to(g, tuple(x.shape)).to(x.dtype))
        return tuple(out)
''' % {"configs": CONFIGS}
