"""Put first on PYTHONPATH by `gpubox run`: attach gpubox's dataloader probe to this Python,
then run the sitecustomize that this one shadows, if there is one.

The gpubox package this file belongs to is loaded under a private name: the program imports
what it would import without the probe, its own module named gpubox or none; and the rest of
gpubox's environment stays out of the program's sys.path.

Every Python a job starts runs this file, Python 2 as well: it is written so that any of them
can run it (no annotations, no f-strings), and a Python older than the probe's code attaches
nothing and just runs the sitecustomize it shadows.
"""

import os
import sys

PACKAGE = "_gpubox_probe"  # what gpubox is called in the program's sys.modules
OLDEST = (3, 8)  # the oldest Python that the probe's modules (and gpubox.paths) run on


def _attach_probe(package_dir):  # type: (str) -> None
    try:
        import importlib
        import importlib.util

        if PACKAGE not in sys.modules:
            init = os.path.join(package_dir, "__init__.py")
            spec = importlib.util.spec_from_file_location(PACKAGE, init, submodule_search_locations=[package_dir])
            if spec is None or spec.loader is None:
                raise ImportError("no gpubox package in " + package_dir)
            module = importlib.util.module_from_spec(spec)
            sys.modules[PACKAGE] = module
            try:
                spec.loader.exec_module(module)
            except BaseException:
                del sys.modules[PACKAGE]
                raise
        importlib.import_module(PACKAGE + ".probe").install()
    except Exception as exc:
        sys.stderr.write("gpubox probe: disabled: " + type(exc).__name__ + ": " + str(exc) + "\n")


def _run_shadowed(here):  # type: (str) -> None
    """Execute the next sitecustomize on sys.path after this file's directory, as site would;
    its errors reach site, which reports them as it always does."""

    def same(entry):  # type: (str) -> bool
        return os.path.realpath(entry or os.curdir) == here

    mine = [i for i, entry in enumerate(sys.path) if same(entry)]
    later = [e for e in sys.path[mine[0] + 1 if mine else 0 :] if not same(e)]
    if sys.version_info < (3, 5):  # noqa: UP036 (Python 2 runs this file too)
        _run_shadowed_with_imp(later)
        return
    import importlib.machinery
    import importlib.util

    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", later)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules["sitecustomize"] = module  # `import sitecustomize` now gives the user's own
    spec.loader.exec_module(module)


def _run_shadowed_with_imp(later):  # type: (list[str]) -> None
    """Python 2: run it in this module, under its name, as imp loads a module already loaded."""
    import importlib

    imp = importlib.import_module("imp")
    try:
        found = imp.find_module("sitecustomize", later)
    except ImportError:
        return
    try:
        imp.load_module("sitecustomize", *found)
    finally:
        if found[0] is not None:
            found[0].close()


if __name__ == "sitecustomize":  # not when imported as part of the gpubox package
    _here = os.path.dirname(os.path.realpath(__file__))
    if sys.version_info >= OLDEST:
        _attach_probe(os.path.dirname(os.path.dirname(_here)))
    _run_shadowed(_here)
