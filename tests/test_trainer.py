"""gc.Trainer: cross-backend agreement, imported models with frozen params, NaN handling,
fit/History/plot, input checks, params on the device."""

from pathlib import Path

import numpy as np
import pytest

import graphc as gc
from graphc.models import cnn
from graphc.runtime.trainer import TrainingFailed
from backend_params import ORT
from trainer_models import blobs, bn_artifacts, imported_mlp


def test_cnn_losses_agree_on_numpy_and_onnxruntime_for_20_steps():
    model = gc.capture(cnn.LeNet(), seed=0, **cnn.example_inputs())
    arts = gc.training.generate(model, gc.losses.cross_entropy("output", label="y"),
                                gc.optim.SGD(0.05, momentum=0.9))
    rng = np.random.default_rng(0)
    batches = [{"x": rng.standard_normal((8, 1, 28, 28)).astype(np.float32),
                "y": rng.integers(0, 10, 8).astype(np.int64)} for _ in range(4)]
    losses = {}
    for backend in ("numpy", "ort-cpu"):
        trainer = gc.Trainer(arts, backend=backend)
        losses[backend] = [trainer.step(batches[i % 4]) for i in range(20)]
    np.testing.assert_allclose(losses["ort-cpu"], losses["numpy"], rtol=2e-4, atol=2e-5)
    assert losses["numpy"][-1] < losses["numpy"][0]


def assert_trains_around_frozen(trainer, feeds, steps, frozen, trained):
    """``steps`` steps on ``feeds``: the frozen params stay bit-identical, ``trained`` moves and
    the loss at least halves."""
    before = trainer.params
    losses = [trainer.step(feeds) for _ in range(steps)]
    after = trainer.params
    for name in frozen:
        assert after[name].tobytes() == before[name].tobytes(), f"frozen {name} changed"
    assert not np.array_equal(after[trained], before[trained])
    assert losses[-1] < 0.5 * losses[0]


@pytest.mark.parametrize("backend", ["numpy", "ort-cpu"])
def test_imported_model_trains_with_frozen_params_unchanged(backend):
    model = gc.load(imported_mlp())
    frozen = ["enc.weight", "enc.bias"]
    arts = gc.training.generate(model, gc.losses.cross_entropy("logits", label="y"),
                                gc.optim.SGD(0.2, momentum=0.9), frozen=frozen)
    assert set(arts.manifest.frozen) >= set(frozen)
    assert "head.weight" in arts.manifest.trainable  # promoted from a Constant node
    assert_trains_around_frozen(gc.Trainer(arts, backend=backend), blobs(), 30, frozen, "head.weight")


def test_nan_loss_stops_fit_with_training_failed():
    arts = gc.training.generate(gc.load(imported_mlp()), gc.losses.mse("logits", label="t"), gc.optim.SGD(1e6))
    rng = np.random.default_rng(0)
    data = {"x": rng.standard_normal((64, 8)).astype(np.float32) * 100,
            "t": rng.standard_normal((64, 3)).astype(np.float32)}
    trainer = gc.Trainer(arts, backend="ort-cpu")
    with pytest.raises(TrainingFailed, match=r"loss became (nan|inf).*step \d+"):
        trainer.fit(gc.data.DataLoader(data, batch_size=8), epochs=20, progress=False)


def test_fit_history_eval_and_loss_curve(tmp_path):
    pytest.importorskip("matplotlib")
    data = blobs(200)
    trainer = gc.Trainer(bn_artifacts(), backend="ort-cpu")
    loader = gc.data.DataLoader(data, batch_size=32, seed=1)
    history = trainer.fit(loader, epochs=3, eval_loader=gc.data.DataLoader(blobs(64, seed=1), 64, shuffle=False),
                          progress=True, plot=tmp_path / "curve.png")
    assert len(history.step_losses) == 3 * len(loader) and len(history.epochs) == 3
    assert [e.epoch for e in history.epochs] == [1, 2, 3]
    assert history.epochs[-1].loss < history.epochs[0].loss
    assert history.epochs[-1].eval["accuracy"] > 0.8 and "loss" in history.epochs[-1].eval
    assert history.throughput > 0 and history.epochs[0].samples == 200
    assert (tmp_path / "curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert trainer.step_count == 3 * len(loader) and trainer.epoch == 3
    # BatchNorm running statistics are carried state and moved away from their defaults.
    state = trainer.state_dict()
    stats = [n for n, r in trainer._roles.items() if r == "state" and "running_mean" in n]
    assert stats and not np.allclose(state[stats[0]], 0)
    assert int(state["step"]) == trainer.step_count


def test_bad_batches_are_named():
    trainer = gc.Trainer(bn_artifacts(), backend="ort-cpu")
    data = blobs(16)
    with pytest.raises(gc.InputError, match=r"batch has no 'y'"):
        trainer.step({"x": data["x"]})
    with pytest.raises(gc.InputError, match=r"input 'x': expected x: float32\[N,8\], got float64\[16,8\]"):
        trainer.step({"x": data["x"].astype(np.float64), "y": data["y"]})
    with pytest.raises(gc.InputError, match=r"input 'x': expected x: float32\[N,8\], got float32\[16,5\]"):
        trainer.step({"x": data["x"][:, :5], "y": data["y"]})
    with pytest.raises(gc.InputError, match=r"dim 'N' is 15 here"):
        trainer.step({"x": data["x"], "y": data["y"][:15]})
    with pytest.raises(gc.InputError, match=r"array 'x'.*size 8 on axis 1"):
        trainer.fit(gc.data.DataLoader({"x": data["x"][:, :4], "y": data["y"]}, 4), 1, progress=False)


@pytest.mark.parametrize("backend", ["ort-cpu", "numpy"])
def test_an_empty_batch_is_refused_and_changes_nothing(backend):
    """A zero-row batch once took a step (AdamW's decay applied, the step counted) with a loss
    of 0 on onnxruntime and NaN on numpy; evaluate gave that loss too."""
    arts = gc.training.generate(gc.load(imported_mlp()), gc.losses.cross_entropy("logits", label="y"),
                                gc.optim.AdamW(0.1))
    trainer = gc.Trainer(arts, backend=backend)
    data = blobs(16)
    trainer.step(data)
    before = {name: value.copy() for name, value in trainer.params.items()}
    empty = {name: value[:0] for name, value in data.items()}
    with pytest.raises(gc.InputError, match=r"a train step needs at least one example; the batch's 'x' is empty "
                                            r"\(shape \(0, 8\)\)"):
        trainer.step(empty)
    with pytest.raises(gc.InputError, match="an evaluation needs at least one example"):
        trainer.evaluate(empty)
    assert trainer.step_count == 1
    for name, value in trainer.params.items():
        np.testing.assert_array_equal(value, before[name], err_msg=name)
    assert trainer.predict({"x": data["x"][:0]})["logits"].shape[0] == 0  # outputs of nothing: still fine


@pytest.mark.parametrize("backend", ["ort-cpu", "numpy"])
def test_cross_entropy_labels_outside_the_classes_are_refused(backend):
    """A label outside [0, C) that is not the ignore index once trained silently: the graph
    gives it a loss of 0 that still counts in the mean (PyTorch raises). A batch of ignored
    labels only would write a NaN mean into every param."""
    arts = gc.training.generate(gc.load(imported_mlp()), gc.losses.cross_entropy("logits", label="y"),
                                gc.optim.SGD(0.1))
    trainer = gc.Trainer(arts, backend=backend)
    data = blobs(8)
    before = {name: value.copy() for name, value in trainer.params.items()}
    for bad, value, at in ((3, 3, 2), (-1, -1, 5)):
        labels = data["y"].copy()
        labels[at] = bad
        for action, call in (("a train step", trainer.step), ("an evaluation", trainer.evaluate)):
            with pytest.raises(gc.InputError, match=rf"{action}: label 'y' holds {value} at \({at},\); cross-entropy "
                                                    r"labels are class indices in \[0, 3\) or the ignore index -100"):
                call({"x": data["x"], "y": labels})
    with pytest.raises(gc.InputError, match="every label in 'y' is the ignore index -100"):
        trainer.step({"x": data["x"], "y": np.full(8, -100)})
    assert trainer.step_count == 0
    for name, value in trainer.params.items():
        np.testing.assert_array_equal(value, before[name], err_msg=name)
    some_ignored = data["y"].copy()
    some_ignored[:3] = -100
    assert np.isfinite(trainer.step({"x": data["x"], "y": some_ignored}))
    rows = blobs(16)
    rows["y"][11] = 5
    with pytest.raises(gc.InputError, match=r"the training loader: label 'y' holds 5 at \(11,\)"):
        trainer.fit(gc.data.DataLoader(rows, 4), 1, progress=False)  # the row in the data, before any step
    with pytest.raises(gc.InputError, match=r"the eval loader: label 'y' holds 5 at \(11,\)"):
        trainer.fit(gc.data.DataLoader(blobs(16), 4), 1, eval_loader=gc.data.DataLoader(rows, 4), progress=False)
    assert trainer.step_count == 1
    summed = gc.training.generate(gc.load(imported_mlp()),
                                  gc.losses.cross_entropy("logits", label="y", reduction="sum"), gc.optim.SGD(0.1))
    assert gc.Trainer(summed, backend=backend).step({"x": data["x"], "y": np.full(8, -100)}) == 0.0


@pytest.mark.parametrize("backend", ["ort-cpu", "numpy"])
def test_fit_skips_a_batch_of_ignored_labels_only_with_a_warning(backend):
    """A mean cross-entropy over a batch whose every label is ignored is NaN (as PyTorch's) and its
    gradient in the graph 0 * inf = NaN: fit once stopped there with the InputError of step. It
    now skips the batch, saying so: no update (Adam's moments and step count untouched), no loss
    in the history, its rows not in the epoch's samples; as if the loader had not given it."""
    arts = gc.training.generate(gc.load(imported_mlp()), gc.losses.cross_entropy("logits", label="y"),
                                gc.optim.Adam(0.05))
    data = blobs(12)
    data["y"][4:8] = -100  # the second batch of 4
    trainer = gc.Trainer(arts, backend=backend)
    with pytest.warns(UserWarning, match=r"epoch [12], batch 2 of 3: every label in 'y' is the ignore index -100; "
                                         r"skipped \(no step: ") as caught:
        history = trainer.fit(gc.data.DataLoader(data, 4, shuffle=False), 2, progress=False, quiet=True)
    assert len([w for w in caught if "ignore index" in str(w.message)]) == 2
    oracle = gc.Trainer(arts, backend=backend)
    kept = [{k: v[i:i + 4] for k, v in data.items()} for i in (0, 8)]
    losses = [oracle.step(batch) for _ in range(2) for batch in kept]
    assert history.step_losses == losses
    assert trainer.step_count == oracle.step_count == 4 and trainer.epoch == 2 and trainer.batch_in_epoch == 0
    for name, value in oracle.state_dict().items():
        np.testing.assert_array_equal(trainer.state_dict()[name], value, err_msg=name)
    assert [(e.steps, e.samples) for e in history.epochs] == [(2, 8), (2, 8)]
    assert history.epochs[1].loss == pytest.approx((losses[2] + losses[3]) / 2, rel=1e-6)


def test_bad_training_arguments_are_refused_before_any_step(tmp_path):
    """A NaN, infinite or negative lr (NaN params at the next step, or ascent), epochs below 0,
    a loader with no batch (an epoch of nothing, recorded with a NaN loss) and checkpoint_every
    without a checkpoint (ignored) once passed."""
    trainer = gc.Trainer(bn_artifacts(), backend="ort-cpu")
    data = blobs(10)
    for lr in (float("nan"), float("inf"), -1.0, "0.1", True):
        with pytest.raises(ValueError, match="lr must be a finite number >= 0"):
            trainer.lr = lr
    for epochs in (-1, 1.5, True):
        with pytest.raises(ValueError, match="epochs must be a whole number >= 0"):
            trainer.fit(gc.data.DataLoader(data, 4), epochs, progress=False)
    with pytest.raises(ValueError, match="the training loader gives no batch: 0 rows in batches of 4"):
        trainer.fit(gc.data.DataLoader({k: v[:0] for k, v in data.items()}, 4), 1, progress=False)
    with pytest.raises(ValueError, match="10 rows in batches of 16, the last partial one dropped"):
        trainer.fit(gc.data.DataLoader(data, 16, drop_last=True), 1, progress=False)
    with pytest.raises(ValueError, match="the eval loader gives no batch"):
        trainer.fit(gc.data.DataLoader(data, 4), 1, eval_loader=gc.data.DataLoader(data, 16, drop_last=True),
                    progress=False)
    with pytest.raises(ValueError, match="the eval loader gives no batch"):
        trainer.evaluate_loader(gc.data.DataLoader({k: v[:0] for k, v in data.items()}, 4))
    with pytest.raises(ValueError, match="checkpoint_every needs checkpoint"):
        trainer.fit(gc.data.DataLoader(data, 4), 1, checkpoint_every=2, progress=False)
    assert trainer.step_count == 0 and trainer.epoch == 0
    with pytest.raises(TypeError, match="unknown Trainer option 'thread'; options are: cpu_arena, cuda_graph, device_id"):
        gc.Trainer(bn_artifacts(), backend="ort-cpu", thread=2)  # once onnxruntime's prepare() complained
    with pytest.raises(ValueError, match="seed must be a whole number >= 0, got -1"):
        gc.Trainer(bn_artifacts(), backend="numpy", seed=-1)
    with pytest.raises(gc.GraphError, match="to opset 99: onnx .* knows ai.onnx opsets 1 to"):
        trainer.export_inference(tmp_path / "model.onnx", opset=99)  # once onnx's C++ assertion
    with pytest.raises(IsADirectoryError, match="it is a directory; give a file path such as"):
        trainer.export_inference(tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_fit_trains_from_a_data_loader_and_evaluation_takes_any_iterable_of_batches():
    """fit given a list of batch dicts or a generator (or a torch DataLoader) failed inside with
    AttributeError / TypeError. Training takes a gc.data.DataLoader, whose order a checkpoint
    replays mid-epoch; evaluation, which never resumes, takes any iterable of batch dicts (a
    one-shot iterator for one evaluation only)."""
    trainer = gc.Trainer(gc.training.generate(gc.load(imported_mlp()), gc.losses.cross_entropy("logits", label="y"),
                                              gc.optim.SGD(0.1)), backend="numpy")
    data = blobs(12)
    batches = [{k: v[i:i + 4] for k, v in data.items()} for i in (0, 4, 8)]
    for loader, kind in ((batches, "list"), (iter(batches), "list_iterator"), ((b for b in batches), "generator")):
        with pytest.raises(TypeError, match=rf"fit trains from a gc\.data\.DataLoader .*; got {kind}: make one from "
                                            r"the arrays, gc\.data\.DataLoader\(\{'x': x, 'y': y\}, batch_size=64\)"):
            trainer.fit(loader, 1, progress=False)
    whole = trainer.evaluate(data)
    for loader in (batches, tuple(batches), (b for b in batches)):
        result = trainer.evaluate_loader(loader)
        assert result == trainer.evaluate_loader(gc.data.DataLoader(data, 4, shuffle=False))
        for name, value in whole.items():
            assert result[name] == pytest.approx(value, rel=1e-6), name
    spent = iter(batches)
    trainer.evaluate_loader(spent)
    with pytest.raises(ValueError, match=r"the eval loader gives no batch \(an iterator gives its batches once"):
        trainer.evaluate_loader(spent)
    loader = gc.data.DataLoader(data, 4)
    with pytest.raises(TypeError, match=r"the eval loader is a one-shot iterator \(generator\) .* after each of 2 "
                                        r"epochs: pass a list of batch dicts or a gc\.data\.DataLoader"):
        trainer.fit(loader, 2, eval_loader=(b for b in batches), progress=False)
    assert trainer.step_count == 0
    history = trainer.fit(loader, 1, eval_loader=(b for b in batches), progress=False)
    assert history.epochs[0].eval == trainer.evaluate_loader(batches)
    history = trainer.fit(loader, 3, eval_loader=batches, progress=False)
    assert [e.eval for e in history.epochs][-1] == trainer.evaluate_loader(batches)
    for bad, message in ((data, "the eval loader is a dict, one batch"), (5, "got int"), ([data["x"]], "batch 1 of "
                         "the eval loader is numpy.ndarray, not a dict of arrays by input name"),
                         ([], "the eval loader gives no batch")):
        with pytest.raises((TypeError, ValueError), match=message):
            trainer.evaluate_loader(bad)


def test_a_torch_data_loader_of_dicts_evaluates_and_one_of_tuples_is_named():
    torch = pytest.importorskip("torch")
    trainer = gc.Trainer(gc.training.generate(gc.load(imported_mlp()), gc.losses.cross_entropy("logits", label="y"),
                                              gc.optim.SGD(0.1)), backend="numpy")
    data = blobs(12)

    class Rows(torch.utils.data.Dataset):
        def __len__(self):
            return 12

        def __getitem__(self, i):
            return {k: torch.from_numpy(v[i:i + 1]).squeeze(0) for k, v in data.items()}

    assert trainer.evaluate_loader(torch.utils.data.DataLoader(Rows(), batch_size=5)) == pytest.approx(
        trainer.evaluate(data), rel=1e-6)
    pairs = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(*map(torch.from_numpy, data.values())), 5)
    with pytest.raises(TypeError, match="batch 1 of the eval loader is list, not a dict of arrays by input name"):
        trainer.evaluate_loader(pairs)
    with pytest.raises(TypeError, match=r"fit trains from a gc\.data\.DataLoader .*; "
                                        r"got torch\.utils\.data\.dataloader\.DataLoader"):
        trainer.fit(pairs, 1, progress=False)


def test_params_and_lr_are_host_copies():
    trainer = gc.Trainer(bn_artifacts(gc.optim.SGD(0.1)), backend="numpy")
    params = trainer.params
    assert set(params) >= {"fc1.weight", "fc1.bias", "bn.weight", "fc2.weight"}
    params["fc1.weight"][...] = 0  # mutating a copy does not touch the trainer
    assert not np.all(trainer.params["fc1.weight"] == 0)
    assert trainer.lr == pytest.approx(0.1)
    trainer.lr = 0.0
    before = trainer.params
    trainer.step(blobs(16))
    np.testing.assert_array_equal(trainer.params["fc1.weight"], before["fc1.weight"])


def test_trainer_reads_an_artifact_directory(tmp_path):
    bn_artifacts().save(tmp_path / "arts")
    trainer = gc.Trainer(tmp_path / "arts", backend="ort-cpu")
    assert np.isfinite(trainer.step(blobs(16)))
    with pytest.raises(FileNotFoundError, match="no training artifacts"):
        gc.Trainer(tmp_path, backend="ort-cpu")


def test_a_trainer_forgets_the_artifacts_it_read_itself(tmp_path):
    """From a directory the Trainer keeps no second copy of the weights once its device buffers
    hold them: the train_step graph and the initial state are read again when used (here by a
    checkpoint that saves the artifacts beside it), and training matches a Trainer given the
    artifacts object, whose graphs and state stay as they are."""
    arts = bn_artifacts(gc.optim.Adam(1e-2))
    arts.save(tmp_path / "arts")
    from_dir, given = gc.Trainer(tmp_path / "arts", backend="ort-cpu"), gc.Trainer(arts, backend="ort-cpu")
    assert not from_dir.artifacts._loaded  # nothing read from the files is held
    assert set(given.artifacts._loaded) >= {"train_step", "state"}
    initial = {k: v.copy() for k, v in arts.state.items()}
    for _ in range(3):
        batch = blobs(16)
        assert from_dir.step(batch) == pytest.approx(given.step(batch), rel=1e-6)
    assert all(np.array_equal(arts.state[k], v) for k, v in initial.items())  # steps never write into them
    from_dir.save_checkpoint(tmp_path / "ckpt" / "checkpoint.safetensors")
    beside = gc.training.load(tmp_path / "ckpt" / "artifacts")
    assert beside.state.keys() == initial.keys()
    assert all(np.array_equal(beside.state[k], v) for k, v in initial.items())
    resumed = gc.Trainer(tmp_path / "ckpt" / "checkpoint.safetensors", backend="ort-cpu")
    batch = blobs(16)
    assert resumed.step(batch) == pytest.approx(from_dir.step(batch), rel=1e-6)


def test_onnxruntime_wraps_an_owned_host_array_and_copies_any_other():
    import onnxruntime as ort

    exe = gc.Session(gc.capture(lambda x: x * 2, x=gc.spec("float32", (3,))), backend="ort-cpu")._executable
    owned, shared = np.arange(3, dtype=np.float32), np.arange(3, dtype=np.float32)
    a, b = exe.to_device(owned, owned=True), exe.to_device(shared)
    assert isinstance(a, ort.OrtValue) and a.data_ptr() == owned.ctypes.data
    assert b.data_ptr() != shared.ctypes.data
    assert exe.to_device(owned[::2], owned=True).data_ptr() != owned.ctypes.data  # not contiguous: copied


def test_the_cpu_train_step_allocates_from_the_exact_shared_arena():
    """train_step's session opts into the process's CPU arena that grows by what is asked; the
    Trainer's other sessions, and a session asked for nothing, keep arenas of their own."""
    trainer = gc.Trainer(bn_artifacts(gc.optim.Adam(1e-2)), backend="ort-cpu")
    trainer.step(blobs(16))

    def uses_shared(exe) -> bool:
        try:
            return exe.session.get_session_options().get_session_config_entry("session.use_env_allocators") == "1"
        except RuntimeError:  # "does not have configuration with key": not set
            return False

    assert uses_shared(trainer._train)
    plain = gc.Session(gc.capture(lambda x: x * 2, x=gc.spec("float32", (3,))), backend="ort-cpu")._executable
    assert not uses_shared(plain)
    trainer.evaluate(blobs(16))
    assert not uses_shared(trainer._eval)


TORCH_CNN = Path(__file__).parent / "data" / "torch_cnn_bn.onnx"


@pytest.mark.skipif(not TORCH_CNN.is_file(), reason="tests/data/torch_cnn_bn.onnx (exported from PyTorch) is absent")
def test_pytorch_exported_cnn_trains_with_frozen_conv():
    model = gc.load(TORCH_CNN)
    frozen = ["conv.weight", "conv.bias"]
    arts = gc.training.generate(model, gc.losses.cross_entropy("y", label="label"), gc.optim.Adam(1e-2),
                                frozen=frozen)
    trainer = gc.Trainer(arts, backend="ort-cpu")
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 4, 32).astype(np.int64)
    images = (rng.standard_normal((32, 1, 12, 12)) * 0.3 + labels[:, None, None, None]).astype(np.float32)
    assert_trains_around_frozen(trainer, {"x": images, "label": labels}, 25, frozen, "fc.weight")


@pytest.mark.parametrize("backend", ORT)
def test_onnxruntime_keeps_params_and_state_on_the_device(backend):
    import onnxruntime as ort

    trainer = gc.Trainer(bn_artifacts(gc.optim.Adam(1e-2)), backend=backend)
    trainer.step(blobs(16))
    assert trainer._state and all(isinstance(v, ort.OrtValue) for v in trainer._state.values())
    assert {v.device_name().lower() for v in trainer._state.values()} == {backend.removeprefix("ort-")}
    assert set(trainer._state) == {e.name for e in trainer.manifest.graphs["train_step"].inputs
                                   if e.role in ("param", "state", "hyper")}


def test_train_step_session_runs_without_the_memory_pattern():
    """The Trainer turns onnxruntime's memory pattern off for train_step (faster and smaller
    there, measured in graphc/runtime/trainer.py); an explicit option still wins; losses are unchanged."""
    arts = bn_artifacts(gc.optim.Adam(1e-2))
    default, explicit = gc.Trainer(arts, backend="ort-cpu"), gc.Trainer(arts, backend="ort-cpu", mem_pattern=True)
    assert default._train.session.get_session_options().enable_mem_pattern is False
    assert explicit._train.session.get_session_options().enable_mem_pattern is True
    for _ in range(3):
        batch = blobs(16)
        assert default.step(batch) == pytest.approx(explicit.step(batch), rel=1e-6)
