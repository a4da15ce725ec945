"""A year of the GPU ledger on a box of 8 GPUs: its size on disk and the time of a year's report.

A year of per-minute rollups is written through the store, one day per transaction, from a
simulated schedule: training runs of half a day to four days, inference services, short
quantizations and batch jobs, a few thousand attempts with retries, idle stretches between them,
and now and then someone using an idle GPU outside the queue. Then the report for the last 365
days is timed by gpu and by job (best of --runs), and so are the rest of the groupings.

With --record-day it also runs the recorder itself for one simulated day (a sample every 5 s for
each GPU): the CPU time of a `record()` call, the bytes it adds per GPU per day, and the bytes
written to the database files with a write once a minute against one on every sample.

    .venv/bin/python benchmarks/ledger_year.py                 # 365 days, 8 GPUs
    .venv/bin/python benchmarks/ledger_year.py --record-day
"""

from __future__ import annotations

import argparse
import os
import random
import sqlite3
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from gpubox.ledger.accounting import Allocation, GpuMark
from gpubox.ledger.recorder import Recorder
from gpubox.ledger.report import Prices, build_report
from gpubox.ledger.rollup import AttemptSeen, Batch, GpuSeen
from gpubox.ledger.store import LedgerStore
from gpubox.ledger.usage import GPU_BUSY, SM_ACTIVE, AttemptUsage, GpuUsage, UnqueuedUsage
from gpubox.telemetry.model import BoxSnapshot, GpuSnapshot, HostSnapshot, ProcessSnapshot

DAY = 86400
GOAL_S = 1.0
START = 1_704_067_200  # 2024-01-01 00:00 UTC
# kind: (share of jobs, shortest and longest run in minutes)
KINDS = {
    "train": (0.25, 12 * 60, 4 * 24 * 60),
    "infer": (0.15, 60, 24 * 60),
    "quantize": (0.30, 10, 60),
    "batch": (0.30, 60, 10 * 60),
}
USERS = ("alice", "bob", "carol", "dave", "erin")
TEAMS = ("vision", "speech", "llm")


@dataclass(frozen=True)
class Run:
    """One attempt on one GPU, minute by minute, with how it tends to use the GPU."""

    start: int  # minute number since START
    end: int
    allocation: Allocation
    busy: float  # 0..1
    loader_wait: float | None


def schedule(gpus: int, days: int, rng: random.Random) -> tuple[list[list[Run]], list[list[tuple[int, int, str]]]]:
    """Per GPU: the attempts it ran, and the idle stretches someone used outside the queue."""
    minutes = days * 1440
    runs: list[list[Run]] = [[] for _ in range(gpus)]
    unqueued: list[list[tuple[int, int, str]]] = [[] for _ in range(gpus)]
    job_id = 0
    for g in range(gpus):
        at = int(rng.expovariate(1 / 60))
        while at < minutes:
            kind = rng.choices(list(KINDS), weights=[k[0] for k in KINDS.values()])[0]
            _, shortest, longest = KINDS[kind]
            job_id += 1
            user, team = rng.choice(USERS), rng.choice(TEAMS)
            busy = rng.uniform(0.2, 0.95)
            wait = rng.uniform(0.0, 0.6) if rng.random() < 0.7 else None
            for attempt in (1, 2) if rng.random() < 0.1 else (1,):
                length = int(rng.uniform(shortest, longest)) // attempt
                alloc = Allocation(job_id, attempt, kind, (f"GPU-{g}",), f"{kind}-{job_id}", user, {"team": team})
                runs[g].append(Run(at, min(minutes, at + length), alloc, busy, wait))
                at += length
            idle = int(rng.expovariate(1 / 120))
            if idle > 30 and rng.random() < 0.1:
                unqueued[g].append((at + 5, at + idle - 5, rng.choice(USERS)))
            at += idle
    return runs, unqueued


def write_year(store: LedgerStore, gpus: int, days: int, seed: int) -> int:
    """Write the simulated year, one day per transaction; the number of attempts."""
    rng = random.Random(seed)
    runs, unqueued = schedule(gpus, days, rng)
    cursor = [0] * gpus
    ucursor = [0] * gpus
    energy = [0] * gpus
    for day in range(days):
        minutes: dict[tuple[str, int], GpuUsage] = {}
        hours: dict[tuple[int, int, int], AttemptUsage] = {}
        seen: dict[tuple[int, int], AttemptSeen] = {}
        others: dict[tuple[str, int, str | None], UnqueuedUsage] = {}
        for g in range(gpus):
            uuid = f"GPU-{g}"
            for m in range(day * 1440, (day + 1) * 1440):
                minute = START + m * 60
                while cursor[g] < len(runs[g]) and runs[g][cursor[g]].end <= m:
                    cursor[g] += 1
                while ucursor[g] < len(unqueued[g]) and unqueued[g][ucursor[g]][1] <= m:
                    ucursor[g] += 1
                run = runs[g][cursor[g]] if cursor[g] < len(runs[g]) and runs[g][cursor[g]].start <= m else None
                other = unqueued[g][ucursor[g]] if ucursor[g] < len(unqueued[g]) else None
                user = other[2] if other is not None and other[0] <= m else None
                busy = min(1.0, max(0.0, rng.gauss(run.busy, 0.1))) if run else (rng.uniform(0.3, 0.9) if user else 0.0)
                joules = round(60 * (80 + 600 * busy))
                energy[g] += joules * 1000
                minutes[(uuid, minute)] = GpuUsage(
                    observed_s=60.0,
                    allocated_s=60.0 if run else 0.0,
                    busy_s=60 * busy,
                    busy_known_s=60.0,
                    idle_allocated_s=60 * (1 - busy) if run else 0.0,
                    starved_s=60 * run.loader_wait if run and run.loader_wait is not None else 0.0,
                    loader_known_s=60.0 if run and run.loader_wait is not None else 0.0,
                    occupancy_s=60 * busy * rng.uniform(0.3, 0.7),
                    occupancy_known_s=60.0,
                    energy_j=joules,
                    energy_known_s=60.0,
                    pcie_tx_bytes=round(busy * rng.uniform(1e8, 2e9) * 60),
                    pcie_rx_bytes=round(busy * rng.uniform(1e9, 2e10) * 60),
                    pcie_known_s=60.0,
                    unqueued_s=60.0 if user and not run else 0.0,
                    busy_source=SM_ACTIVE,
                )
                if run:
                    a = run.allocation
                    key = (a.job_id, a.attempt, minute - minute % 3600)
                    usage = AttemptUsage(
                        allocated_s=60.0,
                        busy_s=60 * busy,
                        busy_known_s=60.0,
                        idle_allocated_s=60 * (1 - busy),
                        starved_s=60 * run.loader_wait if run.loader_wait is not None else 0.0,
                        loader_known_s=60.0 if run.loader_wait is not None else 0.0,
                        energy_j=joules,
                        energy_known_s=60.0,
                        busy_source=GPU_BUSY if g % 2 else SM_ACTIVE,
                    )
                    hours[key] = hours[key].plus(usage) if key in hours else usage
                    first = seen[a.key].first_at if a.key in seen else float(minute)
                    seen[a.key] = AttemptSeen(a, first, float(minute + 60), int(busy * 70e9))
                elif user:
                    ukey = (uuid, minute - minute % 3600, user)
                    part = UnqueuedUsage(60.0, 60 * busy, 60.0)
                    others[ukey] = others[ukey].plus(part) if ukey in others else part
        last = START + (day + 1) * DAY
        marks = {
            f"GPU-{g}": GpuSeen(f"GPU-{g}", g, "NVIDIA H100 80GB HBM3", None, False, GpuMark(last, energy[g]))
            for g in range(gpus)
        }
        store.write(Batch(minutes, hours, seen, others, (), marks, float(last), {"max_gap_s": 15.0}))
    return sum(len(r) for r in runs)


def timed(runs: int, fn: Callable[[], object]) -> tuple[float, float]:
    """Seconds of the first call and of the fastest of `runs`."""
    times = []
    for _ in range(runs):
        began = time.perf_counter()
        fn()
        times.append(time.perf_counter() - began)
    return times[0], min(times)


def table_sizes(path: Path) -> dict[str, int]:
    db = sqlite3.connect(path)
    try:
        rows = db.execute(
            "SELECT name, SUM(pgsize) FROM dbstat WHERE name IN ('gpu_minutes', 'gpu_hours', 'attempt_hours',"
            " 'attempts', 'unqueued_hours', 'gaps') GROUP BY name ORDER BY 2 DESC"
        ).fetchall()
    except sqlite3.OperationalError:
        rows = []
    finally:
        db.close()
    return {name: int(size) for name, size in rows}


def written_bytes() -> int:
    """Bytes this process has handed to write(2) so far (the WAL, checkpoints, the database)."""
    with open("/proc/self/io") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("wchar:"))


def record_day(folder: Path, gpus: int, flush_every_s: float) -> tuple[float, int, int]:
    """One day through the recorder: µs per record(), bytes on disk, bytes written."""
    store = LedgerStore(folder / f"day-{flush_every_s:g}.db")
    clock = [0.0]
    recorder = Recorder(store, interval_s=5, clock=lambda: clock[0], flush_every_s=flush_every_s)
    host = HostSnapshot(hostname="box")
    rng = random.Random(7)
    allocations = [
        Allocation(g + 1, 1, "train", (f"GPU-{g}",), "train", "alice", {"team": "llm"}) for g in range(gpus - 1)
    ]
    spent = 0.0
    wrote = written_bytes()
    energy = [0] * gpus
    for step in range(DAY // 5 + 1):
        t = START + step * 5
        clock[0] = step * 5.0
        snaps, procs = [], []
        for g in range(gpus):
            busy = rng.uniform(0, 100)
            energy[g] += int(5 * (80 + 6 * busy) * 1000)
            snaps.append(
                GpuSnapshot(
                    g,
                    f"GPU-{g}",
                    "NVIDIA H100",
                    None,
                    gpu_busy=busy,
                    sm_active=busy * 0.7,
                    sm_occupancy=busy * 0.4,
                    pcie_tx_Bps=1e8 * busy,
                    pcie_rx_Bps=1e9 * busy,
                    power_w=80 + 6 * busy,
                    energy_mj=energy[g],
                )
            )
            if g < gpus - 1:
                procs.append(ProcessSnapshot(100 + g, g, f"GPU-{g}", "compute", "alice", loader_wait=0.2, job_id=g + 1))
        snapshot = BoxSnapshot(t, "simulated", host, tuple(snaps), tuple(procs))
        began = time.perf_counter()
        recorder.record(snapshot, allocations)
        spent += time.perf_counter() - began
    recorder.close()
    wrote = written_bytes() - wrote
    store.close()
    db = sqlite3.connect(store.path)
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    db.close()
    return spent / (DAY // 5 + 1) * 1e6, os.path.getsize(store.path), wrote


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--days", type=int, default=365)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--record-day", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        path = folder / "ledger.db"
        store = LedgerStore(path)
        began = time.perf_counter()
        attempts = write_year(store, args.gpus, args.days, args.seed)
        write_s = time.perf_counter() - began
        store.rows("PRAGMA wal_checkpoint(TRUNCATE)")
        store.close()
        size = os.path.getsize(path)
        store = LedgerStore(path, create=False)  # as a report command opens it: SQLite's cache empty
        until = START + args.days * DAY
        since = until - 365 * DAY
        prices = Prices(per_gpu_hour=2.5, per_kwh=0.3)
        timings = {
            by: timed(args.runs, partial(build_report, store, since, until, by, prices=prices, now=until))
            for by in ("gpu", "job", "kind", "tag", "user")
        }
        store.close()
        per_day = args.gpus * args.days
        print(f"ledger: {args.gpus} GPUs x {args.days} days, {attempts} attempts (written in {write_s:.0f} s)\n")
        row("size on disk", f"{size / 2**20:.1f} MiB")
        row("bytes per GPU per day", f"{size / per_day:,.0f}")
        for name, table_bytes in table_sizes(path).items():
            row(f"  {name}", f"{table_bytes / per_day:,.0f}")
        for by, (first, best) in timings.items():
            verdict = "" if first < GOAL_S else f"over the {GOAL_S:g} s goal"
            row(f"report --since 365d --by {by}", f"{best * 1000:.0f} ms", f"first run {first * 1000:.0f} ms {verdict}")
        if args.record_day:
            for every in (60.0, 0.0):
                us, day_size, wrote = record_day(folder, args.gpus, every)
                row(
                    f"recorder, 1 day, write {'every minute' if every else 'every sample'}",
                    f"{us:.0f} µs",
                    "per record()",
                )
                row("  bytes per GPU per day on disk", f"{day_size / args.gpus:,.0f}")
                row("  bytes written to the files a day", f"{wrote / 2**20:,.1f} MiB")


def row(label: str, value: str, note: str = "") -> None:
    print(f"{label:<36}{value:>12}  {note}".rstrip())


if __name__ == "__main__":
    main()
