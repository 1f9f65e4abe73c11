"""The Triton target on the peer variants of test_peer_variants.py: its kernels under TRITON_INTERPRET=1 against
the dense torch references written there from each peer's definition, in float32 and in bfloat16 (against
the reference run in bfloat16). Triton fixes its interpreter mode at its first import: the variable is set
before it."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("TRITON_INTERPRET", "1")
torch = pytest.importorskip("torch", reason="the Triton target needs torch (pip install symattn[torch])")
pytest.importorskip("triton", reason="the Triton target needs triton (pip install symattn[torch])")

from symattn.check.triton import interpreting, load_module as load_triton  # noqa: E402

from test_peer_variants import VARIANTS, _check, _leaves, _reference, _spec  # noqa: E402

if not interpreting() and not torch.cuda.is_available():
    pytest.skip("triton was imported without TRITON_INTERPRET=1 in this process", allow_module_level=True)


@pytest.mark.parametrize("name", VARIANTS)
def test_triton_kernels_against_the_dense_reference(name):
    leaves, upstream, sizes = _leaves(name)
    module = load_triton(_spec(name).emit("triton").text, interpret=not torch.cuda.is_available())
    for dtype, tolerance in ((torch.float32, 2e-5), (torch.bfloat16, 3e-2)):
        want = _reference(name, leaves, upstream, torch.float64 if dtype == torch.float32 else dtype)
        tensors = {k: torch.tensor(v, dtype=dtype) for k, v in leaves.items()}
        outs, grads = module.forward_backward(**tensors, **{k: torch.tensor(v, dtype=dtype)
                                                            for k, v in upstream.items()}, **sizes)
        _check(name, {k: v.float() for k, v in outs.items()}, {k: v.float() for k, v in grads.items()},
               {k: v.float() for k, v in want[0].items()}, {k: v.float() for k, v in want[1].items()}, tolerance,
               f"triton {dtype}")


# The mask language's reference specs (test_mask_language.py's peer definitions) that the plan fuses.
from test_mask_language import VARIANTS as MASKS  # noqa: E402
from test_mask_language import _check as _check_mask, _leaves as _mask_leaves  # noqa: E402
from test_mask_language import _reference as _mask_reference, _spec as _mask_spec  # noqa: E402

FUSED_MASKS = [name for name in MASKS if name != "paged_decode"]  # a decode step of index sums: no core


@pytest.mark.parametrize("name", FUSED_MASKS)
def test_triton_kernels_against_the_peer_masks(name):
    leaves, integers, upstream, sizes = _mask_leaves(name)
    module = load_triton(_mask_spec(name).emit("triton").text, interpret=not torch.cuda.is_available())
    for dtype, tolerance in ((torch.float32, 2e-5), (torch.bfloat16, 3e-2)):
        want = _mask_reference(name, leaves, integers, upstream, torch.float64 if dtype == torch.float32 else dtype)
        tensors = {k: torch.tensor(v, dtype=dtype) for k, v in {**leaves, **upstream}.items()}
        outs, grads = module.forward_backward(**tensors, **{k: torch.from_numpy(v) for k, v in integers.items()},
                                              **sizes)
        _check_mask(name, {k: v.float() for k, v in outs.items()}, {k: v.float() for k, v in grads.items()},
                    tuple({k: v.float() for k, v in part.items()} for part in want), tolerance, f"triton {dtype}")


def test_a_buffer_mask_skips_the_tiles_it_hides_whole():
    """A mask that reads buffers (document ids) is tested per tile before its product: the forward's key loop and
    the backward's query and key loops skip a tile it hides whole; an index-only mask (a window) has static
    bounds instead. At N = 64, 8 documents of 8 tokens, 16 x 16 tiles (most of them hidden), the kernels give the
    peer definition's result."""
    import numpy as np

    import symattn
    from conftest import REPO
    from test_mask_language import _reference as reference

    source = _mask_spec("document_offsets").emit("triton").text
    assert source.count("if _O_live(") == 3  # fwd, dkdv, dq
    assert "_live(" not in _mask_spec("window_zero_side").emit("triton").text
    n, docs, width = 64, 8, 4
    spec = symattn.load(REPO / "derivations" / "document_offsets.attn", dims={"N": n, "D": docs, "d_k": width})
    module = load_triton(spec.emit("triton").text, interpret=not torch.cuda.is_available())
    rng = np.random.default_rng(2)
    leaves = {name: rng.standard_normal((1, n, width)) for name in "QKV"}
    leaves["slope"] = np.array(0.01)
    integers = {"doc": np.repeat(np.arange(docs), n // docs)[None], "offsets": (np.arange(docs) * (n // docs))[None]}
    upstream = {"grad_O": rng.standard_normal((1, n, width))}
    want = reference("document_offsets", leaves, integers, upstream)
    outs, grads = module.forward_backward(**{k: torch.tensor(v, dtype=torch.float32) for k, v in
                                             {**leaves, **upstream}.items()},
                                          **{k: torch.from_numpy(v) for k, v in integers.items()})
    _check_mask("document_offsets", {k: v.double() for k, v in outs.items()}, {k: v.double() for k, v in grads.items()},
                want, 2e-5, "triton, tiles skipped")
