"""Programs that fork: a child never writes its parent's file, and DataLoader workers never
publish at all (they never ask a DataLoader iterator for a batch)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.probe.support import Running, only_record, probe_files, python_cmd, requires_torch, run, write_program

pytestmark = requires_torch

FORKS = """
import json
import gpubox.probe; gpubox.probe.install()
from torch.utils.data import DataLoader, Dataset
from gpubox.paths import resolve_paths
from gpubox.probe import layout

probes = layout.probe_dir(resolve_paths().runtime_dir)
parent = os.getpid()

def own_record():
    files = list(probes.glob(f"{os.getpid()}-*.probe"))
    rec = layout.read_consistent(files[0]) if files else None
    return rec and [rec.pid, rec.batches]

def in_child(work):
    # Run work() in a forked child that exits normally (atexit runs); return what it reports.
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        os.write(w, json.dumps(work()).encode())
        sys.exit(0)
    os.close(w)
    report = json.loads(os.read(r, 4096))
    os.waitpid(pid, 0)
    return report

for batch in DataLoader(sleepy(3, 0.0)):
    pass
idle = in_child(lambda: own_record())
iterating = in_child(lambda: [len(list(DataLoader(sleepy(5, 0.0)))), own_record()])

class ForksWhileLoading(Dataset):
    def __len__(self):
        return 2

    def __getitem__(self, i):
        if i == 1:
            pid = os.fork()
            if pid:
                os.waitpid(pid, 0)
        return i

loaded = list(DataLoader(ForksWhileLoading()))
if os.getpid() != parent:  # the child of a fork in the middle of a wait
    print("MIDWAIT", json.dumps([len(loaded), own_record()]), flush=True)
    sys.exit(0)
pause("DONE " + json.dumps({"idle": idle, "iterating": iterating}))
"""


def test_forked_children_never_write_the_parents_file(tmp_path: Path, runtime: Path) -> None:
    job = Running(python_cmd(write_program(tmp_path, FORKS)))
    try:
        mid_wait = json.loads(job.wait_for("MIDWAIT"))
        children = json.loads(job.wait_for("DONE"))
        parent = only_record(runtime, job.proc.pid)  # the children's files went with them
        job.go_on()
        code, _, err = job.finish()
    finally:
        job.kill()
    assert code == 0, err
    assert parent.batches == 3 + 2  # nothing of the children's 5 and 2 batches
    assert children["idle"] is None  # never iterated: no file of its own
    count, (pid, batches) = children["iterating"]
    assert count == batches == 5 and pid != job.proc.pid
    loaded, (pid, batches) = mid_wait
    assert loaded == 2 and batches == 0  # the wait began in the parent: not the child's to count
    assert probe_files(runtime) == []


WORKERS = """
import json
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.dataloader import _BaseDataLoaderIter

class Pids(Dataset):
    def __len__(self):
        return 8

    def __getitem__(self, i):
        time.sleep(0.01)
        probed = hasattr(_BaseDataLoaderIter.__next__, "__wrapped__")
        return os.getpid() * 10 + probed

if __name__ == "__main__":
    if sys.argv[2] == "install":
        import gpubox.probe; gpubox.probe.install()
    context = sys.argv[1]
    loader = DataLoader(Pids(), batch_size=2, num_workers=2, multiprocessing_context=context, persistent_workers=True)
    seen = set()
    for epoch in range(2):
        for batch in loader:
            seen.update(int(x) for x in batch)
    pause("DONE " + json.dumps(sorted(seen)))  # the persistent workers are still alive here
"""


@pytest.mark.parametrize(("context", "attach"), [("fork", "install"), ("spawn", "run")])
def test_dataloader_workers_never_publish(tmp_path: Path, runtime: Path, context: str, attach: str) -> None:
    program = write_program(tmp_path, WORKERS)
    job = Running(python_cmd(program, context, attach, via_run=attach == "run"))
    try:
        seen = json.loads(job.wait_for("DONE"))
        record = only_record(runtime, job.proc.pid)  # one file: the trainer's
        job.go_on()
        code, _, err = job.finish()
    finally:
        job.kill()
    assert code == 0, err
    workers = {x // 10 for x in seen}
    assert len(workers) == 2 and job.proc.pid not in workers
    assert {x % 10 for x in seen} == {1}  # the probe was in the workers too, and stayed silent
    assert record.batches == 2 * 4
    assert probe_files(runtime) == []


RANKS = """
import multiprocessing as mp
import gpubox.probe; gpubox.probe.install()
from torch.utils.data import DataLoader

def rank():
    for batch in DataLoader(sleepy(4, 0.0)):
        pass

if __name__ == "__main__":
    child = mp.get_context(sys.argv[1]).Process(target=rank)
    child.start()
    child.join()
    print("EXIT", child.exitcode, flush=True)
"""


@pytest.mark.parametrize("context", ["fork", "forkserver"])
def test_a_multiprocessing_child_removes_its_file(tmp_path: Path, runtime: Path, context: str) -> None:
    # multiprocessing ends its fork and forkserver children with os._exit, past atexit: a
    # training rank started this way (Lightning's ddp_fork, a notebook's DDP) left its file.
    result = run(python_cmd(write_program(tmp_path, RANKS), context))
    assert result.returncode == 0, result.stderr
    assert "EXIT 0" in result.stdout
    assert "gpubox probe" not in result.stderr
    assert probe_files(runtime) == []
