"""Stage codegen: typed spec + derivation -> runnable code.

Contract: `program` lowers a spec and its derivation to a straight-line
program (forward and backward, common subexpressions shared, buffers freed
when dead) and `index` vectorises index notation; the targets render it:
`numpy` (a standalone module importing only NumPy: `forward`, `backward`,
`forward_backward`) and `cuda` (kernels and extern "C" launchers, a fused
FlashAttention-style core where the spec has one). Generated code embeds no
user text other than validated identifiers.
"""
