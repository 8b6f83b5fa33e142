"""A Ray cluster of several nodes on this machine's loopback, for the multi-node tests.

Each node is ``ray start --block`` of this interpreter (so its workers import this graphc) in a
process group of its own, on 127.0.0.1 with free ports and a temp dir of the cluster's own:
stopping a node kills its group (its raylet and workers) and nothing else on the machine, where
``ray stop`` would stop every Ray cluster of the user. The nodes run with Ray's multi-node switch
on (``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER`` unset); a driver must run with it off ("0", as graphc's
own local cluster), or Ray rewrites the address 127.0.0.1 to the machine's IP, where no node listens.
"""

from __future__ import annotations

import importlib.util
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional

RAY_CLI = [sys.executable, "-m", "ray.scripts.scripts"]
ENABLE = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"
PORTS = ("node-manager-port", "object-manager-port", "dashboard-agent-listen-port", "dashboard-agent-grpc-port",
         "runtime-env-agent-port", "metrics-export-port")


def have_ray_cli() -> bool:
    """Whether this interpreter has Ray (its command line, ``ray start``, comes with it). Only the
    top-level spec is looked up: finding ``ray.scripts`` would import ``ray``, whose constants then
    read this process's multi-node switch before the tests that set it (at collection)."""
    return importlib.util.find_spec("ray") is not None


_TAKEN: set[int] = set()


def _free_port() -> int:
    """A port free now on 127.0.0.1 that no earlier call gave (a node's ports must differ)."""
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port not in _TAKEN:
            _TAKEN.add(port)
            return port


def _session(sid: int) -> list[int]:
    """The processes of session ``sid`` (field 6 of /proc/PID/stat), the leader first."""
    pids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rpartition(")")[2].split()
        except OSError:
            continue  # gone since listed
        if int(fields[3]) == sid:
            pids.append(int(stat.parent.name))
    return sorted(pids, key=lambda pid: pid != sid)


class LoopbackCluster:
    """Nodes named by a custom resource each (``{name: 1}``), each with ``cpus`` CPUs; the first
    is the head. ``address`` is the head's ``127.0.0.1:port``, ``client_address`` its Ray Client
    server's ``ray://127.0.0.1:port``."""

    def __init__(self, nodes: dict[str, float], env: Optional[dict[str, str]] = None, start_s: float = 60.0):
        self.dir = Path(tempfile.mkdtemp(prefix="gcr", dir="/tmp"))  # short: Ray's socket paths are bounded
        self.env = {k: v for k, v in os.environ.items() if k != ENABLE}
        # Ray 2.60's head turns token authentication on where ~/.ray/auth_token exists, and a node
        # joins only with the same token: every node and driver gets this cluster's own
        self.env.update(RAY_USAGE_STATS_ENABLED="0", RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=secrets.token_hex(16))
        self.env.update(env or {})
        self.nodes: dict[str, subprocess.Popen] = {}
        self.start_s = start_s
        self.address = f"127.0.0.1:{_free_port()}"
        self.client_address = f"ray://127.0.0.1:{_free_port()}"  # the head's Ray Client server
        try:
            for name, cpus in nodes.items():
                self._start(name, cpus)
            self._wait(len(nodes), start_s)
        except BaseException:
            self.close()
            raise

    def add(self, name: str, cpus: float) -> None:
        """Start node ``name`` of ``cpus`` CPUs and wait until it is up."""
        self._start(name, cpus)
        self._wait(len(self.nodes), self.start_s)

    def _start(self, name: str, cpus: float) -> None:
        where = ["--head", f"--port={self.address.rpartition(':')[2]}", "--include-dashboard=false",
                 f"--dashboard-port={_free_port()}", f"--ray-client-server-port={self.client_address.rpartition(':')[2]}"] if not self.nodes \
            else [f"--address={self.address}"]
        command = [*RAY_CLI, "start", "--block", "--node-ip-address=127.0.0.1", f"--num-cpus={cpus:g}",
                   f"--resources={json.dumps({name: 1})}", "--disable-usage-stats", f"--temp-dir={self.dir}",
                   *where, *(f"--{p}={_free_port()}" for p in PORTS)]
        with open(self.dir / f"{name}.log", "w") as log:
            self.nodes[name] = subprocess.Popen(command, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                                start_new_session=True)

    def _wait(self, count: int, within_s: float) -> None:
        """Until every node says it started (a node that exits fails at once)."""
        deadline = time.monotonic() + within_s
        while time.monotonic() < deadline:
            for name, node in self.nodes.items():
                if node.poll() is not None:
                    raise RuntimeError(f"ray node {name} exited: {self.log(name)[-2000:]}")
            if all("Ray runtime started" in self.log(name) for name in self.nodes):
                return
            time.sleep(0.2)
        raise RuntimeError(f"{count} ray nodes not up within {within_s:g} s: {self.log(next(iter(self.nodes)))[-2000:]}")

    def log(self, name: str) -> str:
        return (self.dir / f"{name}.log").read_text(errors="replace")

    def kill(self, name: str) -> None:
        """Kill node ``name`` at once, as a machine lost: every process of its session (``ray start``
        runs in a session of its own; its raylet, its workers, each in a group of its own)."""
        node = self.nodes.pop(name)
        for pid in _session(node.pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        node.wait(30)

    def close(self) -> None:
        for name in list(self.nodes)[::-1]:
            self.kill(name)
        shutil.rmtree(self.dir, ignore_errors=True)
