"""The NumPy target: `emit.numpy_source(spec)` is the module's text, `emit.load_module`
executes it; `printer` prints program statements as NumPy, `runtime` holds the helpers
copied into every generated module (stable softmax, shape checks)."""
