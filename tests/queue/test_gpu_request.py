"""The GPUS column of `queue ls` for a queued job: what it asked for, at a glance and unambiguous."""

from __future__ import annotations

import pytest

from gpubox.queue.jobs import Job, JobSpec
from gpubox.queue.records import gpu_request

INDEX = {"GPU-a": 0, "GPU-b": 1, "GPU-c": 3}


@pytest.mark.parametrize(
    ("request_", "shown"),
    [
        ({"gpus": 1}, "1"),
        ({"gpus": 2, "gpu_mem_bytes": 40 << 30}, "2×40G"),
        ({"gpu_ids": ("GPU-b",)}, "#1"),  # GPU 1 by name: not one GPU, any
        ({"gpu_ids": ("GPU-a", "GPU-c"), "gpu_mem_bytes": 40 << 30}, "#0,3×40G"),
        ({"gpu_ids": ("GPU-unknown-to-the-daemon",)}, "#GPU-unknown-"),  # a UUID, cut to 12 characters
        ({"gpus": 0}, "cpu"),
        ({"gpus": None}, "auto"),
    ],
)
def test_a_count_and_gpus_named_read_differently(request_: dict[str, object], shown: str) -> None:
    spec = JobSpec(argv=("true",), cwd="/", env={}, **request_)  # type: ignore[arg-type]
    assert gpu_request(Job(id=1, spec=spec, state="queued", submitted_at=0.0), INDEX) == shown
