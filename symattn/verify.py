"""Check generated code against the reference evaluator: `symattn verify SPEC --target numpy`.

Contract: `verify_numpy(spec)` generates the NumPy module, runs it in float64
on random inputs in several configurations (the default sizes, every dim
doubled, a leading batch axis on the inputs, and batch axes on inputs and params that
broadcast against each other) and returns a `Report` with one `Row` per
configuration and tensor: the forward outputs against the plain reference
evaluator (`Evaluator` with the NUMERIC backend, run on each batch element on
its own, so the batch semantics are checked too), and the gradient of every
input and param against central finite differences of that reference forward
pass. The error of a tensor is its max relative error,
`max |generated - reference| / max(max |reference|, 1e-3)`; a row fails past
its tolerance. Nothing here trusts the code under test.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable

from . import progress
from . import typed as t

# NumPy and the evaluator are imported where they are used: the command line imports this module to
# dispatch `symattn verify`, and every other command should not pay for NumPy's import.
if TYPE_CHECKING:
    import numpy as np

__all__ = ["Row", "Report", "verify_numpy", "reference_forward", "finite_difference_gradients",
           "relative_error", "FORWARD_TOLERANCE", "BACKWARD_TOLERANCE"]

FORWARD_TOLERANCE = 1e-9  # float64 against float64, the same formulas in another order
BACKWARD_TOLERANCE = 1e-6  # against central differences, step 1e-5: truncation and rounding both ~1e-10
STEP = 1e-5


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

    @property
    def ok(self) -> bool:
        return all(r.ok for r in self.rows)

    def lines(self) -> list[str]:
        out = []
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


def relative_error(got, want) -> float:
    import numpy as np

    got, want = np.asarray(got, dtype=np.float64), np.asarray(want, dtype=np.float64)
    if got.shape != want.shape:
        return float("inf")
    if got.size == 0:
        return 0.0
    if np.isnan(got).any() or np.isnan(want).any():
        return 0.0 if np.array_equal(np.isnan(got), np.isnan(want)) and np.allclose(
            np.nan_to_num(got), np.nan_to_num(want)) else float("nan")
    return float(np.max(np.abs(got - want)) / max(float(np.max(np.abs(want))), 1e-3))


def _sum_to(array: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    lead = array.ndim - len(shape)
    array = array.sum(axis=tuple(range(lead))) if lead else array
    axes = tuple(k for k, n in enumerate(shape) if n == 1 and array.shape[k] != 1)
    return array.sum(axis=axes, keepdims=True) if axes else array


def _instances(spec: t.TypedSpec, leaves: dict[str, np.ndarray], sizes: dict[str, int]):
    """(batch shape, function index -> the unbatched leaves of that batch element)."""
    import numpy as np

    ranks = {n: len(spec.tensors[n].shape) for n in spec.leaves}
    batch = np.broadcast_shapes(*(leaves[n].shape[: leaves[n].ndim - ranks[n]] for n in spec.leaves))
    full = {n: np.broadcast_to(leaves[n], batch + leaves[n].shape[leaves[n].ndim - ranks[n]:]) for n in spec.leaves}
    return batch, lambda idx: {n: np.array(full[n][idx], dtype=np.float64) for n in spec.leaves}


def reference_forward(spec: t.TypedSpec, leaves: dict[str, np.ndarray], sizes: dict[str, int]) -> dict:
    """Every output by the reference evaluator, one batch element at a time."""
    import numpy as np

    from .evaluate import NUMERIC, Evaluator

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
    """dL/dT for every leaf by central differences of the reference forward, L = sum of <O, grad(O)>."""
    import numpy as np

    from .evaluate import NUMERIC, Evaluator

    batch, instance = _instances(spec, leaves, sizes)
    ranks = {n: len(spec.tensors[n].shape) for n in spec.leaves}
    grads = {n: np.zeros(batch + leaves[n].shape[leaves[n].ndim - ranks[n]:]) for n in spec.leaves}
    for idx in itertools.product(*(range(n) for n in batch)):
        base = instance(idx)
        weights = {o: np.broadcast_to(upstream[o], batch + upstream[o].shape[upstream[o].ndim
                                      - len(spec.tensors[o].shape):])[idx] for o in spec.outputs}

        def loss(values: dict[str, np.ndarray]) -> float:
            result = Evaluator(spec, NUMERIC, sizes).run(values)
            return float(sum(np.sum(result[o] * weights[o]) for o in spec.outputs))

        for name in spec.leaves:
            array = base[name]
            for position in np.ndindex(array.shape):
                saved = array[position]
                array[position] = saved + step
                plus = loss(base)
                array[position] = saved - step
                minus = loss(base)
                array[position] = saved
                grads[name][idx + position] = (plus - minus) / (2 * step)
    return {n: _sum_to(grads[n], leaves[n].shape) for n in spec.leaves}


def _configs(spec: t.TypedSpec) -> list[tuple[str, dict[str, int], Callable]]:
    defaults = dict(spec.sizes)
    larger = {name: 2 * size for name, size in defaults.items()}  # doubling keeps split_heads divisible
    inputs = set(spec.inputs)

    def none(name):
        return ()

    def inputs_only(name):
        return (2,) if name in inputs else ()

    def broadcast(name):
        return (2, 3) if name in inputs else (3,)

    def show(sizes):
        return ", ".join(f"{k}={v}" for k, v in sizes.items())

    return [
        (f"default sizes ({show(defaults)})", defaults, none),
        (f"larger sizes ({show(larger)})", larger, none),
        ("batch axis [2] on the inputs", defaults, inputs_only),
        ("batch axes [2, 3] on the inputs, [3] on the params", defaults, broadcast),
    ]


def verify_numpy(spec: t.TypedSpec, seed: int = 0, module=None) -> Report:
    """Run the generated NumPy module against the reference evaluator and finite differences."""
    import numpy as np

    from .codegen_numpy import load_module, numpy_source, size_keywords
    from .evaluate import random_leaves

    module = module or load_module(numpy_source(spec), f"symattn_verify_{spec.name}")
    report = Report(spec.name)
    rng = np.random.default_rng(seed)
    keywords = size_keywords(spec)  # dims no input's shape has: passed to the module by name
    configs = _configs(spec)
    for number, (title, sizes, batch_of) in enumerate(configs):
        progress.step(title, number, len(configs))
        dims = {name: sizes[name] for name in keywords}
        leaves = {}
        for name in spec.leaves:
            one = random_leaves(spec, rng, batch_of(name), sizes)[name]
            leaves[name] = one
        reference = reference_forward(spec, leaves, sizes)
        outputs = module.forward(**leaves, **dims)
        for o in spec.outputs:
            report.rows.append(Row(title, "forward", o, relative_error(outputs[o], reference[o]), FORWARD_TOLERANCE))
        upstream = {o: rng.standard_normal(np.shape(reference[o])) for o in spec.outputs}
        generated = module.backward(**leaves, **{f"grad_{o}": upstream[o] for o in spec.outputs}, **dims)
        expected = finite_difference_gradients(spec, leaves, upstream, sizes)
        for name in spec.leaves:
            report.rows.append(Row(title, "backward", name, relative_error(generated[name], expected[name]),
                                   BACKWARD_TOLERANCE))
    return report


def verify_command(args) -> int:
    """`symattn verify SPEC --target numpy`: exit 0 when every tensor is within tolerance, 1 otherwise."""
    from .cli import _load  # the command line's own loading rules (--dim, '-' for stdin)
    from .errors import SymAttnError

    spec = _load(args)
    if args.target != "numpy":
        raise SymAttnError(f"verify --target {args.target}: CUDA code generation is not implemented yet")
    report = verify_numpy(spec.typed, seed=args.seed)
    print(f"verify {spec.name} ({spec.filename}), generated NumPy code against the reference evaluator "
          "(forward) and central finite differences of it (backward), float64")
    print("\n".join(report.lines()))
    return 0 if report.ok else 1
