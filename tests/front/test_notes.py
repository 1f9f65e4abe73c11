"""Notes: what a spec says that is valid but likely not meant, reported as `FILE:LINE:COL: note:` on stderr.

`i / W` of integers inside a comparison is real division (a fraction), so `(i / W) == (j / W)` holds only
where i == j; a blocked or dilated mask means `i // W`. The spec stays valid (exit status as without the
note); a real division outside comparisons (ALiBi's slopes, `-8 * (g + 1) / H`) gets no note.
"""

from __future__ import annotations

import symattn

from conftest import EXAMPLES, run_main

BLOCKED = "dim N = 4, W = 2\ninput Q[N, N]\nM[i:N, j:N] = where((i / W) == (j / W), 0, -inf)\nO = Q + M\noutput O\n"


def test_an_index_divided_in_a_comparison_gets_a_note(tmp_path):
    typed = symattn.load(BLOCKED, filename="blocked.attn").typed
    assert [(p.line, p.column, m) for p, m in typed.notes] == [
        (3, 22, "i / W is real division, a fraction; for the block an index falls in write i // W"),
        (3, 33, "j / W is real division, a fraction; for the block an index falls in write j // W")]
    path = tmp_path / "blocked.attn"
    path.write_text(BLOCKED)
    done = run_main("show", str(path))
    assert done.returncode == 0
    assert f"{path}:3:22: note: i / W is real division" in done.stderr
    assert "    M[i:N, j:N] = where((i / W) == (j / W), 0, -inf)\n" + " " * 25 + "^" in done.stderr


def test_no_note_for_floor_division_or_values():
    assert not symattn.load(BLOCKED.replace(" / ", " // ")).typed.notes
    values = "dim N = 4, H = 2\ninput Q[H, N, N]\nB[g:H, i:N, j:N] = -(g + 1) / H * abs(i - j)\nO = Q + B\noutput O\n"
    assert not symattn.load(values).typed.notes
    assert not [p for p in EXAMPLES if symattn.load(p).typed.notes]
