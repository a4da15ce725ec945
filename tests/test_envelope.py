import json
from dataclasses import dataclass

from gpubox.envelope import SCHEMA_VERSION, dumps, envelope
from gpubox.exit_codes import ExitCode


@dataclass(frozen=True)
class _Thing:
    name: str
    values: tuple[float, ...]


def test_envelope_shape_and_nan_becomes_null() -> None:
    doc = envelope("top", _Thing("x", (1.0, float("nan"))), errors=["e"])
    parsed = json.loads(dumps(doc))
    assert parsed == {
        "schema": SCHEMA_VERSION,
        "command": "top",
        "ok": True,
        "exit_code": 0,
        "data": {"name": "x", "values": [1.0, None]},
        "errors": ["e"],
    }


def test_failure_envelope() -> None:
    doc = envelope("top", None, code=ExitCode.NO_GPU, errors=["no driver"])
    assert doc["ok"] is False and doc["exit_code"] == 3 and doc["data"] is None
