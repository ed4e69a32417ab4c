"""The run directory's layout: where each file of a run goes (paths only, no file touched).
Only ``miles_amd.evidence`` opens a run-dir record for reading (``.ci/lint``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


class _Under:
    def __init__(self, name: str) -> None:
        self.name = name

    def __get__(self, run: RunDir, owner: object = None) -> Path:
        return run.root / self.name


@dataclass(frozen=True)
class RunDir:
    """Paths of one run directory; building one touches no file."""

    root: Path

    tensorboard = _Under("tensorboard")
    ci_history = _Under("ci_history")
    job_log = _Under("job.log")
    job_json = _Under("job.json")
    env_json = _Under("env.json")
    plan_json = _Under("plan.json")
    canary_json = _Under("canary.json")
    report = _Under("report")
    compare_report = _Under("report/compare")
    ray_head_log = _Under("ray_head.log")
    pullback_json = _Under("pullback.json")

    def variant(self, name: str) -> RunDir:
        """``train --variants``: the run dir of aiter variant ``name`` under this one."""
        return RunDir(self.root / name)

    @property
    def markers(self) -> tuple[Path, ...]:
        """What any run leaves, even one that failed at once (job.log, plan.json, env.json or
        canary.json come before the job)."""
        return (*self.evidence, self.env_json, self.plan_json, self.canary_json)

    @property
    def is_run_dir(self) -> bool:
        return self.root.is_dir() and any(p.exists() for p in self.markers)

    @property
    def evidence(self) -> tuple[Path, ...]:
        """What a run leaves behind; a run dir holding any of it is not fresh."""
        return (self.tensorboard, self.ci_history, self.job_log, self.job_json, self.report)
