"""Put first on PYTHONPATH by `gpubox run`: attach gpubox's dataloader probe to this Python,
then run the sitecustomize that this one shadows, if there is one.

The gpubox package this file belongs to is loaded under a private name: the program imports
what it would import without the probe, its own module named gpubox or none; and the rest of
gpubox's environment stays out of the program's sys.path.
"""

from __future__ import annotations

import os
import sys

PACKAGE = "_gpubox_probe"  # what gpubox is called in the program's sys.modules


def _attach_probe(package_dir: str) -> None:
    try:
        import importlib
        import importlib.util

        if PACKAGE not in sys.modules:
            init = os.path.join(package_dir, "__init__.py")
            spec = importlib.util.spec_from_file_location(PACKAGE, init, submodule_search_locations=[package_dir])
            if spec is None or spec.loader is None:
                raise ImportError(f"no gpubox package in {package_dir}")
            module = importlib.util.module_from_spec(spec)
            sys.modules[PACKAGE] = module
            try:
                spec.loader.exec_module(module)
            except BaseException:
                del sys.modules[PACKAGE]
                raise
        importlib.import_module(PACKAGE + ".probe").install()
    except Exception as exc:
        sys.stderr.write(f"gpubox probe: disabled: {type(exc).__name__}: {exc}\n")


def _run_shadowed(here: str) -> None:
    """Execute the next sitecustomize on sys.path after this file's directory, as site would;
    its errors reach site, which reports them as it always does."""
    import importlib.machinery
    import importlib.util

    def same(entry: str) -> bool:
        return os.path.realpath(entry or os.curdir) == here

    mine = [i for i, entry in enumerate(sys.path) if same(entry)]
    later = [e for e in sys.path[mine[0] + 1 if mine else 0 :] if not same(e)]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", later)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules["sitecustomize"] = module  # `import sitecustomize` now gives the user's own
    spec.loader.exec_module(module)


if __name__ == "sitecustomize":  # not when imported as part of the gpubox package
    _here = os.path.dirname(os.path.realpath(__file__))
    _attach_probe(os.path.dirname(os.path.dirname(_here)))
    _run_shadowed(_here)
