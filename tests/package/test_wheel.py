"""The wheel built from this repository works on its own: grammar and example inside.

Builds the wheel once as a user's `pip install .` would (from a copy of the
sources, so the checkout gets no build/ directory; pip installs the build
backend the project declares into an isolated environment, so nothing but
pip is needed here, and a machine that cannot reach a package index skips),
installs it with --no-deps into a fresh virtual environment that sees this
interpreter's site-packages (for lark, sympy, numpy), and runs that
environment's python and `symattn` script from a directory outside the
repository.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest

from conftest import REPO

pytestmark = pytest.mark.slow

SPEC = "dim N = 4, d = 3\ninput X[N, d]\nparam W[d, d]\nO = softmax(X @ W, axis=-1)\noutput O\n"


# What pip says when it cannot fetch the build backend (no network, no index).
OFFLINE = re.compile(r"No matching distribution found|Could not find a version that satisfies|"
                     r"Failed to establish a new connection|Temporary failure in name resolution")
# Warnings from the build backend: setuptools' warning classes and distutils-style "warning:" lines.
# (pip's own notes are "WARNING:" in capitals and say nothing about the project.)
BUILD_WARNING = re.compile(r"\w*Warning\b|^\s*warning:", re.M)


def _clean_env(*drop_also: str) -> dict[str, str]:
    """This environment without PYTHONPATH (which would import symattn from the checkout, not the wheel)."""
    drop = {"PYTHONPATH", *drop_also}
    return {k: v for k, v in os.environ.items() if k not in drop}


def _run(*args, cwd: Path, timeout: float = 300, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([str(a) for a in args], cwd=cwd, capture_output=True, text=True, timeout=timeout,
                          env=env if env is not None else _clean_env())


def _see_these_site_packages(python: Path, cwd: Path) -> None:
    """Let the venv import this interpreter's packages (lark, sympy, numpy) after its own.
    `--system-site-packages` alone does not when this interpreter is itself a venv (CI's is):
    that flag shows the base interpreter's site-packages, not this venv's. A .pth line only
    adds the directory to sys.path (the .pth files in it, such as an editable install's, are
    not run), so `import symattn` still finds the wheel first."""
    found = _run(python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])", cwd=cwd)
    assert found.returncode == 0, found.stderr
    import site

    outer = [*site.getsitepackages(), site.getusersitepackages()]
    (Path(found.stdout.strip()) / "_symattn_test_outer.pth").write_text(
        "".join(f"{d}\n" for d in outer if Path(d).is_dir()), encoding="utf-8")


@pytest.fixture(scope="module")
def venv(tmp_path_factory) -> dict[str, Path]:
    if importlib.util.find_spec("pip") is None:
        pytest.skip("building a wheel needs pip, which is not installed")
    root = tmp_path_factory.mktemp("wheel")
    source = root / "src"
    source.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE", "setup.cfg", "setup.py", "MANIFEST.in"):
        if (REPO / name).exists():
            shutil.copy2(REPO / name, source / name)
    for name in ("symattn", "grammar"):
        shutil.copytree(REPO / name, source / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    dist = root / "dist"
    # -v shows the backend's output (its warnings); byte-compiling stays on, else distutils notes that it is off.
    built = _run(sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-cache-dir", "-v", "-w", dist, source,
                 cwd=root, env=_clean_env("PYTHONDONTWRITEBYTECODE"))
    if built.returncode != 0:
        if OFFLINE.search(built.stdout + built.stderr):
            pytest.skip("cannot build a wheel here: pip cannot fetch the build backend (setuptools) from an index")
        pytest.fail(f"pip wheel failed:\n{built.stdout}\n{built.stderr}")
    (wheel,) = dist.glob("symattn-*.whl")

    env = root / "venv"
    made = _run(sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", env, cwd=root)
    assert made.returncode == 0, made.stderr
    python = env / ("Scripts/python.exe" if sys.platform == "win32" else "bin/python")
    # The outer pip installs into the venv (--python needs pip >= 22.3; else the venv's own pip).
    installed = _run(sys.executable, "-m", "pip", "--python", python, "install", "--no-deps", "--no-index",
                     "-q", wheel, cwd=root)
    if installed.returncode != 0:
        shutil.rmtree(env)
        made = _run(sys.executable, "-m", "venv", "--system-site-packages", env, cwd=root)
        assert made.returncode == 0, made.stderr
        installed = _run(python, "-m", "pip", "install", "--no-deps", "--no-index", "-q", wheel, cwd=root)
    assert installed.returncode == 0, installed.stderr
    _see_these_site_packages(python, root)
    outside = root / "elsewhere"
    outside.mkdir()
    return {"wheel": wheel, "env": env, "python": python, "cwd": outside, "log": built.stdout + built.stderr}


def test_wheel_ships_grammar_and_example(venv):
    names = zipfile.ZipFile(venv["wheel"]).namelist()
    assert "symattn/grammar/attention.lark" in names
    assert "symattn/examples/self_attention.attn" in names
    assert not any(n.startswith(("tests/", "derivations/", "grammar/")) for n in names), names


def test_wheel_ships_license_types_marker_and_cuda_runtime(venv):
    wheel = zipfile.ZipFile(venv["wheel"])
    names = wheel.namelist()
    assert {"symattn/py.typed", "symattn/runtime/cuda_host.h", "symattn/runtime/cuda_warp.h",
            "symattn/runtime/philox.h", "symattn/codegen/cuda/__init__.py"} <= set(names)
    (license_file,) = [n for n in names if n.endswith(".dist-info/licenses/LICENSE")]
    assert wheel.read(license_file) == (REPO / "LICENSE").read_bytes()
    (metadata,) = [n for n in names if n.endswith(".dist-info/METADATA")]
    headers = wheel.read(metadata).decode("utf-8").split("\n\n")[0].splitlines()
    assert "License-Expression: MIT" in headers
    assert not any(h.startswith("Classifier: License ::") for h in headers), "SPDX expression, not a classifier"


def test_the_build_prints_no_warnings(venv):
    warnings = [line for line in venv["log"].splitlines() if BUILD_WARNING.search(line)]
    assert not warnings, "\n".join(warnings)


def test_installed_package_parses_a_spec(venv):
    script = textwrap.dedent(f"""
        import sys
        from importlib import resources
        import symattn
        print(symattn.__file__)
        print(resources.files("symattn.grammar").joinpath("attention.lark"))
        spec = symattn.load({SPEC!r})
        print(spec.shape("O"), spec.concrete_shape("O"))
    """)
    result = _run(venv["python"], "-c", script, cwd=venv["cwd"])
    assert result.returncode == 0, result.stderr
    module_file, grammar_file, shape = result.stdout.splitlines()
    env = venv["env"].resolve()
    assert Path(module_file).resolve().is_relative_to(env), module_file
    assert Path(grammar_file).resolve().is_relative_to(env), grammar_file
    assert shape == "[N, d] (4, 3)"


def test_installed_console_script(venv):
    spec = venv["cwd"] / "tiny.attn"
    spec.write_text(SPEC, encoding="utf-8")
    script = venv["env"] / ("Scripts/symattn.exe" if sys.platform == "win32" else "bin/symattn")
    result = _run(script, "show", "tiny.attn", "--dim", "N=7", cwd=venv["cwd"])
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("attention tiny  (tiny.attn)")
    assert any(line.split()[:4] == ["O", "output", "[N,", "d]"] and "[7, 3]" in line
               for line in result.stdout.splitlines()), result.stdout
    bad = venv["cwd"] / "bad.attn"
    bad.write_text("dim N = 4\ninput X[N\noutput X\n", encoding="utf-8")
    result = _run(script, "show", "bad.attn", cwd=venv["cwd"])
    assert result.returncode == 2
    assert result.stderr.startswith("bad.attn:2:8: error: '[' is never closed")
