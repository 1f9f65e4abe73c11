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

try:  # the printer reads the helpers' source without torch; generated modules import torch themselves
    import torch
except ImportError:  # pragma: no cover - exercised where torch is not installed
    torch = None

__all__ = ["HELPERS", "CALLS", "helper_source"]


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
    finfo = torch.finfo(x.dtype)
    x -= x.amax(dim=axis, keepdim=True).clamp_min(finfo.min)
    x.exp_()
    x /= x.sum(dim=axis, keepdim=True).clamp_min(finfo.tiny)
    return x


def _softmax(x, axis):
    """softmax(x) along `axis` in a new tensor (x is read again later)."""
    return _softmax_(x.clone(), axis)


def _softmax_lse_(x, axis):
    """(softmax(x), logsumexp(x)) along `axis`, the weights in x's buffer: the row log-sum-exp is what the
    backward pass keeps to recompute the weights (FlashAttention's convention); -inf for a fully masked row."""
    finfo = torch.finfo(x.dtype)
    top = x.amax(dim=axis, keepdim=True).clamp_min(finfo.min)
    x -= top
    x.exp_()
    total = x.sum(dim=axis, keepdim=True)
    x /= total.clamp_min(finfo.tiny)
    return x, total.log_() + top


def _softmax_from_lse_(x, lse):
    """softmax(x) recomputed from its row log-sum-exp, in x's buffer: exp(x - lse); 0 in a fully masked row."""
    x -= lse.clamp_min(torch.finfo(x.dtype).min)  # -inf - lowest finite = -inf: exp gives 0
    return x.exp_()


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
    return (x - top).exp_().sum(dim=axis, keepdim=True).log_() + top


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
    "_as_float", "_bind", "_batch_axes", "_take", "_size", "_exact", "_upstream", "_sum_to",
    "_softmax_", "_softmax", "_softmax_lse_", "_softmax_from_lse_", "_softmax_backward_",
    "_softmax_backward", "_rowdot", "_logsumexp", "_reverse_cumsum", "_merge_heads", "_split_heads", "_concat",
    "_expand", "_sinusoidal", "_causal_mask", "_scatter", "_own",
    "_flash_forward", "_flash_backward", "_append", "_entries",
)
CALLS = {"_upstream": ("_bind",), "_softmax": ("_softmax_",), "_flash_forward": ("_append", "_entries"),
         "_flash_backward": ("_append", "_entries")}


def _flash_forward(q, k, v, score, keys, scale, heads, block_q, block_k):
    """(o, lse) of o = softmax(score(scale * q @ k.T), dim=-1) @ v, tiled (FlashAttention): as in the NumPy
    runtime, one batch entry at a time, blocks of block_q queries x block_k keys, an online softmax whose
    row sums come from p @ [v, 1], blocks outside keys(first, last) skipped; a fully masked row gives o = 0
    and lse = -inf."""
    batch = torch.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    n_q, n_k, d_v = q.shape[-2], k.shape[-2], v.shape[-1]
    device = q.device
    q = _entries(q * scale if scale != 1 else q, batch, heads)
    k, v1 = _entries(k, batch, heads), _entries(_append(v, 1), batch, heads)
    o = torch.zeros(q.shape[:-1] + (d_v,), dtype=q.dtype, device=device)
    lse = torch.full(q.shape[:-1] + (1,), -math.inf, dtype=q.dtype, device=device)
    for b in range(q.shape[0]):
        kt = k[b].transpose(-1, -2)
        for i0 in range(0, n_q, block_q):
            i1 = min(i0 + block_q, n_q)
            lo, hi = (0, n_k) if keys is None else keys(i0, i1 - 1)
            i = torch.arange(i0, i1, device=device)[:, None]
            qi = q[b, ..., i0:i1, :]
            m = torch.full(qi.shape[:-1] + (1,), -math.inf, dtype=q.dtype, device=device)
            acc = torch.zeros(qi.shape[:-1] + (d_v + 1,), dtype=q.dtype, device=device)
            for j0 in range(lo, hi, block_k):
                j1 = min(j0 + block_k, hi)
                p = score(qi @ kt[..., j0:j1], i, torch.arange(j0, j1, device=device)[None, :])
                top = torch.maximum(m, p.amax(dim=-1, keepdim=True))
                shift = torch.where(top == -math.inf, 0.0, top)  # a row masked so far: exp(-inf - 0) = 0
                p.sub_(shift).exp_()
                acc.mul_(torch.exp(m - shift))
                acc.add_(p @ v1[b, ..., j0:j1, :])
                m = top
            total = acc[..., d_v:]
            o[b, ..., i0:i1, :] = acc[..., :d_v] / torch.where(total == 0, 1.0, total)
            lse[b, ..., i0:i1, :] = m + torch.log(total)
    return o.reshape(batch + o.shape[-2:]), lse.reshape(batch + lse.shape[-2:])


def _flash_backward(q, k, v, o, lse, do, score, score_grad, keys, scale, heads, block_q, block_k):
    """(dq, dk, dv) of o = softmax(score(scale * q @ k.T), dim=-1) @ v given do, tiled (FlashAttention-2), as in
    the NumPy runtime: P recomputed from lse per block, dv += P.T @ do, dS = P * (do @ v.T - delta) * score',
    dq += dS @ k, dk += dS.T @ q; delta (and lse, where d score / d s is 1: score_grad None) subtracted inside
    the products."""
    batch = torch.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2], do.shape[:-2])
    n_q, n_k = q.shape[-2], k.shape[-2]
    shift = torch.where(lse == -math.inf, 0.0, lse)  # a fully masked row: exp(-inf - 0) = 0
    delta = (do * o).sum(dim=-1, keepdim=True)
    q = q * scale if scale != 1 else q
    q1, k1 = (_append(q, -shift), _append(k, 1)) if score_grad is None else (q, k)
    q, q1, k, k1, do, do1, v1, shift = (_entries(x, batch, heads) for x in (
        q, q1, k, k1, do, _append(do, -delta), _append(v, 1), shift))
    dq, dk = torch.zeros_like(q), torch.zeros_like(k)
    dv = torch.zeros(k.shape[:-1] + (v1.shape[-1] - 1,), dtype=q.dtype, device=q.device)
    for b in range(q.shape[0]):
        kt, v1t = k1[b].transpose(-1, -2), v1[b].transpose(-1, -2)
        for i0 in range(0, n_q, block_q):
            i1 = min(i0 + block_q, n_q)
            lo, hi = (0, n_k) if keys is None else keys(i0, i1 - 1)
            i = torch.arange(i0, i1, device=q.device)[:, None]
            qi, q1i, doi, do1i, dqi = (x[b, ..., i0:i1, :] for x in (q, q1, do, do1, dq))
            for j0 in range(lo, hi, block_k):
                j1 = min(j0 + block_k, hi)
                j = torch.arange(j0, j1, device=q.device)[None, :]
                s = q1i @ kt[..., j0:j1]
                if score_grad is None:
                    p = score(s, i, j)  # score(s) - lse: s has lse subtracted already
                else:
                    grad = score_grad(s, i, j)
                    p = score(s, i, j)
                    p = p - shift[b, ..., i0:i1, :]
                p = p.exp_()
                dv[b, ..., j0:j1, :] += p.transpose(-1, -2) @ doi
                ds = do1i @ v1t[..., j0:j1]  # do @ v.T - delta
                ds.mul_(p)
                if score_grad is not None:
                    ds = ds * grad
                dqi += ds @ k[b, ..., j0:j1, :]
                dk[b, ..., j0:j1, :] += ds.transpose(-1, -2) @ qi
    if scale != 1:
        dq.mul_(scale)
    return tuple(x.reshape(batch + x.shape[-2:]) for x in (dq, dk, dv))


def _append(x, column):
    """x with one more column on its last axis: a number, or a tensor of one column (batch axes broadcast)."""
    batch = torch.broadcast_shapes(x.shape[:-2], column.shape[:-2] if torch.is_tensor(column) else ())
    out = torch.empty(batch + x.shape[-2:-1] + (x.shape[-1] + 1,), dtype=x.dtype, device=x.device)
    out[..., :-1] = x
    out[..., -1:] = column
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
    return inspect.getsource(globals()[name]).strip("\n")
