"""How fast each queue drains a backlog: N jobs queued behind a running one, timed from that
job's end to the end of the last, for gpubox, task-spooler and nq, interleaved in rounds.

benchmarks/queue_vs_peers.py times a stream (the first submission to the last end), where
task-spooler and nq start each job as it is submitted; here every job waits in the queue first,
which is what a queue is for. The first job holds the queue until every other job is submitted,
then writes the time and ends; N-2 jobs run `true`; the last writes the time. Both times come
from the same clock (`date +%s.%N`), so a tool's own wait adds nothing. Each tool submits as in
queue_vs_peers.py (gpubox one `queue add --file`, task-spooler and nq one call a job), one slot.

task-spooler keeps a client process and a connection for every queued job, and its server
stops taking connections near 1,000 (on 2026-11-30 a backlog stalled at 995 jobs, every
submission after that waiting for ever): hence at most TSP_MOST jobs here.

    .venv/bin/python benchmarks/queue_backlog.py --jobs 900 --rounds 3
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import queue_vs_peers as peers  # the same environments and commands

TSP_MOST = 900


def _marks(home: Path) -> tuple[str, str, Path]:
    """The first job (held until GO exists, then writes its end), the last one, and GO."""
    go = home / "GO"
    first = f"until [ -e {go} ]; do sleep 0.01; done; date +%s.%N > {home / 'start'}"
    last = f"date +%s.%N > {home / 'end'}"
    return first, last, go


def _elapsed(home: Path) -> float:
    return float((home / "end").read_text()) - float((home / "start").read_text())


def gpubox_backlog(n: int, home: Path) -> float:
    env = peers._env(home)
    first, last, go = _marks(home)
    peers._run([*peers.GPUBOX, "queue", "add", "--gpus", "0", "--no-probe", "--shell", "--", first], env)
    jobs = home / "jobs.txt"
    jobs.write_text("true\n" * (n - 2))
    peers._run([*peers.GPUBOX, "queue", "add", "--gpus", "0", "--no-probe", "--file", str(jobs)], env)
    out = peers._run([*peers.GPUBOX, "queue", "add", "--gpus", "0", "--no-probe", "--shell", "--", last], env)
    go.touch()
    peers._run([*peers.GPUBOX, "queue", "wait", out.stdout.strip()], env)
    return _elapsed(home)


def tsp_backlog(n: int, home: Path) -> float:
    env = peers._env(home)
    first, last, go = _marks(home)
    quiet = {"env": env, "check": True, "stdout": subprocess.DEVNULL}
    subprocess.run(["tsp", "sh", "-c", first], **quiet)  # type: ignore[call-overload]
    for _ in range(n - 2):
        subprocess.run(["tsp", "true"], **quiet)  # type: ignore[call-overload]
    subprocess.run(["tsp", "sh", "-c", last], **quiet)  # type: ignore[call-overload]
    go.touch()
    subprocess.run(["tsp", "-w"], env=env, check=False, stdout=subprocess.DEVNULL)
    subprocess.run(["tsp", "-K"], env=env, check=False, capture_output=True)
    return _elapsed(home)


def nq_backlog(n: int, home: Path) -> float:
    env = peers._env(home)
    first, last, go = _marks(home)
    quiet = {"env": env, "check": True, "stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
    subprocess.run(["nq", "sh", "-c", first], **quiet)  # type: ignore[call-overload]
    for _ in range(n - 2):
        subprocess.run(["nq", "true"], **quiet)  # type: ignore[call-overload]
    subprocess.run(["nq", "sh", "-c", last], **quiet)  # type: ignore[call-overload]
    go.touch()
    subprocess.run(["nq", "-w"], **quiet)  # type: ignore[call-overload]
    return _elapsed(home)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=TSP_MOST)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--no-nq", action="store_true", help="leave nq out (it takes the longest)")
    args = parser.parse_args()
    if args.jobs > TSP_MOST:
        print(f"queue_backlog: at most {TSP_MOST} jobs (task-spooler cannot queue many more)")
        return 2
    tools = [("gpubox", gpubox_backlog), ("task-spooler", tsp_backlog)]
    if not args.no_nq:
        tools.append(("nq", nq_backlog))
    missing = [cmd for cmd in ("tsp", "nq") if shutil.which(cmd) is None and (cmd == "tsp" or not args.no_nq)]
    if missing:
        print(f"queue_backlog: needs {' and '.join(missing)} (benchmarks/queue_vs_peers.sh installs them)")
        return 2
    root = Path(tempfile.mkdtemp(prefix="gpubox-backlog-"))
    results: dict[str, list[float]] = {name: [] for name, _ in tools}
    try:
        for r in range(args.rounds):
            for name, fn in tools:
                home = root / f"{name}-{r}"
                try:
                    results[name].append(fn(args.jobs, home))
                finally:
                    if name == "gpubox":
                        peers._stop(home)
                time.sleep(0.5)  # the last tool's processes leave
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(f"{args.jobs} jobs queued behind a running one, its end to the last end (median of {args.rounds}):")
    print("| tool | median s | min s | max s | jobs/s |")
    print("|---|---:|---:|---:|---:|")
    for name, times in results.items():
        med = statistics.median(times)
        print(f"| {name} | {med:.2f} | {min(times):.2f} | {max(times):.2f} | {(args.jobs - 1) / med:.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
