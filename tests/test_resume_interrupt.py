"""Interrupted training resumes exactly: SIGINT or SIGKILL at random steps, through the CLI in a
subprocess and through ``Trainer.fit`` in-process, on numpy and onnxruntime. The printed
per-epoch history and the final params and optimizer state equal the uninterrupted run's, bit
for bit. The signal is sent by the Trainer's test hook (``GRAPHC_TEST_SIGNAL_AT_STEP``) right
after a step, before its bookkeeping: the spot where an interrupt used to repeat a batch."""

import contextlib
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import graphc as gc
from graphc.runtime import checkpoint as ckpt
from graphc.runtime.trainer import SIGNAL_HOOK_ENV, TrainingInterrupted
from cli_util import one_line_error, run_cli
from trainer_models import blobs, drop_bn_artifacts, drop_bn_workdir, imported_mlp

GRAPHC = str(Path(sys.executable).parent / "graphc")
EPOCHS, BATCH, SAMPLES = 3, 16, 100  # 7 batches an epoch (the last one of 4): 21 steps
BATCHES = -(-SAMPLES // BATCH)
STEPS = EPOCHS * BATCHES
EVERY = 4  # --checkpoint-every: what a SIGKILL resumes from
EPOCH_LINE = re.compile(r"^epoch (\d+)/\d+  loss .*?  eval loss \S+  eval accuracy \S+", re.M)


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    return drop_bn_workdir(tmp_path_factory.mktemp("resume"), SAMPLES, 40)


def train(workdir, backend, ck, *extra, signal_at=None):
    env = {**os.environ, "COLUMNS": "200"}
    env.pop(SIGNAL_HOOK_ENV, None)
    if signal_at is not None:
        env[SIGNAL_HOOK_ENV] = signal_at
    return subprocess.run([GRAPHC, "train", workdir / "arts", "--data", workdir / "data.npz", "--epochs", str(EPOCHS),
                           "--batch-size", str(BATCH), "--backend", backend, "--checkpoint", ck,
                           "--checkpoint-every", str(EVERY), *extra],
                          capture_output=True, text=True, timeout=120, env=env)


def epoch_lines(text):
    """Epoch number -> its printed line, throughput and time cut off (they are not replayed)."""
    return {int(m.group(1)): m.group(0) for m in EPOCH_LINE.finditer(text)}


def last_saved(step):
    """The step of the last checkpoint written before a signal right after ``step`` (the
    periodic or epoch-end save due at ``step`` itself comes after the signal)."""
    return max((step - 1) // EVERY * EVERY, (step - 1) // BATCHES * BATCHES)


def tensors(ck):
    return ckpt.load(ck)[0]


@pytest.fixture(scope="module")
def reference(workdir):
    runs = {}
    for backend in ("numpy", "ort-cpu"):
        r = train(workdir, backend, workdir / f"ref-{backend}")
        assert r.returncode == 0, r.stderr
        runs[backend] = epoch_lines(r.stdout), tensors(workdir / f"ref-{backend}")
        assert sorted(runs[backend][0]) == list(range(1, EPOCHS + 1)), r.stdout
    return runs


# Steps drawn at random once (seeded, so a failure replays); the first is an epoch's last step.
_rng = np.random.default_rng(10)
CASES = [("numpy", "INT", int(BATCHES * _rng.integers(1, EPOCHS))), ("numpy", "KILL", int(_rng.integers(1, STEPS))),
         ("ort-cpu", "INT", int(_rng.integers(1, STEPS))), ("ort-cpu", "KILL", int(_rng.integers(1, STEPS)))]


@pytest.mark.parametrize("backend, sig, step", CASES)
def test_cli_interrupted_and_resumed_equals_the_uninterrupted_run(workdir, reference, tmp_path, backend, sig, step):
    ck = tmp_path / "ck"
    first = train(workdir, backend, ck, signal_at=f"{sig}:{step}")
    if sig == "INT":
        assert first.returncode == 130 and f"interrupted at step {step}; saved" in first.stderr, first.stderr
        assert ckpt.read_meta(ck).step == step  # the step under way finished, then the state was saved
    else:
        assert first.returncode == -9, first.stderr
        assert ckpt.read_meta(ck).step == last_saved(step)
    second = train(workdir, backend, ck, "--resume")
    assert second.returncode == 0, second.stderr
    lines, resumed = epoch_lines(first.stdout), epoch_lines(second.stdout)
    # a SIGKILL after an epoch line but before its checkpoint prints that epoch again: identically
    assert all(lines[e] == line for e, line in resumed.items() if e in lines)
    lines.update(resumed)
    want_lines, want = reference[backend]
    assert lines == want_lines
    got = tensors(ck)
    assert sorted(got) == sorted(want)
    for name, value in want.items():
        assert got[name].dtype == value.dtype and np.array_equal(got[name], value), name


def test_cli_resume_with_other_loader_settings_is_refused(workdir, tmp_path, capsys, monkeypatch):
    trainer = gc.Trainer(workdir / "arts", backend="numpy")
    monkeypatch.setenv(SIGNAL_HOOK_ENV, "INT:3")
    with pytest.raises(KeyboardInterrupt):
        trainer.fit(gc.data.DataLoader(blobs(SAMPLES), batch_size=BATCH), EPOCHS, progress=False)
    monkeypatch.delenv(SIGNAL_HOOK_ENV)
    trainer.save_checkpoint(tmp_path / "ck")
    r = run_cli(capsys, "train", workdir / "arts", "--data", workdir / "data.npz", "--epochs", EPOCHS, "--batch-size", 8,
                "--backend", "numpy", "--checkpoint", tmp_path / "ck", "--resume", "--no-progress")
    assert "the checkpoint's run used a loader with batch_size 16 (now 8)" in one_line_error(r)


def fit(trainer, **kwargs):
    loader = gc.data.DataLoader(blobs(SAMPLES), batch_size=BATCH, seed=3)
    return trainer.fit(loader, EPOCHS, eval_loader=gc.data.DataLoader(blobs(40, seed=1), 64, shuffle=False),
                       progress=False, **kwargs)


def replayed(history):
    return [(e.epoch, e.loss, e.metrics, e.steps, e.samples, e.eval) for e in history.epochs]


@pytest.mark.parametrize("backend", ["numpy", "ort-cpu"])
@pytest.mark.parametrize("killed", [False, True], ids=["interrupted", "killed"])
def test_fit_stopped_and_resumed_in_process_equals_the_uninterrupted_run(tmp_path, monkeypatch, backend, killed):
    arts = drop_bn_artifacts()
    straight = gc.Trainer(arts, backend=backend, seed=4)
    expected = replayed(fit(straight))
    for step in np.random.default_rng(20 + killed).choice(np.arange(1, STEPS), size=2, replace=False):
        ck = tmp_path / f"ck{step}"
        first = gc.Trainer(arts, backend=backend, seed=4)
        if killed:  # a kill gives fit no chance to save: only the last periodic checkpoint stays
            monkeypatch.setattr(first, "_saved_on_interrupt", lambda *args: contextlib.nullcontext())
        monkeypatch.setenv(SIGNAL_HOOK_ENV, f"INT:{step}")  # a real SIGINT to this process, held to the step's end
        with pytest.raises(KeyboardInterrupt) as interrupt:
            fit(first, checkpoint=ck, checkpoint_every=EVERY)
        monkeypatch.delenv(SIGNAL_HOOK_ENV)
        assert first.step_count == step
        if not killed:  # Ctrl-C: fit saved where it stopped (it had saved nothing)
            assert isinstance(interrupt.value, TrainingInterrupted) and interrupt.value.step == step
            assert str(interrupt.value) == f"at step {step}: saved {interrupt.value.saved}"
        second = gc.Trainer(ck, backend=backend, seed=99)  # the RNG state comes from the checkpoint
        assert second.step_count == (last_saved(step) if killed else step)
        start = second.epoch
        history = fit(second)
        assert replayed(history) == expected[start:]  # whole epochs: the resumed one's loss covers all its batches
        for name, value in straight.state_dict().items():
            assert second.state_dict()[name].tobytes() == value.tobytes(), name


def recall_of_class_0(pred, target):
    """NaN on a batch without class 0, as recall is undefined there (sklearn warns and gives 0)."""
    mask = target == 0
    return float((pred.argmax(1)[mask] == 0).mean()) if mask.any() else float("nan")


@pytest.mark.parametrize("backend", ["numpy", "ort-cpu"])
def test_a_checkpoint_whose_train_metric_sum_is_nan_resumes_exactly(tmp_path, monkeypatch, backend):
    """The epoch's running sum of a metric that was NaN on a batch is NaN: fit saved such a
    checkpoint on Ctrl-C but no Trainer could read it back (pydantic wrote the NaN as null)."""
    data = blobs(SAMPLES)
    data = {k: v[np.argsort(data["y"] == 0, kind="stable")] for k, v in data.items()}  # class 0 last: NaN early on
    arts = gc.training.generate(gc.load(imported_mlp()), gc.losses.cross_entropy("logits", label="y"),
                                gc.optim.Adam(0.01))

    def run(trainer, **kwargs):
        return trainer.fit(gc.data.DataLoader(data, batch_size=BATCH, shuffle=False), 2, progress=False, quiet=True,
                           **kwargs)

    metrics = ["accuracy", recall_of_class_0]
    expected = replayed(run(gc.Trainer(arts, backend=backend, metrics=metrics)))
    assert np.isnan(expected[0][2]["recall_of_class_0"])  # the NaN reaches the epoch's record
    first = gc.Trainer(arts, backend=backend, metrics=metrics)
    monkeypatch.setenv(SIGNAL_HOOK_ENV, "INT:3")
    with pytest.raises(TrainingInterrupted):
        run(first, checkpoint=tmp_path / "ck")
    monkeypatch.delenv(SIGNAL_HOOK_ENV)
    assert np.isnan(ckpt.read_meta(tmp_path / "ck").progress.metric_sums["recall_of_class_0"])
    second = gc.Trainer(tmp_path / "ck", backend=backend, metrics=metrics)
    assert (second.epoch, second.batch_in_epoch) == (0, 3)
    np.testing.assert_equal(replayed(run(second)), expected)  # NaN equals NaN here


def random_op_artifacts():
    """A model that draws noise inside its graph (RandomNormal): the backend's own generator."""
    from onnx import TensorProto, helper, numpy_helper

    w = numpy_helper.from_array(np.full((8, 3), 0.1, np.float32), "w")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["z"]), helper.make_node("RandomNormal", [], ["n"], shape=[3]),
             helper.make_node("Add", ["z", "n"], ["logits"])]
    graph = helper.make_graph(nodes, "noisy", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 8])],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", 3])], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    return gc.training.generate(gc.load(model), gc.losses.cross_entropy("logits", label="y"), gc.optim.SGD(0.1))


def test_random_ops_inside_the_graph_replay_on_numpy_and_are_warned_about_elsewhere(tmp_path, monkeypatch):
    arts = random_op_artifacts()
    expected = replayed(fit(gc.Trainer(arts, backend="numpy")))
    first = gc.Trainer(arts, backend="numpy")
    monkeypatch.setenv(SIGNAL_HOOK_ENV, "INT:9")
    with pytest.raises(KeyboardInterrupt):
        fit(first, checkpoint=tmp_path / "ck")
    monkeypatch.delenv(SIGNAL_HOOK_ENV)
    first.save_checkpoint(tmp_path / "ck")
    assert sorted(ckpt.read_meta(tmp_path / "ck").graph_rng) == ["eval", "train_step"]
    resumed = gc.Trainer(tmp_path / "ck", backend="numpy")
    assert replayed(fit(resumed)) == expected[1:]
    with pytest.warns(UserWarning, match=r"draws random numbers itself \(RandomNormal\); ort-cpu keeps"):
        fit(gc.Trainer(arts, backend="ort-cpu"), checkpoint=tmp_path / "ort")
