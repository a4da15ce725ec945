"""Human renderings of queue listings: plain aligned columns (no rich: `queue ls` starts fast)."""

from __future__ import annotations

import time
import unicodedata
from collections.abc import Mapping, Sequence
from typing import Any

from gpubox.format import one_line

DASH = "-"


def duration(seconds: float | None) -> str:
    """45s, 12m, 1h02m, 3d04h."""
    if seconds is None:
        return DASH
    s = int(max(seconds, 0))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s" if s < 600 else f"{s // 60}m"
    if s < 86400:
        return f"{s // 3600}h{(s % 3600) // 60:02d}m"
    return f"{s // 86400}d{(s % 86400) // 3600:02d}h"


def _times(rec: Mapping[str, Any], now: float) -> tuple[str, str]:
    started, ended = rec["started_at"], rec["ended_at"]
    # From when it last joined the queue: a job queued again waits from then, not from its submission.
    since = rec.get("queued_at") or rec["submitted_at"]
    waited = (started if started is not None else (ended if ended is not None else now)) - since
    ran = None if started is None else (ended if ended is not None else now) - started
    if rec["state"] == "queued" and rec["attempt"]:
        ran = None  # requeued: the last attempt's run time is in `queue show`
    return duration(waited), duration(ran)


def _gpus(rec: Mapping[str, Any], request: str) -> str:
    """The GPUs a job holds or last held ("#0,1": GPUs 0 and 1, as `--gpu` names them, never a
    count); for a queued job, what it asks for."""
    if rec["state"] != "queued" and rec["attempt"]:
        held = [str(g) for g in rec["gpus"]]
        return ("#" if all(g.isdigit() for g in held) else "") + ",".join(held) if held else "cpu"
    return request


def held(gpus: Sequence[Any]) -> str:
    """GPUs by index, in words: "GPU 0", "GPUs 0,1"; "cpu" for none."""
    if not gpus:
        return "cpu"
    return ("GPU " if len(gpus) == 1 else "GPUs ") + ",".join(map(str, gpus))


NAME_WIDTH = 24  # a job without a name shows this much of its command
NAME_MAX = 40  # a longer name is cut in the table (`queue show` has it whole), or it widens every row


def _name(rec: Mapping[str, Any]) -> str:
    """Its name; without one, the start of its command (as Slurm names a job after its script)."""
    if rec["name"]:
        return _cut(str(rec["name"]), NAME_MAX)
    return _cut(" ".join(str(rec.get("command") or DASH).split()), NAME_WIDTH)


def _cut(text: str, width: int) -> str:
    """`text` in at most `width` terminal columns, ending in "…" where it is cut."""
    if columns(text) <= width:
        return text
    kept, used = [], 0
    for c in text:
        used += columns(c)
        if used > width - 1:
            break
        kept.append(c)
    return "".join(kept) + "…"


def columns(text: str) -> int:
    """How many terminal columns `text` takes: two for a wide character (CJK, most emoji),
    none for a combining mark or a zero-width one, one for the rest. A decomposed Hangul
    syllable's vowel and final consonant join its initial consonant's two columns, as
    terminals draw them."""
    if text.isascii():
        return len(text)
    width = 0
    for c in text:
        if unicodedata.combining(c) or unicodedata.category(c) in ("Mn", "Me", "Cf") or _hangul_joined(c):
            continue
        width += 2 if unicodedata.east_asian_width(c) in ("W", "F") else 1
    return width


def _hangul_joined(c: str) -> bool:
    """A Hangul medial vowel or final consonant (conjoining jamo), drawn inside the syllable."""
    return "\u1160" <= c <= "\u11ff" or "\ud7b0" <= c <= "\ud7ff"


def _note(rec: Mapping[str, Any]) -> str:
    state = rec["state"]
    if state == "queued":
        return rec["reason"] or ""
    if state == "running":
        return f"attempt {rec['attempt']}" if rec["attempt"] > 1 else ""
    code = rec["exit_code"]
    parts = [] if code is None else [f"exit {code}"]
    if rec["reason"] and rec["reason"] != f"exit code {code}":
        parts.append(rec["reason"])
    return "; ".join(parts)


def table(rows: Sequence[Sequence[str]], header: Sequence[str]) -> str:
    """Columns aligned by the width a terminal gives each character, not by its count."""
    # A name or command is the user's text: a control character in it must not move the cursor.
    rows = [[one_line(str(c)) for c in row] for row in rows]
    widths = [max(columns(r[i]) for r in (header, *rows)) for i in range(len(header) - 1)]
    lines = []
    for row in (header, *rows):
        cells = [c + " " * (w - columns(c)) for c, w in zip(row, widths, strict=False)]
        lines.append("  ".join([*cells, str(row[-1])]).rstrip())
    return "\n".join(lines)


def job_table(records: Sequence[Mapping[str, Any]], requests: Mapping[int, str], now: float | None = None) -> str:
    now = time.time() if now is None else now
    rows = []
    for rec in records:
        waited, ran = _times(rec, now)
        rows.append(
            [
                str(rec["id"]),
                _name(rec),
                rec["kind"],
                rec["state"],
                _gpus(rec, requests[rec["id"]]),
                waited,
                ran,
                _note(rec),
            ]
        )
    return table(rows, ["ID", "NAME", "KIND", "STATE", "GPUS", "WAITED", "RAN", "WHY / HOW IT ENDED"])


def _when(t: float | None) -> str:
    return DASH if t is None else time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))


def job_details(
    rec: Mapping[str, Any],
    attempts: Sequence[Mapping[str, Any]],
    request: str,
    usage: Mapping[str, Any] | None = None,
    usage_unread: bool = False,
) -> str:
    holding = "holds" if rec["state"] == "running" else "held"  # an ended job's last GPUs
    lines = [
        f"job {rec['id']}" + (f" ({rec['name']})" if rec["name"] else ""),
        f"  state       {rec['state']}" + (f": {rec['reason']}" if rec["reason"] else ""),
        f"  command     {rec['command']}" + ("   (through /bin/sh -c)" if rec["shell"] else ""),
        f"  cwd         {rec['cwd']}",
        f"  kind        {rec['kind']}, priority {rec['priority']}",
        f"  gpus        asked {request}" + (f"; {holding} {held(rec['gpus'])}" if rec["gpus"] else ""),
        f"  after       {', '.join(map(str, rec['after'])) or DASH}",
        f"  time limit  {duration(rec['time_limit_s']) if rec['time_limit_s'] else DASH}",
        f"  retries     {rec['failures']} of {rec['retries']} used",
        f"  probe       {'on' if rec['probe'] else 'off'}",
        f"  tags        {', '.join(f'{k}={v}' for k, v in rec['tags'].items()) or DASH}",
        f"  submitted   {_when(rec['submitted_at'])}",
        f"  started     {_when(rec['started_at'])}",
        f"  ended       {_when(rec['ended_at'])}",
        f"  exit code   {DASH if rec['exit_code'] is None else rec['exit_code']}",
        f"  gpu use     {'not shown: the ledger cannot be read' if usage_unread else gpu_use(usage, rec)}",
    ]
    for a in attempts:
        ran = None if a["ended_at"] is None else a["ended_at"] - a["started_at"]
        gpus = held(a["gpus"])
        how = a["outcome"] or "running"
        code = "" if a["exit_code"] is None else f", exit {a['exit_code']}"
        logs = f"{a['log_prefix']}.out|.err"
        lines.append(f"  attempt {a['number']}   {how}{code}, ran {duration(ran)} on {gpus}; logs {logs}")
    return "\n".join(one_line(line) for line in lines)


def _gpu_time(gpu_hours: float | None, unknown: str) -> str:
    return unknown if gpu_hours is None else duration(gpu_hours * 3600)


def gpu_use(usage: Mapping[str, Any] | None, rec: Mapping[str, Any] | None = None) -> str:
    """The job's GPU use from the ledger, in GPU-time (one GPU for 1h, or two for 30m, is 1h00m);
    said to be partial while the ledger has not caught up with the job (`rec`)."""
    if usage is None:
        return "not recorded"
    last = usage["last_at"]
    # The daemon writes what it sampled once a minute: a running job's last minute, or an ended
    # one's, may not be in yet.
    behind = rec is not None and (rec["state"] == "running" or (rec["ended_at"] or 0) - last > 1)
    upto = f" (recorded up to {time.strftime('%H:%M:%S', time.localtime(last))})" if behind else ""
    share = usage["busy_share"]
    busy = _gpu_time(usage["busy_gpu_hours"], "unknown") + ("" if share is None else f" ({100 * share:.0f}%)")
    energy = "unknown" if usage["energy_kwh"] is None else f"{usage['energy_kwh']:.3g} kWh"
    attempts = usage["attempts"]
    return (
        f"{_gpu_time(usage['allocated_gpu_hours'], DASH)} GPU-time allocated"
        f" over {attempts} attempt{'' if attempts == 1 else 's'}, busy {busy},"
        f" idle while allocated {_gpu_time(usage['idle_allocated_gpu_hours'], 'unknown')},"
        f" starved {_gpu_time(usage['starved_gpu_hours'], 'not measured')}, energy {energy}{upto}"
    )
