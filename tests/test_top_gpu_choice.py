"""`top --gpu` is checked against the GPUs as the backend opened them, before any sampling: a GPU
that is not there is refused at once (one line, exit 2), not after the --once sampling window,
and not after a sample taken before the live view."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gpubox.cli.main import main
from gpubox.telemetry.model import GpuId
from gpubox.telemetry.nvml_backend import NvmlBackend
from gpubox.telemetry.simulated import SimulatedBackend
from tests.fake_nvml import scenarios
from tests.fake_nvml.build import fake_nvml_env

NO_GPU_9 = "gpubox: no GPU 9 on this box (GPUs: 0, 1, 2, 3)\n"


@pytest.fixture
def sampling_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """The simulated box fails the test if it is sampled."""

    def sample(self: SimulatedBackend) -> Any:
        raise AssertionError("the box was sampled before --gpu was checked")

    monkeypatch.setattr(SimulatedBackend, "sample", sample)


@pytest.mark.usefixtures("sampling_refused")
@pytest.mark.parametrize("gpu", ["9", "GPU-nope", ","])
def test_once_refuses_a_bad_gpu_before_it_samples(capsys: pytest.CaptureFixture[str], gpu: str) -> None:
    assert main(["top", "--once", "--demo", "--interval", "30", "--gpu", gpu]) == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.splitlines()) == 1 and err.startswith("gpubox: ")


@pytest.mark.usefixtures("sampling_refused")
def test_json_refuses_a_bad_gpu_before_it_samples(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["top", "--json", "--demo", "--interval", "30", "--gpu", "9"]) == 2
    out, err = capsys.readouterr()
    assert err == NO_GPU_9
    assert json.loads(out)["errors"] == [NO_GPU_9.removeprefix("gpubox: ").strip()]


@pytest.mark.usefixtures("sampling_refused")
def test_the_live_view_refuses_a_bad_gpu_before_it_samples(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import gpubox.tui.top_app

    monkeypatch.setattr(sys.stdout, "isatty", lambda: True)
    monkeypatch.setattr(sys.stdin, "isatty", lambda: True)

    def run_live(*args: object, **kwargs: object) -> int:
        raise AssertionError("the live view started")

    monkeypatch.setattr(gpubox.tui.top_app, "run_live", run_live)
    assert main(["top", "--demo", "--gpu", "9"]) == 2
    assert capsys.readouterr().err == NO_GPU_9


def test_a_bad_gpu_on_nvml_is_refused_before_the_sampling_window(tmp_path: Path) -> None:
    """On the fake NVML: an hour's window, which the refusal does not wait for (a regression
    would run into the subprocess's timeout)."""
    env = fake_nvml_env(scenarios.hopper(gpus=2, processes=2).write(tmp_path / "s.txt"))
    result = subprocess.run(
        [sys.executable, "-m", "gpubox", "top", "--once", "--interval", "3600", "--gpu", "2"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr == "gpubox: no GPU 2 on this box (GPUs: 0, 1)\n"


@pytest.mark.parametrize("scenario", ["hopper", "mig", "lost_gpu", "consumer"])
def test_nvml_names_the_gpus_its_snapshots_show(nvml: Any, scenario: str) -> None:
    backend = NvmlBackend(nvml(getattr(scenarios, scenario)()), clock=lambda: 1000.0)
    try:
        named = backend.gpus()
        for _ in range(3):  # a GPU lost meanwhile is still shown, as lost
            assert named == tuple(GpuId(g.index, g.uuid) for g in backend.sample().gpus)
    finally:
        backend.close()
    if scenario == "mig":  # the card and its two instances, all GPU 0
        assert [g.index for g in named] == [0, 0, 0] and named[2].uuid.startswith("MIG-")


def test_the_simulated_box_names_the_gpus_its_snapshots_show() -> None:
    box = SimulatedBackend(gpus=5, processes=3, clock=lambda: 0.0)
    assert box.gpus() == tuple(GpuId(g.index, g.uuid) for g in box.sample().gpus)
