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


def test_cluster_plan_asks_for_a_whole_node_and_writes_evidence_on_it() -> None:
    plan = build_train_plan(
        Recipe(), CLUSTER, run_dir="/runs/r1", node_root="/scratch/miles", run_id="abc"
    )
    assert plan.job is not None
    assert dict(plan.job.entrypoint_resources) == {NODE_RESOURCE: 1.0}
    assert plan.node_run_dir == "/scratch/miles/r1-abc"
    assert plan.job.env_vars["TENSORBOARD_DIR"] == "/scratch/miles/r1-abc/tensorboard"
    assert plan.job.env_vars["MILES_CI_GATE_RECORD_DIR"] == "/scratch/miles/r1-abc/ci_history"
    assert [s.name for s in plan.steps] == ["cleanup", "check-cluster", "submit", "pull-back"]
    assert plan.to_dict()["job"]["entrypoint_resources"] == {NODE_RESOURCE: 1.0}
    assert "check-cluster" in format_plan(plan)


def test_shared_storage_cluster_plan_writes_the_run_dir_and_pulls_nothing() -> None:
    plan = build_train_plan(Recipe(), CLUSTER, run_dir="/runs/r1")
    assert plan.job is not None and plan.job.entrypoint_resources
    assert plan.node_run_dir is None
    assert plan.job.env_vars["TENSORBOARD_DIR"] == "/runs/r1/tensorboard"
    assert [s.name for s in plan.steps] == ["cleanup", "check-cluster", "submit"]


def test_own_head_plan_has_no_node_request() -> None:
    plan = build_train_plan(Recipe(), {}, run_dir="/runs/r1")
    assert plan.job is not None and not plan.job.entrypoint_resources
    assert plan.node_run_dir is None
    assert plan.job.env_vars["TENSORBOARD_DIR"] == "/runs/r1/tensorboard"


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
    payload = {
        "data": {
            "result": {
                "result": [
                    {
                        "node_id": "n1",
                        "node_ip": "1.2.3.4",
                        "state": "ALIVE",
                        "resources_total": {"GPU": 8, NODE_RESOURCE: 1},
                    }
                ]
            }
        }
    }
    (only,) = parse_nodes(payload)
    assert only.alive and only.resources["GPU"] == 8.0 and only.shortfall(8) is None
    with pytest.raises(ClusterError, match="without a node list"):
        parse_nodes({"data": {"summary": []}})
