"""Where each job of a stream waits, from the kernel's scheduler events: N queued `true` jobs run by
the daemon alone (benchmarks/queue_daemon_throughput.py) under `perf sched record`, then, from
one job to the next (one CPU slot: they run one after another):

- `spawn -> exit`: the job itself (for `true`: exec, the dynamic loader, exit), from its
  supervisor's `posix_spawn` waking it to its exit waking the supervisor;
- `exit -> next spawn, handed on`: from a job's exit to the next job's spawn, where the next job
  was handed on to the same supervisor (no word with the daemon in between);
- `exit -> next spawn, by the daemon`: the same where the daemon woke a supervisor in between
  (the end told, recorded, and the next start's "go"; the first jobs of a stream, and after a
  job too long to hand on after).

Needs `perf` and the right to trace the scheduler (root, or kernel.perf_event_paranoid <= -1).

    .venv/bin/python benchmarks/queue_hops.py --jobs 300
"""

from __future__ import annotations

import argparse
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
EVENT = re.compile(r"\s*([\d.]+)\s+\[\d+\]\s+(\S+)\[(\d+)\]\s+awakened: (\S+)\[(\d+)\]")
JOB = "gpubox-job"  # a supervisor's name while it has a job (gpubox/queue/supervise.py)


def hops(timehist: str) -> dict[str, list[float]]:
    """The job and the way to the next, in ms, from `perf sched timehist -w` lines."""
    job: list[float] = []
    handed: list[float] = []
    by_daemon: list[float] = []
    spawned: float | None = None  # the last job's spawn
    exited: float | None = None  # the last job's exit
    daemon_woke = False  # the daemon woke a supervisor since that exit
    for line in timehist.splitlines():
        m = EVENT.match(line)
        if m is None:
            continue
        t, src, src_pid, dst, dst_pid = float(m[1]), m[2], int(m[3]), m[4], int(m[5])
        if src == "python" and dst.startswith(JOB):
            daemon_woke = True
        elif src.startswith(JOB) and dst.startswith(JOB) and src_pid != dst_pid:  # a supervisor wakes its vfork child
            if exited is not None:
                (by_daemon if daemon_woke else handed).append((t - exited) * 1000.0)
            spawned, exited = t, None
        elif src == "true" and dst.startswith(JOB) and spawned is not None:
            job.append((t - spawned) * 1000.0)
            spawned, exited, daemon_woke = None, t, False
    return {
        "spawn -> exit": job,
        "exit -> next spawn, handed on": handed,
        "exit -> next spawn, by the daemon": by_daemon,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=300)
    args = parser.parse_args()
    if shutil.which("perf") is None:
        print("queue_hops: needs perf (Debian: linux-perf)", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="gpubox-hops-") as tmp:
        data = Path(tmp) / "sched.data"
        bench = [sys.executable, str(HERE / "queue_daemon_throughput.py"), "--jobs", str(args.jobs)]
        run = subprocess.run(["perf", "sched", "record", "-q", "-o", str(data), "--", *bench], capture_output=True)
        if run.returncode != 0:
            print(
                f"queue_hops: perf sched record failed: {run.stderr.decode(errors='replace').strip()}", file=sys.stderr
            )
            return 1
        print(run.stdout.decode().splitlines()[0])
        hist = subprocess.run(
            ["perf", "sched", "timehist", "-w", "-i", str(data)], capture_output=True, text=True, check=True
        ).stdout
    print("| hop | jobs | p10 ms | p50 ms | p90 ms | mean ms |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, values in hops(hist).items():
        if not values:
            print(f"| {name} | 0 | | | | |")
            continue
        values.sort()
        n = len(values)
        mean = statistics.mean(values)
        print(
            f"| {name} | {n} | {values[n // 10]:.3f} | {values[n // 2]:.3f} | {values[n * 9 // 10]:.3f} | {mean:.3f} |"
        )
    print("(perf's tracing slows every hop a little)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
