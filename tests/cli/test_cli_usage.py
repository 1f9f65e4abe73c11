"""The command line's usage contract: what a SPEC path may be, where -o may point, and what comes back.

Every mistake here is the user's: it must end with exit status 2 and one `symattn CMD: error:` (or
`FILE:LINE:COL: error:`) report on stderr, never a traceback or an "internal error" (exit 3).
The expectations are written by hand from the command line; most cases run `main` in process,
and one of each kind runs a fresh interpreter, as a user's shell does.
"""

from __future__ import annotations

import shutil

import pytest

from conftest import REPO, run_cli
from symattn.cli import main

TINY = "dim N = 2, d = 2\ninput X[N, d]\nparam W[d, d]\nO = X @ W\noutput O\n\ncheck grad(W) == X.T @ grad(O)\n"


def _main(capsys, monkeypatch, *argv: str, cwd=None) -> tuple[int, str, str]:
    """(exit status, stdout, stderr) of `symattn ARGV` in process."""
    if cwd is not None:
        monkeypatch.chdir(cwd)
    capsys.readouterr()
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def _usage_error(code: int, err: str, command: str, message: str) -> None:
    assert code == 2, err
    assert err.startswith(f"symattn {command}: error: ") and message in err, err
    assert "Traceback" not in err and "internal error" not in err


# --- SPEC: a path, `.attn` optional, as for symattn.load -----------------------------------------


def test_a_spec_path_without_its_suffix_is_read(capsys, monkeypatch):
    code, out, err = _main(capsys, monkeypatch, "show", "derivations/self_attention", cwd=REPO)
    assert code == 0 and err == "" and "X" in out and "O" in out


def test_a_missing_spec_is_no_such_file(capsys, monkeypatch, tmp_path):
    code, _, err = _main(capsys, monkeypatch, "show", "mqa", cwd=tmp_path)
    _usage_error(code, err, "show", "mqa: no such file (nor mqa.attn)")
    code, _, err = _main(capsys, monkeypatch, "check", "mqa.attn", cwd=tmp_path)
    _usage_error(code, err, "check", "mqa.attn: no such file")


def test_a_directory_as_spec_is_a_directory(capsys, monkeypatch):
    code, _, err = _main(capsys, monkeypatch, "show", "derivations", cwd=REPO)
    _usage_error(code, err, "show", "derivations: is a directory, not a spec file")


def test_a_missing_spec_in_a_fresh_interpreter(tmp_path):
    run = run_cli("derive", "nope", "-o", str(tmp_path / "nope.md"), cwd=tmp_path)
    _usage_error(run.returncode, run.stderr, "derive", "nope: no such file (nor nope.attn)")
    assert run.stdout == "" and not (tmp_path / "nope.md").exists()


# --- derive -o: the format follows the extension, --format wins ----------------------------------

@pytest.fixture
def tiny(tmp_path):
    path = tmp_path / "tiny.attn"
    path.write_text(TINY, encoding="utf-8")
    return path


@pytest.mark.parametrize("name, starts", [("doc.md", "# Derivation of tiny\n"),
                                          ("doc.markdown", "# Derivation of tiny\n"),
                                          ("doc.html", "<!DOCTYPE html>\n"),
                                          ("DOC.HTM", "<!DOCTYPE html>\n"),
                                          ("doc.tex", "\\documentclass"),
                                          ("doc.txt", "# Derivation of tiny\n"),   # any other: Markdown
                                          ("doc", "# Derivation of tiny\n")])
def test_the_document_format_follows_the_extension(capsys, monkeypatch, tiny, name, starts):
    target = tiny.parent / name
    code, out, err = _main(capsys, monkeypatch, "derive", str(tiny), "-o", str(target))
    assert code == 0 and out == "" and err == ""
    assert target.read_text(encoding="utf-8").startswith(starts)


def test_format_wins_over_the_extension(capsys, monkeypatch, tiny):
    target = tiny.parent / "doc.html"
    code, _, _ = _main(capsys, monkeypatch, "derive", str(tiny), "-o", str(target), "--format", "md")
    assert code == 0 and target.read_text(encoding="utf-8").startswith("# Derivation of tiny\n")


# --- -o that cannot be written: exit 2, before the spec is even read ---------------------------


def test_derive_into_a_directory_is_a_usage_error(capsys, monkeypatch, tiny):
    code, out, err = _main(capsys, monkeypatch, "derive", str(tiny), "-o", str(tiny.parent))
    _usage_error(code, err, "derive", f"{tiny.parent}: is a directory; name the document to write in it")
    assert out == ""


def test_derive_into_a_missing_directory_is_a_usage_error(capsys, monkeypatch, tiny):
    code, _, err = _main(capsys, monkeypatch, "derive", str(tiny), "-o", str(tiny.parent / "no" / "doc.md"))
    _usage_error(code, err, "derive", f"{tiny.parent / 'no'}: no such directory")


@pytest.mark.parametrize("argv", [["derive", "{spec}", "-o", "/dev/full"],
                                  ["emit", "numpy", "{spec}", "-o", "/dev/full"],
                                  ["emit", "torch", "{spec}", "-o", "/dev/full"]])
def test_a_file_that_cannot_be_written_is_a_usage_error(capsys, monkeypatch, tiny, argv):
    # /dev/full takes no bytes (ENOSPC) even for root, whom permissions do not stop.
    if not shutil.os.path.exists("/dev/full"):
        pytest.skip("no /dev/full on this system")
    code, _, err = _main(capsys, monkeypatch, *[a.format(spec=tiny) for a in argv])
    _usage_error(code, err, argv[0], "/dev/full: cannot write: No space left on device")


@pytest.mark.parametrize("target", ["numpy", "torch", "triton"])
def test_emit_into_a_directory_is_a_usage_error(capsys, monkeypatch, tiny, target):
    code, _, err = _main(capsys, monkeypatch, "emit", target, str(tiny), "-o", str(tiny.parent))
    _usage_error(code, err, "emit", f"{tiny.parent}: is a directory; name the .py file to write in it")


def test_emit_cuda_onto_a_file_is_a_usage_error(capsys, monkeypatch, tiny):
    code, _, err = _main(capsys, monkeypatch, "emit", "cuda", str(tiny), "-o", str(tiny))
    _usage_error(code, err, "emit", "is a file; emit cuda writes a directory")


def test_derive_into_a_directory_in_a_fresh_interpreter(tiny):
    run = run_cli("derive", str(tiny), "-o", str(tiny.parent))
    _usage_error(run.returncode, run.stderr, "derive", "is a directory")


# --- spec mistakes: FILE:LINE:COL, the source line, a caret, a hint that says what to write ----

PER_HEAD = """dim N = 4, d = 3, d_k = 2, h = 2
input X[h, N, d]
param W_q[d, d_k], W_k[d, d_k], tau[h]
Q = X @ W_q
K = X @ W_k
S = Q @ K.T * tau
O = softmax(S, axis=-1)
output O
"""


@pytest.mark.parametrize("text, report", [
    (PER_HEAD, ["mh.attn:6:13: error: [h, N, N] * [h]: cannot broadcast N and h",
                "    S = Q @ K.T * tau",
                "                ^",
                "hint: broadcasting lines up the last axes, so tau [h] meets the last axis (N) of [h, N, N]; for one "
                "value per h, give it shape [h, 1, 1] (declare `tau[h, 1, 1]`) or write the definition in index "
                "notation: `S[a, i, j] = ... tau[a]`"]),
    ("dim N = 4, d = 3\ninput X[N, d]\nparam W[d, d_k]\nO = X @ W\noutput O\n",
     ["mh.attn:3:12: error: unknown name 'd_k'",
      "    param W[d, d_k]",
      "               ^~~",
      "hint: a new dim is declared before it is used, e.g. `dim d_k = 4` (any positive size)"]),
    ("dim N = 4, d = 3\ninput X[N, d]\nO = X * 2\n\ncheck grad(X) == 2 * grad(O)\ncheck equivariant(O, X)\n",
     ["mh.attn:3:1: error: a spec needs at least one output",
      "    O = X * 2",
      "    ^",
      "hint: add a line `output O` after this one (O is computed and read by nothing else)"]),
], ids=["per_head_factor", "undeclared_dim", "no_output"])
def test_spec_mistakes_are_located_with_a_hint(capsys, monkeypatch, tmp_path, text, report):
    (tmp_path / "mh.attn").write_text(text, encoding="utf-8")
    code, out, err = _main(capsys, monkeypatch, "check", "mh.attn", cwd=tmp_path)
    assert code == 2 and out == ""
    assert err.splitlines() == report


def test_a_spec_mistake_in_a_fresh_interpreter(tmp_path):
    (tmp_path / "mh.attn").write_text(PER_HEAD, encoding="utf-8")
    run = run_cli("derive", "mh.attn", "-o", "mh.html", cwd=tmp_path)
    assert run.returncode == 2 and run.stdout == "" and "Traceback" not in run.stderr
    assert run.stderr.startswith("mh.attn:6:13: error: [h, N, N] * [h]: cannot broadcast N and h\n")
    assert not (tmp_path / "mh.html").exists()


# --- help: every option says what it does and its default ------------------------------------


def _options():
    import argparse

    from symattn.cli import build_parser

    parser = build_parser()
    (commands,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    for command, sub in commands.choices.items():
        for action in sub._actions:
            if action.option_strings and not isinstance(action, argparse._HelpAction):
                yield pytest.param(command, action, id=f"{command} {action.option_strings[-1]}")


@pytest.mark.parametrize("command, action", list(_options()))
def test_every_option_has_help_with_its_default(command, action):
    assert action.help, f"symattn {command} {action.option_strings[-1]} has no help text"
    if not action.required and action.const is None:  # a flag (store_true) is off unless given
        assert "default" in action.help, f"symattn {command} {action.option_strings[-1]}: {action.help!r}"


def test_verify_help_explains_the_target_and_its_default(capsys):
    with pytest.raises(SystemExit) as done:
        main(["verify", "--help"])
    assert done.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "--target {numpy,torch,cuda,triton}" in text
    assert "which generated code to run" in text and "(default numpy)" in text


# --- check --explain: which rung ran, what it found, for every claim and every gradient ---------


def test_check_explain_shows_each_rung_and_each_gradient(capsys, monkeypatch):
    code, plain, _ = _main(capsys, monkeypatch, "check", "derivations/key_padding.attn", cwd=REPO)
    explained_code, out, err = _main(capsys, monkeypatch, "check", "derivations/key_padding.attn", "--explain")
    assert explained_code == code == 0 and err == ""
    assert out.startswith("How a claim is settled, cheapest first: (1) matrix level")
    # Every line of the plain report is there, in order, with the steps in between.
    lines = out.splitlines()
    rest = iter(lines)
    assert all(any(line == seen for seen in rest) for line in plain.splitlines()), "the plain report, in order"
    assert "      substitute the derived gradient of grad(V): grad(V) -> P.T @ grad(O)" in lines
    assert any(line.startswith("      softmax: P = softmax(S, axis=-1) -> Pi P Pi^T (lemma: ") for line in lines)
    assert "      conclusion: O(Pi X, Pi keep) = Pi O(X, keep)" in lines
    gradients = lines[lines.index("Derived gradients against the element-level chain rule (every entry written "
                                  "out exactly and differentiated with sympy.diff):") + 1:]
    names = [line.split(":")[0].strip() for line in gradients if line.startswith("  grad(")]
    assert names == ["grad(O)", "grad(P)", "grad(S)", "grad(V)", "grad(K)", "grad(Q)", "grad(Mk)", "grad(W_v)",
                     "grad(W_k)", "grad(W_q)", "grad(X)"]
    assert "  grad(V): confirmed: exact identity of every entry at N=4, d=3, d_k=2" in gradients


def test_check_explain_as_json_adds_the_steps(capsys, monkeypatch):
    import json

    code, out, _ = _main(capsys, monkeypatch, "check", "derivations/self_attention.attn", "--json", "--explain",
                         cwd=REPO)
    entries = json.loads(out)
    assert code == 0 and entries and all(entry["steps"] for entry in entries if entry["verdict"] == "proved")
    assert all(len(step) == 3 and all(isinstance(part, str) for part in step)
               for entry in entries for step in entry["steps"])
