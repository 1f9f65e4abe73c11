"""The backward and tangent passes written as specs (`derive --backward`, `--tangent`): every derivations/
spec's written passes parse back, and their values equal central differences in float64 of the spec they
were written from (the reference evaluator's forward, which knows nothing of the derived formulas):

- the tangent spec's tangent_O against (O(x + h v) - O(x - h v)) / 2h, along random tangents v of every
  input and param;
- the backward spec's <grad_X, v>, summed over inputs and params, against the directional derivative of
  L = sum of <O, grad(O)>;
- the Hessian-vector product (the tangent spec of the backward spec) against central differences of the
  backward spec's gradients;
- the double backward (the backward spec of the backward spec) against the directional derivative of
  L2 = sum of <grad_X, grad(grad_X)>.
"""

from __future__ import annotations

import numpy as np
import pytest

import symattn
from symattn.symbolic.evaluate import NUMERIC, Evaluator, random_leaves
from symattn.symbolic.passes import backward_spec, tangent_spec

from conftest import EXAMPLES

STEP = 1e-5


def _load(text: str):
    return symattn.load(text).typed


def _forward(spec, leaves):
    return Evaluator(spec, NUMERIC).run(leaves)


def _moved(leaves, tangents, h):
    return {n: (v + h * tangents[n] if n in tangents else v) for n, v in leaves.items()}


def _directional(spec, leaves, tangents, names):
    """(f(x + h v) - f(x - h v)) / 2h for each tensor in `names`, by the reference evaluator."""
    plus, minus = _forward(spec, _moved(leaves, tangents, STEP)), _forward(spec, _moved(leaves, tangents, -STEP))
    return {n: (plus[n] - minus[n]) / (2 * STEP) for n in names}


def _close(got, want, tol=1e-6):
    got, want = np.asarray(got, dtype=float), np.asarray(want, dtype=float)
    finite = np.isfinite(want)
    scale = max(float(np.max(np.abs(want[finite]), initial=0.0)), 1.0)
    assert np.array_equal(np.isfinite(got), finite) or not finite.all(), (got, want)
    err = float(np.max(np.abs(got[finite] - want[finite]), initial=0.0)) / scale
    assert err < tol, f"relative error {err:.2e}\ngot  {got}\nwant {want}"


def _point(spec, rng):
    leaves = random_leaves(spec, rng)
    tangents = {n: rng.standard_normal(np.shape(leaves[n])) for n in spec.differentiable}
    return leaves, tangents


def _finite_outputs(spec, leaves):
    """Whether every output is finite at this point (a fully masked row's -inf logsumexp does not move)."""
    values = _forward(spec, leaves)
    return all(np.all(np.isfinite(values[o])) for o in spec.outputs)


@pytest.fixture(scope="module")
def written():
    cache = {}

    def passes(path):
        if path not in cache:
            spec = symattn.load(path)
            back = symattn.load(backward_spec(spec.typed, spec.derive()).text)
            cache[path] = (spec.typed, back)
        return cache[path]
    return passes


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_tangent_spec_equals_central_differences(path, written):
    spec, _ = written(path)
    tangent = _load(tangent_spec(spec).text)
    rng = np.random.default_rng(7)
    leaves, tangents = _point(spec, rng)
    want = _directional(spec, leaves, tangents, spec.outputs)
    got = _forward(tangent, {**leaves, **{f"tangent_{n}": v for n, v in tangents.items()}})
    for o in spec.outputs:
        np.testing.assert_array_equal(got[o], _forward(spec, leaves)[o])  # the primal rides along unchanged
        _close(got[f"tangent_{o}"], want[o])


def _loss_direction(spec, leaves, tangents, upstream):
    """d/dh of L(x + h v) by central differences, L = sum of <O, grad(O)> over outputs whose value is finite."""
    base = _forward(spec, leaves)
    counted = {o: np.isfinite(base[o]) for o in spec.outputs}
    moved = _directional(spec, leaves, tangents, spec.outputs)
    return sum(float(np.sum(np.where(counted[o], moved[o] * upstream[o], 0.0))) for o in spec.outputs)


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_backward_spec_equals_central_differences(path, written):
    spec, back = written(path)
    back = back.typed
    rng = np.random.default_rng(11)
    leaves, tangents = _point(spec, rng)
    upstream = {o: rng.standard_normal(spec.concrete_shape(spec.tensors[o].shape)) for o in spec.outputs}
    values = _forward(back, {**leaves, **{f"grad_{o}": v for o, v in upstream.items()}})
    got = sum(float(np.sum(values[f"grad_{n}"] * tangents[n])) for n in spec.differentiable)
    want = _loss_direction(spec, leaves, tangents, upstream)
    _close(got, want)


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_hessian_vector_product_equals_central_differences_of_the_gradient(path, written):
    spec, back = written(path)
    back = back.typed
    hvp = _load(tangent_spec(back).text)
    rng = np.random.default_rng(13)
    leaves, tangents = _point(back, rng)
    # upstream gradients have tangent 0: the HVP of L along the tangents of the inputs and params
    for o in spec.outputs:
        tangents[f"grad_{o}"] = np.zeros_like(leaves[f"grad_{o}"])
    outputs = [f"grad_{n}" for n in spec.differentiable]
    want = _directional(back, leaves, tangents, outputs)
    got = _forward(hvp, {**leaves, **{f"tangent_{n}": v for n, v in tangents.items()}})
    for name in outputs:
        _close(got[f"tangent_{name}"], want[name], tol=1e-5)


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_double_backward_equals_central_differences(path, written):
    spec, written_back = written(path)
    back = written_back.typed
    double = _load(backward_spec(back, written_back.derive()).text)
    rng = np.random.default_rng(17)
    leaves, tangents = _point(back, rng)
    upstream = {o: rng.standard_normal(back.concrete_shape(back.tensors[o].shape)) for o in back.outputs}
    names = {n: double.outputs[k] for k, n in enumerate(back.differentiable)}
    values = _forward(double, {**leaves, **{f"grad_{o}": v for o, v in upstream.items()}})
    got = sum(float(np.sum(values[names[n]] * tangents[n])) for n in back.differentiable)
    want = _loss_direction(back, leaves, tangents, upstream)
    _close(got, want, tol=1e-5)
