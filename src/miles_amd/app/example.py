"""The embedded example run as ``gate --example`` uses it, and where its report may go.

- :func:`example_run_dir`: the example's run dir, shipped as package data
  (``testing/example-run`` below the package; in the repo a link to
  ``examples/runs/jvvnhop9``, in an installed wheel a copy inside site-packages:
  ``miles_amd.package_data``).
- :func:`example_report_dir`: ``--report-dir`` when given, else a new temporary dir, so the
  gate never writes into the installed package.
- :func:`inside_installed_package`: whether a path lies in the installed ``miles_amd``
  package (a report there would change the installation); in the repo the example resolves
  to ``examples/runs/``, outside the package, so the README's repo form writes where it says.

``tests/unit/test_packaging.py`` gates ``--example`` from an installed wheel and checks the
package is unchanged; ``tests/unit/test_gate_cli.py`` covers the refusals.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

__all__ = ["example_report_dir", "example_run_dir", "inside_installed_package"]

# read as data below the package root, so the product imports nothing of the testing
# package (tests/unit/test_testing_package.py)
EXAMPLE_PARTS = ("testing", "example-run")


def example_run_dir() -> Path:
    """The embedded example's run dir (real path, links resolved)."""
    from miles_amd.package_data import package_path

    return package_path("miles_amd", *EXAMPLE_PARTS)


def package_root() -> Path:
    """The installed ``miles_amd`` package directory (real path)."""
    import miles_amd

    return Path(miles_amd.__file__).resolve().parent


def inside_installed_package(path: Path) -> bool:
    """Whether ``path`` (made absolute, links resolved) lies in the ``miles_amd`` package."""
    return Path(path).resolve().is_relative_to(package_root())


def example_report_dir(given: Path | None) -> Path:
    """``given``, else a new temporary directory (``miles-amd-example-*``)."""
    if given is not None:
        return given
    return Path(tempfile.mkdtemp(prefix="miles-amd-example-"))
