"""The versioned JSON envelope that every `--json` output is wrapped in."""

from __future__ import annotations

import dataclasses
import json
import math
from typing import Any

from gpubox.exit_codes import ExitCode

SCHEMA_VERSION = 1


def to_jsonable(value: Any) -> Any:
    """Turn dataclasses, tuples and mappings into plain JSON values; NaN/inf become null."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_jsonable(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def envelope(
    command: str,
    data: Any,
    *,
    code: int = ExitCode.OK,
    errors: list[str] | None = None,
) -> dict[str, Any]:
    """`code`: the command's exit code (one of ExitCode, or a job's own, as `queue wait` exits with)."""
    return {
        "schema": SCHEMA_VERSION,
        "command": command,
        "ok": code == ExitCode.OK,
        "exit_code": int(code),
        "data": to_jsonable(data),
        "errors": list(errors or []),
    }


def dumps(doc: dict[str, Any]) -> str:
    return json.dumps(doc, indent=2, sort_keys=False, allow_nan=False)
