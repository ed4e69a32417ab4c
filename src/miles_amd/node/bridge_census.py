"""Build the trainer's LoRA model the way miles does, on the meta device; describe it as JSON.

Stdlib-only, run by path with the job's interpreter (:data:`USAGE`). Exit 0 built, 1 a build or
import failed (``{"ok": false, "stage", "error"}``), 64 bad usage. ``docs/node.md`` ("The
trainer's model").
"""

from __future__ import annotations

import json
import os
import re
import socket
import sys
import traceback
from typing import Any

USAGE = "usage: bridge_census.py --result FILE -- <train.py args>"
NAMES_KEPT = 4  # example module names per group in the result


def _meta_model(provider: Any, *_: Any, **__: Any) -> list[Any]:
    """``provide_distributed_model``'s stand-in: in a gloo world of one with every parallel size
    1, the decoder on meta, then the pre-wrap hooks (miles' LoRA), as ``get_model`` runs them."""
    import torch
    import torch.distributed as dist
    from megatron.core import parallel_state
    from megatron.core.process_groups_config import ProcessGroupCollection

    if not dist.is_initialized():
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        address = f"tcp://127.0.0.1:{port}"
        dist.init_process_group("gloo", init_method=address, rank=0, world_size=1)
    if not parallel_state.model_parallel_is_initialized():
        parallel_state.initialize_model_parallel()
    for size in (
        "tensor_model_parallel_size",
        "pipeline_model_parallel_size",
        "expert_model_parallel_size",
        "expert_tensor_parallel_size",
        "context_parallel_size",
    ):
        setattr(provider, size, 1)
    provider.sequence_parallel = False
    provider.virtual_pipeline_model_parallel_size = None
    provider._pg_collection = ProcessGroupCollection.use_mpu_process_groups()
    provider.init_model_with_meta_device = True
    provider.perform_initialization = False
    with torch.device("meta"):
        chunks = [provider.provide(pre_process=False, post_process=False)]
    hook = provider.pre_wrap_hook
    wrapped = hook(chunks) if hook is not None else None
    _BUILT["provider"] = provider
    return chunks if wrapped is None else wrapped


_BUILT: dict[str, Any] = {}


def build_meta_model(args: Any) -> tuple[Any, list[Any]]:
    """miles' ``_setup_lora_model_via_bridge(args)`` on :func:`_meta_model`: provider, chunks."""
    from megatron.bridge.models.model_provider import ModelProviderMixin
    from miles.backends.megatron_utils.bridge_lora_helpers import _setup_lora_model_via_bridge

    original = ModelProviderMixin.provide_distributed_model
    ModelProviderMixin.provide_distributed_model = _meta_model
    try:
        chunks = _setup_lora_model_via_bridge(args)
    finally:
        ModelProviderMixin.provide_distributed_model = original
    return _BUILT.pop("provider"), list(chunks)


DTYPE_NAMES = {"torch.bfloat16": "bf16", "torch.float16": "fp16", "torch.float32": "fp32"}


def census(provider: Any, chunks: list[Any]) -> dict[str, Any]:
    import megatron.bridge
    from megatron.bridge.peft.utils import is_expert_linear
    from megatron.core.transformer.utils import is_layer_window_attention

    try:
        from importlib.metadata import version

        release = version("megatron-bridge")
    except Exception:
        release = "no distribution metadata"

    wrapped_expert: list[str] = []
    wrapped_other: list[str] = []
    adapters: dict[str, int] = {}
    bare_expert: dict[str, int] = {}
    routers: dict[str, int] = {}
    windows: list[list[int] | None] = []
    for chunk in chunks:
        for name, module in chunk.named_modules():
            if hasattr(module, "to_wrap") and hasattr(module, "adapter"):  # a LoRA wrapper
                expert = is_expert_linear(name)
                (wrapped_expert if expert else wrapped_other).append(name)
                if expert:
                    kind = type(module.adapter).__name__
                    adapters[kind] = adapters.get(kind, 0) + 1
            elif is_expert_linear(name):
                leaf = name.rsplit(".", 1)[-1]
                bare_expert[leaf] = bare_expert.get(leaf, 0) + 1
            if type(module).__name__.endswith("Router") and hasattr(module, "config"):
                setting = str(module.config.moe_router_dtype)
                routers[setting] = routers.get(setting, 0) + 1
            if hasattr(module, "self_attention") and hasattr(module, "layer_number"):
                config = module.config
                windowed = is_layer_window_attention(
                    config.window_size, config.window_attn_skip_freq, module.layer_number
                )
                windows.append(list(config.window_size) if windowed else None)
    dtype = str(getattr(provider, "params_dtype", None))
    per_expert = sum(".local_experts." in name for name in wrapped_expert)
    layers = {m.group(1) for n in wrapped_expert if (m := re.search(r"layers\.(\d+)\.", n))}
    return {
        "lora": {
            "expert": len(wrapped_expert),
            "expert_grouped": len(wrapped_expert) - per_expert,
            "expert_per_expert": per_expert,
            "expert_layers": len(layers),
            "expert_adapters": adapters,
            "other": len(wrapped_other),
            "bare_expert": bare_expert,
            "examples": wrapped_expert[:NAMES_KEPT] + wrapped_other[:NAMES_KEPT],
        },
        "router": {
            "moe_router_dtype": routers,
            "params_dtype": DTYPE_NAMES.get(dtype, dtype),
            "bf16": bool(getattr(provider, "bf16", False)),
            "fp16": bool(getattr(provider, "fp16", False)),
        },
        "attention": {
            "window_size": _listed(getattr(provider, "window_size", None)),
            "window_attn_skip_freq": _listed(getattr(provider, "window_attn_skip_freq", None)),
            "layers": windows,
        },
        "moe_grouped_gemm": bool(getattr(provider, "moe_grouped_gemm", False)),
        "num_moe_experts": getattr(provider, "num_moe_experts", None),
        "bridge": f"megatron.bridge {release} at {os.path.dirname(megatron.bridge.__file__)}",
    }


def _listed(value: Any) -> Any:
    return list(value) if isinstance(value, (list, tuple)) else value


def _write(path: str, payload: dict[str, Any]) -> None:
    with open(path, "w", encoding="utf-8") as out:
        json.dump(payload, out, sort_keys=True)


def _failed(result: str, stage: str, exc: BaseException) -> int:
    traceback.print_exc()
    error = " ".join(f"{type(exc).__name__}: {exc}".split())[:600]
    _write(result, {"ok": False, "stage": stage, "error": error})
    return 1


def main(tokens: list[str]) -> int:
    if "--" not in tokens:
        print(USAGE, file=sys.stderr)
        return 64
    split = tokens.index("--")
    own, train_argv = tokens[:split], tokens[split + 1 :]
    if len(own) != 2 or own[0] != "--result":
        print(USAGE, file=sys.stderr)
        return 64
    result = own[1]
    sys.argv = ["train.py", *train_argv]
    try:
        from miles.utils.arguments import parse_args

        args = parse_args()
    except (Exception, SystemExit) as exc:
        return _failed(result, "parse_args", exc)
    try:
        provider, chunks = build_meta_model(args)
    except Exception as exc:
        return _failed(result, "build", exc)
    try:
        _write(result, {"ok": True, **census(provider, chunks)})
    except Exception as exc:
        return _failed(result, "census", exc)
    return 0


if __name__ == "__main__":
    # Run by path, this file's folder is sys.path[0]: drop it, so no module next to it can
    # shadow a top-level module miles imports.
    here = os.path.dirname(os.path.abspath(__file__))
    if sys.path and os.path.abspath(sys.path[0] or ".") == here:
        sys.path.pop(0)
    sys.exit(main(sys.argv[1:]))
