"""One pass per attention core (the NumPy tiled pass) when the upstream gradients are given.

With the upstream gradients in hand, the tiled pass computes a core's forward
and backward at once (`_flash_forward_backward`) when what flows back into the
core does not depend on the core's output; `symattn.codegen.program.one_pass`
reorders the program for it. These tests check that order (nothing read before
it is computed, the program itself left as it was), which cores it pairs (an
output read again, a nonlinearity after the core and a chain of two cores keep
the two passes), and the gradients against central finite differences of the
module's plain forward. `test_numpy_tiled.py` compares the tiled pass, now one pass
for its cores, with a float64 attention written there.
"""

from __future__ import annotations

import numpy as np
import pytest

import symattn
from symattn.codegen.numpy.emit import load_module
from symattn.codegen.program import Var, build_program, one_pass
from symattn.codegen.plan import attention_plan
from symattn.codegen.program_ir import walk_labelled

from conftest import EXAMPLES
from test_numpy_tiled import tiled

HEAD = """
attention {name}
dim N = 8, d = 4
input Q[N, d], K[N, d], V[N, d]
"""

SPECS = {  # name -> (the rest of the spec, cores in one pass, cores in two)
    "plain": ("O = softmax(Q @ K.T / sqrt(d), axis=-1) @ V\noutput O", 1, 0),
    # both outputs: grad(O) as a whole reads O, so O's core cannot run before it
    "read_again": ("O = softmax(Q @ K.T / sqrt(d), axis=-1) @ V\nR = O * O\noutput O, R", 0, 1),
    "squashed": ("O = softmax(Q @ K.T / sqrt(d), axis=-1) @ V\nR = tanh(O)\noutput R", 0, 1),
    "projected": ("param W[d, d]\nO = softmax(Q @ K.T / sqrt(d), axis=-1) @ V\nR = O @ W\noutput R", 1, 0),
    "pair": ("O = softmax(Q @ K.T / sqrt(d), axis=-1) @ V + softmax(K @ Q.T / sqrt(d), axis=-1) @ V\noutput O",
             2, 0),
    # d score / d s is s itself: the closure returns the block the score then overwrites
    "squared_score": ("O = softmax((Q @ K.T / 2) * (Q @ K.T / 2) / 2, axis=-1) @ V\noutput O", 1, 0),
    # keys bounded from below only (min(N) alone was a TypeError)
    "anti_causal": ("M[i:N, j:N] = where(j > i, 0, -inf)\nO = softmax(Q @ K.T / sqrt(d) + M, axis=-1) @ V\noutput O",
                    1, 0),
    # an output that is no core's, read by a core (its paths' sum held that core unfused)
    "linear_read": ("param W[d, d]\nO = Q @ W\nR = softmax(O @ K.T / sqrt(d), axis=-1) @ V\noutput O, R", 1, 0),
    # the second core reads the first one's output: the first one's gradient needs the second's backward
    "chain": ("A = softmax(Q @ K.T / sqrt(d), axis=-1) @ V\nB = softmax(A @ K.T / sqrt(d), axis=-1) @ A\noutput B",
              1, 1),
}


def spec(name):
    return symattn.load(HEAD.format(name=name) + SPECS[name][0])


def _arrays(name, n=23, seed=0):
    """The spec's leaves at N = n, d = 4, the inputs with a batch axis of 2."""
    rng = np.random.default_rng(seed)
    typed = spec(name).typed
    sizes = {"N": n, "d": 4}
    given = {}
    for leaf in typed.given:
        shape = tuple(sizes[str(dim)] for dim in typed.tensors[leaf].shape)
        given[leaf] = rng.standard_normal(((2,) if typed.tensors[leaf].kind == "input" else ()) + shape)
    return typed, given, rng


@pytest.mark.parametrize("name", SPECS)
def test_which_cores_run_in_one_pass(name):
    source = spec(name).emit("numpy")
    _, together, apart = SPECS[name]
    assert source.count("= _flash_forward_backward(") == together
    assert source.count("= _flash_backward(") == apart


def _check_order(program):
    """Every variable a statement reads is an argument or computed by an earlier statement; liveness is the
    last statement that reads it."""
    done = {v for v, s in program.info.items() if s.section == "argument"}
    last = {}
    for k, stmt in enumerate(program.stmts):
        for var in stmt.reads:
            assert var in done, f"{stmt.var} reads {var} before it is computed"
            last[var] = k
        done.add(stmt.var)
    for var, k in last.items():
        assert program.info[var].last_use in (k, 1 << 30)


@pytest.mark.parametrize("source", [*SPECS, *(p.stem for p in EXAMPLES)])
def test_the_one_pass_order_reads_nothing_before_it_is_computed(source):
    if source in SPECS:
        text = HEAD.format(name=source) + SPECS[source][0]
    else:
        text = next(p for p in EXAMPLES if p.stem == source).read_text(encoding="utf-8")
    plan = attention_plan(symattn.load(text).typed)
    if plan is None:
        pytest.skip(f"{source} has no attention core")
    program = plan.program()
    before = [(s.var, s.last_use) for s in program.stmts]
    paired = one_pass(program)
    assert [(s.var, s.last_use) for s in program.stmts] == before  # the program itself is left as it was
    if paired is None:
        return
    _check_order(paired.program)
    stmts = paired.program.stmts
    for k, stmt in enumerate(stmts):
        node = stmt.node
        if type(node).__name__ == "FusedAttentionGrad" and node.core in paired.cores:
            assert type(stmts[k - 1].node).__name__ == "FusedAttention" and stmts[k - 1].node.core == node.core
            forward_var = stmts[k - 1].var
            reads_do = {n.name for n in walk_labelled(node.do) if isinstance(n, Var)}
            assert forward_var not in reads_do


@pytest.mark.parametrize("name", SPECS)
def test_tiled_gradients_against_finite_differences(name):
    typed, given, rng = _arrays(name, n=11)
    mod = load_module(spec(name).emit("numpy"))
    outs = mod.forward(**given)
    upstream = {f"grad_{o}": rng.standard_normal(outs[o].shape) for o in typed.outputs}
    _, grads = tiled(mod, 4, 3).forward_backward(**given, **upstream)
    mod.TILED_ABOVE = 1 << 62  # the loss from the plain forward: a pass of its own

    def loss(args):
        got = mod.forward(**args)
        return sum(np.sum(got[o] * upstream[f"grad_{o}"]) for o in typed.outputs)

    h = 1e-6
    for leaf in typed.differentiable:
        for _ in range(4):
            at = tuple(int(rng.integers(0, s)) for s in given[leaf].shape)
            plus = {n: a.copy() for n, a in given.items()}
            minus = {n: a.copy() for n, a in given.items()}
            plus[leaf][at] += h
            minus[leaf][at] -= h
            numeric = (loss(plus) - loss(minus)) / (2 * h)
            assert abs(grads[leaf][at] - numeric) < 1e-6 * max(1.0, abs(numeric)), (leaf, at)


def test_an_upstream_gradient_with_more_batch_axes():
    """grad_O of shape [3, 2, N, d] for inputs [2, N, d]: the outputs keep the inputs' batch axes (the plain
    pass's shapes), the gradients are summed back to them."""
    q, k, v = (np.random.default_rng(s).standard_normal((2, 7, 4)) for s in range(3))
    go = np.random.default_rng(3).standard_normal((3, 2, 7, 4))
    mod = load_module(spec("plain").emit("numpy"))
    want = mod.forward_backward(Q=q, K=k, V=v, grad_O=go)
    got = tiled(mod, 3, 2).forward_backward(Q=q, K=k, V=v, grad_O=go)
    for have, expected in [(got[0]["O"], want[0]["O"])] + [(got[1][n], want[1][n]) for n in "QKV"]:
        assert have.shape == expected.shape
        np.testing.assert_allclose(have, expected, rtol=1e-10, atol=1e-12)
    assert got[0]["O"].shape == (2, 7, 4)


def test_a_score_whose_derivative_is_its_argument_torch():
    """d score / d s = s (the closure returns the block itself): the torch module's tiled backward keeps it
    apart from the block the score overwrites, as the NumPy one pass does; against the plain NumPy pass."""
    torch = pytest.importorskip("torch", reason="the torch target needs torch")
    from symattn.codegen.torch import load_torch_module

    typed, given, rng = _arrays("squared_score", n=13)
    upstream = {"grad_O": rng.standard_normal((2, 13, 4))}
    want = load_module(spec("squared_score").emit("numpy")).forward_backward(**given, **upstream)[1]
    module = load_torch_module(spec("squared_score").emit("torch"), "squared_score")
    module.BLOCK_Q, module.BLOCK_K = 4, 3
    got = module.forward_backward(**{n: torch.from_numpy(x) for n, x in {**given, **upstream}.items()})[1]
    for name in typed.differentiable:
        np.testing.assert_allclose(got[name].numpy(), want[name], rtol=1e-10, atol=1e-12)
