"""Options of the hardware tests, resolved once: dirs, run root, aiter variant, rollouts."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest


@dataclass(frozen=True)
class NodeOptions:
    model_dir: Path
    data_dir: Path
    miles_dir: Path
    megatron_dir: Path
    run_root: Path
    aiter_variant: str
    num_rollouts: int

    def run_dir(self, variant: str) -> Path:
        return (self.run_root / variant).resolve()


@pytest.fixture(scope="session")
def node(request: pytest.FixtureRequest) -> NodeOptions:
    opt = request.config.getoption
    return NodeOptions(
        model_dir=Path(opt("--model-dir")),
        data_dir=Path(opt("--data-dir")),
        miles_dir=Path(opt("--miles-dir")),
        megatron_dir=Path(opt("--megatron-dir")),
        run_root=Path(opt("--run-root")),
        aiter_variant=opt("--aiter-variant"),
        num_rollouts=opt("--num-rollouts"),
    )
