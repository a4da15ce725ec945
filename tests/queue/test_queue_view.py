"""`queue ls` times: how long a job waited (from when it last joined the queue) and ran."""

from __future__ import annotations

import time
import unicodedata
from typing import Any

from gpubox.cli.queue_view import NAME_MAX, NAME_WIDTH, columns, job_table


def record(**fields: Any) -> dict[str, Any]:
    base = {"id": 1, "name": None, "kind": "other", "state": "queued", "attempt": 0, "reason": None}
    base.update({"submitted_at": 1000.0, "queued_at": 1000.0, "started_at": None, "ended_at": None})
    base.update({"exit_code": None, "gpus": []})
    return {**base, **fields}


def cells(rec: dict[str, Any], now: float) -> list[str]:
    return job_table([rec], {1: "cpu"}, now=now).splitlines()[1].split()


def test_a_queued_job_waits_from_its_submission() -> None:
    assert cells(record(), now=1090.0)[5:7] == ["1m30s", "-"]


def test_a_job_queued_again_waits_from_then_not_from_its_submission() -> None:
    # Ran from 1100 to 4700, failed, queued again at 4700: at 4760 it has waited a minute.
    again = record(attempt=1, queued_at=4700.0, reason="attempt 1 failed (exit code 1); retry 1 of 2")
    assert cells(again, now=4760.0)[5:7] == ["1m00s", "-"]


def test_a_running_job_waited_until_it_started() -> None:
    running = record(state="running", attempt=1, started_at=1030.0)
    assert cells(running, now=1100.0)[5:7] == ["30s", "1m10s"]


def test_a_record_without_queued_at_waits_from_its_submission() -> None:
    # A record from before jobs had queued_at (an older daemon's JSON, say).
    old = record()
    del old["queued_at"]
    assert cells(old, now=1090.0)[5:7] == ["1m30s", "-"]


def test_a_job_without_a_name_is_listed_by_the_start_of_its_command() -> None:
    table = job_table(
        [
            record(id=1, name="big", command="python train.py"),
            record(id=2, command="python serve.py --port 8000 --model /models/llama"),
            record(id=3, command="echo  two\tspaces"),
        ],
        {1: "1", 2: "1", 3: "cpu"},
        now=1000.0,
    )
    names = [line[4:30].rstrip() for line in table.splitlines()[1:]]
    assert names == ["big", "python serve.py --port …", "echo two spaces"]


def test_gpus_a_job_holds_are_named_never_counted() -> None:
    running = record(state="running", attempt=1, started_at=1000.0, gpus=[0, 1])
    assert cells(running, now=1000.0)[4] == "#0,1"
    assert cells(record(state="running", attempt=1, started_at=1000.0, gpus=["GPU-9f3a"]), now=1000.0)[4] == "GPU-9f3a"
    assert cells(record(state="running", attempt=1, started_at=1000.0), now=1000.0)[4] == "cpu"
    assert cells(record(), now=1000.0)[4] == "cpu"  # queued: what it asks for


def test_show_names_the_gpus_held_in_words() -> None:
    from gpubox.cli.queue_view import job_details

    rec = record(state="running", attempt=1, started_at=1000.0, gpus=[0], command="python train.py", shell=False)
    rec.update({"cwd": "/", "priority": 0, "after": [], "time_limit_s": None, "failures": 0, "retries": 0})
    rec.update({"probe": True, "tags": {}})
    attempts = [{"number": 1, "started_at": 1000.0, "ended_at": 1060.0, "gpus": [0, 1], "outcome": "failed"}]
    attempts[0].update({"exit_code": 1, "log_prefix": "/state/logs/1.1"})
    text = job_details(rec, attempts, "1")
    assert "asked 1; holds GPU 0" in text
    assert "ran 1m00s on GPUs 0,1;" in text
    rec.update({"state": "failed", "ended_at": 1060.0})  # an ended job no longer holds them
    assert "asked 1; held GPU 0" in job_details(rec, attempts, "1")


def test_gpu_use_says_when_the_ledger_has_not_caught_up_with_the_job() -> None:
    from gpubox.cli.queue_view import gpu_use

    usage = {"last_at": 1045.0, "busy_share": 0.5, "busy_gpu_hours": 0.00625, "energy_kwh": None, "attempts": 1}
    usage.update({"allocated_gpu_hours": 0.0125, "idle_allocated_gpu_hours": 0.00625, "starved_gpu_hours": None})
    stamp = time.strftime("%H:%M:%S", time.localtime(1045.0))
    ended = record(state="succeeded", attempt=1, started_at=1000.0, ended_at=1075.0)
    assert gpu_use(usage, ended).endswith(f"energy unknown (recorded up to {stamp})")
    assert gpu_use(usage, record(state="running", attempt=1, started_at=1000.0)).endswith(f"(recorded up to {stamp})")
    caught_up = record(state="succeeded", attempt=1, started_at=1000.0, ended_at=1045.5)
    assert gpu_use(usage, caught_up).endswith("energy unknown")


def test_columns_stay_aligned_with_wide_characters_and_a_long_command_is_cut_by_width() -> None:
    table = job_table(
        [
            record(id=1, name="训练模型", command="python train.py"),
            record(id=2, name="plain", command="true"),
            record(id=3, command="python 評価スクリプトを実行する.py --model 大きい"),
            record(id=4, name="cafe\u0301", command="true"),  # an e and a combining accent: four columns
        ],
        {1: "1", 2: "1", 3: "cpu", 4: "cpu"},
        now=1000.0,
    )
    lines = table.splitlines()
    # KIND starts at the same terminal column on every line: ID (2) and NAME (24, the cut
    # command) with two spaces after each.
    assert (
        {wide(line[: line.index("other")]) for line in lines[1:]} == {wide(lines[0][: lines[0].index("KIND")])} == {30}
    )
    cut = lines[3][4:].split("  ")[0]
    assert cut == "python 評価スクリプトを…" and wide(cut) == NAME_WIDTH


def test_a_decomposed_hangul_syllable_takes_the_columns_of_the_composed_one() -> None:
    composed = "학습"  # precomposed syllables, two columns each
    decomposed = unicodedata.normalize("NFD", composed)
    assert len(decomposed) == 6 and columns(decomposed) == columns(composed) == 4
    table = job_table(
        [record(id=1, name=composed, command="true"), record(id=2, name=decomposed, command="true")],
        {1: "cpu", 2: "cpu"},
        now=1000.0,
    )
    first, second = table.splitlines()[1:]
    # The same padding after either name: KIND starts at the same terminal column.
    assert first.index("other") - len(composed) == second.index("other") - len(decomposed)


def wide(text: str) -> int:
    """Terminal columns, for the characters these tests use: CJK takes two, a combining accent none."""
    return sum(2 if "\u3000" <= c <= "\u9fff" else 0 if c == "\u0301" else 1 for c in text)


def test_a_very_long_name_is_cut_so_it_does_not_widen_every_row() -> None:
    table = job_table(
        [record(id=1, name="n" * 5000, command="true"), record(id=2, name="short", command="true")],
        {1: "cpu", 2: "cpu"},
        now=1000.0,
    )
    lines = table.splitlines()
    assert lines[1].split()[1] == "n" * (NAME_MAX - 1) + "…"
    assert max(map(len, lines)) < 120
    assert len({line.index("other") for line in lines[1:]}) == 1  # still aligned
