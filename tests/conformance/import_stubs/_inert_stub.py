"""Inert stand-ins for packages that are imported at load time but never used by a parse.

Put the directory holding this file on ``PYTHONPATH`` of the parse subprocess only
(never of a process that runs kernels). Its ``triton/`` and ``torchvision/`` packages
turn themselves into inert modules with ``make_inert(__name__)``.

Why they exist: ``sglang`` (imported by miles' argument module for SGLang's
``ServerArgs``) does ``import triton`` and ``from torchvision.io import decode_jpeg`` at
module load (``sglang/srt/utils/common.py``), and Megatron's ``@jit_fuser``
(``torch.compile`` at import) makes torch probe triton too. The real packages are
unusable here: PyPI's torchvision pulls a CUDA torch, triton is 0.9 GB, and neither runs
on the parse path.

Behaviour, all at attribute level (measured surface: ~70 names such as ``triton.jit``,
``triton.Config``, ``triton.language.constexpr``, ``triton.runtime.jit.JITFunction``,
``triton.runtime.driver.active.get_current_target()``, ``torchvision.io.decode_jpeg``,
``torchvision.transforms.InterpolationMode.BICUBIC``):

- any ``import <pkg>.<sub>`` succeeds and yields another inert module;
- a Capitalised attribute is a real class (torch does ``isinstance(x, JITFunction)`` and
  code subclasses ``KernelInterface``); its own attributes are inert values;
- any other attribute is an inert value; calling it with one callable returns that
  callable unchanged (``@triton.jit``), otherwise it returns a pass-through decorator
  (``@triton.autotune(...)``), so kernel *definitions* load and nothing ever runs.
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
