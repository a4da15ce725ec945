"""Factories for the loader benchmark's tests, loaded by the benchmark in a child interpreter.

Sleeping stands in for work: a sleeping worker holds no CPU, so more workers load faster even on a
box with 2 CPUs, and a sleeping step costs the same on any machine.
"""

from __future__ import annotations

import time
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset

ITEM_SLEEP_S = 0.003  # per item: a batch of 8 takes about 24 ms to load in one process
FAST_STEP_SLEEP_S = 0.01  # the fast loader's step: far slower than its batches load


class SlowItems(Dataset[torch.Tensor]):
    """Each item sleeps, as decoding a JPEG or reading a remote file would."""

    def __init__(self, n: int = 100_000) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        time.sleep(ITEM_SLEEP_S)
        return torch.full((16,), float(i))


class ReadyItems(Dataset[torch.Tensor]):
    """Items already in memory: loading costs next to nothing."""

    def __init__(self, n: int = 4096) -> None:
        self.items = torch.arange(n * 16, dtype=torch.float32).reshape(n, 16)

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> torch.Tensor:
        return self.items[i]


def cheap_step(batch: torch.Tensor) -> None:
    batch.sum()


def slow_step(batch: torch.Tensor) -> None:
    time.sleep(FAST_STEP_SLEEP_S)


def slow() -> tuple[DataLoader[torch.Tensor], Any]:
    """Input-bound: one process loads far slower than the step consumes."""
    return DataLoader(SlowItems(), batch_size=8, num_workers=0), cheap_step


def fast() -> dict[str, Any]:
    """Not input-bound: the step is far slower than loading."""
    return {"loader": DataLoader(ReadyItems(), batch_size=32, shuffle=True), "step": slow_step}


def loader_only() -> DataLoader[torch.Tensor]:
    """No step: only the input rates can be measured."""
    return DataLoader(ReadyItems(256), batch_size=32)


def failing_step() -> tuple[DataLoader[torch.Tensor], Any]:
    def step(batch: torch.Tensor) -> None:
        raise RuntimeError("CUDA out of memory")

    return DataLoader(ReadyItems(64), batch_size=8), step


# torch's CUDA errors: the words that matter on the first line, then lines of advice
OOM_MESSAGE = (
    "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.15 GiB "
    "of which 1.02 GiB is free.\n"
    "If reserved but unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True.\n"
)
ASSERT_MESSAGE = (
    "CUDA error: device-side assert triggered\n"
    "CUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace below might be "
    "incorrect.\nFor debugging consider passing CUDA_LAUNCH_BLOCKING=1\n"
    "Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.\n"
)


def oom_step() -> tuple[DataLoader[torch.Tensor], Any]:
    def step(batch: torch.Tensor) -> None:
        raise torch.OutOfMemoryError(OOM_MESSAGE)

    return DataLoader(ReadyItems(64), batch_size=8), step


class FailingItems(Dataset[torch.Tensor]):
    def __len__(self) -> int:
        return 64

    def __getitem__(self, i: int) -> torch.Tensor:
        raise RuntimeError(ASSERT_MESSAGE)


def failing_worker() -> DataLoader[torch.Tensor]:
    """The error comes back from a worker process, with the worker's traceback in its message."""
    return DataLoader(FailingItems(), batch_size=8, num_workers=1)


def hangs() -> DataLoader[torch.Tensor]:
    """Never returns within any test's budget."""
    time.sleep(120)
    raise AssertionError("unreachable")


def raises() -> DataLoader[torch.Tensor]:
    raise ValueError("the dataset path is not set")


def wrong_type() -> list[int]:
    return [1, 2, 3]


def empty() -> DataLoader[torch.Tensor]:
    return DataLoader(ReadyItems(4), batch_size=8, drop_last=True)


NOT_CALLABLE = 42
