"""How long `symattn derive SPEC -o FILE` takes for each spec in derivations/.

    python benchmarks/bench_documents.py [--formats md html] [--repeat 3] [--repo DIR ...] [SPEC ...]

Each run is the command a user types, in a fresh interpreter (imports, parsing,
the derivation, every element-level check, figures and rendering included),
writing the document into a temporary directory. Prints one row per spec and
format: the median wall-clock seconds and the median CPU seconds of the child
process (CPU time is steadier on a busy machine), and the load average before
the runs. The goal (issue 15) is under 2 s per spec. With several `--repo`
checkouts (say, an unpacked `git archive` of an older commit and this one), the
runs of each spec alternate between them, so that both see the same load.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def run_once(repo: Path, spec: Path, fmt: str, out_dir: Path) -> tuple[float, float]:
    """(wall seconds, CPU seconds) of one `symattn derive` of `repo`'s code in a fresh interpreter."""
    env = dict(os.environ, PYTHONPATH=str(repo) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    target = out_dir / f"{spec.stem}.{fmt}"
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "symattn", "derive", str(spec), "-o", str(target), "--format", fmt],
                   check=True, env=env, cwd=repo, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("specs", nargs="*", type=Path, help="specs (default: every derivations/*.attn)")
    parser.add_argument("--formats", nargs="+", default=["md", "html"], choices=["md", "html", "tex"])
    parser.add_argument("--repeat", type=int, default=3, help="runs per spec and format (median reported)")
    parser.add_argument("--repo", action="append", type=Path,
                        help="a checkout whose symattn to time (repeatable; default: this one)")
    args = parser.parse_args(argv)
    repos = [r.resolve() for r in args.repo] if args.repo else [REPO]
    specs = [s.resolve() for s in args.specs] or sorted((REPO / "derivations").glob("*.attn"))
    print(f"# {time.strftime('%a %b %d %H:%M:%S UTC %Y', time.gmtime())}, {os.cpu_count()} cores, "
          f"load average {' '.join(f'{x:.1f}' for x in os.getloadavg())}, Python {sys.version.split()[0]}")
    label = len(repos) > 1
    print(("| code " if label else "") + "| spec | format | wall s (median) | cpu s (median) | wall s (all runs) |")
    print(("| --- " if label else "") + "| --- | --- | ---: | ---: | --- |")
    with tempfile.TemporaryDirectory() as tmp:
        for spec in specs:
            for fmt in args.formats:
                runs: dict[Path, list] = {repo: [] for repo in repos}
                for _ in range(args.repeat):
                    for repo in repos:  # alternate, so that every checkout sees the same load
                        runs[repo].append(run_once(repo, spec, fmt, Path(tmp)))
                for repo in repos:
                    walls, cpus = [r[0] for r in runs[repo]], [r[1] for r in runs[repo]]
                    print((f"| {repo.name} " if label else "")
                          + f"| {spec.stem} | {fmt} | {statistics.median(walls):.2f} | {statistics.median(cpus):.2f} | "
                          f"{' '.join(f'{w:.2f}' for w in walls)} |", flush=True)
    print(f"# load average after: {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
