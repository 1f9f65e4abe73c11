"""What a benchmark table needs to say about where and when it was measured.

`describe()` is one line for the top of a table in BENCHMARKS.md: the date (UTC), the CPU and
its cores, the load average (a shared machine's load moves the figures more than the code
does), and the versions of Python and the packages the benchmark reads. `table(header, rows)`
prints a Markdown table. Used by the `--markdown` option of the benchmark scripts.
"""

from __future__ import annotations

import os
import platform
from datetime import datetime, timezone
from importlib import metadata

__all__ = ["describe", "load_average", "table"]


def _cpu() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as info:
            for line in info:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def load_average() -> str:
    try:
        return " ".join(f"{x:.1f}" for x in os.getloadavg())
    except OSError:
        return "unknown"


def describe(packages: tuple[str, ...] = ("sympy", "numpy", "lark")) -> str:
    versions = []
    for name in packages:
        try:
            versions.append(f"{name} {metadata.version(name)}")
        except metadata.PackageNotFoundError:
            versions.append(f"{name} not installed")
    return (f"Measured {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC on {_cpu()}, {os.cpu_count()} cores, "
            f"load average {load_average()} (1, 5, 15 min); Python {platform.python_version()}, "
            + ", ".join(versions) + ".")


def table(header: list[str], rows: list[list[str]], right: set[int] = frozenset()) -> str:
    """A Markdown table; the columns in `right` are right-aligned (numbers)."""
    rule = ["---:" if k in right else "---" for k in range(len(header))]
    lines = [header, rule, *rows]
    return "\n".join("| " + " | ".join(str(cell) for cell in line) + " |" for line in lines)
