"""Supervisors kept forked ahead for the daemon, from the spawner (zygote.py).

Spares are asked for without waiting and collected when the spawner replies, through the
daemon's own selector (the socket is registered with the data "spawner"). A spawner that died
is noticed (its socket reads EOF) and started again on the next request.
"""

from __future__ import annotations

import selectors
import socket
from contextlib import suppress

from gpubox.queue import supervise
from gpubox.queue.spawner import Spawner


class SparePool:
    def __init__(
        self, done_w: int, selector: selectors.BaseSelector, size: int, spawner: Spawner | None = None
    ) -> None:
        """`spawner`: one started already on `done_w` (spawner.EarlyStart), or None to start one."""
        self.spawner = spawner if spawner is not None else Spawner(done_w)
        self.selector = selector
        self.size = size
        self.ready: list[supervise.Spare] = []
        self._watched: socket.socket | None = None

    def _watch(self) -> None:
        """Keep the selector on the spawner's current socket (a new one after a restart), and
        on no closed one."""
        current = self.spawner.control
        if self._watched is current:
            return
        if self._watched is not None:
            with suppress(KeyError, ValueError):
                self.selector.unregister(self._watched)
        if current is not None:
            self.selector.register(current, selectors.EVENT_READ, "spawner")
        self._watched = current

    def warm(self) -> None:
        """Start the spawner now, without asking for a spare: a Python takes a while to start."""
        if self.spawner.proc is None:
            self.spawner.start()
        self._watch()

    def _ask(self) -> None:
        try:
            self.spawner.ask()  # starts the spawner, or a new one when it died
        finally:
            self._watch()

    def take(self) -> supervise.Spare:
        """A spare now: a ready one, the one asked for already, or a new one (OSError if none)."""
        if self.ready:
            return self.ready.pop(0)
        if not self.spawner.asked:
            self._ask()
        try:
            return self.spawner.receive()
        finally:
            self._watch()

    def take_ready(self) -> supervise.Spare | None:
        """A spare forked already, or None (without asking for one or waiting)."""
        return self.ready.pop(0) if self.ready else None

    def give_back(self, spare: supervise.Spare) -> None:
        """A supervisor whose job ended, for another job (`keep` sends away those not needed)."""
        self.ready.append(spare)

    def on_readable(self, wanted: bool) -> None:
        """The spawner has something to say: a spare (kept while wanted), or EOF (it died)."""
        try:
            if not self.spawner.asked:
                self.spawner.close()  # readable with nothing asked: it ended; reap it
                return
            spare = self.spawner.receive(timeout=0)
        except (OSError, TimeoutError):
            return
        finally:
            self._watch()
        if wanted:
            self.ready.append(spare)
        else:
            supervise.discard(spare)

    def keep(self, wanted: bool, ahead: int = 0) -> None:
        """While jobs wait, keep `size` spares ready or asked for (`ahead` more this once: the next
        call sends them away if still unused); none while the queue is empty. OSError when the
        spawner cannot be asked."""
        while wanted and len(self.ready) + self.spawner.asked < self.size + ahead:
            self._ask()
        while self.ready and (not wanted or len(self.ready) > self.size):
            supervise.discard(self.ready.pop(0))

    def close(self) -> None:
        for spare in self.ready:
            supervise.discard(spare)
        self.ready = []
        self.spawner.close()
        self._watch()
