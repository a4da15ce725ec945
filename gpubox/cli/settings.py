"""What a command reads of its settings: its folders and its config, each after the one warning
of GPUBOX_* variables gpubox does not know. Without Typer: the plain `queue add` reads them too."""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Mapping

TYPE_CHECKING = False  # typing's import (4 ms) is not needed at run time
if TYPE_CHECKING:
    from typing import Any

    from gpubox.config import Config
    from gpubox.paths import Paths


@functools.cache  # once per command, however often it reads its settings
def warn_unknown_variables() -> None:
    """Say on stderr which GPUBOX_* variables gpubox does not know (a misspelt one is ignored)."""
    from gpubox.env_vars import unknown_variables

    for warning in unknown_variables(os.environ):
        from gpubox.format import one_line

        sys.stderr.write(f"gpubox: warning: {one_line(warning)}\n")


def settings_paths() -> Paths:
    """This command's folders, from the environment."""
    from gpubox.paths import resolve_paths

    warn_unknown_variables()
    return resolve_paths()


def load_settings(flags: Mapping[str, Any] | None = None) -> Config:
    """This command's settings: `flags`, then the environment, then the config files."""
    from gpubox.config import load_config

    warn_unknown_variables()
    return load_config(flags)
