"""Which addresses `metrics serve` listens on when its host name has several (localhost is often
::1 and 127.0.0.1): every one, in-process, with the name's addresses given by a fake resolver."""

from __future__ import annotations

import errno
import os
import signal
import socket
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from gpubox.metrics import server
from gpubox.metrics.exposition import BoxCollector
from gpubox.metrics.listen import ListenAddress
from gpubox.telemetry.simulated import SimulatedBackend

V4 = (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.1", 0))
V6 = (socket.AF_INET6, socket.SOCK_STREAM, 6, "", ("::1", 0, 0, 0))
NOT_HERE = (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("192.0.2.1", 0))  # TEST-NET-1: no box has it
NAME = "gpubox-test-name"  # the name the fake resolver answers for


def port_free_on_both() -> int:
    for _ in range(50):
        with socket.socket() as v4, socket.socket(socket.AF_INET6) as v6:
            v4.bind(("127.0.0.1", 0))
            port = int(v4.getsockname()[1])
            try:
                v6.bind(("::1", port))
            except OSError:
                continue
            return port
    raise AssertionError("no port free on both loopbacks")


def assert_not_listening(family: int, host: str, port: int) -> None:
    with socket.socket(family) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # past connections' TIME_WAIT, not a listener
        s.bind((host, port))


@pytest.fixture
def resolves_to(monkeypatch: pytest.MonkeyPatch) -> Callable[..., None]:
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
    except OSError:
        pytest.skip("no IPv6 loopback here")

    real = socket.getaddrinfo

    def give(*infos: tuple[Any, ...]) -> None:
        def getaddrinfo(host: str, *args: Any, **kwargs: Any) -> list[tuple[Any, ...]]:
            return list(infos) if host == NAME else real(host, *args, **kwargs)  # the scrapes resolve for real

        monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)

    return give


def serve_and_scrape(host: str, port: int, scraped: list[str]) -> tuple[int, dict[str, object]]:
    """Serve on host:port; once it listens, scrape each of `scraped` (addresses), then SIGTERM,
    which serve() waits for through its own handler. The signal serve() returned, and what each
    scrape got (an HTTP status, or the error)."""
    seen: dict[str, object] = {}

    def ready() -> None:
        for each in scraped:
            url = f"http://{'[' + each + ']' if ':' in each else each}:{port}/metrics"
            try:
                with urllib.request.urlopen(url, timeout=30) as response:
                    seen[each] = response.status
            except OSError as exc:
                seen[each] = exc
        os.kill(os.getpid(), signal.SIGTERM)

    stopped = server.serve(BoxCollector(SimulatedBackend(gpus=1, processes=0)), ListenAddress(host, port), ready)
    return stopped, seen


def test_a_name_with_two_addresses_is_served_on_both(resolves_to: Callable[..., None]) -> None:
    resolves_to(V6, V4, V4)  # a name listed twice is one server
    port = port_free_on_both()
    stopped, seen = serve_and_scrape(NAME, port, ["::1", "127.0.0.1"])
    assert stopped == signal.SIGTERM
    assert seen == {"::1": 200, "127.0.0.1": 200}
    for host, family in (("127.0.0.1", socket.AF_INET), ("::1", socket.AF_INET6)):
        assert_not_listening(family, host, port)


def test_an_address_the_box_does_not_have_is_skipped_beside_one_it_has(resolves_to: Callable[..., None]) -> None:
    resolves_to(NOT_HERE, V4)
    port = port_free_on_both()
    _, seen = serve_and_scrape(NAME, port, ["127.0.0.1"])
    assert seen == {"127.0.0.1": 200}


def test_a_port_in_use_on_one_of_the_addresses_fails_the_whole(resolves_to: Callable[..., None]) -> None:
    resolves_to(V6, V4)
    port = port_free_on_both()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", port))
        taken.listen()
        with pytest.raises(server.ListenError, match="in use") as failed:
            serve_and_scrape(NAME, port, [])  # a stop, should it serve after all
    assert not failed.value.bad_input
    assert_not_listening(socket.AF_INET6, "::1", port)  # the server already started there was closed


def test_no_address_of_the_box_at_all_is_the_error_of_the_first(resolves_to: Callable[..., None]) -> None:
    resolves_to(NOT_HERE)
    with pytest.raises(server.ListenError) as failed:
        serve_and_scrape(NAME, 9400, [])  # a stop, should it serve after all
    assert os.strerror(errno.EADDRNOTAVAIL) in failed.value.message


def test_the_ipv6_wildcard_alone_takes_ipv4_scrapes_too(resolves_to: Callable[..., None]) -> None:
    # "[::]:9400" listened on IPv4 as well, where the box lets an IPv6 socket do so; only beside
    # an IPv4 server on the same port is an IPv6 one kept to its own family.
    try:
        dual = Path("/proc/sys/net/ipv6/bindv6only").read_text().strip() == "0"
    except OSError:
        dual = False
    if not dual:
        pytest.skip("IPv6 sockets here take IPv6 alone")
    port = port_free_on_both()
    _, seen = serve_and_scrape("::", port, ["127.0.0.1", "::1"])
    assert seen == {"127.0.0.1": 200, "::1": 200}


def link_local_address() -> str | None:
    """An IPv6 link-local address of this box with its interface ("fe80::1%eth0"), or None."""
    try:
        lines = Path("/proc/net/if_inet6").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        hex_address, _, _, scope, _, name = line.split()
        if int(scope, 16) == 0x20:
            packed = bytes.fromhex(hex_address)
            return f"{socket.inet_ntop(socket.AF_INET6, packed)}%{name}"
    return None


def test_an_ipv6_link_local_address_is_served_on_its_interface() -> None:
    host = link_local_address()
    if host is None:
        pytest.skip("no IPv6 link-local address here")
    with socket.socket(socket.AF_INET6) as probe:
        probe.bind(socket.getaddrinfo(host, 0, socket.AF_INET6, socket.SOCK_STREAM)[0][4])  # with its scope
        port = int(probe.getsockname()[1])
    seen: list[bytes] = []

    def ready() -> None:
        with socket.create_connection((host, port), timeout=30) as scrape:
            scrape.sendall(b"GET /metrics HTTP/1.0\r\n\r\n")
            seen.append(scrape.recv(64))
        os.kill(os.getpid(), signal.SIGTERM)

    server.serve(BoxCollector(SimulatedBackend(gpus=1, processes=0)), ListenAddress(host, port), ready)
    assert seen and seen[0].startswith(b"HTTP/1.0 200"), seen


def test_an_ipv6_address_is_skipped_on_a_box_without_ipv6(
    resolves_to: Callable[..., None], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Booted with IPv6 off, the box cannot open an IPv6 socket at all: "localhost" (::1 and
    # 127.0.0.1) is served on 127.0.0.1, as it was when the first address alone was served.
    resolves_to(V4, V6)
    real = socket.socket

    def no_ipv6(family: int = socket.AF_INET, *args: Any, **kwargs: Any) -> socket.socket:
        if family == socket.AF_INET6:
            raise OSError(errno.EAFNOSUPPORT, os.strerror(errno.EAFNOSUPPORT))
        return real(family, *args, **kwargs)

    port = port_free_on_both()
    monkeypatch.setattr(socket, "socket", no_ipv6)
    _, seen = serve_and_scrape(NAME, port, ["127.0.0.1"])
    assert seen == {"127.0.0.1": 200}
