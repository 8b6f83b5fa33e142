"""Which Ray connection this process holds: whether a ``ray_address`` names its cluster
(``check_joined``), and whether the connection a trainer started its workers under still is the
one (``Connection``): their actors go when it is shut down (``ray.shutdown()``). Such a trainer
cannot be copied (``DrivesWorkers``).

A Ray Client connection (``ray.init("ray://host:10001")``) is told by its client object, which
each ``ray.init`` makes anew: asking the cluster for the session (``ray.get_runtime_context()``)
there is a round trip to the server, 3.7 ms on loopback, about a quarter of a 2-worker step.
"""

from __future__ import annotations

import socket
from typing import Any, Optional

from graphc.errors import GraphcError

__all__ = ["Connection", "DrivesWorkers", "check_joined"]


class DrivesWorkers:
    """A driver of Ray actors that it steps one call at a time (``DistributedTrainer``): a copy
    (pickled into a Ray task or actor, ``copy.deepcopy``) would step them behind its back, its
    updates lost with it, so it refuses to be one."""

    def __reduce_ex__(self, protocol):
        raise TypeError("a data-parallel gc.Trainer cannot be pickled (passed to a Ray task or actor, copied): its "
                        "workers are Ray actors that this process drives step by step, and a copy would step them "
                        "behind its back (the copy's updates lost); save a checkpoint (save_checkpoint(path)) and "
                        "make a gc.Trainer from it where it is needed")


class Connection:
    """The Ray connection of this process when made (``ray``: the module, connected)."""

    def __init__(self, ray):
        self._ray, self._client = ray, _client(ray)
        self._session = None if self._client is not None else _session(ray)

    def current(self) -> bool:
        """Whether this process still holds that connection, without a call to the cluster."""
        if self._client is not None:
            return _client(self._ray) is self._client
        return _client(self._ray) is None and _session(self._ray) == self._session


def check_joined(ray, address: str) -> None:
    """Refuse ``address`` when this process already joined another cluster (``ray.init`` was
    called, by the user or an earlier trainer): Ray keeps one connection per process, so graphc
    would otherwise run on that cluster, not the one asked for. A ``ray://`` address is compared
    with the Ray Client connection's, another with the cluster's GCS address (``host:port``)."""
    client = _client(ray)
    where = getattr(client, "_conn_str", None)  # "host:port" of the Ray Client server
    if client is not None and where is None:
        return  # a Ray Client of another make: its server's address is unknown here
    if address.startswith("ray://"):
        joined = f"ray://{where}" if client is not None else ray.get_runtime_context().gcs_address
        same = client is not None and _endpoint(address.removeprefix("ray://")) == _endpoint(where)
    else:
        joined = ray.get_runtime_context().gcs_address
        same = _endpoint(address) == _endpoint(joined)
    if same:
        return
    raise GraphcError(f"ray_address={address!r}, but this process is already connected to the Ray cluster at "
                      f"{joined!r} (ray.init() was called, or an earlier gc.Trainer or map_batches connected), and "
                      "Ray holds one connection per process: call ray.shutdown() first, or leave ray_address out "
                      "(or pass 'auto') to use the cluster already joined")


def _client(ray) -> Optional[Any]:
    """The Ray Client connection's client object, None outside one."""
    import ray.util.client

    context = ray.util.client.ray.get_context()
    return context.client_worker if context.is_connected() else None


def _session(ray) -> Optional[tuple[str, str]]:
    """The connection's (cluster session, job); None when there is none."""
    if not ray.is_initialized():
        return None
    context = ray.get_runtime_context()
    return context.get_session_name(), context.get_job_id()


def _endpoint(address: str) -> tuple[str, str]:
    """``host:port`` as (IP address, port), any address of this machine as one (a Ray Client
    server names its cluster by the machine's address, where the client reached it on 127.0.0.1);
    a host that does not resolve stays as written."""
    host, _, port = address.rpartition(":")
    host = host.strip("[]")
    try:
        host = socket.gethostbyname(host)
    except OSError:
        return host, port
    return ("this machine" if _local(host) else host), port


def _local(ip: str) -> bool:
    """Whether ``ip`` (IPv4) is an address of this machine: loopback, or one a socket binds to."""
    if ip.startswith("127."):
        return True
    try:
        with socket.socket() as probe:
            probe.bind((ip, 0))
    except OSError:
        return False
    return True
