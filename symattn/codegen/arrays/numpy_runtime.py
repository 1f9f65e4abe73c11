"""The NumPy host's runtime helpers: copied, as source text, into the generated NumPy modules that call them.

Contract: every function here is an ordinary NumPy function that a generated
module may call; `HOST` lists them with the shared plain-Python helpers
(`symattn.codegen.arrays.runtime`), and `runtime(extra, helpers, calls)` is
the `Runtime` of a target that adds its own (the NumPy target's tiled pass):
its `helper_source(name)` is one's exact source text, which the printer
copies into a generated module that uses it (so that the module needs nothing
but NumPy), with the helpers it calls in turn. Being real functions, they
are tested and linted like any other code. Each keeps the dtype of its arrays
and never loops over tokens.

Dropout's keep test, `_dropout_keep(seed, stream, index, threshold)` (a bool
array: whether the entries at the flat positions `index`, an integer array,
are kept) and the `_philox4x32_10` it calls, are the reference evaluator's own
functions (`symattn.ir.philox.NUMPY_HELPERS`, whose docstring states the
contract every target follows), so that a generated module draws the very
bits the reference draws. A tiled pass computes `index` from the tile's
(batch, row, column) positions in the full shape.
"""

from __future__ import annotations

import numpy as np

from ...ir.philox import NUMPY_HELPERS
from .runtime import Runtime

__all__ = ["HOST", "CALLS", "runtime"]


def _as_float(*arrays):
    """The arrays in their common floating dtype (integers become float64); no copy when already so."""
    arrays = [a if type(a) is np.ndarray else np.asarray(a) for a in arrays]
    dtype = np.result_type(np.float32, *arrays)
    if dtype.kind != "f":
        raise ValueError(f"expected real floating-point arrays, got dtype {dtype}")
    return dtype, [a if a.dtype == dtype else a.astype(dtype) for a in arrays]


def _integers(name, array, low, high):
    """An integer buffer as int64: every entry an integer in low .. high - 1 (ValueError naming it otherwise)."""
    array = np.asarray(array)
    if array.dtype.kind not in "iub":
        if array.dtype.kind != "f" or not np.all(np.isfinite(array)) or np.any(array != np.floor(array)):
            raise ValueError(f"{name}: an integer buffer, got entries that are not integers (dtype {array.dtype})")
    values = array.astype(np.int64)
    if values.size and (values.min() < low or values.max() >= high):
        raise ValueError(f"{name}: every entry must be in {low} .. {high - 1}, got {values.min()} .. {values.max()}")
    return values


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
    """Zeros of `shape` (after the leading batch axes) to which each entry of `values` over its last
    `rank` axes is added at the position the index arrays `at` give it (np.add.at: a position reached
    several times gets the sum). An index array may carry batch axes of its own (positions read from a
    batched buffer): each batch entry then scatters to its own positions."""
    box = values.shape[values.ndim - rank:]
    lead = values.shape[:values.ndim - rank]
    for a in at:
        lead = np.broadcast_shapes(lead, np.shape(a)[:max(0, np.ndim(a) - rank)])
    out = np.zeros(lead + tuple(shape), dtype=values.dtype)
    values = np.broadcast_to(values, lead + box)
    batch = [np.arange(n).reshape((n,) + (1,) * (len(lead) - k - 1 + rank)) for k, n in enumerate(lead)]
    np.add.at(out, (*batch, *(np.broadcast_to(a, lead + box) for a in at)), values)
    return out


def _gather(x, at, rank):
    """x[..., at[0], at[1], ...] where the index arrays' last `rank` axes are the entry's labels and any axes
    before them batch axes (positions read from a batched buffer): each batch entry reads with its own."""
    lead = x.shape[:x.ndim - len(at)]
    for a in at:
        lead = np.broadcast_shapes(lead, np.shape(a)[:max(0, np.ndim(a) - rank)])
    x = np.broadcast_to(x, lead + x.shape[x.ndim - len(at):])
    batch = [np.arange(n).reshape((n,) + (1,) * (len(lead) - k - 1 + rank)) for k, n in enumerate(lead)]
    return x[(*batch, *at)]


_dropout_keep = NUMPY_HELPERS["_dropout_keep"]  # (the mask helpers below call it)


def _seed(seed):
    """The seed dropout's masks are drawn from, an integer in [0, 2**64), or a ValueError."""
    if isinstance(seed, (bool, np.bool_)) or not isinstance(seed, (int, np.integer)) or not 0 <= seed < 2 ** 64:
        raise ValueError(f"seed must be an integer in [0, 2**64), got {seed!r}")
    return int(seed)


def _dropout_mask(seed, stream, like, threshold):
    """Dropout's 0/1 mask for the array `like`, in its shape and dtype: entry n (flat, row-major) is 1 iff
    `_dropout_keep` keeps position n."""
    positions = np.arange(np.size(like), dtype=np.int64).reshape(np.shape(like))
    return _dropout_keep(seed, stream, positions, threshold).astype(np.result_type(like))


def _dropout_keep_outer(seed, stream, rows, cols, threshold):
    """`_dropout_keep` at the positions rows + cols, rows over the leading axes ([..., 1]) and cols over the last
    one ([1, keys] or a number), computed a few rows at a time: no int64 array of the whole block is made."""
    rows, cols = np.asarray(rows), np.asarray(cols)
    shape = np.broadcast_shapes(rows.shape, cols.shape)
    keep = np.empty(shape, dtype=bool)
    if keep.size == 0:
        return keep
    if not shape:
        keep[()] = _dropout_keep(seed, stream, rows + cols, threshold)
        return keep
    width = shape[-1]
    starts = np.broadcast_to(rows, shape)[..., :1].reshape(-1, 1)  # (small: one per row)
    offsets = np.broadcast_to(cols, shape)[(0,) * (len(shape) - 1)].reshape(1, -1)
    out = keep.reshape(-1, width)
    step = max(1, (1 << 16) // width)
    for r in range(0, starts.shape[0], step):
        out[r:r + step] = _dropout_keep(seed, stream, starts[r:r + step] + offsets, threshold)
    return keep


def _dropout_base(size, seed, *sources):
    """(offset, seed) per batch entry for a dropout mask a fused core draws: the offset is where the entry's
    positions start, its number over the batch axes of the `sources` ((array, spec rank) pairs: the core's q,
    k and score reads) times `size`; the seed's 64 bits as an int64. An int64 array of those axes and [2]."""
    batch = np.broadcast_shapes(*(np.shape(x)[:np.ndim(x) - rank] for x, rank in sources))
    out = np.empty(batch + (2,), dtype=np.int64)
    out[..., 0] = np.arange(int(np.prod(batch)), dtype=np.int64).reshape(batch) * int(size)
    out[..., 1] = int(seed) - 2 ** 64 if int(seed) >= 2 ** 63 else int(seed)
    return out


HOST = (  # in module order
    "_as_float", "_integers", "_bind", "_batch_axes", "_take", "_size", "_exact", "_upstream", "_one_batch", "_sum_to",
    "_softmax_", "_softmax", "_softmax_backward_", "_softmax_backward", "_rowdot", "_logsumexp", "_reverse_cumsum",
    "_sigmoid", "_merge_heads", "_split_heads", "_concat", "_expand", "_sinusoidal", "_causal_mask", "_scatter",
    "_gather", "_Score", "_key_blocks", "_philox4x32_10", "_dropout_keep", "_seed", "_dropout_mask", "_dropout_keep_outer", "_dropout_base",
)
CALLS = {"_upstream": ("_bind",), "_softmax": ("_softmax_",), "_dropout_keep": ("_philox4x32_10",),
         "_dropout_mask": ("_dropout_keep",), "_dropout_keep_outer": ("_dropout_keep",)}


def runtime(extra: dict | None = None, helpers: tuple[str, ...] = (), calls: dict | None = None) -> Runtime:
    """The host helpers, with a target's own (`extra`: name -> function, listed in `helpers`, calling `calls`)."""
    return Runtime({**globals(), **NUMPY_HELPERS, **(extra or {})}, HOST + tuple(helpers), {**CALLS, **(calls or {})})
