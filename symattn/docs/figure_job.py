"""Figures drawn in a child process while the document's element-level work goes on.

Contract: `FigureJob(thunks)` is a set of named, argument-less callables (drawing the figures
of one document). `job.result(name)` returns what `thunks[name]()` returns, or raises what it
raised; `job.close()` ends the job (a child still running is stopped). The answers, PNG bytes
included, are the same whichever way the job runs:

- forked (`fork=True`, the default where the 'fork' start method exists, as on Linux): every
  thunk runs at once, in order, in a child made with multiprocessing's 'fork' start method, so
  it sees the parent's objects as they are at the fork (the typed spec, the derivation) and
  needs no pickling of its inputs. The child sends back each thunk's value or exception (with
  its traceback) through a pipe; `result` waits for them. An exception raised by a thunk is
  raised again in the parent by `result` of that name, only, with the child's traceback as
  its cause (`ChildTraceback`), as `concurrent.futures` does: a figure the document does not
  use (the heatmap of a spec whose element model was refused) raises nothing, as in-process.
  A child that dies without answering (killed, crashed) makes `result` raise `FigureJobError`.
- in-process (`fork=False`, or no 'fork' start method, as on Windows and macOS by default):
  a thunk runs when its result is first asked for, in this process, as before there was a
  child.

Why fork is safe here: the child calls only the thunks (matplotlib on an Agg canvas, NumPy,
SymPy) and the pipe, then leaves with `os._exit` (multiprocessing's fork child does), so no
atexit hook, cache write or buffered output of the parent runs twice. By the time a document
forks, the only threads are (a) OpenBLAS's worker pool, started when NumPy is imported; OpenBLAS
registers a `pthread_atfork` handler that stops its workers before a fork and starts them
again on demand in both processes, so the child's BLAS is in a consistent state; and (b) on a
terminal, `symattn.progress`'s ticker thread, whose every write to stderr happens under its
line's lock: the fork happens inside `progress.held()`, which holds that lock, so the child
never starts with stderr's buffer half written. symattn starts no other thread. The parent's objects are frozen (`gc.freeze`) across the fork,
so the child's garbage collections never walk the inherited heap (which would copy it page by
page and cost CPU for nothing); the parent unfreezes them at once. (Python 3.12+
warns on fork with threads running; 3.14 made 'forkserver' the default start method, which is
why the context asks for 'fork' by name.)
"""

from __future__ import annotations

import gc
import multiprocessing
import pickle
import traceback
from dataclasses import dataclass
from typing import Any, Callable

from .. import progress

__all__ = ["FigureJob", "FigureJobError", "ChildTraceback", "fork_available"]

WAIT_SECONDS = 600.0   # how long `result` waits for a child before calling it stuck


class FigureJobError(RuntimeError):
    """The figure child ended without sending its figures back."""


class ChildTraceback(Exception):
    """The traceback of an exception raised in the figure child (the cause of the one re-raised)."""

    def __str__(self) -> str:
        return "\n" + self.args[0]


@dataclass
class _Outcome:
    """What one thunk gave in the child: its value, or the exception it raised and its traceback."""

    value: Any = None
    error: BaseException | None = None
    trace: str = ""


def fork_available() -> bool:
    return "fork" in multiprocessing.get_all_start_methods()


def _run_all(thunks: dict[str, Callable[[], Any]], conn) -> None:
    """The child: run every thunk, send the outcomes back."""
    outcomes: dict[str, _Outcome] = {}
    for name, thunk in thunks.items():
        try:
            outcomes[name] = _Outcome(value=thunk())
        except Exception as err:  # sent to the parent, re-raised there by `result(name)`
            outcomes[name] = _Outcome(error=err, trace=traceback.format_exc())
    try:
        conn.send(outcomes)  # pickled whole before anything is written
    except (pickle.PicklingError, TypeError, AttributeError):  # an exception that does not pickle
        for outcome in outcomes.values():
            if outcome.error is not None:
                outcome.error = FigureJobError(f"{type(outcome.error).__name__}: {outcome.error}")
        conn.send(outcomes)
    conn.close()


class FigureJob:
    def __init__(self, thunks: dict[str, Callable[[], Any]], fork: bool | None = None) -> None:
        self.thunks = dict(thunks)
        self.forked = fork_available() if fork is None else bool(fork)
        self._outcomes: dict[str, _Outcome] | None = None
        self._process = None
        self._conn = None
        if self.forked:
            context = multiprocessing.get_context("fork")
            self._conn, sender = context.Pipe(duplex=False)
            # The parent's objects into the permanent generation for the fork: the child's
            # collections then never walk (and copy, page by page) the heap it inherited.
            gc.freeze()
            try:
                with progress.held():
                    self._process = context.Process(target=_run_all, args=(self.thunks, sender),
                                                    name="symattn-figures", daemon=True)
                    self._process.start()
            finally:
                gc.unfreeze()
            sender.close()

    def result(self, name: str) -> Any:
        if not self.forked:
            return self.thunks[name]()
        outcome = self._collect()[name]
        if outcome.error is not None:
            raise outcome.error from ChildTraceback(outcome.trace)
        return outcome.value

    def _collect(self) -> dict[str, _Outcome]:
        if self._outcomes is None:
            if self._process is None:
                raise FigureJobError("the figure process ended without sending its figures")
            try:
                if not self._conn.poll(WAIT_SECONDS):
                    raise FigureJobError(f"the figure process sent nothing in {WAIT_SECONDS:.0f} s")
                self._outcomes = self._conn.recv()
            except EOFError:
                self._process.join()
                raise FigureJobError(f"the figure process ended (exit code {self._process.exitcode}) "
                                     "without sending its figures") from None
            finally:
                self.close()
        return self._outcomes

    def close(self) -> None:
        """Stop the child if it still runs (the document failed first) and reap it."""
        if self._process is not None:
            if self._outcomes is None and self._process.is_alive():
                self._process.terminate()
            self._process.join()
            self._conn.close()
            self._process = None

    def __enter__(self) -> "FigureJob":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
