"""The Recorder contract (issue 11).

Every simplification a builder of `symattn.ir.build` makes is recorded, in the recorder
the caller passed and nowhere else; `derive` attributes each step to the contribution it
was made for when it is made. Values are checked with a small NumPy evaluator written
here (not symattn's), at random points; the expected steps of `derive` are worked out by
hand from the adjoint rules.
"""

from __future__ import annotations

import gc
import inspect
import itertools
import sys

import numpy as np
import pytest
import sympy

import symattn
from symattn.ir import build as b
from symattn.ir import typed as t
from symattn.symbolic.evaluate import NUMERIC, Evaluator, random_leaves
from conftest import REPO

DERIVATIONS = REPO / "derivations"
N = sympy.Integer(3)
A = t.Tensor("A", (N, N))
B = t.Tensor("B", (N, N))
ZERO, ONE, TWO = t.Scalar(sympy.Integer(0)), t.Scalar(sympy.Integer(1)), t.Scalar(sympy.Integer(2))


def _value(node: t.Node, env: dict[str, np.ndarray]) -> np.ndarray:
    """Plain NumPy value of the few node kinds the builders make."""
    if isinstance(node, t.Tensor):
        return env[node.name]
    if isinstance(node, t.Scalar):
        return np.float64(float(node.value))
    if isinstance(node, t.Constant) and node.kind == "ones":
        return np.ones([int(d) for d in node.shape])
    if isinstance(node, t.Unary) and node.fn == "neg":
        return -_value(node.x, env)
    if isinstance(node, t.Binary):
        x, y = _value(node.a, env), _value(node.b, env)
        return {"add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.divide,
                "pow": np.power}[node.op](x, y)
    if isinstance(node, t.MatMul):
        return _value(node.a, env) @ _value(node.b, env)
    if isinstance(node, t.Transpose):
        return np.swapaxes(_value(node.x, env), -1, -2)
    raise TypeError(f"the test evaluator has no rule for {type(node).__name__}")


def _envs(count: int = 3) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(11)
    # Positive entries keep A^2 and A / B real and finite for every operand below.
    return [{"A": rng.uniform(0.5, 2.0, (3, 3)), "B": rng.uniform(0.5, 2.0, (3, 3))} for _ in range(count)]


def _same_value(x: t.Node, y: t.Node) -> bool:
    return all(np.allclose(_value(x, env), _value(y, env), rtol=1e-12, atol=1e-12) for env in _envs())


# Operands built by hand (not by the builders), some of which invite a simplification.
OPERANDS = {
    "A": A,
    "B": B,
    "0": ZERO,
    "1": ONE,
    "2": TWO,
    "-A": t.Unary("neg", A, A.shape),
    "--A": t.Unary("neg", t.Unary("neg", A, A.shape), A.shape),
    "-2": t.Unary("neg", TWO, ()),
    "A.T": t.Transpose(A, A.shape),
    "A / 2": t.Binary("div", A, TWO, A.shape),
    "A * 2": t.Binary("mul", A, TWO, A.shape),
    "A @ B": t.MatMul(A, B, A.shape),
}


def _naive(op: str, *args: t.Node) -> t.Node:
    """The node an operation denotes, before any simplification."""
    if op == "neg":
        return t.Unary("neg", args[0], args[0].shape)
    if op == "transpose":
        x = args[0]
        return t.Transpose(x, x.shape[:-2] + (x.shape[-1], x.shape[-2]))
    x, y = args
    if op == "matmul":
        return t.MatMul(x, y, (x.shape[0], y.shape[1]))
    return t.Binary({"power": "pow"}.get(op, op), x, y, x.shape if len(x.shape) >= len(y.shape) else y.shape)


def _calls():
    for name in ("neg", "transpose"):
        for key, x in OPERANDS.items():
            if name == "transpose" and x.shape == ():
                continue
            yield pytest.param(name, (x,), id=f"{name}({key})")
    for name in ("add", "sub", "mul", "div", "power", "matmul"):
        for (kx, x), (ky, y) in itertools.product(OPERANDS.items(), repeat=2):
            if name == "matmul" and (x.shape == () or y.shape == ()):
                continue
            if name == "div" and y == ZERO:
                continue
            if name == "power" and (y.shape != () or x == ZERO):  # NaN for a negative base, inf for 0^-2
                continue
            yield pytest.param(name, (x, y), id=f"{name}({kx}, {ky})")


@pytest.mark.parametrize("name, args", list(_calls()))
def test_every_simplification_that_fires_is_recorded_with_equal_values(name, args):
    rec = b.Recorder()
    result = getattr(b, name)(*args, rec=rec)
    naive = _naive(name, *args)
    assert _same_value(result, naive), "the builder changed the value"
    if result == naive:
        assert rec.steps == [], "a step was recorded but nothing was simplified"
        return
    assert rec.steps, f"{name} simplified {naive} to {result} without recording a step"
    for step in rec.steps:
        assert step.rule and step.before != step.after
        assert _same_value(step.before, step.after), f"{step.rule}: before and after differ in value"
    assert rec.steps[-1].after == result, "the last step does not arrive at the result"
    assert any(step.before == naive for step in rec.steps), "no step starts at the operation written out"


# Each rule, with a call that fires it (and the steps it makes, in order).
RULES = [
    (lambda r: b.neg(TWO, r), ["-(c) = -c for a number c"]),
    (lambda r: b.neg(OPERANDS["-A"], r), ["-(-A) = A"]),
    (lambda r: b.add(ZERO, A, r), ["0 + A = A"]),
    (lambda r: b.add(A, ZERO, r), ["A + 0 = A"]),
    (lambda r: b.add(A, OPERANDS["-A"], r), ["A + (-B) = A - B"]),
    (lambda r: b.sub(A, ZERO, r), ["A - 0 = A"]),
    (lambda r: b.sub(ZERO, A, r), ["0 - A = -A"]),
    (lambda r: b.sub(ZERO, OPERANDS["-A"], r), ["0 - A = -A", "-(-A) = A"]),
    (lambda r: b.mul(ONE, A, r), ["1 * A = A"]),
    (lambda r: b.mul(A, ONE, r), ["A * 1 = A"]),
    (lambda r: b.mul(OPERANDS["-A"], B, r), ["(-A) * B = -(A * B)"]),
    (lambda r: b.mul(A, OPERANDS["-A"], r), ["A * (-B) = -(A * B)"]),
    (lambda r: b.mul(OPERANDS["-A"], OPERANDS["-A"], r),
     ["A * (-B) = -(A * B)", "(-A) * B = -(A * B)", "-(-A) = A"]),
    (lambda r: b.div(A, ONE, r), ["A / 1 = A"]),
    (lambda r: b.div(OPERANDS["-A"], B, r), ["(-A) / B = -(A / B)"]),
    (lambda r: b.power(A, ONE, r), ["A^1 = A"]),
    (lambda r: b.matmul(OPERANDS["A / 2"], B, r), ["(A / c) @ B = (A @ B) / c for a scalar c"]),
    (lambda r: b.matmul(B, OPERANDS["A * 2"], r), ["(A * c) @ B = (A @ B) * c for a scalar c"]),
    (lambda r: b.matmul(OPERANDS["-A"], B, r), ["(-A) @ B = -(A @ B)"]),
    (lambda r: b.matmul(B, OPERANDS["-A"], r), ["A @ (-B) = -(A @ B)"]),
    (lambda r: b.transpose(OPERANDS["A.T"], r), ["(A.T).T = A"]),
    (lambda r: b.transpose(OPERANDS["A / 2"], r), ["(A / c).T = A.T / c"]),
    (lambda r: b.transpose(OPERANDS["-A"], r), ["(-A).T = -(A.T)"]),
    (lambda r: b.transpose(t.MatMul(OPERANDS["A.T"], B, A.shape), r), ["(A.T).T = A", "(A @ B).T = B.T @ A.T"]),
    (lambda r: b.expand_to(OPERANDS["-A"], (N, N, N), r), ["(-A) * B = -(A * B)"]),
]


@pytest.mark.parametrize("make, rules", RULES, ids=[" ; ".join(rules) for _, rules in RULES])
def test_each_rule_is_recorded_in_the_order_made(make, rules):
    rec = b.Recorder()
    result = make(rec)
    assert [step.rule for step in rec.steps] == rules
    assert rec.steps[-1].after == result
    for step in rec.steps:
        assert _same_value(step.before, step.after), step.rule


def test_writing_a_node_that_needs_no_simplification_records_nothing():
    rec = b.Recorder()
    b.add(None, A, rec)  # the start of a sum: nothing was written
    b.add(A, B, rec)
    b.mul(A, TWO, rec)
    b.matmul(A, B, rec)
    b.transpose(A, rec)
    b.sum_to(A, A.shape)
    b.expand_to(A, A.shape, rec)
    assert rec.steps == []


BUILDERS = ["neg", "add", "sub", "mul", "div", "power", "matmul", "transpose", "expand_to"]


def test_a_builder_without_a_recorder_records_nowhere():
    for name in BUILDERS:
        assert inspect.signature(getattr(b, name)).parameters["rec"].default is None, name
    # issubclass(type(...)): isinstance would read __class__ of every object, waking lazy modules.
    held = [(r, len(r.steps)) for r in gc.get_objects() if issubclass(type(r), b.Recorder)]
    for make, _ in RULES:
        make(None)
    symattn.load(DERIVATIONS / "self_attention.attn").derive()  # derive's recorders are its own
    for r, count in held:
        assert len(r.steps) == count, "a recorder nobody passed received steps"
    for module in list(sys.modules.values()):
        if getattr(module, "__name__", "").startswith("symattn"):
            shared = [k for k, v in vars(module).items() if isinstance(v, b.Recorder)]
            assert not shared, f"{module.__name__} holds a recorder at module level: {shared}"


def test_a_recorder_gets_only_the_steps_of_the_calls_it_was_passed_to():
    mine, other = b.Recorder(), b.Recorder()
    b.mul(ONE, A, mine)
    b.transpose(OPERANDS["A.T"], other)
    b.neg(OPERANDS["-A"])
    assert [s.rule for s in mine.steps] == ["1 * A = A"]
    assert [s.rule for s in other.steps] == ["(A.T).T = A"]


# --- derive: the steps of each contribution are those made while building it --------------

UNNAMED_SOFTMAX = """attention t
dim N = 3, d = 2
input Q[N, d], K[N, d], V[N, d]
O = softmax(Q @ K.T, axis=-1) @ V
output O
"""

MINUS_PATHS = """attention m
dim N = 3, d = 2
input A[N, d], B[N, d]
O = A - A * B
output O
"""


def _rules(derivation, tensor):
    return [step.rule for step in derivation.gradients[tensor].steps]


def test_a_step_is_listed_only_under_the_contribution_it_was_made_for():
    """Q @ K.T: (K.T).T = K is made building grad(Q) = G @ (K.T).T, not grad(K); K's own
    contribution Q.T @ (...softmax(Q @ K.T)...) contains K, so a search for the step's
    result in it used to list the step under grad(K) as well."""
    derivation = symattn.load(UNNAMED_SOFTMAX).derive()
    through_softmax = ["C = A @ B: grad(A) = grad(C) @ B.T",
                       "P = softmax(S): grad(S) = P * (grad(P) - sum(grad(P) * P))"]
    assert _rules(derivation, "Q") == through_softmax + [
        "C = A @ B: grad(A) = grad(C) @ B.T", "simplify: (A.T).T = A"]
    assert _rules(derivation, "K") == through_softmax + [
        "C = A @ B: grad(B) = A.T @ grad(C)", "C = A.T: grad(A) = grad(C).T",
        "simplify: (A.T).T = A", "simplify: (A @ B).T = B.T @ A.T"]
    q, k = derivation.gradients["Q"].steps[-1], derivation.gradients["K"].steps[-2]
    shape = derivation.spec.tensors["K"].shape
    assert q.before == t.Transpose(t.Transpose(t.Tensor("K", shape), shape[::-1]), shape) and q.after.name == "K"
    assert k.before == t.Transpose(t.Transpose(t.Tensor("Q", shape), shape[::-1]), shape) and k.after.name == "Q"
    assert _rules(derivation, "V") == ["C = A @ B: grad(B) = A.T @ grad(C)"]


def test_steps_of_summing_the_paths_are_recorded_with_the_sum():
    spec = symattn.load(MINUS_PATHS)
    derivation = spec.derive()
    assert derivation.formula("A") == "grad(A) = grad(O) - grad(O) * B"
    assert _rules(derivation, "A") == [
        "A - B: A gets G",
        "A - B: B gets -G", "A * B: A gets G * B", "simplify: (-A) * B = -(A * B)",
        "sum over the 2 paths from A to the outputs", "simplify: A + (-B) = A - B"]
    assert _rules(derivation, "B") == [
        "A - B: B gets -G", "A * B: B gets A * G", "simplify: A * (-B) = -(A * B)"]
    assert _check_step_values(spec, derivation) == 3


def _free_of_indices(node: t.Node) -> bool:
    return not any(isinstance(n, (t.Entry, t.IndexVar, t.IndexSum, t.IndexDef)) for n in t.walk(node))


def _check_step_values(spec, derivation, seed: int = 0) -> int:
    """Every simplify step's before and after agree in value (the reference evaluator, random
    tensors and upstream gradients); returns how many steps were checked."""
    rng = np.random.default_rng(seed)
    ev = Evaluator(spec.typed, NUMERIC)
    ev.run(random_leaves(spec.typed, rng))
    for name in derivation.gradients:
        ev.grads[name] = rng.standard_normal(spec.concrete_shape(name))
    checked = 0
    for grad in derivation.gradients.values():
        for step in grad.steps:
            if step.rule.startswith("simplify: ") and _free_of_indices(step.before) and _free_of_indices(step.after):
                np.testing.assert_allclose(ev.evaluate(step.before), ev.evaluate(step.after),
                                           rtol=1e-10, atol=1e-12, err_msg=step.rule)
                checked += 1
    return checked


@pytest.mark.parametrize("name", ["self_attention", "positional", "causal", "additive"])
def test_recorded_steps_of_the_examples_hold_in_value(name):
    spec = symattn.load(DERIVATIONS / f"{name}.attn")
    assert _check_step_values(spec, spec.derive()) > 0


def test_index_notation_writes_no_one_times_for_a_bare_delta():
    """d X[l, m] / d X[l, m] is the delta itself: the product rule writes v, not 1 * v."""
    derivation = symattn.load(DERIVATIONS / "additive.attn").derive()
    rules = [s.rule for g in derivation.gradients.values() for s in g.steps]
    assert "simplify: 1 * A = A" not in rules and "simplify: A * 1 = A" not in rules
