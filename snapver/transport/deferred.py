"""Modules a dependency imports at start-up but rarely uses, run when first used instead.

Invoke (which paramiko and Fabric import) imports its vendored PyYAML, and that the
system's C YAML binding, on every command (regexes compiled, classes built) before
each SSH connection, for a parser that reads only Fabric/Invoke YAML
config files (``~/.fabric.yaml``, ``/etc/fabric.yml``...), which most users never write.

A deferred module is created and bound where it is imported as usual, but its code runs
when one of its names is first read, under a lock: a second thread reading a name
meanwhile waits for the whole module (``importlib.util.LazyLoader`` switches the module
back before running it, so on Python < 3.13 such a thread could find it half-made).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import threading
import types
from collections.abc import Sequence
from typing import Any

_LOCK = threading.RLock()
_REAL_LOADER = "__snapver_deferred_loader__"
_LOADING = "__snapver_deferred_loading__"


class _DeferredModule(types.ModuleType):
    def __getattr__(self, name: str) -> Any:  # called only for a name not (yet) in the module
        with _LOCK:
            state = self.__dict__
            if state.get(_LOADING):  # read by the module's own code as it runs (`from . import x`)
                raise AttributeError(name)
            if _REAL_LOADER in state:
                state[_LOADING] = True
                try:
                    state[_REAL_LOADER].exec_module(self)
                finally:
                    del state[_LOADING]
                del state[_REAL_LOADER]
                self.__class__ = types.ModuleType  # type: ignore[assignment]  # an ordinary module from now on
        return object.__getattribute__(self, name)


class _DeferredLoader(importlib.abc.Loader):
    def __init__(self, real: importlib.abc.Loader) -> None:
        self.real = real

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType | None:
        return self.real.create_module(spec)

    def exec_module(self, module: types.ModuleType) -> None:
        module.__dict__[_REAL_LOADER] = self.real
        module.__class__ = _DeferredModule


class _DeferredFinder(importlib.abc.MetaPathFinder):
    def __init__(self) -> None:
        self.names: set[str] = set()

    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: types.ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        if fullname not in self.names:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is not None and isinstance(spec.loader, importlib.machinery.SourceFileLoader):
            spec.loader = _DeferredLoader(spec.loader)
        return spec


_FINDER = _DeferredFinder()


def defer(*names: str) -> None:
    """Run these modules' code when first used, if they are not imported yet."""
    with _LOCK:
        _FINDER.names.update(names)
        if _FINDER not in sys.meta_path:
            sys.meta_path.insert(0, _FINDER)
