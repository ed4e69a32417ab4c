"""Run ``bridge_census``'s build and census on CPU with the real Megatron-Bridge, miles and
Megatron-LM, the node-only parts replaced by the fewest stand-ins that let them run.

Executed BY FILE PATH with a python that has ``megatron-bridge`` (PyPI, ``--no-deps``), torch
(the CPU wheel) and transformers, ``PYTHONPATH`` leading to miles and Megatron-LM::

    python bridge_harness.py --census SCRIPT --result FILE -- <train.py args>

Real: Megatron-Bridge's ``AutoBridge`` and gpt-oss provider from the checkpoint's config.json,
miles' ``_setup_lora_model_via_bridge`` and ``create_lora_instance`` (its target-name mapping),
Megatron-Bridge's ``LoRA`` transform and ``is_expert_linear``, Megatron-LM's ``GPTModel``, MoE
layer, router and ``is_layer_window_attention``.

Stand-ins, each for something that cannot install or run on CPU:

- ``transformer_engine``: no CPU build exists (PyPI's needs CUDA). Megatron-Bridge imports it
  at module level, so an empty module answers the import (only when the real one is absent);
  Megatron-LM, imported first, sees no TE and takes its local layers; Megatron-Bridge's
  ``peft.utils.HAVE_TE`` is set false to match, and Megatron-LM's ``attention.TELinear`` (a
  non-type when TE is absent, which ``isinstance`` refuses) becomes an empty class.
- the provider, as ``to_megatron_provider`` returns it: Megatron-LM's local layer spec instead
  of the TE spec; ``moe_grouped_gemm`` off (the local grouped MLP needs the CUDA-only
  ``grouped_gemm``: experts become ``SequentialMLP`` with one linear per expert, where a node
  has one grouped linear per layer); ``moe_permute_fusion`` off (TE kernels);
  ``use_cpu_initialization`` on (so Megatron's own tensors follow the meta device instead of
  asking for a GPU).
- ``torch.cuda.current_device`` / ``torch.cuda.Stream``: no GPU (the token dispatcher makes a
  stream, the YaRN table asks for the current device).

Argument values: the namespace fields ``_setup_lora_model_via_bridge`` reads, taken from the
argv tokens as miles' parser would leave them (``--target-modules`` split at commas; the
conformance tier proves miles' parser on the same argv).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import types
from typing import Any

# Flags read by _setup_lora_model_via_bridge / create_lora_instance, and their types.
INT_FLAGS = (
    "tensor-model-parallel-size",
    "pipeline-model-parallel-size",
    "expert-model-parallel-size",
    "expert-tensor-parallel-size",
    "context-parallel-size",
    "recompute-num-layers",
    "lora-rank",
    "lora-alpha",
)
STR_FLAGS = ("hf-checkpoint", "recompute-granularity", "recompute-method", "optimizer")


def namespace_from_argv(tokens: list[str]) -> argparse.Namespace:
    """The fields miles' bridge LoRA setup reads, as miles' parser leaves them."""
    from megatron.core.transformer.enums import AttnBackend

    def value(flag: str) -> str | None:
        return tokens[tokens.index(f"--{flag}") + 1] if f"--{flag}" in tokens else None

    fields: dict[str, Any] = {f.replace("-", "_"): value(f) for f in STR_FLAGS}
    fields.update({f.replace("-", "_"): int(v) for f in INT_FLAGS if (v := value(f)) is not None})
    targets = value("target-modules") or ""
    fields.update(
        target_modules=[m.strip() for m in targets.split(",")] if "," in targets else [targets],
        lora_dropout=float(value("lora-dropout") or 0.0),
        lora_type=value("lora-type") or "lora",
        exclude_modules=value("exclude-modules"),
        sequence_parallel="--sequence-parallel" in tokens,
        virtual_pipeline_model_parallel_size=None,
        gradient_accumulation_fusion=False,
        recompute_modules=None,
        distribute_saved_activations=False,
        attention_backend=AttnBackend[value("attention-backend") or "auto"],
        accumulate_allreduce_grads_in_fp32=False,
        offload_train=False,
    )
    return argparse.Namespace(**fields)


def install_stand_ins() -> None:
    """The stand-ins of the module doc; the real packages where they are present."""
    import megatron.core.transformer.attention as attention  # TE-less, before the fake
    import torch

    if not torch.cuda.is_available():
        torch.cuda.current_device = lambda: torch.device("cpu")
        torch.cuda.Stream = _NoStream
    if importlib.util.find_spec("transformer_engine") is None:
        sys.modules.update(_empty_transformer_engine())
        import megatron.bridge.peft.utils as peft_utils

        peft_utils.HAVE_TE = False
    if not isinstance(attention.TELinear, type):
        attention.TELinear = type("NoTELinear", (), {})
    _local_provider()


class _NoStream:
    """What the token dispatcher keeps as its device-to-host stream; never used on meta."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass


class _AnyAttribute(types.ModuleType):
    """A module whose every public attribute is a fresh empty ``nn.Module`` subclass."""

    def __getattr__(self, name: str) -> type:
        if name.startswith("__"):
            raise AttributeError(name)
        import torch

        made = type(name, (torch.nn.Module,), {})
        setattr(self, name, made)
        return made


def _empty_transformer_engine() -> dict[str, types.ModuleType]:
    root = _AnyAttribute("transformer_engine")
    pytorch = _AnyAttribute("transformer_engine.pytorch")
    ops = _AnyAttribute("transformer_engine.pytorch.ops")
    root.pytorch = pytorch  # type: ignore[attr-defined]
    pytorch.ops = ops  # type: ignore[attr-defined]
    return {m.__name__: m for m in (root, pytorch, ops)}


def _local_provider() -> None:
    from megatron.bridge.models.conversion.auto_bridge import AutoBridge
    from megatron.bridge.models.gpt_provider import local_layer_spec

    original = AutoBridge.to_megatron_provider

    def to_megatron_provider(self: Any, *args: Any, **kwargs: Any) -> Any:
        provider = original(self, *args, **kwargs)
        provider.transformer_layer_spec = local_layer_spec
        provider.moe_grouped_gemm = False
        provider.moe_permute_fusion = False
        provider.use_cpu_initialization = True
        return provider

    AutoBridge.to_megatron_provider = to_megatron_provider


def main(tokens: list[str]) -> int:
    split = tokens.index("--")
    own = argparse.ArgumentParser()
    own.add_argument("--census", required=True)
    own.add_argument("--result", required=True)
    options = own.parse_args(tokens[:split])
    install_stand_ins()
    spec = importlib.util.spec_from_file_location("bridge_census", options.census)
    assert spec is not None and spec.loader is not None
    census_module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(census_module)
    provider, chunks = census_module.build_meta_model(namespace_from_argv(tokens[split + 1 :]))
    reading = census_module.census(provider, chunks)
    with open(options.result, "w", encoding="utf-8") as out:
        json.dump({"ok": True, **reading}, out, sort_keys=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
