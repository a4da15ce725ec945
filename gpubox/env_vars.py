"""The GPUBOX_* environment variables gpubox knows, and a warning for any other.

A misspelt one would be ignored without a word, and the queue or the settings would go where
the user did not mean. It is not an error: the variable may belong to a newer gpubox.
"""

from __future__ import annotations

from collections.abc import Mapping

PREFIX = "GPUBOX_"

# Every GPUBOX_* name gpubox reads or sets besides the settings, whose names come from
# gpubox/config.py (the setting "top.interval" is GPUBOX_TOP_INTERVAL). A test fails when the
# source names one that is missing here.
OWN_VARIABLES = frozenset(
    {
        # the folders (gpubox/paths.py)
        "GPUBOX_STATE_DIR",
        "GPUBOX_RUNTIME_DIR",
        "GPUBOX_SYSTEM_CONFIG",
        # set in every queued job's environment (gpubox/queue/supervise.py)
        "GPUBOX_JOB_ID",
        "GPUBOX_JOB_KIND",
        "GPUBOX_JOB_ATTEMPT",
        "GPUBOX_JOB_LOG",
        # the boot the daemon takes itself to run in, which tests set (gpubox/queue/daemon.py)
        "GPUBOX_BOOT_ID",
        # read by scripts/test.sh and examples/cron/gpu-snapshot.sh, which run gpubox with them set
        "GPUBOX_VENV",
        "GPUBOX_SNAPSHOT_DIR",
    }
)


def known_variables() -> frozenset[str]:
    from gpubox.config import SCHEMA, env_name

    return OWN_VARIABLES | {env_name(key) for key in SCHEMA}


def unknown_variables(env: Mapping[str, str]) -> list[str]:
    """One warning for each GPUBOX_* variable in `env` that gpubox does not know, naming the known
    one it is close to, if any."""
    names = sorted(name for name in env if name.startswith(PREFIX) and name not in OWN_VARIABLES)
    if not names:
        return []  # the usual case: nothing more imported
    known = known_variables()
    unknown = [name for name in names if name not in known]
    if not unknown:
        return []
    import difflib

    # Compared without the prefix, which every name shares and would make any two look close.
    by_suffix = {name.removeprefix(PREFIX): name for name in sorted(known)}
    warnings = []
    for name in unknown:
        close = difflib.get_close_matches(name.removeprefix(PREFIX).upper(), by_suffix, n=1)
        hint = f" (did you mean {by_suffix[close[0]]}?)" if close else ""
        warnings.append(f"{name} is not a gpubox variable{hint}")
    return warnings
