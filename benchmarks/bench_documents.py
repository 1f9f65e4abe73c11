"""How long `symattn derive SPEC -o FILE` takes for each spec in derivations/, cold and warm.

    python benchmarks/bench_documents.py [--formats md html] [--repeat 3] [--repo DIR ...] [SPEC ...]

Each run is the command a user types, in a fresh interpreter (imports, parsing,
the derivation, every element-level check, figures and rendering included),
writing the document into a temporary directory. "cold" runs start with an
empty cache directory (SYMATTN_CACHE_DIR, symattn.cache), as a newcomer's
first run does; "warm" runs find the document the previous run stored (one
untimed run fills it). A checkout without symattn/cache.py has no cache and
gets cold runs only. Prints one row per spec and format: for each checkout and
kind of run, the median wall-clock seconds and the median CPU seconds of the
child process (CPU time is steadier on a busy machine), and the load average
before and after. The goal (issue 15) is under 2 s per spec. The runs of each
spec alternate between checkouts and kinds (say, an unpacked `git archive` of
an older commit and this one), so that all see the same load.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def run_once(repo: Path, spec: Path, fmt: str, out_dir: Path, cache_dir: Path) -> tuple[float, float]:
    """(wall seconds, CPU seconds) of one `symattn derive` of `repo`'s code in a fresh interpreter."""
    env = dict(os.environ, PYTHONPATH=str(repo) + os.pathsep + os.environ.get("PYTHONPATH", ""),
               SYMATTN_CACHE_DIR=str(cache_dir))
    env.pop("SYMATTN_NO_CACHE", None)
    target = out_dir / f"{spec.stem}.{fmt}"
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "symattn", "derive", str(spec), "-o", str(target), "--format", fmt],
                   check=True, env=env, cwd=repo, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def load() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("specs", nargs="*", type=Path, help="specs (default: every derivations/*.attn)")
    parser.add_argument("--formats", nargs="+", default=["md"], choices=["md", "html", "tex"])
    parser.add_argument("--repeat", type=int, default=3, help="runs per spec, format and kind (median reported)")
    parser.add_argument("--repo", action="append", type=Path,
                        help="a checkout whose symattn to time (repeatable; default: this one)")
    args = parser.parse_args(argv)
    repos = [r.resolve() for r in args.repo] if args.repo else [REPO]
    specs = [s.resolve() for s in args.specs] or sorted((REPO / "derivations").glob("*.attn"))
    kinds = [(repo, kind) for repo in repos
             for kind in (("cold", "warm") if (repo / "symattn" / "cache.py").is_file() else ("cold",))]
    names = [f"{repo.name} {kind}" if len(repos) > 1 else kind for repo, kind in kinds]
    print(f"# {time.strftime('%a %b %d %H:%M:%S UTC %Y', time.gmtime())}, {os.cpu_count()} cores, "
          f"load average {load()}, Python {sys.version.split()[0]}")
    print("# command: symattn derive SPEC -o FILE --format FORMAT, a fresh interpreter per run; "
          f"median of {args.repeat} runs, wall / CPU seconds")
    print("| spec | format | " + " | ".join(f"{n} wall | {n} CPU" for n in names) + " |")
    print("| --- | --- | " + " | ".join("---: | ---:" for _ in names) + " |")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        for spec in specs:
            for fmt in args.formats:
                runs: dict[int, list] = {k: [] for k in range(len(kinds))}
                warm_dirs = {k: work / f"warm{k}" for k, (_, kind) in enumerate(kinds) if kind == "warm"}
                for k, directory in warm_dirs.items():  # fill the cache: the run a warm run follows
                    run_once(kinds[k][0], spec, fmt, work, directory)
                for attempt in range(args.repeat):
                    for k, (repo, kind) in enumerate(kinds):  # alternate, so that every kind sees the same load
                        directory = warm_dirs[k] if kind == "warm" else work / f"cold{k}-{attempt}"
                        runs[k].append(run_once(repo, spec, fmt, work, directory))
                cells = []
                for k in range(len(kinds)):
                    cells += [f"{statistics.median(r[0] for r in runs[k]):.2f}",
                              f"{statistics.median(r[1] for r in runs[k]):.2f}"]
                print(f"| {spec.stem} | {fmt} | " + " | ".join(cells) + " |", flush=True)
                for directory in list(warm_dirs.values()) + list(work.glob("cold*")):
                    shutil.rmtree(directory, ignore_errors=True)
    print(f"# load average after: {load()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
