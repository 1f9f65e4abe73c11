"""The tiled pass of generated NumPy modules (FlashAttention): runtime helpers copied as source text.

Contract: `_flash_forward`, `_flash_backward` and `_flash_forward_backward`
compute one fused core of the attention plan block by block, O(N * block)
memory, from q, k, v (each [*batch, *heads, rows, width], heads of size 1
broadcast: GQA, MQA), the tensors its score reads (`reads`: (array, rank))
and its closures (`core`, a `_Score`: `symattn.codegen.arrays.block`). They
return O and the row log-sum-exp, and the gradients of q, k and v (each
summed over the heads it is broadcast along) and of every learned tensor the
score reads (of its array's shape); `dlse` is the gradient of the row
log-sum-exp where the spec has it as a tensor (None: 0). A fully masked row
gives O = 0, lse = -inf and no gradient, never NaN. The (entry, query block)
units run on `threads` threads (`_units`, `_runs`, `_run`); each unit writes
its own rows, and what several runs add to (dK, dV, the learned gradients)
is summed in the order of the runs, so the result does not depend on the
thread count.
"""

from __future__ import annotations

import numpy as np

from ..arrays import runtime as shared

__all__ = ["TILED", "CALLS"]

_key_blocks = shared._key_blocks  # (a shared helper: generated modules get its source beside these)


def _flash_forward(q, k, v, reads, core, block_q, block_k, threads):
    """(o, lse): o = softmax(score(scale * q @ k.T), axis=-1) [* weights] @ v and each row's log-sum-exp, tiled.

    Per batch entry (the head axes stay together), blocks of block_q query rows x block_k keys: each block's
    scores come from one matrix product, and an online softmax keeps each row's running max m and sum l of
    exp(score - m), rescaling the partial output when m grows, so no array is larger than a block.
    `core.keys(first, last)` (None: all) is the range of keys rows first..last may see: blocks outside it
    are skipped; `core.inside` the keys where the score is `core.score_inside` (no mask to pay,
    `_key_blocks`). Without weights the row sums come out of the product with v, which has a column of
    ones appended.
    """
    q, k, v, rs, batch, lead = _prepare(q, k, v, (), reads, core)
    dtype = np.result_type(q, k, v)
    n_q, n_k, d_v = q.shape[-2], k.shape[-2], v.shape[-1]
    v1 = _append(v, 1)  # p @ [v, 1] = [p @ v, rowsum(p)]
    o = np.zeros(q.shape[:-1] + (d_v,), dtype)
    lse = np.full(q.shape[:-1] + (1,), -np.inf, dtype)
    units = _units(q.shape[0], n_q, n_k, core.keys, block_q)

    def work(r, first, last):
        for b, i0, i1, lo, hi in units[first:last]:
            rb = [x[b] for x in rs]
            kt = k[b].swapaxes(-1, -2)
            i = np.arange(i0, i1)[:, None]
            qi = q[b, ..., i0:i1, :]
            m = np.full(qi.shape[:-1] + (1,), -np.inf, dtype)  # running max of each row's scores
            acc = np.zeros(qi.shape[:-1] + (d_v + 1,), dtype)  # running p @ v and sum of p, against m
            for j0, j1, whole in _key_blocks(lo, hi, None if core.inside is None else core.inside(i0, i1 - 1),
                                             block_k):
                j = np.arange(j0, j1)[None, :]
                if core.live is not None and not core.live(qi, i, j, *rb):  # masked whole: its weights are 0
                    core.blocks[1] += 1
                    continue
                core.blocks[0] += 1
                p = qi @ kt[..., j0:j1]
                w = None if core.weights is None else core.weights(p, i, j, *rb)
                fn = core.score_inside if whole else core.score
                if fn is not None:
                    p = fn(p, i, j, *rb)
                top = p.max(axis=-1, keepdims=True, initial=-np.inf)
                np.maximum(top, m, out=top)
                shift = np.where(top == -np.inf, 0, top)  # a row masked so far: exp(-inf - 0) = 0
                p -= shift
                np.exp(p, out=p)
                m -= shift
                acc *= np.exp(m, out=m)
                if w is None:
                    acc += p @ v1[b, ..., j0:j1, :]
                else:
                    acc[..., :d_v] += (p * w) @ v[b, ..., j0:j1, :]
                    acc[..., d_v:] += p.sum(axis=-1, keepdims=True)
                m = top
            total = acc[..., d_v:]
            o[b, ..., i0:i1, :] = acc[..., :d_v] / np.where(total == 0, 1, total)
            with np.errstate(divide="ignore"):
                lse[b, ..., i0:i1, :] = m + np.log(total)

    _run(work, _runs(units, threads))
    return o.reshape(batch + o.shape[1:]), lse.reshape(batch + lse.shape[1:])


def _flash_backward(q, k, v, o, lse, do, dlse, reads, core, block_q, block_k, threads):
    """(dq, dk, dv, *dT) given do = grad(o), tiled (FlashAttention-2).

    delta = rowsum(do * o) - dlse (= rowsum(dP * P) - dlse); per block the weights are recomputed from the
    saved lse, P = exp(score - lse), then dv += (P * w).T @ do, dS = P * ((do @ v.T) * w - delta) *
    score'(s), dq += dS @ k, dk += dS.T @ q, and each learned tensor's add takes dS, over the blocks the
    forward visited. `core.grad(s, i, j, ...)` is d score / d s (evaluated before the score, which may
    overwrite s); None means 1 (the score is s plus terms free of it), and then lse is subtracted inside the
    product: [q, -lse] @ [k, 1].T. Without weights delta is too: [do, -delta] @ [v, 1].T.
    """
    shapes = [x.shape for x in (q, k, v)]
    arrays = [r for r, _ in reads]
    q, k, v, rs, batch, lead = _prepare(q, k, v, (do,), reads, core)
    dtype = np.result_type(q, k, v, do)
    n_q, n_k = q.shape[-2], k.shape[-2]
    shift = np.where(lse == -np.inf, 0, lse)  # a fully masked row: exp(-inf - 0) = 0
    delta = np.einsum("...j,...j->...", do, o)[..., None]
    if dlse is not None:
        delta = delta - dlse
    weighted = core.weights is not None
    q1, k1 = (_append(q, -_entries(shift, batch, lead)), _append(k, 1)) if core.grad is None else (q, k)
    do, delta = _entries(do, batch, lead), _entries(delta, batch, lead)
    do1, v1, shift = _append(do, -delta), _append(v, 1), _entries(shift, batch, lead)
    dq, dk, dv = np.zeros(q.shape, dtype), np.zeros(k.shape, dtype), np.zeros(v.shape, dtype)
    dts = [np.zeros(rs[n].shape, dtype) for _, n in core.adds]
    units = _units(q.shape[0], n_q, n_k, core.keys, block_q)
    runs = _runs(units, threads)
    first_run = _first_runs(units, runs)

    def work(r, first, last):
        parts = {}  # entry -> (dk, dv, *dT) of this run, for an entry an earlier run has units of too
        for b, i0, i1, lo, hi in units[first:last]:
            dkb, dvb, *dtb = _sums_of(parts, b, first_run[b] == r, [dk, dv, *dts])
            rb = [x[b] for x in rs]
            kt, vt, v1t = k1[b].swapaxes(-1, -2), v[b].swapaxes(-1, -2), v1[b].swapaxes(-1, -2)
            i = np.arange(i0, i1)[:, None]
            qi, q1i, doi, do1i, dqi = (x[b, ..., i0:i1, :] for x in (q, q1, do, do1, dq))
            for j0, j1, whole in _key_blocks(lo, hi, None if core.inside is None else core.inside(i0, i1 - 1),
                                             block_k):
                j = np.arange(j0, j1)[None, :]
                if core.live is not None and not core.live(qi, i, j, *rb):  # masked whole: P is 0 there
                    core.blocks[1] += 1
                    continue
                core.blocks[0] += 1
                p = q1i @ kt[..., j0:j1]
                w = None if not weighted else core.weights(p, i, j, *rb)
                raw = p.copy() if core.adds and core.grad is not None else p  # (the adds read s)
                fn = core.score_inside if whole else core.score
                if core.grad is None:
                    if fn is not None:
                        p = fn(p, i, j, *rb)  # score(s) - lse: s has lse subtracted already
                else:
                    grad = core.grad(p, i, j, *rb)
                    grad = grad.copy() if np.may_share_memory(grad, p) else grad  # (the score may overwrite p)
                    if fn is not None:
                        p = fn(p, i, j, *rb)
                    p -= shift[b, ..., i0:i1, :]
                np.exp(p, out=p)
                dvb[..., j0:j1, :] += (p if w is None else p * w).swapaxes(-1, -2) @ doi
                if w is None:
                    ds = do1i @ v1t[..., j0:j1]  # do @ v.T - delta
                else:
                    ds = doi @ vt[..., j0:j1]
                    ds *= w
                    ds -= delta[b, ..., i0:i1, :]
                ds *= p  # dS, the gradient of the score: what the learned tensors' adds take
                for (add, n), dt in zip(core.adds, dtb):
                    add(dt, ds, i0, i1, j0, j1, raw, i, j, *rb)
                if core.grad is not None:
                    ds *= grad
                dqi += ds @ k[b, ..., j0:j1, :]
                dkb[..., j0:j1, :] += ds.swapaxes(-1, -2) @ qi
        return parts

    _add_parts(_run(work, runs), [dk, dv, *dts])
    if core.scale != 1:
        dq *= core.scale
    grads = [_heads_of(x.reshape(batch + x.shape[1:]), shape, core.heads) for x, shape in zip((dq, dk, dv), shapes)]
    learned = [_to_shape(dt.reshape(batch + dt.shape[1:]), arrays[n].shape) for dt, (_, n) in zip(dts, core.adds)]
    return tuple(grads + learned)


def _flash_forward_backward(q, k, v, do, dlse, reads, core, block_q, block_k, threads):
    """(o, lse, dq, dk, dv, *dT): `_flash_forward` and `_flash_backward` in one pass, for a gradient do of o that
    is known before o is (its output's gradient does not depend on o).

    Per query block, the scores of every key it may see come from one product and stay (block_q rows x
    those keys: O(N * block) memory, no online softmax): E = exp(s - m) with m the row max, l = rowsum(E)
    (a column of ones appended to v), o = (E * w) @ v / l and delta = rowsum(do * o) - dlse; then, with
    P = E / l and the 1 / l put on the small factors, dv += (E * w).T @ (do / l), dS = E * ((do @ v.T) * w
    - delta) * score'(s), dq = dS @ k / l, dk += dS.T @ (q / l), and each learned tensor's add takes dS / l.
    Six products where the two passes take seven, and one exp of each score instead of two. A fully masked
    row gives o = 0, lse = -inf and dq = 0.
    """
    shapes = [x.shape for x in (q, k, v)]
    arrays = [r for r, _ in reads]
    forward = np.broadcast_shapes(*(x.shape[:x.ndim - 2 - core.heads] for x in (q, k, v)),
                                  *(r.shape[:r.ndim - rank] for r, rank in reads))
    q, k, v, rs, batch, lead = _prepare(q, k, v, (do,), reads, core)
    dtype = np.result_type(q, k, v, do)
    n_q, n_k, d_v = q.shape[-2], k.shape[-2], v.shape[-1]
    weighted = core.weights is not None
    do, v1 = _entries(do, batch, lead), _append(v, 1)
    gl = None if dlse is None else _entries(dlse, batch, lead)
    o, dq = np.zeros(q.shape[:-1] + (d_v,), dtype), np.zeros(q.shape, dtype)
    lse = np.full(q.shape[:-1] + (1,), -np.inf, dtype)
    dk, dv = np.zeros(k.shape, dtype), np.zeros(v.shape, dtype)
    dts = [np.zeros(rs[n].shape, dtype) for _, n in core.adds]
    units = _units(q.shape[0], n_q, n_k, core.keys, block_q)
    runs = _runs(units, threads)
    first_run = _first_runs(units, runs)

    def work(r, first, last):
        parts = {}  # entry -> (dk, dv, *dT) of this run, for an entry an earlier run has units of too
        for b, i0, i1, lo, hi in units[first:last]:
            if hi <= lo:  # no key visible: o = 0, lse = -inf, dq = 0
                continue
            dkb, dvb, *dtb = _sums_of(parts, b, first_run[b] == r, [dk, dv, *dts])
            rb = [x[b] for x in rs]
            i = np.arange(i0, i1)[:, None]
            if core.live is not None:  # the keys of the blocks the mask keeps an entry of, first to last
                cut = [(j0, j1) for j0, j1, _ in _key_blocks(lo, hi, None, block_k)]
                alive = [(j0, j1) for j0, j1 in cut if core.live(q[b, ..., i0:i1, :], i, np.arange(j0, j1)[None, :],
                                                                 *rb)]
                kept = 0 if not alive else cut.index(alive[-1]) - cut.index(alive[0]) + 1
                core.blocks[0] += kept
                core.blocks[1] += len(cut) - kept
                if not alive:  # every key masked: o = 0, lse = -inf, dq = 0
                    continue
                lo, hi = alive[0][0], alive[-1][1]
            qi, doi, kb, v1b = q[b, ..., i0:i1, :], do[b, ..., i0:i1, :], k[b, ..., lo:hi, :], v1[b, ..., lo:hi, :]
            s = qi @ kb.swapaxes(-1, -2)
            raw = s.copy() if core.adds and core.grad is not None else None  # (the adds read s)
            jall = np.arange(lo, hi)[None, :]
            w = None if not weighted else core.weights(s, i, jall, *rb)
            grads = []  # (first, end, d score / d s) of the key blocks, before the score overwrites s
            for j0, j1, whole in _key_blocks(lo, hi, None if core.inside is None else core.inside(i0, i1 - 1),
                                             block_k):
                j, part = np.arange(j0, j1)[None, :], s[..., j0 - lo:j1 - lo]
                if core.grad is not None:
                    grad = core.grad(part, i, j, *rb)  # (it may be `part` itself, which the score overwrites)
                    grads.append((j0 - lo, j1 - lo, grad.copy() if np.may_share_memory(grad, s) else grad))
                fn = core.score_inside if whole else core.score
                got = part if fn is None else fn(part, i, j, *rb)
                if got is not part:
                    part[...] = got
            top = s.max(axis=-1, keepdims=True)
            shift = np.where(top == -np.inf, 0, top)  # a fully masked row: exp(-inf - 0) = 0
            s -= shift
            np.exp(s, out=s)
            e = s if w is None else s * w
            acc = e @ v1b if w is None else np.concatenate([e @ v1b[..., :d_v], s.sum(axis=-1, keepdims=True)], -1)
            total = acc[..., d_v:]
            total = np.where(total == 0, 1, total)  # a fully masked row: 0 / 1
            oi = acc[..., :d_v] / total
            o[b, ..., i0:i1, :] = oi
            with np.errstate(divide="ignore"):
                lse[b, ..., i0:i1, :] = top + np.log(acc[..., d_v:])
            delta = np.einsum("...j,...j->...", doi, oi)[..., None]
            if gl is not None:
                delta = delta - gl[b, ..., i0:i1, :]
            if w is None:
                ds = _append(doi, -delta) @ v1b.swapaxes(-1, -2)  # do @ v.T - delta
            else:
                ds = doi @ v1b[..., :d_v].swapaxes(-1, -2)
                ds *= w
                ds -= delta
            ds *= s
            if core.adds:  # dS = ds / l, the gradient of the score
                g = ds / total
                for (add, n), dt in zip(core.adds, dtb):
                    add(dt, g, i0, i1, lo, hi, s if raw is None else raw, i, jall, *rb)
            for j0, j1, grad in grads:
                ds[..., j0:j1] *= grad
            dvb[..., lo:hi, :] += e.swapaxes(-1, -2) @ (doi / total)
            dq[b, ..., i0:i1, :] = ds @ kb / total
            dkb[..., lo:hi, :] += ds.swapaxes(-1, -2) @ (qi / total)
        return parts

    _add_parts(_run(work, runs), [dk, dv, *dts])
    if core.scale != 1:
        dq *= core.scale
    # o and lse have the batch axes of q, k, v and the reads: where do's add to them, every entry is the same
    ahead = len(batch) - len(forward)
    along = (0,) * ahead + tuple(slice(None) if f == a else slice(0, 1) for f, a in zip(forward, batch[ahead:]))
    o, lse = (x.reshape(batch + x.shape[1:])[along] for x in (o, lse))
    grads = [_heads_of(x.reshape(batch + x.shape[1:]), shape, core.heads) for x, shape in zip((dq, dk, dv), shapes)]
    learned = [_to_shape(dt.reshape(batch + dt.shape[1:]), arrays[n].shape) for dt, (_, n) in zip(dts, core.adds)]
    return (o, lse, *grads, *learned)


def _prepare(q, k, v, more, reads, core):
    """q (scaled), k and v broadcast to the batch axes of all of them, `more` and the reads, and to the heads of
    all three, as [entries, *heads, rows, width] (views); each read as [entries, *its shape]; the batch and
    head shapes."""
    h = core.heads
    batch = np.broadcast_shapes(*(x.shape[:x.ndim - 2 - h] for x in (q, k, v, *more)),
                                *(r.shape[:r.ndim - rank] for r, rank in reads))
    lead = np.broadcast_shapes(*(x.shape[x.ndim - 2 - h:x.ndim - 2] for x in (q, k, v)))
    q = q * core.scale if core.scale != 1 else q
    q, k, v = (_entries(x, batch, lead) for x in (q, k, v))
    rs = [np.broadcast_to(r, batch + r.shape[r.ndim - rank:]).reshape((-1,) + r.shape[r.ndim - rank:])
          for r, rank in reads]
    return q, k, v, rs, batch, lead


def _entries(x, batch, lead):
    """x broadcast to the batch axes `batch` and the heads `lead`, made [entries, *lead, rows, cols] (a view)."""
    x = np.broadcast_to(x, batch + lead + x.shape[-2:])
    return x.reshape((-1,) + lead + x.shape[-2:])


def _heads_of(x, shape, heads):
    """x ([*batch, *heads, rows, cols]) summed over the head axes where `shape` (an operand's) has size 1 (keeping
    them): the gradient of an operand that is broadcast over heads (GQA, MQA)."""
    axes = tuple(a for a in range(-2 - heads, -2) if shape[a] == 1 and x.shape[a] != 1)
    return x.sum(axis=axes, keepdims=True) if axes else x


def _to_shape(grad, shape):
    """`grad` summed over the batch axes and the axes of size 1 that broadcasting added: exactly `shape`."""
    lead = grad.ndim - len(shape)
    if lead > 0:
        grad = grad.sum(axis=tuple(range(lead)))
    axes = tuple(k for k, n in enumerate(shape) if n == 1 and grad.shape[k] != 1)
    return grad.sum(axis=axes, keepdims=True) if axes else grad


def _first_runs(units, runs):
    """entry -> the first run with units of it: that run sums the entry's dk and dv in place, each later one
    in arrays of its own (`_sums_of`), added in the order of the runs afterwards (`_add_parts`)."""
    first_run = {}
    for r, (first, last) in enumerate(runs):
        for b in range(units[first][0], units[last - 1][0] + 1):
            first_run.setdefault(b, r)
    return first_run


def _sums_of(parts, b, first, arrays):
    """Where a run adds entry b's part of each of `arrays` (dk, dv, the learned gradients): the arrays' own rows
    b for the entry's `first` run, else zeros of this run's own, kept in `parts` (entry -> list)."""
    if not first and b not in parts:
        parts[b] = [np.zeros(a.shape[1:], a.dtype) for a in arrays]
    return parts[b] if b in parts else [a[b, ...] for a in arrays]


def _add_parts(results, arrays):
    """Each run's own sums (`_sums_of`) added into `arrays`, in the order of the runs: the sums do not depend
    on timing."""
    for parts in results:
        for b, own in parts.items():
            for a, x in zip(arrays, own):
                a[b] += x


def _units(entries, n_q, n_k, keys, block_q):
    """The units of work of a tiled pass, (entry, first row, end row, first key, end key): each batch entry's
    query blocks in order, with the range of keys they may see (`keys`, None: all)."""
    units = []
    for b in range(entries):
        for i0 in range(0, n_q, block_q):
            i1 = min(i0 + block_q, n_q)
            units.append((b, i0, i1) + ((0, n_k) if keys is None else tuple(keys(i0, i1 - 1))))
    return units


def _runs(units, threads):
    """The units cut into at most `threads` runs (first, end) of consecutive units, each of about an equal share
    of the work (rows x keys seen; each cut at the unit boundary nearest its share), none empty. The cuts
    depend on nothing but the units and `threads` (None: `_threads()`)."""
    threads = _threads() if threads is None else threads
    prefix = np.cumsum([0] + [(i1 - i0) * max(hi - lo, 0) for _, i0, i1, lo, hi in units])
    cuts = [0] + [int(np.argmin(np.abs(prefix - prefix[-1] * w / threads))) for w in range(1, threads)]
    cuts = sorted(set(cuts + [len(units)]))
    return [(first, end) for first, end in zip(cuts, cuts[1:]) if first < end]


def _threads():
    """The default thread count of the tiled pass: OPENBLAS_NUM_THREADS or else OMP_NUM_THREADS when set to
    a whole number (the first of a list), else the CPU count."""
    import os

    for name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS"):
        value = os.environ.get(name, "").split(",")[0].strip()
        if value.isdigit() and int(value) > 0:
            return int(value)
    return os.cpu_count() or 1


def _run(work, runs):
    """[work(r, first, end) for each run r], in the order of the runs. Several runs go at once, each on a thread
    of its own (NumPy's products and ufuncs release the GIL), while BLAS is held to one thread per product
    (`_one_blas_thread`); where it cannot be, one after another in this thread (the same sums: each run's
    work is the same)."""
    limit = _one_blas_thread() if len(runs) > 1 else None
    if limit is None:
        return [work(r, *run) for r, run in enumerate(runs)]
    from concurrent.futures import ThreadPoolExecutor

    with limit, ThreadPoolExecutor(len(runs) - 1) as pool:
        others = [pool.submit(work, r, *run) for r, run in enumerate(runs) if r]
        return [work(0, *runs[0])] + [future.result() for future in others]


def _one_blas_thread():
    """A context that holds BLAS to one thread per product while it lasts (threadpoolctl's limit: for the whole
    process), or None where threadpoolctl is not installed. Products that BLAS splits over threads of its
    own, called from several threads at once, wait for each other (BENCHMARKS.md: the tiled pass's threads).
    Two tiled passes called from two threads at once may leave BLAS at one thread (each limit restores what
    it found when it began)."""
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        return None
    return threadpool_limits(limits=1, user_api="blas")


def _append(x, column):
    """x with one more column on its last axis: a number, or an array of one column (batch axes broadcast)."""
    batch = np.broadcast_shapes(x.shape[:-2], np.shape(column)[:-2])
    out = np.empty(batch + x.shape[-2:-1] + (x.shape[-1] + 1,), x.dtype)
    out[..., :-1] = x
    out[..., -1:] = column
    return out


TILED = ("_flash_forward", "_flash_backward", "_flash_forward_backward", "_prepare", "_entries", "_heads_of",
         "_to_shape", "_first_runs", "_sums_of", "_add_parts", "_units", "_runs", "_threads", "_run",
         "_one_blas_thread", "_append")
_PASS = ("_prepare", "_entries", "_units", "_runs", "_run", "_key_blocks", "_append")
_SUMS = ("_first_runs", "_sums_of", "_add_parts", "_heads_of", "_to_shape")
CALLS = {"_flash_forward": _PASS, "_flash_backward": _PASS + _SUMS, "_flash_forward_backward": _PASS + _SUMS,
         "_runs": ("_threads",), "_run": ("_one_blas_thread",)}
