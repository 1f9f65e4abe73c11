"""The layout of tests/: a directory per stage, file names unique, no folder that shadows a module.

pytest imports a test file by its base name with the file's directory on sys.path (no
`__init__.py`, "prepend" import mode; conftest.py puts every test directory there), so two test
files of one name would collide, and a folder named like a module beside a test file would be
found by `import` as a namespace package wherever the real module is not installed: with a
folder `torch/` next to a test, `pytest.importorskip("torch")` passes on a machine without
torch and the tests fail instead of skipping. The modules checked are the ones the tests
import, read from their source here.
"""

from __future__ import annotations

import ast

from conftest import REPO

TESTS = REPO / "tests"
FILES = sorted(TESTS.rglob("test_*.py"))
STAGES = {"front", "ir", "symbolic", "prove", "codegen", "check", "docs", "cli", "features", "package"}
TARGETS = {"plan", "numpy", "torch", "triton", "cuda", "all_targets"}


def _imported_modules() -> set[str]:
    """Top-level names of every module a test imports, `pytest.importorskip("x")` included."""
    names: set[str] = set()
    for path in [*FILES, *TESTS.glob("*.py")]:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names.add(node.module.split(".")[0])
            elif (isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "importorskip"
                  and node.args and isinstance(node.args[0], ast.Constant)):
                names.add(str(node.args[0].value).split(".")[0])
    return names


def test_every_test_file_is_under_its_stage():
    for path in FILES:
        parts = path.relative_to(TESTS).parts
        assert len(parts) >= 2 and parts[0] in STAGES, f"{path.relative_to(REPO)}: not under one of {sorted(STAGES)}"
        if parts[0] == "codegen":
            assert len(parts) == 3 and parts[1] in TARGETS, f"{path.relative_to(REPO)}: codegen tests go by target"


def test_test_file_names_are_unique():
    seen: dict[str, str] = {}
    for path in FILES:
        assert path.name not in seen, f"{path.relative_to(REPO)} and {seen[path.name]} share a name"
        seen[path.name] = str(path.relative_to(REPO))


def test_no_folder_on_the_import_path_is_named_like_an_imported_module():
    modules = _imported_modules()
    assert {"torch", "triton", "numpy", "symattn"} <= modules  # the reading above found the imports
    for directory in sorted({path.parent for path in FILES} | {TESTS}):
        for folder in directory.iterdir():
            if folder.is_dir():
                assert folder.name not in modules, (
                    f"{folder.relative_to(REPO)} sits beside test files and is named like the module "
                    f"'{folder.name}': without that module installed, `import {folder.name}` finds the folder")
