"""Read how far miles' ``train()`` got from its driver log (its own log lines and traceback).

The stages, in the order ``train()`` reaches them (pinned miles 31f1ca961), each with the
line that proves it and the defect a stop before it points to:

1. ``parse``: ``placement_group.py`` logs ``Creating placement group with <n> GPUs``, the
   first line of ``train()`` after ``parse_args()``.
2. ``placement group``: one ``bundle <i>, actual_bundle_index`` line per GPU: Ray placed
   miles' GPU bundles (the head declared the GPUs).
3. ``rollout manager``: ``rollout_manager.py`` logs ``import <path> as generate_rollout
   function``: the data source read the dataset with the checkpoint's tokenizer and the
   rollout function path loaded.
4. ``router``: ``router_manager.py`` logs ``Router launched at``.
5. ``engines``: ``addr_allocator.py`` logs ``Ports for engine <k>`` for each rollout engine
   (GPUs / rollout TP of them), after their Ray actors were created.
6. ``engine init``: ``SGLangEngine.init`` -> ``_init_normal`` -> ``ServerArgs(**...)`` ->
   ``get_device`` raises ``RuntimeError: No accelerator ...``: the expected stop on CPU.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

ANSI = re.compile(r"\x1b\[[0-9;]*m")
NO_ACCELERATOR = (
    "RuntimeError: No accelerator (CUDA, XPU, HPU, NPU, MUSA, MPS) or platform plugin is available."
)
ENGINE_INIT_FRAMES = (
    re.compile(r'sglang_engine\.py", line \d+, in _init_normal'),
    re.compile(r"launch_server_process\(ServerArgs\(\*\*server_args_dict\)\)"),
    re.compile(r'sglang/srt/utils/common\.py", line \d+, in get_device'),
)
# train.py's own end: create_rollout_manager's ray.get on the dead RolloutManager
DRIVER_STOP = (
    r"ray\.exceptions\.ActorDiedError: The actor died because of an error raised in its "
    r"creation task, ray::RolloutManager\.__init__\(\)"
)
_ERROR_LINE = re.compile(r"^(?:\S+\.)?\w*(?:Error|Exception|Exit)\b.*:|^\S+: error: ")


@dataclass(frozen=True)
class Stage:
    name: str
    reached: Callable[[str], bool]
    defect: str  # what a stop just before this stage means


def count(pattern: str, log: str) -> int:
    return len(set(re.findall(pattern, log)))


def stages(num_gpus: int, num_engines: int) -> tuple[Stage, ...]:
    return (
        Stage(
            "parse",
            lambda log: f"Creating placement group with {num_gpus} GPUs" in log,
            "parse_args() or an import refused the argv / env before train() ran",
        ),
        Stage(
            "placement group",
            lambda log: count(r"bundle\s+(\d+), actual_bundle_index", log) == num_gpus,
            f"Ray did not place {num_gpus} GPU bundles (the head's --num-gpus, or the job's "
            "device env)",
        ),
        Stage(
            "rollout manager",
            lambda log: (
                re.search(r"rollout_manager\.py:\d+ - import \S+ as generate_rollout", log)
                is not None
            ),
            "the rollout manager did not start: the data source (--prompt-data, --input-key, "
            "--label-key, --apply-chat-template, the checkpoint's tokenizer) or a function path",
        ),
        Stage(
            "router",
            lambda log: "Router launched at" in log,
            "miles' router did not start (--sglang-router-* flags, sglang-router)",
        ),
        Stage(
            "engines",
            lambda log: count(r"Ports for engine (\d+)", log) == num_engines,
            f"not {num_engines} rollout engines (--rollout-num-gpus-per-engine, "
            "--num-gpus-per-node)",
        ),
        Stage(
            "engine init",
            lambda log: NO_ACCELERATOR in log and all(f.search(log) for f in ENGINE_INIT_FRAMES),
            "SGLang's engine init failed for another reason than the missing accelerator: miles' "
            "server args (the --sglang-* flags) or SGLang refused them",
        ),
    )


def clean(log: str) -> str:
    return ANSI.sub("", log)


def first_missing(log: str, num_gpus: int, num_engines: int) -> Stage | None:
    for stage in stages(num_gpus, num_engines):
        if not stage.reached(log):
            return stage
    return None


def last_error(log: str) -> str:
    """The last exception or argparse error line of the log, or a note that there is none."""
    lines = [line.strip() for line in log.splitlines() if _ERROR_LINE.search(line.strip())]
    return lines[-1] if lines else "(no exception line in the driver log)"
