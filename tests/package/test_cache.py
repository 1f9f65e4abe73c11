"""The cache on disk (symattn.cache): a hit is what would be computed, byte for byte (the
committed documents in derivations/ are the reference, or without matplotlib, whose figures they
link, the same document computed with the cache off); other text, other sizes or other code
miss; a damaged file is recomputed, never trusted; a result that depended on the clock (a time
budget ran out) is not stored; SYMATTN_NO_CACHE=1 turns it off.

conftest.py turns the cache off for every other test; these turn it on in a directory of their own.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
import subprocess
import sys
from pathlib import Path

import pytest

import symattn
from conftest import REPO, run_cli
from symattn import budget, cache
from symattn.docs import document
from symattn.docs import figures as figure_module
from symattn.prove import claims

ROOT = REPO
SPEC = ROOT / "derivations" / "sigmoid.attn"
NAME = "derivations/sigmoid.attn"


@dataclass
class Reference:
    markdown: str
    html: str
    figures: dict[str, bytes]


@pytest.fixture(scope="module")
def reference() -> Reference:
    """What the document of sigmoid.attn is, to compare what the cache gives back with. Where
    matplotlib draws figures: the committed files in derivations/ (`python -m symattn.regenerate`
    writes them). Without matplotlib those do not apply (they link the figures), and the reference
    is the document computed here with the cache off (conftest turns it off; module fixtures come
    before `store`): a hit must be what would be computed, byte for byte."""
    if figure_module.available():
        return Reference((ROOT / "derivations" / "sigmoid.md").read_text(encoding="utf-8"),
                         (ROOT / "derivations" / "sigmoid.html").read_text(encoding="utf-8"),
                         {p.name: p.read_bytes() for p in (ROOT / "derivations").glob("sigmoid-*.png")})
    assert os.environ.get("SYMATTN_NO_CACHE") == "1"
    markdown, figures = fresh().document_with_figures("md")
    return Reference(markdown, fresh().document("html"), figures)


def fresh(text: str | None = None) -> symattn.Spec:
    """A new Spec, as a new process would make it (nothing remembered in memory)."""
    return symattn.load(SPEC if text is None else text, filename=NAME)


@pytest.fixture
def store(tmp_path, monkeypatch) -> Path:
    directory = tmp_path / "cache"
    monkeypatch.delenv("SYMATTN_NO_CACHE", raising=False)
    monkeypatch.setenv("SYMATTN_CACHE_DIR", str(directory))
    return directory


@pytest.fixture
def builds(monkeypatch) -> list[str]:
    """The names of the specs whose documents were built (not read back)."""
    calls: list[str] = []
    original = document._build
    monkeypatch.setattr(document, "_build", lambda spec, *rest: calls.append(spec.name) or original(spec, *rest))
    return calls


def files(directory: Path, kind: str) -> list[Path]:
    return sorted(directory.glob(f"{kind}-*.pickle")) if directory.is_dir() else []


def test_a_hit_is_the_committed_document_and_builds_nothing(store, builds, reference):
    assert fresh().document("md") == reference.markdown
    assert builds == ["sigmoid"] and len(files(store, "document")) == 1
    assert fresh().document("md") == reference.markdown, "read back"
    assert fresh().document("html") == reference.html, "one stored document serves every format"
    markdown, figures = fresh().document_with_figures("md")
    assert figures == reference.figures
    assert builds == ["sigmoid"], "every later document was read back"


def test_other_spec_text_or_sizes_miss(store, builds, reference):
    source = SPEC.read_text(encoding="utf-8")
    assert fresh().document("md") == reference.markdown
    edited = source + "# one more comment\n"
    text = fresh(edited).document("md")
    assert builds == ["sigmoid", "sigmoid"], "other text is another key"
    # The spec is quoted in the document; nothing else changes.
    assert text == reference.markdown.replace(source.rstrip("\n"), edited.rstrip("\n"))
    verdicts = fresh().check()
    stored = len(files(store, "verdicts"))   # the verdicts of both documents
    smaller = fresh().with_dims(N=3).check()
    assert len(files(store, "verdicts")) == stored + 1, "other sizes are another key"
    assert [v.claim for v in smaller] == [v.claim for v in verdicts]


@pytest.mark.parametrize("damage", ["truncated", "one byte changed", "not a cache file", "empty"])
def test_a_damaged_file_is_recomputed_and_replaced(store, builds, damage, reference):
    assert fresh().document("md") == reference.markdown
    (path,) = files(store, "document")
    data = path.read_bytes()
    damaged = {"truncated": data[: len(data) // 2],
               "one byte changed": data[:-100] + bytes([data[-100] ^ 1]) + data[-99:],
               "not a cache file": b"\x80\x04garbage" * 10,
               "empty": b""}[damage]
    path.write_bytes(damaged)
    assert fresh().document("md") == reference.markdown
    assert builds == ["sigmoid", "sigmoid"], "the damaged file was not used"
    assert path.read_bytes() == data, "and was written again"
    assert fresh().document("md") == reference.markdown and len(builds) == 2


def test_verdicts_and_gradient_checks_are_read_back(store, monkeypatch):
    spec = fresh()
    verdicts = [v.to_json() for v in spec.check()]
    checks = [(c.tensor, c.ok, c.method) for c in spec.verify_gradients()]
    assert [v["verdict"] for v in verdicts] == ["proved", "proved", "proved"]
    assert files(store, "verdicts") and files(store, "gradient-checks")

    def fail(*args, **kwargs):
        raise AssertionError("computed again")

    monkeypatch.setattr(claims, "check_spec", fail)
    monkeypatch.setattr(claims, "verify_gradients", fail)
    again = fresh()
    assert [v.to_json() for v in again.check()] == verdicts
    assert [(c.tensor, c.ok, c.method) for c in again.verify_gradients()] == checks


def test_nothing_is_stored_when_a_budget_ran_out(store):
    before = budget.runs_out()
    spec = fresh()
    verdicts = spec.check(budget=1e-6)
    assert budget.runs_out() > before, "a microsecond is not enough for any claim"
    assert any(v.verdict == "unknown" for v in verdicts)
    assert files(store, "verdicts") == [], "a verdict that depended on the clock was stored"
    spec.check()   # the same Spec, given time: it may reuse what ran out of time, so still not stored
    assert files(store, "verdicts") == []
    assert [v.verdict for v in fresh().check()] == ["proved", "proved", "proved"]
    assert len(files(store, "verdicts")) == 1, "a new Spec computed all of it in time: stored"


def test_no_cache_turns_it_off(store, builds, monkeypatch, reference):
    monkeypatch.setenv("SYMATTN_NO_CACHE", "1")
    assert fresh().document("md") == reference.markdown
    assert fresh().document("md") == reference.markdown
    assert builds == ["sigmoid", "sigmoid"]
    assert not store.exists(), "nothing written"


def test_a_cache_directory_that_cannot_be_made_is_ignored(tmp_path, monkeypatch, builds):
    blocker = tmp_path / "a file"
    blocker.write_text("not a directory")
    monkeypatch.delenv("SYMATTN_NO_CACHE", raising=False)
    monkeypatch.setenv("SYMATTN_CACHE_DIR", str(blocker / "cache"))
    assert [v.verdict for v in fresh().check()] == ["proved", "proved", "proved"]


def test_the_cache_directory_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.delenv("SYMATTN_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache.directory() == tmp_path / "xdg" / "symattn"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache.directory() == tmp_path / "home" / ".cache" / "symattn"
    monkeypatch.setenv("SYMATTN_CACHE_DIR", str(tmp_path / "mine"))
    assert cache.directory() == tmp_path / "mine"
    for value, on in [("", True), ("0", True), ("1", False), ("yes", False)]:
        monkeypatch.setenv("SYMATTN_NO_CACHE", value)
        assert cache.enabled() is on, value


@pytest.mark.slow  # seconds of work: the slow step runs it (the README's command stays under 5 min)
def test_a_change_to_any_source_file_is_another_fingerprint(tmp_path):
    """The key covers symattn's own code: a copy with one comment added to the prover keys apart."""
    copy = tmp_path / "copy"
    shutil.copytree(ROOT / "symattn", copy / "symattn", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(ROOT / "grammar", copy / "grammar")

    def fingerprint() -> str:
        env = dict(os.environ, PYTHONPATH=str(copy))
        code = ("import sys; from symattn import cache; "
                "assert cache.__file__.startswith(sys.argv[1]), cache.__file__; print(cache.fingerprint())")
        return subprocess.run([sys.executable, "-c", code, str(copy)], env=env, cwd=copy, capture_output=True,
                              text=True, check=True).stdout.strip()

    first = fingerprint()
    assert len(first) == 64 and fingerprint() == first, "the same code, the same fingerprint"
    with open(copy / "symattn" / "prove" / "claims.py", "a", encoding="utf-8") as out:
        out.write("# a change\n")
    assert fingerprint() != first
    (copy / "symattn" / "prove" / "claims.py").write_text(
        (ROOT / "symattn" / "prove" / "claims.py").read_text(encoding="utf-8"), encoding="utf-8")
    assert fingerprint() == first
    with open(copy / "grammar" / "attention.lark", "a", encoding="utf-8") as out:
        out.write("// a change\n")
    assert fingerprint() != first


def test_the_command_twice_reads_back_and_stays_quiet_when_piped(store, tmp_path, reference):
    """`symattn derive` in fresh interpreters, stderr piped: no progress, no noise; the second run
    reads the document and figures the first stored, and writes the committed files."""
    for attempt in ("cold", "warm"):
        target = tmp_path / attempt / "sigmoid.md"
        target.parent.mkdir()
        result = run_cli("derive", NAME, "-o", str(target))
        assert result.returncode == 0 and result.stdout == "" and result.stderr == "", (attempt, result.stderr)
        assert target.read_text(encoding="utf-8") == reference.markdown, attempt
        assert {p.name: p.read_bytes() for p in target.parent.glob("sigmoid-*.png")} == reference.figures, attempt
        assert len(files(store, "document")) == 1


def test_the_oldest_files_go_past_the_limit(store, monkeypatch):
    monkeypatch.setattr(cache, "LIMIT", 2)
    for k in range(4):
        before = set(files(store, "test"))
        cache.remembered("test", (k,), lambda: k, keep=lambda: True)
        (new,) = set(files(store, "test")) - before
        os.utime(new, (1_000_000 + 10 * k, 1_000_000 + 10 * k))  # distinct times, in the order written
    assert len(files(store, "test")) == 2
    assert cache.remembered("test", (3,), lambda: "computed", keep=lambda: True) == 3, "the newest stays"
    assert cache.remembered("test", (0,), lambda: "computed", keep=lambda: True) == "computed", "the oldest went"


BAD = "attention bad\ndim N = 4\ninput X[N, N]\nY = X @ @ X\noutput Y\n"


def test_the_parser_tables_are_kept_and_a_damaged_file_is_rebuilt(store, tmp_path, monkeypatch):
    """Lark's analysed grammar is kept in the cache directory: parse errors read the same from
    tables built, read back, or rebuilt from a damaged file, and say nothing else."""
    spec = tmp_path / "bad.attn"
    spec.write_text(BAD, encoding="utf-8")
    monkeypatch.setenv("SYMATTN_NO_CACHE", "1")
    reference = run_cli("check", str(spec))
    assert reference.returncode == 2 and "bad.attn:4:" in reference.stderr and "^" in reference.stderr
    assert not store.exists()
    monkeypatch.delenv("SYMATTN_NO_CACHE")
    for attempt in ("built", "read back", "damaged"):
        if attempt == "damaged":
            tables = (store / "parser.lark").read_bytes()
            damaged = tables[: len(tables) // 3]
            (store / "parser.lark").write_bytes(damaged)
        result = run_cli("check", str(spec))
        assert (result.returncode, result.stdout, result.stderr) == \
            (reference.returncode, reference.stdout, reference.stderr), attempt
        assert (store / "parser.lark").is_file(), attempt
    assert (store / "parser.lark").read_bytes() != damaged, "written again"
