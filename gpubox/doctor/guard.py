"""Run one group of checks with a time limit, so that a hung driver call or a slow filesystem
costs the doctor that group and not the whole report."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TypeVar

from gpubox.doctor.model import Check

T = TypeVar("T")


class TimedOut(Exception):
    """The work did not finish in time (it goes on in a daemon thread that nobody waits for)."""


def within(seconds: float, work: Callable[[], T]) -> T:
    """`work()`'s result, or TimedOut after `seconds`; its exception, if it raised one."""
    result: list[T] = []
    error: list[BaseException] = []

    def target() -> None:
        try:
            result.append(work())
        except BaseException as exc:  # handed to the caller's thread below
            error.append(exc)

    # A daemon thread: a call stuck in the driver must not keep the process from exiting.
    thread = threading.Thread(target=target, name="gpubox-doctor-check", daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        raise TimedOut(f"did not finish within {seconds:g} s")
    if error:
        raise error[0]
    return result[0]


def guarded(group: str, title: str, category: str, seconds: float, work: Callable[[], list[Check]]) -> list[Check]:
    """The checks `work` makes, or one warning that says why there are none: it timed out, or it
    failed with an error (a bug or a system that answers in a way nobody expected)."""
    try:
        return within(seconds, work)
    except TimedOut as exc:
        detail = f"{title}: {exc}"
        meaning = "Something it reads did not answer in time: a hung driver call, a stalled mount."
    except Exception as exc:
        detail = f"{title}: stopped by an error: {type(exc).__name__}: {exc}"
        meaning = "The check itself failed, so what it looks at is unknown."
    return [
        Check(
            id=f"{group}.error",
            title=title,
            category=category,
            status="warn",
            detail=detail,
            meaning=meaning,
            fix="Run `gpubox doctor` again; if it repeats, run the same group alone with --only to see it.",
            impact=0.05,
        )
    ]
