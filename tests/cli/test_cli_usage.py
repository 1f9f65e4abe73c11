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
