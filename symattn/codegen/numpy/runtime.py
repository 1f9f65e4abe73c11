"""Runtime helpers of generated NumPy modules: copied, as source text, into the modules that call them.

Contract: every function here is an ordinary NumPy function that a generated
module may call; `helper_source(name)` is its exact source text, which the
NumPy printer copies into a generated module that uses it (so that the module
needs nothing but NumPy), with the helpers it calls in turn (`CALLS`). Being
real functions, they are tested and linted like any other code. Each keeps
the dtype of its arrays and never loops over tokens.
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


def _flash_forward(q, k, v, score, keys, block_q, block_k):
    """(o, lse): o = softmax(score(q @ k.T), axis=-1) @ v and each row's log-sum-exp, tiled (FlashAttention).

    Blocks of block_q query rows x block_k keys: each block's scores come from
    one matrix product, and an online softmax keeps each row's running max m and
    sum l of exp(score - m), rescaling the partial output when m grows, so no
    array is larger than a block (per batch entry and head). `score(s, i, j)` is
    the score of the block with products s at rows i ([rows, 1]) and keys j
    ([1, cols]); `keys(first, last)` (None: all) the range of keys rows
    first..last may see, so blocks outside it are never computed. A fully
    masked row gives o = 0 and lse = -inf, never NaN.
    """
    n_q, n_k = q.shape[-2], k.shape[-2]
    batch = np.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    dtype = np.result_type(q, k, v)
    o = np.zeros(batch + (n_q, v.shape[-1]), dtype)
    lse = np.full(batch + (n_q, 1), -np.inf, dtype)
    kt = k.swapaxes(-1, -2)
    for i0 in range(0, n_q, block_q):
        i1 = min(i0 + block_q, n_q)
        lo, hi = (0, n_k) if keys is None else keys(i0, i1 - 1)
        i = np.arange(i0, i1)[:, None]
        qi = q[..., i0:i1, :]
        m = np.full(batch + (i1 - i0, 1), -np.inf, dtype)  # running max of each row's scores
        l = np.zeros(batch + (i1 - i0, 1), dtype)           # running sum of exp(score - m)
        acc = o[..., i0:i1, :]
        for j0 in range(lo, hi, block_k):
            j1 = min(j0 + block_k, hi)
            p = score(qi @ kt[..., j0:j1], i, np.arange(j0, j1)[None, :])
            top = np.maximum(m, p.max(axis=-1, keepdims=True))
            shift = np.where(top == -np.inf, 0, top)  # a row masked so far: exp(-inf - 0) = 0
            p -= shift
            np.exp(p, out=p)
            alpha = np.exp(m - shift)
            l *= alpha
            l += p.sum(axis=-1, keepdims=True)
            acc *= alpha
            acc += p @ v[..., j0:j1, :]
            m = top
        acc /= np.where(l == 0, 1, l)
        with np.errstate(divide="ignore"):
            lse[..., i0:i1, :] = m + np.log(l)
    return o, lse


def _flash_backward(q, k, v, o, lse, do, score, score_grad, keys, block_q, block_k):
    """(dq, dk, dv) for o = softmax(score(q @ k.T), axis=-1) @ v, given do = grad(o), tiled (FlashAttention-2).

    delta = rowsum(do * o) (= rowsum(dP * P)); per block, the weights are
    recomputed from the saved lse, P = exp(score - lse), then dv += P.T @ do,
    dP = do @ v.T, dS = P * (dP - delta) * score'(s), dq += dS @ k and
    dk += dS.T @ q; the blocks are those the forward visited. A constant
    score' (a scale) is applied to dq and dk once, at the end.
    """
    n_q, n_k = q.shape[-2], k.shape[-2]
    batch = np.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2], do.shape[:-2])
    dtype = np.result_type(q, k, v, do)
    dq = np.zeros(batch + q.shape[-2:], dtype)
    dk = np.zeros(batch + k.shape[-2:], dtype)
    dv = np.zeros(batch + v.shape[-2:], dtype)
    delta = np.einsum("...j,...j->...", do, o)[..., None]
    shift = np.where(lse == -np.inf, 0, lse)  # a fully masked row: exp(-inf - 0) = 0
    kt, vt = k.swapaxes(-1, -2), v.swapaxes(-1, -2)
    scale = None
    for i0 in range(0, n_q, block_q):
        i1 = min(i0 + block_q, n_q)
        lo, hi = (0, n_k) if keys is None else keys(i0, i1 - 1)
        i = np.arange(i0, i1)[:, None]
        qi, doi, dqi = q[..., i0:i1, :], do[..., i0:i1, :], dq[..., i0:i1, :]
        for j0 in range(lo, hi, block_k):
            j1 = min(j0 + block_k, hi)
            j = np.arange(j0, j1)[None, :]
            s = qi @ kt[..., j0:j1]
            p = score(s, i, j)
            if p is s:
                p = s.copy()
            p -= shift[..., i0:i1, :]
            np.exp(p, out=p)
            dv[..., j0:j1, :] += p.swapaxes(-1, -2) @ doi
            ds = doi @ vt[..., j0:j1]
            ds -= delta[..., i0:i1, :]
            ds *= p
            grad = score_grad(s, i, j)
            if np.ndim(grad) == 0:
                scale = grad
            else:
                ds *= grad
            dqi += ds @ k[..., j0:j1, :]
            dk[..., j0:j1, :] += ds.swapaxes(-1, -2) @ qi
    if scale is not None and scale != 1:
        dq *= scale
        dk *= scale
    return dq, dk, dv


HELPERS = (  # in the order generated modules list them
    "_as_float", "_bind", "_batch_axes", "_take", "_size", "_exact", "_upstream", "_sum_to",
    "_softmax_", "_softmax", "_softmax_backward_", "_softmax_backward", "_rowdot", "_logsumexp", "_reverse_cumsum",
    "_sigmoid",
    "_merge_heads", "_split_heads", "_concat", "_expand", "_sinusoidal", "_causal_mask", "_scatter",
    "_flash_forward", "_flash_backward",
)
CALLS = {"_upstream": ("_bind",), "_softmax": ("_softmax_",)}  # helper -> the helpers it calls


def helper_source(name: str) -> str:
    """The source text of one helper, as it appears in generated modules."""
    if name not in HELPERS:
        raise KeyError(f"no runtime helper {name}")
    return inspect.getsource(globals()[name]).strip("\n")
