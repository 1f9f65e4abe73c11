"""Forward mode and double backward through the torch module raise until they are derived (issue 28's
regression: torch.func.jvp through the custom op returned zero tangents, a silent wrong answer)."""

from __future__ import annotations

import pytest

import symattn

from conftest import REPO

torch = pytest.importorskip("torch", reason="the torch target needs torch")


@pytest.fixture(scope="module")
def module():
    return symattn.load(REPO / "derivations" / "self_attention.attn").torch().double()


def _output(module, x):
    return module(X=x)["O"]


def test_jvp_raises_instead_of_zero_tangents(module):
    x = torch.randn(4, 3, dtype=torch.float64)
    with pytest.raises(NotImplementedError, match="forward-mode AD"):
        torch.func.jvp(lambda v: _output(module, v), (x,), (torch.ones_like(x),))


def test_forward_ad_raises(module):
    import torch.autograd.forward_ad as fwAD

    x = torch.randn(4, 3, dtype=torch.float64)
    with fwAD.dual_level(), pytest.raises(NotImplementedError, match="forward-mode AD"):
        _output(module, fwAD.make_dual(x, torch.ones_like(x)))


def test_double_backward_raises_and_first_order_still_matches_autograd(module):
    x = torch.randn(4, 3, dtype=torch.float64, requires_grad=True)
    (g,) = torch.autograd.grad(_output(module, x).sum(), x, create_graph=True)
    with pytest.raises(NotImplementedError, match="double backward"):
        g.sum().backward()
    # the first-order gradient against autograd on the textbook formula (the module's own weights)
    w = {n: getattr(module, n).detach() for n in ("W_q", "W_k", "W_v")}
    y = x.detach().clone().requires_grad_(True)
    q, k, v = y @ w["W_q"], y @ w["W_k"], y @ w["W_v"]
    (torch.softmax(q @ k.T / q.shape[-1] ** 0.5, dim=-1) @ v).sum().backward()
    torch.testing.assert_close(g.detach(), y.grad, rtol=1e-10, atol=1e-12)
