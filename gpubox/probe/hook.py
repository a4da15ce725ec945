"""Time torch's DataLoader iterators: wrap `_BaseDataLoaderIter.__next__` now, or as soon as
torch defines it. Never imports torch itself.

The base class's `__next__` serves single- and multi-process loaders, pinned memory, and the
loaders Lightning and Accelerate drive. A subclass that overrides `__next__` and calls super()
reaches the one wrapper, so each batch counts once.
"""

from __future__ import annotations

import sys

TYPE_CHECKING = False  # not typing.TYPE_CHECKING: importing typing costs start-up time

if TYPE_CHECKING:  # annotations only: a process that never loads torch imports next to nothing
    from collections.abc import Callable, Sequence
    from importlib.machinery import ModuleSpec
    from types import ModuleType
    from typing import Any

TARGET = "torch.utils.data.dataloader"
_MARK = "__gpubox_probe__"
_patched: tuple[type, Callable[[Any], Any]] | None = None  # (class, its own __next__)


def attach() -> None:
    """Patch the loaded module, or wait for it to load."""
    module = sys.modules.get(TARGET)
    if module is not None:
        patch(module)
    elif not any(isinstance(f, _DataLoaderFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _DataLoaderFinder())


def detach() -> None:
    """Give the class its own __next__ back and stop waiting for torch."""
    global _patched
    sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, _DataLoaderFinder)]
    if _patched is not None:
        cls, original = _patched
        _patched = None
        if getattr(cls.__dict__.get("__next__"), _MARK, False):
            type.__setattr__(cls, "__next__", original)


def patch(module: ModuleType) -> None:
    global _patched
    cls = module._BaseDataLoaderIter
    original = cls.__dict__["__next__"]
    if getattr(original, _MARK, False):
        return  # already timed, perhaps by another copy of gpubox
    type.__setattr__(cls, "__next__", timed(original))
    _patched = (cls, original)


def timed(original: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """`original`, publishing how long each call blocked; its result and exceptions unchanged."""
    from . import recorder

    recorder.prepare()
    begin, end = recorder.begin, recorder.end

    def __next__(self: Any) -> Any:
        try:
            t0 = begin()
        except Exception as exc:
            _switch_off(exc)
            return original(self)
        returned = False
        try:
            batch = original(self)
            returned = True
            return batch
        finally:
            try:
                end(t0, returned)
            except Exception as exc:
                _switch_off(exc)

    __next__.__qualname__ = getattr(original, "__qualname__", "__next__")
    __next__.__doc__ = original.__doc__
    __next__.__wrapped__ = original  # type: ignore[attr-defined]
    setattr(__next__, _MARK, True)
    return __next__


def _switch_off(exc: BaseException) -> None:
    from . import disable

    disable(exc)


class _DataLoaderFinder:
    """A sys.meta_path entry that hands torch's dataloader module to a patching loader."""

    def __init__(self) -> None:
        self._searching = False

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        # Asked again while it asks the others: by another finder that asks the others too (an
        # import hook of the program's, another copy of the probe), which would recurse forever.
        if fullname != TARGET or self._searching:
            return None
        self._searching = True
        try:
            for finder in sys.meta_path:
                find = getattr(finder, "find_spec", None)
                if finder is self or find is None:
                    continue
                spec = find(fullname, path, target)
                if spec is not None:
                    if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                        spec.loader = _PatchingLoader(spec.loader, self)
                    return spec  # type: ignore[no-any-return]
            return None
        finally:
            self._searching = False


class _PatchingLoader:
    """Runs the module's own loader, then patches it and puts everything back as it was."""

    def __init__(self, loader: Any, finder: _DataLoaderFinder) -> None:
        self._loader = loader
        self._finder = finder

    def create_module(self, spec: ModuleSpec) -> ModuleType | None:
        return self._loader.create_module(spec)  # type: ignore[no-any-return]

    def exec_module(self, module: ModuleType) -> None:
        if module.__spec__ is not None:
            module.__spec__.loader = self._loader
        module.__loader__ = self._loader
        try:
            self._loader.exec_module(module)
        finally:
            if self._finder in sys.meta_path:
                sys.meta_path.remove(self._finder)
        try:
            patch(module)
        except Exception as exc:
            _switch_off(exc)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._loader, name)
