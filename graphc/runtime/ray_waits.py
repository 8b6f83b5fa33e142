"""How long the driver waits on a ``gc.data.RayDataLoader``'s Ray work: for ever, unless a caller
bounds it (``waits_at_most``: a data-parallel ``fit`` by its ``timeout_s``), then a ``GraphcError``
naming what it waited for and the likely cause, not a hang.

The bound is a context variable, so it holds for the thread (and context) that set it alone.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, Callable, Optional

from graphc.errors import GraphcError

__all__ = ["got", "ran", "waits_at_most"]

_BOUND: ContextVar[Optional[float]] = ContextVar("graphc_ray_data_wait_s", default=None)

NO_CPU = ("the dataset's own tasks (Ray Data's read and map tasks ask for 1 CPU each by default) found no free CPU: "
          "actors (data-parallel workers, a placement group) may hold every CPU of the cluster, or the tasks ask "
          "for more than it has")


@contextmanager
def waits_at_most(timeout_s: Optional[float]) -> Iterator[None]:
    """Bound each wait on a loader's Ray work in this context by ``timeout_s`` seconds (None: none)."""
    token = _BOUND.set(timeout_s)
    try:
        yield
    finally:
        _BOUND.reset(token)


def _late(what: str, cause: str) -> GraphcError:
    return GraphcError(f"RayDataLoader: {what} took more than {_BOUND.get():g} s (timeout_s); likely cause: {cause}")


def got(refs: Any, what: str, cause: str) -> Any:
    """``ray.get(refs)`` within the bound: past it, an error naming ``what`` and the likely ``cause``."""
    import ray

    try:
        return ray.get(refs, timeout=_BOUND.get())
    except ray.exceptions.GetTimeoutError:
        raise _late(what, cause) from None


def ran(fn: Callable[[], Any], what: str) -> Any:
    """``fn()`` (a Ray Data execution, which takes no timeout) within the bound, in a daemon thread
    the caller leaves behind past it: Ray Data goes on waiting for its tasks there."""
    if _BOUND.get() is None:
        return fn()
    out: dict[str, Any] = {}

    def run() -> None:
        try:
            out["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - raised again in the caller's thread
            out["error"] = exc

    thread = threading.Thread(target=run, name="graphc-ray-data-run", daemon=True)
    thread.start()
    thread.join(_BOUND.get())
    if thread.is_alive():
        raise _late(what, NO_CPU)
    if "error" in out:
        raise out["error"]
    return out["value"]
