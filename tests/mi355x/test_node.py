"""The node itself: 8 AMD GPUs of arch gfx950 seen through the image's ROCm torch, and the
trainer's LoRA model as the image's miles and Megatron-Bridge build it."""

from __future__ import annotations

from typing import Any

import pytest

pytestmark = pytest.mark.mi355x

EXPECTED_GPUS = 8
EXPECTED_ARCH = "gfx950"


def test_node_shows_eight_gfx950_gpus_through_rocm_torch() -> None:
    torch = pytest.importorskip("torch", reason="the image's ROCm torch is required")
    assert torch.version.hip, f"torch {torch.__version__} is not a ROCm build (torch.version.hip)"
    assert torch.cuda.is_available(), "ROCm torch sees no GPU (check --device=/dev/kfd,/dev/dri)"
    count = torch.cuda.device_count()
    archs = [torch.cuda.get_device_properties(i).gcnArchName for i in range(count)]
    assert count == EXPECTED_GPUS, f"{count} GPUs visible, the recipe needs {EXPECTED_GPUS}"
    wrong = [a for a in archs if not a.startswith(EXPECTED_ARCH)]
    assert not wrong, f"GPU archs {archs}: expected all {EXPECTED_ARCH} (MI355X/MI350X)"


def test_the_image_builds_the_recipe_with_an_adapter_on_every_expert(node, tmp_path) -> None:
    """The deep probe with the image's Bridge and TE: one grouped linear per expert projection
    per layer (24 x 2 = 48), no fp32 router (miles#3263), config.json's sliding windows."""
    from miles_amd.run.probes import PreflightConfig
    from miles_amd.run.probes_miles import (
        attention_window_fact,
        lora_experts_fact,
        read_census,
        read_hf_config,
    )

    config = PreflightConfig(
        model_dir=node.model_dir,
        data_dir=node.data_dir,
        miles_dir=node.miles_dir,
        megatron_dir=node.megatron_dir,
        run_dir=tmp_path / "run",
    )
    census = read_census(config)
    assert census.get("ok") is True, f"the census stopped: {census}"
    lora: Any = census["lora"]
    router: Any = census["router"]
    assert (lora["expert"], lora["expert_grouped"], lora["expert_layers"]) == (48, 48, 24), lora
    assert lora_experts_fact(census, config.recipe().target_modules).status == "ok"
    assert router["moe_router_dtype"] == {"None": 24}  # flips when #3263 is fixed
    window = attention_window_fact(census, read_hf_config(config.checkpoint_dir))
    assert window.status == "ok", window
