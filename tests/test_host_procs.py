import signal
import subprocess
import sys

import pytest

from gpubox.telemetry.host_procs import PidTable, host_snapshot, signal_process


@pytest.fixture
def child():
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "marker-arg"])
    yield proc
    proc.kill()
    proc.wait()


def test_pid_details_and_cpu_rate_over_refreshes(child) -> None:
    table = PidTable()
    first = table.lookup([child.pid])[child.pid]
    assert first.command is not None and "marker-arg" in first.command
    assert first.user is not None and first.rss_bytes and first.rss_bytes > 0
    assert first.cpu_percent is None and first.reasons["cpu_percent"] == "warming_up"
    second = table.lookup([child.pid])[child.pid]
    assert second.cpu_percent is not None and "cpu_percent" not in second.reasons


def test_gone_pid_is_null_with_no_process_reason() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    info = PidTable().lookup([proc.pid])[proc.pid]
    assert (info.user, info.command, info.cpu_percent, info.rss_bytes) == (None, None, None, None)
    assert info.reasons["command"] == "no_process"


def test_signal_refuses_a_recycled_pid(child) -> None:
    info = PidTable().lookup([child.pid])[child.pid]
    assert info.start_time is not None
    with pytest.raises(ProcessLookupError):
        signal_process(child.pid, signal.SIGTERM, info.start_time - 100)
    assert child.poll() is None  # still alive: nothing was sent
    signal_process(child.pid, signal.SIGTERM, info.start_time)
    assert child.wait(timeout=10) == -signal.SIGTERM


def test_host_snapshot() -> None:
    host = host_snapshot("550.1", "12.4", "12.550.1", hostname=lambda: "box")
    assert host.hostname == "box" and host.driver_version == "550.1"
    assert host.mem_total_bytes and host.mem_used_bytes is not None and host.cpu_count
