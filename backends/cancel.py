"""``CancelToken``: stops a run from another thread (``Session.run(..., cancel=token)``).

``token.cancel()`` may be called from any thread at any time. The numpy interpreter checks the
token before every node and at the start of every subgraph run (each Loop or Scan iteration, each
If branch), so a run stops within one node's time; a single kernel is never interrupted. An
onnxruntime run gets ``RunOptions.terminate``, which onnxruntime checks between nodes, inside a
Loop's or Scan's subgraph too. Either way the run raises ``gc.errors.RunCancelled``.
"""

from __future__ import annotations

from typing import Any

from graphc.errors import RunCancelled


class CancelToken:
    """A flag another thread sets to stop the runs given it; a token stays cancelled."""

    __slots__ = ("cancelled", "_runs")

    def __init__(self) -> None:
        self.cancelled = False
        self._runs: list[Any] = []  # onnxruntime RunOptions of the runs under way

    def cancel(self) -> None:
        self.cancelled = True  # before reading ``_runs``: a run ``watch`` adds now sees the flag
        for options in tuple(self._runs):
            options.terminate = True

    def watch(self, options: Any) -> Any:
        """Let ``cancel`` terminate the onnxruntime run given ``options`` (a ``RunOptions``);
        returns them, already terminated if the token is cancelled."""
        self._runs.append(options)
        if self.cancelled:
            options.terminate = True
        return options

    def check(self, where: str) -> None:
        """``RunCancelled`` naming ``where`` the run stopped, if the token is cancelled."""
        if self.cancelled:
            raise RunCancelled(f"the run was cancelled {where}")
