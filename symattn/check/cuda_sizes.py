"""Sizes for `symattn verify --target cuda`: the main sizes, and the sizes for each head-dim instantiation.

Contract: `verify_sizes(spec)` picks sizes that are no multiple of a tile size;
`guarded_sizes` makes them smaller when their work exceeds a budget;
`head_dim_sizes(spec, code, sizes)` gives one set of sizes per instantiation of
the fused kernels (`HEAD_DIMS`) that `sizes` does not run, and `instantiation`
says which one a head dim runs.
"""

from __future__ import annotations

from typing import Mapping

import sympy

from ..ir import typed as t
from ..ir.sizes import SizeChoice, fit_sizes, repair, user_sizes, valid_sizes
from ..codegen.cuda import CudaCode
from ..codegen.cuda.flash import HEAD_DIMS

__all__ = ["verify_sizes", "guarded_sizes", "head_dim_sizes", "instantiation", "BUDGET"]

BUDGET = 16_000_000           # entries of the spec's arrays: above it the size guard picks smaller sizes


def verify_sizes(spec: t.TypedSpec) -> dict[str, int]:
    """Sizes for verification: sequence dims (the rows of an input: its axis -2, or its one axis) 67, 45, ...;
    others small (heads in front of the rows, `Q[H, N, d_k]`, among them).

    None is a multiple of a tile size (16, 32, 64), and 67 spans more than one tile of every kernel.
    A dim the user overrode (--dim) keeps the user's size.
    """
    sequence, other = iter([67, 45, 29, 23]), iter([5, 3, 6, 7, 9, 11, 13, 4])
    firsts = {spec.tensors[x].shape[-2 if len(spec.tensors[x].shape) >= 2 else 0] for x in spec.given
              if spec.tensors[x].kind != "param" and spec.tensors[x].shape}  # inputs and buffers (a KV cache's T)
    sizes = {}
    chosen = []
    for name, info in spec.dims.items():
        if spec.sizes[name] != info.default:
            sizes[name] = spec.sizes[name]
        else:
            sizes[name] = next(sequence, 31) if info.symbol in firsts else next(other, 5)
            chosen.append(name)
    # A shape such as [h, N, d / h] (split_heads) needs d divisible by h: scale a chosen numerator.
    shapes = [d for info in spec.tensors.values() for d in info.shape]
    for _ in range(4):
        subs = {spec.dims[n].symbol: v for n, v in sizes.items()}
        bad = [d for d in shapes if not sympy.sympify(d).subs(subs).is_integer]
        if not bad:
            break
        numerator, denominator = sympy.fraction(sympy.together(bad[0]))
        free = [str(s) for s in numerator.free_symbols if str(s) in chosen]
        if not free:
            break
        sizes[free[0]] *= int(denominator.subs(subs))
    if not valid_sizes(spec, sizes):  # e.g. (N + 1) / 2 needs an odd N: the nearest sizes that fit
        sizes = repair(spec, sizes, chosen) or repair(spec, sizes) or sizes
    return sizes


def guarded_sizes(spec: t.TypedSpec, budget: int = BUDGET) -> SizeChoice:
    """`verify_sizes`, made smaller by the size guard when their work exceeds `budget` entries.

    Sizes given with --dim stand unless they are over the budget too.
    """
    return fit_sizes(spec, budget, sizes=verify_sizes(spec), fixed=user_sizes(spec))


def instantiation(head_dim: int) -> int | None:
    """The HEAD_DIMS bound whose kernels run at this head dim (the smallest that holds it), or None."""
    return next((bound for bound in HEAD_DIMS if head_dim <= bound), None)


def head_dim_sizes(spec: t.TypedSpec, code: CudaCode, sizes: Mapping[str, int]) -> list[dict[str, int]]:
    """Sizes at which the fused cores run each head-dim instantiation that `sizes` leaves out.

    For each such bound, the head dim (of Q and K) of every core is set just above the previous
    bound (39 for the 64 kernels: not a multiple of a tile), solving for one of its dims that the
    user did not give (`d_k`, or `h` in `2 * h`), and the sequence lengths (query and key rows)
    are cut to about 5/8 (67 to 41, at least 33: still more than one tile), because the CPU
    emulation's time grows with their square; sizes that then break a constraint (`d / h` whole)
    are repaired by moving the other dims. Empty without a fused core.
    """
    cores = code.plan.cores
    if not cores:
        return []
    symbols = {info.symbol: name for name, info in spec.dims.items()}
    fixed = set(user_sizes(spec))

    def head_dim(core, values) -> int:
        subs = {spec.dims[n].symbol: v for n, v in values.items()}
        return max(int(sympy.sympify(core.d_qk).subs(subs)), int(sympy.sympify(core.d_v).subs(subs)))

    covered = {instantiation(head_dim(core, sizes)) for core in cores}
    rows = {symbols[s] for core in cores for d in (core.n_q, core.n_k)
            for s in sympy.sympify(d).free_symbols if s in symbols} - fixed
    found = []
    for k, bound in enumerate(HEAD_DIMS):
        if bound in covered:
            continue
        low = HEAD_DIMS[k - 1] if k else 0
        candidate = {n: max(v * 5 // 8, 33) if n in rows and v > 41 else v for n, v in sizes.items()}
        for core in cores:
            expr = sympy.sympify(core.d_qk)
            for target in range(low + 7, bound + 1):
                solved = _solve_dim(expr, target, candidate, symbols, fixed)
                if solved:
                    candidate.update(solved)
                    break
        moved = {n for n in candidate if candidate[n] != sizes[n]}
        if not valid_sizes(spec, candidate):
            candidate = repair(spec, candidate, [n for n in spec.dims if n not in moved | fixed]) or candidate
        if valid_sizes(spec, candidate) and all(instantiation(head_dim(c, candidate)) == bound for c in cores):
            found.append(candidate)
    return found


def _solve_dim(expr, target: int, sizes: Mapping[str, int], symbols, fixed) -> dict[str, int] | None:
    """{dim: value} that makes `expr` equal `target`, moving one dim not in `fixed`, or None."""
    for symbol in sorted(expr.free_symbols, key=str):
        name = symbols.get(symbol)
        if name is None or name in fixed:
            continue
        rest = {s: sizes[symbols[s]] for s in expr.free_symbols if s != symbol and s in symbols}
        for value in sympy.solve(sympy.Eq(expr.subs(rest), target), symbol):
            if value.is_integer and value > 0:
                return {name: int(value)}
    return None
