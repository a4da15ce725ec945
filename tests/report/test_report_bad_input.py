"""Bad input is one line on stderr and exit 2, checked before the ledger is read; no ledger yet
is one line and exit 1 (with --json, an envelope whose data is null); neither is a traceback."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from gpubox.cli.report import NO_LEDGER
from gpubox.ledger.store import LedgerStore
from tests.report.conftest import SINCE, UNTIL, Box, one_line_error

BAD = [
    ("unknown-by", ("--by", "team"), "--by must be one of gpu, job, kind, tag, user, not 'team'"),
    ("since-after-until", ("--since", UNTIL, "--until", SINCE), "must be earlier than --until"),
    ("since-equals-until", ("--since", "now", "--until", "now"), "must be earlier than --until"),
    ("since-in-the-future", ("--since", "2999-01-01"), "must be earlier than --until"),
    ("unparsable-since", ("--since", "last tuesday"), "invalid --since 'last tuesday': expected a time ago"),
    ("unparsable-until", ("--until", "2026-13-45"), "invalid --until '2026-13-45'"),
    ("negative-duration", ("--since", "-7d"), "invalid --since '-7d'"),
    ("json-and-csv", ("--json", "--csv"), "--json and --csv cannot be used together"),
    (
        "negative-price",
        ("--price-per-gpu-hour", "-1"),
        "--price-per-gpu-hour must be a price from 0 to 1000000000, not -1",
    ),
    ("nan-price", ("--price-per-kwh", "nan"), "--price-per-kwh must be a price from 0 to 1000000000, not nan"),
    ("huge-price", ("--price-per-gpu-hour", "1e308"), "--price-per-gpu-hour must be a price from 0 to 1000000000"),
    ("bare-number-since", ("--since", "1700002800"), "invalid --since '1700002800': give a unit"),
    ("price-not-a-number", ("--price-per-kwh", "cheap"), "'cheap' is not a valid float"),
    ("tag-with-other-by", ("--by", "job", "--tag", "team"), "--tag KEY groups --by tag"),
    ("tag-key-with-value", ("--tag", "team=vision"), "invalid --tag 'team=vision': expected a tag key"),
    ("unknown-option", ("--group", "job"), "No such option: --group"),
    ("bad-config-price", (), "report.gpu_hour_price: must be a price from 0 to 1000000000, got '-3'"),
]

BAD_SETTINGS = [
    ("huge", {"GPUBOX_REPORT_GPU_HOUR_PRICE": "1e12"}, "report.gpu_hour_price: must be a price from 0 to 1000000000"),
    ("not-a-number", {"GPUBOX_REPORT_KWH_PRICE": "abc"}, "report.kwh_price: expected a price, got 'abc'"),
]


@pytest.mark.parametrize(("args", "message"), [b[1:] for b in BAD], ids=[b[0] for b in BAD])
@pytest.mark.parametrize("ledger", [True, False], ids=["ledger", "no-ledger"])
def test_bad_input_is_one_line_and_exit_2(box: Box, args: tuple[str, ...], message: str, ledger: bool) -> None:
    if ledger:
        box.record()
    env = {"GPUBOX_REPORT_GPU_HOUR_PRICE": "-3"} if not args else None
    result = box.report(*args, env=env)
    line = one_line_error(result, 2)
    assert message in line, line
    assert result.stdout == "" or "--json" in args


@pytest.mark.parametrize(("env", "message"), [b[1:] for b in BAD_SETTINGS], ids=[b[0] for b in BAD_SETTINGS])
def test_a_bad_price_setting_is_one_line_and_exit_2(recorded: Box, env: dict[str, str], message: str) -> None:
    line = one_line_error(recorded.report(env=env), 2)
    assert message in line, line


def test_bad_input_with_json_still_gets_an_envelope(recorded: Box) -> None:
    result = recorded.report("--json", "--by", "team")
    assert result.returncode == 2
    doc = json.loads(result.stdout)
    assert (doc["command"], doc["ok"], doc["exit_code"], doc["data"]) == ("report", False, 2, None)
    assert doc["errors"] == ["--by must be one of gpu, job, kind, tag, user, not 'team'"]


@pytest.fixture
def gpus(tmp_path: Path) -> dict[str, str]:
    """An environment in which NVML answers, with one GPU (the fake NVML)."""
    from tests.fake_nvml import scenarios
    from tests.fake_nvml.build import fake_nvml_env

    box = scenarios.hopper(gpus=1, processes=0)
    return fake_nvml_env(box.write(tmp_path / "box.txt"), box.library_variant, base={})


def test_no_ledger_yet_is_one_line_and_exit_1(box: Box, gpus: dict[str, str]) -> None:
    assert one_line_error(box.report(env=gpus), 1) == f"gpubox: {NO_LEDGER}"
    assert one_line_error(box.report("--csv", env=gpus), 1) == f"gpubox: {NO_LEDGER}"
    assert not (box.state_dir / "ledger.db").exists()  # a report never creates the ledger


def test_a_ledger_with_nothing_written_yet_is_no_ledger_yet(box: Box, gpus: dict[str, str]) -> None:
    # The daemon makes the ledger when it starts and writes it once a minute: until then, nothing
    # is recorded, as the README's exit codes say, and a script is not handed a report of zeros.
    LedgerStore(box.state_dir / "ledger.db").close()
    assert one_line_error(box.report(env=gpus), 1) == f"gpubox: {NO_LEDGER}"
    result = box.report("--json", env=gpus)
    assert result.returncode == 1
    doc = json.loads(result.stdout)
    assert (doc["ok"], doc["exit_code"], doc["data"], doc["errors"]) == (False, 1, None, [NO_LEDGER])


def test_no_ledger_on_a_box_where_nvml_cannot_start_says_so(box: Box, tmp_path: Path) -> None:
    """Not "the daemon records it while it runs": it runs, and has no GPU to record."""
    from tests.fake_nvml import scenarios
    from tests.fake_nvml.build import fake_nvml_env

    unloaded = dataclasses.replace(scenarios.hopper(gpus=1, processes=0), init_error="driver_not_loaded")
    broken = fake_nvml_env(unloaded.write(tmp_path / "unloaded.txt"), unloaded.library_variant, base={})
    line = one_line_error(box.report(env=broken), 3)
    assert line == "gpubox: no GPU use recorded: NVML cannot start here (the NVIDIA kernel driver is not loaded)"
    assert not (box.state_dir / "ledger.db").exists()


def test_no_ledger_yet_with_json_is_an_envelope_with_null_data(box: Box, gpus: dict[str, str]) -> None:
    result = box.report("--json", env=gpus)
    assert result.returncode == 1
    doc = json.loads(result.stdout)
    assert (doc["schema"], doc["command"], doc["ok"], doc["exit_code"], doc["data"]) == (1, "report", False, 1, None)
    assert doc["errors"] == [NO_LEDGER]


def test_a_damaged_ledger_is_one_line_and_exit_1(box: Box) -> None:
    box.state_dir.mkdir(parents=True)
    (box.state_dir / "ledger.db").write_bytes(b"this is not an SQLite database" * 100)
    line = one_line_error(box.report(), 1)
    assert "ledger" in line and "Traceback" not in line


def test_a_ledger_that_cannot_be_looked_for_is_one_line_and_exit_1(box: Box, tmp_path: Path) -> None:
    # A name too long stands for any state directory the system will not look into (another
    # user's, mode 700): Path.exists() raises rather than say False, and that is no traceback.
    state = tmp_path / ("s" * 300)
    for args in ((), ("--json",)):
        result = box.report(*args, env={"GPUBOX_STATE_DIR": str(state)})
        line = one_line_error(result, 1)
        assert line.startswith("gpubox: cannot open the ledger ") and "File name too long" in line, line
    assert json.loads(result.stdout)["errors"] == [line.removeprefix("gpubox: ")]
