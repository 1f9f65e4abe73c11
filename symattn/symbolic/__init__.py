"""Stage symbolic: the mathematics of a typed spec, at both levels.

Contract: `derive.derive(spec)` gives every grad(T) in matrix form, dims
symbolic, with the recorded steps (`index_adjoint` differentiates index
notation); `element.ElementModel` the explicit SymPy entries at concrete sizes
with exact ground-truth gradients and the exact identity test (`polyzero` its
fast path); `evaluate.Evaluator` evaluates nodes exactly or in float64 (the
reference evaluator); `finiteness` says which values may be -inf or NaN, the
one static analysis every level honours; `cost` counts FLOPs and memory;
`sympy_form` writes nodes as SymPy matrix expressions.
"""
