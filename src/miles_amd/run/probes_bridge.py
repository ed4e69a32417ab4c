"""The deep preflight probe: the trainer's model as miles will build it, counted on the node.

- Decides the ``lora_experts``, ``router_dtype`` and ``attention_window`` facts from one run
  of ``run/bridge_census.py`` with the job's ``python3``, argv and env
  (``parse_probe.submitted_job``), in a subprocess with a time limit; only its JSON is read.
- ``lora_experts``: expert linears with a LoRA adapter and other wrapped layers; ``wrong``
  when none has one or a targeted expert linear (``recipe.lora_targets``) is bare. gpt-oss-20b
  with grouped GEMM has 24 x 2 = 48; the value names the adapter classes.
- ``router_dtype``: what the MoE routers compute in; the argv's fp32 not reaching the model
  is miles#3263 (``recipe.ignored_flags``): recorded, not a failure
  (``tests/unit/test_bridge_probe.py``).
- ``attention_window``: each layer's window against config.json's ``layer_types``; ``wrong``
  on a mismatch or an unreadable config.json. A window one token wider than HF's
  (Megatron-Bridge before NVIDIA-NeMo/Megatron-Bridge#2656) is said in the value.

Caveats:

- Where the child cannot answer (no miles, no Megatron-Bridge: a CPU machine), each fact is
  ``ok`` with ``unknown: <stage>: <reason>`` (``tests/unit/test_bridge_probe.py``); the gate
  decides what an unknown count means (``judge.model_build``).

Explained in ``docs/node.md`` ("The trainer's model (the deep probe)").
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from functools import lru_cache
from pathlib import Path

from miles_amd.recipe.lora_targets import LORA_TARGET_MODULES
from miles_amd.recipe.plan import build_train_plan
from miles_amd.records.env import Fact
from miles_amd.run.facts import PreflightConfig, one_line
from miles_amd.run.parse_probe import submitted_job

CENSUS = Path(__file__).with_name("bridge_census.py")
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
    with tempfile.TemporaryDirectory(prefix="bridge-census-") as tmp:
        result = Path(tmp) / "census.json"
        command = [python, str(CENSUS), "--result", str(result), "--", *argv]
        try:
            done = subprocess.run(
                command,
                env=dict(env),
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                timeout=CENSUS_TIMEOUT_S,
                cwd="/",
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            return {"ok": False, "stage": "run", "error": f"{python}: {one_line(exc)}"}
        try:
            reading = json.loads(result.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError):
            tail = one_line(Exception(done.stderr[-300:])) or f"exit {done.returncode}"
            return {"ok": False, "stage": "run", "error": f"no census written: {tail}"}
    return reading if isinstance(reading, dict) else {"ok": False, "stage": "run", "error": "?"}


def read_census(config: PreflightConfig, base_env: Mapping[str, str] | None = None) -> Reading:
    """The child's reading for ``config``'s recipe, as the job would run it (cached)."""
    env = dict(os.environ if base_env is None else base_env)
    job = submitted_job(build_train_plan(config.recipe(), env, run_dir=str(config.run_dir)), env)
    if not Path(job.train_script).is_file():
        return {"ok": False, "stage": "setup", "error": f"no miles checkout ({job.train_script})"}
    python = shutil.which(job.python, path=job.env.get("PATH"))
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
    """``lora_experts`` from the census (module doc); pure."""
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
    """``router_dtype`` from the census (module doc); pure, never a failure."""
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
    """``attention_window``: the built layers' windows against config.json (``hf_config``,
    or the one-line reason it could not be read); pure."""
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
    """config.json as a mapping, or the one-line reason it cannot be read (naming the file)."""
    path = checkpoint_dir / "config.json"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        return f"{path}: {one_line(exc)}; fix: re-download the checkpoint (miles-amd prepare)"
    if not isinstance(data, dict):
        return f"{path}: not a JSON object; fix: re-download the checkpoint (miles-amd prepare)"
    return data


def probe_lora_experts(config: PreflightConfig) -> Fact:
    return lora_experts_fact(read_census(config), config.recipe().target_modules)


def probe_router_dtype(config: PreflightConfig) -> Fact:
    return router_dtype_fact(read_census(config), config.recipe().argv())


def probe_attention_window(config: PreflightConfig) -> Fact:
    return attention_window_fact(read_census(config), read_hf_config(config.checkpoint_dir))
