"""symattn: the mathematics of attention, derived, checked and compiled from a spec.

    >>> import symattn
    >>> spec = symattn.load("derivations/self_attention.attn")   # doctest: +SKIP
    >>> print(spec.show())                                         # doctest: +SKIP
"""

from .api import Spec, load
from .errors import SpecError, SymAttnError, UnknownTensorError, UsageError
from .version import __version__

__all__ = ["load", "Spec", "SymAttnError", "SpecError", "UsageError", "UnknownTensorError", "__version__"]
