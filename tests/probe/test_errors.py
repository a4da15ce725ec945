"""The probe never breaks its host: an internal error is one line on stderr and nothing else;
and a reader never sees a record torn by the writer."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from gpubox.probe import layout
from tests.probe.support import Running, python_cmd, requires_torch, run, torn, wait_for_file, write_program

pytestmark = requires_torch

TRAINS = """
if os.environ.get("WITH_PROBE"):
    import gpubox.probe; gpubox.probe.install()
from torch.utils.data import DataLoader
from torch.utils.data.dataloader import _BaseDataLoaderIter

train = DataLoader(sleepy(4, 0.0), batch_size=2)
evaluate = DataLoader(sleepy(3, 0.0))
for epoch in range(2):
    print("train", [int(x) for batch in train for x in batch])
    print("eval", [int(batch) for batch in evaluate])
print("probe left in place:", hasattr(_BaseDataLoaderIter.__next__, "__wrapped__"))
sys.exit(5)
"""


@pytest.mark.parametrize("attach", ["install", "run"])
def test_an_internal_error_is_one_warning_and_changes_nothing_else(tmp_path: Path, attach: str) -> None:
    not_a_dir = tmp_path / "runtime-is-a-file"
    not_a_dir.write_text("")
    program = write_program(tmp_path, TRAINS)
    env = {"GPUBOX_RUNTIME_DIR": str(not_a_dir)}
    plain = run(python_cmd(program), env=env)
    probed = run(
        python_cmd(program, via_run=attach == "run"), env={**env, "WITH_PROBE": "1" if attach == "install" else ""}
    )
    assert plain.returncode == probed.returncode == 5
    assert probed.stdout == plain.stdout and "probe left in place: False" in plain.stdout
    warnings = [line for line in probed.stderr.splitlines() if line.startswith("gpubox probe:")]
    assert len(warnings) == 1 and warnings[0].startswith("gpubox probe: disabled: "), probed.stderr
    assert str(not_a_dir) in warnings[0]
    others = [line for line in probed.stderr.splitlines() if not line.startswith("gpubox probe:")]
    assert others == plain.stderr.splitlines()


WRITER = """
import threading
import gpubox.probe; gpubox.probe.install()
from torch.utils.data import DataLoader

sys.setswitchinterval(1e-5)  # threads take turns as often as they can
if sys.argv[2] == "lock":  # as on a Python without the GIL
    from gpubox.probe import recorder
    recorder._lock = threading.Lock()
stop = time.monotonic() + float(sys.argv[1])

def train(loader):
    while time.monotonic() < stop:
        for batch in loader:
            pass

other = threading.Thread(target=train, args=(DataLoader(list(range(64)), batch_size=4),))
other.start()
train(DataLoader(list(range(64)), batch_size=4))
other.join()
pause("DONE")
"""


@pytest.mark.parametrize("guard", ["gil", "lock"])
def test_a_reader_never_sees_a_torn_record(tmp_path: Path, runtime: Path, guard: str) -> None:
    job = Running(python_cmd(write_program(tmp_path, WRITER), "3", guard))
    reads: list[layout.ProbeRecord] = []
    problems: list[str] = []
    retried = 0

    def hammer(path: Path, until: float) -> None:
        nonlocal retried
        while time.monotonic() < until:
            try:
                record = layout.read_consistent(path)
            except layout.ProbeFileError:
                retried += 1  # torn five times running: refused, which is the point
                continue
            problems.extend(torn(record))
            if reads and (record.batches < reads[-1].batches or record.wait_ns < reads[-1].wait_ns):
                problems.append("went backwards")
            reads.append(record)

    try:
        path = wait_for_file(runtime)
        reader = threading.Thread(target=hammer, args=(path, time.monotonic() + 2.5))
        reader.start()
        reader.join()
        job.wait_for("DONE")
        final = layout.read_consistent(path)
        job.go_on()
        code, _, err = job.finish()
    finally:
        job.kill()
    assert code == 0, err
    assert not problems, sorted(set(problems))
    assert len(reads) > 200 and reads[-1].batches > 1000, (len(reads), retried)
    assert not torn(final) and final.batches % 16 == 0 and final.waiting_since_ns == 0
