"""Serving /metrics over HTTP with prometheus_client's WSGI app, in the foreground until SIGINT, SIGTERM or SIGHUP."""

from __future__ import annotations

import errno
import os
import select
import signal
import socket
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer

from prometheus_client import make_wsgi_app

from gpubox.metrics.exposition import BoxCollector, registry_of
from gpubox.metrics.listen import ListenAddress

# SIGHUP too (a closed terminal, a reload): a clean stop, as `gpubox daemon` takes it.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
METRICS_PATH = "/metrics"
CLIENT_TIMEOUT_S = 30.0  # a client that sends no request, or reads no answer, for this long is let go


class _ScrapeHandler(WSGIRequestHandler):
    timeout = CLIENT_TIMEOUT_S  # else a connection that never sends a request holds its thread for good

    def log_message(self, format: str, *args: Any) -> None:
        pass  # no line per scrape


class _ScrapeServer(ThreadingMixIn, WSGIServer):
    daemon_threads = True  # a scrape in progress does not hold up the stop

    def handle_error(self, request: Any, client_address: Any) -> None:
        if not isinstance(sys.exc_info()[1], OSError):  # a client that reset or timed out is its own business
            super().handle_error(request, client_address)


def only_metrics_path(app: Any) -> Any:
    """The WSGI app at /metrics alone: elsewhere (a typo in a scrape config, a browser at /) a 404,
    rather than a scrape that also takes a snapshot and so shortens the next scrape's rates."""

    def route(environ: dict[str, Any], start_response: Any) -> Any:
        if environ.get("PATH_INFO") == METRICS_PATH:
            return app(environ, start_response)
        start_response("404 Not Found", [("Content-Type", "text/plain; charset=utf-8")])
        return [f"gpubox: no such page; the metrics are at {METRICS_PATH}\n".encode()]

    return route


# An address this box does not have, or of a family it does not have at all (IPv6 off at boot):
# skipped while another address of the name is served.
_NOT_HERE = frozenset({errno.EADDRNOTAVAIL, errno.EAFNOSUPPORT})


def _start_servers(address: ListenAddress, app: Any) -> list[tuple[WSGIServer, threading.Thread]]:
    """A server on every address the host names ("localhost" is often ::1 and 127.0.0.1: on the
    first alone, a scrape of the other was refused). One the box does not have is skipped while
    another is served; anything else, a port in use above all, fails the whole."""
    infos = socket.getaddrinfo(address.host, address.port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    # the whole address: an IPv6 link-local one needs its scope (the interface) to be bound
    addresses = list(dict.fromkeys((family, sockaddr) for family, _, _, _, sockaddr in infos))
    # An IPv6 server takes IPv4 too where the box allows it ("[::]:9400" always did): its own
    # family only where an IPv4 server shares the port.
    v6_only = any(family == socket.AF_INET for family, _ in addresses)
    servers: list[tuple[WSGIServer, threading.Thread]] = []
    missing: OSError | None = None
    try:
        for family, sockaddr in addresses:
            try:
                servers.append(_start_server(family, (sockaddr[0], address.port, *sockaddr[2:]), app, v6_only))
            except OSError as exc:
                if exc.errno not in _NOT_HERE:
                    raise
                missing = missing or exc
        if not servers:
            raise missing or OSError(errno.EADDRNOTAVAIL, os.strerror(errno.EADDRNOTAVAIL))
    except BaseException:
        _stop_servers(servers)
        raise
    return servers


def _start_server(family: int, sockaddr: Any, app: Any, v6_only: bool) -> tuple[WSGIServer, threading.Thread]:
    class Server(_ScrapeServer):
        address_family = family

        def server_bind(self) -> None:
            if family == socket.AF_INET6 and v6_only:  # beside an IPv4 server on the port
                self.socket.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            super().server_bind()

    server = Server(sockaddr, _ScrapeHandler)  # as make_server, with the scope of a link-local address
    server.set_app(app)
    thread = threading.Thread(target=server.serve_forever, name="gpubox-metrics-http", daemon=True)
    thread.start()
    return server, thread


def _stop_servers(servers: list[tuple[WSGIServer, threading.Thread]]) -> None:
    for server, thread in servers:
        server.shutdown()
        server.server_close()
        thread.join()


class ListenError(Exception):
    """The server cannot listen; `bad_input` when the address itself is wrong (no such host)."""

    def __init__(self, message: str, bad_input: bool) -> None:
        super().__init__(message)
        self.message = message
        self.bad_input = bad_input


@contextmanager
def stop_signals() -> Iterator[Callable[[], int]]:
    """While inside, SIGINT and SIGTERM end nothing by themselves: the function yielded waits for one.

    The signal may land on any thread (the server's among them), so it is waited for through
    Python's wakeup file descriptor rather than in a handler the main thread may not run in time.
    """
    reader, writer = socket.socketpair()
    writer.setblocking(False)
    previous_fd = signal.set_wakeup_fd(writer.fileno(), warn_on_full_buffer=False)
    previous = {sig: signal.signal(sig, lambda *_: None) for sig in STOP_SIGNALS}

    def wait() -> int:
        while True:
            select.select([reader], [], [])
            for number in reader.recv(64):
                if number in STOP_SIGNALS:
                    return number

    try:
        yield wait
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        signal.set_wakeup_fd(previous_fd)
        reader.close()
        writer.close()


def serve(collector: BoxCollector, address: ListenAddress, ready: Callable[[], object] = lambda: None) -> int:
    """Serve the collector's scrapes on `address` until SIGINT, SIGTERM or SIGHUP; return that signal.
    Raises ListenError when the address cannot be listened on. Call from the main thread."""
    with stop_signals() as wait:
        try:
            servers = _start_servers(address, only_metrics_path(make_wsgi_app(registry_of(collector))))
        except socket.gaierror as exc:
            raise ListenError(f"cannot listen on {address}: no such host ({exc.strerror})", bad_input=True) from None
        except ValueError as exc:  # a host name that cannot be encoded, or holds a NUL
            raise ListenError(f"cannot listen on {address}: not a host name ({exc})", bad_input=True) from None
        except OSError as exc:
            raise ListenError(f"cannot listen on {address}: {exc.strerror or exc}", bad_input=False) from None
        try:
            ready()
            return wait()
        finally:
            _stop_servers(servers)
