"""Source positions: where in a spec's text a node came from.

Contract: `Pos` is a frozen 1-based span (line, column, end line, end column);
`NOWHERE` stands for nodes that no source text wrote (made by the backward
pass). Every IR, syntax and typed, carries one on each node, excluded from
equality and hashing.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Pos", "NOWHERE"]


@dataclass(frozen=True, slots=True)
class Pos:
    """A 1-based source span: where a node starts and (exclusively) ends."""

    line: int
    column: int
    end_line: int
    end_column: int

    @property
    def length(self) -> int:
        """Columns to underline on the first line (at least one)."""
        if self.end_line == self.line:
            return max(1, self.end_column - self.column)
        return 1


NOWHERE = Pos(1, 1, 1, 2)
