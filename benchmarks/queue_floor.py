"""The floor under any queue that keeps a durable record and logs: one Python process, no
daemon, no supervisor, doing per job only what the record needs. For each of N `true` jobs:
a commit that starts it, two log files, `posix_spawn`, `waitpid`, an exit record, a commit that
ends it (SQLite in WAL mode, synchronous=NORMAL). gpubox's queue cannot run jobs faster than
this one after another; compare with benchmarks/queue_vs_peers.sh.

    .venv/bin/python benchmarks/queue_floor.py --jobs 1000
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import sys
import tempfile
import time


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--jobs", type=int, default=1000)
    n = parser.parse_args().jobs
    folder = tempfile.mkdtemp(prefix="gpubox-floor-")
    db = sqlite3.connect(os.path.join(folder, "q.db"), isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=NORMAL")
    db.execute("CREATE TABLE jobs (id INTEGER PRIMARY KEY, state TEXT, exit_code INTEGER)")
    db.executemany("INSERT INTO jobs (state) VALUES ('queued')", [()] * n)
    env = dict(os.environ)
    flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC
    t0 = time.perf_counter()
    for i in range(1, n + 1):
        db.execute("BEGIN IMMEDIATE")
        db.execute("UPDATE jobs SET state = 'running' WHERE id = ?", (i,))
        db.execute("COMMIT")
        out = os.open(os.path.join(folder, f"{i}.out"), flags, 0o600)
        err = os.open(os.path.join(folder, f"{i}.err"), flags, 0o600)
        actions = [(os.POSIX_SPAWN_DUP2, out, 1), (os.POSIX_SPAWN_DUP2, err, 2)]
        pid = os.posix_spawnp("true", ["true"], env, file_actions=actions, setpgroup=0)
        _, status = os.waitpid(pid, 0)
        os.close(out)
        os.close(err)
        record = os.open(os.path.join(folder, f"{i}.exit"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.write(record, json.dumps({"exit_code": os.waitstatus_to_exitcode(status)}).encode())
        os.close(record)
        db.execute("BEGIN IMMEDIATE")
        db.execute("UPDATE jobs SET state = 'succeeded', exit_code = 0 WHERE id = ?", (i,))
        db.execute("COMMIT")
    took = time.perf_counter() - t0
    print(f"{n} jobs in {took:.2f} s ({1000 * took / n:.2f} ms a job)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
