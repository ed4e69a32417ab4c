"""The preflight's probes: ``probe_<name>(config) -> Fact``, reading the node, changing nothing.

Where each value comes from: ``docs/node.md`` ("How the preflight reads the node").
"""

from __future__ import annotations

import importlib.machinery
import importlib.metadata
import importlib.util
import json
import re
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from miles_amd.recipe.inputs import InputError, validate_checkpoint, validate_dataset
from miles_amd.recipe.settings import (
    CHECKPOINT_NAME,
    DATASET_DIR_NAME,
    DATASET_FILE_NAME,
    HardwareDetectionError,
    Runner,
    detect_hardware,
    run_tool,
)
from miles_amd.records.env import Fact
from miles_amd.variants import AITER_VARIANTS

if TYPE_CHECKING:
    from miles_amd.recipe.settings import Recipe


IMAGE = "rocm/sgl-dev:miles-rocm720-mi35x"


@dataclass(frozen=True)
class PreflightConfig:
    model_dir: Path
    data_dir: Path
    miles_dir: Path
    megatron_dir: Path
    run_dir: Path
    expected_gpus: int = 8
    expected_arch: str = "gfx950"
    expected_rocm: str = "7.2"
    aiter_variant: str | None = None
    min_free_gib: float = 20.0  # TensorBoard events, CI history and job.log of one run
    rocm_root: Path = Path("/opt/rocm")

    @property
    def checkpoint_dir(self) -> Path:
        return self.model_dir / CHECKPOINT_NAME

    @property
    def dataset_file(self) -> Path:
        return self.data_dir / DATASET_DIR_NAME / DATASET_FILE_NAME

    def recipe(self) -> Recipe:
        from miles_amd.recipe.settings import Recipe

        return Recipe(
            num_gpus=self.expected_gpus,
            model_dir=str(self.model_dir),
            data_dir=str(self.data_dir),
            miles_dir=str(self.miles_dir),
            megatron_dir=str(self.megatron_dir),
        )

    def as_dict(self) -> dict[str, object]:
        return {k: str(v) if isinstance(v, Path) else v for k, v in asdict(self).items()}


def find_spec(module: str) -> importlib.machinery.ModuleSpec | None:
    try:  # a parent package absent raises
        return importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None


def one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())


RESULT = "{result}"  # in a child's argv: the path of the file it writes its answer to


def child_json(
    argv: Sequence[str], env: Mapping[str, str], timeout_s: float, what: str, marker: str = ""
) -> tuple[dict[str, Any] | None, str]:
    """The JSON object ``argv`` (run from ``/``) wrote to :data:`RESULT` when named, else on its
    last stdout line starting with ``marker``; else None and one line why."""
    with tempfile.TemporaryDirectory(prefix="miles-amd-child-") as tmp:
        result = Path(tmp) / "result.json"
        command = [str(result) if arg == RESULT else arg for arg in argv]
        try:
            done = subprocess.run(
                command,
                env=dict(env),
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                timeout=timeout_s,
                cwd="/",
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            return None, f"{argv[0]} could not run: {one_line(exc)}"
        try:
            if RESULT in argv:
                text = result.read_text(encoding="utf-8")
            else:
                lines = [x for x in done.stdout.splitlines() if x.strip() and x.startswith(marker)]
                text = lines[-1].removeprefix(marker)
            reading = json.loads(text)
        except (OSError, IndexError, ValueError):
            reading = None
    if isinstance(reading, dict):
        return reading, ""
    tail = one_line(Exception(done.stderr[-300:])) or f"exit {done.returncode}"
    return None, f"{argv[0]} gave no {what}: {tail}"


def probe_gpus(config: PreflightConfig) -> Fact:
    reading = None  # (source, archs): the ROCm torch, else amd-smi, else rocm-smi
    if find_spec("torch") is not None:
        import torch

        if getattr(torch.version, "hip", None) and torch.cuda.is_available():
            props = map(torch.cuda.get_device_properties, range(torch.cuda.device_count()))
            reading = "torch", [_arch(p.gcnArchName) for p in props]
    for tool, parse in (
        (["amd-smi", "static", "--asic", "--json"], parse_amd_smi_static),
        (["rocm-smi", "--showproductname", "--json"], parse_rocm_smi_product),
    ):
        output = None if reading else run_tool(tool)
        archs = None if output is None else parse(output)
        reading = reading or (None if archs is None else (tool[0], archs))
    if not reading:
        why = (
            "no AMD GPU visible: no ROCm torch with devices and neither amd-smi nor rocm-smi "
            f"answered; run on an {config.expected_gpus}x {config.expected_arch} node "
            f"(MI355X/MI350X) inside {IMAGE}"
        )
        return Fact("gpus", "missing", "", why)
    source, archs = reading
    return judge_gpus(archs, source, config.expected_gpus, config.expected_arch)


def probe_gpu_model(config: PreflightConfig, runner: Runner = run_tool) -> Fact:
    try:
        return Fact("gpu_model", "ok", detect_hardware(runner).value)
    except HardwareDetectionError as exc:
        return Fact("gpu_model", "missing", "", str(exc).removeprefix("--hardware auto: "))


def judge_gpus(archs: Sequence[str], source: str, expected: int, arch: str) -> Fact:
    if not archs:
        why = f"{source} lists no GPU; check the container's --device=/dev/kfd --device=/dev/dri"
        return Fact("gpus", "missing", f"0 ({source})", why)
    found = ",".join(sorted(set(archs)))
    value = f"{len(archs)}x {found} ({source})"
    if any(a != arch for a in archs):
        why = f"the recipe is validated on {arch} (MI355X/MI350X); found {found}"
        return Fact("gpus", "wrong", value, why)
    if len(archs) != expected:
        why = (
            f"the recipe needs {expected} GPUs, {len(archs)} visible; "
            "check HIP_VISIBLE_DEVICES and the container's device flags"
        )
        return Fact("gpus", "wrong", value, why)
    return Fact("gpus", "ok", value)


def _arch(name: object) -> str:
    return str(name).split(":", 1)[0].strip().lower()


def parse_amd_smi_static(text: str) -> list[str] | None:
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        return None
    archs: list[str] = []
    nodes = [data]
    while nodes:  # depth first, in document order
        node = nodes.pop(0)
        asic = node.get("asic") if isinstance(node, dict) else None
        if isinstance(asic, dict) and "target_graphics_version" in asic:
            archs.append(_arch(asic["target_graphics_version"]))
        elif isinstance(node, (dict, list)):
            nodes[:0] = node.values() if isinstance(node, dict) else node
    return archs


def parse_rocm_smi_product(text: str) -> list[str] | None:
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        return None
    return (
        None
        if not isinstance(data, dict)
        else [
            _arch(card.get("GFX Version", "unknown"))
            for key, card in sorted(data.items())
            if key.startswith("card") and isinstance(card, dict)
        ]
    )


def probe_rocm(config: PreflightConfig) -> Fact:
    info = config.rocm_root / ".info" / "version"
    version: str | None
    try:
        version, source = info.read_text(encoding="utf-8").split()[0], str(info)
    except (OSError, IndexError):
        match = re.search(r"ROCm version:\s*([0-9][0-9.]*)", run_tool(["amd-smi", "version"]) or "")
        version, source = (match.group(1), "amd-smi version") if match else (None, "")
    if version is None:
        why = (
            f"no ROCm found ({config.rocm_root}/.info/version absent, amd-smi not answering); "
            f"run inside {IMAGE}"
        )
        return Fact("rocm", "missing", "", why)
    value = f"{version} ({source})"
    major_minor = [
        [int(n) for n in re.findall(r"\d+", v)[:2]] for v in (version, config.expected_rocm)
    ]
    if major_minor[0] != major_minor[1]:
        why = f"the recipe's baselines were measured on ROCm {config.expected_rocm}; use {IMAGE}"
        return Fact("rocm", "wrong", value, why)
    return Fact("rocm", "ok", value)


def probe_torch(config: PreflightConfig) -> Fact:
    if find_spec("torch") is None:
        return Fact("torch", "missing", "", f"torch is not importable; run inside {IMAGE}")
    try:
        import torch
    except Exception as exc:
        return Fact("torch", "wrong", "", f"import torch failed: {one_line(exc)}")
    hip = getattr(torch.version, "hip", None)
    if not hip:
        why = "this torch is not a ROCm build (torch.version.hip is None); use the image's torch"
        return Fact("torch", "wrong", str(torch.__version__), why)
    return Fact("torch", "ok", f"{torch.__version__} (HIP {hip})")


LORA_ROUTE = "/register_lora_adapter"


def probe_sglang(config: PreflightConfig) -> Fact:
    return installed_package_fact("sglang", module="sglang", distribution="sglang")


def probe_sglang_lora_endpoint(config: PreflightConfig) -> Fact:
    return sglang_lora_endpoint_fact(_package_dir("sglang"))


def sglang_lora_endpoint_fact(package_dir: Path | None) -> Fact:
    name = "sglang_lora_endpoint"
    if package_dir is None:
        return Fact(name, "missing", "", f"sglang is not importable; run inside {IMAGE}")
    entrypoints = package_dir / "srt" / "entrypoints"
    sources = sorted(entrypoints.rglob("*.py")) if entrypoints.is_dir() else []
    if not sources:
        why = (
            f"cannot confirm {LORA_ROUTE}: no sources under {entrypoints}; "
            f"use an image whose SGLang serves it ({IMAGE})"
        )
        return Fact(name, "wrong", str(package_dir), why)
    route = re.compile(r"[\"']" + re.escape(LORA_ROUTE) + r"[\"']")
    for source in sources:
        if route.search(source.read_text(encoding="utf-8", errors="replace")):
            return Fact(name, "ok", f"{LORA_ROUTE} in {source}")
    why = (
        "this SGLang fails at the first LoRA weight update with HTTP 404; "
        f"use an image whose SGLang has the endpoint ({IMAGE})"
    )
    return Fact(name, "wrong", f"no {LORA_ROUTE} in {entrypoints}", why)


def probe_megatron_bridge(config: PreflightConfig) -> Fact:
    return installed_package_fact(
        "megatron_bridge", module="megatron.bridge", distribution="megatron-bridge"
    )


def probe_megatron_lm(config: PreflightConfig) -> Fact:
    name, root = "megatron_lm", config.megatron_dir
    if not root.is_dir():
        return Fact(name, "missing", "", f"no Megatron-LM checkout at {root}; pass --megatron-dir")
    core = root / "megatron" / "core"
    if not (core / "__init__.py").is_file():
        why = f"{root} has no megatron/core/__init__.py; point --megatron-dir at Megatron-LM"
        return Fact(name, "wrong", str(root), why)
    try:
        text = (core / "package_info.py").read_text(encoding="utf-8")
    except OSError:
        text = ""
    parts = {
        key: m.group(1)
        for key in ("MAJOR", "MINOR", "PATCH", "PRE_RELEASE")
        if (m := re.search(rf"^{key}\s*=\s*['\"]?([\w.]*)['\"]?", text, re.MULTILINE))
    }
    version = "unknown version"
    if {"MAJOR", "MINOR", "PATCH"} <= parts.keys():
        version = "{MAJOR}.{MINOR}.{PATCH}".format(**parts) + parts.get("PRE_RELEASE", "")
    return Fact(name, "ok", _with_commit(f"megatron.core {version}", git_commit(root)))


def probe_miles(config: PreflightConfig) -> Fact:
    root = config.miles_dir
    if not root.is_dir():
        return Fact("miles", "missing", "", f"no miles checkout at {root}; pass --miles-dir")
    if not (root / "train.py").is_file():
        why = f"{root} has no train.py; point --miles-dir at a miles checkout"
        return Fact("miles", "wrong", str(root), why)
    return Fact("miles", "ok", _with_commit(str(root), git_commit(root)))


def probe_aiter(config: PreflightConfig) -> Fact:
    providing = importlib.metadata.packages_distributions().get("aiter", [])
    return aiter_fact(_package_dir("aiter"), providing)


def aiter_fact(package_dir: Path | None, distributions: Sequence[str]) -> Fact:
    name = "aiter"
    if package_dir is None:
        return Fact(name, "missing", "", f"AMD's aiter (amd-aiter) is not importable; use {IMAGE}")
    normalized = {re.sub(r"[-_.]+", "-", d).lower() for d in distributions}
    if "aiter" in normalized:
        why = (
            "module 'aiter' comes from the PyPI distribution 'aiter', an unrelated "
            "async-iterator library; `pip uninstall aiter` and use the image's amd-aiter"
        )
        return Fact(name, "wrong", f"PyPI 'aiter' at {package_dir}", why)
    if "amd-aiter" in normalized:
        version = _distribution_version("amd-aiter") or "unknown version"
        return Fact(name, "ok", _with_commit(f"amd-aiter {version}", git_commit(package_dir)))
    if (package_dir / "jit").is_dir():  # AMD's layout; a source install without metadata
        return Fact(name, "ok", _with_commit(f"aiter at {package_dir}", git_commit(package_dir)))
    why = (
        "module 'aiter' has no amd-aiter metadata and not AMD's layout (no aiter/jit); "
        "use the image's amd-aiter"
    )
    return Fact(name, "wrong", f"unknown 'aiter' at {package_dir}", why)


def probe_aiter_variant(config: PreflightConfig) -> Fact:
    variant = config.aiter_variant
    if variant is None:
        why = f"pass --aiter-variant {'|'.join(AITER_VARIANTS)} to label the run's environment"
        return Fact("aiter_variant", "ok", "unrecorded", why)
    if variant not in AITER_VARIANTS:
        why = f"--aiter-variant must be one of {', '.join(AITER_VARIANTS)}"
        return Fact("aiter_variant", "wrong", variant, why)
    return Fact("aiter_variant", "ok", variant)


def installed_package_fact(name: str, *, module: str, distribution: str) -> Fact:
    package_dir = _package_dir(module)
    if package_dir is None:
        why = f"module {module} is not importable (distribution {distribution}); use {IMAGE}"
        return Fact(name, "missing", "", why)
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


def _distribution_version(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def git_commit(directory: Path) -> str | None:
    if {"site-packages", "dist-packages"} & set(directory.parts):
        return None
    output = run_tool(["git", "-C", str(directory), "rev-parse", "HEAD"])
    commit = (output or "").strip()
    return commit if re.fullmatch(r"[0-9a-f]{40,64}", commit) else None


def _with_commit(label: str, commit: str | None) -> str:
    return f"{label} @ {commit[:12]}" if commit else label


def probe_checkpoint(config: PreflightConfig) -> Fact:
    return input_fact("checkpoint", config.checkpoint_dir, validate_checkpoint)


def probe_dataset(config: PreflightConfig) -> Fact:
    return input_fact("dataset", config.dataset_file, validate_dataset)


def input_fact(name: str, path: Path, validate: Callable[[Path], None]) -> Fact:
    try:
        validate(path)
    except InputError as exc:
        return Fact(name, "wrong" if path.exists() else "missing", str(path), str(exc))
    return Fact(name, "ok", str(path))


def probe_disk(config: PreflightConfig) -> Fact:
    where = config.run_dir.absolute().parent
    while not where.exists() and where != where.parent:
        where = where.parent
    free_gib = shutil.disk_usage(where).free / 1024**3
    value = f"{free_gib:.1f} GiB free at {where}"
    if free_gib < config.min_free_gib:
        why = (
            f"a run needs {config.min_free_gib:g} GiB for job.log, TensorBoard and CI history; "
            "free space or pass another --run-dir"
        )
        return Fact("disk", "wrong", value, why)
    return Fact("disk", "ok", value)
