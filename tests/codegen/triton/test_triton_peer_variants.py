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
