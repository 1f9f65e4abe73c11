"""The fused path holds memory linear in N on every target, for every reference spec the plan fuses.

NumPy: tracemalloc's peak of one forward and backward at N = 1024 and 4096 (a [N, N] array grows 16
times, the tiled pass about 4). torch (CPU): the peak resident memory of a fresh process running the
module at N = 4096 after a run at N = 256 (its inputs made before) grows by less than one [4096, 4096]
float32 array. Triton and
CUDA: no value their program computes (the Triton module's torch statements, the CUDA plan's workspace) has
a query axis and a key axis; the kernels themselves hold tiles.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tracemalloc

import numpy as np
import pytest

import symattn
from symattn.codegen.arrays.module import load_module

from conftest import EXAMPLES, REPO, module_arguments

FUSED = [p.stem for p in EXAMPLES if symattn.load(p).plan().cores]
SIZES = {"prefix_lm": {"L": 64}}  # dims no array gives


def _leaves(spec, n: int, width: int = 16, dtype=np.float32, seed=0):
    """Given tensors at N = n (every sequence dim n, every width `width`, the other dims as the spec has them),
    upstream gradients, and the size keywords."""
    rng = np.random.default_rng(seed)
    typed = spec.typed
    sizes = {d: n if d in ("N", "M", "T") else width if d.startswith("d") else typed.sizes[d] for d in typed.dims}
    if "H" in sizes and "W" in sizes and "N" not in sizes:  # a 2-D grid of H x W tokens (NATTEN): n of them
        sizes.update(H=n // 32, W=32)
    sizes.update(SIZES.get(typed.name, {}))
    typed = symattn.load(typed.source, dims=sizes, filename=typed.filename).typed
    leaves = {}
    for name in typed.given:
        value = rng.standard_normal(typed.concrete_shape(typed.tensors[name].shape)).astype(dtype)
        if typed.tensors[name].integer:  # document ids, offsets, image intervals: integers in their range
            value = rng.integers(*typed.integer_range(name), size=value.shape)
        elif typed.tensors[name].kind == "buffer":
            value = np.abs(value)  # padding and dropout buffers: every key kept
        leaves[name] = value
    leaves = module_arguments(typed, leaves)  # a dropout mask is drawn by the module, from the seed
    upstream = {f"grad_{o}": rng.standard_normal(typed.concrete_shape(typed.tensors[o].shape)).astype(dtype)
                for o in typed.outputs}
    keywords = {d: sizes[d] for d in SIZES.get(typed.name, {})}
    if "H" in sizes and "W" in sizes and "N" not in sizes:
        keywords.update(H=sizes["H"], W=sizes["W"])  # no array has an axis of size H or W alone
    return leaves, upstream, keywords


def _square(program):
    """Statements whose value has a query axis and a key axis (an [N, N] array)."""
    out = []
    for core in program.cores.values():
        rows, keys = str(core.n_q), str(core.n_k)
        for stmt in program.stmts:
            shape = [str(d) for d in stmt.shape]
            if len(shape) >= 2 and shape[-2] == rows and shape[-1] == keys:
                out.append(stmt.title or stmt.var)
    return out


@pytest.mark.slow  # seconds of work: the slow step runs it (the README's command stays under 5 min)
@pytest.mark.parametrize("name", FUSED)
def test_numpy_tiled_pass_memory_is_linear(name):
    spec = symattn.load(REPO / "derivations" / f"{name}.attn")
    module = load_module(spec.emit("numpy"), f"memory_{name}")
    module.TILED_ABOVE, module.THREADS = 0, 1
    peaks = {}
    for n in (1024, 4096):
        leaves, upstream, keywords = _leaves(spec, n)
        module.forward_backward(**leaves, **upstream, **keywords)
        tracemalloc.start()
        base = tracemalloc.get_traced_memory()[0]
        module.forward_backward(**leaves, **upstream, **keywords)
        peaks[n] = tracemalloc.get_traced_memory()[1] - base
        tracemalloc.stop()
    assert peaks[4096] < 8 * peaks[1024], peaks
    assert peaks[4096] < 4096 * 4096 * 4, peaks  # less than one [N, N] float32 array


_CHILD = """
import json, resource, sys
import numpy as np
import torch
import symattn
sys.path[:0] = [{tests!r}, {root!r}]
from test_fused_memory import _leaves
from symattn.codegen.torch import load_torch_module
torch.set_num_threads(1)
spec = symattn.load({path!r})
module = load_torch_module(spec.emit("torch"), "memory")
def run(leaves, upstream, keywords):
    module.forward_backward(**{{k: torch.from_numpy(v) if isinstance(v, np.ndarray) else v
                               for k, v in leaves.items()}},
                            **{{k: torch.from_numpy(v) for k, v in upstream.items()}}, **keywords)
large = _leaves(spec, 4096)  # (made first: a given [N, N] buffer, a dropout mask, is the caller's memory)
run(*_leaves(spec, 256))
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
run(*large)
print(json.dumps([before, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss]))
"""


@pytest.mark.slow
@pytest.mark.parametrize("name", FUSED)
def test_torch_module_memory_is_linear(name):
    pytest.importorskip("torch", reason="the torch target needs torch")
    code = _CHILD.format(tests=str(REPO / "tests" / "codegen" / "all_targets"), root=str(REPO / "tests"),
                         path=str(REPO / "derivations" / f"{name}.attn"))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600, cwd=REPO)
    assert done.returncode == 0, done.stderr[-3000:]
    before, after = json.loads(done.stdout.strip().splitlines()[-1])
    grown = (after - before) * 1024  # ru_maxrss is in KiB on Linux
    assert grown < 4096 * 4096 * 4, f"{name}: the peak grew by {grown / 2**20:.0f} MiB from N = 256 to 4096"


@pytest.mark.parametrize("name", FUSED)
def test_no_target_computes_a_score_sized_value(name):
    """The plan's program (what NumPy, torch and the Triton module print around their fused cores) and the CUDA
    plan's workspace hold no [N, N] value."""
    spec = symattn.load(REPO / "derivations" / f"{name}.attn")
    plan = spec.plan()
    assert not _square(plan.program()), name
    cuda = spec.emit("cuda").plan
    assert cuda.path == "fused"
    cores = {str(c.n_q) for c in cuda.cores}, {str(c.n_k) for c in cuda.cores}
    square = [b.name for b in cuda.workspace if len(b.shape) >= 2 and str(b.shape[-2]) in cores[0]
              and str(b.shape[-1]) in cores[1]]
    assert not square, (name, square)
