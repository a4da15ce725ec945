"""`gpubox metrics serve`: a real server in a subprocess, scraped over HTTP with urllib, its answer
parsed with prometheus_client's parser; stopped by SIGTERM, SIGINT or SIGHUP with exit 0."""

from __future__ import annotations

import signal
import socket
import subprocess
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from tests.metrics.support import free_port, metrics_argv, of, run_metrics, samples, wait_for_port


@contextmanager
def server(*args: str) -> Iterator[subprocess.Popen[str]]:
    pipe = subprocess.PIPE
    proc = subprocess.Popen(metrics_argv("serve", *args), stdout=pipe, stderr=pipe, stdin=subprocess.DEVNULL, text=True)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate(timeout=30)


def scrape(url: str) -> tuple[str, str]:
    with urllib.request.urlopen(url, timeout=30) as response:
        assert response.status == 200
        return response.headers["Content-Type"], response.read().decode()


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP], ids=["SIGTERM", "SIGINT", "SIGHUP"])
def test_serve_scraped_twice_then_stopped_by_a_signal(stop: signal.Signals) -> None:
    port = free_port()
    with server("--demo", "--listen", f"127.0.0.1:{port}") as proc:
        wait_for_port("127.0.0.1", port, proc)
        content_type, first = scrape(f"http://127.0.0.1:{port}/metrics")
        _, second = scrape(f"http://127.0.0.1:{port}/metrics")
        assert content_type.startswith("text/plain") and "version=" in content_type
        proc.send_signal(stop)
        out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert out == "" and err.strip() == f"gpubox: serving http://127.0.0.1:{port}/metrics"
    a, b = samples(first), samples(second)
    for found in (a, b):
        assert len(of(found, "gpubox_gpu_busy_ratio")) == 4
        assert len(of(found, "gpubox_gpu_pcie_rx_bytes_per_second")) == 4  # rates from the first scrape on
        assert len(of(found, "gpubox_process_gpu_memory_bytes")) == 12
    # Each scrape is a snapshot of its own: the simulated figures move from one to the next.
    assert of(a, "gpubox_gpu_busy_ratio") != of(b, "gpubox_gpu_busy_ratio")


def test_serve_on_ipv6_loopback() -> None:
    if not socket.has_ipv6:
        pytest.skip("no IPv6 here")
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
            port = s.getsockname()[1]
    except OSError:
        pytest.skip("no IPv6 loopback here")
    with server("--demo", "--listen", f"[::1]:{port}") as proc:
        wait_for_port("::1", port, proc)
        _, text = scrape(f"http://[::1]:{port}/metrics")
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=30)
    assert proc.returncode == 0
    assert "gpubox_gpu_busy_ratio" in text


@pytest.mark.parametrize(
    "listen",
    ["127.0.0.1", "127.0.0.1:", "localhost:http", "127.0.0.1:0", "127.0.0.1:65536", "::1:9400", "[::1", "[]:9400", ""],
)
def test_bad_listen_is_one_line_and_exit_2(listen: str) -> None:
    res = run_metrics("serve", "--demo", "--listen", listen, timeout=30)
    assert res.returncode == 2, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpubox: ") and "--listen" in lines[0], res.stderr
    assert "Traceback" not in res.stderr and res.stdout == ""


def test_a_port_in_use_is_one_line_and_exit_1() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        res = run_metrics("serve", "--demo", "--listen", f"127.0.0.1:{port}", timeout=30)
    assert res.returncode == 1, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"gpubox: cannot listen on 127.0.0.1:{port}"), res.stderr
    assert "in use" in lines[0]


def test_an_address_not_of_this_box_is_one_line_and_exit_1() -> None:
    res = run_metrics("serve", "--demo", "--listen", f"192.0.2.1:{free_port()}", timeout=30)  # TEST-NET-1
    assert res.returncode == 1, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpubox: cannot listen on 192.0.2.1:"), res.stderr


def test_a_host_name_that_cannot_be_one_is_exit_2() -> None:
    res = run_metrics("serve", "--demo", "--listen", f"bad..name:{free_port()}", timeout=30)
    assert res.returncode == 2, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpubox: cannot listen on bad..name:"), res.stderr
