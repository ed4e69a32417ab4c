"""Where the files that ship inside the package are, read through ``importlib.resources``.

Shipped: the baselines (``baseline/shipped-baselines/``), the baseline schema and the
embedded example run (``testing/example-run/``). Git keeps one copy at the repo's top level
(``baselines/``, ``examples/runs/jvvnhop9/``) and relative symlinks inside ``src/miles_amd``
(hyphenated, so setuptools does not take them for sub-packages); a wheel holds real files.
A resource that is not a file-system path (a zipped install) is an error saying so.
"""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path


class PackageDataError(RuntimeError):
    """Shipped data that is not a file-system path (a zipped install)."""


def package_path(anchor: str, *parts: str) -> Path:
    """The real path of ``parts`` inside package ``anchor`` (links resolved).

    Existence is not checked: a caller that needs the file says what is missing and how to
    fix it.
    """
    resource = files(anchor)
    for part in parts:
        resource = resource / part
    if not isinstance(resource, Path):
        name = "/".join((anchor.replace(".", "/"), *parts))
        raise PackageDataError(
            f"{name}: package data is not on the file system ({type(resource).__name__}); "
            "fix: install miles-amd unpacked (pip install miles-amd), not from a zip"
        )
    return resource.resolve()
