"""Cluster mode: does a Ray cluster have the whole MI355X nodes a run needs (State API, before
anything is submitted)? A shortfall is one line naming every node and what it lacks.
``docs/cluster.md``.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from miles_amd.recipe.plan import NODE_RESOURCE
from miles_amd.run.dashboard import DashboardAuthError, DashboardError, get_json, read_timeout_s

NODES_PATH = "/api/v0/nodes?limit=10000&detail=1"


class ClusterError(RuntimeError):
    """The cluster cannot run the job; bad input."""


@dataclass(frozen=True)
class Node:
    node_id: str
    ip: str
    alive: bool
    resources: Mapping[str, float]

    def shortfall(self, gpus: int) -> str | None:
        if not self.alive:
            return "not alive"
        missing = [f"no {NODE_RESOURCE}"] if self.resources.get(NODE_RESOURCE, 0) < 1 else []
        if self.resources.get("GPU", 0) < gpus:
            missing.append(f"GPU {self.resources.get('GPU', 0):g} < {gpus}")
        return ", ".join(missing) or None


def parse_nodes(payload: Mapping[str, object]) -> list[Node]:
    try:
        rows = payload["data"]["result"]["result"]  # type: ignore[index]
        return [
            Node(
                node_id=str(row["node_id"]),
                ip=str(row.get("node_ip", "?")),
                alive=row.get("state") == "ALIVE",
                resources={str(k): float(v) for k, v in row.get("resources_total", {}).items()},
            )
            for row in rows
        ]
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise ClusterError(f"the State API answered without a node list ({exc!r})") from None


def list_nodes(address: str, headers: Mapping[str, str]) -> list[Node]:
    try:
        answer = get_json(address, NODES_PATH, headers, timeout_s=read_timeout_s())
    except DashboardAuthError as exc:
        raise ClusterError(f"cannot list the nodes: {exc}") from None
    except DashboardError as exc:
        raise ClusterError(f"{address}: cannot list the nodes: {exc}") from None
    if not isinstance(answer, Mapping):
        raise ClusterError(f"{address}: the State API answered without a node list")
    return parse_nodes(answer)


def suitable_nodes(nodes: Sequence[Node], *, gpus: int, count: int, address: str) -> list[Node]:
    fit = [node for node in nodes if node.shortfall(gpus) is None]
    if len(fit) >= count:
        return fit
    unfit = "; ".join(
        f"{n.node_id[:8]} ({n.ip}): {n.shortfall(gpus)}" for n in nodes if n not in fit
    )
    raise ClusterError(
        f"the Ray cluster at {address} has {len(fit)} node(s) with {NODE_RESOURCE} >= 1 and "
        f"GPU >= {gpus}, {count} needed (one per job) [{unfit or 'no nodes'}]; nothing "
        f"submitted. Declare whole nodes with ray start --num-gpus {gpus} "
        f"--resources '{{\"{NODE_RESOURCE}\": 1}}' (docs/cluster.md)"
    )


def check_cluster(
    address: str, headers: Mapping[str, str], *, gpus: int, count: int = 1, settle_s: float = 15.0
) -> list[Node]:
    """Require ``count`` suitable nodes. An empty list is read again for up to ``settle_s``:
    the State API lists a new head about 3 s after the dashboard first answers (Ray 2.60)."""
    deadline = time.monotonic() + settle_s
    nodes = list_nodes(address, headers)
    while not nodes and time.monotonic() < deadline:
        time.sleep(0.5)
        nodes = list_nodes(address, headers)
    return suitable_nodes(nodes, gpus=gpus, count=count, address=address)
