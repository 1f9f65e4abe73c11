"""The README stays true: its spec parses, its Python tour works, its commands exist."""

from __future__ import annotations

import re

import symattn
from conftest import REPO, run_cli

README = (REPO / "README.md").read_text("utf-8")


def code_blocks() -> list[str]:
    """The fenced code blocks of the README, in order."""
    blocks, current = [], None
    for line in README.splitlines():
        if line.startswith("```"):
            if current is None:
                current = []
            else:
                blocks.append("\n".join(current) + "\n")
                current = None
        elif current is not None:
            current.append(line)
    return blocks


def test_first_screen_has_the_two_setup_commands():
    first_screen = "\n".join(README.splitlines()[:25])
    assert "pip install -e . && symattn derive" in first_screen
    assert "pip install -e '.[test]' && python -m pytest" in first_screen


def test_ci_runs_the_readme_test_command():
    ci = (REPO / ".ci" / "run").read_text("utf-8")
    assert "python -m pip install -e '.[test]'" in ci
    assert re.search(r"^python -m pytest$", ci, re.M)


def test_ci_then_runs_the_slow_step_the_readme_names():
    ci = (REPO / ".ci" / "run").read_text("utf-8")
    assert ci.index("\npython -m pytest\n") < ci.index("python -m pytest -m slow")
    assert "`python -m pytest -m slow`" in README


def test_readme_spec_parses_with_the_stated_shapes():
    (spec_text,) = [b for b in code_blocks() if b.lstrip().startswith("# Scaled dot-product")]
    spec = symattn.load(spec_text, filename="readme.attn")
    assert spec.name == "self_attention"
    assert spec.shape("P") == "[N, N]"  # the comment in the README block
    assert [c.kind for c in spec.checks] == ["equal", "equivariant"]


def test_readme_python_tour(monkeypatch):
    monkeypatch.chdir(REPO)
    spec = symattn.load("derivations/self_attention")
    assert spec.filename == "derivations/self_attention.attn"
    assert spec.shape("P") == "[N, N]"
    assert 'symattn.load("derivations/self_attention")' in README
    assert spec.with_dims(N=8).concrete_shape("P") == (8, 8)
    assert spec.show().startswith("attention self_attention")


def test_readme_error_example_is_what_the_cli_prints(tmp_path):
    (block,) = [b for b in code_blocks() if "error:" in b]
    head = block.splitlines()[0]
    m = re.match(r"bad\.attn:(\d+):(\d+): error: (.*)$", head)
    assert m
    # Build a spec whose line m[1] is the README's source line, and compare.
    line = int(m[1])
    source_line = block.splitlines()[1][4:]
    prefix = ["dim N = 4, d = 3, e = 2", "input X[N, d], Y[e, d]"] + ["#"] * (line - 3)
    path = tmp_path / "bad.attn"
    path.write_text("\n".join(prefix + [source_line, "output Z"]) + "\n", encoding="utf-8")
    result = run_cli("show", "bad.attn", cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr.splitlines()[:3] == block.splitlines()[:3]


def test_commands_in_the_readme_exist():
    result = run_cli("--help")
    for command in re.findall(r"^\| `symattn (\w+)", README, re.M):
        assert command in result.stdout, command


def test_relative_links_resolve_in_a_clone():
    """Every relative Markdown link in the README and docs/ names a file or folder of this repository."""
    pages = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
    checked = 0
    for page in pages:
        for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text("utf-8")):
            if re.match(r"[a-z]+:", target) or target.startswith("#"):
                continue
            path = (page.parent / target.split("#")[0]).resolve()
            assert path.exists() and path.is_relative_to(REPO), f"{page.name}: {target}"
            checked += 1
    assert checked >= 3  # derivations/, docs/language.md, BENCHMARKS.md at least
    assert "../shared" not in README
