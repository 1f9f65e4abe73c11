"""Runtime helpers of generated NumPy modules: copied, as source text, into the modules that call them.

Contract: every function here is an ordinary NumPy function that a generated
module may call; `helper_source(name)` is its exact source text, which the
NumPy printer copies into a generated module that uses it (so that the module
needs nothing but NumPy: the tiled pass's helpers import the standard library
inside, and threadpoolctl where it is installed), with the helpers it calls in
turn (`CALLS`). Being real functions, they are tested and linted like any
other code. Each keeps the dtype of its arrays and never loops over tokens.
"""

from __future__ import annotations

import inspect

import numpy as np

__all__ = ["HELPERS", "CALLS", "helper_source"]


def _as_float(*arrays):
    """The arrays in their common floating dtype (integers become float64); no copy when already so."""
    arrays = [a if type(a) is np.ndarray else np.asarray(a) for a in arrays]
    dtype = np.result_type(np.float32, *arrays)
    if dtype.kind != "f":
        raise ValueError(f"expected real floating-point arrays, got dtype {dtype}")
    return dtype, [a if a.dtype == dtype else a.astype(dtype) for a in arrays]


def _bind(name, array, shape, expected):
    """The sizes of the last len(expected) axes of `array`; ValueError unless they are `expected` (None: any)."""
    rank = len(expected)
    sizes = array.shape[array.ndim - rank:]
    fits = array.ndim >= rank
    for want, size in zip(expected, sizes):
        if want is not None and want != size:
            fits = False
    if not fits:
        want = ", ".join("?" if e is None else str(e) for e in expected)
        raise ValueError(f"{name}: expected shape {shape} = [{want}] after any leading batch axes, "
                         f"got {list(array.shape)}")
    return sizes


def _batch_axes(*arrays):
    """The broadcast shape of the leading batch axes of (name, array, rank) triples; ValueError if none."""
    leading = {name: array.shape[:array.ndim - rank] for name, array, rank in arrays}
    if not any(leading.values()):
        return ()
    try:
        return np.broadcast_shapes(*leading.values())
    except ValueError:
        shown = ", ".join(f"{name} {list(array.shape)}" for name, array, _ in arrays)
        raise ValueError(f"the leading batch axes do not broadcast: {shown}") from None


def _take(tensors, names):
    """The arrays passed as these keywords, in order; TypeError for a missing or unexpected one."""
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
    array = np.asarray(array)
    _bind(name, array, shape, expected)
    return array.astype(dtype, copy=False)


def _one_batch(arrays):
    """(name, array, rank) of each output and its upstream gradient: ValueError unless all have the same batch
    axes (leading axes of size 1 aside). With several outputs, a gradient path from one of them carries its
    batch axes; paths with different ones, added and then summed over the batch at each leaf, would count
    the smaller ones once per batch entry (a weight penalty beside batched attention: 3x at batch 3)."""
    shapes = {}
    for name, array, rank in arrays:  # (plain Python on shapes: the torch target's helper too)
        lead = tuple(array.shape[:len(array.shape) - rank])
        while lead and lead[0] == 1:
            lead = lead[1:]
        shapes[name] = lead
    if len(set(shapes.values())) > 1:
        shown = ", ".join(f"{name} {list(lead)}" for name, lead in shapes.items())
        raise ValueError(f"the outputs and their upstream gradients have different batch axes ({shown}): the "
                         f"gradients of outputs with different batch axes are not supported; give them all the "
                         f"same batch axes")

def _sum_to(grad, shape):
    """`grad` summed over the batch axes that broadcasting added, so that it has exactly `shape`."""
    if grad.shape == shape:
        return grad
    lead = grad.ndim - len(shape)
    if lead > 0:
        grad = grad.sum(axis=tuple(range(lead)))
    axes = tuple(k for k, n in enumerate(shape) if n == 1 and k >= len(shape) - grad.ndim
                 and grad.shape[k - len(shape) + grad.ndim] != 1)
    if axes:
        grad = grad.sum(axis=tuple(k - len(shape) for k in axes), keepdims=True)
    return np.broadcast_to(grad, shape).copy() if grad.shape != shape else grad


def _softmax_(x, axis):
    """softmax(x) along `axis`, stably (the row max is subtracted), computed in x's own buffer.

    A fully masked row (all -inf) gets weights 0, not NaN: its max counts as the
    dtype's lowest finite value, so it stays -inf and exp gives 0, and its sum
    starts from the tiniest positive value (which leaves every other sum, at
    least 1, unchanged), so 0 / tiny = 0.
    """
    finfo = np.finfo(x.dtype)
    x -= x.max(axis=axis, keepdims=True, initial=finfo.min)
    np.exp(x, out=x)
    x /= x.sum(axis=axis, keepdims=True, initial=finfo.tiny)
    return x


def _softmax(x, axis):
    """softmax(x) along `axis` in a new array (x is read again later)."""
    return _softmax_(np.array(x), axis)


def _softmax_backward_(P, dP, rowdot):
    """grad(S) = P * (dP - rowdot) for P = softmax(S), rowdot = sum(dP * P) along the softmax axis.

    Computed in dP's buffer (dP is not read again) when the shapes allow it.
    """
    fits = dP.shape == P.shape and dP.ndim >= rowdot.ndim and dP.flags.writeable
    for r, s in zip(rowdot.shape[::-1], dP.shape[::-1]):
        if r != 1 and r != s:
            fits = False
    if not fits:
        return P * (dP - rowdot)
    dP -= rowdot
    dP *= P
    return dP


def _softmax_backward(P, dP, rowdot):
    """grad(S) = P * (dP - rowdot) for P = softmax(S), in a new array."""
    return P * (dP - rowdot)


def _rowdot(a, b):
    """sum(a * b, axis=-1), keeping the axis, without an array of the products."""
    return np.einsum("...j,...j->...", a, b)[..., None]


def _logsumexp(x, axis):
    """log(sum(exp(x))) along `axis`, stably; -inf for a fully masked row."""
    top = x.max(axis=axis, keepdims=True, initial=np.finfo(x.dtype).min)
    with np.errstate(divide="ignore"):
        return np.log(np.exp(x - top).sum(axis=axis, keepdims=True)) + top


def _reverse_cumsum(x, axis):
    """The suffix sum along `axis`: entry i holds x[i] + x[i + 1] + ... (the adjoint of np.cumsum)."""
    return np.flip(np.cumsum(np.flip(x, axis), axis=axis), axis)


def _sigmoid(x):
    """1 / (1 + exp(-x)), stably: exp only of -|x|, so it neither overflows nor underflows early.

    For x < 0 it is e / (1 + e) with e = exp(x), accurate down to the smallest
    subnormal (the tanh form 0.5 * tanh(x / 2) + 0.5 rounds to 0 below x = -37 in
    float64, so log(sigmoid(x)) became -inf and its gradient NaN).
    """
    e = np.exp(-np.abs(x))
    return np.where(x >= 0, 1, e) / (1 + e)


def _merge_heads(x):
    """[..., h, N, k] -> [..., N, h * k], head-major."""
    x = x.swapaxes(-3, -2)
    return x.reshape(*x.shape[:-2], x.shape[-2] * x.shape[-1])


def _split_heads(x, heads):
    """[..., N, h * k] -> [..., h, N, k], the inverse of _merge_heads."""
    if x.shape[-1] % heads:
        raise ValueError(f"split_heads: width {x.shape[-1]} is not a multiple of {heads} heads")
    return x.reshape(*x.shape[:-1], heads, x.shape[-1] // heads).swapaxes(-3, -2)


def _concat(parts, axis):
    """np.concatenate along `axis` (negative), after broadcasting the leading batch axes."""
    rank = -axis
    batch = np.broadcast_shapes(*(p.shape[:p.ndim - rank] for p in parts))
    return np.concatenate([np.broadcast_to(p, batch + p.shape[p.ndim - rank:]) for p in parts], axis=axis)


def _expand(x, shape):
    """`x` broadcast over the trailing `shape` (its leading batch axes kept); a read-only view."""
    return np.broadcast_to(x, x.shape[:x.ndim - len(shape)] + shape)


def _sinusoidal(n, width, dtype):
    """E[i, 2c] = sin(i / 10000^(2c/width)), E[i, 2c+1] = cos(i / 10000^(2c/width)), i from 0."""
    column = np.arange(width)
    angle = np.arange(n)[:, None] / 10000.0 ** (2 * (column // 2) / width)
    return np.where(column % 2 == 0, np.sin(angle), np.cos(angle)).astype(dtype)


def _causal_mask(n, dtype):
    """0 on and below the diagonal, -inf above it."""
    return np.triu(np.full((n, n), -np.inf, dtype=dtype), k=1)


def _scatter(values, at, shape, rank):
    """Zeros of `shape` (after the leading batch axes of `values`) to which each entry of `values` over
    its last `rank` axes is added at the position the index arrays `at` give it (np.add.at: a position
    reached several times gets the sum)."""
    box = values.shape[values.ndim - rank:]
    out = np.zeros(values.shape[:values.ndim - rank] + tuple(shape), dtype=values.dtype)
    np.add.at(out, (Ellipsis, *(np.broadcast_to(a, box) for a in at)), values)
    return out


def _flash_forward(q, k, v, score, keys, inside, score_inside, scale, heads, block_q, block_k, threads):
    """(o, lse): o = softmax(score(scale * q @ k.T), axis=-1) @ v and each row's log-sum-exp, tiled (FlashAttention).

    Per batch entry (the last `heads` leading axes, which the score may read,
    stay together), blocks of block_q query rows x block_k keys: each
    block's scores come from one matrix product, and an online softmax keeps
    each row's running max m and sum l of exp(score - m), rescaling the partial
    output when m grows, so no array is larger than a block. `score(s, i, j)`
    is the score of the block with products s (it may overwrite s) at rows i
    ([rows, 1]) and keys j ([1, cols]); `keys(first, last)` (None: all) the
    range of keys rows first..last may see: blocks outside it are skipped;
    `inside(first, last)` (None: none) the keys every one of those rows sees
    at each condition that bounds keys, where the score is
    `score_inside(s, i, j)` (None: s itself), which pays no mask (see
    `_key_blocks`). The row sums come out of the product with v, which has a
    column of ones appended. A fully masked row gives o = 0 and lse = -inf,
    never NaN. The (entry, query block) units run on `threads` threads
    (`_units`, `_runs`, `_run`); each unit writes its own rows of o and lse, so
    the result does not depend on the thread count.
    """
    batch = np.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    dtype = np.result_type(q, k, v)
    n_q, n_k, d_v = q.shape[-2], k.shape[-2], v.shape[-1]
    q = _entries(q * scale if scale != 1 else q, batch, heads)
    k, v1 = _entries(k, batch, heads), _entries(_append(v, 1), batch, heads)  # p @ [v, 1] = [p @ v, rowsum(p)]
    o = np.zeros(q.shape[:-1] + (d_v,), dtype)
    lse = np.full(q.shape[:-1] + (1,), -np.inf, dtype)
    units = _units(q.shape[0], n_q, n_k, keys, block_q)

    def work(r, first, last):
        for b, i0, i1, lo, hi in units[first:last]:
            kt = k[b].swapaxes(-1, -2)
            i = np.arange(i0, i1)[:, None]
            qi = q[b, ..., i0:i1, :]
            m = np.full(qi.shape[:-1] + (1,), -np.inf, dtype)  # running max of each row's scores
            acc = np.zeros(qi.shape[:-1] + (d_v + 1,), dtype)  # running p @ v and sum of p, against m
            for j0, j1, whole in _key_blocks(lo, hi, None if inside is None else inside(i0, i1 - 1), block_k):
                p = qi @ kt[..., j0:j1]
                fn = score_inside if whole else score
                if fn is not None:
                    p = fn(p, i, np.arange(j0, j1)[None, :])
                top = p.max(axis=-1, keepdims=True, initial=-np.inf)
                np.maximum(top, m, out=top)
                shift = np.where(top == -np.inf, 0, top)  # a row masked so far: exp(-inf - 0) = 0
                p -= shift
                np.exp(p, out=p)
                m -= shift
                acc *= np.exp(m, out=m)
                acc += p @ v1[b, ..., j0:j1, :]
                m = top
            total = acc[..., d_v:]
            o[b, ..., i0:i1, :] = acc[..., :d_v] / np.where(total == 0, 1, total)
            with np.errstate(divide="ignore"):
                lse[b, ..., i0:i1, :] = m + np.log(total)

    _run(work, _runs(units, threads))
    return o.reshape(batch + o.shape[-2:]), lse.reshape(batch + lse.shape[-2:])


def _flash_backward(q, k, v, o, lse, do, score, score_grad, keys, inside, score_inside, scale, heads,
                    block_q, block_k, threads):
    """(dq, dk, dv) for o = softmax(score(scale * q @ k.T), axis=-1) @ v, given do = grad(o), tiled (FlashAttention-2).

    delta = rowsum(do * o) (= rowsum(dP * P)); per block the weights are
    recomputed from the saved lse, P = exp(score - lse), then dv += P.T @ do,
    dS = P * (do @ v.T - delta) * score'(s), dq += dS @ k and dk += dS.T @ q,
    over the blocks the forward visited (`keys`, `inside` and `score_inside` as
    there). `score_grad(s, i, j)` is d score / d s (evaluated before `score`,
    which may overwrite s); None means 1 (the score is s plus terms of the
    indices), and then lse is subtracted inside the product: [q, -lse] @ [k, 1].T.
    delta always is: [do, -delta] @ [v, 1].T. The (entry, query block) units
    run on `threads` threads as in `_flash_forward`: each writes its own rows
    of dq; dk and dv of an entry whose units several runs share are summed in
    place by the first of them and in an array of its own by each other one,
    added in the order of the runs afterwards.
    """
    batch = np.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2], do.shape[:-2])
    dtype = np.result_type(q, k, v, do)
    n_q, n_k = q.shape[-2], k.shape[-2]
    shift = np.where(lse == -np.inf, 0, lse)  # a fully masked row: exp(-inf - 0) = 0
    delta = np.einsum("...j,...j->...", do, o)[..., None]
    q = q * scale if scale != 1 else q
    q1, k1 = (_append(q, -shift), _append(k, 1)) if score_grad is None else (q, k)
    q, q1, k, k1, do, do1, v1, shift = (_entries(x, batch, heads) for x in (
        q, q1, k, k1, do, _append(do, -delta), _append(v, 1), shift))
    dq, dk = np.zeros(q.shape, dtype), np.zeros(k.shape, dtype)
    dv = np.zeros(k.shape[:-1] + (v1.shape[-1] - 1,), dtype)
    units = _units(q.shape[0], n_q, n_k, keys, block_q)
    runs = _runs(units, threads)
    first_run = _first_runs(units, runs)

    def work(r, first, last):
        parts = {}  # entry -> (dk, dv) of this run, for an entry an earlier run has units of too
        for b, i0, i1, lo, hi in units[first:last]:
            dkb, dvb = _sums_of(parts, b, first_run[b] == r, dk, dv)
            kt, v1t = k1[b].swapaxes(-1, -2), v1[b].swapaxes(-1, -2)
            i = np.arange(i0, i1)[:, None]
            qi, q1i, doi, do1i, dqi = (x[b, ..., i0:i1, :] for x in (q, q1, do, do1, dq))
            for j0, j1, whole in _key_blocks(lo, hi, None if inside is None else inside(i0, i1 - 1), block_k):
                j = np.arange(j0, j1)[None, :]
                p = q1i @ kt[..., j0:j1]
                fn = score_inside if whole else score
                if score_grad is None:
                    if fn is not None:
                        p = fn(p, i, j)  # score(s) - lse: s has lse subtracted already
                else:
                    grad = score_grad(p, i, j)
                    grad = grad.copy() if np.may_share_memory(grad, p) else grad  # (the score may overwrite p)
                    if fn is not None:
                        p = fn(p, i, j)
                    p -= shift[b, ..., i0:i1, :]
                np.exp(p, out=p)
                dvb[..., j0:j1, :] += p.swapaxes(-1, -2) @ doi
                ds = do1i @ v1t[..., j0:j1]  # do @ v.T - delta
                ds *= p
                if score_grad is not None:
                    ds *= grad
                dqi += ds @ k[b, ..., j0:j1, :]
                dkb[..., j0:j1, :] += ds.swapaxes(-1, -2) @ qi
        return parts

    _add_parts(_run(work, runs), dk, dv)
    if scale != 1:
        dq *= scale
    return tuple(x.reshape(batch + x.shape[-2:]) for x in (dq, dk, dv))


def _flash_forward_backward(q, k, v, do, score, score_grad, keys, inside, score_inside, scale, heads,
                            block_q, block_k, threads):
    """(o, lse, dq, dk, dv): `_flash_forward` and `_flash_backward` in one pass, for a gradient do of o that is
    known before o is (its output's gradient does not depend on o).

    Per query block, the scores of every key it may see come from one product and stay (block_q rows x
    those keys: O(N * block) memory, no online softmax): E = exp(s - m) with m the row max, l = rowsum(E)
    (a column of ones appended to v), o = E @ v / l and delta = rowsum(do * o); then, with P = E / l and
    the 1 / l put on the small factors, dv += E.T @ (do / l), dS = E * (do @ v.T - delta) * score'(s),
    dq = dS @ k / l and dk += dS.T @ (q / l). Six products where the two passes take seven, and one exp of
    each score instead of two. `score`, `score_grad`, `keys`, `inside` and `score_inside` as in
    `_flash_backward` (`_key_blocks` cuts each row block's keys where the mask is to be paid); the units,
    their threads and the order of the dk and dv sums as there. A fully masked row gives o = 0,
    lse = -inf and dq = 0.
    """
    forward = np.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    batch = np.broadcast_shapes(forward, do.shape[:-2])
    dtype = np.result_type(q, k, v, do)
    n_q, n_k, d_v = q.shape[-2], k.shape[-2], v.shape[-1]
    q = q * scale if scale != 1 else q
    q, k, do, v1 = (_entries(x, batch, heads) for x in (q, k, do, _append(v, 1)))
    o, dq = np.zeros(q.shape[:-1] + (d_v,), dtype), np.zeros(q.shape, dtype)
    lse = np.full(q.shape[:-1] + (1,), -np.inf, dtype)
    dk, dv = np.zeros(k.shape, dtype), np.zeros(k.shape[:-1] + (d_v,), dtype)
    units = _units(q.shape[0], n_q, n_k, keys, block_q)
    runs = _runs(units, threads)
    first_run = _first_runs(units, runs)

    def work(r, first, last):
        parts = {}  # entry -> (dk, dv) of this run, for an entry an earlier run has units of too
        for b, i0, i1, lo, hi in units[first:last]:
            if hi <= lo:  # no key visible: o = 0, lse = -inf, dq = 0
                continue
            dkb, dvb = _sums_of(parts, b, first_run[b] == r, dk, dv)
            i = np.arange(i0, i1)[:, None]
            qi, doi, kb, v1b = q[b, ..., i0:i1, :], do[b, ..., i0:i1, :], k[b, ..., lo:hi, :], v1[b, ..., lo:hi, :]
            s = qi @ kb.swapaxes(-1, -2)
            grads = []  # (first, end, d score / d s) of the key blocks, before `score` overwrites s
            for j0, j1, whole in _key_blocks(lo, hi, None if inside is None else inside(i0, i1 - 1), block_k):
                j, part = np.arange(j0, j1)[None, :], s[..., j0 - lo:j1 - lo]
                if score_grad is not None:
                    grad = score_grad(part, i, j)  # (it may be `part` itself, which the score overwrites)
                    grads.append((j0 - lo, j1 - lo, grad.copy() if np.may_share_memory(grad, s) else grad))
                fn = score_inside if whole else score
                got = part if fn is None else fn(part, i, j)
                if got is not part:
                    part[...] = got
            top = s.max(axis=-1, keepdims=True)
            shift = np.where(top == -np.inf, 0, top)  # a fully masked row: exp(-inf - 0) = 0
            s -= shift
            np.exp(s, out=s)
            acc = s @ v1b  # [E @ v, l]
            total = acc[..., d_v:]
            total = np.where(total == 0, 1, total)  # a fully masked row: 0 / 1
            oi = acc[..., :d_v] / total
            o[b, ..., i0:i1, :] = oi
            with np.errstate(divide="ignore"):
                lse[b, ..., i0:i1, :] = top + np.log(acc[..., d_v:])
            delta = np.einsum("...j,...j->...", doi, oi)[..., None]
            ds = _append(doi, -delta) @ v1b.swapaxes(-1, -2)  # do @ v.T - delta
            ds *= s
            for j0, j1, grad in grads:
                ds[..., j0:j1] *= grad
            dvb[..., lo:hi, :] += s.swapaxes(-1, -2) @ (doi / total)
            dq[b, ..., i0:i1, :] = ds @ kb / total
            dkb[..., lo:hi, :] += ds.swapaxes(-1, -2) @ (qi / total)
        return parts

    _add_parts(_run(work, runs), dk, dv)
    if scale != 1:
        dq *= scale
    # o and lse have the batch axes of q, k and v: where do's add to them, every entry along those is the same
    ahead = len(batch) - len(forward)
    along = (0,) * ahead + tuple(slice(None) if f == a else slice(0, 1) for f, a in zip(forward, batch[ahead:]))
    o, lse = (x.reshape(batch + x.shape[-2:])[along] for x in (o, lse))
    return (o, lse) + tuple(x.reshape(batch + x.shape[-2:]) for x in (dq, dk, dv))


def _first_runs(units, runs):
    """entry -> the first run with units of it: that run sums the entry's dk and dv in place, each later one
    in arrays of its own (`_sums_of`), added in the order of the runs afterwards (`_add_parts`)."""
    first_run = {}
    for r, (first, last) in enumerate(runs):
        for b in range(units[first][0], units[last - 1][0] + 1):
            first_run.setdefault(b, r)
    return first_run


def _sums_of(parts, b, first, dk, dv):
    """Where a run adds entry b's dk and dv: dk[b] and dv[b] for the entry's `first` run, else zeros of this
    run's own, kept in `parts` (entry -> (dk, dv))."""
    if not first and b not in parts:
        parts[b] = np.zeros(dk.shape[1:], dk.dtype), np.zeros(dv.shape[1:], dv.dtype)
    return parts[b] if b in parts else (dk[b], dv[b])


def _add_parts(results, dk, dv):
    """Each run's own sums (`_sums_of`) added into dk and dv, in the order of the runs: the sums do not depend
    on timing."""
    for parts in results:
        for b, (dkb, dvb) in parts.items():
            dk[b] += dkb
            dv[b] += dvb


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
    own, called from several threads at once, wait for each other: two runs at once on two-thread OpenBLAS
    took 1.2 s and 13 s (causal) where one after another took 0.7 s and 0.4 s (N = 4096, d = 64, 2 cores).
    Two tiled passes called from two threads at once may leave BLAS at one thread (each limit restores what
    it found when it began)."""
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        return None
    return threadpool_limits(limits=1, user_api="blas")


def _key_blocks(lo, hi, inside, block_k):
    """The blocks of keys lo..hi - 1 as (first, end, whole): those of the range `inside` (first, end; None:
    empty), rounded inward to multiples of min(64, block_k), are `whole` (every condition
    bounding keys holds there: no mask to apply), and every other key is in a block that straddles them.
    Each stretch is cut into blocks of block_k keys (the last one shorter)."""
    step = min(64, block_k)
    a, b = inside or (hi, hi)
    a = min(max(-(-a // step) * step, lo), hi)
    b = max(min(b // step * step, hi), a)
    return [(j0, min(j0 + block_k, end), whole)
            for start, end, whole in ((lo, a, False), (a, b, True), (b, hi, False))
            for j0 in range(start, end, block_k)]


def _append(x, column):
    """x with one more column on its last axis: a number, or an array of one column (batch axes broadcast)."""
    batch = np.broadcast_shapes(x.shape[:-2], np.shape(column)[:-2])
    out = np.empty(batch + x.shape[-2:-1] + (x.shape[-1] + 1,), x.dtype)
    out[..., :-1] = x
    out[..., -1:] = column
    return out


def _entries(x, batch, heads):
    """x broadcast to the batch axes `batch` and made [entries, *heads, rows, cols]: the leading axes but the last
    `heads` flattened into one (a view where x has them all)."""
    x = np.broadcast_to(x, batch + x.shape[-2:])
    return x.reshape((-1,) + x.shape[x.ndim - 2 - heads:])


HELPERS = (  # in the order generated modules list them
    "_as_float", "_bind", "_batch_axes", "_take", "_size", "_exact", "_upstream", "_one_batch", "_sum_to",
    "_softmax_", "_softmax", "_softmax_backward_", "_softmax_backward", "_rowdot", "_logsumexp", "_reverse_cumsum",
    "_sigmoid",
    "_merge_heads", "_split_heads", "_concat", "_expand", "_sinusoidal", "_causal_mask", "_scatter",
    "_flash_forward", "_flash_backward", "_flash_forward_backward", "_first_runs", "_sums_of", "_add_parts",
    "_units", "_runs", "_threads", "_run", "_one_blas_thread", "_key_blocks",
    "_append", "_entries",
)
_TILED = ("_units", "_runs", "_run", "_key_blocks", "_append", "_entries")
_SUMS = ("_first_runs", "_sums_of", "_add_parts")
CALLS = {"_upstream": ("_bind",), "_softmax": ("_softmax_",), "_flash_forward": _TILED,
         "_flash_backward": _TILED + _SUMS, "_flash_forward_backward": _TILED + _SUMS,
         "_runs": ("_threads",), "_run": ("_one_blas_thread",)}  # helper -> the helpers it calls


def helper_source(name: str) -> str:
    """The source text of one helper, as it appears in generated modules."""
    if name not in HELPERS:
        raise KeyError(f"no runtime helper {name}")
    return inspect.getsource(globals()[name]).strip("\n")
