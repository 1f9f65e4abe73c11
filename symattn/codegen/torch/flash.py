"""The tiled pass of generated torch modules (FlashAttention): runtime helpers copied as source text.

Contract: `_flash_forward` and `_flash_backward` take the arguments of the
NumPy runtime's (`symattn.codegen.numpy.flash`) and return the same values,
for torch tensors on any device: one fused core of the attention plan, block
by block, from q, k, v (heads of size 1 broadcast: GQA, MQA), the tensors its
score reads (`reads`: (tensor, rank)) and its closures (`core`, a `_Score`,
which see a run of batch entries at once). Every batch entry and head of a
group goes through one batched product; a fully masked row gives O = 0 and
lse = -inf. exp(x - max) comes from `_exp_shifted_` (exp2), the row max in at
least float32.

This module imports without torch installed (the printer reads the helpers'
source text to emit a module); the helpers need it to run.
"""

from __future__ import annotations

import math

try:  # the printer reads the helpers' source without torch; generated modules import torch themselves
    import torch
except ImportError:  # pragma: no cover - exercised where torch is not installed
    torch = None

from ..arrays import runtime as shared
from ..arrays import torch_runtime as host

__all__ = ["TILED", "CALLS"]

# helpers of the torch host and shared ones: generated modules get their source beside these
_key_blocks, _exp_shifted_, _log2_shift, _exp2_plus_ = (shared._key_blocks, host._exp_shifted_, host._log2_shift,
                                                         host._exp2_plus_)


def _flash_forward(q, k, v, reads, core, block_q, block_k):
    """(o, lse) of o = softmax(score(scale * q @ k.T), dim=-1) [* weights] @ v, tiled (FlashAttention): every batch
    entry and head of a group at once (batched products), query blocks of block_q rows, each against its
    visible keys (core.keys(first, last); all when None) in strips of up to 16 key blocks, with an online
    softmax across strips; one score buffer per group, reused. `core.inside(first, last)` (None: none) gives
    the keys every one of those rows sees at each condition that bounds keys: strips there take
    `core.score_inside` (None: s itself), which pays no mask, and the others `core.score` (`_key_blocks`)."""
    q, k, v, rs, batch, lead = _prepare(q, k, v, (), reads, core)
    n_q, n_k, d_v = q.shape[-2], k.shape[-2], v.shape[-1]
    unit = math.prod(lead)
    q = q.reshape((-1,) + q.shape[-2:])
    kt = k.reshape((-1,) + k.shape[-2:]).transpose(1, 2)
    v = v.reshape((-1,) + v.shape[-2:])
    o = q.new_zeros(q.shape[:-1] + (d_v,))
    lse = q.new_full(q.shape[:-1] + (1,), -math.inf)
    rows = torch.arange(n_q, device=q.device)[:, None]
    cols = torch.arange(n_k, device=q.device)[None, :]
    wide = torch.promote_types(q.dtype, torch.float32)  # the running row max: no overflow in float16
    strip = 16 * block_k
    for g0, g1, buffer in _groups(q, lead, block_q * min(strip, n_k)):
        rb = [x[g0 // unit:g1 // unit] for x in rs]
        for i0 in range(0, n_q, block_q):
            i1 = min(i0 + block_q, n_q)
            lo, hi = (0, n_k) if core.keys is None else core.keys(i0, i1 - 1)
            seen = None if core.inside is None else core.inside(i0, i1 - 1)
            qi, oi = q[g0:g1, i0:i1], o[g0:g1, i0:i1]
            m = total = None
            visited = _key_blocks(lo, hi, seen, block_k)
            if core.live is not None:  # a mask read at run time: blocks it masks whole for the group are skipped
                visited = _live(core, visited, qi.view((-1,) + lead + qi.shape[1:]), rows[i0:i1], cols, rb)
            for j0, j1, whole in _strips(visited, strip):
                s = torch.bmm(qi, kt[g0:g1, :, j0:j1], out=_block(buffer, g1 - g0, i1 - i0, j1 - j0))
                view = s.view((-1,) + lead + s.shape[1:])
                w = None if core.weights is None else core.weights(view, rows[i0:i1], cols[:, j0:j1], *rb)
                if w is not None:
                    w = torch.broadcast_to(w, view.shape).reshape(s.shape)
                fn = core.score_inside if whole else core.score
                p = s if fn is None else fn(view, rows[i0:i1], cols[:, j0:j1], *rb).reshape(s.shape)
                top = p.amax(dim=-1, keepdim=True).to(wide)  # the running row max
                if m is not None:
                    top = torch.maximum(m, top)
                _exp_shifted_(p, top)  # a row masked so far (top -inf) gives 0
                pw = p if w is None else p * w
                if m is None:
                    torch.bmm(pw, v[g0:g1, j0:j1], out=oi)
                    total = p.sum(dim=-1, keepdim=True)
                else:
                    fix = _exp_shifted_(m, top)
                    oi.mul_(fix).baddbmm_(pw, v[g0:g1, j0:j1])
                    total.mul_(fix).add_(p.sum(dim=-1, keepdim=True))
                m = top
            if m is not None:
                oi.div_(total.clamp_min(torch.finfo(total.dtype).tiny))  # a fully masked row: 0 / tiny = 0
                torch.add(m, total.log_(), out=lse[g0:g1, i0:i1])
    return o.reshape(batch + lead + o.shape[-2:]), lse.reshape(batch + lead + lse.shape[-2:])


def _live(core, blocks, qv, i, cols, rb):
    """The key blocks (first, end, whole) of `blocks` that the run-time mask `core.live` keeps an entry of, for the
    rows i and every entry of the group (qv: its queries, [entries, *heads, rows, width]); `core.blocks` counts
    those computed and those skipped. Fake tensors (the custom op's fake implementation, torch.compile's
    tracing) hold no values to test: every block is kept."""
    if isinstance(qv, torch._subclasses.FakeTensor) or qv.device.type == "meta" or torch.compiler.is_compiling():
        return blocks
    kept = [b for b in blocks if bool(core.live(qv, i, cols[:, b[0]:b[1]], *rb))]
    core.blocks[0] += len(kept)
    core.blocks[1] += len(blocks) - len(kept)
    return kept


def _flash_backward(q, k, v, o, lse, do, dlse, reads, core, block_q, block_k):
    """(dq, dk, dv, *dT) of o = softmax(score(scale * q @ k.T), dim=-1) [* weights] @ v given do, tiled
    (FlashAttention-2): every batch entry and head of a group at once, key blocks of block_k keys, each
    against the query rows that see it (runs of query blocks, up to 16 blocks a strip; `keys`, `inside` and
    `score_inside` as in the forward): P = exp(score - lse) recomputed, dv += (P * w).T @ do, dS = P *
    ((do @ v.T) * w - delta) * score', dq += dS @ k, dk += dS.T @ q, and each learned tensor's add takes dS;
    delta = rowsum(do * o) - dlse. The weights come from exp2, as in the forward."""
    shapes = [tuple(x.shape) for x in (q, k, v)]
    arrays = [r for r, _ in reads]
    q, k, v, rs, batch, lead = _prepare(q, k, v, (do,), reads, core)
    n_q, n_k = q.shape[-2], k.shape[-2]
    unit = math.prod(lead)
    shift = torch.where(lse == -math.inf, 0.0, lse)  # a fully masked row: exp(-inf - 0) = 0
    delta = (do * o).sum(dim=-1, keepdim=True)
    if dlse is not None:
        delta = delta - dlse
    q, k, v = (x.reshape((-1,) + x.shape[-2:]) for x in (q, k, v))
    do, shift, delta = (_entries(x, batch, lead).reshape((-1,) + x.shape[-2:]) for x in (do, shift, delta))
    kt, vt = k.transpose(1, 2), v.transpose(1, 2)
    shift = _log2_shift(shift, q.dtype)  # once: every key block adds it
    dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    dts = [rs[n].new_zeros(rs[n].shape) for _, n in core.adds]
    rows = torch.arange(n_q, device=q.device)[:, None]
    cols = torch.arange(n_k, device=q.device)[None, :]
    blocks = [(i0, min(i0 + block_q, n_q)) for i0 in range(0, n_q, block_q)]
    seen = [(0, n_k) if core.keys is None else core.keys(i0, i1 - 1) for i0, i1 in blocks]
    sure = [(n_k, n_k) if core.inside is None else core.inside(i0, i1 - 1) for i0, i1 in blocks]
    strip = 16 * block_q
    for g0, g1, buffer in _groups(q, lead, 2 * block_k * min(strip, n_q)):
        e0, e1 = g0 // unit, g1 // unit
        rb = [x[e0:e1] for x in rs]
        for j0 in range(0, n_k, block_k):
            j1 = min(j0 + block_k, n_k)
            j = cols[:, j0:j1]
            kj = k[g0:g1, j0:j1]
            dkj = dvj = None  # this key block's dK and dV: contiguous, copied into dk and dv at its end
            runs = [(i0, i1, a <= j0 and j1 <= b) for (i0, i1), (lo, hi), (a, b) in zip(blocks, seen, sure)
                    if lo < j1 and hi > j0]
            if core.live is not None:  # a mask read at run time: query blocks it masks whole here are skipped
                runs = [r for r in runs if _live(core, [(j0, j1, False)], q[g0:g1, r[0]:r[1]].view(
                    (-1,) + lead + (r[1] - r[0], q.shape[-1])), rows[r[0]:r[1]], cols, rb)]
            for r0, r1, whole in _strips(runs, strip):
                size = (g1 - g0) * (r1 - r0) * (j1 - j0)
                i = rows[r0:r1]
                qi, doi, dqi = q[g0:g1, r0:r1], do[g0:g1, r0:r1], dq[g0:g1, r0:r1]
                fn = core.score_inside if whole else core.score
                s = torch.bmm(qi, kt[g0:g1, :, j0:j1], out=_block(buffer, g1 - g0, r1 - r0, j1 - j0))
                view = (-1,) + lead + s.shape[1:]
                grad = None if core.grad is None else core.grad(s.view(view), i, j, *rb)
                if grad is not None and grad.data_ptr() == s.data_ptr():  # s itself, which the score overwrites
                    grad = grad.clone()
                raw = s.clone() if core.adds else None  # (the adds read s)
                w = None if core.weights is None else torch.broadcast_to(
                    core.weights(s.view(view), i, j, *rb), s.view(view).shape).reshape(s.shape)
                p = s if fn is None else fn(s.view(view), i, j, *rb).reshape(s.shape)
                p = _exp2_plus_(p, shift[g0:g1, r0:r1])  # exp(score - lse)
                pw = p if w is None else p * w
                if dvj is None:
                    dvj = torch.bmm(pw.transpose(1, 2), doi)
                else:
                    dvj.baddbmm_(pw.transpose(1, 2), doi)
                ds = torch.bmm(doi, vt[g0:g1, :, j0:j1], out=_block(buffer[size:], g1 - g0, r1 - r0, j1 - j0))
                if w is not None:
                    ds.mul_(w)
                ds.sub_(delta[g0:g1, r0:r1]).mul_(p)  # dS, the gradient of the score: what the adds take
                for (add, n), dt in zip(core.adds, dts):
                    add(dt[e0:e1], ds.view(view), r0, r1, j0, j1, raw.view(view), i, j, *rb)
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
    if core.scale != 1:
        dq.mul_(core.scale)
    grads = [_heads_of(x.reshape(batch + lead + x.shape[-2:]), shape, core.heads)
             for x, shape in zip((dq, dk, dv), shapes)]
    learned = [_to_shape(dt.reshape(batch + dt.shape[1:]), tuple(arrays[n].shape)) for dt, (_, n) in
               zip(dts, core.adds)]
    return tuple(grads + learned)


def _prepare(q, k, v, more, reads, core):
    """q (scaled), k and v expanded to the batch axes of all of them, `more` and the reads, and to the heads of
    all three, as [entries, *heads, rows, width]; each read as [entries, *its shape] (in q's dtype); the batch
    and head shapes."""
    h = core.heads
    batch = tuple(torch.broadcast_shapes(*(x.shape[:x.dim() - 2 - h] for x in (q, k, v, *more)),
                                         *(r.shape[:r.dim() - rank] for r, rank in reads)))
    lead = tuple(torch.broadcast_shapes(*(x.shape[x.dim() - 2 - h:x.dim() - 2] for x in (q, k, v))))
    q = q * core.scale if core.scale != 1 else q
    q, k, v = (_entries(x, batch, lead) for x in (q, k, v))
    kept = [r if not r.is_floating_point() and r.dtype != torch.bool else r.to(q.dtype) for r, _ in reads]  # integers
    rs = [r.expand(batch + tuple(r.shape[r.dim() - rank:])).reshape((-1,) + tuple(r.shape[r.dim() - rank:]))
          for r, (_, rank) in zip(kept, reads)]
    return q, k, v, rs, batch, lead


def _entries(x, batch, lead):
    """x expanded to the batch axes `batch` and the heads `lead`, made [entries, *lead, rows, cols]."""
    x = x.expand(batch + lead + tuple(x.shape[-2:]))
    return x.reshape((-1,) + lead + tuple(x.shape[-2:]))


def _heads_of(x, shape, heads):
    """x ([*batch, *heads, rows, cols]) summed over the head axes where `shape` (an operand's) has size 1 (keeping
    them): the gradient of an operand that is broadcast over heads (GQA, MQA)."""
    axes = tuple(a for a in range(-2 - heads, -2) if shape[a] == 1 and x.shape[a] != 1)
    return x.sum(dim=axes, keepdim=True) if axes else x


def _to_shape(grad, shape):
    """`grad` summed over the batch axes and the axes of size 1 that broadcasting added: exactly `shape`."""
    lead = grad.dim() - len(shape)
    if lead > 0:
        grad = grad.sum(dim=tuple(range(lead)))
    axes = tuple(k for k, n in enumerate(shape) if n == 1 and grad.shape[k] != 1)
    return grad.sum(dim=axes, keepdim=True) if axes else grad


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


TILED = ("_flash_forward", "_live", "_flash_backward", "_prepare", "_entries", "_heads_of", "_to_shape", "_groups",
         "_block", "_strips")
CALLS = {"_flash_forward": ("_prepare", "_entries", "_groups", "_block", "_strips", "_key_blocks", "_exp_shifted_",
                            "_live"),
         "_flash_backward": ("_prepare", "_entries", "_groups", "_block", "_strips", "_key_blocks", "_log2_shift",
                             "_exp2_plus_", "_heads_of", "_to_shape", "_live")}
