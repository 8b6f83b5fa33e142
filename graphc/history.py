"""`gc.History`: what `Trainer.fit` returns — per-step losses, per-epoch records, throughput."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Union

from pydantic import BaseModel, Field

from graphc.errors import MissingDependency

__all__ = ["EpochRecord", "History", "check_plot"]


class EpochRecord(BaseModel):
    """One epoch of ``fit``: mean train loss, evaluation metrics and train throughput."""

    epoch: int                      # 1-based
    loss: float                     # mean train loss over the epoch's steps
    steps: int
    samples: int
    seconds: float                  # train time (evaluation excluded)
    samples_per_s: float
    eval: dict[str, float] = Field(default_factory=dict)


class History(BaseModel):
    backend: str = ""
    step_losses: list[float] = Field(default_factory=list)
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
