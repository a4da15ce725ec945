"""Which filesystem holds the dataset, from /proc/self/mountinfo (the longest mount point that
contains the path), and the "data.filesystem" check: network and FUSE mounts starve loaders."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from gpubox.doctor.model import Check, skipped

NETWORK = frozenset({"nfs", "nfs4", "cifs", "smb3", "smbfs", "9p", "ceph", "afs", "ncpfs", "davfs"})
PARALLEL = frozenset({"lustre", "gpfs", "beegfs", "wekafs", "pvfs2", "orangefs"})  # HPC: fast streams, slow metadata
MEMORY = frozenset({"tmpfs", "ramfs"})


@dataclass(frozen=True)
class Mount:
    mount_point: str
    fstype: str  # as the kernel names it: "nfs4", "fuse.sshfs", "ext4"
    source: str  # "server:/export", "/dev/nvme0n1p2", "user@host:/data"

    @property
    def kind(self) -> str:
        """ "network", "parallel", "fuse", "vm-share", "memory" or "local"."""
        if self.fstype in NETWORK:
            return "network"
        if self.fstype in PARALLEL:
            return "parallel"
        if self.fstype == "virtiofs":
            return "vm-share"
        if self.fstype in {"fuse", "fuseblk"} or self.fstype.startswith("fuse."):
            return "fuse"
        return "memory" if self.fstype in MEMORY else "local"


def _unescape(field: str) -> str:
    # mountinfo writes space, tab, newline and backslash as octal escapes: "\040"
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def parse_mountinfo(text: str) -> list[Mount]:
    mounts = []
    for line in text.splitlines():
        fields = line.split()
        if len(fields) < 7 or "-" not in fields[6:]:
            continue
        sep = fields.index("-", 6)  # after the optional fields
        if len(fields) < sep + 3:
            continue
        mounts.append(Mount(_unescape(fields[4]), fields[sep + 1], _unescape(fields[sep + 2])))
    return mounts


def mount_of(path: Path, mountinfo: Path) -> Mount | None:
    """The mount that holds `path`: the longest mount point containing it; of equal ones the
    last, which hides those mounted before it. None when mountinfo cannot be read."""
    try:
        mounts = parse_mountinfo(mountinfo.read_text())
    except (OSError, UnicodeDecodeError):
        return None
    real = os.path.realpath(path)
    best: Mount | None = None
    for m in mounts:
        point = m.mount_point.rstrip("/") or "/"
        inside = point == "/" or real == point or real.startswith(point + "/")
        if inside and (best is None or len(point) >= len(best.mount_point.rstrip("/") or "/")):
            best = m
    return best


_MEANING = {
    "network": "Every read that misses the local page cache is a round trip to a file server: latency per file "
    "dominates small files, and the network link caps throughput for every job that shares it.",
    "parallel": "A parallel filesystem streams large files fast, but every open and stat is a round trip to a "
    "metadata server, which starves a loader that reads many small files.",
    "fuse": "Every read that misses the page cache goes through a user-space daemon, and for s3fs, gcsfuse, sshfs "
    "or rclone over the network as well: per-call overhead and latency cap the loader.",
    "vm-share": "The directory is shared from the VM's host over virtio-fs: every uncached read crosses the "
    "hypervisor to a daemon on the host.",
}
_IMPACT = {"network": 0.3, "parallel": 0.15, "fuse": 0.35, "vm-share": 0.15}
_FIX = {
    "parallel": "Pack small files into large shards (WebDataset tar shards, LMDB, Parquet): large sequential reads "
    "are what these filesystems do well; or stage the dataset on local NVMe before training.",
}
_DEFAULT_FIX = (
    "Copy or cache the dataset on local NVMe before training (`rsync -a SRC/ /local/nvme/dataset/`); pack small "
    "files into larger shards (WebDataset tar shards, LMDB, Parquet) that stream sequentially; raise "
    "DataLoader(num_workers=...) so more reads are in flight."
)


def filesystem_check(path: Path, mount: Mount | None, read_ok: bool | None = None) -> Check:
    """data.filesystem. `read_ok`: the measured reads met the threshold, which halves what is at
    stake (the mount keeps up today, but shares its server or daemon with everyone)."""
    id, title = "data.filesystem", "Dataset filesystem"
    if mount is None:
        return skipped(id, title, "data", "cannot read /proc/self/mountinfo to find the filesystem")
    kind = mount.kind
    detail = f"{path} is on {mount.fstype} at {mount.mount_point} (from {mount.source})"
    evidence = {"fstype": mount.fstype, "kind": kind, "mount_point": mount.mount_point, "source": mount.source}
    if kind in ("local", "memory"):
        meaning = "Held in memory (tmpfs)." if kind == "memory" else "A local filesystem: reads go to a local disk."
        return Check(id, title, "data", "ok", detail, mount.fstype, None, meaning, evidence=evidence)
    meaning = _MEANING[kind]
    if mount.fstype == "9p":
        meaning += " 9p (WSL2's /mnt/c, VM shares) is among the slowest of these."
    impact = _IMPACT[kind] * (0.5 if read_ok else 1.0)
    fix = _FIX.get(kind, _DEFAULT_FIX)
    return Check(id, title, "data", "warn", detail, mount.fstype, None, meaning, fix, None, impact, evidence)
