"""Matrix-level derivation: formulas that read like the literature, in spec syntax, with steps.

The expected formulas are written by hand from FlashAttention (Dao et al.,
2022, Algorithm 2 and its Appendix B.2), in the spec's own names; they are not
copied from symattn's output. Every printed formula must also be spec syntax
that the front end reads back to the very node that was derived.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import sympy

import symattn
from symattn.ir import typed as t
from symattn.symbolic.derive import Step
from symattn.symbolic.evaluate import NUMERIC, Evaluator, random_leaves
from conftest import REPO

DERIVATIONS = REPO / "derivations"
SPECS = sorted(DERIVATIONS.glob("*.attn"))

FLASH_ATTENTION = {
    "V": "grad(V) = P.T @ grad(O)",
    "P": "grad(P) = grad(O) @ V.T",
    "S": "grad(S) = P * (grad(P) - sum(grad(P) * P, axis=-1))",
    "Q": "grad(Q) = grad(S) @ K / sqrt(d_k)",
    "K": "grad(K) = grad(S).T @ Q / sqrt(d_k)",
    "W_q": "grad(W_q) = X.T @ grad(Q)",
    "W_k": "grad(W_k) = X.T @ grad(K)",
    "W_v": "grad(W_v) = X.T @ grad(V)",
    "X": "grad(X) = grad(Q) @ W_q.T + grad(K) @ W_k.T + grad(V) @ W_v.T",
}


@pytest.fixture(scope="module")
def self_attention():
    return symattn.load(DERIVATIONS / "self_attention.attn").derive()


@pytest.mark.parametrize("tensor", list(FLASH_ATTENTION))
def test_self_attention_reads_like_flash_attention(self_attention, tensor):
    assert self_attention.formula(tensor) == FLASH_ATTENTION[tensor]


def test_every_tensor_gets_a_gradient_outputs_first(self_attention):
    spec = self_attention.spec
    assert set(self_attention.gradients) == set(spec.tensors)
    assert next(iter(self_attention.gradients)) == "O"
    assert self_attention.gradients["O"].expr == t.Grad("O", spec.tensors["O"].shape)
    assert "upstream gradient" in self_attention.formula("O")


def test_grad_x_is_the_sum_of_its_three_paths(self_attention):
    paths = self_attention.gradients["X"].paths
    assert [consumer for consumer, _ in paths] == ["Q", "K", "V"]
    printed = [symattn.ir.printing.to_spec(part) for _, part in paths]
    assert printed == ["grad(Q) @ W_q.T", "grad(K) @ W_k.T", "grad(V) @ W_v.T"]
    rules = [step.rule for step in self_attention.gradients["X"].steps]
    assert any(rule.startswith("sum over the 3 paths") for rule in rules)


def test_a_tensor_the_outputs_do_not_depend_on_has_zero_gradient():
    spec = symattn.load(
        "dim N = 2, d = 2\ninput X[N, d]\nparam W[d, d], U[d, d]\nA = X @ W\nB = X @ U\nO = A\noutput O\n"
    )
    derivation = spec.derive()
    assert derivation.gradients["U"].expr is None
    assert derivation.gradients["B"].expr is None
    assert derivation.formula("U") == "grad(U) = 0    # L does not depend on U"
    assert derivation.formula("W") == "grad(W) = X.T @ grad(A)"


def test_an_alias_passes_the_gradient_through():
    """`O = A` names A again; before this was handled every gradient came out 0."""
    spec = symattn.load("dim N = 2, d = 2\ninput X[N, d]\nparam W[d, d]\nA = X @ W\nO = A\noutput O\n")
    derivation = spec.derive()
    assert derivation.formula("A") == "grad(A) = grad(O)"
    assert derivation.formula("W") == "grad(W) = X.T @ grad(A)"
    assert derivation.formula("X") == "grad(X) = grad(A) @ W.T"
    assert derivation.gradients["A"].steps


# --- every formula is spec syntax ---------------------------------------------------


def _uses_index_notation(node: t.Node) -> bool:
    stack = [node]
    while stack:
        n = stack.pop()
        if isinstance(n, (t.IndexDef, t.Entry, t.IndexSum, t.IndexVar)):
            return True
        stack.extend(n.children)
    return False


def _has_sum_over_leading_axes(node: t.Node) -> bool:
    """A SumTo that drops leading axes: the spec language's `sum` keeps them (size 1)."""
    stack = [node]
    while stack:
        n = stack.pop()
        if isinstance(n, t.SumTo) and len(n.x.shape) > len(n.shape):
            return True
        stack.extend(n.children)
    return False


def _formulas():
    for path in SPECS:
        spec = symattn.load(path)
        for name, grad in spec.derive().gradients.items():
            if grad.expr is None or name in spec.outputs:
                continue
            if _uses_index_notation(grad.expr):
                continue  # index-notation gradients print as `[l, m] -> ...`, which is not spec syntax
            yield pytest.param(path, name, id=f"{path.stem}-{name}")


def _printed_form(node: t.Node) -> t.Node:
    """`node` as the printer writes it: a SumTo that keeps its rank prints as nested sums,
    `sum(sum(x, axis=-1), axis=-2)` (innermost the last axis), which read back as Reduce
    nodes. The entries are the same; only the summation order differs. Nothing else changes."""
    changes = {}
    for f in dataclasses.fields(node):
        value = getattr(node, f.name)
        if isinstance(value, t.Node):
            changes[f.name] = _printed_form(value)
        elif isinstance(value, tuple) and value and all(isinstance(v, t.Node) for v in value):
            changes[f.name] = tuple(_printed_form(v) for v in value)
    node = dataclasses.replace(node, **changes) if changes else node
    if isinstance(node, t.SumTo) and len(node.shape) == len(node.x.shape):
        out = node.x
        for axis in sorted(node.axes, reverse=True):
            shape = tuple(sympy.Integer(1) if k == axis else d for k, d in enumerate(out.shape))
            out = t.Reduce("sum", out, axis, shape)
        return out
    return node


@pytest.mark.parametrize("path, name", list(_formulas()))
def test_formula_parses_back_to_the_derived_node(path, name):
    spec = symattn.load(path)
    derivation = spec.derive()
    formula = derivation.formula(name)
    lhs, _, rhs = formula.partition(" = ")
    assert lhs == f"grad({name})"
    text = spec.typed.source + f"\ncheck grad({name}) == {rhs}\n"
    reread = symattn.load(text, filename=path.name)
    check = reread.typed.checks[-1]
    assert check.text == f"grad({name}) == {rhs}"
    derived = derivation.gradients[name].expr
    if not _has_sum_over_leading_axes(derived):
        assert check.rhs == _printed_form(derived)
        return
    # `sum(A, axis=-3)` keeps the summed axis, so the text reads back with leading axes of
    # size 1: the same entries, broadcast. Compare values (NaN where both are NaN).
    lead = len(check.rhs.shape) - len(derived.shape)
    assert lead > 0 and tuple(check.rhs.shape) == (1,) * lead + tuple(derived.shape)
    rng = np.random.default_rng(1)
    ev = Evaluator(spec.typed, NUMERIC)
    ev.run(random_leaves(spec.typed, rng))
    for grad_name in derivation.gradients:
        shape = spec.concrete_shape(grad_name)
        ev.grads[grad_name] = rng.standard_normal(shape)
    reread_value = np.asarray(ev.evaluate(check.rhs), dtype=np.float64)
    np.testing.assert_allclose(reread_value.reshape(reread_value.shape[lead:]), ev.evaluate(derived),
                               rtol=1e-12, atol=1e-12)


# --- steps -----------------------------------------------------------------------------


@pytest.mark.parametrize("path", SPECS, ids=[p.stem for p in SPECS])
def test_every_gradient_records_its_steps(path):
    spec = symattn.load(path)
    derivation = spec.derive()
    for name, grad in derivation.gradients.items():
        if name in spec.outputs or grad.expr is None:
            continue
        assert grad.steps, f"grad({name}) has no steps"
        for step in grad.steps:
            assert isinstance(step, Step)
            assert step.rule and isinstance(step.rule, str)
            assert isinstance(step.before, t.Node) and isinstance(step.after, t.Node)
            assert step.tensor == name


@pytest.mark.parametrize("path", SPECS, ids=[p.stem for p in SPECS])
def test_steps_start_at_each_consumers_definition_and_end_at_the_path(path):
    """The steps for grad(T) replay the whole way: from the definition of every tensor
    that reads T down to T's share of its gradient, so a document can show each rule."""
    spec = symattn.load(path)
    derivation = spec.derive()
    for name, grad in derivation.gradients.items():
        if name in spec.outputs or grad.expr is None:
            continue
        befores = [step.before for step in grad.steps]
        afters = [step.after for step in grad.steps]
        for consumer, contribution in grad.paths:
            definition = spec.tensors[consumer].expr
            assert definition in befores, f"grad({name}): no step starts at the definition of {consumer}"
            assert any(_contains(after, contribution) or _contains(contribution, after) for after in afters), (
                f"grad({name}): no step arrives at the contribution through {consumer}")


def _contains(node: t.Node, part: t.Node) -> bool:
    stack = [node]
    while stack:
        n = stack.pop()
        if n == part:
            return True
        stack.extend(n.children)
    return False


def test_steps_for_grad_k_show_the_scale_the_product_and_the_transpose(self_attention):
    rules = [step.rule for step in self_attention.gradients["K"].steps]
    assert any(rule.startswith("A / B") for rule in rules), rules
    assert any(rule.startswith("C = A @ B: grad(B)") for rule in rules), rules
    assert any(rule.startswith("C = A.T") for rule in rules), rules
