"""After miles' parse: what miles' own code makes of the argv, written as JSON.

Executed BY FILE PATH with the conformance python, in the job's env (PYTHONPATH to miles and
Megatron-LM), by ``test_semantics.py`` and ``test_ignored_flags.py``::

    python semantic_probe.py --result FILE --stubs <miles_parse.py> -- <tokens after train.py>

It parses the argv with miles' ``parse_args()`` (the parse probe's two GPU-query stubs first)
and records, with miles' and SGLang's own functions:

- ``dests``: every option string of miles' parser -> its ``dest`` (argparse's own table);
- ``derived``: world size and data-parallel size as Megatron's ``validate_args`` set them, the
  rollout engine count as ``start_rollout_servers`` computes it from
  ``_resolve_sglang_config``, and the optimizer steps per rollout by the formula of
  ``miles/backends/training_utils/data.py`` (``get_data_iterator``);
- ``function_paths``: every set ``*_path`` argument miles' source hands to
  ``load_function`` / ``load_rollout_function``, loaded with ``load_function`` (``ok`` or the
  error);
- ``rewards``: miles' ``async_rm`` on a boxed right and a boxed wrong answer;
- ``lora``: ``convert_target_modules_to_megatron`` for the parsed targets and for each name
  given in ``--lora-names``, with a class named as ``create_lora_instance`` chooses it
  (megatron.bridge is not installable on CPU; the function reads only the class's name);
- ``server_args``: ``_compute_server_args`` for engine 0 (its "not supported" log line
  captured), and whether SGLang's ``ServerArgs(**kwargs)`` constructs with only the device
  queries ``get_device``, ``get_device_memory_capacity`` and ``is_hip`` stubbed;
- ``sglang_flag_use``: for each ``sglang_*`` dest of ``--recipe-flags``, whether a unique
  value set on ``args`` reaches the server args (``used``) or is replaced (``overridden``).
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import importlib.util
import json
import logging
import re
import sys
import traceback
from pathlib import Path
from typing import Any

LORA_CLASS_NAMES = {"lora": "LoRA", "canonical_lora": "CanonicalLoRA"}  # create_lora_instance


def _jsonable(value: Any) -> Any:
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    return repr(value)


def _capture_parsers() -> list[argparse.ArgumentParser]:
    seen: list[argparse.ArgumentParser] = []
    original = argparse.ArgumentParser.parse_known_args

    def recording(self: argparse.ArgumentParser, *args: Any, **kwargs: Any) -> Any:
        seen.append(self)
        return original(self, *args, **kwargs)

    argparse.ArgumentParser.parse_known_args = recording  # type: ignore[method-assign]
    return seen


def _derived(args: Any) -> dict[str, Any]:
    from miles.ray.rollout.rollout_server import _resolve_sglang_config

    engines = 0
    for model in _resolve_sglang_config(args).models:
        model.resolve(args)
        for group in model.server_groups:
            per_engine = min(group.num_gpus_per_engine, args.num_gpus_per_node)
            engines += group.num_gpus // per_engine
    dp = args.data_parallel_size
    samples = args.rollout_batch_size * args.n_samples_per_prompt
    num_local_gbs = args.global_batch_size // dp  # data.py: get_data_iterator
    return {
        "world_size": args.world_size,
        "data_parallel_size": dp,
        "rollout_num_gpus": args.rollout_num_gpus,
        "rollout_engines": engines,
        "optimizer_steps_per_rollout": (samples // dp) // num_local_gbs,
    }


def _loaded_as_functions() -> set[str]:
    """Arg names miles hands to its loaders: ``args.<x>_path`` on a line calling
    ``load_function(`` / ``load_rollout_function(`` or on one of the two lines before it
    (``if (x := self.args.<x>_path) is not None:``)."""
    import miles

    names: set[str] = set()
    for source in Path(miles.__file__).parent.rglob("*.py"):
        lines = source.read_text(errors="replace").splitlines()
        for i, line in enumerate(lines):
            if re.search(r"\bload_(?:rollout_)?function\(", line):
                names.update(
                    re.findall(r"args\.(\w+_path)\b", "\n".join(lines[max(0, i - 2) : i + 1]))
                )
    return names


def _function_paths(args: Any) -> dict[str, str]:
    from miles.utils.misc import load_function

    out = {}
    for name in sorted(_loaded_as_functions()):
        value = getattr(args, name, None)
        if value is None:
            continue
        try:
            out[name] = "ok" if callable(load_function(value)) else "not callable"
        except Exception as exc:
            out[name] = f"{type(exc).__name__}: {exc}"
    return out


def _rewards(args: Any) -> dict[str, Any]:
    from miles.rollout.rm_hub import async_rm
    from miles.utils.types import Sample

    def score(response: str) -> Any:
        return asyncio.run(async_rm(args, Sample(prompt="1 + 1 = ?", response=response, label="2")))

    return {"right": score("So 1 + 1 = \\boxed{2}."), "wrong": score("So 1 + 1 = \\boxed{3}.")}


def _lora(args: Any, extra_names: list[str]) -> dict[str, Any]:
    from miles.backends.megatron_utils.lora_utils import convert_target_modules_to_megatron

    lora_cls = type(LORA_CLASS_NAMES[args.lora_type], (), {})
    convert = convert_target_modules_to_megatron
    return {
        "lora_class": lora_cls.__name__,
        "targets": convert(list(args.target_modules), lora_type=lora_cls),
        "each": {name: convert([name], lora_type=lora_cls) for name in extra_names},
    }


def _server_args(args: Any) -> tuple[dict[str, Any], list[str]]:
    from miles.backends.sglang_utils import sglang_engine

    records: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record.getMessage())

    handler = Keep()
    sglang_engine.logger.addHandler(handler)
    try:
        kwargs, _ = sglang_engine._compute_server_args(
            args, 0, "127.0.0.1:20000", 20001, "127.0.0.1", 20002
        )
    finally:
        sglang_engine.logger.removeHandler(handler)
    return kwargs, [r for r in records if "not supported" in r]


def _server_args_accepted(kwargs: dict[str, Any]) -> str:
    from sglang.srt import server_args

    server_args.get_device = lambda device_id=None: "cuda"
    server_args.get_device_memory_capacity = lambda device=None: 288 * 1024  # MiB, one MI355X
    server_args.is_hip = lambda: True
    try:
        server_args.ServerArgs(**kwargs)
    except Exception as exc:
        traceback.print_exc()
        return f"{type(exc).__name__}: {exc}"
    return "ok"


def _sglang_flag_use(args: Any, dests: list[str]) -> dict[str, str]:
    from miles.backends.sglang_utils import sglang_engine

    marked = copy.deepcopy(args)
    for i, dest in enumerate(dests):
        setattr(marked, dest, f"<probe {i}>")
    kwargs, _ = sglang_engine._compute_server_args(
        marked, 0, "127.0.0.1:20000", 20001, "127.0.0.1", 20002
    )
    values = {json.dumps(v, default=repr) for v in kwargs.values()}
    return {
        dest: "used" if json.dumps(f"<probe {i}>") in values else "overridden"
        for i, dest in enumerate(dests)
    }


def main(tokens: list[str]) -> int:
    split = tokens.index("--")
    own = argparse.ArgumentParser()
    own.add_argument("--result", required=True)
    own.add_argument("--stubs", required=True)
    own.add_argument("--lora-names", default="")
    own.add_argument("--recipe-flags", default="")
    opts = own.parse_args(tokens[:split])
    spec = importlib.util.spec_from_file_location("miles_parse_stubs", opts.stubs)
    assert spec is not None and spec.loader is not None
    stubs = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(stubs)
    stubs.stub_gpu_queries()
    parsers = _capture_parsers()
    sys.argv = ["train.py", *tokens[split + 1 :]]
    from miles.utils.arguments import parse_args

    args = parse_args()
    parser = max(parsers, key=lambda p: len(p._actions))
    dests = {opt: action.dest for opt, action in parser._option_string_actions.items()}
    kwargs, dropped = _server_args(args)
    flags = [f for f in opts.recipe_flags.split(",") if f in dests]
    recipe_sglang = sorted({dests[f] for f in flags if dests[f].startswith("sglang_")})
    result = {
        "dests": dests,
        "derived": _derived(args),
        "function_paths": _function_paths(args),
        "rewards": _rewards(args),
        "lora": _lora(args, [n for n in opts.lora_names.split(",") if n]),
        "server_args": {
            "kwargs": _jsonable(kwargs),
            "dropped": dropped,
            "accepted": _server_args_accepted(dict(kwargs)),
        },
        "sglang_flag_use": _sglang_flag_use(args, recipe_sglang),
        "args": {k: _jsonable(v) for k, v in vars(args).items()},
    }
    with open(opts.result, "w", encoding="utf-8") as out:
        json.dump(result, out, sort_keys=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
