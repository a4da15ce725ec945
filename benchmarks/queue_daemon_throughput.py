"""How fast the queue daemon alone runs short jobs: N `true` jobs, queued before it starts.

The daemon runs in this process (no client, no autostart), with no GPUs, one CPU slot; the
clock stops when the database says no job is queued or running. It prints the time from the
first job's start to the last one's end (from the database), the daemon's own CPU and that of
its children (the spawner, the supervisors and the jobs), and their page faults.

    .venv/bin/python benchmarks/queue_daemon_throughput.py --jobs 1000
"""

from __future__ import annotations

import argparse
import os
import resource
import signal
import sqlite3
import sys
import tempfile
import threading
import time
from pathlib import Path

from gpubox.paths import resolve_paths
from gpubox.queue.daemon import Daemon
from gpubox.queue.schedule import QueueConfig
from gpubox.queue.store import JobSpec, JobStore


class NoGpus:
    def read(self) -> list[object]:
        return []

    def close(self) -> None:
        pass


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--jobs", type=int, default=1000)
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="gpubox-daemon-bench-"))
    paths = resolve_paths(
        {"HOME": str(base), "GPUBOX_STATE_DIR": str(base / "state"), "GPUBOX_RUNTIME_DIR": str(base / "run")}
    )
    with JobStore(paths.state_dir / "queue.db") as store:
        spec = JobSpec(argv=("true",), cwd="/tmp", env=dict(os.environ), gpus=0, probe=False)
        store.add_many([spec] * args.jobs)
    daemon = Daemon(paths, QueueConfig(poll_interval_s=2.0), gpu_source=NoGpus(), log=lambda line: None)
    t0 = time.monotonic()
    took: list[float] = []

    def watch() -> None:
        db = sqlite3.connect(paths.state_dir / "queue.db")
        while db.execute("SELECT count(*) FROM jobs WHERE state IN ('queued', 'running')").fetchone()[0]:
            time.sleep(0.05)
        took.append(time.monotonic() - t0)
        os.kill(os.getpid(), signal.SIGTERM)  # the daemon's own way to stop

    threading.Thread(target=watch, daemon=True).start()
    daemon.run()
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    # From the jobs' own records: the watch above looks every 50 ms, too coarse a clock for this.
    with sqlite3.connect(paths.state_dir / "queue.db") as db:
        first, last = db.execute("SELECT min(started_at), max(ended_at) FROM jobs").fetchone()
    span = last - first
    print(f"{args.jobs} jobs, first start to last end {span:.3f} s ({1000 * span / args.jobs:.3f} ms a job)")
    print(f"from the daemon's start to the end seen {took[0]:.2f} s")
    others = kids.ru_utime + kids.ru_stime
    print(f"daemon CPU {me.ru_utime + me.ru_stime:.2f} s; spawner, supervisors and jobs {others:.2f} s")
    print(f"page faults: daemon {me.ru_minflt}, the rest {kids.ru_minflt}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
