"""Hardware identity: was the run made where its baseline was?

Decides how env.json reads as an :class:`Environment`, how it compares with the baseline's
``provenance.environment`` (ROCm by major.minor, the aiter commit by prefix, a field the
baseline leaves null not compared), and the ``environment.identity`` check: a mismatch fails
naming field and values; malformed facts fail when env.json vouches for hardware; without
env.json ``not_measured``, unless ``require_env``, which also fails a baseline without the GPU
arch, count and ROCm. Pure. ``baselines/README.md`` ("Hardware identity").
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from typing import TYPE_CHECKING

from miles_amd import variants
from miles_amd.rules.check import BuiltinCheck, Check, Status

if TYPE_CHECKING:
    from miles_amd.evidence.types import EnvRecord, RunEvidence
    from miles_amd.rules.model import Baseline

HARDWARE = ("gpu_arch", "gpu_count", "rocm")  # what --require-env needs the baseline to record
_RATIONALE = (
    "tolerances are measured on one GPU arch, GPU count, ROCm and aiter build; "
    "a run elsewhere is not judged by them"
)
_check = BuiltinCheck("environment.identity", "environment", _RATIONALE)


@dataclass(frozen=True)
class Environment:
    """A hardware identity; ``None`` where it is not recorded."""

    gpu_arch: str | None = None
    gpu_count: int | None = None
    rocm: str | None = None
    aiter_variant: str | None = None
    aiter_version: str | None = None
    aiter_commit: str | None = None
    gpu_model: str | None = None  # MI355X, MI350X: env.json's gpu_model fact

    def describe(self) -> str:
        gpus = f"{self.gpu_count or '?'}x {self.gpu_arch or '?'}"
        if self.gpu_model:
            gpus += f" {self.gpu_model}"
        aiter = f"aiter {self.aiter_variant or '?'}"
        if self.aiter_version:
            aiter += f" ({self.aiter_version})"
        if self.aiter_commit:
            aiter += f" @ {self.aiter_commit[:12]}"
        return f"{gpus}, ROCm {self.rocm or '?'}, {aiter}"

    def to_json(self) -> dict[str, object]:
        """JSON-ready; ``gpu_model`` only when known (baselines before it lack the field)."""
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        if out["gpu_model"] is None:
            del out["gpu_model"]
        return out


def run_environment(env: EnvRecord) -> Environment:
    """The identity env.json records; unparseable or absent values are None."""
    return Environment(
        gpu_arch=env.gpu_arch,
        gpu_count=env.gpu_count,
        rocm=env.rocm,
        aiter_variant=env.aiter_variant,
        aiter_version=env.aiter_version,
        aiter_commit=env.aiter_commit,
        gpu_model=env.value("gpu_model").split(" ")[0] or None,
    )


def compare(run: Environment, reference: Environment) -> tuple[list[str], list[str]]:
    """(mismatches, fields the baseline records and the run does not)."""
    mismatched, unrecorded = [], []
    for name in (f.name for f in fields(Environment)):
        expected, found = getattr(reference, name), getattr(run, name)
        if expected is None or (found is None and name == "gpu_model"):
            continue  # gpu_model: an env.json of a preflight before the gpu_model fact
        if found is None:
            unrecorded.append(name)
        elif name != "aiter_commit":
            if found != expected:
                mismatched.append(f"{name}: run {found}, baseline {expected}")
        elif not (str(found).startswith(str(expected)) or str(expected).startswith(str(found))):
            variant = reference.aiter_variant
            build = f" ({variants.describe(variant)})" if variant else ""
            mismatched.append(
                f"{name}: run {found}, baseline {expected} (the baseline's aiter{build}); fix: "
                "run on an aiter built from the baseline's commit (AITER_PATCHED_REF / "
                "AITER_PATCHED_DIR for patched), or record a baseline from this build with "
                "`miles-amd baseline record`"
            )
    return mismatched, unrecorded


def environment_check(
    evidence: RunEvidence,
    baseline: Baseline,
    *,
    require_env: bool,
    control_arm: bool = False,
    key: Environment | None = None,
) -> Check:
    """``environment.identity`` of ``evidence`` against ``baseline``; see
    ``baselines/README.md`` ("Hardware identity"). ``key``: a record-only run's GPU count
    and model, which replace the template baseline's (``miles_amd.baseline.keys``)."""
    raw = baseline.provenance.get("environment")
    raw = raw if isinstance(raw, Mapping) else {}
    reference = Environment(**{f.name: raw.get(f.name) for f in fields(Environment)})
    if key is not None:
        reference = replace(reference, gpu_model=key.gpu_model, gpu_count=key.gpu_count)
    if control_arm:
        reference = replace(reference, aiter_variant=None)
    expected = reference.describe()
    unknown = [name for name in HARDWARE if getattr(reference, name) is None]
    if require_env and unknown:
        detail = (
            f"the baseline records no {', '.join(unknown)} (provenance.environment), so it "
            "cannot vouch for this hardware; record it from a run with a passing preflight"
        )
        return _check("fail", None, expected, detail, True)
    if evidence.env is None:
        unreadable = [p.detail for p in evidence.problems if p.source == "env_json"]
        if unreadable:
            return _check("fail", None, expected, f"env.json unreadable: {unreadable[0]}", True)
        detail = (
            "not measured: no env.json in the run dir; run `miles-amd preflight --run-dir RUN "
            "--aiter-variant stock|patched` before the run"
        )
        return _check.absent(None, expected, detail, require_env)
    unbelievable = evidence.env.problems
    vouches = require_env or len(unknown) < len(HARDWARE)  # env.json stands for hardware
    if unbelievable and vouches:
        detail = f"env.json cannot vouch for this node: {'; '.join(unbelievable)}"
        return _check("fail", None, expected, detail, True)
    run = run_environment(evidence.env)
    mismatched, unrecorded = compare(run, reference)
    recorded = sum(getattr(reference, f.name) is not None for f in fields(Environment))
    if not mismatched and len(unrecorded) == recorded:
        detail = f"not measured: env.json records none of {', '.join(unrecorded)}"
        return _check.absent(run.describe(), expected, detail, require_env)
    parts = [f"mismatch: {'; '.join(mismatched)}"] if mismatched else []
    if unrecorded:
        parts.append(f"env.json does not record {', '.join(unrecorded)}")
    status: Status = "fail" if mismatched or (unrecorded and require_env) else "pass"
    detail = "; ".join(parts) or f"env.json matches the baseline's {expected}"
    return _check(status, run.describe(), expected, detail, require_env or bool(mismatched))
