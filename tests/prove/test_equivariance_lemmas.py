"""The equivariance lemmas are checked, not trusted.

Every lemma that `symattn.prove.equivariance` names in a proof step (`LEMMAS`) has a
check here: an exact, element-level verification with SymPy matrices of
symbols at n = 2 and n = 3, for every permutation of n (and every pair of
permutations where a lemma has two). A lemma added to `LEMMAS` without a check
makes `test_every_lemma_has_a_check` fail.

Convention: the permutation matrix of `perm` is Pi[i, perm[i]] = 1, so
(Pi A)[i] = A[perm[i]] = numpy.take(A, perm, axis=0) -- the convention the
witness and the counterexample search use (checked by the `leaf` lemma).
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import sympy

from conftest import EXAMPLES
from symattn import load
from symattn.prove.equivariance import LEMMAS, prove_symmetry
from symattn.prove.symmetry_evidence import _permuted

SIZES = (2, 3)


# --- helpers ---------------------------------------------------------------------------


def perms(n: int):
    return list(itertools.permutations(range(n)))


def pmat(perm) -> sympy.Matrix:
    """Pi with Pi[i, perm[i]] = 1."""
    n = len(perm)
    return sympy.Matrix(n, n, lambda i, j: 1 if perm[i] == j else 0)


def mat(name: str, rows: int, cols: int) -> sympy.Matrix:
    return sympy.Matrix(rows, cols, lambda i, j: sympy.Symbol(f"{name}_{i}{j}", real=True))


def arr(name: str, *shape: int) -> np.ndarray:
    out = np.empty(shape, dtype=object)
    for index in np.ndindex(*shape):
        out[index] = sympy.Symbol(f"{name}_{''.join(map(str, index))}", real=True)
    return out


def is_zero(expr) -> bool:
    """Exact zero test: structural first (sums are canonically ordered), then simplify."""
    expr = sympy.sympify(expr)
    if expr == 0:
        return True
    if sympy.expand(expr) == 0:
        return True
    return sympy.simplify(expr) == 0


def same(a, b) -> bool:
    """Exact entrywise equality of two matrices / object arrays of the same shape."""
    a = np.asarray(a.tolist() if isinstance(a, sympy.MatrixBase) else a, dtype=object)
    b = np.asarray(b.tolist() if isinstance(b, sympy.MatrixBase) else b, dtype=object)
    if a.shape != b.shape:
        return False
    return all(x == y or is_zero(x - y) for x, y in zip(a.flat, b.flat))


def emap(f, m: sympy.Matrix) -> sympy.Matrix:
    return m.applyfunc(f)


def row_softmax(s: sympy.Matrix) -> sympy.Matrix:
    e = s.applyfunc(sympy.exp)
    return sympy.Matrix(s.rows, s.cols, lambda i, j: e[i, j] / sum(e[i, k] for k in range(s.cols)))


def col_softmax(s: sympy.Matrix) -> sympy.Matrix:
    return row_softmax(s.T).T


def broadcast(op, a: sympy.Matrix, b: sympy.Matrix) -> sympy.Matrix:
    """a op b with NumPy broadcasting of a [1, m] row or [n, 1] column b."""
    return sympy.Matrix(a.rows, a.cols,
                        lambda i, j: op(a[i, j], b[0 if b.rows == 1 else i, 0 if b.cols == 1 else j]))


def merge_heads(z: np.ndarray) -> np.ndarray:
    h, n, k = z.shape
    return z.transpose(1, 0, 2).reshape(n, h * k)


def split_heads(x: np.ndarray, h: int) -> np.ndarray:
    n, hk = x.shape
    return x.reshape(n, h, hk // h).transpose(1, 0, 2)


# --- one check per lemma -----------------------------------------------------------------


def check_leaf(n: int) -> None:
    """Pi A (matrix product) is numpy.take(A, perm, axis=0), and A Pi^T is take along axis 1:
    the permutation the proofs reason about is the one the witness and the counterexamples apply."""
    a = mat("a", n, n)
    for p in perms(n):
        pi = pmat(p)
        assert same(pi * a, _permuted(np.array(a.tolist(), dtype=object), list(p), [0]))
        assert same(a * pi.T, _permuted(np.array(a.tolist(), dtype=object), list(p), [1]))
        assert same(pi * a * pi.T, _permuted(np.array(a.tolist(), dtype=object), list(p), [0, 1]))


def check_group(n: int) -> None:
    """A group moves every axis of size n of each tensor by the same Pi: X [n, 2] becomes Pi X, a table
    B [2, n] becomes B Pi^T, a mask M [n, n] becomes Pi M Pi^T, and whatever combines them elementwise
    follows: (Pi X) * c' = Pi (X * c) for a column c [n, 1] of the group, and Pi M Pi^T + Pi X X^T Pi^T
    = Pi (M + X X^T) Pi^T."""
    x, b, m, col = mat("x", n, 2), mat("b", 2, n), mat("m", n, n), mat("c", n, 1)
    for p in perms(n):
        pi = pmat(p)
        moved = {name: _permuted(np.array(v.tolist(), dtype=object), list(p), axis)
                 for name, v, axis in (("x", x, [0]), ("b", b, [1]), ("m", m, [0, 1]), ("c", col, [0]))}
        assert same(pi * x, moved["x"]) and same(b * pi.T, moved["b"]) and same(pi * m * pi.T, moved["m"])
        assert same(broadcast(lambda u, v: u * v, sympy.Matrix(moved["x"]), sympy.Matrix(moved["c"])),
                    pi * broadcast(lambda u, v: u * v, x, col))
        px = sympy.Matrix(moved["x"])
        assert same(sympy.Matrix(moved["m"]) + px * px.T, pi * (m + x * x.T) * pi.T)


def check_matmul(n: int) -> None:
    a_rows, b = mat("a", n, 2), mat("b", 2, 3)
    a_cols, b_rows = mat("c", 2, n), mat("d", n, 2)
    eye = sympy.eye(n)
    # batched: the batch axis permuted in both operands permutes the batch axis of the product
    za, zb = arr("z", n, 2, 2), arr("w", n, 2, 2)

    def bmm(x, y):
        return np.array([(sympy.Matrix(x[k]) * sympy.Matrix(y[k])).tolist() for k in range(x.shape[0])],
                        dtype=object)

    for p in perms(n):
        pi = pmat(p)
        assert same((pi * a_rows) * b, pi * (a_rows * b))                 # (Pi A) @ B = Pi (A @ B)
        assert same(a_cols.T * (b_rows.T * pi.T), (a_cols.T * b_rows.T) * pi.T)  # A @ (B Pi^T) = (A @ B) Pi^T
        assert same((a_cols * pi.T) * (pi * b_rows), a_cols * b_rows)    # (A Pi^T) @ (Pi B) = A @ B
        assert pi.T * pi == eye                                          # Pi^T Pi = I
        # vectors (numpy.matmul promotes them): (u Pi^T) @ (Pi v) = u @ v, (Pi A) @ w = Pi (A @ w)
        u, v = mat("u", 1, n), mat("v", n, 1)
        assert same((u * pi.T) * (pi * v), u * v)
        assert same(bmm(np.take(za, p, axis=0), np.take(zb, p, axis=0)), np.take(bmm(za, zb), p, axis=0))


def check_transpose(n: int) -> None:
    a = mat("a", n, n)
    for p, q in itertools.product(perms(n), perms(n)):
        pi, sigma = pmat(p), pmat(q)
        assert same((pi * a * sigma.T).T, sigma * a.T * pi.T)


def check_elementwise(n: int) -> None:
    a, b = mat("a", n, 3), mat("b", n, 3)
    row, col = mat("r", 1, 3), mat("c", n, 1)
    square = mat("s", n, n)
    for p in perms(n):
        pi = pmat(p)
        for f in (sympy.exp, sympy.tanh, lambda x: sympy.Max(0, x), sympy.Abs):
            assert same(emap(f, pi * a), pi * emap(f, a))
            assert same(emap(f, pi * square * pi.T), pi * emap(f, square) * pi.T)
        assert same(pi * a + pi * b, pi * (a + b))
        assert same((pi * a).multiply_elementwise(pi * b), pi * a.multiply_elementwise(b))
        # broadcasting: an unpermuted row vector, and a column vector permuted like A
        assert same(broadcast(sympy.Add, pi * a, row), pi * broadcast(sympy.Add, a, row))
        assert same(broadcast(sympy.Mul, pi * a, row), pi * broadcast(sympy.Mul, a, row))
        assert same(broadcast(sympy.Mul, pi * a, pi * col), pi * broadcast(sympy.Mul, a, col))
        # ... and a row vector permuted like the columns of a square matrix
        r = mat("q", 1, n)
        assert same(broadcast(sympy.Add, square * pi.T, r * pi.T), broadcast(sympy.Add, square, r) * pi.T)


def check_softmax(n: int) -> None:
    s = mat("s", n, n)
    for p, q in itertools.product(perms(n), perms(n)):
        pi, sigma = pmat(p), pmat(q)
        moved = pi * s * sigma.T
        assert same(row_softmax(moved), pi * row_softmax(s) * sigma.T)
        assert same(col_softmax(moved), pi * col_softmax(s) * sigma.T)


def check_reduce(n: int) -> None:
    a = mat("a", 2, n)
    square = mat("s", n, n)

    def rsum(m):    # sum(m, axis=-1), keeping the axis
        return sympy.Matrix(m.rows, 1, lambda i, _: sum(m[i, k] for k in range(m.cols)))

    def rmean(m):
        return rsum(m) / m.cols

    def rlse(m):
        return sympy.Matrix(m.rows, 1, lambda i, _: sympy.log(sum(sympy.exp(m[i, k]) for k in range(m.cols))))

    for p in perms(n):
        pi = pmat(p)
        for reduce in (rsum, rmean, rlse):
            assert same(reduce(a * pi.T), reduce(a))               # over the permuted axis: unchanged
            assert same(reduce(pi * square * pi.T), pi * reduce(square))  # the other axis keeps its Pi
        col_sum = sympy.Matrix(1, 2, lambda _, j: sum((pi * a.T)[k, j] for k in range(n)))
        assert same(col_sum, sympy.Matrix(1, 2, lambda _, j: sum(a.T[k, j] for k in range(n))))


def check_scan(n: int) -> None:
    """cumsum (forward and reverse) along an axis that is not permuted commutes with permuting
    another axis; along the permuted axis it does not (why the lemma names the axis)."""

    def cumsum(m: sympy.Matrix, axis: int, reverse: bool = False) -> sympy.Matrix:
        def entry(i, j):
            if axis == 1:
                cols = range(j, m.cols) if reverse else range(j + 1)
                return sum(m[i, k] for k in cols)
            rows = range(i, m.rows) if reverse else range(i + 1)
            return sum(m[k, j] for k in rows)
        return sympy.Matrix(m.rows, m.cols, entry)

    a = mat("a", n, 3)
    for p in perms(n):
        pi = pmat(p)
        for reverse in (False, True):
            assert same(cumsum(pi * a, 1, reverse), pi * cumsum(a, 1, reverse))        # rows permuted, scan columns
            assert same(cumsum(a.T * pi.T, 0, reverse), cumsum(a.T, 0, reverse) * pi.T)  # columns permuted, scan rows
            if list(p) != list(range(n)):                                                # along the permuted axis: no
                assert not same(cumsum(pi * a, 0, reverse), pi * cumsum(a, 0, reverse))


def check_heads(n: int) -> None:
    h, k = 2, 2
    z = arr("z", h, n, k)
    x = arr("x", n, h * k)
    for p in perms(n):
        assert same(merge_heads(np.take(z, p, axis=1)), np.take(merge_heads(z), p, axis=0))
        assert same(split_heads(np.take(x, p, axis=0), h), np.take(split_heads(x, h), p, axis=1))
        assert same(split_heads(merge_heads(z), h), z)


def check_concat(n: int) -> None:
    a, b = mat("a", n, 2), mat("b", n, 3)
    c, d = mat("c", 2, n), mat("d", 1, n)
    for p in perms(n):
        pi = pmat(p)
        assert same((pi * a).row_join(pi * b), pi * a.row_join(b))       # concat(.., axis=-1), rows permuted
        assert same((c * pi.T).col_join(d * pi.T), c.col_join(d) * pi.T)  # concat(.., axis=0), columns permuted


def check_blocks(n: int) -> None:
    """concat(Pi A, B) = diag(Pi, I) concat(A, B) along the joined axis; equal diag(Pi, I) cancel in a
    contraction, commute with a row softmax; a slice of whole blocks is permuted as those blocks."""
    a, b = mat("a", n, 2), mat("b", 1, 2)       # K_cache [n, 2] and a new row [1, 2]
    v, w = mat("v", n, 2), mat("w", 1, 2)
    q = mat("q", 1, 2)
    for p in perms(n):
        pi = pmat(p)
        block = sympy.diag(pi, sympy.eye(1))
        assert same((pi * a).col_join(b), block * a.col_join(b))
        assert same((pi * a).col_join(pi * a), sympy.diag(pi, pi) * a.col_join(a))
        k, vv = a.col_join(b), v.col_join(w)
        moved_k, moved_v = (pi * a).col_join(b), (pi * v).col_join(w)
        assert same(row_softmax(q * moved_k.T) * moved_v, row_softmax(q * k.T) * vv)
        assert same(row_softmax(q * moved_k.T), row_softmax(q * k.T) * block.T)
        assert same((block * k)[0:n, :], pi * k[0:n, :])       # the whole first block
        assert same((block * k)[n:n + 1, :], k[n:n + 1, :])   # the new row, unmoved


def check_slice(n: int) -> None:
    a = mat("a", n, 3)
    for p in perms(n):
        pi = pmat(p)
        assert same((pi * a)[:, 0:2], pi * a[:, 0:2])      # slicing the columns of row-permuted A
        assert same((a.T * pi.T)[0:2, :], a.T[0:2, :] * pi.T)  # slicing the rows of column-permuted A.T


def check_constant(n: int) -> None:
    ones = sympy.ones(n, 3)
    square = sympy.ones(n, n)
    eye = sympy.eye(n)
    for p in perms(n):
        pi = pmat(p)
        assert pi * ones == ones and square * pi.T == square and pi * square * pi.T == square
        assert pi * eye * pi.T == eye


def _entrywise(n: int, formula, *shape_dims) -> sympy.Matrix:
    return sympy.Matrix(n, n, lambda i, j: formula(i, j))


def check_index(n: int) -> None:
    d = 2
    x = mat("x", n, d)
    w1, w2, w = mat("u", d, 2), mat("v", d, 2), mat("w", 1, 2)

    def gram(xm):       # S[i, j] = sum(k, X[i, k] * X[j, k]), built entry by entry
        return _entrywise(n, lambda i, j: sum(xm[i, k] * xm[j, k] for k in range(d)))

    def additive(xm):   # S[i, j] = sum(c, w[c] * tanh(sum(k, X[i,k] W1[k,c]) + sum(k, X[j,k] W2[k,c])))
        return _entrywise(n, lambda i, j: sum(
            w[0, c] * sympy.tanh(sum(xm[i, k] * w1[k, c] for k in range(d)) + sum(xm[j, k] * w2[k, c] for k in range(d)))
            for c in range(2)))

    for p in perms(n):
        pi = pmat(p)
        for build in (gram, additive):
            assert same(build(pi * x), pi * build(x) * pi.T)


def check_index_counter(n: int) -> None:
    """The counter-lemma: an entry formula that uses the index values does not commute with
    relabeling -- for some permutation, and at n = 2 and 3 for every non-identity one."""
    mask = _entrywise(n, lambda i, j: 0 if j <= i else -sympy.oo)        # where(j <= i, 0, -inf)
    s = mat("s", n, n)
    broken = []
    for p in perms(n):
        pi = pmat(p)
        # Pi M Pi^T by relabeling (a matrix product would meet 0 * -oo = nan)
        moved_mask = sympy.Matrix(n, n, lambda i, j: mask[p[i], p[j]])
        if list(p) == list(range(n)):
            assert moved_mask == mask
            continue
        assert moved_mask != mask
        # and the consequence: softmax(Pi S Pi^T + M) != Pi softmax(S + M) Pi^T
        left = row_softmax(pi * s * pi.T + mask)
        right = pi * row_softmax(s + mask) * pi.T
        broken.append(not same(left, right))
    assert broken and all(broken)


CHECKS = {
    "leaf": check_leaf,
    "group": check_group,
    "matmul": check_matmul,
    "transpose": check_transpose,
    "elementwise": check_elementwise,
    "softmax": check_softmax,
    "reduce": check_reduce,
    "scan": check_scan,
    "heads": check_heads,
    "concat": check_concat,
    "blocks": check_blocks,
    "slice": check_slice,
    "constant": check_constant,
    "index": check_index,
}


def test_every_lemma_has_a_check():
    missing = sorted(set(LEMMAS) - set(CHECKS))
    assert not missing, f"lemmas with no element-level check in tests/prove/test_equivariance_lemmas.py: {missing}"
    stale = sorted(set(CHECKS) - set(LEMMAS))
    assert not stale, f"checks for lemmas that no longer exist: {stale}"


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("lemma", sorted(LEMMAS))
def test_lemma(lemma, n):
    assert lemma in CHECKS, f"no check for lemma {lemma!r}: {LEMMAS[lemma].statement}"
    CHECKS[lemma](n)


@pytest.mark.parametrize("n", SIZES)
def test_index_values_do_not_commute(n):
    check_index_counter(n)


def test_alibi_distance_needs_n_3():
    """-abs(i - j) is symmetric under the one swap at n = 2, but not under every permutation at n = 3:
    why a single small size is not enough, and why the witness uses N >= 3 generators."""
    for n, expect_all in ((2, True), (3, False)):
        bias = _entrywise(n, lambda i, j: -abs(i - j))
        kept = [pmat(p) * bias * pmat(p).T == bias for p in perms(n)]
        assert all(kept) is expect_all


def test_every_step_names_a_known_lemma():
    """Each step of the proofs of the example specs rests on a lemma in LEMMAS (or concludes / stops)."""
    seen = set()
    for path in EXAMPLES:
        spec = load(path).typed
        for check in spec.checks:
            if check.kind not in ("equivariant", "invariant"):  # equalities and relative(B) are not symmetries
                continue
            proof = prove_symmetry(spec, check.output, check.sources, check.dim, check.kind == "invariant")
            for step in proof.steps:
                assert step.lemma in LEMMAS or step.lemma in ("conclusion", "none"), step
                seen.add(step.lemma)
    assert {"leaf", "matmul", "softmax", "index", "conclusion", "none"} <= seen


def test_the_checks_can_fail():
    """The comparisons are not vacuous: the wrong side of each key lemma is told apart."""
    n = 3
    pi, sigma = pmat((1, 0, 2)), pmat((1, 2, 0))
    s, a, b = mat("s", n, n), mat("a", 2, n), mat("b", n, 2)
    assert not same(row_softmax(pi * s * sigma.T), sigma * row_softmax(s) * pi.T)
    assert not same((a * pi.T) * (sigma * b), a * b)                       # two different permutations
    assert not same((pi * s).T, pi * s.T)
    rsum = sympy.Matrix(n, 1, lambda i, _: sum((pi * s)[i, k] for k in range(n)))
    assert not same(rsum, sympy.Matrix(n, 1, lambda i, _: sum(s[i, k] for k in range(n))))  # not summed over Pi
    z = arr("z", 2, n, 2)
    assert not same(merge_heads(np.take(z, [1, 0], axis=0)), merge_heads(z))  # permuting heads mixes columns
    assert not same(np.take(merge_heads(z), [1, 0, 2], axis=1), merge_heads(np.take(z, [1, 0, 2], axis=1)))
