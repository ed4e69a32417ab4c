"""Cluster mode without a cluster: the plan's node request and the suitable-node rule."""

from __future__ import annotations

import pytest

from miles_amd.recipe.plan import NODE_RESOURCE, build_train_plan, format_plan
from miles_amd.recipe.settings import Recipe
from miles_amd.run.cluster import ClusterError, Node, parse_nodes, suitable_nodes

pytestmark = pytest.mark.unit

CLUSTER = {"RAY_ADDRESS": "http://10.0.0.5:8265"}


def node(node_id: str, alive: bool = True, **resources: float) -> Node:
    return Node(node_id, "10.0.0.9", alive, resources)


@pytest.mark.parametrize(
    ("env", "node_root", "resources", "evidence", "steps"),
    [  # a cluster without shared storage, with it, and the tool's own head
        (CLUSTER, "/scratch/miles", {NODE_RESOURCE: 1.0}, "/scratch/miles/r1-abc", ["pull-back"]),
        (CLUSTER, None, {NODE_RESOURCE: 1.0}, "/runs/r1", []),
        ({}, None, {}, "/runs/r1", None),
    ],
)
def test_the_plan_asks_for_a_whole_node_and_writes_evidence_on_it(
    env: dict, node_root: str | None, resources: dict, evidence: str, steps: list | None
) -> None:
    plan = build_train_plan(Recipe(), env, run_dir="/runs/r1", node_root=node_root, run_id="abc")
    assert plan.job is not None and dict(plan.job.entrypoint_resources) == resources
    assert plan.node_run_dir == (evidence if node_root else None)
    assert plan.job.env_vars["TENSORBOARD_DIR"] == f"{evidence}/tensorboard"
    assert plan.job.env_vars["MILES_CI_GATE_RECORD_DIR"] == f"{evidence}/ci_history"
    if steps is not None:
        assert [s.name for s in plan.steps] == ["cleanup", "check-cluster", "submit", *steps]
        assert plan.to_dict()["job"]["entrypoint_resources"] == resources
        assert "check-cluster" in format_plan(plan)


def test_suitable_needs_resource_gpus_and_alive() -> None:
    nodes = [
        node("good", GPU=8, **{NODE_RESOURCE: 1}),
        node("nores", GPU=8),
        node("fewgpu", GPU=4, **{NODE_RESOURCE: 1}),
        node("dead", alive=False, GPU=8, **{NODE_RESOURCE: 1}),
    ]
    assert [n.node_id for n in suitable_nodes(nodes, gpus=8, count=1, address="X")] == ["good"]
    with pytest.raises(ClusterError) as refused:
        suitable_nodes(nodes, gpus=8, count=2, address="http://h:8265")
    message = str(refused.value)
    assert "has 1 node(s)" in message and "2 needed" in message
    assert f"nores (10.0.0.9): no {NODE_RESOURCE}" in message
    assert "fewgpu (10.0.0.9): GPU 4 < 8" in message and "dead (10.0.0.9): not alive" in message
    assert "nothing submitted" in message and "--resources" in message


def test_parse_nodes_reads_the_state_api_and_refuses_other_shapes() -> None:
    total = {"GPU": 8, NODE_RESOURCE: 1}
    row = {"node_id": "n1", "node_ip": "1.2.3.4", "state": "ALIVE", "resources_total": total}
    (only,) = parse_nodes({"data": {"result": {"result": [row]}}})
    assert only.alive and only.resources["GPU"] == 8.0 and only.shortfall(8) is None
    with pytest.raises(ClusterError, match="without a node list"):
        parse_nodes({"data": {"summary": []}})
