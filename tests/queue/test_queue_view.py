"""`queue ls` times: how long a job waited (from when it last joined the queue) and ran."""

from __future__ import annotations

from typing import Any

from gpubox.cli.queue_view import job_table


def record(**fields: Any) -> dict[str, Any]:
    base = {"id": 1, "name": None, "kind": "other", "state": "queued", "attempt": 0, "reason": None}
    base.update({"submitted_at": 1000.0, "queued_at": 1000.0, "started_at": None, "ended_at": None})
    base.update({"exit_code": None, "gpus": []})
    return {**base, **fields}


def cells(rec: dict[str, Any], now: float) -> list[str]:
    return job_table([rec], {1: "cpu"}, now=now).splitlines()[1].split()


def test_a_queued_job_waits_from_its_submission() -> None:
    assert cells(record(), now=1090.0)[5:7] == ["1m30s", "-"]


def test_a_job_queued_again_waits_from_then_not_from_its_submission() -> None:
    # Ran from 1100 to 4700, failed, queued again at 4700: at 4760 it has waited a minute.
    again = record(attempt=1, queued_at=4700.0, reason="attempt 1 failed (exit code 1); retry 1 of 2")
    assert cells(again, now=4760.0)[5:7] == ["1m00s", "-"]


def test_a_running_job_waited_until_it_started() -> None:
    running = record(state="running", attempt=1, started_at=1030.0)
    assert cells(running, now=1100.0)[5:7] == ["30s", "1m10s"]


def test_a_record_without_queued_at_waits_from_its_submission() -> None:
    # A record from before jobs had queued_at (an older daemon's JSON, say).
    old = record()
    del old["queued_at"]
    assert cells(old, now=1090.0)[5:7] == ["1m30s", "-"]
