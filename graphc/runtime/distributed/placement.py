"""Where the data-parallel workers run on a Ray cluster of several nodes, how errors name them,
and what a node lost leaves to restart on.

``placement`` (``gc.Trainer(..., placement=...)``): ``"default"`` is Ray's default scheduling,
which fills the driver's node first (on a cluster of 16-CPU nodes, 4 workers of 1 CPU all run on
one); ``"spread"`` is Ray's ``"SPREAD"`` strategy, one worker per node in turn where resources
allow; any other Ray scheduling strategy (a ``PlacementGroupSchedulingStrategy``, a
``NodeAffinitySchedulingStrategy``) is passed to every worker as it is.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Sequence
from typing import Any

from graphc.errors import GraphcError
from graphc.runtime.distributed.cluster import check_resources

PLACEMENTS = {"default": None, "spread": "SPREAD"}
RAYLET_PROBE_S = 2.0  # how long a node's raylet may take to accept a connection before it counts as lost
NODE_DEAD_S = 60.0  # how long Ray may take to mark a lost node dead (its health checks: about 30 s)


def actor_options(placement: Any) -> dict[str, Any]:
    """The Ray actor options for ``placement`` (the module's docstring); a string that names
    none of ``PLACEMENTS`` is a ``ValueError`` naming them."""
    if isinstance(placement, str):
        if placement not in PLACEMENTS:
            raise ValueError(f"placement must be one of {sorted(PLACEMENTS)} or a Ray scheduling strategy, "
                             f"got {placement!r}")
        strategy = PLACEMENTS[placement]
        return {} if strategy is None else {"scheduling_strategy": strategy}
    return {"scheduling_strategy": placement}


def worker_names(ray, started: Sequence[tuple]) -> list[str]:
    """Each worker's name by rank, from ``Replica.setup``'s (backend, pid, stages, node id): its
    rank and pid and, on a cluster of several nodes, its node (address and the node id's first 8
    hex digits, Ray's)."""
    nodes = {n["NodeID"]: n["NodeManagerAddress"] for n in ray.nodes() if n["Alive"]}
    several = len(nodes) > 1
    return [f"worker rank {rank} (pid {pid}" + (f", node {nodes.get(node, '?')} {node[:8]})" if several else ")")
            for rank, (_, pid, _, node) in enumerate(started)]


def forget_lost_nodes(ray, node_ids: Sequence[str], within_s: float = NODE_DEAD_S) -> list[str]:
    """Of ``node_ids`` (the nodes of workers that died), those lost: their raylet accepts no
    connection within ``RAYLET_PROBE_S``. Waits, up to ``within_s``, until Ray marks each dead, so
    that the cluster's resources no longer count it (a worker killed on a node that lives on
    leaves the node counted). Returns the lost nodes' addresses with their ids' first 8 digits."""
    lost = [n for n in ray.nodes() if n["NodeID"] in set(node_ids) and not (n["Alive"] and _answers(n))]
    deadline = time.monotonic() + within_s
    gone = {n["NodeID"] for n in lost}
    while gone & {n["NodeID"] for n in ray.nodes() if n["Alive"]} and time.monotonic() < deadline:
        time.sleep(0.5)
    return [f"{n['NodeManagerAddress']} {n['NodeID'][:8]}" for n in lost]


def restartable(ray, node_ids: Sequence[str], workers: int, num_cpus: float, num_gpus: float,
                timeout_s: float) -> None:
    """Whether the workers, which ran on ``node_ids``, can start again: a ``GraphcError`` naming the
    nodes lost (``forget_lost_nodes``) when the cluster left cannot hold them (``check_resources``)."""
    gone = forget_lost_nodes(ray, node_ids, min(NODE_DEAD_S, timeout_s))
    try:
        check_resources(ray, workers, num_cpus, num_gpus, timeout_s)
    except GraphcError as exc:
        lost = f"node {', '.join(gone)} lost" if gone else "no node lost"
        raise GraphcError(f"{lost}, the workers cannot start again: {exc}") from None


def _answers(node: dict) -> bool:
    """Whether ``node``'s raylet accepts a connection within ``RAYLET_PROBE_S``."""
    try:
        socket.create_connection((node["NodeManagerAddress"], node["NodeManagerPort"]), timeout=RAYLET_PROBE_S).close()
    except OSError:
        return False
    return True
