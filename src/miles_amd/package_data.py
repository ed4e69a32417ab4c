"""Where the files that ship inside the package are, read through ``importlib.resources``.

The package ships three kinds of data (``[tool.setuptools.package-data]`` in
``pyproject.toml`` lists them):

- the baselines, ``miles_amd/baseline/shipped-baselines/gpt_oss_20b_lora/*/*/*.json``;
- the baseline schema, ``miles_amd/baseline/baseline.schema.json``;
- the embedded example run, ``miles_amd/testing/example-run/`` (jvvnhop9).

Git keeps one copy of the baselines and of the example at the repo's top level
(``baselines/``, ``examples/runs/jvvnhop9/``), where reviewers read them; inside
``src/miles_amd`` they are relative symlinks. Reading through the source tree or an
editable install follows the links; building a wheel or an sdist copies the files the links
point at (setuptools' ``build_py`` globs through directory links and copies contents), so an
installed wheel holds real files. The link names carry a hyphen so setuptools does not
take the data directories for sub-packages.

This module decides only where shipped data is; what a file means is decided by its reader.
pip installs a wheel unpacked, so a resource is a real path; anything else is an error that
says so (``tests/unit/test_packaging.py`` installs the wheel and gates its example run).
"""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

__all__ = ["PackageDataError", "package_path"]


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
