"""C identifiers for generated CUDA: the spec's own names, made safe.

Contract: `CNames(spec)` gives every spec identifier that reaches generated
code (tensors, dims, index names, the spec's name) a C identifier. A name is
kept as the user wrote it unless it would clash with C++ or CUDA (a keyword,
a builtin such as `threadIdx`, a math function such as `expf`, a reserved
`__x`/`_X` form), with the generator's own locals (which all end in `_`), or
with the `sa_`/`SA_` helpers of the runtime; then it gets a suffix. Names the
generator derives (`grad_X`, kernel names) go through `fresh`, which never
returns a name already handed out. Only validated identifiers
(`[A-Za-z_][A-Za-z0-9_]*`) ever come out, so generated code embeds no other
user text.
"""

from __future__ import annotations

import re

__all__ = ["CNames", "c_identifier", "RESERVED"]

_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")

_KEYWORDS = """
alignas alignof and and_eq asm auto bitand bitor bool break case catch char char8_t char16_t char32_t class
compl concept const consteval constexpr constinit const_cast continue co_await co_return co_yield decltype
default delete do double dynamic_cast else enum explicit export extern false float for friend goto if inline
int long mutable namespace new noexcept not not_eq nullptr operator or or_eq private protected public register
reinterpret_cast requires return short signed sizeof static static_assert static_cast struct switch template
this thread_local throw true try typedef typeid typename union unsigned using virtual void volatile wchar_t
while xor xor_eq restrict main
""".split()

_CUDA = """
threadIdx blockIdx blockDim gridDim warpSize dim3 uint3 cudaStream_t cudaError_t atomicAdd atomicMax
__syncthreads __global__ __device__ __host__ __shared__ __forceinline__ __launch_bounds__ __restrict__
""".split()

_LIBRARY = """
expf logf sqrtf fabsf tanhf sinf cosf powf fmaxf fminf exp log sqrt fabs tanh sin cos pow fmax fmin
INFINITY NAN NULL std size_t ptrdiff_t int8_t int16_t int32_t int64_t uint8_t uint16_t uint32_t uint64_t
min max abs printf malloc free memset memcpy assert errno stdin stdout stderr EOF
""".split()

RESERVED = frozenset(_KEYWORDS + _CUDA + _LIBRARY)


def c_identifier(text: str) -> str:
    """An ASCII C identifier from arbitrary text (for a spec name taken from a file stem)."""
    out = re.sub(r"[^A-Za-z0-9_]", "_", text)
    if not out or out[0].isdigit():
        out = "spec_" + out
    return out


def _unsafe(name: str) -> bool:
    return (name in RESERVED or name.endswith("_") or name.startswith("__")
            or (name.startswith("_") and len(name) > 1 and name[1].isupper())
            or name.lower().startswith("sa_"))


class CNames:
    """One namespace per generated file. Register the spec's names (`spec`) before deriving any (`fresh`)."""

    def __init__(self) -> None:
        self._given: dict[tuple[str, str], str] = {}
        self._used: set[str] = set()

    def spec(self, kind: str, name: str) -> str:
        """The C name of a spec identifier (`kind`: tensor, dim, index or spec); stable per (kind, name)."""
        key = (kind, name)
        if key not in self._given:
            if not _IDENT.match(name):
                raise ValueError(f"not an identifier: {name!r}")
            if _unsafe(name) or name in self._used:
                self._given[key] = self.fresh((name.strip("_") or "v") + "_v")
            else:
                self._given[key] = name
                self._used.add(name)
        return self._given[key]

    def fresh(self, base: str) -> str:
        """A new name built from `base` (derived names: grad_X, kernels, temporaries)."""
        base = c_identifier(base).rstrip("_") or "v"
        if _unsafe(base):
            base = "v_" + base.lstrip("_")
        name, k = base, 2
        while name in self._used or _unsafe(name):
            name = f"{base}{k}"
            k += 1
        self._used.add(name)
        return name
