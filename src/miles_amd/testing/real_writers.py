"""The replay's real writers: miles' own logger, tracking backends and metric functions write
the replayed values, in Ray actors named as miles' (so Ray prefixes their lines as in a real
job); a statement they cannot feed is replayed from its source line, found by its text.
docs/rehearsal.md ("The real writers") lists each function and each CPU stub.
"""

from __future__ import annotations

import os
import sys
import time
import types
from argparse import Namespace
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from miles_amd.testing.miles_writer import (
    SGLANG_ACTOR,
    TRAINER_ACTOR,
    ActorPids,
    group_metrics,
)

CPU_MEMORY_KEY = "perf/cpu_memory_after_offload_train_gb"
# (module whose logger and file it is, the statement's text) of the replayed statements
_PERF_SITE = ("miles.ray.rollout.metrics", 'logger.info(f"perf {rollout_id}: {log_dict}")')
_MODEL_STEP_SITE = (
    "miles.backends.megatron_utils.model",
    'logger.info(f"{role_tag}step {accumulated_step_id}: {log_dict}")',
)
_LOG_STEP_SITE = (
    "miles.backends.training_utils.log_utils",
    'logger.info(f"{role_tag}step {accumulated_step_id}: {log_dict_out}")',
)


class MilesSourceError(ValueError):
    """The miles tree logs a metric elsewhere; the message names the file."""


def use_miles(miles_src: str) -> None:
    if miles_src not in sys.path:
        sys.path.insert(0, miles_src)


def miles_args(*, use_tensorboard: bool, ci_history: bool) -> Namespace:
    return Namespace(
        use_tensorboard=use_tensorboard, tb_project_name=None, tb_experiment_name=None,
        ci_enable_metrics_capture=ci_history, save_debug_event_data=None,
        wandb_always_use_train_step=False, mfu_peak_tflops=None,
        sglang_router_ip="127.0.0.1", sglang_router_port=0,
    )  # fmt: skip


def source_line(miles_src: str, relative: str, text: str) -> int:
    path = Path(miles_src) / relative
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if text in line:
            return number
    raise MilesSourceError(f"{path}: no line {text!r}; this miles logs metrics elsewhere")


def log_at(miles_src: str, site: tuple[str, str], message: str) -> None:
    import logging

    name, text = site
    relative = name.replace(".", "/") + ".py"
    logger = logging.getLogger(name)
    record = logger.makeRecord(
        name, logging.INFO, str(Path(miles_src) / relative),
        source_line(miles_src, relative, text), message, (), None,
    )  # fmt: skip
    logger.handle(record)


def _flush_tensorboard() -> None:
    from miles.utils.tracking_utils import tracking

    for backend in tracking._manager._backends:
        adapter = getattr(backend, "_adapter", None)
        if adapter is not None and adapter._writer is not None:
            adapter._writer.flush()


class _MilesProcess:
    def __init__(self, miles_src: str, args: Namespace, identity: str) -> None:
        use_miles(miles_src)
        from miles.utils.audit_utils import process_identity as pi
        from miles.utils.logging_utils import configure_logger
        from miles.utils.tracking_utils.tracking import init_tracking

        source = {
            "rollout_manager": pi.RolloutManagerProcessIdentity(),
            "trainer": pi.TrainProcessIdentity(component="actor", cell_index=0, rank_within_cell=0),
        }[identity]
        configure_logger(args, source=source)
        self.miles_src, self.args = miles_src, args
        init_tracking(args, primary=False, router_addr="http://127.0.0.1:0")

    def pid(self) -> int:
        return os.getpid()

    def print_line(self, body: str) -> None:
        print(body, flush=True)


class RolloutManager(_MilesProcess):
    def __init__(self, miles_src: str, args: Namespace) -> None:
        super().__init__(miles_src, args, "rollout_manager")

    def log_rollout(self, rollout_id: int, log_dict: dict[str, float]) -> None:
        from miles.utils.metric_utils import compute_rollout_step
        from miles.utils.tracking_utils import tracking

        log_at(self.miles_src, _PERF_SITE, f"perf {rollout_id}: {log_dict}")
        step = compute_rollout_step(self.args, rollout_id)
        tracking.log(self.args, {**log_dict, "rollout/step": step}, step_key="rollout/step")
        _flush_tensorboard()


class MegatronTrainRayActor(_MilesProcess):
    """miles' trainer rank 0, its parallel state and gather stubbed to one rank."""

    def __init__(self, miles_src: str, args: Namespace) -> None:
        super().__init__(miles_src, args, "trainer")
        from miles.backends.training_utils import log_utils

        one_rank = types.SimpleNamespace(rank=0, size=1, gloo_groups_inner_to_outer=[])
        log_utils.get_parallel_state = lambda: types.SimpleNamespace(effective_dp_cp=one_rank)
        log_utils.MultiPGUtil = types.SimpleNamespace(
            gather_object=lambda obj, groups_inner_to_outer: [obj]
        )

    def log_rollout(self, rollout_id: int, groups: dict[str, dict[str, float]]) -> None:
        from miles.backends.training_utils import log_utils
        from miles.utils import train_metric_utils

        if groups["rollout"]:
            pairs = {k.removeprefix("rollout/"): (v, 1) for k, v in groups["rollout"].items()}
            log_utils.gather_log_data("rollout", self.args, rollout_id, pairs)
        if groups["step"]:
            self._log_step(rollout_id, groups["step"])
        if groups["trainer_perf"]:
            train_metric_utils.log_perf_data_raw(
                rollout_id=rollout_id, args=self.args, is_primary_rank=True,
                compute_total_fwd_flops=None, extra_metrics=dict(groups["trainer_perf"]),
            )  # fmt: skip
        if CPU_MEMORY_KEY in groups["tb_only"]:
            used = groups["tb_only"][CPU_MEMORY_KEY] * 1e9
            log_utils.psutil = types.SimpleNamespace(
                virtual_memory=lambda: types.SimpleNamespace(used=used)
            )
            log_utils.log_cpu_memory(rollout_id, self.args, "after_offload_train")
        _flush_tensorboard()

    def _log_step(self, rollout_id: int, step: dict[str, float]) -> None:
        from miles.backends.training_utils import log_utils
        from miles.utils.tracking_utils import tracking

        if "train/grad_norm" in step:
            losses = {
                k.removeprefix("train/"): v for k, v in step.items() if k != "train/grad_norm"
            }
            log_dict = log_utils.log_train_step(
                args=self.args, loss_dict=losses, grad_norm=step["train/grad_norm"],
                rollout_id=rollout_id, step_id=0, num_steps_per_rollout=1, should_log=True,
            )  # fmt: skip
        else:  # log_train_step's own two statements, without inventing a grad_norm
            log_dict = {**step, "train/step": rollout_id}
            tracking.log(self.args, log_dict, step_key="train/step")
            log_at(self.miles_src, _LOG_STEP_SITE, f"step {rollout_id}: {log_dict}")
        log_at(self.miles_src, _MODEL_STEP_SITE, f"step {rollout_id}: {log_dict}")


class SGLangEngine(_MilesProcess):
    def __init__(self) -> None:  # only prints (fault sentinels); no miles code runs in it
        pass


class RealRunWriter:
    """The imitation's interface over miles' code in Ray actors; a ``None`` dir: that off."""

    def __init__(
        self, miles_src: Path, tensorboard_dir: Path | None, ci_history_dir: Path | None
    ) -> None:
        import ray

        self._src = str(miles_src)
        args = miles_args(
            use_tensorboard=tensorboard_dir is not None, ci_history=bool(ci_history_dir)
        )
        self._tensorboard_dir = tensorboard_dir
        use_miles(self._src)
        from miles.utils.audit_utils.process_identity import MainProcessIdentity
        from miles.utils.logging_utils import configure_logger
        from miles.utils.tracking_utils.tracking import init_tracking

        configure_logger(args, source=MainProcessIdentity())
        init_tracking(args)
        # Join the job's cluster, never start one: a local ray.init() writes ~/.ray/auth_token,
        # which turns on token auth for every later Ray head of this user on the machine.
        ray.init(address="auto", log_to_driver=True)
        self._ray = ray
        # Actor handles are Any: Ray's stubs cannot type methods called through .remote().
        actors: list[Any] = [
            ray.remote(cls).options(num_cpus=0).remote(*given)
            for cls, given in ((RolloutManager, (self._src, args)),
                               (MegatronTrainRayActor, (self._src, args)), (SGLangEngine, ()))
        ]  # fmt: skip
        self._manager, self._trainer, self._sglang = actors
        manager_pid, trainer_pid, sglang_pid = ray.get([a.pid.remote() for a in actors])
        self.pids = ActorPids((trainer_pid,), manager_pid, sglang_pid)
        self.event_file: Path | None = None

    def print_line(self, line: str) -> None:
        import logging

        logging.getLogger("miles_amd.replay").info(line)

    def print_actor_line(self, actor: str, body: str, rank: int = 0) -> None:
        target = {SGLANG_ACTOR: self._sglang, TRAINER_ACTOR: self._trainer}[actor]
        self._ray.get(target.print_line.remote(body))

    def emit_rollout(self, rollout: int, metrics: Mapping[str, float]) -> None:
        groups = group_metrics(metrics)
        if groups["perf"]:
            self._ray.get(self._manager.log_rollout.remote(rollout, groups["perf"]))
        self._ray.get(self._trainer.log_rollout.remote(rollout, groups))

    def close(self) -> None:
        from miles.utils.tracking_utils.tracking import finish_tracking

        time.sleep(1.5)  # Ray's log monitor forwards worker lines about once a second
        for actor in (self._manager, self._trainer, self._sglang):
            self._ray.kill(actor)
        finish_tracking()
        if self._tensorboard_dir is not None:
            marker = f".{self.pids.trainers[0]}."
            found = [p for p in self._tensorboard_dir.iterdir() if marker in p.name]
            self.event_file = found[0] if len(found) == 1 else None
        self._ray.shutdown()
