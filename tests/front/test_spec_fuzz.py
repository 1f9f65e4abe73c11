"""Property tests: no spec text, however mangled, makes symattn fail other than with a located SpecError.

Mutations of the example specs (delete, duplicate and swap tokens and lines,
insert characters and tokens), random token soup from the language's
vocabulary and arbitrary Unicode text are fed to `symattn.load`. The only
exception allowed is a `SpecError` whose report starts `FILE:LINE:COL: error:`
(and a `UsageError` for text without a newline, which may name a file). A
spec that loads must also print (`spec.show()`). A sample of mutated files
goes through the command line, which must exit 0 or 2 and never print a
traceback.

SYMATTN_FUZZ_SCALE=10 multiplies the number of examples (for a long hunt).
"""

from __future__ import annotations

import os
import random
import re
from concurrent.futures import ThreadPoolExecutor

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import symattn
from symattn.errors import SpecError, UsageError
from conftest import EXAMPLES, run_cli

SCALE = int(os.environ.get("SYMATTN_FUZZ_SCALE", "1"))
TEXTS = [p.read_text("utf-8") for p in EXAMPLES]

# Tokens as a person would see them; comments and runs of spaces stay whole.
TOKEN = re.compile(r"\n|[ \t]+|#[^\n]*|[A-Za-z_][A-Za-z0-9_]*|\d+\.?\d*(?:[eE][+-]?\d+)?|\.T|<=|>=|==|!=|.")

KEYWORDS = ["attention", "dim", "input", "param", "buffer", "output", "check", "not"]
FUNCTIONS = ["exp", "log", "sqrt", "abs", "tanh", "sigmoid", "relu", "sin", "cos", "sum", "mean", "logsumexp",
             "softmax", "where", "merge_heads", "split_heads", "concat", "transpose", "sinusoidal", "causal_mask",
             "eye", "ones", "grad", "equivariant", "invariant"]
NAMES = ["X", "Y", "Q", "K", "V", "P", "S", "O", "W_q", "W_o", "m", "N", "M", "d", "d_k", "h", "i", "j", "k",
         "axis", "inf", "pi", "T"]
OPERATORS = ["+", "-", "*", "/", "@", "^", ".T", "<", "<=", ">", ">=", "==", "!=", "=", ",", ":", "(", ")", "[",
             "]", "#", "\n", " ", "axis=-1", "axis=0"]
NUMBERS = ["0", "1", "2", "-1", "2.5", "1e-6", ".5", "1e400", "10000", "99999999999999999999"]
ODD = ["\t", "\r", "\r\n", "\x00", "\x0c", "\x85", "\u2028", "\u00e9", "$", "\\", "\"", "'", "`", "!", ";", "{",
       "}", "**", "//", "..", ".", "\ufeff", "\U0001f600"]
VOCABULARY = KEYWORDS + FUNCTIONS + NAMES + OPERATORS + NUMBERS + ODD

FUZZ = settings(max_examples=600 * SCALE, deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

REPORT = re.compile(r"fuzz\.attn:(\d+):(\d+): error: \S")


def assert_only_spec_errors(text: str) -> None:
    try:
        spec = symattn.load(text, filename="fuzz.attn")
    except SpecError as err:
        report = str(err)
        m = REPORT.match(report)
        assert m, report
        assert 1 <= int(m[1]) <= text.count("\n") + 2, report
        assert int(m[2]) >= 1
        assert "Traceback" not in report
    except UsageError:
        # Text without a newline may be taken for a file name (`load("x.attn")`).
        assert "\n" not in text
    else:
        assert spec.outputs
        spec.show()


# --- mutations ----------------------------------------------------------------------------------


def mutate_tokens(tokens: list[str], rng: random.Random, steps: int) -> list[str]:
    tokens = list(tokens)
    for _ in range(steps):
        if not tokens:
            tokens.append(rng.choice(VOCABULARY))
            continue
        k = rng.randrange(len(tokens))
        op = rng.choice(["delete", "duplicate", "swap", "insert", "replace", "char"])
        if op == "delete":
            del tokens[k]
        elif op == "duplicate":
            tokens.insert(k, tokens[k])
        elif op == "swap":
            j = rng.randrange(len(tokens))
            tokens[k], tokens[j] = tokens[j], tokens[k]
        elif op == "insert":
            tokens.insert(k, rng.choice(VOCABULARY))
        elif op == "replace":
            tokens[k] = rng.choice(VOCABULARY)
        else:
            tokens.insert(k, chr(rng.choice([rng.randrange(32, 127), rng.randrange(0, 0x3000)])))
    return tokens


def mutate_lines(lines: list[str], rng: random.Random, steps: int) -> list[str]:
    lines = list(lines)
    for _ in range(steps):
        if not lines:
            break
        k = rng.randrange(len(lines))
        op = rng.choice(["delete", "duplicate", "swap"])
        if op == "delete":
            del lines[k]
        elif op == "duplicate":
            lines.insert(k, lines[k])
        else:
            j = rng.randrange(len(lines))
            lines[k], lines[j] = lines[j], lines[k]
    return lines


def mutated_spec(rng: random.Random) -> str:
    text = rng.choice(TEXTS)
    if rng.random() < 0.4:
        text = "\n".join(mutate_lines(text.split("\n"), rng, rng.randint(1, 3)))
    if rng.random() < 0.8:
        text = "".join(mutate_tokens(TOKEN.findall(text), rng, rng.randint(1, 4)))
    return text


# --- properties ---------------------------------------------------------------------------------


@FUZZ
@given(st.sampled_from(TEXTS), st.randoms(use_true_random=False), st.integers(1, 6))
def test_token_mutations(text, rng, steps):
    assert_only_spec_errors("".join(mutate_tokens(TOKEN.findall(text), rng, steps)))


@pytest.mark.slow  # seconds of work: the slow step runs it (the README's command stays under 5 min)
@FUZZ
@given(st.sampled_from(TEXTS), st.randoms(use_true_random=False), st.integers(1, 4))
def test_line_mutations(text, rng, steps):
    assert_only_spec_errors("\n".join(mutate_lines(text.split("\n"), rng, steps)))


@pytest.mark.slow  # seconds of work: the slow step runs it (the README's command stays under 5 min)
@FUZZ
@given(st.randoms(use_true_random=False))
def test_line_and_token_mutations(rng):
    assert_only_spec_errors(mutated_spec(rng))


@FUZZ
@given(st.lists(st.sampled_from(VOCABULARY), max_size=60), st.sampled_from(["", " "]))
def test_token_soup(tokens, sep):
    assert_only_spec_errors(sep.join(tokens))


@FUZZ
@given(st.lists(st.sampled_from(VOCABULARY), max_size=30))
def test_token_soup_after_a_valid_prefix(tokens):
    # Valid declarations first, so that soup reaches the validator, not just the parser.
    prefix = "dim N = 4, d = 3, h = 2\ninput X[N, d], Y[N, N]\nparam W[d, d], m\n"
    assert_only_spec_errors(prefix + " ".join(tokens) + "\noutput X\n")


@FUZZ
@given(st.text(max_size=200))
def test_arbitrary_text(text):
    assert_only_spec_errors(text + "\n")


def test_mutations_reach_every_stage():
    """The generators are worth something only if they produce all kinds of outcome."""
    rng = random.Random(2)
    outcomes = set()
    for _ in range(400):
        try:
            symattn.load(mutated_spec(rng), filename="fuzz.attn")
            outcomes.add("ok")
        except SpecError as err:
            outcomes.add(type(err).__name__)
    assert {"ok", "SpecSyntaxError", "SpecNameError", "SpecShapeError"} <= outcomes, outcomes


# --- the command line -----------------------------------------------------------------------------


@pytest.mark.slow  # sixteen fresh interpreters; the in-process tests above cover thousands of mutants
def test_cli_never_prints_a_traceback(tmp_path):
    rng = random.Random(20240601)
    valid, invalid = [], []  # 8 mutants that load and 8 that do not (told in process), each run in a fresh interpreter
    while len(valid) < 8 or len(invalid) < 8:
        text = mutated_spec(rng)
        try:
            symattn.load(text, filename="fuzz.attn")
            group = valid
        except SpecError:
            group = invalid
        if len(group) < 8:
            group.append(text)
    paths = []
    for n, text in enumerate(valid + invalid):
        path = tmp_path / f"mutant_{n}.attn"
        path.write_text(text, encoding="utf-8")
        paths.append(path)
    with ThreadPoolExecutor(max_workers=2) as pool:
        results = list(pool.map(lambda p: run_cli("show", str(p)), paths))
    for path, result in zip(paths, results):
        assert "Traceback" not in result.stderr, (path.read_text("utf-8"), result.stderr)
        assert result.returncode in (0, 2), (path.read_text("utf-8"), result.stderr)
        if result.returncode == 2:
            assert result.stderr.startswith(f"{path}:"), result.stderr
            assert re.match(rf"{re.escape(str(path))}:\d+:\d+: error: ", result.stderr), result.stderr
        else:
            assert result.stdout.startswith("attention ")
    assert {r.returncode for r in results} == {0, 2}, "the sample should hold valid and invalid specs"
