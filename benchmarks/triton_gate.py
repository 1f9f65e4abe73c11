"""The Triton compile gate for sm_90 without a GPU: `python benchmarks/triton_gate.py SPEC...`.

Prints a Markdown table (registers, shared memory, spills, tensor-core instructions per kernel at
head dims 64 and 128; see symattn.check.triton_gate); exit status 1 when a kernel spills or a fused
kernel has no HGMMA/HMMA. Run without TRITON_INTERPRET (it compiles, it does not interpret).
"""

import os
import sys

os.environ.pop("TRITON_INTERPRET", None)

import symattn  # noqa: E402
from symattn.check.triton_gate import table  # noqa: E402

if __name__ == "__main__":
    text, ok = table([symattn.load(path).typed for path in sys.argv[1:]])
    print(text)
    sys.exit(0 if ok else 1)
