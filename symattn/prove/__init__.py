"""Stage prove: answers to `check` claims.

Contract: `claims.check_spec(spec)` returns one `verdicts.Verdict` per check,
climbing the ladder cheapest first: a float64 probe confirmed at 30 digits
(refuted), the matrix-level prover `canonical` (proved for all sizes), the
exact element-level identity (proved at the stated sizes), a wider
counterexample search, then unknown with the reason; `equivariance` proves or
refutes permutation equivariance and invariance with named lemmas. "Equal"
means equal under IEEE float64 semantics (see `symattn.symbolic.finiteness`).
"""
