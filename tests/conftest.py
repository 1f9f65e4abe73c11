"""Shared helpers for the spec tests: where the example specs are, how to run the CLI."""

from __future__ import annotations

import atexit
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

# Verdicts must not depend on how loaded the machine is: the tests give each claim a generous
# time budget (tests of the budget itself pass theirs explicitly). Set before symattn is imported.
os.environ.setdefault("SYMATTN_BUDGET", "120")

# Every test computes what it checks: the cache on disk (symattn.cache) is off, and points at a
# directory of this run, not the user's, for the tests of the cache that turn it on.
os.environ["SYMATTN_NO_CACHE"] = "1"
os.environ["SYMATTN_CACHE_DIR"] = tempfile.mkdtemp(prefix="symattn-test-cache-")
atexit.register(shutil.rmtree, os.environ["SYMATTN_CACHE_DIR"], ignore_errors=True)

REPO = Path(__file__).resolve().parent.parent
DATA = REPO / "tests" / "data"  # the test specs and sources that are not in derivations/
EXAMPLES = sorted((REPO / "derivations").glob("*.attn"))

# Cosine attention written as self-attention (derivations/cosine.attn is the cross-attention
# form): its QK-norm gradient exercises the simplifications (two paths to Q, ones folded).
COSINE_SELF_ATTENTION = DATA / "cosine_self_attention.attn"

# Tests are laid out by stage (front/, ir/, ..., codegen/<target>/, cli/), each file's name unique.
# A test module that shares another's helpers imports it by name (`from test_numpy_tiled import
# tiled`); pytest puts only the importing file's own directory on sys.path, so every test
# directory goes there, whichever module a worker happens to import first.
for _directory in sorted({path.parent for path in (REPO / "tests").rglob("test_*.py")}):
    if str(_directory) not in sys.path:
        sys.path.append(str(_directory))

if not EXAMPLES:  # pragma: no cover - the checkout is broken
    raise RuntimeError(f"no example specs found in {REPO / 'derivations'}")


def run_cli(*args: str, cwd: Path | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    """`python -m symattn ARGS` in a fresh interpreter, as a user would run it."""
    env = dict(os.environ)
    env.pop("PYTHONWARNINGS", None)
    return subprocess.run(
        [sys.executable, "-m", "symattn", *args],
        capture_output=True,
        text=True,
        encoding="utf-8",
        errors="replace",
        cwd=cwd or REPO,
        env=env,
        timeout=timeout,
    )


def run_main(*args: str) -> subprocess.CompletedProcess:
    """`symattn ARGS` in this process (`symattn.cli.main`), for tests that run a command once per
    spec: the same code and output as `run_cli` without starting an interpreter each time (the
    commands in fresh interpreters are tested by `run_cli`'s users and tests/cli/test_cli_exit.py)."""
    import contextlib
    import io

    from symattn.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(list(args))
        except SystemExit as done:  # argparse: --help, a usage error
            code = done.code if isinstance(done.code, int) else 2
    return subprocess.CompletedProcess(["symattn", *args], code, out.getvalue(), err.getvalue())


def slow_params(values, ids, slow):
    """pytest.param of each value, marked slow where its id is in `slow` (seconds each: the slow step runs them,
    so that the README's test command stays under 5 minutes on 2 cores)."""
    return [pytest.param(v, id=i, marks=[pytest.mark.slow] if i in slow else []) for v, i in zip(values, ids)]


DROPOUT_SEED = 2 ** 62 + 12345  # the seed generic tests hand a module whose spec has dropout (an int64: torch.tensor takes it)


def module_arguments(typed, leaves: dict, seed: int = DROPOUT_SEED) -> dict:
    """A generated module's keyword arguments from leaves drawn for every given tensor (`random_leaves`):
    dropout's masks left out (the module draws them), the seed added when the spec has dropout."""
    out = {n: v for n, v in leaves.items() if n not in typed.tensors or typed.tensors[n].dropout is None}
    if typed.dropouts:
        out[typed.seed_keyword] = seed
    return out


@pytest.fixture(params=EXAMPLES, ids=[p.stem for p in EXAMPLES])
def example(request) -> Path:
    """Each example spec in derivations/."""
    return request.param


def run_cuda_on_cpu(spec, given, upstream, sizes, batch, tmp_path, seed=None):
    """(outputs, gradients) by name from the emitted fp32 CUDA kernels built for the CPU (the emulation header)
    and called through their C API: `given` the arrays of the spec's given tensors (a batch axis on inputs and
    buffers; dropout's masks aside, drawn from `seed`), `upstream` grad_<output> arrays, `sizes` dims no array
    gives. Pointers pass as c_void_p."""
    import ctypes

    import numpy as np

    from symattn.check.cuda import build_cpu

    code = spec.emit("cuda")
    p = code.plan
    lib = ctypes.CDLL(str(build_cpu(code, tmp_path)))
    dims = {**{d: int(spec.typed.sizes[d]) for d in p.dims}, **sizes}
    for x in spec.typed.arguments:  # every dim from the arrays: a param's axes, or an input's after its batch axis
        shape = given[x].shape
        for axis, d in zip(shape[len(shape) - len(spec.typed.tensors[x].shape):], spec.typed.tensors[x].shape):
            if str(d) in dims:
                dims[str(d)] = axis
    ints = [*map(ctypes.c_int, [dims[d] for d in p.dims] + [batch])]
    tail = [ctypes.c_uint64(seed)] if p.seed else []  # dropout's seed, after the batch
    arrays = {}
    for b in (*p.inputs, *p.upstream):
        arrays[b.name] = np.ascontiguousarray((given if b.kind != "upstream" else upstream)[b.name], np.float32)
    for b in (*p.outputs, *p.gradients):
        source = upstream[f"grad_{b.name}"] if b.kind == "output" else given[b.name[len("grad_"):]]
        arrays[b.name] = np.zeros(source.shape, np.float32)
    ptrs = lambda buffers: [ctypes.c_void_p(arrays[b.name].ctypes.data) for b in buffers]  # noqa: E731
    for fn in ("workspace_bytes", "forward", "backward"):
        getattr(lib, f"{p.prefix}_{fn}").restype = ctypes.c_size_t if fn == "workspace_bytes" else ctypes.c_int
    workspace = np.zeros(getattr(lib, f"{p.prefix}_workspace_bytes")(*ints) // 4 + 1, np.float32)
    ws = ctypes.c_void_p(workspace.ctypes.data)
    assert getattr(lib, f"{p.prefix}_forward")(*ptrs((*p.inputs, *p.outputs)), ws, *ints, *tail, None) == 0
    assert getattr(lib, f"{p.prefix}_backward")(*ptrs((*p.inputs, *p.outputs, *p.upstream, *p.gradients)), ws,
                                                *ints, *tail, None) == 0
    return ({b.name: arrays[b.name] for b in p.outputs},
            {b.name[len("grad_"):]: arrays[b.name] for b in p.gradients})
