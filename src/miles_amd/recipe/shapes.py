"""The recipe's declared shapes (``--shape``): the GPU count and default rollouts of each, and
which shape a run is, read back from its GPU count. ``docs/cli.md`` ("Recipe shapes").
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["DEFAULT_SHAPE", "SHAPES", "Shape", "shape_of"]


@dataclass(frozen=True)
class Shape:
    """One declared shape of the recipe."""

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
    """The name of the shape a run on ``num_gpus`` GPUs is (``<n>gpu`` for an undeclared one)."""
    for shape in SHAPES.values():
        if shape.num_gpus == num_gpus:
            return shape.name
    return f"{num_gpus}gpu"
