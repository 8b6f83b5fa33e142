"""Connecting to Ray: the lazy import, the local cluster graphc starts, errors from workers.

Ray is optional (``pip install "graphc[ray]"``); nothing here imports it before it is needed.
A cluster graphc starts itself (no address, none running) serves this machine only: it binds to
127.0.0.1, runs no dashboard and reports no usage statistics; its start is quiet (Ray logs only
errors while it starts: not its INFO lines, nor its WARNING that token authentication, its
default, is on), and Ray's driver logs warnings and errors after it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import time
from collections.abc import Sequence
from typing import Any, Optional

from graphc.errors import BackendUnavailable, GraphcError, MissingDependency
from graphc.runtime.distributed.connection import check_joined

INSTALL_HINT = 'pip install "graphc[ray]"'
# A local cluster graphc starts: loopback only (Ray's switch for single-machine clusters), no
# usage reporting. Set before Ray is imported: it reads them at import.
LOCAL_ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_USAGE_STATS_ENABLED": "0"}
PROBE_S = 10.0  # how long a cluster's address may take to accept a connection (ray.init retries for minutes)
LOST_SETTLE_S = 5.0  # how long the calls that take a lost worker's objects may take to fail (settled)
BUSY_S = 30.0  # how long resources others hold may take to be freed (a trainer just shut down frees them late)


class WorkerLost(GraphcError, RuntimeError):
    """A Ray worker process died (killed, out of memory, its node gone) while it held a replica."""


def require_ray(feature: str):
    """The ``ray`` module, or ``MissingDependency`` saying what to install for ``feature``."""
    try:
        import ray
    except ImportError as exc:
        raise MissingDependency(f"{feature} runs on Ray, which is not installed ({exc}); "
                                f"install it with: {INSTALL_HINT}") from None
    return ray


def connect(address: Optional[str], feature: str):
    """Ray, connected: to ``address`` (``"auto"``, ``"ray://host:10001"``, ``"host:6379"``) when
    given, else to the cluster this process already joined, else to a new local one."""
    for key, value in LOCAL_ENV.items():
        if address is None:
            os.environ.setdefault(key, value)
    ray = require_ray(feature)
    if ray.is_initialized() and address not in (None, "auto"):
        check_joined(ray, address)
    if not ray.is_initialized():
        if address is not None:
            _probe(address)
        try:
            if address is None:
                try:
                    ray.init(include_dashboard=False, log_to_driver=False, logging_level=logging.ERROR)
                finally:
                    logging.getLogger("ray").setLevel(logging.WARNING)
            else:
                ray.init(address=address, log_to_driver=False)
        except Exception as exc:  # noqa: BLE001 - Ray raises bare Exceptions (a raylet that did not start)
            where = f"reach the Ray cluster at {address!r}" if address else "start a local Ray cluster"
            raise GraphcError(f"cannot {where}: {exc}") from None
    return ray


def _probe(address: str) -> None:
    """Fail within ``PROBE_S``, naming ``address``, when nothing accepts a connection at its
    ``host:port`` (``"auto"`` names none: Ray finds the cluster itself, or fails at once)."""
    host, sep, port = address.removeprefix("ray://").rpartition(":")
    if not sep or not port.isdigit():
        return
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=PROBE_S).close()
    except OSError as exc:
        raise GraphcError(f"cannot reach the Ray cluster at {address!r}: nothing accepts a connection at "
                          f"{host}:{port} within {PROBE_S:g} s ({exc or 'timed out'}); check the address "
                          "(`ray start --head` prints it) and that the port is open") from None


def check_resources(ray, workers: int, num_cpus: float, num_gpus: float, timeout_s: float) -> None:
    """Fail, with the reason, when the cluster cannot hold ``workers`` actors asking for these
    resources (Ray would leave them pending for ever), or when others hold them for ``BUSY_S``
    or ``timeout_s`` if shorter (the workers would wait for them until a call timed out)."""
    asked = [(kind, each) for kind, each in (("GPU", num_gpus), ("CPU", num_cpus)) if each > 0]
    total = ray.cluster_resources()
    for kind, each in asked:
        have = float(total.get(kind, 0.0))
        if have < each * workers:
            detail = " (no GPU on any node: ort-cuda cannot run)" if kind == "GPU" and have == 0 else ""
            raise BackendUnavailable(f"{workers} worker(s) x {kind.lower()}s={each:g} need {each * workers:g} "
                                     f"{kind}(s); the Ray cluster has {have:g}{detail}")
    busy_s = min(BUSY_S, timeout_s)
    deadline = time.monotonic() + busy_s
    while True:
        free = ray.available_resources()
        short = [(kind, each, float(free.get(kind, 0.0))) for kind, each in asked
                 if float(free.get(kind, 0.0)) < each * workers - 1e-6]
        if not short:
            return
        if time.monotonic() > deadline:
            kind, each, have = short[0]
            raise BackendUnavailable(f"{workers} worker(s) x {kind.lower()}s={each:g} need {each * workers:g} "
                                     f"{kind}(s); the Ray cluster has {float(total[kind]):g}, but others (another "
                                     f"trainer or job) have held all but {have:g} for {busy_s:g} s; stop them, or "
                                     f"ask for fewer workers or {kind.lower()}s")
        time.sleep(0.5)


def get(ray, refs: Any, timeout: Optional[float], what: str, who: Optional[Sequence[str]] = None) -> Any:
    """``ray.get`` that turns a dead worker into ``WorkerLost``, a worker's graphc error into
    that error itself, named after the worker that raised it, and a time-out into an error naming
    ``what``; ``who`` names the worker (or batch) of each of ``refs`` (a list), and the errors name
    those that died, failed or are late."""
    from ray import exceptions as rex

    try:
        return ray.get(refs, timeout=timeout)
    except (rex.RayActorError, rex.WorkerCrashedError) as exc:
        lost = _named(ray, refs, who, (rex.RayActorError, rex.WorkerCrashedError)) or "a Ray worker"
        raise WorkerLost(f"{lost} died during {what}: {str(exc).splitlines()[0]}") from None
    except rex.RayTaskError as exc:
        cause = exc.cause
        if not isinstance(cause, GraphcError):
            raise
        failed = _named(ray, refs, who, (rex.RayTaskError,))
        if failed and len(cause.args) == 1 and isinstance(cause.args[0], str):
            cause.args = (f"{failed} failed during {what}: {cause.args[0]}",)
        raise cause from None
    except rex.GetTimeoutError:
        late = _named(ray, refs, who, None)
        late = f" ({late} not done)" if late else ""
        raise GraphcError(f"{what} took more than {timeout:g} s{late}; raise timeout_s or check the cluster") from None


def settle(ray, refs: list, wait_s: float = 0.0) -> None:
    """Read what each of ``refs`` that is done holds, dropping its error: a call that failed left
    one in every object it returns, and Ray logs an error never read ("Unhandled error", with the
    worker's traceback) once its object is freed, after graphc raised it already. ``wait_s``: how long
    the others may take to be done (the calls that take a lost worker's objects fail after it). A ref
    given twice is read once (``ray.wait`` refuses duplicates)."""
    for ref in _done(ray, list(dict.fromkeys(refs)), wait_s):
        _error(ray, ref)  # the error was raised from another of the call's objects


@contextlib.contextmanager
def settled(ray, refs: list):
    """``settle`` ``refs`` where the block raises a ``GraphcError`` (a worker lost, failed or late),
    after a worker lost giving the calls that wait on it ``LOST_SETTLE_S`` to fail."""
    try:
        yield
    except GraphcError as exc:
        settle(ray, refs, LOST_SETTLE_S if isinstance(exc, WorkerLost) else 0.0)
        raise


def _named(ray, refs: list, who: Optional[Sequence[str]], errors: Optional[tuple]) -> str:
    """The names in ``who`` of the ``refs`` that hold one of ``errors`` (a worker that died, or a
    task that raised), else (``errors`` None) of those not done."""
    if who is None:
        return ""
    done = set(_done(ray, refs))
    if errors is None:
        return ", ".join(name for ref, name in zip(refs, who) if ref not in done)
    return ", ".join(name for ref, name in zip(refs, who) if ref in done and isinstance(_error(ray, ref), errors))


def _done(ray, refs: list, wait_s: float = 0.0) -> list:
    """Those of ``refs`` that are done, waiting at most ``wait_s`` for the others."""
    return ray.wait(refs, num_returns=len(refs), timeout=wait_s)[0]


def _error(ray, ref) -> Optional[Exception]:
    """The error the done ``ref`` holds (read, so Ray does not log it as never read), else None."""
    try:
        ray.get(ref, timeout=0)
    except Exception as exc:  # noqa: BLE001 - any error: the caller tells which it names
        return exc
    return None
