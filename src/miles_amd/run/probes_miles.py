"""The probes that run miles' own code on the job's exact argv and env: its parser, its model
build. ``docs/node.md`` ("The trainer's model (the deep probe)").
"""

from __future__ import annotations

import itertools
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from functools import lru_cache
from pathlib import Path
from typing import Any

from miles_amd.recipe.plan import LaunchPlan, build_train_plan
from miles_amd.recipe.settings import LORA_TARGET_MODULES
from miles_amd.records.env import Fact
from miles_amd.run.probes import RESULT, PreflightConfig, child_json, one_line

SCRIPT = Path(__file__).parents[1] / "node" / "miles_parse.py"
PARSE_TIMEOUT_S = 180.0
_ARGPARSE_ERROR = re.compile(r"^\S+: error: (?P<message>.+)$")


@dataclass(frozen=True)
class ParseOutcome:
    returncode: int | None  # None: killed at the time limit
    args: dict[str, Any] | None
    message: str  # the parser's one line when not ok; "" when ok
    stderr: str
    seconds: float

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and self.args is not None


@dataclass(frozen=True)
class SubmittedJob:
    python: str
    train_script: str
    train_argv: list[str]
    env: dict[str, str]


def submitted_job(plan: LaunchPlan, base_env: Mapping[str, str]) -> SubmittedJob:
    """What the driver submits for ``plan`` (``env`` holds secrets)."""
    if plan.job is None:
        raise ValueError("the plan has no job; build it with build_train_plan")
    entrypoint = list(plan.job.entrypoint)
    scripts = [i for i, token in enumerate(entrypoint) if token.endswith("/train.py")]
    if len(scripts) != 1 or scripts[0] != 1:
        raise ValueError(f"the job's entrypoint is not `python train.py ...`: {entrypoint[:3]}")
    runtime_env: dict[str, str] = plan.job.runtime_env()["env_vars"]  # type: ignore[assignment]
    env = {**base_env, **plan.process_env, **runtime_env}
    return SubmittedJob(entrypoint[0], entrypoint[1], entrypoint[2:], env)


def _job_python(
    config: PreflightConfig, base_env: Mapping[str, str] | None
) -> tuple[SubmittedJob, str | None]:
    env = dict(os.environ if base_env is None else base_env)
    job = submitted_job(build_train_plan(config.recipe(), env, run_dir=str(config.run_dir)), env)
    return job, shutil.which(job.python, path=job.env.get("PATH"))


def parse_with_miles(
    train_argv: Sequence[str],
    env: Mapping[str, str],
    *,
    python: str | Path,
    gpu_stubs: bool = False,
    timeout: float = PARSE_TIMEOUT_S,
) -> ParseOutcome:
    with tempfile.TemporaryDirectory(prefix="miles-parse-") as tmp:
        result = Path(tmp) / "result.json"
        command = [str(python), str(SCRIPT), "--result", str(result)]
        command += ["--stub-gpu-queries"] if gpu_stubs else []
        command += ["--", *train_argv]
        start = time.monotonic()
        try:
            done = subprocess.run(
                command,
                env=dict(env),
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                timeout=timeout,
            )
        except subprocess.TimeoutExpired as exc:  # subprocess.run has killed the child
            raw = exc.stderr or ""
            stderr = raw.decode(errors="replace") if isinstance(raw, bytes) else raw
            message = f"the parse did not finish within {timeout:g} s"
            outcome = ParseOutcome(None, None, message, stderr, time.monotonic() - start)
        else:
            outcome = read_outcome(done.returncode, result, done.stderr, time.monotonic() - start)
    from miles_amd.redact import SECRET_VARS, redact

    secrets = [env[name] for name in SECRET_VARS if env.get(name)]  # the child may quote them
    return replace(
        outcome, message=redact(outcome.message, secrets), stderr=redact(outcome.stderr, secrets)
    )


def read_outcome(returncode: int, result: Path, stderr: str, seconds: float) -> ParseOutcome:
    """What the child wrote to ``result`` (untrusted: a child killed mid-write cuts it)."""
    try:
        payload = json.loads(result.read_text(encoding="utf-8")) if result.is_file() else {}
        if not isinstance(payload, dict):
            raise ValueError("not a JSON object")
    except (OSError, ValueError) as exc:  # UnicodeDecodeError and JSONDecodeError included
        why = f"{result}: the parse child's answer is unreadable ({one_line(exc)}); rerun it"
        return ParseOutcome(returncode, None, why, stderr, seconds)
    args = payload.get("args") if returncode == 0 and payload.get("ok") else None
    message = ""  # else argparse's error line, the validator's exception, stderr's last line
    if args is None:
        lines = [line.strip() for line in stderr.splitlines() if line.strip()]
        refusals = [m["message"] for line in lines if (m := _ARGPARSE_ERROR.match(line))]
        last = lines[-1] if lines else f"exit {returncode} with nothing on stderr"
        message = refusals[-1] if refusals else str(payload.get("error") or "") or last
    return ParseOutcome(returncode, args, message, stderr, seconds)


def probe_miles_argv(
    config: PreflightConfig,
    *,
    base_env: Mapping[str, str] | None = None,
    gpu_stubs: bool = False,
    timeout: float = PARSE_TIMEOUT_S,
) -> Fact:
    name = "miles_argv"
    job, python = _job_python(config, base_env)
    if not Path(job.train_script).is_file():
        why = f"no {job.train_script}; point --miles-dir at a miles checkout"
        return Fact(name, "missing", "", why)
    if python is None:
        return Fact(name, "missing", "", f"no `{job.python}` on the job's PATH to run train.py")
    outcome = parse_with_miles(
        job.train_argv, job.env, python=python, gpu_stubs=gpu_stubs, timeout=timeout
    )
    where = f"{python} {job.train_script}"
    if outcome.ok:
        return Fact(name, "ok", f"{len(outcome.args or {})} args parsed by {where}")
    if outcome.returncode is None:
        why = (
            f"{outcome.message}: importing miles hangs in this image; run `{where} --help` "
            "to see where"
        )
        return Fact(name, "wrong", where, why)
    why = (
        f"miles' parse_args rejects the argv train would submit: {outcome.message}; "
        "the job would fail the same way before training (README: Conformance with the real "
        "miles)"
    )
    return Fact(name, "wrong", where, why)


CENSUS = Path(__file__).parents[1] / "node" / "bridge_census.py"
CENSUS_TIMEOUT_S = 600.0  # imports (~15 s) plus building 24 layers on meta; a wedge, not a pace
ROUTER_ISSUE = "radixark/miles#3263"
WINDOW_FIX = "NVIDIA-NeMo/Megatron-Bridge#2656"
_FIX = (
    "fix: use names miles maps to the experts' linear_fc1/linear_fc2 "
    "(gate_proj,up_proj,down_proj) in --target-modules"
)

Reading = Mapping[str, object]


@lru_cache(maxsize=4)
def _run_census(python: str, argv: tuple[str, ...], env: tuple[tuple[str, str], ...]) -> Reading:
    command = [python, str(CENSUS), "--result", RESULT, "--", *argv]
    reading, why = child_json(command, dict(env), CENSUS_TIMEOUT_S, "census")
    return {"ok": False, "stage": "run", "error": why} if reading is None else reading


def read_census(config: PreflightConfig, base_env: Mapping[str, str] | None = None) -> Reading:
    job, python = _job_python(config, base_env)
    if not Path(job.train_script).is_file():
        return {"ok": False, "stage": "setup", "error": f"no miles checkout ({job.train_script})"}
    if python is None:
        return {"ok": False, "stage": "setup", "error": f"no `{job.python}` on the job's PATH"}
    return _run_census(python, tuple(job.train_argv), tuple(sorted(job.env.items())))


def _unknown(name: str, reading: Reading) -> Fact:
    stage, error = reading.get("stage", "?"), reading.get("error", "no reason given")
    return Fact(name, "ok", f"unknown: {stage}: {error}")


def _section(reading: Reading, key: str) -> Mapping[str, object]:
    value = reading.get(key)
    return value if isinstance(value, Mapping) else {}


def _int(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def lora_experts_fact(reading: Reading, target_modules: Sequence[str]) -> Fact:
    name = "lora_experts"
    if reading.get("ok") is not True:
        return _unknown(name, reading)
    lora = _section(reading, "lora")
    expert, other = _int(lora.get("expert")), _int(lora.get("other"))
    grouped, layers = _int(lora.get("expert_grouped")), _int(lora.get("expert_layers"))
    kinds = _section(lora, "expert_adapters")
    adapters = ", ".join(f"{n} {kind}" for kind, n in sorted(kinds.items())) or "none"
    layout = f"{grouped} grouped, {expert - grouped} per-expert, over {layers} layers; {adapters}"
    bridge = reading.get("bridge")
    value = f"{expert} expert linears LoRA-wrapped ({layout}), {other} other [{bridge}]"
    if expert == 0:
        message = (
            f"no MoE expert linear has a LoRA adapter (targets {','.join(target_modules)}): "
            f"the run would train no expert adapter and pass for healthy; {_FIX}"
        )
        return Fact(name, "wrong", value, message)
    bare = _section(lora, "bare_expert")
    wanted = {LORA_TARGET_MODULES.get(t, t) for t in target_modules}
    missed = {leaf: _int(n) for leaf, n in bare.items() if leaf in wanted and _int(n)}
    if missed:
        listed = ", ".join(f"{n} {leaf}" for leaf, n in sorted(missed.items()))
        message = f"expert linears the targets name got no adapter: {listed}; {_FIX}"
        return Fact(name, "wrong", value, message)
    return Fact(name, "ok", value)


def router_dtype_fact(reading: Reading, argv: Sequence[str]) -> Fact:
    name = "router_dtype"
    if reading.get("ok") is not True:
        return _unknown(name, reading)
    router = _section(reading, "router")
    settings = _section(router, "moe_router_dtype")
    model_dtype = str(router.get("params_dtype") or "?")
    effective = sorted({s if s in ("fp32", "fp64") else model_dtype for s in settings})
    asked = argv[argv.index("--moe-router-dtype") + 1] if "--moe-router-dtype" in argv else None
    counted = ", ".join(f"{n} with moe_router_dtype={s}" for s, n in sorted(settings.items()))
    value = f"{'/'.join(effective) or 'no router'} ({counted or 'no MoE router built'})"
    if asked and effective != [asked]:
        value += f"; the argv's --moe-router-dtype {asked} does not reach it ({ROUTER_ISSUE})"
    return Fact(name, "ok", value)


def attention_window_fact(reading: Reading, hf_config: Mapping[str, object] | str) -> Fact:
    name = "attention_window"
    if isinstance(hf_config, str):
        return Fact(name, "wrong", "", hf_config)
    if reading.get("ok") is not True:
        return _unknown(name, reading)
    layers = _section(reading, "attention").get("layers")
    built = list(layers) if isinstance(layers, list) else []
    windowed = [i + 1 for i, w in enumerate(built) if w]
    sizes = sorted({tuple(w) for w in built if isinstance(w, list)})
    value = (
        f"window {', '.join(map(str, sizes)) or 'none'} on {len(windowed)} of {len(built)} "
        f"layers ({_ranges(windowed)}), full attention on the rest"
    )
    types = hf_config.get("layer_types")
    expected = [t == "sliding_attention" for t in types] if isinstance(types, list) else None
    if expected is None:
        return Fact(name, "ok", value + "; config.json has no layer_types to compare")
    if expected != [bool(w) for w in built]:
        sliding = [i + 1 for i, s in enumerate(expected) if s]
        message = (
            f"config.json's layer_types slide on layers {_ranges(sliding) or 'none'} but the "
            "trainer's model does on the above: it would not compute the model SGLang serves; "
            "fix: use the image's Megatron-Bridge gpt-oss provider unmodified"
        )
        return Fact(name, "wrong", value, message)
    return Fact(name, "ok", value + _size_note(sizes, hf_config.get("sliding_window")))


def _size_note(sizes: list[tuple[int, ...]], sliding: object) -> str:
    if not isinstance(sliding, int) or not sizes:
        return "; as config.json's layer_types"
    lefts = {size[0] for size in sizes}
    if lefts == {sliding - 1}:
        return f"; as config.json (sliding_window {sliding} counting the query token)"
    if lefts == {sliding}:
        return f"; one token wider than config.json's sliding_window {sliding} ({WINDOW_FIX})"
    return f"; config.json's sliding_window is {sliding}"


def _ranges(numbers: list[int]) -> str:
    if len(numbers) > 2 and all(b - a == 2 for a, b in itertools.pairwise(numbers)):
        return f"{numbers[0]},{numbers[1]},...,{numbers[-1]}"
    return ",".join(map(str, numbers))


def read_hf_config(checkpoint_dir: Path) -> Mapping[str, object] | str:
    """config.json, or the one-line reason it cannot be read."""
    path = checkpoint_dir / "config.json"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        why = "" if isinstance(data, dict) else "not a JSON object"
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        why = one_line(exc)
    return f"{path}: {why}; fix: re-download the checkpoint (miles-amd prepare)" if why else data


def probe_lora_experts(config: PreflightConfig) -> Fact:
    return lora_experts_fact(read_census(config), config.recipe().target_modules)


def probe_router_dtype(config: PreflightConfig) -> Fact:
    return router_dtype_fact(read_census(config), config.recipe().argv())


def probe_attention_window(config: PreflightConfig) -> Fact:
    return attention_window_fact(read_census(config), read_hf_config(config.checkpoint_dir))
