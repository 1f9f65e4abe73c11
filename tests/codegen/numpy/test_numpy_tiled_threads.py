"""The generated NumPy module's tiled pass on several threads (issue 14) against its plain pass.

The tiled pass cuts its (batch entry, query block) units into THREADS runs of
consecutive units (`_runs`) and runs them at once on threads of their own
(`_run`) while threadpoolctl holds BLAS to one thread; without threadpoolctl
the same runs go one after another. Each run writes its own rows of o, lse
and dq; dk and dv of an entry that several runs share are summed by the first
in place and by each other in an array of its own, added in run order. Here
the runs are forced onto threads (threadpoolctl or not: `_one_blas_thread`
patched to a context that limits nothing) or forced one after another, with
2 and 3 threads, N not a multiple of the blocks, entries shared by runs, and
compared with the plain pass in float64 and, bit for bit, with each other.
"""

from __future__ import annotations

import copy

import contextlib
import threading

import numpy as np
import pytest

from test_numpy_tiled import VARIANTS, inputs, module, reference, tiled

# how the runs go: on threads of their own, or one after another (as without threadpoolctl)
MODES = {"threads": contextlib.nullcontext, "in turn": lambda: None}


def threaded(mod, threads, mode, monkeypatch):
    mod.THREADS = threads
    monkeypatch.setattr(mod, "_one_blas_thread", MODES[mode])
    return mod


def results(mod, q, k, v, do):
    outs, grads = mod.forward_backward(Q=q, K=k, V=v, grad_O=do)
    return [outs["O"], grads["Q"], grads["K"], grads["V"]]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("threads", [2, 3])
@pytest.mark.parametrize("batch", [(), (2,), (2, 3)])
@pytest.mark.parametrize("name", ["plain", "causal", "window", "strict_causal", "softcap_strict_causal"])
def test_threads_against_the_plain_pass_and_the_reference(name, batch, threads, mode, monkeypatch):
    """37 rows in blocks of 5 x 7 (8 query blocks per entry): with no batch axis every run shares the one
    entry; with 2 or 6 entries, 3 runs cut some entries between them."""
    q, k, v, do = inputs(n=37, batch=batch, seed=5)
    mod = module(name)
    plain = results(mod, q, k, v, do)
    mod = threaded(tiled(mod, 5, 7), threads, mode, monkeypatch)
    got = results(mod, q, k, v, do)
    want = reference(q, k, v, do, *VARIANTS[name][2:])
    for have, expected, untiled in zip(got, want, plain):
        assert np.all(np.isfinite(have))
        np.testing.assert_allclose(have, expected, rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(have, untiled, rtol=1e-10, atol=1e-12)
    runs = mod._runs(mod._units(int(np.prod(batch)), 37, 37, None, 5), threads)
    assert len(runs) == threads and runs[0][0] == 0 and runs[-1][1] == 8 * int(np.prod(batch))


@pytest.mark.parametrize("name, batch", [("causal", ()), ("window", (2,)), ("plain", (3,))])
def test_threads_and_turns_give_the_same_bits(name, batch, monkeypatch):
    """The runs' sums do not depend on how the runs interleave: on threads, one after another and again on
    threads, bit for bit (blocks of 16 x 16 over 400 rows, so that the threads overlap)."""
    q, k, v, do = inputs(n=400, d=16, batch=batch, seed=7)
    mod = tiled(module(name), 16, 16)
    runs = {mode: results(threaded(mod, 3, mode, monkeypatch), q, k, v, do) for mode in MODES}
    again = results(threaded(mod, 3, "threads", monkeypatch), q, k, v, do)
    want = reference(q, k, v, do, *VARIANTS[name][2:])
    for on_threads, in_turn, repeated, expected in zip(runs["threads"], runs["in turn"], again, want):
        np.testing.assert_array_equal(on_threads, in_turn)
        np.testing.assert_array_equal(on_threads, repeated)
        np.testing.assert_allclose(on_threads, expected, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("threads", [2, 3])
def test_fully_masked_rows_give_zeros_on_threads(threads, monkeypatch):
    q, k, v, do = inputs(n=19, batch=(2,))
    mod = threaded(tiled(module("strict_causal"), 4, 4), threads, "threads", monkeypatch)
    o, dq, dk, dv = results(mod, q, k, v, do)
    assert np.all(o[..., 0, :] == 0) and np.all(dq[..., 0, :] == 0)
    assert all(np.all(np.isfinite(x)) for x in (o, dq, dk, dv))
    assert np.all(dk[..., -1, :] == 0) and np.all(dv[..., -1, :] == 0)  # the last key: no row sees it


@pytest.mark.parametrize("name", ["plain", "causal"])
@pytest.mark.parametrize("threads", [2, 3])
def test_nan_in_an_input_reaches_the_same_entries_on_threads(name, threads, monkeypatch):
    """A NaN in one query row: without a mask, the same NaN entries as the plain pass; causal, as the tiled
    pass on one thread (the plain pass also spreads it to the keys the row never sees, through exp(-inf - NaN);
    the tiled pass never computes those blocks)."""
    q, k, v, do = inputs(n=37, batch=(2,))
    q[1, 20, 2] = np.nan
    mod = module(name)
    plain = results(mod, q, k, v, do)
    serial = results(threaded(tiled(mod, 8, 16), 1, "threads", monkeypatch), q, k, v, do)
    got = results(threaded(mod, threads, "threads", monkeypatch), q, k, v, do)
    for have, untiled, one in zip(got, plain, serial):
        assert np.isnan(have).any()
        np.testing.assert_allclose(have, untiled if name == "plain" else one, rtol=1e-10, atol=1e-12)


def test_the_runs_go_on_several_threads_only_with_a_blas_limit(monkeypatch):
    q, k, v, _ = inputs(n=37, batch=(2,))
    mod = tiled(module("causal"), 8, 16)
    score = mod._flash_forward
    seen = set()

    def spy(q, k, v, reads, core, *rest):
        def recording(s, i, j, *read):
            seen.add(threading.get_ident())
            return core.score(s, i, j, *read)
        spied = copy.copy(core)
        spied.score = recording
        return score(q, k, v, reads, spied, *rest)

    monkeypatch.setattr(mod, "_flash_forward", spy)
    for mode, threads, count in [("threads", 3, lambda n: n >= 2), ("in turn", 3, lambda n: n == 1),
                                 ("threads", 1, lambda n: n == 1)]:
        seen.clear()
        threaded(mod, threads, mode, monkeypatch).forward(Q=q, K=k, V=v)
        assert count(len(seen)), (mode, threads, seen)


def test_blas_is_held_to_one_thread_while_runs_go_at_once(monkeypatch):
    threadpoolctl = pytest.importorskip("threadpoolctl", reason="the BLAS limit needs threadpoolctl")
    q, k, v, _ = inputs(n=37, batch=(2,))
    mod = tiled(module("plain"), 8, 16)
    mod.THREADS = 2
    before = [x["num_threads"] for x in threadpoolctl.threadpool_info() if x["user_api"] == "blas"]
    inside = []
    score = mod._flash_forward

    def spy(q, k, v, reads, core, *rest):
        def recording(s, i, j, *read):
            if not inside:
                inside.extend(x["num_threads"] for x in threadpoolctl.threadpool_info() if x["user_api"] == "blas")
            return s
        spied = copy.copy(core)
        spied.score = recording
        return score(q, k, v, reads, spied, *rest)

    monkeypatch.setattr(mod, "_flash_forward", spy)
    mod.forward(Q=q, K=k, V=v)
    assert inside and set(inside) == {1}
    assert [x["num_threads"] for x in threadpoolctl.threadpool_info() if x["user_api"] == "blas"] == before


@pytest.mark.parametrize("variable, value, want", [("OPENBLAS_NUM_THREADS", "3", 3), ("OMP_NUM_THREADS", "4,2", 4),
                                                   ("OMP_NUM_THREADS", "", None), ("OPENBLAS_NUM_THREADS", "0", None)])
def test_the_default_thread_count(variable, value, want, monkeypatch):
    import os

    mod = module("plain")
    assert mod.THREADS is None
    for name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv(variable, value)
    assert mod._threads() == (want or os.cpu_count())


@pytest.mark.parametrize("costs, threads, want", [
    ([1] * 8, 2, [(0, 4), (4, 8)]),
    ([1] * 8, 3, [(0, 3), (3, 5), (5, 8)]),  # shares 8/3 and 16/3: the nearest cuts
    ([1, 2, 3, 4, 5, 6, 7, 8], 2, [(0, 5), (5, 8)]),  # a causal entry: 15 | 21, the first of two cuts 3 from 18
    ([1] * 2, 5, [(0, 1), (1, 2)]),  # fewer units than threads: no empty run
    ([0, 0, 0], 2, [(0, 3)]),  # no work at all
    ([], 2, []),
])
def test_runs_cut_the_work_into_equal_shares(costs, threads, want):
    mod = module("plain")
    units = [(0, 0, 1, 0, c) for c in costs]  # one row seeing c keys: cost c
    assert mod._runs(units, threads) == want
