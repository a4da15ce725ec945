"""Where the time of a stream of short jobs goes: N `true` jobs added in one `queue add --file`
to a cold queue (the add starts the daemon), then `queue wait` on the last, as
benchmarks/queue_vs_peers.py times gpubox. From the clock of the client and the rows of the
database, for each run:

- `stored`: when the jobs were committed, from the first command's start;
- `first start`: when the first job's start was recorded (the daemon and its spawner had to start);
- `to the second`: from the first job's recorded start to the second's (ms);
- `cycle`: from one job's recorded start to the next (percentiles over the run), and the
  cycles after the second start that took over 1.5 ms: how many, and their sum (stalls);
- `daemon`: from a job's end (the supervisor's clock) to the next start recorded by the daemon;
- `job`: from a job's recorded start to its end, which holds its supervisor's wake-up and
  `posix_spawn`, `true` itself, and the reaping;
- `wait lag`: from the last end to `queue wait` returning.

    .venv/bin/python benchmarks/queue_timeline.py --rounds 3
    .venv/bin/python benchmarks/queue_timeline.py --rounds 3 --baseline DIR   # also the gpubox in DIR

`--baseline DIR` runs, alternating with this gpubox, the one in DIR (a `git archive` of another
commit, first on PYTHONPATH).
"""

from __future__ import annotations

import argparse
import itertools
import os
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import queue_vs_peers as peers  # the same environment and commands

LONG_MS = 1.5  # a cycle this long is a stall: the median is under 1 ms on 2 CPUs


def one_run(n: int, home: Path, pythonpath: str | None) -> dict[str, object]:
    env = peers._env(home)
    if pythonpath is not None:
        env["PYTHONPATH"] = pythonpath
    jobs = home / "jobs.txt"
    jobs.write_text("true\n" * n)
    wall0, t0 = time.time(), time.perf_counter()
    ids = peers._run([*peers.GPUBOX, "queue", "add", "--gpus", "0", "--no-probe", "--file", str(jobs)], env).stdout
    peers._run([*peers.GPUBOX, "queue", "wait", ids.split()[-1]], env)
    total = time.perf_counter() - t0
    with sqlite3.connect(home / "state" / "queue.db") as db:
        rows = db.execute("SELECT submitted_at, started_at, ended_at FROM jobs ORDER BY started_at").fetchall()
    peers._stop(home, pythonpath)
    starts = [r[1] for r in rows]
    in_order = [1000 * (b - a) for a, b in itertools.pairwise(starts)]
    cycles = sorted(in_order)
    long = [c for c in in_order[1:] if c > LONG_MS]
    daemon = [1000 * (b[1] - a[2]) for a, b in itertools.pairwise(rows)]
    job = [1000 * (r[2] - r[1]) for r in rows]
    return {
        "total": total,
        "stored": rows[0][0] - wall0,
        "first": starts[0] - wall0,
        "cycles": cycles,
        "second": in_order[0],
        "long": (len(long), sum(long)),
        "daemon": statistics.median(daemon),
        "job": statistics.median(job),
        "lag": total - (max(r[2] for r in rows) - wall0),
    }


def show(name: str, r: dict[str, object]) -> str:
    cycles = r["cycles"]
    assert isinstance(cycles, list)

    def pct(p: float) -> float:
        return float(cycles[int(p * (len(cycles) - 1))])

    long = r["long"]
    assert isinstance(long, tuple)
    return (
        f"| {name} | {r['total']:.2f} | {r['stored']:.3f} | {r['first']:.3f} | {r['second']:.1f} | {pct(0.1):.2f} | "
        f"{pct(0.5):.2f} | {pct(0.9):.2f} | {statistics.mean(cycles):.2f} | {long[0]} / {long[1]:.0f} | "
        f"{r['daemon']:.2f} | {r['job']:.2f} | {r['lag']:.3f} |"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--baseline", type=Path, help="also run the gpubox in this directory, alternating")
    args = parser.parse_args()
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)  # an installed gpubox has its .pyc files
    root = Path(tempfile.mkdtemp(prefix="gpubox-timeline-"))
    kinds: list[tuple[str, str | None]] = [("gpubox", None)]
    if args.baseline is not None:
        kinds.append(("baseline", str(args.baseline.resolve())))
    print(f"{args.jobs} `true` jobs, one `queue add --file` to a cold queue, then `queue wait` (seconds; cycles ms)")
    head = "| run | total s | stored s | first start s | to the second | cycle p10 | p50 | p90 | mean"
    print(head + f" | over {LONG_MS} ms (count / sum) | daemon p50 | job p50 | wait lag s |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in range(args.rounds):
        for name, pythonpath in kinds:
            print(show(name, one_run(args.jobs, root / f"{name}-{r}", pythonpath)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
