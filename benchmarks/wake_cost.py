"""What one small piece of work costs in CPU after the process slept a while: a `stat`, SQLite's
`PRAGMA data_version` and a small query, and a walk over some Python objects (about what an
idle gpubox daemon does when it wakes). On a machine that gives a sleeping process's memory and
caches to others, the same work can cost many times more after a long sleep, and an idle
daemon's CPU figure (benchmarks/queue_vs_peers.sh) moves with it, whatever the daemon does.

    .venv/bin/python benchmarks/wake_cost.py            # sleeps of 0 to 2 s
    .venv/bin/python benchmarks/wake_cost.py 0.01 2 10  # sleeps of your choice, in seconds
"""

from __future__ import annotations

import os
import sqlite3
import statistics
import sys
import tempfile
import time


def main() -> int:
    try:
        gaps = [float(a) for a in sys.argv[1:]] or [0.0, 0.001, 0.01, 0.1, 0.5, 2.0]
    except ValueError:
        print("wake_cost: give sleeps in seconds, such as 0.01 2", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="gpubox-wake-") as folder:
        path = os.path.join(folder, "work.db")
        db = sqlite3.connect(path)
        db.execute("CREATE TABLE t (a INTEGER, b TEXT)")
        db.executemany("INSERT INTO t VALUES (?, ?)", [(i, "x" * 200) for i in range(2000)])
        db.commit()
        objects = [str(i) * 10 for i in range(200_000)]

        def work() -> int:
            os.stat(path)
            db.execute("PRAGMA data_version").fetchone()
            rows = db.execute("SELECT * FROM t WHERE a < 20").fetchall()
            return len(rows) + sum(len(x) for x in objects[::500])

        print("| asleep before | runs | CPU of the work, median | p90 |")
        print("|---:|---:|---:|---:|")
        for gap in gaps:
            runs = max(5, min(200, int(1 / (gap + 0.005))))
            cpu = []
            for _ in range(runs):
                if gap:
                    time.sleep(gap)
                start = time.thread_time()
                work()
                cpu.append(1e6 * (time.thread_time() - start))
            cpu.sort()
            p90 = cpu[min(len(cpu) - 1, int(0.9 * len(cpu)))]
            print(f"| {gap * 1000:g} ms | {runs} | {statistics.median(cpu):,.0f} µs | {p90:,.0f} µs |")
        db.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
