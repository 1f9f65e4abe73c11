"""Errors symattn reports to people.

Contract: every mistake in a spec is a `SpecError` carrying the file name, a
1-based line and column, the message, the source line and an optional hint;
`str(err)` is the compiler-style report

    FILE:LINE:COL: error: MESSAGE
        the source line
        ^~~~
    hint: ...

which the command line prints before exiting with status 2. One base class,
`SymAttnError`, with a subclass per stage, so callers can catch exactly what
they mean to.
"""

from __future__ import annotations

__all__ = [
    "SymAttnError",
    "SpecError",
    "SpecSyntaxError",
    "SpecNameError",
    "SpecShapeError",
    "SpecCheckError",
    "UsageError",
    "UnknownGradientError",
    "UnknownTensorError",
    "SymbolicError",
    "SizeGuardError",
    "CodegenError",
    "Unfusable",
]


class SymAttnError(Exception):
    """Base class of every error symattn raises on purpose."""


class UsageError(SymAttnError):
    """A bad command-line or API argument (an unknown dim, a bad size)."""


class UnknownGradientError(UsageError, KeyError):
    """`derivation["grad(T)"]` for a T the derivation has no gradient of; also a KeyError."""

    def __str__(self) -> str:  # KeyError would show the message in quotes
        return str(self.args[0]) if self.args else ""


class UnknownTensorError(UsageError, KeyError):
    """A tensor name the spec does not declare (also a KeyError, as a dict lookup was before)."""

    def __init__(self, name: str, spec: str, known) -> None:
        self.name = name
        self.known = tuple(known)
        super().__init__(f"no tensor named {name!r} in {spec}; its tensors are {', '.join(self.known)}")

    def __str__(self) -> str:  # KeyError would print the message as a quoted repr
        return str(self.args[0])


class SymbolicError(SymAttnError):
    """The symbolic engine met something it cannot handle."""


class SizeGuardError(SymAttnError):
    """Element-level work that would take minutes was refused."""


class CodegenError(SymAttnError):
    """A spec (or part of one) that a code target cannot express; the message says why and what to change.

    Every target raises this one class (or `Unfusable`); the message names the target where it matters."""


class Unfusable(CodegenError):
    """An attention core that the attention plan does not fuse; the message is the plan's reason."""


class SpecError(SymAttnError):
    """A mistake in a spec, located at FILE:LINE:COL."""

    def __init__(
        self,
        message: str,
        *,
        line: int,
        column: int,
        filename: str = "<spec>",
        source: str = "",
        hint: str | None = None,
        length: int = 1,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.line = max(1, line)
        self.column = max(1, column)
        self.filename = filename
        self.source = source
        self.hint = hint
        self.length = max(1, length)

    def located(self, filename: str, source: str) -> "SpecError":
        """Attach the file name and text (set once the error reaches the loader)."""
        self.filename = filename
        self.source = source
        return self

    @property
    def source_line(self) -> str:
        # Lines end at "\n" only, as the parser counts them (str.splitlines
        # would also split at \f, \x1c, \x85, \u2028, ... and shift the lines).
        lines = self.source.split("\n")
        if 1 <= self.line <= len(lines):
            return lines[self.line - 1].rstrip("\r")
        return ""

    def __str__(self) -> str:
        head = f"{self.filename}:{self.line}:{self.column}: error: {self.message}"
        parts = [head]
        text = self.source_line.expandtabs(1)
        if text.strip():
            col = min(self.column, len(text) + 1)
            width = max(1, min(self.length, len(text) - col + 1))
            parts.append("    " + text)
            parts.append("    " + " " * (col - 1) + "^" + "~" * (width - 1))
        if self.hint:
            parts.append(f"hint: {self.hint}")
        return "\n".join(parts)


class SpecSyntaxError(SpecError):
    """Text that is not in the spec grammar (or not UTF-8 text at all)."""


class SpecNameError(SpecError):
    """An unknown, redefined, reserved or out-of-order name."""


class SpecShapeError(SpecError):
    """Shapes or index ranges that do not fit together."""


class SpecCheckError(SpecError):
    """A `check` statement that is not a claim symattn can answer."""
