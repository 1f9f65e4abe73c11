"""Figures drawn in a child process (symattn.docs.figure_job): the same bytes and documents as
in-process, failures raised in the parent, a dead child reported, no child when none is needed."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

import symattn
from symattn.docs import figure_job, figures
from symattn.docs.document import build, render
from symattn.docs.figure_job import ChildTraceback, FigureJob, FigureJobError
from conftest import REPO

ROOT = REPO
needs_fork = pytest.mark.skipif(not figure_job.fork_available(), reason="no 'fork' start method here")


def _load(name: str):
    return symattn.load(ROOT / "derivations" / f"{name}.attn", filename=f"derivations/{name}.attn")


def _build(name: str, monkeypatch, fork: bool, figures_wanted: bool = True):
    """A fresh document (the cache on disk is off in the tests), drawn forked or in-process."""
    with monkeypatch.context() as patch:
        patch.setattr(figure_job, "fork_available", lambda: fork)
        return build(_load(name), figures=figures_wanted)


def _boom():
    raise ValueError("drawing failed")


# --- the job itself --------------------------------------------------------------------------

@needs_fork
def test_forked_job_returns_the_thunks_values_and_sees_the_parents_objects():
    data = {"x": [1, 2, 3]}  # never pickled on the way in: the child sees it through the fork
    with FigureJob({"sum": lambda: sum(data["x"]), "pid": os.getpid}, fork=True) as job:
        assert job.forked
        assert job.result("sum") == 6
        assert job.result("pid") != os.getpid()  # it did run in another process


def test_in_process_job_runs_thunks_here():
    with FigureJob({"pid": os.getpid}, fork=False) as job:
        assert job.result("pid") == os.getpid()


@needs_fork
def test_a_thunks_exception_is_raised_in_the_parent_with_the_childs_traceback():
    with FigureJob({"ok": lambda: 1, "bad": _boom}, fork=True) as job:
        assert job.result("ok") == 1  # a failure of one figure does not hide the others
        with pytest.raises(ValueError, match="drawing failed") as info:
            job.result("bad")
    cause = info.value.__cause__
    assert isinstance(cause, ChildTraceback) and "_boom" in str(cause)


@needs_fork
def test_an_exception_that_does_not_pickle_still_arrives_as_an_error():
    class Local(Exception):  # a local class: pickle cannot find it by name
        pass

    def fail():
        raise Local("unpicklable")

    with FigureJob({"bad": fail}, fork=True) as job:
        with pytest.raises(FigureJobError, match="Local: unpicklable"):
            job.result("bad")


@needs_fork
def test_a_child_that_dies_without_answering_is_an_error_not_a_missing_figure():
    with FigureJob({"die": lambda: os._exit(3)}, fork=True) as job:
        with pytest.raises(FigureJobError, match="exit code 3"):
            job.result("die")
        with pytest.raises(FigureJobError):  # asked again: the same answer, no hang
            job.result("die")


@needs_fork
def test_closing_a_job_early_stops_its_child():
    job = FigureJob({"wait": lambda: __import__("time").sleep(60)}, fork=True)
    process = job._process
    job.close()
    assert not process.is_alive()


# --- documents -------------------------------------------------------------------------------

@needs_fork
@pytest.mark.parametrize("name", ["self_attention", "rope_half"])
def test_documents_and_pngs_are_the_same_forked_and_in_process(name, monkeypatch):
    pytest.importorskip("matplotlib")
    forked = _build(name, monkeypatch, fork=True)
    here = _build(name, monkeypatch, fork=False)
    for fmt in ("md", "html", "tex"):
        assert render(forked, fmt) == render(here, fmt)
    assert [f.name for f in forked.figures] == [f.name for f in here.figures]
    assert [f.png for f in forked.figures] == [f.png for f in here.figures]
    # and both are the committed files (written before figures moved to a child)
    for figure in forked.figures:
        assert figure.png == (ROOT / "derivations" / figure.name).read_bytes()
    assert render(forked, "md") == (ROOT / "derivations" / f"{name}.md").read_text(encoding="utf-8")


def test_in_process_pngs_are_the_figure_functions_own(monkeypatch):
    """The in-process fallback draws with `figures` directly: compare with a direct call."""
    pytest.importorskip("matplotlib")
    doc = _build("causal", monkeypatch, fork=False)
    spec = _load("causal")
    from symattn.symbolic.cost import spec_cost

    direct = figures.cost_curve(spec.typed, spec_cost(spec.typed, spec.derive()))
    assert [f.png for f in doc.figures if f.name == "causal-cost.png"] == [direct.png]


@needs_fork
@pytest.mark.parametrize("fork", [True, False])
def test_a_failing_figure_fails_the_document(fork, monkeypatch):
    pytest.importorskip("matplotlib")
    monkeypatch.setattr(figures, "cost_curve", lambda *args: _boom())  # copied into the child by the fork
    with pytest.raises(ValueError, match="drawing failed") as info:
        _build("sigmoid", monkeypatch, fork=fork)
    assert isinstance(info.value.__cause__, ChildTraceback) == fork


@pytest.mark.parametrize("fork", [True, False])
def test_matplotlib_that_does_not_import_gives_the_notes(fork, monkeypatch):
    if fork and not figure_job.fork_available():
        pytest.skip("no 'fork' start method here")
    monkeypatch.setattr(figures, "available", lambda: False)
    doc = _build("self_attention", monkeypatch, fork=fork)
    text = render(doc, "md")
    assert not doc.figures
    assert "The heatmap of these weights is left out: matplotlib is not installed" in text
    assert text.rstrip().endswith("Figures are left out: matplotlib is not installed (`pip install 'symattn[plots]'`).")


def test_no_child_without_matplotlib_or_without_figures(monkeypatch):
    started = []
    real = FigureJob.__init__

    def spy(self, thunks, fork=None):
        real(self, thunks, fork)
        started.append(self.forked)

    monkeypatch.setattr(FigureJob, "__init__", spy)
    real_find = importlib.util.find_spec
    build(_load("sigmoid"), figures=False)
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "matplotlib" else real_find(name, *a))
    build(_load("sigmoid"))
    assert started == [False, False]  # in-process: matplotlib's own import then says what is there


def test_without_figures_the_document_is_the_one_with_them_less_the_figures(monkeypatch):
    pytest.importorskip("matplotlib")
    full = _build("causal", monkeypatch, fork=figure_job.fork_available())
    bare = _build("causal", monkeypatch, fork=figure_job.fork_available(), figures_wanted=False)
    assert full.figures and not bare.figures
    assert [b for b in full.blocks if b not in full.figures] == bare.blocks


def test_figures_drawn_from_a_notebook_kernel_are_the_committed_ones():
    """Spec.document_with_figures in a Jupyter kernel (threads of its own, stdout a ZMQ stream) forks too."""
    pytest.importorskip("matplotlib")
    nbformat = pytest.importorskip("nbformat", reason="the notebook extra is not installed")
    nbclient = pytest.importorskip("nbclient", reason="the notebook extra is not installed")
    pytest.importorskip("ipykernel", reason="the notebook extra is not installed")
    derivations = ROOT / "derivations"
    cell = (f"import sys\nsys.path.insert(0, {str(ROOT)!r})\nimport symattn\nfrom pathlib import Path\n"
            f"spec = symattn.load({str(derivations / 'self_attention.attn')!r})\n"
            "_, pngs = spec.document_with_figures()\n"
            f"print(sorted(pngs), all(png == (Path({str(derivations)!r}) / name).read_bytes() "
            "for name, png in pngs.items()))")
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(cell)])
    nbclient.NotebookClient(notebook, timeout=600, kernel_name="python3").execute()
    (output,) = notebook.cells[0].outputs
    assert output.text.strip() == "['self_attention-cost.png', 'self_attention-weights.png'] True"


def test_no_heatmap_is_drawn_for_an_example_too_large_to_write(monkeypatch):
    """Over the element model's size guard the document has no example and no heatmap; the job is
    not even asked for one (its weights would be evaluated at the large sizes for nothing)."""
    pytest.importorskip("matplotlib")
    asked = []
    real = FigureJob.__init__

    def spy(self, thunks, fork=None):
        asked.append(sorted(thunks))
        real(self, thunks, fork)

    monkeypatch.setattr(FigureJob, "__init__", spy)
    doc = build(_load("self_attention").with_dims(N=64))
    assert asked == [["available", "cost"]]
    assert [f.name for f in doc.figures] == ["self_attention-cost.png"]
    assert "is too large to write out" in render(doc, "md")
