"""The Triton kernels of one core of the attention plan (FlashAttention-2's schedule), as Python source.

Contract: `core_kernels(core, spec, prefix)` returns a `CoreKernels`: the
source of the `@triton.jit` functions of one `AttentionCore`
(`symattn.codegen.plan`), and what the launchers need to know (the given
tensors the score loads, which of them get gradients, the dims the kernels
take). The kernels:

- `<prefix>_score`, `<prefix>_score_grad`, `<prefix>_score_d<k>` and
  `<prefix>_weights`: the score of one tile as a function of the tile `s_ =
  Q_i . K_j` (the plan's where(keep, value, -inf): scale, biases, reads and
  masks inlined, `triton.jit` functions are inlined where called), d value /
  d s, d value / d the k-th learned read, and the factor of the weights after
  the softmax (a dropout mask).
- `<prefix>_fwd`: one program per BLOCK_M query rows of one (batch entry,
  head); key tiles of BLOCK_N stream through, online softmax with the running
  max m and sum l in fp32, `tl.dot` with fp32 accumulation (TF32 for fp32
  inputs on a GPU). Writes O and lse = m + log(l); a fully masked row gives
  O = 0 and lse = -inf, never NaN. Key tiles outside the mask's bounds
  (`plan.tile_bounds`: causal, sliding window) are never visited.
- `<prefix>_delta`: delta = rowsum(dO * O) in fp32.
- `<prefix>_dkdv`: one program per BLOCK_N keys; query tiles stream through,
  P = exp(score - lse) recomputed, dV += P^T dO, dS = P * (dP - delta) * score',
  dK += dS^T Q. Gradients of learned score tensors are summed here: a read
  whose subscripts are coordinates is summed over the tile axes it is
  broadcast along in registers, then `tl.atomic_add` into an fp32 buffer
  (programs of other key tiles and batch entries add to it too); a read at
  computed subscripts (a learned table) adds each entry at its address.
- `<prefix>_dq`: one program per BLOCK_M queries; dQ += dS K.

Head dims are padded to powers of two (`BLOCK_DQK`, `BLOCK_DV`) and masked.
`UPCAST` (set by the launcher only under the interpreter, whose `tl.dot` gets
bfloat16 wrong) feeds the products float32 copies of the loaded tiles.
"""

from __future__ import annotations

from dataclasses import dataclass
from string import Template

from ...ir import typed as t
from ..plan import AttentionCore, Bounds, entry_text, tile_bounds
from .printer import TritonPrinter, operand_args

__all__ = ["CoreKernels", "core_kernels"]


@dataclass(frozen=True)
class CoreKernels:
    prefix: str
    source: str
    reads: tuple[str, ...]          # given tensors the score loads, in argument order
    learned: tuple[str, ...]        # those of them that get gradients (inputs and params)
    dims: tuple[str, ...]           # the spec's dims, passed as D_<dim>
    formula: str


_SCORE = Template('''\
@triton.jit
def ${prefix}_${name}(${params}):
    # ${comment}
    return ${body}
''')

_HEAD = '''\
    bh_ = tl.program_id(1)
    b_ = (bh_ // H_).to(tl.int64)
    h_ = (bh_ % H_).to(tl.int64)
$lead'''

_FWD = Template('''\
@triton.jit
def ${prefix}_fwd(Q, K, V, O, LSE, ${operands}
        sq_b, sq_h, sq_n, sq_d, sk_b, sk_h, sk_n, sk_d, sv_b, sv_h, sv_n, sv_d, so_b, so_h, so_n, so_d,
        n_q_, n_k_, d_qk_, d_v_, H_, ${lead_params}${dims}
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_DQK: tl.constexpr, BLOCK_DV: tl.constexpr,
        PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    start_m_ = tl.program_id(0)
${head}
    offs_m = start_m_ * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_dqk = tl.arange(0, BLOCK_DQK)
    offs_dv = tl.arange(0, BLOCK_DV)
    i_ = offs_m[:, None]
    Q += b_ * sq_b + h_ * sq_h
    K += b_ * sk_b + h_ * sk_h
    V += b_ * sv_b + h_ * sv_h
    q = _mma(tl.load(Q + i_ * sq_n + offs_dqk[None, :] * sq_d, mask=(i_ < n_q_) & (offs_dqk[None, :] < d_qk_),
                     other=0.0), UPCAST)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)  # running max of the row's scores
    l_i = tl.zeros([BLOCK_M], tl.float32)                # running sum of exp(score - m_i)
    acc = tl.zeros([BLOCK_M, BLOCK_DV], tl.float32)
    I0_ = start_m_ * BLOCK_M
    I1_ = I0_ + BLOCK_M - 1
${key_range}
    for start_n in range(lo_, hi_, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        j_ = offs_n[None, :]
        k = _mma(tl.load(K + offs_n[:, None] * sk_n + offs_dqk[None, :] * sk_d,
                         mask=(offs_n[:, None] < n_k_) & (offs_dqk[None, :] < d_qk_), other=0.0), UPCAST)
        s_ = tl.dot(q, tl.trans(k), input_precision=PRECISION)
        score = ${prefix}_score(${score_args})
        score = tl.where(j_ < n_k_, score, float("-inf"))
${weights}
        m_new = tl.maximum(m_i, tl.max(score, 1))
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row masked so far: exp(-inf - 0) = 0
        alpha = tl.exp(m_i - m_use)
        p = tl.exp(score - m_use[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        v = _mma(tl.load(V + offs_n[:, None] * sv_n + offs_dv[None, :] * sv_d,
                         mask=(offs_n[:, None] < n_k_) & (offs_dv[None, :] < d_v_), other=0.0), UPCAST)
        acc = acc * alpha[:, None] + tl.dot(${weighted}.to(v.dtype), v, input_precision=PRECISION)
        m_i = m_new
    l_use = tl.where(l_i == 0.0, 1.0, l_i)  # a fully masked row: O = 0, lse = -inf
    o = acc / l_use[:, None]
    lse = tl.where(l_i == 0.0, float("-inf"), m_i + tl.log(l_use))
    O += b_ * so_b + h_ * so_h
    tl.store(O + i_ * so_n + offs_dv[None, :] * so_d, o.to(O.dtype.element_ty),
             mask=(i_ < n_q_) & (offs_dv[None, :] < d_v_))
    tl.store(LSE + bh_ * n_q_ + offs_m, lse, mask=offs_m < n_q_)
''')

_DELTA = Template('''\
@triton.jit
def ${prefix}_delta(O, DO, DELTA, so_b, so_h, so_n, so_d, sdo_b, sdo_h, sdo_n, sdo_d, n_q_, d_v_, H_,
        BLOCK_M: tl.constexpr, BLOCK_DV: tl.constexpr):
    # delta[i] = rowsum(dO * O)[i] = rowsum(dP * P)[i]: the softmax backward's correction
    start_m_ = tl.program_id(0)
    bh_ = tl.program_id(1)
    b_ = (bh_ // H_).to(tl.int64)
    h_ = (bh_ % H_).to(tl.int64)
    offs_m = start_m_ * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_dv = tl.arange(0, BLOCK_DV)
    mask = (offs_m[:, None] < n_q_) & (offs_dv[None, :] < d_v_)
    o = tl.load(O + b_ * so_b + h_ * so_h + offs_m[:, None] * so_n + offs_dv[None, :] * so_d, mask=mask, other=0.0)
    do = tl.load(DO + b_ * sdo_b + h_ * sdo_h + offs_m[:, None] * sdo_n + offs_dv[None, :] * sdo_d, mask=mask,
                 other=0.0)
    delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), 1)
    tl.store(DELTA + bh_ * n_q_ + offs_m, delta, mask=offs_m < n_q_)
''')

# P and dS of one tile, from s_, dO . V^T, the rows' lse and delta (shared by dK/dV and dQ)
_RECOMPUTE = '''\
        s_ = tl.dot(q, tl.trans(k), input_precision=PRECISION)
        score = ${prefix}_score(${score_args})
        live = (i_ < n_q_) & (j_ < n_k_) & (lse[:, None] != float("-inf"))
        p = tl.where(live, tl.exp(score - lse_use[:, None]), 0.0)
        dp = tl.dot(do, tl.trans(v), input_precision=PRECISION)
${weights}
        dscore = p * (dp${weighted_dp} - delta[:, None])  # d loss / d score
        ds = tl.where(p != 0.0, dscore * ${prefix}_score_grad(${score_args}), 0.0)'''

_ROWS = '''\
        lse = tl.load(LSE + bh_ * n_q_ + offs_m, mask=offs_m < n_q_, other=float("-inf"))
        lse_use = tl.where(lse == float("-inf"), 0.0, lse)
        delta = tl.load(DELTA + bh_ * n_q_ + offs_m, mask=offs_m < n_q_, other=0.0)'''

_LOADS_Q = '''\
        q = _mma(tl.load(Q + i_ * sq_n + offs_dqk[None, :] * sq_d, mask=(i_ < n_q_) & (offs_dqk[None, :] < d_qk_),
                         other=0.0), UPCAST)
        do = _mma(tl.load(DO + i_ * sdo_n + offs_dv[None, :] * sdo_d, mask=(i_ < n_q_) & (offs_dv[None, :] < d_v_),
                          other=0.0), UPCAST)'''

_LOADS_K = '''\
        k = _mma(tl.load(K + j_T * sk_n + offs_dqk[None, :] * sk_d, mask=(j_T < n_k_) & (offs_dqk[None, :] < d_qk_),
                         other=0.0), UPCAST)
        v = _mma(tl.load(V + j_T * sv_n + offs_dv[None, :] * sv_d, mask=(j_T < n_k_) & (offs_dv[None, :] < d_v_),
                         other=0.0), UPCAST)'''

_BWD_PARAMS = '''Q, K, V, DO, LSE, DELTA, ${operands}
        sq_b, sq_h, sq_n, sq_d, sk_b, sk_h, sk_n, sk_d, sv_b, sv_h, sv_n, sv_d, sdo_b, sdo_h, sdo_n, sdo_d,
        n_q_, n_k_, d_qk_, d_v_, H_, ${lead_params}${dims}'''

_BWD_OFFSETS = '''\
    offs_dqk = tl.arange(0, BLOCK_DQK)
    offs_dv = tl.arange(0, BLOCK_DV)
    Q += b_ * sq_b + h_ * sq_h
    K += b_ * sk_b + h_ * sk_h
    V += b_ * sv_b + h_ * sv_h
    DO += b_ * sdo_b + h_ * sdo_h'''

_DKDV = Template('''\
@triton.jit
def ${prefix}_dkdv(DK, DV, ${grads}''' + _BWD_PARAMS + '''
        sdk_b, sdk_h, sdk_n, sdk_d, sdv_b, sdv_h, sdv_n, sdv_d,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_DQK: tl.constexpr, BLOCK_DV: tl.constexpr,
        PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    start_n_ = tl.program_id(0)
${head}
''' + _BWD_OFFSETS + '''
    offs_n = start_n_ * BLOCK_N + tl.arange(0, BLOCK_N)
    j_ = offs_n[None, :]
    j_T = offs_n[:, None]
''' + _LOADS_K.replace("        ", "    ") + '''
    dk = tl.zeros([BLOCK_N, BLOCK_DQK], tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_DV], tl.float32)
${grad_init}
    J0_ = start_n_ * BLOCK_N
    J1_ = J0_ + BLOCK_N - 1
${query_range}
    for start_m in range(lo_, hi_, BLOCK_M):
        offs_m = start_m + tl.arange(0, BLOCK_M)
        i_ = offs_m[:, None]
''' + _LOADS_Q + '\n' + _ROWS + '\n' + _RECOMPUTE + '''
        dv += tl.dot(tl.trans(${weighted}).to(do.dtype), do, input_precision=PRECISION)
        dk += tl.dot(tl.trans(ds).to(q.dtype), q, input_precision=PRECISION)
${grad_step}
${grad_final}
    mask_k = (j_T < n_k_) & (offs_dqk[None, :] < d_qk_)
    tl.store(DK + b_ * sdk_b + h_ * sdk_h + j_T * sdk_n + offs_dqk[None, :] * sdk_d, dk.to(DK.dtype.element_ty),
             mask=mask_k)
    mask_v = (j_T < n_k_) & (offs_dv[None, :] < d_v_)
    tl.store(DV + b_ * sdv_b + h_ * sdv_h + j_T * sdv_n + offs_dv[None, :] * sdv_d, dv.to(DV.dtype.element_ty),
             mask=mask_v)
''')

_DQ = Template('''\
@triton.jit
def ${prefix}_dq(DQ, ''' + _BWD_PARAMS + '''
        sdq_b, sdq_h, sdq_n, sdq_d,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_DQK: tl.constexpr, BLOCK_DV: tl.constexpr,
        PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    start_m_ = tl.program_id(0)
${head}
''' + _BWD_OFFSETS + '''
    offs_m = start_m_ * BLOCK_M + tl.arange(0, BLOCK_M)
    i_ = offs_m[:, None]
''' + (_LOADS_Q + '\n' + _ROWS).replace("\n        ", "\n    ").replace("        q =", "    q =", 1) + '''
    dq = tl.zeros([BLOCK_M, BLOCK_DQK], tl.float32)
    I0_ = start_m_ * BLOCK_M
    I1_ = I0_ + BLOCK_M - 1
${key_range}
    for start_n in range(lo_, hi_, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        j_ = offs_n[None, :]
        j_T = offs_n[:, None]
''' + _LOADS_K + '\n' + _RECOMPUTE + '''
        dq += tl.dot(ds.to(k.dtype), k, input_precision=PRECISION)
    tl.store(DQ + b_ * sdq_b + h_ * sdq_h + i_ * sdq_n + offs_dqk[None, :] * sdq_d, dq.to(DQ.dtype.element_ty),
             mask=(i_ < n_q_) & (offs_dqk[None, :] < d_qk_))
''')


def _range(lo: list[str], hi: list[str], limit: str, step: str) -> str:
    """`lo_`, `hi_`: the loop range, lower bounds rounded down to a tile start, clamped to [0, limit)."""
    lines = ["    lo_ = 0", f"    hi_ = {limit}"]
    for bound in lo:
        lines.append(f"    lo_ = tl.maximum(lo_, {bound})")
    if lo:
        lines.append(f"    lo_ = lo_ // {step} * {step}")
    for bound in hi:
        lines.append(f"    hi_ = tl.minimum(hi_, {bound})")
    return "\n".join(lines)


def _lead(core: AttentionCore) -> str:
    n = len(core.lead)
    if not n:
        return ""
    lines = ["    rest_ = h_"]
    for k in range(n - 1, 0, -1):
        lines += [f"    z{k}_ = rest_ % L{k}_", f"    rest_ = rest_ // L{k}_"]
    lines.append("    z0_ = rest_")
    return "\n".join(lines) + "\n"


def _scatter(name: str, coords: tuple[str, ...], value: str) -> tuple[str, str, str]:
    """(init, per-tile step, final) lines that sum `value` (a [BLOCK_M, BLOCK_N] tile) into G_<name> at a read
    whose subscripts are the coordinates `coords` (or "0")."""
    offset = " + ".join(f"{c} * G_{name}_s{k}" for k, c in enumerate(coords) if c != "0")
    address = f"G_{name} + b_ * G_{name}_bs" + (f" + {offset}" if offset else "")
    over_i = "i_" not in coords
    masks = [f"({c} < n_q_)" if c == "i_" else f"({c} < n_k_)" for c in coords if c in ("i_", "j_")]
    mask = f", mask={' & '.join(masks)}" if masks else ""
    if not over_i:  # each tile owns distinct rows: add per tile
        reduced = value if "j_" in coords else f"tl.sum({value}, 1, keep_dims=True)"
        return "", f"        tl.atomic_add({address}, {reduced}{mask})", ""
    # summed over the query rows: accumulate across the loop, add once
    acc = f"g_{name}"
    shape = "[1, BLOCK_N]" if "j_" in coords else "[1, 1]"
    step = f"tl.sum({value}, 0, keep_dims=True)"
    if "j_" not in coords:
        step = f"tl.sum({step}, 1, keep_dims=True)"
    total = acc if "j_" in coords else f"tl.sum(tl.sum({acc}, 1), 0)"
    return (f"    {acc} = tl.zeros({shape}, tl.float32)", f"        {acc} += {step}",
            f"    tl.atomic_add({address}, {total}{mask})")


def core_kernels(core: AttentionCore, spec: t.TypedSpec, prefix: str) -> CoreKernels:
    dims = tuple(spec.dims)
    lead = [f"z{k}_" for k in range(len(core.lead))]
    operands = operand_args(core, spec)
    params = ["s_", "i_", "j_", "b_", *lead, "n_q_", "n_k_", *operands, *[f"D_{d}" for d in dims]]
    score_args = ", ".join(params)
    printer = TritonPrinter(core, spec)
    order = list(spec.dims)
    formula = core.text.split(" = ", 1)[1] if core.text else ""
    functions = [
        _SCORE.substitute(prefix=prefix, name="score", params=score_args, body=printer.masked(core.keep, core.value),
                          comment=f"score of {core.text}: {entry_text(core.score, order, core)}"),
        _SCORE.substitute(prefix=prefix, name="score_grad", params=score_args, body=printer.tile(core.d_product),
                          comment="d score / d s"),
    ]
    learned = core.learned
    init, step, final = [], [], []
    for k, read in enumerate(r for r in core.reads if r.derivative is not None):
        functions.append(_SCORE.substitute(prefix=prefix, name=f"score_d{k}", params=score_args,
                                           body=printer.tile(read.derivative),
                                           comment=f"d score / d {entry_text(read.node, order)}"))
        value = f"tl.where(p != 0.0, dscore * {prefix}_score_d{k}({score_args}), 0.0)"
        if read.plain:
            coords = tuple(printer.coords[s] if isinstance(s, str) else "0" for s in read.subscripts)
            lines = _scatter(read.tensor, coords, value)
        else:
            offset, mask = printer.address(read.node, "G")
            live = "(i_ < n_q_) & (j_ < n_k_)"
            lines = ("", f"        tl.atomic_add(G_{read.tensor} + {offset} + tl.zeros([BLOCK_M, BLOCK_N], tl.int32), "
                     f"{value}, mask={live})", "")
        init.append(lines[0])
        step.append(lines[1])
        final.append(lines[2])
    weights = weights_bwd = ""
    weighted, weighted_dp = "p", ""
    if core.weights is not None:
        functions.append(_SCORE.substitute(prefix=prefix, name="weights", params=score_args,
                                           body=printer.tile(core.weights),
                                           comment=f"the factor of the weights after the softmax: "
                                                   f"{entry_text(core.weights, order)}"))
        weights = f"        w_ = {prefix}_weights({score_args})"
        weights_bwd = weights
        weighted, weighted_dp = "(p * w_)", " * w_"
    bounds: Bounds = tile_bounds(core)
    common = dict(prefix=prefix, operands="".join(f"{a}, " for a in operands),
                  lead_params="".join(f"L{k}_, " for k in range(len(core.lead))),
                  dims="".join(f"D_{d}, " for d in dims), head=Template(_HEAD).substitute(lead=_lead(core)).rstrip("\n"),
                  score_args=score_args, weighted=weighted,
                  key_range=_range([str(x) for x in bounds.key_lo], [str(x) for x in bounds.key_hi], "n_k_", "BLOCK_N"),
                  query_range=_range([str(x) for x in bounds.query_lo], [str(x) for x in bounds.query_hi], "n_q_",
                                     "BLOCK_M"))
    grads = "".join(f"{a}, " for n in learned for a in _grad_args(n, spec))
    fwd = _FWD.substitute(common, weights=weights)
    delta = _DELTA.substitute(common)
    dkdv = _DKDV.substitute(common, grads=grads, grad_init="\n".join(x for x in init if x),
                            grad_step="\n".join(x for x in step if x), grad_final="\n".join(x for x in final if x),
                            weights=weights_bwd, weighted_dp=weighted_dp)
    dq = _DQ.substitute(common, weights=weights_bwd, weighted_dp=weighted_dp)
    if core.masked_at_run_time:
        # a mask of buffers (document ids) or of // % min max: each tile tests it first and is skipped when it
        # masks the whole tile (FlexAttention's block mask, computed as the loop goes)
        live_args = score_args.replace("s_, ", "0.0, ", 1)
        functions.append(_SCORE.substitute(prefix=prefix, name="live", params=score_args,
                                           body=f"tl.max(tl.where(({printer.tile(core.keep)}) & (i_ < n_q_) & "
                                                "(j_ < n_k_), 1, 0))",
                                           comment="whether the tile keeps an entry (1) or the mask hides all (0)"))
        guard = f"if {prefix}_live({live_args}) != 0:  # a tile the mask hides whole is skipped"
        fwd = _guarded(fwd, "        j_ = offs_n[None, :]", guard)
        dkdv = _guarded(dkdv, "        i_ = offs_m[:, None]", guard)
        dq = _guarded(dq, "        j_T = offs_n[:, None]", guard)
    source = "\n\n".join([*functions, fwd, delta, dkdv, dq])
    return CoreKernels(prefix, source, core.read_tensors, learned, dims, formula)


def _guarded(source: str, anchor: str, condition: str) -> str:
    """`source` with the rest of the key or query loop's body after `anchor` (a line of it) under `condition`."""
    lines = source.split("\n")
    at = lines.index(anchor)
    end = at + 1
    while end < len(lines) and (lines[end].startswith("        ") or not lines[end].strip()):
        end += 1
    while end > at + 1 and not lines[end - 1].strip():
        end -= 1
    body = ["    " + line if line.strip() else line for line in lines[at + 1:end]]
    return "\n".join(lines[:at + 1] + ["        " + condition] + body + lines[end:])


def _grad_args(name: str, spec: t.TypedSpec) -> list[str]:
    rank = len(spec.tensors[name].shape)
    return [f"G_{name}", f"G_{name}_bs", *[f"G_{name}_s{k}" for k in range(rank)]]
