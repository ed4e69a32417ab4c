"""Inert ``triton`` / ``torchvision`` for the parse path of a python without them (sglang imports
both at load; nothing on the parse path runs them; docs/conformance.md, "Stubs"): any submodule
imports, a Capitalised attribute is a class, any other an inert value whose call returns its one
callable argument (``@triton.jit``) or a pass-through decorator (``@triton.autotune(...)``).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types
from typing import Any

STUB_VERSION = "0.0.0+inert"


class _InertValue:
    def __init__(self, path: str) -> None:
        self._path = path

    def __getattr__(self, name: str) -> _InertValue:
        if name.startswith("__"):
            raise AttributeError(name)
        return _InertValue(f"{self._path}.{name}")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if len(args) == 1 and callable(args[0]) and not kwargs:
            return args[0]
        return lambda fn: fn

    def __repr__(self) -> str:
        return f"<inert stub {self._path}>"


class _InertClassMeta(type):
    def __getattr__(cls, name: str) -> _InertValue:
        if name.startswith("__"):
            raise AttributeError(name)
        return _InertValue(f"{cls.__module__}.{cls.__qualname__}.{name}")


class _InertInstanceBase:
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass


class _InertModule(types.ModuleType):
    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        if name[:1].isupper():
            value: Any = _InertClassMeta(name, (_InertInstanceBase,), {"__module__": self.__name__})
        else:
            value = _InertValue(f"{self.__name__}.{name}")
        setattr(self, name, value)
        return value


class _SubmoduleFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def __init__(self, package: str) -> None:
        self._prefix = package + "."

    def find_spec(
        self, fullname: str, path: Any = None, target: Any = None
    ) -> importlib.machinery.ModuleSpec | None:
        if not fullname.startswith(self._prefix):
            return None
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = _InertModule(spec.name)
        module.__path__ = []
        module.__version__ = STUB_VERSION
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        pass


def make_inert(package: str) -> None:
    """Make the (already importing) top-level ``package`` and all its submodules inert."""
    sys.meta_path.insert(0, _SubmoduleFinder(package))
    module = sys.modules[package]
    module.__class__ = _InertModule
    module.__version__ = STUB_VERSION
