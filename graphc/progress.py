"""The progress bar `Trainer.fit` shows: steps, loss, throughput, elapsed and remaining time."""

from __future__ import annotations

import time

from rich.console import Console
from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn,
                           TimeRemainingColumn)

__all__ = ["TrainProgress"]

_REFRESH_S = 0.1  # update the bar at most this often: a step can take well under a millisecond
_EPOCH_LINES = 10  # print at most about this many per-epoch summary lines


class TrainProgress:
    """A rich progress bar over ``total`` steps; a no-op when ``enabled`` is False."""

    def __init__(self, total: int, enabled: bool = True, console: Console | None = None):
        self.enabled = enabled
        self._pending = 0
        self._last = 0.0
        if enabled:
            self._progress = Progress(
                TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                TextColumn("loss {task.fields[loss]:.4f}"), TextColumn("{task.fields[rate]:,.0f} samples/s"),
                TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn(),
                console=console, transient=False)
            self._task = self._progress.add_task("train", total=total, loss=float("nan"), rate=0.0)

    def __enter__(self) -> TrainProgress:
        if self.enabled:
            self._progress.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.enabled:
            self._flush()
            self._progress.__exit__(*exc)

    def step(self, loss: float, rate: float, epoch: int) -> None:
        if not self.enabled:
            return
        self._pending += 1
        self._fields = {"loss": loss, "rate": rate, "description": f"epoch {epoch + 1}"}
        now = time.perf_counter()
        if now - self._last >= _REFRESH_S:
            self._last = now
            self._flush()

    def _flush(self) -> None:
        if self._pending:
            self._progress.update(self._task, advance=self._pending, **self._fields)
            self._pending = 0

    def epoch_done(self, record, epochs: int) -> None:
        every = max(1, -(-epochs // _EPOCH_LINES))
        if not self.enabled or (record.epoch % every and record.epoch != epochs):
            return
        self._flush()
        evals = "".join(f"  eval {k} {v:.4f}" for k, v in record.eval.items())
        self._progress.console.print(
            f"epoch {record.epoch}/{epochs}  loss {record.loss:.4f}{evals}  "
            f"{record.samples_per_s:,.0f} samples/s  ({record.seconds:.2f} s)", highlight=False, soft_wrap=True)
