"""The `/` filter of the process table: `user:alice`, `gpu:1` (or `gpu:0/3`, or a UUID prefix) and
plain words.

Terms are ANDed; a plain word is a case-insensitive substring of the command.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpubox.telemetry.model import ProcessSnapshot


@dataclass(frozen=True)
class ProcessFilter:
    users: frozenset[str] = frozenset()
    gpus: frozenset[str] = frozenset()
    words: tuple[str, ...] = ()
    text: str = ""

    @classmethod
    def parse(cls, text: str) -> ProcessFilter:
        users: set[str] = set()
        gpus: set[str] = set()
        words: list[str] = []
        for term in text.split():
            name, sep, value = term.partition(":")
            if sep and value and name.lower() == "user":
                users.add(value)
            elif sep and value and name.lower() == "gpu":
                gpus.add(value.lower())
            else:
                words.append(term.lower())
        return cls(frozenset(users), frozenset(gpus), tuple(words), text.strip())

    def __bool__(self) -> bool:
        return bool(self.users or self.gpus or self.words)

    def matches(self, proc: ProcessSnapshot, gpu_label: str) -> bool:
        if self.users and proc.user not in self.users:
            return False
        # `gpu:1` names the GPU with index 1 and every MIG instance on it; `gpu:1/3` one instance
        if self.gpus and not self._gpu_matches(proc, gpu_label):
            return False
        command = (proc.command or "").lower()
        return all(word in command for word in self.words)

    def _gpu_matches(self, proc: ProcessSnapshot, gpu_label: str) -> bool:
        if {gpu_label.lower(), str(proc.gpu_index)} & self.gpus:
            return True
        uuid = proc.gpu_uuid.lower()
        return any(uuid.startswith(g) for g in self.gpus if g.startswith(("gpu-", "mig-")))
