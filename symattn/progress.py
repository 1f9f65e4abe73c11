"""One line of progress on stderr, for work that takes more than about a second.

Contract: a command (or an API call such as `Spec.document`) wraps its work in
`with progress.task("derive self_attention"):`; the code doing the work says
what it is at with `progress.step("grad(K)", done=3, total=11)`, and inner
loops add a detail with `progress.detail("unfolding P")` (kept until the next
step). While a task runs on a terminal (stderr is a tty when the outermost
task starts) and has run for `DELAY` seconds, one line is kept up to date in
place:

    symattn derive multi_head: [#####.....] 5/11 checking grad(K) (element level: unfolding P)  2.3 s

It is erased when the task ends, so the command's own output starts on a
clean line, and a background thread redraws it every half second, so the
clock runs through long single steps (a compiler, one big expansion). While
the line is shown, writes to `sys.stdout` erase it first (it comes back at
the next redraw), so output never lands in the middle of it.

When stderr is not a terminal (piped, captured by pytest, a notebook), or
outside any task, nothing is written. Tasks nest: the outermost one owns the
title, the clock and the terminal (so `Spec.document` shows progress in a
terminal REPL, and inside `symattn derive` the command's title stays).
`step` and `detail` are cheap (a clock read) and may be called in inner loops.
"""

from __future__ import annotations

import os
import shutil
import sys
import threading
import time
from contextlib import contextmanager
from typing import Iterator, TextIO

__all__ = ["task", "step", "detail", "held", "DELAY"]

DELAY = 1.0      # seconds a task runs before the line appears
INTERVAL = 0.1   # seconds between redraws
BAR = 10         # cells of the bar when the step says how many there are


class _Line:
    """The progress line of the outermost running task, redrawn by a daemon thread."""

    def __init__(self, stream: TextIO, title: str) -> None:
        self.stream = stream
        self.title = title
        self.started = time.monotonic()
        self.drawn = 0.0      # when the line was last written (0: never)
        self.last: tuple[str, int | None, int | None] = ("", None, None)
        self.detail = ""
        self.lock = threading.Lock()
        self.stopped = threading.Event()
        self.ticker = threading.Thread(target=self._tick, name="symattn-progress", daemon=True)
        self.ticker.start()

    def _tick(self) -> None:
        while not self.stopped.wait(0.5):
            self._draw()  # only reads the state: a step the main thread records meanwhile is not undone

    def show(self, what: str, done: int | None, total: int | None, detail: str = "") -> None:
        self.last = (what, done, total)
        self.detail = detail
        self._draw()

    def _draw(self) -> None:
        (what, done, total), detail = self.last, self.detail
        now = time.monotonic()
        elapsed = now - self.started
        if elapsed < DELAY or now - self.drawn < INTERVAL:
            return
        parts = []
        if total:
            filled = BAR * min(done or 0, total) // total
            parts.append(f"[{'#' * filled}{'.' * (BAR - filled)}] {done}/{total}")
        if what:
            parts.append(what)
        if detail:
            parts.append(f"({detail})")
        text = f"symattn {self.title}{': ' if parts else ''}{' '.join(parts)}"
        clock = f"  {elapsed:.1f} s"
        room = shutil.get_terminal_size((80, 24)).columns - 1 - len(clock)
        if len(text) > room:
            text = text[: max(0, room - 3)] + "..."
        text += clock
        with self.lock:
            if self.stopped.is_set():
                return
            self.stream.write("\r" + text + "\x1b[K")
            self.stream.flush()
            self.drawn = now

    def clear(self) -> None:
        """Erase the line for a moment (the next redraw brings it back)."""
        with self.lock:
            if self.drawn and not self.stopped.is_set():
                self.stream.write("\r\x1b[K")
                self.stream.flush()
                self.drawn = 0.0

    def erase(self) -> None:
        with self.lock:
            self.stopped.set()
            if self.drawn:
                self.stream.write("\r\x1b[K")
                self.stream.flush()
        self.ticker.join()


class _ClearingStream:
    """sys.stdout while a progress line is shown: erases the line before each write."""

    def __init__(self, stream: TextIO, line: _Line) -> None:
        self._stream = stream
        self._line = line

    def write(self, text: str) -> int:
        self._line.clear()
        return self._stream.write(text)

    def __getattr__(self, name: str):
        return getattr(self._stream, name)


_line: _Line | None = None   # the running task's line on a terminal, else None
_depth = 0                   # running tasks, nested


@contextmanager
def task(title: str) -> Iterator[None]:
    """Report progress for the body (see the module docstring)."""
    global _line, _depth
    outermost = _depth == 0
    stdout = sys.stdout
    if outermost:
        stream = sys.stderr
        isatty = getattr(stream, "isatty", None)
        _line = _Line(stream, title) if isatty is not None and isatty() else None
        if _line is not None:
            sys.stdout = _ClearingStream(stdout, _line)
    _depth += 1
    try:
        yield
    finally:
        _depth -= 1
        if outermost:
            if _line is not None:
                _line.erase()
                if isinstance(sys.stdout, _ClearingStream):
                    sys.stdout = stdout
            _line = None


def step(what: str = "", done: int | None = None, total: int | None = None) -> None:
    """Say what the running task is doing now (`done` of `total` steps, when counted)."""
    if _line is not None:
        _line.show(what, done, total)


def detail(text: str) -> None:
    """Add a detail to the current step (what an inner loop is at), until the next step."""
    if _line is not None:
        what, done, total = _line.last
        _line.show(what, done, total, detail=text)


@contextmanager
def held() -> Iterator[None]:
    """Keep the progress line from being written during the body (its ticker thread waits): a
    process forked in the body never starts with stderr half written by that thread."""
    line = _line
    if line is None:
        yield
        return
    with line.lock:
        yield


def _forget_line_in_child() -> None:
    """A forked child draws no progress: the line (its lock possibly held by the forking thread,
    its ticker thread not copied) and the stdout wrapper that clears it stay the parent's."""
    global _line
    _line = None
    if isinstance(sys.stdout, _ClearingStream):
        sys.stdout = sys.stdout._stream


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_line_in_child)
