"""What `Trainer.fit` prints: a progress bar within each epoch and one line per epoch.

The bar (rich) counts the steps of the epoch under way, is labelled ``epoch K/N`` and shows the
epoch's running mean loss (``-`` until a step has run), throughput, elapsed and remaining time;
it is transient, so what stays on screen (and in a log of stdout) is one line per epoch, every
epoch, Keras style: ``epoch 3/12  loss 0.1234  accuracy 0.9100  eval loss 0.2345  eval accuracy
0.9300  ...``, where ``loss`` and the train metrics are means over the epoch's steps.
"""

from __future__ import annotations

import time
from typing import Optional

import rich
from rich.console import Console
from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn,
                           TimeRemainingColumn)

__all__ = ["TrainProgress", "plural"]

_REFRESH_S = 0.1  # update the bar at most this often: a step can take well under a millisecond


def plural(count: int, word: str) -> str:
    """``1 epoch``, ``2 epochs``, ``1,370 elements``."""
    return f"{count:,} {word}{'' if count == 1 else 's'}"


class TrainProgress:
    """The bar (``bar``) and the epoch lines (``lines``) of a run of ``epochs`` epochs of
    ``steps`` steps each; either can be off (``fit(progress=False)`` keeps the lines,
    ``fit(quiet=True)`` drops both)."""

    def __init__(self, epochs: int, steps: int, bar: bool = True, lines: bool = True,
                 console: Optional[Console] = None):
        self.epochs, self.steps, self.lines = epochs, steps, lines
        self.console = console or rich.get_console()
        self._progress: Optional[Progress] = None
        self._pending = 0
        self._last = 0.0
        if bar and self.console.is_terminal:  # rich cannot animate elsewhere: a log gets the lines only
            self._progress = Progress(
                TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                TextColumn("running mean loss {task.fields[loss]}"), TextColumn("{task.fields[rate]:,.0f} samples/s"),
                TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn(),
                console=self.console, transient=True)
        self._task = None

    def __enter__(self) -> TrainProgress:
        if self._progress is not None:
            self._progress.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._progress is not None:
            self._flush()
            self._progress.__exit__(*exc)

    def start_epoch(self, epoch: int, done: int, mean_loss: Optional[float]) -> None:
        """Epoch ``epoch`` (0-based) begins, ``done`` of its steps already run (a resumed
        epoch), with the running mean loss of those."""
        if self._progress is None:
            return
        self._pending = 0
        fields = {"total": self.steps, "completed": done, "loss": _loss(mean_loss), "rate": 0.0}
        if self._task is None:
            self._task = self._progress.add_task(f"epoch {epoch + 1}/{self.epochs}", **fields)
        else:
            self._progress.reset(self._task, description=f"epoch {epoch + 1}/{self.epochs}", **fields)

    def step(self, mean_loss: float, rate: float, batches: int = 1) -> None:
        """``batches`` more batches done (an accumulated step's micro-batches)."""
        if self._progress is None:
            return
        self._pending += batches
        self._fields = {"loss": _loss(mean_loss), "rate": rate}
        now = time.perf_counter()
        if now - self._last >= _REFRESH_S:
            self._last = now
            self._flush()

    def _flush(self) -> None:
        if self._pending:
            self._progress.update(self._task, advance=self._pending, **self._fields)
            self._pending = 0

    def epoch_done(self, record) -> None:
        """Print the line of the epoch ``record`` (a ``gc.runtime.history.EpochRecord``)."""
        if self._progress is not None:
            self._flush()
            self._progress.refresh()  # else the live area printed under the line is the last auto-refresh's
        if not self.lines:
            return
        train = "".join(f"  {k} {v:.4f}" for k, v in record.metrics.items())
        evals = "".join(f"  eval {k} {v:.4f}" for k, v in record.eval.items())
        scaling = "" if record.loss_scale is None else \
            f"  loss scale {record.loss_scale:g} ({plural(record.skipped_steps, 'step')} skipped)"
        self.console.print(
            f"epoch {record.epoch}/{self.epochs}  loss {record.loss:.4f}{train}{evals}{scaling}  "
            f"{record.samples_per_s:,.0f} samples/s  {record.seconds:.2f} s", highlight=False, soft_wrap=True)


def _loss(mean: Optional[float]) -> str:
    return "-" if mean is None else f"{mean:.4f}"
