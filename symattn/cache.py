"""A cache on disk of finished results (documents, verdicts), so that the second run on a spec is fast.

Contract: `remembered(kind, parts, compute, keep)` returns what `compute()`
returns: from disk when the same `kind` and `parts` were computed before by
the same code, else computed now and, when `keep()` says the result is
reproducible, stored. The key is a SHA-256 of the kind, the parts (their
`repr`: strings, numbers, booleans, tuples of them), and a fingerprint of
the code: every source file of the symattn package (and the checkout's
grammar), the version of Python and of each library a result depends on
(sympy, mpmath, numpy, lark, matplotlib, pillow). Any change to symattn's
source, or an upgrade, is a different key, so a hit is exactly what would
be computed now. Callers pass a `keep` that is false when a time budget ran
out (`symattn.budget.runs_out`): a claim that gave up on a busy machine may
be proved on an idle one, and is never stored. So a stored result is the
one no budget cut short, which is what every budget gives on a machine fast
enough (documents leave the budget out of their key; verdicts keep it).

Where: `$SYMATTN_CACHE_DIR`, else `$XDG_CACHE_HOME/symattn`, else
`~/.cache/symattn`; one file per key. `SYMATTN_NO_CACHE=1` turns it off
(nothing read or written). Each file starts with a magic line and the
SHA-256 of the pickled payload: a truncated or corrupted file fails that
test and is recomputed (and rewritten), never unpickled. Files are written
to a temporary name and renamed, so a reader never sees half a file; a
directory that cannot be written is ignored. Past `LIMIT` files the oldest
are removed (every change to symattn's source makes new keys, so old files
are never read again). The directory is trusted as Python's own
`__pycache__` is: it holds pickles.
"""

from __future__ import annotations

import functools
import hashlib
import os
import pickle
import sys
import tempfile
from importlib import metadata
from pathlib import Path
from typing import Callable, TypeVar

from .version import __version__

__all__ = ["remembered", "place", "directory", "enabled", "fingerprint"]

T = TypeVar("T")

MAGIC = b"symattn-cache 1\n"
LIBRARIES = ("sympy", "mpmath", "numpy", "lark", "matplotlib", "pillow")
SOURCES = (".py", ".lark", ".attn", ".h")   # the package files results can depend on
LIMIT = 500        # files kept; a document with its figures is 10-100 kB


def enabled() -> bool:
    """False when SYMATTN_NO_CACHE is set to anything but "" or "0"."""
    return os.environ.get("SYMATTN_NO_CACHE", "") in ("", "0")


def directory() -> Path:
    """Where the cache files are (read from the environment at each call, so tests can move it)."""
    explicit = os.environ.get("SYMATTN_CACHE_DIR")
    if explicit:
        return Path(explicit)
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg) if xdg and Path(xdg).is_absolute() else Path.home() / ".cache"
    return base / "symattn"


def _library_version(name: str) -> str:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "-"


@functools.lru_cache(maxsize=1)
def fingerprint() -> str:
    """SHA-256 of the code a result depends on: symattn's files and the libraries' versions."""
    digest = hashlib.sha256()
    package = Path(__file__).resolve().parent
    files = [p for p in package.rglob("*") if p.suffix in SOURCES and "__pycache__" not in p.parts]
    grammar = package.parent / "grammar"   # a checkout's grammar, which the parser prefers
    if grammar.is_dir():
        files += [p for p in grammar.rglob("*.lark")]
    for path in sorted(files):
        digest.update(str(path.relative_to(package.parent)).encode("utf-8") + b"\0")
        digest.update(path.read_bytes() + b"\0")
    versions = [f"symattn {__version__}", f"python {sys.version}"]
    versions += [f"{name} {_library_version(name)}" for name in LIBRARIES]
    digest.update("\n".join(versions).encode("utf-8"))
    return digest.hexdigest()


def _path(kind: str, parts: tuple) -> Path:
    key = hashlib.sha256(f"{fingerprint()}\n{kind}\n{parts!r}".encode("utf-8")).hexdigest()
    return directory() / f"{kind}-{key[:40]}.pickle"


def _read(path: Path) -> tuple[bool, object]:
    """(True, value) from an intact file; (False, None) when there is none or it is damaged."""
    try:
        data = path.read_bytes()
    except OSError:
        return False, None
    head, payload = data[: len(MAGIC) + 64], data[len(MAGIC) + 64:]
    if head != MAGIC + hashlib.sha256(payload).hexdigest().encode("ascii"):
        return False, None
    try:
        return True, pickle.loads(payload)
    except (pickle.UnpicklingError, EOFError, AttributeError, ImportError):  # written by other code
        return False, None


def _write(path: Path, value: object) -> None:
    payload = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
    data = MAGIC + hashlib.sha256(payload).hexdigest().encode("ascii") + payload
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        handle, temporary = tempfile.mkstemp(prefix=path.name, suffix=".tmp", dir=path.parent)
        try:
            with os.fdopen(handle, "wb") as out:
                out.write(data)
            os.replace(temporary, path)
        except BaseException:
            os.unlink(temporary)
            raise
    except OSError:   # a read-only or full disk: the result is still returned, just not kept
        return
    _prune(path.parent)


def _prune(folder: Path) -> None:
    """Remove the oldest cache files past LIMIT (by modification time)."""
    try:
        entries = [e for e in os.scandir(folder) if e.name.endswith(".pickle")]
        if len(entries) <= LIMIT:
            return
        entries.sort(key=lambda e: e.stat().st_mtime)
        for entry in entries[: len(entries) - LIMIT]:
            os.unlink(entry.path)
    except OSError:   # another process removed one first, or the folder is not ours to clean
        return


def place(name: str) -> Path | None:
    """A path in the cache directory for a file another library keeps itself (Lark's parser
    tables), or None when the cache is off or the directory cannot be made."""
    if not enabled():
        return None
    try:
        directory().mkdir(parents=True, exist_ok=True)
    except OSError:
        return None
    return directory() / name


def remembered(kind: str, parts: tuple, compute: Callable[[], T], keep: Callable[[], bool]) -> T:
    """compute(), or its stored result (see the module docstring)."""
    if not enabled():
        return compute()
    path = _path(kind, parts)
    found, value = _read(path)
    if found:
        return value  # type: ignore[return-value]
    value = compute()
    if keep():
        _write(path, value)
    return value
