"""The queue's chaos run (tests/queue/chaos.py) over many seeds and longer streams: the daemon and
its spawner SIGKILLed at random moments while jobs run, then every promise checked.

    .venv/bin/python scripts/queue_chaos.py --seeds 20 --count 40
    .venv/bin/python scripts/queue_chaos.py --minutes 5          # seeds from --first on, until then

Each run gets a private queue in a temporary folder, removed when the run passes and kept (its
path printed, with the daemon's log) when it fails. Exits 1 when any run failed.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import sys
import tempfile
import time
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.queue.chaos import chaos_run, check_run  # noqa: E402
from tests.queue.conftest import QueueBox, kill_everything, queue_env  # noqa: E402

# What the daemon says in a run that goes as planned; anything else is printed for a look.
USUAL = re.compile(
    r"gpubox daemon: (pid \d+, state |job \d+: (failed|timeout|cancelled)|GPU use is not recorded until NVML"
    r"|stopped; running jobs go on)"
)


def unusual(log: Path) -> list[str]:
    lines = log.read_text(errors="replace").splitlines() if log.exists() else []
    return [line for line in lines if line.strip() and not USUAL.match(line)]


def one(seed: int, count: int, gap: tuple[float, float], snipe: float, cpu_jobs: int) -> bool:
    home = Path(tempfile.mkdtemp(prefix=f"gpubox-chaos-{seed}-"))
    box = QueueBox(home, queue_env(home))
    started = time.monotonic()
    try:
        run = chaos_run(box, seed, count=count, gap=gap, snipe=snipe, cpu_jobs=cpu_jobs, say=print)
        check_run(box, run)
    except Exception:
        traceback.print_exc()
        print(f"seed {seed}: FAILED after {time.monotonic() - started:.1f}s; kept {home}", flush=True)
        log = home / "state" / "daemon.log"
        if log.exists():
            print(log.read_text()[-4000:], flush=True)
        return False
    finally:
        kill_everything(box)
    print(f"seed {seed}: ok, {count} jobs in {time.monotonic() - started:.1f}s", flush=True)
    for line in unusual(home / "state" / "daemon.log"):
        print(f"seed {seed}: daemon said: {line}", flush=True)
    shutil.rmtree(home, ignore_errors=True)
    return True


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--first", type=int, default=1000, help="the first seed")
    parser.add_argument("--seeds", type=int, default=10, help="how many seeds (without --minutes)")
    parser.add_argument("--minutes", type=float, default=None, help="run seeds until this much time has passed")
    parser.add_argument("--count", type=int, default=40, help="jobs per run")
    parser.add_argument("--gap", type=float, nargs=2, default=(0.15, 0.8), help="seconds between kills, min max")
    parser.add_argument("--snipe", type=float, default=0.3, help="share of job starts and ends a kill is timed to")
    parser.add_argument("--cpu-jobs", type=int, default=2, help="queue.max_cpu_jobs")
    args = parser.parse_args()
    # A SIGTERM (timeout(1), say) ends the sweep as Ctrl-C does: the run's queue is killed first.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    for name in [n for n in os.environ if n.startswith("GPUBOX_")]:
        del os.environ[name]  # each run's queue is its own
    failed: list[int] = []
    seed = args.first
    until = None if args.minutes is None else time.monotonic() + args.minutes * 60
    while (seed - args.first < args.seeds) if until is None else time.monotonic() < until:
        if not one(seed, args.count, tuple(args.gap), args.snipe, args.cpu_jobs):  # type: ignore[arg-type]
            failed.append(seed)
        seed += 1
    print(f"{seed - args.first} runs, {len(failed)} failed" + (f": seeds {failed}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
