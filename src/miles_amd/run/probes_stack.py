"""Preflight probes of the software stack and inputs: packages, checkouts, aiter, disk.

Decides the ``sglang``, ``sglang_lora_endpoint``, ``megatron_bridge``, ``megatron_lm``,
``miles``, ``aiter``, ``aiter_variant``, ``checkpoint``, ``dataset`` and ``disk`` facts (see
``facts``). The hardware-only packages (sglang, megatron.bridge, aiter) are located with
``importlib.util.find_spec`` and ``importlib.metadata`` without being imported; nothing on
the machine is changed.

Facts about the environment the probes rely on:

- aiter: AMD's kernel library is the distribution ``amd-aiter`` providing module ``aiter``.
  The PyPI distribution named ``aiter`` is an unrelated async-iterator library that provides
  the same module name; finding it is ``wrong`` (``tests/unit/test_preflight.py``). The variants a
  run can be labelled with are ``miles_amd.variants.AITER_VARIANTS``.
- The SGLang that miles drives must serve ``/register_lora_adapter`` (miles calls it at the
  first LoRA weight update; images without it fail there with HTTP 404). The route is found
  as a quoted string in the sources under ``sglang/srt/entrypoints/``.
- Megatron-LM and miles run from checkouts put on ``PYTHONPATH`` by ``recipe.plan``, so they are
  probed in the given directories; their git commit comes from ``git -C <dir> rev-parse
  HEAD``. Packages installed in site-packages get no commit (a venv inside some other
  repository would otherwise report that repository's commit).
"""

from __future__ import annotations

import importlib.metadata
import re
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path

from miles_amd.recipe.hardware import run_tool
from miles_amd.recipe.inputs import InputError, validate_checkpoint, validate_dataset
from miles_amd.records.env import Fact
from miles_amd.run.facts import IMAGE, PreflightConfig, find_spec
from miles_amd.variants import AITER_VARIANTS

LORA_ROUTE = "/register_lora_adapter"
_GIB = 1024**3

# ---- Python packages and checkouts -----------------------------------------------------------


def probe_sglang(config: PreflightConfig) -> Fact:
    return installed_package_fact("sglang", module="sglang", distribution="sglang")


def probe_sglang_lora_endpoint(config: PreflightConfig) -> Fact:
    return sglang_lora_endpoint_fact(_package_dir("sglang"))


def sglang_lora_endpoint_fact(package_dir: Path | None) -> Fact:
    """Whether the SGLang package at ``package_dir`` serves :data:`LORA_ROUTE`."""
    name = "sglang_lora_endpoint"
    if package_dir is None:
        return Fact(name, "missing", "", f"sglang is not importable; run inside {IMAGE}")
    entrypoints = package_dir / "srt" / "entrypoints"
    sources = sorted(entrypoints.rglob("*.py")) if entrypoints.is_dir() else []
    if not sources:
        return Fact(
            name,
            "wrong",
            str(package_dir),
            f"cannot confirm {LORA_ROUTE}: no sources under {entrypoints}; "
            f"use an image whose SGLang serves it ({IMAGE})",
        )
    route = re.compile(r"[\"']" + re.escape(LORA_ROUTE) + r"[\"']")
    for source in sources:
        if route.search(source.read_text(encoding="utf-8", errors="replace")):
            return Fact(name, "ok", f"{LORA_ROUTE} in {source}")
    return Fact(
        name,
        "wrong",
        f"no {LORA_ROUTE} in {entrypoints}",
        "this SGLang fails at the first LoRA weight update with HTTP 404; "
        f"use an image whose SGLang has the endpoint ({IMAGE})",
    )


def probe_megatron_bridge(config: PreflightConfig) -> Fact:
    return installed_package_fact(
        "megatron_bridge", module="megatron.bridge", distribution="megatron-bridge"
    )


def probe_megatron_lm(config: PreflightConfig) -> Fact:
    """The Megatron-LM checkout the plan puts on PYTHONPATH (module ``megatron.core``)."""
    name = "megatron_lm"
    root = config.megatron_dir
    if not root.is_dir():
        return Fact(name, "missing", "", f"no Megatron-LM checkout at {root}; pass --megatron-dir")
    core = root / "megatron" / "core"
    if not (core / "__init__.py").is_file():
        return Fact(
            name,
            "wrong",
            str(root),
            f"{root} has no megatron/core/__init__.py; point --megatron-dir at Megatron-LM",
        )
    version = _megatron_core_version(core / "package_info.py") or "unknown version"
    return Fact(name, "ok", _with_commit(f"megatron.core {version}", git_commit(root)))


def _megatron_core_version(package_info: Path) -> str | None:
    try:
        text = package_info.read_text(encoding="utf-8")
    except OSError:
        return None
    parts = {
        key: m.group(1)
        for key in ("MAJOR", "MINOR", "PATCH", "PRE_RELEASE")
        if (m := re.search(rf"^{key}\s*=\s*['\"]?([\w.]*)['\"]?", text, re.MULTILINE))
    }
    if not {"MAJOR", "MINOR", "PATCH"} <= parts.keys():
        return None
    return f"{parts['MAJOR']}.{parts['MINOR']}.{parts['PATCH']}{parts.get('PRE_RELEASE', '')}"


def probe_miles(config: PreflightConfig) -> Fact:
    """The miles checkout: ``train.py`` is the job's entrypoint."""
    root = config.miles_dir
    if not root.is_dir():
        return Fact("miles", "missing", "", f"no miles checkout at {root}; pass --miles-dir")
    if not (root / "train.py").is_file():
        return Fact(
            "miles",
            "wrong",
            str(root),
            f"{root} has no train.py; point --miles-dir at a miles checkout",
        )
    return Fact("miles", "ok", _with_commit(str(root), git_commit(root)))


def probe_aiter(config: PreflightConfig) -> Fact:
    return aiter_fact(_package_dir("aiter"), _distributions_providing("aiter"))


def aiter_fact(package_dir: Path | None, distributions: Sequence[str]) -> Fact:
    """Judge the ``aiter`` module by the distributions that provide it.

    ``distributions`` are the names from ``importlib.metadata.packages_distributions()``.
    """
    name = "aiter"
    if package_dir is None:
        return Fact(name, "missing", "", f"AMD's aiter (amd-aiter) is not importable; use {IMAGE}")
    normalized = {_normalize(d) for d in distributions}
    if "aiter" in normalized:
        return Fact(
            name,
            "wrong",
            f"PyPI 'aiter' at {package_dir}",
            "module 'aiter' comes from the PyPI distribution 'aiter', an unrelated "
            "async-iterator library; `pip uninstall aiter` and use the image's amd-aiter",
        )
    if "amd-aiter" in normalized:
        version = _distribution_version("amd-aiter") or "unknown version"
        return Fact(name, "ok", _with_commit(f"amd-aiter {version}", git_commit(package_dir)))
    if (package_dir / "jit").is_dir():  # AMD's layout; a source install without metadata
        return Fact(name, "ok", _with_commit(f"aiter at {package_dir}", git_commit(package_dir)))
    return Fact(
        name,
        "wrong",
        f"unknown 'aiter' at {package_dir}",
        "module 'aiter' has no amd-aiter metadata and not AMD's layout (no aiter/jit); "
        "use the image's amd-aiter",
    )


def probe_aiter_variant(config: PreflightConfig) -> Fact:
    """Which aiter build the run is labelled with (stock, or patched with ROCm/aiter#5694)."""
    variant = config.aiter_variant
    if variant is None:
        return Fact(
            "aiter_variant",
            "ok",
            "unrecorded",
            f"pass --aiter-variant {'|'.join(AITER_VARIANTS)} to label the run's environment",
        )
    if variant not in AITER_VARIANTS:
        return Fact(
            "aiter_variant",
            "wrong",
            variant,
            f"--aiter-variant must be one of {', '.join(AITER_VARIANTS)}",
        )
    return Fact("aiter_variant", "ok", variant)


def installed_package_fact(name: str, *, module: str, distribution: str) -> Fact:
    """A package found on ``sys.path``: its distribution version and, from a checkout, commit."""
    package_dir = _package_dir(module)
    if package_dir is None:
        return Fact(
            name,
            "missing",
            "",
            f"module {module} is not importable (distribution {distribution}); use {IMAGE}",
        )
    version = _distribution_version(distribution)
    label = f"{distribution} {version}" if version else f"{module} at {package_dir}"
    return Fact(name, "ok", _with_commit(label, git_commit(package_dir)))


def _package_dir(module: str) -> Path | None:
    spec = find_spec(module)
    if spec is None:
        return None
    if spec.submodule_search_locations:
        return Path(next(iter(spec.submodule_search_locations)))
    return Path(spec.origin).parent if spec.origin else None


def _distributions_providing(module: str) -> list[str]:
    return list(importlib.metadata.packages_distributions().get(module, []))


def _distribution_version(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def _normalize(distribution: str) -> str:
    return re.sub(r"[-_.]+", "-", distribution).lower()


def git_commit(directory: Path) -> str | None:
    """HEAD of the checkout holding ``directory``; None outside a checkout or in site-packages."""
    if {"site-packages", "dist-packages"} & set(directory.parts):
        return None
    output = run_tool(["git", "-C", str(directory), "rev-parse", "HEAD"])
    commit = (output or "").strip()
    return commit if re.fullmatch(r"[0-9a-f]{40,64}", commit) else None


def _with_commit(label: str, commit: str | None) -> str:
    return f"{label} @ {commit[:12]}" if commit else label


# ---- inputs and disk -------------------------------------------------------------------------


def probe_checkpoint(config: PreflightConfig) -> Fact:
    return _input_fact("checkpoint", config.checkpoint_dir, validate_checkpoint)


def probe_dataset(config: PreflightConfig) -> Fact:
    return _input_fact("dataset", config.dataset_file, validate_dataset)


def _input_fact(name: str, path: Path, validate: Callable[[Path], None]) -> Fact:
    try:
        validate(path)
    except InputError as exc:
        return Fact(name, "wrong" if path.exists() else "missing", str(path), str(exc))
    return Fact(name, "ok", str(path))


def probe_disk(config: PreflightConfig) -> Fact:
    """Free space where the run dir goes (its nearest existing ancestor)."""
    where = _nearest_existing(config.run_dir.absolute().parent)
    free_gib = shutil.disk_usage(where).free / _GIB
    value = f"{free_gib:.1f} GiB free at {where}"
    if free_gib < config.min_free_gib:
        return Fact(
            "disk",
            "wrong",
            value,
            f"a run needs {config.min_free_gib:g} GiB for job.log, TensorBoard and CI history; "
            "free space or pass another --run-dir",
        )
    return Fact("disk", "ok", value)


def _nearest_existing(path: Path) -> Path:
    while not path.exists() and path != path.parent:
        path = path.parent
    return path
