"""The recipe's declared shapes: how many GPUs it runs on, and its default length there.

Decides the named shapes ``miles-amd train --shape`` offers and which shape a run is:

- ``8gpu``: the recipe (one whole node: two TP-4 rollout engines colocated with the TP-4
  trainer, 20 rollouts), the shape the nightly acceptance and the published runs have;
- ``4gpu``: the per-PR smoke (one TP-4 rollout engine colocated with the TP-4 trainer, 2
  rollouts), the recipe otherwise unchanged: a 4-GPU runner of an MI350 host holds it.

A shape fixes the GPU count and gives the default rollouts (``--num-rollouts`` overrides
them). A run's shape is read back from its GPU count (:func:`shape_of`), so a baseline key
(``miles_amd.baseline.keys``) needs no field the run does not already record.

Explained in ``docs/cli.md`` ("Recipe shapes").
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
