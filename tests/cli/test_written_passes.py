"""`symattn derive --backward / --tangent / --order`: the passes written as specs from the command line, as a
user chains them (write, then derive or check the file written)."""

from __future__ import annotations

import pytest

import symattn

from conftest import REPO, run_cli

pytestmark = pytest.mark.slow  # a few seconds of fresh interpreters: the slow step runs them


def test_backward_twice_and_tangent_from_files(tmp_path):
    back = tmp_path / "b.attn"
    result = run_cli("derive", str(REPO / "derivations" / "causal.attn"), "--backward", "-o", str(back))
    assert result.returncode == 0, result.stderr
    spec = symattn.load(back)
    assert spec.outputs == ("grad_X", "grad_W_q", "grad_W_k", "grad_W_v")
    assert "grad_O" in spec.typed.inputs
    twice = run_cli("derive", str(back), "--backward")
    assert twice.returncode == 0, twice.stderr
    assert "attention causal_backward_backward" in twice.stdout
    # grad_X and the like are the first pass's tensors: the second pass names its own and says so, once
    assert twice.stderr.count("note:") == 1 and "grad_X_2" in twice.stderr, twice.stderr
    double = symattn.load(twice.stdout)
    assert "grad_grad_X" in double.typed.inputs and "grad_X_2" in double.outputs
    tangent = run_cli("derive", str(back), "--tangent")
    assert tangent.returncode == 0, tangent.stderr
    hvp = symattn.load(tangent.stdout)
    assert "tangent_grad_X" in hvp.outputs and "tangent_W_q" in hvp.typed.inputs


def test_order_two_is_the_document_of_the_backward_spec():
    result = run_cli("derive", str(REPO / "derivations" / "self_attention.attn"), "--order", "2", "--document")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("# Derivation of self_attention_backward")
    assert "is the upstream gradient of the output grad_X" in result.stdout  # the second order's own upstream


def test_usage_errors_exit_2():
    for args in (("--order", "0"), ("--backward", "--format", "md"), ("--backward", "--tangent")):
        result = run_cli("derive", str(REPO / "derivations" / "self_attention.attn"), *args)
        assert result.returncode == 2, (args, result.stderr)
        assert "Traceback" not in result.stderr and "error" in result.stderr, result.stderr
