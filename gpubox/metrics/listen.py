"""The address `gpubox metrics serve` listens on: HOST:PORT, [IPv6]:PORT, or :PORT for every interface."""

from __future__ import annotations

from dataclasses import dataclass

from gpubox.digits import ascii_int

DEFAULT_LISTEN = "127.0.0.1:9400"  # this box only; DCGM's exporter defaults to 9400 too: move one to run both


@dataclass(frozen=True)
class ListenAddress:
    host: str
    port: int

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"

    @property
    def url(self) -> str:
        return f"http://{self}/metrics"


def parse_listen(text: str) -> ListenAddress:
    """The address in `text`; ValueError with one line saying what is wrong with it."""
    text = text.strip()
    example = "give HOST:PORT, like 127.0.0.1:9400"
    if "://" in text or "/" in text:
        raise ValueError(f"--listen {text!r} is a URL, not an address ({example}; the path is always /metrics)")
    if text.startswith("["):
        host, bracket, rest = text[1:].partition("]")
        if not bracket or not host:
            raise ValueError(f"--listen {text!r} is not an address ({example}, or [::1]:9400)")
        sep, port_text = rest[:1], rest[1:]
    else:
        host, sep, port_text = text.rpartition(":")
        if ":" in host:
            raise ValueError(f"--listen {text!r}: put an IPv6 address in brackets, like [::1]:9400")
    if sep != ":" or not port_text:
        raise ValueError(f"--listen {text!r} has no port ({example})")
    port = ascii_int(port_text)
    if port is None:
        raise ValueError(f"--listen {text!r}: {port_text!r} is not a port number ({example})")
    if not 1 <= port <= 65535:
        raise ValueError(f"--listen {text!r}: port {port} is out of range (1-65535)")
    return ListenAddress(host or "0.0.0.0", port)
