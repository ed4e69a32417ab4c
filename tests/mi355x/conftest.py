"""The hardware tests' options, and the preflight, run once a session into
``<run-root>/<aiter variant>`` (cleared first; one xdist group, so one env.json writer).
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from miles_amd.records.env import Fact


@dataclass(frozen=True)
class NodeOptions:
    model_dir: Path
    data_dir: Path
    miles_dir: Path
    megatron_dir: Path
    run_root: Path
    aiter_variant: str
    num_rollouts: int

    @property
    def run_dir(self) -> Path:
        return (self.run_root / self.aiter_variant).resolve()


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


@pytest.fixture(scope="session")
def preflighted(node: NodeOptions) -> list[Fact]:
    """The preflight's facts of the session's run dir, env.json written there (module doc)."""
    from miles_amd.run.preflight import PreflightConfig, run_preflight, write_env_json

    shutil.rmtree(node.run_dir, ignore_errors=True)  # an earlier session's run
    config = PreflightConfig(
        model_dir=node.model_dir,
        data_dir=node.data_dir,
        miles_dir=node.miles_dir,
        megatron_dir=node.megatron_dir,
        run_dir=node.run_dir,
        aiter_variant=node.aiter_variant,
    )
    facts = run_preflight(config)
    write_env_json(facts, config.run_dir, {"config": config.as_dict()})
    return facts
