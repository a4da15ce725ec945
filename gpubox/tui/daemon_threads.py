"""An executor whose threads never keep the process alive.

Textual runs thread workers on the event loop's default executor, whose threads Python joins at
exit. A driver call that never returns (a GPU falling off the bus can do that) would then keep
`gpubox top` running after q; on a daemon thread it cannot.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar

_T = TypeVar("_T")


class DaemonThreadExecutor(ThreadPoolExecutor):
    """One daemon thread per call; asyncio only accepts a ThreadPoolExecutor as its default."""

    def submit(self, fn: Callable[..., _T], /, *args: Any, **kwargs: Any) -> Future[_T]:
        future: Future[_T] = Future()

        def run() -> None:
            if not future.set_running_or_notify_cancel():
                return
            try:
                result = fn(*args, **kwargs)
            except BaseException as exc:
                future.set_exception(exc)
            else:
                future.set_result(result)

        threading.Thread(target=run, name="gpubox-worker", daemon=True).start()
        return future

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Nothing to join: a call still running is left to die with the process."""
