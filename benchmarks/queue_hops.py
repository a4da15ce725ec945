"""Where each job of a stream waits, from the kernel's scheduler events: N queued `true` jobs run by
the daemon alone (benchmarks/queue_daemon_throughput.py) under `perf sched record`, then, for
each job, the four hops of the chain that starts one job after another:

- `go -> spawn`: from the daemon waking the supervisor with "go" to that supervisor starting
  the job (its `posix_spawn` wakes the child);
- `spawn -> exit`: the job itself (for `true`: exec, the dynamic loader, exit);
- `exit -> done`: from the job's exit to its supervisor waking the daemon with the end;
- `done -> next go`: the daemon records the end and the next start, then says "go".

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
    """The four hops of each job, in ms, from `perf sched timehist -w` lines."""
    go: dict[int, float] = {}
    spawn: dict[int, float] = {}
    exited: dict[int, float] = {}
    done: dict[int, float] = {}
    for line in timehist.splitlines():
        m = EVENT.match(line)
        if m is None:
            continue
        t, src, src_pid, dst, dst_pid = float(m[1]), m[2], int(m[3]), m[4], int(m[5])
        if src == "python" and dst.startswith(JOB):
            go.setdefault(int(dst[len(JOB) :]), t)  # the first wake-up by the daemon: "go"
        elif src.startswith(JOB) and dst.startswith(JOB) and src_pid != dst_pid:
            spawn.setdefault(int(src[len(JOB) :]), t)  # the supervisor wakes its vfork child
        elif src == "true" and dst.startswith(JOB):
            exited[int(dst[len(JOB) :])] = t
        elif src.startswith(JOB) and dst == "python":
            done[int(src[len(JOB) :])] = t

    def between(start: dict[int, float], end: dict[int, float], step: int = 0) -> list[float]:
        # A "go" that came while its supervisor was still awake (preparing) wakes nobody: then the
        # first wake-up seen is a later one, and that job's hop is left out (it would be negative).
        gaps = ((end[j + step] - start[j]) * 1000.0 for j in start if j + step in end)
        return [g for g in gaps if g >= 0]

    return {
        "go -> spawn": between(go, spawn),
        "spawn -> exit": between(spawn, exited),
        "exit -> done": between(exited, done),
        "done -> next go": between(done, go, 1),
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
    total = 0.0
    for name, values in hops(hist).items():
        if not values:
            print(f"| {name} | 0 | | | | |")
            continue
        values.sort()
        n = len(values)
        mean = statistics.mean(values)
        total += mean
        print(
            f"| {name} | {n} | {values[n // 10]:.3f} | {values[n // 2]:.3f} | {values[n * 9 // 10]:.3f} | {mean:.3f} |"
        )
    print(f"sum of the means: {total:.3f} ms a job (perf's tracing slows every hop a little)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
