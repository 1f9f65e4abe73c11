"""Runtime helpers every generated Python module shares (plain Python), and how a runtime lists its own.

Contract: the functions here use no array library (sizes, keywords, block
ranges, a core's closures); a target runtime (`symattn.codegen.numpy.runtime`,
`symattn.codegen.torch.runtime`) names them in its `HELPERS` beside its own,
and `Runtime(namespace, helpers, calls)` is such a runtime: `source(name)` is
the exact source text of one helper (the target's own, or one of these),
which the printer copies into a generated module that calls it, so that the
module needs nothing but its array library; `calls` maps a helper to the
helpers it calls in turn. Being real functions, they are tested and linted
like any other code.
"""

from __future__ import annotations

import inspect

__all__ = ["Runtime", "SHARED"]


def _take(tensors, names):
    """The arrays passed as these keywords, in order; TypeError for a missing or unexpected one."""
    missing = [n for n in names if n not in tensors]
    unexpected = sorted(set(tensors) - set(names))
    if missing or unexpected:
        raise TypeError(f"missing tensors {missing}, unexpected keywords {unexpected}; expected {list(names)}")
    return [tensors[n] for n in names]


def _size(name, value, least=1):
    """A size passed as a keyword: a positive integer (least 0: a dim used only as a number, which may be 0)."""
    if isinstance(value, bool) or int(value) != value or value < least:
        raise ValueError(f"{name}: a size is a{' positive' if least else ' nonnegative'} integer, got {value!r}")
    return int(value)


def _exact(dim, numerator, denominator):
    """A quotient of sizes such as (N + 1) / 2 must be a whole number; ValueError naming it otherwise."""
    if numerator % denominator:
        raise ValueError(f"{dim} is {numerator} / {denominator} at these sizes, not an integer")


def _one_batch(arrays):
    """(name, array, rank) of each output and its upstream gradient: ValueError unless all have the same batch
    axes (leading axes of size 1 aside). With several outputs, a gradient path from one of them carries its
    batch axes; paths with different ones, added and then summed over the batch at each leaf, would count
    the smaller ones once per batch entry (a weight penalty beside batched attention: 3x at batch 3)."""
    shapes = {}
    for name, array, rank in arrays:
        lead = tuple(array.shape[:len(array.shape) - rank])
        while lead and lead[0] == 1:
            lead = lead[1:]
        shapes[name] = lead
    if len(set(shapes.values())) > 1:
        shown = ", ".join(f"{name} {list(lead)}" for name, lead in shapes.items())
        raise ValueError(f"the outputs and their upstream gradients have different batch axes ({shown}): the "
                         f"gradients of outputs with different batch axes are not supported; give them all the "
                         f"same batch axes")


class _Score:
    """One fused core's score as a tiled pass reads it: the closures of the generated module (None where a
    core has none), its query scale, its number of head axes, the factor of its weights after the softmax and
    the add of each learned tensor it reads (see `symattn.codegen.arrays.block`)."""

    def __init__(self, score, grad, keys, inside, score_inside, scale, heads, weights=None, adds=(), live=None):
        self.score, self.grad, self.keys, self.inside, self.score_inside = score, grad, keys, inside, score_inside
        self.scale, self.heads, self.weights, self.adds = scale, heads, weights, tuple(adds)
        self.live = live  # (q block, i, j, *reads) -> whether the block keeps an entry: a mask read at run time

    # Key blocks computed and skipped as fully masked by `live`, over every core of the module (diagnostics;
    # with threads two counts may race).
    blocks = [0, 0]


def _key_blocks(lo, hi, inside, block_k):
    """The blocks of keys lo..hi - 1 as (first, end, whole): those of the range `inside` (first, end; None:
    empty), rounded inward to multiples of min(64, block_k), are `whole` (every condition
    bounding keys holds there: no mask to apply), and every other key is in a block that straddles them.
    Each stretch is cut into blocks of block_k keys (the last one shorter)."""
    step = min(64, block_k)
    a, b = inside or (hi, hi)
    a = min(max(-(-a // step) * step, lo), hi)
    b = max(min(b // step * step, hi), a)
    return [(j0, min(j0 + block_k, end), whole)
            for start, end, whole in ((lo, a, False), (a, b, True), (b, hi, False))
            for j0 in range(start, end, block_k)]


SHARED = ("_take", "_size", "_exact", "_one_batch", "_Score", "_key_blocks")


class Runtime:
    """A target's runtime helpers (see the module docstring)."""

    def __init__(self, namespace: dict, helpers: tuple[str, ...], calls: dict[str, tuple[str, ...]]) -> None:
        self.namespace = namespace
        self.HELPERS = helpers
        self.CALLS = calls

    def helper_source(self, name: str) -> str:
        """The source text of one helper, as it appears in generated modules."""
        if name not in self.HELPERS:
            raise KeyError(f"no runtime helper {name}")
        value = self.namespace.get(name) if name not in SHARED else globals()[name]
        return inspect.getsource(value).strip("\n")
