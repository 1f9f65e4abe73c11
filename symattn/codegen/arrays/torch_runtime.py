"""The torch host's runtime helpers: copied, as source text, into the generated torch modules that call them.

Contract: the same helper names, arguments and errors as the NumPy host's
(`symattn.codegen.arrays.numpy_runtime`), written for torch tensors on any
device; `HOST` lists them with the shared plain-Python helpers
(`symattn.codegen.arrays.runtime`) and `runtime(extra, helpers, calls)` is the
`Runtime` of a target that adds its own (the torch target's tiled pass, the
Triton target's launchers), whose `helper_source(name)` the printer copies
into a generated module that uses it (with the helpers it calls in turn), so
that the module needs nothing but torch (and triton). Each
keeps the dtype and device of its tensors (float16, bfloat16, float32 and
float64 stay as they are) and never loops over tokens. A fully masked softmax
row (all -inf) gives weights 0, never NaN, as in the NumPy target.

Dropout's keep test `_dropout_keep(seed, stream, index, threshold)` follows
the contract of `symattn.ir.philox` (Philox-4x32-10, key from the seed,
counter (index low, index high, stream, 0), kept iff word 0 >= threshold)
bit for bit. torch has no uint32 or uint64 arithmetic: the words are held in
int64 tensors, and `_mulhilo32` splits each 32 x 32 bit product into 16-bit
halves so that no partial product reaches 2**63.

This module imports without torch installed (the printer reads the helpers'
source text to emit a module); the helpers need it to run.
"""

from __future__ import annotations

import math

from .runtime import Runtime

try:  # the printer reads the helpers' source without torch; generated modules import torch themselves
    import torch
except ImportError:  # pragma: no cover - exercised where torch is not installed
    torch = None

__all__ = ["HOST", "CALLS", "runtime"]


def _as_float(*arrays):
    """The tensors in their common floating dtype (torch's promotion over the floating ones; none floating:
    the default dtype), on the first tensor's device; no copy when already so."""
    tensors = [a if isinstance(a, torch.Tensor) else torch.as_tensor(a) for a in arrays]
    floating = [a.dtype for a in tensors if a.is_floating_point()]
    if any(a.is_complex() for a in tensors):
        raise ValueError("expected real floating-point tensors, got a complex one")
    dtype = torch.get_default_dtype()
    if floating:
        dtype = floating[0]
        for other in floating[1:]:
            dtype = torch.promote_types(dtype, other)
    device = tensors[0].device
    return dtype, [a.to(device=device, dtype=dtype) for a in tensors]


def _integers(name, array, low, high):
    """An integer buffer as int64 on its device: every entry an integer in low .. high - 1 (ValueError naming it
    otherwise)."""
    array = array if isinstance(array, torch.Tensor) else torch.as_tensor(array)
    if array.is_floating_point():
        if not bool(torch.all(torch.isfinite(array))) or bool(torch.any(array != torch.floor(array))):
            raise ValueError(f"{name}: an integer buffer, got entries that are not integers (dtype {array.dtype})")
    elif array.is_complex():
        raise ValueError(f"{name}: an integer buffer, got a complex tensor")
    values = array.long()
    if values.numel() and (int(values.min()) < low or int(values.max()) >= high):
        raise ValueError(f"{name}: every entry must be in {low} .. {high - 1}, got {int(values.min())} .. "
                         f"{int(values.max())}")
    return values


def _bind(name, array, shape, expected):
    """The sizes of the last len(expected) axes of `array`; ValueError unless they are `expected` (None: any)."""
    rank = len(expected)
    sizes = tuple(array.shape[array.dim() - rank:])
    fits = array.dim() >= rank
    for want, size in zip(expected, sizes):
        if want is not None and want != size:
            fits = False
    if not fits:
        want = ", ".join("?" if e is None else str(e) for e in expected)
        raise ValueError(f"{name}: expected shape {shape} = [{want}] after any leading batch axes, "
                         f"got {list(array.shape)}")
    return sizes


def _batch_axes(*arrays):
    """The broadcast shape of the leading batch axes of (name, tensor, rank) triples; ValueError if none."""
    leading = {name: tuple(array.shape[:array.dim() - rank]) for name, array, rank in arrays}
    if not any(leading.values()):
        return ()
    try:
        return tuple(torch.broadcast_shapes(*leading.values()))
    except RuntimeError:
        shown = ", ".join(f"{name} {list(array.shape)}" for name, array, _ in arrays)
        raise ValueError(f"the leading batch axes do not broadcast: {shown}") from None


def _upstream(name, array, shape, expected, dtype):
    """An upstream gradient: the shape of its output (batch axes broadcast), in the forward pass's dtype."""
    array = array if isinstance(array, torch.Tensor) else torch.as_tensor(array)
    _bind(name, array, shape, expected)
    return array.to(dtype)


def _sum_to(grad, shape):
    """`grad` summed over the batch axes that broadcasting added, so that it has exactly `shape`."""
    shape = tuple(shape)
    if tuple(grad.shape) == shape:
        return grad
    lead = grad.dim() - len(shape)
    if lead > 0:
        grad = grad.sum(dim=tuple(range(lead)))
    axes = tuple(k for k, n in enumerate(shape) if n == 1 and k >= len(shape) - grad.dim()
                 and grad.shape[k - len(shape) + grad.dim()] != 1)
    if axes:
        grad = grad.sum(dim=tuple(k - len(shape) for k in axes), keepdim=True)
    return grad.expand(shape).clone() if tuple(grad.shape) != shape else grad


def _softmax_(x, axis):
    """softmax(x) along `axis`, stably (the row max is subtracted), computed in x's own buffer.

    A fully masked row (all -inf) gets weights 0, not NaN: its max is clamped to
    the dtype's lowest finite value, so the row stays -inf and exp gives 0, and
    its sum to the tiniest positive value (which leaves every other sum, at
    least 1, unchanged), so 0 / tiny = 0.
    """
    _exp_shifted_(x, x.amax(dim=axis, keepdim=True))
    x /= x.sum(dim=axis, keepdim=True).clamp_min(torch.finfo(x.dtype).tiny)
    return x


def _softmax(x, axis):
    """softmax(x) along `axis` in a new tensor (x is read again later)."""
    return _softmax_(x.clone(), axis)


def _softmax_lse_(x, axis):
    """(softmax(x), logsumexp(x)) along `axis`, the weights in x's buffer: the row log-sum-exp is what the
    backward pass keeps to recompute the weights (FlashAttention's convention); -inf for a fully masked row."""
    finfo = torch.finfo(x.dtype)
    top = x.amax(dim=axis, keepdim=True).clamp_min(finfo.min)
    _exp_shifted_(x, top)
    total = x.sum(dim=axis, keepdim=True)
    x /= total.clamp_min(finfo.tiny)
    return x, total.log_() + top


def _softmax_from_lse_(x, lse):
    """softmax(x) recomputed from its row log-sum-exp, in x's buffer: exp(x - lse); 0 in a fully masked row."""
    return _exp_shifted_(x, lse)


def _softmax_backward_(P, dP, rowdot):
    """grad(S) = P * (dP - rowdot) for P = softmax(S), rowdot = sum(dP * P) along the softmax axis.

    Computed in dP's buffer (dP is not read again) when the shapes allow it.
    """
    fits = dP.shape == P.shape and dP.dim() >= rowdot.dim()
    for r, s in zip(tuple(rowdot.shape)[::-1], tuple(dP.shape)[::-1]):
        if r != 1 and r != s:
            fits = False
    if not fits:
        return P * (dP - rowdot)
    dP -= rowdot
    dP *= P
    return dP


def _softmax_backward(P, dP, rowdot):
    """grad(S) = P * (dP - rowdot) for P = softmax(S), in a new tensor."""
    return P * (dP - rowdot)


def _rowdot(a, b):
    """sum(a * b, axis=-1), keeping the axis, without a tensor of the products."""
    return (a.unsqueeze(-2) @ b.unsqueeze(-1)).squeeze(-1)


def _logsumexp(x, axis):
    """log(sum(exp(x))) along `axis`, stably; -inf for a fully masked row.

    The same formula as the NumPy target and the reference evaluator, so that a row
    holding +inf gives NaN (+inf - +inf) there too; torch.logsumexp would give +inf.
    """
    top = x.amax(dim=axis, keepdim=True).clamp_min(torch.finfo(x.dtype).min)
    return _exp_shifted_(x.clone(), top).sum(dim=axis, keepdim=True).log_() + top


def _exp_shifted_(x, top):
    """exp(x - top) in x's buffer, `top` (a row max or log-sum-exp) broadcast; a row of -inf whose top is
    -inf gives 0. Taken as exp2(x log2e - top log2e), one fused multiply-add (the rounding of top log2e
    scales a whole row alike): torch's exp is 10-170x slower where it underflows or x is -inf, its exp2
    is not."""
    return _exp2_plus_(x, _log2_shift(top, x.dtype))


def _log2_shift(top, dtype):
    """-top log2e, in at least float32 (no overflow in float16) and at most the lowest finite value's
    negation (top -inf: x log2e - lowest is still -inf for x = -inf); what `_exp2_plus_` adds."""
    wide = torch.promote_types(dtype, torch.float32)
    return top.to(wide).mul(1.4426950408889634).clamp_min_(torch.finfo(wide).min).neg_()


def _exp2_plus_(x, shift):
    """exp2(x log2e + shift) in x's buffer: exp(x - top) for shift = `_log2_shift(top)`."""
    return torch.add(shift, x, alpha=1.4426950408889634, out=x).exp2_()


def _reverse_cumsum(x, dim):
    """The suffix sum along `dim`: entry i holds x[i] + x[i + 1] + ... (the adjoint of torch.cumsum)."""
    return torch.flip(torch.cumsum(torch.flip(x, (dim,)), dim=dim), (dim,))


def _merge_heads(x):
    """[..., h, N, k] -> [..., N, h * k], head-major."""
    x = x.transpose(-3, -2)
    return x.reshape(*x.shape[:-2], x.shape[-2] * x.shape[-1])


def _split_heads(x, heads):
    """[..., N, h * k] -> [..., h, N, k], the inverse of _merge_heads."""
    if x.shape[-1] % heads:
        raise ValueError(f"split_heads: width {x.shape[-1]} is not a multiple of {heads} heads")
    return x.reshape(*x.shape[:-1], heads, x.shape[-1] // heads).transpose(-3, -2)


def _concat(parts, axis):
    """torch.cat along `axis` (negative), after broadcasting the leading batch axes."""
    rank = -axis
    batch = tuple(torch.broadcast_shapes(*(p.shape[:p.dim() - rank] for p in parts)))
    return torch.cat([p.expand(batch + tuple(p.shape[p.dim() - rank:])) for p in parts], dim=axis)


def _expand(x, shape):
    """`x` broadcast over the trailing `shape` (its leading batch axes kept); a view."""
    return x.expand(tuple(x.shape[:x.dim() - len(shape)]) + tuple(shape))


def _sinusoidal(n, width, dtype, device):
    """E[i, 2c] = sin(i / 10000^(2c/width)), E[i, 2c+1] = cos(i / 10000^(2c/width)), i from 0."""
    column = torch.arange(width, device=device, dtype=torch.float64)
    angle = torch.arange(n, device=device, dtype=torch.float64)[:, None] / 10000.0 ** (
        2 * torch.div(column, 2, rounding_mode="floor") / width)
    return torch.where(column % 2 == 0, torch.sin(angle), torch.cos(angle)).to(dtype)


def _causal_mask(n, dtype, device):
    """0 on and below the diagonal, -inf above it."""
    return torch.triu(torch.full((n, n), -math.inf, dtype=dtype, device=device), diagonal=1)


def _scatter(values, at, shape, rank):
    """Zeros of `shape` (after the leading batch axes) to which each entry of `values` over its last
    `rank` axes is added at the position the index tensors `at` give it (index_put_ with accumulate: a
    position reached several times gets the sum). An index tensor may carry batch axes of its own
    (positions read from a batched buffer): each batch entry then scatters to its own positions."""
    at = [torch.as_tensor(a, device=values.device) for a in at]
    box = tuple(values.shape[values.dim() - rank:])
    lead = tuple(values.shape[:values.dim() - rank])
    for a in at:
        lead = tuple(torch.broadcast_shapes(lead, tuple(a.shape[:max(0, a.dim() - rank)])))
    flat = values.broadcast_to(lead + box).reshape((-1,) + box)
    out = flat.new_zeros((flat.shape[0],) + tuple(shape))
    batch = torch.arange(flat.shape[0], device=values.device).reshape((-1,) + (1,) * rank)
    positions = [a.broadcast_to(lead + box).reshape((-1,) + box) for a in at]
    out.index_put_((batch, *positions), flat, accumulate=True)
    return out.reshape(lead + tuple(shape))


def _gather(x, at, rank):
    """x[..., at[0], at[1], ...] where the index tensors' last `rank` axes are the entry's labels and any axes
    before them batch axes (positions read from a batched buffer): each batch entry reads with its own."""
    at = [torch.as_tensor(a, device=x.device) for a in at]
    lead = tuple(x.shape[:x.dim() - len(at)])
    for a in at:
        lead = tuple(torch.broadcast_shapes(lead, tuple(a.shape[:max(0, a.dim() - rank)])))
    x = x.broadcast_to(lead + tuple(x.shape[x.dim() - len(at):]))
    batch = [torch.arange(n, device=x.device).reshape((n,) + (1,) * (len(lead) - k - 1 + rank))
             for k, n in enumerate(lead)]
    return x[(*batch, *at)]


def _minimum(a, b):
    """torch.minimum with a Python number on either side (NaN propagates, as in NumPy)."""
    if not isinstance(a, torch.Tensor) and not isinstance(b, torch.Tensor):
        return a if a != a or a <= b else b
    like = a if isinstance(a, torch.Tensor) else b
    return torch.minimum(torch.as_tensor(a, device=like.device), torch.as_tensor(b, device=like.device))


def _maximum(a, b):
    """torch.maximum with a Python number on either side (NaN propagates, as in NumPy)."""
    if not isinstance(a, torch.Tensor) and not isinstance(b, torch.Tensor):
        return a if a != a or a >= b else b
    like = a if isinstance(a, torch.Tensor) else b
    return torch.maximum(torch.as_tensor(a, device=like.device), torch.as_tensor(b, device=like.device))


def _floordiv(a, b):
    """a // b with Python's semantics (floor), on tensors of integers or reals."""
    return torch.div(a, b, rounding_mode="floor") if isinstance(a, torch.Tensor) else torch.div(
        torch.as_tensor(a), b, rounding_mode="floor")


def _mod(a, b):
    """a % b with Python's semantics (the sign of b)."""
    return torch.remainder(a, b) if isinstance(a, torch.Tensor) else torch.remainder(torch.as_tensor(a), b)


def _tangents_in(spec, tensors, derived):
    """Whether forward-mode AD (torch.func.jvp, torch.autograd.forward_ad) asks for tangents here; where the
    module has no derived tangents (`derived` False: this file loaded on its own), a NotImplementedError, not
    the zero tangents a custom op without a forward-mode formula would give."""
    if torch.compiler.is_compiling():  # torch.compile traces the forward: no tangents there, nothing to ask
        return False
    try:
        from torch._functorch.pyfunctorch import retrieve_all_functorch_interpreters
        from torch._C._functorch import TransformType
        jvp = any(i.key() == TransformType.Jvp for i in retrieve_all_functorch_interpreters())
    except ImportError:  # another torch: its transforms are not looked for
        jvp = False
    forward_ad = torch.autograd.forward_ad
    dual = getattr(forward_ad, "_current_level", -1) >= 0 and any(
        isinstance(x, torch.Tensor) and forward_ad.unpack_dual(x).tangent is not None for x in tensors)
    if (jvp or dual) and not derived:
        raise NotImplementedError(f"{spec}: forward-mode AD (tangents, torch.func.jvp, torch.autograd.forward_ad) "
                                  "is derived by spec.torch(), not by this file on its own; it would be zero here")
    return jvp or dual


def _own(values, inputs):
    """What a custom op returns may alias neither its inputs nor each other: a view or an input is copied."""
    seen = []
    out = []
    for value in values:
        if value._base is not None or any(value is other for other in list(inputs) + seen):
            value = value.clone()
        seen.append(value)
        out.append(value)
    return out


def _mulhilo32(m, x):
    """(high word, low word) of m * x for a constant m < 2**32 and an int64 tensor x of words < 2**32,
    exactly: m * x may exceed 2**63, m times each 16-bit half of x stays below 2**48."""
    upper = (x >> 16) * m  # m * x = upper * 2**16 + lower
    lower = (x & 0xFFFF) * m
    middle = ((upper & 0xFFFF) << 16) + lower  # below 2**49: its high part carries into the high word
    return (upper >> 16) + (middle >> 32), middle & 0xFFFFFFFF


def _philox4x32_10(c0, c1, c2, c3, k0, k1):
    """Philox-4x32-10 (Random123) of the counter words c0..c3 (int64 tensors of one shape holding 32-bit
    values) under the key words k0, k1 (ints below 2**32): the four output words, int64 tensors likewise."""
    for _ in range(10):
        hi0, lo0 = _mulhilo32(0xD2511F53, c0)
        hi1, lo1 = _mulhilo32(0xCD9E8D57, c2)
        c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
        k0 = (k0 + 0x9E3779B9) & 0xFFFFFFFF
        k1 = (k1 + 0xBB67AE85) & 0xFFFFFFFF
    return c0, c1, c2, c3


def _dropout_keep(seed, stream, index, threshold):
    """Whether dropout keeps the entries at the flat positions `index` (an integer tensor, any shape and
    device; taken mod 2**64): word 0 of Philox-4x32-10 at counter (index low word, index high word,
    stream, 0) under key (seed low word, seed high word) is at least `threshold`. A bool tensor of index's
    shape on its device; ValueError for a seed, stream or threshold out of range. Computed in blocks that
    bound the int64 temporaries: 2**16 entries on the CPU (they stay in cache: 10x faster than 2**22),
    2**22 on a GPU (fewer launches)."""
    seed, stream, threshold = int(seed), int(stream), int(threshold)
    if not (0 <= seed < 2 ** 64 and 0 <= stream < 2 ** 32 and 0 <= threshold < 2 ** 32):
        raise ValueError(f"dropout: seed {seed} must be in [0, 2**64), stream {stream} and threshold "
                         f"{threshold} in [0, 2**32)")
    if index.dtype.is_floating_point or index.dtype.is_complex or index.dtype == torch.bool:
        raise ValueError(f"dropout: positions must be integers, got dtype {index.dtype}")
    flat = index.reshape(-1)
    keep = torch.empty(flat.shape, dtype=torch.bool, device=index.device)
    block = 1 << 16 if index.device.type == "cpu" else 1 << 22
    for start in range(0, flat.numel(), block):
        position = flat[start:start + block].to(torch.int64)
        word, _, _, _ = _philox4x32_10(position & 0xFFFFFFFF, (position >> 32) & 0xFFFFFFFF,
                                       torch.full_like(position, stream), torch.zeros_like(position),
                                       seed & 0xFFFFFFFF, seed >> 32)
        torch.ge(word, threshold, out=keep[start:start + block])
    return keep.reshape(index.shape)


def _seed(seed):
    """The seed dropout's masks are drawn from, an integer in [0, 2**64), as the int64 of the same bits (what a
    custom op passes; the op's functions take it back mod 2**64), or a ValueError."""
    if isinstance(seed, torch.Tensor) and seed.numel() == 1 and not seed.dtype.is_floating_point \
            and seed.dtype != torch.bool:
        seed = int(seed)
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2 ** 64:
        raise ValueError(f"seed must be an integer in [0, 2**64), got {seed!r}")
    return seed - 2 ** 64 if seed >= 2 ** 63 else seed


def _dropout_mask(seed, stream, like, threshold):
    """Dropout's 0/1 mask for the tensor `like`, in its shape, dtype and device: entry n (flat, row-major) is
    1 iff `_dropout_keep` keeps position n."""
    positions = torch.arange(like.numel(), dtype=torch.int64, device=like.device).reshape(like.shape)
    return _dropout_keep(seed, stream, positions, threshold).to(like.dtype)


def _dropout_keep_outer(seed, stream, rows, cols, threshold):
    """`_dropout_keep` at the positions rows + cols, rows over the leading axes ([..., 1]) and cols over the last
    one ([1, keys] or a number), computed a few rows at a time: no int64 tensor of the whole block is made."""
    rows, cols = torch.as_tensor(rows), torch.as_tensor(cols, device=torch.as_tensor(rows).device)
    shape = torch.broadcast_shapes(rows.shape, cols.shape)
    keep = torch.empty(shape, dtype=torch.bool, device=rows.device)
    if keep.numel() == 0:
        return keep
    if not len(shape):
        keep[()] = _dropout_keep(seed, stream, rows + cols, threshold)
        return keep
    width = shape[-1]
    starts = rows.expand(shape)[..., :1].reshape(-1, 1)  # (small: one per row)
    offsets = cols.expand(shape)[(0,) * (len(shape) - 1)].reshape(1, -1)
    out = keep.view(-1, width)
    step = max(1, ((1 << 16) if rows.device.type == "cpu" else (1 << 22)) // width)
    for r in range(0, starts.shape[0], step):
        out[r:r + step] = _dropout_keep(seed, stream, starts[r:r + step] + offsets, threshold)
    return keep


def _dropout_base(size, seed, *sources):
    """(offset, seed) per batch entry for a dropout mask a fused core draws: the offset is where the entry's
    positions start, its number over the batch axes of the `sources` ((tensor, spec rank) pairs: the core's q,
    k and score reads) times `size`; the seed's 64 bits as an int64. An int64 tensor of those axes and [2]."""
    batch = torch.broadcast_shapes(*(x.shape[:x.dim() - rank] for x, rank in sources))
    device = sources[0][0].device
    offsets = torch.arange(math.prod(batch), dtype=torch.int64, device=device).reshape(batch) * int(size)
    seed = int(seed) - 2 ** 64 if int(seed) >= 2 ** 63 else int(seed)
    return torch.stack([offsets, torch.full_like(offsets, seed)], dim=-1)


HOST = (  # in module order
    "_as_float", "_integers", "_bind", "_batch_axes", "_take", "_size", "_exact", "_upstream", "_one_batch", "_sum_to",
    "_softmax_", "_softmax", "_softmax_lse_", "_softmax_from_lse_", "_softmax_backward_",
    "_softmax_backward", "_rowdot", "_logsumexp", "_exp_shifted_", "_log2_shift", "_exp2_plus_",
    "_reverse_cumsum", "_merge_heads", "_split_heads", "_concat",
    "_expand", "_sinusoidal", "_causal_mask", "_scatter", "_gather", "_minimum", "_maximum", "_floordiv", "_mod",
    "_own", "_tangents_in", "_mulhilo32", "_philox4x32_10", "_dropout_keep", "_seed", "_dropout_mask", "_dropout_keep_outer", "_dropout_base", "_Score",
    "_key_blocks",
)
CALLS = {"_upstream": ("_bind",), "_softmax": ("_softmax_",), "_softmax_": ("_exp_shifted_",),
         "_exp_shifted_": ("_log2_shift", "_exp2_plus_"),
         "_softmax_lse_": ("_exp_shifted_",), "_softmax_from_lse_": ("_exp_shifted_",),
         "_logsumexp": ("_exp_shifted_",), "_minimum": ("_maximum",), "_philox4x32_10": ("_mulhilo32",),
         "_dropout_keep": ("_philox4x32_10",), "_dropout_mask": ("_dropout_keep",),
         "_dropout_keep_outer": ("_dropout_keep",)}


def runtime(extra: dict | None = None, helpers: tuple[str, ...] = (), calls: dict | None = None) -> Runtime:
    """The host helpers, with a target's own (`extra`: name -> function, listed in `helpers`, calling `calls`)."""
    return Runtime({**globals(), **(extra or {})}, HOST + tuple(helpers), {**CALLS, **(calls or {})})
