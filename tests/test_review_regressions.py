"""Behaviour at the edges: odd text, odd files, odd drivers, odd namespaces."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from gpubox.telemetry.host_procs import PidTable, in_child_pid_namespace
from gpubox.telemetry.model import Reason
from tests.fake_nvml import scenarios
from tests.fake_nvml.build import fake_nvml_env
from tests.helpers import run_gpubox


def test_markup_in_a_command_line_is_printed_as_text(tmp_path: Path) -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "[/bold]", "[red]x"])
    try:
        box = scenarios.with_pids(scenarios.hopper(gpus=1, processes=1), [child.pid])
        box.gpus[0].name = "GPU [b]x[/b]"
        res = run_gpubox("top", "--once", "--interval", "0.05", env=fake_nvml_env(box.write(tmp_path / "s.txt")))
        assert res.returncode == 0, res.stderr
        assert "[/bold] [red]x" in res.stdout and "GPU [b]x[/b]" in res.stdout
    finally:
        child.kill()
        child.wait()


def test_non_utf8_arguments_become_valid_text() -> None:
    bad = subprocess.Popen([sys.executable.encode(), b"-c", b"import time; time.sleep(60)", b"caf\xe9"])
    try:
        for _ in range(500):  # until the child has exec'd
            if b"caf\xe9" in Path(f"/proc/{bad.pid}/cmdline").read_bytes():
                break
            time.sleep(0.01)
        info = PidTable().lookup([bad.pid])[bad.pid]
        assert info.command is not None and "caf\ufffd" in info.command
        json.dumps(info.command).encode("utf-8")  # no lone surrogates
    finally:
        bad.kill()
        bad.wait()


@pytest.mark.parametrize("make", ["directory", "empty_env"])
def test_config_that_is_not_a_file_is_one_line_exit_2(isolated_env: Path, make: str) -> None:
    env: dict[str, str] = {}
    if make == "directory":
        (isolated_env / ".config" / "gpubox" / "config.toml").mkdir(parents=True)
        res = run_gpubox("top", "--once", "--demo", env=env)
        assert res.returncode == 2 and "not a regular file" in res.stderr
        assert len(res.stderr.splitlines()) == 1
    else:
        env["GPUBOX_SYSTEM_CONFIG"] = ""  # empty means unset
        res = run_gpubox("top", "--once", "--demo", "--interval", "0.05", env=env)
        assert res.returncode == 0, res.stderr


def test_a_closed_pipe_ends_gpubox_as_sigpipe_ends_a_tool() -> None:
    cmd = f"{sys.executable} -m gpubox top --once --demo --demo-processes 3000 --interval 0.05 | head -1; "
    cmd += 'echo "rc=${PIPESTATUS[0]}"'
    out = subprocess.run(["bash", "-c", cmd], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip().endswith("rc=141"), out.stdout + out.stderr  # 128 + SIGPIPE, as for `yes | head -1`
    assert out.stderr == ""


def test_json_gets_an_envelope_on_usage_errors_too() -> None:
    res = run_gpubox("top", "--json", "--demo", "--gpu", "9")
    assert res.returncode == 2
    doc = json.loads(res.stdout)
    assert doc["ok"] is False and doc["exit_code"] == 2 and "no GPU 9" in doc["errors"][0]


def test_pcie_falls_back_to_counters_within_once_when_gpm_metrics_fail(tmp_path: Path) -> None:
    box = scenarios.hopper(gpus=1, processes=0)
    box.gpus[0].unsupported = ["nvmlGpmMetricsGet"]
    res = run_gpubox("top", "--json", "--interval", "0.05", env=fake_nvml_env(box.write(tmp_path / "s.txt")))
    gpu = json.loads(res.stdout)["data"]["gpus"][0]
    assert gpu["pcie_source"] == "counters" and gpu["pcie_rx_Bps"] == box.gpus[0].pcie_rx_bps
    assert gpu["sm_active"] is None and gpu["reasons"]["sm_active"] == "not_supported"


def test_a_gpu_that_cannot_be_opened_is_not_called_lost(tmp_path: Path) -> None:
    box = scenarios.hopper(gpus=2, processes=0)
    box.gpus[1].unsupported = ["nvmlDeviceGetUUID"]
    res = run_gpubox("top", "--json", "--interval", "0.05", env=fake_nvml_env(box.write(tmp_path / "s.txt")))
    doc = json.loads(res.stdout)
    g1 = doc["data"]["gpus"][1]
    assert g1["lost"] is False and g1["reasons"]["gpu_busy"] == "not_supported"
    assert any("GPU 1 cannot be opened" in e for e in doc["data"]["errors"])
    assert doc["data"]["gpus"][0]["gpu_busy"] == box.gpus[0].gpu_util


def test_container_pid_namespace_hides_host_pids(tmp_path: Path) -> None:
    status = tmp_path / "status"
    no_link = str(tmp_path / "no-such-link")  # the namespace link unreadable: NSpid decides
    status.write_text("Name:\tx\nNSpid:\t4242\t7\n")
    assert in_child_pid_namespace(str(status), no_link) is True
    status.write_text("Name:\tx\nNSpid:\t4242\n")
    assert in_child_pid_namespace(str(status), no_link) is False
    # A container mounts its own /proc, where NSpid lists one pid as on the host: the namespace
    # link tells them apart.
    link = tmp_path / "pid"
    link.symlink_to("pid:[4026532201]")
    assert in_child_pid_namespace(str(status), str(link)) is True
    link.unlink()
    link.symlink_to("pid:[4026531836]")
    assert in_child_pid_namespace(str(status), str(link)) is False
    me = PidTable(host_pids_visible=False).lookup([1])[1]
    assert me.command is None and me.reasons["command"] == Reason.NO_PROCESS.value


def test_container_refuses_to_signal_host_pids(nvml: Any) -> None:
    from gpubox.telemetry.nvml_backend import NvmlBackend

    backend = NvmlBackend(nvml(scenarios.hopper(gpus=1, processes=0)), pids=PidTable(host_pids_visible=False))
    with pytest.raises(ProcessLookupError, match="PID namespace"):
        backend.send_signal(1, 15, None)
    backend.close()


def test_backend_is_not_closed_under_a_running_sample() -> None:
    from gpubox.tui.poller import Poller

    closed = threading.Event()
    backend = SimpleNamespace(close=closed.set)
    poller = Poller(SimpleNamespace(), backend, 1.0)  # type: ignore[arg-type]
    poller._backend_lock.acquire()  # a sample is running
    assert poller.close_backend(timeout=0.05) is False and not closed.is_set()
    poller._backend_lock.release()
    assert poller.close_backend(timeout=0.05) is True and closed.is_set()
