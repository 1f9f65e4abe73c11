"""Every example spec in derivations/ parses, validates, and has the shapes its text states.

The expectations come from the spec text itself, read here with plain regular
expressions, never from symattn: the shapes written in declarations
(`input X[N, d]`), in explicit index ranges (`M[i:N, j:N]`) and in comments
(`Q = X @ W_q   # [h, N, d_k]`), and the default sizes in `dim` lines.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field
from pathlib import Path

import pytest

import symattn
from conftest import EXAMPLES, run_cli, run_main

NAME = r"[A-Za-z_][A-Za-z0-9_]*"
BRACKET = r"\[[^\]]*\]"


def squash(text: str) -> str:
    """Shape text with all whitespace removed: `[h * d_k, d]` -> `[h*d_k,d]`."""
    return "".join(text.split())


def split_top(text: str) -> list[str]:
    """Split at commas that are not inside brackets."""
    parts, depth, start = [], 0, 0
    for k, ch in enumerate(text):
        depth += ch in "[("
        depth -= ch in ")]"
        if ch == "," and depth == 0:
            parts.append(text[start:k])
            start = k + 1
    parts.append(text[start:])
    return [p.strip() for p in parts if p.strip()]


@dataclass
class Facts:
    """What a spec's text says, read without symattn."""

    dims: dict[str, int] = field(default_factory=dict)
    kinds: dict[str, str] = field(default_factory=dict)       # name -> input | param | buffer | intermediate
    lines: dict[str, int] = field(default_factory=dict)       # name -> line of its declaration
    shapes: dict[str, str] = field(default_factory=dict)      # name -> shape stated in the text
    outputs: list[str] = field(default_factory=list)
    masks: set[str] = field(default_factory=set)              # the buffers `D = dropout(x, p)` declares
    checks: int = 0
    comment_shapes: list[tuple[int, str, str]] = field(default_factory=list)  # (line, name, shape)


DEF_LINE = re.compile(rf"^({NAME})\s*({BRACKET})?\s*=(?!=)([^#]*)(#.*)?$")
COMMENT_SHAPE = re.compile(rf"#\s*({BRACKET})(?:\s*@\s*({BRACKET}))?")


def read_facts(path: Path) -> Facts:
    facts = Facts()
    depth = 0  # open parentheses: a statement continues on the next line until they close
    for number, raw in enumerate(path.read_text("utf-8").splitlines(), start=1):
        code = raw.split("#", 1)[0].strip()
        if not code:
            continue
        continued, depth = depth > 0, depth + code.count("(") - code.count(")")
        if continued:
            continue
        keyword = code.split()[0]
        rest = code[len(keyword):].strip()
        if keyword == "dim":
            for item in split_top(rest):
                name, size = (s.strip() for s in item.split("="))
                facts.dims[name] = int(size)
        elif keyword in ("input", "param", "buffer"):
            for item in split_top(rest):
                m = re.fullmatch(rf"({NAME})\s*({BRACKET})?(?:\s+in\s+[^:]+:.+)?", item)  # `doc[N] in 0:D`
                assert m, f"{path.name}:{number}: cannot read declaration {item!r}"
                facts.kinds[m[1]] = keyword
                facts.lines[m[1]] = number
                facts.shapes[m[1]] = m[2] or "[]"
        elif keyword == "output":
            facts.outputs += split_top(rest)
        elif keyword == "check":
            facts.checks += 1
        elif keyword != "attention":
            m = DEF_LINE.match(raw.strip())
            assert m, f"{path.name}:{number}: cannot read definition {raw!r}"
            name, indices, comment = m[1], m[2], m[4]
            if m[3].strip().startswith("dropout("):  # LANGUAGE.md: the definition's own mask, a buffer, before it
                facts.kinds[f"{name}_keep"] = "buffer"
                facts.lines[f"{name}_keep"] = number
                facts.masks.add(f"{name}_keep")
            facts.kinds[name] = "intermediate"
            facts.lines[name] = number
            if indices:
                ranges = [i.split(":", 1)[1] for i in split_top(indices[1:-1]) if ":" in i]
                if len(ranges) == len(split_top(indices[1:-1])):
                    facts.shapes[name] = "[" + ", ".join(ranges) + "]"
            shape = COMMENT_SHAPE.match(comment) if comment else None
            if shape and shape[2] is None:
                facts.comment_shapes.append((number, name, shape[1]))
                facts.shapes[name] = shape[1]
            elif shape:
                # `O = A @ B   # [N, h * d_k] @ [h * d_k, d]`: the comment gives the
                # operands; the product drops the shared inner dim.
                left, right = split_top(shape[1][1:-1]), split_top(shape[2][1:-1])
                assert squash(left[-1]) == squash(right[0]), f"{path.name}:{number}: comment's inner dims differ"
                product = "[" + ", ".join(left[:-1] + right[1:]) + "]"
                facts.comment_shapes.append((number, name, product))
                facts.shapes[name] = product
    return facts


FACTS = {path: read_facts(path) for path in EXAMPLES}
COMMENT_CASES = [
    pytest.param(path, name, shape, id=f"{path.stem}:{line}:{name}")
    for path, facts in FACTS.items()
    for line, name, shape in facts.comment_shapes
]


def size_of(dim_text: str, sizes: dict[str, int]) -> int:
    """Evaluate dim arithmetic such as `h * d_k` at concrete sizes."""
    assert re.fullmatch(r"[A-Za-z0-9_ +\-*/^()]+", dim_text), dim_text
    value = eval(dim_text.replace("^", "**"), {"__builtins__": {}}, dict(sizes))  # noqa: S307 - checked above
    assert value == int(value)
    return int(value)


def concrete(shape_text: str, sizes: dict[str, int]) -> list[int]:
    inner = shape_text.strip()[1:-1]
    return [size_of(d, sizes) for d in split_top(inner)]


# --- the API -------------------------------------------------------------------


def test_every_example_is_collected():
    names = {p.stem for p in EXAMPLES}
    assert {"self_attention", "causal", "cross_attention", "multi_head", "positional", "additive"} <= names


def test_example_parses_and_validates(example):
    facts = FACTS[example]
    spec = symattn.load(example)
    assert spec.name == example.stem
    assert spec.dims == facts.dims
    assert list(spec.tensors) == list(facts.kinds)
    assert list(spec.outputs) == facts.outputs
    assert len(spec.checks) == facts.checks
    for name, kind in facts.kinds.items():
        assert spec.tensors[name].kind == kind, name


def test_example_loads_from_text_too(example):
    facts = FACTS[example]
    spec = symattn.load(example.read_text("utf-8"))
    assert list(spec.tensors) == list(facts.kinds)


def test_declared_shapes(example):
    facts = FACTS[example]
    spec = symattn.load(example)
    for name, shape in facts.shapes.items():
        assert squash(spec.shape(name)) == squash(shape), name


def test_comment_shapes_are_found():
    # The regex must not silently find nothing: these comments are in the specs.
    found = {(path.stem, name) for path, facts in FACTS.items() for _, name, _ in facts.comment_shapes}
    assert {("cross_attention", "P"), ("multi_head", "Q"), ("multi_head", "P"), ("multi_head", "Z"),
            ("multi_head", "O")} <= found


@pytest.mark.parametrize("path, name, shape", COMMENT_CASES)
def test_comment_shape(path, name, shape):
    assert squash(symattn.load(path).shape(name)) == squash(shape)


def test_concrete_shapes_at_default_sizes(example):
    facts = FACTS[example]
    spec = symattn.load(example)
    for name, shape in facts.shapes.items():
        assert list(spec.concrete_shape(name)) == concrete(shape, facts.dims), name


def test_with_dims_changes_concrete_sizes(example):
    facts = FACTS[example]
    first = next(iter(facts.dims))
    sizes = {**facts.dims, first: 8}
    spec = symattn.load(example).with_dims(**{first: 8})
    assert spec.dims == sizes
    for name, shape in facts.shapes.items():
        assert list(spec.concrete_shape(name)) == concrete(shape, sizes), name


# --- the command line ---------------------------------------------------------------

ROW = re.compile(rf"^  ({NAME})\s+(input|param|buffer|dropout mask|intermediate|output)\s+({BRACKET})\s+(\[[0-9, ]*\])\s+line (\d+)")


def show_rows(stdout: str) -> dict[str, tuple[str, str, list[int], int]]:
    rows = {}
    for line in stdout.splitlines():
        m = ROW.match(line)
        if m:
            sizes = [int(x) for x in m[4][1:-1].split(",") if x.strip()]
            rows[m[1]] = (m[2], m[3], sizes, int(m[5]))
    return rows


def check_show(stdout: str, facts: Facts, sizes: dict[str, int]) -> None:
    rows = show_rows(stdout)
    assert set(rows) == set(facts.kinds), stdout
    for name, kind in facts.kinds.items():
        shown_kind, shape, concrete_sizes, line = rows[name]
        assert shown_kind == ("output" if name in facts.outputs else "dropout mask" if name in facts.masks
                              else kind), name
        assert line == facts.lines[name], name
        if name in facts.shapes:
            assert squash(shape) == squash(facts.shapes[name]), name
        # The concrete sizes are the symbolic shape evaluated at the sizes in use.
        assert concrete_sizes == concrete(shape, sizes), name
    for dim, size in sizes.items():
        assert re.search(rf"^  {dim} = {size}\b", stdout, re.M), f"dim {dim} = {size} not shown"


@functools.lru_cache(maxsize=None)
def show_at_default_sizes(example: Path):
    """`symattn show EXAMPLE`, run once per example: two tests read it (in process: 20 fresh
    interpreters would cost more than the rest of this file; the by-hand cases below start one)."""
    return run_main("show", str(example))


def test_show_lists_every_tensor(example):
    facts = FACTS[example]
    result = show_at_default_sizes(example)
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    check_show(result.stdout, facts, facts.dims)


def test_show_dim_override(example):
    facts = FACTS[example]
    first = next(iter(facts.dims))
    result = run_main("show", "--dim", f"{first}=8", str(example))
    assert result.returncode == 0, result.stderr
    sizes = {**facts.dims, first: 8}
    check_show(result.stdout, facts, sizes)
    assert re.search(rf"^  {first} = 8\s+line \d+\s+\(default {facts.dims[first]}\)", result.stdout, re.M)
    # The override really changes sizes: some tensor has an axis of the dim.
    default_rows = show_rows(show_at_default_sizes(example).stdout)
    assert any(show_rows(result.stdout)[n][2] != default_rows[n][2] for n in default_rows)


def test_show_self_attention_by_hand():
    """The whole tensor table of the reference spec, written out by hand."""
    result = run_cli("show", "derivations/self_attention.attn")
    assert result.returncode == 0, result.stderr
    expected = {
        "X": ("input", "[N, d]", [4, 3], 9),
        "W_q": ("param", "[d, d_k]", [3, 2], 10),
        "W_k": ("param", "[d, d_k]", [3, 2], 10),
        "W_v": ("param", "[d, d_k]", [3, 2], 10),
        "Q": ("intermediate", "[N, d_k]", [4, 2], 12),
        "K": ("intermediate", "[N, d_k]", [4, 2], 13),
        "V": ("intermediate", "[N, d_k]", [4, 2], 14),
        "S": ("intermediate", "[N, N]", [4, 4], 15),
        "P": ("intermediate", "[N, N]", [4, 4], 16),
        "O": ("output", "[N, d_k]", [4, 2], 17),
    }
    assert show_rows(result.stdout) == expected
    assert "outputs  O" in result.stdout
    assert "line 22: grad(V) == P.T @ grad(O)    [N, d_k] == [N, d_k]" in result.stdout
    assert "line 31: equivariant(O, X) permuting dim N" in result.stdout


def test_show_dim_override_by_hand():
    result = run_cli("show", "derivations/multi_head.attn", "--dim", "N=8", "--dim", "h=3")
    assert result.returncode == 0, result.stderr
    rows = show_rows(result.stdout)
    assert rows["W_o"][1:3] == ("[h * d_k, d]", [6, 4])
    assert rows["P"][1:3] == ("[h, N, N]", [3, 8, 8])
    assert rows["O"][1:3] == ("[N, d]", [8, 4])


def test_show_help_describes_commands():
    result = run_cli("--help")
    assert result.returncode == 0
    for command in ("show", "derive", "check", "emit", "verify"):
        assert command in result.stdout
    result = run_cli("show", "--help")
    assert result.returncode == 0
    assert "--dim" in result.stdout and "typed IR" in result.stdout
