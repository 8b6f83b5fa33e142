"""Run `graphc` in-process through its console-script entry (``graphc.cli.main``): the exit code
and what it printed, so tests can check the one-line error policy quickly."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx

import graphc as gc
from graphc.cli import main
from trainer_models import blobs, imported_mlp


@dataclass
class Result:
    code: int
    out: str
    err: str


def run_cli(capsys, *args) -> Result:
    """``graphc ARGS...``; ``capsys`` is pytest's fixture."""
    capsys.readouterr()
    try:
        main([str(a) for a in args])
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    captured = capsys.readouterr()
    return Result(code, captured.out, captured.err)


def one_line_error(result: Result, code: int = 2) -> str:
    """The error line of a failed run; asserts the exit code and that it is one line, no traceback."""
    assert result.code == code, (result.code, result.out, result.err)
    assert "Traceback" not in result.err and len(result.err.strip().splitlines()) == 1, result.err
    return result.err


def record_trainers(monkeypatch) -> list[dict]:
    """``gc.Trainer`` replaced by one that records its keyword arguments in the returned list and stops
    the command with a ``GraphcError`` ("stopped here: the test's Trainer"): how an option reaches it,
    checked without training."""
    made: list[dict] = []

    def trainer(*args, **kwargs):
        made.append(kwargs)
        raise gc.GraphcError("stopped here: the test's Trainer")

    monkeypatch.setattr(gc, "Trainer", trainer)
    return made


def workspace(root: Path) -> Path:
    """``root/mlp.onnx``, ``root/arts`` (Adam, cross-entropy on ``logits``) and ``root/data.npz``."""
    onnx.save(imported_mlp(), root / "mlp.onnx")
    arts = gc.training.generate(gc.load(root / "mlp.onnx"), gc.losses.cross_entropy("logits", label="y"),
                                gc.optim.Adam(0.01))
    arts.save(root / "arts")
    train = blobs(64)
    np.savez(root / "data.npz", x=train["x"], y=train["y"])
    return root


NET_PY = ("from graphc import nn\n\n\nclass Net(nn.Module):\n"
          "    def __init__(self):\n        super().__init__()\n"
          "        self.fc = nn.Linear(4, 2)\n\n    def forward(self, x):\n"
          "        return self.fc(x)\n")
"""A capturable ``FILE.py:Net``: one Linear of 4 inputs and 2 outputs."""
