"""The queue's promise under chaos: a stream of mixed jobs while the daemon, and sometimes its
spawner, is SIGKILLed at random moments; every job ends once, with its own exit code recorded.

The run and its checks are in chaos.py; scripts/queue_chaos.py runs more seeds and longer streams.
"""

from __future__ import annotations

import pytest

from tests.queue.chaos import chaos_run, check_run
from tests.queue.conftest import QueueBox


@pytest.mark.parametrize("seed", [11, 23, 47])
def test_the_daemon_killed_at_random_moments_loses_no_job_and_runs_none_twice(queue: QueueBox, seed: int) -> None:
    run = chaos_run(queue, seed, count=20, snipe=0.3)
    assert run.kills, "the run killed nothing"
    check_run(queue, run, show_all=False)
