"""A two-node Ray cluster on one CPU machine for the cluster rehearsal, stopped by pid.

A head and a joined raylet, each with a private 0700 temp dir as its ``TMPDIR`` and
``MILES_AMD_NODE_ROOT`` (evidence only that node writes) and the fake node resource with 8 GPUs;
they share Ray's ``--temp-dir`` (``docs/cluster.md``). Token auth, every port chosen here; each
``ray start --block`` is a ``ProcessTree`` stopped by pid; :meth:`LocalNode.kill` is node loss.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import sys
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from miles_amd.files import atomic_write_text
from miles_amd.recipe.plan import NODE_RESOURCE, NODE_ROOT_VAR
from miles_amd.run.dashboard import DashboardError, auth_headers, get_json
from miles_amd.run.ray_head import (
    PORT_ENV_VARS,
    PORT_OPTIONS,
    TEMP_PREFIX,
    TEMP_ROOT,
    WORKER_PORTS,
    OwnedProcess,
    ProcessTree,
    free_ports,
    ray_executable,
    spawn_logged,
)

# The head's ports are the tool's own head's (ray_head); a joining raylet has no GCS,
# dashboard or client server, so it takes the rest.
WORKER_NODE_PORTS = tuple(
    p for p in PORT_OPTIONS if p not in ("--port", "--dashboard-port", "--ray-client-server-port")
)


@dataclass(kw_only=True)
class LocalNode(ProcessTree):
    name: str
    temp_dir: Path

    @property
    def node_root(self) -> Path:
        return self.temp_dir / "node_root"


@dataclass
class TwoNodeCluster:
    nodes: list[LocalNode]
    dashboard_url: str
    gcs_address: str
    token_dir: Path
    token: str = field(repr=False)

    @property
    def token_path(self) -> Path:
        return self.token_dir / "auth_token"

    def client_env(self, env: Mapping[str, str]) -> dict[str, str]:
        return {
            **env,
            "RAY_ADDRESS": self.dashboard_url,
            "RAY_AUTH_TOKEN_PATH": str(self.token_path),
        }

    def stop(self) -> None:
        for node in reversed(self.nodes):  # the joined node first, the head last
            node.stop()
        for node in self.nodes:
            shutil.rmtree(node.temp_dir, ignore_errors=True)
        shutil.rmtree(self.token_dir, ignore_errors=True)

    def leftovers(self) -> list[OwnedProcess]:
        return [p for node in self.nodes for p in node.leftovers()]


def _node_argv(ray_temp: Path, ports: dict[str, int], gpus: int) -> list[str]:
    resources = json.dumps({NODE_RESOURCE: 1}) if gpus else "{}"
    argv = [ray_executable(), "start", "--block", "--disable-usage-stats"]
    argv += ["--num-cpus", "1", "--num-gpus", str(gpus), "--resources", resources]
    argv += ["--temp-dir", str(ray_temp)]
    argv += [str(x) for option, port in ports.items() for x in (option, port)]
    return argv + list(WORKER_PORTS)


def _spawn(name: str, argv: list[str], env: dict[str, str], temp_dir: Path) -> LocalNode:
    log_path = temp_dir / f"{name}.log"
    (temp_dir / "node_root").mkdir()
    process, owned = spawn_logged(argv, env, log_path)
    return LocalNode(process, owned, log_path, name=name, temp_dir=temp_dir)


def _node_env(base: Mapping[str, str], temp_dir: Path, token_path: Path) -> dict[str, str]:
    env = {k: v for k, v in base.items() if k not in ("RAY_AUTH_TOKEN", "RAY_ADDRESS")}
    env.pop("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", None)
    return {
        **env,
        "RAY_AUTH_MODE": "token",
        "RAY_AUTH_TOKEN_PATH": str(token_path),
        "TMPDIR": str(temp_dir),
        NODE_ROOT_VAR: str(temp_dir / "node_root"),
        # a node's `python` is the one with Ray (the pull-back's entrypoint runs it)
        "PATH": os.pathsep.join((str(Path(sys.executable).parent), base.get("PATH", ""))),
    }


def start_cluster(
    env: Mapping[str, str], *, second_node_gpus: int = 8, timeout_s: float = 120.0
) -> TwoNodeCluster:
    token_dir = Path(tempfile.mkdtemp(prefix=TEMP_PREFIX, dir=TEMP_ROOT))
    token = secrets.token_hex(32)
    atomic_write_text(token_dir / "auth_token", token, mode=0o600)
    cluster = TwoNodeCluster([], "", "", token_dir, token)
    try:
        head_dir = Path(tempfile.mkdtemp(prefix=TEMP_PREFIX, dir=TEMP_ROOT))
        names = (*PORT_OPTIONS, *PORT_ENV_VARS)
        ports = dict(zip(names, free_ports(len(names)), strict=True))
        head_env = _node_env(env, head_dir, cluster.token_path)
        head_env.update({name: str(ports.pop(name)) for name in PORT_ENV_VARS})
        argv = _node_argv(head_dir / "ray", ports, 8)
        argv[2:2] = ["--head", "--node-ip-address", "127.0.0.1", "--dashboard-host", "127.0.0.1"]
        cluster.nodes.append(_spawn("head", argv, head_env, head_dir))
        cluster.dashboard_url = f"http://127.0.0.1:{ports['--dashboard-port']}"
        cluster.gcs_address = f"127.0.0.1:{ports['--port']}"
        _wait_nodes(cluster, 1, timeout_s)
        node_dir = Path(tempfile.mkdtemp(prefix=TEMP_PREFIX, dir=TEMP_ROOT))
        node_ports = dict(zip(WORKER_NODE_PORTS, free_ports(len(WORKER_NODE_PORTS)), strict=True))
        argv = _node_argv(head_dir / "ray", node_ports, second_node_gpus)
        argv[2:2] = ["--address", cluster.gcs_address, "--node-ip-address", "127.0.0.1"]
        node_env = _node_env(env, node_dir, cluster.token_path)
        cluster.nodes.append(_spawn("node", argv, node_env, node_dir))
        _wait_nodes(cluster, 2, timeout_s)
    except BaseException:
        cluster.stop()
        raise
    for node in cluster.nodes:
        node.record_descendants()
    return cluster


def _wait_nodes(cluster: TwoNodeCluster, count: int, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    headers = auth_headers(cluster.token)
    while time.monotonic() < deadline:
        for node in cluster.nodes:
            if node.process.poll() is not None:
                raise RuntimeError(f"ray start ({node.name}) exited: {node.log_tail()}")
        try:
            answer = get_json(cluster.dashboard_url, "/nodes?view=summary", headers, timeout_s=5)
            summary = answer["data"]["summary"]
            alive = [n for n in summary if n.get("raylet", {}).get("state") == "ALIVE"]
            if len(alive) >= count:
                return
        except (DashboardError, KeyError, TypeError, AttributeError):
            pass
        time.sleep(1.0)
    raise RuntimeError(f"{count} Ray nodes not alive after {timeout_s:.0f} s")
