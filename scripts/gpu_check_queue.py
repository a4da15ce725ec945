"""Checks `gpubox queue` on a machine with NVIDIA GPUs: jobs get their own GPU, by UUID.

Run through scripts/gpu-check.sh. Two jobs asking for one GPU each must run on different GPUs
or one after the other, and each must see exactly its own GPU in torch; a CPU-only job must see
none; `gpubox top` must show a running job's id and kind, and `queue show --json` its GPU
process's pid as job_pid. Uses a private state directory, so it
leaves the user's queue alone. Exit 0 when every check passes, 1 otherwise.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PROBE = """
import json, os, sys, time, torch
start = time.time()
info = {"visible": os.environ.get("CUDA_VISIBLE_DEVICES"), "order": os.environ.get("CUDA_DEVICE_ORDER"),
        "count": torch.cuda.device_count(), "uuids": []}
for i in range(info["count"]):
    info["uuids"].append(str(torch.cuda.get_device_properties(i).uuid))
if info["count"]:
    x = torch.randn(4096, 4096, device="cuda")
    end = time.time() + float(sys.argv[2])
    while time.time() < end:
        x @ x
    torch.cuda.synchronize()
info["start"], info["end"] = start, time.time()
open(sys.argv[1], "w").write(json.dumps(info))
"""


def _norm(uuid: str) -> str:
    return uuid.lower().removeprefix("gpu-")


def main() -> int:
    failures: list[str] = []
    home = Path(tempfile.mkdtemp(prefix="gpubox-gpu-check-queue-"))
    env = {**os.environ, "GPUBOX_STATE_DIR": str(home / "state"), "GPUBOX_RUNTIME_DIR": str(home / "run")}
    script = home / "probe.py"
    script.write_text(PROBE)

    def gpubox(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "gpubox", *args], env=env, capture_output=True, text=True, timeout=300
        )

    def add(*args: str) -> int:
        out = gpubox("queue", "add", *args)
        if out.returncode != 0:
            raise SystemExit(f"queue add failed ({out.returncode}): {out.stderr.strip()}")
        return int(out.stdout)

    try:
        a = add("--gpus", "1", "--kind", "train", "--", sys.executable, str(script), str(home / "a.json"), "6")
        b = add("--gpus", "1", "--kind", "infer", "--", sys.executable, str(script), str(home / "b.json"), "6")
        c = add("--gpus", "0", "--", sys.executable, str(script), str(home / "c.json"), "0")
        # While a GPU job runs, `gpubox top` names it in the process table.
        seen_job = pid_named = False
        deadline = time.time() + 60
        while time.time() < deadline and not seen_job:
            top = subprocess.run(
                [sys.executable, "-m", "gpubox", "top", "--once", "--json"],
                env=env,
                capture_output=True,
                text=True,
                timeout=60,
            )
            if top.returncode == 0:
                procs = json.loads(top.stdout)["data"]["processes"]
                ours = [p for p in procs if p.get("job_id") in (a, b) and p.get("job_kind") in ("train", "infer")]
                seen_job = bool(ours)
                for proc in ours:  # the job's own process, as `queue show --json` names it
                    shown = json.loads(gpubox("queue", "show", str(proc["job_id"]), "--json").stdout)
                    job_pid = shown["data"]["job"]["job_pid"]
                    print(f"job {proc['job_id']}: NVML pid {proc['pid']}, queue show job_pid {job_pid}")
                    if job_pid == proc["pid"]:
                        pid_named = True
                    elif job_pid is not None:  # None: it ended meanwhile
                        failures.append(f"job {proc['job_id']}: job_pid {job_pid} is not the GPU process {proc['pid']}")
            time.sleep(0.5)
        print(f"top shows a queue job's id and kind: {seen_job}")
        if not seen_job:
            failures.append("gpubox top never showed job_id/job_kind for a running queue job")
        elif not pid_named:
            failures.append("queue show --json never named a running job's GPU process as its job_pid")
        waited = gpubox("queue", "wait", str(a), str(b), str(c), "--timeout", "4m")
        print(f"queue wait: exit {waited.returncode}: {waited.stdout.strip()} {waited.stderr.strip()}")
        if waited.returncode != 0:
            failures.append(f"queue wait exited {waited.returncode}")
            print(gpubox("queue", "ls", "--all").stdout)
        infos = {
            n: json.loads((home / f"{n}.json").read_text()) for n in ("a", "b", "c") if (home / f"{n}.json").exists()
        }
        shown = json.loads(gpubox("queue", "ls", "--all", "--json").stdout)["data"]["jobs"]
        held = {j["id"]: j["gpu_uuids"] for j in shown}
        for name, job in (("a", a), ("b", b)):
            info = infos.get(name)
            print(f"job {job}: {info}; held {held.get(job)}")
            if info is None:
                failures.append(f"job {job} left no report")
                continue
            if info["count"] != 1:
                failures.append(f"job {job} saw {info['count']} GPUs in torch, not 1")
            if info["order"] != "PCI_BUS_ID":
                failures.append(f"job {job}: CUDA_DEVICE_ORDER={info['order']}")
            if len(held.get(job, [])) != 1 or info["visible"] != held[job][0]:
                failures.append(f"job {job}: CUDA_VISIBLE_DEVICES={info['visible']} but the queue gave {held.get(job)}")
            elif info["uuids"] and _norm(info["uuids"][0]) != _norm(held[job][0]):
                failures.append(f"job {job}: torch's GPU {info['uuids'][0]} is not the one given, {held[job][0]}")
        if "a" in infos and "b" in infos:
            same_gpu = held.get(a) == held.get(b)
            overlap = infos["a"]["start"] < infos["b"]["end"] and infos["b"]["start"] < infos["a"]["end"]
            print(f"same GPU: {same_gpu}; ran at the same time: {overlap}")
            if same_gpu and overlap:
                failures.append("two 1-GPU jobs ran on the same GPU at the same time")
        info_c = infos.get("c")
        print(f"cpu-only job {c}: {info_c}")
        if info_c is None or info_c["count"] != 0 or info_c["visible"] != "":
            failures.append(f"the CPU-only job saw GPUs: {info_c}")
    finally:
        gpubox("daemon", "stop")
    for failure in failures:
        print(f"FAIL: {failure}")
    print("queue checks:", "ok" if not failures else f"{len(failures)} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
