"""The A/B premise on the node: the job's SGLang aiter env, aiter's build, SGLang's route.

``docs/node.md`` ("The preflight's all-reduce probes").
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Literal

from miles_amd import variants
from miles_amd.records.env import Fact
from miles_amd.run.probes import PreflightConfig, child_json, git_commit

Route = Literal["aiter", "sglang", "none", "invalid"]

SGLANG_SOURCE = "sglang/srt/distributed/device_communicators/custom_all_reduce.py"
DETERMINISTIC_FLAGS = (
    "--sglang-enable-deterministic-inference",
    "--true-on-policy-mode",
    "--recompute-logprobs-via-prefill",
    "--sglang-rl-on-policy-target",
)
DISABLE_FLAG = "--sglang-disable-custom-all-reduce"
_ENV_TRUE, _ENV_FALSE = ("true", "1", "yes", "y"), ("false", "0", "no", "n")


@dataclass(frozen=True)
class AllreduceRoute:
    route: Route
    reason: str

    def text(self) -> str:
        return f"{self.route}: {self.reason}"


def allreduce_route(
    env: Mapping[str, str], argv: Sequence[str], aiter_import_error: str | None
) -> AllreduceRoute:
    if DISABLE_FLAG in argv:
        return AllreduceRoute("none", f"{DISABLE_FLAG}: no custom all-reduce (RCCL only)")
    one_stage = env.get("SGLANG_USE_1STAGE_ALLREDUCE")
    if one_stage is not None:
        value = one_stage.lower()
        if value in _ENV_TRUE:
            return AllreduceRoute("sglang", f"SGLANG_USE_1STAGE_ALLREDUCE={one_stage}: 1-stage")
        if value not in _ENV_FALSE:
            return AllreduceRoute(
                "invalid", f"SGLANG_USE_1STAGE_ALLREDUCE={one_stage!r} makes SGLang raise"
            )
    else:
        flags = [flag for flag in DETERMINISTIC_FLAGS if flag in argv]
        if flags:
            return AllreduceRoute("sglang", f"{flags[0]}: deterministic 1-stage all-reduce")
    aiter_ar = env.get("SGLANG_USE_AITER_AR", "true")
    if aiter_ar.lower() not in ("true", "1"):
        return AllreduceRoute("sglang", f"SGLANG_USE_AITER_AR={aiter_ar}")
    if aiter_import_error is not None:
        return AllreduceRoute(
            "sglang",
            "fallback: aiter.dist.device_communicators.custom_all_reduce does not import "
            f"({aiter_import_error})",
        )
    return AllreduceRoute("aiter", "AiterCustomAllreduce (SGLANG_USE_AITER_AR on, it imports)")


SGLANG_ENV_KEYS = ("SGLANG_USE_AITER", "SGLANG_USE_AITER_AR", "SGLANG_USE_1STAGE_ALLREDUCE")
CHILD_TIMEOUT_S = 300.0  # importing aiter on a node loads its JIT modules
_SCM_LOCAL = re.compile(r"\+g([0-9a-f]{7,40})(?:\.|$)")
_HEX = re.compile(r"^[0-9a-f]{7,64}$")

# Runs in the job's python3 with the job's PYTHONPATH; stdlib only; prints one JSON object.
CHILD = r"""
import importlib.metadata as md, importlib.util, json, os, re
out = {"package_dir": None, "version_py": None, "dists": [], "ar_import_error": None}
try:
    spec = importlib.util.find_spec("aiter")
except Exception as exc:
    spec = None
    out["ar_import_error"] = f"{type(exc).__name__}: {exc}"
if spec is not None and spec.submodule_search_locations:
    pkg = list(spec.submodule_search_locations)[0]
    out["package_dir"] = pkg
    try:
        with open(os.path.join(pkg, "_version.py"), encoding="utf-8") as f:
            out["version_py"] = f.read(4096)
    except OSError:
        pass
for dist in md.distributions():
    name = re.sub(r"[-_.]+", "-", dist.metadata.get("Name") or "").lower()
    if name == "amd-aiter":
        direct_url = dist.read_text("direct_url.json")
        out["dists"].append({"version": dist.version, "direct_url": direct_url})
try:
    import aiter.dist.device_communicators.custom_all_reduce  # noqa: F401  (as SGLang does)
except BaseException as exc:
    out["ar_import_error"] = f"{type(exc).__name__}: {exc}"
print(json.dumps(out))
"""


def job_sglang_env(variant: str | None, launch_env: Mapping[str, str]) -> dict[str, str]:
    inherited = {k: launch_env[k] for k in SGLANG_ENV_KEYS if k in launch_env}
    return {**inherited, **variants.sglang_env(variant)}


def job_pythonpath(config: PreflightConfig, launch_env: Mapping[str, str]) -> str:
    from miles_amd.recipe.plan import job_env_vars

    env = job_env_vars(config.recipe(), launch_env, "127.0.0.1", None, config.aiter_variant)
    return env["PYTHONPATH"]


@lru_cache(maxsize=8)
def read_job_aiter(pythonpath: str, python: str = "python3") -> Mapping[str, object]:
    """What :data:`CHILD` finds, or ``{"error": ...}``."""
    env = {**os.environ, "PYTHONPATH": pythonpath}
    reading, why = child_json([python, "-c", CHILD], env, CHILD_TIMEOUT_S, "reading")
    return {"error": why} if reading is None else reading


@lru_cache(maxsize=8)
def read_aiter_fix(pythonpath: str, python: str = "python3") -> Mapping[str, object]:
    """``miles_amd.aiter_fix``'s fingerprint from a child ``python`` with ``pythonpath``, or
    ``{"value": "unknown: ..."}``."""
    from miles_amd import aiter_fix

    script = Path(aiter_fix.__file__).read_text(encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": pythonpath}
    argv = [python, "-c", script]
    reading, why = child_json(argv, env, CHILD_TIMEOUT_S, "fingerprint", aiter_fix.MARKER)
    if reading is not None and not isinstance(reading.get("value"), str):
        reading, why = None, f"{python} gave no fingerprint: no value in its answer"
    return {"value": f"unknown: {why}"} if reading is None else reading


def probe_aiter_fix(config: PreflightConfig) -> Fact:
    reading = read_aiter_fix(job_pythonpath(config, os.environ))
    return aiter_fix_fact(config.aiter_variant, str(reading["value"]))


def aiter_fix_fact(variant: str | None, value: str) -> Fact:
    from miles_amd.aiter_fix import FIXED, UNKNOWN, verdict_of

    verdict = verdict_of(value)
    if variant == "patched" and verdict != FIXED:
        holds = "is not shown to hold" if verdict == UNKNOWN else "does not hold"
        why = (
            f"the patched run's aiter {holds} {variants.AITER_FIX}'s fix; point "
            f"{variants.PATCHED_DIR_VAR} at the patched checkout or install it (pip install -e)"
        )
        return Fact("aiter_fix", "wrong", value, why)
    if variant == "stock" and verdict == FIXED:
        why = (
            f"the stock run's aiter holds {variants.AITER_FIX}'s fix; run stock on the image's "
            "aiter (no patched build on PYTHONPATH or installed over it)"
        )
        return Fact("aiter_fix", "wrong", value, why)
    return Fact("aiter_fix", "ok", value)


def probe_sglang_aiter_env(config: PreflightConfig) -> Fact:
    env = job_sglang_env(config.aiter_variant, os.environ)
    return Fact(
        "sglang_aiter_env", "ok", " ".join(f"{k}={env.get(k, 'unset')}" for k in SGLANG_ENV_KEYS)
    )


def probe_aiter_commit(config: PreflightConfig) -> Fact:
    reading = read_job_aiter(job_pythonpath(config, os.environ))
    package = reading.get("package_dir")
    git = git_commit(Path(str(package))) if isinstance(package, str) else None
    return aiter_commit_fact(reading, git)


def aiter_commit_fact(reading: Mapping[str, object], git_commit: str | None) -> Fact:
    name = "aiter_commit"
    if "error" in reading:
        return Fact(name, "ok", f"unknown: {reading['error']}")
    package = reading.get("package_dir")
    if not isinstance(package, str):
        return Fact(name, "ok", "unknown: the job's python3 finds no module aiter")
    if git_commit:
        return Fact(name, "ok", f"{git_commit} (git checkout {package})")
    looked = [f"{package} is no git checkout"]
    listed = reading.get("dists")
    dists = [d for d in listed if isinstance(d, dict)] if isinstance(listed, list) else []
    for dist in dists:
        try:
            commit = str(json.loads(str(dist.get("direct_url")))["vcs_info"]["commit_id"])
        except (ValueError, TypeError, KeyError):  # no direct_url.json, not JSON, no vcs_info
            continue
        if _HEX.match(commit):
            return Fact(name, "ok", f"{commit} (amd-aiter direct_url.json vcs_info)")
    looked.append("no amd-aiter direct_url.json with vcs_info")
    version_py = reading.get("version_py")
    if isinstance(version_py, str):
        quoted = re.search(r"""__version__\s*=\s*['"]([^'"]+)['"]""", version_py)
        version = quoted.group(1) if quoted else ""
        if match := _SCM_LOCAL.search(version):
            return Fact(name, "ok", f"{match.group(1)} (aiter/_version.py, setuptools-scm +g)")
        looked.append(f"aiter/_version.py says {version or '?'!r}")
    for dist in dists:
        version = str(dist.get("version") or "")
        if match := _SCM_LOCAL.search(version):
            return Fact(name, "ok", f"{match.group(1)} (amd-aiter {version}, setuptools-scm +g)")
        looked.append(f"amd-aiter {version} has no +g<sha> (a tagged release build)")
    return Fact(name, "ok", "unknown: " + "; ".join(looked))


def probe_sglang_allreduce(config: PreflightConfig) -> Fact:
    reading = read_job_aiter(job_pythonpath(config, os.environ))
    error = reading.get("error") or reading.get("ar_import_error")
    return sglang_allreduce_fact(
        config.aiter_variant,
        job_sglang_env(config.aiter_variant, os.environ),
        config.recipe().argv(),
        str(error) if error else None,
    )


def sglang_allreduce_fact(
    variant: str | None, env: Mapping[str, str], argv: list[str], import_error: str | None
) -> Fact:
    route = allreduce_route(env, argv, import_error)
    value = f"{route.text()} [{SGLANG_SOURCE}]"
    if variant is None:
        return Fact("sglang_allreduce", "ok", value)
    want = "aiter" if variants.aiter_allreduce_expected(variant) else "sglang"
    if route.route == want:
        return Fact("sglang_allreduce", "ok", value)
    need = (
        f"the {variant} variant is about aiter's all-reduce ({variants.AITER_FIX} lives there)"
        if want == "aiter"
        else "the rccl control arm must run SGLang's own all-reduce"
    )
    why = (
        f"{need}; fix: run with the job env miles-amd sets (--aiter-variant {variant}), unset "
        "SGLANG_USE_1STAGE_ALLREDUCE, drop deterministic flags, and make aiter's "
        "custom_all_reduce import in the job's python3"
    )
    return Fact("sglang_allreduce", "wrong", value, why)
