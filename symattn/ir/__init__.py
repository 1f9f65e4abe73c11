"""Stage ir: the typed IR every other stage reads and writes.

Contract: `typed` is the closed set of frozen, slotted typed nodes (with
`walk`, `tensors_read`) and `TypedSpec`; `index_scope` one index name per
binding (`scope_sum_indices`); `affine` and `gather` computed subscripts
and the gather form of a scatter; `position`
the source spans every node carries; `shapes` symbolic shapes (NumPy
broadcasting, formatting); `build` the node builders that simplify as they
build, recording each rule in a `Recorder`; `printer` the base every printer
subclasses (`_print_<Node>` dispatch, one precedence table); `printing` the
spec-text printer (every printed expression parses back to the same nodes); `sizes` concrete
sizes that keep a spec valid and fit a budget; `philox` dropout's generator
(Philox-4x32-10 and the keep test every target matches bit for bit). Nothing here imports a later
stage: the front end builds this IR, everything after it consumes it.
"""
