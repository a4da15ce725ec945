"""CPU of the live view in a real terminal: `gpubox top` against `nvitop -m full`, same box.

Each tool runs in its own tmux session (200x60) on the same fake NVML scenario (8 Hopper GPUs,
N processes whose pids are real sleeping processes), at a 1 s refresh. After a warm-up, the CPU
time of the tool's process tree is read from /proc over the measuring window. Needs tmux,
`pip install nvitop` and a C compiler.

    python benchmarks/live_cpu.py --processes 40 300 --seconds 30
    python benchmarks/live_cpu.py --processes 40 300 --seconds 30 --python   # with py-spy sampling
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def tree_cpu_seconds(pid: int) -> float:
    total = 0.0
    try:
        root = psutil.Process(pid)
        for proc in [root, *root.children(recursive=True)]:
            with proc.oneshot():
                t = proc.cpu_times()
                # children_*: children that already exited and were reaped (e.g. py-spy runs)
                total += t.user + t.system + t.children_user + t.children_system
    except psutil.Error:
        pass
    return total


def measure(command: list[str], env: dict[str, str], warmup: float, seconds: float) -> float:
    """Percent of one core used by `command` in a tmux pane over `seconds`."""
    session = f"gpubox-bench-{os.getpid()}"
    line = " ".join(shlex.quote(c) for c in command)
    exports = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
    subprocess.run(
        ["tmux", "new-session", "-d", "-s", session, "-x", "200", "-y", "60", f"env {exports} {line}"],
        check=True,
    )
    try:
        pane_pid = int(
            subprocess.run(
                ["tmux", "list-panes", "-t", session, "-F", "#{pane_pid}"], capture_output=True, text=True, check=True
            ).stdout.split()[0]
        )
        time.sleep(warmup)
        c0, t0 = tree_cpu_seconds(pane_pid), time.monotonic()
        time.sleep(seconds)
        c1, t1 = tree_cpu_seconds(pane_pid), time.monotonic()
        screen = subprocess.run(["tmux", "capture-pane", "-p", "-t", session], capture_output=True, text=True).stdout
        if "Traceback" in screen:
            raise SystemExit(f"{command[0]} crashed:\n{screen}")
        return 100.0 * (c1 - c0) / (t1 - t0)
    finally:
        subprocess.run(["tmux", "kill-session", "-t", session], capture_output=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--processes", type=int, nargs="+", default=[40, 300])
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--warmup", type=float, default=5.0)
    ap.add_argument(
        "--python",
        action="store_true",
        help="the GPU processes are Python interpreters (so gpubox also samples their stacks with py-spy)",
    )
    args = ap.parse_args()
    if not shutil.which("tmux"):
        raise SystemExit("tmux is needed: apt-get install tmux")
    from tests.fake_nvml.build import build_fake_nvml
    from tests.fake_nvml.scenarios import hopper8, with_pids

    libdir = build_fake_nvml("full")
    bindir = Path(sys.executable).parent
    tools = {
        "gpubox top --interval 1": [str(bindir / "gpubox"), "top", "--interval", "1"],
        "nvitop -m full --interval 1": [str(bindir / "nvitop"), "-m", "full", "--interval", "1"],
    }
    rows = []
    for n in args.processes:
        naptime = str(int(args.seconds * 4 + 120))
        argv = [sys.executable, "-c", f"import time; time.sleep({naptime})"] if args.python else ["sleep", naptime]
        sleepers = [subprocess.Popen(argv) for _ in range(n)]
        try:
            with tempfile.TemporaryDirectory() as tmp:
                scenario = with_pids(hopper8(processes=n), [p.pid for p in sleepers]).write(Path(tmp) / "s.txt")
                env = {
                    "LD_LIBRARY_PATH": str(libdir),
                    "FAKE_NVML_SCENARIO": str(scenario),
                    "TERM": "xterm-256color",
                    "HOME": os.environ.get("HOME", "/root"),
                    "PATH": os.environ.get("PATH", ""),
                }
                for label, cmd in tools.items():
                    rows.append((n, label, measure(cmd, env, args.warmup, args.seconds)))
        finally:
            for p in sleepers:
                p.kill()
                p.wait()
    kind = "Python processes (stack sampling on)" if args.python else "non-Python processes"
    print(f"live view, 8 GPUs, {kind}, {args.seconds:.0f} s after {args.warmup:.0f} s warm-up, tmux 200x60")
    print(f"{'processes':>9}  {'tool':<30}{'CPU % of one core':>18}")
    for n, label, cpu in rows:
        print(f"{n:>9}  {label:<30}{cpu:>18.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
