"""symattn.ir.philox: Philox-4x32-10 against Random123's known answers and a scalar rewrite, dropout's threshold.

The known answers are the three `philox4x32 10` lines of Random123's
tests/kat_vectors (github.com/DEShawResearch/random123 at 9545ff64). The
independent computation is a scalar Philox in Python integers written from
Random123's philox.h in its own order (the key bumped before rounds 2..R),
which the vectorised NumPy one (bumped after every round) must match on
counters with every word used (index high words, streams, seeds above
2**32). The generated NumPy helper is checked from its source text alone,
executed in a namespace holding nothing but NumPy.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest

from symattn.codegen.numpy.runtime import RUNTIME
from symattn.errors import UsageError
from symattn.ir.philox import dropout_threshold, keep_at, keep_mask, philox4x32_10

# counter (4 words), key (2 words), output (4 words): Random123 tests/kat_vectors
KAT = [
    ((0x00000000, 0x00000000, 0x00000000, 0x00000000), (0x00000000, 0x00000000),
     (0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8)),
    ((0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff), (0xffffffff, 0xffffffff),
     (0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd)),
    ((0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344), (0xa4093822, 0x299f31d0),
     (0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1)),
]

MASK = 0xFFFFFFFF


def scalar_philox(counter, key, rounds=10):
    """Random123's philox4x32_R on Python ints: round, then (bump key, round) R - 1 times."""
    def one_round(c, k):
        p0 = 0xD2511F53 * c[0]
        p1 = 0xCD9E8D57 * c[2]
        return ((p1 >> 32) ^ c[1] ^ k[0], p1 & MASK, (p0 >> 32) ^ c[3] ^ k[1], p0 & MASK)

    c, k = tuple(counter), tuple(key)
    c = one_round(c, k)
    for _ in range(rounds - 1):
        k = ((k[0] + 0x9E3779B9) & MASK, (k[1] + 0xBB67AE85) & MASK)
        c = one_round(c, k)
    return c


def scalar_keep(seed, stream, index, threshold):
    word = scalar_philox((index & MASK, index >> 32, stream, 0), (seed & MASK, seed >> 32))[0]
    return word >= threshold


@pytest.mark.parametrize("counter, key, expected", KAT)
def test_known_answers_of_random123(counter, key, expected):
    got = philox4x32_10(tuple(np.array([c], dtype=np.uint32) for c in counter), key)
    assert [int(w[0]) for w in got] == list(expected)
    assert all(w.dtype == np.uint32 for w in got)
    assert scalar_philox(counter, key) == expected  # the scalar rewrite the other tests lean on


def test_vectorised_philox_matches_the_scalar_one_on_random_counters():
    rng = np.random.default_rng(0)
    counter = tuple(rng.integers(0, 2 ** 32, size=300, dtype=np.uint64) for _ in range(4))
    key = (0x9E3779B9, 0xFFFFFFFF)
    got = np.stack(philox4x32_10(counter, key), axis=1)
    want = [scalar_philox([int(c[n]) for c in counter], key) for n in range(300)]
    assert got.tolist() == [list(w) for w in want]


SEEDS = [0, 1, 2 ** 32 - 1, 2 ** 32, 0x0123456789ABCDEF, 2 ** 64 - 1]
INDICES = [0, 1, 2, 4095, 2 ** 31, 2 ** 32 - 1, 2 ** 32, 2 ** 32 + 5, 3 << 40, 2 ** 63 - 1]


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("threshold", [0, 1, 2 ** 31, dropout_threshold(0.1), 2 ** 32 - 1])
def test_keep_at_is_the_contract_on_every_word_of_the_counter(seed, threshold):
    for stream in (0, 1, 2 ** 32 - 1):
        got = keep_at(seed, stream, np.array(INDICES, dtype=np.int64), threshold)
        assert got.tolist() == [scalar_keep(seed, stream, n, threshold) for n in INDICES]


def test_threshold_zero_keeps_all_and_the_largest_keeps_only_an_all_ones_word():
    assert keep_mask(7, 0, (3, 40, 50), 0).all()
    # 2**32 - 1 keeps an entry iff word 0 is 0xFFFFFFFF: (almost) never among 6000 entries
    word = philox4x32_10((np.arange(6000, dtype=np.uint32), 0, 0, 0), (7, 0))[0]
    assert keep_mask(7, 0, (6000,), 2 ** 32 - 1).tolist() == (word == MASK).tolist()


def test_keep_mask_is_keep_at_of_flat_row_major_positions_in_the_full_shape():
    shape = (2, 3, 17, 19)
    mask = keep_mask(99, 4, shape, dropout_threshold(0.3))
    b, h, i, j = np.indices(shape)
    flat = ((b * 3 + h) * 17 + i) * 19 + j
    assert mask.shape == shape and (mask == keep_at(99, 4, flat, dropout_threshold(0.3))).all()
    # a tile of the last (batch, head) computes its positions from (batch, head, i, j) alone
    rows, cols = np.arange(5, 12)[:, None], np.arange(8, 19)[None, :]
    tile = keep_at(99, 4, ((1 * 3 + 2) * 17 + rows) * 19 + cols, dropout_threshold(0.3))
    assert (tile == mask[1, 2, 5:12, 8:19]).all()


def test_drop_fraction_is_p_within_five_sigma_and_streams_are_independent():
    p, n = 0.1, 10 ** 6
    threshold = dropout_threshold(p)
    first, second = (keep_mask(2024, stream, (1000, 1000), threshold) for stream in (0, 1))
    sigma = math.sqrt(p * (1 - p) / n)
    for mask in (first, second):
        assert abs((1 - mask.mean()) - p) < 5 * sigma
    # independent masks agree where both keep or both drop: (1-p)^2 + p^2 of the time
    agree = (first == second).mean()
    expected = (1 - p) ** 2 + p ** 2
    assert abs(agree - expected) < 5 * math.sqrt(expected * (1 - expected) / n)
    other_seed = keep_mask(2025, 0, (1000, 1000), threshold)
    assert abs((first == other_seed).mean() - expected) < 5 * math.sqrt(expected * (1 - expected) / n)


def _exact_threshold(p: float) -> int:
    numerator, denominator = p.as_integer_ratio()
    return min(numerator * 2 ** 32 // denominator, 2 ** 32 - 1)


EDGES = [0.0, 0.5, 0.1, 0.25, 1 / 3, 1 - 2 ** -53, 1 - 2 ** -32, 1 - 2 ** -33, 2 ** -32, 2 ** -33, 5e-324,
         math.nextafter(0.5, 0), math.nextafter(0.25, 0), math.nextafter(2 ** -32, 0),
         math.nextafter(3 * 2 ** -32, 0), math.nextafter(1 - 2 ** -32, 0), 0.9999999999]


@pytest.mark.parametrize("p", EDGES, ids=[repr(p) for p in EDGES])
def test_dropout_threshold_is_exact(p):
    assert dropout_threshold(p) == _exact_threshold(p)
    assert dropout_threshold(p) == min(math.floor(Fraction(p) * 2 ** 32), 2 ** 32 - 1)


def test_dropout_threshold_at_named_points():
    assert dropout_threshold(0.0) == 0
    assert dropout_threshold(0.5) == 2 ** 31
    assert dropout_threshold(1 - 2 ** -53) == 2 ** 32 - 1
    assert dropout_threshold(math.nextafter(0.5, 0)) == 2 ** 31 - 1  # p * 2**32 just below 2**31
    assert dropout_threshold(0.1) == 429496729  # 0.1 * 2**32 = 429496729.6000000015...
    assert dropout_threshold(np.float32(0.5)) == 2 ** 31
    assert dropout_threshold(Fraction(1, 3)) == 1431655765


@pytest.mark.parametrize("p", [1.0, -0.0 - 1e-300, 1.5, -1, float("nan"), float("inf"), True, "0.1", None])
def test_dropout_threshold_rejects_p_outside_zero_one(p):
    with pytest.raises(UsageError, match=r"p must be"):
        dropout_threshold(p)


@pytest.mark.parametrize("call, match", [
    (lambda: keep_at(-1, 0, [0], 0), r"seed must be an integer in \[0, 2\*\*64\)"),
    (lambda: keep_at(2 ** 64, 0, [0], 0), r"seed must be"),
    (lambda: keep_at(0, 2 ** 32, [0], 0), r"stream must be an integer in \[0, 2\*\*32\)"),
    (lambda: keep_at(0, 0, [0], 2 ** 32), r"threshold must be"),
    (lambda: keep_at(0, 0, [-1], 0), r"non-negative integers"),
    (lambda: keep_at(0, 0, [0.5], 0), r"non-negative integers"),
    (lambda: philox4x32_10((0, 0, 0, 2 ** 32), (0, 0)), r"counter word 3"),
    (lambda: philox4x32_10((0, 0, 0, 0), (0, -1)), r"key word 1"),
    (lambda: philox4x32_10((0, 0, 0), (0, 0)), r"4 counter words"),
])
def test_bad_arguments_name_the_broken_rule(call, match):
    with pytest.raises(UsageError, match=match):
        call()


def test_generated_numpy_helper_runs_from_its_source_alone():
    source = "\n\n\n".join(RUNTIME.helper_source(n) for n in ("_philox4x32_10", "_dropout_keep"))
    assert "symattn" not in source
    namespace = {"np": np, "__builtins__": __builtins__}
    exec(compile(source, "<generated>", "exec"), namespace)
    index = np.array([[0, 2 ** 32 + 1], [3 << 40, 12345]], dtype=np.int64)
    for seed, stream, threshold in [(0, 0, 0), (2 ** 40 + 3, 2, 2 ** 31), (2 ** 64 - 1, 7, 2 ** 32 - 1)]:
        got = namespace["_dropout_keep"](seed, stream, index, threshold)
        assert got.dtype == bool and got.shape == (2, 2)
        assert got.tolist() == [[scalar_keep(seed, stream, int(n), threshold) for n in row] for row in index]
    with pytest.raises(ValueError, match="seed"):
        namespace["_dropout_keep"](2 ** 64, 0, index, 0)

