"""Preflight probes of the node: GPU count, arch and model, the ROCm release, a ROCm torch.

Decides the ``gpus``, ``gpu_model``, ``rocm`` and ``torch`` facts (see ``facts`` for what a
fact is). No GPU memory is allocated; torch is imported only when it is installed.

Facts about the environment the probes rely on:

- GPUs: the ROCm torch reports ``torch.version.hip`` and per device
  ``get_device_properties(i).gcnArchName`` such as ``gfx950:sramecc+:xnack-`` (the arch is
  the part before the first colon). Without a usable torch, ``amd-smi static --asic --json``
  gives records with ``asic.target_graphics_version`` (newer releases wrap the list in
  ``{"gpu_data": [...]}``, older ones print the bare list, so records are found by shape), and
  ``rocm-smi --showproductname --json`` gives ``{"card0": {"GFX Version": "gfx950", ...}}``.
  A machine with none of them reports ``missing``.
- ROCm: ``<rocm_root>/.info/version`` holds e.g. ``7.2.0-43``; ``amd-smi version`` prints
  ``ROCm version: 7.2.0``. The recipe was measured on ROCm 7.2.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from pathlib import Path

from miles_amd.recipe.hardware import HardwareDetectionError, Runner, detect_hardware, run_tool
from miles_amd.records.env import Fact
from miles_amd.run.facts import IMAGE, PreflightConfig, find_spec, one_line

# ---- GPUs ------------------------------------------------------------------------------------


def probe_gpus(config: PreflightConfig) -> Fact:
    """GPU count and arch, from the ROCm torch, else ``amd-smi``, else ``rocm-smi``."""
    reading = _gpus_from_torch() or _gpus_from_amd_smi(run_tool) or _gpus_from_rocm_smi(run_tool)
    if reading is None:
        return Fact(
            "gpus",
            "missing",
            "",
            "no AMD GPU visible: no ROCm torch with devices and neither amd-smi nor rocm-smi "
            f"answered; run on an {config.expected_gpus}x {config.expected_arch} node "
            f"(MI355X/MI350X) inside {IMAGE}",
        )
    source, archs = reading
    return judge_gpus(archs, source, config.expected_gpus, config.expected_arch)


def probe_gpu_model(config: PreflightConfig, runner: Runner = run_tool) -> Fact:
    """The GPU model (MI355X, MI350X) the ROCm tools name: the key of the baselines that may
    judge a run here (``miles_amd.baseline.keys``); two models, or none, are ``missing``."""
    try:
        return Fact("gpu_model", "ok", detect_hardware(runner).value)
    except HardwareDetectionError as exc:
        return Fact("gpu_model", "missing", "", str(exc).removeprefix("--hardware auto: "))


def judge_gpus(archs: Sequence[str], source: str, expected: int, arch: str) -> Fact:
    """Pure judgement of the GPUs one source reported."""
    if not archs:
        return Fact(
            "gpus",
            "missing",
            f"0 ({source})",
            f"{source} lists no GPU; check the container's --device=/dev/kfd --device=/dev/dri",
        )
    found = ",".join(sorted(set(archs)))
    value = f"{len(archs)}x {found} ({source})"
    if any(a != arch for a in archs):
        return Fact(
            "gpus",
            "wrong",
            value,
            f"the recipe is validated on {arch} (MI355X/MI350X); found {found}",
        )
    if len(archs) != expected:
        return Fact(
            "gpus",
            "wrong",
            value,
            f"the recipe needs {expected} GPUs, {len(archs)} visible; "
            "check HIP_VISIBLE_DEVICES and the container's device flags",
        )
    return Fact("gpus", "ok", value)


def _arch(name: object) -> str:
    return str(name).split(":", 1)[0].strip().lower()


def _gpus_from_torch() -> tuple[str, list[str]] | None:
    if find_spec("torch") is None:
        return None
    import torch

    if not getattr(torch.version, "hip", None) or not torch.cuda.is_available():
        return None
    count = torch.cuda.device_count()
    return "torch", [_arch(torch.cuda.get_device_properties(i).gcnArchName) for i in range(count)]


def _gpus_from_amd_smi(runner: Runner) -> tuple[str, list[str]] | None:
    output = runner(["amd-smi", "static", "--asic", "--json"])
    if output is None:
        return None
    archs = parse_amd_smi_static(output)
    return None if archs is None else ("amd-smi", archs)


def parse_amd_smi_static(text: str) -> list[str] | None:
    """Archs of the GPU records in ``amd-smi static --asic --json``; None if not JSON."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        return None
    archs: list[str] = []

    def visit(node: object) -> None:
        if isinstance(node, dict):
            asic = node.get("asic")
            if isinstance(asic, dict) and "target_graphics_version" in asic:
                archs.append(_arch(asic["target_graphics_version"]))
                return
            for child in node.values():
                visit(child)
        elif isinstance(node, list):
            for child in node:
                visit(child)

    visit(data)
    return archs


def _gpus_from_rocm_smi(runner: Runner) -> tuple[str, list[str]] | None:
    output = runner(["rocm-smi", "--showproductname", "--json"])
    if output is None:
        return None
    archs = parse_rocm_smi_product(output)
    return None if archs is None else ("rocm-smi", archs)


def parse_rocm_smi_product(text: str) -> list[str] | None:
    """Archs of the ``cardN`` entries of ``rocm-smi --showproductname --json``."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        return None
    if not isinstance(data, dict):
        return None
    return [
        _arch(card.get("GFX Version", "unknown"))
        for key, card in sorted(data.items())
        if key.startswith("card") and isinstance(card, dict)
    ]


# ---- ROCm and torch --------------------------------------------------------------------------


def probe_rocm(config: PreflightConfig) -> Fact:
    """The ROCm release, from ``<rocm_root>/.info/version`` or ``amd-smi version``."""
    version, source = _rocm_version(config.rocm_root, run_tool)
    if version is None:
        return Fact(
            "rocm",
            "missing",
            "",
            f"no ROCm found ({config.rocm_root}/.info/version absent, amd-smi not answering); "
            f"run inside {IMAGE}",
        )
    value = f"{version} ({source})"
    if _major_minor(version) != _major_minor(config.expected_rocm):
        return Fact(
            "rocm",
            "wrong",
            value,
            f"the recipe's baselines were measured on ROCm {config.expected_rocm}; use {IMAGE}",
        )
    return Fact("rocm", "ok", value)


def _rocm_version(rocm_root: Path, runner: Runner) -> tuple[str | None, str]:
    info = rocm_root / ".info" / "version"
    try:
        text = info.read_text(encoding="utf-8").strip()
    except OSError:
        text = ""
    if text:
        return text.split()[0], str(info)
    output = runner(["amd-smi", "version"])
    match = re.search(r"ROCm version:\s*([0-9][0-9.]*)", output or "")
    return (match.group(1), "amd-smi version") if match else (None, "")


def _major_minor(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", version)[:2])


def probe_torch(config: PreflightConfig) -> Fact:
    """torch must be a ROCm build: ``torch.version.hip`` set."""
    if find_spec("torch") is None:
        return Fact("torch", "missing", "", f"torch is not importable; run inside {IMAGE}")
    try:
        import torch
    except Exception as exc:
        return Fact("torch", "wrong", "", f"import torch failed: {one_line(exc)}")
    hip = getattr(torch.version, "hip", None)
    if not hip:
        return Fact(
            "torch",
            "wrong",
            str(torch.__version__),
            "this torch is not a ROCm build (torch.version.hip is None); use the image's torch",
        )
    return Fact("torch", "ok", f"{torch.__version__} (HIP {hip})")
