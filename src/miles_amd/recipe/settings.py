"""The gpt-oss-20b MoE LoRA GRPO recipe as a typed, validated value: its settings (each field
declares its :class:`Setting`), their invariants (each error naming its CLI flag), the exact
model and train argv in RECIPE.md's order, the LoRA targets and credential flags it refuses,
its declared shapes and ``--hardware auto``. ``docs/cli.md`` ("The recipe's invariants and
settings").
"""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields
from enum import Enum
from typing import Any, TypeVar

Arg = tuple[str, tuple[str, ...]]  # a flag and its values, e.g. ("--lora-rank", ("32",))
T = TypeVar("T")


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


def flag_of(field_name: str) -> str:
    """The CLI flag that sets ``field_name``, or the field's own name when no flag does."""
    return FIELD_FLAGS.get(field_name, field_name)


@dataclass(frozen=True)
class Setting:
    """What one :class:`Recipe` field is to miles, to the user and to the run history."""

    argv: tuple[str, ...] = ()  # the miles flags that carry its value (a bool: present iff on)
    cli: str | None = None  # the ``miles-amd train`` option that sets it
    identity: bool = True  # False: it says where or how a run is recorded, not what it trains
    under: str = ""  # a directory field: its argv value is this path below it
    negated: bool = False  # a bool passed when off (``--no-...``)


def setting(default: T, *argv: str, **declared: Any) -> T:
    """A :class:`Recipe` field with its :class:`Setting` (``dataclasses.field`` metadata)."""
    return field(default=default, metadata={"setting": Setting(argv, **declared)})


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

    hardware: Hardware = setting(Hardware.MI355X, cli="--hardware")
    num_gpus: int = setting(8, "--actor-num-gpus-per-node", "--num-gpus-per-node", cli="--num-gpus")
    model_dir: str = setting(
        DEFAULT_MODEL_DIR,
        "--hf-checkpoint",
        under=CHECKPOINT_NAME,
        cli="--model-dir",
        identity=False,
    )
    data_dir: str = setting(
        DEFAULT_DATA_DIR,
        "--prompt-data",
        under=f"{DATASET_DIR_NAME}/{DATASET_FILE_NAME}",
        cli="--data-dir",
        identity=False,
    )
    miles_dir: str = setting(DEFAULT_MILES_DIR, cli="--miles-dir", identity=False)
    megatron_dir: str = setting(DEFAULT_MEGATRON_DIR, cli="--megatron-dir", identity=False)
    lora_rank: int = setting(32, "--lora-rank")
    lora_alpha: int = setting(32, "--lora-alpha")
    lora_dropout: float = setting(0.0, "--lora-dropout")
    target_modules: tuple[str, ...] = setting(  # comma-joined in the argv
        ("gate_proj", "up_proj", "down_proj"), "--target-modules"
    )
    num_rollout: int = setting(20, "--num-rollout", cli="--num-rollouts")
    rollout_batch_size: int = setting(8, "--rollout-batch-size")
    n_samples_per_prompt: int = setting(8, "--n-samples-per-prompt")
    global_batch_size: int = setting(64, "--global-batch-size")
    rollout_max_response_len: int = setting(4096, "--rollout-max-response-len")
    lr: float = setting(1e-5, "--lr")
    tensor_model_parallel_size: int = setting(4, "--tensor-model-parallel-size")
    rollout_num_gpus_per_engine: int = setting(4, "--rollout-num-gpus-per-engine")
    sglang_mem_fraction_static: float = setting(0.2, "--sglang-mem-fraction-static")
    sglang_max_lora_rank: int = setting(32, "--sglang-max-lora-rank")
    sglang_lora_backend: str = setting("triton", "--sglang-lora-backend")
    sglang_moe_runner_backend: str = setting("triton", "--sglang-moe-runner-backend")
    sglang_attention_backend: str = setting("triton", "--sglang-attention-backend")
    sglang_lora_use_virtual_experts: bool = setting(
        False, "--no-sglang-lora-use-virtual-experts", negated=True
    )
    lora_base_cpu_backup: bool = setting(True, "--lora-base-cpu-backup")
    qkv_format: str = setting("bshd", "--qkv-format")
    use_dynamic_batch_size: bool = setting(False, "--use-dynamic-batch-size")
    # the plan (recipe.plan) turns W&B on only when a W&B key is configured
    use_wandb: bool = setting(False, "--use-wandb", identity=False)
    # TensorBoard + CI history, for the gate (set by recipe.plan)
    capture_metrics: bool = setting(False, "--use-tensorboard", identity=False)
    wandb_project: str = setting("miles-amd", "--wandb-project", identity=False)
    wandb_group: str = setting("gpt-oss-20b-lora", "--wandb-group", identity=False)
    extra_args: str = setting("", cli="--extra-args")  # shell-split, appended last
    override_pinned: bool = setting(False, cli="--override-pinned")
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
        checked: list[tuple[str, Sequence[str]]] = [("target_modules", self.target_modules)]
        if not self.override_pinned:  # overridden: the node's miles decides (lora_targets)
            checked.append(("--extra-args --target-modules", extra_target_modules(extra)))
        for source, names in checked:
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
        return _flatten(_MODEL_ARGS)

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
        out = {name: getattr(self, name) for name in SETTINGS}
        return {k: v.value if isinstance(v, Enum) else v for k, v in out.items()} | {
            "target_modules": list(self.target_modules)
        }


# Each public field's Setting, in field order; the tables below are derived from them.
SETTINGS: dict[str, Setting] = {
    f.name: f.metadata.get("setting", Setting()) for f in fields(Recipe) if f.init
}
# The CLI flag that sets each field (``miles-amd train``); messages name these, not fields.
FIELD_FLAGS: dict[str, str] = {name: s.cli for name, s in SETTINGS.items() if s.cli}
# plan.json recipe fields left out of the run's identity (``history.entry.recipe_digest``).
NOT_IDENTITY: frozenset[str] = frozenset(n for n, s in SETTINGS.items() if not s.identity)


_POSITIVE = shlex.split("""num_gpus num_rollout rollout_batch_size n_samples_per_prompt
    global_batch_size rollout_max_response_len tensor_model_parallel_size
    rollout_num_gpus_per_engine lora_rank sglang_max_lora_rank""")


def _check_invariants(r: Recipe) -> None:
    for name in _POSITIVE:
        if getattr(r, name) < 1:
            raise RecipeError(f"{flag_of(name)} must be >= 1, got {getattr(r, name)}")
    node = GPUS_PER_NODE[r.hardware]
    tps = (
        ("tensor_model_parallel_size (trainer TP)", r.tensor_model_parallel_size),
        ("rollout_num_gpus_per_engine (rollout engine TP)", r.rollout_num_gpus_per_engine),
    )
    rules = [
        (r.num_gpus > node, f"--num-gpus {r.num_gpus}: one {r.hardware.value} node has {node} "
         "GPUs and this recipe runs on one node"),
        (r.rollout_batch_size * r.n_samples_per_prompt != r.global_batch_size,
         "batch shape: rollout_batch_size x n_samples_per_prompt must equal global_batch_size "
         f"(one optimizer step per rollout), got {r.rollout_batch_size} x "
         f"{r.n_samples_per_prompt} != {r.global_batch_size}"),
        *((r.num_gpus % tp != 0, f"--num-gpus {r.num_gpus}: not divisible by {name} {tp}; "
           f"pass a multiple of {tp}") for name, tp in tps),
        (r.lora_rank != r.sglang_max_lora_rank,
         f"lora_rank {r.lora_rank} != sglang_max_lora_rank {r.sglang_max_lora_rank}: miles "
         "ignores --sglang-max-lora-rank and gives SGLang max_lora_rank = --lora-rank "
         f"({r.lora_rank}); set both to the same rank so the argv says what runs"),
        (r.use_dynamic_batch_size and r.qkv_format == "bshd",
         "use_dynamic_batch_size with qkv_format bshd: sink attention needs BSHD in Transformer "
         "Engine, which precludes --use-dynamic-batch-size"),
        (not 0.0 < r.sglang_mem_fraction_static < 1.0, "sglang_mem_fraction_static must be in "
         f"(0, 1), got {r.sglang_mem_fraction_static}"),
    ]  # fmt: skip
    for broken, why in rules:
        if broken:
            raise RecipeError(why)


def _flags_in(argv: Sequence[str]) -> set[str]:
    return {a.split("=", 1)[0] for a in argv if a.startswith("--")}


def pinned_flags(recipe: Recipe) -> set[str]:
    """Every flag the recipe itself sets (model and train args)."""
    return {flag for flag, _ in _MODEL_ARGS} | {flag for flag, _ in _train_args(recipe)}


def _flatten(args: Sequence[Arg]) -> list[str]:
    return [token for flag, values in args for token in (flag, *values)]


def _args(tokens: Sequence[str]) -> list[Arg]:
    """Tokens grouped as flags with the values that follow each."""
    out: list[Arg] = []
    for token in tokens:
        if token.startswith("--"):
            out.append((token, ()))
        else:
            out[-1] = (out[-1][0], (*out[-1][1], token))
    return out


# gpt-oss-20b's architecture, as miles' scripts/models/gpt-oss-20B.sh gives it
_MODEL_ARGS = _args(
    shlex.split(
        """--num-layers 24 --hidden-size 2880 --ffn-hidden-size 2880 --num-attention-heads 64
    --group-query-attention --num-query-groups 8 --kv-channels 64
    --use-rotary-position-embeddings --rotary-percent 1.0 --rotary-base 150000
    --max-position-embeddings 131072 --normalization RMSNorm --norm-epsilon 1e-5 --swiglu
    --untie-embeddings-and-output-weights --vocab-size 201088 --softmax-type learnable
    --window-size 128,0 --window-attn-skip-freq 2 --no-masked-softmax-fusion --no-rope-fusion
    --num-experts 32 --moe-router-topk 4 --moe-aux-loss-coeff 0.0
    --moe-token-dispatcher-type alltoall --moe-router-dtype fp32 --moe-grouped-gemm"""
    )
)
# RECIPE.md's train args in its order: pinned flags spelled out, ``{field}`` where a field's
# Setting places its args, ``{wandb}`` where W&B's go when it is on. miles has no CLI switch
# for CI history: the env MILES_CI_GATE_RECORD_DIR alone turns it on (miles/utils/
# arguments.py); recipe.plan sets it with TENSORBOARD_DIR.
_TRAIN_ARGS = shlex.split(
    """{model_dir} --megatron-to-hf-mode bridge {lora_rank} {lora_alpha} {lora_dropout}
    {target_modules} {sglang_lora_use_virtual_experts} {lora_base_cpu_backup} {data_dir}
    --input-key prompt --label-key label --apply-chat-template --rollout-shuffle --balance-data
    --rm-type math {num_rollout} {rollout_batch_size} {n_samples_per_prompt}
    {rollout_max_response_len} --rollout-temperature 1 {global_batch_size} --optimizer adam {lr}
    --lr-decay-style constant --weight-decay 0.1 --adam-beta1 0.9 --adam-beta2 0.98
    --advantage-estimator grpo --entropy-coef 0.00 --eps-clip 0.2 --eps-clip-high 0.28 {wandb}
    {capture_metrics} {tensor_model_parallel_size} --sequence-parallel
    --pipeline-model-parallel-size 1 --context-parallel-size 1 --expert-model-parallel-size 1
    --expert-tensor-parallel-size 1 --recompute-granularity full --recompute-method uniform
    --recompute-num-layers 1 --micro-batch-size 1 {use_dynamic_batch_size}
    --max-tokens-per-gpu 4096 {rollout_num_gpus_per_engine} {sglang_mem_fraction_static}
    --sglang-dtype bfloat16 --sglang-decode-log-interval 1000 {sglang_max_lora_rank}
    {sglang_lora_backend} {sglang_moe_runner_backend} {sglang_attention_backend}
    --train-backend megatron --attention-dropout 0.0 --hidden-dropout 0.0 {qkv_format}
    --attention-backend unfused --actor-num-nodes 1 {num_gpus} --colocate"""
)
_WANDB = ("{use_wandb}", "{wandb_project}", "{wandb_group}", "--disable-wandb-random-suffix")


def _field_tokens(r: Recipe, name: str) -> list[str]:
    """The tokens field ``name`` of ``r`` produces, as its :class:`Setting` declares them."""
    declared = SETTINGS[name]
    value = getattr(r, name)
    if isinstance(value, bool):
        return list(declared.argv) if value != declared.negated else []
    if isinstance(value, tuple):
        value = ",".join(value)
    elif declared.under:
        value = f"{value}/{declared.under}"
    return [token for flag in declared.argv for token in (flag, str(value))]


def _expand(r: Recipe, template: Sequence[str]) -> list[str]:
    tokens: list[str] = []
    for token in template:
        if token == "{wandb}":
            tokens += _expand(r, _WANDB) if r.use_wandb else []
        elif token.startswith("{"):
            tokens += _field_tokens(r, token[1:-1])
        else:
            tokens.append(token)
    return tokens


def _train_args(r: Recipe) -> list[Arg]:
    return _args(_expand(r, _TRAIN_ARGS))


# The LoRA target names that reach a layer of gpt-oss in the pinned miles (31f1ca961,
# ``lora_utils.convert_target_modules_to_megatron``: any other name trains no adapter).
PINNED_MILES = "31f1ca961"
_QKV, _PROJ, _FC1, _FC2 = "linear_qkv", "linear_proj", "linear_fc1", "linear_fc2"
LORA_TARGET_MODULES: dict[str, str] = {
    **{"q_proj": _QKV, "k_proj": _QKV, "v_proj": _QKV, "o_proj": _PROJ},
    **{"gate_proj": _FC1, "up_proj": _FC1, "down_proj": _FC2},
    **{name: name for name in (_QKV, _PROJ, _FC1, _FC2)},
}


def unmapped_targets_message(source: str, names: Sequence[str]) -> str | None:
    """The one-line refusal for the names miles would not map, or None when all map."""
    unknown = [name for name in names if name not in LORA_TARGET_MODULES]
    if not unknown:
        return None
    return (
        f"{source}: LoRA target {', '.join(unknown)} is not a name miles {PINNED_MILES} (the "
        "pinned miles) maps to a Megatron layer, so there it would match nothing and train no "
        f"adapter; use names from {', '.join(LORA_TARGET_MODULES)} (gpt-oss's gate_up_proj is "
        "gate_proj,up_proj); with a newer miles that maps it, pass it in --extra-args with "
        "--override-pinned and let the node's preflight (fact lora_experts) decide"
    )


def extra_target_modules(extra: Sequence[str]) -> list[str]:
    """The names of ``--target-modules`` in extra args (``X`` or ``=X`` form), else []."""
    names: list[str] = []
    for i, token in enumerate(extra):
        if token.startswith("--target-modules="):
            names += token.split("=", 1)[1].split(",")
        elif token == "--target-modules" and i + 1 < len(extra):
            names += extra[i + 1].split(",")
    return [name.strip() for name in names]


# Credential flags in every spelling argparse accepts (``docs/ray-head-and-secrets.md``,
# "Credential flags in --extra-args"): any case, ``_`` for ``-``, ``=value``, an abbreviation
# that reaches the last word.
SECRET_FLAGS = frozenset({"--wandb-key", "--wandb-api-key", "--api-key", "--hf-token"})
_SECRET_FLAG_PATTERN = re.compile(
    r"^--[a-z0-9-]*-(?:(api-key|token|secret|password|passwd|credentials?)|api-ke?)$"
)
_NON_SECRET_TOKEN_FLAGS = frozenset(
    f"--fim-{part}-token" for part in ("eod", "middle", "pad", "prefix", "suffix")
)
_ABBREVIATIONS = frozenset(
    flag[:end] for flag in SECRET_FLAGS for end in range(flag.rindex("-") + 2, len(flag) + 1)
)


def secret_flags_in(argv: Sequence[str]) -> list[str]:
    """The flags of ``argv`` (as written, ``=value`` dropped) that carry a credential."""
    found = set()
    for token in argv:
        if not token.startswith("--") or len(token) < 3:
            continue
        name = token.split("=", 1)[0].lower().replace("_", "-")
        if name not in _NON_SECRET_TOKEN_FLAGS and (
            name in _ABBREVIATIONS or _SECRET_FLAG_PATTERN.match(name)
        ):
            found.add(token.split("=", 1)[0])
    return sorted(found)


@dataclass(frozen=True)
class Shape:
    """One declared shape of the recipe (``--shape``; ``docs/cli.md``, "Recipe shapes")."""

    name: str
    num_gpus: int
    num_rollouts: int
    what: str


SHAPES: dict[str, Shape] = {
    shape.name: shape
    for shape in (
        Shape("8gpu", 8, 20, "one node: two TP-4 rollout engines beside the TP-4 trainer"),
        Shape("4gpu", 4, 2, "half a node: one TP-4 rollout engine beside the TP-4 trainer"),
    )
}
DEFAULT_SHAPE = "8gpu"


def shape_of(num_gpus: object) -> str:
    """The shape a run on ``num_gpus`` GPUs is (``<n>gpu`` for an undeclared one)."""
    return next((s.name for s in SHAPES.values() if s.num_gpus == num_gpus), f"{num_gpus}gpu")


# ``--hardware auto``: the product every GPU reports, from amd-smi or rocm-smi.
PRODUCT_PATTERN = re.compile(r"MI35([05])X", re.IGNORECASE)
PROBE_COMMANDS = (("amd-smi", "static", "--asic"), ("rocm-smi", "--showproductname"))
Runner = Callable[[Sequence[str]], str | None]


class HardwareDetectionError(RuntimeError):
    """``--hardware auto`` could not tell the node's product."""


def run_tool(argv: Sequence[str]) -> str | None:
    """Output of a ROCm tool, or None when it is not installed or fails."""
    if shutil.which(argv[0]) is None:
        return None
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout if done.returncode == 0 else None


def detect_hardware(runner: Runner = run_tool) -> Hardware:
    """The one product every GPU of this node reports; HardwareDetectionError otherwise."""
    tried = []
    for argv in PROBE_COMMANDS:
        output = runner(argv)
        tried.append(argv[0])
        found = {Hardware(f"MI35{m.group(1)}X") for m in PRODUCT_PATTERN.finditer(output or "")}
        if len(found) == 1:
            return found.pop()
        if len(found) > 1:
            names = ", ".join(sorted(h.value for h in found))
            raise HardwareDetectionError(
                f"--hardware auto: this node mixes {names}; pass --hardware explicitly"
            )
    raise HardwareDetectionError(
        f"--hardware auto: no MI355X/MI350X GPU found (asked {', '.join(tried)}); "
        "run on an AMD Instinct node or pass --hardware MI355X|MI350X"
    )
