"""The Python API's small contracts: verdict truth, unknown tensor names, paths without `.attn`."""

from __future__ import annotations

import pytest

import symattn
from conftest import REPO
from symattn.errors import SpecSyntaxError, SymAttnError, UnknownTensorError, UsageError

SPEC = """dim N = 3, d = 2
input X[N, d]
param W[d, d]
S = X @ W @ X.T
P = softmax(S, axis=-1)
O = P @ X
output O
check grad(X) == grad(X)
check grad(W) == X.T @ grad(O)
check sin(S / 2)^2 == (1 - cos(S)) / 2
"""


# --- bool(verdict) ---------------------------------------------------------------------------


def test_a_verdict_is_true_only_when_proved():
    verdicts = symattn.load(SPEC).check()
    assert [v.verdict for v in verdicts] == ["proved", "refuted", "unknown"]
    assert [bool(v) for v in verdicts] == [v.verdict == "proved" for v in verdicts] == [True, False, False]
    assert not all(verdicts) and any(verdicts)


def test_a_negated_claim_is_true_when_the_negation_is_proved():
    spec = symattn.load(SPEC.replace("check grad(W) == X.T @ grad(O)", "check not grad(W) == X.T @ grad(O)"))
    negated = spec.check()[1]
    assert negated.verdict == "proved" and bool(negated)


def test_an_equivariance_verdict_is_truthy_as_it_holds():
    spec = symattn.load(REPO / "derivations" / "self_attention.attn")
    assert spec.equivariance("O", "X").verdict == "proved"
    assert spec.equivariance("O", "X")
    invariant = spec.equivariance("O", "X", invariant=True)
    assert invariant.verdict != "proved" and not invariant


# --- unknown tensor names --------------------------------------------------------------------


@pytest.mark.parametrize("method", ["shape", "concrete_shape"])
def test_an_unknown_tensor_is_a_symattn_error_naming_the_known_ones(method):
    spec = symattn.load(SPEC, filename="tiny.attn")
    with pytest.raises(UnknownTensorError) as info:
        getattr(spec, method)("Nope")
    err = info.value
    assert isinstance(err, SymAttnError) and isinstance(err, UsageError) and isinstance(err, KeyError)
    assert str(err) == "no tensor named 'Nope' in tiny; its tensors are X, W, S, P, O"
    assert err.name == "Nope" and err.known == tuple(spec.tensors)


def test_equivariance_of_an_unknown_tensor_names_the_known_ones():
    spec = symattn.load(SPEC, filename="tiny.attn")
    with pytest.raises(UnknownTensorError, match=r"no tensor named 'Y' in tiny; its tensors are X, W, S, P, O"):
        spec.equivariance("O", "Y")


# --- load a path without its suffix ---------------------------------------------------------


def test_load_adds_the_attn_suffix_when_that_file_exists(monkeypatch):
    monkeypatch.chdir(REPO)
    bare = symattn.load("derivations/self_attention")
    full = symattn.load(REPO / "derivations" / "self_attention.attn")
    assert bare.filename == "derivations/self_attention.attn"
    assert bare.name == full.name == "self_attention"
    assert bare.typed.source == full.typed.source
    assert {n: bare.shape(n) for n in bare.tensors} == {n: full.shape(n) for n in full.tensors}


def test_a_file_without_suffix_wins_over_adding_one(tmp_path):
    (tmp_path / "plain").write_text("dim N = 2\ninput X[N]\noutput X\n", encoding="utf-8")
    (tmp_path / "plain.attn").write_text("dim N = 2, M = 3\ninput Y[M]\noutput Y\n", encoding="utf-8")
    assert list(symattn.load(str(tmp_path / "plain")).tensors) == ["X"]


def test_a_missing_file_is_no_such_file_not_spec_text(tmp_path):
    with pytest.raises(UsageError, match=r"missing: no such file \(nor .*missing\.attn\)$"):
        symattn.load(str(tmp_path / "missing"))
    with pytest.raises(UsageError, match=r"nope\.attn: no such file$"):
        symattn.load("nope.attn")
    with pytest.raises(UsageError, match=r"nope: no such file"):
        symattn.load("nope")


def test_a_directory_is_a_directory_not_spec_text(tmp_path):
    with pytest.raises(UsageError, match=r"is a directory, not a spec file"):
        symattn.load(str(tmp_path) + "/")


def test_one_line_of_spec_text_is_still_spec_text():
    # A spec has at least two statements, one a line: one line with blanks is read (and reported) as text.
    with pytest.raises(SpecSyntaxError, match=r"^<spec>:1:"):
        symattn.load("input X[N")
