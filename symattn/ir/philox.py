"""Philox-4x32-10, the counter-based generator of `dropout`'s masks, in NumPy: the reference every target matches.

Contract (the same on the four targets: this module, the NumPy and torch
helpers of `symattn.codegen.arrays`, the Triton device function of
`symattn.codegen.triton.runtime` and `runtime/philox.h` for CUDA):

- Philox-4x32-10 exactly as Random123 defines it: 10 rounds, each
  (hi0, lo0) = 0xD2511F53 * c0, (hi1, lo1) = 0xCD9E8D57 * c2 (32 x 32 -> 64
  bit products) and c = (hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0), the key
  bumped by the Weyl constants (k0 += 0x9E3779B9, k1 += 0xBB67AE85, mod
  2**32) between rounds (bumping after the tenth too changes nothing).
- key = (seed & 0xFFFFFFFF, (seed >> 32) & 0xFFFFFFFF) for a seed in [0, 2**64).
- counter = (index & 0xFFFFFFFF, (index >> 32) & 0xFFFFFFFF, stream, 0):
  `index` is the entry's flat row-major position in the tensor's full shape,
  leading batch axes included (a tiled kernel computes it from (batch, i, j)
  and gets what the whole-array version gets); `stream` (a uint32) names the
  `dropout` definition (0, 1, 2, ... in spec order), so that two definitions
  draw independent masks.
- An entry is kept iff output word 0 >= threshold, threshold =
  `dropout_threshold(p)` = min(floor(p * 2**32), 2**32 - 1), computed
  exactly; generated code is handed this integer, never p, so every target
  compares the same integers.

`philox4x32_10(counter, key)` is the generator on arrays of counters;
`keep_mask(seed, stream, shape, threshold)` is the keep mask (a bool array)
of a whole tensor, `keep_at(seed, stream, index, threshold)` the keep test at
given flat positions. `NUMPY_HELPERS` holds the two functions they run
(`_philox4x32_10`, `_dropout_keep`), written with NumPy alone and no name of
this module, so that generated NumPy modules copy their source text
(`symattn.codegen.arrays.numpy_runtime` lists them): the reference evaluator
and the generated code run the very same text. They work on blocks of 2**16
entries, whose words stay in cache (a 4096 x 4096 mask takes about a second).
"""

from __future__ import annotations

import math
import numbers
from fractions import Fraction

import numpy as np

from ..errors import UsageError

__all__ = ["philox4x32_10", "dropout_threshold", "keep_mask", "keep_at", "NUMPY_HELPERS"]


def _philox4x32_10(c0, c1, c2, c3, k0, k1):
    """Philox-4x32-10 (Random123) of the counter words c0..c3, uint64 arrays of one shape holding 32-bit
    values (consumed: their buffers hold the result), under the key words k0, k1 (ints below 2**32).
    Returns the four output words, uint64 arrays holding 32-bit values. uint64 throughout: each 32 x 32
    bit product fits, its high word is a shift and its low word a mask."""
    low, shift = np.uint64(0xFFFFFFFF), np.uint64(32)
    p0, p1 = np.empty_like(c0), np.empty_like(c2)
    for _ in range(10):
        np.multiply(c0, np.uint64(0xD2511F53), out=p0)
        np.multiply(c2, np.uint64(0xCD9E8D57), out=p1)
        np.right_shift(p1, shift, out=c0)  # c0 = hi1 ^ c1 ^ k0, read before c1 is overwritten
        c0 ^= c1
        c0 ^= np.uint64(k0)
        np.bitwise_and(p1, low, out=c1)
        np.right_shift(p0, shift, out=c2)  # c2 = hi0 ^ c3 ^ k1
        c2 ^= c3
        c2 ^= np.uint64(k1)
        np.bitwise_and(p0, low, out=c3)
        k0 = (k0 + 0x9E3779B9) & 0xFFFFFFFF
        k1 = (k1 + 0xBB67AE85) & 0xFFFFFFFF
    return c0, c1, c2, c3


def _dropout_keep(seed, stream, index, threshold):
    """Whether dropout keeps the entries at the flat positions `index` (an integer array, any shape; taken
    mod 2**64): word 0 of Philox-4x32-10 at counter (index low word, index high word, stream, 0) under key
    (seed low word, seed high word) is at least `threshold`. A bool array of index's shape; ValueError
    for a seed, stream or threshold out of range."""
    seed, stream, threshold = int(seed), int(stream), int(threshold)
    if not (0 <= seed < 2 ** 64 and 0 <= stream < 2 ** 32 and 0 <= threshold < 2 ** 32):
        raise ValueError(f"dropout: seed {seed} must be in [0, 2**64), stream {stream} and threshold "
                         f"{threshold} in [0, 2**32)")
    index = np.asarray(index)
    if index.dtype.kind not in "iu":
        raise ValueError(f"dropout: positions must be integers, got dtype {index.dtype}")
    flat = index.reshape(-1)
    keep = np.empty(flat.shape, dtype=bool)
    block = 1 << 16
    for start in range(0, flat.size, block):
        position = flat[start:start + block].astype(np.uint64)
        hi = position >> np.uint64(32)
        position &= np.uint64(0xFFFFFFFF)
        word, _, _, _ = _philox4x32_10(position, hi, np.full_like(position, stream), np.zeros_like(position),
                                       seed & 0xFFFFFFFF, seed >> 32)
        np.greater_equal(word, np.uint64(threshold), out=keep[start:start + block])
    return keep.reshape(index.shape)


NUMPY_HELPERS = {"_philox4x32_10": _philox4x32_10, "_dropout_keep": _dropout_keep}


def _word(value, what: str) -> int:
    if isinstance(value, bool) or int(value) != value or not 0 <= value < 2 ** 32:
        raise UsageError(f"{what} must be an integer in [0, 2**32), got {value!r}")
    return int(value)


def philox4x32_10(counter: tuple, key: tuple[int, int]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Philox-4x32-10 of four counter words (integer arrays or ints in [0, 2**32), broadcast together)
    under the key (k0, k1): the four output words as uint32 arrays."""
    if len(counter) != 4 or len(key) != 2:
        raise UsageError(f"philox4x32_10 takes 4 counter words and 2 key words, got {len(counter)} and {len(key)}")
    words = []
    for k, word in enumerate(np.broadcast_arrays(*(np.asarray(c) for c in counter))):
        if word.dtype.kind not in "iu" or (word.size and (word.min() < 0 or word.max() >= 2 ** 32)):
            raise UsageError(f"counter word {k} must hold integers in [0, 2**32)")
        words.append(word.astype(np.uint64))
    out = _philox4x32_10(*words, _word(key[0], "key word 0"), _word(key[1], "key word 1"))
    return tuple(w.astype(np.uint32) for w in out)


def dropout_threshold(p: float) -> int:
    """The uint32 that dropout's word 0 is compared with: min(floor(p * 2**32), 2**32 - 1), exactly (p as
    the binary fraction it is, no rounding), for p in [0, 1)."""
    if isinstance(p, bool) or not isinstance(p, numbers.Real):
        raise UsageError(f"dropout: p must be a number in [0, 1), got {p!r}")
    try:
        exact = Fraction(p) if isinstance(p, (int, Fraction)) else Fraction(float(p))
    except (TypeError, ValueError, OverflowError):
        raise UsageError(f"dropout: p must be a number in [0, 1), got {p!r}") from None
    if not 0 <= exact < 1:
        raise UsageError(f"dropout: p must be in [0, 1), got {p!r}")
    return min(math.floor(exact * 2 ** 32), 2 ** 32 - 1)


def _check(seed, stream, threshold) -> None:
    if isinstance(seed, bool) or int(seed) != seed or not 0 <= seed < 2 ** 64:
        raise UsageError(f"dropout: the seed must be an integer in [0, 2**64), got {seed!r}")
    _word(stream, "dropout: the stream")
    _word(threshold, "dropout: the threshold")


def keep_at(seed: int, stream: int, index, threshold: int) -> np.ndarray:
    """The keep mask at the flat positions `index` (non-negative integers, any shape): a bool array."""
    _check(seed, stream, threshold)
    index = np.asarray(index)
    if index.dtype.kind not in "iu" or (index.size and index.dtype.kind == "i" and index.min() < 0):
        raise UsageError("dropout: positions must be non-negative integers")
    return _dropout_keep(seed, stream, index, threshold)


def keep_mask(seed: int, stream: int, shape: tuple[int, ...], threshold: int) -> np.ndarray:
    """The keep mask of a whole tensor of `shape` (leading batch axes included): entry at flat row-major
    position n is `keep_at(seed, stream, n, threshold)`."""
    _check(seed, stream, threshold)
    shape = tuple(int(n) for n in shape)
    return _dropout_keep(seed, stream, np.arange(math.prod(shape), dtype=np.int64).reshape(shape), threshold)
