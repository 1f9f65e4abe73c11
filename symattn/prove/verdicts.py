"""Verdicts: what a check answers, in a form people and programs can use.

Contract: a `Verdict` is one claim's answer, `proved`, `refuted` (with a
`Counterexample` whose inputs reproduce the difference in plain NumPy) or
`unknown`, with the method that settled it (the rung of the ladder in
`symattn.prove.claims`) and, for proofs that record them, the steps. A verdict is
truthy only when proved. `to_json` is strict JSON: non-finite numbers are the
strings "inf", "-inf" and "nan". `GradientCheck` is the element-level check of
one derived gradient. In a notebook a verdict displays through
`symattn.present`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from ..present import render

__all__ = ["Verdict", "Counterexample", "GradientCheck", "json_number"]


def json_number(value):
    """A float for JSON: non-finite values as the strings "inf", "-inf", "nan" (strict JSON)."""
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    return value


def _strict(value):
    if isinstance(value, dict):
        return {k: _strict(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_strict(v) for v in value]
    return json_number(value)


@dataclass
class Counterexample:
    """Concrete inputs at which a claim fails, reproducible with NumPy."""

    sizes: dict[str, int]
    inputs: dict[str, list]            # inputs, params, and upstream gradients grad(O)
    lhs: list | float | None = None
    rhs: list | float | None = None
    note: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict:
        return _strict({"sizes": self.sizes, "inputs": self.inputs, "lhs": self.lhs, "rhs": self.rhs,
                        "note": self.note, **self.extra})


@dataclass
class Verdict:
    line: int
    claim: str
    verdict: str                       # proved | refuted | unknown
    method: str
    counterexample: Counterexample | None = None
    steps: tuple = ()

    @property
    def holds(self) -> bool:
        return self.verdict == "proved"

    def __bool__(self) -> bool:
        """True only when proved: `if verdict:` must not pass a refuted or unknown claim."""
        return self.holds

    def to_json(self) -> dict:
        return {"line": self.line, "claim": self.claim, "verdict": self.verdict, "method": self.method,
                "counterexample": self.counterexample.to_json() if self.counterexample else None}

    def _repr_html_(self) -> str | None:
        """In a notebook: the verdict, the claim, how it was settled, and any counterexample."""
        return render("html", self)

    def _repr_latex_(self) -> str | None:
        return render("latex", self)


@dataclass
class GradientCheck:
    tensor: str
    ok: bool
    method: str
