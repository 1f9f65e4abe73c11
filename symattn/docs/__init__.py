"""Stage docs: derivation documents and notebook displays.

Contract: `document.build(spec)` assembles the document model (sections,
formulas as boxes, tables, figures) from the derivation, the element-level
example, the verdicts and the costs, and `render.render` writes it as
Markdown, HTML (MathML) or LaTeX; `mathprint` turns typed nodes into math
boxes and `mathbox` renders boxes; `figures` draws PNGs with matplotlib when it
is installed; `display` registers the notebook displays of derivations,
formulas and verdicts with `symattn.present`. Output is byte-identical from run
to run.
"""
