"""Queue option parsers: exact results for good values, one clear ValueError for bad ones."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from gpubox.queue.parse import (
    parse_duration,
    parse_env,
    parse_ids,
    parse_kind,
    parse_size,
    parse_tag,
)

GIB = 1 << 30
MIB = 1 << 20


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("90s", 90.0),
        ("15m", 900.0),
        ("2h", 7200.0),
        ("1h30m", 5400.0),
        ("7d", 604800.0),
        ("45", 45.0),
        ("1.5h", 5400.0),
        ("1d2h3m4s", 93784.0),
        ("0.5", 0.5),
        (" 2H ", 7200.0),
    ],
)
def test_parse_duration(text: str, expected: float) -> None:
    assert parse_duration(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("40G", 40 * GIB),
        ("40GiB", 40 * GIB),
        ("40GB", 40 * GIB),
        ("512M", 512 * MIB),
        ("512MiB", 512 * MIB),
        ("1.5G", 1536 * MIB),
        ("1000000", 1000000),
        ("4K", 4096),
        ("2T", 2 << 40),
        ("40g", 40 * GIB),
        ("100B", 100),
    ],
)
def test_parse_size(text: str, expected: int) -> None:
    assert parse_size(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("team=vision", ("team", "vision")),
        ("cost.center=a=b", ("cost.center", "a=b")),
        ("run-id_2=x y", ("run-id_2", "x y")),
    ],
)
def test_parse_tag(text: str, expected: tuple[str, str]) -> None:
    assert parse_tag(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("K=V", ("K", "V")),
        ("_X1=", ("_X1", "")),
        ("PATH=/a:/b=c", ("PATH", "/a:/b=c")),
    ],
)
def test_parse_env(text: str, expected: tuple[str, str]) -> None:
    assert parse_env(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("3,5, 8", (3, 5, 8)),
        ("12", (12,)),
        (" 7 , 1 ", (7, 1)),
    ],
)
def test_parse_ids(text: str, expected: tuple[int, ...]) -> None:
    assert parse_ids(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("infer", "infer"),
        ("QUANTIZE", "quantize"),
        ("Train", "train"),
        ("batch", "batch"),
        ("other", "other"),
    ],
)
def test_parse_kind(text: str, expected: str) -> None:
    assert parse_kind(text) == expected


INVALID: list[tuple[Callable[[str], Any], str]] = [
    (parse_duration, ""),
    (parse_duration, "-3h"),
    (parse_duration, "2x"),
    (parse_duration, "h"),
    (parse_duration, "1.5.2h"),
    (parse_duration, "nan"),
    (parse_duration, "inf"),
    (parse_duration, "0"),
    (parse_duration, "0h0m"),
    (parse_duration, "30m1h"),
    (parse_duration, "1h 30m"),
    (parse_duration, "\u0661h"),  # an Arabic-Indic 1: \d and float() take it
    (parse_duration, "\u0661"),
    (parse_size, ""),
    (parse_size, "G"),
    (parse_size, "-3"),
    (parse_size, "-3G"),
    (parse_size, "nan"),
    (parse_size, "3Q"),
    (parse_size, "0"),
    (parse_size, "0G"),
    (parse_size, "1.5.2G"),
    (parse_size, "inf"),
    (parse_size, "\u0664G"),
    (parse_tag, "team"),
    (parse_tag, "=vision"),
    (parse_tag, "team="),
    (parse_tag, "te am=x"),
    (parse_tag, ""),
    (parse_env, "K"),
    (parse_env, "=V"),
    (parse_env, "1K=V"),
    (parse_env, "A-B=V"),
    (parse_ids, ""),
    (parse_ids, "0"),
    (parse_ids, "-1"),
    (parse_ids, "3,,5"),
    (parse_ids, "3,x"),
    (parse_ids, "3,5,3"),
    (parse_ids, "1.5"),
    (parse_ids, "\u0661"),
    (parse_kind, "inference"),
    (parse_kind, ""),
    (parse_kind, "gpu"),
]


@pytest.mark.parametrize(
    ("parser", "text"),
    INVALID,
    ids=[f"{parser.__name__}-{text!r}" for parser, text in INVALID],
)
def test_invalid_values_raise_naming_the_value(parser: Callable[[str], Any], text: str) -> None:
    with pytest.raises(ValueError) as caught:
        parser(text)
    assert repr(text) in str(caught.value)


def test_kind_message_lists_the_kinds() -> None:
    with pytest.raises(ValueError, match="infer, quantize, train, batch, other"):
        parse_kind("gpu")


def test_a_job_file_line_that_is_a_json_list_is_refused_and_a_test_command_is_not() -> None:
    from gpubox.queue.submit import AddOptions, parse_job_file

    ((_, argv, _),) = parse_job_file("[ -f done ] || ./run.sh\n", "jobs.txt", AddOptions())
    assert argv == ["[", "-f", "done", "]", "||", "./run.sh"]  # a shell line: `[` is test(1)
    with pytest.raises(ValueError, match=r"^jobs.txt:2: a JSON list is not a job"):
        parse_job_file('true\n["python", "x.py"]\n', "jobs.txt", AddOptions())
    with pytest.raises(ValueError, match=r"^jobs.txt:1: a JSON list is not a job"):
        parse_job_file('["python", "x.py"]  # train\n', "jobs.txt", AddOptions())


def test_a_job_file_line_that_says_which_gpus_replaces_the_command_lines_request() -> None:
    """Command-line options are defaults for every line: a line's own GPU count or GPUs is that
    line's request, not a second one that disagrees with the default."""
    from gpubox.queue.gpus import GpuInfo
    from gpubox.queue.submit import AddOptions, build_spec, parse_job_file

    box = [GpuInfo(i, f"GPU-{i}", 80 * GIB, 0) for i in range(2)]

    def spec(line: str, defaults: AddOptions) -> tuple[int | None, tuple[str, ...] | None, int | None]:
        ((_, argv, opts),) = parse_job_file(line + "\n", "jobs.txt", defaults)
        s = build_spec(argv, opts, {}, "/", lambda: box)
        return s.gpus, s.gpu_ids, s.gpu_mem_bytes

    assert spec('{"cmd": "t", "gpu": "1"}', AddOptions(gpus=0)) == (None, ("GPU-1",), None)
    assert spec('{"cmd": "t", "gpu": "1"}', AddOptions(gpus=2)) == (None, ("GPU-1",), None)
    assert spec('{"cmd": "t", "gpus": 2}', AddOptions(gpu="0")) == (2, None, None)
    assert spec('{"cmd": "t", "gpus": 0}', AddOptions(gpu="0", gpu_mem="10G")) == (0, None, None)
    assert spec('{"cmd": "t", "gpu_mem": "10G"}', AddOptions(gpus=0)) == (None, None, 10 * GIB)
    # What the line does not say stays the command line's.
    assert spec('{"cmd": "t", "gpu": "1"}', AddOptions(gpu_mem="10G")) == (None, ("GPU-1",), 10 * GIB)
    assert spec('{"cmd": "t", "gpus": 2}', AddOptions(gpu_mem="10G")) == (2, None, 10 * GIB)
    assert spec('{"cmd": "t"}', AddOptions(gpus=0)) == (0, None, None)
    with pytest.raises(ValueError, match="disagree"):  # within one line, still refused
        spec('{"cmd": "t", "gpus": 2, "gpu": "1"}', AddOptions())
