"""From what a user typed to job specs: `queue add` options, and job files (`--file`).

A job file has one job per line: a command line (split as a shell would, run without a shell)
or a JSON object with the command and options. Blank lines and lines starting with # are
skipped. Options given on the command line are defaults for every line. Every error names the
line, and no job is added when any line is wrong.
"""

from __future__ import annotations

import json
import os
import shlex
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from gpubox.queue.gpus import GpuInfo, resolve_gpus
from gpubox.queue.jobs import JobSpec
from gpubox.queue.parse import parse_duration, parse_env, parse_ids, parse_kind, parse_size, parse_tag

TYPE_CHECKING = False  # typing's import (4 ms) is not needed at run time
if TYPE_CHECKING:
    from typing import Any

NO_COMMAND = "no command given (put it after --, as in: gpubox queue add -- python train.py)"


@dataclass(frozen=True)
class AddOptions:
    name: str | None = None
    kind: str | None = None
    gpus: int | None = None
    gpu: str | None = None  # "0,2" or UUIDs
    gpu_mem: str | None = None
    priority: int | None = None
    after: str | None = None
    time_limit: str | None = None
    retries: int | None = None
    tags: tuple[str, ...] = ()
    env: tuple[str, ...] = ()
    cwd: str | None = None
    shell: bool = False
    probe: bool = True
    share: bool = False

    @property
    def wants_gpus(self) -> bool:
        """True when the options name GPUs, so they must be checked against the box."""
        return self.gpu is not None or self.gpu_mem is not None or (self.gpus is not None and self.gpus > 0)


@dataclass
class GpuLookup:
    """The box's GPUs, read once and only if an option needs them."""

    read: Callable[[], list[GpuInfo]]
    _gpus: list[GpuInfo] | None = field(default=None)

    def __call__(self) -> list[GpuInfo]:
        if self._gpus is None:
            self._gpus = self.read()
        return self._gpus


def option_pairs(items: Sequence[str], parse: Callable[[str], tuple[str, str]], option: str) -> dict[str, str]:
    """The values of a repeatable key=value option (--tag, --env) by key. A key given twice with
    two values is refused (ValueError): which one was meant cannot be known, and keeping the
    last would drop the other without a word. The same pair twice says nothing new: it is one."""
    pairs: dict[str, str] = {}
    first: dict[str, str] = {}
    for item in items:
        key, value = parse(item)
        if key in pairs and pairs[key] != value:
            raise ValueError(f"{option} {first[key]} and {option} {item} disagree: give {key} once")
        pairs[key] = value
        first.setdefault(key, item)
    return pairs


def _names_dir(path: str, directory: str) -> bool:
    """Whether `path` is `directory`, also by another name (a symlink a shell's PWD keeps)."""
    try:
        return os.path.isabs(path) and os.path.samefile(path, directory)
    except OSError:
        return False


class SpecBuilder:
    """`build_spec` for the lines of a job file: what a line's options give (the environment, the
    folder checked, the GPUs looked up, the limits parsed) is worked out once for each set of
    options, and each line adds its command. Plain lines share the command line's options, so a
    file of 1,000 of them pays for one `build_spec` instead of 1,000 (8 ms, which the first job
    of a cold queue waited for). The jobs it makes share one environment dict: nothing changes a
    spec's environment in place."""

    def __init__(self, base_env: Mapping[str, str], base_cwd: str, gpus: Callable[[], list[GpuInfo]]) -> None:
        self.base_env = base_env
        self.base_cwd = base_cwd
        self.gpus = gpus
        self._made: dict[int, tuple[AddOptions, JobSpec]] = {}  # by id(options), the options kept alive

    def __call__(self, argv: Sequence[str], opts: AddOptions) -> JobSpec:
        words = list(argv)
        if not words or not words[0].strip():
            raise ValueError(NO_COMMAND)  # first, as build_spec says it
        kept = self._made.get(id(opts))
        if kept is None or kept[0] is not opts:
            kept = (opts, build_spec(words, opts, self.base_env, self.base_cwd, self.gpus))
            self._made[id(opts)] = kept
            return kept[1]
        return replace(kept[1], argv=(" ".join(words),) if opts.shell else tuple(words))


def check_options(opts: AddOptions) -> None:
    """The options given on the command line, checked before any job file is read: an error in
    them is theirs, not a line's."""
    option_pairs(opts.tags, parse_tag, "--tag")
    option_pairs(opts.env, parse_env, "--env")


def build_spec(
    argv: Sequence[str],
    opts: AddOptions,
    base_env: Mapping[str, str],
    base_cwd: str,
    gpus: Callable[[], list[GpuInfo]],
) -> JobSpec:
    """One job from a command and options; ValueError with one line when anything is wrong."""
    words = [w for w in argv]
    if not words or not words[0].strip():
        raise ValueError(NO_COMMAND)
    given_env = option_pairs(opts.env, parse_env, "--env")
    env = {**base_env, **given_env}
    tags = option_pairs(opts.tags, parse_tag, "--tag")
    if opts.cwd == "":
        raise ValueError("the working directory (--cwd) is empty")
    cwd = os.path.abspath(os.path.join(base_cwd, os.path.expanduser(opts.cwd))) if opts.cwd else base_cwd
    if not os.path.isdir(cwd):
        what = "is not a directory" if os.path.exists(cwd) else "does not exist"
        raise ValueError(f"working directory {cwd} {what}")
    if "PWD" in env and "PWD" not in given_env and not _names_dir(env["PWD"], cwd):
        # The adding shell's PWD names where it was, not where the job runs (--cwd): a program
        # or script that reads $PWD would look in the wrong folder.
        env["PWD"] = cwd
    if opts.gpus is not None and opts.gpus < 0:
        raise ValueError(f"invalid GPU count {opts.gpus}: expected 0 or more")
    gpu_ids: tuple[str, ...] | None = None
    mem = parse_size(opts.gpu_mem) if opts.gpu_mem is not None else None
    if opts.gpus == 0 and (opts.gpu is not None or mem is not None):
        raise ValueError("--gpus 0 makes a CPU-only job: it cannot also ask for --gpu or --gpu-mem")
    if opts.gpu is not None and not opts.gpu.strip():
        raise ValueError("--gpu is empty: expected GPU indexes or UUIDs separated by commas, as 0,2")
    if opts.gpu is not None and any(not part.strip() for part in opts.gpu.split(",")):
        # Said before the GPUs are read: a box without a driver would otherwise answer first.
        raise ValueError(f"--gpu {opts.gpu} names an empty GPU: expected GPU indexes or UUIDs separated by commas")
    if opts.wants_gpus:
        box = gpus()
        if opts.gpu is not None:
            gpu_ids = resolve_gpus(opts.gpu.split(","), box)
            if opts.gpus is not None and opts.gpus != len(gpu_ids):
                raise ValueError(f"--gpus {opts.gpus} and --gpu {opts.gpu} disagree on how many GPUs")
        elif opts.gpus is not None and opts.gpus > len(box):
            raise ValueError(f"asks for {opts.gpus} GPUs; this box has {len(box)}")
        if mem is not None:
            pool = [g for g in box if gpu_ids is None or g.uuid in gpu_ids]
            largest = max((g.mem_total_bytes for g in pool), default=0)
            if mem > largest:
                raise ValueError(
                    f"--gpu-mem {opts.gpu_mem} is more than any GPU has (the largest has {largest / (1 << 30):.1f} GiB)"
                )
    limit = parse_duration(opts.time_limit) if opts.time_limit is not None else None
    if opts.after is not None and not opts.after.strip():  # a script's empty $ID: not "no dependency"
        raise ValueError("--after is empty: expected job ids separated by commas, as 12,15")
    after = parse_ids(opts.after) if opts.after is not None else ()
    shell = opts.shell
    return JobSpec(
        argv=(" ".join(words),) if shell else tuple(words),
        cwd=cwd,
        env=env,
        kind=parse_kind(opts.kind) if opts.kind is not None else "other",
        name=opts.name,
        gpus=opts.gpus if gpu_ids is None else None,
        gpu_ids=gpu_ids,
        gpu_mem_bytes=mem,
        priority=opts.priority or 0,
        after=after,
        time_limit_s=limit,
        retries=opts.retries or 0,
        tags=tags,
        shell=shell,
        probe=opts.probe,
        share=opts.share,
    )


_JSON_KEYS = {
    "cmd",
    "argv",
    "name",
    "kind",
    "gpus",
    "gpu",
    "gpu_mem",
    "priority",
    "after",
    "time_limit",
    "retries",
    "tags",
    "env",
    "cwd",
    "shell",
    "probe",
    "share",
}


def _as_int(value: Any, key: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{key!r} must be a whole number, not {value!r}")
    return value


def _as_text(value: Any, key: str) -> str:
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise ValueError(f"{key!r} must be text, not {value!r}")
    return str(value)


def _json_job(doc: Any, defaults: AddOptions) -> tuple[list[str], AddOptions]:
    if not isinstance(doc, dict):
        raise ValueError("a JSON line must be an object")
    unknown = sorted(set(doc) - _JSON_KEYS)
    if unknown:
        raise ValueError(f"unknown key {unknown[0]!r} (expected some of: {', '.join(sorted(_JSON_KEYS))})")
    opts = defaults
    changes: dict[str, Any] = {}
    for key in ("name", "kind", "gpu_mem", "time_limit", "cwd"):
        if key in doc:
            changes[key] = _as_text(doc[key], key)
    for key in ("gpus", "priority", "retries"):
        if key in doc:
            changes[key] = _as_int(doc[key], key)
    for key in ("shell", "probe", "share"):
        if key in doc:
            if not isinstance(doc[key], bool):
                raise ValueError(f"{key!r} must be true or false, not {doc[key]!r}")
            changes[key] = doc[key]
    if "gpu" in doc:
        gpu = doc["gpu"]
        changes["gpu"] = ",".join(_as_text(g, "gpu") for g in gpu) if isinstance(gpu, list) else _as_text(gpu, "gpu")
    if "after" in doc and doc["after"] != []:  # [] says: no dependency
        after = doc["after"]
        items = after if isinstance(after, list) else [after]
        changes["after"] = ",".join(str(_as_int(a, "after")) if not isinstance(a, str) else a for a in items)
    # Which GPUs is one setting: a line's count or GPUs replace the command line's request whole,
    # rather than being refused as disagreeing with a default the line meant to override.
    if "gpus" in changes or "gpu" in changes:
        changes.setdefault("gpus", None)
        changes.setdefault("gpu", None)
        if changes["gpus"] == 0 and "gpu_mem" not in changes:
            changes["gpu_mem"] = None  # a CPU-only line needs no GPU memory
    elif "gpu_mem" in changes and defaults.gpus == 0:
        changes["gpus"] = None  # a line that needs GPU memory is not CPU-only
    for key in ("tags", "env"):
        if key in doc:
            if not isinstance(doc[key], dict):
                raise ValueError(f"{key!r} must be an object of names to values")
            for name in doc[key]:
                if "=" in name:  # joined below as name=value, it would split elsewhere
                    raise ValueError(f"invalid name {name!r} in {key!r}: a name has no '='")
            line = {k: _as_text(v, key) for k, v in doc[key].items()}
            # The line's own value of a key replaces the command line's, as for every option.
            kept = tuple(item for item in getattr(defaults, key) if item.partition("=")[0] not in line)
            changes[key] = (*kept, *(f"{k}={v}" for k, v in line.items()))
    opts = replace(opts, **changes)
    if ("cmd" in doc) == ("argv" in doc):
        raise ValueError('give the command as "cmd" (a string) or "argv" (a list), one of them')
    if "argv" in doc:
        argv = doc["argv"]
        if not isinstance(argv, list) or not all(isinstance(a, str) for a in argv):
            raise ValueError("'argv' must be a list of strings")
        return list(argv), opts
    cmd = doc["cmd"]
    if not isinstance(cmd, str):
        raise ValueError("'cmd' must be a string")
    return ([cmd] if opts.shell else shlex.split(cmd)), opts


_NOT_PLAIN = frozenset("'\"\\#")


def _plain_words(line: str) -> list[str] | None:
    """The words of a line with nothing a shell would read specially (no quote, backslash or #,
    only ASCII, spaces and tabs as its only blanks), split as shlex.split would split it, at a
    tenth of the cost; None for any other line."""
    if not line.isascii() or not _NOT_PLAIN.isdisjoint(line) or not (line.replace("\t", " ").isprintable()):
        return None
    return line.split()


def strip_comment(line: str) -> str:
    """The line without its comment, as a shell reads one: from a `#` that starts a word (after
    an unquoted, unescaped blank), outside quotes: `a#b`, `"x # y"` and `a\\ #b` keep theirs."""
    quote = ""
    escaped = False
    word_start = True
    for i, c in enumerate(line):
        literal = escaped or bool(quote)  # this character is not a blank that ends a word
        if escaped:
            escaped = False
        elif quote == "'":
            quote = "" if c == "'" else quote
        elif quote == '"':
            escaped = c == "\\"
            quote = "" if c == '"' else quote
        elif c == "\\":
            escaped = True
        elif c in "'\"":
            quote = c
        elif c == "#" and word_start:
            return line[:i]
        word_start = not literal and c in " \t"
    return line


def _one_value_per_key(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object, whose key given twice with two values is refused (json.loads would keep
    the last), as --tag and --env given twice are."""
    doc: dict[str, Any] = {}
    for key, value in pairs:
        if key in doc and doc[key] != value:
            raise ValueError(f"{key!r} is given twice, with two values: give it once")
        doc[key] = value
    return doc


def _is_json_list(line: str) -> bool:
    try:
        return isinstance(json.loads(line), list)
    except ValueError:  # not JSON: a shell line ([ -f x ] && ..., say)
        return False


def job_file_text(data: bytes, source: str) -> str:
    """A job file's text, read as UTF-8 whatever the locale says, so that a file and the same
    bytes on stdin are read alike; anything else is refused, naming the line."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        if data.startswith((b"\xff\xfe", b"\xfe\xff")):
            why = "UTF-16, by its byte-order mark"
        else:
            why = f"byte 0x{data[exc.start]:02x}"
        line = data.count(b"\n", 0, exc.start) + 1
        raise ValueError(f"{source}:{line}: not UTF-8 text ({why}): save it as UTF-8") from None


def parse_job_file(text: str, source: str, defaults: AddOptions) -> list[tuple[int, list[str], AddOptions]]:
    """(line number, argv, options) for each job in a job file."""
    jobs: list[tuple[int, list[str], AddOptions]] = []
    text = text.removeprefix("\ufeff")  # a byte-order mark, as some editors write
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        try:
            if line.startswith("{"):
                try:
                    doc = json.loads(line, object_pairs_hook=_one_value_per_key)
                except json.JSONDecodeError as exc:
                    raise ValueError(f"not valid JSON ({exc})") from None
                argv, opts = _json_job(doc, defaults)
            elif line.startswith("[") and _is_json_list(strip_comment(line)):
                # No shell command looks like this; a list of words meant as one would fail to run.
                raise ValueError('a JSON list is not a job: give a command, or an object as {"argv": [...]}')
            else:
                # A shell line goes to the shell whole (it reads its own comments).
                argv = [line] if defaults.shell else _plain_words(line) or shlex.split(strip_comment(line))
                opts = defaults
        except ValueError as exc:
            raise ValueError(f"{source}:{number}: {exc}") from None
        jobs.append((number, argv, opts))
    if not jobs:
        raise ValueError(f"{source}: no jobs in the file")
    return jobs
