"""Invalid specs: each is reported as the right error class, at the right place, with a clear message.

Every expectation (class, line, column, message) is written by hand from the
spec text: columns are 1-based and count characters, as an editor does.
"""

from __future__ import annotations

import re

import pytest

import symattn
from symattn.errors import (
    SpecCheckError,
    SpecError,
    SpecNameError,
    SpecShapeError,
    SpecSyntaxError,
    SymAttnError,
    UsageError,
)
from conftest import REPO, run_cli, run_main

# Two dims that differ (d, e) and two tensors whose shapes clash.
BASE = "dim N = 4, d = 3, e = 2\ninput X[N, d], Y[e, d]\n"  # lines 1 and 2

Syntax, Name, Shape, Check = SpecSyntaxError, SpecNameError, SpecShapeError, SpecCheckError
INTS = "dim N = 4, D = 2, d = 3\ninput X[N, d]\nbuffer doc[N] in 0:D\nbuffer offsets[D] in 0:N\n"  # lines 1-4

CASES = [
    # --- syntax ----------------------------------------------------------------------------
    ("unexpected_character", BASE + "Z = X $ Y\noutput Z\n", Syntax, 3, 7, r"^unexpected character '\$'$"),
    ("unclosed_paren", BASE + "Z = softmax(X @ Y.T\noutput Z\n", Syntax, 3, 12, r"^'\(' is never closed$"),
    ("unclosed_bracket", "dim N = 4\ninput X[N\noutput X\n", Syntax, 2, 8, r"^'\[' is never closed$"),
    ("unclosed_paren_at_eof", BASE + "Z = (X", Syntax, 3, 5, r"^'\(' is never closed$"),
    ("unclosed_inner_paren", BASE + "Z = exp((X)\noutput Z\n", Syntax, 3, 8, r"^'\(' is never closed$"),
    ("unclosed_over_lines", BASE + "Z = softmax(X,\n    axis=-1\noutput Z\n", Syntax, 3, 12,
     r"^'\(' is never closed$"),
    ("stray_close", BASE + "Z = X)\noutput Z\n", Syntax, 3, 6, r"^unexpected '\)'"),
    ("missing_operand", BASE + "Z = X +\noutput Z\n", Syntax, 3, 8, r"^unexpected end of line; expected "),
    ("two_names", BASE + "Z = X Y\noutput Z\n", Syntax, 3, 7, r"^unexpected 'Y'"),
    ("python_power", BASE + "Z = X ** 2\noutput Z\n", Syntax, 3, 8, r"^unexpected '\*'"),
    ("keyword_as_name", "dim = 3\n", Syntax, 1, 5, r"^unexpected '='"),
    ("dim_without_size", "dim N\n", Syntax, 1, 6, r"^unexpected end of line; expected '='"),
    ("empty_brackets", "dim N = 4\ninput X[]\n", Syntax, 2, 9, r"^unexpected '\]'"),
    ("number_out_of_range", "dim N = 1e99999\n", Syntax, 1, 9, r"^the number 1e99999 is out of range"),
    ("nested_too_deep", BASE + "Z = " + "-" * 150 + "X\noutput Z\n", Syntax, 3, 1,
     r"^this statement nests its expression more than 100 levels deep$"),
    # --- names -----------------------------------------------------------------------------
    ("unknown_name", BASE + "Z = X @ W\noutput Z\n", Name, 3, 9, r"^unknown name 'W'$"),
    ("unknown_function", BASE + "Z = softmaxx(X)\noutput Z\n", Name, 3, 5, r"^unknown function 'softmaxx'$"),
    ("unknown_function_far", BASE + "Z = gelu(X)\noutput Z\n", Name, 3, 5, r"^unknown function 'gelu'$"),
    ("tensor_called", BASE + "Z = X(Y)\noutput Z\n", Name, 3, 5, r"^'X' is not a function$"),
    ("redefinition", BASE + "X = Y\noutput X\n", Name, 3, 1,
     r"^redefinition of 'X' \(first defined at 2:7\)$"),
    ("redefinition_dim", "dim N = 4\ndim N = 5\n", Name, 2, 5, r"^redefinition of 'N' \(first defined at 1:5\)$"),
    ("redefinition_dim_as_tensor", "dim N = 4\ninput N[N]\n", Name, 2, 7, r"^redefinition of 'N'"),
    ("builtin_redefined", "dim N = 4\ninput exp[N]\n", Name, 2, 7, r"^'exp' is a builtin and cannot be redefined$"),
    ("use_before_definition", BASE + "Z = W\nW = X\noutput Z\n", Name, 3, 5,
     r"^'W' is used before its definition at 4:1$"),
    ("dim_before_definition", "input X[N]\ndim N = 4\noutput X\n", Name, 1, 9,
     r"^'N' is used before its definition at 2:5$"),
    ("output_before_definition", BASE + "output Z\nZ = X\n", Name, 3, 8,
     r"^'Z' is used before its definition at 4:1$"),
    ("no_output", BASE + "Z = X\n", Name, 3, 1, r"^a spec needs at least one output$"),
    # Reported where the output line belongs (after the last tensor), not at the last check.
    ("no_output_before_checks", BASE + "Z = X * 2\nW = Z + 1\n\ncheck grad(X) == 2 * grad(Z)\n", Name, 4, 1,
     r"^a spec needs at least one output$"),
    ("empty_spec", "", Name, 1, 1, r"^a spec needs at least one output$"),
    ("output_unknown", BASE + "output Z\n", Name, 3, 8, r"^unknown name 'Z'$"),
    ("output_is_dim", BASE + "output N\n", Name, 3, 8, r"^'N' is a dim; an output must be a tensor$"),
    ("output_twice", BASE + "output X, X\n", Name, 3, 11, r"^'X' is already an output$"),
    ("header_not_first", BASE + "attention foo\noutput X\n", Name, 3, 1,
     r"^the 'attention' header must be the first statement$"),
    ("inf_as_dim", "dim N = 4\ninput X[inf]\n", Name, 2, 9, r"^'inf' is a number, not a tensor or dim$"),
    ("unknown_index", "dim N = 4\ninput A[N, N]\nZ[i] = A[i, k]\noutput Z\n", Name, 3, 13,
     r"^unknown index 'k'$"),
    ("index_repeated", "dim N = 4\ninput A[N, N]\nZ[i, i] = A[i, i]\noutput Z\n", Name, 3, 6,
     r"^index 'i' appears twice on the left$"),
    # --- shapes ----------------------------------------------------------------------------
    ("matmul_inner_dims", BASE + "Z = X @ Y\noutput Z\n", Shape, 3, 7,
     r"^\[N, d\] @ \[e, d\]: inner dims d and e differ$"),
    ("matmul_batch_axes", "dim N = 4, h = 2, g = 3\ninput A[h, N, N], B[g, N, N]\nZ = A @ B\noutput Z\n", Shape,
     3, 7, r"^\[h, N, N\] @ \[g, N, N\]: batch axes \[h\] and \[g\] do not broadcast$"),
    ("matmul_scalar", "dim N = 4\ninput X[N, N]\nparam m\nZ = X @ m\noutput Z\n", Shape, 4, 7,
     r"^\[N, N\] @ \[\]: @ needs tensors with at least one axis"),
    ("broadcast", BASE + "Z = X + Y\noutput Z\n", Shape, 3, 7, r"^\[N, d\] \+ \[e, d\]: cannot broadcast N and e$"),
    ("broadcast_transposed", BASE + "Z = X * X.T\noutput Z\n", Shape, 3, 7,
     r"^\[N, d\] \* \[d, N\]: cannot broadcast d and N$"),
    ("broadcast_in_where", BASE + "Z = where(X > 0, X, Y)\noutput Z\n", Shape, 3, 5,
     r"^\[N, d\] , \[N, d\] , \[e, d\]: cannot broadcast N and e$"),
    ("softmax_axis", BASE + "Z = softmax(X, axis=2)\noutput Z\n", Shape, 3, 21,
     r"^axis 2 is out of range for softmax\(\) of a tensor with shape \[N, d\] \(2 axes\)$"),
    ("sum_axis", BASE + "Z = sum(X, axis=-3)\noutput Z\n", Shape, 3, 17,
     r"^axis -3 is out of range for sum\(\) of a tensor with shape \[N, d\] \(2 axes\)$"),
    ("mean_axis_of_vector", "dim N = 4\ninput v[N]\nZ = mean(v, axis=1)\noutput Z\n", Shape, 3, 18,
     r"^axis 1 is out of range for mean\(\) of a tensor with shape \[N\] \(1 axis\)$"),
    ("axis_not_integer", BASE + "Z = softmax(X, axis=0.5)\noutput Z\n", Shape, 3, 21, r"^axis must be an integer"),
    ("dim_zero", "dim N = 0\ninput X[N]\noutput X\n", Shape, 2, 9,
     r"^N is 0 \(its declaration says so\), but it is used as a size here"),
    ("dim_negative", "dim N = -1\n", Shape, 1, 9, r"^dim N must have a positive integer size$"),
    # the mask language: integer operations on reals, a divisor that is 0, a subscript through an integer
    # buffer that can leave its axis, elementwise min of one operand, a learned clamp bound
    ("floordiv_of_a_real", INTS + "Y = X // 2\noutput Y\n", Shape, 5, 5, r"^// works on integers, but X is real$"),
    ("divisor_zero", INTS + "M[i:N, j:N] = where(doc[i] // (N - N) == 0, 0, -inf)\noutput M\n", Shape, 5, 32,
     r"^the divisor N - N of // is 0 at every size$"),
    # a divisor that is not a constant must be shown nonzero for every index value and size: an integer buffer
    # whose range holds 0 (an entry, negated, or the whole buffer in matrix notation), indices that meet (checked
    # when the definition, or the sum of a summed index, closes), bounds that do not exclude 0
    ("divisor_buffer_holds_zero", INTS + "buffer dil[D] in -1:2\nM[g:D, i:N, j:N] = where(((i - j) % dil[g]) == 0, 0, "
     "-inf)\noutput M\n", Shape, 6, 37, r"^the divisor dil\[g\] of % can be 0: dil holds the values -1 to 1 "
     r"\(`in -1:2`\), 0 among them$"),
    ("divisor_negated_buffer", INTS + "M[i:N, j:N] = where((j // -doc[i]) == 0, 0, -inf)\noutput M\n", Shape, 5, 27,
     r"^the divisor -doc\[i\] of // can be 0: doc holds the values 0 to D - 1 \(`in 0:D`\), 0 among them$"),
    ("divisor_whole_buffer", INTS + "Y = offsets // doc\noutput Y\n", Shape, 5, 16,
     r"^the divisor doc of // can be 0: doc holds the values 0 to D - 1"),
    ("divisor_of_indices", INTS + "M[i:N, j:N] = where(((i - j) // (j - i)) == 0, 0, -inf)\noutput M\n", Shape, 5, 34,
     r"^the divisor j - i of // can be 0: it is 0 at i = 0, j = 0 \(at N=4\)$"),
    ("divisor_of_a_summed_index", INTS + "Z[i:N] = sum(k, X[k, 0] * (i // (k - 1)))\noutput Z\n", Shape, 5, 34,
     r"^the divisor k - 1 of // can be 0: it is 0 at k = 1 \(at N=4\)$"),
    ("divisor_not_shown_nonzero", INTS + "M[i:N, j:N] = where((j % (doc[i] - 1)) == 0, 0, -inf)\noutput M\n", Shape, 5,
     27, r"^cannot show that the divisor doc\[i\] - 1 of % is nonzero for every index value and size$"),
    ("subscript_through_a_buffer", INTS + "M[i:N, j:N] = where(offsets[doc[i] + 1] == j, 0, -inf)\noutput M\n",
     Shape, 5, 29, r"^cannot show that subscript doc\[i\] \+ 1 of offsets stays in axis 0 of offsets, \[0, D\)"),
    ("min_alone", INTS + "Y = min(X)\noutput Y\n", Shape, 5, 5, r"^min\(x\) alone: which min is meant\?$"),
    ("clamp_learned_bound", INTS + "param w[N, d]\nY = clamp(X, 0, w)\noutput Y\n", Shape, 6, 17,
     r"^the bound hi of clamp reads 'w', which is differentiated"),
    ("logical_unparenthesised", INTS + "M[i:N, j:N] = where(j <= i & doc[i] == doc[j], 0, -inf)\noutput M\n",
     Syntax, 5, 37, r"^unexpected '=='"),
    ("dim_fraction", "dim N = 2.5\n", Shape, 1, 9, r"^dim N must have a positive integer size$"),
    ("dim_is_a_name", "dim d = 2, N = d\n", Shape, 1, 16, r"^dim N must have a positive integer size$"),
    ("shape_not_integer", "dim N = 4\ninput X[N / 3]\noutput X\n", Shape, 2, 9,
     r"^N / 3 is 4/3 at N=4, not a positive integer$"),
    ("shape_zero", "dim N = 4\ninput X[N - 4]\noutput X\n", Shape, 2, 9, r"^N - 4 is 0 at N=4, not a positive integer$"),
    ("shape_literal_zero", "dim N = 4\ninput X[0, N]\noutput X\n", Shape, 2, 9, r"^0 is not a positive integer"),
    ("shape_is_tensor", "dim N = 4\ninput X[N]\ninput Y[X]\noutput Y\n", Shape, 3, 9,
     r"^'X' is a tensor, not a dim"),
    ("shape_huge_power", "dim N = 4\ninput X[N^1000000]\noutput X\n", Shape, 2, 10,
     r"^a dim power of 1000000 is too large"),
    ("transpose_vector", "dim N = 4\ninput v[N]\nZ = v.T\noutput Z\n", Shape, 3, 6,
     r"^\.T swaps the last two axes, but the operand has shape \[N\]$"),
    ("index_ranges_differ", BASE + "Z[i, j] = X[i, j] * Y[i, j]\noutput Z\n", Shape, 3, 23,
     r"^index 'i' ranges over e here \(axis 0 of Y\) but over N at 3:13$"),
    ("index_range_given_differs", BASE + "Z[i:e, j] = X[i, j]\noutput Z\n", Shape, 3, 15,
     r"^index 'i' ranges over N here \(axis 0 of X\) but over e at 3:3$"),
    ("summed_index_ranges_differ", BASE + "Z[i] = sum(k, X[i, k] * Y[k, k])\noutput Z\n", Shape, 3, 27,
     r"^index 'k' ranges over e here \(axis 0 of Y\) but over d at 3:20$"),
    ("index_range_unknown", "dim N = 4\nZ[i] = i\noutput Z\n", Shape, 2, 3, r"^cannot infer the range of index 'i'$"),
    ("index_range_not_positive", "dim N = 4\nZ[i: N - 5] = 1\noutput Z\n", Shape, 2, 6,
     r"^N - 5 is -1 at N=4, not a positive integer$"),
    ("index_wrong_count", "dim N = 4\ninput A[N, N]\nZ[i] = A[i]\noutput Z\n", Shape, 3, 8,
     r"^A has shape \[N, N\]: it takes 2 indices, not 1$"),
    ("matrix_in_index_notation", "dim N = 4\ninput A[N, N]\nZ[i, j] = A\noutput Z\n", Shape, 3, 11,
     r"^'A' has shape \[N, N\]; in index notation write one entry, as A\[i, j\]$"),
    # --- checks ----------------------------------------------------------------------------
    ("grad_unknown_tensor", BASE + "output X\ncheck grad(W) == X\n", Check, 4, 12, r"^grad of unknown tensor 'W'$"),
    ("grad_of_dim", BASE + "output X\ncheck grad(N) == X\n", Check, 4, 12, r"^grad of 'N': it is a dim, not a tensor$"),
    # --- check-only definitions: a definition that reads grad(...) is not part of the forward pass
    ("output_reads_grad", BASE + "Z = grad(X)\noutput Z\n", Check, 3, 5,
     r"^'Z' is an output \(declared at 4:8\), so it cannot read grad\(X\)$"),
    ("output_is_check_only", BASE + "O = X * 2\ndX_1[i:N, j:d] = grad(O)[i, j] * 2\noutput O, dX_1\n", Check, 4, 18,
     r"^'dX_1' is an output \(declared at 5:11\), so it cannot read grad\(O\)$"),
    ("output_reads_check_only", BASE + "O = X * 2\nG = grad(O) * 2\nZ = O + G\noutput Z\n", Check, 5, 9,
     r"^output 'Z' cannot read 'G', a check-only definition \(it reads grad\(O\) at 4:5\)$"),
    ("forward_tensor_reads_check_only", BASE + "O = X * 2\nG = grad(O) * 2\nH = G + X\nZ = H * O\noutput Z\n",
     Check, 5, 5, r"^'H' is part of the forward pass \(output 'Z' depends on it\), so it cannot read 'G', "
     r"a check-only definition \(it reads grad\(O\) at 4:5\)$"),
    ("grad_of_check_only", BASE + "O = X * 2\nG = grad(O)\noutput O\ncheck grad(G) == O\n", Check, 6, 12,
     r"^grad of 'G': it is a check-only definition, not a tensor of the forward pass$"),
    ("equivariant_of_check_only", BASE + "O = X * 2\nG = grad(O)\noutput O\ncheck equivariant(G, X)\n",
     Check, 6, 19, r"^'G' is a check-only definition \(it reads grad\(O\) at 4:5\), not a tensor of the forward pass$"),
    ("entry_of_check_only", BASE + "O = X * 2\nG = grad(O)\nH[i, j] = G[i, j]\noutput O\n", Check, 5, 11,
     r"^'G' is a check-only definition"),
    ("grad_entry_in_matrix_notation", BASE + "O = X * 2\nG = grad(O)[0]\noutput O\n", Shape, 4, 5,
     r"^grad\(\.\.\.\)\[\.\.\.\] picks one entry, which is index notation$"),
    ("whole_grad_in_index_notation", BASE + "O = X * 2\nG[i, j] = grad(O) + 1\noutput O\n", Shape, 4, 11,
     r"^grad\(O\) has shape \[N, d\]; in index notation write one entry, as grad\(O\)\[i, j\]$"),
    ("entry_of_a_call", BASE + "G[i, j] = exp(X)[i, j]\noutput X\n", Shape, 3, 11,
     r"^exp\(\.\.\.\)\[\.\.\.\]: only grad\(T\) has entries to pick$"),
    ("check_shapes_differ", BASE + "output X\ncheck grad(X) == Y\n", Check, 4, 15,
     r"^the two sides have different shapes: \[N, d\] == \[e, d\]$"),
    ("check_not_a_claim", BASE + "output X\ncheck X\n", Check, 4, 7,
     r"^a check is `A == B`, `equivariant\(O, X\)`, `invariant\(O, Y\)` or `relative\(B\)`$"),
    ("equivariant_of_computed", BASE + "Z = X\noutput Z\ncheck equivariant(Z, Z)\n", Check, 5, 22,
     r"^'Z' is computed, not declared; permute an input, param or buffer$"),
    ("equivariant_unknown", BASE + "output X\ncheck equivariant(O, X)\n", Name, 4, 19, r"^unknown name 'O'$"),
    ("invariant_in_expression", BASE + "output X\ncheck invariant(X, Y) == X\n", Check, 4, 7,
     r"^invariant\(\.\.\.\) is a claim; it can only stand alone in a check$"),
    ("floor_of_nan_subscript", "dim N = 4, R = 3\ninput Q[N, N]\nparam Bt[R]\n"
     "B[i:N, j:N] = Bt[clamp(floor(log2(j - i)), 0, R - 1)]\nO = Q + B\noutput O\n", Shape, 4, 18,
     r"^subscript clamp\(floor\(log2\(j - i\)\), 0, R - 1\) of Bt is not a number where log2\(j - i\) is NaN or "
     r"infinite \(j = 0, i = 0, at the default sizes\)"),
    ("ceil_of_infinite_subscript", "dim N = 4, R = 3\ninput Q[N, N]\nparam Bt[R]\n"
     "B[i:N, j:N] = Bt[clamp(ceil(1 / (i - j)), 0, R - 1)]\nO = Q + B\noutput O\n", Shape, 4, 18,
     r"^subscript .* of Bt is not a number where 1 / \(i - j\) is NaN or infinite \(i = 0, j = 0"),
    # --- dropout: a definition's whole right side, p a number literal in [0, 1) -------------
    ("dropout_inside_an_expression", BASE + "Z = 2 * dropout(X, 0.1)\noutput Z\n", Shape, 3, 9,
     r"^dropout stands only as the whole right side of a definition, not inside an expression or a check$"),
    ("dropout_in_index_notation", BASE + "Z[i, j] = dropout(X[i, j], 0.1)\noutput Z\n", Shape, 3, 11,
     r"^dropout stands only as the whole right side of a definition, not in index notation$"),
    ("dropout_in_a_check", BASE + "output X\ncheck dropout(X, 0.1) == X\n", Shape, 4, 7,
     r"^dropout stands only as the whole right side of a definition"),
    ("dropout_p_one", BASE + "Z = dropout(X, 1)\noutput Z\n", Shape, 3, 16, r"^dropout's p must be in \[0, 1\), got 1$"),
    ("dropout_p_large", BASE + "Z = dropout(X, 1.5)\noutput Z\n", Shape, 3, 16, r"^dropout's p must be in \[0, 1\)"),
    ("dropout_p_a_dim", BASE + "Z = dropout(X, d)\noutput Z\n", Shape, 3, 16,
     r"^dropout's p must be a number literal in \[0, 1\)$"),
    ("dropout_p_negative", BASE + "Z = dropout(X, -0.1)\noutput Z\n", Shape, 3, 16,
     r"^dropout's p must be a number literal in \[0, 1\)$"),
    ("dropout_one_argument", BASE + "Z = dropout(X)\noutput Z\n", Shape, 3, 5,
     r"^dropout\(\) takes 2 arguments \(x, p\), got 1$"),
    ("dropout_keyword", BASE + "Z = dropout(X, rate=0.1)\noutput Z\n", Shape, 3, 16,
     r"^dropout\(\) got an unexpected keyword argument 'rate'$"),
    ("dropout_p_twice", BASE + "Z = dropout(X, 0.1, p=0.1)\noutput Z\n", Shape, 3, 21,
     r"^dropout\(\) got an unexpected keyword argument 'p'$"),
    ("dropout_of_a_condition", BASE + "Z = dropout((X > 0), 0.1)\noutput Z\n", Shape, 3, 14,
     r"^dropout's x is a condition, not a tensor$"),
    ("dropout_mask_named_by_a_definition", BASE + "Z = dropout(X, 0.1)\nW = Z_keep * 2\noutput W\n", Name, 4, 5,
     r"^'Z_keep' is the mask that `Z = dropout\(\.\.\.\)` draws; no definition may read it$"),
    ("dropout_of_the_backward", BASE + "O = X * 2\nG = dropout(grad(O), 0.1)\noutput O\n", Shape, 4, 13,
     r"^dropout's x reads grad\(O\), the backward pass; dropout belongs to the forward pass$"),
]


@pytest.mark.parametrize("text, cls, line, column, message", [pytest.param(*c[1:], id=c[0]) for c in CASES])
def test_invalid_spec(text, cls, line, column, message):
    with pytest.raises(cls) as info:
        symattn.load(text, filename="case.attn")
    err = info.value
    assert type(err) is cls
    assert (err.line, err.column) == (line, column), str(err)
    assert re.search(message, err.message), err.message
    report = str(err).splitlines()
    assert report[0] == f"case.attn:{line}:{column}: error: {err.message}"
    source_line = (text.split("\n") + [""])[line - 1]
    if source_line.strip():
        # The source line, then a caret under the column.
        assert report[1] == "    " + source_line
        assert re.fullmatch(" " * (4 + column - 1) + r"\^~*", report[2]), report[2]
    assert "Traceback" not in str(err)


@pytest.mark.parametrize("definition", [
    "M[g:D, i:N, j:N] = where(((i - j) % dil[g]) == 0, 0, -inf)",       # an entry of a buffer in 1:4
    "M[i:N, j:N] = where((j // w[i]) == (i // w[i]), 0, -inf)",          # in 1:N + 1
    "M[i:N, j:N] = where((j % (doc[i] + 1)) == 0, 0, -inf)",            # doc in 0:D, plus 1
    "M[i:N, j:N] = where(((j - i) % back[i]) == -1, 0, -inf)",          # negative: back in -3:0
    "M[i:N, j:N] = where((j // (i + 1)) <= 1, 0, -inf)",                # an index: checked when the definition closes
    "Z[i:N] = sum(k, X[k, 0] * (i // (abs(k - 2) + 1)))",               # a summed index: when its sum closes
    "Z[i:N] = X[i, 0] * (i // clamp(doc[i], 1, 3))",
    "Y = doc // w",                                                     # a whole buffer, in matrix notation
    "G[i:N, c:d] = X[(N - 1 - i) // w[i], c]",                          # a subscript: in range at both ends of w
])
def test_divisors_shown_nonzero_are_valid(definition):
    text = INTS + "buffer dil[D] in 1:4\nbuffer w[N] in 1:N + 1\nbuffer back[N] in -3:0\n" + definition
    assert symattn.load(text + f"\noutput {definition[0]}\n").typed.outputs


def test_cases_cover_every_error_class():
    assert {c[2] for c in CASES} == {SpecSyntaxError, SpecNameError, SpecShapeError, SpecCheckError}
    assert len({c[0] for c in CASES}) == len(CASES)


@pytest.mark.parametrize("text, hint", [
    pytest.param(BASE + "Z = X ** 2\noutput Z\n", r"powers are written with \^", id="python_power"),
    pytest.param(BASE + "Z = XX\noutput Z\n", r"did you mean 'X'\?", id="did_you_mean_name"),
    pytest.param(BASE + "Z = sofmax(X)\noutput Z\n", r"did you mean 'softmax'\?", id="did_you_mean_function"),
    pytest.param(BASE + "Z = softmax(X @ Y.T\noutput Z\n", r"^at 4:1: unexpected 'output'; close the '\('",
                 id="unclosed"),
    pytest.param("dim = 3\n", r"'dim' is a keyword and cannot be used as a name", id="keyword"),
    pytest.param(BASE + "Z = X + Y\noutput Z\n", r"for a matrix product use @ with \.T \(A @ B\.T\)",
                 id="broadcast_transposed_product"),
    pytest.param("dim N = 4, d = 3\ninput X[N, d], Y[d, N]\nZ = X * Y\noutput Z\n",
                 r"^elementwise operators broadcast like NumPy; for a matrix product use @$", id="broadcast_product"),
    pytest.param("dim N = 4, M = 3\ninput X[N], Y[M]\nZ = X + Y\noutput Z\n",
                 r"shapes line up from the last axis, and each pair of dims is equal or one of them is 1",
                 id="broadcast_other"),
    # A per-head factor: [h] against [h, N, N] meets the last N, not h; @ is not what is meant.
    pytest.param("dim N = 4, h = 2\ninput S[h, N, N]\nparam tau[h]\nZ = S * tau\noutput Z\n",
                 r"^broadcasting lines up the last axes, so tau \[h\] meets the last axis \(N\) of \[h, N, N\]; "
                 r"for one value per h, give it shape \[h, 1, 1\] \(declare `tau\[h, 1, 1\]`\) or write the "
                 r"definition in index notation: `Z\[a, i, j\] = \.\.\. tau\[a\]`$", id="per_head_factor"),
    pytest.param("dim N = 4, h = 2\ninput S[h, N, N], b[h, N]\nZ = b + S\noutput Z\n",
                 r"so b \[h, N\] meets the last axes \(N, N\) of \[h, N, N\]; for one value per \(h, N\), give it "
                 r"shape \[h, N, 1\] \(declare `b\[h, N, 1\]`\) or .*`Z\[a, i, j\] = \.\.\. b\[a, i\]`$",
                 id="per_row_factor"),
    pytest.param("dim N = 4, d = 3\ninput X[N, d]\nparam W[d, d_k]\nO = X @ W\noutput O\n",
                 r"^a new dim is declared before it is used, e.g. `dim d_k = 4` \(any positive size\)$",
                 id="unknown_dim"),
    pytest.param("dim N = 4, d = 3\ninput X[N, dd]\noutput X\n",
                 r"^did you mean 'd'\? Or: a new dim is declared before it is used", id="unknown_dim_near_one"),
    pytest.param(BASE + "Z = X * Wq\noutput Z\n",
                 r"^a new tensor is declared before it is used \(`input Wq\[\.\.\.\]` or `param Wq\[\.\.\.\]`\) "
                 r"or defined \(`Wq = \.\.\.`\)$", id="unknown_tensor"),
    pytest.param(BASE + "Z = X\n", r"add a line `output Z` after this one \(Z is computed and read by nothing",
                 id="no_output"),
    pytest.param("dim N = 4\nZ[i] = i\noutput Z\n", r"give it explicitly, as i:N", id="index_range"),
    pytest.param(BASE + "Z = argmax(X)\noutput Z\n", r"^the builtins are abs, causal_mask, .*softmax", id="no_near_builtin"),
    pytest.param(BASE + "Z = X.t\noutput Z\n", r"the only postfix is \.T", id="method_call"),
    pytest.param(INTS + "M[i:N, j:N] = where(j <= i & doc[i] == doc[j], 0, -inf)\noutput M\n",
                 r"& and \| bind tighter than a comparison: put each comparison in brackets, as in "
                 r"\(j <= i\) & \(doc\[i\] == doc\[j\]\)", id="logical_precedence"),
    pytest.param(INTS + "Y = X % 2\noutput Y\n", r"integers are indices, dims, integer literals, integer buffers",
                 id="integer_operands"),
])
def test_hint(text, hint):
    with pytest.raises(SpecError) as info:
        symattn.load(text, filename="case.attn")
    assert info.value.hint is not None and re.search(hint, info.value.hint), info.value.hint
    assert str(info.value).splitlines()[-1] == f"hint: {info.value.hint}"


def test_errors_share_one_base_class():
    for cls in (SpecSyntaxError, SpecNameError, SpecShapeError, SpecCheckError):
        assert issubclass(cls, SpecError) and issubclass(cls, SymAttnError)
    assert issubclass(UsageError, SymAttnError) and not issubclass(UsageError, SpecError)


def test_error_positions_count_lines_like_an_editor():
    # A form feed is ordinary whitespace and \x85 may sit in a comment; neither
    # starts a new line, so the reported line and the line shown must agree.
    text = "# caf\u00e9 \x85 note\ndim N = 4\ninput X[N]\x0c\noutput Y\n"
    with pytest.raises(SpecNameError) as info:
        symattn.load(text, filename="case.attn")
    assert (info.value.line, info.value.column) == (4, 8)
    assert str(info.value).splitlines()[1] == "    output Y"


def test_crlf_line_endings_are_accepted():
    spec = symattn.load("dim N = 4\r\ninput X[N]\r\noutput X\r\n")
    assert spec.shape("X") == "[N]"


def test_long_text_is_not_mistaken_for_a_path():
    with pytest.raises(SpecSyntaxError):
        symattn.load("x" * 5000)


# --- files that are not UTF-8 -------------------------------------------------------------

LATIN1 = b"dim N = 4\ninput X[N]\noutput X  # caf\xe9\n"  # \xe9 is 'e acute' in Latin-1, not UTF-8


def test_not_utf8(tmp_path):
    path = tmp_path / "latin1.attn"
    path.write_bytes(LATIN1)
    with pytest.raises(SpecSyntaxError) as info:
        symattn.load(path)
    err = info.value
    assert (err.line, err.column) == (3, 16)
    assert re.fullmatch(r"not UTF-8 text: byte 0xe9 .*", err.message)
    assert str(err).startswith(f"{path}:3:16: error: not UTF-8 text")


def test_not_utf8_column_counts_characters(tmp_path):
    path = tmp_path / "mixed.attn"
    path.write_bytes("# \u00e9t\u00e9 ".encode("utf-8") + b"\xff\n")  # '# été ' is 6 characters, 8 bytes
    with pytest.raises(SpecSyntaxError) as info:
        symattn.load(str(path))
    assert (info.value.line, info.value.column) == (1, 7)


def test_utf8_byte_order_mark_is_accepted(tmp_path):
    path = tmp_path / "bom.attn"
    path.write_bytes(b"\xef\xbb\xbfdim N = 4\ninput X[N]\noutput X\n")
    assert symattn.load(path).shape("X") == "[N]"


def test_not_utf8_cli(tmp_path):
    path = tmp_path / "latin1.attn"
    path.write_bytes(LATIN1)
    result = run_cli("show", str(path))
    assert result.returncode == 2
    assert result.stderr.startswith(f"{path}:3:16: error: not UTF-8 text")
    assert "Traceback" not in result.stderr


# --- usage errors ----------------------------------------------------------------------------


def test_missing_file_is_a_usage_error(tmp_path):
    with pytest.raises(UsageError, match="no such file"):
        symattn.load(tmp_path / "missing.attn")


def test_bad_dim_override_is_a_usage_error():
    with pytest.raises(UsageError, match=r"dim N=-1: sizes are positive integers"):
        symattn.load(BASE + "output X\n", dims={"N": -1})
    # 0 is a size only for a dim used as a number alone (a window side); N is the rows of X
    with pytest.raises(SpecShapeError, match=r"N is 0 \(--dim says so\), but it is used as a size here"):
        symattn.load(BASE + "output X\n", dims={"N": 0})
    assert symattn.load("dim N = 4, R = 2\ninput X[N]\nY[i:N] = X[i] * R\noutput Y\n", dims={"R": 0}).typed.sizes["R"] == 0
    with pytest.raises(UsageError, match=r"--dim M: the spec has no dim 'M'"):
        symattn.load(BASE + "output X\n", dims={"M": 3})


# --- the command line ---------------------------------------------------------------------------

CLI_CASES = [c for c in CASES if c[0] in (
    "unclosed_paren", "unclosed_bracket", "unknown_name", "matmul_inner_dims", "broadcast", "dim_fraction",
    "index_ranges_differ", "grad_unknown_tensor", "check_shapes_differ", "nested_too_deep", "divisor_buffer_holds_zero",
    "divisor_of_indices",
)]


@pytest.mark.parametrize("name, text, cls, line, column, message", CLI_CASES, ids=[c[0] for c in CLI_CASES])
def test_cli_reports_spec_errors(tmp_path, name, text, cls, line, column, message):
    path = tmp_path / f"{name}.attn"
    path.write_text(text, encoding="utf-8")
    result = run_main("show", str(path))  # in process; test_not_utf8_cli runs a fresh interpreter
    assert result.returncode == 2
    assert result.stdout == ""
    assert "Traceback" not in result.stderr
    lines = result.stderr.splitlines()
    head = re.escape(f"{path}:{line}:{column}: error: ")
    assert re.match(head, lines[0]), lines[0]
    assert re.search(message.lstrip("^").rstrip("$"), lines[0][len(f"{path}:{line}:{column}: error: "):])
    source_line = text.split("\n")[line - 1]
    assert lines[1] == "    " + source_line
    assert re.fullmatch(" " * (4 + column - 1) + r"\^~*", lines[2]), lines[2]


@pytest.mark.parametrize("args, stderr", [
    pytest.param(["show", "derivations/self_attention.attn", "--dim", "M=3"],
                 r"^symattn show: error: --dim M: the spec has no dim 'M'", id="unknown_dim"),
    pytest.param(["show", "derivations/self_attention.attn", "--dim", "N=0"], r"N: size 0 is not positive",
                 id="zero_size"),
    pytest.param(["show", "derivations/self_attention.attn", "--dim", "N"], r"expected NAME=SIZE", id="no_size"),
    pytest.param(["show", "no/such/file.attn"], r"^symattn show: error: no/such/file.attn: no such file",
                 id="missing_file"),
    pytest.param(["show", "derivations"], r"is a directory", id="directory"),
    pytest.param(["show"], r"required: SPEC|the following arguments are required", id="no_spec"),
    pytest.param(["frobnicate"], r"invalid choice", id="unknown_command"),
])
def test_cli_usage_errors(monkeypatch, args, stderr):
    monkeypatch.chdir(REPO)
    result = run_main(*args)  # in process: the same main(); tests/cli runs such mistakes in fresh interpreters
    assert result.returncode == 2
    assert re.search(stderr, result.stderr, re.M), result.stderr
    assert "Traceback" not in result.stderr
