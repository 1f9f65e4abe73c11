"""Stage front: spec text -> typed IR.

Contract: `parse.parse(text, filename)` turns `.attn` text into the syntax IR
(`syntax`, frozen nodes with positions) with the Lark grammar shipped as
`symattn.grammar`; `validate.validate(program)` resolves names, checks every
shape and index range (`builtins` holds the typing rule of each builtin call)
and returns a `symattn.ir.typed.TypedSpec`. Every mistake is a `SpecError`
located at FILE:LINE:COL with the source line and a caret; no input produces
a traceback.
"""
