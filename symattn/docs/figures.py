"""Figures for derivation documents, drawn with matplotlib when it is installed.

Contract: `available()` says whether matplotlib can be imported; `heatmap`
and `cost_curve` return `Figure` objects holding PNG bytes that are
identical from run to run (fixed size and DPI, no timestamp or software
metadata). Nothing here is imported unless a document asks for a figure.
"""

from __future__ import annotations

import io
from dataclasses import dataclass

import numpy as np

__all__ = ["Figure", "available", "heatmap", "cost_curve"]


@dataclass
class Figure:
    """A figure of a document: a PNG file written next to it, and its caption."""

    name: str          # file name next to the document
    png: bytes
    caption: str


def available() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def _new_figure(figsize):
    """A figure on an Agg canvas, without pyplot (its import is half of matplotlib's; the PNG bytes
    are the same as those of `pyplot.subplots`, with no figure manager or global figure list)."""
    import matplotlib
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure as MplFigure

    matplotlib.rcParams.update({"svg.hashsalt": "symattn", "font.size": 9})
    fig = MplFigure(figsize=figsize)
    FigureCanvasAgg(fig)
    return fig, fig.add_subplot()


def _png(fig) -> bytes:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=100, metadata={"Software": None})
    return buffer.getvalue()


def heatmap(spec_name: str, tensor: str, which: str, values: np.ndarray):
    """The weights `tensor` (`P`, or `P[0, :, :]` for weights with more axes, `which` then saying
    which matrix that is: `the first of h = 2`, in the title and the caption) as an image."""
    fig, ax = _new_figure((3.2, 2.8))
    if which:
        ax.set_title(f"{tensor} ({which})", fontsize=8)
    image = ax.imshow(values, cmap="viridis", vmin=0.0, vmax=max(1e-12, float(np.max(values))))
    ax.set_xlabel("key position j")
    ax.set_ylabel("query position i")
    ax.set_xticks(range(values.shape[1]), [str(j + 1) for j in range(values.shape[1])])
    ax.set_yticks(range(values.shape[0]), [str(i + 1) for i in range(values.shape[0])])
    fig.colorbar(image, ax=ax)
    fig.tight_layout()
    png = _png(fig)
    caption = f"The attention weights {tensor} of the small example" + (f" ({which})" if which else "")
    return Figure(f"{spec_name}-weights.png", png, caption)


def cost_curve(spec, cost):
    """Forward FLOPs of the spec against N, next to an RNN over the same sequence (other dims at defaults)."""

    tokens = [name for name, info in spec.dims.items()
              if any(d == info.symbol for t in spec.tensors.values() for d in t.shape[:1])]
    if not tokens:
        return None
    n_symbol = spec.dims[tokens[0]].symbol
    subs = {info.symbol: spec.sizes[name] for name, info in spec.dims.items() if info.symbol != n_symbol}
    width = max(subs.values(), default=1)
    ns = np.array([2 ** k for k in range(2, 13)])
    attention = [float(cost.forward_flops.subs(subs).subs(n_symbol, int(n))) for n in ns]
    rnn = [float(2 * 2 * width * width * n) for n in ns]  # h_t = tanh(W h_{t-1} + U x_t): two products a step
    fig, ax = _new_figure((4.2, 2.8))
    ax.loglog(ns, attention, marker="o", label=f"{spec.name} (parallel in {tokens[0]})")
    ax.loglog(ns, rnn, marker="s", label=f"RNN, width {width} (sequential in {tokens[0]})")
    ax.set_xlabel(f"{tokens[0]} (sequence length)")
    ax.set_ylabel("forward FLOPs")
    ax.legend(fontsize=7)
    fig.tight_layout()
    png = _png(fig)
    return Figure(f"{spec.name}-cost.png", png, f"Forward FLOPs against {tokens[0]}: attention and an RNN")
