"""From a recipe and an environment to a launch plan (pure: executing it is the driver's): the
canary, the cleanup of this tool's own leftovers, ``ray start --head`` unless ``RAY_ADDRESS``
names a cluster, then a Ray job running miles' ``train.py`` with RECIPE.md's env; secrets held
apart from everything printable. ``docs/cli.md`` ("The launch plan").
"""

from __future__ import annotations

import base64
import shlex
import uuid
import zlib
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

from miles_amd import variants
from miles_amd.recipe.settings import (
    CHECKPOINT_REPO,
    DATASET_DIR_NAME,
    DATASET_REPO,
    Recipe,
)

REDACTED = "<redacted>"
AITER_FIX_SHOWN = "<miles_amd/aiter_fix.py>"  # the fingerprint's source, as printed
SECRET_ENV_VARS = ("WANDB_API_KEY", "HF_TOKEN")  # inherited from the tool's own head
RUNTIME_ENV_SECRETS = ("WANDB_API_KEY",)  # sent to a RAY_ADDRESS cluster's job
DEFAULT_MASTER_ADDR = "127.0.0.1"
RAY_HEAD_STATE_FILE = "ray_head.json"
CANARY_STEP = "canary"
# Cluster mode (docs/cluster.md): the resource an operator declares on every whole node; a job
# asks for all of it, so one job holds one node. Evidence goes to a node-local dir.
NODE_RESOURCE = "miles_amd_mi355x_node"
NODE_ROOT_VAR = "MILES_AMD_NODE_ROOT"
DEFAULT_NODE_ROOT = "/tmp/miles_amd_runs"


@dataclass(frozen=True)
class Step:
    """One thing a run does, in order; ``argv`` is empty for in-process steps."""

    name: str
    description: str
    argv: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, object]:
        return {"name": self.name, "description": self.description, "argv": list(self.argv)}


@dataclass(frozen=True)
class JobSpec:
    """The Ray job: entrypoint argv and runtime env; secrets held apart from printable vars."""

    entrypoint: tuple[str, ...]
    env_vars: Mapping[str, str]
    secret_env_vars: Mapping[str, str] = field(default_factory=dict, repr=False)
    entrypoint_resources: Mapping[str, float] = field(default_factory=dict)  # cluster mode
    aiter_fix_python: str | None = None  # runs miles_amd.aiter_fix first, inside the job

    def aiter_fix_argv(self, script: str = AITER_FIX_SHOWN) -> tuple[str, ...]:
        """The fingerprint's argv (``script``: the source, or a printable stand-in)."""
        return (self.aiter_fix_python, "-c", script) if self.aiter_fix_python else ()

    def command(self) -> str:
        """The aiter fingerprint (its source compressed on one line), then ``exec`` the job."""
        main = shlex.join(self.entrypoint)
        if not self.aiter_fix_python:
            return main
        from miles_amd import aiter_fix

        packed = base64.b64encode(zlib.compress(Path(aiter_fix.__file__).read_bytes(), 9))
        script = f"import base64,zlib;exec(zlib.decompress(base64.b64decode('{packed.decode()}')))"
        return f"{shlex.join(self.aiter_fix_argv(script))}; exec {main}"

    def runtime_env(self) -> dict[str, object]:
        """The runtime env to submit, secrets included. Never print or store this."""
        return {"env_vars": {**self.env_vars, **self.secret_env_vars}}

    def to_dict(self) -> dict[str, object]:
        env = dict(self.env_vars)
        env.update({name: REDACTED for name in self.secret_env_vars})
        out: dict[str, object] = {"entrypoint": list(self.entrypoint)}
        if self.aiter_fix_python:
            out["aiter_fix"] = list(self.aiter_fix_argv())
        if self.entrypoint_resources:
            out["entrypoint_resources"] = dict(self.entrypoint_resources)
        out["runtime_env"] = {"env_vars": env}
        return out


@dataclass(frozen=True)
class LaunchPlan:
    """What the driver will do; printable (``to_dict``) without leaking a secret."""

    recipe: Recipe
    steps: tuple[Step, ...]
    job: JobSpec | None
    process_env: Mapping[str, str] = field(default_factory=dict)
    ray_address: str | None = None
    run_dir: str | None = None
    aiter_variant: str | None = None  # miles_amd.variants; sets the job's SGLang aiter env
    ray_auth_token_path: str | None = None  # the RAY_ADDRESS cluster's token file, if given
    node_run_dir: str | None = None  # cluster mode: where the job writes evidence on its node
    inherited_secrets: Mapping[str, str] = field(default_factory=dict, repr=False)
    aiter: Mapping[str, str] = field(default_factory=dict)  # aiter_imports

    def head_env(self) -> dict[str, str]:
        """What the tool's own head adds to the launching env, secrets included. Never print."""
        return {**self.process_env, **self.inherited_secrets}

    def printable_process_env(self) -> dict[str, str]:
        """:meth:`head_env` with every secret ``<redacted>``."""
        return {**self.process_env, **dict.fromkeys(self.inherited_secrets, REDACTED)}

    def to_dict(self) -> dict[str, object]:
        return {
            "recipe": self.recipe.as_dict(),
            "steps": [s.to_dict() for s in self.steps],
            "job": self.job.to_dict() if self.job else None,
            "process_env": self.printable_process_env(),
            "ray_address": self.ray_address,
            "ray_auth_token_path": self.ray_auth_token_path,
            "run_dir": self.run_dir,
            "aiter_variant": self.aiter_variant,
            **({"aiter": dict(self.aiter)} if self.aiter else {}),
            **({"node_run_dir": self.node_run_dir} if self.node_run_dir else {}),
        }


def device_env(env: Mapping[str, str]) -> dict[str, str]:
    """The ROCm device variables the launching process and the job's workers need."""
    out = {
        "RAY_EXPERIMENTAL_NOSET_HIP_VISIBLE_DEVICES": "1",
        "RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES": "1",
    }
    if env.get("HIP_VISIBLE_DEVICES"):
        out["HIP_VISIBLE_DEVICES"] = env["HIP_VISIBLE_DEVICES"]
        out["CUDA_VISIBLE_DEVICES"] = env["HIP_VISIBLE_DEVICES"]
    return out


def job_env_vars(
    recipe: Recipe,
    env: Mapping[str, str],
    master_addr: str,
    run_dir: str | None,
    aiter_variant: str | None = None,
) -> dict[str, str]:
    """RECIPE.md's runtime env, the variant's SGLang switches and ``PYTHONPATH``, and where the
    evidence lands."""
    pythonpath = variants.aiter_pythonpath(
        aiter_variant, env, recipe.miles_dir, recipe.megatron_dir
    )
    out = {
        "PYTHONUNBUFFERED": "1",
        "CUDA_DEVICE_MAX_CONNECTIONS": "1",
        "NCCL_NVLS_ENABLE": "0",
        "no_proxy": ",".join(dict.fromkeys(("127.0.0.1", master_addr))),
        "MASTER_ADDR": master_addr,
        "PYTHONPATH": pythonpath,
        **device_env(env),
        **variants.sglang_env(aiter_variant),
    }
    if run_dir is not None:
        out["TENSORBOARD_DIR"] = f"{run_dir}/tensorboard"
        out["MILES_CI_GATE_RECORD_DIR"] = f"{run_dir}/ci_history"
    return out


def ray_start_argv(num_gpus: int, master_addr: str) -> tuple[str, ...]:
    """``ray start`` for a head, its dashboard on loopback only (``RayHead`` adds the rest)."""
    return (
        *("ray", "start", "--head", "--node-ip-address", master_addr),
        *("--num-gpus", str(num_gpus), "--disable-usage-stats", "--dashboard-host", "127.0.0.1"),
    )


def node_run_dir(node_root: str, run_dir: str, run_id: str | None) -> str:
    """Cluster mode: ``<node root>/<run name>[-<id>]``; the root may be ``${VAR}``."""
    name = run_dir.rstrip("/").rsplit("/", 1)[-1] or "run"
    return f"{node_root.rstrip('/')}/{name}-{run_id}" if run_id else f"{node_root}/{name}"


def build_train_plan(
    recipe: Recipe,
    env: Mapping[str, str],
    *,
    run_dir: str | None = None,
    state_dir: str = "~/.cache/miles_amd",
    master_addr: str = DEFAULT_MASTER_ADDR,
    entrypoint_prefix: tuple[str, ...] | None = None,
    node_root: str | None = None,
    run_id: str | None = None,
    aiter_variant: str | None = None,
    canary: bool = False,
) -> LaunchPlan:
    """``docs/cli.md`` ("The launch plan"); ``entrypoint_prefix`` replaces ``python3
    <miles>/train.py`` (the rehearsal's replay); an unknown ``aiter_variant`` is a KeyError."""
    if run_dir is not None and not recipe.capture_metrics:
        recipe = replace(recipe, capture_metrics=True)
    if env.get("WANDB_API_KEY") and not recipe.use_wandb:
        recipe = replace(recipe, use_wandb=True)
    ray_address = env.get("RAY_ADDRESS") or None
    token_path = (env.get("RAY_AUTH_TOKEN_PATH") or None) if ray_address else None
    entrypoint = (*(entrypoint_prefix or ("python3", recipe.train_script)), *recipe.argv())
    names = RUNTIME_ENV_SECRETS if ray_address else SECRET_ENV_VARS
    secrets = {name: env[name] for name in names if env.get(name)}
    on_node = None
    if ray_address and run_dir and node_root:
        on_node = node_run_dir(node_root, run_dir, run_id or uuid.uuid4().hex[:8])
    job_vars = job_env_vars(recipe, env, master_addr, on_node or run_dir, aiter_variant)
    resources = {NODE_RESOURCE: 1.0} if ray_address else {}
    cleanup = Step(
        "cleanup",
        "stop the Ray head and job this tool recorded in "
        f"{state_dir}/{RAY_HEAD_STATE_FILE} (its own leftovers only)",
    )
    token = " (token from RAY_AUTH_TOKEN_PATH)" if token_path else ""
    submit = Step(
        "submit",
        f"submit the job to {ray_address or 'the local head'}{token} and follow its log",
        entrypoint,
    )
    steps: tuple[Step, ...]
    if ray_address is None:
        head = Step(
            "ray-start",
            "start a private local Ray head: loopback only, a fresh auth token, every port "
            "chosen by the tool (device env set first)",
            ray_start_argv(recipe.num_gpus, master_addr),
        )
        steps = (cleanup, head, submit)
    else:
        check = Step(
            "check-cluster",
            f"refuse to submit unless an alive node has {NODE_RESOURCE} >= 1 and "
            f"GPU >= {recipe.num_gpus} (the whole node the job asks for)",
        )
        pull = Step(
            "pull-back",
            "bring the job's TensorBoard and CI-history files from its node into the run "
            "dir, during the run and completely at the end (sizes and sha256 verified)",
        )
        steps = (cleanup, check, submit, *((pull,) if on_node else ()))
    if canary and aiter_variant and run_dir and not ray_address:
        canary_step = Step(
            CANARY_STEP,
            f"all-reduce canary of the {aiter_variant} rollouts' all-reduce on this machine's "
            "GPUs, before the job; a wrong sum stops patched and rccl here, stock goes on (it "
            f"reproduces {variants.AITER_FIX}); --no-canary skips it",
            ("miles-amd", "canary", "--variant", aiter_variant, "--run-dir", run_dir),
        )
        steps = (canary_step, *steps)
    job = JobSpec(entrypoint, job_vars, secrets if ray_address else {}, resources, entrypoint[0])
    job_path = job_vars["PYTHONPATH"]
    return LaunchPlan(
        recipe=recipe,
        steps=steps,
        job=job,
        process_env=device_env(env),
        ray_address=ray_address,
        run_dir=run_dir,
        aiter_variant=aiter_variant,
        ray_auth_token_path=token_path,
        node_run_dir=on_node,
        inherited_secrets={} if ray_address else secrets,
        aiter={  # where each process imports aiter from
            "from": variants.aiter_origin(aiter_variant, env),
            "preflight": job_path,
            "canary": variants.aiter_pythonpath(aiter_variant, env),
            "job": job_path,
        },
    )


def build_prepare_plan(recipe: Recipe) -> LaunchPlan:
    """``prepare``: download the BF16 checkpoint and the dataset with ``hf``."""
    checkpoint = ("hf", "download", CHECKPOINT_REPO, "--local-dir", recipe.checkpoint_dir)
    dataset_dir = f"{recipe.data_dir}/{DATASET_DIR_NAME}"
    dataset = ("hf", "download", "--repo-type", "dataset", DATASET_REPO, "--local-dir", dataset_dir)
    steps = (
        Step(
            "download-checkpoint",
            f"download {CHECKPOINT_REPO} (BF16; the MXFP4 openai/gpt-oss-20b is not served "
            "by the Triton MoE path)",
            checkpoint,
        ),
        Step("download-dataset", f"download the {DATASET_REPO} dataset", dataset),
    )
    return LaunchPlan(recipe=recipe, steps=steps, job=None)


def format_plan(plan: LaunchPlan) -> str:
    """The plan as a reviewer reads it, each line through ``escape.terminal``."""
    from miles_amd.escape import terminal

    lines = [
        f"recipe: gpt-oss-20b LoRA GRPO on {plan.recipe.num_gpus}x {plan.recipe.hardware.value}"
    ]
    if plan.run_dir:
        lines.append(f"run dir: {plan.run_dir}")
    if plan.aiter_variant:
        lines.append(f"aiter variant: {variants.describe(plan.aiter_variant)}")
    for i, step in enumerate(plan.steps, 1):
        lines.append(f"{i}. {step.name}: {step.description}")
        if step.argv and step.name != "submit":
            lines.append("   $ " + " ".join(step.argv))
    if plan.aiter:
        lines.append("aiter each process imports (one rule: variants.aiter_pythonpath):")
        lines.append(f"  from: {plan.aiter['from']}")
        lines += [
            f"  {who}: PYTHONPATH={plan.aiter[who] or '(unset)'}"
            for who in ("preflight", "canary", "job")
        ]
    process_env = plan.printable_process_env()
    if process_env:
        own_head = plan.ray_address is None and plan.job is not None
        title = "Ray head env (the job inherits it)" if own_head else "launching process env"
        lines.append(f"{title}:")
        lines += [f"  {k}={v}" for k, v in process_env.items()]
    if plan.job:
        job = plan.job.to_dict()
        if plan.job.aiter_fix_python:
            lines.append("job first records its aiter_fix (a MILES_AMD_AITER_FIX line in job.log):")
            lines.append("  " + " ".join(plan.job.aiter_fix_argv()))
        lines.append("job entrypoint:")
        lines += _argv_lines(job["entrypoint"])  # type: ignore[arg-type]
        lines.append("job runtime env:")
        env_vars = job["runtime_env"]["env_vars"]  # type: ignore[index]
        lines += [f"  {k}={v}" for k, v in env_vars.items()]
    return "\n".join(terminal(line) for line in lines)


def _argv_lines(argv: list[str]) -> list[str]:
    """One flag with its values per line, so a review diff shows which flag changed."""
    lines: list[str] = []
    for token in argv:
        if token.startswith("--") or not lines:
            lines.append(f"  {token}")
        else:
            lines[-1] += f" {token}"
    return lines
