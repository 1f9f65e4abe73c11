"""Check generated code against the reference evaluator: `symattn verify SPEC --target numpy`.

Contract: `verify_numpy(spec)` generates the NumPy module, runs it in float64
on random inputs in several configurations (the default sizes, every dim
doubled, a leading batch axis on the inputs and buffers, and batch axes on inputs,
buffers and params that broadcast against each other) and returns a `Report` with one `Row` per
configuration and tensor: the forward outputs against the plain reference
evaluator (`Evaluator` with the NUMERIC backend, run on each batch element on
its own, so the batch semantics are checked too), and the gradient of every
input and param (not of a buffer, which has none) against central finite differences of that reference forward
pass. The error of a tensor is `relative_error`: its max relative error,
`max |generated - reference| / max(max |reference|, 1e-3)`, where entries
that are non-finite in the same way on both sides (the same infinity, or NaN)
count as equal and any other disagreement about finiteness as an infinite
error; a row fails past its tolerance. Nothing here trusts the code under test.
"""

from __future__ import annotations

import contextlib
import itertools
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable

from .. import progress
from ..ir import typed as t

# NumPy and the evaluator are imported where they are used: the command line imports this module to
# dispatch `symattn verify`, and every other command should not pay for NumPy's import.
if TYPE_CHECKING:
    import numpy as np

__all__ = ["Row", "Report", "verify_numpy", "reference_forward", "finite_difference_gradients", "draw_dropout",
           "relative_error", "FORWARD_TOLERANCE", "BACKWARD_TOLERANCE", "USER_BUDGET"]

FORWARD_TOLERANCE = 1e-9  # float64 against float64, the same formulas in another order
BACKWARD_TOLERANCE = 1e-6  # against central differences, step 1e-5: truncation and rounding both ~1e-10
STEP = 1e-5
USER_BUDGET = 1_000_000  # entries: sizes given with --dim stand up to this; beyond it the size guard shrinks them


@dataclass(frozen=True)
class Row:
    config: str
    phase: str  # forward or backward
    tensor: str
    error: float
    tolerance: float

    @property
    def ok(self) -> bool:
        return bool(self.error <= self.tolerance)  # NaN fails


@dataclass
class Report:
    spec: str
    rows: list[Row] = field(default_factory=list)
    sizes: dict[str, int] = field(default_factory=dict)  # the base sizes verified at
    notes: list[str] = field(default_factory=list)       # e.g. that the size guard chose smaller sizes

    @property
    def ok(self) -> bool:
        return all(r.ok for r in self.rows)

    def lines(self) -> list[str]:
        out = list(self.notes)
        config = None
        for row in self.rows:
            if row.config != config:
                config = row.config
                out.append(config)
            mark = "ok  " if row.ok else "FAIL"
            out.append(f"  {mark} {row.phase:<8} {row.tensor:<12} max rel error {row.error:.2e}  "
                       f"(tolerance {row.tolerance:.0e})")
        failed = sum(not r.ok for r in self.rows)
        out.append(f"{self.spec}: {len(self.rows) - failed} of {len(self.rows)} tensors within tolerance"
                   + ("" if not failed else f", {failed} failed"))
        return out


def relative_error(got, want, floor: float = 1e-3) -> float:
    """How far `got` is from `want`: 0 when equal, inf when they disagree about which entries are finite.

    Equal means equal within tolerance, or both non-finite in the same way: an
    entry that is the same infinity on both sides, or NaN on both, counts as
    exact (a fully masked row's logsumexp is -inf in both, and -inf - -inf is
    not a difference). An entry finite on one side only, or non-finite in
    different ways, gives inf. Over the rest the error is
    `max |got - want| / max(max |want|, floor)` (floor 0: the absolute error
    when every finite `want` is 0). `got` may lack leading axes that `want`
    has (an output that reads no batched tensor comes back unbatched); it is
    broadcast. Any other difference of shape gives inf.
    """
    import numpy as np

    got, want = np.asarray(got, dtype=np.float64), np.asarray(want, dtype=np.float64)
    if got.shape != want.shape:
        if got.ndim > want.ndim or want.shape[want.ndim - got.ndim:] != got.shape:
            return float("inf")
        got = np.broadcast_to(got, want.shape)
    if got.size == 0:
        return 0.0
    finite = np.isfinite(want)
    if not np.array_equal(np.isfinite(got), finite):
        return float("inf")
    if not np.array_equal(got[~finite], want[~finite], equal_nan=True):
        return float("inf")  # +inf against -inf, or an infinity against NaN
    if not finite.any():
        return 0.0
    diff = float(np.max(np.abs(got[finite] - want[finite])))
    scale = max(float(np.max(np.abs(want[finite]))), floor)
    return diff / scale if scale > 0 else diff


def _sum_to(array: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    lead = array.ndim - len(shape)
    array = array.sum(axis=tuple(range(lead))) if lead else array
    axes = tuple(k for k, n in enumerate(shape) if n == 1 and array.shape[k] != 1)
    return array.sum(axis=axes, keepdims=True) if axes else array


def _instances(spec: t.TypedSpec, leaves: dict[str, np.ndarray], sizes: dict[str, int]):
    """(batch shape, function index -> the unbatched given tensors of that batch element)."""
    import numpy as np

    ranks = {n: len(spec.tensors[n].shape) for n in spec.given}
    batch = np.broadcast_shapes(*(leaves[n].shape[: leaves[n].ndim - ranks[n]] for n in spec.given))
    full = {n: np.broadcast_to(leaves[n], batch + leaves[n].shape[leaves[n].ndim - ranks[n]:]) for n in spec.given}
    return batch, lambda idx: {n: np.array(full[n][idx], dtype=np.float64) for n in spec.given}


def draw_dropout(spec: t.TypedSpec, leaves: dict, rng, sizes: dict | None = None) -> tuple[dict, dict]:
    """With `dropout` in the spec: `leaves` with each mask replaced by the one the generated code draws from a
    seed (taken from `rng`, above 2**63 half the time: every bit of the key is used), in the full shape of
    the tensor dropped (the batch axes of what it is computed from, then its shape at `sizes`, by default the
    spec's; `symattn.ir.philox.keep_mask`), and the keyword arguments of a generated module: the spec's
    arguments and the seed. Without dropout, (leaves, leaves)."""
    import numpy as np
    import sympy

    from ..ir.philox import keep_mask

    if not spec.dropouts:
        return leaves, leaves
    seed = int(rng.integers(0, 2 ** 63)) + (2 ** 63 if rng.random() < 0.5 else 0)
    drawn = dict(leaves)
    for name in spec.dropouts:
        info = spec.tensors[name]
        batch = np.broadcast_shapes(*(np.shape(leaves[n])[:np.ndim(leaves[n]) - len(spec.tensors[n].shape)]
                                      for n in t.dropout_sources(spec, name)))
        shape = batch + tuple(int(d) for d in sympy.sympify(sympy.Tuple(*info.shape)).subs(
            {spec.dims[n].symbol: v for n, v in (sizes or spec.sizes).items()}))
        drawn[name] = keep_mask(seed, info.dropout.stream, shape, info.dropout.threshold).astype(np.float64)
    arguments = {n: drawn[n] for n in spec.arguments}
    arguments[spec.seed_keyword] = seed
    return drawn, arguments


def reference_forward(spec: t.TypedSpec, leaves: dict[str, np.ndarray], sizes: dict[str, int]) -> dict:
    """Every output by the reference evaluator, one batch element at a time."""
    import numpy as np

    from ..symbolic.evaluate import NUMERIC, Evaluator

    batch, instance = _instances(spec, leaves, sizes)
    out = {o: None for o in spec.outputs}
    for idx in itertools.product(*(range(n) for n in batch)):
        values = Evaluator(spec, NUMERIC, sizes).run(instance(idx))
        for o in spec.outputs:
            if out[o] is None:
                out[o] = np.empty(batch + np.shape(values[o]))
            out[o][idx] = values[o]
    return out


def finite_difference_gradients(spec: t.TypedSpec, leaves: dict[str, np.ndarray], upstream: dict[str, np.ndarray],
                                sizes: dict[str, int], step: float = STEP) -> dict[str, np.ndarray]:
    """dL/dT for every input and param by central differences of the reference forward, L = sum of <O, grad(O)>."""
    import numpy as np

    from ..symbolic.evaluate import NUMERIC, Evaluator

    batch, instance = _instances(spec, leaves, sizes)
    ranks = {n: len(spec.tensors[n].shape) for n in spec.differentiable}
    grads = {n: np.zeros(batch + leaves[n].shape[leaves[n].ndim - ranks[n]:]) for n in spec.differentiable}
    for idx in itertools.product(*(range(n) for n in batch)):
        base = instance(idx)
        weights = {o: np.broadcast_to(upstream[o], batch + upstream[o].shape[upstream[o].ndim
                                      - len(spec.tensors[o].shape):])[idx] for o in spec.outputs}

        # An output entry that is non-finite at the base point (a fully masked row's logsumexp, -inf)
        # does not move under a small step: it is left out of L, as its zero derivative says.
        base_values = Evaluator(spec, NUMERIC, sizes).run(base)
        counted = {o: np.isfinite(base_values[o]) for o in spec.outputs}

        def loss(values: dict[str, np.ndarray]) -> float:
            result = Evaluator(spec, NUMERIC, sizes).run(values)
            return float(sum(np.sum(np.where(counted[o], result[o] * weights[o], 0.0)) for o in spec.outputs))

        for name in spec.differentiable:
            array = base[name]
            for position in np.ndindex(array.shape):
                saved = array[position]
                array[position] = saved + step
                plus = loss(base)
                array[position] = saved - step
                minus = loss(base)
                array[position] = saved
                grads[name][idx + position] = (plus - minus) / (2 * step)
    return {n: _sum_to(grads[n], leaves[n].shape) for n in spec.differentiable}


def _configs(spec: t.TypedSpec, base: dict[str, int]) -> list[tuple[str, dict[str, int], Callable]]:
    from ..ir.sizes import repair

    # Doubling keeps split_heads divisible; (N + 1) / 2 needs N odd again, hence the repair.
    larger = repair(spec, {name: 2 * size for name, size in base.items()})
    data = set(spec.inputs) | set(spec.buffers)  # what travels with the batch: inputs and buffers

    def none(name):
        return ()

    def inputs_only(name):
        return (2,) if name in data else ()

    def broadcast(name):
        return (2, 3) if name in data else (3,)

    def show(sizes):
        return ", ".join(f"{k}={v}" for k, v in sizes.items())

    which = "default" if base == dict(spec.sizes) else "size-guarded"
    buffers = " and buffers" if spec.buffers else ""
    return [
        (f"{which} sizes ({show(base)})", base, none),
        *([(f"larger sizes ({show(larger)})", larger, none)] if larger is not None else []),
        (f"batch axis [2] on the inputs{buffers}", base, inputs_only),
        (f"batch axes [2, 3] on the inputs{buffers}, [3] on the params", base, broadcast),
    ]


def verify_numpy(spec: t.TypedSpec, seed: int = 0, module=None, budget: int | None = None) -> Report:
    """Run the generated NumPy module against the reference evaluator and finite differences.

    Sizes are the spec's unless their work exceeds `budget` entries (default
    `sizes.VERIFY_BUDGET`; sizes given with --dim stand up to `USER_BUDGET`):
    then smaller valid ones (`sizes.fit_sizes`), and `report.notes` says which.
    """
    import numpy as np

    from ..codegen.arrays.module import size_keywords
    from ..codegen.numpy.emit import load_module, numpy_source
    from ..symbolic.evaluate import random_leaves
    from ..ir.sizes import VERIFY_BUDGET, fit_sizes, user_sizes

    budget = budget or VERIFY_BUDGET
    choice = fit_sizes(spec, budget, fixed=user_sizes(spec), fixed_budget=max(budget, USER_BUDGET))
    module = module or load_module(numpy_source(spec), f"symattn_verify_{spec.name}")
    report = Report(spec.name, sizes=choice.sizes)
    if choice.shrunk:
        report.notes.append(choice.note("verify"))
    rng = np.random.default_rng(seed)
    keywords = size_keywords(spec)  # dims no input's shape has: passed to the module by name
    configs = _configs(spec, choice.sizes)
    # the pass that large attention takes, checked too: at the larger sizes (the first ones where none are)
    tiled = (1 if len(configs) == 4 else 0) if hasattr(module, "_forward_backward_tiled") else None
    for number, (title, sizes, batch_of) in enumerate(configs):
        progress.step(title, number, len(configs))
        dims = {name: sizes[name] for name in keywords}
        leaves = {}
        for name in spec.given:
            one = random_leaves(spec, rng, batch_of(name), sizes)[name]
            leaves[name] = one
        leaves, arguments = draw_dropout(spec, leaves, rng, sizes)
        reference = reference_forward(spec, leaves, sizes)
        upstream = {o: rng.standard_normal(np.shape(reference[o])) for o in spec.outputs}
        expected = finite_difference_gradients(spec, leaves, upstream, sizes)
        passes = [(title, None)]
        if number == tiled:
            passes.append((f"the same, tiled pass forced on: blocks of {TILED_BLOCKS[0]} queries x "
                           f"{TILED_BLOCKS[1]} keys, on 2 threads", (0, *TILED_BLOCKS, 2)))
        for shown, constants in passes:
            with _constants(module, constants):
                outputs = module.forward(**arguments, **dims)
                try:
                    generated = module.backward(**arguments, **{f"grad_{o}": upstream[o] for o in spec.outputs},
                                                **dims)
                except ValueError as why:  # outputs of different batch axes: refused, not computed wrongly
                    if "different batch axes" not in str(why):
                        raise
                    report.notes.append(f"{shown}: the backward pass not run: {why}")
                    generated = None
            for o in spec.outputs:
                report.rows.append(Row(shown, "forward", o, relative_error(outputs[o], reference[o]),
                                       FORWARD_TOLERANCE))
            if generated is None:
                continue
            for name in spec.differentiable:
                report.rows.append(Row(shown, "backward", name, relative_error(generated[name], expected[name]),
                                       BACKWARD_TOLERANCE))
    return report


TILED_BLOCKS = (3, 5)  # query rows x keys per block when verify forces the tiled pass: no size is a multiple
_TILED_CONSTANTS = ("TILED_ABOVE", "BLOCK_Q", "BLOCK_K", "THREADS")


@contextlib.contextmanager
def _constants(module, values):
    """The module's tiled-pass constants set to `values` (None: as they are) while the block runs."""
    if values is None:
        yield
        return
    saved = [getattr(module, name) for name in _TILED_CONSTANTS]
    for name, value in zip(_TILED_CONSTANTS, values):
        setattr(module, name, value)
    try:
        yield
    finally:
        for name, value in zip(_TILED_CONSTANTS, saved):
            setattr(module, name, value)
