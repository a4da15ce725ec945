"""Checks the GPU-hours ledger, `gpubox report` and `gpubox metrics` on a machine with an NVIDIA GPU.

Run through scripts/gpu-check.sh. A private queue (its own state directory, ledger.interval 1 s)
runs one job that keeps a GPU busy with matmuls for 15 s. Then `gpubox report --json --by job`
must give that attempt about as much allocated time as it ran, mostly busy, with energy from the
GPU's energy counter (not estimated); `gpubox queue show` must have its usage; and
`gpubox metrics dump` must export the GPU's energy counter and the ledger's allocated seconds.
Exit 0 when every check passes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BUSY = """
import sys, time, torch
x = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
end = time.time() + float(sys.argv[1])
while time.time() < end:
    x @ x
torch.cuda.synchronize()
"""
SECONDS = 15


def main() -> int:
    failures: list[str] = []
    home = Path(tempfile.mkdtemp(prefix="gpubox-gpu-check-ledger-"))
    env = {
        **os.environ,
        "GPUBOX_STATE_DIR": str(home / "state"),
        "GPUBOX_RUNTIME_DIR": str(home / "run"),
        "GPUBOX_LEDGER_INTERVAL": "1",
    }
    script = home / "busy.py"
    script.write_text(BUSY)

    def gpubox(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "gpubox", *args], env=env, capture_output=True, text=True, timeout=300
        )

    def expect(ok: bool, what: str) -> None:
        print(("ok   " if ok else "FAIL ") + what)
        if not ok:
            failures.append(what)

    try:
        busy = [sys.executable, str(script), str(SECONDS)]
        added = gpubox("queue", "add", "--gpus", "1", "--kind", "train", "--", *busy)
        job = int(added.stdout)
        waited = gpubox("queue", "wait", str(job), "--timeout", "3m")
        expect(waited.returncode == 0, f"the busy job ran ({waited.returncode}: {waited.stderr.strip()})")
        record = json.loads(gpubox("queue", "show", str(job), "--json").stdout)["data"]
        ran_s = record["ended_at"] - record["started_at"]
    finally:
        gpubox("daemon", "stop")
    deadline = time.time() + 30
    while (home / "run").exists() and any((home / "run").glob("queue-*.sock")) and time.time() < deadline:
        time.sleep(0.2)  # the daemon writes what its ledger holds as it stops

    doc = json.loads(gpubox("report", "--json", "--by", "job", "--since", "1h").stdout)
    rows = [r for r in (doc["data"] or {}).get("rows", []) if r["job_id"] == job]
    expect(len(rows) == 1, f"the report has the job ({doc['errors']})")
    if rows:
        row = rows[0]
        allocated_s = row["allocated_gpu_hours"] * 3600
        busy = (row["busy_gpu_hours"] or 0) / row["allocated_gpu_hours"] if row["allocated_gpu_hours"] else 0
        print(f"  ran {ran_s:.1f} s; allocated {allocated_s:.1f} s, busy {busy:.0%} ({row['busy_source']}),")
        print(f"  energy {row['energy_kwh']} kWh (estimated {row['energy_estimated_kwh']})")
        expect(abs(allocated_s - ran_s) <= 3, "allocated time within 3 s of the job's run time")
        expect(busy > 0.5, "the matmul job was busy more than half the time it held the GPU")
        expect((row["energy_kwh"] or 0) > 0 and not row["energy_estimated_kwh"], "energy from the counter")
    shown = json.loads(gpubox("queue", "show", str(job), "--json").stdout)["data"]
    expect(shown.get("usage") is not None, f"queue show has the job's usage ({shown.get('usage')})")
    dump = gpubox("metrics", "dump")
    expect("gpubox_gpu_energy_joules_total{" in dump.stdout, "metrics dump exports the energy counter")
    expect("gpubox_gpu_allocated_seconds_total{" in dump.stdout, "metrics dump exports the ledger's counters")
    print("ledger checks:", "ok" if not failures else f"{len(failures)} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
