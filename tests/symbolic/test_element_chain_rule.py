"""The element level's node-by-node chain rule against a naive, independent computation.

`ElementModel.ground_truth(T)` differentiates small local formulas and writes
the result in the slots of other tensors and their gradients. Here the same
gradients are computed the naive way, sharing no code with symattn: a
hand-written forward pass on NumPy object arrays of SymPy symbols expands
every output entry down to the inputs and params, `L = sum(O * grad(O))`, and
`sympy.diff(L, x)` for every entry x. (For an intermediate T the naive forward
takes free symbols for T, differentiates, then puts T's own value back.)
Both sides are then compared exactly: every `exp(...)` is split into
positive atoms `exp(monomial)`, every other function becomes an atom, and the
numerator of the difference must expand to zero.

Sizes are tiny (N = 2, d_k = 1) so that the naive expansion stays cheap and
`1/sqrt(d_k)` stays rational.
"""

from __future__ import annotations


import numpy as np
import pytest
import sympy

import symattn
from symattn.symbolic.element import ElementModel
from conftest import REPO

DERIVATIONS = REPO / "derivations"


# --- naive forward passes, written from the specs' text, not from symattn ----------


def _symbol(name: str) -> sympy.Symbol:
    return sympy.Symbol(name, real=True)


def _tex_head(tensor: str) -> str:
    """`W_q` -> `W^{q}`: how people write a parameter's name with its subscript raised."""
    base, _, sub = tensor.partition("_")
    return f"{base}^{{{sub}}}" if sub else base


def _symbols(head: str, shape: tuple[int, ...]) -> np.ndarray:
    out = np.empty(shape, dtype=object)
    for index in np.ndindex(*shape):
        out[index] = _symbol(f"{head}_{{{','.join(str(i + 1) for i in index)}}}")
    return out


def _exp(array: np.ndarray) -> np.ndarray:
    return np.vectorize(sympy.exp, otypes=[object])(array)


def _softmax_rows(scores: np.ndarray) -> np.ndarray:
    e = _exp(scores)
    return e / e.sum(axis=-1, keepdims=True)


class _Forward:
    """Values of every tensor; an `override` replaces a tensor's value (free symbols)."""

    def __init__(self, leaves: dict[str, np.ndarray], override: dict[str, np.ndarray]) -> None:
        self.v = dict(leaves)
        self.override = override

    def put(self, name: str, value: np.ndarray) -> np.ndarray:
        self.v[name] = self.override.get(name, np.asarray(value, dtype=object))
        return self.v[name]


def self_attention_forward(leaves, override):
    f = _Forward(leaves, override)
    x, w_q, w_k, w_v = leaves["X"], leaves["W_q"], leaves["W_k"], leaves["W_v"]
    d_k = w_q.shape[1]
    q, k, v = f.put("Q", x @ w_q), f.put("K", x @ w_k), f.put("V", x @ w_v)
    s = f.put("S", q @ k.T / sympy.sqrt(d_k))
    p = f.put("P", _softmax_rows(s))
    f.put("O", p @ v)
    return f.v


def causal_forward(leaves, override):
    f = _Forward(leaves, override)
    x, w_q, w_k, w_v = leaves["X"], leaves["W_q"], leaves["W_k"], leaves["W_v"]
    n, d_k = x.shape[0], w_q.shape[1]
    mask = np.array([[sympy.Integer(0) if j <= i else -sympy.oo for j in range(n)] for i in range(n)], dtype=object)
    m = f.put("M", mask)
    q, k, v = f.put("Q", x @ w_q), f.put("K", x @ w_k), f.put("V", x @ w_v)
    p = f.put("P", _softmax_rows(q @ k.T / sympy.sqrt(d_k) + m))
    f.put("O", p @ v)
    return f.v


def additive_forward(leaves, override):
    f = _Forward(leaves, override)
    x, w_1, w_2, w, w_v = leaves["X"], leaves["W_1"], leaves["W_2"], leaves["w"], leaves["W_v"]
    a, b = x @ w_1, x @ w_2                      # [N, d_a]
    n, d_a = a.shape
    scores = np.array([[sum(w[c] * sympy.tanh(a[i, c] + b[j, c]) for c in range(d_a)) for j in range(n)]
                       for i in range(n)], dtype=object)
    s = f.put("S", scores)
    p = f.put("P", _softmax_rows(s))
    f.put("O", p @ (x @ w_v))
    return f.v


def multi_head_forward(leaves, override):
    f = _Forward(leaves, override)
    x, w_q, w_k, w_v, w_o = leaves["X"], leaves["W_q"], leaves["W_k"], leaves["W_v"], leaves["W_o"]
    h, _, d_k = w_q.shape
    q = f.put("Q", np.array([x @ w_q[c] for c in range(h)], dtype=object))
    k = f.put("K", np.array([x @ w_k[c] for c in range(h)], dtype=object))
    v = f.put("V", np.array([x @ w_v[c] for c in range(h)], dtype=object))
    p = f.put("P", np.array([_softmax_rows(q[c] @ k[c].T / sympy.sqrt(d_k)) for c in range(h)], dtype=object))
    z = f.put("Z", np.array([p[c] @ v[c] for c in range(h)], dtype=object))
    merged = np.concatenate([z[c] for c in range(h)], axis=-1)   # head-major [N, h * d_k]
    f.put("O", merged @ w_o)
    return f.v


CASES = {
    "self_attention": (self_attention_forward, {"N": 2, "d": 2, "d_k": 1}),
    "causal": (causal_forward, {"N": 2, "d": 2, "d_k": 1}),
    "additive": (additive_forward, {"N": 2, "d": 1, "d_a": 2}),
    "multi_head": (multi_head_forward, {"N": 2, "d": 1, "h": 2, "d_k": 1}),
}


# --- exact comparison, independent of symattn.symbolic.element ------------------------------


def _canonical(expr: sympy.Expr, atoms: dict) -> sympy.Expr:
    """Functions replaced by symbols; exp(sum c_k m_k) = prod E_{m_k}^{c_k} with E_m = exp(m) > 0."""

    def atom(key, **assumptions):
        if key not in atoms:
            atoms[key] = sympy.Symbol(f"_atom{len(atoms)}", **assumptions)
        return atoms[key]

    def walk(node):
        if not node.args:
            return node
        node = node.func(*[walk(a) for a in node.args])
        if isinstance(node, sympy.exp):
            out = sympy.Integer(1)
            for term in sympy.Add.make_args(sympy.expand(node.args[0])):
                coeff, monomial = term.as_coeff_Mul()
                out *= sympy.exp(coeff) if monomial == 1 else atom(("exp", monomial), positive=True) ** coeff
            return out
        if isinstance(node, sympy.Function):
            return atom((node.func, sympy.expand(node.args[0])), real=True)
        return node

    return walk(sympy.sympify(expr))


def exactly_equal(a, b) -> bool:
    atoms: dict = {}
    numerator, _ = sympy.fraction(sympy.together(_canonical(a, atoms) - _canonical(b, atoms)))
    return sympy.expand(numerator) == 0


def unfold(model: ElementModel, entries: np.ndarray) -> np.ndarray:
    """Entries written in slots and gradient symbols, rewritten down to inputs, params and grad(O)."""
    spec = model.spec
    mapping = {}
    for name in model.slot:
        mapping.update(zip(model.slot[name].flat, model.local[name].flat))
    for name in spec.tensors:
        if name not in spec.outputs:
            mapping.update(zip(model.upstream[name].flat, model.ground_truth(name).flat))
    keys = set(mapping)
    out = []
    for entry in np.asarray(entries, dtype=object).flat:
        entry = sympy.sympify(entry)
        for _ in range(len(spec.tensors) * 2 + 2):
            if not entry.free_symbols & keys:
                break
            entry = entry.xreplace(mapping)
        assert not entry.free_symbols & keys, "unfolding did not terminate"
        out.append(entry)
    return np.array(out, dtype=object).reshape(np.shape(entries))


# --- fixtures ---------------------------------------------------------------------------


class _Case:
    def __init__(self, name: str) -> None:
        forward, dims = CASES[name]
        self.spec = symattn.load(DERIVATIONS / f"{name}.attn", dims=dims).typed
        self.forward = forward
        self.model = ElementModel(self.spec)
        self.leaves = {n: _symbols(_tex_head(n), self.spec.concrete_shape(self.spec.tensors[n].shape))
                       for n in self.spec.given}
        (out,) = self.spec.outputs
        self.output = out
        self.bar = _symbols(f"\\bar{{{out}}}", self.spec.concrete_shape(self.spec.tensors[out].shape))
        self.values = forward(self.leaves, {})
        self._naive: dict[str, np.ndarray] = {}

    def naive_gradient(self, name: str) -> np.ndarray:
        """dL/dT by sympy.diff of the fully expanded L, at T's own value."""
        if name not in self._naive:
            self._naive[name] = self._naive_gradient(name)
        return self._naive[name]

    def _naive_gradient(self, name: str) -> np.ndarray:
        if name in self.leaves:
            free, values = self.leaves[name], self.values
        else:
            shape = self.values[name].shape
            free = np.array([sympy.Dummy(f"free_{name}", real=True) for _ in range(int(np.prod(shape)))],
                            dtype=object).reshape(shape)
            values = self.forward(self.leaves, {name: free})
        loss = (values[self.output] * self.bar).sum()
        grad = [sympy.diff(loss, x) for x in free.flat]
        if name not in self.leaves:
            back = dict(zip(free.flat, self.values[name].flat))
            grad = [g.xreplace(back) for g in grad]
        return np.array(grad, dtype=object).reshape(free.shape)


_CACHE: dict[str, _Case] = {}


def case(name: str) -> _Case:
    if name not in _CACHE:
        _CACHE[name] = _Case(name)
    return _CACHE[name]


def _gradient_targets():
    for name in CASES:
        spec = symattn.load(DERIVATIONS / f"{name}.attn", dims=CASES[name][1]).typed
        for tensor in spec.tensors:
            if tensor not in spec.outputs:
                yield pytest.param(name, tensor, id=f"{name}-{tensor}")


# --- tests ----------------------------------------------------------------------------


def test_symbol_names_read_as_people_write_them():
    model = case("self_attention").model
    assert model.leaf["X"][0, 1].name == "X_{1,2}"
    assert model.leaf["W_q"][1, 0].name == "W^{q}_{2,1}"
    assert model.upstream["O"][0, 0].name == "\\bar{O}_{1,1}"
    assert all(s.is_real for s in model.leaf["X"].flat)


@pytest.mark.parametrize("name", list(CASES))
def test_naive_forward_uses_the_models_leaf_symbols(name):
    c = case(name)
    for leaf, symbols in c.leaves.items():
        assert list(symbols.flat) == list(c.model.leaf[leaf].flat), leaf
    assert list(c.bar.flat) == list(c.model.upstream[c.output].flat)


@pytest.mark.parametrize("name", list(CASES))
def test_forward_entries_unfold_to_the_naive_forward(name):
    c = case(name)
    unfolded = unfold(c.model, c.model.slot[c.output])
    for got, want in zip(unfolded.flat, c.values[c.output].flat):
        assert exactly_equal(got, want)


@pytest.mark.parametrize("name, tensor", list(_gradient_targets()))
def test_ground_truth_equals_naive_diff_of_expanded_loss(name, tensor):
    c = case(name)
    truth = unfold(c.model, c.model.ground_truth(tensor))
    naive = c.naive_gradient(tensor)
    assert truth.shape == naive.shape
    for index in np.ndindex(*naive.shape):
        assert exactly_equal(truth[index], naive[index]), f"grad({tensor}){list(index)} differs"


def test_the_exact_comparison_is_not_vacuous():
    """A wrong gradient (grad(W_k) offered as grad(W_q), or one entry scaled) is told apart."""
    c = case("self_attention")
    naive_q = c.naive_gradient("W_q")
    truth_k = unfold(c.model, c.model.ground_truth("W_k"))
    assert not all(exactly_equal(a, b) for a, b in zip(naive_q.flat, truth_k.flat))
    truth_q = unfold(c.model, c.model.ground_truth("W_q"))
    assert exactly_equal(truth_q[0, 0], naive_q[0, 0])
    assert not exactly_equal(2 * truth_q[0, 0], naive_q[0, 0])


def test_causal_mask_gives_exactly_zero_weight():
    c = case("causal")
    p = unfold(c.model, c.model.slot["P"])
    assert p[0, 1] == 0                  # token 1 cannot see token 2
    assert p[0, 0] == 1                  # so it attends only to itself
    assert p[1, 0] != 0 and p[1, 1] != 0
    assert exactly_equal(p[1, 0] + p[1, 1], 1)
    # No weight leaks into the gradient either: token 2's key is masked out of row 1, so with
    # an upstream gradient on row 1 of O only, grad(K) of token 2 is exactly zero.
    bar_row2 = {s: 0 for s in c.model.upstream["O"][1]}
    grad_k = unfold(c.model, c.model.ground_truth("K"))
    assert all(sympy.simplify(e.xreplace(bar_row2)) == 0 for e in grad_k[1])


def test_ground_truth_of_an_output_is_its_upstream_gradient():
    c = case("self_attention")
    assert list(c.model.ground_truth("O").flat) == list(c.model.upstream["O"].flat)
