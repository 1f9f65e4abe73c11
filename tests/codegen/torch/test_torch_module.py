"""The PyTorch target (`symattn emit torch`, `spec.torch()`): every spec in derivations/.

Compared with independent computations: the generated NumPy module (itself
checked against the reference evaluator), a plain torch forward with torch
autograd written here, torch's gradcheck (finite differences in float64), and
the single-process gradients for the distributed test.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (pip install 'symattn[torch]')")

import symattn  # noqa: E402
from symattn.codegen.arrays.module import size_keywords  # noqa: E402
from conftest import DROPOUT_SEED, REPO, module_arguments, run_cli  # noqa: E402
from symattn.check.numpy import relative_error  # noqa: E402
from symattn.codegen.torch import load_torch_module as load_module  # noqa: E402
from symattn.errors import SymAttnError, UsageError  # noqa: E402
from symattn.symbolic.evaluate import random_leaves  # noqa: E402

SPECS = sorted(p.stem for p in (REPO / "derivations").glob("*.attn"))


@pytest.fixture(scope="module")
def modules():
    """name -> (spec, generated torch module, generated NumPy module)."""
    out = {}
    for name in SPECS:
        spec = symattn.load(REPO / "derivations" / f"{name}.attn")
        out[name] = (spec, load_module(spec.emit("torch"), f"torch_{name}"), spec.numpy())
    return out


def _leaves(spec, seed=0, batch=(2,)):
    rng = np.random.default_rng(seed)
    typed = spec.typed
    data = set(typed.inputs) | set(typed.buffers)
    leaves = {n: random_leaves(typed, rng, batch if n in data else (), typed.sizes)[n] for n in typed.given}
    return module_arguments(typed, leaves), rng


@pytest.mark.parametrize("name", SPECS)
def test_outputs_and_gradients_equal_the_numpy_module(name, modules):
    spec, tm, nm = modules[name]
    leaves, rng = _leaves(spec)
    want = nm.forward(**leaves)
    upstream = {f"grad_{o}": rng.standard_normal(want[o].shape) for o in spec.outputs}
    want_grads = nm.backward(**leaves, **upstream)
    # autograd through the custom op
    tensors = {n: torch.tensor(v, requires_grad=n in spec.typed.differentiable) for n, v in leaves.items()}
    got = tm.forward(**tensors)
    for o in spec.outputs:
        assert got[o].dtype == torch.float64
        assert relative_error(got[o].detach().numpy(), want[o]) < 1e-12
    loss = sum((got[o] * torch.tensor(upstream[f"grad_{o}"])).sum() for o in spec.outputs)
    loss.backward()
    direct = tm.backward(**{n: torch.tensor(v) for n, v in leaves.items()},
                         **{k: torch.tensor(v) for k, v in upstream.items()})
    assert set(direct) == set(spec.typed.differentiable) == set(want_grads)
    for n in spec.typed.differentiable:
        assert tensors[n].grad.shape == tensors[n].shape
        assert relative_error(tensors[n].grad.numpy(), want_grads[n]) < 1e-10, n
        assert relative_error(direct[n].numpy(), want_grads[n]) < 1e-10, n
    for n in spec.typed.buffers:
        if n in spec.typed.arguments:  # (a dropout mask is drawn, not given)
            assert tensors[n].grad is None


TILED = [name for name in SPECS if "_flash_forward(" in symattn.load(REPO / "derivations" / f"{name}.attn").emit("torch")]


@pytest.mark.parametrize("blocks", [(1, 1), (4, 3)], ids=["1x1", "4x3"])
@pytest.mark.parametrize("name", TILED)
def test_tiled_strips_and_groups_equal_the_numpy_module(name, blocks):
    """At N = 21 with blocks of 1 x 1 (strips of 16: two per pass; every visible key of a row is inside
    its mask's bounds) and of 4 x 3 (blocks that straddle a mask's bound, next to ones that do not) and one
    batch entry per group, heads and masks included, the tiled torch module gives the NumPy module's
    outputs and gradients."""
    spec = symattn.load(REPO / "derivations" / f"{name}.attn")
    tm = load_module(spec.emit("torch"), f"torch_strips_{name}")
    tm.BLOCK_Q, tm.BLOCK_K = blocks
    groups = tm._groups
    tm._groups = lambda q, lead, per: groups(q, lead, per, 1)
    typed = spec.typed
    sizes = {**typed.sizes, "N": 21} if "N" in typed.sizes else typed.sizes
    rng = np.random.default_rng(5)
    data = set(typed.inputs) | set(typed.buffers)
    leaves = module_arguments(typed, {n: random_leaves(typed, rng, (2,) if n in data else (), sizes)[n]
                                      for n in typed.given})
    keywords = {n: sizes[n] for n in size_keywords(typed)}
    want = spec.numpy().forward(**leaves, **keywords)
    upstream = {f"grad_{o}": rng.standard_normal(want[o].shape) for o in spec.outputs}
    want_grads = spec.numpy().backward(**leaves, **upstream, **keywords)
    outs, grads = tm.forward_backward(**{n: torch.tensor(v) for n, v in leaves.items()},
                                      **{k: torch.tensor(v) for k, v in upstream.items()}, **keywords)
    for o in spec.outputs:
        assert relative_error(outs[o].numpy(), want[o]) < 1e-12, o
    for n in typed.differentiable:
        assert relative_error(grads[n].numpy(), want_grads[n]) < 1e-10, n


@pytest.mark.parametrize("name", SPECS)
def test_gradcheck_float64(name, modules):
    spec, tm, _ = modules[name]
    leaves, _ = _leaves(spec, seed=1, batch=())
    tensors = [torch.tensor(leaves[n], requires_grad=n in spec.typed.differentiable) for n in spec.typed.arguments]
    # dims that no tensor's shape gives (a window width) follow the tensors, at the spec's sizes, then the seed
    sizes = [spec.typed.dims[n].default for n in size_keywords(spec.typed)]
    sizes += [DROPOUT_SEED] if spec.typed.dropouts else []
    assert torch.autograd.gradcheck(lambda *a: tuple(tm.op(*a, *sizes)[: len(spec.outputs)]), tensors, eps=1e-6,
                                    atol=1e-7, rtol=1e-5)
    assert torch.autograd.gradcheck(lambda *a: tm.Function.apply(*a, *sizes), tensors, eps=1e-6, atol=1e-7,
                                    rtol=1e-5)


def test_self_attention_against_plain_torch_autograd(modules):
    spec, tm, _ = modules["self_attention"]
    g = torch.Generator().manual_seed(3)
    X, W_q, W_k, W_v = (torch.randn(*s, generator=g, dtype=torch.float64, requires_grad=True)
                        for s in [(3, 5, 4), (4, 2), (4, 2), (4, 2)])
    grad_O = torch.randn(3, 5, 2, generator=g, dtype=torch.float64)

    def plain(X, W_q, W_k, W_v):
        Q, K, V = X @ W_q, X @ W_k, X @ W_v
        return torch.softmax(Q @ K.transpose(-1, -2) / 2 ** 0.5, dim=-1) @ V

    want = plain(X, W_q, W_k, W_v)
    want_grads = torch.autograd.grad(want, (X, W_q, W_k, W_v), grad_O)
    got = tm.forward(X=X, W_q=W_q, W_k=W_k, W_v=W_v)["O"]
    got_grads = torch.autograd.grad(got, (X, W_q, W_k, W_v), grad_O)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    for a, b in zip(got_grads, want_grads):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


STRICT_CAUSAL = """
attention strict_causal
dim N = 4, d = 3
input Q[N, d], K[N, d], V[N, d]
M[i:N, j:N] = where(j < i, 0, -inf)   # row 0 sees nothing
O = softmax(Q @ K.T + M, axis=-1) @ V
output O
"""


def test_fully_masked_rows_give_zero_not_nan():
    spec = symattn.load(STRICT_CAUSAL)
    tm = load_module(spec.emit("torch"), "torch_strict_causal")
    q, k, v = (torch.randn(2, 4, 3, dtype=torch.float64, requires_grad=True) for _ in range(3))
    out = tm.forward(Q=q, K=k, V=v)["O"]
    assert torch.equal(out[:, 0], torch.zeros(2, 3, dtype=torch.float64))
    out.sum().backward()
    for t in (q, k, v):
        assert torch.isfinite(t.grad).all()
    assert torch.equal(q.grad[:, 0], torch.zeros(2, 3, dtype=torch.float64))
    # key padding with every key padded: every row masked
    spec, kp = symattn.load(REPO / "derivations" / "key_padding.attn"), None
    kp = load_module(spec.emit("torch"), "torch_kp_masked")
    X = torch.randn(4, 3, dtype=torch.float64, requires_grad=True)
    params = {n: torch.randn(3, 2, dtype=torch.float64, requires_grad=True) for n in ("W_q", "W_k", "W_v")}
    O = kp.forward(X=X, keep=-torch.ones(4, dtype=torch.float64), **params)["O"]
    assert torch.equal(O, torch.zeros(4, 2, dtype=torch.float64))
    O.sum().backward()
    assert torch.isfinite(X.grad).all() and all(torch.isfinite(p.grad).all() for p in params.values())


LOGSUMEXP_ROWS = """attention lse_rows
dim N = 3, d = 2
input X[N, d]
L = logsumexp(-log(X * X), axis=-1)
output L
"""


def test_logsumexp_of_rows_with_inf_matches_plain_numpy():
    """A row holding +inf (-log(0)) gives NaN, as the stable formula the language names does in
    plain NumPy (and the NumPy target); a row of -inf gives -inf; torch.logsumexp would give +inf."""
    spec = symattn.load(LOGSUMEXP_ROWS)
    tm = load_module(spec.emit("torch"), "torch_lse_rows")
    x = np.array([[0.0, 2.0], [0.5, 0.25], [np.inf, np.inf]])
    z = -np.log(x * x)
    with np.errstate(invalid="ignore"):
        top = np.maximum(np.max(z, axis=-1, keepdims=True), np.finfo(np.float64).min)  # -inf rows: log(0)
        want = np.log(np.exp(z - top).sum(axis=-1, keepdims=True)) + top
    assert np.isnan(want[0, 0]) and want[2, 0] == -np.inf  # the cases this test is about
    got = tm.forward(X=torch.tensor(x))["L"].numpy()
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_allclose(got[~np.isnan(got)], want[~np.isnan(want)], rtol=1e-15)
    np.testing.assert_array_equal(np.isnan(spec.numpy().forward(X=x)["L"]), np.isnan(want))


@pytest.mark.parametrize("dtype,tolerance", [(torch.float32, 1e-5), (torch.bfloat16, 5e-2), (torch.float16, 5e-3)])
def test_low_precision_dtypes_are_kept(dtype, tolerance, modules):
    spec, tm, _ = modules["causal"]
    leaves, _ = _leaves(spec, seed=2)
    exact = tm.forward_backward(**{n: torch.tensor(v) for n, v in leaves.items()},
                                grad_O=torch.ones(2, 4, 2, dtype=torch.float64))
    tensors = {n: torch.tensor(v, dtype=dtype, requires_grad=True) for n, v in leaves.items()}
    out = tm.forward(**tensors)["O"]
    assert out.dtype == dtype
    out.sum().backward()
    assert relative_error(out.detach().double().numpy(), exact[0]["O"].numpy()) < tolerance
    for n, t in tensors.items():
        assert t.grad.dtype == dtype
        assert relative_error(t.grad.double().numpy(), exact[1][n].numpy()) < 4 * tolerance, n


def test_shape_errors_are_value_errors(modules):
    spec, tm, _ = modules["self_attention"]
    with pytest.raises(ValueError, match=r"W_q: expected shape \[d, d_k\]"):
        tm.forward(X=torch.randn(4, 3), W_q=torch.randn(5, 2), W_k=torch.randn(3, 2), W_v=torch.randn(3, 2))


UNFUSED = """
attention unfused
dim N = 4, d = 3
input Q[N, d], K[N, d], V[N, d]
S = Q @ K.T + sum(Q, axis=-1)
P = softmax(S, axis=-1)
O = P @ V
output O
"""


def test_recomputes_softmax_from_the_row_logsumexp():
    spec = symattn.load(UNFUSED)  # a row sum of Q in the score: no fused core (the plan says so), the plain form
    assert any("not a per-entry operation" in note for note in spec.plan().notes)
    source = spec.emit("torch")
    assert "P, P_lse = _softmax_lse_(S, axis=-1)" in source
    assert "return [O], [P_lse]" in source  # no [N, N] tensor is saved (Q, K and V are inputs)
    assert "np." not in source


def test_fused_core_is_tiled_and_saves_only_its_logsumexp(modules):
    spec = modules["self_attention"][0]
    source = spec.emit("torch")
    assert "O_core = _Score(O_score, None, None, None, None, d_k ** -0.5, 0, None, ())" in source
    assert "O, O_lse = _flash_forward(Q, K, V, (), O_core, BLOCK_Q, BLOCK_K)" in source
    assert "return [O], [Q, K, V, O_lse]" in source  # no [N, N] tensor is saved, none is made
    assert "np." not in source


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_torch_compile_keeps_the_custom_op(backend, modules):
    torch._dynamo.reset()
    spec, tm, _ = modules["key_padding"]
    leaves, _ = _leaves(spec, seed=4)

    def loss(**tensors):
        return (tm.forward(**tensors)["O"] ** 2).sum()

    compiled = torch.compile(loss, backend=backend, fullgraph=True)
    results = []
    for fn in (loss, compiled):
        tensors = {n: torch.tensor(v, requires_grad=n in spec.typed.differentiable) for n, v in leaves.items()}
        value = fn(**tensors)
        value.backward()
        results.append((value.detach(), [tensors[n].grad for n in spec.typed.differentiable]))
    torch.testing.assert_close(results[0][0], results[1][0])
    for a, b in zip(results[0][1], results[1][1]):
        torch.testing.assert_close(a, b)


def test_spec_torch_module_trains():
    torch.manual_seed(0)
    spec = symattn.load(REPO / "derivations" / "key_padding.attn")
    model = spec.torch(backend="eager")
    assert sorted(n for n, _ in model.named_parameters()) == ["W_k", "W_q", "W_v"]
    assert model.W_q.shape == (3, 2)
    X = torch.randn(8, 4, 3)
    keep = torch.ones(8, 4)
    keep[:, -1] = 0
    target = torch.randn(8, 4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.2)
    losses = []
    for _ in range(20):
        loss = ((model(X=X, keep=keep)["O"] - target) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.9 * losses[0]
    model = model.double()
    assert model(X=X.double(), keep=keep.double())["O"].dtype == torch.float64
    assert model.to("cpu") is model


def test_spec_torch_backends_and_errors():
    spec = symattn.load(REPO / "derivations" / "self_attention.attn")
    with pytest.raises(UsageError, match="unknown backend"):
        spec.torch(backend="cuda")
    model = spec.torch(backend="triton")
    if os.environ.get("TRITON_INTERPRET") != "1":
        with pytest.raises(SymAttnError, match="Triton|TRITON_INTERPRET"):
            model(X=torch.randn(4, 3))
    with pytest.raises(TypeError, match="missing inputs"):
        spec.torch()()
    assert spec.torch(backend="auto")(X=torch.randn(4, 3))["O"].shape == (4, 2)  # CPU: eager


def test_cli_emit_torch(tmp_path):
    out = tmp_path / "causal_torch.py"
    result = run_cli("emit", "torch", str(REPO / "derivations" / "causal.attn"), "-o", str(out))
    assert result.returncode == 0, result.stderr
    assert "import torch" in out.read_text()


def test_verify_torch_report(modules):
    from symattn.check.torch import verify_torch

    report = verify_torch(modules["self_attention"][0].typed)
    assert report.ok and len(report.rows) >= 10
    assert {r.phase for r in report.rows} == {"forward", "backward"}


@pytest.mark.slow
def test_cli_verify_torch():
    result = run_cli("verify", str(REPO / "derivations" / "causal.attn"), "--target", "torch")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "tensors within tolerance" in result.stdout and "FAIL" not in result.stdout


def test_readme_training_example(monkeypatch):
    readme = (REPO / "README.md").read_text("utf-8")
    start = readme.index("import torch, symattn")
    code = readme[start: readme.index("```", start)]
    assert len(code.strip().splitlines()) <= 10
    monkeypatch.chdir(REPO)
    namespace: dict = {}
    exec(compile(code, "README.md", "exec"), namespace)
    assert namespace["loss"].item() < 1.0


def _wrap_ddp(model, world):
    return torch.nn.parallel.DistributedDataParallel(model)


def _wrap_fsdp2(model, world):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import DTensor

    fully_shard(model, mesh=init_device_mesh("cpu", (world,)))
    # FSDP2 really shards: every parameter is a DTensor whose local piece is a part of it
    for p in model.parameters():
        assert isinstance(p, DTensor) and p.to_local().numel() < p.numel()
    return model


def _full_grad(p):
    grad = p.grad
    return grad.full_tensor() if hasattr(grad, "full_tensor") else grad


_WRAPPERS = {"ddp": _wrap_ddp, "fsdp2": _wrap_fsdp2}


def _distributed_worker(rank, world, port, how, X, keep, target, result):
    import torch.distributed as dist

    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(0)
    model = symattn.load(REPO / "derivations" / "key_padding.attn").torch(backend="eager").double()
    wrapped = _WRAPPERS[how](model, world)
    half = X.shape[0] // world
    part = slice(rank * half, (rank + 1) * half)
    loss = ((wrapped(X=X[part], keep=keep[part])["O"] - target[part]) ** 2).mean()
    loss.backward()
    # every rank takes part in full_tensor()'s all-gather; rank 0 reports
    grads = {n: _full_grad(p).detach().numpy().copy() for n, p in model.named_parameters()}
    if rank == 0:
        # NumPy copies travel by value: a torch tensor would travel as a shared-memory handle that
        # dies with this process, and the parent may read the queue after it has exited
        result.put(grads)
    # both ranks past every collective before either tears gloo down: under load a rank that destroyed
    # its group early made the other abort in teardown ("terminate called without an active exception")
    dist.barrier()
    dist.destroy_process_group()


@pytest.mark.slow
@pytest.mark.parametrize("how", sorted(_WRAPPERS))
def test_distributed_gloo_averaged_gradients_equal_single_process(how):
    import socket

    import torch.multiprocessing as mp

    g = torch.Generator().manual_seed(5)
    X = torch.randn(4, 4, 3, generator=g, dtype=torch.float64)
    keep = (torch.rand(4, 4, generator=g) > 0.3).double()
    target = torch.randn(4, 4, 2, generator=g, dtype=torch.float64)
    torch.manual_seed(0)
    single = symattn.load(REPO / "derivations" / "key_padding.attn").torch(backend="eager").double()
    ((single(X=X, keep=keep)["O"] - target) ** 2).mean().backward()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    result = ctx.Queue()
    procs = [ctx.Process(target=_distributed_worker, args=(r, 2, port, how, X, keep, target, result))
             for r in range(2)]
    for p in procs:
        p.start()
    grads = result.get(timeout=120)
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    for n, p in single.named_parameters():
        torch.testing.assert_close(torch.from_numpy(grads[n]), p.grad, rtol=1e-12, atol=1e-14)


EXTREME = """
attention extreme
dim N = 8, d = 4
input Q[N, d], K[N, d], V[N, d]
buffer B[N, N]
O = softmax(Q @ K.T + B, axis=-1) @ V
output O
"""


def _attention_reference(q, k, v, b, grad_o):
    """Plain float64 NumPy attention and its gradients: a fully masked row gets weights 0."""
    s = q @ k.T + b
    top = s.max(axis=-1, keepdims=True)
    top = np.where(top == -np.inf, 0, top)
    p = np.exp(s - top)
    p /= np.where(p.sum(axis=-1, keepdims=True) == 0, 1, p.sum(axis=-1, keepdims=True))
    o = p @ v
    dp = grad_o @ v.T
    ds = p * (dp - (dp * p).sum(axis=-1, keepdims=True))
    return o, ds @ k, ds.T @ q, p.T @ grad_o


@pytest.mark.parametrize("dtype,tolerance", [(torch.float64, 1e-12), (torch.float32, 1e-5)])
@pytest.mark.parametrize("blocks", [(3, 2), (256, 128)], ids=["3x2", "default"])
def test_extreme_scores_equal_plain_numpy(dtype, tolerance, blocks):
    """Rows whose scores spread over hundreds (exp underflows: the weights of far keys are 0), scores
    offset by 1e4, -inf entries, a fully masked row (weights 0, output 0) and a row with a single visible
    key, through the tiled torch module (exp taken as exp2), against plain float64 NumPy."""
    n, d = 11, 4
    rng = np.random.default_rng(7)
    q, k, v, grad_o = (rng.standard_normal((n, d)) for _ in range(4))
    b = rng.standard_normal((n, n))
    b[0] = rng.uniform(-400, 0, n)             # spread: most weights underflow to 0
    b[1] += 1e4                                 # large offset, small spread
    b[2] = -np.inf                              # fully masked
    b[3, :] = -np.inf
    b[3, 5] = 0.0                               # one visible key
    b[4:, :][np.triu_indices(n - 4, 1)] = -np.inf  # causal-like -inf corner
    b[5, 2] = -1e4
    want = _attention_reference(q, k, v, b, grad_o)
    tm = load_module(symattn.load(EXTREME).emit("torch"), "torch_extreme")
    tm.BLOCK_Q, tm.BLOCK_K = blocks
    t = {name: torch.tensor(x, dtype=dtype, requires_grad=name != "B") for name, x in
         (("Q", q), ("K", k), ("V", v), ("B", b))}
    out = tm.forward(**t)["O"]
    out.backward(torch.tensor(grad_o, dtype=dtype))
    got = (out, t["Q"].grad, t["K"].grad, t["V"].grad)
    assert not np.isnan(out.detach().numpy()).any()
    assert (out.detach().numpy()[2] == 0).all()
    # float32 rounds scores near 1e4 to 1e-3: the bar is the plain float32 computation's own error, x10
    plain = _attention_reference(*(x.astype(np.float32) for x in (q, k, v, b, grad_o)))
    for name, g, w, f in zip(("O", "dQ", "dK", "dV"), got, want, plain):
        bar = max(tolerance, 10 * relative_error(f.astype(np.float64), w))  # lse recomputed: a little more
        assert relative_error(g.detach().double().numpy(), w) < bar, name
    assert (t["Q"].grad.numpy()[2] == 0).all()  # the fully masked row has no gradient
