"""GPUs named on the command line (`queue add --gpu`, `pause --gpu`): by index, UUID or prefix."""

from __future__ import annotations

import pytest

from gpubox.queue.gpus import GpuInfo, resolve_gpus

BOX = [GpuInfo(0, "GPU-aaaa", 80 << 30, 0), GpuInfo(1, "GPU-abbb", 80 << 30, 0)]


def test_indexes_uuids_and_prefixes_name_gpus() -> None:
    assert resolve_gpus(["1", " 0 "], BOX) == ("GPU-abbb", "GPU-aaaa")
    assert resolve_gpus(["GPU-AB"], BOX) == ("GPU-abbb",)


@pytest.mark.parametrize(
    ("texts", "message"),
    [
        (["\u0661"], "no GPU with UUID \u0661 on this box"),  # an Arabic-Indic 1: int() takes it, CUDA does not
        (["1_0"], "no GPU with UUID 1_0 on this box"),
        (["2"], "no GPU 2 on this box (GPUs: 0-1)"),
        (["GPU-a"], "GPU UUID prefix GPU-a matches 2 GPUs; give more of it"),
        (["0", "GPU-aaaa"], "GPU GPU-aaaa is named twice"),
        ([" "], "an empty GPU in the --gpu list"),
    ],
)
def test_what_names_no_single_gpu_is_refused_saying_why(texts: list[str], message: str) -> None:
    with pytest.raises(ValueError) as raised:
        resolve_gpus(texts, BOX)
    assert str(raised.value) == message
