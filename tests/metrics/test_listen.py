"""--listen parsing, and the server in this process: its errors, and its stop on a signal."""

from __future__ import annotations

import os
import signal
import socket
import struct
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable

import pytest

from gpubox.metrics import server as server_module
from gpubox.metrics.exposition import BoxCollector
from gpubox.metrics.listen import ListenAddress, parse_listen
from gpubox.metrics.server import ListenError, serve
from gpubox.telemetry.simulated import SimulatedBackend
from tests.metrics.support import RecordingBackend, free_port, samples


@pytest.mark.parametrize(
    ("text", "host", "port", "shown"),
    [
        ("127.0.0.1:9400", "127.0.0.1", 9400, "127.0.0.1:9400"),
        (" localhost:1 ", "localhost", 1, "localhost:1"),
        ("[::1]:65535", "::1", 65535, "[::1]:65535"),
        (":9400", "0.0.0.0", 9400, "0.0.0.0:9400"),
    ],
)
def test_addresses(text: str, host: str, port: int, shown: str) -> None:
    address = parse_listen(text)
    assert address == ListenAddress(host, port)
    assert str(address) == shown and address.url == f"http://{shown}/metrics"


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("127.0.0.1", "has no port"),
        ("127.0.0.1:", "has no port"),
        ("[::1]", "has no port"),
        ("[::1]9400", "has no port"),
        ("", "has no port"),
        ("host:http", "is not a port number"),
        ("host:９４００", "is not a port number"),  # digits, but not ASCII ones
        ("host:-1", "is not a port number"),
        ("host:0", "out of range"),
        ("host:65536", "out of range"),
        ("::1:9400", "in brackets"),
        ("[::1", "is not an address"),
        ("[]:9400", "is not an address"),
        ("http://127.0.0.1:9400", "is a URL, not an address"),
        ("127.0.0.1:9400/metrics", "is a URL, not an address"),
    ],
)
def test_bad_addresses_say_what_is_wrong(text: str, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        parse_listen(text)


def collector() -> BoxCollector:
    return BoxCollector(SimulatedBackend(gpus=1, processes=1))


def handlers() -> tuple[object, ...]:
    return (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM), signal.set_wakeup_fd(-1))


def test_a_signal_on_another_thread_stops_the_server_and_everything_is_put_back() -> None:
    before = handlers()
    signal.set_wakeup_fd(before[2])  # handlers() took it out to read it
    port = free_port()
    scraped: list[str] = []

    def scrape_then_interrupt() -> None:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as response:
            scraped.append(response.read().decode())
        os.kill(os.getpid(), signal.SIGINT)

    def ready() -> None:
        threading.Thread(target=scrape_then_interrupt).start()

    assert serve(collector(), ListenAddress("127.0.0.1", port), ready) == signal.SIGINT
    after = handlers()
    signal.set_wakeup_fd(after[2])
    assert after == before
    assert "gpubox_gpu_busy_ratio" in {name for name, _ in samples(scraped[0])}
    with socket.socket() as s:  # nothing listens there any more (the scrape's connection may linger)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", port))
        s.listen()


def test_a_port_in_use_is_a_listen_error_not_bad_input() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(ListenError) as caught:
            serve(collector(), ListenAddress("127.0.0.1", port))
    assert not caught.value.bad_input and "in use" in caught.value.message
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL


def test_a_name_that_is_no_host_name_is_bad_input() -> None:
    with pytest.raises(ListenError) as caught:
        serve(collector(), ListenAddress("bad..name", free_port()))
    assert caught.value.bad_input and caught.value.message.startswith("cannot listen on bad..name:")


def serve_while(port: int, client: Callable[[], None]) -> None:
    """Serve a collector on `port` in this thread while `client` runs in another, then stop by SIGINT."""
    failed: list[BaseException] = []

    def run() -> None:
        try:
            client()
        except BaseException as exc:
            failed.append(exc)
        finally:
            os.kill(os.getpid(), signal.SIGINT)

    assert serve(collector(), ListenAddress("127.0.0.1", port), lambda: threading.Thread(target=run).start())
    if failed:
        raise failed[0]


def test_a_client_that_sends_nothing_is_let_go_quietly(
    monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(server_module._ScrapeHandler, "timeout", 0.2)
    port = free_port()

    def idle_then_scrape() -> None:
        with socket.create_connection(("127.0.0.1", port), timeout=60) as idle:
            assert idle.recv(1) == b""  # the server hung up on it, rather than hold a thread for it forever
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as response:
            assert response.status == 200

    serve_while(port, idle_then_scrape)
    out, err = capfd.readouterr()
    assert (out, err) == ("", "")


def test_a_client_that_resets_its_connection_leaves_no_traceback(capfd: pytest.CaptureFixture[str]) -> None:
    port = free_port()

    def reset_mid_request() -> None:
        before = threading.active_count()
        with socket.create_connection(("127.0.0.1", port), timeout=30) as rude:
            rude.sendall(b"GET /metr")
            deadline = time.monotonic() + 30
            while threading.active_count() == before and time.monotonic() < deadline:
                time.sleep(0.01)  # until the server's thread for it reads
            rude.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        while threading.active_count() > before and time.monotonic() < deadline:
            time.sleep(0.01)  # until that thread has ended, having said whatever it says
        assert threading.active_count() == before

    serve_while(port, reset_mid_request)
    out, err = capfd.readouterr()
    assert (out, err) == ("", "")


def test_only_metrics_is_served_and_other_paths_take_no_snapshot() -> None:
    backend = RecordingBackend(SimulatedBackend(gpus=1, processes=1))
    port = free_port()
    answers: dict[str, int] = {}

    def get(path: str) -> None:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=30) as response:
                answers[path] = response.status
        except urllib.error.HTTPError as exc:
            answers[path] = exc.code
            assert exc.read().decode() == "gpubox: no such page; the metrics are at /metrics\n"

    def scrape_then_interrupt() -> None:
        for path in ("/", "/metric", "/metrics/", "/favicon.ico", "/metrics?x=1"):
            get(path)
        os.kill(os.getpid(), signal.SIGINT)

    serve(
        BoxCollector(backend),
        ListenAddress("127.0.0.1", port),
        lambda: threading.Thread(target=scrape_then_interrupt).start(),
    )
    assert answers == {"/": 404, "/metric": 404, "/metrics/": 404, "/favicon.ico": 404, "/metrics?x=1": 200}
    assert len(backend.snapshots) == 1  # the one scrape at /metrics
