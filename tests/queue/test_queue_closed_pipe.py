"""`queue logs -f | head -1`: the reader goes away while the job is quiet. As tail -f does, the
follower notices at once (nothing on stderr, exit 141), not at the job's next line, which may
be hours away."""

from __future__ import annotations

import os
import subprocess
import sys

from gpubox.exit_codes import ExitCode
from tests.queue.conftest import QueueBox


def test_logs_follow_ends_when_its_reader_leaves_while_the_job_is_quiet(queue: QueueBox) -> None:
    job = queue.add("--gpus", "0", "--shell", "--", "echo started; sleep 600")
    queue.wait_state(job, ("running",))
    follower = subprocess.Popen(
        [sys.executable, "-m", "gpubox", "queue", "logs", "-f", str(job)],
        env={**os.environ, **queue.env},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert follower.stdout is not None and follower.stdout.readline() == "started\n"
        follower.stdout.close()
        _, stderr = follower.communicate(timeout=30)  # the job writes nothing more for 600 s
        assert (follower.returncode, stderr) == (ExitCode.READER_LEFT, "")
    finally:
        follower.kill()
        follower.wait()
        queue("queue", "cancel", str(job))
        queue("daemon", "stop")
