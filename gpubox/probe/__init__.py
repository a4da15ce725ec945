"""The dataloader probe: how long a training process waits for its batches, published for
`gpubox top` in a small memory-mapped file (see layout.py).

    import gpubox.probe; gpubox.probe.install()

or, with no change to the program, `gpubox run python train.py`. It runs inside other people's
programs, so it imports no torch of its own (it hooks in when torch's DataLoader loads), does
nothing where torch is never used, and on any internal error says so once on stderr and turns
itself off.

Its modules, and gpubox.paths which they use, run on Python 3.8 and newer: the environments
jobs run in are often older than gpubox's own. They import one another relatively: `gpubox run`
loads this package under a name of its own, so that a program's own module named gpubox (or
another version of it) stays the program's.
"""

from __future__ import annotations

import sys

_installed = False
_disabled = False


def install() -> None:
    """Time every DataLoader batch this process asks for. Idempotent; never raises."""
    global _installed
    if _installed or _disabled:
        return
    _installed = True
    try:
        from . import hook

        hook.attach()
    except Exception as exc:
        disable(exc)


def disable(reason: BaseException | str) -> None:
    """Turn the probe off for good in this process, after one line on stderr."""
    global _disabled
    if _disabled:
        return
    _disabled = True
    from contextlib import suppress

    with suppress(Exception):  # a closed stderr must not become the host program's problem
        if isinstance(reason, BaseException):
            reason = f"{reason}" if isinstance(reason, OSError) else f"{type(reason).__name__}: {reason}"
        if sys.stderr is not None:
            sys.stderr.write(f"gpubox probe: disabled: {' '.join(reason.split())}\n")
            sys.stderr.flush()

    for name, off in (("hook", "detach"), ("recorder", "close")):
        module = sys.modules.get(f"{__name__}.{name}")
        if module is not None:
            with suppress(Exception):
                getattr(module, off)()
