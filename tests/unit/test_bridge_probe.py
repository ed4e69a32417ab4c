"""The deep probe's facts (``run.probes_miles``) and its child's failure paths, on CPU.

The facts are judged from census readings (``tests.bridge_readings``: one measured on CPU with
the real Megatron-Bridge, one shaped as a node's from the sources). The child
``node/bridge_census.py`` runs for real in subprocesses: without miles or Megatron-Bridge it
must write why and exit 1, and the probe must turn that into an ``unknown`` fact, not a crash.
What the child reads from a real model is ``tests/conformance/test_bridge_census.py``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from miles_amd.recipe.settings import Recipe
from miles_amd.run import probes_miles as probes_bridge
from miles_amd.run.probes import PreflightConfig
from miles_amd.run.probes_miles import (
    CENSUS,
    attention_window_fact,
    lora_experts_fact,
    read_census,
    read_hf_config,
    router_dtype_fact,
)
from tests.bridge_readings import CPU_MEASURED, NO_ADAPTER, NODE_EXPECTED, UNKNOWN, reading
from tests.conformance.fake_inputs import GPT_OSS_20B_BF16_CONFIG

pytestmark = pytest.mark.unit

TARGETS = ("gate_proj", "up_proj", "down_proj")
ARGV = Recipe().argv()


def test_lora_experts_an_adapter_on_every_targeted_expert_linear() -> None:
    node = lora_experts_fact(NODE_EXPECTED, TARGETS)
    assert node.status == "ok"
    assert node.value.startswith(
        "48 expert linears LoRA-wrapped (48 grouped, 0 per-expert, over 24 layers; "
        "48 ParallelLinearAdapter), 0 other"
    )
    cpu = lora_experts_fact(CPU_MEASURED, TARGETS)
    assert cpu.status == "ok" and cpu.value.startswith("1536 expert linears LoRA-wrapped")
    assert "megatron.bridge 0.3.1" in cpu.value
    none = lora_experts_fact(NO_ADAPTER, ("gate_up_proj",))
    assert none.status == "wrong" and none.value.startswith("0 expert linears LoRA-wrapped")
    assert "targets gate_up_proj" in none.message
    assert "gate_proj,up_proj,down_proj" in none.message  # how to fix
    half = reading(expert=24, grouped=24, window=[127, 0], bare={"linear_fc2": 24})
    fact = lora_experts_fact(half, TARGETS)  # down_proj -> linear_fc2 should be wrapped
    assert fact.status == "wrong" and "24 linear_fc2" in fact.message
    assert lora_experts_fact(half, ("gate_proj", "up_proj")).status == "ok"  # untargeted


def test_an_unanswered_census_is_unknown_with_its_reason_never_a_failure() -> None:
    for fact in (
        lora_experts_fact(UNKNOWN, TARGETS),
        router_dtype_fact(UNKNOWN, ARGV),
        attention_window_fact(UNKNOWN, GPT_OSS_20B_BF16_CONFIG),
    ):
        assert fact.status == "ok"
        assert fact.value == "unknown: build: ModuleNotFoundError: No module named 'megatron'"


def test_the_router_runs_bf16_and_the_dropped_fp32_is_named_not_failed() -> None:
    fact = router_dtype_fact(NODE_EXPECTED, ARGV)
    assert fact.status == "ok"
    assert fact.value.startswith("bf16 (24 with moe_router_dtype=None)")
    assert "--moe-router-dtype fp32 does not reach it (radixark/miles#3263)" in fact.value
    fixed = router_dtype_fact(reading(expert=48, grouped=48, window=[127, 0], router="fp32"), ARGV)
    assert fixed.value == "fp32 (24 with moe_router_dtype=fp32)"


def test_windows_against_config_json() -> None:
    node = attention_window_fact(NODE_EXPECTED, GPT_OSS_20B_BF16_CONFIG)
    assert node.status == "ok"
    assert node.value.startswith("window (127, 0) on 12 of 24 layers (1,3,...,23)")
    assert "sliding_window 128 counting the query token" in node.value
    cpu = attention_window_fact(CPU_MEASURED, GPT_OSS_20B_BF16_CONFIG)
    assert cpu.status == "ok"
    assert "one token wider than config.json's sliding_window 128" in cpu.value
    full = attention_window_fact(
        reading(expert=48, grouped=48, window=None), GPT_OSS_20B_BF16_CONFIG
    )
    assert full.status == "wrong"
    assert full.value.startswith("window none on 0 of 24 layers")
    assert "slide on layers 1,3,...,23" in full.message
    shifted = {
        **GPT_OSS_20B_BF16_CONFIG,
        "layer_types": ["full_attention", "sliding_attention"] * 12,
    }
    assert attention_window_fact(NODE_EXPECTED, shifted).status == "wrong"


def test_a_bad_config_json_is_one_line_naming_the_file(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{not json")
    reason = read_hf_config(tmp_path)
    assert isinstance(reason, str) and str(tmp_path / "config.json") in reason
    assert "\n" not in reason and "miles-amd prepare" in reason
    fact = attention_window_fact(NODE_EXPECTED, reason)
    assert fact.status == "wrong" and fact.message == reason
    (tmp_path / "config.json").write_text("[1, 2]")
    assert "not a JSON object" in str(read_hf_config(tmp_path))
    (tmp_path / "config.json").write_text(json.dumps(GPT_OSS_20B_BF16_CONFIG))
    assert read_hf_config(tmp_path) == GPT_OSS_20B_BF16_CONFIG


def _config(tmp_path: Path, miles: Path) -> PreflightConfig:
    return PreflightConfig(
        model_dir=tmp_path / "models",
        data_dir=tmp_path / "data",
        miles_dir=miles,
        megatron_dir=tmp_path / "Megatron-LM",
        run_dir=tmp_path / "run",
    )


def test_the_real_child_without_miles_says_so_and_the_facts_stay_unknown(tmp_path: Path) -> None:
    found = read_census(_config(tmp_path, tmp_path / "nowhere"), base_env={"PATH": ""})
    assert found["ok"] is False and found["stage"] == "setup"  # no checkout: not run
    assert "no miles checkout" in str(found["error"])
    miles = tmp_path / "miles"
    miles.mkdir()
    (miles / "train.py").write_text("")
    probes_bridge._run_census.cache_clear()
    env = {"PATH": str(Path(sys.executable).parent)}  # the job's python3: this venv's
    found = read_census(_config(tmp_path, miles), base_env=env)
    assert found == {
        "ok": False,
        "stage": "parse_args",
        "error": "ModuleNotFoundError: No module named 'miles'",
    }
    assert lora_experts_fact(found, TARGETS).value.startswith("unknown: parse_args: ")


def test_the_child_past_parsing_without_megatron_bridge_stops_at_build_and_checks_usage(
    tmp_path: Path,
) -> None:
    fake = tmp_path / "fake_miles" / "miles" / "utils"
    fake.mkdir(parents=True)
    for package in (fake.parent, fake):
        (package / "__init__.py").write_text("")
    (fake / "arguments.py").write_text(
        "import argparse\ndef parse_args():\n    return argparse.Namespace()\n"
    )
    result = tmp_path / "census.json"
    done = subprocess.run(
        [sys.executable, str(CENSUS), "--result", str(result), "--", "--lora-rank", "32"],
        env={"PYTHONPATH": str(tmp_path / "fake_miles")},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1, done.stderr
    written = json.loads(result.read_text())
    assert (written["ok"], written["stage"]) == (False, "build")
    assert "No module named 'megatron" in written["error"]
    done = subprocess.run([sys.executable, str(CENSUS), "--result"], capture_output=True, text=True)
    assert done.returncode == 64 and "usage: bridge_census.py" in done.stderr
