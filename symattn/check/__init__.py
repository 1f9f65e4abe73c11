"""Stage check: generated code against the reference evaluator.

Contract: `numpy.verify_numpy(spec)` runs the generated NumPy module against
the float64 reference evaluator (forward) and central finite differences of it
(backward) at several sizes and batch shapes; `cuda.verify_cuda(spec)` compiles
the CUDA kernels (nvcc gate for sm_90 when nvcc is present) and runs them on the
CPU through the emulation header, plain and under ThreadSanitizer. Both compare
under float64 semantics (equal within tolerance, or the same non-finite value)
and pick smaller sizes when the spec's would be too large, saying so.
"""
