"""`gc.History`: what `Trainer.fit` returns — per-step losses, per-epoch records, throughput —
and `EpochLog`, the per-epoch log file ``fit(log=...)`` writes for scripts."""

from __future__ import annotations

import csv
import io
import json
import os
from pathlib import Path
from typing import Optional, Union

from pydantic import BaseModel, Field

from graphc.errors import MissingDependency

__all__ = ["EpochLog", "EpochRecord", "History", "check_plot"]


class EpochRecord(BaseModel):
    """One epoch of ``fit``: mean train loss and train metrics (each the mean of its batch values
    weighted by batch size, from the training steps' own outputs), evaluation loss and metrics,
    train throughput."""

    epoch: int                      # 1-based
    loss: float                     # mean train loss over the epoch's steps
    steps: int
    samples: int
    seconds: float                  # train time (evaluation excluded)
    samples_per_s: float
    metrics: dict[str, float] = Field(default_factory=dict)  # train metrics: over the epoch's steps' outputs
    eval: dict[str, float] = Field(default_factory=dict)
    lr: Optional[float] = None      # the learning rate at the epoch's end, as set (not the graph's float32)
    loss_scale: Optional[float] = None  # with loss scaling: the scale at the epoch's end (torch's scaler.get_scale())
    skipped_steps: Optional[int] = None  # with loss scaling: the epoch's steps skipped for inf/NaN gradients


class History(BaseModel):
    backend: str = ""
    step_losses: list[float] = Field(default_factory=list)
    # with an optimizer spec's max_grad_norm, each step's total gradient norm before clipping
    # (what torch.nn.utils.clip_grad_norm_ returns); empty without it
    step_grad_norms: list[float] = Field(default_factory=list)
    epochs: list[EpochRecord] = Field(default_factory=list)

    @property
    def losses(self) -> list[float]:
        return self.step_losses

    @property
    def throughput(self) -> float:
        """Train samples per second over the whole run."""
        seconds = sum(e.seconds for e in self.epochs)
        return sum(e.samples for e in self.epochs) / seconds if seconds > 0 else 0.0

    def plot(self, path: Union[str, os.PathLike]) -> Path:
        """Write a loss-curve PNG (per-step loss, epoch means, eval loss) to ``path``."""
        check_plot(path)
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        fig, ax = plt.subplots(figsize=(7, 4), dpi=100)
        try:
            ax.plot(range(1, len(self.step_losses) + 1), self.step_losses, lw=0.8, alpha=0.6, label="train loss (step)")
            ends = [sum(e.steps for e in self.epochs[:i + 1]) for i in range(len(self.epochs))]
            ax.plot(ends, [e.loss for e in self.epochs], "o-", label="train loss (epoch mean)")
            if any("loss" in e.eval for e in self.epochs):
                ax.plot(ends, [e.eval.get("loss", float("nan")) for e in self.epochs], "s--", label="eval loss")
            ax.set_xlabel("step")
            ax.set_ylabel("loss")
            ax.set_title(f"graphc training ({self.backend})" if self.backend else "graphc training")
            ax.grid(alpha=0.3)
            ax.legend()
            fig.tight_layout()
            fig.savefig(path)
        finally:
            plt.close(fig)
        return path


def check_plot(path: Union[str, os.PathLike]) -> None:
    """Fail now, not after a training run, where ``History.plot(path)`` could not write:
    ``MissingDependency`` without matplotlib, ``ValueError`` for an image format it lacks."""
    try:
        from matplotlib.backend_bases import FigureCanvasBase
    except ImportError as exc:
        raise MissingDependency(f"plotting the loss curve to {path} needs matplotlib, which is not installed: "
                                "pip install 'graphc[plot]' (or matplotlib)") from exc
    formats = FigureCanvasBase.get_supported_filetypes()
    suffix = Path(path).suffix.lower().lstrip(".")
    if suffix and suffix not in formats:
        raise ValueError(f"cannot plot the loss curve to {path}: matplotlib writes no {suffix!r} images; "
                         f"use one of {', '.join('.' + f for f in sorted(formats))}")


LOG_FORMATS = {".jsonl": "jsonl", ".ndjson": "jsonl", ".csv": "csv"}
_SCALING_FIELDS = ("loss_scale", "skipped_steps")  # EpochRecord's fields a run without loss scaling leaves None


def record_row(record: EpochRecord) -> dict:
    """``record`` as ``--log`` writes it (JSON values; loss scaling's fields only where it is on)."""
    return record.model_dump(mode="json", exclude={k for k in _SCALING_FIELDS if getattr(record, k) is None})


class EpochLog:
    """The per-epoch log ``fit(log=path)`` writes: one line per epoch, JSON lines (``.jsonl``,
    an ``EpochRecord`` each) or CSV (``.csv``: ``metrics`` and ``eval`` flattened to ``train_<name>``
    and ``eval_<name>`` columns),
    chosen by ``path``'s suffix.

    Each line goes out in one append, flushed to disk, so a killed run leaves whole lines (a
    torn last line is dropped by the next run). A run that starts at epoch ``done`` > 0 (a resume)
    keeps the lines of epochs 1..done and drops later ones (logged by a run killed before its
    checkpoint: the resume trains them again); a run from epoch 0 starts the file afresh. The
    file is rewritten atomically when it is cut or a CSV header gains a column."""

    def __init__(self, path: Union[str, os.PathLike], done: int):
        self.path = Path(path)
        self.format = log_format(self.path)
        self._rows: list[dict] = [row for row in self._read() if row["epoch"] <= done] if done else []
        self._columns: list[str] = list(dict.fromkeys(k for row in self._rows for k in row))
        self._rewrite()

    def write(self, record: EpochRecord) -> None:
        """Append ``record``'s line."""
        row = record_row(record)
        if self.format == "csv":
            row = {**{k: v for k, v in row.items() if k not in ("metrics", "eval")},
                   **{f"train_{k}": v for k, v in row["metrics"].items()},
                   **{f"eval_{k}": v for k, v in row["eval"].items()}}
        self._rows.append(row)
        if self.format == "csv" and not set(row) <= set(self._columns):
            self._columns += [k for k in row if k not in self._columns]
            self._rewrite()
            return
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, self._line(row).encode())
            os.fsync(fd)
        finally:
            os.close(fd)

    def _line(self, row: dict) -> str:
        if self.format == "jsonl":
            return json.dumps(row) + "\n"
        text = io.StringIO()
        csv.DictWriter(text, self._columns, lineterminator="\n").writerow(row)
        return text.getvalue()

    def _rewrite(self) -> None:
        from graphc.fileio import atomic_write

        head = ""
        if self.format == "csv" and self._columns:
            text = io.StringIO()
            csv.writer(text, lineterminator="\n").writerow(self._columns)
            head = text.getvalue()
        atomic_write(self.path, (head + "".join(self._line(row) for row in self._rows)).encode())

    def _read(self) -> list[dict]:
        """The rows of the log there (none where there is no file); a torn last line is left out."""
        if not self.path.is_file():
            return []
        text = self.path.read_text(encoding="utf-8")
        lines = text.splitlines(keepends=True)
        if lines and not lines[-1].endswith("\n"):
            lines.pop()  # a run killed mid-write
        try:
            if self.format == "jsonl":
                rows = [json.loads(line) for line in lines if line.strip()]
            else:
                rows = [{k: _csv_value(v) for k, v in row.items()} for row in csv.DictReader(lines)]
            if all(isinstance(row, dict) and isinstance(row.get("epoch"), int) for row in rows):
                return rows
        except (TypeError, ValueError):
            pass
        raise ValueError(f"log {self.path}: not an epoch log written by fit (each line needs an integer 'epoch'); "
                         "choose another path or remove it")


def log_format(path: Union[str, os.PathLike]) -> str:
    """``jsonl`` or ``csv`` by ``path``'s suffix; ``ValueError`` for another one."""
    suffix = Path(path).suffix.lower()
    if suffix not in LOG_FORMATS:
        raise ValueError(f"cannot log epochs to {path}: the file name must end in "
                         f"{', '.join(LOG_FORMATS)} (JSON lines or CSV)")
    return LOG_FORMATS[suffix]


def _csv_value(text: Optional[str]):
    """A CSV cell as the JSON value it was written from: int, float, or None for an empty cell."""
    if text in ("", None):
        return None
    try:
        return int(text)
    except ValueError:
        return float(text)
