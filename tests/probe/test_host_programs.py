"""Programs that do unusual things at start-up or with imports run with the probe exactly as
they run without it."""

from __future__ import annotations

from pathlib import Path

from gpubox.probe import layout
from tests.probe.support import python_cmd, requires_torch, run, write_program

# An import hook that asks the other finders for the module, as the hooks of tracers, profilers
# and type checkers do; it passes over itself alone.
DELEGATING_FINDER = """
class Delegating:
    def find_spec(self, name, path, target=None):
        if name != "torch.utils.data.dataloader":
            return None
        for finder in sys.meta_path:
            if finder is not self and hasattr(finder, "find_spec"):
                spec = finder.find_spec(name, path, target)
                if spec is not None:
                    return spec
        return None

sys.meta_path.insert(0, Delegating())
"""


@requires_torch
def test_an_import_hook_that_asks_the_other_finders(tmp_path: Path, runtime: Path) -> None:
    program = write_program(
        tmp_path,
        DELEGATING_FINDER
        + "from torch.utils.data import DataLoader\n"
        + "print([int(b) for b in DataLoader(sleepy(3, 0.0))])\n"
        + "from torch.utils.data.dataloader import _BaseDataLoaderIter\n"
        + "print(hasattr(_BaseDataLoaderIter.__next__, '__wrapped__'), file=sys.stderr)\n",
    )
    plain = run(python_cmd(program))
    probed = run(python_cmd(program, via_run=True))
    assert (plain.returncode, plain.stdout, plain.stderr) == (0, "[0, 1, 2]\n", "False\n"), plain.stderr
    assert (probed.returncode, probed.stdout, probed.stderr) == (0, "[0, 1, 2]\n", "True\n"), probed.stderr[-2000:]


# Printed by a program after its loop: the batches in its own probe file, read without gpubox.
OWN_BATCHES = f"""
probes = os.path.join(os.environ["GPUBOX_RUNTIME_DIR"], "probe")
mine = [n for n in os.listdir(probes) if n.startswith(f"{{os.getpid()}}-")]
with open(os.path.join(probes, mine[0]), "rb") as fh:
    print("batches", int.from_bytes(fh.read()[8 * {layout.S_BATCHES} : 8 * {layout.S_BATCHES + 1}], "little"))
"""


@requires_torch
def test_a_programs_own_module_named_gpubox_stays_its_own(tmp_path: Path, runtime: Path) -> None:
    (tmp_path / "gpubox.py").write_text("NAME = 'mine'\n")
    program = write_program(
        tmp_path,
        "import gpubox\nprint(gpubox.NAME)\n"
        + "from torch.utils.data import DataLoader\nprint(len(list(DataLoader(sleepy(3, 0.0)))))\n"
        + OWN_BATCHES,
    )
    probed = run(python_cmd(program, via_run=True))
    assert (probed.returncode, probed.stdout, probed.stderr) == (0, "mine\n3\nbatches 3\n", "")


@requires_torch
def test_the_one_line_install_under_gpubox_run_counts_each_batch_once(tmp_path: Path, runtime: Path) -> None:
    # The program's gpubox (installed where it runs) and the one gpubox run brings: two copies.
    program = write_program(
        tmp_path,
        "import gpubox.probe; gpubox.probe.install()\n"
        + "from torch.utils.data import DataLoader\nprint(len(list(DataLoader(sleepy(4, 0.0)))))\n"
        + OWN_BATCHES,
    )
    probed = run(python_cmd(program, via_run=True))
    assert (probed.returncode, probed.stdout, probed.stderr[-2000:]) == (0, "4\nbatches 4\n", "")


# After a first loop (which makes the probe file), the program closes every descriptor above
# stderr, as a daemon does at start; then its workers' pipes get numbers the probe's mapping had.
CLOSES_EVERY_DESCRIPTOR = """
from torch.utils.data import DataLoader

if __name__ == "__main__":
    print(sum(int(b) for b in DataLoader(sleepy(8, 0.0))), flush=True)
    os.closerange(3, 4096)
    loader = DataLoader(sleepy(8, 0.0), num_workers=2, multiprocessing_context="fork", timeout=30)
    print(sum(int(b) for b in loader), flush=True)
"""


@requires_torch
def test_a_program_that_closes_every_descriptor_it_did_not_open(tmp_path: Path, runtime: Path) -> None:
    program = write_program(tmp_path, CLOSES_EVERY_DESCRIPTOR)
    plain = run(python_cmd(program))
    probed = run(python_cmd(program, via_run=True))
    assert (plain.returncode, plain.stdout, plain.stderr) == (0, "28\n28\n", ""), plain.stderr[-2000:]
    assert (probed.returncode, probed.stdout, probed.stderr) == (0, "28\n28\n", ""), probed.stderr[-2000:]


# Files opened after closing every descriptor, written by an exit handler registered before
# torch (so it runs after the probe's own).
WRITES_AT_EXIT = """
import atexit

files = []

@atexit.register
def finish():
    for fh in files:
        fh.write("written at exit\\n")
        fh.close()

from torch.utils.data import DataLoader

print(len(list(DataLoader(sleepy(3, 0.0)))))
os.closerange(3, 4096)
files.extend(open(os.path.join(sys.argv[1], str(i)), "w") for i in range(8))
"""


@requires_torch
def test_files_reopened_after_closing_every_descriptor_stay_the_programs(tmp_path: Path, runtime: Path) -> None:
    program = write_program(tmp_path, WRITES_AT_EXIT)
    for name in ("plain", "probed"):
        out = tmp_path / name
        out.mkdir()
        result = run(python_cmd(program, str(out), via_run=name == "probed"))
        assert (result.returncode, result.stdout, result.stderr) == (0, "3\n", ""), result.stderr[-2000:]
        assert [(out / str(i)).read_text() for i in range(8)] == ["written at exit\n"] * 8
