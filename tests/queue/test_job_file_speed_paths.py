"""The shortcuts `queue add --file` takes for a large file give what the long way gives: plain
lines split as shlex splits them, one set of options worked out once for every line that
shares it, and the stored text of a spec the same as plain JSON with sorted keys."""

from __future__ import annotations

import json
import os
import random
import shlex
from pathlib import Path

import pytest

from gpubox.queue.gpus import GpuInfo
from gpubox.queue.jobs import JobSpec, spec_from_json, spec_to_json
from gpubox.queue.submit import AddOptions, SpecBuilder, build_spec, parse_job_file

GIB = 1 << 30
PIECES = [
    "a",
    "b c",
    "  ",
    "\t",
    "'q'",
    '"d q"',
    "\\ ",
    "#",
    "x#y",
    " #c",
    "é",
    "\u00a0",
    "\x01",
    "\x7f",
    "\u2003",
    ";|&",
    "$HOME",
    "*",
]


def test_every_line_splits_as_shlex_splits_it() -> None:
    """Whatever path a line takes (the plain one or shlex's), its words are shlex's, less the
    comment a shell would drop."""
    from gpubox.queue.submit import strip_comment

    rng = random.Random(7)
    for _ in range(4000):
        line = "".join(rng.choice(PIECES) for _ in range(rng.randrange(1, 6))).strip()
        if not line or line.startswith(("#", "{", "[")):
            continue
        try:
            expected = shlex.split(strip_comment(line))
        except ValueError:  # an open quote: refused either way
            with pytest.raises(ValueError):
                parse_job_file(line + "\n", "jobs.txt", AddOptions())
            continue
        if not expected:
            continue
        ((_, argv, _),) = parse_job_file(line + "\n", "jobs.txt", AddOptions())
        assert argv == expected, repr(line)


def test_a_builder_makes_what_build_spec_makes_line_by_line(tmp_path: Path) -> None:
    box = [GpuInfo(i, f"GPU-{i}", 80 * GIB, 0) for i in range(2)]
    text = "\n".join(
        [
            "python train.py --lr 3",
            '{"cmd": "echo hi", "gpus": 2, "name": "two"}',
            "python eval.py",
            '{"argv": ["b", "c"], "env": {"A": "1"}, "cwd": "sub"}',
            "sleep 1",
        ]
    )
    (tmp_path / "sub").mkdir()
    base_env = {"HOME": "/h", "PWD": str(tmp_path)}
    for defaults in (
        AddOptions(),
        AddOptions(gpus=1, gpu_mem="10G", time_limit="2h", tags=("team=a",)),
        AddOptions(shell=True),
    ):
        build = SpecBuilder(base_env, str(tmp_path), lambda: box)
        for _, argv, opts in parse_job_file(text, "jobs.txt", defaults):
            assert build(argv, opts) == build_spec(argv, opts, base_env, str(tmp_path), lambda: box)


def test_a_builder_says_what_build_spec_says() -> None:
    build = SpecBuilder({}, "/", lambda: [])
    with pytest.raises(ValueError, match="no command given"):
        build([], AddOptions())
    with pytest.raises(ValueError, match="no command given"):
        build(["  "], AddOptions())
    with pytest.raises(ValueError, match="does not exist"):
        build(["true"], AddOptions(cwd="/no/such/folder"))
    with pytest.raises(ValueError, match="this box has 0"):
        build(["true"], AddOptions(gpus=1))


def _plain_json(spec: JobSpec) -> str:
    return json.dumps(
        {
            "argv": list(spec.argv),
            "cwd": spec.cwd,
            "env": spec.env,
            "kind": spec.kind,
            "name": spec.name,
            "gpus": spec.gpus,
            "gpu_ids": None if spec.gpu_ids is None else list(spec.gpu_ids),
            "gpu_mem_bytes": spec.gpu_mem_bytes,
            "priority": spec.priority,
            "after": list(spec.after),
            "time_limit_s": spec.time_limit_s,
            "retries": spec.retries,
            "tags": spec.tags,
            "shell": spec.shell,
            "probe": spec.probe,
            "share": spec.share,
        },
        sort_keys=True,
    )


def test_a_spec_is_stored_as_plain_sorted_json() -> None:
    """The environment is encoded apart and set in its place: the text is still exactly the
    plain encoding (the store compares texts to tell an edited job), whatever the strings hold,
    and an environment changed in place is encoded anew."""
    weird = ["", "a", ', "gpu_ids": ', '"', "\\", "é\u2028", "\ud800", "{}", 'x", "gpu_ids": 3, "y": "']
    rng = random.Random(3)

    def word() -> str:
        return rng.choice(weird) + rng.choice(weird)

    shared = dict(os.environ)
    for _ in range(2000):
        env = {word() + str(k): word() for k in range(rng.randrange(4))} if rng.random() < 0.7 else shared
        spec = JobSpec(
            argv=tuple(word() for _ in range(rng.randrange(1, 3))),
            cwd=word(),
            env=env,
            name=rng.choice([None, word()]),
            gpus=rng.choice([None, 0, 2]),
            gpu_ids=rng.choice([None, (word(),)]),
            tags={word(): word()} if rng.random() < 0.5 else {},
        )
        text = spec_to_json(spec)
        assert text == _plain_json(spec)
        assert spec_from_json(text) == spec
        shared[f"K{rng.randrange(3)}"] = word()  # the same dict, changed in place
    # Values that are not text (a job stored long ago) and equal without being the same: 1 == True.
    for values in ({"A": 1}, {"A": True}, {"A": 1.0}, {"A": 1}, {"gpu_ids": "x"}):
        spec = JobSpec(argv=("t",), env=values, tags={"a": "1", "gpu_ids": "2"})  # type: ignore[arg-type]
        assert spec_to_json(spec) == _plain_json(spec)
