"""Forward mode and double backward through spec.torch(): derived formulas (the tangent and backward passes
written as specs), checked against torch's own references: `torch.autograd.gradcheck` / `gradgradcheck`
(finite differences), `torch.func.jvp` and `torch.autograd.forward_ad` against central differences, and the
double backward of self-attention against torch autograd's double backward of a plain torch reference. The
generated file loaded on its own derives neither, and raises instead of giving zero (issue 28's regression:
torch.func.jvp through the custom op returned zero tangents, a silent wrong answer)."""

from __future__ import annotations

import numpy as np
import pytest

import symattn
from symattn.symbolic.evaluate import random_leaves

from conftest import EXAMPLES, REPO, slow_params

torch = pytest.importorskip("torch", reason="the torch target needs torch")

QUICK = {"self_attention", "causal", "key_padding", "t5_buckets", "gqa", "lse_output", "natten_2d", "cosine"}
CASES = [p for p in EXAMPLES if "dropout" not in p.stem]


def _function(spec, module, rng):
    """(f, primals): f maps the inputs and params (as tensors, in spec order) to the outputs, the buffers fixed."""
    leaves = random_leaves(spec.typed, rng)
    fixed = {n: torch.as_tensor(leaves[n]) for n in spec.typed.buffers}
    names = list(spec.typed.differentiable)

    def f(*values):
        given = dict(zip(names, values))
        params = {n: given[n] for n in spec.typed.params}
        inputs = {n: given[n] for n in spec.typed.inputs}
        out = torch.func.functional_call(module, params, args=(), kwargs={**inputs, **fixed})
        return tuple(out[o] for o in spec.typed.outputs)
    return f, tuple(torch.as_tensor(leaves[n], dtype=torch.float64) for n in names)


@pytest.mark.parametrize("path", slow_params(CASES, [p.stem for p in CASES], {p.stem for p in CASES} - QUICK),
                         ids=[p.stem for p in CASES])
def test_gradgradcheck_and_jvp_against_finite_differences(path):
    spec = symattn.load(path)
    module = spec.torch().double()
    f, primals = _function(spec, module, np.random.default_rng(0))
    inputs = tuple(p.clone().requires_grad_(True) for p in primals)
    assert torch.autograd.gradcheck(f, inputs, atol=1e-6)
    assert torch.autograd.gradgradcheck(f, inputs, atol=1e-5)
    rng = torch.Generator().manual_seed(1)
    tangents = tuple(torch.randn(p.shape, dtype=torch.float64, generator=rng) for p in primals)
    _, got = torch.func.jvp(f, primals, tangents)
    h = 1e-6
    plus = f(*(p + h * t for p, t in zip(primals, tangents)))
    minus = f(*(p - h * t for p, t in zip(primals, tangents)))
    for g, a, b in zip(got, plus, minus):
        finite = torch.isfinite(a) & torch.isfinite(b)
        torch.testing.assert_close(g[finite], ((a - b) / (2 * h))[finite], rtol=1e-5, atol=1e-6)
    import torch.autograd.forward_ad as fwAD

    with fwAD.dual_level():
        dual = f(*(fwAD.make_dual(p, t) for p, t in zip(primals, tangents)))
        for d, g in zip(dual, got):
            torch.testing.assert_close(fwAD.unpack_dual(d).tangent, g, rtol=1e-12, atol=1e-12)


def _reference(x, wq, wk, wv):
    q, k, v = x @ wq, x @ wk, x @ wv
    return torch.softmax(q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5, dim=-1) @ v


def test_double_backward_equals_torch_autograd_on_a_plain_reference():
    spec = symattn.load(REPO / "derivations" / "self_attention.attn")
    module = spec.torch().double()
    x = torch.randn(4, 3, dtype=torch.float64, requires_grad=True)
    w = {n: getattr(module, n).detach().clone().requires_grad_(True) for n in ("W_q", "W_k", "W_v")}
    g_o = torch.randn(4, 2, dtype=torch.float64)
    # first order with a graph, then the gradient of <grad, v> (a Hessian-vector product) on both sides
    out = torch.func.functional_call(module, w, args=(), kwargs={"X": x})["O"]
    grads = torch.autograd.grad(out, [x, *w.values()], g_o, create_graph=True)
    ref_x = x.detach().clone().requires_grad_(True)
    ref_w = {n: v.detach().clone().requires_grad_(True) for n, v in w.items()}
    ref = torch.autograd.grad(_reference(ref_x, *ref_w.values()), [ref_x, *ref_w.values()], g_o, create_graph=True)
    vs = [torch.randn_like(g) for g in grads]
    second = torch.autograd.grad(sum((g * v).sum() for g, v in zip(grads, vs)), [x, *w.values()])
    want = torch.autograd.grad(sum((g * v).sum() for g, v in zip(ref, vs)), [ref_x, *ref_w.values()])
    for a, b in zip(second, want):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-11)


def test_third_order_runs_through_the_backward_pass_derived_again():
    spec = symattn.load(REPO / "derivations" / "self_attention.attn")
    module = spec.torch().double()
    w = {n: getattr(module, n).detach() for n in ("W_q", "W_k", "W_v")}
    x = torch.randn(4, 3, dtype=torch.float64, requires_grad=True)
    ref_x = x.detach().clone().requires_grad_(True)

    def third(f, y):
        (g,) = torch.autograd.grad(f(y).pow(2).sum(), y, create_graph=True)
        (h,) = torch.autograd.grad(g.pow(2).sum(), y, create_graph=True)
        (k,) = torch.autograd.grad(h.sum(), y)
        return k
    got = third(lambda y: torch.func.functional_call(module, w, args=(), kwargs={"X": y})["O"], x)
    want = third(lambda y: _reference(y, *w.values()), ref_x)
    torch.testing.assert_close(got, want, rtol=1e-8, atol=1e-10)


def _standalone():
    from symattn.codegen.torch.emit import load_torch_module

    spec = symattn.load(REPO / "derivations" / "self_attention.attn")
    return load_torch_module(spec.emit("torch"), "symattn_standalone_self_attention")


def test_the_file_on_its_own_raises_instead_of_zero_tangents():
    generated = _standalone()
    x = torch.randn(4, 3, dtype=torch.float64)
    w = {n: torch.randn(3, 2, dtype=torch.float64) for n in ("W_q", "W_k", "W_v")}
    with pytest.raises(NotImplementedError, match="forward-mode AD"):
        torch.func.jvp(lambda v: generated.forward(X=v, **w)["O"], (x,), (torch.ones_like(x),))
    import torch.autograd.forward_ad as fwAD

    with fwAD.dual_level(), pytest.raises(NotImplementedError, match="forward-mode AD"):
        generated.forward(X=fwAD.make_dual(x, torch.ones_like(x)), **w)
    y = x.clone().requires_grad_(True)
    (g,) = torch.autograd.grad(generated.forward(X=y, **w)["O"].sum(), y, create_graph=True)
    with pytest.raises(NotImplementedError, match="double backward"):
        g.sum().backward()


def test_dropout_specs_raise_for_higher_orders():
    spec = symattn.load(REPO / "derivations" / "attention_dropout.attn")
    module = spec.torch().double()
    q, k, v = (torch.randn(2, 4, 3, dtype=torch.float64, requires_grad=True) for _ in range(3))
    (g,) = torch.autograd.grad(module(Q=q, K=k, V=v, seed=3)["O"].sum(), q, create_graph=True)
    with pytest.raises(NotImplementedError, match="dropout"):
        g.sum().backward()
