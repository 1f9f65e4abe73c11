"""Hand-written torch versions of the attention variants in derivations/, written from the
.attn files' text alone (nothing from symattn is imported).

Each takes the spec's inputs and params as torch tensors, by name, and returns the output.
`keep`, when given, receives the named intermediates (with `retain_grad`, so that after a
backward pass `keep[name].grad` is grad(name)): tests/prove/test_equality_claims.py re-evaluates the
counterexamples of negated claims with them, tests/symbolic/test_gradients_numeric.py compares
symattn's leaf gradients against torch autograd.
"""

from __future__ import annotations

import math

import torch


def _keep(keep: dict | None, name: str, value: torch.Tensor) -> torch.Tensor:
    if keep is not None:
        if value.requires_grad:
            value.retain_grad()
        keep[name] = value
    return value


def _causal_bias(n: int, dtype, window: int | None = None) -> torch.Tensor:
    """0 where query i sees key j (j <= i, and i - j < window if given), -inf elsewhere."""
    i = torch.arange(n)[:, None]
    j = torch.arange(n)[None, :]
    visible = j <= i if window is None else (j <= i) & (i - j < window)
    zero = torch.zeros(n, n, dtype=dtype)
    return torch.where(visible, zero, torch.full_like(zero, float("-inf")))


def alibi(X, W_q, W_k, W_v, m, keep=None):
    n = X.shape[0]
    d_k = W_q.shape[-1]
    Q, K, V = X @ W_q, X @ W_k, X @ W_v                                  # [h, N, d_k]
    distance = (torch.arange(n)[None, :] - torch.arange(n)[:, None]).to(X.dtype)   # j - i
    scores = Q @ K.transpose(-1, -2) / math.sqrt(d_k) + m * distance + _causal_bias(n, X.dtype)
    P = _keep(keep, "P", torch.softmax(scores, dim=-1))
    return P @ _keep(keep, "V", V)


def causal_linear(X, W_q, W_k, W_v, keep=None):
    Q, K, V = X @ W_q, X @ W_k, X @ W_v
    Fq = _keep(keep, "Fq", torch.relu(Q) + 1)
    Fk = _keep(keep, "Fk", torch.relu(K) + 1)
    KV_step = _keep(keep, "KV_step", Fk[:, :, None] * V[:, None, :])    # [N, d_k, d_k]
    KV = _keep(keep, "KV", torch.cumsum(KV_step, dim=0))
    Z = _keep(keep, "Z", torch.cumsum(Fk, dim=0))
    num = _keep(keep, "num", torch.einsum("ia,iac->ic", Fq, KV))
    den = _keep(keep, "den", (Fq * Z).sum(dim=-1, keepdim=True))
    _keep(keep, "V", V)
    return _keep(keep, "O", num / den)


def cosine(Q, K, V, tau, keep=None):
    Q, K = _keep(keep, "Q", Q), _keep(keep, "K", K)
    Qn = _keep(keep, "Qn", Q / torch.sqrt((Q * Q).sum(dim=-1, keepdim=True)))
    Kn = K / torch.sqrt((K * K).sum(dim=-1, keepdim=True))
    P = _keep(keep, "P", torch.softmax(tau * (Qn @ Kn.T), dim=-1))
    return P @ V


def differential(X, W_q1, W_k1, W_q2, W_k2, W_v, lam, keep=None):
    d_k = W_q1.shape[-1]
    P1 = torch.softmax((X @ W_q1) @ (X @ W_k1).T / math.sqrt(d_k), dim=-1)
    P2 = _keep(keep, "P2", torch.softmax((X @ W_q2) @ (X @ W_k2).T / math.sqrt(d_k), dim=-1))
    D = _keep(keep, "D", P1 - lam * P2)
    return D @ (X @ W_v)


def gqa(X, W_q, W_k, W_v, keep=None):
    d_k = W_q.shape[-1]
    Q = _keep(keep, "Q", X @ W_q)                                        # [g, r, N, d_k]
    K = _keep(keep, "K", X @ W_k)                                        # [g, 1, N, d_k]
    V = X @ W_v
    S = _keep(keep, "S", Q @ K.transpose(-1, -2) / math.sqrt(d_k))       # K broadcast over r
    return torch.softmax(S, dim=-1) @ V


def sigmoid(X, W_q, W_k, W_v, keep=None):
    n = X.shape[0]
    d_k = W_q.shape[-1]
    S = _keep(keep, "S", (X @ W_q) @ (X @ W_k).T / math.sqrt(d_k))
    P = _keep(keep, "P", torch.sigmoid(S - math.log(n)))
    return P @ (X @ W_v)


def sliding_window(X, W_q, W_k, W_v, keep=None):
    n = X.shape[0]
    d_k = W_q.shape[-1]
    window = 2                                                           # dim w = 2
    scores = (X @ W_q) @ (X @ W_k).T / math.sqrt(d_k) + _causal_bias(n, X.dtype, window)
    return torch.softmax(scores, dim=-1) @ (X @ W_v)


def softcap(X, W_q, W_k, W_v, keep=None):
    d_k = W_q.shape[-1]
    S = _keep(keep, "S", (X @ W_q) @ (X @ W_k).T / math.sqrt(d_k))
    R = _keep(keep, "R", 50 * torch.tanh(S / 50))
    return torch.softmax(R, dim=-1) @ (X @ W_v)


def stable_softmax(X, W_q, W_k, W_v, keep=None):
    d_k = W_q.shape[-1]
    S = _keep(keep, "S", (X @ W_q) @ (X @ W_k).T / math.sqrt(d_k))
    top = _keep(keep, "top", torch.amax(S, dim=-1, keepdim=True))       # ties share the gradient
    E = _keep(keep, "E", torch.exp(S - top))
    P = E / E.sum(dim=-1, keepdim=True)
    return P @ (X @ W_v)


def relative_bias(X, W_q, W_k, W_v, b, keep=None):
    n = X.shape[0]
    b = _keep(keep, "b", b)
    B = torch.stack([torch.stack([b[j - i + n - 1] for j in range(n)]) for i in range(n)])   # B[i, j]
    Q, K, V = X @ W_q, X @ W_k, X @ W_v
    S = _keep(keep, "S", Q @ K.T / math.sqrt(Q.shape[-1]) + B)
    return torch.softmax(S, dim=-1) @ V


def _rope_angles(n: int, h: int, dtype) -> torch.Tensor:
    """angle[i, c] = i * 10000^(-c / h)"""
    return torch.arange(n, dtype=dtype)[:, None] * 10000.0 ** (-torch.arange(h, dtype=dtype)[None, :] / h)


def rope_half(X, W_q, W_k, W_v, keep=None):
    h = W_q.shape[-1] // 2
    a = _rope_angles(X.shape[0], h, X.dtype)
    Cos, Sin = _keep(keep, "Cos", a.cos()), _keep(keep, "Sin", a.sin())
    Q, K, V = _keep(keep, "Q", X @ W_q), X @ W_k, X @ W_v
    Q1, Q2, K1, K2 = _keep(keep, "Q1", Q[:, :h]), Q[:, h:], K[:, :h], K[:, h:]
    Qr = _keep(keep, "Qr", torch.cat([Q1 * Cos - Q2 * Sin, Q2 * Cos + Q1 * Sin], dim=-1))
    Kr = torch.cat([K1 * Cos - K2 * Sin, K2 * Cos + K1 * Sin], dim=-1)
    return torch.softmax(Qr @ Kr.T / math.sqrt(2 * h), dim=-1) @ V


def rope_interleaved(X, W_q, W_k, W_v, keep=None):
    h = W_q.shape[-1] // 2
    a = _rope_angles(X.shape[0], h, X.dtype)
    Cos, Sin = _keep(keep, "Cos", a.cos()), _keep(keep, "Sin", a.sin())
    Q, K, V = _keep(keep, "Q", X @ W_q), X @ W_k, X @ W_v

    def rotate(x):                                   # pairs (2c, 2c + 1) rotated by angle[i, c]
        even, odd = x[:, 0::2], x[:, 1::2]
        return torch.stack([even * Cos - odd * Sin, even * Sin + odd * Cos], dim=-1).flatten(1)

    Qr = _keep(keep, "Qr", rotate(Q))
    return torch.softmax(Qr @ rotate(K).T / math.sqrt(2 * h), dim=-1) @ V


def kv_cache_decode(x, W_q, W_k, W_v, K_cache, V_cache, keep=None):
    x, W_v = _keep(keep, "x", x), _keep(keep, "W_v", W_v)
    K = torch.cat([K_cache, x @ W_k], dim=0)                  # the new key as the last row
    V = _keep(keep, "V", torch.cat([V_cache, x @ W_v], dim=0))
    return torch.softmax((x @ W_q) @ K.T / math.sqrt(W_q.shape[-1]), dim=-1) @ V


def _lse(s: torch.Tensor) -> torch.Tensor:
    """The row logsumexp: -inf for a fully masked row (torch.logsumexp's answer too)."""
    return torch.logsumexp(s, dim=-1, keepdim=True)


def _masked_softmax(s: torch.Tensor) -> torch.Tensor:
    """softmax with the language's convention: a fully masked row has weights 0 and gradient 0."""
    empty = torch.isinf(s).all(dim=-1, keepdim=True)
    safe = torch.where(empty, torch.zeros_like(s), s)
    return torch.softmax(safe, dim=-1) * (~empty).to(s.dtype)


def online_softmax(Q, K1, K2, K3, V1, V2, V3, keep=None):
    d = Q.shape[-1]
    S1, S2, S3 = (Q @ k.T / math.sqrt(d) for k in (K1, K2, K3))
    S = _keep(keep, "S", torch.cat([S1, S2, S3], dim=-1))
    V = _keep(keep, "V", torch.cat([V1, V2, V3], dim=0))
    top = torch.amax(S, dim=-1, keepdim=True)
    E = torch.exp(S - top)
    P = _keep(keep, "P", E / E.sum(dim=-1, keepdim=True))
    O = _keep(keep, "O", P @ V)
    with torch.no_grad():   # the blocks' own statistics, read by the claims, not by the output
        values = {"L": _lse(S), "l1": _lse(S1), "l2": _lse(S2), "l3": _lse(S3), "m1": torch.amax(S1, -1, True),
                  "m2": torch.amax(S2, -1, True), "r1": None, "r2": None}
        values["r1"] = torch.exp(S1 - values["m1"]).sum(-1, keepdim=True)
        values["r2"] = torch.exp(S2 - values["m2"]).sum(-1, keepdim=True)
        values["m12"] = torch.maximum(values["m1"], values["m2"])
        for k, (s, v) in enumerate(((S1, V1), (S2, V2), (S3, V3)), start=1):
            values[f"O{k}"] = torch.softmax(s, dim=-1) @ v
        a1, a2 = torch.exp(values["m1"] - values["m12"]), torch.exp(values["m2"] - values["m12"])
        values["r12"] = a1 * values["r1"] + a2 * values["r2"]
        values["A12"] = (a1 * values["r1"] * values["O1"] + a2 * values["r2"] * values["O2"]) / values["r12"]
    for name, value in values.items():
        _keep(keep, name, value)
    return O


def online_softmax_masked(Q, K1, K2, V1, V2, keep1, keep2, keep=None):
    d = Q.shape[-1]
    ninf = torch.tensor(float("-inf"), dtype=Q.dtype)
    S1 = Q @ K1.T / math.sqrt(d) + torch.where(keep1 > 0, torch.zeros_like(keep1), ninf)
    S2 = Q @ K2.T / math.sqrt(d) + torch.where(keep2 > 0, torch.zeros_like(keep2), ninf)
    S = _keep(keep, "S", torch.cat([S1, S2], dim=-1))
    V = torch.cat([V1, V2], dim=0)
    P = _keep(keep, "P", _masked_softmax(S))
    O = _keep(keep, "O", P @ V)
    with torch.no_grad():
        values = {"L": _lse(S), "l1": _lse(S1), "l2": _lse(S2),
                  "O1": _masked_softmax(S1) @ V1, "O2": _masked_softmax(S2) @ V2}
    for name, value in values.items():
        _keep(keep, name, value)
    return O


def mqa(X, W_q, W_k, W_v, keep=None):
    d_k = W_q.shape[-1]
    Q = X @ W_q                                                          # [h, N, d_k]
    V = _keep(keep, "V", X @ W_v)                                        # [1, N, d_k]
    K = (X @ W_k).expand_as(Q)                                           # the one key/value head for every head
    P = _keep(keep, "P", torch.softmax(Q @ K.transpose(-1, -2) / math.sqrt(d_k), dim=-1))
    return P @ V.expand_as(Q)


def t5_bias(X, W_q, W_k, W_v, Bt, keep=None):
    n = X.shape[0]
    Q, K, V = X @ W_q, X @ W_k, X @ W_v                                  # [h, N, d_k]
    offset = torch.arange(n)[None, :] - torch.arange(n)[:, None] + n - 1
    S = _keep(keep, "S", Q @ K.transpose(-1, -2) / math.sqrt(Q.shape[-1]) + Bt[:, offset] + _causal_bias(n, X.dtype))
    return _keep(keep, "P", torch.softmax(S, dim=-1)) @ V


def alibi_learned(X, W_q, W_k, W_v, m, keep=None):
    n = X.shape[0]
    Q, K, V = X @ W_q, X @ W_k, X @ W_v
    distance = (torch.arange(n)[:, None] - torch.arange(n)[None, :]).abs().to(X.dtype)
    B = -m[:, None, None] * distance + _causal_bias(n, X.dtype)
    S = _keep(keep, "S", Q @ K.transpose(-1, -2) / math.sqrt(Q.shape[-1]) + B)
    return _keep(keep, "P", torch.softmax(S, dim=-1)) @ V


def padding_qk(X, W_q, W_k, W_v, real, keep=None):
    Q, K, V = X @ W_q, X @ W_k, X @ W_v
    real = real > 0
    S = Q @ K.T / math.sqrt(Q.shape[-1])
    S = torch.where(real[None, :] & real[:, None], S, torch.full_like(S, float("-inf")))
    return _keep(keep, "P", _masked_softmax(S)) @ V


def mla(X, W_qc, W_kc, W_qr, W_kr, W_v, keep=None):
    Qc, Kc, Qr, Kr, V = (X @ w for w in (W_qc, W_kc, W_qr, W_kr, W_v))
    S = _keep(keep, "S", (Qc @ Kc.transpose(-1, -2) + Qr @ Kr.transpose(-1, -2))
              / math.sqrt(W_qc.shape[-1] + W_qr.shape[-1]))
    return _keep(keep, "P", torch.softmax(S, dim=-1)) @ V


def lse_output(Q, K, V, keep=None):
    S = _keep(keep, "S", Q @ K.T / math.sqrt(Q.shape[-1]))
    _keep(keep, "L", _lse(S))
    return _keep(keep, "P", torch.softmax(S, dim=-1)) @ V


def dropout_mask(X, W_q, W_k, W_v, Z, keep=None):
    Q, K, V = X @ W_q, X @ W_k, X @ W_v
    P = _keep(keep, "P", torch.softmax(Q @ K.T / math.sqrt(Q.shape[-1]), dim=-1))
    D = _keep(keep, "D", P * Z / 0.9)
    return D @ V


def attention_dropout(Q, K, V, Pd_keep, keep=None):
    """FlashAttention's dropout after a causal softmax, the 0/1 mask given (symattn's claims hold for each)."""
    n = Q.shape[-2]
    causal = torch.arange(n)[None, :] <= torch.arange(n)[:, None]
    S = Q @ K.transpose(-1, -2) / math.sqrt(Q.shape[-1])
    S = _keep(keep, "S", torch.where(causal, S, torch.full_like(S, float("-inf"))))
    P = _keep(keep, "P", torch.softmax(S, dim=-1))
    return _keep(keep, "Pd", P * Pd_keep / 0.9) @ V


def prefix_lm(X, W_q, W_k, W_v, keep=None, prefix=2):
    n = X.shape[0]
    Q, K, V = X @ W_q, X @ W_k, X @ W_v
    visible = (torch.arange(n)[None, :] <= torch.arange(n)[:, None]) | (torch.arange(n)[None, :] < prefix)
    S = Q @ K.T / math.sqrt(Q.shape[-1])
    S = torch.where(visible, S, torch.full_like(S, float("-inf")))
    return _keep(keep, "P", torch.softmax(S, dim=-1)) @ V


def causal_bottom_right(Q, K, V, keep=None):
    n, m = Q.shape[0], K.shape[0]
    visible = torch.arange(m)[None, :] <= torch.arange(n)[:, None] + m - n
    S = Q @ K.T / math.sqrt(Q.shape[-1])
    S = torch.where(visible, S, torch.full_like(S, float("-inf")))
    return _keep(keep, "P", torch.softmax(S, dim=-1)) @ V


# The mask language: integer buffers arrive as float tensors of integers (their values, never differentiated).
def _ints(x: torch.Tensor) -> torch.Tensor:
    return x.detach().round().long()


def _attend(q, k, v, keep_mask=None, bias=0.0, keep=None):
    s = _keep(keep, "S", q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1]) + bias)
    if keep_mask is not None:
        s = _keep(keep, "S", torch.where(keep_mask, s, torch.full_like(s, float("-inf"))))
    return _keep(keep, "P", _masked_softmax(s)) @ v


def document_offsets(Q, K, V, doc, offsets, slope, keep=None):
    """attention-gym's document mask in each document's own positions q_idx - offsets[document_id[q_idx]]."""
    doc, off = _ints(doc), _ints(offsets)
    n = Q.shape[0]
    pos = torch.arange(n) - off[doc]
    visible = (doc[:, None] == doc[None, :]) & (pos[None, :] <= pos[:, None])
    bias = torch.where(visible, -slope * (pos[:, None] - pos[None, :]), torch.full((n, n), float("-inf"),
                                                                                    dtype=Q.dtype))
    return _attend(Q, K, V, None, bias, keep)


def dilated_window(Q, K, V, keep=None, w=2, r=2):
    n = Q.shape[0]
    i, j = torch.arange(n)[:, None], torch.arange(n)[None, :]
    return _attend(Q, K, V, ((i - j) % r == 0) & ((i - j).abs() <= w * r), keep=keep)


def window_zero_side(Q, K, V, keep=None, w=3, right=0):
    n = Q.shape[0]
    i, j = torch.arange(n)[:, None], torch.arange(n)[None, :]
    return _attend(Q, K, V, (j >= i - w) & (j <= i + right), keep=keep)


def alibi_exp2(Q, K, V, keep=None):
    h, n = Q.shape[0], Q.shape[1]
    slopes = torch.tensor([2.0 ** (-8 * (g + 1) / h) for g in range(h)], dtype=Q.dtype)[:, None, None]
    distance = (torch.arange(n)[:, None] - torch.arange(n)[None, :]).abs()
    return _attend(Q, K, V, None, -slopes * distance, keep)


def natten_2d(Q, K, V, keep=None, height=3, width=4, radius=1):
    t = torch.arange(height * width)
    row, col = t // width, t % width
    centre_row = row.clamp(radius, height - 1 - radius)[:, None]
    centre_col = col.clamp(radius, width - 1 - radius)[:, None]
    visible = ((row[None, :] - centre_row).abs() <= radius) & ((col[None, :] - centre_col).abs() <= radius)
    return _attend(Q, K, V, visible, keep=keep)


def flamingo_intervals(X, Y, W_q, W_k, W_v, last, lo, hi, keep=None):
    last, lo, hi = _ints(last), _ints(lo), _ints(hi)
    j = torch.arange(Y.shape[0])[None, :]
    visible = (j >= lo[last][:, None]) & (j < hi[last][:, None])
    return _attend(X @ W_q, Y @ W_k, Y @ W_v, visible, keep=keep)


def t5_buckets(Q, K, V, Bt, keep=None):
    n, nb = Q.shape[0], Bt.shape[0]
    distance = (torch.arange(n)[:, None] - torch.arange(n)[None, :]).abs()
    bucket = torch.floor(torch.log2(distance.double() + 1)).long().clamp(0, nb - 1)
    return _attend(Q, K, V, None, _keep(keep, "B", Bt[bucket]), keep)


def paged_decode(q, Kc, Vc, table, seqlen, keep=None):
    table, seqlen = _ints(table), int(_ints(seqlen))
    size = Kc.shape[1]
    p = torch.arange(table.shape[0] * size)
    k, v = Kc[table[p // size], p % size], Vc[table[p // size], p % size]
    return _attend(q, k, v, (p < seqlen)[None, :], keep=keep)


# outputs other than the first, read by the callers from `keep` (lse_output's L)
EXTRA_OUTPUTS = {"lse_output": ("L",)}


FORWARDS = {f.__name__: f for f in (kv_cache_decode, alibi, causal_linear, cosine, differential, gqa, sigmoid, sliding_window,
                                    softcap, stable_softmax, relative_bias, rope_half, rope_interleaved, online_softmax,
                                    online_softmax_masked, mqa, t5_bias, alibi_learned, padding_qk, mla, lse_output,
                                    dropout_mask, prefix_lm, causal_bottom_right, document_offsets, dilated_window,
                                    window_zero_side, alibi_exp2, natten_2d, flamingo_intervals, t5_buckets,
                                    paged_decode, attention_dropout)}
