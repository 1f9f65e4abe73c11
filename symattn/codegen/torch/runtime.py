"""Runtime helpers of generated PyTorch modules: copied, as source text, into the modules that call them.

Contract: the same helper names, arguments and errors as the NumPy runtime
(`symattn.codegen.numpy.runtime`), written for torch tensors on any device:
`helper_source(name)` is the exact source text of one, which the torch
printer copies into a generated module that uses it (with the helpers it
calls in turn, `CALLS`), so that the module needs nothing but torch. Each
keeps the dtype and device of its tensors (float16, bfloat16, float32 and
float64 stay as they are) and never loops over tokens. A fully masked softmax
row (all -inf) gives weights 0, never NaN, as in the NumPy target.

This module imports without torch installed (the printer reads the helpers'
source text to emit a module); the helpers need it to run.
"""

from __future__ import annotations

import inspect
import math

from ..numpy.runtime import helper_source as numpy_helper_source

try:  # the printer reads the helpers' source without torch; generated modules import torch themselves
    import torch
except ImportError:  # pragma: no cover - exercised where torch is not installed
    torch = None

__all__ = ["HELPERS", "CALLS", "SHARED", "helper_source"]


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


def _take(tensors, names):
    """The tensors passed as these keywords, in order; TypeError for a missing or unexpected one."""
    missing = [n for n in names if n not in tensors]
    unexpected = sorted(set(tensors) - set(names))
    if missing or unexpected:
        raise TypeError(f"missing tensors {missing}, unexpected keywords {unexpected}; expected {list(names)}")
    return [tensors[n] for n in names]


def _size(name, value):
    """A size passed as a keyword: a positive integer."""
    if isinstance(value, bool) or int(value) != value or value < 1:
        raise ValueError(f"{name}: a size is a positive integer, got {value!r}")
    return int(value)


def _exact(dim, numerator, denominator):
    """A quotient of sizes such as (N + 1) / 2 must be a whole number; ValueError naming it otherwise."""
    if numerator % denominator:
        raise ValueError(f"{dim} is {numerator} / {denominator} at these sizes, not an integer")


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
    """Zeros of `shape` (after the leading batch axes of `values`) to which each entry of `values` over
    its last `rank` axes is added at the position the index tensors `at` give it (index_put_ with
    accumulate: a position reached several times gets the sum)."""
    lead = tuple(values.shape[:values.dim() - rank])
    box = tuple(values.shape[values.dim() - rank:])
    flat = values.reshape((-1,) + box)
    out = flat.new_zeros((flat.shape[0],) + tuple(shape))
    batch = torch.arange(flat.shape[0], device=values.device).reshape((-1,) + (1,) * rank)
    positions = [torch.as_tensor(a, device=values.device).broadcast_to(box) for a in at]
    out.index_put_((batch, *positions), flat, accumulate=True)
    return out.reshape(lead + tuple(shape))


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


HELPERS = (  # in the order generated modules list them
    "_as_float", "_bind", "_batch_axes", "_take", "_size", "_exact", "_upstream", "_one_batch", "_sum_to",
    "_softmax_", "_softmax", "_softmax_lse_", "_softmax_from_lse_", "_softmax_backward_",
    "_softmax_backward", "_rowdot", "_logsumexp", "_exp_shifted_", "_log2_shift", "_exp2_plus_",
    "_reverse_cumsum", "_merge_heads", "_split_heads", "_concat",
    "_expand", "_sinusoidal", "_causal_mask", "_scatter", "_own",
    "_flash_forward", "_flash_backward", "_groups", "_block", "_strips", "_key_blocks", "_entries",
)
SHARED = ("_key_blocks", "_one_batch")  # plain Python on integers: the NumPy runtime's own source text
CALLS = {"_upstream": ("_bind",), "_softmax": ("_softmax_",), "_softmax_": ("_exp_shifted_",),
         "_exp_shifted_": ("_log2_shift", "_exp2_plus_"),
         "_softmax_lse_": ("_exp_shifted_",), "_softmax_from_lse_": ("_exp_shifted_",),
         "_logsumexp": ("_exp_shifted_",),
         "_flash_forward": ("_entries", "_groups", "_block", "_strips", "_key_blocks", "_exp_shifted_"),
         "_flash_backward": ("_entries", "_groups", "_block", "_strips", "_log2_shift", "_exp2_plus_")}


def _flash_forward(q, k, v, score, keys, inside, score_inside, scale, heads, block_q, block_k):
    """(o, lse) of o = softmax(score(scale * q @ k.T), dim=-1) @ v, tiled (FlashAttention): every batch entry
    and head of a group at once (batched products), query blocks of block_q rows, each against its visible
    keys (keys(first, last); all when None) in strips of up to 16 key blocks, with an online softmax across
    strips; one score buffer per group, reused. `inside(first, last)` (None: none) gives the keys every
    one of those rows sees at each condition that bounds keys: strips there take `score_inside` (None:
    s itself), which pays no mask, and the others `score` (`_key_blocks`). A fully masked row gives
    o = 0 and lse = -inf. exp(x - max) comes from `_exp_shifted_` (exp2), the row max in at least float32."""
    batch = torch.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    n_q, n_k, d_v = q.shape[-2], k.shape[-2], v.shape[-1]
    q = _entries(q * scale if scale != 1 else q, batch, heads)
    lead = tuple(q.shape[1:-2])
    q = q.reshape((-1,) + q.shape[-2:])
    kt = _entries(k, batch, heads).reshape((-1,) + k.shape[-2:]).transpose(1, 2)
    v = _entries(v, batch, heads).reshape((-1,) + v.shape[-2:])
    o = q.new_zeros(q.shape[:-1] + (d_v,))
    lse = q.new_full(q.shape[:-1] + (1,), -math.inf)
    rows = torch.arange(n_q, device=q.device)[:, None]
    cols = torch.arange(n_k, device=q.device)[None, :]
    wide = torch.promote_types(q.dtype, torch.float32)  # the running row max: no overflow in float16
    strip = 16 * block_k
    for g0, g1, buffer in _groups(q, lead, block_q * min(strip, n_k)):
        for i0 in range(0, n_q, block_q):
            i1 = min(i0 + block_q, n_q)
            lo, hi = (0, n_k) if keys is None else keys(i0, i1 - 1)
            seen = None if inside is None else inside(i0, i1 - 1)
            qi, oi = q[g0:g1, i0:i1], o[g0:g1, i0:i1]
            m = total = None
            for j0, j1, whole in _strips(_key_blocks(lo, hi, seen, block_k), strip):
                s = torch.bmm(qi, kt[g0:g1, :, j0:j1], out=_block(buffer, g1 - g0, i1 - i0, j1 - j0))
                fn = score_inside if whole else score
                p = s if fn is None else fn(s.view((-1,) + lead + s.shape[1:]), rows[i0:i1],
                                            cols[:, j0:j1]).reshape(s.shape)
                top = p.amax(dim=-1, keepdim=True).to(wide)  # the running row max
                if m is not None:
                    top = torch.maximum(m, top)
                _exp_shifted_(p, top)  # a row masked so far (top -inf) gives 0
                if m is None:
                    torch.bmm(p, v[g0:g1, j0:j1], out=oi)
                    total = p.sum(dim=-1, keepdim=True)
                else:
                    fix = _exp_shifted_(m, top)
                    oi.mul_(fix).baddbmm_(p, v[g0:g1, j0:j1])
                    total.mul_(fix).add_(p.sum(dim=-1, keepdim=True))
                m = top
            if m is not None:
                oi.div_(total.clamp_min(torch.finfo(total.dtype).tiny))  # a fully masked row: 0 / tiny = 0
                torch.add(m, total.log_(), out=lse[g0:g1, i0:i1])
    return o.reshape(batch + o.shape[-2:]), lse.reshape(batch + lse.shape[-2:])


def _flash_backward(q, k, v, o, lse, do, score, score_grad, keys, inside, score_inside, scale, heads,
                    block_q, block_k):
    """(dq, dk, dv) of o = softmax(score(scale * q @ k.T), dim=-1) @ v given do, tiled (FlashAttention-2): every
    batch entry and head of a group at once, key blocks of block_k keys, each against the query rows that
    see it (runs of query blocks, up to 16 blocks a strip; `keys`, `inside` and `score_inside` as in the
    forward): P = exp(score - lse) recomputed, dv += P.T @ do, dS = P * (do @ v.T - delta) * score',
    dq += dS @ k, dk += dS.T @ q. The weights come from exp2, as in the forward. (lse and delta
    subtracted inside the products, [q, -lse] @ [k, 1].T and [do, -delta] @ [v, 1].T as in the NumPy
    target, measured 5% slower here: torch's products of 65 columns are slower than of 64.)"""
    batch = torch.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2], do.shape[:-2])
    n_q, n_k = q.shape[-2], k.shape[-2]
    shift = torch.where(lse == -math.inf, 0.0, lse)  # a fully masked row: exp(-inf - 0) = 0
    delta = (do * o).sum(dim=-1, keepdim=True)
    q = q * scale if scale != 1 else q
    lead = tuple(_entries(q, batch, heads).shape[1:-2])
    q, k, v, do, shift, delta = (_entries(x, batch, heads).reshape((-1,) + x.shape[-2:])
                                 for x in (q, k, v, do, shift, delta))
    kt, vt = k.transpose(1, 2), v.transpose(1, 2)
    shift = _log2_shift(shift, q.dtype)  # once: every key block adds it
    dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    rows = torch.arange(n_q, device=q.device)[:, None]
    cols = torch.arange(n_k, device=q.device)[None, :]
    blocks = [(i0, min(i0 + block_q, n_q)) for i0 in range(0, n_q, block_q)]
    seen = [(0, n_k) if keys is None else keys(i0, i1 - 1) for i0, i1 in blocks]
    sure = [(n_k, n_k) if inside is None else inside(i0, i1 - 1) for i0, i1 in blocks]
    strip = 16 * block_q
    for g0, g1, buffer in _groups(q, lead, 2 * block_k * min(strip, n_q)):
        for j0 in range(0, n_k, block_k):
            j1 = min(j0 + block_k, n_k)
            j = cols[:, j0:j1]
            kj = k[g0:g1, j0:j1]
            dkj = dvj = None  # this key block's dK and dV: contiguous, copied into dk and dv at its end
            runs = [(i0, i1, a <= j0 and j1 <= b) for (i0, i1), (lo, hi), (a, b) in zip(blocks, seen, sure)
                    if lo < j1 and hi > j0]
            for r0, r1, whole in _strips(runs, strip):
                size = (g1 - g0) * (r1 - r0) * (j1 - j0)
                i = rows[r0:r1]
                qi, doi, dqi = q[g0:g1, r0:r1], do[g0:g1, r0:r1], dq[g0:g1, r0:r1]
                fn = score_inside if whole else score
                s = torch.bmm(qi, kt[g0:g1, :, j0:j1], out=_block(buffer, g1 - g0, r1 - r0, j1 - j0))
                view = (-1,) + lead + s.shape[1:]
                grad = None if score_grad is None else score_grad(s.view(view), i, j)
                if grad is not None and grad.data_ptr() == s.data_ptr():  # s itself, which the score overwrites
                    grad = grad.clone()
                p = s if fn is None else fn(s.view(view), i, j).reshape(s.shape)
                p = _exp2_plus_(p, shift[g0:g1, r0:r1])  # exp(score - lse)
                if dvj is None:
                    dvj = torch.bmm(p.transpose(1, 2), doi)
                else:
                    dvj.baddbmm_(p.transpose(1, 2), doi)
                ds = torch.bmm(doi, vt[g0:g1, :, j0:j1], out=_block(buffer[size:], g1 - g0, r1 - r0, j1 - j0))
                ds.sub_(delta[g0:g1, r0:r1]).mul_(p)
                if grad is not None:
                    ds.view(view).mul_(grad)
                dqi.baddbmm_(ds, kj)
                if dkj is None:
                    dkj = torch.bmm(ds.transpose(1, 2), qi)
                else:
                    dkj.baddbmm_(ds.transpose(1, 2), qi)
            if dkj is not None:  # else no query sees these keys: their gradients stay 0
                dk[g0:g1, j0:j1] = dkj
                dv[g0:g1, j0:j1] = dvj
    if scale != 1:
        dq.mul_(scale)
    return tuple(x.reshape(batch + x.shape[-2:]) for x in (dq, dk, dv))


def _groups(q, lead, per, budget=1 << 20):
    """(first, last + 1, buffer) of groups of the [entries * heads] matrices of q: whole entries (all their
    heads), as many as keep one block of `per` numbers a matrix under `budget` numbers; the buffer holds
    `per` numbers for each matrix of a group."""
    unit = math.prod(lead)
    step = unit * max(1, budget // (unit * per))
    buffer = q.new_empty(min(step, q.shape[0]) * per)
    return [(g0, min(g0 + step, q.shape[0]), buffer) for g0 in range(0, q.shape[0], step)]


def _block(buffer, *shape):
    """The first prod(shape) numbers of a flat buffer as a contiguous tensor of that shape."""
    return buffer[:math.prod(shape)].view(shape)


def _strips(blocks, limit):
    """Runs of adjacent (first, last + 1, whole) blocks with the same `whole` merged, each at most `limit`
    long (a block on its own may be longer)."""
    out = []
    for b0, b1, whole in blocks:
        if out and out[-1][1] == b0 and out[-1][2] == whole and b1 - out[-1][0] <= limit:
            out[-1] = (out[-1][0], b1, whole)
        else:
            out.append((b0, b1, whole))
    return out


def _entries(x, batch, heads):
    """x expanded to the batch axes `batch` and made [entries, *heads, rows, cols] (the leading axes but the
    last `heads` flattened into one)."""
    x = x.expand(batch + x.shape[-2:])
    return x.reshape((-1,) + tuple(x.shape[x.dim() - 2 - heads:]))


def helper_source(name: str) -> str:
    """The source text of one helper, as it appears in generated modules."""
    if name not in HELPERS:
        raise KeyError(f"no runtime helper {name}")
    if name in SHARED:
        return numpy_helper_source(name)
    return inspect.getsource(globals()[name]).strip("\n")
