"""Bad training data against gc.Trainer and `graphc train`: a clear error naming the input, the
position and what was expected, never a step on wrong numbers; torch 2.13 is the oracle."""

import numpy as np
import pytest

import graphc as gc
from graphc import nn
from trainer_models import Contrastive, Prototypes

RNG = np.random.default_rng(0)
BACKENDS = ["numpy", "ort-cpu"]


def _prototype_case(twice: bool, label_smoothing: float):
    model = gc.capture(Prototypes(twice), seed=0, x=gc.spec("float32", ("N", 4)), protos=gc.spec("float32", ("K", 4)))
    loss = gc.losses.cross_entropy("logits", label="y", label_smoothing=label_smoothing)
    batch = {"x": RNG.standard_normal((8, 4)).astype(np.float32),
             "protos": RNG.standard_normal((3, 4)).astype(np.float32)}
    classes = 6 if twice else 3
    return gc.training.generate(model, loss, gc.optim.SGD(0.1)), batch, classes


def _torch_refuses(logits: np.ndarray, labels: np.ndarray, label_smoothing: float) -> None:
    torch = pytest.importorskip("torch")
    with pytest.raises((IndexError, RuntimeError), match="out of bounds"):
        torch.nn.functional.cross_entropy(torch.from_numpy(logits), torch.from_numpy(labels),
                                          label_smoothing=label_smoothing)


def _assert_refused_without_a_step(trainer, batch: dict, bad: int, at: int, classes: int) -> None:
    before = {name: value.copy() for name, value in trainer.params.items()}
    message = (rf"label 'y' holds {bad} at \({at},\); cross-entropy labels are class indices in \[0, {classes}\) "
               r"or the ignore index -100")
    for action, call in (("a train step", trainer.step), ("an evaluation", trainer.evaluate),
                         ("an evaluation", lambda b: trainer.evaluate_loader([b]))):
        with pytest.raises(gc.InputError, match=f"{action}: {message}"):
            call(batch)
    assert trainer.step_count == 0
    for name, value in trainer.params.items():
        np.testing.assert_array_equal(value, before[name], err_msg=name)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("twice", [False, True], ids=["K-from-the-batch", "2K-computed"])
@pytest.mark.parametrize("label_smoothing", [0.0, 0.1])
def test_labels_past_a_class_count_the_graphs_leave_symbolic_are_refused(backend, twice, label_smoothing):
    """Logits [N, K] with K a dim of another batch input, or computed in the model: the static
    check saw no C and let a label >= C through, which the graph counts as a loss of 0 (its
    smoothing term still in) in the mean's divisor, a step on wrong numbers where torch raises."""
    arts, batch, classes = _prototype_case(twice, label_smoothing)
    trainer = gc.Trainer(arts, backend=backend)
    labels = RNG.integers(0, classes, 8).astype(np.int64)
    for bad in (classes, 1000):
        wrong = labels.copy()
        wrong[2] = bad
        logits = trainer.predict(batch)["logits"]
        assert logits.shape == (8, classes)
        _torch_refuses(logits, wrong, label_smoothing)
        _assert_refused_without_a_step(trainer, {**batch, "y": wrong}, bad, 2, classes)
    assert np.isfinite(trainer.step({**batch, "y": labels}))
    fewer = {"x": batch["x"], "protos": batch["protos"][:2]}  # 2 prototypes: C is 2 (4 computed) for this batch
    fewer_classes = 2 * classes // 3
    labels %= fewer_classes
    labels[5] = fewer_classes
    _assert_refused_without_a_step(gc.Trainer(arts, backend=backend), {**fewer, "y": labels}, fewer_classes, 5,
                                   fewer_classes)


@pytest.mark.parametrize("backend", BACKENDS)
def test_contrastive_labels_past_the_batch_are_refused_by_each_step(backend):
    """Logits [N, N]: C is the batch's own size, so a loader's full-data check cannot bound the
    labels, but each step does, before it runs; labels in range train as torch's loss."""
    torch = pytest.importorskip("torch")
    model = gc.capture(Contrastive(), seed=0, x=gc.spec("float32", ("N", 4)))
    arts = gc.training.generate(model, gc.losses.cross_entropy("logits", label="y"), gc.optim.SGD(0.1))
    trainer = gc.Trainer(arts, backend=backend)
    x = RNG.standard_normal((8, 4)).astype(np.float32)
    labels = np.arange(8) % 4
    logits = trainer.predict({"x": x[:4]})["logits"]
    expected = torch.nn.functional.cross_entropy(torch.from_numpy(logits), torch.from_numpy(labels[:4])).item()
    assert trainer.evaluate({"x": x[:4], "y": labels[:4]})["loss"] == pytest.approx(expected, rel=1e-6)
    loader = gc.data.DataLoader({"x": x, "y": labels}, batch_size=4, shuffle=False)
    history = trainer.fit(loader, 1, progress=False, quiet=True)
    assert history.epochs[0].steps == 2 and trainer.step_count == 2
    labels[6] = 5  # a row of the data's second batch of 4: in range for the data's 8 rows, not the batch's 4
    _torch_refuses(trainer.predict({"x": x[4:]})["logits"], labels[4:], 0.0)
    with pytest.raises(gc.InputError, match=r"a train step: label 'y' holds 5 at \(2,\); cross-entropy labels are "
                                            r"class indices in \[0, 4\)"):
        fresh = gc.Trainer(arts, backend=backend)
        fresh.fit(gc.data.DataLoader({"x": x, "y": labels}, batch_size=4, shuffle=False), 1, progress=False, quiet=True)
    assert fresh.step_count == 1  # the first batch's step, not the second's


class Regressor(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 1)

    def forward(self, x):
        return {"pred": self.fc(x)}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("where", ["x", "target"])
@pytest.mark.parametrize("value", [np.nan, np.inf])
def test_a_non_finite_value_in_the_data_is_named_when_fit_stops(backend, where, value):
    """NaN or inf in an input or a target: a step propagates it into the loss, as torch's
    (same value), and fit's NaN guard names the array, the batch position and the data row,
    where it only said to lower the learning rate."""
    torch = pytest.importorskip("torch")
    model = gc.capture(Regressor(), seed=0, x=gc.spec("float32", ("N", 4)))
    arts = gc.training.generate(model, gc.losses.mse("pred", label="target"), gc.optim.SGD(0.1))
    data = {"x": RNG.standard_normal((12, 4)).astype(np.float32),
            "target": RNG.standard_normal((12, 1)).astype(np.float32)}
    column = 2 if where == "x" else 0
    data[where][7, column] = value
    pred = gc.Trainer(arts, backend=backend).predict({"x": data["x"][4:8]})["pred"]
    expected = torch.nn.functional.mse_loss(torch.from_numpy(pred), torch.from_numpy(data["target"][4:8])).item()
    loss = gc.Trainer(arts, backend=backend).step({"x": data["x"][4:8], "target": data["target"][4:8]})
    assert np.isnan(expected) == np.isnan(loss) and np.isinf(expected) == np.isinf(loss)
    loader = gc.data.DataLoader(data, batch_size=4, seed=3)
    position = int(np.flatnonzero(loader.order(0) == 7)[0])
    batch, row = divmod(position, 4)
    from graphc.runtime.trainer import TrainingFailed

    with pytest.raises(TrainingFailed, match=rf"the loss became (nan|inf) at step {batch + 1} \(epoch 1, batch "
                                             rf"{batch + 1}\); the batch's '{where}' holds {value} at \({row}, "
                                             rf"{column}\) \(row 7 of the loader's data\)"):
        gc.Trainer(arts, backend=backend).fit(loader, 1, progress=False, quiet=True)


@pytest.mark.parametrize("keys", [("x", "y"), ("x_val", "y_val")])
def test_graphc_train_names_the_file_and_arrays_whose_lengths_differ(tmp_path, capsys, keys):
    """A label array of another length than its data, in --data's training or evaluation set:
    one line naming the option, the file, each array and its rows (it named neither the file
    nor, for the _val set, the arrays)."""
    from cli_util import one_line_error, run_cli, workspace

    root = workspace(tmp_path)
    data = dict(np.load(root / "data.npz"))
    arrays = {**data, keys[0]: data["x"][:10], keys[1]: data["y"][:9]}
    np.savez(root / "short.npz", **arrays)
    result = run_cli(capsys, "train", root / "arts", "--data", root / "short.npz", "--epochs", 1, "--batch-size", 8,
                     "--backend", "numpy")
    err = " ".join(one_line_error(result).split())
    assert f"--data {root / 'short.npz'}: the inputs' arrays need one row per sample" in err
    assert f"got '{keys[0]}' 10 rows, '{keys[1]}' 9 rows" in err


@pytest.mark.parametrize("option", ["--data", "--eval-data"])
def test_graphc_train_names_the_file_of_an_array_of_another_dtype_and_the_cast(tmp_path, capsys, option):
    """float64 data (np.savez keeps numpy's default) or int32 labels: one line naming the option,
    the file, the array as the file names it and the cast to save it with (it said only "array
    'x': expected dtype float32", for x_val too); after the cast the run trains."""
    from cli_util import one_line_error, run_cli, workspace

    root = workspace(tmp_path)
    data = dict(np.load(root / "data.npz"))
    bad = root / "bad.npz"
    np.savez(bad, **({"x": data["x"], "y": data["y"], "x_val": data["x"].astype(np.float64), "y_val": data["y"]}
                     if option == "--data" else {"x": data["x"], "y": data["y"].astype(np.int32)}))
    extra = ["--data", root / "data.npz", "--eval-data", bad] if option == "--eval-data" else ["--data", bad]
    run = ["train", root / "arts", *extra, "--epochs", 1, "--batch-size", 8, "--backend", "numpy"]
    err = " ".join(one_line_error(run_cli(capsys, *run)).split())
    if option == "--data":
        assert (f"--data {bad}: array 'x_val' is float64[64,8] where the model input x: float32[batch,8] takes "
                "float32; save it as float32: np.savez(..., x_val=x_val.astype(np.float32))") in err
    else:
        assert (f"--eval-data {bad}: array 'y' is int32[64] where the model input y: int64[batch] takes int64; "
                "save it as int64: np.savez(..., y=y.astype(np.int64))") in err
    np.savez(bad, **{key: array.astype(data[key[0]].dtype) for key, array in np.load(bad).items()})
    assert run_cli(capsys, *run).code == 0


class KLDiv(nn.Module):
    def forward(self, logp, target):
        return {"loss": gc.nn.functional.kl_div(logp, target, reduction="none")}


@pytest.mark.parametrize("backend", BACKENDS)
def test_kl_div_of_a_negative_target_is_nan_as_torchs(backend):
    """A target below 0 (not a probability): torch's xlogy(t, t) is nan there; graphc read its log
    as 0 and returned a finite loss. 0 targets still give 0, positive ones t log t - t logp."""
    torch = pytest.importorskip("torch")
    logp = RNG.standard_normal((2, 3)).astype(np.float32)
    target = np.array([[-0.5, 0.0, 0.25], [1.0, -2.0, 0.5]], np.float32)
    model = gc.capture(KLDiv(), seed=0, logp=gc.spec("float32", (2, 3)), target=gc.spec("float32", (2, 3)))
    got = gc.Session(model, backend=backend).run({"logp": logp, "target": target})["loss"]
    want = torch.nn.functional.kl_div(torch.from_numpy(logp), torch.from_numpy(target), reduction="none").numpy()
    assert np.isnan(want[target < 0]).all()
    np.testing.assert_allclose(got, want, rtol=1e-6, equal_nan=True)


class OwnClassLoss(nn.Module):
    """A model that computes its own loss: ``F.cross_entropy`` or ``F.nll_loss`` of a data input's
    class labels, trained by the name of that output (no loss spec, so no label input)."""

    def __init__(self, kind: str, ignore_index: int):
        super().__init__()
        self.fc = nn.Linear(4, 3)
        self.kind, self.ignore_index = kind, ignore_index

    def forward(self, x, y):
        logits = self.fc(x)
        if self.kind == "nll_loss":
            return {"loss": gc.nn.functional.nll_loss(gc.log_softmax(logits, dim=1), y, ignore_index=self.ignore_index)}
        return {"loss": gc.nn.functional.cross_entropy(logits, y, ignore_index=self.ignore_index)}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kind", ["cross_entropy", "nll_loss"])
@pytest.mark.parametrize("ignore_index", [-100, -1])
def test_labels_out_of_range_of_a_models_own_class_loss_are_refused(backend, kind, ignore_index):
    """The model's own cross_entropy / nll_loss: a label outside [0, C) that is not the ignore index
    gave a loss of 0 counted in the mean's divisor (1.133 where the right mean is 1.295), a step on
    wrong numbers where torch raises; the ignore index itself trains to torch's loss."""
    torch = pytest.importorskip("torch")
    model = gc.capture(OwnClassLoss(kind, ignore_index), seed=0, x=gc.spec("float32", ("N", 4)),
                       y=gc.spec("int64", ("N",)))
    arts = gc.training.generate(model, "loss", gc.optim.SGD(0.1))
    x = RNG.standard_normal((8, 4)).astype(np.float32)
    labels = np.arange(8) % 3
    trainer = gc.Trainer(arts, backend=backend)
    weight, bias = (torch.from_numpy(trainer.params[f"fc.{p}"]) for p in ("weight", "bias"))
    logits = torch.from_numpy(x) @ weight.T + bias
    for bad in (3, -1 if ignore_index != -1 else -5, 1000):
        wrong = labels.copy()
        wrong[2] = bad
        with pytest.raises((IndexError, RuntimeError), match="out of bounds"):
            torch.nn.functional.cross_entropy(logits, torch.from_numpy(wrong), ignore_index=ignore_index)
        message = (rf"label 'y' holds {bad} at \(2,\); cross_entropy / nll_loss labels are class indices in "
                   rf"\[0, 3\) or the ignore index {ignore_index}")
        for action, call in (("a train step", trainer.step), ("an evaluation", trainer.evaluate),
                             ("the training loader", lambda b: trainer.fit(gc.data.DataLoader(b, 4), 1, quiet=True,
                                                                            progress=False))):
            with pytest.raises(gc.InputError, match=f"{action}: {message}"):
                call({"x": x, "y": wrong})
    assert trainer.step_count == 0
    ignored = labels.copy()
    ignored[2] = ignore_index
    expected = torch.nn.functional.cross_entropy(logits, torch.from_numpy(ignored), ignore_index=ignore_index).item()
    assert trainer.step({"x": x, "y": ignored}) == pytest.approx(expected, rel=1e-5)
    assert arts.manifest.class_labels == [("y", 3, ignore_index)]


class TokenLoss(nn.Module):
    """A language-model-style loss: ``F.cross_entropy(logits.reshape(-1, C), y.reshape(-1))``, the
    labels flattened (and, with ``widen``, int32 ones cast by ``.long()``) inside the model."""

    def __init__(self, widen: bool):
        super().__init__()
        self.fc = nn.Linear(4, 5)
        self.widen = widen

    def forward(self, x, y):
        return {"loss": gc.nn.functional.cross_entropy(self.fc(x).reshape(-1, 5),
                                                       (y.long() if self.widen else y).reshape(-1))}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("widen", [False, True], ids=["int64", "int32-long"])
def test_labels_out_of_range_reshaped_inside_the_model_are_refused(backend, widen):
    """Labels [N, T] flattened (or widened) before the model's own cross_entropy: a label of C
    trained on a wrong loss (a loss of 0 counted in the mean's divisor) where torch raises;
    the Trainer names it at its place in the batch's own array."""
    torch = pytest.importorskip("torch")
    dtype = "int32" if widen else "int64"
    model = gc.capture(TokenLoss(widen), seed=0, x=gc.spec("float32", ("N", "T", 4)), y=gc.spec(dtype, ("N", "T")))
    trainer = gc.Trainer(gc.training.generate(model, "loss", gc.optim.SGD(0.1)), backend=backend)
    x = RNG.standard_normal((2, 3, 4)).astype(np.float32)
    labels = (np.arange(6).reshape(2, 3) % 5).astype(dtype)
    labels[1, 2] = 5
    with pytest.raises((IndexError, RuntimeError), match="out of bounds"):
        torch.nn.functional.cross_entropy(torch.zeros(6, 5), torch.from_numpy(labels.astype(np.int64)).reshape(-1))
    with pytest.raises(gc.InputError, match=r"a train step: label 'y' holds 5 at \(1, 2\); cross_entropy / nll_loss "
                                            r"labels are class indices in \[0, 5\) or the ignore index -100"):
        trainer.step({"x": x, "y": labels})
    assert trainer.step_count == 0


class PrototypeLoss(Prototypes):
    """``Prototypes``' logits ``[N, K]`` (K the length of the ``protos`` batch input) into the
    model's own cross_entropy."""

    def forward(self, x, protos, y):
        return {"loss": gc.nn.functional.cross_entropy(super().forward(x, protos)["logits"], y)}


@pytest.mark.parametrize("backend", BACKENDS)
def test_labels_past_a_symbolic_class_count_of_a_models_own_loss_are_refused(backend):
    """The model's own cross_entropy over K classes, K the batch's prototypes: a label of K or more
    trained on a wrong loss where torch raises; the Trainer reads K from the batch's shapes."""
    torch = pytest.importorskip("torch")
    model = gc.capture(PrototypeLoss(), seed=0, x=gc.spec("float32", ("N", 4)), protos=gc.spec("float32", ("K", 4)),
                       y=gc.spec("int64", ("N",)))
    arts = gc.training.generate(model, "loss", gc.optim.SGD(0.1))
    trainer = gc.Trainer(arts, backend=backend)
    batch = {"x": RNG.standard_normal((6, 4)).astype(np.float32), "protos": RNG.standard_normal((3, 4)).astype(np.float32),
             "y": np.array([0, 1, 2, 0, 1, 3])}
    with pytest.raises((IndexError, RuntimeError), match="out of bounds"):
        torch.nn.functional.cross_entropy(torch.zeros(6, 3), torch.from_numpy(batch["y"]))
    with pytest.raises(gc.InputError, match=r"a train step: label 'y' holds 3 at \(5,\); cross_entropy / nll_loss "
                                            r"labels are class indices in \[0, 3\)"):
        trainer.step(batch)
    assert np.isfinite(trainer.step({**batch, "protos": RNG.standard_normal((4, 4)).astype(np.float32)}))  # K = 4
    assert arts.manifest.class_labels == [("y", "K", -100)]


@pytest.mark.parametrize("split", ["y", "y_val"])
def test_graphc_train_names_the_file_of_a_label_out_of_range(tmp_path, capsys, split):
    """A cross-entropy label of C in --data's training or evaluation arrays: one line naming the
    file (it said "the training loader" / "the eval loader"), the array, the row and the range."""
    from cli_util import one_line_error, run_cli, workspace

    root = workspace(tmp_path)
    data = dict(np.load(root / "data.npz"))
    bad = data["y"].copy()
    bad[5] = 3
    np.savez(root / "bad.npz", **{**data, **({"y": bad} if split == "y" else {"x_val": data["x"], "y_val": bad})})
    result = run_cli(capsys, "train", root / "arts", "--data", root / "bad.npz", "--epochs", 1, "--batch-size", 8,
                     "--backend", "numpy")
    err = " ".join(one_line_error(result).split())
    where = f"--data {root / 'bad.npz'}" if split == "y" else f"x_val, y_val of {root / 'bad.npz'}"
    assert f"{where}: label 'y' holds 3 at (5,); cross-entropy labels are class indices in [0, 3)" in err, err
