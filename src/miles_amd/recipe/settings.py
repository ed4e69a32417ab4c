"""The gpt-oss-20b MoE LoRA GRPO recipe as a typed, validated value.

This module decides *what* miles is asked to run: the recipe's settings, the invariants
between them, and the exact model and train argv in the order RECIPE.md gives. It does not
decide how the job is launched (``recipe.plan``) and never touches the filesystem, the
environment or a GPU: building the argv is a pure function of the recipe.

Invariants checked on construction (each error names the broken one):

- ``rollout_batch_size * n_samples_per_prompt == global_batch_size``: one optimizer step per
  rollout, so N rollouts are N optimizer steps.
- ``num_gpus`` divisible by the trainer TP and by the rollout engine TP.
- ``lora_rank == sglang_max_lora_rank``: miles ignores the latter and sets SGLang's max LoRA
  rank from ``--lora-rank`` (``recipe.ignored_flags``); equal, the argv says what runs.
- every LoRA target name maps to a gpt-oss layer in miles (``recipe.lora_targets``), also in
  ``--extra-args --target-modules``: an unmapped one (``gate_up_proj``) trains no adapter.
- ``hardware`` is MI355X or MI350X (both 8 GPUs a node).
- ``--qkv-format bshd`` (sink attention in TE) forbids ``--use-dynamic-batch-size``.

Extra args (one string, split with ``shlex``) are appended last. An extra arg that repeats a
flag the recipe pins is an error, unless ``override_pinned`` is set: then the pinned flag and
its values are removed from the recipe's argv and the extra arg takes its place at the end.
An extra arg that carries a credential (``recipe.secret_flags``: every spelling argparse
would accept) is always an error whose message never repeats the value: an argv is visible
to every user of the host (``ps``), in Ray's job table and in the printed plan. The W&B key
reaches the job as ``WANDB_API_KEY``.

Messages name the CLI flag a field comes from (:data:`FIELD_FLAGS`), so ``num_rollout`` is
reported as ``--num-rollouts``; fields no flag sets are named as fields.

The default directories (``/root/models`` ...) are the image's layout and are declared here
once, as the defaults of :class:`Recipe`'s fields; the CLI and the tests read them from here.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from enum import Enum

from miles_amd.recipe.lora_targets import extra_target_modules, unmapped_targets_message
from miles_amd.recipe.secret_flags import secret_flags_in

Arg = tuple[str, tuple[str, ...]]  # a flag and its values, e.g. ("--lora-rank", ("32",))


class RecipeError(ValueError):
    """An invalid recipe; the message names the broken invariant and the option to change."""


class Hardware(str, Enum):
    MI355X = "MI355X"
    MI350X = "MI350X"


GPUS_PER_NODE: dict[Hardware, int] = {Hardware.MI355X: 8, Hardware.MI350X: 8}
CHECKPOINT_NAME = "gpt-oss-20b-bf16"
CHECKPOINT_REPO = "lmsys/gpt-oss-20b-bf16"
DATASET_REPO = "zhuzilin/dapo-math-17k"
DATASET_DIR_NAME = "dapo-math-17k"
DATASET_FILE_NAME = "dapo-math-17k.jsonl"

# The image's layout (rocm/sgl-dev:miles-rocm720-mi35x): where RECIPE.md puts each piece.
DEFAULT_MODEL_DIR = "/root/models"
DEFAULT_DATA_DIR = "/root/datasets"
DEFAULT_MILES_DIR = "/root/miles"
DEFAULT_MEGATRON_DIR = "/root/Megatron-LM"

# The CLI flag that sets each field (``miles-amd train``); messages name these, not fields.
FIELD_FLAGS: dict[str, str] = {
    "hardware": "--hardware",
    "num_gpus": "--num-gpus",
    "model_dir": "--model-dir",
    "data_dir": "--data-dir",
    "miles_dir": "--miles-dir",
    "megatron_dir": "--megatron-dir",
    "num_rollout": "--num-rollouts",
    "extra_args": "--extra-args",
    "override_pinned": "--override-pinned",
}


def flag_of(field_name: str) -> str:
    """The CLI flag that sets ``field_name``, or the field's own name when no flag does."""
    return FIELD_FLAGS.get(field_name, field_name)


def parse_hardware(value: str) -> Hardware:
    """``"mi355x"`` -> ``Hardware.MI355X``; anything unknown is a RecipeError naming the flag."""
    try:
        return Hardware(value.upper())
    except ValueError:
        known = ", ".join(h.value for h in Hardware)
        raise RecipeError(
            f"--hardware {value}: unknown hardware; this recipe runs on {known} (or 'auto')"
        ) from None


@dataclass(frozen=True)
class Recipe:
    """gpt-oss-20b LoRA GRPO on one node of 8 AMD Instinct GPUs; defaults are RECIPE.md's."""

    hardware: Hardware = Hardware.MI355X
    num_gpus: int = 8
    model_dir: str = DEFAULT_MODEL_DIR
    data_dir: str = DEFAULT_DATA_DIR
    miles_dir: str = DEFAULT_MILES_DIR
    megatron_dir: str = DEFAULT_MEGATRON_DIR
    lora_rank: int = 32
    lora_alpha: int = 32
    lora_dropout: float = 0.0
    target_modules: tuple[str, ...] = ("gate_proj", "up_proj", "down_proj")
    num_rollout: int = 20
    rollout_batch_size: int = 8
    n_samples_per_prompt: int = 8
    global_batch_size: int = 64
    rollout_max_response_len: int = 4096
    lr: float = 1e-5
    tensor_model_parallel_size: int = 4
    rollout_num_gpus_per_engine: int = 4
    sglang_mem_fraction_static: float = 0.2
    sglang_max_lora_rank: int = 32
    sglang_lora_backend: str = "triton"
    sglang_moe_runner_backend: str = "triton"
    sglang_attention_backend: str = "triton"
    sglang_lora_use_virtual_experts: bool = False
    lora_base_cpu_backup: bool = True
    qkv_format: str = "bshd"
    use_dynamic_batch_size: bool = False
    use_wandb: bool = False  # the plan (recipe.plan) turns it on only when a W&B key is configured
    capture_metrics: bool = False  # TensorBoard + CI history, for the gate (set by recipe.plan)
    wandb_project: str = "miles-amd"
    wandb_group: str = "gpt-oss-20b-lora"
    extra_args: str = ""
    override_pinned: bool = False
    _extra: tuple[str, ...] = field(default=(), init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.hardware, Hardware):
            object.__setattr__(self, "hardware", parse_hardware(str(self.hardware)))
        _check_invariants(self)
        try:
            extra = tuple(shlex.split(self.extra_args))
        except ValueError as exc:  # the value is not echoed: it may hold a secret
            raise RecipeError(
                f"--extra-args: cannot split it as a shell would ({exc}); fix the quoting"
            ) from None
        secrets = secret_flags_in(extra)
        if secrets:
            raise RecipeError(
                f"--extra-args carries a credential ({' '.join(secrets)}; value not shown): "
                "an argv is visible to every user of the host and in Ray's job table; "
                "remove it and set WANDB_API_KEY (or HF_TOKEN) in the environment instead"
            )
        object.__setattr__(self, "_extra", extra)
        for source, names in (
            ("target_modules", self.target_modules),
            ("--extra-args --target-modules", extra_target_modules(extra)),
        ):
            if message := unmapped_targets_message(source, names):
                raise RecipeError(message)
        repeated = sorted(pinned_flags(self) & _flags_in(extra))
        if repeated and not self.override_pinned:
            raise RecipeError(
                f"--extra-args repeats flags the recipe pins: {' '.join(repeated)}; "
                "change the recipe option instead, or pass --override-pinned to replace them"
            )

    @property
    def checkpoint_dir(self) -> str:
        return f"{self.model_dir}/{CHECKPOINT_NAME}"

    @property
    def dataset_file(self) -> str:
        return f"{self.data_dir}/{DATASET_DIR_NAME}/{DATASET_FILE_NAME}"

    @property
    def train_script(self) -> str:
        return f"{self.miles_dir}/train.py"

    def model_argv(self) -> list[str]:
        return _flatten(_model_args())

    def train_argv(self) -> list[str]:
        """The train args in RECIPE.md's order, minus overridden pins, extra args last."""
        overridden = _flags_in(self._extra) if self.override_pinned else set()
        kept = [arg for arg in _train_args(self) if arg[0] not in overridden]
        return _flatten(kept) + list(self._extra)

    def argv(self) -> list[str]:
        """Model args first, then train args: what follows ``train.py`` on the command line."""
        return self.model_argv() + self.train_argv()

    def as_dict(self) -> dict[str, object]:
        """The resolved fields, JSON-ready (for plans and reports)."""
        out: dict[str, object] = {}
        for f in fields(self):
            if f.name.startswith("_"):
                continue
            value = getattr(self, f.name)
            out[f.name] = (
                value.value
                if isinstance(value, Enum)
                else list(value)
                if isinstance(value, tuple)
                else value
            )
        return out


def _check_invariants(r: Recipe) -> None:
    for name in (
        "num_gpus",
        "num_rollout",
        "rollout_batch_size",
        "n_samples_per_prompt",
        "global_batch_size",
        "rollout_max_response_len",
        "tensor_model_parallel_size",
        "rollout_num_gpus_per_engine",
        "lora_rank",
        "sglang_max_lora_rank",
    ):
        if getattr(r, name) < 1:
            raise RecipeError(f"{flag_of(name)} must be >= 1, got {getattr(r, name)}")
    if r.num_gpus > GPUS_PER_NODE[r.hardware]:
        raise RecipeError(
            f"--num-gpus {r.num_gpus}: one {r.hardware.value} node has "
            f"{GPUS_PER_NODE[r.hardware]} GPUs and this recipe runs on one node"
        )
    if r.rollout_batch_size * r.n_samples_per_prompt != r.global_batch_size:
        raise RecipeError(
            "batch shape: rollout_batch_size x n_samples_per_prompt must equal "
            f"global_batch_size (one optimizer step per rollout), got {r.rollout_batch_size} x "
            f"{r.n_samples_per_prompt} != {r.global_batch_size}"
        )
    for name, tp in (
        ("tensor_model_parallel_size (trainer TP)", r.tensor_model_parallel_size),
        ("rollout_num_gpus_per_engine (rollout engine TP)", r.rollout_num_gpus_per_engine),
    ):
        if r.num_gpus % tp:
            raise RecipeError(
                f"--num-gpus {r.num_gpus}: not divisible by {name} {tp}; pass a multiple of {tp}"
            )
    if r.lora_rank != r.sglang_max_lora_rank:
        raise RecipeError(
            f"lora_rank {r.lora_rank} != sglang_max_lora_rank {r.sglang_max_lora_rank}: "
            "miles ignores --sglang-max-lora-rank and gives SGLang max_lora_rank = --lora-rank "
            f"({r.lora_rank}); set both to the same rank so the argv says what runs"
        )
    if r.use_dynamic_batch_size and r.qkv_format == "bshd":
        raise RecipeError(
            "use_dynamic_batch_size with qkv_format bshd: sink attention needs BSHD in "
            "Transformer Engine, which precludes --use-dynamic-batch-size"
        )
    if not 0.0 < r.sglang_mem_fraction_static < 1.0:
        raise RecipeError(
            f"sglang_mem_fraction_static must be in (0, 1), got {r.sglang_mem_fraction_static}"
        )


def _flags_in(argv: Sequence[str]) -> set[str]:
    return {a.split("=", 1)[0] for a in argv if a.startswith("--")}


def pinned_flags(recipe: Recipe) -> set[str]:
    """Every flag the recipe itself sets (model and train args)."""
    return {flag for flag, _ in _model_args()} | {flag for flag, _ in _train_args(recipe)}


def _flatten(args: Sequence[Arg]) -> list[str]:
    return [token for flag, values in args for token in (flag, *values)]


def _a(flag: str, *values: object) -> Arg:
    return (flag, tuple(str(v) for v in values))


def _model_args() -> list[Arg]:
    """gpt-oss-20b's architecture, as miles' scripts/models/gpt-oss-20B.sh gives it."""
    return [
        _a("--num-layers", 24),
        _a("--hidden-size", 2880),
        _a("--ffn-hidden-size", 2880),
        _a("--num-attention-heads", 64),
        _a("--group-query-attention"),
        _a("--num-query-groups", 8),
        _a("--kv-channels", 64),
        _a("--use-rotary-position-embeddings"),
        _a("--rotary-percent", "1.0"),
        _a("--rotary-base", 150000),
        _a("--max-position-embeddings", 131072),
        _a("--normalization", "RMSNorm"),
        _a("--norm-epsilon", "1e-5"),
        _a("--swiglu"),
        _a("--untie-embeddings-and-output-weights"),
        _a("--vocab-size", 201088),
        _a("--softmax-type", "learnable"),
        _a("--window-size", "128,0"),
        _a("--window-attn-skip-freq", 2),
        _a("--no-masked-softmax-fusion"),
        _a("--no-rope-fusion"),
        _a("--num-experts", 32),
        _a("--moe-router-topk", 4),
        _a("--moe-aux-loss-coeff", "0.0"),
        _a("--moe-token-dispatcher-type", "alltoall"),
        _a("--moe-router-dtype", "fp32"),
        _a("--moe-grouped-gemm"),
    ]


def _train_args(r: Recipe) -> list[Arg]:
    lora = [
        _a("--lora-rank", r.lora_rank),
        _a("--lora-alpha", r.lora_alpha),
        _a("--lora-dropout", r.lora_dropout),
        _a("--target-modules", ",".join(r.target_modules)),
    ]
    if not r.sglang_lora_use_virtual_experts:
        lora.append(_a("--no-sglang-lora-use-virtual-experts"))
    if r.lora_base_cpu_backup:
        lora.append(_a("--lora-base-cpu-backup"))
    tracking = (
        [
            _a("--use-wandb"),
            _a("--wandb-project", r.wandb_project),
            _a("--wandb-group", r.wandb_group),
            _a("--disable-wandb-random-suffix"),
        ]
        if r.use_wandb
        else []
    )
    if r.capture_metrics:
        # miles has no CLI switch for CI history: the env MILES_CI_GATE_RECORD_DIR alone turns
        # it on (miles/utils/arguments.py); recipe.plan sets it with TENSORBOARD_DIR.
        tracking.append(_a("--use-tensorboard"))
    batching = [_a("--use-dynamic-batch-size")] if r.use_dynamic_batch_size else []
    return [
        _a("--hf-checkpoint", r.checkpoint_dir),
        _a("--megatron-to-hf-mode", "bridge"),
        *lora,
        _a("--prompt-data", r.dataset_file),
        _a("--input-key", "prompt"),
        _a("--label-key", "label"),
        _a("--apply-chat-template"),
        _a("--rollout-shuffle"),
        _a("--balance-data"),
        _a("--rm-type", "math"),
        _a("--num-rollout", r.num_rollout),
        _a("--rollout-batch-size", r.rollout_batch_size),
        _a("--n-samples-per-prompt", r.n_samples_per_prompt),
        _a("--rollout-max-response-len", r.rollout_max_response_len),
        _a("--rollout-temperature", 1),
        _a("--global-batch-size", r.global_batch_size),
        _a("--optimizer", "adam"),
        _a("--lr", r.lr),
        _a("--lr-decay-style", "constant"),
        _a("--weight-decay", 0.1),
        _a("--adam-beta1", 0.9),
        _a("--adam-beta2", 0.98),
        _a("--advantage-estimator", "grpo"),
        _a("--entropy-coef", "0.00"),
        _a("--eps-clip", 0.2),
        _a("--eps-clip-high", 0.28),
        *tracking,
        _a("--tensor-model-parallel-size", r.tensor_model_parallel_size),
        _a("--sequence-parallel"),
        _a("--pipeline-model-parallel-size", 1),
        _a("--context-parallel-size", 1),
        _a("--expert-model-parallel-size", 1),
        _a("--expert-tensor-parallel-size", 1),
        _a("--recompute-granularity", "full"),
        _a("--recompute-method", "uniform"),
        _a("--recompute-num-layers", 1),
        _a("--micro-batch-size", 1),
        *batching,
        _a("--max-tokens-per-gpu", 4096),
        _a("--rollout-num-gpus-per-engine", r.rollout_num_gpus_per_engine),
        _a("--sglang-mem-fraction-static", r.sglang_mem_fraction_static),
        _a("--sglang-dtype", "bfloat16"),
        _a("--sglang-decode-log-interval", 1000),
        _a("--sglang-max-lora-rank", r.sglang_max_lora_rank),
        _a("--sglang-lora-backend", r.sglang_lora_backend),
        _a("--sglang-moe-runner-backend", r.sglang_moe_runner_backend),
        _a("--sglang-attention-backend", r.sglang_attention_backend),
        _a("--train-backend", "megatron"),
        _a("--attention-dropout", "0.0"),
        _a("--hidden-dropout", "0.0"),
        _a("--qkv-format", r.qkv_format),
        _a("--attention-backend", "unfused"),
        _a("--actor-num-nodes", 1),
        _a("--actor-num-gpus-per-node", r.num_gpus),
        _a("--num-gpus-per-node", r.num_gpus),
        _a("--colocate"),
    ]
