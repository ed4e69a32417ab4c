"""Which miles the conformance tier checks against: a miles checkout, a Megatron-LM checkout
and the python that has miles' dependencies.

Each comes from a pytest option, else an environment variable, else the folder
``.ci/conformance-env`` builds (``<repo>/.conformance``: the pinned archives of
``tests/conformance/upstream/`` unpacked next to a lean CPU venv):

=================  ==========================  ============================================
option             environment variable        on a node with the image
=================  ==========================  ============================================
``--miles-src``    ``MILES_AMD_MILES_SRC``     ``/root/miles``
``--megatron-src`` ``MILES_AMD_MEGATRON_SRC``  ``/root/Megatron-LM``
``--miles-python`` ``MILES_AMD_MILES_PYTHON``  the image's ``python3``
=================  ==========================  ============================================

With none of them the tier skips with :data:`HOW_TO_PROVIDE` as the reason; a value that
points at the wrong thing fails the tests that need it (never a silent skip).

Decides also whether the lean stand-ins for ``triton`` and ``torchvision``
(``import_stubs/``) go on the parse's ``PYTHONPATH``: only when that python lacks the real
packages, so on a node the real ones are imported.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DEFAULT_DIR = REPO / ".conformance"
IMPORT_STUBS = Path(__file__).resolve().parent / "import_stubs"

OPTIONS = (
    ("--miles-src", "MILES_AMD_MILES_SRC", "upstream/miles", "miles checkout (has train.py)"),
    ("--megatron-src", "MILES_AMD_MEGATRON_SRC", "upstream/Megatron-LM", "Megatron-LM checkout"),
    ("--miles-python", "MILES_AMD_MILES_PYTHON", "venv/bin/python", "python with miles' deps"),
)
HOW_TO_PROVIDE = (
    "conformance needs a miles checkout, a Megatron-LM checkout and a python with miles' "
    "dependencies: run `.ci/conformance-env` once (builds .conformance/ from the pinned "
    "archives), or pass --miles-src DIR --megatron-src DIR --miles-python PYTHON "
    "(env MILES_AMD_MILES_SRC, MILES_AMD_MEGATRON_SRC, MILES_AMD_MILES_PYTHON; on a node "
    "/root/miles, /root/Megatron-LM, python3)"
)


def add_options(parser: pytest.Parser) -> None:
    group = parser.getgroup("conformance", "conformance with the real miles")
    for flag, env_name, _, what in OPTIONS:
        group.addoption(flag, default=None, help=f"{what} (env {env_name})")


@dataclass(frozen=True)
class MilesCheckout:
    miles: Path
    megatron: Path
    python: Path
    needs_import_stubs: bool

    def parse_pythonpath(self, job_pythonpath: str) -> str:
        """The job's PYTHONPATH, plus the inert stand-ins last when this python lacks them."""
        extra = [str(IMPORT_STUBS)] if self.needs_import_stubs else []
        return os.pathsep.join([job_pythonpath, *extra])


def _given(config: pytest.Config) -> dict[str, str]:
    values = {}
    for flag, env_name, default_rel, _ in OPTIONS:
        value = config.getoption(flag) or os.environ.get(env_name)
        if not value and (DEFAULT_DIR / default_rel).exists():
            value = str(DEFAULT_DIR / default_rel)
        if value:
            values[flag] = value
    return values


def miles_src(config: pytest.Config) -> Path:
    """The miles checkout alone (for code of miles' that needs no interpreter of its own, such
    as ``tests/ci/``); skips with :data:`HOW_TO_PROVIDE` when none is given."""
    given = _given(config).get("--miles-src")
    if given is None:
        pytest.skip(HOW_TO_PROVIDE)
    path = Path(given)
    if not (path / "tests" / "ci" / "metric_history" / "gate.py").is_file():
        pytest.fail(f"conformance: --miles-src {given}: no tests/ci/metric_history there")
    return path.resolve()


def resolve(config: pytest.Config) -> MilesCheckout:
    """The checkout to test against; skips with :data:`HOW_TO_PROVIDE` when none is given."""
    given = _given(config)
    if not given:
        pytest.skip(HOW_TO_PROVIDE)
    missing = [flag for flag, *_ in OPTIONS if flag not in given]
    if missing:
        pytest.fail(f"conformance: {', '.join(missing)} not given; {HOW_TO_PROVIDE}")
    miles, megatron = Path(given["--miles-src"]), Path(given["--megatron-src"])
    python = Path(given["--miles-python"])
    checks = (
        (miles / "miles" / "utils" / "arguments.py", "--miles-src", "a miles checkout"),
        (megatron / "megatron" / "training" / "arguments.py", "--megatron-src", "Megatron-LM"),
        (python, "--miles-python", "an interpreter"),
    )
    for path, flag, what in checks:
        if not path.exists():
            pytest.fail(f"conformance: {flag} {given[flag]}: no {path} there; give {what}")
    probe = subprocess.run(
        [str(python), "-c", "import triton, torchvision"], capture_output=True, timeout=120
    )
    return MilesCheckout(miles.resolve(), megatron.resolve(), python, probe.returncode != 0)
