"""Notebook displays for objects of early stages, without importing the stage that draws them.

Contract: `Derivation`, `Formula` and `Verdict` (symbolic and prove stages) show
themselves in a notebook by asking this registry: `render(kind, obj)` returns
the `kind` ("html", "latex", "mathml") of `obj` from the renderer registered for
its type name, or None when none is. The docs stage registers its renderers
(`symattn.docs.display`) when it is imported, which `import symattn` does; a
stage thus never imports a later one to be displayed (dependency inversion, as
a plotting library's backends register themselves).
"""

from __future__ import annotations

from typing import Callable

__all__ = ["register", "render"]

_renderers: dict[tuple[str, str], Callable[[object], str]] = {}


def register(type_name: str, **kinds: Callable[[object], str]) -> None:
    """Register `html=`, `latex=`, `mathml=` renderers for objects whose class is `type_name`."""
    for kind, renderer in kinds.items():
        _renderers[(type_name, kind)] = renderer


def render(kind: str, obj: object) -> str | None:
    """`obj` rendered as `kind` by its registered renderer, or None when there is none."""
    renderer = _renderers.get((type(obj).__name__, kind))
    return None if renderer is None else renderer(obj)
