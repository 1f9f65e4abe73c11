"""The `symattn` command ends with `os._exit` after `main` (`cli.run`): what a user sees must be
what an ordinary exit gives. Each case runs a fresh interpreter, as a user's shell does, and
compares with what the same command gives in-process or on disk."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO, run_cli



def _run_with_exit_hook(tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess, Path]:
    """`symattn ARGS` through `cli.run`, with an exit handler registered first that writes a file
    (as logging's, multiprocessing's or torch's would flush or reap)."""
    marker = tmp_path / "handler-ran"
    code = ("import atexit, sys\n"
            "marker = sys.argv[1]\n"
            "atexit.register(lambda: open(marker, 'w').write('ran'))\n"
            "sys.argv = ['symattn'] + sys.argv[2:]\n"
            "from symattn.cli import run\n"
            "run()\n")
    done = subprocess.run([sys.executable, "-c", code, str(marker), *args], capture_output=True, text=True,
                          cwd=REPO, timeout=120)
    return done, marker


def test_exit_handlers_run_and_the_status_is_mains(tmp_path):
    done, marker = _run_with_exit_hook(tmp_path, "check", "derivations/self_attention.attn")
    assert done.returncode == 0, done.stderr
    assert marker.read_text() == "ran"

    bad = tmp_path / "bad.attn"
    bad.write_text("attention bad\ndim N = 4\ninput X[N, M]\noutput X\n")
    marker.unlink()
    done, marker = _run_with_exit_hook(tmp_path, "check", str(bad))
    assert done.returncode == 2
    assert f"{bad}:3:" in done.stderr and "error:" in done.stderr and "Traceback" not in done.stderr
    assert marker.read_text() == "ran"


@pytest.mark.slow  # seconds of work: the slow step runs it (the README's command stays under 5 min)
def test_a_document_piped_out_arrives_whole(tmp_path):
    """Everything written to stdout is flushed before the process leaves: the piped document is
    the one `-o` writes to a file, less the figure lines (a pipe has nowhere for the PNGs)."""
    piped = run_cli("derive", "derivations/multi_head.attn", "--format", "html")
    assert piped.returncode == 0, piped.stderr
    written = tmp_path / "multi_head.html"
    to_file = run_cli("derive", "derivations/multi_head.attn", "--format", "html", "-o", str(written))
    assert to_file.returncode == 0, to_file.stderr
    html = written.read_text(encoding="utf-8")
    assert len(piped.stdout) > 20_000 and piped.stdout.rstrip().endswith("</html>")
    assert piped.stdout.count("<math") == html.count("<math") > 0


def test_a_reader_that_leaves_early_is_not_an_error():
    """`symattn derive | head -1`: the reader closes the pipe; the command ends quietly with 141
    or 0 (the document may fit in the pipe's buffer before the reader leaves), never a traceback."""
    done = subprocess.run(f"{sys.executable} -m symattn derive derivations/gqa.attn --document | head -c 10",
                          shell=True, capture_output=True, text=True, cwd=REPO, timeout=120)
    assert done.stdout == "# Derivati"
    assert "Traceback" not in done.stderr and "Exception ignored" not in done.stderr, done.stderr
