"""symattn: the mathematics of attention, derived, checked and compiled from a spec.

    >>> import symattn
    >>> spec = symattn.load("derivations/self_attention.attn")   # doctest: +SKIP
    >>> print(spec.show())                                         # doctest: +SKIP
"""

from .api import Spec, load
from .errors import SpecError, SymAttnError, UnknownTensorError, UsageError

__all__ = ["load", "Spec", "SymAttnError", "SpecError", "UsageError", "UnknownTensorError", "__version__"]
__version__ = "0.1.0"
