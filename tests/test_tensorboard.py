"""TensorBoard logs (issue 15, item 5), read back with TensorBoard's own EventAccumulator."""

from __future__ import annotations

import sys

import numpy as np
import pytest

import graphc as gc
from graphc.errors import MissingDependency

from cli_util import one_line_error, run_cli, workspace
from trainer_models import blobs

pytest.importorskip("tensorboard", reason="tensorboard is a dev extra: pip install -e '.[dev]'")
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator  # noqa: E402


def _read(logdir) -> EventAccumulator:
    acc = EventAccumulator(str(logdir))
    acc.Reload()
    return acc


def test_fit_writes_losses_metrics_lr_and_the_graph(tmp_path):
    model = gc.load(workspace(tmp_path) / "mlp.onnx")
    arts = gc.training.generate(model, gc.losses.cross_entropy("logits", label="y"), gc.optim.SGD(0.05))
    trainer = gc.Trainer(arts, backend="numpy", tensorboard=tmp_path / "tb")
    train = blobs(64)
    loader = gc.data.DataLoader(train, batch_size=16, seed=0)
    history = trainer.fit(loader, 2, eval_loader=gc.data.DataLoader(blobs(32, seed=1), batch_size=32, shuffle=False),
                          progress=False)
    acc = _read(tmp_path / "tb")
    tags = acc.Tags()["scalars"]
    assert {"train/loss", "train/epoch_loss", "eval/loss", "eval/accuracy", "train/lr"} <= set(tags)
    steps = acc.Scalars("train/loss")
    assert [e.step for e in steps] == list(range(1, 9))
    np.testing.assert_allclose([e.value for e in steps], history.step_losses, rtol=1e-6)
    epoch = acc.Scalars("eval/accuracy")
    assert [e.step for e in epoch] == [4, 8]
    np.testing.assert_allclose([e.value for e in epoch], [r.eval["accuracy"] for r in history.epochs], rtol=1e-6)
    np.testing.assert_allclose([e.value for e in acc.Scalars("train/epoch_loss")], [r.loss for r in history.epochs],
                               rtol=1e-6)
    assert [e.value for e in acc.Scalars("train/lr")] == pytest.approx([0.05, 0.05])
    assert [e.step for e in acc.Scalars("train/epoch_accuracy")] == [4, 8]  # train metrics from the steps' outputs
    np.testing.assert_allclose([e.value for e in acc.Scalars("train/epoch_accuracy")],
                               [r.metrics["accuracy"] for r in history.epochs], rtol=1e-6)

    graph = acc.Graph()
    by_name = {n.name: n for n in graph.node}
    inference = arts.inference.proto.graph
    assert sorted(n.op for n in graph.node if n.op not in ("Placeholder", "Const")) == sorted(
        n.op_type for n in inference.node)
    assert by_name["x"].op == "Placeholder" and by_name["enc.weight"].op == "Const"
    gemm = next(n for n in graph.node if n.op == "Gemm")
    assert list(gemm.input) == ["x", "enc.weight", "enc.bias"]

    # a second fit on the same trainer continues the step axis in the same log
    trainer.fit(loader, 3, progress=False)
    assert [e.step for e in _read(tmp_path / "tb").Scalars("train/loss")][-4:] == [9, 10, 11, 12]


def test_without_tensorboard_installed_a_missing_dependency_names_the_extra(tmp_path, monkeypatch):
    from graphc.runtime.tensorboard import TensorBoardWriter

    monkeypatch.setitem(sys.modules, "tensorboard", None)
    monkeypatch.setitem(sys.modules, "tensorboard.compat.proto", None)
    with pytest.raises(MissingDependency, match=r"pip install 'graphc\[tensorboard\]'"):
        TensorBoardWriter(tmp_path / "tb")
    assert not (tmp_path / "tb").exists()


def test_cli_tensorboard(capsys, tmp_path):
    root = workspace(tmp_path)
    r = run_cli(capsys, "train", root / "arts", "--data", root / "data.npz", "--epochs", "1", "--batch-size", "32",
                "--backend", "numpy", "--no-progress", "--tensorboard", root / "runs")
    assert r.code == 0, r.err
    assert len(_read(root / "runs").Scalars("train/loss")) == 2
    (root / "file").write_text("")
    err = one_line_error(run_cli(capsys, "train", root / "arts", "--data", root / "data.npz", "--epochs", "1",
                                 "--batch-size", "32", "--backend", "numpy", "--tensorboard", root / "file"))
    assert "file: a file, not a folder; expected a folder" in err


def _scalars(logdir) -> dict[str, list[tuple[int, float]]]:
    """Every scalar of every event file in ``logdir``: tag -> sorted (step, value), a step written
    twice kept twice (each file read alone, nothing purged)."""
    found: dict[str, list[tuple[int, float]]] = {}
    for path in sorted(logdir.glob("events.*")):
        acc = EventAccumulator(str(path), purge_orphaned_data=False)
        acc.Reload()
        for tag in acc.Tags()["scalars"]:
            found.setdefault(tag, []).extend((e.step, e.value) for e in acc.Scalars(tag))
    return {tag: sorted(values) for tag, values in found.items()}


@pytest.mark.parametrize("backend", ["numpy", "ort-cpu"])
@pytest.mark.parametrize("killed", [False, True], ids=["interrupted", "killed"])
def test_a_run_resumed_mid_epoch_logs_each_step_once(tmp_path, monkeypatch, backend, killed):
    """Ctrl-C at step 10 (mid-epoch 2 of 7-step epochs), or a kill there that leaves step 8's
    periodic checkpoint: the run resumed into the same log holds each step's ``train/loss`` and
    ``train/grad_norm`` once, as the uninterrupted run's log (steps 8-10 or 8 were missing: each
    epoch's steps went out at its end, from the resumed process's part of the epoch only)."""
    import contextlib

    from graphc.runtime.trainer import SIGNAL_HOOK_ENV
    from trainer_models import drop_bn_artifacts

    arts = drop_bn_artifacts(gc.optim.SGD(0.05, momentum=0.9, max_grad_norm=0.5))

    def fit(trainer, **kwargs):
        return trainer.fit(gc.data.DataLoader(blobs(100), batch_size=16, seed=3), 3, progress=False, quiet=True,
                           eval_loader=gc.data.DataLoader(blobs(40, seed=1), 64, shuffle=False), **kwargs)

    fit(gc.Trainer(arts, backend=backend, seed=4, tensorboard=tmp_path / "straight"))
    first = gc.Trainer(arts, backend=backend, seed=4, tensorboard=tmp_path / "resumed")
    if killed:  # no save and no flush on the way out
        monkeypatch.setattr(first, "_saved_on_interrupt", lambda *args: contextlib.nullcontext())
    monkeypatch.setenv(SIGNAL_HOOK_ENV, "INT:10")
    with pytest.raises(KeyboardInterrupt):
        fit(first, checkpoint=tmp_path / "ck", checkpoint_every=4)
    monkeypatch.delenv(SIGNAL_HOOK_ENV)
    resumed = gc.Trainer(tmp_path / "ck", backend=backend, tensorboard=tmp_path / "resumed")
    assert resumed.step_count == (8 if killed else 10)
    fit(resumed, checkpoint=tmp_path / "ck")
    want, got = _scalars(tmp_path / "straight"), _scalars(tmp_path / "resumed")
    assert [step for step, _ in got["train/loss"]] == [step for step, _ in got["train/grad_norm"]] == list(range(1, 22))
    assert got == want
