"""The NumPy module's `jvp` and `hvp` (`emit numpy --jvp`): the tangents against central differences of the
reference evaluator's forward (which knows nothing of the derived formulas), the Hessian-vector products
against central differences of the module's derived gradient, as the issue asks; masked and bucketed specs
included, and the keywords a user passes."""

from __future__ import annotations

import numpy as np
import pytest

import symattn
from symattn.symbolic.evaluate import NUMERIC, Evaluator, random_leaves

from conftest import REPO, run_cli

SPECS = ["self_attention", "causal", "key_padding", "t5_buckets", "gqa", "lse_output"]
H = 1e-6


@pytest.mark.parametrize("name", SPECS)
def test_jvp_and_hvp_against_central_differences(name):
    spec = symattn.load(REPO / "derivations" / f"{name}.attn")
    module = spec.numpy(jvp=True)
    rng = np.random.default_rng(2)
    leaves = random_leaves(spec.typed, rng)
    tangents = {x: rng.standard_normal(np.shape(leaves[x])) for x in spec.typed.differentiable}
    moved = {s: {n: v + s * H * tangents[n] if n in tangents else v for n, v in leaves.items()} for s in (1, -1)}
    outputs, got = module.jvp(**leaves, **{f"tangent_{x}": v for x, v in tangents.items()})
    reference = {s: Evaluator(spec.typed, NUMERIC).run(moved[s]) for s in (1, -1)}
    for o in spec.outputs:
        np.testing.assert_allclose(outputs[o], module.forward(**leaves)[o], rtol=1e-12, atol=1e-12)
        want = (reference[1][o] - reference[-1][o]) / (2 * H)
        finite = np.isfinite(want)
        np.testing.assert_allclose(got[o][finite], want[finite], rtol=1e-5, atol=1e-6)
    upstream = {f"grad_{o}": rng.standard_normal(np.shape(outputs[o])) for o in spec.outputs}
    hvp = module.hvp(**leaves, **upstream, **{f"tangent_{x}": v for x, v in tangents.items()})
    plus, minus = (module.backward(**moved[s], **upstream) for s in (1, -1))
    for x in spec.typed.differentiable:
        np.testing.assert_allclose(hvp[x], (plus[x] - minus[x]) / (2 * H), rtol=1e-5, atol=1e-6)


def test_a_tangent_not_given_is_zero():
    spec = symattn.load(REPO / "derivations" / "self_attention.attn")
    module = spec.numpy(jvp=True)
    leaves = random_leaves(spec.typed, np.random.default_rng(4))
    tx = np.random.default_rng(5).standard_normal(leaves["X"].shape)
    _, only_x = module.jvp(**leaves, tangent_X=tx)
    zeros = {f"tangent_{n}": np.zeros_like(leaves[n]) for n in ("W_q", "W_k", "W_v")}
    _, explicit = module.jvp(**leaves, tangent_X=tx, **zeros)
    np.testing.assert_array_equal(only_x["O"], explicit["O"])


@pytest.mark.slow  # three fresh interpreters
def test_emit_jvp_from_the_command_line(tmp_path):
    out = tmp_path / "m.py"
    result = run_cli("emit", "numpy", str(REPO / "derivations" / "causal.attn"), "--jvp", "-o", str(out))
    assert result.returncode == 0, result.stderr
    assert "jvp and hvp" in result.stdout and "def jvp(" in out.read_text() and "import torch" not in out.read_text()
    wrong = run_cli("emit", "torch", str(REPO / "derivations" / "causal.attn"), "--jvp", "-o", str(out))
    assert wrong.returncode == 2 and "--jvp is for `emit numpy`" in wrong.stderr and "Traceback" not in wrong.stderr
    dropout = run_cli("emit", "numpy", str(REPO / "derivations" / "attention_dropout.attn"), "--jvp", "-o", str(out))
    assert dropout.returncode == 2 and "dropout" in dropout.stderr and "Traceback" not in dropout.stderr
