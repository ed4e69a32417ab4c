"""The wheel, built offline from a copy of the tree and installed into a fresh venv (this
environment's packages behind a ``.pth``, so ``miles_amd`` is the wheel's, checked), holds its
data and gates its example away from the repo.
"""

from __future__ import annotations

import json
import os
import shutil
import site
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.cli_runs import flat
from tests.constants import REPO

SHIPPED_DATA = (
    "miles_amd/report/report.schema.json",
    "miles_amd/baseline/baseline.schema.json",
    "miles_amd/baseline/shipped-baselines/gpt_oss_20b_lora/8gpu/mi355x/patched.json",
    "miles_amd/baseline/shipped-baselines/gpt_oss_20b_lora/8gpu/mi355x/stock.json",
    "miles_amd/testing/example-run/job.json",
    "miles_amd/testing/example-run/job.log",
    "miles_amd/testing/example-run/README.md",
)

# Variables that would put the source tree or another baselines dir in front of the wheel.
DROPPED_ENV = ("PYTHONPATH", "PYTHONHOME", "PYTHONSAFEPATH", "MILES_AMD_BASELINES_DIR")


def run(
    argv: list[str], *, cwd: Path | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        argv, capture_output=True, text=True, check=False, timeout=300, cwd=cwd, env=env
    )


def copy_source_tree(dest: Path) -> Path:
    skip = shutil.ignore_patterns("__pycache__", "*.egg-info")
    shutil.copytree(REPO / "src", dest / "src", symlinks=True, ignore=skip)
    shutil.copytree(REPO / "baselines", dest / "baselines")
    example = dest / "examples" / "runs" / "jvvnhop9"
    shutil.copytree(REPO / "examples" / "runs" / "jvvnhop9", example, dirs_exist_ok=True)
    # A gate run leaves report/ in the example; it must not ship.
    (example / "report").mkdir(exist_ok=True)
    (example / "report" / "report.json").write_text("{}")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, dest / name)
    return dest


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tree = copy_source_tree(tmp_path_factory.mktemp("tree"))
    dist = tmp_path_factory.mktemp("dist")
    pip_wheel = [sys.executable, "-m", "pip", "wheel", str(tree), "-w", str(dist)]
    built = run([*pip_wheel, "--no-deps", "--no-build-isolation", "--no-index"])
    assert built.returncode == 0, (
        "building the wheel failed; this test needs the test extra's setuptools "
        f"(pip install -e '.[test]'):\n{built.stdout[-2000:]}\n{built.stderr[-2000:]}"
    )
    (found,) = dist.glob("miles_amd-*.whl")
    return found


@pytest.fixture(scope="module")
def venv(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("venv") / "venv"
    made = run([sys.executable, "-m", "venv", "--without-pip", str(root)])
    assert made.returncode == 0, made.stderr
    python = root / "bin" / "python"
    pip_install = [sys.executable, "-m", "pip", "--python", str(python), "install"]
    installed = run([*pip_install, "--no-deps", "--no-index", str(wheel)])
    assert installed.returncode == 0, installed.stderr
    purelib = run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"])
    # This environment's packages, after the venv's own site-packages (where the wheel is).
    outer = [p for p in site.getsitepackages() if Path(p).is_dir()]
    (Path(purelib.stdout.strip()) / "zz_test_env_packages.pth").write_text("\n".join(outer) + "\n")
    return root


def clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in DROPPED_ENV}


def test_the_wheel_holds_the_baselines_the_schema_and_the_example(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    missing = [name for name in SHIPPED_DATA if name not in names]
    assert not missing, f"{wheel.name} lacks {missing}"
    assert any(n.startswith("miles_amd/testing/example-run/tensorboard/events.") for n in names)
    assert any(n.startswith("miles_amd/testing/example-run/ci_history/") for n in names)
    leaked = [n for n in names if n.startswith("miles_amd/testing/example-run/report/")]
    assert not leaked, f"a gate report leaked into the wheel: {leaked}"


def test_the_installed_wheel_gates_its_example_run(venv: Path, tmp_path: Path) -> None:
    where = run(
        [
            str(venv / "bin" / "python"),
            "-c",
            "import miles_amd; from miles_amd.package_data import package_path; "
            "print(miles_amd.__file__); print(package_path('miles_amd.testing', 'example-run'))",
        ],
        cwd=tmp_path,
        env=clean_env(),
    )
    assert where.returncode == 0, where.stderr
    module_file, example = (Path(line) for line in where.stdout.split())
    assert module_file.is_relative_to(venv), f"miles_amd imported from {module_file}"
    assert example.is_relative_to(venv), f"example run read from {example}"

    run_dir = tmp_path / "jvvnhop9"
    shutil.copytree(example, run_dir)
    miles_amd = str(venv / "bin" / "miles-amd")
    argv = [miles_amd, "gate", "--run-dir", str(run_dir), "--baseline", "patched"]
    gate = run(argv, cwd=tmp_path, env=clean_env())
    assert gate.returncode == 0, f"exit {gate.returncode}\n{gate.stdout}\n{gate.stderr}"
    report = json.loads((run_dir / "report" / "report.json").read_text())
    assert report["verdict"] == "pass"

    # the README's wheel form: the shipped example, reported outside the installed package
    package = module_file.parent
    before = sorted(str(p.relative_to(package)) for p in package.rglob("*"))
    out = tmp_path / "example-report"
    argv = [miles_amd, "gate", "--example", "--baseline", "patched", "--report-dir", str(out)]
    example_gate = run(argv, cwd=tmp_path, env=clean_env())
    assert example_gate.returncode == 0, example_gate.stderr
    assert "against baseline patched (jvvnhop9)" in flat(example_gate.stdout)
    assert json.loads((out / "report.json").read_text())["verdict"] == "pass"
    inside = [miles_amd, "gate", "--run-dir", str(example), "--baseline", "patched"]
    refused = run(inside, cwd=tmp_path, env=clean_env())
    assert refused.returncode == 2 and "installed miles_amd package" in refused.stderr
    after = sorted(str(p.relative_to(package)) for p in package.rglob("*"))
    assert [p for p in after if "__pycache__" not in p] == [
        p for p in before if "__pycache__" not in p
    ]
