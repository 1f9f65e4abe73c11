"""The spec-text printer (`symattn.ir.printing.to_spec`): parses back, with no parentheses to spare.

Each definition of a spec is printed, the printed text replaces the original
definition line, and the spec is loaded again: the typed IR must be the same
node for node (positions aside). Minimality is checked independently of the
printer: every pair of grouping parentheses in the printed text is removed in
turn and the text loaded again; the result must either fail to load or give a
different typed node, except for the pairs kept on purpose around a product
that stands beside `@` (`(A @ B) * C`, `(A * B) @ C`), which people misread.
"""

from __future__ import annotations

import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import symattn
from symattn.ir import typed as t
from symattn.errors import SpecError
from symattn.ir.printing import to_spec
from conftest import EXAMPLES
from test_notebook_displays import EVERY_NODE

SCALED_PRODUCT = """\
attention scaled
dim N = 3, d = 2
input Qn[N, d], Kn[N, d]
param tau, b[1, d], c[d]
S = tau * (Qn @ Kn.T)
T = (Qn @ Kn.T) * tau
U = tau * (Qn @ Kn.T) / 2
V = (Qn * tau) @ Kn.T
W = Qn - (Kn - b) + -(c * tau) ^ 2
Y = (Qn + b) / (c - 1) * exp(-Kn) ^ (2 - tau)
Z = sum(Qn * (Kn + c), axis=-1) - (tau - 1) * 3
O = softmax(S + T + U + V, axis=-1) @ (W + Y + Z)
output O
"""

HAND_SPECS = {"scaled": SCALED_PRODUCT, "every_node": EVERY_NODE}
DOUBLED = re.compile(r"(?<![A-Za-z0-9_])\(\(")  # two grouping brackets in a row (`sum((` is a call)


def _definitions(spec) -> dict[str, t.Node]:
    return {name: info.expr for name, info in spec.tensors.items() if info.expr is not None}


def _printed(spec) -> dict[str, str]:
    """Each matrix-notation definition, printed back in spec syntax (index notation keeps its line; a dropout
    definition too: its typed form x * D_keep / (1 - p) reads the mask no definition may name, and it prints
    back as `dropout(x, p)`, tests/codegen/all_targets/test_dropout.py)."""
    order = list(spec.typed.dims)
    dropped = {spec.typed.tensors[m].dropout.of for m in spec.typed.dropouts}
    return {name: to_spec(info.expr, order) for name, info in spec.tensors.items()
            if info.expr is not None and not isinstance(info.expr, t.IndexDef) and name not in dropped}


def _with_definition(source: str, spec, name: str, body: str) -> str:
    lines = source.split("\n")
    lines[spec.tensors[name].pos.line - 1] = f"{name} = {body}"
    return "\n".join(lines)


def _sources():
    cases = [(p.stem, p.read_text("utf-8")) for p in EXAMPLES]
    return cases + list(HAND_SPECS.items())


SOURCES = _sources()
# every_node multiplies a matrix by a 1-D vector, whose gradient the matrix language cannot write.
DERIVABLE = [c for c in SOURCES if c[0] != "every_node"]


@pytest.mark.parametrize("name,source", SOURCES, ids=[c[0] for c in SOURCES])
def test_printed_definitions_parse_back_to_the_same_typed_ir(name, source):
    spec = symattn.load(source)
    printed = _printed(spec)
    assert printed
    text = source
    for tensor, body in printed.items():
        text = _with_definition(text, spec, tensor, body)
    again = symattn.load(text)
    assert _definitions(again) == _definitions(spec)


def _grouping_pairs(text: str) -> list[tuple[int, int]]:
    """(open, close) offsets of the parentheses that group, not those of a call like `exp(`."""
    pairs, stack = [], []
    for k, ch in enumerate(text):
        if ch == "(":
            call = k > 0 and (text[k - 1].isalnum() or text[k - 1] == "_")
            stack.append((k, call))
        elif ch == ")":
            start, call = stack.pop()
            if not call:
                pairs.append((start, k))
    return pairs


def _top_level_operators(inner: str) -> set[str]:
    depth, found = 0, set()
    for ch in inner:
        depth += ch in "(["
        depth -= ch in ")]"
        if depth == 0 and ch in "*/@":
            found.add(ch)
    return found


def _kept_for_reading(text: str, start: int, stop: int) -> bool:
    """A product in brackets beside `@`, or a matrix product in brackets beside `*` or `/`."""
    inside = _top_level_operators(text[start + 1:stop])
    before = text[:start].rstrip()[-1:]
    after = text[stop + 1:].lstrip()[:1]
    beside = {before, after} & set("*/@")
    return bool(("@" in inside and beside & set("*/")) or (inside & set("*/") and "@" in beside))


@pytest.mark.parametrize("name,source", SOURCES, ids=[c[0] for c in SOURCES])
def test_no_parentheses_to_spare(name, source):
    spec = symattn.load(source)
    for tensor, body in _printed(spec).items():
        for start, stop in _grouping_pairs(body):
            if _kept_for_reading(body, start, stop):
                continue
            lighter = body[:start] + body[start + 1:stop] + body[stop + 1:]
            try:
                again = symattn.load(_with_definition(source, spec, tensor, lighter))
            except SpecError:
                continue
            assert again.tensors[tensor].expr != spec.tensors[tensor].expr, \
                f"{tensor} = {body}: the brackets at {start}..{stop} can go ({lighter})"


def test_scalar_times_bracketed_product_prints_one_pair():
    spec = symattn.load(SCALED_PRODUCT)
    shown = spec.show()
    assert "S = tau * (Qn @ Kn.T)" in shown
    assert "T = (Qn @ Kn.T) * tau" in shown
    assert "V = (Qn * tau) @ Kn.T" in shown
    assert not DOUBLED.search(shown), shown


def _check_rhs(source: str, claim: str) -> t.Node | None:
    """The typed right-hand side of `check CLAIM` appended to the spec; None when it does not load."""
    try:
        spec = symattn.load(source + f"\ncheck {claim}\n")
    except SpecError:
        return None
    return spec.checks[-1].rhs


@pytest.mark.parametrize("name,source", DERIVABLE, ids=[c[0] for c in DERIVABLE])
def test_gradient_formulas_have_no_parentheses_to_spare(name, source):
    """`derive --gradients` lines, stated as checks: dropping any grouping pair changes the claim."""
    derivation = symattn.load(source).derive()
    for tensor, grad in derivation.gradients.items():
        line = derivation.formula(tensor)
        if grad.expr is None or isinstance(grad.expr, t.Grad):
            continue
        if any(isinstance(n, t.IndexDef) for n in t.walk(grad.expr)):
            continue  # `[i, j] -> ...` is how a derivation shows index notation, not spec syntax
        head, body = line.split(" = ", 1)
        parsed = _check_rhs(source, f"{head} == {body}")
        assert parsed is not None, line
        for start, stop in _grouping_pairs(body):
            if _kept_for_reading(body, start, stop):
                continue
            lighter = body[:start] + body[start + 1:stop] + body[stop + 1:]
            assert _check_rhs(source, f"{head} == {lighter}") != parsed, \
                f"{line}: the brackets at {start}..{stop} can go ({lighter})"


RANDOM_HEADER = "dim N = 2\ninput A[N, N], B[N, N]\nparam s\n"
def _expressions():
    leaf = st.sampled_from(["A", "B", "s", "2", "1/2", "A @ B", "s * A"])

    def extend(inner):
        binary = st.tuples(inner, st.sampled_from(["+", "-", "*", "/", "@", "^"]), inner).map(
            lambda p: f"({p[0]}) {p[1]} ({p[2]})" if p[1] == "^" else f"{p[0]} {p[1]} ({p[2]})")
        return st.one_of(
            binary,
            st.tuples(inner, st.sampled_from(["+", "-", "*", "/", "@"]), inner).map(lambda p: f"({p[0]}) {p[1]} {p[2]}"),
            inner.map(lambda x: f"-({x})"),
            inner.map(lambda x: f"({x}).T"),
            inner.map(lambda x: f"exp({x})"),
            inner.map(lambda x: f"sum({x}, axis=-1)"),
        )

    return st.recursive(leaf, extend, max_leaves=6)


@settings(max_examples=150, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(_expressions())
def test_random_expressions_print_back_minimally(text):
    source = RANDOM_HEADER + f"Z = {text}\nO = Z + A\noutput O\n"
    try:
        spec = symattn.load(source)
    except SpecError:
        return  # `@` of a scalar, a shape that does not fit: not an expression of the language
    node = spec.tensors["Z"].expr
    body = to_spec(node, ["N"])
    again = symattn.load(RANDOM_HEADER + f"Z = {body}\nO = Z + A\noutput O\n")
    assert again.tensors["Z"].expr == node, body
    for start, stop in _grouping_pairs(body):
        if _kept_for_reading(body, start, stop):
            continue
        lighter = body[:start] + body[start + 1:stop] + body[stop + 1:]
        try:
            other = symattn.load(RANDOM_HEADER + f"Z = {lighter}\nO = Z + A\noutput O\n")
        except SpecError:
            continue
        assert other.tensors["Z"].expr != node, f"{body}: the brackets at {start}..{stop} can go ({lighter})"
