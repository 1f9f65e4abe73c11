"""The package's layering: stages import only earlier stages, no private names, no cycles.

The order (README, "How it is built"): the base modules (errors, budget,
progress), then ir (the typed IR every stage shares), front (text -> typed
IR), symbolic, prove, codegen, check, docs, and last the entry points (api,
golden, regenerate, cli). A module may import from its own stage or an
earlier one; library modules never import the CLI.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from conftest import REPO

PACKAGE = REPO / "symattn"

STAGES = ["base", "ir", "front", "symbolic", "prove", "codegen", "check", "docs", "entry"]
BASE = {"errors", "budget", "cache", "progress", "present", "version"}
ENTRY = {"api", "golden", "regenerate", "cli", "__init__", "__main__"}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def stage_of(module: str) -> str:
    parts = module.split(".")
    if len(parts) == 1:
        return "entry"
    head = parts[1]
    if head in BASE:
        return "base"
    if head in ENTRY:
        return "entry"
    if head in STAGES:
        return head
    raise AssertionError(f"{module} belongs to no stage: put it in one of {STAGES[1:-1]} or list it as base")


MODULES = sorted(PACKAGE.rglob("*.py"))


def imports(path: Path):
    """(imported module, imported names, line) for every import of a symattn module in `path`."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = module_name(path) if path.name == "__init__.py" else module_name(path).rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            elif node.module and node.module.split(".")[0] == "symattn":
                target = node.module
            else:
                continue
            names = [a.name for a in node.names]
            for name in names:  # `from . import typed` imports a module
                candidate = f"{target}.{name}"
                if (PACKAGE.parent / (candidate.replace(".", "/") + ".py")).exists() or \
                        (PACKAGE.parent / candidate.replace(".", "/") / "__init__.py").exists():
                    yield candidate, [], node.lineno
                else:
                    yield target, [name], node.lineno
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "symattn":
                    yield alias.name, [], node.lineno


@pytest.mark.parametrize("path", MODULES, ids=[module_name(p) for p in MODULES])
def test_imports_go_only_to_earlier_stages_and_public_names(path):
    here = module_name(path)
    mine = STAGES.index(stage_of(here))
    for target, names, line in imports(path):
        theirs = STAGES.index(stage_of(target))
        assert theirs <= mine, f"{here}:{line} imports {target} from a later stage ({stage_of(target)})"
        if target.split(".")[-1] == "cli":
            assert here in ("symattn.__main__",), f"{here}:{line} imports the CLI"
        private = [n for n in names if n.startswith("_") and not n.startswith("__")]
        assert not private, f"{here}:{line} imports private names {private} from {target}"


def test_no_import_cycles_between_modules():
    graph = {module_name(p): {t for t, _, _ in imports(p)} for p in MODULES}
    state: dict[str, int] = {}

    def visit(node, trail):
        state[node] = 1
        for nxt in graph.get(node, ()):
            if nxt not in graph:
                continue
            if state.get(nxt) == 1:
                raise AssertionError("import cycle: " + " -> ".join(trail + [node, nxt]))
            if nxt not in state:
                visit(nxt, trail + [node])
        state[node] = 2

    for module in graph:
        if module not in state:
            visit(module, [])


def test_every_stage_package_states_its_contract():
    for stage in STAGES[1:-1]:
        init = PACKAGE / stage / "__init__.py"
        doc = ast.get_docstring(ast.parse(init.read_text(encoding="utf-8")))
        assert doc and "Contract" in doc, f"{init} needs a docstring stating the stage's contract"


def test_no_module_is_over_600_lines():
    for path in MODULES:
        lines = len(path.read_text(encoding="utf-8").splitlines())
        assert lines <= 600, f"{module_name(path)} has {lines} lines: split it along a seam"


TARGETS = ("numpy", "torch", "triton", "cuda")  # the code targets: each renders the attention plan


@pytest.mark.parametrize("path", [p for p in MODULES if len(p.relative_to(PACKAGE).parts) > 2
                                  and p.relative_to(PACKAGE).parts[:2] in [("codegen", t) for t in TARGETS]],
                         ids=lambda p: module_name(p))
def test_no_target_package_imports_another(path):
    """A target imports the plan, the shared array printers and its own modules; never another target."""
    here = module_name(path).split(".")[2]
    for target, _, line in imports(path):
        parts = target.split(".")
        if parts[:2] == ["symattn", "codegen"] and len(parts) > 2 and parts[2] in TARGETS:
            assert parts[2] == here, f"{module_name(path)}:{line} imports the {parts[2]} target"


def _operator_table(node: ast.AST) -> str | None:
    """'binary' or 'comparison' when `node` is a dict literal that spells two or more operators (IR operation ->
    its symbol), the table every printer shares; tables of other facts about operators (negations, functions)
    are not spellings."""
    if not isinstance(node, ast.Dict):
        return None
    pairs = {k.value: v.value for k, v in zip(node.keys, node.values)
             if isinstance(k, ast.Constant) and isinstance(v, ast.Constant) and isinstance(k.value, str)}
    binary = {k for k, v in pairs.items() if k in {"add", "sub", "mul", "div"} and v in {"+", "-", "*", "/"}}
    comparison = {k for k, v in pairs.items() if k in {"<", "<=", ">", ">=", "==", "!="} and v == k}
    if len(binary) >= 2:
        return "binary"
    return "comparison" if len(comparison) >= 4 else None


def test_the_operator_tables_are_defined_once():
    """The printers' operator symbols come from one table (`symattn.ir.printer`); a target overrides entries."""
    found = []
    for path in MODULES:
        if path == PACKAGE / "ir" / "printer.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            kind = _operator_table(node)
            if kind is not None:
                found.append(f"{module_name(path)}:{node.lineno} ({kind})")
    assert not found, f"operator tables written again: {found}"
