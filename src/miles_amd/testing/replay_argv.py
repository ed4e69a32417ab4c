"""The replay's argv check: rebuild a :class:`Recipe` from a ``train.py`` argv and refuse any
argv that is not exactly that recipe's.

Decides, before the replay writes anything: the argv is the recipe's, token for token
(:func:`check_argv`): a :class:`~miles_amd.recipe.settings.Recipe` is rebuilt from it
(:func:`recipe_from_argv`) and its ``argv()`` must equal the given argv, so a foreign flag, a
changed pinned value, a missing flag or a different order is refused naming the flag
(:func:`argv_difference`); the recipe's own invariants (``RecipeError``) refuse too. Does not
read the source run or write evidence (``miles_amd.testing.replay``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from miles_amd.recipe.settings import Recipe, RecipeError

Flag = tuple[str, tuple[str, ...]]


class ReplayRefused(ValueError):
    """The replay will not run; the message names the flag, variable or file and the fix."""


def split_flags(argv: Sequence[str]) -> list[Flag]:
    """``["--a", "1", "--b"]`` -> ``[("--a", ("1",)), ("--b", ())]``; a leading value refuses."""
    flags: list[tuple[str, list[str]]] = []
    for token in argv:
        if token.startswith("--"):
            flags.append((token, []))
        elif not flags:
            raise ReplayRefused(f"{token}: a value before any flag; pass the recipe's argv")
        else:
            flags[-1][1].append(token)
    return [(flag, tuple(values)) for flag, values in flags]


def _flag_map(flags: Sequence[Flag]) -> dict[str, tuple[str, ...]]:
    out: dict[str, tuple[str, ...]] = {}
    for flag, values in flags:
        if flag in out:
            raise ReplayRefused(f"{flag}: given twice; the recipe passes it once")
        out[flag] = values
    return out


# flag -> (Recipe field, converter); every other field has no flag or is handled below.
_VALUE_FIELDS: dict[str, tuple[str, type]] = {
    "--lora-rank": ("lora_rank", int),
    "--lora-alpha": ("lora_alpha", int),
    "--lora-dropout": ("lora_dropout", float),
    "--num-rollout": ("num_rollout", int),
    "--rollout-batch-size": ("rollout_batch_size", int),
    "--n-samples-per-prompt": ("n_samples_per_prompt", int),
    "--global-batch-size": ("global_batch_size", int),
    "--rollout-max-response-len": ("rollout_max_response_len", int),
    "--lr": ("lr", float),
    "--wandb-project": ("wandb_project", str),
    "--wandb-group": ("wandb_group", str),
    "--tensor-model-parallel-size": ("tensor_model_parallel_size", int),
    "--rollout-num-gpus-per-engine": ("rollout_num_gpus_per_engine", int),
    "--sglang-mem-fraction-static": ("sglang_mem_fraction_static", float),
    "--sglang-max-lora-rank": ("sglang_max_lora_rank", int),
    "--sglang-lora-backend": ("sglang_lora_backend", str),
    "--sglang-moe-runner-backend": ("sglang_moe_runner_backend", str),
    "--sglang-attention-backend": ("sglang_attention_backend", str),
    "--qkv-format": ("qkv_format", str),
    "--actor-num-gpus-per-node": ("num_gpus", int),
}
_SWITCH_FIELDS: dict[str, str] = {
    "--lora-base-cpu-backup": "lora_base_cpu_backup",
    "--use-dynamic-batch-size": "use_dynamic_batch_size",
    "--use-wandb": "use_wandb",
    "--use-tensorboard": "capture_metrics",
}


def _one_value(flags: Mapping[str, tuple[str, ...]], flag: str) -> str | None:
    values = flags.get(flag)
    if values is None:
        return None
    if len(values) != 1:
        raise ReplayRefused(f"{flag}: takes one value, got {len(values)}")
    return values[0]


def _parent(path: str, levels: int) -> str:
    for _ in range(levels):
        path = path.rpartition("/")[0]
    return path


def recipe_from_argv(argv: Sequence[str]) -> Recipe:
    """The recipe whose ``argv()`` the given argv would be, read flag by flag.

    ``model_dir`` is the parent of ``--hf-checkpoint``, ``data_dir`` the directory two levels
    above ``--prompt-data``; a flag the recipe derives but the argv lacks keeps its default,
    and flags the recipe does not know are ignored here (:func:`check_argv` refuses both by
    comparing argvs). ``ReplayRefused`` for an unreadable value, ``RecipeError`` for a broken
    invariant. The hardware is not in the argv (MI355X and MI350X run the same argv).
    """
    flags = _flag_map(split_flags(argv))
    fields: dict[str, object] = {}
    for flag, (name, convert) in _VALUE_FIELDS.items():
        raw = _one_value(flags, flag)
        if raw is None:
            continue
        try:
            fields[name] = convert(raw)
        except ValueError:
            raise ReplayRefused(f"{flag} {raw}: not a valid {convert.__name__}") from None
    for flag, name in _SWITCH_FIELDS.items():
        if flag in flags:
            fields[name] = True
    fields["sglang_lora_use_virtual_experts"] = "--no-sglang-lora-use-virtual-experts" not in flags
    fields.setdefault("lora_base_cpu_backup", False)
    if (checkpoint := _one_value(flags, "--hf-checkpoint")) is not None:
        fields["model_dir"] = _parent(checkpoint, 1)
    if (prompt_data := _one_value(flags, "--prompt-data")) is not None:
        fields["data_dir"] = _parent(prompt_data, 2)
    if (modules := _one_value(flags, "--target-modules")) is not None:
        fields["target_modules"] = tuple(modules.split(","))
    return Recipe(**fields)  # type: ignore[arg-type]


def argv_difference(expected: Sequence[str], given: Sequence[str]) -> str | None:
    """The first difference between two argvs, worded by flag; ``None`` if they are equal."""
    want, got = split_flags(expected), split_flags(given)
    want_flags = {flag for flag, _ in want}
    got_flags = {flag for flag, _ in got}
    for index in range(max(len(want), len(got))):
        w = want[index] if index < len(want) else None
        g = got[index] if index < len(got) else None
        if w == g:
            continue
        if g is not None and g[0] not in want_flags:
            return f"{g[0]}: not a flag of the recipe; the replay takes the recipe's argv only"
        if w is not None and w[0] not in got_flags:
            return f"{w[0]}: missing; the recipe passes {' '.join((w[0], *w[1]))}"
        if w is not None and g is not None and w[0] == g[0]:
            return (
                f"{' '.join((g[0], *g[1]))}: the recipe passes {' '.join((w[0], *w[1]))} "
                "(only recipe options change argv values)"
            )
        assert w is not None and g is not None
        return f"{g[0]}: out of the recipe's order (the recipe passes {w[0]} here)"
    return None


def check_argv(argv: Sequence[str]) -> Recipe:
    """The recipe of ``argv`` if ``argv`` is exactly its ``argv()``; ``ReplayRefused`` if not."""
    try:
        recipe = recipe_from_argv(argv)
    except RecipeError as exc:
        raise ReplayRefused(f"the recipe rejects this argv: {exc}") from None
    difference = argv_difference(recipe.argv(), argv)
    if difference is not None:
        raise ReplayRefused(difference)
    return recipe
