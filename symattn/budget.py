"""Time budgets for symbolic work that can grow without bound.

Contract: `with time_budget(seconds):` runs its body until it finishes or the
budget is spent; then `OutOfTime` is raised inside the body and leaves the
`with` statement. `OutOfTime` derives from BaseException, so no
`except Exception` inside SymPy or symattn can swallow it; callers catch it
where the work is one answer (a claim, one gradient's check) and report
"gave up after 5.0 s" instead of a verdict.

The budget is enforced two ways: a real-time interval timer (SIGALRM, which
interrupts pure-Python work such as SymPy's expansion, in the main thread
on POSIX), re-firing every half second until the body has left, so an
interruption swallowed by a bare `except` comes back; and `checkpoint()`,
which long loops call, for threads and platforms without the timer.
`seconds=None` means no budget. Budgets nest: the inner one ends no later
than the outer.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from contextlib import contextmanager
from typing import Iterator

__all__ = ["Budget", "OutOfTime", "time_budget", "checkpoint", "runs_out", "DEFAULT_SECONDS"]

def _default_seconds() -> float:
    """5 s, or the SYMATTN_BUDGET environment variable (seconds; a slow or shared machine)."""
    text = os.environ.get("SYMATTN_BUDGET", "")
    try:
        value = float(text)
    except ValueError:
        return 5.0
    return value if 0 < value < float("inf") else 5.0


DEFAULT_SECONDS = _default_seconds()  # per claim, unless --budget (or SYMATTN_BUDGET) says otherwise


class Budget:
    """One running budget: `seconds` allowed, ending at the monotonic time `deadline`."""

    __slots__ = ("seconds", "deadline")

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.deadline = time.monotonic() + seconds


class OutOfTime(BaseException):
    """The time budget of a piece of symbolic work is spent; `budget` says which one."""

    def __init__(self, budget: Budget) -> None:
        super().__init__(f"gave up after {budget.seconds:.1f} s")
        self.budget = budget
        self.seconds = budget.seconds


_local = threading.local()  # each thread has its own budgets; only the main thread's use the timer
_runs_out = 0               # budgets that have run out in this process, any thread


def runs_out() -> int:
    """How many times a budget has run out in this process so far. A result computed while this
    count stayed the same did not depend on the clock (`symattn.cache` stores only such results)."""
    return _runs_out


def _running() -> list[Budget]:
    """This thread's running budgets, innermost last."""
    if not hasattr(_local, "budgets"):
        _local.budgets = []
    return _local.budgets


def _first() -> Budget | None:
    running = _running()
    return min(running, key=lambda b: b.deadline) if running else None


def checkpoint() -> None:
    """Raise OutOfTime when one of this thread's budgets is spent (cheap; call it in long loops)."""
    global _runs_out
    first = _first()
    if first is not None and time.monotonic() >= first.deadline:
        _runs_out += 1
        raise OutOfTime(first)


def _on_alarm(signum, frame) -> None:  # noqa: ARG001 - the signal handler's signature
    checkpoint()  # signal handlers run in the main thread: its budgets


def _can_use_timer() -> bool:
    return hasattr(signal, "setitimer") and threading.current_thread() is threading.main_thread()


def _arm(first: Budget | None) -> None:
    if first is not None:
        signal.setitimer(signal.ITIMER_REAL, max(first.deadline - time.monotonic(), 1e-3), 0.5)


@contextmanager
def time_budget(seconds: float | None) -> Iterator[Budget | None]:
    """Run the body within `seconds` of wall time (None: unbounded), else raise OutOfTime.
    Yields the Budget, so a caller can tell its own OutOfTime from an outer one's."""
    if seconds is None:
        yield None
        return
    entry = Budget(seconds)
    timer = _can_use_timer()
    previous_handler, previous_timer, started = None, (0.0, 0.0), time.monotonic()
    try:
        _running().append(entry)
        if timer:
            previous_timer = signal.setitimer(signal.ITIMER_REAL, 0)
            previous_handler = signal.signal(signal.SIGALRM, _on_alarm)
            _arm(_first())
        yield entry
    finally:
        while True:  # a tick that lands during the clean-up must not cut it short
            try:
                _close(entry, timer, previous_handler, previous_timer, started)
                break
            except OutOfTime:
                continue


def _close(entry: Budget, timer: bool, previous_handler, previous_timer, started: float) -> None:
    if timer:
        signal.setitimer(signal.ITIMER_REAL, 0)
    running = _running()
    if entry in running:
        running.remove(entry)
    if timer:
        # None: the handler was installed from C; the default action is the closest Python can restore
        signal.signal(signal.SIGALRM, signal.SIG_DFL if previous_handler is None else previous_handler)
        if running:  # an outer budget is still running: re-arm its timer
            _arm(_first())
        elif previous_timer[0] > 0:  # someone else's timer: what is left of it
            signal.setitimer(signal.ITIMER_REAL, max(previous_timer[0] - (time.monotonic() - started), 1e-3),
                             previous_timer[1])
