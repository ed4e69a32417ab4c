"""The run directory: the one contract between running a recipe and judging it.

Decides the layout and nothing else. The hardware run, the CPU rehearsal's replay and the
embedded example all produce it; the driver, the watcher, the preflight, the readers, the
gate, the report and ``baseline record`` all find their files through :class:`RunDir`, so
no other module spells a file name of the run dir::

    tensorboard/          TensorBoard event files (miles' TENSORBOARD_DIR)
    ci_history/*.jsonl    miles' CI-history records (miles' MILES_CI_GATE_RECORD_DIR)
    job.log               the Ray job's log
    job.json              the job's end state, written by the driver
    env.json              the preflight's facts about the node
    report/               the gate's report.json, report.md, metrics.png
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

__all__ = ["RunDir"]


@dataclass(frozen=True)
class RunDir:
    """Paths of one run directory; building one touches no file."""

    root: Path

    @property
    def tensorboard(self) -> Path:
        return self.root / "tensorboard"

    @property
    def ci_history(self) -> Path:
        return self.root / "ci_history"

    @property
    def job_log(self) -> Path:
        return self.root / "job.log"

    @property
    def job_json(self) -> Path:
        return self.root / "job.json"

    @property
    def env_json(self) -> Path:
        return self.root / "env.json"

    @property
    def report(self) -> Path:
        return self.root / "report"

    @property
    def evidence(self) -> tuple[Path, ...]:
        """What a run leaves behind; a run dir holding any of it is not fresh."""
        return (self.tensorboard, self.ci_history, self.job_log, self.job_json, self.report)
