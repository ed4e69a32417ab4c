"""Where the files that ship inside the package are (``importlib.resources``). Git keeps
one copy at the top level and relative symlinks inside ``src/miles_amd``; a wheel holds real
files; a zipped install is an error saying so.
"""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path


class PackageDataError(RuntimeError):
    """Shipped data that is not a file-system path (a zipped install)."""


def package_path(anchor: str, *parts: str) -> Path:
    """The real path of ``parts`` inside package ``anchor`` (links resolved; existence is
    the caller's to check and explain)."""
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
